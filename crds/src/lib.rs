//! The Kubernetes API of Primus Projection (group `primus.dev`, version `v1alpha1`):
//! [`TrainingPlan`] (what users apply) and [`BenchmarkReport`] (what benchmark pods post); the
//! typed kubeflow.org/v1 [`PyTorchJob`] the operator creates and the webhook reads, with the
//! job writer ([`pytorchjob::pytorchjob`]); and every Kubernetes name ([`annotations`]).
//!
//! The plan's architecture, cluster, training and layout fields are the oracle's own types
//! (built with the oracle's `schema` feature), so the CRD, the CLI and the operator read one
//! definition. [`TrainingPlanSpec::to_oracle`] converts at the edge, through the oracle's
//! parser, so both paths apply the same rules and name fields the same way, and
//! [`TrainingPlanSpec::validate`] ([`validate`]) is the one validator the webhook, the
//! operator and the CLI call.

pub mod agent;
pub mod annotations;
pub mod benchmark_report;
pub mod crdgen;
pub mod job;
pub mod job_meta;
pub mod provenance;
pub mod pytorchjob;
pub mod training_plan;
pub mod trainjob;
pub mod validate;

pub use benchmark_report::{BenchmarkReport, BenchmarkReportSpec};
pub use pytorchjob::PyTorchJob;
pub use training_plan::{
    BenchmarkSpec, BenchmarkStatus, DriftSpec, DriftStatus, FinalistsSummary, JobKind, JobSpec,
    JobStatus, Launcher, LayoutSummary, MeasuredThroughput, Phase, PrometheusSource, RuntimeRef,
    SearchSummary, TrainingPlan, TrainingPlanSpec, TrainingPlanStatus,
};
pub use trainjob::TrainJob;
pub use validate::Runner;

/// API group of every kind here.
pub const GROUP: &str = "primus.dev";
/// API version of every kind here.
pub const VERSION: &str = "v1alpha1";
