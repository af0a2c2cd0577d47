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
use crate::precision::Precision;
use crate::scenario::Scenario;
use crate::units::MICROSECOND;

mod moe;
mod ops;

pub use moe::*;
pub use ops::*;

/// Bytes of one BF16 activation element.
pub use crate::units::ACT_BYTES;
/// Bytes per element that a Transformer Engine FP8 cast moves: read BF16 (2), write the FP8
/// row-wise and column-wise (transposed) copies (1 + 1).
pub const FP8_CAST_BYTES: f64 = 4.0;
/// Flash-attention backward FLOPs per forward FLOP: five matrix products (recomputed QK^T,
/// dV, dP, dQ, dK) against two in the forward pass (Dao 2023, FlashAttention-2, section 3.1).
pub const ATTENTION_BWD_FLOPS: f64 = 2.5;
/// The head dimension the hardware profiles' attention efficiencies are stated for
/// (`efficiency.attention`, `attentionBackward`: flash attention at head dim 128).
pub const ATTENTION_PROFILE_HEAD_DIM: f64 = 128.0;
/// Flash attention at a smaller head dimension, measured: cuDNN's BF16 attention on H100 at
/// sequence 4K (FlashAttention-3 paper, Shah et al. 2024, arXiv 2407.08608, the forward and
/// backward speed figures per head dimension): forward 408 TFLOP/s at head dim 64 against
/// 609 at 128, backward 417 against 499. [`attention_head_dim_factor`] turns them into a law.
pub const ATTENTION_D64_TFLOPS_FWD: f64 = 408.0;
pub const ATTENTION_D128_TFLOPS_FWD: f64 = 609.0;
pub const ATTENTION_D64_TFLOPS_BWD: f64 = 417.0;
pub const ATTENTION_D128_TFLOPS_BWD: f64 = 499.0;

/// Attention efficiency at head dimension `d` relative to the profile's head dim 128. Per
/// scored (query, key) pair a flash-attention kernel does 4d matrix FLOPs (QK^T and PV; the
/// backward 2.5 times as many) and a fixed amount of softmax work (max, exponential, sum,
/// rescale) that does not shrink with d; with that work worth `c` head-dimension units, the
/// time per pair goes as d + c and the FLOP efficiency as d / (d + c). `c` follows from the
/// measured ratio at head dim 64 ([`ATTENTION_D64_TFLOPS_FWD`] and the rest): r = 64 (128 + c)
/// / (128 (64 + c)), so c = 8192 (1 - r) / (128 r - 64): about 124 forward, 31 backward (the
/// backward's five matrix products outweigh its softmax work). At 128 and above the profile's
/// figures hold (factor 1: larger heads measure no faster there, cuDNN 581 TFLOP/s at 256);
/// an unknown head dimension (0) also keeps them.
pub fn attention_head_dim_factor(d: f64, pass: Pass) -> f64 {
    if d <= 0.0 || d >= ATTENTION_PROFILE_HEAD_DIM {
        return 1.0;
    }
    let r = match pass {
        Pass::Forward => ATTENTION_D64_TFLOPS_FWD / ATTENTION_D128_TFLOPS_FWD,
        Pass::Dgrad | Pass::Wgrad => ATTENTION_D64_TFLOPS_BWD / ATTENTION_D128_TFLOPS_BWD,
    };
    let (base, measured) = (ATTENTION_PROFILE_HEAD_DIM, ATTENTION_PROFILE_HEAD_DIM / 2.0);
    let c = base * measured * (1.0 - r) / (base * r - measured);
    d * (base + c) / (base * (d + c))
}

