//! Megatron-Core's fine-grained activation offloading (`--fine-grained-activation-offloading
//! --offload-modules ...`): the bytes each offload group moves to the host, derived by hand from
//! what the submodule saves (`attention.py`, `multi_latent_attention.py`, `moe/experts.py`,
//! `transformer_layer.py` at Megatron-LM d98e8a6), the two layers Megatron keeps resident, the
//! legality rules of `TransformerConfig.__post_init__`, and the flags' round trip.

use primus_oracle::layout::{
    CudaGraph, CudaGraphImpl, CudaGraphModule, Layout, OffloadModule, OffloadSet, Recompute,
    RecomputeModule, Schedule,
};
use primus_oracle::megatron::{MegatronArgs, megatron_flags};
use primus_oracle::memory::{
    self, Dropout, ExpertSide, FINE_GRAINED_OFFLOAD_RESIDENT_LAYERS, Keep, MemoryOptions,
    effective_offload, layer_terms_offloaded,
};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::scenario::Scenario;

use OffloadModule::*;

mod common;

fn scenario(model: &str, gpu: &str, gpus: u32) -> Scenario {
    common::scenario(model, gpu, gpus, Some(4), 4096, 1024, Precision::Bf16)
}

/// (all, offloaded) per-token terms of one layer kept as `keep`, balanced routing, BF16.
fn terms(
    s: &Scenario,
    kind: LayerKind,
    keep: Keep,
    offload: &[OffloadModule],
) -> (
    primus_oracle::memory::ActivationTerms,
    primus_oracle::memory::ActivationTerms,
) {
    layer_terms_offloaded(
        &s.model,
        kind,
        keep,
        ExpertSide {
            etp: 1,
            load: 1.0,
            fp8_gemms: true,
        },
        Precision::Bf16,
        &MemoryOptions::default(),
        Dropout::NONE,
        OffloadSet::of(offload),
    )
}

#[test]
fn expert_groups_move_fc1_input_and_activation_input_by_hand() {
    // Qwen3-235B-A22B: h 4096, 8 routed copies per token, expert FFN 1536 (SwiGLU).
    let s = scenario("qwen3-235b-a22b", "gb200", 256);
    let keep = Keep::Modules(primus_oracle::layout::ModuleSet::of(&[
        RecomputeModule::MoeAct,
        RecomputeModule::Layernorm,
    ]));
    let (all, moved) = terms(&s, LayerKind::Moe, keep, &[ExpertFc1, MoeAct]);
    // expert_fc1: fc1's input, 2 B x 4096 = 8,192 B per copy; moe_act: the activation's input
    // (gate and up), 2 B x 2 x 1536 = 6,144 B per copy, kept as moe_act's checkpoint input:
    // 8 x 14,336 = 114,688 B per token.
    assert_eq!(moved.expert, 114_688.0);
    // What stays of the expert side: the fp32 routing probability (4 B per copy; the fc2 input
    // is recomputed by moe_act).
    assert_eq!(all.expert - moved.expert, 8.0 * 4.0);
    // Nothing outside the experts moves.
    assert_eq!((moved.seq, moved.tensor, moved.whole), (0.0, 0.0, 0.0));
    // Each group alone moves its own share.
    assert_eq!(
        terms(&s, LayerKind::Moe, keep, &[ExpertFc1]).1.expert,
        65_536.0
    );
    assert_eq!(
        terms(&s, LayerKind::Moe, keep, &[MoeAct]).1.expert,
        49_152.0
    );
}

