//! The op lists: what one decoder layer (dense or MoE block, standard or MLA attention, full
//! or sliding window), the embedding, the output layer with its loss, and an MTP module run
//! per GPU and micro-batch under a layout, with their FLOPs, bytes and shapes.

use super::*;
use crate::layout::{CrossEntropyFusion, ModuleSet, RecomputeModule};
use crate::model::MlaConfig;
use crate::units::FP32_BYTES;

/// The kinds of decoder layer whose cost differs: dense or MoE block, full or sliding-window
/// attention. Costs are computed once per kind, not per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerShape {
    pub kind: LayerKind,
    /// Sliding-window (local) attention.
    pub sliding: bool,
}

/// Per-micro-batch, per-GPU shape of the job under a layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dims {
    /// Micro-batch size (sequences).
    pub b: f64,
    /// Sequence length.
    pub s: f64,
    pub tp: f64,
    pub cp: f64,
    pub ep: f64,
    pub etp: f64,
    /// Sequence parallelism in effect.
    pub sp: bool,
    /// The layout's MoE execution options.
    pub moe: MoeExec,
    /// The cross-entropy kernel (the last stage's loss).
    pub ce_fusion: CrossEntropyFusion,
}

impl Dims {
    pub fn of(s: &Scenario, l: &Layout) -> Dims {
        Dims {
            b: l.micro_batch_size as f64,
            s: s.training.seq_length as f64,
            tp: l.tp.max(1) as f64,
            cp: l.cp.max(1) as f64,
            ep: l.ep.max(1) as f64,
            etp: l.etp.max(1) as f64,
            sp: l.sp(),
            moe: MoeExec::of(s, l),
            ce_fusion: l.cross_entropy_fusion,
        }
    }

    /// Tokens of the micro-batch one CP rank holds: b * s / cp (the GEMMs' M).
    pub fn tokens(&self) -> f64 {
        self.b * self.s / self.cp
    }

    /// Tokens one GPU's norms and residuals see: divided by TP under sequence parallelism.
    pub fn tokens_sp(&self) -> f64 {
        if self.sp {
            self.tokens() / self.tp
        } else {
            self.tokens()
        }
    }

    /// Tokens one GPU dispatches to the experts (its sequence-parallel shard; Megatron's
    /// all-to-all dispatcher works on it directly).
    pub fn tokens_dispatched(&self) -> f64 {
        self.tokens() / self.tp
    }

    /// Routed token copies that reach one GPU's experts: its dispatched tokens x top-k, times
    /// ETP (the expert-TP group gathers its members' tokens). Balanced routing.
    pub fn routed_tokens(&self, top_k: f64) -> f64 {
        self.tokens_dispatched() * top_k * self.etp
    }
}

/// Query/key pairs the attention core scores per sequence on one CP rank: causal full
/// attention s(s+1)/2, a sliding window of w keys s*w - w(w-1)/2; split evenly over CP
/// (Megatron's load-balanced causal CP).
pub fn attention_pairs(s: f64, window: Option<f64>, cp: f64) -> f64 {
    let pairs = match window {
        Some(w) if w < s => s * w - w * (w - 1.0) / 2.0,
        _ => s * (s + 1.0) / 2.0,
    };
    pairs / cp
}

/// Of one CP rank's attention-core work, the fraction in unmasked (non-causal) blocks.
/// Transformer Engine's ring (`context_parallel.py`, `AttnFuncWithCPAndKVP2P`, causal
/// masking with the load-balanced split of the sequence into 2 x cp chunks, rank r holding
/// chunks r and 2cp - 1 - r) runs its first step, the rank's own key/value chunks, as one
/// causal kernel over its 2c tokens (2c^2 pairs), and each of the other cp - 1 steps as an
/// unmasked kernel of 2c^2 pairs (both query chunks against one key/value chunk, or one
/// query chunk against both): (cp - 1) / cp of the work. Without context parallelism, and
/// for sliding-window layers (a banded mask), every kernel is masked.
pub fn unmasked_attention_fraction(cp: f64, sliding: bool) -> f64 {
    if sliding || cp <= 1.0 {
        0.0
    } else {
        (cp - 1.0) / cp
    }
}