/// HBM traffic of an element-wise op's backward pass per forward byte (read the saved input
/// and the incoming gradient, write the outgoing gradient).
pub const MEMORY_BWD_BYTES: f64 = 2.0;
/// Vocab-parallel cross-entropy traffic per logit element, forward: read the BF16 logits (2),
/// write and re-read FP32 exponentials for max/sum (4 + 4); Megatron's fused kernel.
pub const LOSS_FWD_BYTES: f64 = 10.0;
/// Backward: read the FP32 softmax (4), write the BF16 logit gradient (2).
pub const LOSS_BWD_BYTES: f64 = 6.0;
/// The unfused vocab-parallel cross-entropy (Megatron without `--cross-entropy-loss-fusion`,
/// `tensor_parallel/cross_entropy.py`), per logit element over forward and backward: the FP32
/// cast (read 2, write 4), max (4), subtract, exp and divide in place (8 each), sum (4): 38;
/// backward, the gradient scaled in place (8) and cast back to BF16 (6): 14. Timed as one
/// memory op, whose backward moves [`MEMORY_BWD_BYTES`] per forward byte: 52 / 3 forward.
pub const LOSS_UNFUSED_BYTES: f64 = 52.0 / 3.0;
/// Eager rotary embedding (Megatron-Core `rope_utils.py`, `_apply_rotary_pos_emb_bshd`: the
/// path of YaRN with a concentration factor other than 1, [`crate::model::ModelCard::unfused_rotary`]),
/// bytes per rotated element over forward and backward beyond the fused kernel's: the forward
/// negates and concatenates the rotated halves, multiplies by the cosine and the sine, adds
/// and concatenates with the pass-through part (12 reads and writes of 2 bytes: 24), the
/// backward as many (24); the fused kernel reads and writes once each way (4 + 8 as a memory
/// op): 36 more, charged as one memory op (its backward at [`MEMORY_BWD_BYTES`]): 36 / 3
/// forward.
pub const ROTARY_UNFUSED_EXTRA_BYTES: f64 = 36.0 / 3.0;
/// Kernels of the eager rotary's forward per rotated tensor (query, key): negate, concatenate,
/// two products, sum, concatenate.
pub const ROTARY_UNFUSED_KERNELS: f64 = 6.0;
/// The eager clamp in front of a clamped GLU (`fused_bias_geglu.py`,
/// `weighted_bias_quick_geglu_impl`: `chunk`, two `clamp`s, `cat`), bytes per element of the
/// activation's output width F (the first projection is 2F wide): forward the two clamps read
/// and write F each and the concatenation 2F (16 bytes), backward each clamp's gradient reads
/// the gradient and the input and writes F, and the chunk's gradient is a concatenation of 2F
/// (20 bytes); charged as one memory op (its backward at [`MEMORY_BWD_BYTES`]): 36 / 3
/// forward. A recompute of the activation reruns the forward's 16.
pub const CLAMP_BYTES_PER_WIDTH: f64 = 36.0 / 3.0;
pub const CLAMP_FORWARD_BYTES_PER_WIDTH: f64 = 16.0;
/// Kernels of the clamp's forward: two clamps and the concatenation.
pub const CLAMP_KERNELS: f64 = 3.0;
/// The routed experts' second-projection bias weighted by the routing probability, which
/// Megatron-Core's `TEGroupedMLP._apply_bias` adds per local expert in Python
/// (`experts.py`: `cat([t + b * p for each expert's split])`, then a cast to the activation
/// dtype), bytes per routed token copy and hidden element over forward and backward. BF16
/// probabilities: forward `b * p` written (2), the sum reads 4 and writes 2, the concatenation
/// reads and writes 4 (12); backward about 16 (the gradients of the sum, of `b` and of `p`):
/// 28. FP32 probabilities (the flex dispatchers cast them, `token_dispatcher.py`: "DeepEP /
/// HybridEP only supports float32 probs"; or `routerDtype` fp32): the products, sums and the
/// concatenation in FP32 and a cast back, forward 28, backward about 40: 68. Charged as one
/// memory op (its backward at [`MEMORY_BWD_BYTES`]): a third of each, forward.
pub const EXPERT_BIAS_BF16_BYTES: f64 = 28.0 / 3.0;
pub const EXPERT_BIAS_FP32_BYTES: f64 = 68.0 / 3.0;
/// Kernels of the fused cross-entropy's forward.
pub const LOSS_FUSED_KERNELS: f64 = 4.0;
/// Kernels of the unfused cross-entropy's forward (cast, max, subtract, gather, exp, sum,
/// log, divide).
pub const LOSS_UNFUSED_KERNELS: f64 = 8.0;

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

