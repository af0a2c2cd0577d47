//! Model cards: the architecture of a decoder-only transformer (dense, GQA, MoE with shared
//! experts and dense-first layers, MLA), as loaded from `profiles/models/*.yaml` or inlined in
//! a plan under `spec.model.card`.

use serde::{Deserialize, Serialize};

use crate::bounds::{self, Bound, Bounded, limits};
use crate::error::FieldError;

/// MLP activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// Gated SiLU: three matrices (gate, up, down).
    Swiglu,
    /// Plain GELU MLP: two matrices (up, down).
    Gelu,
}

/// Normalisation layer kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// RMSNorm: one weight vector.
    Rmsnorm,
    /// LayerNorm: weight and bias vectors.
    Layernorm,
}

/// Router scoring function of a mixture-of-experts layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum RouterKind {
    #[default]
    Softmax,
    /// Sigmoid scores with a per-expert bias for load balancing (DeepSeek-V3).
    Sigmoid,
}

/// Mixture-of-experts settings. Absent for dense models.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<MoeConfig>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MoeConfig {
    /// Routed experts per MoE layer.
    pub num_experts: u32,
    /// Experts each token is routed to.
    pub top_k: u32,
    /// FFN hidden size of one routed expert.
    pub moe_ffn_hidden_size: u64,
    /// Shared experts every token goes through (DeepSeek, Qwen2-MoE); 0 when none.
    #[serde(default)]
    pub shared_experts: u32,
    /// FFN hidden size of one shared expert (defaults to `moeFfnHiddenSize`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_expert_ffn_hidden_size: Option<u64>,
    /// The first k layers are dense (their FFN uses the card's `ffnHiddenSize`).
    #[serde(default)]
    pub dense_layers: u32,
    /// Router scoring function.
    #[serde(default)]
    pub router: RouterKind,
    /// Whether the router has a bias vector (gpt-oss) in addition to its weight matrix.
    #[serde(default)]
    pub router_bias: bool,
    /// Token capacity factor per expert; absent means dropless routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_factor: Option<f64>,
}

/// Multi-head latent attention (DeepSeek-V2/V3). Absent for standard attention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<MlaConfig>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MlaConfig {
    /// Rank of the query down-projection; absent when queries are not compressed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub q_lora_rank: Option<u64>,
    /// Rank of the joint key/value down-projection.
    pub kv_lora_rank: u64,
    /// Per-head query/key dimension without rotary embedding.
    pub qk_nope_head_dim: u64,
    /// Per-head query/key dimension with rotary embedding (the rotary key is shared by heads).
    pub qk_rope_head_dim: u64,
    /// Per-head value dimension.
    pub v_head_dim: u64,
}