/// The op list of one decoder layer of the given shape, per GPU and micro-batch.
pub fn layer_ops(card: &ModelCard, d: &Dims, shape: LayerShape) -> OpList {
    let mut ops = OpList::default();
    let h = card.hidden_size as f64;
    let mut ew = attention_ops(card, d, shape, &mut ops);
    // --- MLP block ---
    // Pre-MLP norm and residual add on the SP shard.
    ew.bytes += d.tokens_sp() * (2.0 * h + 3.0 * h) * ACT_BYTES;
    ew.kernels += 2.0;
    match (shape.kind, &card.moe) {
        (LayerKind::Moe, Some(moe)) => moe_ops(card, d, moe, &mut ops, &mut ew),
        _ => dense_mlp_ops(card, d, &mut ops, &mut ew),
    }
    ops.push(Op::memory("elementwise", ew.bytes, ew.kernels));
    ops
}

/// The layer's element-wise work outside the GEMMs and the attention core, merged into one
/// memory-bound op: bytes moved and kernels launched.
pub(super) struct Elementwise {
    pub bytes: f64,
    pub kernels: f64,
}

/// Per-head widths of the attention: query/key and value head dimensions, the rotary part of
/// the query/key, and the key/value heads.
struct HeadDims {
    dqk: f64,
    dv: f64,
    rope_dim: f64,
    kv_heads: f64,
}

/// The attention block: the query/key/value projections, the attention core and the output
/// projection; returns the element-wise work around it (norm, residual, rotary, Q/K norms).
fn attention_ops(card: &ModelCard, d: &Dims, shape: LayerShape, ops: &mut OpList) -> Elementwise {
    let h = card.hidden_size as f64;
    let heads = card.attention_heads as f64;
    let t = d.tp;
    let tok = d.tokens();
    let tok_sp = d.tokens_sp();
    let HeadDims {
        dqk,
        dv,
        rope_dim,
        kv_heads,
    } = match &card.mla {
        Some(m) => mla_projection_ops(card, m, d, ops),
        None => qkv_projection_ops(card, d, ops),
    };
    let window = if shape.sliding {
        card.sliding_window.map(|w| w as f64)
    } else {
        None
    };
    let pairs = attention_pairs(d.s, window, d.cp);
    // QK^T (2 d_qk) and PV (2 d_v) FLOPs per scored pair and local head.
    let att_flops = 2.0 * d.b * (heads / t) * pairs * (dqk + dv);
    // Read Q, K, V, write O (BF16), per token and local head.
    let att_bytes = tok * ((heads + kv_heads) * dqk + kv_heads * dv + heads * dv) / t * ACT_BYTES;
    ops.push(Op {
        name: "attention",
        class: OpClass::Attention,
        m: tok,
        n: 0.0,
        // The head dimension, for the attention efficiency's head-dimension law
        // (`compute::attention_head_dim_factor`).
        k: (dqk + dv) / 2.0,
        groups: 1.0,
        flops: att_flops,
        bytes: att_bytes,
        fp8: false,
        kernels: 1.0,
        host_ops: 1.0,
        selective: true,
        part: Part::Attention,
        load: 1.0,
        unmasked: unmasked_attention_fraction(d.cp, window.is_some_and(|w| w < d.s)),
    });
    if d.cp > 1.0 {
        // Context parallelism's ring attention runs the core in `cp` steps, one per KV chunk,
        // and merges each step's partial output into the running one by its log-sum-exp
        // (Transformer Engine `context_parallel.py`, `AttnFuncWithCPAndKVP2P`:
        // `flash_attn_fwd_out_correction` and `_softmax_lse_correction` per step): read the
        // step's BF16 output, read and write the FP32 accumulator, per local head; the backward
        // accumulates dQ and dKV per step likewise (MEMORY_BWD_BYTES).
        let merge_bytes = d.cp * tok * (heads / t) * dv * (ACT_BYTES + 2.0 * FP32_BYTES);
        // Part of the attention core: selective recompute of `core_attn` reruns it.
        ops.push(Op {
            selective: true,
            ..Op::memory("cp_merge", merge_bytes, 2.0 * d.cp)
        });
    }
    // Row-parallel output projection: a d_v / tp -> h.
    ops.push(Op::gemm("proj", tok, h, heads * dv / t, 1.0, true));

    // Element-wise work around attention, bytes per token (BF16): input norm (read h,
    // write h) and residual add (read 2h, write h) on the SP shard; rotary on the local
    // query and key heads' rotary dims (read + write); Q/K norms (Qwen3) likewise.
    let mut ew = Elementwise {
        bytes: tok_sp * (2.0 * h + 3.0 * h) * ACT_BYTES
            + tok * 2.0 * (heads + kv_heads) * rope_dim / t * ACT_BYTES,
        kernels: 4.0,
    };
    if card.qk_norm {
        ew.bytes += tok * 2.0 * (heads + kv_heads) * dqk / t * ACT_BYTES;
        ew.kernels += 2.0;
    }
    if card.unfused_rotary() {
        // Eager rotary: ROTARY_UNFUSED_EXTRA_BYTES more per rotated element of the local
        // query and key heads.
        ops.push(
            Op::memory(
                "rotary_unfused",
                tok * (heads + kv_heads) * rope_dim / t * ROTARY_UNFUSED_EXTRA_BYTES,
                2.0 * ROTARY_UNFUSED_KERNELS,
            )
            .eager(),
        );
    }
    ew
}

