//! The plan's job, a PyTorchJob or (`spec.job.kind: TrainJob`) a Kubeflow Trainer v2 TrainJob:
//! built by the crds writer ([`primus_crds::job::write`], the same object `primus tune --emit`
//! prints), owned by the plan, and created once. A job
//! that has not started is replaced when the chosen layout changes; a started job is never
//! touched (the status says the plan and the job differ). `spec.job.suspend` creates it
//! suspended and flips `runPolicy.suspend` of an existing job only when the field itself
//! changes (the review flow): the value applied last is kept in the job's
//! `primus.dev/suspend-applied` annotation, so a queue controller (Kueue) that suspends or
//! resumes the job is never reverted. Queue and scheduling fields of `spec.job.template`
//! (Kueue's queue-name label, Volcano's annotations, `runPolicy.schedulingPolicy`, pods'
//! `priorityClassName` and `schedulerName`) pass to the job as they are. `autoSubmit: false`
//! creates nothing. A cluster without the kind's CRD is
//! detected through discovery and reported in a condition.
//!
//! One step is [`observe`] (discovery, the existing job) -> [`decide`] (pure: the outcome and
//! at most one change) -> [`apply`].

use primus_crds::job::{self, Job};
use primus_crds::pytorchjob::JobOptions;
use primus_crds::{JobKind, JobStatus, TrainingPlan, annotations};
use primus_oracle::layout::Layout;
use primus_oracle::plan::Plan;

mod apply;
mod decide;
mod observe;

pub use apply::apply;
pub use decide::{Action, Decision, decide};
pub use observe::{Observed, crd_present, observe};

/// What happened to the plan's job in this pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// `spec.job.autoSubmit: false`: nothing created.
    NotSubmitted,
    /// The PyTorchJob CRD is not installed.
    CrdMissing,
    /// A job of that name exists and belongs to someone else.
    NameTaken { name: String },
    /// Created in this pass.
    Created {
        name: String,
        suspended: bool,
        /// `spec.job.suspend` is true (else a suspend came from elsewhere: a queue).
        plan_suspends: bool,
        /// The queue the job is submitted to.
        queue: Option<String>,
    },
    /// The job exists with the chosen layout.
    UpToDate {
        name: String,
        started: bool,
        suspended: bool,
        plan_suspends: bool,
        queue: Option<String>,
    },
    /// The job had not started and ran another layout: deleted, recreated next pass.
    Replacing { name: String, old: String },
    /// The job runs another layout and has started: left alone.
    Differs {
        name: String,
        job_layout: String,
        started: bool,
        suspended: bool,
    },
}

impl Outcome {
    /// The job part of the plan's status.
    pub fn status(&self) -> Option<JobStatus> {
        let status = |name: &String, layout_matches_plan, started, suspended| JobStatus {
            name: Some(name.clone()),
            layout_matches_plan,
            started,
            suspended,
        };
        match self {
            Outcome::NotSubmitted | Outcome::CrdMissing => None,
            Outcome::NameTaken { name } => Some(JobStatus {
                name: Some(name.clone()),
                ..JobStatus::default()
            }),
            Outcome::Created {
                name, suspended, ..
            } => Some(status(name, true, false, *suspended)),
            Outcome::UpToDate {
                name,
                started,
                suspended,
                ..
            } => Some(status(name, true, *started, *suspended)),
            Outcome::Replacing { name, .. } => Some(status(name, false, false, false)),
            Outcome::Differs {
                name,
                started,
                suspended,
                ..
            } => Some(status(name, false, *started, *suspended)),
        }
    }
}

/// Name of the plan's job: `spec.job.name`, else the plan's name.
pub fn job_name(plan_obj: &TrainingPlan) -> String {
    plan_obj
        .spec
        .job
        .as_ref()
        .and_then(|j| j.name.clone())
        .unwrap_or_else(|| plan_obj.metadata.name.clone().unwrap_or_default())
}

/// The kind of the plan's job (`spec.job.kind`, default PyTorchJob).
pub fn job_kind(plan_obj: &TrainingPlan) -> JobKind {
    plan_obj
        .spec
        .job
        .as_ref()
        .and_then(|j| j.kind)
        .unwrap_or_default()
}

/// The job of the chosen layout (pure; unit-tested).
pub fn desired(
    plan_obj: &TrainingPlan,
    plan: &Plan,
    layout: &Layout,
    projected_tokens_per_second: f64,
) -> Result<Job, primus_oracle::FieldError> {
    let spec = plan_obj.spec.job.clone().unwrap_or_default();
    let opts = JobOptions {
        name: Some(job_name(plan_obj)),
        suspend: spec.suspend == Some(true),
        projected_tokens_per_second: Some(projected_tokens_per_second),
        inline_model_card: plan_obj.spec.model.preset.is_none(),
        launcher: spec.launcher.unwrap_or_default(),
        experiment: spec.experiment.clone(),
    };
    let mut out = job::write(
        plan_obj.metadata.name.as_deref().unwrap_or_default(),
        plan_obj.metadata.namespace.as_deref(),
        &plan.scenario,
        layout,
        &spec,
        &opts,
    )?;
    out.metadata_mut()
        .annotations
        .get_or_insert_default()
        .insert(
            annotations::SUSPEND_APPLIED.to_string(),
            opts.suspend.to_string(),
        );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::plan_with as plan;
    use serde_json::json;

    #[test]
    fn the_desired_job_carries_layout_annotations_and_no_tracking_labels() {
        let (obj, p) = plan(json!({"job": {"suspend": true, "template": {
            "metadata": {"labels": {"app.kubernetes.io/instance": "argo-app", "team": "a"},
                         "annotations": {"argocd.argoproj.io/tracking-id": "x"}},
            "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [
                {"name": "pytorch", "image": "example/megatron:1", "args": ["--lr", "1e-4"]}]}}}}}
        }}}));
        let l = Layout {
            tp: 2,
            pp: 2,
            ..Layout::default()
        };
        let job = desired(&obj, &p, &l, 1234.5).unwrap();
        assert_eq!(job.annotated_layout(), Some(l.clone()));
        assert!(job.suspended());
        assert!(!job.started());
        let j = serde_json::to_value(&job).unwrap();
        let ann = &j["metadata"]["annotations"];
        assert_eq!(ann[annotations::PLAN], "p");
        assert_eq!(ann[annotations::PROJECTED_TOKENS_PER_SECOND], "1234.5");
        assert!(ann.get("argocd.argoproj.io/tracking-id").is_none());
        let labels = &j["metadata"]["labels"];
        assert!(labels.get("app.kubernetes.io/instance").is_none());
        assert_eq!(labels["team"], "a");
        let args: Vec<String> = serde_json::from_value(
            j["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
                .clone(),
        )
        .unwrap();
        let joined = args.join(" ");
        assert!(
            joined.contains("--tensor-model-parallel-size 2"),
            "{joined}"
        );
        assert!(
            joined.contains("--pipeline-model-parallel-size 2"),
            "{joined}"
        );
        assert!(joined.contains("--lr 1e-4"), "{joined}");
    }
}
