//! The step-time projection: consistency of its outputs, hand-derived model FLOPs, schedule
//! and overlap effects, the op-timer interface, errors and the JSON contract.

use primus_oracle::calibrate::{LayerMeasurement, MeasuredTimer};
use primus_oracle::compute::{AnalyticTimer, LayerShape, Op, OpTimer, Pass, TimerContext};
use primus_oracle::layout::{Layout, Recompute, Schedule};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::projection::{Dominant, project, project_with, step_time};
use primus_oracle::scenario::{Cluster, Scenario, Training};

fn scenario(
    model: &str,
    gpu: &str,
    gpus: u32,
    seq: u64,
    gbs: u64,
    precision: Precision,
) -> Scenario {
    let c = Catalog::builtin().expect("catalog");
    Scenario {
        model: c.model(model).expect("model").clone(),
        hardware: c.hardware(gpu).expect("gpu").clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node: 8,
        },
        training: Training {
            seq_length: seq,
            global_batch_size: gbs,
            precision,
        },
    }
}

/// A MoE layout with Megatron's EP overlap: PP2 VPP2 EP8, alltoall, grouped experts, forced
/// balance, delayed weight gradients (Mixtral 8x7B on 64 B200 in `cases`).
fn overlapped_moe() -> Layout {
    use primus_oracle::layout::{Dispatch, GroupedGemm};
    let mut l = Layout {
        pp: 2,
        vpp: 2,
        ep: 8,
        schedule: Schedule::Interleaved,
        ..Layout::default()
    };
    l.moe.set_dispatch(Dispatch::Alltoall);
    l.moe.grouped_gemm = GroupedGemm::Grouped;
    l.moe.force_load_balancing = true;
    l.moe.ep_overlap = true;
    l.moe.delay_wgrad = true;
    l
}

fn cases() -> Vec<(Scenario, Layout)> {
    let dense = scenario("llama3.1-70b", "h100-sxm", 64, 8192, 128, Precision::Bf16);
    let moe = scenario("mixtral-8x7b", "b200", 64, 4096, 256, Precision::Fp8);
    let mla = scenario("deepseek-v3", "mi300x", 256, 4096, 512, Precision::Bf16);
    vec![
        (
            dense.clone(),
            Layout {
                tp: 4,
                pp: 4,
                vpp: 5,
                schedule: Schedule::Interleaved,
                ..Layout::default()
            },
        ),
        (
            dense.clone(),
            Layout {
                tp: 4,
                pp: 4,
                cp: 2,
                recompute: Recompute::Full,
                ..Layout::default()
            },
        ),
        (
            dense.clone(),
            Layout {
                tp: 8,
                pp: 4,
                schedule: Schedule::ZeroBubble,
                recompute: Recompute::Selective,
                ..Layout::default()
            },
        ),
        (
            dense,
            Layout {
                tp: 8,
                fsdp: true,
                distributed_optimizer: false,
                recompute: Recompute::Full,
                ..Layout::default()
            },
        ),
        (
            moe.clone(),
            Layout {
                ep: 8,
                micro_batch_size: 2,
                ..Layout::default()
            },
        ),
        (moe, overlapped_moe()),
        (
            mla,
            Layout {
                pp: 8,
                ep: 32,
                recompute: Recompute::Full,
                pipeline_layout: Some(
                    primus_oracle::layout::PipelineLayout::parse("Et*7|(t*8|)*6t*6mL")
                        .expect("layout"),
                ),
                ..Layout::default()
            },
        ),
    ]
}

#[test]
fn breakdown_sums_to_the_step_and_throughputs_agree() {
    for (s, l) in cases() {
        l.check(&s).unwrap_or_else(|e| panic!("{}: {e}", l.label()));
        let p = project(&s, &l).expect("projects");
        let b = p.breakdown;
        let sum = b.total();
        assert!(
            (sum - p.step_time_seconds).abs() < 1e-9 * p.step_time_seconds,
            "{}: breakdown {sum} vs step {}",
            l.label(),
            p.step_time_seconds
        );
        for (name, v) in b.terms() {
            assert!(v >= 0.0 && v.is_finite(), "{} {name} = {v}", l.label());
        }
        // tokens/s/GPU = GBS * seq / step / GPUs.
        let tokens = s.training.global_batch_size as f64 * s.training.seq_length as f64;
        let expect = tokens / p.step_time_seconds / s.cluster.gpus as f64;
        assert!((p.tokens_per_second_per_gpu - expect).abs() < 1e-9 * expect);
        // MFU is model TFLOP/s over the dense peak of the precision.
        let peak = s.hardware.peak_flops(s.training.precision) / 1e12;
        assert!((p.mfu - p.tflops_per_gpu / peak).abs() < 1e-12);
        assert!(p.mfu > 0.01 && p.mfu < 0.9, "{}: mfu {}", l.label(), p.mfu);
        assert!(p.bubble_fraction >= 0.0 && p.bubble_fraction < 1.0);
        assert_eq!(p.dp, l.dp(s.cluster.gpus).unwrap());
        assert_eq!(p.num_microbatches, l.num_microbatches(&s));
    }
}

