//! Annotation and label keys shared by the operator (which writes them onto PyTorchJobs), the
//! webhook (which reads them back) and users.

// The job annotations are defined once, next to the PyTorchJob writer in the oracle (which
// cannot depend on this crate), and re-exported here for the operator, the webhook and users.
pub use primus_oracle::tune::job::annotation::{
    GPU, LAYOUT, MODEL, MODEL_CARD, PLAN, PROJECTED_TOKENS_PER_SECOND, TRAINING,
};

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