/// The architecture of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<ModelCard>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelCard {
    /// Preset name, e.g. `llama3.1-70b` (optional for inline cards).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Transformer layers (decoder blocks), excluding MTP layers.
    pub layers: u32,
    /// Model (residual stream) width.
    pub hidden_size: u64,
    /// FFN hidden size of a dense layer.
    pub ffn_hidden_size: u64,
    /// Query heads.
    pub attention_heads: u32,
    /// Key/value heads (GQA); defaults to `attentionHeads` (plain multi-head attention).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_heads: Option<u32>,
    /// Per-head dimension; defaults to `hiddenSize / attentionHeads` (differs in Qwen3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<u64>,
    /// Vocabulary size (padded as trained).
    pub vocab_size: u64,
    /// Whether the output layer shares the input embedding matrix.
    #[serde(default)]
    pub tied_embeddings: bool,
    /// MLP activation.
    pub activation: Activation,
    /// Normalisation kind.
    pub norm: Norm,
    /// RMSNorm on queries and keys per head (Qwen3).
    #[serde(default)]
    pub qk_norm: bool,
    /// Bias vectors on the QKV and output projections (GPT-3, gpt-oss).
    #[serde(default)]
    pub attention_bias: bool,
    /// Bias vectors on the MLP / expert matrices (GPT-3, gpt-oss).
    #[serde(default)]
    pub mlp_bias: bool,
    /// Learned absolute position embeddings of this many positions (GPT-3); 0 for rotary.
    #[serde(default)]
    pub position_embeddings: u64,
    /// Learned per-head attention sink logits (gpt-oss).
    #[serde(default)]
    pub attention_sinks: bool,
    /// Sliding-window size of the local attention layers (gpt-oss: 128); absent for full attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sliding_window: Option<u64>,
    /// Every n-th layer uses full attention when `slidingWindow` is set (gpt-oss: 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_attention_every: Option<u32>,
    /// Mixture-of-experts settings; absent for dense models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeConfig>,
    /// Multi-head latent attention settings; absent for standard attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mla: Option<MlaConfig>,
    /// Multi-token-prediction layers (DeepSeek-V3: 1); not counted in the headline size.
    #[serde(default)]
    pub mtp_layers: u32,
    /// The gated activation's inputs are clamped (gpt-oss: Megatron-Core
    /// `TransformerConfig.activation_func_clamp_value` 7.0, set by Megatron-Bridge's gpt-oss
    /// provider). Megatron runs the clamp as eager kernels in front of its compiled GLU
    /// (`fusions/fused_bias_geglu.py`, `weighted_bias_quick_geglu_impl`): their time, and a
    /// second saved copy of the activation's input unless `moe_act` is recomputed.
    #[serde(default)]
    pub activation_clamp: bool,
    /// YaRN scaling factor of the rotary embedding of standard (non-MLA) attention with no
    /// mscale pair (gpt-oss: 32, `yarn_rotary_scaling_factor`); absent for plain RoPE. Its
    /// concentration factor 0.1 ln(s) + 1 is not 1, which Transformer Engine's fused RoPE
    /// does not take (`rope_utils.py`: `mscale != 1.0` -> unfused), so the rotary runs as
    /// eager kernels; time only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub yarn_scaling_factor: Option<u32>,
}

/// The card's sizes, bounded (one row per field; [`bounds`] checks them and writes them into
/// the CRD schema).
impl Bounded for ModelCard {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("name", limits::NAME, |m| (&m.name).into()),
        Bound::int("layers", 1, limits::LAYERS, |m| m.layers.into()),
        Bound::int("hiddenSize", 1, limits::HIDDEN, |m| m.hidden_size.into()),
        Bound::int("ffnHiddenSize", 1, limits::FFN, |m| {
            m.ffn_hidden_size.into()
        }),
        Bound::int("attentionHeads", 1, limits::HEADS, |m| {
            m.attention_heads.into()
        }),
        Bound::int("kvHeads", 1, limits::HEADS, |m| m.kv_heads.into()),
        Bound::int("headDim", 1, limits::HIDDEN, |m| m.head_dim.into()),
        Bound::int("vocabSize", 1, limits::VOCAB, |m| m.vocab_size.into()),
        Bound::int("positionEmbeddings", 0, limits::SEQ, |m| {
            m.position_embeddings.into()
        }),
        Bound::int("slidingWindow", 1, limits::SEQ, |m| m.sliding_window.into()),
        Bound::int("fullAttentionEvery", 1, limits::LAYERS, |m| {
            m.full_attention_every.into()
        }),
        Bound::int("mtpLayers", 0, limits::MTP_LAYERS, |m| m.mtp_layers.into()),
        Bound::int("yarnScalingFactor", 1, limits::YARN_SCALING, |m| {
            m.yarn_scaling_factor.into()
        }),
    ];

    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        bounds::check_rows(self, at, Self::BOUNDS)?;
        if let Some(moe) = &self.moe {
            bounds::check(moe, &bounds::path(at, "moe"))?;
        }
        if let Some(mla) = &self.mla {
            bounds::check(mla, &bounds::path(at, "mla"))?;
        }
        Ok(())
    }
}

