//! The `simulate` benchmark backend: what a single-node benchmark would report, produced by the
//! analytic model instead of a GPU. Marked `backend: simulate` everywhere, so nothing mistakes
//! it for a measurement. It exercises the whole benchmark -> report -> calibration path on
//! machines without GPUs (test beds, CI, laptops).
//!
//! The ops are those of the projection itself ([`crate::compute::layer_ops`]): one dense and
//! (for MoE models) one MoE decoder layer at the downscaled TP/CP/EP/ETP, each op timed by the
//! [`AnalyticTimer`] in its forward, dgrad and wgrad passes; plus the in-node collectives of
//! those groups, timed by the alpha-beta model.

use crate::bench::{Downscaled, measured, model_key, shapes_key, target_layout};
use crate::collectives::{self, Topology};
use crate::compute::{
    ACT_BYTES, AnalyticTimer, Dims, LayerShape, Op, OpClass, OpTimer, Pass, TimerContext, layer_ops,
};
use crate::model::LayerKind;
use crate::plan::{Plan, Scenario};
use crate::report::{Backend, BenchmarkResults, CollectiveMeasurement, OpMeasurement};
use crate::units::GB;

/// Where and when the (simulated) benchmark ran: filled by the caller, so this module stays
/// free of clocks and environment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Provenance {
    /// Kubernetes node or host name.
    pub node: String,
    /// Start time, RFC 3339.
    pub started_at: String,
    /// End time, RFC 3339.
    pub finished_at: String,
}

fn kind_name(c: OpClass) -> &'static str {
    match c {
        OpClass::Gemm => "gemm",
        OpClass::GroupedGemm => "grouped-gemm",
        OpClass::Attention => "attention",
        OpClass::Memory => "memory-bound",
    }
}

fn pass_name(p: Pass) -> &'static str {
    match p {
        Pass::Forward => "fwd",
        Pass::Dgrad => "dgrad",
        Pass::Wgrad => "wgrad",
    }
}

/// The shape of one pass of an op as a benchmark would launch it (M x N x K of the GEMM that
/// runs; for attention and memory-bound ops what the op list records).
fn pass_shape(op: &Op, pass: Pass) -> Vec<u64> {
    let (m, n, k) = match (op.class, pass) {
        (OpClass::Gemm | OpClass::GroupedGemm, Pass::Dgrad) => (op.m, op.k, op.n),
        (OpClass::Gemm | OpClass::GroupedGemm, Pass::Wgrad) => (op.k, op.n, op.m),
        (OpClass::Memory, _) => (op.bytes, 0.0, 0.0),
        _ => (op.m, op.n, op.k),
    };
    vec![m.round() as u64, n.round() as u64, k.round() as u64]
}

fn pass_bytes(op: &Op, pass: Pass, fp8: bool) -> f64 {
    match op.class {
        OpClass::Gemm | OpClass::GroupedGemm => {
            let [m, n, k] = {
                let s = pass_shape(op, pass);
                [s[0] as f64, s[1] as f64, s[2] as f64]
            };
            let elem = if fp8 { 1.0 } else { ACT_BYTES };
            ((m * k + k * n) * elem + m * n * ACT_BYTES) * op.groups
        }
        _ => match pass {
            Pass::Forward => op.bytes,
            _ => 2.0 * op.bytes,
        },
    }
}

