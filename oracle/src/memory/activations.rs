//! Activation memory: bytes one decoder layer keeps for its backward pass per micro-batch, and
//! how many micro-batches each pipeline schedule keeps in flight.
//!
//! The per-layer accounting follows Korthikanti et al. 2022, "Reducing Activation Recomputation
//! in Large Transformer Models", section 4, generalised from its GPT regime (GELU MLP of 4h,
//! multi-head attention, dropout, no flash attention, 16-bit activations):
//!   no parallelism                       s*b*h*(34 + 5*a*s/h)
//!   tensor parallel t                    s*b*h*(10 + 24/t + 5*a*s/(h*t))
//!   tensor + sequence parallel           s*b*h*(34 + 5*a*s/h)/t
//!   ... + selective recompute            34*s*b*h/t
//!   full recompute                       2*s*b*h (divided by t with sequence parallelism)
//! Every term below is named after the tensor it counts; with the paper's regime the terms add
//! up to exactly those formulas (tests check it).
//!
//! Megatron-Core's selective recompute modules (`--recompute-modules`, see
//! [`crate::layout::RecomputeModule`]) each drop named terms: `core_attn` the softmax
//! statistics (or scores), `layernorm` the outputs of the separate norms (MLA's input norm, the
//! MoE block's pre-MLP norm), `mla_up_proj` MLA's Q, K and V, `mlp` everything inside a dense
//! MLP but its input, `moe` everything inside the MoE block but its input, `shared_experts` the
//! shared experts' activations, `moe_act` the routed experts' activation output.

use crate::layout::{
    CudaGraphModule, Layout, ModuleSet, OffloadModule, OffloadSet, RecomputeModule, Schedule,
};
use crate::model::{Activation, LayerKind, MlaConfig, ModelCard, MoeConfig};
use crate::precision::Precision;

/// Bytes per element of 16-bit activations (BF16) and of FP32 tensors (softmax statistics,
/// router scores, logits for the loss).
pub use crate::units::{ACT_BYTES, FP32_BYTES};
/// Bytes per element of a dropout mask or a routing map (Korthikanti: 1 byte).
pub const MASK_BYTES: f64 = 1.0;
/// Bytes per element of a linear layer's saved input under FP8 training: Transformer Engine
/// casts GEMM inputs to FP8 and keeps that copy for the weight-gradient GEMM.
pub const FP8_ACT_BYTES: f64 = 1.0;

/// Knobs of the activation model that are not part of a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryOptions {
    /// Fused (flash) attention: no s x s score matrices are stored, only the softmax
    /// log-sum-exp statistics (fp32, one per head and token). On by default: Transformer
    /// Engine / Megatron-Core use fused attention whenever it is available.
    pub flash_attention: bool,
}

impl Default for MemoryOptions {
    fn default() -> Self {
        MemoryOptions {
            flash_attention: true,
        }
    }
}

/// Which dropouts keep memory, from the layout's `attentionDropout` / `hiddenDropout`. PyTorch's
/// dropout with p = 0 returns its input and saves no mask (ATen `dropout`: `p == 0` is the
/// identity), so only a positive probability counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dropout {
    /// Attention dropout: without flash attention its 1-byte mask and the dropped-out
    /// probabilities (Korthikanti's as^2b + 2as^2b); flash attention regenerates the mask.
    pub attention: bool,
    /// Hidden dropout: a 1-byte mask after the attention block and after the MLP of every
    /// layer, and after the embedding on the first stage (Korthikanti's two sbh masks).
    pub hidden: bool,
}

impl Dropout {
    /// Megatron's GPT regime (both 0.1).
    pub const BOTH: Dropout = Dropout {
        attention: true,
        hidden: true,
    };
    /// No dropout (Llama, Qwen, Mixtral, DeepSeek, gpt-oss recipes).
    pub const NONE: Dropout = Dropout {
        attention: false,
        hidden: false,
    };

    pub fn of(l: &Layout) -> Dropout {
        Dropout {
            attention: l.attention_dropout.positive(),
            hidden: l.hidden_dropout.positive(),
        }
    }
}

