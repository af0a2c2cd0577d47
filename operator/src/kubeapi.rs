//! Small helpers over the Kubernetes API: every call with a timeout, owner references, label
//! values, and the job resources (PyTorchJob, TrainJob) for the dynamic API (watches, writes).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use kube::api::ApiResource;
use primus_crds::{JobKind, TrainingPlan};

use crate::error::Error;

/// How long one API call may take before the pass gives up (and retries with backoff).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Run one API call with [`CALL_TIMEOUT`].
pub async fn call<T>(
    what: impl Into<String>,
    f: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Error> {
    let what = what.into();
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(Error::Kube { what, source }),
        Err(_) => Err(Error::Timeout {
            what,
            after: CALL_TIMEOUT,
        }),
    }
}

/// The resource of a job kind: `pytorchjobs.kubeflow.org/v1` ([`primus_crds::PyTorchJob`])
/// or `trainjobs.trainer.kubeflow.org/v1alpha1` ([`primus_crds::TrainJob`]).
pub fn job_resource(kind: JobKind) -> ApiResource {
    match kind {
        JobKind::PyTorchJob => ApiResource::erase::<primus_crds::PyTorchJob>(&()),
        JobKind::TrainJob => ApiResource::erase::<primus_crds::TrainJob>(&()),
    }
}

/// `trainingplans.primus.dev/v1alpha1`, for calls whose answer is not decoded.
pub fn plan_resource() -> ApiResource {
    ApiResource::erase::<TrainingPlan>(&())
}

/// `benchmarkreports.primus.dev/v1alpha1`, for lists decoded object by object.
pub fn report_resource() -> ApiResource {
    ApiResource::erase::<primus_crds::BenchmarkReport>(&())
}

/// A controller owner reference to the plan (garbage collection deletes the object with the
/// plan; the controller's watches map the object back to the plan).
pub fn owner_reference(plan: &TrainingPlan) -> Result<OwnerReference, Error> {
    plan.controller_owner_ref(&())
        .ok_or_else(|| Error::Missing(format!("trainingplan {}", name_of(plan)), "uid"))
}

/// Whether `owners` has a controller reference to the object with `uid`.
pub fn controlled_by(owners: Option<&Vec<OwnerReference>>, uid: &str) -> bool {
    owners
        .into_iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// `namespace/name` of a plan, for messages.
pub fn name_of(plan: &TrainingPlan) -> String {
    format!(
        "{}/{}",
        plan.metadata.namespace.as_deref().unwrap_or_default(),
        plan.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A label value naming a plan: the name when it fits the 63-character limit, else its first
/// 54 characters and a hash.
pub fn plan_label_value(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let head: String = name.chars().take(54).collect();
    format!(
        "{}-{:08x}",
        head.trim_end_matches(['-', '.']),
        primus_oracle::bench::stable_hash(name.as_bytes()) & 0xffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_plan_names_become_valid_label_values() {
        assert_eq!(plan_label_value("llama"), "llama");
        let long = "a".repeat(80);
        let v = plan_label_value(&long);
        assert!(v.len() <= 63, "{v}");
        assert_ne!(v, plan_label_value(&"a".repeat(81)));
    }
}
