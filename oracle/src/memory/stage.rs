//! The accounting of one pipeline stage behind [`super::estimate`] and [`super::peak_bytes`],
//! in the terms the module documentation of [`crate::memory`] lists: what the stage's chunks
//! hold (layers by kind, embedding, loss, MTP) and the activations they keep, the parameters
//! and their weight, gradient and optimizer bytes under the layout's sharding, and the
//! buffers. Everything that does not depend on the stage is computed once per call ([`Ctx`]),
//! on the stack, so [`super::peak_bytes`] allocates nothing.

use crate::compute;
use crate::layout::{Layout, Recompute, Schedule};
use crate::model::LayerKind;
use crate::precision::Precision;
use crate::scenario::Scenario;

use super::activations::{
    self, ACT_BYTES, ActivationTerms, ChunkSplit, Dropout, ExpertSide, FP32_BYTES, Keep,
    MASK_BYTES, MemoryOptions, effective_offload, inflight_microbatches, layer_terms,
    layer_terms_offloaded, wgrad_terms,
};
use super::optimizer::{StateBytes, state_bytes};
use super::{
    FSDP_UNSHARDED_LAYERS, PP_P2P_BUFFERS, SP_GATHER_BUFFERS, StageMemory, TP_OVERLAP_BUFFERS,
    VOCAB_PAD_MULTIPLE, allocator, dispatcher, graphs,
};

/// Layers of offloaded activations resident on the GPU at once with layer-level activation
/// offload (`--cpu-offloading-num-layers`): Megatron-Core's offload handler double-buffers, so
/// the layer whose activations are being copied (forward) or prefetched (backward) is held
/// beside the one computing (`megatron/core/extensions/transformer_engine.py`, TE
/// `get_cpu_offload_context`).
pub const ACTIVATION_OFFLOAD_RESIDENT_LAYERS: f64 = 1.0;

/// Layers of one micro-batch whose fine-grained offload groups (`--offload-modules`) are on
/// the GPU at the peak besides what the layers keep: Megatron keeps the last group of each
/// module name on the GPU (the "offload margin" of `PipelineOffloadManager.post_warmup_callback`,
/// `megatron/core/pipeline_parallel/fine_grained_activation_offload.py`, so that reloading it
/// does not stall the first backward), and the backward reloads the next layer's groups
/// (`pre_reload_last_layer`, `bulk_reload_group`) while one computes: two layers.
pub const FINE_GRAINED_OFFLOAD_RESIDENT_LAYERS: f64 = 2.0;

/// Per-GPU parameters of one layer: a dense layer, and an MoE layer outside / inside its
/// experts; and of those, the ones in GEMM weights (what FP8 keeps an extra copy of).
struct LayerParams {
    dense: f64,
    moe_dense: f64,
    moe_expert: f64,
    dense_linear: f64,
    moe_dense_linear: f64,
    moe_expert_linear: f64,
}

/// Per micro-batch activation bytes of one layer: as the layout keeps it (everything, or all
/// but what the selective-recompute modules rerun), keeping everything, fully recomputed (its
/// input only), and its deferred weight-gradient inputs (zero-bubble); and of what the layout
/// keeps, the bytes fine-grained activation offloading moves to the host.
struct LayerActivations {
    dense: f64,
    moe: f64,
    dense_offloaded: f64,
    moe_offloaded: f64,
    all_dense: f64,
    all_moe: f64,
    input: f64,
    wgrad_dense: f64,
    wgrad_moe: f64,
}

/// Divisors of the per-GPU parameters: weights and gradients (FSDP) and optimizer states
/// (the distributed optimizer or FSDP), for non-expert and expert parameters.
struct Shards {
    dense_weight: f64,
    expert_weight: f64,
    dense_opt: f64,
    expert_opt: f64,
}

