//! What to do about a plan's job, from what [`super::observe`] read (pure): create it, leave it,
//! pass a change of `spec.job.suspend` on, replace it (not started, another layout), or report
//! why not.
//!
//! The job's suspend field (a PyTorchJob's `runPolicy.suspend`, a TrainJob's `spec.suspend`) is
//! the job's, not the plan's: the operator writes it when it creates the
//! job and afterwards only when `spec.job.suspend` differs from the value it applied last (the
//! job's `primus.dev/suspend-applied` annotation). A queue controller that suspends the job
//! until its queue admits it, then resumes it, is left alone either way.

use primus_crds::TrainingPlan;
use primus_crds::job::Job;
use primus_oracle::layout::Layout;

use super::{Observed, Outcome, job_name};
use crate::kubeapi::controlled_by;

/// What to do about the plan's job.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What the pass reports once the action is done.
    pub outcome: Outcome,
    pub action: Option<Action>,
}

/// A change to the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Create this job (the plan becomes its controller owner).
    Create(Box<Job>),
    /// `spec.job.suspend` changed (the review flow): set the job's suspend field to `suspend`
    /// when given (never to suspend a job that runs) and record `applied` as the value applied.
    Suspend {
        suspend: Option<bool>,
        applied: bool,
    },
    /// Delete the job that has this uid and resourceVersion (preconditions), to replace it.
    Delete {
        uid: Option<String>,
        resource_version: Option<String>,
    },
}

/// Decide one step of the plan's job: `desired` is the job of the chosen `layout`.
pub fn decide(plan_obj: &TrainingPlan, seen: &Observed, desired: Job, layout: &Layout) -> Decision {
    let spec = plan_obj.spec.job.clone().unwrap_or_default();
    let name = job_name(plan_obj);
    let want_suspended = spec.suspend == Some(true);
    let only = |outcome| Decision {
        outcome,
        action: None,
    };
    if spec.auto_submit == Some(false) {
        return only(Outcome::NotSubmitted);
    }
    if !seen.crd_present {
        return only(Outcome::CrdMissing);
    }
    let Some(existing) = &seen.existing else {
        return Decision {
            outcome: Outcome::Created {
                name,
                suspended: desired.suspended(),
                plan_suspends: want_suspended,
                queue: desired.queue(),
            },
            action: Some(Action::Create(Box::new(desired))),
        };
    };
    let uid = plan_obj.metadata.uid.clone().unwrap_or_default();
    if !controlled_by(existing.metadata().owner_references.as_ref(), &uid) {
        return only(Outcome::NameTaken { name });
    }
    if existing.metadata().deletion_timestamp.is_some() {
        return only(Outcome::Replacing {
            name,
            old: String::new(),
        });
    }
    let (started, suspended) = (existing.started(), existing.suspended());
    let current = existing.annotated_layout();
    if current.as_ref() == Some(layout) {
        let action = suspend_change(existing.applied_suspend(), want_suspended, started);
        let suspended = match &action {
            Some(Action::Suspend {
                suspend: Some(s), ..
            }) => *s,
            _ => suspended,
        };
        return Decision {
            outcome: Outcome::UpToDate {
                name,
                started,
                suspended,
                plan_suspends: want_suspended,
                queue: existing.queue(),
            },
            action,
        };
    }
    let old = current
        .map(|l| l.label())
        .unwrap_or_else(|| "unknown".into());
    if started {
        return only(Outcome::Differs {
            name,
            job_layout: old,
            started: true,
            suspended,
        });
    }
    // Not started: replace it (the next pass creates the new job).
    Decision {
        outcome: Outcome::Replacing { name, old },
        action: Some(Action::Delete {
            uid: existing.metadata().uid.clone(),
            resource_version: existing.metadata().resource_version.clone(),
        }),
    }
}

/// What a change of `spec.job.suspend` asks of an existing job: nothing while it equals the
/// value applied last, whatever the job's own suspend field is now (another manager may
/// have set it). A job without the record (written before it) is adopted as it is: the record
/// is written and its suspend left. A job that runs is never suspended.
fn suspend_change(applied: Option<bool>, want: bool, started: bool) -> Option<Action> {
    match applied {
        Some(a) if a == want => None,
        Some(_) => Some(Action::Suspend {
            suspend: (!(started && want)).then_some(want),
            applied: want,
        }),
        None => Some(Action::Suspend {
            suspend: None,
            applied: want,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspend_is_written_only_when_the_plan_field_changes() {
        // Unchanged since the last apply: nothing, whatever the job says now.
        assert_eq!(suspend_change(Some(false), false, false), None);
        assert_eq!(suspend_change(Some(true), true, false), None);
        // Changed: passed on.
        let set = |s, a| {
            Some(Action::Suspend {
                suspend: s,
                applied: a,
            })
        };
        assert_eq!(
            suspend_change(Some(true), false, false),
            set(Some(false), false)
        );
        assert_eq!(
            suspend_change(Some(false), true, false),
            set(Some(true), true)
        );
        // A running job is not suspended; the change is recorded.
        assert_eq!(suspend_change(Some(false), true, true), set(None, true));
        // No record: adopted, its suspend left.
        assert_eq!(suspend_change(None, true, false), set(None, true));
        assert_eq!(suspend_change(None, false, false), set(None, false));
    }
}