#[test]
fn model_flops_match_the_hand_derivation() {
    // Llama 3.1 8B, seq 8192 (config.json: 32 layers, h 4096, 32 heads of 128, 8 KV heads,
    // SwiGLU 14336, vocab 128256, untied). GEMM weights per layer: Q + O 2 * 4096^2, K + V
    // 2 * 4096 * 1024, MLP 3 * 4096 * 14336 -> 218,103,808; output layer 4096 * 128256.
    // Model FLOPs per token: 6 x (GEMM weights) + attention 3 x 32 layers x (2 x 32 heads x
    // 256 (QK and PV dims) x (s + 1)/2 causal pairs per query).
    let s = scenario("llama3.1-8b", "h100-sxm", 8, 8192, 128, Precision::Bf16);
    let l = Layout::default();
    let t = step_time(&s, &l).expect("projects");
    let gemm_weights = 32.0 * 218_103_808.0 + 4096.0 * 128_256.0;
    let attention = 3.0 * 32.0 * 2.0 * 32.0 * 256.0 * (8192.0 + 1.0) / 2.0;
    let per_token = 6.0 * gemm_weights + attention;
    let tokens = 128.0 * 8192.0;
    let got = t.model_flops_per_step / tokens;
    assert!(
        (got - per_token).abs() < 1e-9 * per_token,
        "{got} vs {per_token}"
    );
    // NeMo's published tables give 744 TFLOP/s at 14451 tokens/s/GPU for this model:
    // 5.148e10 FLOPs per token, the same convention within 0.1%.
    assert!((per_token / 5.148e10 - 1.0).abs() < 1e-3);
}

#[test]
fn zero_bubble_and_interleaving_shrink_the_bubble() {
    let s = scenario("llama3.1-70b", "h100-sxm", 64, 8192, 64, Precision::Bf16);
    let base = Layout {
        tp: 8,
        pp: 8,
        ..Layout::default()
    };
    let ofob = step_time(&s, &base).expect("1f1b");
    let zb = step_time(
        &s,
        &Layout {
            schedule: Schedule::ZeroBubble,
            ..base.clone()
        },
    )
    .expect("zb");
    let il = step_time(
        &s,
        &Layout {
            vpp: 5,
            schedule: Schedule::Interleaved,
            ..base.clone()
        },
    )
    .expect("interleaved");
    assert!(zb.step_time_seconds < ofob.step_time_seconds);
    assert!(zb.bubble_fraction < ofob.bubble_fraction);
    assert!(il.bubble_fraction < ofob.bubble_fraction);
    // 1F1B with 64 micro-batches on 8 stages: (p-1)/(m+p-1) = 7/71 = 9.9% with equal stages.
    // Here the last stage also runs the output layer and loss, so it is the busiest and the
    // others' idle time counts against it: a bubble fraction somewhat below 7/71.
    assert!(
        ofob.bubble_fraction > 0.6 * 7.0 / 71.0 && ofob.bubble_fraction < 7.0 / 71.0,
        "{}",
        ofob.bubble_fraction
    );
}

