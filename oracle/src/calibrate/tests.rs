//! The upscale arithmetic against synthetic reports with hand-derived expectations.

use super::*;
use crate::bench::simulate::{Provenance, simulate};
use crate::collectives::LinkPoint;
use crate::plan::{Plan, parse_plan};
use crate::profiles::Catalog;
use crate::projection::{Projection, project, project_with};
use crate::report::OpMeasurement;

fn plan(model: &str, gpu: &str, gpus: u32, layout: &str) -> Plan {
    let c = Catalog::builtin().unwrap();
    let text = format!(
        "metadata: {{name: p}}\nspec:\n  model: {{preset: {model}}}\n  cluster: {{gpu: {gpu}, gpus: {gpus}}}\n  training: {{seqLength: 8192, globalBatchSize: 64}}\n  parallelism: {layout}\n"
    );
    parse_plan(&text, "p.yaml", &c).unwrap()
}

fn projections(p: &Plan, report: &BenchmarkResults) -> (Projection, Projection) {
    let l = p.layout.as_ref().unwrap();
    let timer = CalibratedTimer::new(&p.scenario, report).unwrap();
    (
        project(&p.scenario, l).unwrap(),
        project_with(&p.scenario, l, &timer).unwrap(),
    )
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()) + 1e-15
}

/// Every breakdown term but `except` is the same (to rounding: the bubble is a difference of
/// pass end times, zero up to a few ulps of the step).
fn only_changed(a: &Projection, c: &Projection, except: &str) {
    let tol = 1e-12 * a.step_time_seconds;
    for ((name, x), (_, y)) in a.breakdown.terms().iter().zip(c.breakdown.terms().iter()) {
        if *name != except {
            assert!((x - y).abs() <= tol, "{name} changed: {x} -> {y}");
        }
    }
}

#[test]
fn a_simulated_report_calibrates_to_the_analytic_projection() {
    for (model, gpu, gpus, layout) in [
        (
            "llama3.1-70b",
            "mi300x",
            64,
            "{tp: 4, pp: 8, vpp: 5, schedule: interleaved}",
        ),
        ("mixtral-8x7b", "h200", 64, "{tp: 2, ep: 8, pp: 4}"),
        ("deepseek-v3", "h200", 64, "{ep: 64}"),
        (
            "gpt3-175b",
            "h100-sxm",
            256,
            "{tp: 16, pp: 4, sequenceParallel: false}",
        ),
    ] {
        let p = plan(model, gpu, gpus, layout);
        let r = simulate(&p, Provenance::default());
        let (a, c) = projections(&p, &r);
        assert_eq!(a.step_time_seconds, c.step_time_seconds, "{model}");
        assert_eq!(a.breakdown, c.breakdown, "{model}");
        let timer = CalibratedTimer::new(&p.scenario, &r).unwrap();
        assert!(timer.calibration.ops.iter().all(|o| o.matched), "{model}");
        assert!(
            timer.calibration.ops.iter().all(|o| o.ratio() == 1.0),
            "{model}"
        );
        assert!(
            timer
                .calibration
                .collectives
                .iter()
                .all(|c| c.factor == 1.0),
            "{model}: {:?}",
            timer.calibration.collectives
        );
    }
}

/// A single-node dense job without pipeline or data parallelism: compute, TP and the fixed
/// terms only.
fn single_node() -> Plan {
    plan("llama3.1-8b", "h200", 8, "{tp: 8}")
}

#[test]
fn kernels_at_half_the_analytic_speed_double_the_compute_term_and_nothing_else() {
    let p = single_node();
    let mut r = simulate(&p, Provenance::default());
    for o in &mut r.ops {
        o.median_seconds *= 2.0;
    }
    let (a, c) = projections(&p, &r);
    assert!(close(c.breakdown.compute, 2.0 * a.breakdown.compute));
    only_changed(&a, &c, "compute");
    assert!(close(
        c.step_time_seconds,
        a.step_time_seconds + a.breakdown.compute
    ));
}

