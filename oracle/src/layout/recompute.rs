//! Megatron-Core's selective-recompute modules (`--recompute-granularity selective
//! --recompute-modules ...`, `TransformerConfig.recompute_modules` in
//! `megatron/core/transformer/transformer_config.py`): which submodules of a decoder layer drop
//! their saved activations in the forward pass and rerun it in the backward pass. Megatron's
//! default is `[core_attn]`.
//!
//! What each one recomputes (Megatron-Core, `transformer_layer.py`, `moe/experts.py`,
//! `multi_latent_attention.py`, `moe/moe_layer.py`):
//! - `core_attn`: the attention core (normal checkpointing: Q, K, V are kept as its inputs);
//! - `moe_act`: the routed experts' activation function (output-discarding: the fc2 input is
//!   freed and recomputed from the fc1 output);
//! - `layernorm`: the input layernorm and the pre-MLP layernorm where they are separate
//!   modules (output-discarding). With Transformer Engine a standard attention block and a
//!   dense MLP fuse their norm into the first linear (`TELayerNormColumnParallelLinear`, the
//!   norm is an `IdentityOp`), so only MLA's input norm and the MoE block's pre-MLP norm are
//!   recomputed;
//! - `mla_up_proj`: MLA's query/key-value up-projections and the rotary embedding applied to
//!   them (output-discarding: Q, K and V are freed after the attention core);
//! - `mlp`: the dense MLP of dense layers (normal checkpointing: only its input is kept);
//! - `moe`: the whole MoE block, router, dispatch, experts, shared experts and combine (normal
//!   checkpointing: only its input is kept);
//! - `shared_experts`: the MoE block's shared experts (normal checkpointing).

use serde::{Deserialize, Serialize};

/// A submodule Megatron's selective recompute can recompute, spelled as Megatron's
/// `--recompute-modules` spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RecomputeModule {
    /// The attention core (Megatron's default selective recompute).
    CoreAttn,
    /// The routed experts' activation function (its output, the fc2 input, is not kept); needs
    /// a mixture-of-experts model.
    MoeAct,
    /// The layernorms that are separate modules: MLA's input norm and the MoE block's pre-MLP
    /// norm (their outputs are not kept; norms fused into a linear are unaffected).
    Layernorm,
    /// MLA's up-projections and rotary embedding (Q, K, V are not kept); needs multi-latent
    /// attention.
    MlaUpProj,
    /// The dense MLP of dense layers (only its input is kept).
    Mlp,
    /// The whole MoE block (only its input is kept); needs a mixture-of-experts model.
    Moe,
    /// The MoE block's shared experts; needs a mixture-of-experts model.
    SharedExperts,
}

impl RecomputeModule {
    /// Every module, in Megatron's documentation order.
    pub const ALL: [RecomputeModule; 7] = [
        RecomputeModule::CoreAttn,
        RecomputeModule::MoeAct,
        RecomputeModule::Layernorm,
        RecomputeModule::MlaUpProj,
        RecomputeModule::Mlp,
        RecomputeModule::Moe,
        RecomputeModule::SharedExperts,
    ];

    /// The name as Megatron spells it (`moe_act`).
    pub fn as_str(self) -> &'static str {
        match self {
            RecomputeModule::CoreAttn => "core_attn",
            RecomputeModule::MoeAct => "moe_act",
            RecomputeModule::Layernorm => "layernorm",
            RecomputeModule::MlaUpProj => "mla_up_proj",
            RecomputeModule::Mlp => "mlp",
            RecomputeModule::Moe => "moe",
            RecomputeModule::SharedExperts => "shared_experts",
        }
    }

    /// The module of a Megatron name.
    pub fn parse(name: &str) -> Option<RecomputeModule> {
        RecomputeModule::named(name)
    }
}

impl std::fmt::Display for RecomputeModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Megatron submodule name list's element (`--recompute-modules`, `--offload-modules`): the
/// names in Megatron's documentation order, as Megatron spells them.
pub trait SubmoduleName: Copy + Eq + 'static {
    /// Every name, in Megatron's documentation order (at most 8).
    const ALL: &'static [Self];
    /// What one name is, with its article, for errors (`a recompute module`).
    const KIND: &'static str;
    /// The name as Megatron spells it.
    fn as_str(self) -> &'static str;
    /// Its position in [`SubmoduleName::ALL`] (the bit of a set).
    fn index(self) -> u8;

    /// The name of Megatron's spelling `name`.
    fn named(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|m| m.as_str() == name)
    }
}