/// Mixture-of-experts sizes, bounded.
impl Bounded for MoeConfig {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::int("numExperts", 1, limits::EXPERTS, |m| m.num_experts.into()),
        Bound::int("topK", 1, limits::EXPERTS, |m| m.top_k.into()),
        Bound::int("moeFfnHiddenSize", 1, limits::FFN, |m| {
            m.moe_ffn_hidden_size.into()
        }),
        Bound::int("sharedExperts", 0, limits::EXPERTS, |m| {
            m.shared_experts.into()
        }),
        Bound::int("sharedExpertFfnHiddenSize", 1, limits::FFN, |m| {
            m.shared_expert_ffn_hidden_size.into()
        }),
        Bound::int("denseLayers", 0, limits::LAYERS, |m| m.dense_layers.into()),
    ];
}

/// Multi-latent attention sizes, bounded.
impl Bounded for MlaConfig {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::int("qLoraRank", 1, limits::HIDDEN, |m| m.q_lora_rank.into()),
        Bound::int("kvLoraRank", 1, limits::HIDDEN, |m| m.kv_lora_rank.into()),
        Bound::int("qkNopeHeadDim", 1, limits::HIDDEN, |m| {
            m.qk_nope_head_dim.into()
        }),
        Bound::int("qkRopeHeadDim", 1, limits::HIDDEN, |m| {
            m.qk_rope_head_dim.into()
        }),
        Bound::int("vHeadDim", 1, limits::HIDDEN, |m| m.v_head_dim.into()),
    ];
}

/// Whether a decoder layer has a dense MLP or a mixture-of-experts block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerKind {
    Dense,
    Moe,
}

/// The parameters of one decoder layer, split by how Megatron-Core shards them. "Linear" counts
/// are GEMM weight matrices (what FP8 copies and FLOPs apply to); "small" counts are biases,
/// sinks and norm vectors. `_tp` parts are split over tensor parallelism (column-parallel
/// weights and biases, row-parallel weights), `_dup` parts are held whole by every TP rank
/// (row-parallel output biases, norms, MLA down-projections, which Megatron-Core builds as
/// duplicated linears).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LayerParams {
    /// Attention GEMM weights split over TP: Q/K/V (or MLA up-projections) and the output.
    pub attention_linear_tp: u64,
    /// Attention GEMM weights every TP rank holds: MLA's query and key/value down-projections.
    pub attention_linear_dup: u64,
    /// Attention biases split over TP (Q/K/V biases) and per-head attention sinks.
    pub attention_small_tp: u64,
    /// Attention vectors held whole: output-projection bias, Q/K norms, MLA latent norms.
    pub attention_small_dup: u64,
    /// The layer's two norms (before attention, before the MLP).
    pub norms: u64,
    /// Dense MLP (dense layer) or shared experts (MoE layer) GEMM weights, split over TP.
    pub mlp_linear_tp: u64,
    /// Their first-projection biases, split over TP.
    pub mlp_small_tp: u64,
    /// Their output bias, held whole.
    pub mlp_small_dup: u64,
    /// Router weight (and bias, and DeepSeek's expert-score correction bias), held whole by
    /// every TP and EP rank.
    pub router: u64,
    /// Routed experts in this layer (0 for a dense layer).
    pub experts: u32,
    /// Routed experts each token is sent to (0 for a dense layer).
    pub top_k: u32,
    /// GEMM weights of one routed expert, split over expert tensor parallelism (ETP).
    pub expert_linear: u64,
    /// First-projection bias of one routed expert, split over ETP.
    pub expert_small_etp: u64,
    /// Output bias of one routed expert, held whole by every ETP rank.
    pub expert_small_dup: u64,
}

impl LayerParams {
    /// One routed expert's parameters.
    pub fn per_expert(&self) -> u64 {
        self.expert_linear + self.expert_small_etp + self.expert_small_dup
    }