/// Bytes one layer keeps per token of a micro-batch, grouped by how they divide over the
/// parallel ranks. Per GPU and micro-batch: `tokens * (seq/t_sp + tensor/t + whole +
/// expert/t_sp) + tokens * keys * score / t`, with `tokens = s*b/cp` and `t_sp = t` under
/// sequence parallelism, else 1.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ActivationTerms {
    /// Split over the sequence by sequence parallelism, replicated over TP without it: norm
    /// inputs, inputs of column-parallel linears, dropout masks, router tensors.
    pub seq: f64,
    /// Split over TP (heads, FFN width): Q/K/V, attention output, MLP activations.
    pub tensor: f64,
    /// Held whole by every TP rank: MLA latents gathered over the sequence for the
    /// up-projections.
    pub whole: f64,
    /// Routed-expert tensors, per local token (the EP/ETP split is already applied).
    pub expert: f64,
    /// Attention score matrices (no flash attention), bytes per token per key, split over TP.
    pub score: f64,
}

impl ActivationTerms {
    /// Bytes per micro-batch on one GPU.
    pub fn bytes(&self, tokens: f64, keys: f64, tp: f64, tp_sp: f64) -> f64 {
        tokens * (self.seq / tp_sp + self.tensor / tp + self.whole + self.expert / tp_sp)
            + tokens * keys * self.score / tp
    }
}

/// A layer's terms as they are added: all of them, and those inside a fine-grained offload
/// group the layout offloads (see [`crate::layout::OffloadModule`] for each group's tensors).
struct Terms {
    all: ActivationTerms,
    moved: ActivationTerms,
    offload: OffloadSet,
}

impl Terms {
    /// The terms to add to: `moved` too when `group` is offloaded.
    fn add(&mut self, group: Option<OffloadModule>, f: impl Fn(&mut ActivationTerms)) {
        f(&mut self.all);
        if group.is_some_and(|g| self.offload.contains(g)) {
            f(&mut self.moved);
        }
    }
}

/// The offload modules that move tensors in this layout: the listed ones, less `attn_norm`
/// under an `attn` CUDA graph and `mlp_norm` under an `attn` or `moe_router` one (Megatron
/// disables them there: `transformer_layer.py`, `_set_offload_modules`).
pub fn effective_offload(l: &Layout) -> OffloadSet {
    let mut set = OffloadSet::EMPTY;
    let g = &l.cuda_graph;
    for m in l.offload_set().iter() {
        let skipped = match m {
            OffloadModule::AttnNorm => g.captures(CudaGraphModule::Attn),
            OffloadModule::MlpNorm => {
                g.captures(CudaGraphModule::Attn) || g.captures(CudaGraphModule::MoeRouter)
            }
            _ => false,
        };
        if !skipped {
            set = set.with(m);
        }
    }
    set
}

/// How a layer's activations are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Everything the backward pass needs.
    All,
    /// Everything but the attention core (Korthikanti's selective recompute, Megatron's
    /// default `[core_attn]`).
    Selective,
    /// Everything but what these selective-recompute modules rerun.
    Modules(ModuleSet),
    /// Only the layer's input (full recompute).
    Input,
}

impl Keep {
    /// How a layout keeps its layers' activations (full recompute is per layer: the callers
    /// pick [`Keep::Input`] for the recomputed ones).
    pub fn of(l: &Layout) -> Keep {
        match l.recompute_set() {
            s if s.is_empty() => Keep::All,
            s if s == ModuleSet::DEFAULT => Keep::Selective,
            s => Keep::Modules(s),
        }
    }

    /// The selective-recompute modules (none for [`Keep::All`] and [`Keep::Input`]).
    pub fn modules(self) -> ModuleSet {
        match self {
            Keep::All | Keep::Input => ModuleSet::EMPTY,
            Keep::Selective => ModuleSet::DEFAULT,
            Keep::Modules(m) => m,
        }
    }
}

/// Bytes per element of a saved linear-layer input: 2 (BF16), 1 under FP8.
fn linear_input_bytes(precision: Precision) -> f64 {
    match precision {
        Precision::Bf16 => ACT_BYTES,
        Precision::Fp8 => FP8_ACT_BYTES,
    }
}