/// MLA's projections: the duplicated down-projections on the sequence-parallel shard and the
/// column-parallel up-projections.
fn mla_projection_ops(card: &ModelCard, m: &MlaConfig, d: &Dims, ops: &mut OpList) -> HeadDims {
    let h = card.hidden_size as f64;
    let heads = card.attention_heads as f64;
    let t = d.tp;
    let tok = d.tokens();
    let tok_sp = d.tokens_sp();
    let dqk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
    let dv = m.v_head_dim as f64;
    let rope_dim = m.qk_rope_head_dim as f64;
    let kv_rank = m.kv_lora_rank as f64;
    match m.q_lora_rank {
        Some(r) => {
            let r = r as f64;
            // Duplicated down-projection on the sequence-parallel shard: h -> r_q.
            ops.push(Op::gemm("q_down", tok_sp, r, h, 1.0, true));
            // Column-parallel up-projection: r_q -> a (d_nope + d_rope) / tp.
            ops.push(Op::gemm("q_up", tok, heads * dqk / t, r, 1.0, true));
        }
        None => ops.push(Op::gemm("q_proj", tok, heads * dqk / t, h, 1.0, true)),
    }
    // Duplicated kv down-projection h -> r_kv + d_rope, then up r_kv -> a (d_nope + d_v).
    ops.push(Op::gemm(
        "kv_down",
        tok_sp,
        kv_rank + rope_dim,
        h,
        1.0,
        true,
    ));
    ops.push(Op::gemm(
        "kv_up",
        tok,
        heads * (m.qk_nope_head_dim as f64 + dv) / t,
        kv_rank,
        1.0,
        true,
    ));
    HeadDims {
        dqk,
        dv,
        rope_dim,
        kv_heads: heads,
    }
}

/// Standard (and grouped-query) attention's column-parallel fused QKV projection.
fn qkv_projection_ops(card: &ModelCard, d: &Dims, ops: &mut OpList) -> HeadDims {
    let h = card.hidden_size as f64;
    let heads = card.attention_heads as f64;
    let hd = card.head_dim() as f64;
    let kv_heads = card.kv_heads() as f64;
    // Column-parallel fused QKV: h -> (a + 2g) d / tp.
    ops.push(Op::gemm(
        "qkv",
        d.tokens(),
        (heads + 2.0 * kv_heads) * hd / d.tp,
        h,
        1.0,
        true,
    ));
    HeadDims {
        dqk: hd,
        dv: hd,
        rope_dim: hd,
        kv_heads,
    }
}

/// Bytes per token the MLP activation moves at width `w`: SwiGLU reads gate and up (2w) and
/// writes w; bias-GELU reads w and writes w.
pub(super) fn activation_bytes_per_width(card: &ModelCard, w: f64) -> f64 {
    match card.activation {
        Activation::Swiglu => 3.0 * w,
        Activation::Gelu => 2.0 * w,
    }
}

/// The dense MLP: column-parallel FC1, row-parallel FC2, and its activation.
fn dense_mlp_ops(card: &ModelCard, d: &Dims, ops: &mut OpList, ew: &mut Elementwise) {
    let h = card.hidden_size as f64;
    let t = d.tp;
    let tok = d.tokens();
    let f = card.ffn_hidden_size as f64;
    let fc1 = card.mlp_fc1_width(card.ffn_hidden_size) as f64 / t;
    ops.push(Op::gemm("fc1", tok, fc1, h, 1.0, true).in_part(Part::Mlp));
    ops.push(Op::gemm("fc2", tok, h, f / t, 1.0, true).in_part(Part::Mlp));
    ew.bytes += tok * activation_bytes_per_width(card, f / t) * ACT_BYTES;
    ew.kernels += 1.0;
    if card.activation_clamp {
        ops.push(clamp_op(
            "mlp_act_clamp",
            tok * f / t,
            CLAMP_KERNELS,
            Part::Mlp,
            false,
        ));
    }
}