#[test]
fn attention_groups_by_hand() {
    // Qwen3-235B-A22B: h 4096, 64 query heads and 4 KV heads of 128.
    let s = scenario("qwen3-235b-a22b", "gb200", 256);
    let (all, moved) = terms(
        &s,
        LayerKind::Moe,
        Keep::All,
        &[QkvLinear, CoreAttn, AttnProj, MlpNorm],
    );
    // qkv_linear: Transformer Engine's fused LayerNormLinear keeps the norm's input and output,
    // 2 x 2 B x 4096; mlp_norm: the MoE block's separate pre-MLP norm input, 2 B x 4096.
    assert_eq!(moved.seq, 16_384.0 + 8_192.0);
    // qkv_linear also: the QK layernorm's saved inputs, the query (64 heads) and key (4 heads)
    // copies of 2 B x 128 each, with an fp32 rstd per head (TE `ops/basic/rmsnorm.py`):
    // 68 x 260 = 17,680 B. core_attn: Q 2 B x 64 x 128, K and V 2 B x 4 x 128 each;
    // attn_proj: the output projection's input 2 B x 64 x 128.
    assert_eq!(moved.tensor, 17_680.0 + 16_384.0 + 2.0 * 1_024.0 + 16_384.0);
    assert_eq!(
        terms(&s, LayerKind::Moe, Keep::All, &[QkvLinear]).1.tensor,
        17_680.0
    );
    // A card without QK layernorm (Llama) keeps none of it.
    let llama = scenario("llama3.1-8b", "h100-sxm", 8);
    assert_eq!(
        terms(&llama, LayerKind::Dense, Keep::All, &[QkvLinear])
            .1
            .tensor,
        0.0
    );
    // The softmax statistics (fp32 per head) stay: under Megatron's 1M-element minimum.
    assert_eq!(all.tensor - moved.tensor, 4.0 * 64.0);
    // attn_norm moves nothing here: the input norm is fused (an IdentityOp in Megatron).
    assert_eq!(terms(&s, LayerKind::Moe, Keep::All, &[AttnNorm]).1.seq, 0.0);
    // A dense MLP fuses its norm too: mlp_norm moves nothing in a dense layer.
    assert_eq!(
        terms(&llama, LayerKind::Dense, Keep::All, &[MlpNorm]).1.seq,
        0.0
    );
}

#[test]
fn mla_norm_and_projections_by_hand() {
    // DeepSeek-V3: h 7168, q_lora 1536, kv_lora 512, 128 heads, qk 128 + 64, v 128.
    let s = scenario("deepseek-v3", "gb200", 256);
    let (_, norm) = terms(&s, LayerKind::Moe, Keep::All, &[AttnNorm]);
    // attn_norm: MLA's separate input norm keeps its input, 2 B x 7168.
    assert_eq!(norm.seq, 14_336.0);
    let (_, qkv) = terms(&s, LayerKind::Moe, Keep::All, &[QkvLinear]);
    // qkv_linear: the down-projections' input (2 B x 7168), the latent norms' inputs and the
    // up-projections' inputs (2 B x (1536 + 512) each).
    assert_eq!(qkv.seq, 14_336.0 + 4_096.0);
    assert_eq!(qkv.whole, 4_096.0);
}

fn offload_layout(modules: &[OffloadModule]) -> Layout {
    Layout {
        pp: 2,
        ep: 64,
        micro_batch_size: 2,
        schedule: Schedule::OneFOneB,
        recompute: Recompute::Selective,
        recompute_modules: Some(vec![RecomputeModule::MoeAct, RecomputeModule::Layernorm]),
        offload_modules: (!modules.is_empty()).then(|| modules.to_vec()),
        ..Layout::default()
    }
}