/// Bytes per token of the first MLP projection's output (the activation function's input,
/// 16-bit) and of the activation's output (the second projection's input, `lin` bytes), for
/// FFN width `f`: SwiGLU keeps gate and up (2f elements) and their product (f); GELU keeps its
/// input (f) and output (f). With f = 4h, GELU gives Korthikanti's 8sbh + 8sbh.
fn mlp_act(card: &ModelCard, f: u64, lin: f64) -> (f64, f64) {
    let f = f as f64;
    match card.activation {
        Activation::Swiglu => (ACT_BYTES * 2.0 * f, lin * f),
        Activation::Gelu => (ACT_BYTES * f, lin * f),
    }
}

/// Tokens each local token becomes on the expert side: top_k x `load`, the rank's routed
/// copies relative to balanced routing ([`crate::compute::expert_memory_load`]: the capacity
/// factor when padded to it, else 1).
fn expert_copies(card: &ModelCard, load: f64) -> f64 {
    match &card.moe {
        Some(m) => m.top_k as f64 * load,
        None => 0.0,
    }
}

/// The shape of the expert side a layer's activations are counted for: the expert
/// tensor-parallel size (each expert-side token is gathered over it) and the routing load
/// (see `expert_copies`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpertSide {
    pub etp: u32,
    pub load: f64,
    /// The experts' GEMMs run in FP8 under FP8 training ([`crate::layout::GroupedGemm::runs_fp8`]).
    pub fp8_gemms: bool,
}

impl ExpertSide {
    /// The expert side of layout `l` with routing `load`.
    pub fn of(l: &crate::layout::Layout, load: f64) -> ExpertSide {
        ExpertSide {
            etp: l.etp,
            load,
            fp8_gemms: l.moe.grouped_gemm.runs_fp8(),
        }
    }
}

/// Per-token bytes one decoder layer keeps (see [`ActivationTerms`]), its expert side shaped
/// by `experts`; under FP8 the saved inputs of linear layers take 1 byte per element (norm
/// inputs, attention tensors and activation-function inputs stay 16-bit).
pub fn layer_terms(
    card: &ModelCard,
    kind: LayerKind,
    keep: Keep,
    experts: ExpertSide,
    precision: Precision,
    opts: &MemoryOptions,
    dropout: Dropout,
) -> ActivationTerms {
    let (all, _) = layer_terms_offloaded(
        card,
        kind,
        keep,
        experts,
        precision,
        opts,
        dropout,
        OffloadSet::EMPTY,
    );
    all
}

/// [`layer_terms`], and of them the terms inside the fine-grained offload groups of `offload`
/// ([`effective_offload`]), which Megatron copies to the host: (all, offloaded). Tensors below
/// Megatron's `min_offloaded_tensor_size` (1M elements) stay: the softmax statistics and the
/// routing probabilities, a few hundred bytes per token, are counted as kept.
#[allow(clippy::too_many_arguments)]
pub fn layer_terms_offloaded(
    card: &ModelCard,
    kind: LayerKind,
    keep: Keep,
    experts: ExpertSide,
    precision: Precision,
    opts: &MemoryOptions,
    dropout: Dropout,
    offload: OffloadSet,
) -> (ActivationTerms, ActivationTerms) {
    let lin = linear_input_bytes(precision);
    let h = card.hidden_size as f64;
    let mut t = Terms {
        all: ActivationTerms::default(),
        moved: ActivationTerms::default(),
        offload,
    };
    if keep == Keep::Input {
        // Full recompute keeps the layer input only: 2sbh (Korthikanti eq. 3 regime).
        t.all.seq = ACT_BYTES * h;
        return (t.all, t.moved);
    }
    let rc = keep.modules();
    // Hidden dropout masks (1 byte per element), one per residual branch.
    let drop = if dropout.hidden { MASK_BYTES * h } else { 0.0 };
    attention_terms(&mut t, card, rc, lin, drop, opts, dropout.attention);
    // MLP: the pre-MLP norm's input (a separate module, `mlp_norm`, only in MoE layers: a
    // dense MLP fuses its norm into fc1) and the dropout mask.
    let ln2_input = ACT_BYTES * h;
    let mlp_dropout_mask = drop;
    let moe_layer = kind == LayerKind::Moe && card.moe.is_some();
    let norm_group = moe_layer.then_some(OffloadModule::MlpNorm);
    t.add(norm_group, |a| a.seq += ln2_input);
    t.add(None, |a| a.seq += mlp_dropout_mask);
    match (kind, &card.moe) {
        (LayerKind::Moe, Some(m)) => moe_terms(&mut t, card, m, rc, lin, experts),
        _ => dense_mlp_terms(&mut t, card, rc, lin),
    }
    (t.all, t.moved)
}

