//! `TrainingPlan`: one document that drives the `primus` CLI and the operator alike.

use k8s_openapi::api::core::v1::{PodSecurityContext, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use primus_oracle::FieldError;
use primus_oracle::layout::Layout;
use primus_oracle::plan::{ClusterSpec, ModelRef, PlanSpec, Tuning};
use primus_oracle::report::Backend;
use primus_oracle::scenario::Training;
use primus_oracle::tune::trials::TrialSummary;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A training job to plan: the model, the cluster, the training settings, optionally a layout
/// (projected as given, or the tuner's reference), how to tune, whether to benchmark a node
/// first, and the PyTorchJob template the chosen layout is written into.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "primus.dev",
    version = "v1alpha1",
    kind = "TrainingPlan",
    plural = "trainingplans",
    singular = "trainingplan",
    shortname = "tplan",
    category = "primus",
    namespaced,
    doc = "A training job to plan: Primus Projection projects per-GPU memory and step time of its parallel layouts, tunes the layout and creates a PyTorchJob with the best one.",
    status = "TrainingPlanStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".spec.cluster.gpus"}"#,
    printcolumn = r#"{"name":"Layout","type":"string","jsonPath":".status.chosen.label"}"#,
    printcolumn = r#"{"name":"Tok/s/GPU","type":"number","format":"float","jsonPath":".status.chosen.tokensPerSecondPerGpu"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct TrainingPlanSpec {
    /// The model: a preset name (`primus profiles` lists them) or an inline architecture card.
    pub model: ModelRef,
    /// The cluster: GPU kind (hardware profile), GPU count, GPUs per node.
    pub cluster: ClusterSpec,
    /// Sequence length, global batch size and precision.
    pub training: Training,
    /// A parallel layout. Projected as given with searcher `none`; otherwise the reference the
    /// tuned layout's gain is reported against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<Layout>,
    /// How to search for the best layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<Tuning>,
    /// Single-node benchmark pods that calibrate the projection before tuning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<BenchmarkSpec>,
    /// The PyTorchJob to create with the chosen layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobSpec>,
    /// How measured throughput is compared with the projection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftSpec>,
}

impl TrainingPlanSpec {
    /// The oracle's view of this spec, through the oracle's own parser (same rules, same
    /// field names as `primus tune -f plan.yaml`). The operator's fields (benchmark, job,
    /// drift) are left out: the oracle does not read them, and the job template is free-form.
    pub fn to_oracle(&self) -> Result<PlanSpec, FieldError> {
        let oracle_fields = TrainingPlanSpec {
            benchmark: None,
            job: None,
            drift: None,
            ..self.clone()
        };
        let value = serde_json::to_value(&oracle_fields)
            .map_err(|e| FieldError::new("spec", format!("cannot be serialized: {e}")))?;
        PlanSpec::from_json(value)
    }
}

/// Single-node benchmark settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[schemars(transform = primus_oracle::bounds::schema::<BenchmarkSpec>)]
#[serde(rename_all = "camelCase")]
pub struct BenchmarkSpec {
    /// Run benchmark pods on one node of the plan's GPU kind before projecting.
    #[serde(default)]
    pub enabled: bool,
    /// Container image holding `primus` (defaults to the operator's configured image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Measurement backend; defaults to the GPU vendor's (`rocm` for AMD, `cuda` for NVIDIA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<Backend>,
    /// Tolerations for the benchmark pod (GPU nodes are often tainted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,
    /// Pod security context of the benchmark pod, e.g. `supplementalGroups` with the node's
    /// `render`/`video` group IDs so a non-root image can open `/dev/kfd` and `/dev/dri` on AMD
    /// nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security_context: Option<PodSecurityContext>,
    /// Seconds to wait for a benchmark report before retrying (default 900).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    /// Benchmark attempts before giving up (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// Reuse a report of the same GPU product and layer shapes younger than this many hours
    /// (default 168; 0 disables reuse).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reuse_within_hours: Option<u32>,
}