/// Absurd measurements (a million times slower, a million times faster than the roofline)
/// are clamped to [1/OP_RATIO_LIMIT, OP_RATIO_LIMIT] and counted; measurements inside the band
/// are used as they are.
#[test]
fn absurd_op_ratios_are_clamped_and_counted() {
    use crate::calibrate::{Calibration, OP_RATIO_LIMIT};
    let p = single_node();
    let honest = simulate(&p, Provenance::default());
    let c = Calibration::new(&p.scenario, &honest).unwrap();
    assert!(!c.clamped().any(), "{:?}", c.clamped());
    let mut slow = honest.clone();
    for o in &mut slow.ops {
        o.median_seconds *= 1e6;
    }
    let c = Calibration::new(&p.scenario, &slow).unwrap();
    let n = c.clamped();
    assert_eq!((n.ops, n.of_ops), (c.ops.len(), c.ops.len()));
    let (a, s) = projections(&p, &slow);
    // Compute is OP_RATIO_LIMIT times the analytic compute, not a million times.
    assert!(close(
        s.breakdown.compute,
        OP_RATIO_LIMIT * a.breakdown.compute
    ));
    let mut fast = honest.clone();
    for o in &mut fast.ops {
        o.median_seconds *= 1e-6;
    }
    let (_, f) = projections(&p, &fast);
    assert!(close(
        f.breakdown.compute,
        a.breakdown.compute / OP_RATIO_LIMIT
    ));
    // Within the band: not clamped.
    let mut twice = honest;
    for o in &mut twice.ops {
        o.median_seconds *= 2.0;
    }
    assert!(
        !Calibration::new(&p.scenario, &twice)
            .unwrap()
            .clamped()
            .any()
    );
}

/// Times GEMM passes analytically and everything else as zero: the GEMM part of a term.
struct GemmOnly;

impl OpTimer for GemmOnly {
    fn op_seconds(&self, ctx: &TimerContext, op: &Op, pass: Pass) -> f64 {
        match op.class {
            OpClass::Gemm | OpClass::GroupedGemm => AnalyticTimer.op_seconds(ctx, op, pass),
            _ => 0.0,
        }
    }
}

#[test]
fn gemms_at_half_the_analytic_speed_add_the_gemm_time_to_compute_only() {
    let p = single_node();
    let l = p.layout.as_ref().unwrap();
    let mut r = simulate(&p, Provenance::default());
    for o in &mut r.ops {
        if o.kind == "gemm" || o.kind == "grouped-gemm" {
            o.median_seconds *= 2.0;
        }
    }
    let (a, c) = projections(&p, &r);
    let gemm = project_with(&p.scenario, l, &GemmOnly).unwrap();
    assert!(gemm.breakdown.compute > 0.0 && gemm.breakdown.compute < a.breakdown.compute);
    assert!(
        close(
            c.breakdown.compute,
            a.breakdown.compute + gemm.breakdown.compute
        ),
        "{} vs {} + {}",
        c.breakdown.compute,
        a.breakdown.compute,
        gemm.breakdown.compute
    );
    only_changed(&a, &c, "compute");
}

#[test]
fn an_in_node_all_reduce_at_half_bandwidth_changes_only_the_tp_term() {
    // TP 8 without sequence parallelism (all-reduces) inside each node, DP 2 across the two
    // nodes (reduce-scatter and all-gather of the distributed optimizer, one GPU per node).
    let p = plan(
        "llama3.1-8b",
        "h200",
        16,
        "{tp: 8, sequenceParallel: false}",
    );
    let hw = &p.scenario.hardware;
    let alpha = hw.scale_up.latency_seconds();
    let mut r = simulate(&p, Provenance::default());
    let mut changed = 0;
    for c in &mut r.collectives {
        if c.op == "all-reduce" {
            // Ring all-reduce over n: t = 2(n-1)/n S/B + 2(n-1) alpha; half the bandwidth
            // doubles the first part: 2t - 2(n-1) alpha.
            let latency = 2.0 * (c.group_size as f64 - 1.0) * alpha;
            c.median_seconds = 2.0 * c.median_seconds - latency;
            changed += 1;
        }
    }
    assert!(
        changed >= 2,
        "the TP all-reduce and the DP bucket all-reduce"
    );
    let timer = CalibratedTimer::new(&p.scenario, &r).unwrap();
    for c in &timer.calibration.collectives {
        let want = if c.op == Collective::AllReduce {
            0.5
        } else {
            1.0
        };
        assert!(close(c.factor, want), "{c:?}");
    }
    let (a, c) = projections(&p, &r);
    // All-reduces on the critical rank per micro-batch: 4 per layer (attention and MLP, forward
    // and backward), the embedding's forward and backward, the loss statistics forward and
    // the output layer's input gradient backward. Each goes from t to 2t - 14 alpha.
    let layers = p.scenario.model.layers as f64;
    let per_microbatch = 4.0 * layers + 2.0 + 2.0;
    let n = per_microbatch * a.num_microbatches as f64;
    let want = 2.0 * a.breakdown.tp_comm - n * 14.0 * alpha;
    assert!(
        close(c.breakdown.tp_comm, want),
        "{} vs {want}",
        c.breakdown.tp_comm
    );
    only_changed(&a, &c, "tp");
    assert!(a.breakdown.dp_comm > 0.0, "the DP term exists and stays");
}

