//! Compute time of one decoder layer (and of the embedding and output layer) for one
//! micro-batch on one GPU: an explicit op list (QKV and output projections, the flash-attention
//! core, MLP or router + grouped experts + shared experts, MLA projections, norms and other
//! element-wise work), each op timed by an [`OpTimer`].
//!
//! The default timer, [`AnalyticTimer`], is a roofline: `max(FLOPs / (peak x efficiency),
//! bytes / (HBM bandwidth x efficiency))` plus per-kernel overhead, where the GEMM efficiency
//! depends on the shape (small and skinny GEMMs run far below peak) and on the precision. The
//! benchmark calibration (`calibrate.rs`) replaces op or whole-layer times with measured ones
//! through the same trait.
//!
//! Everything here is per GPU and per micro-batch, with the layout's sharding applied: TP
//! splits the projections' output (column-parallel) or input (row-parallel) features, sequence
//! parallelism splits the norms' tokens, CP splits the sequence, EP and ETP split the experts.

use crate::hardware::HardwareProfile;
use crate::layout::Layout;
use crate::model::{Activation, LayerKind, ModelCard};
use crate::plan::{Precision, Scenario};
use crate::units::MICROSECOND;

/// Bytes of one BF16 activation element.
pub const ACT_BYTES: f64 = 2.0;
/// Bytes per element that a Transformer Engine FP8 cast moves: read BF16 (2), write the FP8
/// row-wise and column-wise (transposed) copies (1 + 1).
pub const FP8_CAST_BYTES: f64 = 4.0;
/// Flash-attention backward FLOPs per forward FLOP: five matrix products (recomputed QK^T,
/// dV, dP, dQ, dK) against two in the forward pass (Dao 2023, FlashAttention-2, section 3.1).
pub const ATTENTION_BWD_FLOPS: f64 = 2.5;
/// HBM traffic of an element-wise op's backward pass per forward byte (read the saved input
/// and the incoming gradient, write the outgoing gradient).
pub const MEMORY_BWD_BYTES: f64 = 2.0;
/// Vocab-parallel cross-entropy traffic per logit element, forward: read the BF16 logits (2),
/// write and re-read FP32 exponentials for max/sum (4 + 4); Megatron's fused kernel.
pub const LOSS_FWD_BYTES: f64 = 10.0;
/// Backward: read the FP32 softmax (4), write the BF16 logit gradient (2).
pub const LOSS_BWD_BYTES: f64 = 6.0;

/// How an op is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    /// A dense matrix product (cuBLAS/hipBLASLt).
    Gemm,
    /// One grouped GEMM over the local experts.
    GroupedGemm,
    /// The fused (flash) attention core.
    Attention,
    /// Memory-bound element-wise work (norms, activations, residuals, rotary, permutations).
    Memory,
}

/// Which pass of an op.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Forward,
    /// Gradient with respect to the input (GEMM dgrad; the whole backward of other ops).
    Dgrad,
    /// Gradient with respect to the weights (GEMMs only).
    Wgrad,
}

/// One op of a layer, per GPU and micro-batch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Op {
    /// Short name, e.g. `qkv`, `attention`, `fc1`, `experts_fc2`.
    pub name: &'static str,
    pub class: OpClass,
    /// GEMM rows (tokens), output features and reduction depth of one instance.
    pub m: f64,
    pub n: f64,
    pub k: f64,
    /// Instances (local experts of a grouped GEMM); 1 otherwise.
    pub groups: f64,
    /// Forward FLOPs of all instances.
    pub flops: f64,
    /// Forward HBM bytes of memory-bound and attention ops (GEMM operand bytes are derived).
    pub bytes: f64,
    /// Runs on FP8 tensor cores when the job trains in FP8 (Transformer Engine linears).
    pub fp8: bool,
    /// Kernels one forward pass launches.
    pub kernels: f64,
    /// Part of Megatron's selective recomputation (`core_attn`).
    pub selective: bool,
    /// Runs after the MoE dispatcher's host synchronisation (the expert section of a MoE
    /// layer), where the host must re-issue every kernel before the GPU can run it.
    pub after_sync: bool,
}

impl Op {
    /// A GEMM of `groups` instances of (m x k) . (k x n): 2mnk FLOPs each.
    pub fn gemm(name: &'static str, m: f64, n: f64, k: f64, groups: f64, fp8: bool) -> Op {
        Op {
            name,
            class: if groups > 1.0 {
                OpClass::GroupedGemm
            } else {
                OpClass::Gemm
            },
            m,
            n,
            k,
            groups,
            // 2 FLOPs (multiply, add) per multiply-accumulate.
            flops: 2.0 * m * n * k * groups,
            bytes: 0.0,
            fp8,
            kernels: 1.0,
            selective: false,
            after_sync: false,
        }
    }

