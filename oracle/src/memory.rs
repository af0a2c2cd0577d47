//! Per-GPU memory of every pipeline stage of a layout: weights, gradients, optimizer states,
//! activations and "other" (communication buffers, allocator fragmentation), the peak stage,
//! and whether it fits the GPU.
//!
//! Megatron-LM's accounting, term by term (each named after what it counts):
//! - parameters per GPU from the model card's per-layer breakdown: attention and dense MLP
//!   split over TP, routed experts over EP x ETP, norms and router replicated; the embedding
//!   (vocabulary padded to a multiple of 128*TP) where `E` runs, the output layer and final norm
//!   where the loss runs (a tied embedding gets a second copy there when PP > 1, as Megatron
//!   keeps one per end of the pipeline), MTP layers (and the embedding and output tables they
//!   need) where they run;
//! - bytes per parameter with the distributed optimizer: BF16 weight 2 + FP32 main gradient 4
//!   unsharded, FP32 master weight + two Adam moments 12 sharded over the data-parallel group
//!   (Megatron-LM `docs/source/api-guide/dist_optimizer.md`: 6 + 12/d), where the group is
//!   DP x CP for dense parameters and the expert-data-parallel group for expert parameters;
//!   without it 2 + 4 + 12 = 18; with FSDP all 18 bytes are sharded; with BF16 gradients
//!   (`--grad-reduce-in-bf16`) 2 + 2 unsharded and 12 + 4 (an FP32 copy of the gradient
//!   shard) sharded: 4 + 16/d, the same table's 16-bit-gradient row, whose copy exists only
//!   from the optimizer step to the next `zero_grad` and so is not counted beside the
//!   activations; the precision-aware optimizer's dtypes, optimizer CPU offload and FP8
//!   parameters as [`optimizer`] derives;
//! - FP8 (Transformer Engine): an FP8 copy of every GEMM weight and its transpose, kept for the
//!   whole step, 2 bytes per GEMM weight ([`FP8_WEIGHT_COPY_BYTES`]), or FP8 weights
//!   themselves with `--fp8-param-gather` ([`FP8_PARAM_BYTES`]);
//! - activations: [`activations`], times the micro-batches each schedule keeps in flight; the
//!   routed experts' for the tokens a rank holds ([`crate::compute::expert_memory_load`]: the
//!   capacity factor when padded to it, else balanced), as is the MoE dispatch buffer;
//! - the last stage's logits: Megatron's vocab-parallel cross entropy casts the BF16 logits
//!   (2 bytes) to FP32 (4 bytes), turns them into the softmax in place and keeps that for the
//!   backward pass: 4 bytes per logit per in-flight micro-batch, plus the 2-byte BF16 logits of
//!   one micro-batch while the cast runs (no fused cross entropy assumed);
//! - other: the sequence-parallel all-gather buffer, pipeline send/receive buffers, the MoE
//!   dispatch buffer, FSDP's unsharded layer buffers, the allocator's overhead (the hardware
//!   profile's `overheads.allocatorFragmentation` fraction of all tensor memory, or the
//!   expandable-segments constant), the communicator buffers ([`allocator`]) and the fused
//!   token dispatcher's buffers ([`dispatcher`]), the last two outside PyTorch's allocator,
//!   and the CUDA graphs' static samples ([`graphs`], whose pools also keep the activations
//!   they captured from the optimizer step's gradient copy).
//!
//! The runtime reserve (`overheads.runtimeReserveGib`: context, workspaces) is not part of a
//! stage's total: it is what separates `capacityBytes` from `usableBytes`. How far the total
//! may be trusted is [`band`]: the measured error band the verdict allows for.
//!
//! `activations.rs` holds the per-layer activation terms and the in-flight micro-batches of
//! each schedule; `stage.rs` the accounting of one stage from them.

use serde::Serialize;

use crate::layout::Layout;
use crate::model::LayerKind;
use crate::scenario::Scenario;

pub mod activations;
pub mod allocator;
pub mod band;
pub mod dispatcher;
pub mod graphs;
pub mod optimizer;
mod stage;

