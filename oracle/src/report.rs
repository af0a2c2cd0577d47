//! The results of a single-node benchmark run: what `primus bench` measures and posts as a
//! `BenchmarkReport` (the CRD embeds this type), and what the calibration reads. Plain data,
//! so the oracle can be calibrated from a JSON file on a laptop as well as from the cluster.

use serde::{Deserialize, Serialize};

use crate::bounds::{self, Bound, Bounded, Seen, limits};
use crate::error::FieldError;
use crate::layout::Layout;
use crate::precision::Precision;

/// Where the numbers came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// AMD GPUs through HIP, hipBLASLt/rocBLAS and RCCL.
    Rocm,
    /// NVIDIA GPUs through CUDA, cuBLASLt/cuBLAS and NCCL.
    Cuda,
    /// No GPU: the analytic model produced the numbers (marked as simulated everywhere).
    #[default]
    Simulate,
}

/// One timed operation: a GEMM, an attention core, a memory-bound kernel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<OpMeasurement>))]
#[serde(rename_all = "camelCase")]
pub struct OpMeasurement {
    /// What the op is, e.g. `dense.qkv.fwd`, `moe.expert_fc1.dgrad`, `attention.core.bwd`.
    pub name: String,
    /// Op kind: `gemm`, `grouped-gemm`, `attention`, `memory-bound`.
    pub kind: String,
    /// GEMM shape M x N x K (for attention: batch*heads, seq, head dim; for memory-bound ops
    /// `[bytes, 0, 0]`).
    pub shape: Vec<u64>,
    /// Precision the op ran at.
    pub precision: Precision,
    /// FLOPs of one run (0 for memory-bound ops).
    pub flops: f64,
    /// Bytes moved from/to HBM by one run (estimate).
    pub bytes: f64,
    /// Median time of the timed runs, seconds.
    pub median_seconds: f64,
    /// Spread of the timed runs: (p90 - p10) / median.
    pub spread: f64,
    /// Number of timed runs (after warm-up).
    pub runs: u32,
}

/// One timed collective inside the node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<CollectiveMeasurement>))]
#[serde(rename_all = "camelCase")]
pub struct CollectiveMeasurement {
    /// `all-reduce`, `reduce-scatter`, `all-gather`, `all-to-all`, `p2p`.
    pub op: String,
    /// GPUs in the group.
    pub group_size: u32,
    /// Message size in bytes (the full buffer, NCCL's "size" convention).
    pub bytes: f64,
    /// Median time, seconds.
    pub median_seconds: f64,
    /// Spread: (p90 - p10) / median.
    pub spread: f64,
    /// Bus bandwidth (NCCL convention), GB/s.
    pub bus_bandwidth_gbps: f64,
    /// Number of timed runs.
    pub runs: u32,
}

/// Everything one benchmark run measured, with its provenance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<BenchmarkResults>))]
#[serde(rename_all = "camelCase")]
pub struct BenchmarkResults {
    /// Measurement backend; `simulate` means no GPU was used.
    pub backend: Backend,
    /// Hardware profile name the plan asked for, e.g. `mi300x`.
    pub gpu: String,
    /// GPU product as the driver reports it, e.g. `AMD Instinct MI300X`.
    pub gpu_product: String,
    /// GPUs on the node that took part.
    pub gpu_count: u32,
    /// Kubernetes node (or host) name.
    pub node: String,
    /// Driver version.
    pub driver_version: String,
    /// Runtime and library versions, e.g. `HIP 6.2 / hipBLASLt 0.10 / RCCL 2.20`.
    pub runtime_version: String,
    /// When the run started (RFC 3339).
    pub started_at: String,
    /// When the run finished (RFC 3339).
    pub finished_at: String,
    /// Model card name the shapes came from.
    pub model: String,
    /// Key of the layer shapes measured (model, downscaled TP/EP, seq, mbs, precision); a
    /// report with the same key and GPU product can be reused.
    pub shapes_key: String,
    /// The layout the plan targets.
    pub target_layout: Layout,
    /// The single-node layout that was measured.
    pub measured_layout: Layout,
    /// Axes reduced to fit the node, e.g. `["pp 8->1", "ep 64->8"]`.
    pub reduced_axes: Vec<String>,
    /// Timed compute ops.
    pub ops: Vec<OpMeasurement>,
    /// Timed in-node collectives.
    pub collectives: Vec<CollectiveMeasurement>,
    /// Peak device memory seen during the run, bytes.
    pub peak_memory_bytes: f64,
    /// The kernels of the tuner's finalists at their own one-node shapes (those whose shapes
    /// differ from `measuredLayout`'s), for ranking them by measured kernels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub finalists: Vec<FinalistMeasurement>,
}

