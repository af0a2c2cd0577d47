//! Legality rules of a layout against a scenario: each broken rule gives one reason, naming
//! the field to change. The rules are Megatron-LM's own asserts (argument validation in
//! `megatron/training/arguments.py`, `megatron/core/parallel_state.py`,
//! `megatron/core/pipeline_parallel/schedules.py`), so a layout that passes here starts there.

use super::{FsdpKind, Layout, PipelineLayout, Recompute, RecomputeModule, Schedule};
use crate::bounds::{self, limits};
use crate::scenario::Scenario;

mod moe;

pub use moe::{MAX_CAPACITY_FACTOR, MIN_CAPACITY_FACTOR, capacity_factor_in_range};

/// One broken legality rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct LayoutError {
    /// Short stable id of the rule, e.g. `tp-divides-heads`.
    pub rule: &'static str,
    /// Dotted path of the field to change, e.g. `spec.parallelism.tp`.
    pub field: String,
    /// What is wrong, in words a user can act on.
    pub message: String,
}

impl From<LayoutError> for crate::error::FieldError {
    fn from(e: LayoutError) -> Self {
        crate::error::FieldError::new(e.field, e.message)
    }
}

const P: &str = "spec.parallelism";

fn field(name: &str) -> String {
    format!("{P}.{name}")
}

/// What a check returns for a broken rule: the whole [`LayoutError`] for users, or only the
/// rule's id ([`RuleId`]) where rejections are only counted (the tuner's screen rejects
/// millions of structures: formatting a message for each took a third of a DeepSeek-V3 tune).
/// The message and field are closures, so the id costs nothing to build.
pub trait Broken: Sized {
    /// Rule `rule` is broken at `field`, for the reason `message`.
    fn broken(
        rule: &'static str,
        field: impl FnOnce() -> String,
        message: impl FnOnce() -> String,
    ) -> Self;
}

impl Broken for LayoutError {
    fn broken(
        rule: &'static str,
        field: impl FnOnce() -> String,
        message: impl FnOnce() -> String,
    ) -> Self {
        LayoutError {
            rule,
            field: field(),
            message: message(),
        }
    }
}

/// Only the id of a broken rule (see [`Broken`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleId(pub &'static str);

impl Broken for RuleId {
    fn broken(
        rule: &'static str,
        _field: impl FnOnce() -> String,
        _message: impl FnOnce() -> String,
    ) -> Self {
        RuleId(rule)
    }
}

/// Rule `rule` broken at `spec.parallelism.<name>`; the message is built only for a
/// [`LayoutError`].
pub(super) fn broken<T, E: Broken, M: Into<String>>(
    rule: &'static str,
    name: &str,
    message: impl FnOnce() -> M,
) -> Result<T, E> {
    Err(E::broken(rule, || field(name), || message().into()))
}

/// Rule `rule` broken at the dotted path `at` (a field outside `spec.parallelism`).
fn broken_at<T, E: Broken, M: Into<String>>(
    rule: &'static str,
    at: &str,
    message: impl FnOnce() -> M,
) -> Result<T, E> {
    Err(E::broken(rule, || at.to_string(), || message().into()))
}

impl Layout {
    /// Micro-batches per iteration per pipeline: globalBatchSize / (microBatchSize * dp); 0 when
    /// the layout does not divide the cluster.
    pub fn num_microbatches(&self, s: &Scenario) -> u64 {
        match self.dp(s.cluster.gpus) {
            Some(dp) if self.micro_batch_size > 0 => {
                s.training.global_batch_size / (self.micro_batch_size as u64 * dp as u64)
            }
            _ => 0,
        }
    }

    /// Check every legality rule against the scenario; the first broken rule. The sizes are
    /// bounded first (rule `within-bounds`), so every rule after computes without overflow.
    pub fn check(&self, s: &Scenario) -> Result<(), LayoutError> {
        self.check_sizes()?;
        self.check_structure(s)?;
        self.check_options(s)
    }