pub use activations::{
    ActivationTerms, Dropout, ExpertSide, Keep, MemoryOptions, deferred_wgrad_microbatches,
    effective_offload, inflight_in_chunk, inflight_microbatches, layer_terms,
    layer_terms_offloaded, wgrad_terms,
};
pub use band::{
    Band, JobKind, MEGATRON_DENSE_OVER, MEGATRON_DENSE_UNDER, MEGATRON_MOE_OVER,
    MEGATRON_MOE_UNDER, Verdict,
};
pub use optimizer::{
    BF16_GRAD_BYTES, FP8_PARAM_BYTES, FP8_WEIGHT_COPY_BYTES, FP32_GRAD_COPY_BYTES, MAIN_GRAD_BYTES,
    OPTIMIZER_STATE_BYTES, StateBytes, WEIGHT_BYTES, state_bytes,
};
use stage::Ctx;
pub use stage::{ACTIVATION_OFFLOAD_RESIDENT_LAYERS, FINE_GRAINED_OFFLOAD_RESIDENT_LAYERS};

/// Megatron pads the vocabulary to a multiple of this times TP (`--make-vocab-size-divisible-by`).
pub const VOCAB_PAD_MULTIPLE: u64 = 128;
/// Pipeline point-to-point buffers alive at once: the gradient received from the next stage
/// and the one sent to the previous (forward inputs are part of the stored activations;
/// forward outputs are freed once sent: `deallocate_output_tensor`).
pub const PP_P2P_BUFFERS: f64 = 2.0;
/// Sequence-parallel all-gather buffers alive at once: the gathered input of the linear
/// running now.
pub const SP_GATHER_BUFFERS: f64 = 1.0;
/// With TP communication overlap, Transformer Engine's userbuffers keep persistent
/// s*b*h buffers for the QKV/FC1 all-gathers and the projection/FC2 reduce-scatters.
pub const TP_OVERLAP_BUFFERS: f64 = 4.0;
/// FSDP keeps the unsharded weights of the running layer and the prefetched next one.
pub const FSDP_UNSHARDED_LAYERS: f64 = 2.0;

/// Memory of one pipeline stage (one GPU of that stage), bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageMemory {
    /// Pipeline rank.
    pub stage: u32,
    /// Decoder layers on this rank, over all its model chunks.
    pub layers: u32,
    pub weights_bytes: f64,
    pub gradients_bytes: f64,
    /// The optimizer's states (FP32 master and moments, or the precision-aware optimizer's).
    pub optimizer_bytes: f64,
    /// The FP32 copy of the gradient shard the optimizer makes for its update when the
    /// gradient buffer is BF16, live from the step to the next step's `zero_grad`: not beside
    /// the activations (see [`optimizer`]); in the total only where it exceeds the
    /// activations and buffers it replaces (that excess is part of the other bytes).
    pub step_grad_copy_bytes: f64,
    /// The inputs this rank received from the previous pipeline stage that outlive the step:
    /// each model chunk fed by the previous stage keeps its last micro-batch's input (Megatron
    /// `TransformerBlock.set_input_tensor` stores it as `input_tensor`, cleared only by the
    /// next call) and that input's gradient (`schedules.backward_step` calls `retain_grad`), so
    /// two hidden states per such chunk are allocated from the last backward to the chunk's
    /// first forward of the next iteration: beside the optimizer step (which they join, like
    /// [`StageMemory::step_grad_copy_bytes`], only by their excess over the activations) and in
    /// the memory allocated between iterations. None at pp = 1 and on the first chunk of the
    /// first stage.
    pub pipeline_inputs_bytes: f64,
    pub activations_bytes: f64,
    pub other_bytes: f64,
    pub total_bytes: f64,
    /// Micro-batch activations in flight at the peak (with the interleaved schedule, in
    /// model-chunk micro-batches, each 1/vpp of the rank's layers).
    pub inflight_microbatches: u32,
    /// Parameters held by this GPU (before any FSDP sharding).
    pub parameters: f64,
    /// MTP layers on this rank.
    pub mtp_layers: u32,
    /// The input embedding runs on this rank.
    pub embedding: bool,
    /// The output layer and loss run on this rank.
    pub loss: bool,
    /// Of the activations: the logits kept for the loss.
    pub logits_bytes: f64,
    /// Of the other bytes: communication and FSDP buffers.
    pub buffers_bytes: f64,
    /// Of the other bytes: the caching allocator's overhead (reserved but not allocated).
    pub fragmentation_bytes: f64,
    /// Of the other bytes: what the shared-expert overlap's side-stream pools keep reserved
    /// beyond their tensors ([`allocator::shared_expert_stream_pool_bytes`]), in the reserved
    /// bytes.
    pub side_stream_pool_bytes: f64,
    /// Of the other bytes: the CUDA graphs' static samples kept from capture on
    /// ([`graphs`]: Transformer Engine's attention masks, a full-iteration graph's batch
    /// copies).
    pub graph_static_bytes: f64,
    /// Of the other bytes: NCCL/RCCL communicator buffers, outside PyTorch's allocator.
    pub communicator_bytes: f64,
    /// Of the other bytes: the fused token dispatcher's buffers (DeepEP, HybridEP), outside
    /// PyTorch's allocator ([`dispatcher`]).
    pub dispatcher_bytes: f64,
    /// Tensors PyTorch allocates at the peak (`max_memory_allocated`): weights, gradients,
    /// optimizer states, activations and buffers.
    pub allocated_bytes: f64,
    /// Allocated plus the allocator's overhead and the side-stream pools
    /// (`max_memory_reserved`).
    pub reserved_bytes: f64,
}

