//! The PyTorchJob API types (kubeflow.org/v1), a hand subset after the training operator's Go
//! types, and what the operator and the webhook read from a job: its replicas in a stable
//! order, the training container, whether it started or is suspended, the layout it runs.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use primus_oracle::layout::Layout;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::job_meta;

/// Fields a struct here does not name, kept as they came.
pub type Extra = BTreeMap<String, Value>;

/// A kubeflow.org/v1 PyTorchJob.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PyTorchJob {
    /// Always `kubeflow.org/v1`.
    #[serde(default = "api_version")]
    pub api_version: String,
    /// Always `PyTorchJob`.
    #[serde(default = "kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: PyTorchJobSpec,
    /// Written by the training operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PyTorchJobStatus>,
    #[serde(flatten)]
    pub extra: Extra,
}

fn api_version() -> String {
    super::API_VERSION.to_string()
}

fn kind() -> String {
    super::KIND.to_string()
}

impl Default for PyTorchJob {
    fn default() -> Self {
        PyTorchJob {
            api_version: api_version(),
            kind: kind(),
            metadata: ObjectMeta::default(),
            spec: PyTorchJobSpec::default(),
            status: None,
            extra: Extra::new(),
        }
    }
}

/// `spec` of a PyTorchJob.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PyTorchJobSpec {
    /// Replica type (`Master`, `Worker`) to replica spec.
    #[serde(default)]
    pub pytorch_replica_specs: BTreeMap<String, ReplicaSpec>,
    /// Workers per node: `auto`, `cpu`, `gpu` or an integer, as a string in the CRD's schema
    /// (a number is read too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nproc_per_node: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_policy: Option<RunPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic_policy: Option<ElasticPolicy>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// One replica type.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaSpec {
    /// Pods of this type (the CRD's default is 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// `Always`, `OnFailure`, `Never` or `ExitCode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<PodTemplateSpec>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Runtime policies of the job (`spec.runPolicy`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunPolicy {
    /// `None`, `Running` or `All`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_pod_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds_after_finished: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_limit: Option<i32>,
    /// No pods while true (the review flow; queue managers such as Kueue flip it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed_by: Option<String>,
    /// Gang scheduling (Volcano, scheduler-plugins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_policy: Option<SchedulingPolicy>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Gang-scheduling settings (`spec.runPolicy.schedulingPolicy`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_timeout_seconds: Option<i32>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl RunPolicy {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == RunPolicy::default()
    }
}

/// Elastic training (`spec.elasticPolicy`): only the field read here is named.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ElasticPolicy {
    /// Workers per node of an elastic job.
    #[serde(
        default,
        rename = "nProcPerNode",
        skip_serializing_if = "Option::is_none"
    )]
    pub n_proc_per_node: Option<i32>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// What the training operator reports (`status`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct PyTorchJobStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<JobCondition>,
    /// Replica type to pod counts.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub replica_statuses: BTreeMap<String, ReplicaStatus>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A job condition: `Created`, `Running`, `Restarting`, `Succeeded`, `Failed`, `Suspended`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Pods of one replica type by state.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<i32>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl k8s_openapi::Resource for PyTorchJob {
    const API_VERSION: &'static str = super::API_VERSION;
    const GROUP: &'static str = super::GROUP;
    const KIND: &'static str = super::KIND;
    const VERSION: &'static str = super::VERSION;
    const URL_PATH_SEGMENT: &'static str = super::PLURAL;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::ListableResource for PyTorchJob {
    const LIST_KIND: &'static str = "PyTorchJobList";
}

impl k8s_openapi::Metadata for PyTorchJob {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl PyTorchJob {
    /// Whether the job has started: a `Running`, `Restarting`, `Succeeded` or `Failed`
    /// condition that is True, or replicas that are (or were) active. `Created` and
    /// `Suspended` do not count.
    pub fn started(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        let by_condition = status.conditions.iter().any(|c| {
            c.status == "True"
                && matches!(
                    c.type_.as_str(),
                    "Running" | "Restarting" | "Succeeded" | "Failed"
                )
        });
        let by_replicas = status.replica_statuses.values().any(|r| {
            [r.active, r.succeeded, r.failed]
                .iter()
                .any(|n| n.unwrap_or(0) > 0)
        });
        by_condition || by_replicas
    }