    /// The rules of the parallel structure (grid, pipeline, experts, sequence, batch, schedule,
    /// recompute, sharding) of a layout within its bounds, which come first in
    /// [`Layout::check`] after the bounds and do not look at the MoE execution options nor the
    /// memory options: layouts that differ only in those share this verdict (the tuner checks
    /// it once for them, on layouts it generates within the bounds of a bounded plan; every
    /// layout it keeps then passes [`Layout::check`] as a whole).
    pub fn check_structure(&self, s: &Scenario) -> Result<(), LayoutError> {
        self.structure_rules(s)
    }

    /// [`Layout::check_structure`] giving only the broken rule's id: nothing is formatted (the
    /// tuner's screen counts rejections by rule, on layouts its space builds within bounds).
    pub fn check_structure_rule(&self, s: &Scenario) -> Result<(), RuleId> {
        self.structure_rules(s)
    }

    /// The rules of the MoE execution options and the memory options, the last two parts of
    /// [`Layout::check`] (for layouts that passed the first two).
    pub fn check_options(&self, s: &Scenario) -> Result<(), LayoutError> {
        self.check_moe_options(s)?;
        self.check_memory_options(s)
    }

    /// The structure rules, in order, for either kind of verdict.
    fn structure_rules<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        self.check_grid::<E>(s)?;
        self.check_tensor_parallel::<E>(s)?;
        self.check_pipeline::<E>(s)?;
        self.check_experts::<E>(s)?;
        self.check_sequence::<E>(s)?;
        self.check_batch::<E>(s)?;
        self.check_schedule::<E>(s)?;
        self.check_recompute::<E>(s)?;
        self.check_sharding::<E>(s)?;
        Ok(())
    }

    /// Megatron's torch FSDP2 path (`--use-torch-fsdp2`) shards whole layers over the data
    /// parallel group and supports neither pipeline nor expert parallelism
    /// (`megatron/training/arguments.py`: "--use-torch-fsdp2 is not supported with pipeline
    /// parallelism / expert parallelism"), nor tied embeddings ("requires
    /// --untie-embeddings-and-output-weights"); it replaces the distributed optimizer. Megatron-FSDP
    /// (`--use-megatron-fsdp`, `fsdpKind: megatron`) has neither restriction: it shards the
    /// experts over the expert-data-parallel group
    /// (`megatron/core/distributed/fsdp/mcore_fsdp_adapter.py`).
    fn check_sharding<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        if !self.fsdp {
            if self.fsdp_kind != FsdpKind::Torch {
                return broken("fsdp-kind-needs-fsdp", "fsdpKind", || {
                    format!("{} needs fsdp: true", self.fsdp_kind.as_str())
                });
            }
            return Ok(());
        }
        if self.fsdp_kind == FsdpKind::Megatron {
            return Ok(());
        }
        if self.pp > 1 {
            return broken("fsdp-no-pp", "fsdp", || {
                format!(
                    "FSDP does not support pipeline parallelism (pp = {})",
                    self.pp
                )
            });
        }
        if self.ep > 1 {
            return broken("fsdp-no-ep", "fsdp", || {
                format!(
                    "FSDP does not support expert parallelism (ep = {})",
                    self.ep
                )
            });
        }
        // arguments.py: "--use-torch-fsdp2 requires --untie-embeddings-and-output-weights".
        if s.model.tied_embeddings {
            return broken("fsdp-needs-untied-embeddings", "fsdp", || {
                "torch FSDP2 needs untied input and output embeddings; this model ties them \
                 (fsdpKind: megatron has no such limit)"
                    .to_string()
            });
        }
        Ok(())
    }

    /// The layout's bounds ([`bounds::Bounded`]): every size in range, the pipeline layout's
    /// syntax.
    fn check_sizes(&self) -> Result<(), LayoutError> {
        bounds::check(self, P).map_err(|e| LayoutError {
            rule: "within-bounds",
            field: e.field,
            message: e.message,
        })
    }

    fn check_grid<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let gpus = s.cluster.gpus;
        let mp = self.model_parallel_size();
        if !u64::from(gpus).is_multiple_of(mp) {
            return broken_at("gpus-divisible", "spec.cluster.gpus", || {
                format!(
                    "{gpus} GPUs are not divisible by tp*pp*cp = {}*{}*{} = {mp}",
                    self.tp, self.pp, self.cp
                )
            });
        }
        Ok(())
    }

    fn check_tensor_parallel<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let m = &s.model;
        let tp = self.tp;
        if !m.attention_heads.is_multiple_of(tp) {
            return broken("tp-divides-heads", "tp", || {
                format!(
                    "{tp} does not divide the model's {} attention heads",
                    m.attention_heads
                )
            });
        }
        // Megatron: num_query_groups % tensor_model_parallel_size == 0 (MLA has no groups).
        if m.mla.is_none() && !m.kv_heads().is_multiple_of(tp) {
            return broken("tp-divides-kv-heads", "tp", || {
                format!(
                    "{tp} does not divide the model's {} key/value heads (GQA groups); Megatron splits whole groups over TP",
                    m.kv_heads()
                )
            });
        }
        if m.dense_layer_count() > 0 && !m.ffn_hidden_size.is_multiple_of(tp as u64) {
            return broken("tp-divides-ffn", "tp", || {
                format!("{tp} does not divide ffnHiddenSize {}", m.ffn_hidden_size)
            });
        }
        let shared = m.shared_expert_ffn();
        if shared > 0 && !shared.is_multiple_of(tp as u64) {
            return broken("tp-divides-ffn", "tp", || {
                format!("{tp} does not divide the shared experts' FFN size {shared}")
            });
        }
        Ok(())
    }

    fn check_pipeline<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let (pp, vpp) = (self.pp, self.vpp);
        // Every product of pp and vpp below is at most this (u32 without overflow).
        // The field's path is written only for an error (this runs for every structure the
        // tuner screens).
        bounds::product(
            "",
            &[("pp", pp.into()), ("vpp", vpp.into())],
            limits::VIRTUAL_STAGES,
        )
        .map_err(|e| E::broken("virtual-stages", || field("vpp"), || e.message))?;
        if vpp > 1 && pp == 1 {
            return broken("vpp-needs-pp", "vpp", || {
                format!("{vpp} virtual stages need pp > 1")
            });
        }
        if let Some(pl) = &self.pipeline_layout {
            return self.check_pipeline_layout::<E>(s, pl);
        }
        if self.first_stage_layers.is_none() && self.last_stage_layers.is_none() {
            let layers = s.model.layers;
            if !layers.is_multiple_of(pp * vpp) {
                return broken("pp-divides-layers", "pp", || {
                    format!(
                        "the model's {layers} layers do not split evenly over pp*vpp = {pp}*{vpp} = {} chunks; set firstStageLayers/lastStageLayers or pipelineLayout for an uneven split",
                        pp * vpp
                    )
                });
            }
            return Ok(());
        }
        self.check_uneven_split::<E>(s)
    }

    /// An explicit `pipelineLayout`: one stage per virtual stage, every decoder and MTP layer
    /// placed, and no first/last stage counts beside it.
    fn check_pipeline_layout<E: Broken>(&self, s: &Scenario, pl: &PipelineLayout) -> Result<(), E> {
        let layers = s.model.layers;
        let (pp, vpp) = (self.pp, self.vpp);
        if self.first_stage_layers.is_some() || self.last_stage_layers.is_some() {
            return broken(
                "pipeline-layout-exclusive",
                "pipelineLayout",
                || "give either pipelineLayout or firstStageLayers/lastStageLayers, not both",
            );
        }
        let stages = pl.stages().len() as u32;
        if stages != pp * vpp {
            return broken("pipeline-layout-stages", "pipelineLayout", || {
                format!(
                    "has {stages} stages, but pp*vpp = {pp}*{vpp} = {} (one per virtual stage)",
                    pp * vpp
                )
            });
        }
        if pl.layers() != layers {
            return broken("pipeline-layout-layers", "pipelineLayout", || {
                format!(
                    "places {} decoder layers `t`, the model has {layers}",
                    pl.layers()
                )
            });
        }
        if pl.mtp_layers() != s.model.mtp_layers {
            return broken("pipeline-layout-layers", "pipelineLayout", || {
                format!(
                    "places {} MTP layers `m`, the model has {}",
                    pl.mtp_layers(),
                    s.model.mtp_layers
                )
            });
        }
        Ok(())
    }

    /// `firstStageLayers` / `lastStageLayers`: the rest splits evenly (and non-empty) over the
    /// middle stages' chunks.
    fn check_uneven_split<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let layers = s.model.layers;
        let (pp, vpp) = (self.pp, self.vpp);
        let (first, last) = (self.first_stage_layers, self.last_stage_layers);
        let name = if first.is_some() {
            "firstStageLayers"
        } else {
            "lastStageLayers"
        };
        if pp == 1 {
            return broken(
                "uneven-split",
                name,
                || "an uneven pipeline split needs pp > 1",
            );
        }
        let (f, l) = (first.unwrap_or(0), last.unwrap_or(0));
        if f + l > layers {
            return broken("uneven-split", name, || {
                format!(
                    "first + last stage layers {} exceed the model's {layers}",
                    f + l
                )
            });
        }
        for (n, v) in [("firstStageLayers", first), ("lastStageLayers", last)] {
            if let Some(v) = v
                && v % vpp != 0
            {
                return broken("uneven-split", n, || {
                    format!("{v} layers do not split evenly over vpp = {vpp} chunks")
                });
            }
        }
        let middle_stages = pp - first.is_some() as u32 - last.is_some() as u32;
        let middle = layers - f - l;
        if middle_stages == 0 {
            if middle != 0 {
                return broken("uneven-split", name, || {
                    format!(
                        "with pp = {pp} there are no middle stages, so first + last must be the model's {layers} layers (got {})",
                        f + l
                    )
                });
            }
        } else if middle == 0 || !middle.is_multiple_of(middle_stages * vpp) {
            return broken("uneven-split", name, || {
                format!(
                    "the remaining {middle} layers do not split evenly (and non-empty) over the {middle_stages} middle stages x vpp = {vpp} chunks"
                )
            });
        }
        Ok(())
    }

    fn check_schedule<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let chunks = self.chunks();
        match self.schedule {
            Schedule::Interleaved => {
                if chunks < 2 {
                    return broken(
                        "interleaved-needs-vpp",
                        "schedule",
                        || "interleaved needs vpp > 1 model chunks per rank (got 1)",
                    );
                }
                // schedules.py: microbatch_group_size_per_vp_stage (default pp) must lie in
                // [pp, m], and m % group must be 0 or >= pp: with the default, m % pp == 0.
                let m = self.num_microbatches(s);
                let pp = self.pp as u64;
                if m < pp || !m.is_multiple_of(pp) {
                    return broken_at(
                        "interleaved-microbatches",
                        "spec.training.globalBatchSize",
                        || {
                            format!(
                                "the interleaved schedule needs the number of micro-batches ({m}) to be a multiple of pp = {pp} (Megatron's schedule groups micro-batches by pp)"
                            )
                        },
                    );
                }
            }
            Schedule::OneFOneB | Schedule::ZeroBubble => {
                if chunks > 1 {
                    return broken("vpp-needs-interleaved", "schedule", || {
                        format!(
                            "{} runs one model chunk per rank; vpp = {chunks} needs schedule interleaved",
                            self.schedule.as_str()
                        )
                    });
                }
                if self.schedule == Schedule::ZeroBubble && self.pp < 2 {
                    return broken(
                        "zero-bubble-needs-pp",
                        "schedule",
                        || "zero-bubble (ZB-H1) schedules a pipeline: it needs pp > 1",
                    );
                }
            }
        }
        Ok(())
    }

    fn check_experts<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let Some(moe) = &s.model.moe else {
            if self.ep > 1 || self.etp > 1 {
                let name = if self.ep > 1 { "ep" } else { "etp" };
                return broken(
                    "ep-needs-moe",
                    name,
                    || "expert parallelism needs a mixture-of-experts model",
                );
            }
            return Ok(());
        };
        if moe.num_experts % self.ep != 0 {
            return broken("ep-divides-experts", "ep", || {
                format!(
                    "{} does not divide the model's {} experts",
                    self.ep, moe.num_experts
                )
            });
        }
        if moe.moe_ffn_hidden_size % self.etp as u64 != 0 {
            return broken("etp-divides-moe-ffn", "etp", || {
                format!(
                    "{} does not divide moeFfnHiddenSize {}",
                    self.etp, moe.moe_ffn_hidden_size
                )
            });
        }
        // MoE parallel folding (parallel_state.initialize_model_parallel): the GPUs of one
        // pipeline stage (tp*cp*dp) are regrouped as etp*ep*edp.
        let per_stage = u64::from(s.cluster.gpus / self.pp);
        let grid = u64::from(self.ep) * u64::from(self.etp);
        if !per_stage.is_multiple_of(grid) {
            return broken("expert-grid-fits", "ep", || {
                format!(
                    "ep*etp = {}*{} = {grid} does not divide the {per_stage} GPUs of one pipeline stage (tp*cp*dp); MoE parallel folding needs it",
                    self.ep, self.etp
                )
            });
        }
        // Megatron-Core asserts sequence parallelism for MoE with tensor parallelism.
        if self.tp > 1 && !self.sequence_parallel {
            return broken(
                "moe-needs-sp",
                "sequenceParallel",
                || "a mixture-of-experts model with tp > 1 needs sequence parallelism",
            );
        }
        Ok(())
    }

    fn check_sequence<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let seq = s.training.seq_length;
        let cp = self.cp as u64;
        // Load-balanced context parallelism splits each sequence into 2*cp chunks.
        if cp > 1 && !seq.is_multiple_of(2 * cp) {
            return broken("cp-divides-seq", "cp", || {
                format!(
                    "seqLength {seq} is not divisible by 2*cp = {} (context parallelism splits each sequence into 2*cp chunks)",
                    2 * cp
                )
            });
        }
        if self.sp() && !(seq / cp).is_multiple_of(self.tp as u64) {
            return broken("sp-divides-seq", "sequenceParallel", || {
                format!(
                    "the {} tokens per context-parallel rank are not divisible by tp = {} (sequence parallelism splits them over TP)",
                    seq / cp,
                    self.tp
                )
            });
        }
        Ok(())
    }

    fn check_batch<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let dp = self.dp(s.cluster.gpus).unwrap_or(1) as u64;
        let mbs = self.micro_batch_size as u64;
        let gbs = s.training.global_batch_size;
        if !gbs.is_multiple_of(mbs * dp) {
            return broken_at("gbs-divisible", "spec.training.globalBatchSize", || {
                format!(
                    "{gbs} is not divisible by microBatchSize*dp = {mbs}*{dp} = {}",
                    mbs * dp
                )
            });
        }
        Ok(())
    }

    /// `recomputeModules`: Megatron reads `--recompute-modules` only with selective
    /// granularity; `moe_act` needs grouped-GEMM experts (an MoE model) and `mla_up_proj`
    /// multi-latent attention (`TransformerConfig.__post_init__`); `moe` and
    /// `shared_experts` recompute parts of the MoE block, so they need one too.
    fn check_recompute_modules<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        let Some(modules) = &self.recompute_modules else {
            return Ok(());
        };
        const NAME: &str = "recomputeModules";
        if self.recompute != Recompute::Selective {
            return broken("recompute-modules-need-selective", NAME, || {
                format!(
                    "recompute modules apply to selective recompute (Megatron's --recompute-modules with --recompute-granularity selective); recompute is {}",
                    self.recompute.as_str()
                )
            });
        }
        for (i, m) in modules.iter().enumerate() {
            if modules[..i].contains(m) {
                return broken("recompute-modules-unique", NAME, || {
                    format!("lists {m} twice")
                });
            }
            let needs = match m {
                RecomputeModule::MoeAct | RecomputeModule::Moe | RecomputeModule::SharedExperts
                    if s.model.moe.is_none() =>
                {
                    "a mixture-of-experts model"
                }
                RecomputeModule::MlaUpProj if s.model.mla.is_none() => {
                    "multi-latent attention (MLA)"
                }
                _ => continue,
            };
            return broken("recompute-module-fits-model", NAME, || {
                format!("{m} needs {needs}; model {} has none", s.model.name)
            });
        }
        Ok(())
    }

    /// Primus' `recompute_layer_ids`, as `validate_specified_recompute_layers` checks them
    /// (`recompute_layer_patches.py`): full granularity, no block count beside them, not empty,
    /// each a decoder layer or an MTP depth. Ascending without repeats here (Primus sorts and
    /// collapses them; the flag reader does too).
    fn check_recompute_layer_ids<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        const NAME: &str = "recomputeLayerIds";
        let Some(ids) = self.recompute_layer_ids.as_deref() else {
            return Ok(());
        };
        if self.recompute != Recompute::Full {
            return broken("recompute-layer-ids-need-full", NAME, || {
                format!(
                    "recomputeLayerIds lists fully recomputed layers: it needs recompute full (got {})",
                    self.recompute.as_str()
                )
            });
        }
        if self.recompute_layers != 0 {
            return broken("recompute-layer-ids-replace-count", NAME, || {
                format!(
                    "recomputeLayerIds replaces recomputeLayers ({}): Primus requires recompute_method null with recompute_layer_ids; set recomputeLayers 0",
                    self.recompute_layers
                )
            });
        }
        if ids.is_empty() {
            return broken("recompute-layer-ids-not-empty", NAME, || {
                "an empty list recomputes nothing (Primus refuses it): omit recomputeLayerIds or set recompute none".to_string()
            });
        }
        if let Some(w) = ids.windows(2).find(|w| w[1] <= w[0]) {
            return broken("recompute-layer-ids-ascending", NAME, || {
                format!(
                    "the IDs must ascend without repeats ({} then {})",
                    w[0], w[1]
                )
            });
        }
        let ids_end = s.model.layers + s.model.mtp_layers;
        if let Some(&bad) = ids.iter().find(|&&i| i >= ids_end) {
            return broken("recompute-layer-ids-fit", NAME, || {
                let mtp = match s.model.mtp_layers {
                    0 => String::new(),
                    n => format!(", {}..{} its {n} MTP depths", s.model.layers, ids_end - 1),
                };
                format!(
                    "layer {bad} is past model {}: 0..{} are its decoder layers{mtp}",
                    s.model.name,
                    s.model.layers.saturating_sub(1)
                )
            });
        }
        Ok(())
    }

    fn check_recompute<E: Broken>(&self, s: &Scenario) -> Result<(), E> {
        self.check_recompute_modules::<E>(s)?;
        self.check_recompute_layer_ids::<E>(s)?;
        if self.recompute_layers == 0 {
            return Ok(());
        }
        if self.recompute != Recompute::Full {
            return broken("recompute-layers-need-full", "recomputeLayers", || {
                format!(
                    "recomputeLayers counts fully recomputed layers: it needs recompute full (got {})",
                    self.recompute.as_str()
                )
            });
        }
        let most = (0..self.pp)
            .flat_map(|r| (0..self.chunks()).map(move |c| (r, c)))
            .map(|(r, c)| self.virtual_stage(s.model.layers, 0, r, c).layers)
            .max()
            .unwrap_or(0);
        if self.recompute_layers > most {
            return broken("recompute-layers-fit", "recomputeLayers", || {
                format!(
                    "{} exceeds the {most} layers of the largest model chunk (use 0 to recompute every layer)",
                    self.recompute_layers
                )
            });
        }
        Ok(())
    }
}