/// The kernels of one finalist layout, timed at its own one-node shapes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<FinalistMeasurement>))]
#[serde(rename_all = "camelCase")]
pub struct FinalistMeasurement {
    /// The finalist (the full-scale layout the tuner ranked).
    pub layout: Layout,
    /// The one-node layout its kernels were timed at.
    pub measured_layout: Layout,
    /// Key of those shapes ([`crate::bench::shapes_key`] of the plan with this layout).
    pub shapes_key: String,
    /// Timed compute ops at those shapes.
    pub ops: Vec<OpMeasurement>,
}

/// Timed ops of one report: a layer's op list at a few shapes is a few hundred.
pub const MAX_REPORT_OPS: u64 = 4096;
/// Timed collectives of one report: a few sizes of a few ops per group size.
pub const MAX_REPORT_COLLECTIVES: u64 = 1024;
/// Dimensions of one op's shape (GEMMs: three).
pub const MAX_SHAPE_DIMS: u64 = 8;
/// Finalists one report measures (the tuner's top K, K at most this).
pub const MAX_FINALISTS: u64 = 8;
/// Timed ops of one finalist (its layer's op list, like the report's own).
pub const MAX_FINALIST_OPS: u64 = 512;

/// One finalist's kernels, bounded.
impl Bounded for FinalistMeasurement {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("shapesKey", limits::TEXT, |f| (&f.shapes_key).into()),
        Bound::items("ops", MAX_FINALIST_OPS, |f| Seen::Items(f.ops.len())),
    ];

    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        bounds::check_rows(self, at, Self::BOUNDS)?;
        bounds::check(&self.layout, &bounds::path(at, "layout"))?;
        bounds::check(&self.measured_layout, &bounds::path(at, "measuredLayout"))?;
        for (i, o) in self.ops.iter().enumerate() {
            bounds::check(o, &format!("{}[{i}]", bounds::path(at, "ops")))?;
        }
        Ok(())
    }
}

/// One timed op, bounded.
impl Bounded for OpMeasurement {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("name", limits::NAME, |o| (&o.name).into()),
        Bound::text("kind", limits::NAME, |o| (&o.kind).into()),
        Bound::items("shape", MAX_SHAPE_DIMS, |o| Seen::Items(o.shape.len())),
    ];
}

/// One timed collective, bounded.
impl Bounded for CollectiveMeasurement {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("op", limits::NAME, |c| (&c.op).into()),
        Bound::int("groupSize", 1, limits::GPUS, |c| c.group_size.into()),
    ];
}

/// A report's results, bounded: the API server refuses a larger object (the CRD schema), the
/// operator and `primus project --calibration` ignore one naming the field.
impl Bounded for BenchmarkResults {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("gpu", limits::NAME, |r| (&r.gpu).into()),
        Bound::text("gpuProduct", limits::NAME, |r| (&r.gpu_product).into()),
        Bound::int("gpuCount", 0, limits::GPUS, |r| r.gpu_count.into()),
        Bound::text("node", limits::NAME, |r| (&r.node).into()),
        Bound::text("driverVersion", limits::NAME, |r| {
            (&r.driver_version).into()
        }),
        Bound::text("runtimeVersion", limits::TEXT, |r| {
            (&r.runtime_version).into()
        }),
        Bound::text("startedAt", limits::NAME, |r| (&r.started_at).into()),
        Bound::text("finishedAt", limits::NAME, |r| (&r.finished_at).into()),
        Bound::text("model", limits::NAME, |r| (&r.model).into()),
        Bound::text("shapesKey", limits::TEXT, |r| (&r.shapes_key).into()),
        Bound::items("reducedAxes", limits::LIST, |r| {
            Seen::Items(r.reduced_axes.len())
        }),
        Bound::items("ops", MAX_REPORT_OPS, |r| Seen::Items(r.ops.len())),
        Bound::items("collectives", MAX_REPORT_COLLECTIVES, |r| {
            Seen::Items(r.collectives.len())
        }),
        Bound::items("finalists", MAX_FINALISTS, |r| {
            Seen::Items(r.finalists.len())
        }),
    ];

    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        bounds::check_rows(self, at, Self::BOUNDS)?;
        bounds::check(&self.target_layout, &bounds::path(at, "targetLayout"))?;
        bounds::check(&self.measured_layout, &bounds::path(at, "measuredLayout"))?;
        for (i, o) in self.ops.iter().enumerate() {
            bounds::check(o, &format!("{}[{i}]", bounds::path(at, "ops")))?;
        }
        for (i, c) in self.collectives.iter().enumerate() {
            bounds::check(c, &format!("{}[{i}]", bounds::path(at, "collectives")))?;
        }
        for (i, f) in self.finalists.iter().enumerate() {
            bounds::check(f, &format!("{}[{i}]", bounds::path(at, "finalists")))?;
        }
        Ok(())
    }
}
