//! What the cluster holds for a plan's job: whether the CRD of its kind (PyTorchJob, TrainJob)
//! is served, and the job of the plan's job name.

use kube::api::{Api, DynamicObject};
use primus_crds::job::{self, Job};
use primus_crds::{JobKind, PyTorchJob, TrainJob, TrainingPlan};
use serde_json::Value;

use super::{job_kind, job_name};
use crate::context::Context;
use crate::error::{Error, is_not_found};
use crate::kubeapi::{CALL_TIMEOUT, call, job_resource};

/// A plan's job as the API server has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Whether the job kind's resource is served.
    pub crd_present: bool,
    /// The job named as the plan's job, whoever owns it.
    pub existing: Option<Job>,
}

/// Read the plan's job: nothing when `spec.job.autoSubmit` is false (the decision does not
/// look), no job when the CRD is missing.
pub async fn observe(ctx: &Context, plan_obj: &TrainingPlan) -> Result<Observed, Error> {
    let auto_submit = plan_obj.spec.job.as_ref().and_then(|j| j.auto_submit);
    if auto_submit == Some(false) {
        return Ok(Observed::default());
    }
    let kind = job_kind(plan_obj);
    if !crd_present(ctx, kind).await? {
        return Ok(Observed::default());
    }
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let name = job_name(plan_obj);
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &job_resource(kind));
    // (A 404 of the resource itself reads as "no such job" here; the create tells.)
    let what = format!("get {} {ns}/{name}", job::names(kind).plural);
    let existing = call(what, api.get_opt(&name)).await?;
    Ok(Observed {
        crd_present: true,
        existing: existing.map(|o| typed(o, kind)),
    })
}

/// The typed job. A job someone else wrote may hold fields the types cannot read (a
/// PyTorchJob's pod templates are unvalidated in the vendored CRD): it is then judged by its
/// metadata, status and suspend field alone (all the decision looks at).
pub fn typed(obj: DynamicObject, kind: JobKind) -> Job {
    let value = serde_json::to_value(&obj).unwrap_or(Value::Null);
    let status = &obj.data["status"];
    match kind {
        JobKind::PyTorchJob => {
            if let Ok(job) = serde_json::from_value(value) {
                return Job::PyTorch(Box::new(job));
            }
            let mut job = PyTorchJob {
                status: serde_json::from_value(status.clone()).ok(),
                metadata: obj.metadata,
                ..PyTorchJob::default()
            };
            job.spec.run_policy =
                serde_json::from_value(obj.data["spec"]["runPolicy"].clone()).ok();
            Job::PyTorch(Box::new(job))
        }
        JobKind::TrainJob => {
            if let Ok(job) = serde_json::from_value(value) {
                return Job::Train(Box::new(job));
            }
            let mut job = TrainJob {
                status: serde_json::from_value(status.clone()).ok(),
                metadata: obj.metadata,
                ..TrainJob::default()
            };
            job.spec.suspend = obj.data["spec"]["suspend"].as_bool();
            Job::Train(Box::new(job))
        }
    }
}

/// Whether the job kind's CRD is served (discovery of its group/version), cached briefly.
pub async fn crd_present(ctx: &Context, kind: JobKind) -> Result<bool, Error> {
    if let Some(p) = ctx.job_crd_cached(kind) {
        return Ok(p);
    }
    let names = job::names(kind);
    let what = format!("discover {}", names.api_version);
    let present = match tokio::time::timeout(
        CALL_TIMEOUT,
        ctx.client.list_api_group_resources(names.api_version),
    )
    .await
    {
        Ok(Ok(list)) => list.resources.iter().any(|r| r.name == names.plural),
        Ok(Err(e)) if is_not_found(&e) => false,
        Ok(Err(e)) => return Err(Error::kube(what, e)),
        Err(_) => {
            return Err(Error::Timeout {
                what,
                after: CALL_TIMEOUT,
            });
        }
    };
    ctx.set_job_crd(kind, present);
    Ok(present)
}