fn gemm_measurement(name: &str, m: u64, n: u64, k: u64, seconds: f64) -> OpMeasurement {
    let (mf, nf, kf) = (m as f64, n as f64, k as f64);
    OpMeasurement {
        name: name.into(),
        kind: "gemm".into(),
        shape: vec![m, n, k],
        precision: Precision::Bf16,
        flops: 2.0 * mf * nf * kf,
        bytes: (mf * kf + kf * nf + mf * nf) * 2.0,
        median_seconds: seconds,
        spread: 0.0,
        runs: 10,
    }
}

fn synthetic(p: &Plan, ops: Vec<OpMeasurement>) -> BenchmarkResults {
    let mut r = simulate(p, Provenance::default());
    r.ops = ops;
    r.collectives.clear();
    r
}

#[test]
fn ratios_interpolate_log_log_between_two_measured_shapes() {
    let p = single_node();
    let s = &p.scenario;
    let ctx = TimerContext {
        hardware: &s.hardware,
        precision: Precision::Bf16,
        fp8_recipe: crate::backend::Fp8Recipe::Delayed,
    };
    let analytic = |m: f64, n: f64, k: f64| {
        AnalyticTimer.op_seconds(&ctx, &Op::gemm("t", m, n, k, 1.0, false), Pass::Forward)
    };
    // 1024^3 runs at 2x the analytic time, 4096^3 (64x the FLOPs) at 0.5x.
    let small = gemm_measurement(
        "x.a.fwd",
        1024,
        1024,
        1024,
        2.0 * analytic(1024.0, 1024.0, 1024.0),
    );
    let large = gemm_measurement(
        "x.b.fwd",
        4096,
        4096,
        4096,
        0.5 * analytic(4096.0, 4096.0, 4096.0),
    );
    let timer = CalibratedTimer::new(s, &synthetic(&p, vec![small, large])).unwrap();
    let cal = &timer.calibration;
    assert!(cal.ops.iter().all(|o| !o.matched));
    // 2048^3 is 8x the small FLOPs: halfway in log FLOPs, so the ratio is sqrt(2 x 0.5) = 1.
    let mid = Op::gemm("t", 2048.0, 2048.0, 2048.0, 1.0, false);
    let (r, src) = cal.ratio(&mid, Pass::Forward);
    assert_eq!(src, RatioSource::Interpolated);
    assert!(close(r, 1.0), "{r}");
    // 1024 x 2048 x 2048 is 4x the small FLOPs, a third of the way in log FLOPs:
    // exp(ln 2 + (1/3)(ln 0.5 - ln 2)) = 2^(1/3).
    let third = Op::gemm("t", 1024.0, 2048.0, 2048.0, 1.0, false);
    assert!(close(
        cal.ratio(&third, Pass::Forward).0,
        2f64.powf(1.0 / 3.0)
    ));
    // Outside the measured range the nearest ratio holds.
    let tiny = Op::gemm("t", 64.0, 64.0, 64.0, 1.0, false);
    assert!(close(cal.ratio(&tiny, Pass::Forward).0, 2.0));
    let huge = Op::gemm("t", 16384.0, 16384.0, 16384.0, 1.0, false);
    assert!(close(cal.ratio(&huge, Pass::Forward).0, 0.5));
    // Other passes borrow the forward measurements; grouped GEMMs borrow the dense ones.
    assert!(close(cal.ratio(&mid, Pass::Wgrad).0, 1.0));
    let grouped = Op::gemm("g", 1024.0, 1024.0, 1024.0, 4.0, false);
    assert!(close(cal.ratio(&grouped, Pass::Forward).0, 2.0));
    // The timer scales the analytic time by the ratio; unmeasured kinds stay analytic.
    assert!(close(
        timer.op_seconds(&ctx, &tiny, Pass::Forward),
        2.0 * AnalyticTimer.op_seconds(&ctx, &tiny, Pass::Forward)
    ));
    let norm = Op::memory("norm", 1e8, 1.0);
    assert_eq!(
        cal.ratio(&norm, Pass::Forward),
        (1.0, RatioSource::Analytic)
    );
}

