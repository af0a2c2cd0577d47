//! The MoE block's op list under the layout's MoE execution options
//! ([`crate::layout::MoeOptions`]): the router, the routed experts of the busiest
//! expert-parallel rank, the token permutation around the dispatch, and the shared experts;
//! and the load of the busiest rank under the router's balancing.
//!
//! What each option changes here, from Megatron-Core's MoE code
//! (`megatron/core/transformer/moe/`):
//! - `groupedGemm`: `SequentialMLP` (`experts.py`) loops over the local experts in Python, a
//!   whole MLP module per expert (slice, fc1, activation, fc2, bias, copy back:
//!   [`SEQUENTIAL_EXPERT_LAUNCHES`] host launches per expert and linear); `TEGroupedMLP` issues
//!   Transformer Engine's grouped linear (one GEMM per local expert on the device, from one
//!   module call); the legacy `GroupedMLP` calls the grouped_gemm package's `gmm`, which
//!   also issues one GEMM per local expert from C++ (cuBLAS, round-robin on `NUM_STREAM` 4
//!   streams: fanshiqing/grouped_gemm `csrc/grouped_gemm.cu` `CublasGroupedGemm` and
//!   `CublasGroupedGemmVariableK`, the CUTLASS grouped kernel only for an sm80 build's
//!   untransposed forward, which the A100 profile does not distinguish; the ROCm port Primus'
//!   images build, caaatch22/grouped_gemm branch `rocm`, the same loop on hipBLAS);
//! - `permuteFusion`: Transformer Engine's fused permute/unpermute (`moe_utils.py:permute`)
//!   instead of the index/gather/scatter chain: fewer kernels, one pass less;
//! - `routerFusion`: the fused top-k and aux-loss kernels (`router.py`, TE
//!   `fused_topk_with_score_function`): a third of the router's element-wise kernels;
//! - `tokenDispatcher` flex: DeepEP/HybridEP fuse the global permute into the dispatch kernel
//!   (`fused_a2a.py`), so only the expert-side sort remains; allgather permutes the gathered
//!   tokens of the whole TP x EP group (`MoEAllGatherTokenDispatcher`);
//! - `routerDtype`: the scores, top-k and losses in fp32/fp64 (`RouterGatingLinearFunction`
//!   keeps the GEMM in the input dtype);
//! - FP8 recipes pad each expert's token count to 16 (32 for MXFP8) rows
//!   (`get_align_size_for_quantization`);
//! - routing load: [`moe_load_factor`].

use super::*;
use crate::layout::{GroupedGemm, Layout, TokenDispatcher};
use crate::model::MoeConfig;
use crate::units::FP32_BYTES;

/// Host launches of one linear of one expert in Megatron's SequentialMLP: slice the expert's
/// tokens, the GEMM, the bias add, and the copy back into the output.
pub const SEQUENTIAL_EXPERT_LAUNCHES: f64 = 8.0;

/// Coefficient of variation of the tokens routed to one expert in a micro-batch under
/// Megatron's auxiliary load-balancing loss (dropless routing, no forced balance). A
/// training-dynamics figure, not a hardware one. FITTED once on the only public measurement
/// of it, the four forced/dropless pairs of Qwen3-235B-A22B on 256 H100 (EP8, 16K-128K
/// context; yanring/Megatron-MoE-ModelZoo best_practice/qwen3/readme.md, the long-context
/// table: dropless/forced TFLOP/s = 0.80, 0.83, 0.87, 0.92): 1.2 reproduces all four ratios
/// within 1% (the shrinking gap with context length follows from the model, as attention
/// grows and the experts' share shrinks); 0.25, the value before, left the gaps at half.
/// Every published throughput table forces balance instead (`forceLoadBalancing`).
pub const MOE_EXPERT_LOAD_CV: f64 = 1.2;