/// Memory of every stage and the verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryReport {
    pub stages: Vec<StageMemory>,
    /// Largest stage total.
    pub peak_bytes: f64,
    /// The stage with the largest total (the first on ties).
    pub bottleneck_stage: u32,
    /// Physical HBM per GPU.
    pub capacity_bytes: f64,
    /// Capacity minus the runtime reserve.
    pub usable_bytes: f64,
    /// Peak <= usable.
    pub fits: bool,
    /// Usable minus peak (negative when it does not fit).
    pub headroom_bytes: f64,
}

impl MemoryReport {
    /// The largest allocated peak of the stages (`max_memory_allocated`).
    pub fn allocated_peak_bytes(&self) -> f64 {
        self.stages
            .iter()
            .map(|st| st.allocated_bytes)
            .fold(0.0, f64::max)
    }

    /// Whether layout `l` (the one reported) could fragment past the usable memory with
    /// fixed-size allocator segments ([`allocator::fixed_segments_at_risk`]).
    pub fn fixed_segments_at_risk(&self, l: &Layout) -> bool {
        allocator::fixed_segments_at_risk(l, self.allocated_peak_bytes(), self.usable_bytes)
    }
}

/// What one GPU copies to the host per decoder layer and micro-batch under the layout's
/// activation offloads, bytes (each copied back for the backward): the fine-grained offload
/// groups of a layer (`offloadModules`, [`layer_terms_offloaded`]'s moved terms) and the
/// whole activations of a layer that layer-level offload (`activationOffloadLayers`) moves.
/// All zero without an offload. The time model prices the copies from the same bytes the
/// memory model takes off the GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HostCopyBytes {
    /// Fine-grained offload groups of a dense layer and of an MoE layer.
    pub dense_groups: f64,
    pub moe_groups: f64,
    /// All the activations a dense / an MoE layer keeps (layer-level offload).
    pub dense_layer: f64,
    pub moe_layer: f64,
}

/// [`HostCopyBytes`] of layout `l`.
pub fn host_copy_bytes(s: &Scenario, l: &Layout) -> HostCopyBytes {
    if effective_offload(l).is_empty() && l.activation_offload_layers == 0 {
        return HostCopyBytes::default();
    }
    Ctx::new(s, l, &MemoryOptions::default()).host_copies()
}

/// Full per-stage report with the default [`MemoryOptions`]. The layout is assumed legal
/// (callers run [`Layout::check`] first).
pub fn estimate(s: &Scenario, l: &Layout) -> MemoryReport {
    estimate_with(s, l, &MemoryOptions::default())
}

