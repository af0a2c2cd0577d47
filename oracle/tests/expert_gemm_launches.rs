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