/// The ops of one decoder layer kind, timed per pass.
fn layer_measurements(s: &Scenario, d: &Downscaled, kind: LayerKind) -> Vec<OpMeasurement> {
    let mut card = s.model.clone();
    if let (Some(m), Some(e)) = (card.moe.as_mut(), d.experts) {
        m.num_experts = e;
    }
    let dims = Dims::of(s, &d.layout);
    let ops = layer_ops(
        &card,
        &dims,
        LayerShape {
            kind,
            sliding: false,
        },
    );
    let ctx = TimerContext {
        hardware: &s.hardware,
        precision: s.training.precision,
    };
    let prefix = match kind {
        LayerKind::Dense => "dense",
        LayerKind::Moe => "moe",
    };
    let mut out = Vec::new();
    for op in ops.iter() {
        for pass in [Pass::Forward, Pass::Dgrad, Pass::Wgrad] {
            let seconds = AnalyticTimer.op_seconds(&ctx, op, pass);
            if seconds <= 0.0 {
                continue;
            }
            let fp8 = op.fp8 && s.training.precision == crate::plan::Precision::Fp8;
            out.push(OpMeasurement {
                name: format!("{prefix}.{}.{}", op.name, pass_name(pass)),
                kind: kind_name(op.class).to_string(),
                shape: pass_shape(op, pass),
                precision: if fp8 {
                    crate::plan::Precision::Fp8
                } else {
                    crate::plan::Precision::Bf16
                },
                flops: op.pass_flops(pass),
                bytes: pass_bytes(op, pass, fp8),
                median_seconds: seconds,
                spread: 0.0,
                runs: 1,
            });
        }
    }
    out
}

/// NCCL's bus-bandwidth factor of a collective over `n` ranks.
fn bus_factor(op: &str, n: f64) -> f64 {
    match op {
        "all-reduce" => 2.0 * (n - 1.0) / n,
        "p2p" => 1.0,
        _ => (n - 1.0) / n,
    }
}

fn collective(op: &str, group_size: u32, bytes: f64, seconds: f64) -> CollectiveMeasurement {
    let algbw = if seconds > 0.0 { bytes / seconds } else { 0.0 };
    CollectiveMeasurement {
        op: op.to_string(),
        group_size,
        bytes,
        median_seconds: seconds,
        spread: 0.0,
        bus_bandwidth_gbps: algbw * bus_factor(op, group_size as f64) / GB,
        runs: 1,
    }
}

/// The in-node collectives of the measured layout: the TP group's activation all-gather and
/// reduce-scatter (all-reduce without sequence parallelism), the CP ring exchange, and the
/// EP dispatch all-to-all.
fn collective_measurements(s: &Scenario, d: &Downscaled) -> Vec<CollectiveMeasurement> {
    let l = &d.layout;
    let topo = Topology::of(&s.hardware, s.cluster.gpus_per_node);
    let world = d.gpus;
    let dims = Dims::of(s, l);
    let h = s.model.hidden_size as f64;
    let act = dims.tokens() * h * ACT_BYTES;
    let mut out = Vec::new();
    if l.tp > 1 {
        let g = topo.group(world, l.tp, 1);
        if l.sp() {
            out.push(collective(
                "all-gather",
                l.tp,
                act,
                collectives::all_gather(&topo, &g, act),
            ));
            out.push(collective(
                "reduce-scatter",
                l.tp,
                act,
                collectives::reduce_scatter(&topo, &g, act),
            ));
        } else {
            out.push(collective(
                "all-reduce",
                l.tp,
                act,
                collectives::all_reduce(&topo, &g, act),
            ));
        }
    }
    if l.cp > 1 {
        // One ring step of the key/value block (2 x kv heads x head dim per token).
        let kv = dims.tokens() / l.tp.max(1) as f64
            * 2.0
            * s.model.kv_heads() as f64
            * s.model.head_dim() as f64
            * ACT_BYTES;
        out.push(collective(
            "p2p",
            l.cp,
            kv,
            collectives::p2p(&topo, false, kv),
        ));
    }
    if let (Some(m), true) = (&s.model.moe, l.ep > 1) {
        let bytes = dims.routed_tokens(m.top_k as f64) / l.etp.max(1) as f64 * h * ACT_BYTES;
        let g = topo.group(world, l.ep, l.etp.max(1));
        out.push(collective(
            "all-to-all",
            l.ep,
            bytes,
            collectives::all_to_all(&topo, &g, bytes),
        ));
    }
    out
}

