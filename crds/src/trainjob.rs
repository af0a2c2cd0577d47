//! A typed Kubeflow Trainer v2 `TrainJob` (trainer.kubeflow.org/v1alpha1): the subset of
//! Trainer's API (`pkg/apis/trainer/v1alpha1`: TrainJobSpec, RuntimeRef, Trainer,
//! TrainJobStatus) that Primus Projection writes and reads, and the writer of a chosen layout
//! as a TrainJob (`spec.job.kind: TrainJob`).
//!
//! A TrainJob names a training runtime (a ClusterTrainingRuntime such as Trainer's
//! `torch-distributed`, or a TrainingRuntime in its namespace) that holds the pod templates;
//! the job itself says the trainer's image, command, arguments, environment, node count,
//! processes per node and resources per node. The writer fills those exactly as it fills a
//! PyTorchJob's `pytorch` container ([`crate::pytorchjob::writer`]): the same Megatron flags or
//! Primus overrides, GPU resources, allocator environment and `primus.dev/*` annotations. Node
//! selection belongs to the runtime (a TrainJob has no pod template of its own); the
//! `primus.dev/gpu` annotation says which GPU the layout was projected for.
//!
//! Every struct keeps the fields it does not name in an `extra` map, so a job read and written
//! back loses nothing. The types are checked against the vendored CRD
//! (`crds/thirdparty/trainer.kubeflow.org_trainjobs.yaml`) by a test.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use primus_oracle::FieldError;
use primus_oracle::layout::Layout;
use primus_oracle::megatron::megatron_flags;
use primus_oracle::scenario::Scenario;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::job_meta;
use crate::pytorchjob::from_json_at;
use crate::pytorchjob::template::AT;
use crate::pytorchjob::writer::{
    JobOptions, fill_container, job_metadata, set_container_allocator_env, set_container_queue_env,
};
use crate::training_plan::RuntimeRef as PlanRuntimeRef;

/// API group of Kubeflow Trainer v2.
pub const GROUP: &str = "trainer.kubeflow.org";
/// API version of TrainJob.
pub const VERSION: &str = "v1alpha1";
/// `group/version` of TrainJob (the `apiVersion` field).
pub const API_VERSION: &str = "trainer.kubeflow.org/v1alpha1";
/// Kind.
pub const KIND: &str = "TrainJob";
/// Resource name (URL path segment).
pub const PLURAL: &str = "trainjobs";
/// The runtime a TrainJob uses unless the plan names one: Trainer's PyTorch runtime.
pub const DEFAULT_RUNTIME: &str = "torch-distributed";
/// Kind of the default runtime (cluster-scoped).
pub const CLUSTER_RUNTIME: &str = "ClusterTrainingRuntime";
/// Kind of a runtime in the job's namespace.
pub const NAMESPACED_RUNTIME: &str = "TrainingRuntime";

/// Fields a struct here does not name, kept as they came.
pub type Extra = BTreeMap<String, Value>;

/// A trainer.kubeflow.org/v1alpha1 TrainJob.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TrainJob {
    /// Always `trainer.kubeflow.org/v1alpha1`.
    #[serde(default = "api_version")]
    pub api_version: String,
    /// Always `TrainJob`.
    #[serde(default = "kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: TrainJobSpec,
    /// Written by the Trainer controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<TrainJobStatus>,
    #[serde(flatten)]
    pub extra: Extra,
}

fn api_version() -> String {
    API_VERSION.to_string()
}

fn kind() -> String {
    KIND.to_string()
}

impl Default for TrainJob {
    fn default() -> Self {
        TrainJob {
            api_version: api_version(),
            kind: kind(),
            metadata: ObjectMeta::default(),
            spec: TrainJobSpec::default(),
            status: None,
            extra: Extra::new(),
        }
    }
}

/// `spec` of a TrainJob.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TrainJobSpec {
    /// The training runtime the job runs on (required by the CRD).
    #[serde(default)]
    pub runtime_ref: RuntimeRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trainer: Option<Trainer>,
    /// Whether the job is suspended (its pods are not created while true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.runtimeRef`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeRef {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// `spec.trainer`: what the training nodes run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Trainer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<Vec<EnvVar>>,
    /// Training nodes (pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_nodes: Option<i32>,
    /// Processes per node (one per GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_proc_per_node: Option<i32>,
    /// Resources of each node's trainer container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources_per_node: Option<ResourceRequirements>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `status` of a TrainJob.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct TrainJobStatus {
    /// `Suspended`, `Complete`, `Failed` (metav1.Condition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Pods of each replicated job by state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs_status: Vec<JobsStatus>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A condition of a TrainJob.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Pod counts of one replicated job (`node`, `dataset-initializer`, ...).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobsStatus {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub active: i32,
    #[serde(default)]
    pub ready: i32,
    #[serde(default)]
    pub succeeded: i32,
    #[serde(default)]
    pub failed: i32,
    #[serde(default)]
    pub suspended: i32,
    #[serde(flatten)]
    pub extra: Extra,
}

