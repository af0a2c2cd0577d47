//! The experts' fused grouped MLP (`moe.fusedGroupedMlp`: Megatron's
//! `--use-transformer-engine-op-fuser` with `NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`, the 26.06+
//! Megatron-Bridge Blackwell recipes): what leaves the op list, by hand; `moe_act` recompute
//! not reaching into it; Megatron-Core's conditions (`moe/experts.py`,
//! `_is_fused_impl_supported`) as rules; the flag's round trip.

use primus_oracle::compute::{Dims, LayerShape, Op, layer_ops};
use primus_oracle::layout::{
    GroupedGemm, Layout, ModuleSet, OffloadModule, Recompute, RecomputeModule, TokenDispatcher,
};
use primus_oracle::megatron::{MegatronArgs, megatron_flags};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::scenario::Scenario;

mod common;

fn scenario(model: &str, gpu: &str, gpus: u32) -> Scenario {
    common::scenario(model, gpu, gpus, Some(4), 4096, 512, Precision::Bf16)
}

/// EP8 with TE's grouped GEMM, permute fusion and forced balance, fused or not.
fn experts(fused: bool) -> Layout {
    let mut l = Layout {
        ep: 8,
        micro_batch_size: 1,
        ..Layout::default()
    };
    l.moe.token_dispatcher = TokenDispatcher::Alltoall;
    l.moe.grouped_gemm = GroupedGemm::Grouped;
    l.moe.permute_fusion = true;
    l.moe.force_load_balancing = true;
    l.moe.fused_grouped_mlp = fused;
    l
}

const MOE: LayerShape = LayerShape {
    kind: LayerKind::Moe,
    sliding: false,
};

fn op(s: &Scenario, l: &Layout, name: &str) -> Option<Op> {
    layer_ops(&s.model, &Dims::of(s, l), MOE)
        .iter()
        .find(|o| o.name == name)
        .copied()
}

#[test]
fn the_activation_pass_leaves_the_expert_elementwise_op_by_hand() {
    // Qwen3-30B-A3B on 8 GB200: 4096 tokens x top-8 = 32,768 routed copies on the busiest
    // rank (times the forced balance's load), expert FFN 768 (SwiGLU).
    let s = scenario("qwen3-30b-a3b", "gb200", 8);
    let plain = op(&s, &experts(false), "moe_expert_elementwise").unwrap();
    let fused = op(&s, &experts(true), "moe_expert_elementwise").unwrap();
    let moe = s.model.moe.as_ref().unwrap();
    let d = Dims::of(&s, &experts(true));
    let (routed, _) = primus_oracle::compute::busiest_rank(&d, moe);
    // SwiGLU reads gate and up and writes their product: 3 x 768 elements of 2 bytes per copy.
    let activation = routed * 3.0 * 768.0 * 2.0;
    assert!(
        (plain.bytes - fused.bytes - activation).abs() < 1e-6 * activation,
        "{} - {} vs {activation}",
        plain.bytes,
        fused.bytes
    );
    // The sorts remain: read + write of each copy's 2048 hidden elements, in and out.
    assert!((fused.bytes - routed * 2048.0 * 2.0 * 4.0).abs() < 1e-6 * fused.bytes);
    // With permute fusion: the two fused sort kernels, no activation kernel.
    assert_eq!((plain.kernels, fused.kernels), (3.0, 2.0));
    // The GEMMs themselves are unchanged.
    assert_eq!(
        op(&s, &experts(false), "experts_fc1"),
        op(&s, &experts(true), "experts_fc1")
    );
}

#[test]
fn gpt_oss_clamp_and_scaled_bias_run_in_the_epilogues() {
    // gpt-oss-120b: the clamped GLU and the probability-scaled fc2 bias are eager kernels on
    // the unfused path (tests/eager_ops.rs), epilogue work of the fused kernels.
    let s = scenario("gpt-oss-120b", "gb200", 64);
    assert!(op(&s, &experts(false), "moe_act_clamp").is_some());
    assert!(op(&s, &experts(false), "experts_fc2_bias").is_some());
    assert!(op(&s, &experts(true), "moe_act_clamp").is_none());
    assert!(op(&s, &experts(true), "experts_fc2_bias").is_none());
}

#[test]
fn moe_act_recompute_does_not_reach_into_the_fused_kernels() {
    let mut l = experts(true);
    l.recompute = Recompute::Selective;
    l.recompute_modules = Some(vec![RecomputeModule::MoeAct, RecomputeModule::Layernorm]);
    assert_eq!(
        l.recompute_set(),
        ModuleSet::of(&[RecomputeModule::Layernorm])
    );
    l.moe.fused_grouped_mlp = false;
    assert!(l.recompute_set().contains(RecomputeModule::MoeAct));
}

#[test]
fn megatrons_conditions_are_the_rules() {
    let s = scenario("qwen3-30b-a3b", "gb200", 8);
    let rule = |l: &Layout, sc: &Scenario| l.check(sc).err().map(|e| e.rule);
    assert_eq!(rule(&experts(true), &s), None);
    let mut legacy = experts(true);
    legacy.moe.grouped_gemm = GroupedGemm::Legacy;
    assert_eq!(rule(&legacy, &s), Some("fused-grouped-mlp-fits"));
    let mut sequential = experts(true);
    sequential.moe.grouped_gemm = GroupedGemm::Sequential;
    assert_eq!(rule(&sequential, &s), Some("fused-grouped-mlp-fits"));
    let mut etp = experts(true);
    etp.ep = 4;
    etp.etp = 2;
    assert_eq!(rule(&etp, &s), Some("fused-grouped-mlp-fits"));
    let mut offload = experts(true);
    offload.offload_modules = Some(vec![OffloadModule::ExpertFc1]);
    assert_eq!(rule(&offload, &s), Some("fused-grouped-mlp-fits"));
    // The CuTe-DSL kernels are Blackwell's: not on Hopper or AMD Instinct.
    for gpu in ["h100-sxm", "mi355x"] {
        assert_eq!(
            rule(&experts(true), &scenario("qwen3-30b-a3b", gpu, 8)),
            Some("fused-grouped-mlp-on-gpu"),
            "{gpu}"
        );
    }
    for gpu in ["b200", "b300", "gb300"] {
        assert_eq!(
            rule(&experts(true), &scenario("qwen3-30b-a3b", gpu, 8)),
            None,
            "{gpu}"
        );
    }
}

#[test]
fn the_flag_round_trips() {
    let s = scenario("qwen3-30b-a3b", "gb200", 8);
    for fused in [false, true] {
        let flags = megatron_flags(&s, &experts(fused));
        assert_eq!(
            flags.contains(&"--use-transformer-engine-op-fuser".to_string()),
            fused,
            "{flags:?}"
        );
        let back = MegatronArgs::parse(flags.iter().map(String::as_str))
            .layout(&s.model)
            .unwrap();
        assert_eq!(back.moe.fused_grouped_mlp, fused);
    }
}