    /// Parameters outside the routed experts (attention, norms, dense MLP or shared experts,
    /// router): the "dense" parameters Megatron shards over DP x CP.
    pub fn non_expert(&self) -> u64 {
        self.attention_linear_tp
            + self.attention_linear_dup
            + self.attention_small_tp
            + self.attention_small_dup
            + self.norms
            + self.mlp_linear_tp
            + self.mlp_small_tp
            + self.mlp_small_dup
            + self.router
    }

    /// All routed experts' parameters.
    pub fn routed_experts(&self) -> u64 {
        self.experts as u64 * self.per_expert()
    }

    /// Every parameter of the layer.
    pub fn total(&self) -> u64 {
        self.non_expert() + self.routed_experts()
    }

    /// Parameters one token goes through: everything but the routed experts it is not sent to.
    pub fn active(&self) -> u64 {
        self.non_expert() + self.top_k as u64 * self.per_expert()
    }

    /// GEMM weights one token goes through (attention, dense MLP or shared experts, top-k
    /// routed experts; router excluded): the `N` of `2 * N` forward FLOPs per token, before
    /// the attention core.
    pub fn active_linear(&self) -> u64 {
        self.attention_linear_tp
            + self.attention_linear_dup
            + self.mlp_linear_tp
            + self.top_k as u64 * self.expert_linear
    }

    /// Non-expert parameters one GPU holds at tensor-parallel size `tp`.
    pub fn non_expert_per_gpu(&self, tp: u32) -> f64 {
        let tp = tp.max(1) as f64;
        (self.attention_linear_tp
            + self.attention_small_tp
            + self.mlp_linear_tp
            + self.mlp_small_tp) as f64
            / tp
            + (self.attention_linear_dup
                + self.attention_small_dup
                + self.norms
                + self.mlp_small_dup
                + self.router) as f64
    }

    /// Routed-expert parameters one GPU holds: `experts / ep` experts, each split over `etp`.
    pub fn experts_per_gpu(&self, ep: u32, etp: u32) -> f64 {
        let local = self.experts as f64 / ep.max(1) as f64;
        local
            * ((self.expert_linear + self.expert_small_etp) as f64 / etp.max(1) as f64
                + self.expert_small_dup as f64)
    }

    /// Non-expert GEMM weights one GPU holds (what Transformer Engine keeps FP8 copies of).
    pub fn non_expert_linear_per_gpu(&self, tp: u32) -> f64 {
        (self.attention_linear_tp + self.mlp_linear_tp) as f64 / tp.max(1) as f64
            + self.attention_linear_dup as f64
    }

    /// Routed-expert GEMM weights one GPU holds.
    pub fn expert_linear_per_gpu(&self, ep: u32, etp: u32) -> f64 {
        self.experts as f64 / ep.max(1) as f64 * self.expert_linear as f64 / etp.max(1) as f64
    }
}

impl ModelCard {
    /// Key/value heads (GQA groups).
    pub fn kv_heads(&self) -> u32 {
        self.kv_heads.unwrap_or(self.attention_heads)
    }

    /// Per-head dimension.
    pub fn head_dim(&self) -> u64 {
        self.head_dim
            .unwrap_or(self.hidden_size / self.attention_heads.max(1) as u64)
    }

    /// Whether layer `i` (0-based) is a mixture-of-experts layer.
    pub fn is_moe_layer(&self, i: u32) -> bool {
        match &self.moe {
            Some(m) => i >= m.dense_layers,
            None => false,
        }
    }

    /// Number of MoE layers among the `layers` decoder layers.
    pub fn moe_layers(&self) -> u32 {
        match &self.moe {
            Some(m) => self.layers.saturating_sub(m.dense_layers),
            None => 0,
        }
    }

    /// Number of vectors a norm layer of width `n` holds: RMSNorm has a weight, LayerNorm a
    /// weight and a bias.
    fn norm_params(&self, n: u64) -> u64 {
        match self.norm {
            Norm::Rmsnorm => n,
            Norm::Layernorm => 2 * n,
        }
    }

