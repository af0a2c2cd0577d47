//! Megatron-Core's fine-grained activation offloading (`--fine-grained-activation-offloading
//! --offload-modules ...`, `TransformerConfig.offload_modules` in
//! `megatron/core/transformer/transformer_config.py`; the manager is
//! `megatron/core/pipeline_parallel/fine_grained_activation_offload.py`, the user guide
//! `docs/user-guide/features/fine_grained_activation_offloading.md`): the tensors autograd saves
//! inside each listed submodule are copied to pinned host memory during the forward pass and
//! copied back before that submodule's backward.
//!
//! Each module's group (what the memory model moves off the GPU,
//! `memory/activations.rs`):
//! - `attn_norm`: the input norm's input, where the norm is a separate module (MLA; a standard
//!   attention block fuses its norm into the QKV linear, an `IdentityOp`, and Megatron skips
//!   it); not with an `attn` CUDA graph (`transformer_layer.py`, `_set_offload_modules`);
//! - `qkv_linear`: what the QKV projection saves: with Transformer Engine's fused
//!   LayerNormLinear the norm's input and output, with MLA the down-projections' input, the
//!   latent norms' inputs and the up-projections' inputs (`attention.py`,
//!   `multi_latent_attention.py`);
//! - `core_attn`: Q, K, V and the softmax statistics the fused attention saves;
//! - `attn_proj`: the output projection's input (needs `core_attn`: it is core attention's
//!   output, which the core's backward needs);
//! - `mlp_norm`: the MoE block's pre-MLP norm input (a dense MLP fuses its norm; with an `attn`
//!   or `moe_router` CUDA graph Megatron skips it in MoE layers);
//! - `expert_fc1`: the routed experts' first projection's input (`moe/experts.py`);
//! - `moe_act`: the routed experts' activation input (the first projection's output, and with
//!   a clamped GLU its second copy).
//!
//! Megatron keeps the last group of each module name on the GPU ("offload margin", so the
//! reload does not stall the backward) and copies one layer in and out at a time: the memory
//! model keeps [`crate::memory::FINE_GRAINED_OFFLOAD_RESIDENT_LAYERS`] layers of offloaded
//! tensors resident. `fused_group_mlp` (the fused grouped MLP's whole input) and `gdp_qkv`
//! (GatedDeltaProduct mixers) are not modelled: a plan cannot name them, and a job offloading
//! them is admitted with a warning naming them (`megatron::UNMODELLED_OFFLOAD_MODULES`).

use serde::{Deserialize, Serialize};

use super::exec::{CudaGraphImpl, CudaGraphModule};
use super::recompute::{SubmoduleName, Submodules};
use super::rules::{LayoutError, broken};
use super::{Layout, RecomputeModule};
use crate::scenario::Scenario;

/// A submodule whose saved activations fine-grained activation offloading moves to the host,
/// spelled as Megatron's `--offload-modules` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum OffloadModule {
    /// The input norm's input (a separate norm only: MLA).
    AttnNorm,
    /// What the QKV projection saves (with a fused norm, the norm's input and output).
    QkvLinear,
    /// Q, K, V and the softmax statistics of the attention core.
    CoreAttn,
    /// The attention output projection's input; needs core_attn.
    AttnProj,
    /// The MoE block's pre-MLP norm input.
    MlpNorm,
    /// The routed experts' first projection's input; needs a mixture-of-experts model.
    ExpertFc1,
    /// The routed experts' activation input; needs a mixture-of-experts model.
    MoeAct,
}

impl OffloadModule {
    /// Every module, in Megatron's documentation order.
    pub const ALL: [OffloadModule; 7] = [
        OffloadModule::AttnNorm,
        OffloadModule::QkvLinear,
        OffloadModule::CoreAttn,
        OffloadModule::AttnProj,
        OffloadModule::MlpNorm,
        OffloadModule::ExpertFc1,
        OffloadModule::MoeAct,
    ];

    /// The name as Megatron spells it (`expert_fc1`).
    pub fn as_str(self) -> &'static str {
        match self {
            OffloadModule::AttnNorm => "attn_norm",
            OffloadModule::QkvLinear => "qkv_linear",
            OffloadModule::CoreAttn => "core_attn",
            OffloadModule::AttnProj => "attn_proj",
            OffloadModule::MlpNorm => "mlp_norm",
            OffloadModule::ExpertFc1 => "expert_fc1",
            OffloadModule::MoeAct => "moe_act",
        }
    }

    /// The module of a Megatron name.
    pub fn parse(name: &str) -> Option<OffloadModule> {
        OffloadModule::named(name)
    }
}