/// Everything per call that does not depend on the stage, on the stack.
pub(super) struct Ctx<'a> {
    s: &'a Scenario,
    l: &'a Layout,
    tp: f64,
    tp_sp: f64,
    tokens: f64,
    m: u32,
    chunks: u32,
    dense_layers: u32,
    h: f64,
    vocab_padded: f64,
    params: LayerParams,
    act: LayerActivations,
    shards: Shards,
    state: StateBytes,
    dropout: Dropout,
    moe_dispatch: f64,
    allocator_overhead: f64,
    /// Reserved bytes per shared-expert side stream ([`allocator::shared_expert_stream_pool_bytes`];
    /// 0 leaves the side-stream pools out, the tuner screen's lower bound).
    pub(super) stream_pool: f64,
    communicators: f64,
    dispatcher: f64,
    /// The CUDA graphs' static attention mask of one (layer, micro-batch) slot, a
    /// full-iteration graph's batch copies on a rank that reads data, and what their pools
    /// keep from the optimizer step ([`graphs`]).
    graph_mask_per_slot: f64,
    graph_batches: f64,
    graph_pinned: graphs::Pinned,
}

impl LayerActivations {
    fn of(
        s: &Scenario,
        l: &Layout,
        opts: &MemoryOptions,
        tokens: f64,
        tp: f64,
        tp_sp: f64,
        expert_load: f64,
    ) -> LayerActivations {
        let card = &s.model;
        let keys = s.training.seq_length as f64;
        let precision = s.training.precision;
        let keep = Keep::of(l);
        let bytes = |t: ActivationTerms| t.bytes(tokens, keys, tp, tp_sp);
        let dropout = Dropout::of(l);
        let experts = ExpertSide::of(l, expert_load);
        let layer = |kind, keep| {
            bytes(layer_terms(
                card, kind, keep, experts, precision, opts, dropout,
            ))
        };
        let offload = effective_offload(l);
        // (kept, offloaded) per micro-batch of a layer as the layout keeps it.
        let kept = |kind| {
            let (all, moved) =
                layer_terms_offloaded(card, kind, keep, experts, precision, opts, dropout, offload);
            (bytes(all), bytes(moved))
        };
        let zero_bubble = l.schedule == Schedule::ZeroBubble;
        let has_moe = card.moe.is_some();
        let (dense, dense_offloaded) = kept(LayerKind::Dense);
        let (moe, moe_offloaded) = if has_moe {
            kept(LayerKind::Moe)
        } else {
            (0.0, 0.0)
        };
        LayerActivations {
            dense,
            moe,
            dense_offloaded,
            moe_offloaded,
            all_dense: if keep == Keep::All {
                dense
            } else {
                layer(LayerKind::Dense, Keep::All)
            },
            all_moe: if keep == Keep::All || !has_moe {
                moe
            } else {
                layer(LayerKind::Moe, Keep::All)
            },
            input: layer(LayerKind::Dense, Keep::Input),
            wgrad_dense: if zero_bubble {
                bytes(wgrad_terms(card, LayerKind::Dense, experts))
            } else {
                0.0
            },
            wgrad_moe: if has_moe && zero_bubble {
                bytes(wgrad_terms(card, LayerKind::Moe, experts))
            } else {
                0.0
            },
        }
    }
}

