//! What CUDA graphs add to a stage's memory (issue 15, `memory::graphs`), derived by hand:
//! Transformer Engine graphs that capture attention keep a static bool mask
//! `[mbs, 1, s/cp, s]` per (layer, micro-batch) in flight (Megatron-Core
//! `TransformerLayer.get_layer_static_inputs`, reused after each backward by
//! `TECudaGraphHelper._get_sample_arguments`); a full-iteration graph keeps a copy of every
//! micro-batch's batch (28 bytes a token: `StaticBufferLoader`) where data is read, and its
//! pool keeps the step's activations from the eager optimizer step, whose FP32 gradient copy
//! then adds in full; the webhook's fixed-segment warning fires past 1.44x the allocated peak
//! (Megatron-Bridge's Llama 3.1 70B SFT OOM at 58.8 GB of 80 on H100).

mod common;

use primus_oracle::backend::FlexBackend;
use primus_oracle::layout::{
    CudaGraph, CudaGraphImpl, CudaGraphModule, Factor, GroupedGemm, Layout, MoeOptions,
    TokenDispatcher,
};
use primus_oracle::memory::{self, allocator, graphs};
use primus_oracle::precision::Precision;
use primus_oracle::scenario::Scenario;

const MIB: f64 = 1024.0 * 1024.0;

/// Qwen3-30B-A3B (48 MoE layers) on 8 B200, FP8, sequence 4096, global batch 512, EP8 with
/// HybridEP and BF16 gradient buffers (Megatron-Bridge's recipe: 16 micro-batches of 4 at
/// pp = 1), with graphs `g`; graphs that capture the MoE block need static shapes (capacity
/// factor 1, padded).
fn qwen3_30b(pp: u32, mbs: u32, g: CudaGraph) -> (Scenario, Layout) {
    let static_shapes = g.captures(CudaGraphModule::Moe);
    let s = common::scenario(
        "qwen3-30b-a3b",
        "b200",
        8 * pp,
        Some(8),
        4096,
        512,
        Precision::Fp8,
    );
    let l = Layout {
        pp,
        ep: 8,
        micro_batch_size: mbs,
        grad_reduce_in_fp32: false,
        cuda_graph: g,
        moe: MoeOptions {
            token_dispatcher: TokenDispatcher::Flex,
            flex_backend: Some(FlexBackend::Hybridep),
            grouped_gemm: GroupedGemm::Grouped,
            permute_fusion: true,
            force_load_balancing: true,
            capacity_factor: static_shapes.then_some(Factor(1.0)),
            pad_to_capacity: static_shapes,
            ..MoeOptions::default()
        },
        ..Layout::default()
    };
    l.check(&s).expect("legal layout");
    (s, l)
}

/// [`qwen3_30b`] without graphs but with the static shapes whole-layer graphs need: their
/// eager baseline.
fn qwen3_30b_static_eager(pp: u32, mbs: u32) -> (Scenario, Layout) {
    let (s, mut l) = qwen3_30b(pp, mbs, CudaGraph::default());
    l.moe.capacity_factor = Some(Factor(1.0));
    l.moe.pad_to_capacity = true;
    l.check(&s).expect("legal layout");
    (s, l)
}

fn te(modules: &[CudaGraphModule]) -> CudaGraph {
    CudaGraph {
        implementation: CudaGraphImpl::TransformerEngine,
        modules: modules.to_vec(),
    }
}

fn graphs_of(implementation: CudaGraphImpl) -> CudaGraph {
    CudaGraph {
        implementation,
        modules: Vec::new(),
    }
}

#[test]
fn te_graphs_of_attention_keep_one_mask_per_layer_and_micro_batch_in_flight() {
    use CudaGraphModule::*;
    // pp = 1: one micro-batch in flight, 48 layers, 4 x 4096 x 4096 bools each: 3 GiB.
    let (s, with) = qwen3_30b(1, 4, te(&[Attn, MoeRouter, MoePreprocess]));
    let (_, without) = qwen3_30b(1, 4, te(&[MoeRouter, MoePreprocess]));
    let a = memory::stage_memory(&s, &with, 0);
    let b = memory::stage_memory(&s, &without, 0);
    assert_eq!(a.graph_static_bytes, 48.0 * 4.0 * 4096.0 * 4096.0);
    assert_eq!(a.graph_static_bytes, 3072.0 * MIB);
    assert_eq!(b.graph_static_bytes, 0.0);
    // In the allocated tensors, and nothing else moves.
    assert_eq!(
        a.allocated_bytes - b.allocated_bytes,
        a.graph_static_bytes,
        "{a:?}\n{b:?}"
    );
    // 1F1B over pp = 4 (12 layers a rank): rank 0 keeps 4 micro-batches in flight, rank 3 one.
    let (s4, l4) = qwen3_30b(4, 1, te(&[Attn]));
    let first = memory::stage_memory(&s4, &l4, 0);
    let last = memory::stage_memory(&s4, &l4, 3);
    assert_eq!(first.inflight_microbatches, 4);
    assert_eq!(first.graph_static_bytes, 12.0 * 4.0 * 4096.0 * 4096.0);
    assert_eq!(last.graph_static_bytes, 12.0 * 4096.0 * 4096.0);
    // Whole-layer graphs capture attention too; local graphs keep no masks.
    let (_, whole) = qwen3_30b(1, 4, graphs_of(CudaGraphImpl::TransformerEngine));
    assert_eq!(
        memory::stage_memory(&s, &whole, 0).graph_static_bytes,
        a.graph_static_bytes
    );
    let (_, local) = qwen3_30b(1, 4, graphs_of(CudaGraphImpl::Local));
    assert_eq!(memory::stage_memory(&s, &local, 0).graph_static_bytes, 0.0);
}