    /// A memory-bound op moving `bytes` forward in `kernels` kernels.
    pub fn memory(name: &'static str, bytes: f64, kernels: f64) -> Op {
        Op {
            name,
            class: OpClass::Memory,
            m: 0.0,
            n: 0.0,
            k: 0.0,
            groups: 1.0,
            flops: 0.0,
            bytes,
            fp8: false,
            kernels,
            selective: false,
            after_sync: false,
        }
    }

    /// FLOPs of a pass.
    pub fn pass_flops(&self, pass: Pass) -> f64 {
        match (self.class, pass) {
            (_, Pass::Forward) => self.flops,
            (OpClass::Gemm | OpClass::GroupedGemm, _) => self.flops,
            (OpClass::Attention, Pass::Dgrad) => ATTENTION_BWD_FLOPS * self.flops,
            _ => 0.0,
        }
    }
}

/// Fixed-capacity op list (no heap: the projection builds a few of these per call).
#[derive(Debug, Clone, Copy)]
pub struct OpList {
    ops: [Op; OpList::CAPACITY],
    len: usize,
}

impl Default for OpList {
    fn default() -> Self {
        OpList {
            ops: [Op::memory("", 0.0, 0.0); OpList::CAPACITY],
            len: 0,
        }
    }
}

impl OpList {
    pub const CAPACITY: usize = 24;

    pub fn push(&mut self, op: Op) {
        assert!(self.len < Self::CAPACITY, "op list full");
        self.ops[self.len] = op;
        self.len += 1;
    }

    pub fn as_slice(&self) -> &[Op] {
        &self.ops[..self.len]
    }

    pub fn iter(&self) -> impl Iterator<Item = &Op> {
        self.as_slice().iter()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// What a timer knows besides the op: the GPU and the job's precision.
#[derive(Debug, Clone, Copy)]
pub struct TimerContext<'a> {
    pub hardware: &'a HardwareProfile,
    pub precision: Precision,
}

/// Times ops. The analytic roofline is the default; benchmark calibration supplies measured
/// times through the same trait (per op, or per whole layer and pass).
pub trait OpTimer: Sync {
    /// Seconds for one pass of one op.
    fn op_seconds(&self, ctx: &TimerContext, op: &Op, pass: Pass) -> f64;

