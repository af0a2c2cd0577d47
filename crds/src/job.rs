//! The job a plan runs, of the kind `spec.job.kind` asks for: a kubeflow.org/v1 [`PyTorchJob`]
//! (the default) or a Kubeflow Trainer v2 [`TrainJob`]. One writer entry point for the operator,
//! the validator and `primus tune --emit`, and what the operator reads from either kind.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use primus_oracle::FieldError;
use primus_oracle::layout::Layout;
use primus_oracle::scenario::Scenario;
use serde::Serialize;

use crate::pytorchjob::{self, JobOptions, PyTorchJob};
use crate::training_plan::{JobKind, JobSpec};
use crate::trainjob::{self, TrainJob};

/// A job of either kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Job {
    PyTorch(Box<PyTorchJob>),
    Train(Box<TrainJob>),
}

/// Names of a job kind's API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindNames {
    pub kind: &'static str,
    pub group: &'static str,
    pub version: &'static str,
    pub api_version: &'static str,
    pub plural: &'static str,
    /// Where a cluster gets the CRD.
    pub install: &'static str,
}

/// The API names of a job kind.
pub fn names(kind: JobKind) -> KindNames {
    match kind {
        JobKind::PyTorchJob => KindNames {
            kind: pytorchjob::KIND,
            group: pytorchjob::GROUP,
            version: pytorchjob::VERSION,
            api_version: pytorchjob::API_VERSION,
            plural: pytorchjob::PLURAL,
            install: "install the Kubeflow training operator (or crds/thirdparty/kubeflow.org_pytorchjobs.yaml)",
        },
        JobKind::TrainJob => KindNames {
            kind: trainjob::KIND,
            group: trainjob::GROUP,
            version: trainjob::VERSION,
            api_version: trainjob::API_VERSION,
            plural: trainjob::PLURAL,
            install: "install Kubeflow Trainer v2 (or crds/thirdparty/trainer.kubeflow.org_*.yaml)",
        },
    }
}

/// The job of layout `l`, of the kind `job.kind` (default PyTorchJob), built from
/// `job.template` (and `job.runtimeRef` for a TrainJob); errors name the plan field.
pub fn write(
    plan_name: &str,
    namespace: Option<&str>,
    s: &Scenario,
    l: &Layout,
    job: &JobSpec,
    opts: &JobOptions,
) -> Result<Job, FieldError> {
    match job.kind.unwrap_or_default() {
        JobKind::PyTorchJob => {
            if job.runtime_ref.is_some() {
                return Err(FieldError::new(
                    "spec.job.runtimeRef",
                    "only a TrainJob has a training runtime: set spec.job.kind to TrainJob or drop runtimeRef",
                ));
            }
            pytorchjob::pytorchjob(plan_name, namespace, s, l, job.template.as_ref(), opts)
                .map(|j| Job::PyTorch(Box::new(j)))
        }
        JobKind::TrainJob => trainjob::trainjob(
            plan_name,
            namespace,
            s,
            l,
            job.template.as_ref(),
            job.runtime_ref.as_ref(),
            opts,
        )
        .map(|j| Job::Train(Box::new(j))),
    }
}

impl Job {
    /// The kind.
    pub fn kind(&self) -> JobKind {
        match self {
            Job::PyTorch(_) => JobKind::PyTorchJob,
            Job::Train(_) => JobKind::TrainJob,
        }
    }

    pub fn metadata(&self) -> &ObjectMeta {
        match self {
            Job::PyTorch(j) => &j.metadata,
            Job::Train(j) => &j.metadata,
        }
    }

    pub fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Job::PyTorch(j) => &mut j.metadata,
            Job::Train(j) => &mut j.metadata,
        }
    }

    /// Whether the job has started (pods ran or run).
    pub fn started(&self) -> bool {
        match self {
            Job::PyTorch(j) => j.started(),
            Job::Train(j) => j.started(),
        }
    }

    /// Whether the job is suspended now.
    pub fn suspended(&self) -> bool {
        match self {
            Job::PyTorch(j) => j.suspended(),
            Job::Train(j) => j.suspended(),
        }
    }

    /// Set the job's suspend field (what a queue controller does).
    pub fn set_suspended(&mut self, suspend: bool) {
        match self {
            Job::PyTorch(j) => j.spec.run_policy.get_or_insert_default().suspend = Some(suspend),
            Job::Train(j) => j.spec.suspend = Some(suspend),
        }
    }

    /// The `spec.job.suspend` the operator applied last.
    pub fn applied_suspend(&self) -> Option<bool> {
        crate::job_meta::applied_suspend(self.metadata())
    }

    /// The queue the job is submitted to.
    pub fn queue(&self) -> Option<String> {
        match self {
            Job::PyTorch(j) => j.queue(),
            Job::Train(j) => j.queue(),
        }
    }

    /// The layout the job says it runs.
    pub fn annotated_layout(&self) -> Option<Layout> {
        crate::job_meta::annotated_layout(self.metadata())
    }

    /// A JSON merge patch that sets the job's suspend field to `suspend`.
    pub fn suspend_patch(kind: JobKind, suspend: bool) -> serde_json::Value {
        match kind {
            JobKind::PyTorchJob => serde_json::json!({"spec": {"runPolicy": {"suspend": suspend}}}),
            JobKind::TrainJob => serde_json::json!({"spec": {"suspend": suspend}}),
        }
    }
}
