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
//!   shard) sharded: 4 + 16/d, the same table's 16-bit-gradient row;
//! - FP8 (Transformer Engine): an FP8 copy of every GEMM weight and its transpose, kept for the
//!   whole step, 2 bytes per GEMM weight ([`FP8_WEIGHT_COPY_BYTES`]);
//! - activations: [`activations`], times the micro-batches each schedule keeps in flight;
//! - the last stage's logits: Megatron's vocab-parallel cross entropy casts the BF16 logits
//!   (2 bytes) to FP32 (4 bytes), turns them into the softmax in place and keeps that for the
//!   backward pass: 4 bytes per logit per in-flight micro-batch, plus the 2-byte BF16 logits of
//!   one micro-batch while the cast runs (no fused cross entropy assumed);
//! - other: the sequence-parallel all-gather buffer, pipeline send/receive buffers, the MoE
//!   dispatch buffer, FSDP's unsharded layer buffers, and the allocator's fragmentation (the
//!   hardware profile's `overheads.allocatorFragmentation` fraction of all tensor memory).
//!
//! The runtime reserve (`overheads.runtimeReserveGib`) is not part of a stage's total: it is
//! what separates `capacityBytes` from `usableBytes`.

use serde::Serialize;

use crate::layout::{Layout, Recompute, Schedule};
use crate::model::LayerKind;
use crate::precision::Precision;
use crate::scenario::Scenario;

pub mod activations;

use activations::{ACT_BYTES, ChunkSplit, FP32_BYTES};
pub use activations::{
    ActivationTerms, Keep, MemoryOptions, deferred_wgrad_microbatches, inflight_in_chunk,
    inflight_microbatches, layer_terms, wgrad_terms,
};

/// BF16 model weight, bytes per parameter.
pub const WEIGHT_BYTES: f64 = 2.0;
/// FP32 main gradient (Megatron accumulates and reduces gradients in FP32 with BF16 training),
/// bytes per parameter.
pub const MAIN_GRAD_BYTES: f64 = 4.0;
/// BF16 gradient (`--grad-reduce-in-bf16`: gradients accumulated and reduced in BF16), bytes
/// per parameter.
pub const BF16_GRAD_BYTES: f64 = 2.0;
/// Adam optimizer state: FP32 master weight 4 + first moment 4 + second moment 4, bytes per
/// parameter.
pub const OPTIMIZER_STATE_BYTES: f64 = 12.0;
/// With BF16 gradients the optimizer casts its gradient shard to an FP32 copy for the update,
/// bytes per parameter (Megatron-LM `docs/source/api-guide/dist_optimizer.md`, the 16-bit
/// gradient rows: 4 + 16/d with the distributed optimizer, 20 without).
pub const FP32_GRAD_COPY_BYTES: f64 = 4.0;

/// Bytes per parameter of the gradient buffer and of the optimizer (sharded by the caller) for
/// a layout's gradient precision.
pub fn grad_and_optimizer_bytes(l: &Layout) -> (f64, f64) {
    if l.grad_reduce_in_fp32 {
        (MAIN_GRAD_BYTES, OPTIMIZER_STATE_BYTES)
    } else {
        (
            BF16_GRAD_BYTES,
            OPTIMIZER_STATE_BYTES + FP32_GRAD_COPY_BYTES,
        )
    }
}
/// Transformer Engine FP8 training keeps, per GEMM weight, an FP8 copy (1 byte) and its
/// transpose (1 byte) for the backward GEMMs, cached across micro-batches.
pub const FP8_WEIGHT_COPY_BYTES: f64 = 2.0;
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
    pub optimizer_bytes: f64,
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
    /// Of the other bytes: allocator fragmentation.
    pub fragmentation_bytes: f64,
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

/// Everything per call that does not depend on the stage, on the stack.
struct Ctx<'a> {
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
    /// Per-GPU parameters of a dense layer, and of an MoE layer outside / inside its experts.
    dense_params: f64,
    moe_dense_params: f64,
    moe_expert_params: f64,
    dense_linear: f64,
    moe_dense_linear: f64,
    moe_expert_linear: f64,
    /// Per micro-batch activation bytes of a layer as the layout keeps it (everything, or all
    /// but what the selective-recompute modules rerun), of a layer keeping everything, of a
    /// fully recomputed layer (its input), and its deferred-W bytes.
    act_dense: f64,
    act_moe: f64,
    act_all_dense: f64,
    act_all_moe: f64,
    act_input: f64,
    wgrad_dense: f64,
    wgrad_moe: f64,
    /// Sharding divisors: weights+grads (FSDP) and optimizer states.
    dense_weight_shard: f64,
    expert_weight_shard: f64,
    dense_opt_shard: f64,
    expert_opt_shard: f64,
    fp8: bool,
    moe_dispatch: f64,
}

