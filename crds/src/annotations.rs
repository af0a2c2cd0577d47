//! Annotation and label keys shared by the operator (which writes them onto PyTorchJobs), the
//! webhook (which reads them back) and users.

/// On a PyTorchJob: the TrainingPlan that created it.
pub const PLAN: &str = "primus.dev/plan";
/// On a PyTorchJob: the layout (the JSON of `spec.parallelism`) the job runs.
pub const LAYOUT: &str = "primus.dev/layout";
/// On a PyTorchJob: projected tokens/s per GPU of that layout.
pub const PROJECTED_TOKENS_PER_SECOND: &str = "primus.dev/projected-tokens-per-second";
/// On a PyTorchJob: model preset name, a shortcut instead of architecture flags.
pub const MODEL: &str = "primus.dev/model";
/// On a PyTorchJob: inline model card (JSON), when the plan used one.
pub const MODEL_CARD: &str = "primus.dev/model-card";
/// On a PyTorchJob: hardware profile name, when node selectors do not say.
pub const GPU: &str = "primus.dev/gpu";
/// On a PyTorchJob: training settings (JSON: seqLength, globalBatchSize, precision).
pub const TRAINING: &str = "primus.dev/training";
/// Label on a namespace: `strict` makes the webhook deny jobs it cannot derive.
pub const ADMISSION_MODE: &str = "primus.dev/admission";
/// Label on a PyTorchJob or namespace: `"true"` opts out of memory validation.
pub const SKIP_VALIDATION: &str = "primus.dev/skip-validation";
/// Field manager of the operator's server-side applies.
pub const OPERATOR_MANAGER: &str = "primus-operator";
/// Field manager of `primus report`.
pub const REPORT_MANAGER: &str = "primus-report";
