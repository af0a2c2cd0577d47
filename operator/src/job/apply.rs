//! Carry out a job [`Decision`]: create the job (owned by the plan), flip its suspend, or
//! delete it for a replacement. Calls go through the dynamic API: their answers are not read,
//! so a pod template the types cannot read never fails a call.

use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
    PropagationPolicy,
};
use primus_crds::job::{self, Job};
use primus_crds::{TrainingPlan, annotations};

use super::{Action, Decision, Outcome, crd_present, job_kind, job_name};
use crate::context::Context;
use crate::error::{Error, is_conflict, is_not_found};
use crate::kubeapi::{call, job_resource, owner_reference};

/// Apply the decision's action and return the outcome (a create that finds the resource gone
/// reports the CRD missing).
pub async fn apply(
    ctx: &Context,
    plan_obj: &TrainingPlan,
    decision: Decision,
) -> Result<Outcome, Error> {
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let name = job_name(plan_obj);
    let kind = job_kind(plan_obj);
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &job_resource(kind));
    let what = format!("{} {ns}/{name}", job::names(kind).kind);
    match decision.action {
        None => {}
        Some(Action::Create(mut job)) => {
            job.metadata_mut().owner_references = Some(vec![owner_reference(plan_obj)?]);
            let job: DynamicObject = serde_json::to_value(&job)
                .and_then(serde_json::from_value)
                .map_err(|source| Error::Serde {
                    what: what.clone(),
                    source,
                })?;
            let pp = PostParams {
                field_manager: Some(crate::CONTROLLER.into()),
                ..PostParams::default()
            };
            match call(format!("create {what}"), api.create(&pp, &job)).await {
                Ok(_) => ctx.metrics.jobs_created.inc(),
                // The resource is not served: gone since discovery, or briefly unavailable
                // while the API server rebuilds its storage after a CRD update. Ask discovery
                // afresh. (A conflict, someone creating it meanwhile, is retried: look again.)
                Err(Error::Kube { source, what }) if is_not_found(&source) => {
                    ctx.forget_job_crd(kind);
                    if !crd_present(ctx, kind).await? {
                        return Ok(Outcome::CrdMissing);
                    }
                    return Err(Error::Kube { source, what });
                }
                Err(e) => return Err(e),
            }
        }
        Some(Action::Suspend { suspend, applied }) => {
            let mut patch = serde_json::json!({"metadata": {"annotations": {
                annotations::SUSPEND_APPLIED: applied.to_string()}}});
            if let Some(s) = suspend {
                patch["spec"] = Job::suspend_patch(kind, s)["spec"].take();
            }
            let pp = PatchParams {
                field_manager: Some(crate::CONTROLLER.into()),
                ..PatchParams::default()
            };
            call(
                format!("patch {what} suspend={suspend:?} applied={applied}"),
                api.patch(&name, &pp, &Patch::Merge(&patch)),
            )
            .await?;
        }
        Some(Action::Delete {
            uid,
            resource_version,
        }) => {
            // Background propagation lets the garbage collector remove whatever pods the
            // training operator made.
            let dp = DeleteParams {
                propagation_policy: Some(PropagationPolicy::Background),
                preconditions: Some(Preconditions {
                    uid,
                    resource_version,
                }),
                ..DeleteParams::default()
            };
            match call(format!("delete {what}"), api.delete(&name, &dp)).await {
                Ok(_) => {}
                Err(Error::Kube { source, .. })
                    if is_not_found(&source) || is_conflict(&source) => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(decision.outcome)
}