/// The job the operator creates (a PyTorchJob, or a TrainJob with `kind: TrainJob`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[schemars(transform = primus_oracle::bounds::schema::<JobSpec>)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    /// A kubeflow.org/v1 PyTorchJob (or just its `spec`) that the chosen layout is written into:
    /// replicas, nprocPerNode, GPU resources and the Megatron flags of the `pytorch` container.
    /// With `kind: TrainJob`, a TrainJob (or its spec): numNodes, numProcPerNode,
    /// resourcesPerNode and the flags of `trainer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object")]
    pub template: Option<serde_json::Value>,
    /// Create the job at all (default true). With false the chosen layout is only reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_submit: Option<bool>,
    /// Create the job suspended (`runPolicy.suspend: true`; a TrainJob's `spec.suspend`) so a
    /// human can review it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend: Option<bool>,
    /// Name of the job (default: the plan's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The kind of job written: `PyTorchJob` (kubeflow.org/v1, the default) or `TrainJob`
    /// (Kubeflow Trainer v2, trainer.kubeflow.org/v1alpha1: the template is then a TrainJob
    /// or its spec, and the job runs on `runtimeRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<JobKind>,
    /// What the container runs: `megatron` (the default: Megatron-LM with the layout as
    /// flags) or `primus` (AMD's `primus-cli ... -- train pretrain --config EXPERIMENT` with
    /// the layout as Primus overrides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher: Option<Launcher>,
    /// With `launcher: primus`: the experiment YAML (a path in the image) when the template's
    /// container runs no Primus command of its own (default
    /// `examples/megatron/exp_pretrain.yaml`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub experiment: Option<String>,
    /// With `kind: TrainJob`: the training runtime (default the ClusterTrainingRuntime
    /// `torch-distributed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_ref: Option<RuntimeRef>,
}

/// The kind of job the operator writes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
pub enum JobKind {
    /// kubeflow.org/v1 PyTorchJob (Kubeflow training operator v1).
    #[default]
    PyTorchJob,
    /// trainer.kubeflow.org/v1alpha1 TrainJob (Kubeflow Trainer v2).
    TrainJob,
}

/// What the job's container runs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum Launcher {
    /// Megatron-LM (`pretrain_gpt.py`) with the layout as flags.
    #[default]
    Megatron,
    /// AMD's Primus (`primus-cli`) with the layout as overrides.
    Primus,
}

/// A TrainJob's training runtime.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[schemars(transform = primus_oracle::bounds::schema::<RuntimeRef>)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeRef {
    /// Name of the runtime (default `torch-distributed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `ClusterTrainingRuntime` (the default) or `TrainingRuntime` (in the plan's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

/// Projection drift settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[schemars(transform = primus_oracle::bounds::schema::<DriftSpec>)]
#[serde(rename_all = "camelCase")]
pub struct DriftSpec {
    /// Allowed |measured / projected - 1| before `DriftWithinTolerance` turns False (default 0.10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
    /// Read measured throughput from Prometheus instead of `status.measured`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSource>,
}

/// A Prometheus query that yields the job's measured tokens/s per GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[schemars(transform = primus_oracle::bounds::schema::<PrometheusSource>)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSource {
    /// Base URL of the Prometheus HTTP API, e.g. `http://prometheus.monitoring:9090`.
    pub url: String,
    /// PromQL instant query returning one sample: measured tokens/s per GPU.
    pub query: String,
}

/// What the operator observed and decided.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct TrainingPlanStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// One word: Pending, Benchmarking, Tuning, Ready, Stalled or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// kstatus conditions (Ready, Reconciling, Stalled) and domain conditions (Benchmarked,
    /// Projected, Tuned, JobCreated, DriftWithinTolerance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Provenance of the benchmark that calibrated the projection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<BenchmarkStatus>,
    /// The chosen layout and its projection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chosen: Option<LayoutSummary>,
    /// The plan's own `spec.parallelism`, projected, when given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<LayoutSummary>,
    /// chosen / reference tokens/s/GPU - 1, when the plan gives a reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gain_over_reference: Option<f64>,
    /// The best alternatives after the chosen one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<LayoutSummary>,
    /// What the search did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search: Option<SearchSummary>,
    /// The PyTorchJob created for the chosen layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobStatus>,
    /// Measured throughput, written by `primus report` (field manager `primus-report`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredThroughput>,
    /// Measured against projected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftStatus>,
}

/// One word: Pending, Benchmarking, Tuning, Ready, Stalled or Failed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Work is under way that is neither benchmarking nor tuning (a job being replaced).
    Pending,
    /// A benchmark pod runs; the projection waits for its report.
    Benchmarking,
    /// The tuner is searching layouts.
    Tuning,
    /// The layout is chosen and the job is as the plan wants it.
    Ready,
    /// The plan cannot progress until something changes (the spec, the cluster).
    Stalled,
    /// Every benchmark attempt failed.
    Failed,
}