impl SubmoduleName for RecomputeModule {
    const ALL: &'static [Self] = &RecomputeModule::ALL;
    const KIND: &'static str = "a recompute module";
    fn as_str(self) -> &'static str {
        RecomputeModule::as_str(self)
    }
    fn index(self) -> u8 {
        self as u8
    }
}

/// A set of submodules, as a bit set (cheap to copy through the tuner's hot loops).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Submodules<M>(u8, std::marker::PhantomData<M>);

/// A set of recompute modules.
pub type ModuleSet = Submodules<RecomputeModule>;

impl<M> Default for Submodules<M> {
    fn default() -> Self {
        Submodules(0, std::marker::PhantomData)
    }
}

impl ModuleSet {
    /// Megatron's default, `[core_attn]`.
    pub const DEFAULT: ModuleSet = Submodules(
        1 << RecomputeModule::CoreAttn as u8,
        std::marker::PhantomData,
    );
}

impl<M: SubmoduleName> Submodules<M> {
    /// No module.
    pub const EMPTY: Submodules<M> = Submodules(0, std::marker::PhantomData);

    fn bit(m: M) -> u8 {
        1 << m.index()
    }

    /// The set of a list (duplicates collapse).
    pub fn of(modules: &[M]) -> Submodules<M> {
        Submodules(
            modules.iter().fold(0, |acc, m| acc | Self::bit(*m)),
            std::marker::PhantomData,
        )
    }

    pub fn contains(self, m: M) -> bool {
        self.0 & Self::bit(m) != 0
    }

    pub fn with(self, m: M) -> Submodules<M> {
        Submodules(self.0 | Self::bit(m), std::marker::PhantomData)
    }

    pub fn without(self, m: M) -> Submodules<M> {
        Submodules(self.0 & !Self::bit(m), std::marker::PhantomData)
    }

    pub fn union(self, o: Submodules<M>) -> Submodules<M> {
        Submodules(self.0 | o.0, std::marker::PhantomData)
    }

    /// Whether every module of `self` is in `o`.
    pub fn is_subset(self, o: Submodules<M>) -> bool {
        self.0 & !o.0 == 0
    }

    pub fn intersects(self, o: Submodules<M>) -> bool {
        self.0 & o.0 != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The modules, in Megatron's documentation order.
    pub fn iter(self) -> impl Iterator<Item = M> {
        M::ALL.iter().copied().filter(move |m| self.contains(*m))
    }

    /// The modules as a list, in Megatron's documentation order.
    pub fn to_vec(self) -> Vec<M> {
        self.iter().collect()
    }

    /// Compact form, e.g. `moe_act+layernorm` (the form `primus validate` reads).
    pub fn label(self) -> String {
        self.iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Parse the compact form (`+`, `,` or spaces between names).
    pub fn parse(text: &str) -> Result<Submodules<M>, String> {
        let mut set = Self::EMPTY;
        for name in text
            .split(|c: char| c == '+' || c == ',' || c.is_whitespace())
            .filter(|w| !w.is_empty())
        {
            let m = M::named(name).ok_or_else(|| {
                format!(
                    "{} is not {} ({})",
                    crate::parse::quote(name),
                    M::KIND,
                    M::ALL
                        .iter()
                        .map(|m| m.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })?;
            set = set.with(m);
        }
        if set.is_empty() {
            return Err(format!(
                "names no {}",
                M::KIND.split_once(' ').map_or(M::KIND, |(_, k)| k)
            ));
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sets_keep_megatrons_order() {
        for m in RecomputeModule::ALL {
            assert_eq!(RecomputeModule::parse(m.as_str()), Some(m));
            let json = serde_json::to_string(&m).unwrap();
            assert_eq!(json, format!("\"{}\"", m.as_str()));
        }
        let s = ModuleSet::parse("layernorm+moe_act").unwrap();
        assert_eq!(s.label(), "moe_act+layernorm");
        assert_eq!(ModuleSet::parse("moe_act, layernorm").unwrap(), s);
        assert_eq!(s.len(), 2);
        assert!(ModuleSet::of(&[RecomputeModule::MoeAct]).is_subset(s));
        assert!(!s.is_subset(ModuleSet::DEFAULT));
        assert!(ModuleSet::parse("moe_act+attention").is_err());
        assert!(ModuleSet::parse("").is_err());
    }
}