/// Peak bytes and bottleneck stage without allocating: the tuner's pre-filter hot path.
pub fn peak_bytes(s: &Scenario, l: &Layout) -> (f64, u32) {
    peak_bytes_with(s, l, &MemoryOptions::default())
}

/// [`peak_bytes`] without the fused token dispatcher's buffers ([`dispatcher`]), which add the
/// same bytes to every stage: `peak + dispatcher::dispatcher_bytes(s, l)` is [`peak_bytes`]'s
/// peak exactly (floating-point addition is monotone, and a stage's total adds them last)
/// when the layout keeps no shared-expert side-stream pool, which is left out (the MoE
/// choice can turn the overlap off): a lower bound then. The tuner's screen computes it once
/// for the MoE choices of a structure and checks every layout it keeps exactly afterwards.
pub fn peak_bytes_before_dispatcher(s: &Scenario, l: &Layout) -> (f64, u32) {
    let mut ctx = Ctx::with_dispatcher(s, l, &MemoryOptions::default(), 0.0);
    ctx.stream_pool = 0.0;
    peak_of(ctx, l)
}

/// The memory of one pipeline stage (`stage` < pp) of [`estimate`], computed alone.
pub fn stage_memory(s: &Scenario, l: &Layout, stage: u32) -> StageMemory {
    Ctx::new(s, l, &MemoryOptions::default()).stage(stage.min(l.pp.max(1) - 1))
}

/// [`estimate`] with explicit options.
pub fn estimate_with(s: &Scenario, l: &Layout, opts: &MemoryOptions) -> MemoryReport {
    let ctx = Ctx::new(s, l, opts);
    let stages: Vec<StageMemory> = (0..l.pp.max(1)).map(|r| ctx.stage(r)).collect();
    let (peak, bottleneck) = stages.iter().fold((f64::NEG_INFINITY, 0), |(p, b), st| {
        if st.total_bytes > p {
            (st.total_bytes, st.stage)
        } else {
            (p, b)
        }
    });
    report(s, stages, peak, bottleneck)
}

/// [`peak_bytes`] with explicit options.
pub fn peak_bytes_with(s: &Scenario, l: &Layout, opts: &MemoryOptions) -> (f64, u32) {
    peak_of(Ctx::new(s, l, opts), l)
}

fn peak_of(ctx: Ctx<'_>, l: &Layout) -> (f64, u32) {
    let mut peak = f64::NEG_INFINITY;
    let mut bottleneck = 0;
    for r in 0..l.pp.max(1) {
        let t = ctx.stage(r).total_bytes;
        if t > peak {
            peak = t;
            bottleneck = r;
        }
    }
    (peak, bottleneck)
}

fn report(s: &Scenario, stages: Vec<StageMemory>, peak: f64, bottleneck: u32) -> MemoryReport {
    let capacity = s.hardware.capacity_bytes();
    let usable = s.hardware.usable_bytes();
    MemoryReport {
        stages,
        peak_bytes: peak,
        bottleneck_stage: bottleneck,
        capacity_bytes: capacity,
        usable_bytes: usable,
        fits: peak <= usable,
        headroom_bytes: usable - peak,
    }
}

/// Activation bytes one layer of `kind` keeps per micro-batch on one GPU of layout `l`, kept
/// as `keep` (see [`activations`]).
pub fn layer_activation_bytes(
    s: &Scenario,
    l: &Layout,
    opts: &MemoryOptions,
    kind: LayerKind,
    keep: Keep,
) -> f64 {
    let tp = l.tp.max(1) as f64;
    let tp_sp = if l.sp() { tp } else { 1.0 };
    let tokens = s.training.seq_length as f64 / l.cp.max(1) as f64 * l.micro_batch_size as f64;
    layer_terms(
        &s.model,
        kind,
        keep,
        ExpertSide::of(l, crate::compute::expert_memory_load(s, l)),
        s.training.precision,
        opts,
        Dropout::of(l),
    )
    .bytes(tokens, s.training.seq_length as f64, tp, tp_sp)
}
