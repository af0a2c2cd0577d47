//! The element-wise work Megatron runs as eager PyTorch kernels for gpt-oss-style model cards
//! (`activationClamp`, `yarnScalingFactor`, expert biases under Transformer Engine's grouped
//! linear), derived by hand from the code each op names, and its absence everywhere else.

use primus_oracle::backend::FlexBackend;
use primus_oracle::compute::{Dims, LayerShape, Op, busiest_rank, layer_ops, recompute_ops};
use primus_oracle::layout::{GroupedGemm, Layout, ModuleSet, RecomputeModule, TokenDispatcher};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};

fn scenario(model: &str) -> Scenario {
    let c = Catalog::builtin().unwrap();
    Scenario {
        model: c.model(model).unwrap().clone(),
        hardware: c.hardware("b200").unwrap().clone(),
        cluster: Cluster {
            gpus: 64,
            gpus_per_node: 8,
        },
        training: Training {
            seq_length: 4096,
            global_batch_size: 1280,
            precision: Precision::Bf16,
        },
    }
}

/// Megatron-Bridge's B200 gpt-oss recipe: TP1 PP1 EP8, MBS 4, alltoall, grouped GEMM.
fn recipe(dispatcher: TokenDispatcher) -> Layout {
    let mut l = Layout {
        ep: 8,
        micro_batch_size: 4,
        ..Layout::default()
    };
    l.moe.token_dispatcher = dispatcher;
    if dispatcher == TokenDispatcher::Flex {
        l.moe.flex_backend = Some(FlexBackend::Hybridep);
    }
    l.moe.grouped_gemm = GroupedGemm::Grouped;
    l.moe.permute_fusion = true;
    l.moe.force_load_balancing = true;
    l
}

const MOE_FULL: LayerShape = LayerShape {
    kind: LayerKind::Moe,
    sliding: false,
};

fn op(s: &Scenario, l: &Layout, name: &str) -> Option<Op> {
    layer_ops(&s.model, &Dims::of(s, l), MOE_FULL)
        .iter()
        .find(|o| o.name == name)
        .copied()
}

#[test]
fn gpt_oss_card_names_its_clamp_and_yarn_rotary() {
    let s = scenario("gpt-oss-120b");
    assert!(s.model.activation_clamp);
    assert_eq!(s.model.yarn_scaling_factor, Some(32));
    assert!(s.model.unfused_rotary());
    // Plain RoPE (Qwen3) and MLA's own rotary (DeepSeek-V3) stay fused.
    assert!(!scenario("qwen3-30b-a3b").model.unfused_rotary());
    assert!(!scenario("deepseek-v3").model.unfused_rotary());
}

#[test]
fn gpt_oss_eager_ops_by_hand() {
    let s = scenario("gpt-oss-120b");
    let l = recipe(TokenDispatcher::Alltoall);
    let d = Dims::of(&s, &l);
    let moe = s.model.moe.as_ref().unwrap();
    let (routed, local) = busiest_rank(&d, moe);
    // 128 experts over EP8: 16 local; 4 x 4096 tokens x top-4 = 65,536 copies, times the
    // forced-balance load of the busiest rank.
    assert_eq!(local, 16.0);
    assert!(routed > 65_536.0 && routed < 1.1 * 65_536.0, "{routed}");

    // Rotary: 16,384 tokens x (64 + 8 heads) x 64 dims x 12 bytes = 905,969,664.
    let rotary = op(&s, &l, "rotary_unfused").unwrap();
    assert_eq!(rotary.bytes, 905_969_664.0);
    assert_eq!(rotary.kernels, 12.0);
    // Clamp: per routed copy F = 2880 x 12 bytes = 34,560.
    let clamp = op(&s, &l, "moe_act_clamp").unwrap();
    assert!((clamp.bytes - routed * 34_560.0).abs() < 1e-9 * clamp.bytes);
    assert_eq!(clamp.kernels, 3.0);
    // Second-projection bias with BF16 probabilities (alltoall, no routerDtype): per copy
    // h = 2880 x 28 / 3 bytes = 26,880; 2 kernels per local expert + cat + cast = 34.
    let bias = op(&s, &l, "experts_fc2_bias").unwrap();
    assert!((bias.bytes - routed * 26_880.0).abs() < 1e-6 * bias.bytes);
    assert_eq!(bias.kernels, 34.0);
    // Eager calls: GPU time, no host calls.
    for o in [rotary, clamp, bias] {
        assert_eq!(o.host_ops, 0.0, "{}", o.name);
    }

    // HybridEP casts the probabilities to FP32: 2880 x 68 / 3 = 65,280 bytes per copy.
    let l32 = recipe(TokenDispatcher::Flex);
    let (routed32, _) = busiest_rank(&Dims::of(&s, &l32), moe);
    let bias32 = op(&s, &l32, "experts_fc2_bias").unwrap();
    assert!((bias32.bytes - routed32 * 65_280.0).abs() < 1e-6 * bias32.bytes);

    // The legacy grouped GEMM takes no bias (a layout rule), so no op for it; the clamp stays.
    let mut legacy = l.clone();
    legacy.moe.grouped_gemm = GroupedGemm::Legacy;
    assert!(op(&s, &legacy, "experts_fc2_bias").is_none());
    assert!(op(&s, &legacy, "moe_act_clamp").is_some());
}

