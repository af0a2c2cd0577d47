//! Annotation, label and field-manager names of Primus Projection: the operator writes them
//! (onto PyTorchJobs, status applies), the webhook and `primus` read them back, users set
//! some. Each is defined here once.

/// Job annotation: the TrainingPlan that created the job.
pub const PLAN: &str = "primus.dev/plan";
/// Job annotation: the layout (JSON of `spec.parallelism`) the job runs.
pub const LAYOUT: &str = "primus.dev/layout";
/// Job annotation: projected tokens/s per GPU of that layout.
pub const PROJECTED_TOKENS_PER_SECOND: &str = "primus.dev/projected-tokens-per-second";
/// Job annotation: model preset name.
pub const MODEL: &str = "primus.dev/model";
/// Job annotation: inline model card (JSON), when the plan did not use a preset.
pub const MODEL_CARD: &str = "primus.dev/model-card";
/// Job annotation: hardware profile name.
pub const GPU: &str = "primus.dev/gpu";
/// Job annotation: training settings (JSON: seqLength, globalBatchSize, precision).
pub const TRAINING: &str = "primus.dev/training";

/// BenchmarkReport annotation: the benchmark pod's signature of the report
/// (`v1.<attempt>.<hex HMAC-SHA256>`, see [`crate::provenance`]).
pub const REPORT_SIGNATURE: &str = "primus.dev/report-signature";

/// Label on a namespace: `strict` makes the webhook deny jobs it cannot derive.
pub const ADMISSION_MODE: &str = "primus.dev/admission";
/// Label on a PyTorchJob or namespace: `"true"` opts out of memory validation.
pub const SKIP_VALIDATION: &str = "primus.dev/skip-validation";
/// Field manager of the operator's server-side applies.
pub const OPERATOR_MANAGER: &str = "primus-operator";
/// Field manager of `primus report`.
pub const REPORT_MANAGER: &str = "primus-report";
/// Field manager of `primus bench --report-to` (the BenchmarkReports it applies).
pub const BENCH_MANAGER: &str = "primus-bench";
/// Field manager of the webhook's server-side applies (the caBundle of its configuration).
pub const WEBHOOK_MANAGER: &str = "primus-webhook";

/// Label naming the TrainingPlan an object belongs to (benchmark pods, BenchmarkReports): the
/// same key as the job annotation [`PLAN`].
pub const PLAN_LABEL: &str = PLAN;
/// The well-known label naming the tool that manages an object.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