/// Router element-wise kernels (softmax or sigmoid, top-k, scatter into the routing map,
/// aux-loss and z-loss terms) without and with `--moe-router-fusion` (the GB200 DeepSeek-V3
/// write-up, Megatron-LM `docs/discussions/deepseek-v3-gb200-optimization`: 72 -> 31 router
/// kernels per layer over forward and backward, about a third left per pass here).
pub const ROUTER_KERNELS: f64 = 10.0;
pub const ROUTER_FUSED_KERNELS: f64 = 4.0;

/// The MoE execution options the op list reads, from the layout (a copyable summary).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeExec {
    pub dispatcher: TokenDispatcher,
    pub grouped_gemm: GroupedGemm,
    pub permute_fusion: bool,
    pub router_fusion: bool,
    /// The fused grouped MLP (`moe.fusedGroupedMlp`): the activation, its clamp and the
    /// probability-scaled fc2 bias run inside the grouped GEMMs' epilogues.
    pub fused_mlp: bool,
    /// `--moe-router-force-load-balancing`.
    pub forced: bool,
    /// Capacity factor (None = dropless) and whether inputs are padded to capacity.
    pub capacity: Option<f64>,
    pub pad: bool,
    /// Bytes of one router score element (the input's 2 unless `routerDtype`).
    pub router_bytes: f64,
    /// Rows an expert's token count is padded to under FP8 (0 in BF16).
    pub fp8_align: f64,
}

impl MoeExec {
    pub fn of(s: &Scenario, l: &Layout) -> MoeExec {
        let m = &l.moe;
        let card_capacity = s.model.moe.as_ref().and_then(|c| c.capacity_factor);
        MoeExec {
            dispatcher: m.token_dispatcher,
            grouped_gemm: m.grouped_gemm,
            permute_fusion: m.permute_fusion,
            router_fusion: m.router_fusion,
            fused_mlp: m.fused_grouped_mlp,
            forced: m.force_load_balancing,
            capacity: m.capacity_factor.map(|c| c.get()).or(card_capacity),
            pad: m.pad_to_capacity,
            router_bytes: m.router_dtype.map_or(ACT_BYTES, |d| d.bytes()),
            // The legacy grouped GEMM runs BF16 experts: no FP8 padding.
            fp8_align: match s.training.precision {
                Precision::Fp8 if m.grouped_gemm.runs_fp8() => l.fp8_recipe().expert_align(),
                _ => 0.0,
            },
        }
    }
}

/// Load of the busiest of `ep` expert-parallel ranks relative to the balanced load, each rank
/// holding `local` experts and receiving `copies` routed token copies on average:
/// - padded to capacity: every expert runs exactly its capacity, `capacityFactor` times the
///   balanced load (`moe_utils.py:get_capacity`);
/// - forced balance (`RandomSTE` logits, `moe_utils.py:apply_random_logits`): the copies a
///   rank receives are binomial, CV = 1/sqrt(copies), and the busiest of `ep` exceeds the mean
///   by about sqrt(2 ln ep) standard deviations (Gaussian extreme-value estimate);
/// - auxiliary-loss routing: per-expert loads with CV [`MOE_EXPERT_LOAD_CV`], per-rank CV
///   that over sqrt(local), the same extreme-value estimate;
/// - a capacity factor without padding drops what exceeds capacity: at most `capacityFactor`.
pub fn moe_load_factor(x: &MoeExec, local: f64, ep: f64, copies: f64) -> f64 {
    if let Some(cf) = padded_load(x) {
        return cf;
    }
    let spread = if ep <= 1.0 {
        0.0
    } else {
        (2.0 * ep.ln()).sqrt()
    };
    let imbalance = if x.forced {
        1.0 + spread / copies.max(1.0).sqrt()
    } else {
        1.0 + MOE_EXPERT_LOAD_CV / local.max(1.0).sqrt() * spread
    };
    match x.capacity {
        Some(cf) => imbalance.min(cf),
        None => imbalance,
    }
}