    /// Weights of one MLP of hidden size `f`: SwiGLU has gate, up and down matrices (3hf),
    /// GELU up and down (2hf).
    pub fn mlp_linear(&self, f: u64) -> u64 {
        let h = self.hidden_size;
        match self.activation {
            Activation::Swiglu => 3 * h * f,
            Activation::Gelu => 2 * h * f,
        }
    }

    /// Width of the first MLP projection's output (gate and up concatenated for SwiGLU).
    pub fn mlp_fc1_width(&self, f: u64) -> u64 {
        match self.activation {
            Activation::Swiglu => 2 * f,
            Activation::Gelu => f,
        }
    }

    /// Whether the standard attention's rotary embedding runs as eager kernels: YaRN whose
    /// concentration factor 0.1 ln(s) + 1 is not 1 (`yarn_rotary_pos_embedding.py`,
    /// `_yarn_get_concentration_factor` with no mscale pair), which Transformer Engine's fused
    /// RoPE does not take (`rope_utils.py`). MLA applies its own rotary.
    pub fn unfused_rotary(&self) -> bool {
        self.mla.is_none() && self.yarn_scaling_factor.is_some_and(|s| s > 1)
    }

    /// Shared experts' total FFN width (n_shared x their FFN size); 0 without shared experts.
    pub fn shared_expert_ffn(&self) -> u64 {
        match &self.moe {
            Some(m) => {
                m.shared_experts as u64
                    * m.shared_expert_ffn_hidden_size
                        .unwrap_or(m.moe_ffn_hidden_size)
            }
            None => 0,
        }
    }

    /// Kind of decoder layer `i` (0-based).
    pub fn layer_kind(&self, i: u32) -> LayerKind {
        if self.is_moe_layer(i) {
            LayerKind::Moe
        } else {
            LayerKind::Dense
        }
    }

    /// Kind of an MTP module's layer: the kind of the last decoder layer.
    pub fn mtp_layer_kind(&self) -> LayerKind {
        self.layer_kind(self.layers.saturating_sub(1))
    }

    /// Dense layers among the decoder layers (all of them for a dense model).
    pub fn dense_layer_count(&self) -> u32 {
        self.layers - self.moe_layers()
    }

