//! What a single-node benchmark measures and how its samples become a report, shared by every
//! backend (`simulate`, `rocm`, `cuda`).
//!
//! The cases come from the projection's own op lists ([`crate::compute::layer_ops`],
//! [`crate::compute::embedding_ops`], [`crate::compute::head_ops`]) at the downscaled layout
//! ([`crate::bench::downscale()`]): one dense layer (models that have them) and one MoE layer
//! (MoE models), the embedding and the output layer with its loss, each op in its forward,
//! dgrad and wgrad passes, so a measurement carries the name and shape the calibration (the
//! `calibrate` module, which reads these reports) looks up. Each case also lists the kernels a GPU
//! backend launches for it ([`Kernel`]):
//! - a GEMM pass runs as the GEMM the pass launches (M x N x K, see [`pass_shape`]), once per
//!   local expert for grouped GEMMs, in the plan's precision (FP8 inputs for the Transformer
//!   Engine linears of an FP8 job, with a copy standing for the input quantization of the
//!   forward and dgrad passes, as the analytic model counts it);
//! - the attention core runs as its batched matrix products at the causal effective key length
//!   (two forward, five backward, as flash attention computes them; the vendor BLAS has no fused
//!   attention kernel, so softmax and masking are left out);
//! - a memory-bound op runs as device-to-device copies moving its bytes in its kernel count.
//!
//! The collectives are those of the measured layout's groups at the message sizes the layout
//! produces: the TP activation all-gather and reduce-scatter (all-reduce without sequence
//! parallelism), the EP dispatch all-to-all, the CP and PP point-to-point messages, and the
//! data-parallel gradient bucket reduce-scatter, all-gather and all-reduce over the node.
//!
//! A [`Device`] times cases (warm-up runs, then timed runs, each between two device events);
//! [`run`] turns the samples into a [`BenchmarkResults`] with medians and spreads.

use crate::bench::{Downscaled, measured, model_key, shapes_key, target_layout};

mod shapes;

use crate::collectives::Collective;
use crate::compute::{ACT_BYTES, Dims, Op, OpClass, Pass};
use crate::layout::Layout;
use crate::plan::Plan;
use crate::precision::Precision;
use crate::projection::{BUCKET_PARAMS, grad_bytes};
use crate::report::{
    Backend, BenchmarkResults, CollectiveMeasurement, FinalistMeasurement, MAX_FINALIST_OPS,
    MAX_FINALISTS, OpMeasurement,
};
use crate::scenario::Scenario;
use crate::units::GB;
pub use shapes::*;

/// A benchmark failure, one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BenchError(pub String);

impl BenchError {
    pub fn new(m: impl Into<String>) -> BenchError {
        BenchError(m.into())
    }
}

/// One timed op pass.
#[derive(Debug, Clone, PartialEq)]
pub struct OpCase {
    /// `<layer>.<op>.<pass>`, e.g. `dense.qkv.fwd`, `moe.experts_fc1.wgrad`, `head.output.dgrad`.
    pub name: String,
    /// `gemm`, `grouped-gemm`, `attention`, `memory-bound`.
    pub kind: &'static str,
    /// See [`pass_shape`].
    pub shape: Vec<u64>,
    /// Precision the pass runs at.
    pub precision: Precision,
    pub flops: f64,
    pub bytes: f64,
    /// The op (per GPU, at the downscaled layout) and the pass, for the analytic model.
    pub op: Op,
    pub pass: Pass,
    /// What a GPU backend launches, in order, between the two events of one timed run.
    pub kernels: Vec<Kernel>,
}

/// One timed collective: `group_size` GPUs of the node (ranks 0 .. group_size), BF16 buffers.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveCase {
    pub op: Collective,
    pub group_size: u32,
    /// Buffer size in NCCL's convention (see [`crate::collectives`]).
    pub bytes: f64,
    /// Where the message comes from, e.g. `tp activations`.
    pub purpose: &'static str,
}

