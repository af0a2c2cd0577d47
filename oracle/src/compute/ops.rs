//! The op lists: what one decoder layer (dense or MoE block, standard or MLA attention, full
//! or sliding window), the embedding, the output layer with its loss, and an MTP module run
//! per GPU and micro-batch under a layout, with their FLOPs, bytes and shapes.

use super::*;
use crate::layout::{ModuleSet, RecomputeModule};
use crate::model::{MlaConfig, MoeConfig};

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

/// Host launches of one linear of one expert in Megatron's SequentialMLP: slice the expert's
/// tokens, the GEMM, the bias add, and the copy back into the output.
pub const SEQUENTIAL_EXPERT_LAUNCHES: f64 = 8.0;

/// Coefficient of variation of the tokens routed to one expert in a step, under Megatron's
/// auxiliary load-balancing loss (dropless routing). A training-dynamics figure, not a
/// hardware one: balanced routers keep per-expert loads within roughly +-25% (one standard
/// deviation) of the mean.
pub const MOE_EXPERT_LOAD_CV: f64 = 0.25;

/// Load of the busiest of `ep` expert-parallel ranks relative to the mean, each rank holding
/// `local` experts: per-rank loads have CV = MOE_EXPERT_LOAD_CV / sqrt(local) (sums of
/// independent expert loads), and the maximum of `ep` roughly normal loads exceeds the mean by
/// about sqrt(2 ln ep) standard deviations (Gaussian extreme-value estimate). 1 without EP.
pub fn moe_load_imbalance(local: f64, ep: f64) -> f64 {
    if ep <= 1.0 {
        return 1.0;
    }
    1.0 + MOE_EXPERT_LOAD_CV / local.max(1.0).sqrt() * (2.0 * ep.ln()).sqrt()
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
struct Elementwise {
    bytes: f64,
    kernels: f64,
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
        k: 0.0,
        groups: 1.0,
        flops: att_flops,
        bytes: att_bytes,
        fp8: false,
        kernels: 1.0,
        selective: true,
        after_sync: false,
        load: 1.0,
    });
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
fn activation_bytes_per_width(card: &ModelCard, w: f64) -> f64 {
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
    ops.push(Op::gemm("fc1", tok, fc1, h, 1.0, true));
    ops.push(Op::gemm("fc2", tok, h, f / t, 1.0, true));
    ew.bytes += tok * activation_bytes_per_width(card, f / t) * ACT_BYTES;
    ew.kernels += 1.0;
}

/// The MoE block: router, the busiest GPU's experts, token permutation on both sides of the
/// dispatch, and the shared experts.
fn moe_ops(card: &ModelCard, d: &Dims, moe: &MoeConfig, ops: &mut OpList, ew: &mut Elementwise) {
    let h = card.hidden_size as f64;
    let t = d.tp;
    let tok = d.tokens();
    let e = moe.num_experts as f64;
    let k = moe.top_k as f64;
    let fe = moe.moe_ffn_hidden_size as f64;
    let td = d.tokens_dispatched();
    // Router: replicated linear h -> E on the dispatched tokens (BF16), then FP32
    // softmax (or sigmoid), top-k, and the load-balancing/z losses over the T x E
    // scores: about six passes of 4 bytes over them.
    ops.push(Op::gemm("router", td, e, h, 1.0, false));
    ops.push(Op::memory("router_scores", td * e * 4.0 * 6.0, 10.0));
    let local = (e / d.ep).max(1.0);
    // Routed copies reaching the busiest GPU's experts.
    let load = moe_load_imbalance(local, d.ep);
    let routed = d.routed_tokens(k) * load;
    let tokens_per_expert = routed / local;
    let fc1 = card.mlp_fc1_width(moe.moe_ffn_hidden_size) as f64 / d.etp;
    let mut fc1_op = Op::gemm("experts_fc1", tokens_per_expert, fc1, h, local, true);
    let mut fc2_op = Op::gemm("experts_fc2", tokens_per_expert, h, fe / d.etp, local, true);
    // Launches per local expert: Transformer Engine's grouped linear issues one GEMM
    // per expert; experts with biases run Megatron's SequentialMLP, a separate MLP
    // module per expert (Megatron's grouped-GEMM experts assert `add_bias_linear ==
    // False`, megatron/core/transformer/moe/experts.py).
    let per_expert = if card.mlp_bias {
        SEQUENTIAL_EXPERT_LAUNCHES
    } else {
        1.0
    };
    fc1_op.kernels = local * per_expert;
    fc2_op.kernels = local * per_expert;
    fc1_op.after_sync = true;
    fc2_op.after_sync = true;
    fc1_op.load = load;
    fc2_op.load = load;
    ops.push(fc1_op);
    ops.push(fc2_op);
    // Source side (balanced): permute the token copies before the dispatch (gather:
    // read + write) and un-permute after the combine (read the copies, weighted
    // scatter-add into the output): 3.5 passes over k copies of h.
    let mut source = Op::memory("moe_permute", td * k * h * ACT_BYTES * 3.5, 6.0);
    source.after_sync = true;
    ops.push(source);
    // Expert side (busiest GPU): sort the received copies by local expert and unsort
    // them before the combine (read + write each), and the experts' activation.
    let mut expert_side = Op::memory(
        "moe_expert_elementwise",
        routed * h * ACT_BYTES * 4.0
            + routed * activation_bytes_per_width(card, fe / d.etp) * ACT_BYTES,
        // Sort, unsort, activation; a sequential MLP runs its activation and the copies
        // in and out per expert.
        if card.mlp_bias {
            2.0 + 3.0 * local
        } else {
            5.0
        },
    );
    expert_side.after_sync = true;
    ops.push(expert_side);
    let shared = card.shared_expert_ffn() as f64;
    if shared > 0.0 {
        let fc1s = card.mlp_fc1_width(card.shared_expert_ffn()) as f64 / t;
        ops.push(Op::gemm("shared_fc1", tok, fc1s, h, 1.0, true));
        ops.push(Op::gemm("shared_fc2", tok, h, shared / t, 1.0, true));
        ew.bytes += tok * activation_bytes_per_width(card, shared / t) * ACT_BYTES;
        ew.kernels += 1.0;
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
        "attention" => ModuleSet::of(&[CoreAttn]),
        "q_up" | "q_proj" | "kv_up" => ModuleSet::of(&[MlaUpProj]),
        "fc1" | "fc2" => ModuleSet::of(&[Mlp]),
        "router"
        | "router_scores"
        | "experts_fc1"
        | "experts_fc2"
        | "moe_permute"
        | "moe_expert_elementwise" => ModuleSet::of(&[Moe]),
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
                let local = (moe.num_experts as f64 / d.ep).max(1.0);
                let routed = d.routed_tokens(moe.top_k as f64) * moe_load_imbalance(local, d.ep);
                let fe = moe.moe_ffn_hidden_size as f64;
                let mut op = Op::memory(
                    "moe_act_recompute",
                    routed * act_bytes_per_width(fe / d.etp) * ACT_BYTES,
                    if card.mlp_bias { local } else { 1.0 },
                );
                op.after_sync = true;
                out.push(op);
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
    ops.push(Op::memory(
        "cross_entropy",
        d.tokens() * v * LOSS_FWD_BYTES,
        4.0,
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
