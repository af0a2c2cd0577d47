//! Benchmark calibration (benchmark mode): "downscale, measure, upscale". A single-node
//! benchmark ([`crate::bench`]) times the ops of one dense and one MoE layer, the embedding and
//! the output layer at the downscaled layout, and the in-node collectives; this module turns
//! its report into a [`CalibratedTimer`] that the projection and the tuner use in place of the
//! analytic roofline. Pure arithmetic: no GPU, no clock, no I/O.
//!
//! **Ops.** Every measured op pass gives a ratio `measured / analytic` (the analytic model
//! timing the very op the benchmark ran, rebuilt from the model card at the measured layout;
//! from the report's own shape, FLOPs and bytes when the card does not match). A target op is
//! timed as `analytic(target op) x ratio`, where the ratio is
//! 1. the op's own when the target runs exactly the measured shape (the measured time itself),
//! 2. else interpolated linearly in log-log between the measured ops of the same kind and pass
//!    by FLOPs of one GEMM instance (bytes for memory-bound ops), constant beyond the measured
//!    range; a pass or kind without measurements borrows the kind's other passes, and grouped
//!    GEMMs borrow the dense GEMMs;
//! 3. else 1 (analytic).
//!
//! So the analytic model carries what changes between the measured and the target layout (TP
//! or EP restored: GEMMs with more or fewer columns, more or fewer routed tokens) and the
//! measurement carries what the model gets wrong about the GPU. Everything the projection
//! builds from op times (the pipeline schedule at the target PP, recomputation, the bubble, the
//! overlap of communication with compute) then runs analytically on measured compute.
//!
//! **Collectives.** A measured in-node collective gives a bandwidth factor for the scale-up
//! links: `f = (t_analytic - L) / (t_measured - L)` with `L` the analytic latency part (so a
//! collective measured at half the analytic bandwidth gives `f = 1/2` whatever its latency).
//! The factors go into the topology's [`LinkCalibration`] through [`OpTimer::topology`]; they
//! scale the in-domain part of each collective of that kind (TP, EP, CP, in-node PP and the
//! in-node stage of hierarchical DP collectives). Out-of-node traffic, the pipeline schedule,
//! DP overlap, the optimizer and per-step overheads stay analytic at the target scale.
//!
//! `compare.rs` compares a report's measurements with the analytic model (the ratios and the
//! link factors); `coverage.rs` says which terms of a projection are measured.

use std::collections::HashMap;

use crate::bench::measure::pass_name;
use crate::collectives::{Collective, LinkCalibration, Topology};
use crate::compute::{AnalyticTimer, LayerShape, Op, OpClass, OpTimer, Pass, TimerContext};
use crate::layout::Layout;
use crate::precision::Precision;
use crate::report::{Backend, BenchmarkResults};
use crate::scenario::Scenario;

mod compare;
mod coverage;
pub mod finalists;
#[cfg(test)]
mod tests;

use compare::{collective_factors, curve_x, op_ratios};
pub use coverage::{Coverage, OpCoverage, Source, TermSource, coverage};

/// Bounds of a collective's bandwidth factor (a measurement faster than the analytic latency
/// alone, or absurdly slow, is clamped rather than trusted without limit).
pub const LINK_FACTOR_LIMIT: f64 = 50.0;

/// Bounds of an op's measured / analytic ratio: [1/limit, limit]. The analytic time is the
/// roofline with the profile's efficiency curves, so a healthy GPU runs a kernel within a small
/// factor of it; a measurement ten times faster would beat the hardware's peak for any curve
/// above 10% efficiency, and ten times slower points at the measurement (a throttled or shared
/// GPU, a wrong clock, a forged report) rather than at the GPU. Beyond the band the ratio is
/// clamped, so one absurd report cannot skew a projection without limit, and the report is
/// flagged ([`Calibration::clamped`]).
pub const OP_RATIO_LIMIT: f64 = 10.0;

/// A measured time for one whole decoder-layer pass at the target TP/EP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerMeasurement {
    pub shape: LayerShape,
    pub pass: Pass,
    /// Seconds per micro-batch.
    pub seconds: f64,
}