/// The attention block's terms: its input norm's input, the projections' inputs and outputs
/// (standard or MLA) and the attention core's softmax statistics (or scores). `rc` are the
/// selective-recompute modules, `lin` the bytes of a saved linear input, `drop` the hidden
/// dropout mask bytes per token, `attention_dropout` whether the scores are dropped out.
fn attention_terms(
    t: &mut Terms,
    card: &ModelCard,
    rc: ModuleSet,
    lin: f64,
    drop: f64,
    opts: &MemoryOptions,
    attention_dropout: bool,
) {
    let h = card.hidden_size as f64;
    let a = card.attention_heads as f64;
    // The input norm's input: a separate norm's (`attn_norm`) with MLA, else saved by
    // Transformer Engine's fused LayerNormLinear, inside the `qkv_linear` group.
    let ln1_input = ACT_BYTES * h;
    let attn_dropout_mask = drop;
    let ln1_group = if card.mla.is_some() {
        OffloadModule::AttnNorm
    } else {
        OffloadModule::QkvLinear
    };
    t.add(Some(ln1_group), |x| x.seq += ln1_input);
    t.add(None, |x| x.seq += attn_dropout_mask);
    if let Some(m) = &card.mla {
        mla_terms(t, card, m, rc, lin);
    } else {
        let d = card.head_dim() as f64;
        let g = card.kv_heads() as f64;
        // QKV input 2sbh; Q and K 4sbh and V 2sbh with MHA (GQA shrinks K and V to g heads);
        // the output projection's input 2sbh. The QKV input is the norm output of Transformer
        // Engine's fused LayerNormLinear, which `layernorm` does not recompute.
        let qkv_input = lin * h;
        let q = ACT_BYTES * a * d;
        let k = ACT_BYTES * g * d;
        let v = ACT_BYTES * g * d;
        let proj_input = lin * a * d;
        t.add(Some(OffloadModule::QkvLinear), |x| x.seq += qkv_input);
        if card.qk_norm {
            // QK layernorm (Qwen3): Transformer Engine's RMSNorm saves its input made
            // contiguous and one fp32 rstd per row (`pytorch/ops/basic/rmsnorm.py`,
            // `save_for_backward(x, rstdevs)`): the query, copied by the reshape out of the
            // fused QKV output, and the key view copied by `.contiguous()`, per head
            // (Megatron-Core `attention.py` `get_query_key_value_tensors`). Both run inside
            // the `qkv_linear` offload group; no selective recompute module covers them.
            let qk_norm_inputs = (ACT_BYTES * d + FP32_BYTES) * (a + g);
            t.add(Some(OffloadModule::QkvLinear), |x| {
                x.tensor += qk_norm_inputs
            });
        }
        t.add(Some(OffloadModule::CoreAttn), |x| x.tensor += q + k + v);
        t.add(Some(OffloadModule::AttnProj), |x| x.tensor += proj_input);
    }
    if !rc.contains(RecomputeModule::CoreAttn) {
        if opts.flash_attention {
            // Flash attention keeps the fp32 log-sum-exp per head and query, not the scores
            // (under the offload's minimum tensor size).
            t.add(None, |x| x.tensor += FP32_BYTES * a);
        } else {
            // Softmax output 2as^2b; with dropout also its mask as^2b and the dropped-out
            // probabilities 2as^2b: Korthikanti's 5as^2b.
            let softmax = ACT_BYTES * a;
            let dropout = if attention_dropout {
                (MASK_BYTES + ACT_BYTES) * a
            } else {
                0.0
            };
            t.add(Some(OffloadModule::CoreAttn), |x| {
                x.score += softmax + dropout
            });
        }
    }
}