/// Everything one benchmark of a plan measures.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchPlan {
    pub downscaled: Downscaled,
    pub ops: Vec<OpCase>,
    pub collectives: Vec<CollectiveCase>,
}

/// Warm-up and timed runs per case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Protocol {
    pub warmup: u32,
    pub runs: u32,
}

impl Default for Protocol {
    fn default() -> Self {
        Protocol {
            warmup: 5,
            runs: 20,
        }
    }
}

/// What a device says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceInfo {
    /// GPU product as the driver names it, e.g. `NVIDIA H200`.
    pub product: String,
    pub driver_version: String,
    /// Runtime and library versions, e.g. `CUDA 12.8 / cuBLASLt 120803 / NCCL 22603`.
    pub runtime_version: String,
}

/// A measurement backend.
pub trait Device {
    /// Which backend this is.
    fn backend(&self) -> Backend;
    /// GPUs visible to the benchmark.
    fn gpus(&self) -> u32;
    fn info(&self) -> DeviceInfo;
    /// Seconds of each timed run of an op pass on GPU 0 (after `protocol.warmup` untimed runs).
    fn time_op(&mut self, case: &OpCase, protocol: &Protocol) -> Result<Vec<f64>, BenchError>;
    /// Seconds of each timed run of a collective over GPUs 0 .. group_size (the slowest rank's
    /// time per run).
    fn time_collective(
        &mut self,
        case: &CollectiveCase,
        protocol: &Protocol,
    ) -> Result<Vec<f64>, BenchError>;
    /// Peak device memory in use during the run (the largest of the GPUs), bytes.
    fn peak_memory_bytes(&self) -> f64;
}

fn op_cases(s: &Scenario, d: &Downscaled) -> Vec<OpCase> {
    let card = measured_card(&s.model, d.experts);
    let dims = Dims::of(s, &d.layout);
    let att = attention_dims(&card, &dims, false);
    let mut out = Vec::new();
    for (prefix, _, ops) in measured_op_lists(&card, &dims) {
        for op in ops.iter() {
            for pass in [Pass::Forward, Pass::Dgrad, Pass::Wgrad] {
                if !pass_runs(op, pass) {
                    continue;
                }
                let fp8 = runs_fp8(op, s.training.precision);
                let att = (op.class == OpClass::Attention).then_some(&att);
                out.push(OpCase {
                    name: format!("{prefix}.{}.{}", op.name, pass_name(pass)),
                    kind: kind_name(op.class),
                    shape: pass_shape(op, pass, att),
                    precision: if fp8 { Precision::Fp8 } else { Precision::Bf16 },
                    flops: op.pass_flops(pass),
                    bytes: pass_bytes(op, pass, fp8),
                    op: *op,
                    pass,
                    kernels: pass_kernels(op, pass, fp8, att),
                });
            }
        }
    }
    out
}