#[test]
fn overlap_flags_and_recompute_move_time_the_right_way() {
    let s = scenario("llama3.1-70b", "h100-sxm", 64, 8192, 128, Precision::Bf16);
    let l = Layout {
        tp: 8,
        pp: 2,
        ..Layout::default()
    };
    let base = step_time(&s, &l).expect("base");
    let overlap = step_time(
        &s,
        &Layout {
            tp_comm_overlap: true,
            ..l.clone()
        },
    )
    .expect("overlap");
    assert!(overlap.breakdown.tp_comm < base.breakdown.tp_comm);
    let full = step_time(
        &s,
        &Layout {
            recompute: Recompute::Full,
            ..l.clone()
        },
    )
    .expect("full");
    let selective = step_time(
        &s,
        &Layout {
            recompute: Recompute::Selective,
            ..l.clone()
        },
    )
    .expect("selective");
    assert!(base.step_time_seconds < selective.step_time_seconds);
    assert!(selective.step_time_seconds < full.step_time_seconds);
    // Full recompute reruns the forward: about a third more compute.
    let ratio = full.breakdown.compute / base.breakdown.compute;
    assert!(ratio > 1.25 && ratio < 1.40, "{ratio}");
    // Model FLOPs do not count recomputation.
    assert_eq!(full.model_flops_per_step, base.model_flops_per_step);
    let no_overlap = step_time(
        &s,
        &Layout {
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            ..l.clone()
        },
    )
    .expect("no overlap");
    assert!(no_overlap.breakdown.dp_comm > base.breakdown.dp_comm);
    // BF16 gradients halve the reduce-scatter's bytes: exposed, the DP time goes from
    // reduce-scatter 4 + all-gather 2 bytes per parameter to 2 + 2, two thirds when
    // bandwidth-bound (latency terms keep it a little above).
    let bf16_grads = step_time(
        &s,
        &Layout {
            overlap_grad_reduce: false,
            overlap_param_gather: false,
            grad_reduce_in_fp32: false,
            ..l.clone()
        },
    )
    .expect("bf16 grads");
    let ratio = bf16_grads.breakdown.dp_comm / no_overlap.breakdown.dp_comm;
    assert!(ratio > 2.0 / 3.0 - 1e-9 && ratio < 0.70, "{ratio}");
}

/// A timer that makes every op twice as slow as the roofline.
struct Slow;

impl OpTimer for Slow {
    fn op_seconds(&self, ctx: &TimerContext, op: &Op, pass: Pass) -> f64 {
        2.0 * AnalyticTimer.op_seconds(ctx, op, pass)
    }
}

#[test]
fn op_timers_replace_the_analytic_times() {
    let s = scenario("llama3.1-8b", "b200", 8, 8192, 64, Precision::Fp8);
    let l = Layout::default();
    let a = project(&s, &l).expect("analytic");
    let slow = project_with(&s, &l, &Slow).expect("slow");
    let ratio = slow.breakdown.compute / a.breakdown.compute;
    assert!((ratio - 2.0).abs() < 1e-9, "{ratio}");
    // A measured whole-layer forward replaces the sum of that layer's ops.
    let shape = LayerShape {
        kind: LayerKind::Dense,
        sliding: false,
    };
    let measured = MeasuredTimer {
        layers: vec![LayerMeasurement {
            shape,
            pass: Pass::Forward,
            seconds: 0.5,
        }],
        ..MeasuredTimer::default()
    };
    let m = project_with(&s, &l, &measured).expect("measured");
    // 32 layers x 0.5 s per micro-batch forward, 8 micro-batches per step (64 / 8 DP).
    assert!(m.breakdown.compute > 32.0 * 0.5 * 8.0);
    assert!(m.breakdown.compute < a.breakdown.compute + 32.0 * 0.5 * 8.0);
}

#[test]
fn what_dominates() {
    let s = scenario("llama3.1-8b", "h100-sxm", 8, 8192, 128, Precision::Bf16);
    let p = project(&s, &Layout::default()).expect("dense");
    assert_eq!(p.dominant, Dominant::Compute);
    // 2 micro-batches on 8 stages: mostly bubble.
    let s = scenario("llama3.1-70b", "h100-sxm", 64, 4096, 2, Precision::Bf16);
    let l = Layout {
        tp: 8,
        pp: 8,
        micro_batch_size: 1,
        ..Layout::default()
    };
    let p = project(&s, &l).expect("bubbly");
    assert_eq!(p.dominant, Dominant::Bubble, "{:?}", p.breakdown);
}

#[test]
fn illegal_layouts_are_errors_naming_the_field() {
    let s = scenario("llama3.1-70b", "h100-sxm", 64, 8192, 128, Precision::Bf16);
    let e = project(
        &s,
        &Layout {
            tp: 16,
            ..Layout::default()
        },
    )
    .expect_err("tp 16 does not divide the 8 KV heads");
    assert!(e.to_string().contains("spec.parallelism.tp"), "{e}");
}