/// A simulated benchmark of `plan` on one node.
pub fn simulate(plan: &Plan, provenance: Provenance) -> BenchmarkResults {
    let s = &plan.scenario;
    let d = measured(plan);
    let mut ops = layer_measurements(s, &d, LayerKind::Dense);
    if s.model.moe.is_some() {
        ops.extend(layer_measurements(s, &d, LayerKind::Moe));
    }
    BenchmarkResults {
        backend: Backend::Simulate,
        gpu: s.hardware.name.clone(),
        gpu_product: s.hardware.product.clone(),
        gpu_count: d.gpus,
        node: provenance.node,
        driver_version: "none (simulated)".into(),
        runtime_version: format!(
            "primus-oracle {} analytic model (simulated)",
            env!("CARGO_PKG_VERSION")
        ),
        started_at: provenance.started_at,
        finished_at: provenance.finished_at,
        model: model_key(&s.model),
        shapes_key: shapes_key(plan),
        target_layout: target_layout(plan),
        measured_layout: d.layout.clone(),
        reduced_axes: d.reduced_axes.clone(),
        collectives: collective_measurements(s, &d),
        ops,
        peak_memory_bytes: 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::parse_plan;
    use crate::profiles::Catalog;

    fn plan(model: &str, layout: &str) -> Plan {
        let c = Catalog::builtin().unwrap();
        let text = format!(
            "metadata: {{name: p}}\nspec:\n  model: {{preset: {model}}}\n  cluster: {{gpu: mi300x, gpus: 64}}\n  training: {{seqLength: 4096, globalBatchSize: 256}}\n  parallelism: {layout}\n"
        );
        parse_plan(&text, "p.yaml", &c).unwrap()
    }

    #[test]
    fn a_dense_plan_reports_one_dense_layer_marked_simulated() {
        let p = plan("llama3.1-70b", "{tp: 4, pp: 8}");
        let r = simulate(
            &p,
            Provenance {
                node: "n1".into(),
                started_at: "2026-01-01T00:00:00Z".into(),
                finished_at: "2026-01-01T00:00:01Z".into(),
            },
        );
        assert_eq!(r.backend, Backend::Simulate);
        assert_eq!(r.node, "n1");
        assert_eq!(r.gpu, "mi300x");
        assert_eq!(r.measured_layout.pp, 1);
        assert_eq!(r.reduced_axes, vec!["pp 8->1"]);
        assert!(r.ops.iter().all(|o| o.name.starts_with("dense.")));
        assert!(r.ops.iter().all(|o| o.median_seconds > 0.0));
        let qkv = r
            .ops
            .iter()
            .find(|o| o.name == "dense.qkv.fwd")
            .expect("the QKV projection is there");
        // M = 4096 tokens, N = (64 + 2 x 8) heads x 128 / TP 4, K = 8192.
        assert_eq!(qkv.shape, vec![4096, 2560, 8192]);
        assert_eq!(qkv.kind, "gemm");
        assert!(
            r.collectives
                .iter()
                .any(|c| c.op == "all-gather" && c.group_size == 4)
        );
        assert_eq!(r.shapes_key, shapes_key(&p));
    }

    #[test]
    fn a_moe_plan_adds_the_moe_layer_and_the_all_to_all() {
        let p = plan("mixtral-8x7b", "{tp: 2, ep: 8, pp: 4}");
        let r = simulate(&p, Provenance::default());
        assert!(r.ops.iter().any(|o| o.name.starts_with("moe.")));
        assert!(
            r.ops
                .iter()
                .any(|o| o.kind == "grouped-gemm" || o.name.contains("expert"))
        );
        assert!(r.collectives.iter().any(|c| c.op == "all-to-all"));
        // The expert grid (EP 8) fits one node once PP is dropped.
        assert_eq!(r.measured_layout.ep, 8);
        assert_eq!(r.reduced_axes, vec!["pp 4->1"]);
    }
}