#[test]
fn in_flight_layers_move_to_the_host_but_two_layers() {
    // Qwen3-235B-A22B on 256 GB200, PP2 EP64 MBS2: the stage keeps every in-flight layer's
    // groups on the host, but two layers of one micro-batch.
    let s = scenario("qwen3-235b-a22b", "gb200", 256);
    let without = offload_layout(&[]);
    let with = offload_layout(&[ExpertFc1, MoeAct]);
    assert!(without.check(&s).is_ok() && with.check(&s).is_ok());
    let stage = 0;
    let a = memory::stage_memory(&s, &without, stage);
    let b = memory::stage_memory(&s, &with, stage);
    // Per micro-batch and layer, by hand: 114,688 B per local token (see above) x 2 x 4096.
    let moved_per_layer = 114_688.0 * 2.0 * 4096.0;
    // The in-flight layers of stage 0, as the memory model counts them: the layers of each
    // chunk times the chunk's in-flight micro-batches (all MoE layers: Qwen3 has no dense one).
    // 1024 sequences over DP 128 in micro-batches of 2: 4 per step.
    let m = (s.training.global_batch_size / (128 * 2)) as u32;
    let inflight_layers: f64 = (0..with.chunks())
        .map(|c| {
            let vs = with.virtual_stage(s.model.layers, 0, stage, c);
            vs.layers as f64 * memory::inflight_in_chunk(&with, stage, m, c) as f64
        })
        .sum();
    assert!(inflight_layers > 2.0, "{inflight_layers}");
    let expected = (inflight_layers - FINE_GRAINED_OFFLOAD_RESIDENT_LAYERS) * moved_per_layer;
    let saved = a.activations_bytes - b.activations_bytes;
    assert!(
        (saved - expected).abs() < 1e-6 * expected,
        "saved {saved}, expected {expected}"
    );
    // Weights, gradients and optimizer states do not move.
    assert_eq!(a.weights_bytes, b.weights_bytes);
    assert_eq!(a.optimizer_bytes, b.optimizer_bytes);
}

#[test]
fn cuda_graphs_disable_the_norm_groups_as_megatron_does() {
    let mut l = offload_layout(&[AttnNorm, MlpNorm, ExpertFc1]);
    assert_eq!(
        effective_offload(&l),
        OffloadSet::of(&[AttnNorm, MlpNorm, ExpertFc1])
    );
    l.cuda_graph = CudaGraph {
        implementation: CudaGraphImpl::TransformerEngine,
        modules: vec![CudaGraphModule::MoeRouter],
    };
    // A moe_router graph: mlp_norm is skipped in MoE layers, attn_norm stays.
    assert_eq!(
        effective_offload(&l),
        OffloadSet::of(&[AttnNorm, ExpertFc1])
    );
    l.cuda_graph.modules = vec![CudaGraphModule::Attn];
    assert_eq!(effective_offload(&l), OffloadSet::of(&[ExpertFc1]));
}

#[test]
fn megatrons_asserts_are_the_rules() {
    let s = scenario("qwen3-235b-a22b", "gb200", 256);
    let rule = |l: &Layout, sc: &Scenario| l.check(sc).err().map(|e| e.rule);
    assert_eq!(
        rule(&offload_layout(&[AttnProj]), &s),
        Some("offload-attn-proj-needs-core-attn")
    );
    assert_eq!(rule(&offload_layout(&[CoreAttn, AttnProj]), &s), None);
    assert_eq!(
        rule(&offload_layout(&[ExpertFc1, ExpertFc1]), &s),
        Some("offload-modules-unique")
    );
    let mut empty = offload_layout(&[]);
    empty.offload_modules = Some(vec![]);
    assert_eq!(rule(&empty, &s), Some("offload-modules-not-empty"));
    let mut moe_recompute = offload_layout(&[MoeAct]);
    moe_recompute.recompute_modules = Some(vec![RecomputeModule::Moe]);
    assert_eq!(
        rule(&moe_recompute, &s),
        Some("offload-not-inside-moe-recompute")
    );
    // A graph of the whole MoE block needs drop-and-pad routing; Megatron then refuses the
    // offload ("Token-drop MoE is temporarily not supported with activation offloading").
    let mut whole_moe_graph = offload_layout(&[]);
    whole_moe_graph.moe.capacity_factor = Some(primus_oracle::layout::Factor(1.0));
    whole_moe_graph.moe.pad_to_capacity = true;
    whole_moe_graph.cuda_graph = CudaGraph {
        implementation: CudaGraphImpl::TransformerEngine,
        modules: vec![],
    };
    assert_eq!(rule(&whole_moe_graph, &s), None);
    whole_moe_graph.offload_modules = Some(vec![ExpertFc1]);
    assert_eq!(
        rule(&whole_moe_graph, &s),
        Some("offload-not-with-moe-graph")
    );
    let mut local = offload_layout(&[CoreAttn]);
    local.cuda_graph = CudaGraph {
        implementation: CudaGraphImpl::Local,
        modules: vec![CudaGraphModule::Attn],
    };
    assert_eq!(rule(&local, &s), Some("offload-local-graphs"));
    // A dense model has no expert groups; layer-level offload excludes the fine-grained one.
    let llama = scenario("llama3.1-8b", "h100-sxm", 8);
    let dense = Layout {
        offload_modules: Some(vec![ExpertFc1]),
        ..Layout::default()
    };
    assert_eq!(rule(&dense, &llama), Some("offload-module-fits-model"));
    let both = Layout {
        offload_modules: Some(vec![CoreAttn]),
        activation_offload_layers: 4,
        ..Layout::default()
    };
    assert_eq!(rule(&both, &llama), Some("offload-not-with-layer-offload"));
}