/// Routed copies that reach the busiest GPU's experts per micro-batch, and its local experts.
pub fn busiest_rank(d: &Dims, moe: &MoeConfig) -> (f64, f64) {
    let local = (moe.num_experts as f64 / d.ep).max(1.0);
    let balanced = d.routed_tokens(moe.top_k as f64);
    (
        balanced * moe_load_factor(&d.moe, local, d.ep, balanced),
        local,
    )
}

/// Routed copies one expert-parallel rank's experts hold relative to balanced routing, on
/// average over the layers and micro-batches whose activations the rank keeps: the capacity
/// factor when inputs are padded to it (every expert runs exactly its capacity, the
/// layout's `capacityFactor` or the model card's), else 1. The memory model's figure. The
/// per-layer extremes of [`moe_load_factor`] (the busiest rank of one all-to-all, which sets
/// that layer's time) do not add up in memory: a stage keeps many layers' activations, the
/// ranks' loads of different layers are independent, and their sum is close to balanced.
pub fn expert_memory_load(s: &Scenario, l: &Layout) -> f64 {
    padded_load(&MoeExec::of(s, l)).unwrap_or(1.0)
}

/// The load of every rank when inputs are padded to a capacity: the capacity factor.
fn padded_load(x: &MoeExec) -> Option<f64> {
    match (x.capacity, x.pad) {
        (Some(cf), true) => Some(cf),
        _ => None,
    }
}

/// Expected number of distinct members of a set of `m` experts hit when a token picks `k` of
/// `e` experts uniformly without replacement: 1 - C(e - m, k) / C(e, k) per set (forced and
/// well-balanced routing).
pub fn hit_probability(e: f64, m: f64, k: f64) -> f64 {
    if m <= 0.0 {
        return 0.0;
    }
    if m >= e {
        return 1.0;
    }
    let mut miss = 1.0;
    let mut i = 0.0;
    while i < k {
        miss *= ((e - m - i) / (e - i)).max(0.0);
        i += 1.0;
    }
    1.0 - miss
}

/// The MoE block: router, the busiest GPU's experts, token permutation on both sides of the
/// dispatch, and the shared experts.
pub(super) fn moe_ops(
    card: &ModelCard,
    d: &Dims,
    moe: &MoeConfig,
    ops: &mut OpList,
    ew: &mut Elementwise,
) {
    let x = &d.moe;
    let h = card.hidden_size as f64;
    let t = d.tp;
    let tok = d.tokens();
    let e = moe.num_experts as f64;
    let k = moe.top_k as f64;
    let td = d.tokens_dispatched();
    // Router: replicated linear h -> E on the dispatched tokens (the input dtype), then the
    // softmax (or sigmoid), top-k, and the load-balancing/z losses over the T x E scores in
    // the router dtype: about six passes over them.
    ops.push(Op::gemm("router", td, e, h, 1.0, false).in_part(Part::Router));
    let router_kernels = if x.router_fusion {
        ROUTER_FUSED_KERNELS
    } else {
        ROUTER_KERNELS
    };
    ops.push(
        Op::memory(
            "router_scores",
            td * e * x.router_bytes * 6.0,
            router_kernels,
        )
        .in_part(Part::Router),
    );
    let (routed, local) = busiest_rank(d, moe);
    // FP8 GEMMs pad each expert's rows to the recipe's alignment: half an alignment on
    // average. Work relative to balanced routing (imbalance and padding are not model FLOPs).
    let tokens_per_expert = routed / local + x.fp8_align / 2.0;
    let load = tokens_per_expert * local / d.routed_tokens(k).max(f64::MIN_POSITIVE);
    push_experts(card, d, moe, tokens_per_expert, local, load, ops);
    push_permutation(card, d, moe, routed, local, ops);
    push_eager_expert_work(card, d, moe, routed, local, ops);
    let shared = card.shared_expert_ffn() as f64;
    if shared > 0.0 {
        let fc1s = card.mlp_fc1_width(card.shared_expert_ffn()) as f64 / t;
        ops.push(Op::gemm("shared_fc1", tok, fc1s, h, 1.0, true).in_part(Part::SharedExperts));
        ops.push(
            Op::gemm("shared_fc2", tok, h, shared / t, 1.0, true).in_part(Part::SharedExperts),
        );
        ew.bytes += tok * activation_bytes_per_width(card, shared / t) * ACT_BYTES;
        ew.kernels += 1.0;
    }
}