/// An op timer that answers whole-layer passes from measurements and falls back to the
/// analytic roofline for everything else (embedding, output layer, unmeasured kinds).
#[derive(Debug, Clone, Default)]
pub struct MeasuredTimer {
    pub layers: Vec<LayerMeasurement>,
    pub fallback: AnalyticTimer,
}

impl OpTimer for MeasuredTimer {
    fn op_seconds(&self, ctx: &TimerContext, op: &Op, pass: Pass) -> f64 {
        self.fallback.op_seconds(ctx, op, pass)
    }

    fn layer_seconds(&self, _ctx: &TimerContext, layer: LayerShape, pass: Pass) -> Option<f64> {
        self.layers
            .iter()
            .find(|m| m.shape == layer && m.pass == pass)
            .map(|m| m.seconds)
    }
}

/// Why a report cannot calibrate a plan.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalibrationError {
    /// The report measured another GPU.
    #[error(
        "the report measured {report_gpu} ({report_product}); the plan runs on {plan_gpu} ({plan_product})"
    )]
    GpuMismatch {
        report_gpu: String,
        report_product: String,
        plan_gpu: String,
        plan_product: String,
    },
    /// Nothing in the report can be used.
    #[error("the report has no usable measurement (no op or collective with a positive time)")]
    Empty,
    /// The report does not parse.
    #[error("{0}")]
    Parse(String),
}

/// One measured op pass against the analytic model.
#[derive(Debug, Clone, PartialEq)]
pub struct OpComparison {
    pub name: String,
    pub kind: String,
    pub pass: Pass,
    pub shape: Vec<u64>,
    pub precision: Precision,
    pub flops: f64,
    pub bytes: f64,
    pub measured_seconds: f64,
    pub analytic_seconds: f64,
    /// The op was found in the model card's op list at the measured layout (else rebuilt from
    /// the report's shape, FLOPs and bytes).
    pub matched: bool,
    /// Its ratio was outside [1/[`OP_RATIO_LIMIT`], [`OP_RATIO_LIMIT`]] and clamped.
    pub clamped: bool,
}

impl OpComparison {
    /// measured / analytic time.
    pub fn ratio(&self) -> f64 {
        self.measured_seconds / self.analytic_seconds
    }

    /// Achieved TFLOP/s (0 for memory-bound ops).
    pub fn measured_tflops(&self) -> f64 {
        self.flops / self.measured_seconds / 1e12
    }

    pub fn analytic_tflops(&self) -> f64 {
        self.flops / self.analytic_seconds / 1e12
    }
}

/// One measured collective against the analytic model.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveComparison {
    pub op: Collective,
    pub group_size: u32,
    pub bytes: f64,
    pub measured_seconds: f64,
    pub analytic_seconds: f64,
    pub measured_bus_gbps: f64,
    pub analytic_bus_gbps: f64,
    /// Its factor was outside [1/[`LINK_FACTOR_LIMIT`], [`LINK_FACTOR_LIMIT`]] and clamped.
    pub clamped: bool,
    /// Factor on the scale-up bandwidth (see the module docs).
    pub factor: f64,
}

/// Identity of an op as the projection builds it, bit for bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ExactKey {
    name: &'static str,
    pass: u8,
    bits: [u64; 7],
}

impl ExactKey {
    fn of(op: &Op, pass: Pass) -> ExactKey {
        ExactKey {
            name: op.name,
            pass: pass_index(pass) as u8,
            bits: [
                op.m.to_bits(),
                op.n.to_bits(),
                op.k.to_bits(),
                op.groups.to_bits(),
                op.flops.to_bits(),
                op.bytes.to_bits(),
                op.kernels.to_bits(),
            ],
        }
    }
}

fn pass_index(p: Pass) -> usize {
    match p {
        Pass::Forward => 0,
        Pass::Dgrad => 1,
        Pass::Wgrad => 2,
    }
}

fn class_index(c: OpClass) -> usize {
    match c {
        OpClass::Gemm => 0,
        OpClass::GroupedGemm => 1,
        OpClass::Attention => 2,
        OpClass::Memory => 3,
    }
}

/// Sorted points (x, ln ratio) with equal x merged; linear interpolation, flat outside.
#[derive(Debug, Clone, Default, PartialEq)]
struct Curve {
    points: Vec<(f64, f64)>,
}