impl<'a> Ctx<'a> {
    pub(super) fn new(s: &'a Scenario, l: &'a Layout, opts: &MemoryOptions) -> Ctx<'a> {
        Ctx::with_dispatcher(s, l, opts, dispatcher::dispatcher_bytes(s, l))
    }

    /// The context with `dispatcher` bytes of fused-dispatcher buffers (0: without them, not
    /// computed).
    pub(super) fn with_dispatcher(
        s: &'a Scenario,
        l: &'a Layout,
        opts: &MemoryOptions,
        dispatcher: f64,
    ) -> Ctx<'a> {
        let card = &s.model;
        let tp = l.tp.max(1) as f64;
        let tp_sp = if l.sp() { tp } else { 1.0 };
        let tokens = s.training.seq_length as f64 / l.cp.max(1) as f64 * l.micro_batch_size as f64;
        let m = l.num_microbatches(s).min(u32::MAX as u64) as u32;
        let gpus = s.cluster.gpus;
        let dp_cp = (gpus / (l.tp.max(1) * l.pp.max(1))).max(1) as f64;
        let edp = l.expert_dp(gpus).unwrap_or(1).max(1) as f64;
        let sharded_opt = l.distributed_optimizer || l.fsdp;
        let pad = VOCAB_PAD_MULTIPLE * l.tp.max(1) as u64;
        let vocab_padded = card.vocab_size.div_ceil(pad) * pad;
        let dense = card.layer_params(LayerKind::Dense);
        let moe = card.layer_params(LayerKind::Moe);
        let expert_load = compute::expert_memory_load(s, l);
        let moe_dispatch = match &card.moe {
            Some(m) => {
                // The routed copies a rank holds (`compute::expert_memory_load`).
                let copies = m.top_k as f64 * expert_load;
                copies * tokens / tp_sp * ACT_BYTES * card.hidden_size as f64
            }
            None => 0.0,
        };
        Ctx {
            s,
            l,
            tp,
            tp_sp,
            tokens,
            m,
            chunks: l.chunks(),
            dense_layers: card.dense_layer_count(),
            h: card.hidden_size as f64,
            vocab_padded: vocab_padded as f64,
            params: LayerParams {
                dense: dense.non_expert_per_gpu(l.tp),
                moe_dense: moe.non_expert_per_gpu(l.tp),
                moe_expert: moe.experts_per_gpu(l.ep, l.etp),
                dense_linear: dense.non_expert_linear_per_gpu(l.tp),
                moe_dense_linear: moe.non_expert_linear_per_gpu(l.tp),
                // BF16 experts (the legacy grouped GEMM) keep no FP8 forms of their weights.
                moe_expert_linear: if l.moe.grouped_gemm.runs_fp8() {
                    moe.expert_linear_per_gpu(l.ep, l.etp)
                } else {
                    0.0
                },
            },
            act: LayerActivations::of(s, l, opts, tokens, tp, tp_sp, expert_load),
            shards: Shards {
                dense_weight: if l.fsdp { dp_cp } else { 1.0 },
                expert_weight: if l.fsdp { edp } else { 1.0 },
                dense_opt: if sharded_opt { dp_cp } else { 1.0 },
                expert_opt: if sharded_opt { edp } else { 1.0 },
            },
            state: state_bytes(l, s.training.precision == Precision::Fp8),
            dropout: Dropout::of(l),
            moe_dispatch,
            allocator_overhead: allocator::overhead_fraction(&s.hardware, l),
            stream_pool: allocator::shared_expert_stream_pool_bytes(s, l, tokens),
            communicators: allocator::communicator_bytes(s, l),
            dispatcher,
            graph_mask_per_slot: graphs::static_mask_bytes_per_slot(s, l, tokens),
            graph_batches: graphs::static_batch_bytes(l, tokens, m),
            graph_pinned: graphs::Pinned::of(l),
        }
    }
}

impl Ctx<'_> {
    /// Bytes copied to the host per layer and micro-batch ([`super::HostCopyBytes`]).
    pub(super) fn host_copies(&self) -> super::HostCopyBytes {
        let offload = self.l.activation_offload_layers > 0;
        super::HostCopyBytes {
            dense_groups: self.act.dense_offloaded,
            moe_groups: self.act.moe_offloaded,
            dense_layer: if offload { self.act.dense } else { 0.0 },
            moe_layer: if offload { self.act.moe } else { 0.0 },
        }
    }
}

/// What a stage's chunks hold, tallied over them, and the activations they keep.
#[derive(Default)]
struct StageTally {
    layers: u32,
    dense_count: u32,
    moe_count: u32,
    mtp: u32,
    embedding: bool,
    loss: bool,
    needs_embedding_table: bool,
    needs_output_table: bool,
    /// Activations of the in-flight micro-batches, summed over the chunks.
    activations: f64,
    /// The logits kept for the loss (last stage).
    logits: f64,
    /// The largest rematerialisation of one recomputed layer during its backward.
    recompute_transient: f64,
    /// Deferred weight-gradient inputs of one micro-batch (zero-bubble).
    wgrad_per_mb: f64,
    /// Offloaded activations held on the GPU while they are copied out or back.
    offload_transient: f64,
    /// Fine-grained offload: the groups of one micro-batch's layers kept on the GPU
    /// (FINE_GRAINED_OFFLOAD_RESIDENT_LAYERS of the largest), and all the bytes moved to the
    /// host, which bound them (a rank with fewer layers in flight keeps only those).
    fine_grained_resident: f64,
    fine_grained_moved: f64,
    /// (Decoder layer, micro-batch) pairs in flight, summed over the chunks: the static
    /// samples Transformer Engine's graphs keep ([`graphs::static_mask_bytes_per_slot`]).
    layer_slots: f64,
}