/// The experts' two grouped GEMMs on the busiest rank.
fn push_experts(
    card: &ModelCard,
    d: &Dims,
    moe: &MoeConfig,
    tokens_per_expert: f64,
    local: f64,
    load: f64,
    ops: &mut OpList,
) {
    let h = card.hidden_size as f64;
    let fe = moe.moe_ffn_hidden_size as f64;
    let fc1 = card.mlp_fc1_width(moe.moe_ffn_hidden_size) as f64 / d.etp;
    // The legacy grouped GEMM runs its experts in BF16 under FP8 training too.
    let fp8 = d.moe.grouped_gemm.runs_fp8();
    let mut fc1_op = Op::gemm("experts_fc1", tokens_per_expert, fc1, h, local, fp8);
    let mut fc2_op = Op::gemm("experts_fc2", tokens_per_expert, h, fe / d.etp, local, fp8);
    // Launches per linear: the sequential loop runs a module per expert (framework calls);
    // Transformer Engine's grouped linear and the legacy grouped GEMM are one call issuing
    // one GEMM per expert from C++.
    let (kernels, host_ops) = match d.moe.grouped_gemm {
        GroupedGemm::Sequential => (
            local * SEQUENTIAL_EXPERT_LAUNCHES,
            local * SEQUENTIAL_EXPERT_LAUNCHES,
        ),
        GroupedGemm::Grouped | GroupedGemm::Legacy => (local, 1.0),
    };
    for op in [&mut fc1_op, &mut fc2_op] {
        op.kernels = kernels;
        op.host_ops = host_ops;
        op.part = Part::Experts;
        op.load = load;
    }
    ops.push(fc1_op);
    ops.push(fc2_op);
}

/// The experts' element-wise work that gpt-oss-style cards add and Megatron runs as eager
/// PyTorch kernels on the busiest rank's routed copies: the clamp in front of a clamped GLU
/// ([`CLAMP_BYTES_PER_WIDTH`]), and with expert biases under Transformer Engine's grouped
/// linear the probability-weighted second-projection bias added per local expert
/// ([`EXPERT_BIAS_BF16_BYTES`], [`EXPERT_BIAS_FP32_BYTES`]; two kernels per expert and a
/// concatenation and cast). The legacy grouped GEMM takes no bias (a layout rule) and the
/// sequential MLP adds it inside each expert's linear. Eager calls: no host time
/// ([`Op::eager`]).
fn push_eager_expert_work(
    card: &ModelCard,
    d: &Dims,
    moe: &MoeConfig,
    routed: f64,
    local: f64,
    ops: &mut OpList,
) {
    let x = &d.moe;
    if x.fused_mlp {
        // The fused grouped MLP applies the clamp and the scaled bias in its epilogues.
        return;
    }
    if card.activation_clamp {
        let fe = moe.moe_ffn_hidden_size as f64 / d.etp;
        ops.push(clamp_op(
            "moe_act_clamp",
            routed * fe,
            clamp_kernels(x, local),
            Part::Experts,
            false,
        ));
    }
    if card.mlp_bias && x.grouped_gemm == GroupedGemm::Grouped {
        let h = card.hidden_size as f64;
        let fp32_probs = x.dispatcher == TokenDispatcher::Flex || x.router_bytes >= FP32_BYTES;
        let per_element = if fp32_probs {
            EXPERT_BIAS_FP32_BYTES
        } else {
            EXPERT_BIAS_BF16_BYTES
        };
        ops.push(
            Op::memory(
                "experts_fc2_bias",
                routed * h * per_element,
                2.0 * local + 2.0,
            )
            .eager()
            .in_part(Part::Experts),
        );
    }
}