    /// Parameters of one decoder layer of the given kind.
    ///
    /// Standard attention (hidden h, a query heads, g key/value heads, head dim d):
    /// Q h*a*d, K and V h*g*d each, output a*d*h; biases a*d + 2*g*d (+ h on the output);
    /// sinks a; Q/K norms d each. MLA (DeepSeek-V2/V3, q_lora rank r_q, kv_lora rank r_kv,
    /// d_nope, d_rope, d_v): q down h*r_q + norm r_q + q up r_q*a*(d_nope+d_rope) (or a plain
    /// h*a*(d_nope+d_rope) without r_q), kv down h*(r_kv+d_rope) + norm r_kv, kv up
    /// r_kv*a*(d_nope+d_v), output a*d_v*h. MLP: 3hf (SwiGLU) or 2hf (GELU), biases 2f|f and h.
    /// Router: E*h (+E bias for gpt-oss, +E expert-score correction bias for sigmoid routers).
    pub fn layer_params(&self, kind: LayerKind) -> LayerParams {
        let h = self.hidden_size;
        let a = self.attention_heads as u64;
        let mut p = LayerParams {
            norms: 2 * self.norm_params(h),
            ..LayerParams::default()
        };
        if let Some(m) = &self.mla {
            let qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
            match m.q_lora_rank {
                Some(r) => {
                    p.attention_linear_dup += h * r;
                    p.attention_small_dup += self.norm_params(r);
                    p.attention_linear_tp += r * a * qk;
                }
                None => p.attention_linear_tp += h * a * qk,
            }
            p.attention_linear_dup += h * (m.kv_lora_rank + m.qk_rope_head_dim);
            p.attention_small_dup += self.norm_params(m.kv_lora_rank);
            p.attention_linear_tp += m.kv_lora_rank * a * (m.qk_nope_head_dim + m.v_head_dim);
            p.attention_linear_tp += a * m.v_head_dim * h;
            if self.attention_bias {
                p.attention_small_dup += h;
            }
        } else {
            let d = self.head_dim();
            let g = self.kv_heads() as u64;
            p.attention_linear_tp += h * a * d + 2 * h * g * d + a * d * h;
            if self.attention_bias {
                p.attention_small_tp += a * d + 2 * g * d;
                p.attention_small_dup += h;
            }
            if self.qk_norm {
                p.attention_small_dup += 2 * self.norm_params(d);
            }
        }
        if self.attention_sinks {
            p.attention_small_tp += a;
        }
        let (mlp_ffn, moe) = match (kind, &self.moe) {
            (LayerKind::Moe, Some(m)) => (self.shared_expert_ffn(), Some(m)),
            _ => (self.ffn_hidden_size, None),
        };
        if mlp_ffn > 0 {
            p.mlp_linear_tp = self.mlp_linear(mlp_ffn);
            if self.mlp_bias {
                p.mlp_small_tp = self.mlp_fc1_width(mlp_ffn);
                p.mlp_small_dup = h;
            }
        }
        if let Some(m) = moe {
            let e = m.num_experts as u64;
            p.experts = m.num_experts;
            p.top_k = m.top_k;
            p.expert_linear = self.mlp_linear(m.moe_ffn_hidden_size);
            if self.mlp_bias {
                p.expert_small_etp = self.mlp_fc1_width(m.moe_ffn_hidden_size);
                p.expert_small_dup = h;
            }
            p.router = e * h;
            if m.router_bias {
                p.router += e;
            }
            if m.router == RouterKind::Sigmoid {
                p.router += e;
            }
        }
        p
    }

    /// Input embedding: vocabulary (unpadded) plus learned positions, times hidden.
    pub fn embedding_params(&self) -> u64 {
        (self.vocab_size + self.position_embeddings) * self.hidden_size
    }

    /// Output layer (unembedding) V*h, whether or not it is tied to the embedding.
    pub fn output_params(&self) -> u64 {
        self.vocab_size * self.hidden_size
    }

    /// The final norm before the output layer.
    pub fn final_norm_params(&self) -> u64 {
        self.norm_params(self.hidden_size)
    }

    /// One multi-token-prediction module (DeepSeek-V3): a decoder layer of the last layer's
    /// kind, norms of the embedding and of the hidden state (h each), the projection of their
    /// concatenation eh_proj (2h*h) and the module's final norm (h). It shares the embedding
    /// and output layer with the main model.
    pub fn mtp_layer_params(&self) -> u64 {
        let h = self.hidden_size;
        self.layer_params(self.layer_kind(self.layers.saturating_sub(1)))
            .total()
            + 3 * self.norm_params(h)
            + 2 * h * h
    }

    /// Sum of all decoder layers' parameters.
    fn layers_total(&self, f: impl Fn(&LayerParams) -> u64) -> u64 {
        let dense = self.dense_layer_count() as u64;
        let moe = self.moe_layers() as u64;
        dense * f(&self.layer_params(LayerKind::Dense))
            + moe * f(&self.layer_params(LayerKind::Moe))
    }

    /// Headline parameter count: embedding, decoder layers, final norm and output layer (once
    /// when tied). MTP modules are excluded, as the authors' figures (DeepSeek-V3: 671B)
    /// exclude them.
    pub fn total_params(&self) -> u64 {
        let output = if self.tied_embeddings {
            0
        } else {
            self.output_params()
        };
        self.embedding_params()
            + self.layers_total(LayerParams::total)
            + self.final_norm_params()
            + output
    }

    /// Total including the MTP modules (what a DeepSeek-V3 checkpoint holds, minus its
    /// duplicated embedding/head).
    pub fn total_params_with_mtp(&self) -> u64 {
        self.total_params() + self.mtp_layers as u64 * self.mtp_layer_params()
    }