    /// Whether the job is suspended (`spec.runPolicy.suspend`).
    pub fn suspended(&self) -> bool {
        self.spec.run_policy.as_ref().and_then(|r| r.suspend) == Some(true)
    }

    /// The `spec.job.suspend` the operator last applied ([`job_meta::applied_suspend`]).
    pub fn applied_suspend(&self) -> Option<bool> {
        job_meta::applied_suspend(&self.metadata)
    }

    /// The queue the job is submitted to, if any: Kueue's queue-name label, Volcano's
    /// queue-name annotation, or `runPolicy.schedulingPolicy.queue`.
    pub fn queue(&self) -> Option<String> {
        let policy = self
            .spec
            .run_policy
            .as_ref()
            .and_then(|r| r.scheduling_policy.as_ref())
            .and_then(|p| p.queue.clone())
            .filter(|q| !q.is_empty());
        job_meta::queue(&self.metadata).or(policy)
    }

    /// The layout the job says it runs (its `primus.dev/layout` annotation).
    pub fn annotated_layout(&self) -> Option<Layout> {
        job_meta::annotated_layout(&self.metadata)
    }
}

impl PyTorchJobSpec {
    /// The replica types, `Master` first, then `Worker`, then the others by name (either
    /// spelling case).
    pub fn replicas_in_order(&self) -> Vec<(&str, &ReplicaSpec)> {
        let mut out: Vec<(&str, &ReplicaSpec)> = self
            .pytorch_replica_specs
            .iter()
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        out.sort_by_key(|(name, _)| match name.to_ascii_lowercase().as_str() {
            "master" => 0,
            "worker" => 1,
            _ => 2,
        });
        out
    }

    /// The spec without `runPolicy.suspend` (and without a `runPolicy` left empty by that):
    /// what an update that only flips suspend leaves unchanged.
    pub fn without_suspend(&self) -> PyTorchJobSpec {
        let mut s = self.clone();
        if let Some(rp) = &mut s.run_policy {
            rp.suspend = None;
            if rp.is_empty() {
                s.run_policy = None;
            }
        }
        s
    }
}

impl ReplicaSpec {
    /// The pod spec of the replica's template.
    pub fn pod_spec(&self) -> Option<&PodSpec> {
        self.template.as_ref()?.spec.as_ref()
    }