/// The eager clamp of a clamped GLU over `elements` of the activation's output width, in
/// `part`: timed over forward and backward ([`CLAMP_BYTES_PER_WIDTH`]), or, for a recompute,
/// its forward rerun ([`CLAMP_FORWARD_BYTES_PER_WIDTH`]).
pub(super) fn clamp_op(
    name: &'static str,
    elements: f64,
    kernels: f64,
    part: Part,
    recompute: bool,
) -> Op {
    let per_width = if recompute {
        CLAMP_FORWARD_BYTES_PER_WIDTH
    } else {
        CLAMP_BYTES_PER_WIDTH
    };
    Op::memory(name, elements * per_width, kernels)
        .eager()
        .in_part(part)
}

/// Kernels of the experts' clamp: per local expert under Megatron's SequentialMLP, which runs
/// the activation per expert, else once over all routed copies.
pub fn clamp_kernels(x: &MoeExec, local: f64) -> f64 {
    match x.grouped_gemm {
        GroupedGemm::Sequential => CLAMP_KERNELS * local,
        _ => CLAMP_KERNELS,
    }
}

/// The token permutation on the source side (before the dispatch, after the combine) and on
/// the expert side (sort by local expert, unsort), with the experts' activation.
fn push_permutation(
    card: &ModelCard,
    d: &Dims,
    moe: &MoeConfig,
    routed: f64,
    local: f64,
    ops: &mut OpList,
) {
    let x = &d.moe;
    let h = card.hidden_size as f64;
    let k = moe.top_k as f64;
    let fe = moe.moe_ffn_hidden_size as f64;
    let td = d.tokens_dispatched();
    // Source side (balanced): permute the token copies before the dispatch (gather: read +
    // write) and un-permute after the combine (read the copies, weighted scatter-add into
    // the output): 3.5 passes over k copies of h. The allgather dispatcher permutes the
    // gathered tokens of the whole TP x EP group; a flex backend permutes inside its dispatch
    // kernel, leaving the combine's weighted sum (1.5 passes); the fused permute saves the
    // separate index and probability passes (3 passes, 2 kernels).
    let (copies, passes, kernels) = match (x.dispatcher, x.permute_fusion) {
        (TokenDispatcher::Flex, _) => (td * k, 1.5, 2.0),
        (TokenDispatcher::Allgather, fused) => {
            (td * d.tp * d.ep, 3.5, if fused { 2.0 } else { 6.0 })
        }
        (TokenDispatcher::Alltoall, true) => (td * k, 3.0, 2.0),
        (TokenDispatcher::Alltoall, false) => (td * k, 3.5, 6.0),
    };
    ops.push(
        Op::memory("moe_permute", copies * h * ACT_BYTES * passes, kernels).in_part(Part::Experts),
    );
    // Expert side (busiest GPU): sort the received copies by local expert and unsort them
    // before the combine (read + write each), and the experts' activation. A sequential MLP
    // runs its activation and the copies in and out per expert; fused sort/unsort kernels
    // replace the chunk sorts.
    // The fused grouped MLP runs the activation in fc1's epilogue (and its backward in fc2's
    // dgrad epilogue): the sorts remain, the activation's pass and kernel go.
    let (activation, activation_kernels) = if x.fused_mlp {
        (0.0, 0.0)
    } else {
        (
            routed * activation_bytes_per_width(card, fe / d.etp) * ACT_BYTES,
            1.0,
        )
    };
    let expert_kernels = match (x.grouped_gemm, x.permute_fusion) {
        (GroupedGemm::Sequential, _) => 2.0 + 3.0 * local,
        (_, true) => 2.0 + activation_kernels,
        (_, false) => 4.0 + activation_kernels,
    };
    ops.push(
        Op::memory(
            "moe_expert_elementwise",
            routed * h * ACT_BYTES * 4.0 + activation,
            expert_kernels,
        )
        .in_part(Part::Experts),
    );
}