/// MLA's projection terms (Megatron-Core): the down-projections run on the sequence-parallel
/// input (kept once for both), the latents are normed, then gathered over the sequence for
/// the TP-split up-projections; all of them inside the `qkv_linear` offload group, Q, K and V
/// in `core_attn`'s.
fn mla_terms(t: &mut Terms, card: &ModelCard, m: &MlaConfig, rc: ModuleSet, lin: f64) {
    let h = card.hidden_size as f64;
    let a = card.attention_heads as f64;
    let q_lora = m.q_lora_rank.unwrap_or(0) as f64;
    let kv_lora = m.kv_lora_rank as f64;
    let qk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
    let v = m.v_head_dim as f64;
    let qkv = Some(OffloadModule::QkvLinear);
    // down_input = lin*h, the output of MLA's separate input norm (`layernorm` drops it).
    let down_input = if rc.contains(RecomputeModule::Layernorm) {
        0.0
    } else {
        lin * h
    };
    let latent_norm_inputs = ACT_BYTES * (q_lora + kv_lora);
    let up_inputs = lin * (q_lora + kv_lora);
    t.add(qkv, |x| x.seq += down_input + latent_norm_inputs);
    t.add(qkv, |x| x.whole += up_inputs);
    // q + k + v = 2a(qk + qk + v), the up-projections' outputs after rotary
    // (`mla_up_proj` drops them).
    if !rc.contains(RecomputeModule::MlaUpProj) {
        let q = ACT_BYTES * a * qk;
        let k = ACT_BYTES * a * qk;
        let v_ = ACT_BYTES * a * v;
        t.add(Some(OffloadModule::CoreAttn), |x| x.tensor += q + k + v_);
    }
    let proj_input = lin * a * v;
    t.add(Some(OffloadModule::AttnProj), |x| x.tensor += proj_input);
}

/// The MoE block's terms after its norm: its input, the router, the shared experts and, per
/// local token, the routed experts' side.
fn moe_terms(
    t: &mut Terms,
    card: &ModelCard,
    m: &MoeConfig,
    rc: ModuleSet,
    lin: f64,
    experts: ExpertSide,
) {
    let h = card.hidden_size as f64;
    let whole_block = rc.contains(RecomputeModule::Moe);
    // The MoE block's input is the output of its separate pre-MLP norm: lin*h as the
    // experts' and router's saved input, or ACT_BYTES*h as the input `moe` keeps for
    // its checkpoint; `layernorm` drops it either way.
    let mlp_input = match (rc.contains(RecomputeModule::Layernorm), whole_block) {
        (true, _) => 0.0,
        (false, true) => ACT_BYTES * h,
        (false, false) => lin * h,
    };
    t.add(None, |x| x.seq += mlp_input);
    if whole_block {
        // `moe`: nothing inside the block is kept.
        return;
    }
    let e = m.num_experts as f64;
    // Router: fp32 scores (softmax/sigmoid output), the routing map, top-k probs.
    let router = FP32_BYTES * e + MASK_BYTES * e + FP32_BYTES * m.top_k as f64;
    t.add(None, |x| x.seq += router);
    let shared = card.shared_expert_ffn();
    if shared > 0 && !rc.contains(RecomputeModule::SharedExperts) {
        // shared_act = act_in + act_out of the shared experts' FFN
        // (`shared_experts` drops it).
        let (act_in, act_out) = mlp_act(card, shared, lin);
        t.add(None, |x| x.tensor += act_in + act_out);
    }
    // Expert side, per local token: k copies (x load factor), each gathered over ETP
    // for fc1 (its input h, the `expert_fc1` offload group), the activation of the whole
    // expert FFN (split over ETP, times ETP tokens: ETP cancels) and the routing probability
    // (fp32), which Megatron-Core applies inside the activation function
    // (`core/transformer/moe/experts.py`, weighted SwiGLU), so the combine after fc2
    // keeps no expert output.
    let copies = expert_copies(card, experts.load);
    // The legacy grouped GEMM runs in BF16 whatever the training precision.
    let lin = if experts.fp8_gemms { lin } else { ACT_BYTES };
    let (act_in, act_out) = mlp_act(card, m.moe_ffn_hidden_size, lin);
    // act_out = lin*f per copy, the fc2 input (`moe_act` drops it; Megatron then saves
    // fc2's original input, so nothing remains under FP8 either).
    // A clamped GLU (`activationClamp`, gpt-oss) saves its input twice: the eager clamps
    // keep the first projection's output for their masks and the compiled GLU keeps the
    // clamped concatenation (`fused_bias_geglu.py`, `weighted_bias_quick_geglu_impl`):
    // another act_in per copy, unless `moe_act` recomputes the activation (the clamps run
    // inside its checkpoint, whose input is the one act_in above). Both act_in copies are
    // saved inside the `moe_act` offload group.
    let (act_out, clamped) = if rc.contains(RecomputeModule::MoeAct) {
        (0.0, 0.0)
    } else {
        (act_out, clamp_copy(card, act_in))
    };
    let fc1_input = lin * h * experts.etp.max(1) as f64;
    let prob = FP32_BYTES;
    t.add(Some(OffloadModule::ExpertFc1), |x| {
        x.expert += copies * fc1_input
    });
    t.add(Some(OffloadModule::MoeAct), |x| {
        x.expert += copies * (act_in + clamped)
    });
    t.add(None, |x| x.expert += copies * (act_out + prob));
}

