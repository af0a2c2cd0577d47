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

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::{Layout, Recompute};

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

/// A layer-ID list as Primus spells it (`0,1,2`).
pub(crate) fn id_list(ids: Option<&[u32]>) -> String {
    ids.unwrap_or_default()
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The layers of one model chunk that full recompute recomputes, as runs of consecutive
/// decoder layers in order ([`Layout::recomputed_runs`]).
#[derive(Debug, Clone)]
pub enum RecomputedRuns<'a> {
    /// One run (or none): Megatron's block method, the chunk's first layers.
    Block(Option<Range<u32>>),
    /// Primus' layer IDs (ascending) that fall in `end`'s chunk, from `ids[0]`.
    Ids { ids: &'a [u32], end: u32 },
}

impl Iterator for RecomputedRuns<'_> {
    type Item = Range<u32>;

    fn next(&mut self) -> Option<Range<u32>> {
        match self {
            RecomputedRuns::Block(run) => run.take(),
            RecomputedRuns::Ids { ids, end } => {
                let first = *ids.first().filter(|&&i| i < *end)?;
                let mut last = first;
                let mut taken = 1;
                while let Some(&i) = ids.get(taken) {
                    if i != last + 1 || i >= *end {
                        break;
                    }
                    last = i;
                    taken += 1;
                }
                *ids = &ids[taken..];
                Some(first..last + 1)
            }
        }
    }
}

impl Layout {
    /// The decoder layers of `range` (one model chunk's) that full recompute recomputes, as
    /// runs of consecutive layers: with Primus' `recomputeLayerIds` exactly the listed ones
    /// (`recompute_layer_patches.py` checkpoints a layer iff its global index is listed), else
    /// Megatron's block method, the chunk's first `recomputeLayers` (0 = all) layers
    /// (`TransformerBlock._checkpointed_forward`); none without full recompute.
    pub fn recomputed_runs(&self, range: Range<u32>) -> RecomputedRuns<'_> {
        if self.recompute != Recompute::Full {
            return RecomputedRuns::Block(None);
        }
        match self.recompute_layer_ids.as_deref() {
            Some(ids) => {
                let from = ids.partition_point(|&i| i < range.start);
                RecomputedRuns::Ids {
                    ids: &ids[from..],
                    end: range.end,
                }
            }
            None => {
                let end = match self.recompute_layers {
                    0 => range.end,
                    k => range.start.saturating_add(k).min(range.end),
                };
                Some(range.start..end)
                    .filter(|r| !r.is_empty())
                    .map_or(RecomputedRuns::Block(None), |r| {
                        RecomputedRuns::Block(Some(r))
                    })
            }
        }
    }

    /// Layers of `range` that full recompute recomputes.
    pub fn recomputed_count(&self, range: Range<u32>) -> u32 {
        self.recomputed_runs(range).map(|r| r.end - r.start).sum()
    }

    /// Whether MTP depth `depth` (of a model of `layers` decoder layers) is recomputed: only
    /// by Primus' layer IDs (`layers + depth`); Megatron's block method leaves MTP alone in
    /// this model.
    pub fn recomputes_mtp_depth(&self, layers: u32, depth: u32) -> bool {
        self.recompute == Recompute::Full
            && self
                .recompute_layer_ids
                .as_deref()
                .is_some_and(|ids| ids.binary_search(&(layers + depth)).is_ok())
    }
}

#[cfg(test)]
mod runs_tests {
    use super::*;

    fn full(layers: u32, ids: Option<Vec<u32>>) -> Layout {
        Layout {
            recompute: Recompute::Full,
            recompute_layers: layers,
            recompute_layer_ids: ids,
            ..Layout::default()
        }
    }

    #[test]
    fn block_method_recomputes_the_chunks_first_layers() {
        let runs: Vec<_> = full(2, None).recomputed_runs(10..14).collect();
        assert_eq!(runs, vec![10..12]);
        let runs: Vec<_> = full(0, None).recomputed_runs(10..14).collect();
        assert_eq!(runs, vec![10..14]);
        let runs: Vec<_> = full(9, None).recomputed_runs(10..14).collect();
        assert_eq!(runs, vec![10..14]);
        let mut none = full(2, None);
        none.recompute = Recompute::Selective;
        assert_eq!(none.recomputed_runs(10..14).count(), 0);
    }

    #[test]
    fn layer_ids_recompute_exactly_the_listed_layers_of_the_chunk() {
        // Primus' DeepSeek-V3 MI355X list (examples/megatron/configs/MI355X/
        // deepseek_v3-FP8-pretrain.yaml) over chunks of four layers.
        let l = full(
            0,
            Some(vec![0, 3, 4, 7, 8, 11, 12, 15, 19, 23, 31, 32, 35, 36]),
        );
        let runs = |r: Range<u32>| l.recomputed_runs(r).collect::<Vec<_>>();
        assert_eq!(runs(0..4), vec![0..1, 3..4]);
        assert_eq!(runs(4..8), vec![4..5, 7..8]);
        assert_eq!(runs(2..9), vec![3..5, 7..9]);
        assert_eq!(runs(16..19), vec![]);
        assert_eq!(runs(30..40), vec![31..33, 35..37]);
        assert_eq!(l.recomputed_count(0..61), 14);
        assert_eq!(l.recomputed_count(24..31), 0);
        assert!(!l.recomputes_mtp_depth(61, 0));
        let mtp = full(0, Some(vec![1, 61]));
        assert!(mtp.recomputes_mtp_depth(61, 0));
        assert!(!mtp.recomputes_mtp_depth(61, 1));
        // IDs past the decoder do not count as decoder layers.
        assert_eq!(mtp.recomputed_count(0..61), 1);
    }
}