impl k8s_openapi::Resource for TrainJob {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = PLURAL;
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::ListableResource for TrainJob {
    const LIST_KIND: &'static str = "TrainJobList";
}

impl k8s_openapi::Metadata for TrainJob {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl TrainJob {
    /// Whether the job has started: a `Complete` or `Failed` condition that is True, or pods
    /// of a replicated job that are (or were) active. `Suspended` does not count.
    pub fn started(&self) -> bool {
        let Some(status) = &self.status else {
            return false;
        };
        let by_condition = status
            .conditions
            .iter()
            .any(|c| c.status == "True" && matches!(c.type_.as_str(), "Complete" | "Failed"));
        let by_pods = status
            .jobs_status
            .iter()
            .any(|j| j.active > 0 || j.ready > 0 || j.succeeded > 0 || j.failed > 0);
        by_condition || by_pods
    }

    /// Whether the job is suspended (`spec.suspend`).
    pub fn suspended(&self) -> bool {
        self.spec.suspend == Some(true)
    }

    /// The `spec.job.suspend` the operator last applied ([`job_meta::applied_suspend`]).
    pub fn applied_suspend(&self) -> Option<bool> {
        job_meta::applied_suspend(&self.metadata)
    }

    /// The queue the job is submitted to (Kueue's label, Volcano's annotation).
    pub fn queue(&self) -> Option<String> {
        job_meta::queue(&self.metadata)
    }

