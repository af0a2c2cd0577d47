//! A benchmark report against the analytic model, the first half of [`super::Calibration`]:
//! every usable op measurement is compared with the analytic time of the op the benchmark ran
//! (rebuilt from the model card at the measured layout when the shape matches, else from the
//! report's own shape, FLOPs and bytes), giving the exact ratios and the ratio curves; every
//! usable collective measurement with the analytic time on the scenario's node, giving the
//! scale-up link factors (the formulas are in the parent module's documentation).

use std::collections::HashMap;

use crate::bench::measure::{
    AttentionDims, attention_dims, gemm_pass_dims, kind_class, measured_card, measured_experts,
    measured_op_lists, pass_bytes, pass_of, pass_shape,
};
use crate::bench::model_key;
use crate::bench::simulate::analytic_collective;
use crate::collectives::{Collective, LinkCalibration, LinkPoint, Topology};
use crate::compute::{AnalyticTimer, Dims, Op, OpClass, OpTimer, Pass, TimerContext};
use crate::precision::Precision;
use crate::report::BenchmarkResults;
use crate::scenario::Scenario;

use super::{
    CollectiveComparison, Curve, ExactKey, LINK_FACTOR_LIMIT, OP_RATIO_LIMIT, OpComparison,
    class_index, pass_index,
};

/// The x coordinate of an op pass on the ratio curves: ln of the FLOPs of one GEMM instance
/// (of the pass FLOPs for attention, of the pass bytes for memory-bound ops).
pub(super) fn curve_x(op: &Op, pass: Pass) -> f64 {
    let v = match op.class {
        OpClass::Gemm | OpClass::GroupedGemm => {
            let (m, n, k) = gemm_pass_dims(op, pass);
            2.0 * m * n * k
        }
        OpClass::Attention => op.pass_flops(pass),
        OpClass::Memory => pass_bytes(op, pass, false),
    };
    v.max(1.0).ln()
}

/// Rebuild an op from a report's fields (shape, FLOPs, bytes) when the card's op list does not
/// have it.
fn op_from_fields(
    class: OpClass,
    pass: Pass,
    shape: &[u64],
    flops: f64,
    bytes: f64,
    fp8: bool,
) -> Op {
    let dim = |i: usize| shape.get(i).copied().unwrap_or(0) as f64;
    match class {
        OpClass::Gemm | OpClass::GroupedGemm => {
            let (a, b, c) = (dim(0).max(1.0), dim(1).max(1.0), dim(2).max(1.0));
            // Invert gemm_pass_dims.
            let (m, n, k) = match pass {
                Pass::Forward => (a, b, c),
                Pass::Dgrad => (a, c, b),
                Pass::Wgrad => (c, b, a),
            };
            let groups = (flops / (2.0 * a * b * c)).round().max(1.0);
            let mut op = Op::gemm("measured", m, n, k, groups, fp8);
            op.kernels = groups;
            op
        }
        OpClass::Attention => {
            let per = if pass == Pass::Forward {
                1.0
            } else {
                crate::compute::ATTENTION_BWD_FLOPS
            };
            let mut op = Op::memory("measured", bytes / backward_bytes(pass), 1.0);
            op.class = OpClass::Attention;
            op.flops = flops / per;
            // The measured shape's query/key head dimension, as the card's op carries it
            // (the analytic time's head-dimension law, `compute::attention_head_dim_factor`).
            op.k = dim(2);
            op
        }
        OpClass::Memory => Op::memory("measured", bytes / backward_bytes(pass), 1.0),
    }
}

fn backward_bytes(pass: Pass) -> f64 {
    if pass == Pass::Forward {
        1.0
    } else {
        crate::compute::MEMORY_BWD_BYTES
    }
}

/// An op the benchmark ran, rebuilt from the card at the measured layout: the op and, for the
/// attention core, its head dimensions (which fix its measured shape).
struct KnownOp {
    op: Op,
    attention: Option<AttentionDims>,
}

/// The ops a report measured for scenario `s`, by `prefix.name` (none when the report measured
/// another model).
fn known_ops(s: &Scenario, report: &BenchmarkResults) -> HashMap<String, KnownOp> {
    let mut known = HashMap::new();
    if model_key(&s.model) == report.model {
        let experts = measured_experts(&s.model, &report.target_layout, &report.measured_layout);
        let card = measured_card(&s.model, experts);
        let dims = Dims::of(s, &report.measured_layout);
        let att = attention_dims(&card, &dims, false);
        for (prefix, _, ops) in measured_op_lists(&card, &dims) {
            for op in ops.iter() {
                let attention = (op.class == OpClass::Attention).then_some(att);
                known.insert(
                    format!("{prefix}.{}", op.name),
                    KnownOp { op: *op, attention },
                );
            }
        }
    }
    known
}

/// The op measurements against the analytic model: the comparisons, the exact ratios of
/// matched shapes and the ratio curves per class and pass.
pub(super) struct OpRatios {
    pub ops: Vec<OpComparison>,
    pub exact: HashMap<ExactKey, f64>,
    pub curves: [[Curve; 3]; 4],
    pub class_curves: [Curve; 4],
}