/// The selective-recompute modules whose checkpoint reruns the whole of a [`layer_ops`] op, by
/// the op's name (Megatron-Core: `core_attn` wraps the attention core, `mla_up_proj` the
/// up-projections, `mlp` the dense MLP, `moe` the whole MoE block, `shared_experts` the shared
/// experts). Ops merged with work outside a module (the element-wise op, which also holds the
/// norms, residual adds, rotary and activations) belong to none: [`recompute_ops`] adds the
/// recomputed parts of them as their own ops.
pub fn recomputed_by(name: &str) -> ModuleSet {
    use RecomputeModule::*;
    match name {
        "attention" | "cp_merge" => ModuleSet::of(&[CoreAttn]),
        "q_up" | "q_proj" | "kv_up" => ModuleSet::of(&[MlaUpProj]),
        "fc1" | "fc2" => ModuleSet::of(&[Mlp]),
        "router"
        | "router_scores"
        | "experts_fc1"
        | "experts_fc2"
        | "moe_permute"
        | "moe_expert_elementwise"
        | "moe_act_clamp"
        | "experts_fc2_bias" => ModuleSet::of(&[Moe]),
        "shared_fc1" | "shared_fc2" => ModuleSet::of(&[Moe, SharedExperts]),
        _ => ModuleSet::EMPTY,
    }
}

/// The forward work that selective recompute of the modules `set` adds to the backward pass of
/// one layer of the given shape, per GPU and micro-batch: the [`layer_ops`] ops a recomputed
/// module holds whole ([`recomputed_by`]), and as ops of their own the recomputed parts of the
/// layer's element-wise work, with the same bytes and kernels [`layer_ops`] counts for them:
/// - `layernorm`: the separate norms, MLA's input norm and the MoE block's pre-MLP norm (read
///   and write h per token of the SP shard, one kernel each; the norms Transformer Engine fuses
///   into the QKV and fc1 linears are not rerun);
/// - `mla_up_proj`: the rotary embedding of the local query and key heads (read and write their
///   rotary dims, two kernels);
/// - `mlp`: the dense MLP's activation; `moe`/`shared_experts`: the shared experts'
///   activation (one kernel);
/// - `moe_act` (without `moe`, which reruns the whole expert section): the routed experts'
///   activation (one kernel; one per local expert for Megatron's SequentialMLP).
pub fn recompute_ops(card: &ModelCard, d: &Dims, shape: LayerShape, set: ModuleSet) -> OpList {
    use RecomputeModule::*;
    let mut out = OpList::default();
    if set.is_empty() {
        return out;
    }
    for op in layer_ops(card, d, shape).iter() {
        if recomputed_by(op.name).intersects(set) {
            out.push(*op);
        }
    }
    let h = card.hidden_size as f64;
    let t = d.tp;
    let moe_layer = shape.kind == LayerKind::Moe && card.moe.is_some();
    let act_bytes_per_width = |w: f64| match card.activation {
        Activation::Swiglu => 3.0 * w,
        Activation::Gelu => 2.0 * w,
    };
    if set.contains(Layernorm) {
        // norm = tokens_sp * 2h * 2 bytes (read h, write h) per separate norm.
        let separate = card.mla.is_some() as u32 + moe_layer as u32;
        for _ in 0..separate {
            out.push(Op::memory(
                "norm_recompute",
                d.tokens_sp() * 2.0 * h * ACT_BYTES,
                1.0,
            ));
        }
    }
    if set.contains(MlaUpProj)
        && let Some(m) = &card.mla
    {
        // rotary = tokens * 2 * (a + a) * d_rope / tp * 2 bytes (MLA: a key heads).
        let heads = card.attention_heads as f64;
        out.push(Op::memory(
            "rotary_recompute",
            d.tokens() * 2.0 * (heads + heads) * m.qk_rope_head_dim as f64 / t * ACT_BYTES,
            2.0,
        ));
    }
    match (moe_layer, &card.moe) {
        (true, Some(moe)) => {
            let shared = card.shared_expert_ffn() as f64;
            if shared > 0.0 && set.intersects(ModuleSet::of(&[Moe, SharedExperts])) {
                // shared activation = tokens * act_bytes(shared / tp) * 2 bytes.
                out.push(Op::memory(
                    "shared_act_recompute",
                    d.tokens() * act_bytes_per_width(shared / t) * ACT_BYTES,
                    1.0,
                ));
            }
            if set.contains(MoeAct) && !set.contains(Moe) {
                // expert activation = routed copies (busiest rank) * act_bytes(f_e / etp) * 2.
                let (routed, local) = busiest_rank(d, moe);
                let fe = moe.moe_ffn_hidden_size as f64;
                let sequential = d.moe.grouped_gemm == crate::layout::GroupedGemm::Sequential;
                let op = Op::memory(
                    "moe_act_recompute",
                    routed * act_bytes_per_width(fe / d.etp) * ACT_BYTES,
                    if sequential { local } else { 1.0 },
                )
                .in_part(Part::Experts);
                out.push(op);
                if card.activation_clamp {
                    // The clamp in front of it reruns too (forward bytes only).
                    out.push(clamp_op(
                        "moe_act_clamp_recompute",
                        routed * fe / d.etp,
                        clamp_kernels(&d.moe, local),
                        Part::Experts,
                        true,
                    ));
                }
            }
        }
        _ => {
            if set.contains(Mlp) {
                // dense activation = tokens * act_bytes(f / tp) * 2 bytes.
                let f = card.ffn_hidden_size as f64;
                out.push(Op::memory(
                    "mlp_act_recompute",
                    d.tokens() * act_bytes_per_width(f / t) * ACT_BYTES,
                    1.0,
                ));
                if card.activation_clamp {
                    out.push(clamp_op(
                        "mlp_act_clamp_recompute",
                        d.tokens() * f / t,
                        CLAMP_KERNELS,
                        Part::Mlp,
                        true,
                    ));
                }
            }
        }
    }
    out
}