    /// The layout the job says it runs (its `primus.dev/layout` annotation).
    pub fn annotated_layout(&self) -> Option<Layout> {
        job_meta::annotated_layout(&self.metadata)
    }
}

/// A parsed `spec.job.template` for a TrainJob: a whole TrainJob or just its spec.
struct Template {
    metadata: ObjectMeta,
    spec: TrainJobSpec,
    spec_at: String,
}

fn parse_template(template: Option<&Value>) -> Result<Template, FieldError> {
    let Some(t) = template else {
        return Ok(Template {
            metadata: ObjectMeta::default(),
            spec: TrainJobSpec::default(),
            spec_at: AT.to_string(),
        });
    };
    let Value::Object(obj) = t else {
        return Err(FieldError::new(
            AT,
            "must be a TrainJob or its spec (a mapping)",
        ));
    };
    for (key, want) in [("kind", KIND), ("apiVersion", API_VERSION)] {
        if let Some(v) = obj.get(key)
            && v != want
        {
            return Err(FieldError::new(
                format!("{AT}.{key}"),
                format!("expected {want} (spec.job.kind is TrainJob), got {v}"),
            ));
        }
    }
    if obj.contains_key("spec") && !obj.contains_key("trainer") {
        let metadata = match obj.get("metadata") {
            None | Some(Value::Null) => ObjectMeta::default(),
            Some(m @ Value::Object(_)) => from_json_at(m, &format!("{AT}.metadata"))?,
            Some(_) => {
                return Err(FieldError::new(
                    format!("{AT}.metadata"),
                    "must be a mapping",
                ));
            }
        };
        let spec_at = format!("{AT}.spec");
        let spec = match obj.get("spec") {
            Some(s @ Value::Object(_)) => from_json_at(s, &spec_at)?,
            _ => return Err(FieldError::new(spec_at, "must be a mapping")),
        };
        return Ok(Template {
            metadata,
            spec,
            spec_at,
        });
    }
    Ok(Template {
        metadata: ObjectMeta::default(),
        spec: from_json_at(t, AT)?,
        spec_at: AT.to_string(),
    })
}

/// A template that is a PyTorchJob's (its replica specs or process count) cannot be a
/// TrainJob's: refused rather than carried along as unknown fields.
fn not_a_pytorchjob(t: &Template) -> Result<(), FieldError> {
    for key in ["pytorchReplicaSpecs", "nprocPerNode", "runPolicy"] {
        if t.spec.extra.contains_key(key) {
            return Err(FieldError::new(
                format!("{}.{key}", t.spec_at),
                "is a PyTorchJob field: spec.job.kind is TrainJob, whose template is a TrainJob or its spec (trainer, runtimeRef)",
            ));
        }
    }
    Ok(())
}

/// The runtime reference: the plan's `spec.job.runtimeRef`, else the template's, else
/// Trainer's `torch-distributed` ClusterTrainingRuntime.
fn runtime_ref(
    plan: Option<&PlanRuntimeRef>,
    template: &RuntimeRef,
    template_at: &str,
) -> Result<RuntimeRef, FieldError> {
    let from_plan = plan.filter(|r| r.name.is_some() || r.kind.is_some());
    let (name, kind, at) = match from_plan {
        Some(r) => (
            r.name.clone(),
            r.kind.clone(),
            "spec.job.runtimeRef".to_string(),
        ),
        None => (
            (!template.name.is_empty()).then(|| template.name.clone()),
            template.kind.clone(),
            format!("{template_at}.runtimeRef"),
        ),
    };
    let kind = kind.unwrap_or_else(|| CLUSTER_RUNTIME.to_string());
    if kind != CLUSTER_RUNTIME && kind != NAMESPACED_RUNTIME {
        return Err(FieldError::new(
            format!("{at}.kind"),
            format!("{kind:?} is not {CLUSTER_RUNTIME} or {NAMESPACED_RUNTIME}"),
        ));
    }
    Ok(RuntimeRef {
        name: name.unwrap_or_else(|| DEFAULT_RUNTIME.to_string()),
        api_group: Some(GROUP.to_string()),
        kind: Some(kind),
    })
}

/// A complete trainer.kubeflow.org/v1alpha1 TrainJob running layout `l` of scenario `s`.
///
/// `template` is the plan's `spec.job.template` (a whole TrainJob or its spec); `runtime` the
/// plan's `spec.job.runtimeRef`. What is set whatever the template says: the runtime reference
/// (kind checked), `trainer.numNodes` and `trainer.numProcPerNode`, the trainer's image
/// (default [`crate::pytorchjob::writer::default_image`] unless the template gives a trainer),
/// command and the layout's flags or overrides, GPU resources per node and environment,
/// `spec.suspend` when [`JobOptions::suspend`] is set, and the `primus.dev/*` annotations.
pub fn trainjob(
    plan_name: &str,
    namespace: Option<&str>,
    s: &Scenario,
    l: &Layout,
    template: Option<&Value>,
    runtime: Option<&PlanRuntimeRef>,
    opts: &JobOptions,
) -> Result<TrainJob, FieldError> {
    let t = parse_template(template)?;
    not_a_pytorchjob(&t)?;
    let nodes = s.cluster.nodes().max(1);
    let nproc = s.cluster.gpus.min(s.cluster.gpus_per_node).max(1);
    let mut spec = t.spec;
    spec.runtime_ref = runtime_ref(runtime, &spec.runtime_ref, &t.spec_at)?;
    let from_user = spec.trainer.is_some();
    let trainer = spec.trainer.take().unwrap_or_default();
    let mut container = Container {
        name: "trainer".to_string(),
        image: trainer.image,
        command: trainer.command,
        args: trainer.args,
        env: trainer.env,
        resources: trainer.resources_per_node,
        ..Container::default()
    };
    let at = format!("{}.trainer", t.spec_at);
    fill_container(
        &mut container,
        s,
        &megatron_flags(s, l),
        from_user,
        nproc,
        &at,
        opts,
    )?;
    set_container_allocator_env(&mut container, s.hardware.vendor, l.expandable_segments);
    set_container_queue_env(&mut container, l);
    // A TrainJob's trainer has no working directory: the default script gets its full path.
    if let (Some(dir), Some(cmd)) = (container.working_dir.take(), container.command.as_mut())
        && let Some(script) = cmd
            .iter_mut()
            .find(|w| w.ends_with(".py") && !w.starts_with('/'))
    {
        *script = format!("{}/{script}", dir.trim_end_matches('/'));
    }
    spec.trainer = Some(Trainer {
        image: container.image,
        command: container.command,
        args: container.args,
        env: container.env,
        num_nodes: Some(i32::try_from(nodes).unwrap_or(i32::MAX)),
        num_proc_per_node: Some(i32::try_from(nproc).unwrap_or(i32::MAX)),
        resources_per_node: container.resources,
        extra: trainer.extra,
    });
    if opts.suspend {
        spec.suspend = Some(true);
    }
    Ok(TrainJob {
        metadata: job_metadata(t.metadata, plan_name, namespace, s, l, opts),
        spec,
        ..TrainJob::default()
    })
}