fn collective_cases(s: &Scenario, target: &Layout, d: &Downscaled) -> Vec<CollectiveCase> {
    let l = &d.layout;
    let dims = Dims::of(s, l);
    let h = s.model.hidden_size as f64;
    let act = dims.tokens() * h * ACT_BYTES;
    // Whole BF16 elements, a multiple of the group size (so every rank's share is whole).
    let case = |op, group_size: u32, bytes: f64, purpose| {
        let unit = 2.0 * group_size as f64;
        CollectiveCase {
            op,
            group_size,
            bytes: (bytes / unit).floor().max(1.0) * unit,
            purpose,
        }
    };
    let mut out = Vec::new();
    if l.tp > 1 {
        if l.sp() {
            out.push(case(Collective::AllGather, l.tp, act, "tp activations"));
            out.push(case(Collective::ReduceScatter, l.tp, act, "tp activations"));
        } else {
            out.push(case(Collective::AllReduce, l.tp, act, "tp activations"));
        }
    }
    if l.cp > 1 {
        // One ring step of the local heads' keys and values.
        let (kv_heads, dqk, dv) = match &s.model.mla {
            Some(m) => (
                s.model.attention_heads as f64,
                (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64,
                m.v_head_dim as f64,
            ),
            None => (
                s.model.kv_heads() as f64,
                s.model.head_dim() as f64,
                s.model.head_dim() as f64,
            ),
        };
        let kv = dims.tokens() * kv_heads * (dqk + dv) / dims.tp * ACT_BYTES;
        out.push(case(Collective::P2p, 2, kv, "cp key/value exchange"));
    }
    if let (Some(m), true) = (&s.model.moe, l.ep > 1) {
        let bytes = dims.tokens_dispatched() * m.top_k as f64 * h * ACT_BYTES;
        out.push(case(Collective::AllToAll, l.ep, bytes, "ep token dispatch"));
    }
    if target.pp > 1 {
        let bytes = if l.sp() { act / dims.tp } else { act };
        out.push(case(Collective::P2p, 2, bytes, "pp activations"));
    }
    if d.gpus > 1 {
        let bucket = BUCKET_PARAMS * grad_bytes(l);
        for op in [
            Collective::ReduceScatter,
            Collective::AllGather,
            Collective::AllReduce,
        ] {
            out.push(case(op, d.gpus, bucket, "dp gradient bucket"));
        }
    }
    out
}

/// What the benchmark of `plan` measures.
pub fn bench_plan(plan: &Plan) -> BenchPlan {
    let s = &plan.scenario;
    let d = measured(plan);
    BenchPlan {
        ops: op_cases(s, &d),
        collectives: collective_cases(s, &target_layout(plan), &d),
        downscaled: d,
    }
}

/// Median and spread ((p90 - p10) / median, percentiles interpolated between order
/// statistics) of samples; (0, 0) for none.
pub fn stats(samples: &[f64]) -> (f64, f64) {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| {
        let x = p * (v.len() - 1) as f64;
        let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
        v[lo] + (v[hi] - v[lo]) * (x - lo as f64)
    };
    let median = q(0.5);
    let spread = if median > 0.0 {
        (q(0.9) - q(0.1)) / median
    } else {
        0.0
    };
    (median, spread)
}

/// NCCL's bus-bandwidth factor of a collective over `n` ranks (nccl-tests PERFORMANCE.md).
pub fn bus_factor(op: Collective, n: f64) -> f64 {
    match op {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::P2p => 1.0,
        _ => (n - 1.0) / n,
    }
}

/// Bus bandwidth of a collective run, GB/s.
pub fn bus_bandwidth_gbps(op: Collective, group_size: u32, bytes: f64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    bytes / seconds * bus_factor(op, group_size as f64) / GB
}

/// Where and when the benchmark ran: filled by the caller, so the library stays free of
/// clocks and environment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Provenance {
    /// Kubernetes node or host name.
    pub node: String,
    /// Start time, RFC 3339.
    pub started_at: String,
    /// End time, RFC 3339.
    pub finished_at: String,
}