    /// Parameters one token goes through, embedding and output layer included (counted once
    /// when tied): the convention of Mistral's 12.9B (Mixtral 8x7B), Qwen's and DeepSeek's
    /// active figures. MTP excluded.
    pub fn active_params(&self) -> u64 {
        let output = if self.tied_embeddings {
            0
        } else {
            self.output_params()
        };
        self.embedding_params()
            + self.layers_total(LayerParams::active)
            + self.final_norm_params()
            + output
    }

    /// Active parameters without the input embedding table (a lookup, not a matrix product);
    /// the output layer stays. OpenAI's convention for gpt-oss (5.1B active for 120b).
    pub fn active_params_without_embedding_lookup(&self) -> u64 {
        let lookup = if self.tied_embeddings {
            // The tied table still multiplies in the output layer: only positions go.
            self.position_embeddings * self.hidden_size
        } else {
            self.embedding_params()
        };
        self.active_params() - lookup
    }

    /// Check the card: its bounds ([`Bounded`]), then its own consistency; `at` is the path of
    /// the card (e.g. `spec.model.card`).
    pub fn validate(&self, at: &str) -> Result<(), FieldError> {
        bounds::check(self, at)?;
        if let Some(kv) = self.kv_heads
            && !self.attention_heads.is_multiple_of(kv)
        {
            return Err(FieldError::new(
                format!("{at}.kvHeads"),
                format!(
                    "{kv} does not divide attentionHeads {}",
                    self.attention_heads
                ),
            ));
        }
        if self.head_dim.is_none()
            && self.mla.is_none()
            && !self.hidden_size.is_multiple_of(self.attention_heads as u64)
        {
            return Err(FieldError::new(
                format!("{at}.headDim"),
                format!(
                    "hiddenSize {} is not divisible by attentionHeads {}: give headDim explicitly",
                    self.hidden_size, self.attention_heads
                ),
            ));
        }
        if let Some(m) = &self.moe {
            if m.top_k > m.num_experts {
                return Err(FieldError::new(
                    format!("{at}.moe.topK"),
                    format!("{} exceeds numExperts {}", m.top_k, m.num_experts),
                ));
            }
            if m.dense_layers >= self.layers {
                return Err(FieldError::new(
                    format!("{at}.moe.denseLayers"),
                    format!(
                        "{} leaves no MoE layer among {} layers",
                        m.dense_layers, self.layers
                    ),
                ));
            }
            if let Some(c) = m.capacity_factor
                && !capacity_factor_in_range(c)
            {
                return Err(FieldError::new(
                    format!("{at}.moe.capacityFactor"),
                    format!(
                        "must be a number in [{}, {}] (omit it for dropless routing), got {}",
                        MIN_CAPACITY_FACTOR,
                        MAX_CAPACITY_FACTOR,
                        crate::bounds::shown(c)
                    ),
                ));
            }
        }
        Ok(())
    }
}
/// The largest capacity factor a plan (`capacityFactor`, `rankCapacityFactor`) or a model card may give: a
/// rank holding 64 times its balanced load is no longer a capacity limit.
pub const MAX_CAPACITY_FACTOR: f64 = 64.0;
/// The smallest: an expert that may keep 1% of its balanced load drops nearly every token;
/// below it the experts' GEMMs would be priced at a vanishing fraction of a row.
pub const MIN_CAPACITY_FACTOR: f64 = 0.01;

/// Whether a capacity factor (a plan's or a model card's) is in
/// [[`MIN_CAPACITY_FACTOR`], [`MAX_CAPACITY_FACTOR`]] (the layout rules and the card's check).
pub fn capacity_factor_in_range(f: f64) -> bool {
    f.is_finite() && (MIN_CAPACITY_FACTOR..=MAX_CAPACITY_FACTOR).contains(&f)
}