impl<'a> Ctx<'a> {
    fn new(s: &'a Scenario, l: &'a Layout, opts: &MemoryOptions) -> Ctx<'a> {
        let card = &s.model;
        let tp = l.tp.max(1) as f64;
        let tp_sp = if l.sp() { tp } else { 1.0 };
        let tokens = s.training.seq_length as f64 / l.cp.max(1) as f64 * l.micro_batch_size as f64;
        let keys = s.training.seq_length as f64;
        let gpus = s.cluster.gpus;
        let dp_cp = (gpus / (l.tp.max(1) * l.pp.max(1))).max(1) as f64;
        let edp = l.expert_dp(gpus).unwrap_or(1).max(1) as f64;
        let sharded_opt = l.distributed_optimizer || l.fsdp;
        let pad = VOCAB_PAD_MULTIPLE * l.tp.max(1) as u64;
        let vocab_padded = card.vocab_size.div_ceil(pad) * pad;
        let dense = card.layer_params(LayerKind::Dense);
        let moe = card.layer_params(LayerKind::Moe);
        let keep = Keep::of(l);
        let bytes = |t: ActivationTerms| t.bytes(tokens, keys, tp, tp_sp);
        let precision = s.training.precision;
        let zero_bubble = l.schedule == Schedule::ZeroBubble;
        let act_dense = bytes(layer_terms(
            card,
            LayerKind::Dense,
            keep,
            l.etp,
            precision,
            opts,
        ));
        let has_moe = card.moe.is_some();
        let act_moe = if has_moe {
            bytes(layer_terms(
                card,
                LayerKind::Moe,
                keep,
                l.etp,
                precision,
                opts,
            ))
        } else {
            0.0
        };
        let moe_dispatch = match &card.moe {
            Some(m) => {
                let copies = m.top_k as f64
                    * m.capacity_factor
                        .unwrap_or(activations::MOE_DROPLESS_LOAD_FACTOR);
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
            m: l.num_microbatches(s).min(u32::MAX as u64) as u32,
            chunks: l.chunks(),
            dense_layers: card.dense_layer_count(),
            h: card.hidden_size as f64,
            vocab_padded: vocab_padded as f64,
            dense_params: dense.non_expert_per_gpu(l.tp),
            moe_dense_params: moe.non_expert_per_gpu(l.tp),
            moe_expert_params: moe.experts_per_gpu(l.ep, l.etp),
            dense_linear: dense.non_expert_linear_per_gpu(l.tp),
            moe_dense_linear: moe.non_expert_linear_per_gpu(l.tp),
            moe_expert_linear: moe.expert_linear_per_gpu(l.ep, l.etp),
            act_dense,
            act_moe,
            act_all_dense: if keep == Keep::All {
                act_dense
            } else {
                bytes(layer_terms(
                    card,
                    LayerKind::Dense,
                    Keep::All,
                    l.etp,
                    precision,
                    opts,
                ))
            },
            act_all_moe: if keep == Keep::All || !has_moe {
                act_moe
            } else {
                bytes(layer_terms(
                    card,
                    LayerKind::Moe,
                    Keep::All,
                    l.etp,
                    precision,
                    opts,
                ))
            },
            act_input: bytes(layer_terms(
                card,
                LayerKind::Dense,
                Keep::Input,
                l.etp,
                precision,
                opts,
            )),
            wgrad_dense: if zero_bubble {
                bytes(wgrad_terms(card, LayerKind::Dense, l.etp))
            } else {
                0.0
            },
            wgrad_moe: if has_moe && zero_bubble {
                bytes(wgrad_terms(card, LayerKind::Moe, l.etp))
            } else {
                0.0
            },
            dense_weight_shard: if l.fsdp { dp_cp } else { 1.0 },
            expert_weight_shard: if l.fsdp { edp } else { 1.0 },
            dense_opt_shard: if sharded_opt { dp_cp } else { 1.0 },
            expert_opt_shard: if sharded_opt { edp } else { 1.0 },
            fp8: s.training.precision == Precision::Fp8,
            moe_dispatch,
        }
    }