/// Compare every usable op measurement of `report` with the analytic time of the same op
/// (the card's, when the shape matches; else rebuilt from the report's fields).
pub(super) fn op_ratios(s: &Scenario, report: &BenchmarkResults) -> OpRatios {
    let hw = &s.hardware;
    let known = known_ops(s, report);
    let mut ops = Vec::new();
    let mut exact = HashMap::new();
    let mut raw: [[Vec<(f64, f64)>; 3]; 4] = Default::default();
    for m in &report.ops {
        let Some(class) = kind_class(&m.kind) else {
            continue;
        };
        let Some((stem, pass)) = m
            .name
            .rsplit_once('.')
            .and_then(|(stem, p)| Some((stem, pass_of(p)?)))
        else {
            continue;
        };
        if !(m.median_seconds.is_finite() && m.median_seconds > 0.0) {
            continue;
        }
        let ctx = TimerContext {
            hardware: hw,
            precision: m.precision,
            fp8_recipe: crate::backend::Fp8Recipe::Delayed,
        };
        let fp8 = m.precision == Precision::Fp8;
        let (op, matched) = match known.get(stem) {
            Some(k) if pass_shape(&k.op, pass, k.attention.as_ref()) == m.shape => (k.op, true),
            _ => (
                op_from_fields(class, pass, &m.shape, m.flops, m.bytes, fp8),
                false,
            ),
        };
        let analytic = AnalyticTimer.op_seconds(&ctx, &op, pass);
        if !(analytic.is_finite() && analytic > 0.0) {
            continue;
        }
        let measured = m.median_seconds / analytic;
        let ratio = measured.clamp(1.0 / OP_RATIO_LIMIT, OP_RATIO_LIMIT);
        let clamped = ratio != measured;
        if matched {
            // The same op measured twice (the attention block of a dense and of a MoE
            // layer): the geometric mean.
            let e = exact.entry(ExactKey::of(&op, pass)).or_insert((0.0, 0u32));
            e.0 += ratio.ln();
            e.1 += 1;
        }
        raw[class_index(class)][pass_index(pass)].push((curve_x(&op, pass), ratio.ln()));
        ops.push(OpComparison {
            name: m.name.clone(),
            kind: m.kind.clone(),
            pass,
            shape: m.shape.clone(),
            precision: m.precision,
            flops: m.flops,
            bytes: m.bytes,
            measured_seconds: m.median_seconds,
            analytic_seconds: analytic,
            matched,
            clamped,
        });
    }
    OpRatios {
        ops,
        exact: exact
            .into_iter()
            .map(|(k, (sum, n))| (k, (sum / n as f64).exp()))
            .collect(),
        curves: raw.clone().map(|per_pass| per_pass.map(Curve::finish)),
        class_curves: raw.map(|per_pass| Curve::finish(per_pass.concat())),
    }
}

/// The collective measurements against the analytic model, and the link factors they give.
pub(super) struct CollectiveFactors {
    pub links: LinkCalibration,
    pub collectives: Vec<CollectiveComparison>,
}

/// Compare every usable collective measurement of `report` with the analytic time on the
/// scenario's node and derive its bandwidth factor (see the module documentation).
pub(super) fn collective_factors(s: &Scenario, report: &BenchmarkResults) -> CollectiveFactors {
    let topo = Topology::of(&s.hardware, s.cluster.gpus_per_node);
    let mut links = LinkCalibration::default();
    let mut collectives = Vec::new();
    for c in &report.collectives {
        let Some(kind) = Collective::from_name(&c.op) else {
            continue;
        };
        let n = c.group_size;
        if n < 2 || !(c.bytes > 0.0 && c.median_seconds.is_finite() && c.median_seconds > 0.0) {
            continue;
        }
        let t = analytic_collective(&topo, kind, n, c.bytes);
        let latency = (2.0 * t - analytic_collective(&topo, kind, n, 2.0 * c.bytes)).max(0.0);
        let (factor, clamped) = if c.median_seconds > latency {
            let raw = (t - latency) / (c.median_seconds - latency);
            let f = raw.clamp(1.0 / LINK_FACTOR_LIMIT, LINK_FACTOR_LIMIT);
            (f, f != raw)
        } else {
            (LINK_FACTOR_LIMIT, true)
        };
        let members = if kind == Collective::P2p { 2 } else { n };
        links.add(
            kind,
            LinkPoint {
                members,
                bytes: c.bytes,
                factor,
            },
        );
        collectives.push(CollectiveComparison {
            op: kind,
            group_size: n,
            bytes: c.bytes,
            measured_seconds: c.median_seconds,
            analytic_seconds: t,
            measured_bus_gbps: crate::bench::measure::bus_bandwidth_gbps(
                kind,
                n,
                c.bytes,
                c.median_seconds,
            ),
            analytic_bus_gbps: crate::bench::measure::bus_bandwidth_gbps(kind, n, c.bytes, t),
            factor,
            clamped,
        });
    }
    CollectiveFactors { links, collectives }
}
