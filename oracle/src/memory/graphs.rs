//! What CUDA graphs (`spec.parallelism.cudaGraph`, Megatron's `--cuda-graph-impl`) change in a
//! stage's memory, for the stack the Megatron-Bridge recipes run (Megatron-Core 0.16+, whose
//! scoped Transformer Engine graphs exist only there, with Transformer Engine 2.7+, to which
//! Megatron-Core hands `_reuse_graph_input_output_buffers`: `transformer/cuda_graphs.py`).
//!
//! A graph's captures allocate from a private pool, which keeps the high-water mark of the
//! captures reserved for as long as the graphs live, replaying or not (PyTorch
//! `c10/cuda/CUDACachingAllocator.cpp`, "Interaction with CUDA graph capture"). Captured in the
//! schedule's order, that mark is the graphed regions' saved activations of the micro-batches in
//! flight: the bytes the eager run keeps, moved into the pool, not new ones. What is new:
//! - Transformer Engine graphs (`transformer_engine`, `make_graphed_callables` through
//!   Megatron-Core's `TECudaGraphHelper`): every graphed layer whose attention the graphs capture
//!   gets a static attention mask among its sample inputs, a bool `[mbs, 1, s/cp, s]` tensor
//!   (`TransformerLayer.get_layer_static_inputs`), allocated in the eager pool and kept by the
//!   graph as input surface. `TECudaGraphHelper._get_sample_arguments` reuses a sample's
//!   buffers once its backward has run, so a rank keeps one per (layer, micro-batch) in flight
//!   ([`static_mask_bytes_per_slot`]); with pp = 1 one graph per layer serves every micro-batch. The
//!   hidden-state sample input replaces the norm input the eager layer saves (no new bytes);
//!   the backward's grad-output buffers are shared per shape (one hidden state a rank, left
//!   out).
//! - Full-iteration graphs (`full_iteration`, Megatron-Core `full_cuda_graph.py`): one graph
//!   for the whole forward and backward; its `StaticBufferLoader` keeps a copy of every
//!   micro-batch's batch (tokens, labels and position ids as int64, the loss mask as FP32: 28
//!   bytes a token) on the ranks that read data ([`static_batch_bytes`]).
//! - The optimizer step runs eagerly, after the backward: memory a graph pool keeps reserved is
//!   not there for it, so its FP32 gradient copy reuses only the activations outside the graphs
//!   ([`Pinned`]). `torch.cuda.graph` empties the eager cache before each capture
//!   (`graph.__enter__`), so a capture does not hold the eager cache and the pool at once.
//!
//! After capture the graphed activations count in `torch.cuda.memory_reserved` but no longer
//! in `memory_allocated` (a replay allocates nothing); the model keeps them in both, so its
//! allocated bytes are the eager peak, what a run logs before capture (Megatron-Core captures at
//! step `cuda_graph_warmup_steps`, 3).

use crate::layout::{CudaGraphImpl, CudaGraphModule, Layout};
use crate::scenario::Scenario;

/// Bytes per token of a full-iteration graph's static batch copy: tokens, labels and position
/// ids (int64) and the loss mask (FP32).
pub const STATIC_BATCH_BYTES_PER_TOKEN: f64 = 3.0 * 8.0 + 4.0;

/// Which of a stage's activation bytes the graphs' private pools keep from the eager optimizer
/// step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinned {
    /// No graphs, or Transformer Engine graphs of some modules: the graphed share of a layer's
    /// activations is not separated from the rest (an `attn` scope keeps the attention's
    /// saved tensors, `moe_router` the router's), so the copy is taken to reuse them all.
    Nothing,
    /// Per-layer graphs of whole layers (`local`, or `transformer_engine` without modules):
    /// the layers' in-flight activations.
    Layers,
    /// A full-iteration graph: every activation and pass buffer of the step.
    Everything,
}

impl Pinned {
    pub fn of(l: &Layout) -> Pinned {
        let g = &l.cuda_graph;
        match g.implementation {
            CudaGraphImpl::None => Pinned::Nothing,
            CudaGraphImpl::FullIteration => Pinned::Everything,
            CudaGraphImpl::Local => Pinned::Layers,
            CudaGraphImpl::TransformerEngine if g.modules.is_empty() => Pinned::Layers,
            CudaGraphImpl::TransformerEngine => Pinned::Nothing,
        }
    }
}

/// Whether the layout's Transformer Engine graphs give their layers a static attention mask.
pub fn has_static_masks(l: &Layout) -> bool {
    l.cuda_graph.implementation == CudaGraphImpl::TransformerEngine
        && l.cuda_graph.captures(CudaGraphModule::Attn)
}

/// Bytes of the static attention mask of one (graphed layer, micro-batch) slot in flight:
/// `mbs * (s / cp) * s` bools, i.e. `s` per token of a micro-batch (`tokens = mbs * s / cp`).
pub fn static_mask_bytes_per_slot(s: &Scenario, l: &Layout, tokens: f64) -> f64 {
    if !has_static_masks(l) {
        return 0.0;
    }
    tokens * s.training.seq_length as f64
}

/// Bytes of a full-iteration graph's static batch copies on a rank that reads data: one per
/// micro-batch of the step, `tokens` (`mbs * s / cp`) each.
pub fn static_batch_bytes(l: &Layout, tokens: f64, microbatches: u32) -> f64 {
    if l.cuda_graph.implementation != CudaGraphImpl::FullIteration {
        return 0.0;
    }
    microbatches as f64 * tokens * STATIC_BATCH_BYTES_PER_TOKEN
}