    /// Memory of pipeline rank `rank`. Allocation-free; the single source of truth for both
    /// [`estimate`] and [`peak_bytes`].
    fn stage(&self, rank: u32) -> StageMemory {
        let card = &self.s.model;
        let l = self.l;
        let h = self.h;
        // Parameter and activation tallies over the rank's chunks.
        let mut layers = 0u32;
        let mut dense_count = 0u32;
        let mut moe_count = 0u32;
        let mut mtp = 0u32;
        let mut embedding = false;
        let mut loss = false;
        let mut needs_embedding_table = false;
        let mut needs_output_table = false;
        let mut activations = 0.0;
        let mut logits = 0.0;
        let mut recompute_transient: f64 = 0.0;
        let mut wgrad_per_mb = 0.0;
        let inflight = inflight_microbatches(l, rank, self.m);
        let split = ChunkSplit::new(l, inflight, self.chunks);
        for c in 0..self.chunks {
            let vs = l.virtual_stage(card.layers, card.mtp_layers, rank, c);
            // Dense layers are the model's first `dense_layers` layers.
            let nd = self
                .dense_layers
                .min(vs.first_layer + vs.layers)
                .saturating_sub(vs.first_layer);
            let nm = vs.layers - nd;
            layers += vs.layers;
            dense_count += nd;
            moe_count += nm;
            mtp += vs.mtp;
            embedding |= vs.embedding;
            loss |= vs.loss;
            needs_embedding_table |= vs.embedding || vs.mtp > 0;
            needs_output_table |= vs.loss || vs.mtp > 0;
            let count = split.share(c) as f64;
            // Full recompute of the chunk's first `recomputed` layers (dense ones first).
            let recomputed = match l.recompute {
                Recompute::Full if l.recompute_layers == 0 => vs.layers,
                Recompute::Full => l.recompute_layers.min(vs.layers),
                _ => 0,
            };
            let rd = recomputed.min(nd);
            let rm = recomputed - rd;
            let mut per_mb = (nd - rd) as f64 * self.act_dense
                + (nm - rm) as f64 * self.act_moe
                + recomputed as f64 * self.act_input;
            // The backward pass of a recomputed layer (or of its selective-recompute modules)
            // rematerialises what it did not keep, one layer of one micro-batch at a time:
            // transient = act_all - act_kept of the largest such layer.
            if rd > 0 {
                recompute_transient = recompute_transient.max(self.act_all_dense - self.act_input);
            }
            if rm > 0 {
                recompute_transient = recompute_transient.max(self.act_all_moe - self.act_input);
            }
            if l.recompute == Recompute::Selective {
                if nd > 0 {
                    recompute_transient =
                        recompute_transient.max(self.act_all_dense - self.act_dense);
                }
                if nm > 0 {
                    recompute_transient = recompute_transient.max(self.act_all_moe - self.act_moe);
                }
            }
            if vs.mtp > 0 {
                // Each MTP module: a layer of the last layer's kind, plus the inputs of its two
                // norms (2h each), of eh_proj (4h), of its final norm and the output layer (2h
                // each), all sequence-split.
                let layer = match card.layer_kind(card.layers.saturating_sub(1)) {
                    LayerKind::Moe => self.act_moe,
                    LayerKind::Dense => self.act_dense,
                };
                let extra = self.tokens / self.tp_sp * ACT_BYTES * 6.0 * h;
                per_mb += vs.mtp as f64 * (layer + extra);
            }
            if vs.loss {
                // Final norm input and output-layer input (2h each, sequence-split) and the
                // per-token fp32 loss.
                per_mb += self.tokens / self.tp_sp * ACT_BYTES * 2.0 * h + self.tokens * FP32_BYTES;
                // Logits: fp32 softmax kept per in-flight micro-batch for the main head and
                // each MTP head, plus one micro-batch's bf16 logits during the cast.
                let per_logit_set = self.tokens * self.vocab_padded / self.tp;
                logits = per_logit_set * (FP32_BYTES * (1 + vs.mtp) as f64 * count + ACT_BYTES);
            }
            activations += count * per_mb;
            wgrad_per_mb += nd as f64 * self.wgrad_dense + nm as f64 * self.wgrad_moe;
        }
        activations += logits + recompute_transient;
        let deferred = activations::deferred_wgrad(l, rank, self.m, inflight);
        if deferred > 0 {
            activations += deferred as f64 * wgrad_per_mb;
        }

        // Parameters on this GPU: non-expert ("dense", sharded over DP x CP) and expert.
        let vocab_table = self.vocab_padded * h / self.tp;
        let positions = (card.position_embeddings as f64) * h;
        let tables = needs_embedding_table as u32 + needs_output_table as u32;
        let shared_tied =
            card.tied_embeddings && needs_embedding_table && needs_output_table && l.pp <= 1;
        let table_count = tables - shared_tied as u32;
        let mut dense_params = dense_count as f64 * self.dense_params
            + moe_count as f64 * self.moe_dense_params
            + table_count as f64 * vocab_table;
        if needs_embedding_table {
            dense_params += positions;
        }
        if loss {
            dense_params += card.final_norm_params() as f64;
        }
        let mut expert_params = moe_count as f64 * self.moe_expert_params;
        let mut dense_linear =
            dense_count as f64 * self.dense_linear + moe_count as f64 * self.moe_dense_linear;
        let mut expert_linear = moe_count as f64 * self.moe_expert_linear;
        if mtp > 0 {
            // MTP module: the layer, eh_proj (2h x h, column-parallel) and three norms.
            let moe_last = card.layer_kind(card.layers.saturating_sub(1)) == LayerKind::Moe;
            let (layer_dense, layer_expert, layer_linear, layer_expert_linear) = if moe_last {
                (
                    self.moe_dense_params,
                    self.moe_expert_params,
                    self.moe_dense_linear,
                    self.moe_expert_linear,
                )
            } else {
                (self.dense_params, 0.0, self.dense_linear, 0.0)
            };
            let eh_proj = 2.0 * h * h / self.tp;
            let norms = 3.0 * card.final_norm_params() as f64;
            dense_params += mtp as f64 * (layer_dense + eh_proj + norms);
            expert_params += mtp as f64 * layer_expert;
            dense_linear += mtp as f64 * (layer_linear + eh_proj);
            expert_linear += mtp as f64 * layer_expert_linear;
        }

        let weights_shard =
            dense_params / self.dense_weight_shard + expert_params / self.expert_weight_shard;
        let mut weights = WEIGHT_BYTES * weights_shard;
        if self.fp8 {
            weights += FP8_WEIGHT_COPY_BYTES
                * (dense_linear / self.dense_weight_shard
                    + expert_linear / self.expert_weight_shard);
        }
        let (grad_bytes, optimizer_bytes) = grad_and_optimizer_bytes(l);
        let gradients = grad_bytes * weights_shard;
        let optimizer = optimizer_bytes
            * (dense_params / self.dense_opt_shard + expert_params / self.expert_opt_shard);

        // Buffers.
        let hidden_bytes = self.tokens * ACT_BYTES * h;
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
        if moe_count > 0 || (mtp > 0 && card.moe.is_some()) {
            buffers += self.moe_dispatch;
        }
        if l.fsdp {
            let largest = if moe_count > 0 {
                self.moe_dense_params + self.moe_expert_params
            } else {
                self.dense_params
            };
            buffers += FSDP_UNSHARDED_LAYERS * largest * (WEIGHT_BYTES + grad_bytes);
        }
        let tensors = weights + gradients + optimizer + activations + buffers;
        let fragmentation = self.s.hardware.overheads.allocator_fragmentation * tensors;
        let other = buffers + fragmentation;
        StageMemory {
            stage: rank,
            layers,
            weights_bytes: weights,
            gradients_bytes: gradients,
            optimizer_bytes: optimizer,
            activations_bytes: activations,
            other_bytes: other,
            total_bytes: tensors + fragmentation,
            inflight_microbatches: inflight,
            parameters: dense_params + expert_params,
            mtp_layers: mtp,
            embedding,
            loss,
            logits_bytes: logits,
            buffers_bytes: buffers,
            fragmentation_bytes: fragmentation,
        }
    }
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
    let ctx = Ctx::new(s, l, opts);
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
    layer_terms(&s.model, kind, keep, l.etp, s.training.precision, opts).bytes(
        tokens,
        s.training.seq_length as f64,
        tp,
        tp_sp,
    )
}