impl SubmoduleName for OffloadModule {
    const ALL: &'static [Self] = &OffloadModule::ALL;
    const KIND: &'static str = "an offload module";
    fn as_str(self) -> &'static str {
        OffloadModule::as_str(self)
    }
    fn index(self) -> u8 {
        self as u8
    }
}

impl std::fmt::Display for OffloadModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of offload modules.
pub type OffloadSet = Submodules<OffloadModule>;

impl OffloadSet {
    /// The routed experts' groups, `expert_fc1` and `moe_act` (MoE layers only; the fused
    /// grouped MLP takes neither).
    pub fn experts() -> OffloadSet {
        OffloadSet::of(&[OffloadModule::ExpertFc1, OffloadModule::MoeAct])
    }
}

impl Layout {
    /// The fine-grained activation offload modules (empty: no fine-grained offloading).
    pub fn offload_set(&self) -> OffloadSet {
        self.offload_modules
            .as_deref()
            .map_or(OffloadSet::EMPTY, OffloadSet::of)
    }

    /// `offloadModules`: the asserts of `TransformerConfig.__post_init__` (Megatron-LM
    /// `transformer_config.py`, fine-grained activation offloading): a non-empty list of
    /// distinct names, `attn_proj` only with `core_attn`, not with layer-level offloading
    /// (`--cpu-offloading-num-layers`), no offload inside a `moe` recompute; with CUDA graphs
    /// the Transformer Engine or full-iteration implementation (the local one only for
    /// `expert_fc1` / `moe_act` with scoped graphs), never the whole MoE block captured. MoE
    /// modules need a mixture-of-experts model.
    pub(super) fn check_offload_modules(&self, s: &Scenario) -> Result<(), LayoutError> {
        const NAME: &str = "offloadModules";
        let Some(list) = &self.offload_modules else {
            return Ok(());
        };
        if list.is_empty() {
            return broken(
                "offload-modules-not-empty",
                NAME,
                || "lists no module (leave offloadModules out for no fine-grained offloading)",
            );
        }
        for (i, m) in list.iter().enumerate() {
            if list[..i].contains(m) {
                return broken("offload-modules-unique", NAME, || {
                    format!("lists {m} twice")
                });
            }
        }
        let set = self.offload_set();
        let moe_modules = OffloadSet::experts();
        if set.intersects(moe_modules) && s.model.moe.is_none() {
            return broken("offload-module-fits-model", NAME, || {
                format!(
                    "{} need a mixture-of-experts model; model {} has none",
                    set.iter()
                        .filter(|m| moe_modules.contains(*m))
                        .map(|m| m.as_str())
                        .collect::<Vec<_>>()
                        .join(" and "),
                    s.model.name
                )
            });
        }
        if set.contains(OffloadModule::AttnProj) && !set.contains(OffloadModule::CoreAttn) {
            return broken(
                "offload-attn-proj-needs-core-attn",
                NAME,
                || "attn_proj needs core_attn: its input is core attention's output, which core attention's backward needs",
            );
        }
        if self.activation_offload_layers > 0 {
            return broken(
                "offload-not-with-layer-offload",
                NAME,
                || "fine-grained activation offloading cannot be combined with layer-level offloading (activationOffloadLayers)",
            );
        }
        if set.intersects(moe_modules) && self.recompute_set().contains(RecomputeModule::Moe) {
            return broken(
                "offload-not-inside-moe-recompute",
                NAME,
                || "cannot offload expert_fc1 or moe_act while recomputeModules has moe (the whole MoE block is checkpointed)",
            );
        }
        let g = &self.cuda_graph;
        if !g.is_none() {
            if g.captures(CudaGraphModule::Moe) && s.model.moe.is_some() {
                return broken(
                    "offload-not-with-moe-graph",
                    NAME,
                    || "fine-grained activation offloading does not support CUDA graphs that capture the whole MoE block",
                );
            }
            if g.implementation == CudaGraphImpl::Local
                && (!set.is_subset(moe_modules) || g.modules.is_empty())
            {
                return broken(
                    "offload-local-graphs",
                    NAME,
                    || "with cudaGraph impl local, fine-grained offloading supports only expert_fc1 and moe_act, with scoped graphs",
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_in_megatrons_order() {
        for m in OffloadModule::ALL {
            assert_eq!(OffloadModule::parse(m.as_str()), Some(m));
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.as_str()));
        }
        let s = OffloadSet::parse("moe_act+expert_fc1").unwrap();
        assert_eq!(s.label(), "expert_fc1+moe_act");
        assert!(OffloadSet::parse("fused_group_mlp").is_err());
        let e = OffloadSet::parse("attention").unwrap_err();
        assert!(
            e.contains("is not an offload module (attn_norm, qkv_linear"),
            "{e}"
        );
    }
}