    /// A measured time for a whole layer pass (forward, dgrad side, wgrad side), overriding
    /// the sum of its ops; `None` (the default) sums the ops.
    fn layer_seconds(&self, _ctx: &TimerContext, _layer: LayerShape, _pass: Pass) -> Option<f64> {
        None
    }
}

/// Roofline with shape- and precision-dependent efficiency from the hardware profile.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnalyticTimer;

impl AnalyticTimer {
    /// GEMM efficiency of one instance of shape (m, n, k): the precision's maximum, times
    /// size/(size + half-size) with size = mnk / 2^30 (ramp-up and tail waves of small GEMMs),
    /// times min-dim/(min-dim + half-dim) (tile under-fill of skinny GEMMs).
    pub fn gemm_efficiency(hw: &HardwareProfile, fp8: bool, m: f64, n: f64, k: f64) -> f64 {
        let e = &hw.efficiency;
        let max = if fp8 { e.gemm_fp8_max } else { e.gemm_bf16_max };
        let size = m * n * k / (1u64 << 30) as f64;
        let mut eff = max * size / (size + e.gemm_half_size_gflop);
        if e.gemm_half_dim > 0.0 {
            let d = m.min(n).min(k);
            eff *= d / (d + e.gemm_half_dim);
        }
        eff
    }
}

impl OpTimer for AnalyticTimer {
    fn op_seconds(&self, ctx: &TimerContext, op: &Op, pass: Pass) -> f64 {
        let hw = ctx.hardware;
        let e = &hw.efficiency;
        let hbm = hw.memory_bandwidth() * e.memory_bound;
        let overhead = e.kernel_overhead_us * MICROSECOND;
        match op.class {
            OpClass::Gemm | OpClass::GroupedGemm => {
                let fp8 = op.fp8 && ctx.precision == Precision::Fp8;
                let peak = hw.peak_flops(if fp8 { Precision::Fp8 } else { Precision::Bf16 });
                let (m, n, k) = match pass {
                    Pass::Forward => (op.m, op.n, op.k),
                    // dX (m x k) = dY (m x n) . W^T (n x k)
                    Pass::Dgrad => (op.m, op.k, op.n),
                    // dW (k x n) = X^T (k x m) . dY (m x n)
                    Pass::Wgrad => (op.k, op.n, op.m),
                };
                let mut eff = Self::gemm_efficiency(hw, fp8, m, n, k);
                if op.class == OpClass::GroupedGemm {
                    eff *= e.grouped_gemm;
                }
                let elem = if fp8 { 1.0 } else { ACT_BYTES };
                // Roofline: operands A (m x k), B (k x n) in the input precision, C (m x n) BF16.
                let operand_bytes = ((m * k + k * n) * elem + m * n * ACT_BYTES) * op.groups;
                let flops = op.pass_flops(pass);
                let mut t = (flops / (peak * eff)).max(operand_bytes / hbm) + overhead * op.kernels;
                if fp8 && pass != Pass::Wgrad {
                    // Quantize the activation input (forward) or the incoming gradient (dgrad);
                    // wgrad reuses both casts.
                    let elems = match pass {
                        Pass::Forward => op.m * op.k,
                        _ => op.m * op.n,
                    } * op.groups;
                    t += elems * FP8_CAST_BYTES / hbm + overhead;
                }
                t
            }
            OpClass::Attention => {
                let (eff, bytes) = match pass {
                    Pass::Forward => (e.attention, op.bytes),
                    Pass::Dgrad => (e.attention_backward(), 2.0 * op.bytes),
                    Pass::Wgrad => return 0.0,
                };
                let flops = op.pass_flops(pass);
                (flops / (hw.peak_flops(Precision::Bf16) * eff)).max(bytes / hbm)
                    + overhead * op.kernels
            }
            OpClass::Memory => {
                let bytes = match pass {
                    Pass::Forward => op.bytes,
                    Pass::Dgrad => MEMORY_BWD_BYTES * op.bytes,
                    Pass::Wgrad => return 0.0,
                };
                if bytes <= 0.0 {
                    return 0.0;
                }
                bytes / hbm + overhead * op.kernels
            }
        }
    }
}

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
    let heads = card.attention_heads as f64;
    let t = d.tp;
    let tok = d.tokens();
    let tok_sp = d.tokens_sp();

    // --- Attention block ---
    let (dqk, dv, rope_dim, kv_heads);
    if let Some(m) = &card.mla {
        dqk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
        dv = m.v_head_dim as f64;
        rope_dim = m.qk_rope_head_dim as f64;
        kv_heads = heads;
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
    } else {
        let hd = card.head_dim() as f64;
        dqk = hd;
        dv = hd;
        rope_dim = hd;
        kv_heads = card.kv_heads() as f64;
        // Column-parallel fused QKV: h -> (a + 2g) d / tp.
        ops.push(Op::gemm(
            "qkv",
            tok,
            (heads + 2.0 * kv_heads) * hd / t,
            h,
            1.0,
            true,
        ));
    }
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
    });
    // Row-parallel output projection: a d_v / tp -> h.
    ops.push(Op::gemm("proj", tok, h, heads * dv / t, 1.0, true));

    // Element-wise work around attention, bytes per token (BF16): input norm (read h,
    // write h) and residual add (read 2h, write h) on the SP shard; rotary on the local
    // query and key heads' rotary dims (read + write); Q/K norms (Qwen3) likewise.
    let mut elementwise = tok_sp * (2.0 * h + 3.0 * h) * ACT_BYTES
        + tok * 2.0 * (heads + kv_heads) * rope_dim / t * ACT_BYTES;
    let mut elementwise_kernels = 4.0;
    if card.qk_norm {
        elementwise += tok * 2.0 * (heads + kv_heads) * dqk / t * ACT_BYTES;
        elementwise_kernels += 2.0;
    }

    // --- MLP block ---
    // Pre-MLP norm and residual add on the SP shard.
    elementwise += tok_sp * (2.0 * h + 3.0 * h) * ACT_BYTES;
    elementwise_kernels += 2.0;
    let act_bytes_per_width = |w: f64| match card.activation {
        // SwiGLU reads gate and up (2w), writes w.
        Activation::Swiglu => 3.0 * w,
        // Bias-GELU reads w, writes w.
        Activation::Gelu => 2.0 * w,
    };
    match (shape.kind, &card.moe) {
        (LayerKind::Moe, Some(moe)) => {
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
            let routed = d.routed_tokens(k) * moe_load_imbalance(local, d.ep);
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
                routed * h * ACT_BYTES * 4.0 + routed * act_bytes_per_width(fe / d.etp) * ACT_BYTES,
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
                elementwise += tok * act_bytes_per_width(shared / t) * ACT_BYTES;
                elementwise_kernels += 1.0;
            }
        }
        _ => {
            let f = card.ffn_hidden_size as f64;
            let fc1 = card.mlp_fc1_width(card.ffn_hidden_size) as f64 / t;
            ops.push(Op::gemm("fc1", tok, fc1, h, 1.0, true));
            ops.push(Op::gemm("fc2", tok, h, f / t, 1.0, true));
            elementwise += tok * act_bytes_per_width(f / t) * ACT_BYTES;
            elementwise_kernels += 1.0;
        }
    }
    ops.push(Op::memory("elementwise", elementwise, elementwise_kernels));
    ops
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

