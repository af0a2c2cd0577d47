//! What to do about a plan's job, from what [`super::observe`] read (pure): create it, leave it,
//! flip its suspend, replace it (not started, another layout), or report why not.

use primus_crds::{PyTorchJob, TrainingPlan};
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
    Create(Box<PyTorchJob>),
    /// Set `spec.runPolicy.suspend` (the review flow: a human flipped `spec.job.suspend`).
    Suspend(bool),
    /// Delete the job that has this uid and resourceVersion (preconditions), to replace it.
    Delete {
        uid: Option<String>,
        resource_version: Option<String>,
    },
}

/// Decide one step of the plan's job: `desired` is the job of the chosen `layout`.
pub fn decide(
    plan_obj: &TrainingPlan,
    seen: &Observed,
    desired: PyTorchJob,
    layout: &Layout,
) -> Decision {
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
                suspended: want_suspended,
            },
            action: Some(Action::Create(Box::new(desired))),
        };
    };
    let uid = plan_obj.metadata.uid.clone().unwrap_or_default();
    if !controlled_by(existing.metadata.owner_references.as_ref(), &uid) {
        return only(Outcome::NameTaken { name });
    }
    if existing.metadata.deletion_timestamp.is_some() {
        return only(Outcome::Replacing {
            name,
            old: String::new(),
        });
    }
    let (started, suspended) = (existing.started(), existing.suspended());
    let current = existing.annotated_layout();
    if current.as_ref() == Some(layout) {
        // Pass a flip of spec.job.suspend on, but never suspend a job that runs.
        let flip = suspended != want_suspended && !(started && want_suspended);
        return Decision {
            outcome: Outcome::UpToDate {
                name,
                started,
                suspended: if flip { want_suspended } else { suspended },
            },
            action: flip.then_some(Action::Suspend(want_suspended)),
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
            uid: existing.metadata.uid.clone(),
            resource_version: existing.metadata.resource_version.clone(),
        }),
    }
}
