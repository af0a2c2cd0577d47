//! Carry out a benchmark [`Decision`]: stop a timed-out pod, start the next attempt's.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use primus_crds::TrainingPlan;
use primus_oracle::plan::Plan;

use super::{Action, Decision, Outcome, Settings, pod};
use crate::context::Config;
use crate::error::{Error, is_conflict};
use crate::kubeapi::call;

/// Apply the decision's actions and return its outcome.
pub async fn apply(
    client: &kube::Client,
    config: &Config,
    plan_obj: &TrainingPlan,
    plan: &Plan,
    settings: &Settings,
    decision: Decision,
) -> Result<Outcome, Error> {
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for action in &decision.actions {
        match action {
            // Best effort: the status keeps the count, and a pod that lingers is not counted
            // twice (the next one gets the next number).
            Action::DeletePod(name) => {
                let _ = call(
                    format!("delete timed-out pod {ns}/{name}"),
                    pods.delete(name, &Default::default()),
                )
                .await;
            }
            Action::CreatePod { attempt } => {
                let p = pod(plan_obj, plan, settings, &decision.report, *attempt, config)?;
                let name = p.metadata.name.clone().unwrap_or_default();
                let pp = PostParams {
                    field_manager: Some(crate::CONTROLLER.into()),
                    ..PostParams::default()
                };
                match call(format!("create pod {ns}/{name}"), pods.create(&pp, &p)).await {
                    Ok(_) => {}
                    // Created by an earlier pass (or another replica before a failover).
                    Err(Error::Kube { source, .. }) if is_conflict(&source) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(decision.outcome)
}