#[test]
fn moe_act_recompute_reruns_the_clamp_forward() {
    let s = scenario("gpt-oss-120b");
    let l = recipe(TokenDispatcher::Alltoall);
    let d = Dims::of(&s, &l);
    let (routed, _) = busiest_rank(&d, s.model.moe.as_ref().unwrap());
    let ops = recompute_ops(
        &s.model,
        &d,
        MOE_FULL,
        ModuleSet::of(&[RecomputeModule::MoeAct]),
    );
    let clamp = ops
        .iter()
        .find(|o| o.name == "moe_act_clamp_recompute")
        .unwrap();
    // Forward only: F = 2880 x 16 bytes per copy = 46,080.
    assert!((clamp.bytes - routed * 46_080.0).abs() < 1e-9 * clamp.bytes);
    // Recomputing the whole MoE block reruns both eager ops with it.
    let whole = recompute_ops(
        &s.model,
        &d,
        MOE_FULL,
        ModuleSet::of(&[RecomputeModule::Moe]),
    );
    for name in ["moe_act_clamp", "experts_fc2_bias"] {
        assert!(whole.iter().any(|o| o.name == name), "{name}");
    }
}

#[test]
fn other_cards_get_none_of_them() {
    for model in ["qwen3-30b-a3b", "deepseek-v3", "mixtral-8x7b"] {
        let s = scenario(model);
        let l = recipe(TokenDispatcher::Alltoall);
        for name in ["rotary_unfused", "moe_act_clamp", "experts_fc2_bias"] {
            assert!(op(&s, &l, name).is_none(), "{model}: {name}");
        }
    }
}

#[test]
fn a_clamped_glu_keeps_its_input_twice_unless_moe_act_is_recomputed() {
    use primus_oracle::memory::{Keep, MemoryOptions, layer_activation_bytes};
    let clamped = scenario("gpt-oss-120b");
    let mut plain = clamped.clone();
    plain.model.activation_clamp = false;
    let l = Layout {
        ep: 8,
        ..Layout::default()
    };
    let opts = MemoryOptions::default();
    let bytes = |s: &Scenario, keep: Keep| {
        layer_activation_bytes(s, &l, &opts, LayerKind::Moe, keep) / s.training.seq_length as f64
    };
    // Per token: top-4 copies x the first projection's output again (2 x 2880 elements, 2
    // bytes) = 46,080 bytes (the eager clamps keep it, the compiled GLU keeps the clamped
    // concatenation).
    assert_eq!(
        bytes(&clamped, Keep::All) - bytes(&plain, Keep::All),
        46_080.0
    );
    // `moe_act` reruns the clamps inside its checkpoint: no second copy.
    let moe_act = Keep::Modules(ModuleSet::of(&[RecomputeModule::MoeAct]));
    assert_eq!(bytes(&clamped, moe_act), bytes(&plain, moe_act));
}