#[test]
fn projection_json_has_the_design_field_names() {
    let s = scenario("llama3.1-70b", "h100-sxm", 64, 8192, 128, Precision::Bf16);
    let l = Layout {
        tp: 4,
        pp: 4,
        ..Layout::default()
    };
    let p = project(&s, &l).expect("projects");
    let v = serde_json::to_value(&p).expect("json");
    for key in [
        "tokensPerSecondPerGpu",
        "tflopsPerGpu",
        "mfu",
        "stepTimeSeconds",
        "bubbleFraction",
        "numMicrobatches",
        "dp",
        "dominant",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    for key in ["peakBytes", "capacityBytes", "fits", "stages"] {
        assert!(v["memory"].get(key).is_some(), "missing memory.{key}");
    }
    let stage = &v["memory"]["stages"][0];
    for key in [
        "weightsBytes",
        "gradientsBytes",
        "optimizerBytes",
        "activationsBytes",
        "otherBytes",
        "totalBytes",
    ] {
        assert!(stage.get(key).is_some(), "missing memory.stages[].{key}");
    }
    for key in [
        "compute",
        "tpComm",
        "cpComm",
        "epComm",
        "ppComm",
        "dpComm",
        "bubble",
        "optimizer",
        "other",
    ] {
        assert!(v["breakdown"][key].is_f64(), "missing breakdown.{key}");
    }
}

/// Under Megatron's EP overlap (`--overlap-moe-expert-parallel-comm`, combined 1F1B) the
/// dispatch and combine run behind the paired micro-batch's computation, so they give the host
/// no GPU time to issue the layer behind: a host-bound MoE layer cannot get faster than with
/// no communication at all. Qwen3-30B-A3B on 16 B200 (TP1 PP2 VPP2 EP8, MBS 1, alltoall,
/// grouped experts, forced balance, no CUDA graphs: host-bound), once with the profile and
/// once with 1,000x the NVLink and NIC bandwidth. Before stop 23 the exposure subtracted the
/// whole dispatch and combine from the host time although the overlap had already hidden them,
/// and the real links projected faster than the near-free ones (Megatron-Bridge 25.11 Qwen3-235B
/// on B200 with the overlap, row N11: +17.9%, after the fix within the generation's spread).
#[test]
fn hidden_ep_communication_does_not_hide_host_time() {
    let s = scenario("qwen3-30b-a3b", "b200", 16, 4096, 256, Precision::Fp8);
    let mut l = overlapped_moe();
    l.moe.permute_fusion = true;
    l.check(&s).expect("legal layout");
    let real = step_time(&s, &l).expect("real links");
    assert!(
        real.breakdown.host > 0.1 * real.step_time_seconds,
        "not host-bound: {:?}",
        real.breakdown
    );
    // Hidden in the steady state; what is left is the unpaired warm-up and cool-down passes
    // (the first rank runs 5 of its 64 forwards and 5 of its backwards unpaired).
    assert!(
        real.breakdown.ep_comm < 0.05 * real.step_time_seconds,
        "{:?}",
        real.breakdown
    );
    let mut fast = s.clone();
    fast.hardware.scale_up.bandwidth_gbps *= 1000.0;
    fast.hardware.scale_out.bandwidth_gbps *= 1000.0;
    let free = step_time(&fast, &l).expect("near-free links");
    assert!(
        real.step_time_seconds >= free.step_time_seconds,
        "real links {} s < near-free links {} s: {:?} vs {:?}",
        real.step_time_seconds,
        free.step_time_seconds,
        real.breakdown,
        free.breakdown
    );
    // Without the overlap the dispatch and combine are exposed and the host issues behind
    // them: its exposure shrinks by at most their time.
    l.moe.ep_overlap = false;
    l.moe.delay_wgrad = false;
    let plain = step_time(&s, &l).expect("no overlap");
    assert!(plain.breakdown.host <= real.breakdown.host);
    assert!(plain.breakdown.host + plain.breakdown.ep_comm >= real.breakdown.host);
}

/// FSDP gathers a layer's weights once for its backward, and that gather and the previous
/// layer's reduce-scatter drain behind the layer's whole backward, the recompute rerun
/// included (Megatron-FSDP's and FSDP2's pre-backward prefetch; the rerun runs on the gathered
/// weights). Llama 3.1 8B on 64 H100 at seq 1024, MBS 1: each layer's 436 MB gather over 64
/// GPUs on 8 nodes takes ~10x its forward, so with full recompute every rerun hides under the
/// traffic: the exposed FSDP time shrinks by exactly the recomputed forward's GPU time. Before
/// stop 24 the rerun hid nothing (Megatron-ModelZoo's Qwen3-235B on 256 H100 with
/// Megatron-FSDP, EP 8 and full recompute was projected 21.5% too slow).
#[test]
fn the_recompute_rerun_hides_fsdp_traffic() {
    let s = scenario("llama3.1-8b", "h100-sxm", 64, 1024, 64, Precision::Bf16);
    let plain = Layout {
        fsdp: true,
        distributed_optimizer: false,
        ..Layout::default()
    };
    plain.check(&s).expect("legal layout");
    let full = Layout {
        recompute: Recompute::Full,
        ..plain.clone()
    };
    let a = step_time(&s, &plain).expect("no recompute");
    let b = step_time(&s, &full).expect("full recompute");
    let rerun = b.breakdown.compute - a.breakdown.compute;
    assert!(rerun > 0.0, "full recompute reruns the forward");
    assert!(
        a.breakdown.dp_comm > 2.0 * rerun,
        "FSDP traffic not exposed enough for the test: {:?}",
        a.breakdown
    );
    let hidden = a.breakdown.dp_comm - b.breakdown.dp_comm;
    assert!(
        (hidden - rerun).abs() <= 1e-9 * a.step_time_seconds,
        "the rerun ({rerun} s) should hide as much FSDP traffic, hid {hidden} s"
    );
    // Recompute never makes a step faster.
    assert!(b.step_time_seconds >= a.step_time_seconds - 1e-9);
}

/// Megatron's EP overlap pairs a forward with a backward only in the interleaved schedule's
/// steady state: the warm-up, one micro-batch longer than without the overlap
/// (`get_pp_rank_microbatches`: `(pp - r - 1) * 2 + (vpp - 1) * pp + 1` forwards on rank r),
/// and as many cool-down backwards run alone, exposing their own dispatch and combine. The
/// step pays for them: with 8 micro-batches (rank 0: 2 + 2 + 1 = 5 of its 16 forwards
/// unpaired) the overlap hides a smaller share of the communication than with 256, and the
/// projection's EP time grows by the unpaired passes' exposure. Before stop 24 every pass
/// counted as paired.
#[test]
fn the_ep_overlap_leaves_the_warm_up_and_cool_down_unpaired() {
    // 32 data-parallel replicas: 8 and 256 micro-batches.
    let few = scenario("mixtral-8x7b", "b200", 64, 4096, 256, Precision::Fp8);
    let many = scenario("mixtral-8x7b", "b200", 64, 4096, 8192, Precision::Fp8);
    let on = overlapped_moe();
    let mut off = on.clone();
    off.moe.ep_overlap = false;
    off.moe.delay_wgrad = false;
    let per_microbatch = |s: &Scenario, l: &Layout| {
        let p = step_time(s, l).expect("projects");
        assert_eq!(p.num_microbatches, s.training.global_batch_size / 32);
        (p.step_time_seconds / p.num_microbatches as f64, p)
    };
    let (few_on, p_few) = per_microbatch(&few, &on);
    let (few_off, _) = per_microbatch(&few, &off);
    let (many_on, p_many) = per_microbatch(&many, &on);
    let (many_off, _) = per_microbatch(&many, &off);
    // The overlap saves less per micro-batch when a third of the passes run unpaired.
    let saved_few = few_off - few_on;
    let saved_many = many_off - many_on;
    assert!(saved_few > 0.0, "the overlap still helps: {saved_few}");
    assert!(
        saved_few < 0.9 * saved_many,
        "saved per micro-batch: {saved_few} s with 8, {saved_many} s with 256"
    );
    // The exposed EP time per micro-batch is larger with few micro-batches.
    let ep_few = p_few.breakdown.ep_comm / p_few.num_microbatches as f64;
    let ep_many = p_many.breakdown.ep_comm / p_many.num_microbatches as f64;
    assert!(ep_few > ep_many, "{ep_few} vs {ep_many}");
}