#[test]
fn a_reduced_tensor_parallel_size_is_restored_by_interpolation() {
    // TP 16 does not fit an 8-GPU node: the benchmark measured TP 8 and the projection
    // restores TP 16's narrower GEMMs between the measured shapes.
    let p = plan("gpt3-175b", "h100-sxm", 256, "{tp: 16, pp: 2}");
    let mut r = simulate(&p, Provenance::default());
    assert_eq!(r.measured_layout.tp, 8);
    for o in &mut r.ops {
        o.median_seconds *= 1.25;
    }
    let (a, c) = projections(&p, &r);
    // Every ratio is 1.25, so every interpolated op time too.
    assert!(close(c.breakdown.compute, 1.25 * a.breakdown.compute));
    let timer = CalibratedTimer::new(&p.scenario, &r).unwrap();
    let cov = coverage(&timer.calibration, &p.scenario, p.layout.as_ref().unwrap());
    assert_eq!(cov.term("compute").unwrap().source, Source::Interpolated);
    let gemm = &cov.op_kinds[0];
    assert_eq!(gemm.kind, "gemm");
    assert!(gemm.interpolated > 0 && gemm.analytic == 0, "{gemm:?}");
    // TP 16 spans two nodes: the in-node half is measured.
    assert_eq!(cov.term("tp").unwrap().source, Source::PartlyMeasured);
    assert_eq!(cov.term("bubble").unwrap().source, Source::FromMeasured);
    assert_eq!(cov.term("optimizer").unwrap().source, Source::Analytic);
}

#[test]
fn coverage_marks_what_the_benchmark_measured() {
    let p = plan("llama3.1-70b", "mi300x", 64, "{tp: 8, pp: 8}");
    let r = simulate(&p, Provenance::default());
    let timer = CalibratedTimer::new(&p.scenario, &r).unwrap();
    let cov = coverage(&timer.calibration, &p.scenario, p.layout.as_ref().unwrap());
    // Same TP, CP and micro-batch: every target op pass is a measured shape.
    let compute = cov.term("compute").unwrap();
    assert_eq!(compute.source, Source::Measured, "{compute:?}");
    assert_eq!(cov.term("tp").unwrap().source, Source::Measured);
    // Pipeline hops and DP groups leave the node: analytic.
    assert_eq!(cov.term("pp").unwrap().source, Source::Analytic);
    assert_eq!(cov.term("cp").unwrap().source, Source::None);
    assert_eq!(cov.term("ep").unwrap().source, Source::None);
    // 64 GPUs = TP 8 x PP 8: no data parallelism.
    assert_eq!(cov.term("dp").unwrap().source, Source::None);
    assert_eq!(cov.op_kinds.iter().map(|k| k.analytic).sum::<usize>(), 0);
}

#[test]
fn a_report_of_another_gpu_is_refused() {
    let p = single_node();
    let mut r = simulate(&p, Provenance::default());
    r.gpu = "mi300x".into();
    r.gpu_product = "AMD Instinct MI300X".into();
    let e = CalibratedTimer::new(&p.scenario, &r).unwrap_err();
    assert!(matches!(e, CalibrationError::GpuMismatch { .. }), "{e}");
    assert!(e.to_string().contains("mi300x"), "{e}");
    let mut empty = simulate(&p, Provenance::default());
    empty.ops.clear();
    empty.collectives.clear();
    assert_eq!(
        CalibratedTimer::new(&p.scenario, &empty).unwrap_err(),
        CalibrationError::Empty
    );
}

#[test]
fn reports_parse_as_results_or_as_kubectl_objects() {
    let p = single_node();
    let r = simulate(&p, Provenance::default());
    let json = serde_json::to_string(&r).unwrap();
    assert_eq!(parse_report(&json, "r.json").unwrap(), r);
    let object = serde_json::json!({
        "apiVersion": "primus.dev/v1alpha1",
        "kind": "BenchmarkReport",
        "metadata": {"name": "p-bench-1", "namespace": "team"},
        "spec": {"plan": "p", "results": r},
    });
    let yaml = serde_saphyr::to_string(&object).unwrap();
    assert_eq!(parse_report(&yaml, "r.yaml").unwrap(), r);
    let mut bad = serde_json::to_value(&r).unwrap();
    bad["ops"][0]["medianSeconds"] = serde_json::json!("fast");
    let e = parse_report(&bad.to_string(), "bad.json").unwrap_err();
    assert!(e.to_string().contains("ops[0].medianSeconds"), "{e}");
    let e = parse_report("kind: BenchmarkReport\nspec: {plan: p}\n", "empty.yaml").unwrap_err();
    assert!(e.to_string().contains("spec.results"), "{e}");
}

