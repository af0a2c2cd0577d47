//! Carry out a benchmark [`Decision`]: stop a timed-out pod, start the next attempt's.

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, PostParams};
use primus_crds::TrainingPlan;
use primus_oracle::plan::Plan;

use super::{Action, Decision, Outcome, Settings, pod, token_secret};
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
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
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
                let pp = PostParams {
                    field_manager: Some(crate::CONTROLLER.into()),
                    ..PostParams::default()
                };
                // The attempt's token first: the pod reads it at start.
                let s = token_secret(plan_obj, &decision.report, *attempt, &config.report_key)?;
                let name = s.metadata.name.clone().unwrap_or_default();
                match call(
                    format!("create secret {ns}/{name}"),
                    secrets.create(&pp, &s),
                )
                .await
                {
                    Ok(_) => {}
                    // Made by an earlier pass: the same token (derived, not random).
                    Err(Error::Kube { source, .. }) if is_conflict(&source) => {}
                    Err(e) => return Err(e),
                }
                let p = pod(plan_obj, plan, settings, &decision.report, *attempt, config)?;
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