/// The parts of a decoder layer whose host cost differs: the capture scopes of Megatron's
/// per-layer CUDA graphs (`--cuda-graph-modules`: attn, mlp, moe_router, moe) and, in a MoE
/// layer, the side of the token dispatcher's host synchronisation each runs on (everything
/// but the routed experts runs before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// The attention block (projections, attention core, norms, residuals, rotary).
    Attention,
    /// The dense MLP.
    Mlp,
    /// The MoE block's shared experts.
    SharedExperts,
    /// The router and the dispatcher's preprocessing (up to its host synchronisation).
    Router,
    /// The routed experts with their permutation, dispatch and combine (after the sync).
    Experts,
}

impl Part {
    pub const COUNT: usize = 5;

    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether the part runs after the MoE dispatcher's host synchronisation.
    pub fn after_sync(self) -> bool {
        self == Part::Experts
    }
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
    /// GEMM rows (tokens), output features and reduction depth of one instance; an attention
    /// core's tokens in `m` and its head dimension in `k`.
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
    /// Framework-level (Python, PyTorch dispatch) calls that launch them: each costs the host
    /// `cpuLaunchUs`; kernels beyond them are launched from library code (a grouped GEMM's
    /// per-expert GEMMs) at `libraryLaunchUs` each.
    pub host_ops: f64,
    /// Part of Megatron's selective recomputation (`core_attn`).
    pub selective: bool,
    /// The part of the layer the op belongs to: what a CUDA-graph scope captures, and whether
    /// it runs before or after the MoE dispatcher's host synchronisation.
    pub part: Part,
    /// Work of this GPU relative to balanced routing (the busiest expert-parallel rank's
    /// load factor, already folded into `m` and `flops` of expert GEMMs); 1 otherwise.
    /// Model FLOPs count the balanced work: `flops / load`.
    pub load: f64,
    /// Of an attention core's FLOPs, the fraction in unmasked (non-causal) blocks, timed at
    /// the profile's `attentionUnmaskedGain`; 0 for every other op.
    pub unmasked: f64,
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
            host_ops: 1.0,
            selective: false,
            part: Part::Attention,
            load: 1.0,
            unmasked: 0.0,
        }
    }

    /// The same op in another part of the layer.
    pub fn in_part(mut self, part: Part) -> Op {
        self.part = part;
        self
    }

    /// The same op issued as single PyTorch element-wise calls (a few microseconds of host
    /// time each), not the framework-level calls `cpuLaunchUs` prices: GPU time and kernel
    /// overhead, no host time in the MoE layer's host-bound sections.
    pub fn eager(self) -> Op {
        Op {
            host_ops: 0.0,
            ..self
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
            host_ops: kernels,
            selective: false,
            part: Part::Attention,
            load: 1.0,
            unmasked: 0.0,
        }
    }

    /// Model FLOPs of the forward pass: the work of balanced routing (`flops / load`).
    pub fn model_flops(&self) -> f64 {
        self.flops / self.load.max(1.0)
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

/// Bounded op list: one allocation of [`OpList::CAPACITY`] ops, filled without initialising
/// the rest (a fixed array of 24 ops was 3 KB to initialise and to move for every layer the
/// projection costs: a tenth of a DeepSeek-V3 tune).
#[derive(Debug, Clone)]
pub struct OpList {
    ops: Vec<Op>,
}

impl Default for OpList {
    fn default() -> Self {
        OpList {
            ops: Vec::with_capacity(OpList::CAPACITY),
        }
    }
}

impl OpList {
    pub const CAPACITY: usize = 24;

    pub fn push(&mut self, op: Op) {
        assert!(self.ops.len() < Self::CAPACITY, "op list full");
        self.ops.push(op);
    }

    pub fn as_slice(&self) -> &[Op] {
        &self.ops
    }

    pub fn iter(&self) -> impl Iterator<Item = &Op> {
        self.as_slice().iter()
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// What a timer knows besides the op: the GPU and the job's precision.
#[derive(Debug, Clone, Copy)]
pub struct TimerContext<'a> {
    pub hardware: &'a HardwareProfile,
    pub precision: Precision,
    /// The FP8 scaling recipe (with precision fp8): how many kernels quantize a GEMM input.
    pub fp8_recipe: crate::backend::Fp8Recipe,
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

    /// The topology the collectives run on: the analytic one (the default), or one whose
    /// scale-up links carry measured per-collective corrections (benchmark calibration,
    /// [`crate::collectives::LinkCalibration`]).
    fn topology(&self, analytic: crate::collectives::Topology) -> crate::collectives::Topology {
        analytic
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
            // A GEMM fills at least one row of a tile: a fraction of a row (an expert's
            // average load under a tiny capacity) is timed as one.
            let d = m.min(n).min(k).max(1.0);
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
                // `k` holds the head dimension (the mean of query/key and value).
                let eff = eff * attention_head_dim_factor(op.k, pass);
                // The causal share at the profile's (causal) efficiency, the unmasked share
                // at `attentionUnmaskedGain` times it.
                let u = op.unmasked.clamp(0.0, 1.0);
                let flops = op.pass_flops(pass) * ((1.0 - u) + u / e.attention_unmasked_gain());
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

/// One part of a layer: its GPU time per pass and what the host issues for it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PartTimes {
    pub forward: f64,
    pub backward: f64,
    /// Framework-level calls of the forward pass.
    pub host_ops: f64,
    /// Library kernel launches of the forward pass.
    pub library: f64,
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
    /// Model FLOPs of the forward pass (GEMMs and attention core, balanced routing; the
    /// backward is counted as twice the forward by the published convention).
    pub model_flops_forward: f64,
    /// Forward GPU time per [`Part`].
    pub part_forward: [f64; Part::COUNT],
    /// Backward (dgrad + wgrad) GPU time per [`Part`].
    pub part_backward: [f64; Part::COUNT],
    /// Framework-level calls per [`Part`] in the forward pass.
    pub part_host_ops: [f64; Part::COUNT],
    /// Kernels per [`Part`] launched from library code in the forward pass (a grouped GEMM's
    /// per-expert GEMMs, FP8 GEMMs' input quantization).
    pub part_library: [f64; Part::COUNT],
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
                    t.model_flops_forward += op.model_flops();
                }
                OpClass::Gemm | OpClass::GroupedGemm => {
                    t.gemm_forward += f;
                    t.model_flops_forward += op.model_flops();
                }
                OpClass::Memory => {}
            }
            if op.selective {
                t.selective_forward += f;
            }
            let i = op.part.index();
            t.part_forward[i] += f;
            t.part_backward[i] += dg + wg;
            // An FP8 GEMM also launches the quantization of its input.
            let quantize = matches!(op.class, OpClass::Gemm | OpClass::GroupedGemm)
                && op.fp8
                && ctx.precision == Precision::Fp8;
            t.part_host_ops[i] += op.host_ops;
            t.part_library[i] += (op.kernels - op.host_ops).max(0.0)
                + if quantize {
                    op.host_ops * ctx.fp8_recipe.quantize_launches()
                } else {
                    0.0
                };
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

    /// Forward GPU time, backward GPU time, and forward framework calls and library launches
    /// of one part.
    pub fn part(&self, p: Part) -> PartTimes {
        let i = p.index();
        PartTimes {
            forward: self.part_forward[i],
            backward: self.part_backward[i],
            host_ops: self.part_host_ops[i],
            library: self.part_library[i],
        }
    }
}