#[test]
fn reports_beyond_their_bounds_are_refused_naming_the_field() {
    let p = single_node();
    let r = simulate(&p, Provenance::default());
    // A simulated report holds a few dozen ops: well within the bounds.
    assert!(
        (r.ops.len() as u64) < crate::report::MAX_REPORT_OPS / 10,
        "{}",
        r.ops.len()
    );
    let mut many = r.clone();
    let op = many.ops[0].clone();
    many.ops = vec![op; crate::report::MAX_REPORT_OPS as usize + 1];
    let e = parse_report(&serde_json::to_string(&many).unwrap(), "many.json").unwrap_err();
    assert!(e.to_string().contains("ops: "), "{e}");
    let mut long = r.clone();
    long.ops[3].name = "x".repeat(300);
    let e = parse_report(&serde_json::to_string(&long).unwrap(), "long.json").unwrap_err();
    assert!(e.to_string().contains("ops[3].name"), "{e}");
    let mut shape = r.clone();
    shape.ops[0].shape = vec![1; 9];
    let e = parse_report(&serde_json::to_string(&shape).unwrap(), "shape.json").unwrap_err();
    assert!(e.to_string().contains("ops[0].shape"), "{e}");
    let object = serde_json::json!({
        "kind": "BenchmarkReport",
        "spec": {"plan": "p", "results": many},
    });
    let e = parse_report(&object.to_string(), "r.json").unwrap_err();
    assert!(e.to_string().contains("spec.results.ops"), "{e}");
}

#[test]
fn link_factors_interpolate_in_message_size_and_borrow_across_kinds() {
    let mut links = LinkCalibration::default();
    assert!(links.is_empty());
    let point = |members, bytes, factor| LinkPoint {
        members,
        bytes,
        factor,
    };
    assert!(links.add(Collective::AllReduce, point(8, 1e6, 0.5)));
    assert!(links.add(Collective::AllReduce, point(8, 1e8, 1.0)));
    assert!(!links.add(Collective::AllReduce, point(8, 1e8, f64::NAN)));
    let ar = |members, bytes| links.lookup(Collective::AllReduce, members, bytes);
    // 1e7 is halfway between 1e6 and 1e8 in log bytes.
    let (f, src, at) = ar(8, 1e7).unwrap();
    assert!(close(f, 0.75) && src == Collective::AllReduce && at == 8);
    // Flat outside the measured sizes.
    assert_eq!(ar(8, 1e3).unwrap().0, 0.5);
    assert_eq!(ar(8, 1e12).unwrap().0, 1.0);
    // Another group size takes the nearest measured one.
    assert_eq!(ar(4, 1e8).unwrap(), (1.0, Collective::AllReduce, 8));
    // Reduce-scatter was not measured: the all-reduce (same ring, same links) stands in;
    // all-to-all has no stand-in.
    assert_eq!(
        links.lookup(Collective::ReduceScatter, 8, 1e6),
        Some((0.5, Collective::AllReduce, 8))
    );
    assert_eq!(links.lookup(Collective::AllToAll, 8, 1e6), None);
    // The topology a collective sees: the scale-up bandwidth times the factor, and a ring
    // all-reduce over 8 GPUs of a 1 MB buffer at half of 100 GB/s with 1 us steps:
    // 2 x 7/8 x 1e6 / 50e9 + 14 x 1 us.
    let topo = Topology {
        domain: 8,
        up: crate::collectives::Tier {
            bandwidth: 100e9,
            latency: 1e-6,
        },
        out: crate::collectives::Tier {
            bandwidth: 10e9,
            latency: 5e-6,
        },
        links,
    };
    let seen = topo.seen_by(Collective::AllReduce, 8, 1e6);
    assert_eq!(seen.up.bandwidth, 50e9);
    assert!(seen.links.is_empty());
    let g = crate::collectives::Group::place(8, 8, 1, 8);
    let t = crate::collectives::all_reduce(&topo, &g, 1e6);
    assert!(close(t, 2.0 * 7.0 / 8.0 * 1e6 / 50e9 + 14.0 * 1e-6), "{t}");
    // All-to-all keeps the analytic bandwidth.
    let a2a = crate::collectives::all_to_all(&topo, &g, 1e6);
    assert!(close(a2a, 7.0 / 8.0 * 1e6 / 100e9 + 7.0 * 1e-6), "{a2a}");
}