/// Parameters one GPU of a stage holds (before FSDP sharding), non-expert and expert, and of
/// those the ones in GEMM weights.
struct StageParams {
    dense: f64,
    expert: f64,
    dense_linear: f64,
    expert_linear: f64,
}

/// Bytes of the model state of one GPU of a stage.
struct ModelState {
    weights: f64,
    gradients: f64,
    optimizer: f64,
    /// The optimizer's FP32 gradient copy, live from its step to the next `zero_grad`.
    step_grad_copy: f64,
}

impl Ctx<'_> {
    /// Memory of pipeline rank `rank`. Allocation-free; the single source of truth for both
    /// [`super::estimate`] and [`super::peak_bytes`].
    pub(super) fn stage(&self, rank: u32) -> StageMemory {
        let l = self.l;
        let inflight = inflight_microbatches(l, rank, self.m);
        let split = ChunkSplit::new(l, inflight, self.chunks);
        let mut t = StageTally::default();
        for c in 0..self.chunks {
            self.tally_chunk(&mut t, rank, c, split.share(c) as f64);
        }
        let mut activations = t.activations;
        activations += t.logits + t.recompute_transient + t.offload_transient;
        activations += t.fine_grained_resident.min(t.fine_grained_moved);
        let deferred = activations::deferred_wgrad(l, rank, self.m, inflight);
        if deferred > 0 {
            activations += deferred as f64 * t.wgrad_per_mb;
        }
        let params = self.stage_params(&t);
        let state = self.model_state(&params);
        let buffers = self.buffers(&t);
        // The CUDA graphs' static samples, kept from capture on (`graphs`): Transformer
        // Engine's attention masks, a full-iteration graph's batch copies where data is read.
        let reads_data = t.embedding || t.loss || t.mtp > 0;
        let graph_statics = self.graph_mask_per_slot * t.layer_slots
            + if reads_data { self.graph_batches } else { 0.0 };
        // The optimizer step runs after the last backward, with the activations and the
        // passes' buffers freed: its gradient copy raises the peak only where it is larger
        // than they are (then by the difference, counted with the other bytes). What the
        // graphs' pools keep reserved is not freed for it.
        let reusable = match self.graph_pinned {
            graphs::Pinned::Nothing => activations + buffers,
            graphs::Pinned::Layers => activations - t.activations + buffers,
            graphs::Pinned::Everything => 0.0,
        };
        // The pipeline inputs each chunk keeps from its last micro-batch (with their
        // gradients) are allocated through the optimizer step as well.
        let pipeline_inputs = self.pipeline_inputs(rank);
        let step_excess = (state.step_grad_copy + pipeline_inputs - reusable).max(0.0);
        let tensors = state.weights
            + state.gradients
            + state.optimizer
            + activations
            + buffers
            + graph_statics
            + step_excess;
        let fragmentation = self.allocator_overhead * tensors;
        // The shared-expert side streams' pools, reserved beside the allocator's overhead.
        let mtp_moe = self.s.model.mtp_layer_kind() == LayerKind::Moe;
        let moe_layers = t.moe_count + if mtp_moe { t.mtp } else { 0 };
        let side_streams =
            allocator::shared_expert_streams(self.s, l, moe_layers) as f64 * self.stream_pool;
        let reserved = tensors + fragmentation + side_streams;
        // Outside PyTorch's allocator: in the total, not in the reserved bytes.
        let other = buffers
            + graph_statics
            + step_excess
            + fragmentation
            + side_streams
            + self.communicators
            + self.dispatcher;
        StageMemory {
            stage: rank,
            layers: t.layers,
            weights_bytes: state.weights,
            gradients_bytes: state.gradients,
            optimizer_bytes: state.optimizer,
            step_grad_copy_bytes: state.step_grad_copy,
            pipeline_inputs_bytes: pipeline_inputs,
            activations_bytes: activations,
            other_bytes: other,
            // Summed in this order so that a total without the dispatcher plus its bytes is
            // this total exactly (the tuner's screen adds each MoE choice's own).
            total_bytes: reserved + self.communicators + self.dispatcher,
            inflight_microbatches: inflight,
            parameters: params.dense + params.expert,
            mtp_layers: t.mtp,
            embedding: t.embedding,
            loss: t.loss,
            logits_bytes: t.logits,
            buffers_bytes: buffers,
            fragmentation_bytes: fragmentation,
            side_stream_pool_bytes: side_streams,
            graph_static_bytes: graph_statics,
            communicator_bytes: self.communicators,
            dispatcher_bytes: self.dispatcher,
            allocated_bytes: tensors,
            reserved_bytes: reserved,
        }
    }

    /// Bytes of the inputs received from the previous pipeline stage that rank `rank` keeps
    /// between iterations ([`StageMemory::pipeline_inputs_bytes`]): per model chunk fed by the
    /// previous stage (every chunk but the first stage's first), its last micro-batch's input
    /// and that input's gradient, each one P2P tensor `[s / (cp * tp_sp), mbs, h]` in BF16
    /// (Megatron `p2p_communication`'s tensor shape). None under a full-iteration graph: there
    /// they are the graph's static receive buffers, inside its pool's activations.
    fn pipeline_inputs(&self, rank: u32) -> f64 {
        if self.l.pp <= 1 || matches!(self.graph_pinned, graphs::Pinned::Everything) {
            return 0.0;
        }
        let fed = self.chunks - u32::from(rank == 0);
        fed as f64 * 2.0 * self.tokens / self.tp_sp * self.h * ACT_BYTES
    }

    /// Add chunk `c` of `rank`, which keeps `count` micro-batches in flight, to the tally.
    fn tally_chunk(&self, t: &mut StageTally, rank: u32, c: u32, count: f64) {
        let card = &self.s.model;
        let l = self.l;
        let h = self.h;
        let act = &self.act;
        let vs = l.virtual_stage(card.layers, card.mtp_layers, rank, c);
        // Dense layers are the model's first `dense_layers` layers.
        let nd = self
            .dense_layers
            .min(vs.first_layer + vs.layers)
            .saturating_sub(vs.first_layer);
        let nm = vs.layers - nd;
        t.layers += vs.layers;
        t.dense_count += nd;
        t.moe_count += nm;
        t.mtp += vs.mtp;
        t.embedding |= vs.embedding;
        t.loss |= vs.loss;
        t.needs_embedding_table |= vs.embedding || vs.mtp > 0;
        t.needs_output_table |= vs.loss || vs.mtp > 0;
        // Fully recomputed layers of the chunk (the block method's first ones, or Primus'
        // listed IDs), dense (the chunk's first `nd`) and MoE.
        let (mut rd, mut rm) = (0, 0);
        let dense_end = vs.first_layer + nd;
        for run in l.recomputed_runs(vs.range()) {
            let d = run.end.min(dense_end).saturating_sub(run.start);
            rd += d;
            rm += run.end - run.start - d;
        }
        let recomputed = rd + rm;
        // Layer-level activation offload (pp = 1, no recompute): the chunk's first layers keep
        // nothing on the GPU but the one being copied (dense ones first, as layers run).
        let offloaded = l.activation_offload_layers.min(vs.layers);
        let od = offloaded.min(nd);
        let om = offloaded - od;
        // Fine-grained offload: the groups of every in-flight layer are on the host, but for
        // FINE_GRAINED_OFFLOAD_RESIDENT_LAYERS layers of one micro-batch.
        let (kd, km) = ((nd - rd - od) as f64, (nm - rm - om) as f64);
        let mut per_mb = kd * (act.dense - act.dense_offloaded)
            + km * (act.moe - act.moe_offloaded)
            + recomputed as f64 * act.input;
        let largest = match (kd > 0.0, km > 0.0) {
            (true, true) => act.moe_offloaded.max(act.dense_offloaded),
            (true, false) => act.dense_offloaded,
            (false, true) => act.moe_offloaded,
            (false, false) => 0.0,
        };
        t.fine_grained_resident = t
            .fine_grained_resident
            .max(FINE_GRAINED_OFFLOAD_RESIDENT_LAYERS * largest);
        t.fine_grained_moved += count * (kd * act.dense_offloaded + km * act.moe_offloaded);
        if offloaded > 0 {
            let largest = if om > 0 {
                act.moe.max(act.dense)
            } else {
                act.dense
            };
            t.offload_transient = t
                .offload_transient
                .max(ACTIVATION_OFFLOAD_RESIDENT_LAYERS * largest);
        }
        if vs.embedding && self.dropout.hidden {
            // The embedding's dropout mask (1 byte per element, sequence-split).
            per_mb += self.tokens / self.tp_sp * MASK_BYTES * h;
        }
        // The backward pass of a recomputed layer (or of its selective-recompute modules)
        // rematerialises what it did not keep, one layer of one micro-batch at a time:
        // transient = act_all - act_kept of the largest such layer.
        if rd > 0 {
            t.recompute_transient = t.recompute_transient.max(act.all_dense - act.input);
        }
        if rm > 0 {
            t.recompute_transient = t.recompute_transient.max(act.all_moe - act.input);
        }
        if l.recompute == Recompute::Selective {
            if nd > 0 {
                t.recompute_transient = t.recompute_transient.max(act.all_dense - act.dense);
            }
            if nm > 0 {
                t.recompute_transient = t.recompute_transient.max(act.all_moe - act.moe);
            }
        }
        if vs.mtp > 0 {
            // Each MTP module: a layer of the last layer's kind, plus the inputs of its two
            // norms (2h each), of eh_proj (4h), of its final norm and the output layer (2h
            // each), all sequence-split.
            let layer = match card.mtp_layer_kind() {
                LayerKind::Moe => act.moe,
                LayerKind::Dense => act.dense,
            };
            let extra = self.tokens / self.tp_sp * ACT_BYTES * 6.0 * h;
            // A depth Primus' layer IDs recompute keeps only its two inputs, the previous
            // depth's hidden states and the shifted tokens' embeddings
            // (MultiTokenPredictionLayer._checkpointed_forward), and rebuilds the rest in
            // its backward.
            let recomputed = vs.recomputed_mtp(l, card.layers);
            per_mb += (vs.mtp - recomputed) as f64 * (layer + extra)
                + recomputed as f64 * 2.0 * act.input;
            if recomputed > 0 {
                t.recompute_transient = t.recompute_transient.max(layer + extra);
            }
        }
        if vs.loss {
            // Final norm input and output-layer input (2h each, sequence-split) and the
            // per-token fp32 loss.
            per_mb += self.tokens / self.tp_sp * ACT_BYTES * 2.0 * h + self.tokens * FP32_BYTES;
            // Logits: fp32 softmax kept per in-flight micro-batch for the main head and
            // each MTP head, plus one micro-batch's bf16 logits during the cast. Counted for
            // every cross-entropy kernel: Transformer Engine's (`crossEntropyFusion: te`)
            // keeps the bf16 logits instead (4 bytes less per logit: memory.csv MP-V5 -> MP-V6
            // measured 20.0 GiB less, 19.6 by this count), but the Primus MoE runs it would
            // lower are already under-predicted by a term not yet modelled (see
            // `CrossEntropyFusion::keeps_fp32_softmax`), so the verdicts stay conservative.
            let per_logit_set = self.tokens * self.vocab_padded / self.tp;
            t.logits = per_logit_set * (FP32_BYTES * (1 + vs.mtp) as f64 * count + ACT_BYTES);
        }
        t.activations += count * per_mb;
        t.layer_slots += count * vs.layers as f64;
        t.wgrad_per_mb += nd as f64 * act.wgrad_dense + nm as f64 * act.wgrad_moe;
    }

    /// Parameters on one GPU of the stage: non-expert ("dense", sharded over DP x CP) and
    /// expert.
    fn stage_params(&self, t: &StageTally) -> StageParams {
        let card = &self.s.model;
        let h = self.h;
        let p = &self.params;
        let vocab_table = self.vocab_padded * h / self.tp;
        let positions = (card.position_embeddings as f64) * h;
        let tables = t.needs_embedding_table as u32 + t.needs_output_table as u32;
        let shared_tied = card.tied_embeddings
            && t.needs_embedding_table
            && t.needs_output_table
            && self.l.pp <= 1;
        let table_count = tables - shared_tied as u32;
        let mut dense = t.dense_count as f64 * p.dense
            + t.moe_count as f64 * p.moe_dense
            + table_count as f64 * vocab_table;
        if t.needs_embedding_table {
            dense += positions;
        }
        if t.loss {
            dense += card.final_norm_params() as f64;
        }
        let mut expert = t.moe_count as f64 * p.moe_expert;
        let mut dense_linear =
            t.dense_count as f64 * p.dense_linear + t.moe_count as f64 * p.moe_dense_linear;
        let mut expert_linear = t.moe_count as f64 * p.moe_expert_linear;
        let mtp = t.mtp;
        if mtp > 0 {
            // MTP module: the layer, eh_proj (2h x h, column-parallel) and three norms.
            let moe_last = card.mtp_layer_kind() == LayerKind::Moe;
            let (layer_dense, layer_expert, layer_linear, layer_expert_linear) = if moe_last {
                (
                    p.moe_dense,
                    p.moe_expert,
                    p.moe_dense_linear,
                    p.moe_expert_linear,
                )
            } else {
                (p.dense, 0.0, p.dense_linear, 0.0)
            };
            let eh_proj = 2.0 * h * h / self.tp;
            let norms = 3.0 * card.final_norm_params() as f64;
            dense += mtp as f64 * (layer_dense + eh_proj + norms);
            expert += mtp as f64 * layer_expert;
            dense_linear += mtp as f64 * (layer_linear + eh_proj);
            expert_linear += mtp as f64 * layer_expert_linear;
        }
        StageParams {
            dense,
            expert,
            dense_linear,
            expert_linear,
        }
    }

    /// Weights (and their FP8 forms), gradients and optimizer states of the stage's
    /// parameters under the layout's sharding, precisions and offload ([`state_bytes`]).
    fn model_state(&self, p: &StageParams) -> ModelState {
        let sh = &self.shards;
        let b = &self.state;
        let weights_shard = p.dense / sh.dense_weight + p.expert / sh.expert_weight;
        let linear_shard = p.dense_linear / sh.dense_weight + p.expert_linear / sh.expert_weight;
        let optimizer_shard = p.dense / sh.dense_opt + p.expert / sh.expert_opt;
        ModelState {
            weights: b.weight * (weights_shard - linear_shard) + b.linear_weight * linear_shard,
            gradients: b.grad * weights_shard,
            optimizer: b.optimizer * optimizer_shard,
            step_grad_copy: b.step_grad_copy * optimizer_shard,
        }
    }

    /// Communication buffers (SP gather or TP-overlap userbuffers, pipeline send/receive, MoE
    /// dispatch) and FSDP's unsharded layers.
    fn buffers(&self, t: &StageTally) -> f64 {
        let l = self.l;
        let card = &self.s.model;
        let p = &self.params;
        let hidden_bytes = self.tokens * ACT_BYTES * self.h;
        let mut buffers = 0.0;
        if l.tp > 1 {
            if l.tp_comm_overlap {
                buffers += TP_OVERLAP_BUFFERS * hidden_bytes;
            } else if l.sp() {
                buffers += SP_GATHER_BUFFERS * hidden_bytes;
            }
        }
        if l.pp > 1 {
            buffers += PP_P2P_BUFFERS * hidden_bytes / self.tp_sp;
        }
        if t.moe_count > 0 || (t.mtp > 0 && card.moe.is_some()) {
            buffers += self.moe_dispatch;
        }
        if l.fsdp {
            let grad_bytes = self.state.grad;
            let largest = if t.moe_count > 0 {
                p.moe_dense + p.moe_expert
            } else {
                p.dense
            };
            buffers += FSDP_UNSHARDED_LAYERS * largest * (self.state.weight + grad_bytes);
        }
        buffers
    }
}