#[test]
fn a_full_iteration_graph_keeps_its_batches_and_its_activations_from_the_optimizer_step() {
    let (s, eager) = qwen3_30b_static_eager(1, 4);
    let (_, full) = qwen3_30b(1, 4, graphs_of(CudaGraphImpl::FullIteration));
    let e = memory::stage_memory(&s, &eager, 0);
    let f = memory::stage_memory(&s, &full, 0);
    // 16 micro-batches of 4 x 4096 tokens, 28 bytes each (three int64 and an FP32 per token).
    assert_eq!(full.num_microbatches(&s), 16);
    assert_eq!(graphs::STATIC_BATCH_BYTES_PER_TOKEN, 28.0);
    assert_eq!(f.graph_static_bytes, 16.0 * 4.0 * 4096.0 * 28.0);
    // Eager, the optimizer's FP32 gradient copy fits in the freed activations (no excess);
    // under the graph it cannot reuse them and adds in full.
    assert!(e.step_grad_copy_bytes > 0.0 && e.step_grad_copy_bytes < e.activations_bytes);
    assert_eq!(e.step_grad_copy_bytes, f.step_grad_copy_bytes);
    let added = f.allocated_bytes - e.allocated_bytes;
    let expected = f.graph_static_bytes + f.step_grad_copy_bytes;
    assert!(
        (added - expected).abs() < 1.0,
        "{added} vs {expected}: {e:?}\n{f:?}"
    );
    // Per-layer graphs of whole layers keep the layers' activations, not the rest: on the
    // first of two stages (no logits there) the copy reuses only the passes' buffers.
    let (s2, eager2) = qwen3_30b_static_eager(2, 4);
    let (_, local2) = qwen3_30b(2, 4, graphs_of(CudaGraphImpl::Local));
    let e0 = memory::stage_memory(&s2, &eager2, 0);
    let l0 = memory::stage_memory(&s2, &local2, 0);
    assert!(!l0.loss && l0.graph_static_bytes == 0.0);
    let added = l0.allocated_bytes - e0.allocated_bytes;
    let expected = l0.step_grad_copy_bytes - l0.buffers_bytes;
    assert!(expected > 0.0);
    assert!((added - expected).abs() < 1.0, "{added} vs {expected}");
    // Graphs of some modules: the masks alone (nothing kept from the copy).
    let (_, dropless) = qwen3_30b(1, 4, CudaGraph::default());
    let (_, router) = qwen3_30b(1, 4, te(&[CudaGraphModule::MoeRouter]));
    assert_eq!(
        memory::stage_memory(&s, &router, 0).allocated_bytes,
        memory::stage_memory(&s, &dropless, 0).allocated_bytes
    );
}

#[test]
fn fixed_segments_are_at_risk_past_the_worst_measured_fragmentation() {
    // Megatron-Bridge's Llama 3.1 70B SFT recipe: 58.8 GB (54.76 GiB) allocated ran out of
    // the H100's 78.8 usable GiB with fixed-size segments: 54.76 x 1.44 = 78.85 > 78.8.
    let gib = 1024.0 * MIB;
    let fixed = Layout::default();
    let expandable = Layout {
        expandable_segments: true,
        ..Layout::default()
    };
    assert_eq!(allocator::FIXED_SEGMENTS_WORST_RESERVED_RATIO, 1.44);
    assert!(allocator::fixed_segments_at_risk(
        &fixed,
        54.76 * gib,
        78.8 * gib
    ));
    assert!(!allocator::fixed_segments_at_risk(
        &fixed,
        54.0 * gib,
        78.8 * gib
    ));
    assert!(!allocator::fixed_segments_at_risk(
        &expandable,
        54.76 * gib,
        78.8 * gib
    ));
}