impl Curve {
    fn finish(mut raw: Vec<(f64, f64)>) -> Curve {
        raw.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut points: Vec<(f64, f64)> = Vec::with_capacity(raw.len());
        let mut run = (0.0, 0.0, 0usize);
        for (x, y) in raw {
            if run.2 > 0 && x == run.0 {
                run.1 += y;
                run.2 += 1;
            } else {
                if run.2 > 0 {
                    points.push((run.0, run.1 / run.2 as f64));
                }
                run = (x, y, 1);
            }
        }
        if run.2 > 0 {
            points.push((run.0, run.1 / run.2 as f64));
        }
        Curve { points }
    }

    fn at(&self, x: f64) -> Option<f64> {
        let p = &self.points;
        let (first, last) = (p.first()?, p.last()?);
        if x <= first.0 {
            return Some(first.1);
        }
        if x >= last.0 {
            return Some(last.1);
        }
        let i = p.partition_point(|q| q.0 <= x);
        let (a, b) = (p[i - 1], p[i]);
        Some(a.1 + (x - a.0) / (b.0 - a.0) * (b.1 - a.1))
    }

    fn is_empty(&self) -> bool {
        self.points.is_empty()
    }
}

/// Where a ratio came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RatioSource {
    /// The target runs exactly a measured shape.
    Exact,
    /// Interpolated between measured shapes.
    Interpolated,
    /// Nothing measured for this kind: the analytic time.
    Analytic,
}

/// How many measurements of a report were beyond their band and clamped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Clamped {
    pub ops: usize,
    pub of_ops: usize,
    pub collectives: usize,
    pub of_collectives: usize,
}

impl Clamped {
    pub fn any(&self) -> bool {
        self.ops + self.collectives > 0
    }
}

/// A benchmark report prepared for one scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    pub backend: Backend,
    /// Hardware profile and product the report measured.
    pub gpu: String,
    pub gpu_product: String,
    pub node: String,
    pub started_at: String,
    pub model: String,
    pub shapes_key: String,
    pub target_layout: Layout,
    pub measured_layout: Layout,
    pub reduced_axes: Vec<String>,
    /// Every usable op measurement against the model.
    pub ops: Vec<OpComparison>,
    /// Every usable collective measurement against the model.
    pub collectives: Vec<CollectiveComparison>,
    /// Scale-up link factors per collective.
    pub links: LinkCalibration,
    exact: HashMap<ExactKey, f64>,
    /// Per op class and pass.
    curves: [[Curve; 3]; 4],
    /// Per op class, all passes.
    class_curves: [Curve; 4],
}

impl Calibration {
    /// Prepare `report` for scenario `s` (its hardware profile is the analytic reference).
    pub fn new(s: &Scenario, report: &BenchmarkResults) -> Result<Calibration, CalibrationError> {
        let hw = &s.hardware;
        if report.gpu != hw.name && report.gpu_product != hw.product {
            return Err(CalibrationError::GpuMismatch {
                report_gpu: report.gpu.clone(),
                report_product: report.gpu_product.clone(),
                plan_gpu: hw.name.clone(),
                plan_product: hw.product.clone(),
            });
        }
        let ops = op_ratios(s, report);
        let links = collective_factors(s, report);
        if ops.ops.is_empty() && links.collectives.is_empty() {
            return Err(CalibrationError::Empty);
        }
        Ok(Calibration {
            backend: report.backend,
            gpu: report.gpu.clone(),
            gpu_product: report.gpu_product.clone(),
            node: report.node.clone(),
            started_at: report.started_at.clone(),
            model: report.model.clone(),
            shapes_key: report.shapes_key.clone(),
            target_layout: report.target_layout.clone(),
            measured_layout: report.measured_layout.clone(),
            reduced_axes: report.reduced_axes.clone(),
            ops: ops.ops,
            collectives: links.collectives,
            links: links.links,
            exact: ops.exact,
            curves: ops.curves,
            class_curves: ops.class_curves,
        })
    }

