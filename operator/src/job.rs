//! The PyTorchJob: built by the tuner's writer ([`primus_oracle::tune::job::pytorchjob`], the
//! same object `primus tune --emit pytorchjob` prints), owned by the plan, and created once.
//! A job that has not started is replaced when the chosen layout changes; a started job is
//! never touched (the status says the plan and the job differ). `spec.job.suspend` creates it
//! suspended and flips `runPolicy.suspend` of an existing job when the field changes (the
//! review flow); `autoSubmit: false` creates nothing. A cluster without the PyTorchJob CRD is
//! detected through discovery and reported in a condition.

use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, PropagationPolicy,
};
use primus_crds::{JobStatus, TrainingPlan, annotations};
use primus_oracle::layout::Layout;
use primus_oracle::plan::Plan;
use primus_oracle::tune::job::{JobOptions, pytorchjob};
use serde_json::Value;

use crate::context::Context;
use crate::error::{Error, is_conflict, is_not_found};
use crate::kubeapi::{
    PYTORCHJOB_API_VERSION, call, controlled_by, owner_reference, pytorchjob_resource,
};

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
    Created { name: String, suspended: bool },
    /// The job exists with the chosen layout.
    UpToDate {
        name: String,
        started: bool,
        suspended: bool,
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
        match self {
            Outcome::NotSubmitted | Outcome::CrdMissing => None,
            Outcome::NameTaken { name } => Some(JobStatus {
                name: Some(name.clone()),
                ..JobStatus::default()
            }),
            Outcome::Created { name, suspended } => Some(JobStatus {
                name: Some(name.clone()),
                layout_matches_plan: true,
                started: false,
                suspended: *suspended,
            }),
            Outcome::UpToDate {
                name,
                started,
                suspended,
            } => Some(JobStatus {
                name: Some(name.clone()),
                layout_matches_plan: true,
                started: *started,
                suspended: *suspended,
            }),
            Outcome::Replacing { name, .. } => Some(JobStatus {
                name: Some(name.clone()),
                layout_matches_plan: false,
                started: false,
                suspended: false,
            }),
            Outcome::Differs {
                name,
                started,
                suspended,
                ..
            } => Some(JobStatus {
                name: Some(name.clone()),
                layout_matches_plan: false,
                started: *started,
                suspended: *suspended,
            }),
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

/// Whether the job has started: a `Running`, `Restarting`, `Succeeded` or `Failed` condition
/// that is True, or replicas that are (or were) active. `Created` and `Suspended` do not count.
pub fn started(job: &Value) -> bool {
    let status = &job["status"];
    let by_condition = status["conditions"].as_array().is_some_and(|cs| {
        cs.iter().any(|c| {
            c["status"] == "True"
                && matches!(
                    c["type"].as_str(),
                    Some("Running" | "Restarting" | "Succeeded" | "Failed")
                )
        })
    });
    let by_replicas = status["replicaStatuses"].as_object().is_some_and(|rs| {
        rs.values().any(|r| {
            ["active", "succeeded", "failed"]
                .iter()
                .any(|k| r[*k].as_i64().unwrap_or(0) > 0)
        })
    });
    by_condition || by_replicas
}

/// Whether the job is suspended (`spec.runPolicy.suspend`).
pub fn suspended(job: &Value) -> bool {
    job["spec"]["runPolicy"]["suspend"].as_bool() == Some(true)
}

/// The layout a job says it runs (its `primus.dev/layout` annotation).
pub fn job_layout(job: &Value) -> Option<Layout> {
    job["metadata"]["annotations"][annotations::LAYOUT]
        .as_str()
        .and_then(|s| serde_json::from_str(s).ok())
}

/// The PyTorchJob of the chosen layout (pure; unit-tested).
pub fn desired(
    plan_obj: &TrainingPlan,
    plan: &Plan,
    layout: &Layout,
    projected_tokens_per_second: f64,
) -> Result<Value, primus_oracle::FieldError> {
    let job = plan_obj.spec.job.clone().unwrap_or_default();
    let opts = JobOptions {
        name: Some(job_name(plan_obj)),
        suspend: job.suspend == Some(true),
        projected_tokens_per_second: Some(projected_tokens_per_second),
        inline_model_card: plan_obj.spec.model.preset.is_none(),
    };
    pytorchjob(
        plan_obj.metadata.name.as_deref().unwrap_or_default(),
        plan_obj.metadata.namespace.as_deref(),
        &plan.scenario,
        layout,
        job.template.as_ref(),
        &opts,
    )
}

/// Whether the PyTorchJob CRD is served (discovery of `kubeflow.org/v1`), cached briefly.
pub async fn crd_present(ctx: &Context) -> Result<bool, Error> {
    if let Some(p) = ctx.job_crd_cached() {
        return Ok(p);
    }
    let present = match tokio::time::timeout(
        crate::kubeapi::CALL_TIMEOUT,
        ctx.client.list_api_group_resources(PYTORCHJOB_API_VERSION),
    )
    .await
    {
        Ok(Ok(list)) => list.resources.iter().any(|r| r.name == "pytorchjobs"),
        Ok(Err(e)) if is_not_found(&e) => false,
        Ok(Err(e)) => return Err(Error::kube("discover kubeflow.org/v1", e)),
        Err(_) => {
            return Err(Error::Timeout {
                what: "discover kubeflow.org/v1".into(),
                after: crate::kubeapi::CALL_TIMEOUT,
            });
        }
    };
    ctx.set_job_crd(present);
    Ok(present)
}

/// Bring the plan's job in line with the chosen layout (one step).
pub async fn ensure(
    ctx: &Context,
    plan_obj: &TrainingPlan,
    desired_job: &Value,
    layout: &Layout,
) -> Result<Outcome, Error> {
    let spec_job = plan_obj.spec.job.clone().unwrap_or_default();
    if spec_job.auto_submit == Some(false) {
        return Ok(Outcome::NotSubmitted);
    }
    if !crd_present(ctx).await? {
        return Ok(Outcome::CrdMissing);
    }
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let uid = plan_obj.metadata.uid.clone().unwrap_or_default();
    let name = job_name(plan_obj);
    let want_suspended = spec_job.suspend == Some(true);
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ns, &pytorchjob_resource());
    let what = format!("pytorchjob {ns}/{name}");

    // (A 404 of the resource itself reads as "no such job" here; the create below tells.)
    let existing =
        match tokio::time::timeout(crate::kubeapi::CALL_TIMEOUT, api.get_opt(&name)).await {
            Ok(Ok(j)) => j,
            Ok(Err(e)) => return Err(Error::kube(format!("get {what}"), e)),
            Err(_) => {
                return Err(Error::Timeout {
                    what: format!("get {what}"),
                    after: crate::kubeapi::CALL_TIMEOUT,
                });
            }
        };

    let Some(existing) = existing else {
        let mut body = desired_job.clone();
        body["metadata"]["ownerReferences"] =
            serde_json::to_value(vec![owner_reference(plan_obj)?]).map_err(|source| {
                Error::Serde {
                    what: format!("owner reference of {what}"),
                    source,
                }
            })?;
        let obj: DynamicObject = serde_json::from_value(body).map_err(|source| Error::Serde {
            what: what.clone(),
            source,
        })?;
        let pp = PostParams {
            field_manager: Some(crate::CONTROLLER.into()),
            ..PostParams::default()
        };
        match tokio::time::timeout(crate::kubeapi::CALL_TIMEOUT, api.create(&pp, &obj)).await {
            Ok(Ok(_)) => {
                ctx.metrics.jobs_created.inc();
                return Ok(Outcome::Created {
                    name,
                    suspended: want_suspended,
                });
            }
            // Someone (an earlier pass, the previous leader) created it meanwhile: look again.
            Ok(Err(e)) if is_conflict(&e) => {
                return Err(Error::kube(format!("create {what}"), e));
            }
            // The resource is not served: gone since discovery, or briefly unavailable while
            // the API server rebuilds its storage after a CRD update. Ask discovery afresh.
            Ok(Err(e)) if is_not_found(&e) => {
                ctx.forget_job_crd();
                if !crd_present(ctx).await? {
                    return Ok(Outcome::CrdMissing);
                }
                return Err(Error::kube(format!("create {what}"), e));
            }
            Ok(Err(e)) => return Err(Error::kube(format!("create {what}"), e)),
            Err(_) => {
                return Err(Error::Timeout {
                    what: format!("create {what}"),
                    after: crate::kubeapi::CALL_TIMEOUT,
                });
            }
        }
    };

    if !controlled_by(existing.metadata.owner_references.as_ref(), &uid) {
        return Ok(Outcome::NameTaken { name });
    }
    if existing.metadata.deletion_timestamp.is_some() {
        return Ok(Outcome::Replacing {
            name,
            old: String::new(),
        });
    }
    let value = serde_json::to_value(&existing).map_err(|source| Error::Serde {
        what: what.clone(),
        source,
    })?;
    let is_started = started(&value);
    let is_suspended = suspended(&value);
    let current = job_layout(&value);
    if current.as_ref() == Some(layout) {
        if is_suspended != want_suspended && !(is_started && want_suspended) {
            // The review flow: a human flips spec.job.suspend; pass it on.
            let patch = serde_json::json!({"spec": {"runPolicy": {"suspend": want_suspended}}});
            call(
                format!("patch {what} suspend={want_suspended}"),
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?;
            return Ok(Outcome::UpToDate {
                name,
                started: is_started,
                suspended: want_suspended,
            });
        }
        return Ok(Outcome::UpToDate {
            name,
            started: is_started,
            suspended: is_suspended,
        });
    }
    let old = current
        .map(|l| l.label())
        .unwrap_or_else(|| "unknown".into());
    if is_started {
        return Ok(Outcome::Differs {
            name,
            job_layout: old,
            started: true,
            suspended: is_suspended,
        });
    }
    // Not started: replace it. Background propagation lets the garbage collector remove
    // whatever pods the training operator made; the next pass creates the new job.
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        preconditions: Some(kube::api::Preconditions {
            uid: existing.metadata.uid.clone(),
            resource_version: existing.metadata.resource_version.clone(),
        }),
        ..DeleteParams::default()
    };
    match tokio::time::timeout(crate::kubeapi::CALL_TIMEOUT, api.delete(&name, &dp)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if is_not_found(&e) || is_conflict(&e) => {}
        Ok(Err(e)) => return Err(Error::kube(format!("delete {what}"), e)),
        Err(_) => {
            return Err(Error::Timeout {
                what: format!("delete {what}"),
                after: crate::kubeapi::CALL_TIMEOUT,
            });
        }
    }
    Ok(Outcome::Replacing { name, old })
}

#[cfg(test)]
mod tests {
    use super::*;
    use primus_crds::TrainingPlanSpec;
    use primus_oracle::profiles::Catalog;
    use serde_json::json;

    fn plan(extra: Value) -> (TrainingPlan, Plan) {
        let mut spec = json!({
            "model": {"preset": "llama3.1-8b"},
            "cluster": {"gpu": "h100-sxm", "gpus": 16},
            "training": {"seqLength": 4096, "globalBatchSize": 64},
        });
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().cloned().unwrap_or_default());
        let spec: TrainingPlanSpec = serde_json::from_value(spec).unwrap();
        let mut obj = TrainingPlan::new("p", spec);
        obj.metadata.namespace = Some("team".into());
        obj.metadata.uid = Some("uid-1".into());
        let plan = crate::choose::validate(&obj.spec, "p", &Catalog::builtin().unwrap()).unwrap();
        (obj, plan)
    }

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
        let j = desired(&obj, &p, &l, 1234.5).unwrap();
        let ann = &j["metadata"]["annotations"];
        assert_eq!(ann[annotations::PLAN], "p");
        assert_eq!(ann[annotations::PROJECTED_TOKENS_PER_SECOND], "1234.5");
        assert_eq!(job_layout(&j), Some(l.clone()));
        assert!(ann.get("argocd.argoproj.io/tracking-id").is_none());
        let labels = &j["metadata"]["labels"];
        assert!(labels.get("app.kubernetes.io/instance").is_none());
        assert_eq!(labels["team"], "a");
        assert!(suspended(&j));
        assert!(!started(&j));
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

    #[test]
    fn started_means_running_or_finished() {
        assert!(!started(
            &json!({"status": {"conditions": [{"type": "Created", "status": "True"}]}})
        ));
        assert!(!started(
            &json!({"status": {"conditions": [{"type": "Running", "status": "False"}]}})
        ));
        assert!(started(
            &json!({"status": {"conditions": [{"type": "Running", "status": "True"}]}})
        ));
        assert!(started(
            &json!({"status": {"replicaStatuses": {"Master": {"active": 1}}}})
        ));
        assert!(!started(
            &json!({"status": {"replicaStatuses": {"Master": {"active": 0}}}})
        ));
    }
}