/// Times of one op list, per micro-batch, split the way the schedule needs them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpTimes {
    /// Forward pass.
    pub forward: f64,
    /// Backward with respect to inputs (GEMM dgrad, attention and element-wise backward).
    pub dgrad: f64,
    /// Backward with respect to weights (GEMM wgrad): what zero-bubble schedules defer.
    pub wgrad: f64,
    /// Forward time of the selective-recompute set (the attention core).
    pub selective_forward: f64,
    /// Forward time of the attention core (what context-parallel exchange hides behind).
    pub attention_forward: f64,
    /// Backward time of the attention core.
    pub attention_backward: f64,
    /// Forward GEMM time (what TP communication overlap hides behind).
    pub gemm_forward: f64,
    /// Model FLOPs of the forward pass (GEMMs and attention core; the backward is counted as
    /// twice the forward by the published convention).
    pub model_flops_forward: f64,
    /// Forward GPU time of the ops after the MoE dispatcher's host sync.
    pub after_sync_forward: f64,
    /// Backward (dgrad + wgrad) GPU time of those ops.
    pub after_sync_backward: f64,
    /// Kernel launches of those ops in the forward pass.
    pub after_sync_launches: f64,
}

impl OpTimes {
    /// Time every op of `ops` with `timer`.
    pub fn of(ops: &OpList, timer: &dyn OpTimer, ctx: &TimerContext) -> OpTimes {
        let mut t = OpTimes::default();
        for op in ops.iter() {
            let f = timer.op_seconds(ctx, op, Pass::Forward);
            let dg = timer.op_seconds(ctx, op, Pass::Dgrad);
            let wg = timer.op_seconds(ctx, op, Pass::Wgrad);
            t.forward += f;
            t.dgrad += dg;
            t.wgrad += wg;
            match op.class {
                OpClass::Attention => {
                    t.attention_forward += f;
                    t.attention_backward += dg;
                    t.model_flops_forward += op.flops;
                }
                OpClass::Gemm | OpClass::GroupedGemm => {
                    t.gemm_forward += f;
                    t.model_flops_forward += op.flops;
                }
                OpClass::Memory => {}
            }
            if op.selective {
                t.selective_forward += f;
            }
            if op.after_sync {
                t.after_sync_forward += f;
                t.after_sync_backward += dg + wg;
                // An FP8 GEMM also launches the quantization of its input.
                let quantize = matches!(op.class, OpClass::Gemm | OpClass::GroupedGemm)
                    && op.fp8
                    && ctx.precision == Precision::Fp8;
                t.after_sync_launches += op.kernels
                    * if quantize {
                        1.0 + ctx.hardware.efficiency.fp8_quantize_launches
                    } else {
                        1.0
                    };
            }
        }
        t
    }

    /// Time a layer: a measured whole-layer time from the timer when it has one, else the ops.
    pub fn of_layer(
        card: &ModelCard,
        d: &Dims,
        shape: LayerShape,
        timer: &dyn OpTimer,
        ctx: &TimerContext,
    ) -> OpTimes {
        let ops = layer_ops(card, d, shape);
        let mut t = OpTimes::of(&ops, timer, ctx);
        if let Some(f) = timer.layer_seconds(ctx, shape, Pass::Forward) {
            t.forward = f;
        }
        if let Some(b) = timer.layer_seconds(ctx, shape, Pass::Dgrad) {
            t.dgrad = b;
        }
        if let Some(w) = timer.layer_seconds(ctx, shape, Pass::Wgrad) {
            t.wgrad = w;
        }
        t
    }

    /// Whole backward pass.
    pub fn backward(&self) -> f64 {
        self.dgrad + self.wgrad
    }
}