/// The input embedding on the first pipeline stage: a vocab-parallel lookup writing the
/// micro-batch's hidden states (read the rows, write b*s*h), backward a scatter-add into the
/// FP32 gradient (counted by the memory op's backward factor).
pub fn embedding_ops(card: &ModelCard, d: &Dims) -> OpList {
    let mut ops = OpList::default();
    let h = card.hidden_size as f64;
    ops.push(Op::memory(
        "embedding",
        d.tokens() * h * ACT_BYTES * 2.0,
        2.0,
    ));
    ops
}

/// The final norm, output layer (column-parallel h -> V/tp, kept in BF16 as Megatron's output
/// layer is not a Transformer Engine linear) and vocab-parallel cross-entropy on the last
/// stage.
pub fn head_ops(card: &ModelCard, d: &Dims) -> OpList {
    let mut ops = OpList::default();
    let h = card.hidden_size as f64;
    let v = card.vocab_size as f64 / d.tp;
    ops.push(Op::memory(
        "final_norm",
        d.tokens_sp() * 2.0 * h * ACT_BYTES,
        1.0,
    ));
    ops.push(Op::gemm("output", d.tokens(), v, h, 1.0, false));
    let (loss_bytes, loss_kernels) = if d.ce_fusion.fused() {
        (LOSS_FWD_BYTES, LOSS_FUSED_KERNELS)
    } else {
        (LOSS_UNFUSED_BYTES, LOSS_UNFUSED_KERNELS)
    };
    ops.push(Op::memory(
        "cross_entropy",
        d.tokens() * v * loss_bytes,
        loss_kernels,
    ));
    ops
}

/// What one multi-token-prediction module adds on top of its decoder layer: norms of the
/// embedding and hidden state, the projection of their concatenation (2h -> h, column-parallel)
/// and its own output layer and loss (the head again).
pub fn mtp_extra_ops(card: &ModelCard, d: &Dims) -> OpList {
    let mut ops = head_ops(card, d);
    let h = card.hidden_size as f64;
    ops.push(Op::memory(
        "mtp_norms",
        d.tokens_sp() * 2.0 * 2.0 * h * ACT_BYTES,
        2.0,
    ));
    ops.push(Op::gemm(
        "mtp_proj",
        d.tokens(),
        h / d.tp,
        2.0 * h,
        1.0,
        true,
    ));
    ops
}
