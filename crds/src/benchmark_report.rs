//! `BenchmarkReport`: what a benchmark pod measured on one node, posted through the API and
//! owned by the plan that asked for it.

use kube::CustomResource;
use primus_oracle::report::BenchmarkResults;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Results of one single-node benchmark run (`primus bench`), with provenance, so the
/// calibration is auditable and can be reused by plans on the same GPU product and shapes.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "primus.dev",
    version = "v1alpha1",
    kind = "BenchmarkReport",
    plural = "benchmarkreports",
    singular = "benchmarkreport",
    shortname = "benchrep",
    category = "primus",
    namespaced,
    doc = "What a single-node benchmark pod measured (GEMMs, attention, memory-bound ops, in-node collectives), with provenance.",
    printcolumn = r#"{"name":"Plan","type":"string","jsonPath":".spec.plan"}"#,
    printcolumn = r#"{"name":"GPU","type":"string","jsonPath":".spec.results.gpuProduct"}"#,
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.results.node"}"#,
    printcolumn = r#"{"name":"Backend","type":"string","jsonPath":".spec.results.backend"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct BenchmarkReportSpec {
    /// Name of the TrainingPlan the benchmark ran for.
    pub plan: String,
    /// Everything measured, with provenance.
    pub results: BenchmarkResults,
}
