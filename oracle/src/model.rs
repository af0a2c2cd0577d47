//! Model cards: the architecture of a decoder-only transformer (dense, GQA, MoE with shared
//! experts and dense-first layers, MLA), as loaded from `profiles/models/*.yaml` or inlined in
//! a plan under `spec.model.card`.

use serde::{Deserialize, Serialize};

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
    #[serde(default)]
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
    #[serde(default)]
    pub capacity_factor: Option<f64>,
}

/// Multi-head latent attention (DeepSeek-V2/V3). Absent for standard attention.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MlaConfig {
    /// Rank of the query down-projection; absent when queries are not compressed.
    #[serde(default)]
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
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelCard {
    /// Preset name, e.g. `llama3.1-70b` (optional for inline cards).
    #[serde(default)]
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
    #[serde(default)]
    pub kv_heads: Option<u32>,
    /// Per-head dimension; defaults to `hiddenSize / attentionHeads` (differs in Qwen3).
    #[serde(default)]
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
    #[serde(default)]
    pub sliding_window: Option<u64>,
    /// Every n-th layer uses full attention when `slidingWindow` is set (gpt-oss: 2).
    #[serde(default)]
    pub full_attention_every: Option<u32>,
    /// Mixture-of-experts settings; absent for dense models.
    #[serde(default)]
    pub moe: Option<MoeConfig>,
    /// Multi-head latent attention settings; absent for standard attention.
    #[serde(default)]
    pub mla: Option<MlaConfig>,
    /// Multi-token-prediction layers (DeepSeek-V3: 1); not counted in the headline size.
    #[serde(default)]
    pub mtp_layers: u32,
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

    /// Check the card's own consistency; `at` is the path of the card (e.g. `spec.model.card`).
    pub fn validate(&self, at: &str) -> Result<(), FieldError> {
        let pos = |name: &str, v: u64| -> Result<(), FieldError> {
            if v == 0 {
                Err(FieldError::new(
                    format!("{at}.{name}"),
                    "must be greater than 0",
                ))
            } else {
                Ok(())
            }
        };
        pos("layers", self.layers as u64)?;
        pos("hiddenSize", self.hidden_size)?;
        pos("ffnHiddenSize", self.ffn_hidden_size)?;
        pos("attentionHeads", self.attention_heads as u64)?;
        pos("vocabSize", self.vocab_size)?;
        if let Some(kv) = self.kv_heads {
            pos("kvHeads", kv as u64)?;
            if self.attention_heads % kv != 0 {
                return Err(FieldError::new(
                    format!("{at}.kvHeads"),
                    format!(
                        "{kv} does not divide attentionHeads {}",
                        self.attention_heads
                    ),
                ));
            }
        }
        if let Some(d) = self.head_dim {
            pos("headDim", d)?;
        } else if self.mla.is_none() && self.hidden_size % self.attention_heads as u64 != 0 {
            return Err(FieldError::new(
                format!("{at}.headDim"),
                format!(
                    "hiddenSize {} is not divisible by attentionHeads {}: give headDim explicitly",
                    self.hidden_size, self.attention_heads
                ),
            ));
        }
        if let Some(m) = &self.moe {
            pos("moe.numExperts", m.num_experts as u64)?;
            pos("moe.topK", m.top_k as u64)?;
            pos("moe.moeFfnHiddenSize", m.moe_ffn_hidden_size)?;
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
                && !(c.is_finite() && c > 0.0)
            {
                return Err(FieldError::new(
                    format!("{at}.moe.capacityFactor"),
                    "must be a positive number (omit it for dropless routing)",
                ));
            }
        }
        if let Some(m) = &self.mla {
            pos("mla.kvLoraRank", m.kv_lora_rank)?;
            pos("mla.qkNopeHeadDim", m.qk_nope_head_dim)?;
            pos("mla.qkRopeHeadDim", m.qk_rope_head_dim)?;
            pos("mla.vHeadDim", m.v_head_dim)?;
        }
        if self.sliding_window == Some(0) {
            return Err(FieldError::new(
                format!("{at}.slidingWindow"),
                "must be greater than 0 (omit it for full attention)",
            ));
        }
        Ok(())
    }
}