/// Time a list of op cases on `device`; `progress` hears one line per case, `what` first.
fn time_ops(
    cases: &[OpCase],
    what: &str,
    device: &mut dyn Device,
    protocol: &Protocol,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<OpMeasurement>, BenchError> {
    let mut ops = Vec::with_capacity(cases.len());
    for (i, case) in cases.iter().enumerate() {
        progress(&format!("{what}[{}/{}] {}", i + 1, cases.len(), case.name));
        let samples = device.time_op(case, protocol)?;
        let (median, spread) = stats(&samples);
        ops.push(OpMeasurement {
            name: case.name.clone(),
            kind: case.kind.to_string(),
            shape: case.shape.clone(),
            precision: case.precision,
            flops: case.flops,
            bytes: case.bytes,
            median_seconds: median,
            spread,
            runs: samples.len() as u32,
        });
    }
    Ok(ops)
}

/// The kernels of the finalists whose one-node shapes differ from the plan's own benchmark
/// and from each other's (at most [`MAX_FINALISTS`]; one whose op list is longer than
/// [`MAX_FINALIST_OPS`] is skipped, `progress` hears so).
fn time_finalists(
    plan: &Plan,
    finalists: &[Layout],
    device: &mut dyn Device,
    protocol: &Protocol,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<FinalistMeasurement>, BenchError> {
    let mut keys = vec![shapes_key(plan)];
    let mut out = Vec::new();
    for l in finalists.iter().take(MAX_FINALISTS as usize) {
        let p = plan.with_layout(l.clone());
        let key = shapes_key(&p);
        if keys.contains(&key) {
            continue;
        }
        keys.push(key.clone());
        let d = measured(&p);
        let cases = op_cases(&p.scenario, &d);
        if cases.len() as u64 > MAX_FINALIST_OPS {
            progress(&format!(
                "skipped finalist {}: {} ops (at most {MAX_FINALIST_OPS})",
                l.label(),
                cases.len()
            ));
            continue;
        }
        let what = format!("finalist {} ", out.len() + 1);
        let ops = time_ops(&cases, &what, device, protocol, progress)?;
        out.push(FinalistMeasurement {
            layout: l.clone(),
            measured_layout: d.layout,
            shapes_key: key,
            ops,
        });
    }
    Ok(out)
}

/// Run the benchmark of `plan` on `device`, and the kernels of `finalists` (the tuner's best
/// layouts, whose shapes may differ from the plan's: ranked later by measured kernels).
/// Collectives over more GPUs than the device has are left out (`progress` hears which);
/// `progress` hears one line per case.
pub fn run(
    plan: &Plan,
    finalists: &[Layout],
    device: &mut dyn Device,
    protocol: &Protocol,
    provenance: Provenance,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchmarkResults, BenchError> {
    let s = &plan.scenario;
    let bp = bench_plan(plan);
    let ops = time_ops(&bp.ops, "", device, protocol, progress)?;
    let mut collectives = Vec::new();
    let mut used = 1;
    for case in &bp.collectives {
        if case.group_size > device.gpus() {
            progress(&format!(
                "skipped {} over {} GPUs ({}): {} visible",
                case.op.name(),
                case.group_size,
                case.purpose,
                device.gpus()
            ));
            continue;
        }
        progress(&format!(
            "{} over {} GPUs, {:.1} MB ({})",
            case.op.name(),
            case.group_size,
            case.bytes / 1e6,
            case.purpose
        ));
        let samples = device.time_collective(case, protocol)?;
        let (median, spread) = stats(&samples);
        used = used.max(case.group_size);
        collectives.push(CollectiveMeasurement {
            op: case.op.name().to_string(),
            group_size: case.group_size,
            bytes: case.bytes,
            median_seconds: median,
            spread,
            bus_bandwidth_gbps: bus_bandwidth_gbps(case.op, case.group_size, case.bytes, median),
            runs: samples.len() as u32,
        });
    }
    let finalists = time_finalists(plan, finalists, device, protocol, progress)?;
    let info = device.info();
    let d = &bp.downscaled;
    Ok(BenchmarkResults {
        backend: device.backend(),
        gpu: s.hardware.name.clone(),
        gpu_product: info.product,
        gpu_count: used,
        node: provenance.node,
        driver_version: info.driver_version,
        runtime_version: info.runtime_version,
        started_at: provenance.started_at,
        finished_at: provenance.finished_at,
        model: model_key(&s.model),
        shapes_key: shapes_key(plan),
        target_layout: target_layout(plan),
        measured_layout: d.layout.clone(),
        reduced_axes: d.reduced_axes.clone(),
        ops,
        collectives,
        peak_memory_bytes: device.peak_memory_bytes(),
        finalists,
    })
}

/// Run `f`, turning a panic inside it (a vendor binding that panics on a missing library or
/// symbol) into one error line `<what>: <panic message>`; the panic prints nothing.
pub fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, BenchError>) -> Result<T, BenchError> {
    use std::sync::{Arc, Mutex};
    let message: Arc<Mutex<Option<String>>> = Arc::default();
    let sink = Arc::clone(&message);
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "panic".into());
        if let Ok(mut m) = sink.lock() {
            *m = Some(payload.lines().next().unwrap_or_default().to_string());
        }
    }));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    std::panic::set_hook(previous);
    match result {
        Ok(r) => r,
        Err(_) => {
            let m = message
                .lock()
                .ok()
                .and_then(|m| m.clone())
                .unwrap_or_else(|| "panic".into());
            Err(BenchError(format!("{what}: {m}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::parse_plan;
    use crate::profiles::Catalog;

    fn plan(model: &str, extra: &str) -> Plan {
        let c = Catalog::builtin().unwrap();
        let text = format!(
            "metadata: {{name: p}}\nspec:\n  model: {{preset: {model}}}\n  cluster: {{gpu: h200, gpus: 64}}\n  training: {{seqLength: 4096, globalBatchSize: 256{extra}}}\n  parallelism: {{tp: 4, pp: 4, ep: 8}}\n"
        );
        parse_plan(&text, "p.yaml", &c).unwrap()
    }

    #[test]
    fn stats_are_the_median_and_the_p10_p90_spread() {
        assert_eq!(stats(&[]), (0.0, 0.0));
        assert_eq!(stats(&[2.0]), (2.0, 0.0));
        // 1..=11: median 6, p10 = 2, p90 = 10 -> spread 8/6.
        let v: Vec<f64> = (1..=11).rev().map(f64::from).collect();
        let (m, s) = stats(&v);
        assert_eq!(m, 6.0);
        assert!((s - 8.0 / 6.0).abs() < 1e-12, "{s}");
        // Even count: the median interpolates.
        assert_eq!(stats(&[1.0, 3.0]).0, 2.0);
    }

    #[test]
    fn gemm_passes_launch_the_transposed_shapes() {
        let op = Op::gemm("fc1", 4096.0, 7168.0, 4096.0, 1.0, true);
        assert_eq!(pass_shape(&op, Pass::Forward, None), vec![4096, 7168, 4096]);
        assert_eq!(pass_shape(&op, Pass::Dgrad, None), vec![4096, 4096, 7168]);
        assert_eq!(pass_shape(&op, Pass::Wgrad, None), vec![4096, 7168, 4096]);
        let k = pass_kernels(&op, Pass::Dgrad, true, None);
        // The FP8 dgrad GEMM and the quantization of the incoming gradient (m x n elements,
        // 4 bytes each).
        assert_eq!(
            k,
            vec![
                Kernel::Gemm {
                    m: 4096,
                    n: 4096,
                    k: 7168,
                    batch: 1,
                    count: 1,
                    fp8: true
                },
                Kernel::Copy {
                    bytes: 4096 * 7168 * 4,
                    count: 1
                }
            ]
        );
        // Wgrad reuses the casts.
        assert_eq!(pass_kernels(&op, Pass::Wgrad, true, None).len(), 1);
        // FP8 dimensions are padded to multiples of 16 (1000 routed tokens -> 1008); BF16 ones
        // are not.
        let experts = Op::gemm("experts_fc1", 1000.0, 2048.0, 4096.0, 4.0, true);
        assert!(matches!(
            pass_kernels(&experts, Pass::Forward, true, None)[0],
            Kernel::Gemm {
                m: 1008,
                count: 4,
                ..
            }
        ));
        assert!(matches!(
            pass_kernels(&experts, Pass::Forward, false, None)[0],
            Kernel::Gemm { m: 1000, .. }
        ));
    }

    #[test]
    fn the_plan_covers_both_layers_the_head_and_the_collectives() {
        let p = plan("mixtral-8x7b", "");
        let bp = bench_plan(&p);
        assert_eq!(bp.downscaled.layout.pp, 1);
        // Every Mixtral layer is a MoE layer: no dense layer to measure.
        assert!(!bp.ops.iter().any(|c| c.name.starts_with("dense.")));
        for name in [
            "moe.qkv.fwd",
            "moe.attention.dgrad",
            "moe.experts_fc1.wgrad",
            "head.output.fwd",
            "embedding.embedding.fwd",
        ] {
            assert!(bp.ops.iter().any(|c| c.name == name), "{name}");
        }
        // Memory-bound ops have no weight gradient, GEMMs have all three passes.
        assert!(!bp.ops.iter().any(|c| c.name == "moe.elementwise.wgrad"));
        // Every case's kernels do its FLOPs (attention at the causal effective key length,
        // up to the rounding of that length).
        for c in &bp.ops {
            let f: f64 = c.kernels.iter().map(Kernel::flops).sum();
            assert!(
                (f - c.flops).abs() <= 1e-3 * c.flops.max(1.0),
                "{}: kernels {f} vs {}",
                c.name,
                c.flops
            );
        }
        // Mixtral: 32 heads, TP 4 -> 8 local heads; 4096 queries; about 2048 keys each.
        let att = bp
            .ops
            .iter()
            .find(|c| c.name == "moe.attention.fwd")
            .unwrap();
        assert_eq!(att.shape, vec![8, 4096, 128]);
        // The experts: 8 local experts (EP 8 fits the node), one GEMM launch each.
        let e = bp
            .ops
            .iter()
            .find(|c| c.name == "moe.experts_fc1.fwd")
            .unwrap();
        assert!(matches!(e.kernels[0], Kernel::Gemm { count: 1, .. }));
        let ops: Vec<_> = bp
            .collectives
            .iter()
            .map(|c| (c.op, c.group_size, c.purpose))
            .collect();
        assert!(ops.contains(&(Collective::AllGather, 4, "tp activations")));
        assert!(ops.contains(&(Collective::ReduceScatter, 4, "tp activations")));
        assert!(ops.contains(&(Collective::AllToAll, 8, "ep token dispatch")));
        assert!(ops.contains(&(Collective::P2p, 2, "pp activations")));
        assert!(ops.contains(&(Collective::ReduceScatter, 8, "dp gradient bucket")));
        // TP activations: 4096 tokens x 4096 hidden x 2 bytes.
        let ag = &bp.collectives[0];
        assert_eq!(ag.bytes, 4096.0 * 4096.0 * 2.0);
    }

    #[test]
    fn fp8_jobs_run_the_linears_in_fp8_and_the_rest_in_bf16() {
        let p = plan("llama3.1-8b", ", precision: fp8");
        let bp = bench_plan(&p);
        let qkv = bp.ops.iter().find(|c| c.name == "dense.qkv.fwd").unwrap();
        assert_eq!(qkv.precision, Precision::Fp8);
        let out = bp.ops.iter().find(|c| c.name == "head.output.fwd").unwrap();
        assert_eq!(out.precision, Precision::Bf16);
        let att = bp
            .ops
            .iter()
            .find(|c| c.name == "dense.attention.fwd")
            .unwrap();
        assert!(
            att.kernels
                .iter()
                .all(|k| matches!(k, Kernel::Gemm { fp8: false, .. }))
        );
    }

    #[test]
    fn a_panic_in_a_backend_becomes_one_error_line() {
        let r: Result<(), BenchError> = guarded("cuda backend", || {
            panic!("Unable to dynamically load the \"cuda\" shared library\nsecond line")
        });
        assert_eq!(
            r.unwrap_err().0,
            "cuda backend: Unable to dynamically load the \"cuda\" shared library"
        );
        assert_eq!(guarded("x", || Ok(3)), Ok(3));
    }

    #[test]
    fn bus_bandwidth_follows_nccl_tests() {
        // 1 GB all-reduce over 8 GPUs in 10 ms: algbw 100 GB/s, busbw x 2*7/8.
        let bw = bus_bandwidth_gbps(Collective::AllReduce, 8, 1e9, 0.01);
        assert!((bw - 175.0).abs() < 1e-9, "{bw}");
        assert_eq!(bus_bandwidth_gbps(Collective::P2p, 2, 1e9, 0.01), 100.0);
    }
}