impl Phase {
    /// The word written to the status.
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Benchmarking => "Benchmarking",
            Phase::Tuning => "Tuning",
            Phase::Ready => "Ready",
            Phase::Stalled => "Stalled",
            Phase::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A layout and what the oracle projects for it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LayoutSummary {
    /// One-line label, e.g. `TP4 PP8 VPP5 MBS1 interleaved`.
    pub label: String,
    /// The layout (the fields of `spec.parallelism`).
    pub layout: Layout,
    /// Data-parallel size.
    pub dp: u32,
    /// Projected tokens per second per GPU.
    pub tokens_per_second_per_gpu: f64,
    /// Projected model TFLOP/s per GPU.
    pub tflops_per_gpu: f64,
    /// Projected model FLOPs utilisation (fraction of dense peak).
    pub mfu: f64,
    /// Projected seconds per iteration.
    pub step_time_seconds: f64,
    /// Predicted peak memory of the bottleneck pipeline stage, bytes.
    pub peak_memory_bytes: f64,
    /// Usable memory per GPU, bytes.
    pub usable_memory_bytes: f64,
    /// What dominates the step: compute, bubble or exposed communication.
    pub dominant: String,
    /// Whether the numbers use a benchmark calibration.
    pub calibrated: bool,
    /// Whether the numbers use kernels timed at this layout's own shapes (a finalist the
    /// benchmark measured), not ratios interpolated from other shapes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measured_kernels: bool,
}

/// What the search did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchSummary {
    /// Searcher used.
    pub searcher: String,
    /// Layouts projected.
    pub evaluated: u64,
    /// Layouts discarded by the memory pre-filter.
    pub rejected_by_memory: u64,
    /// Layouts discarded by the legality rules.
    pub rejected_by_rules: u64,
    /// Wall time of the search, seconds.
    pub seconds: f64,
    /// The layouts tried, in brief: per source (reference, seed, exhaustive, evolutionary,
    /// agent) the trials, how many were scored and the best; the agent's rounds, proposals
    /// accepted and rejected (by rule, by memory, other) and failed requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trials: Option<TrialSummary>,
    /// The chosen layout against `spec.parallelism`, term by term (step, compute, bubble,
    /// each exposed communication, memory headroom), one line each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub explanation: Vec<String>,
    /// Searcher `agent` whose endpoint did not answer (or none is configured): why; the
    /// exhaustive search's answer was used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_unavailable: Option<String>,
    /// The final ranking of the best layouts by kernels measured at their own shapes (with a
    /// benchmark report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalists: Option<FinalistsSummary>,
}

/// The best layouts ranked by measured kernels.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FinalistsSummary {
    /// Finalists (the chosen layout and the candidates).
    pub finalists: u32,
    /// Of them, those projected with kernels timed at their own shapes.
    pub measured: u32,
    /// Whether the measured kernels changed the tuner's order.
    pub order_changed: bool,
    /// What changed, in one line (empty when nothing did).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub change: String,
}

/// Provenance of the benchmark used.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct BenchmarkStatus {
    /// Name of the BenchmarkReport.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
    /// Node the benchmark ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// GPU product the driver reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_product: Option<String>,
    /// Driver version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// When the measurement finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// True when the numbers come from `primus bench --backend simulate`, not a GPU.
    #[serde(default)]
    pub simulated: bool,
    /// True when an earlier matching report was reused.
    #[serde(default)]
    pub reused: bool,
    /// Benchmark pods started for this plan so far.
    #[serde(default)]
    pub attempts: u32,
}

/// The PyTorchJob the operator manages.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// Name of the PyTorchJob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Whether the job's layout equals the currently chosen layout.
    #[serde(default)]
    pub layout_matches_plan: bool,
    /// Whether the job has started running (it is then never replaced).
    #[serde(default)]
    pub started: bool,
    /// Whether the job was created suspended.
    #[serde(default)]
    pub suspended: bool,
}

/// Throughput measured by the running job.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeasuredThroughput {
    /// Measured tokens per second per GPU.
    pub tokens_per_second_per_gpu: f64,
    /// When it was reported (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reported_at: Option<String>,
    /// Who reported it (`primus report`, `prometheus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

/// Measured against projected.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DriftStatus {
    /// measured / projected - 1.
    pub ratio: f64,
    /// The tolerance in force.
    pub tolerance: f64,
    /// |ratio| <= tolerance.
    pub within_tolerance: bool,
}

/// Schema of a free-form object whose unknown fields the API server must keep.
fn preserve_unknown_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}
