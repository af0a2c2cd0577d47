//! What each expert-MLP implementation launches per linear, against the code that launches it:
//! Megatron's SequentialMLP loops over the local experts in Python (`experts.py`), Transformer
//! Engine's grouped linear and the legacy grouped GEMM issue one GEMM per local expert from
//! C++ (the grouped_gemm package's `gmm`: fanshiqing/grouped_gemm `csrc/grouped_gemm.cu`
//! `CublasGroupedGemm` / `CublasGroupedGemmVariableK`, a cuBLAS call per expert round-robin
//! on four streams; on ROCm the same loop on hipBLAS, caaatch22/grouped_gemm branch `rocm`,
//! which Primus' images build).

use primus_oracle::compute::{
    AnalyticTimer, Dims, LayerShape, OpTimes, Part, SEQUENTIAL_EXPERT_LAUNCHES, TimerContext,
    layer_ops,
};
use primus_oracle::layout::{GroupedGemm, Layout, TokenDispatcher};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::scenario::Scenario;

mod common;

const MOE: LayerShape = LayerShape {
    kind: LayerKind::Moe,
    sliding: false,
};

/// DeepSeek-V2-Lite on 8 MI355X, TP1 PP1 EP8, MBS 1 (the Primus MoE package's baseline,
/// oracle/tests/data/moe-nongated.csv XV1): 64 experts, 8 per GPU.
fn dsv2_lite(gg: GroupedGemm) -> (Scenario, Layout) {
    let s = common::scenario(
        "deepseek-v2-lite",
        "mi355x",
        8,
        Some(8),
        4096,
        64,
        Precision::Bf16,
    );
    let mut l = Layout {
        ep: 8,
        ..Layout::default()
    };
    l.moe.token_dispatcher = TokenDispatcher::Alltoall;
    l.moe.grouped_gemm = gg;
    l.moe.force_load_balancing = true;
    (s, l)
}

fn launches(gg: GroupedGemm, name: &str) -> (f64, f64) {
    let (s, l) = dsv2_lite(gg);
    let op = *layer_ops(&s.model, &Dims::of(&s, &l), MOE)
        .iter()
        .find(|o| o.name == name)
        .expect("expert GEMM op");
    (op.kernels, op.host_ops)
}

#[test]
fn every_expert_mlp_launches_one_gemm_per_local_expert_and_differs_in_who_issues_it() {
    let local = 64.0 / 8.0;
    for name in ["experts_fc1", "experts_fc2"] {
        // Python loop: a module per expert, each a handful of framework calls.
        assert_eq!(
            launches(GroupedGemm::Sequential, name),
            (
                local * SEQUENTIAL_EXPERT_LAUNCHES,
                local * SEQUENTIAL_EXPERT_LAUNCHES
            ),
            "{name}"
        );
        // One framework call issuing a GEMM per local expert from C++: TE's grouped linear
        // and the legacy grouped GEMM alike (it is not one grouped kernel).
        assert_eq!(launches(GroupedGemm::Grouped, name), (local, 1.0), "{name}");
        assert_eq!(launches(GroupedGemm::Legacy, name), (local, 1.0), "{name}");
    }
}

#[test]
fn the_legacy_grouped_gemm_costs_the_library_launches_of_its_loop() {
    // The experts' part of the layer: two linears per pass, each one framework call and
    // (local - 1) library-launched GEMMs, so 2 x 7 library launches a forward for 8 local
    // experts; the GPU time is the same GEMMs either way.
    let (s, l) = dsv2_lite(GroupedGemm::Legacy);
    let ctx = TimerContext {
        hardware: &s.hardware,
        precision: Precision::Bf16,
        fp8_recipe: primus_oracle::backend::Fp8Recipe::Delayed,
    };
    let times = |l: &Layout| {
        OpTimes::of(
            &layer_ops(&s.model, &Dims::of(&s, l), MOE),
            &AnalyticTimer,
            &ctx,
        )
        .part(Part::Experts)
    };
    let legacy = times(&l);
    let mut grouped = l.clone();
    grouped.moe.grouped_gemm = GroupedGemm::Grouped;
    let grouped = times(&grouped);
    assert_eq!(legacy.library, 2.0 * 7.0);
    assert_eq!(legacy.library, grouped.library);
    assert_eq!(legacy.host_ops, grouped.host_ops);
    assert!((legacy.forward - grouped.forward).abs() < 1e-12);
    assert!((legacy.backward - grouped.backward).abs() < 1e-12);
}

#[test]
fn the_legacy_grouped_gemm_runs_its_experts_in_bf16_under_fp8() {
    // grouped_gemm's gmm takes BF16 operands only (`csrc/grouped_gemm.cu`: TORCH_CHECK
    // kBFloat16), so under FP8 training Megatron's legacy GroupedMLP keeps BF16 expert GEMMs,
    // BF16 weights without FP8 copies, BF16 saved inputs and no FP8 row padding, where
    // Transformer Engine's grouped linear runs them in FP8.
    let fp8 = |gg: GroupedGemm| {
        let (mut s, l) = dsv2_lite(gg);
        s.training.precision = Precision::Fp8;
        let mut l = l;
        l.micro_batch_size = 1;
        (s, l)
    };
    for (gg, expect) in [(GroupedGemm::Grouped, true), (GroupedGemm::Legacy, false)] {
        let (s, l) = fp8(gg);
        let d = Dims::of(&s, &l);
        for name in ["experts_fc1", "experts_fc2"] {
            let op = *layer_ops(&s.model, &d, MOE)
                .iter()
                .find(|o| o.name == name)
                .unwrap();
            assert_eq!(op.fp8, expect, "{gg:?} {name}");
        }
        assert_eq!(d.moe.fp8_align == 0.0, !expect, "{gg:?}");
    }
    let stage = |gg| {
        let (s, l) = fp8(gg);
        primus_oracle::memory::estimate(&s, &l).stages[0].clone()
    };
    let (grouped, legacy) = (stage(GroupedGemm::Grouped), stage(GroupedGemm::Legacy));
    // Weights: 2 bytes less per expert GEMM parameter (the FP8 copy and its transpose).
    // DeepSeek-V2-Lite: 26 MoE layers x 8 local experts x 3 x 2,048 x 1,408.
    let expert_params = 26.0 * 8.0 * 3.0 * 2048.0 * 1408.0;
    assert!(
        (grouped.weights_bytes - legacy.weights_bytes - 2.0 * expert_params).abs() < 1.0,
        "{} {}",
        grouped.weights_bytes,
        legacy.weights_bytes
    );
    // Activations: one byte more per element of each routed copy's fc1 input (h) and fc2
    // input (f): 6 copies x (2,048 + 1,408) x 4,096 tokens x 26 layers.
    let extra = 6.0 * (2048.0 + 1408.0) * 4096.0 * 26.0;
    assert!(
        (legacy.activations_bytes - grouped.activations_bytes - extra).abs() < 1.0,
        "{} {}",
        legacy.activations_bytes,
        grouped.activations_bytes
    );
}
