//! What the cluster holds for a plan's job: whether the PyTorchJob CRD is served, and the job
//! of the plan's job name.

use kube::api::{Api, DynamicObject};
use primus_crds::{PyTorchJob, TrainingPlan, pytorchjob};
use serde_json::Value;

use super::job_name;
use crate::context::Context;
use crate::error::{Error, is_not_found};
use crate::kubeapi::{CALL_TIMEOUT, call, pytorchjob_resource};

/// A plan's job as the API server has it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Whether pytorchjobs.kubeflow.org/v1 is served.
    pub crd_present: bool,
    /// The job named as the plan's job, whoever owns it.
    pub existing: Option<PyTorchJob>,
}

/// Read the plan's job: nothing when `spec.job.autoSubmit` is false (the decision does not
/// look), no job when the CRD is missing.
pub async fn observe(ctx: &Context, plan_obj: &TrainingPlan) -> Result<Observed, Error> {
    let auto_submit = plan_obj.spec.job.as_ref().and_then(|j| j.auto_submit);
    if auto_submit == Some(false) {
        return Ok(Observed::default());
    }
    if !crd_present(ctx).await? {
        return Ok(Observed::default());
    }
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let name = job_name(plan_obj);
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &pytorchjob_resource());
    // (A 404 of the resource itself reads as "no such job" here; the create tells.)
    let existing = call(format!("get pytorchjob {ns}/{name}"), api.get_opt(&name)).await?;
    Ok(Observed {
        crd_present: true,
        existing: existing.map(typed),
    })
}

/// The typed job. The vendored CRD keeps pod templates unvalidated, so a job someone else
/// wrote may hold one the types cannot read: it is then judged by its metadata, status and
/// run policy alone (all the decision looks at).
pub fn typed(obj: DynamicObject) -> PyTorchJob {
    let value = serde_json::to_value(&obj).unwrap_or(Value::Null);
    if let Ok(job) = serde_json::from_value(value) {
        return job;
    }
    let mut job = PyTorchJob {
        status: serde_json::from_value(obj.data["status"].clone()).ok(),
        metadata: obj.metadata,
        ..PyTorchJob::default()
    };
    job.spec.run_policy = serde_json::from_value(obj.data["spec"]["runPolicy"].clone()).ok();
    job
}

/// Whether the PyTorchJob CRD is served (discovery of `kubeflow.org/v1`), cached briefly.
pub async fn crd_present(ctx: &Context) -> Result<bool, Error> {
    if let Some(p) = ctx.job_crd_cached() {
        return Ok(p);
    }
    let what = format!("discover {}", pytorchjob::API_VERSION);
    let present = match tokio::time::timeout(
        CALL_TIMEOUT,
        ctx.client.list_api_group_resources(pytorchjob::API_VERSION),
    )
    .await
    {
        Ok(Ok(list)) => list.resources.iter().any(|r| r.name == pytorchjob::PLURAL),
        Ok(Err(e)) if is_not_found(&e) => false,
        Ok(Err(e)) => return Err(Error::kube(what, e)),
        Err(_) => {
            return Err(Error::Timeout {
                what,
                after: CALL_TIMEOUT,
            });
        }
    };
    ctx.set_job_crd(present);
    Ok(present)
}