    /// The training container: the one named `pytorch`, else the only one.
    pub fn training_container(&self) -> Option<&Container> {
        let cs = &self.pod_spec()?.containers;
        cs.iter()
            .find(|c| c.name == super::CONTAINER)
            .or(if cs.len() == 1 { cs.first() } else { None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(v: Value) -> PyTorchJob {
        serde_json::from_value(v).expect("a PyTorchJob")
    }

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let v = json!({
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": "j", "namespace": "ns", "annotations": {"a": "b"}},
            "spec": {
                "futureField": {"x": [1, 2.5, null, "s"]},
                "nprocPerNode": "8",
                "runPolicy": {"suspend": true, "schedulingPolicy": {"queue": "q", "minAvailable": 2},
                              "cleanPodPolicy": "None", "backoffLimit": 3},
                "elasticPolicy": {"nProcPerNode": 8, "rdzvBackend": "c10d", "minReplicas": 1},
                "pytorchReplicaSpecs": {
                    "Master": {"replicas": 1, "restartPolicy": "OnFailure", "newKnob": true,
                               "template": {"metadata": {"labels": {"l": "v"}},
                                            "spec": {"containers": [{"name": "pytorch", "image": "i",
                                                     "args": ["--a", "1"],
                                                     "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                                                     "nodeSelector": {"k": "v"}}}},
                    "Worker": {"replicas": 3}
                }
            },
            "status": {
                "conditions": [{"type": "Running", "status": "True", "reason": "R",
                                "lastTransitionTime": "2025-01-01T00:00:00Z"}],
                "replicaStatuses": {"Master": {"active": 1, "selector": "x"}},
                "startTime": "2025-01-01T00:00:00Z"
            },
            "somethingElse": 1
        });
        let j = job(v.clone());
        assert_eq!(serde_json::to_value(&j).unwrap(), v);
        assert!(j.started());
        assert!(j.suspended());
        assert_eq!(j.spec.nproc_per_node, Some(IntOrString::String("8".into())));
        assert_eq!(
            j.spec.elastic_policy.as_ref().unwrap().n_proc_per_node,
            Some(8)
        );
        let names: Vec<&str> = j.spec.replicas_in_order().iter().map(|r| r.0).collect();
        assert_eq!(names, ["Master", "Worker"]);
        let c = j.spec.pytorch_replica_specs["Master"].training_container();
        assert_eq!(c.map(|c| c.image.as_deref()), Some(Some("i")));
    }

    #[test]
    fn started_and_suspended_read_status_and_run_policy() {
        let created = job(json!({"spec": {}, "status": {"conditions": [
            {"type": "Created", "status": "True"}, {"type": "Suspended", "status": "True"}]}}));
        assert!(!created.started());
        assert!(!created.suspended());
        let failed_once = job(json!({"status": {"replicaStatuses": {"Worker": {"failed": 1}}}}));
        assert!(failed_once.started());
        let not_running =
            job(json!({"status": {"conditions": [{"type": "Running", "status": "False"}]}}));
        assert!(!not_running.started());
        assert_eq!(created.api_version, "kubeflow.org/v1");
        assert_eq!(created.kind, "PyTorchJob");
    }

    #[test]
    fn replicas_are_ordered_master_worker_then_by_name() {
        let j = job(json!({"spec": {"pytorchReplicaSpecs": {
            "Aux": {}, "worker": {}, "MASTER": {}, "Zed": {}}}}));
        let names: Vec<&str> = j.spec.replicas_in_order().iter().map(|r| r.0).collect();
        assert_eq!(names, ["MASTER", "worker", "Aux", "Zed"]);
    }

    #[test]
    fn the_only_container_is_the_training_container() {
        let r: ReplicaSpec = serde_json::from_value(json!({"template": {"spec": {"containers": [
            {"name": "main", "image": "i"}]}}}))
        .unwrap();
        assert_eq!(
            r.training_container().map(|c| c.name.as_str()),
            Some("main")
        );
        let two: ReplicaSpec = serde_json::from_value(json!({"template": {"spec": {"containers": [
            {"name": "a"}, {"name": "b"}]}}}))
        .unwrap();
        assert!(two.training_container().is_none());
    }

    #[test]
    fn without_suspend_drops_only_suspend() {
        let s: PyTorchJobSpec =
            serde_json::from_value(json!({"runPolicy": {"suspend": true}})).unwrap();
        assert_eq!(s.without_suspend().run_policy, None);
        let s: PyTorchJobSpec = serde_json::from_value(
            json!({"runPolicy": {"suspend": false, "cleanPodPolicy": "All"}}),
        )
        .unwrap();
        let rp = s.without_suspend().run_policy.unwrap();
        assert_eq!(
            (rp.suspend, rp.clean_pod_policy.as_deref()),
            (None, Some("All"))
        );
    }

    #[test]
    fn type_errors_name_the_path_below_flattened_structs() {
        let e = primus_oracle::parse::from_value_at::<PyTorchJobSpec>(
            json!({"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [
                {"name": "pytorch", "args": [1]}]}}}}}),
            "spec",
        )
        .unwrap_err();
        assert_eq!(
            e.field,
            "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].args[0]"
        );
    }
}