#[test]
fn the_flags_round_trip_and_unmodelled_modules_warn() {
    let s = scenario("qwen3-235b-a22b", "gb200", 256);
    let l = offload_layout(&[MoeAct, ExpertFc1]);
    let flags = megatron_flags(&s, &l);
    let joined = flags.join(" ");
    assert!(
        joined
            .contains("--fine-grained-activation-offloading --offload-modules expert_fc1 moe_act"),
        "{joined}"
    );
    let back = MegatronArgs::parse(flags.iter().map(String::as_str))
        .layout(&s.model)
        .unwrap();
    assert_eq!(back.offload_set(), l.offload_set());
    let read = |line: &str| MegatronArgs::parse(line.split_whitespace());
    // Megatron reads the list only with the switch.
    assert_eq!(
        read("--offload-modules core_attn")
            .layout(&s.model)
            .unwrap()
            .offload_modules,
        None
    );
    let e = read("--fine-grained-activation-offloading --offload-modules attention")
        .layout(&s.model)
        .unwrap_err();
    assert_eq!(e.field, "--offload-modules");
    // A module the model does not represent is left out of the layout and named as unmodelled
    // (the webhook admits such a job with a warning).
    let args =
        read("--fine-grained-activation-offloading --offload-modules fused_group_mlp core_attn");
    assert_eq!(
        args.layout(&s.model).unwrap().offload_modules,
        Some(vec![CoreAttn])
    );
    let unmodelled = args.unmodelled_memory_flags();
    assert_eq!(unmodelled.len(), 1, "{unmodelled:?}");
    assert_eq!(unmodelled[0].0, "--offload-modules fused_group_mlp");
    // The modelled flags themselves are no longer unmodelled.
    assert!(
        read("--fine-grained-activation-offloading --offload-modules core_attn")
            .unmodelled_memory_flags()
            .is_empty()
    );
}

#[test]
fn a_rank_with_one_layer_in_flight_keeps_no_more_than_without_offload() {
    // Qwen3-30B-A3B's 48 layers over PP48: the last rank holds one layer of one micro-batch,
    // which stays on the GPU (the offload margin): offloading saves nothing there and adds
    // nothing either; the first rank (48 micro-batches in flight) keeps all but two layers' worth.
    let mut s = scenario("qwen3-30b-a3b", "gb200", 48);
    s.training.global_batch_size = 64;
    let l = |offload: bool| Layout {
        pp: 48,
        micro_batch_size: 1,
        offload_modules: offload.then(|| vec![ExpertFc1, MoeAct]),
        ..Layout::default()
    };
    assert!(l(true).check(&s).is_ok(), "{:?}", l(true).check(&s));
    let last = 47;
    let (a, b) = (
        memory::stage_memory(&s, &l(false), last),
        memory::stage_memory(&s, &l(true), last),
    );
    assert_eq!(a.inflight_microbatches, 1);
    assert_eq!(a.activations_bytes, b.activations_bytes);
    let (a, b) = (
        memory::stage_memory(&s, &l(false), 0),
        memory::stage_memory(&s, &l(true), 0),
    );
    assert!(b.activations_bytes < a.activations_bytes);
}