/// The dense MLP's terms after its norm (no offload group: Megatron has none for a dense MLP).
fn dense_mlp_terms(t: &mut Terms, card: &ModelCard, rc: ModuleSet, lin: f64) {
    if rc.contains(RecomputeModule::Mlp) {
        // `mlp`: only the MLP's input is kept, which is the residual stream (ln2_input,
        // the fused norm sits inside fc1): mlp_input + act_in + act_out are dropped.
        return;
    }
    // mlp_input = lin*h, the fused pre-MLP norm's output (unaffected by `layernorm`).
    let mlp_input = lin * card.hidden_size as f64;
    let (act_in, act_out) = mlp_act(card, card.ffn_hidden_size, lin);
    t.add(None, |x| x.seq += mlp_input);
    t.add(None, |x| {
        x.tensor += act_in + clamp_copy(card, act_in) + act_out
    });
}

/// The second copy of the activation's input a clamped GLU keeps (see [`moe_terms`]): `act_in`
/// with `activationClamp`, else 0.
fn clamp_copy(card: &ModelCard, act_in: f64) -> f64 {
    if card.activation_clamp { act_in } else { 0.0 }
}

/// Per-token bytes a layer still holds while its weight-gradient (W) pass is deferred by a
/// zero-bubble schedule: the inputs of its linear layers and the gradients of their outputs
/// (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 2: W needs X and dY).
pub fn wgrad_terms(card: &ModelCard, kind: LayerKind, experts: ExpertSide) -> ActivationTerms {
    let h = card.hidden_size as f64;
    let a = card.attention_heads as f64;
    let mut t = ActivationTerms::default();
    // Attention linears: input (sequence-split) and output-projection output gradient.
    t.seq += ACT_BYTES * h + ACT_BYTES * h;
    if let Some(m) = &card.mla {
        let q_lora = m.q_lora_rank.unwrap_or(0) as f64;
        let kv_lora = m.kv_lora_rank as f64;
        let qk = (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64;
        let v = m.v_head_dim as f64;
        // Up-projection inputs and the latents' gradients.
        t.whole += 2.0 * ACT_BYTES * (q_lora + kv_lora) + ACT_BYTES * m.qk_rope_head_dim as f64;
        // Up-projection output gradients (Q, K_nope, V) and the output projection's input.
        t.tensor += ACT_BYTES * a * (qk + m.qk_nope_head_dim as f64 + v) + ACT_BYTES * a * v;
    } else {
        let d = card.head_dim() as f64;
        let g = card.kv_heads() as f64;
        // QKV output gradient and output-projection input.
        t.tensor += ACT_BYTES * (a * d + 2.0 * g * d) + ACT_BYTES * a * d;
    }
    // MLP linears: fc1 input and fc2 output gradient (sequence-split), fc1 output gradient
    // and fc2 input (TP-split).
    t.seq += ACT_BYTES * h + ACT_BYTES * h;
    match (kind, &card.moe) {
        (LayerKind::Moe, Some(m)) => {
            let shared = card.shared_expert_ffn();
            if shared > 0 {
                let (act_in, act_out) = mlp_act(card, shared, ACT_BYTES);
                t.tensor += act_in + act_out;
            }
            let (act_in, act_out) = mlp_act(card, m.moe_ffn_hidden_size, ACT_BYTES);
            let gathered = ACT_BYTES * h * experts.etp.max(1) as f64;
            t.expert += expert_copies(card, experts.load) * (2.0 * gathered + act_in + act_out);
        }
        _ => {
            let (act_in, act_out) = mlp_act(card, card.ffn_hidden_size, ACT_BYTES);
            t.tensor += act_in + act_out;
        }
    }
    t
}

/// Micro-batches whose activations pipeline rank `stage` holds at its peak, in the schedule's
/// own unit.
///
/// - 1F1B (Megatron-LM `core/pipeline_parallel/schedules.py`,
///   `forward_backward_pipelining_without_interleaving`): `pp - stage - 1` warm-up forwards,
///   then one forward before each backward: `min(pp - stage, m)` micro-batches.
/// - Interleaved (`get_pp_rank_microbatches`): `(pp - stage - 1)*2 + (vpp - 1)*pp` warm-up
///   forwards of model-chunk micro-batches, capped at `m*vpp`, then one more forward before the
///   first backward: `min(warm-up + 1, m*vpp)` chunk-micro-batches, each holding one chunk
///   (1/vpp of the rank's layers).
/// - ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3.1): the same
///   forwards in flight as 1F1B, `min(pp - stage, m)`; see [`deferred_wgrad_microbatches`].
pub fn inflight_microbatches(layout: &Layout, stage: u32, num_microbatches: u32) -> u32 {
    let pp = layout.pp.max(1);
    let m = num_microbatches;
    let stage = stage.min(pp - 1);
    match layout.schedule {
        Schedule::Interleaved => {
            let chunks = layout.chunks();
            let total = m * chunks;
            let warmup = (pp - stage - 1) * 2 + (chunks - 1) * pp;
            if warmup >= total { total } else { warmup + 1 }
        }
        Schedule::OneFOneB | Schedule::ZeroBubble => (pp - stage).min(m),
    }
}

/// Of [`inflight_microbatches`], those in model chunk `chunk`. Megatron's interleaved schedule
/// runs forwards in groups of pp micro-batches per chunk, chunk 0 first
/// (`get_schedule_table`), so at the peak the first chunks hold the most.
pub fn inflight_in_chunk(layout: &Layout, stage: u32, num_microbatches: u32, chunk: u32) -> u32 {
    let n = inflight_microbatches(layout, stage, num_microbatches);
    ChunkSplit::new(layout, n, layout.chunks()).share(chunk)
}

/// How `n` in-flight (chunk-)micro-batches of one rank split over its model chunks, with the
/// divisions done once per rank (the memory model's hot loop asks per chunk).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkSplit {
    interleaved: bool,
    n: u32,
    pp: u32,
    full_cycles: u32,
    rem: u32,
}