    /// The ratio measured / analytic for one pass of a target op, and where it came from.
    pub fn ratio(&self, op: &Op, pass: Pass) -> (f64, RatioSource) {
        if let Some(r) = self.exact.get(&ExactKey::of(op, pass)) {
            return (*r, RatioSource::Exact);
        }
        let x = curve_x(op, pass);
        let (c, p, g) = (
            class_index(op.class),
            pass_index(pass),
            class_index(OpClass::Gemm),
        );
        let grouped = op.class == OpClass::GroupedGemm;
        // The kind's pass, the kind's other passes; grouped GEMMs then borrow dense GEMMs.
        [
            Some(&self.curves[c][p]),
            Some(&self.class_curves[c]),
            grouped.then_some(&self.curves[g][p]),
            grouped.then_some(&self.class_curves[g]),
        ]
        .into_iter()
        .flatten()
        .find(|curve| !curve.is_empty())
        .and_then(|curve| curve.at(x))
        .map(|y| (y.exp(), RatioSource::Interpolated))
        .unwrap_or((1.0, RatioSource::Analytic))
    }

    /// Measurements beyond their band (clamped): (ops clamped, ops, collectives clamped,
    /// collectives).
    pub fn clamped(&self) -> Clamped {
        Clamped {
            ops: self.ops.iter().filter(|o| o.clamped).count(),
            of_ops: self.ops.len(),
            collectives: self.collectives.iter().filter(|c| c.clamped).count(),
            of_collectives: self.collectives.len(),
        }
    }

    /// Measured op passes of one kind, for display.
    pub fn measured_points(&self, class: OpClass) -> usize {
        self.curves[class_index(class)]
            .iter()
            .map(|c| c.points.len())
            .sum()
    }
}

/// The op timer of a calibrated oracle: analytic op times scaled by measured ratios, and the
/// scale-up links scaled by measured collective factors.
#[derive(Debug, Clone, PartialEq)]
pub struct CalibratedTimer {
    pub calibration: Calibration,
}

impl CalibratedTimer {
    /// The timer of `report` for scenario `s`.
    pub fn new(
        s: &Scenario,
        report: &BenchmarkResults,
    ) -> Result<CalibratedTimer, CalibrationError> {
        Ok(CalibratedTimer {
            calibration: Calibration::new(s, report)?,
        })
    }
}

impl OpTimer for CalibratedTimer {
    fn op_seconds(&self, ctx: &TimerContext, op: &Op, pass: Pass) -> f64 {
        let analytic = AnalyticTimer.op_seconds(ctx, op, pass);
        if analytic <= 0.0 {
            return analytic;
        }
        analytic * self.calibration.ratio(op, pass).0
    }

    fn topology(&self, analytic: Topology) -> Topology {
        Topology {
            links: self.calibration.links,
            ..analytic
        }
    }
}

/// Read a benchmark report: a `BenchmarkResults` JSON document (what `primus bench -o` writes)
/// or a `BenchmarkReport` object as `kubectl get -o yaml|json` prints it (its `spec.results`).
/// The error names the source and the field.
pub fn parse_report(text: &str, source: &str) -> Result<BenchmarkResults, CalibrationError> {
    let doc = crate::parse::parse_yaml_value(text, source)
        .map_err(|e| CalibrationError::Parse(e.to_string()))?;
    let (value, at) = if let Some(r) = doc.get("spec").and_then(|s| s.get("results")) {
        (r.clone(), "spec.results.")
    } else if doc.get("kind").and_then(|k| k.as_str()) == Some("BenchmarkReport") {
        return Err(CalibrationError::Parse(format!(
            "{source}: spec.results: missing (a BenchmarkReport without results)"
        )));
    } else {
        (doc, "")
    };
    let results = serde_path_to_error::deserialize::<_, BenchmarkResults>(value).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            at.trim_end_matches('.').to_string()
        } else {
            format!("{at}{path}")
        };
        CalibrationError::Parse(format!(
            "{source}: {}: {}",
            if field.is_empty() {
                "(document)"
            } else {
                &field
            },
            e.inner()
        ))
    })?;
    // Lists and texts within the report's bounds (the CRD's maxItems / maxLength).
    crate::bounds::check(&results, at.trim_end_matches('.'))
        .map_err(|e| CalibrationError::Parse(format!("{source}: {e}")))?;
    Ok(results)
}

/// `fwd`/`dgrad`/`wgrad` of a comparison row.
pub fn pass_label(p: Pass) -> &'static str {
    pass_name(p)
}