impl ChunkSplit {
    pub(crate) fn new(layout: &Layout, n: u32, chunks: u32) -> ChunkSplit {
        let pp = layout.pp.max(1);
        let cycle = pp * chunks.max(1);
        ChunkSplit {
            interleaved: layout.schedule == Schedule::Interleaved,
            n,
            pp,
            full_cycles: n / cycle,
            rem: n % cycle,
        }
    }

    /// In-flight micro-batches of model chunk `chunk`.
    pub(crate) fn share(&self, chunk: u32) -> u32 {
        if self.interleaved {
            self.full_cycles * self.pp + self.rem.saturating_sub(chunk * self.pp).min(self.pp)
        } else if chunk == 0 {
            self.n
        } else {
            0
        }
    }
}

/// Micro-batches whose weight-gradient pass ZB-H1 has deferred on rank `stage` at its peak:
/// stage i postpones up to i W passes into the bubble, which keeps its memory within 1F1B's
/// first-stage peak (Qi et al. 2023, section 3.1, ZB-H1). 0 for the other schedules.
pub fn deferred_wgrad_microbatches(layout: &Layout, stage: u32, num_microbatches: u32) -> u32 {
    let inflight = inflight_microbatches(layout, stage, num_microbatches);
    deferred_wgrad(layout, stage, num_microbatches, inflight)
}

/// [`deferred_wgrad_microbatches`] given the rank's in-flight count.
pub(crate) fn deferred_wgrad(
    layout: &Layout,
    stage: u32,
    num_microbatches: u32,
    inflight: u32,
) -> u32 {
    match layout.schedule {
        Schedule::ZeroBubble => stage.min(num_microbatches.saturating_sub(inflight)),
        _ => 0,
    }
}
