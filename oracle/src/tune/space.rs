//! The search space of a plan: for the plan's GPU count, global batch and sequence length, the
//! values each axis may take (`spec.tuning.allowed` narrows them, `spec.tuning.fixed` pins
//! them), and the layouts they combine into.
//!
//! Axes and their default values (before `allowed`/`fixed`):
//! - `tp`, `pp`, `cp`: divisors of the GPU count (`tp` up to the attention heads, `pp` up to the
//!   layers, `cp` where the sequence splits into 2*cp chunks); only triples whose product
//!   divides the GPU count are combined, so the data-parallel size is a whole number;
//! - `vpp`: for each `pp`, every chunk count that leaves at least one layer per chunk;
//! - the layer split: Megatron's even split when `pp*vpp` divides the layers, else the
//!   balanced uneven splits (a lighter last stage, a lighter first stage, or both;
//!   `firstStageLayers`/`lastStageLayers`);
//! - `schedule`: `1f1b` and `zero-bubble` for `vpp = 1`, `interleaved` for `vpp > 1`, only
//!   `1f1b` without a pipeline;
//! - `ep`: divisors of the expert count (1 for dense models); `etp`: divisors of `tp`;
//! - `microBatchSize`: divisors of the global batch;
//! - `recompute`: none, selective, full; full with every per-chunk layer count (0 = all);
//!   selective with a few module lists (`recomputeModules`, Megatron's `--recompute-modules`)
//!   where they save memory for the model: for MoE models `[core_attn]` (Megatron's default),
//!   `[moe_act]`, `[moe_act, layernorm]` and `[core_attn, moe_act, layernorm]` (with MLA also
//!   `mla_up_proj` in the last); for dense models `[core_attn]`, `[mlp]` and `[core_attn, mlp]`
//!   (`layernorm` changes nothing there: Transformer Engine fuses those norms into the linears).
//!   FP8 plans leave out `moe_act` and `layernorm`: Megatron rejects them with the delayed
//!   scaling recipe that `--fp8-format hybrid` selects;
//! - optimizer sharding: the distributed optimizer or FSDP;
//! - for MoE models, the token dispatcher and Megatron's EP communication overlap (`dispatch`,
//!   `epOverlap`; [`MoeChoice`]): the reference's dispatcher, alltoall and every flex backend
//!   the hardware profile lists (`flexBackends`: DeepEP and HybridEP on Hopper and B200,
//!   HybridEP on GB200/GB300, Primus-Turbo DeepEP on AMD Instinct), each without and with the
//!   overlap (with `delayWgrad`) where the overlap is legal (EP > 1, not allgather, VPP with a
//!   pipeline, no full recompute). `spec.tuning.allowed.dispatch` narrows it to what the image
//!   ships. Without a reference layout the options without a trade-off are turned on
//!   (Transformer Engine grouped GEMM, permute and router fusion); a reference keeps its own,
//!   as what its image runs.
//!
//! Everything else (sequence parallel, the overlap switches, routing, FP8 recipe, CUDA graphs)
//! comes from the reference layout when the plan gives one, else from the defaults, unless
//! pinned.

use std::collections::BTreeMap;

use crate::error::FieldError;
use crate::layout::{
    Dispatch, GroupedGemm, Layout, ModuleSet, PipelineLayout, Recompute, RecomputeModule, Schedule,
};
use crate::model::ModelCard;
use crate::plan::{AllowedAxes, FixedAxes, Tuning};
use crate::precision::Precision;
use crate::scenario::Scenario;

/// How optimizer state (and weights) are sharded over data parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Sharding {
    /// Megatron's distributed optimizer (ZeRO-1).
    DistributedOptimizer,
    /// Fully sharded data parallel (weights, gradients and optimizer state).
    Fsdp,
    /// Plain data parallelism: every replica holds the whole optimizer state.
    Replicated,
}

impl Sharding {
    /// The sharding a layout uses.
    pub fn of(l: &Layout) -> Sharding {
        if l.fsdp {
            Sharding::Fsdp
        } else if l.distributed_optimizer {
            Sharding::DistributedOptimizer
        } else {
            Sharding::Replicated
        }
    }

    fn apply(self, l: &mut Layout) {
        l.fsdp = self == Sharding::Fsdp;
        l.distributed_optimizer = self == Sharding::DistributedOptimizer;
    }
}

/// How the decoder layers are split over the pipeline's virtual stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Split {
    /// Megatron's even split (`pp * vpp` divides the layers).
    Even,
    /// Lighter first and/or last stages: `(firstStageLayers, lastStageLayers)`.
    Ends(Option<u32>, Option<u32>),
    /// `--pipeline-model-parallel-layout` with the embedding and the loss (and each MTP layer)
    /// counted as one layer each, split evenly over the virtual stages (Megatron's
    /// `--account-for-embedding/loss-in-pipeline-split`).
    Balanced,
}

/// One MoE execution choice the tuner searches: the token dispatcher and the EP
/// communication overlap (with its delayed weight gradients).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoeChoice {
    pub dispatch: Dispatch,
    pub ep_overlap: bool,
}

impl MoeChoice {
    /// The choice a layout makes.
    pub fn of(l: &Layout) -> MoeChoice {
        MoeChoice {
            dispatch: l.moe.dispatch(),
            ep_overlap: l.moe.ep_overlap,
        }
    }

    /// Set a layout's dispatcher and overlap (the overlap excludes shared-expert overlap).
    pub fn apply(self, l: &mut Layout) {
        l.moe.set_dispatch(self.dispatch);
        l.moe.ep_overlap = self.ep_overlap;
        l.moe.delay_wgrad = self.ep_overlap;
        if self.ep_overlap {
            l.moe.shared_expert_overlap = false;
            l.moe.shared_expert_stream_per_layer = false;
        }
    }
}

/// The part of a layout fixed for one exhaustive-search task: everything but the micro-batch
/// size and recomputation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Structure {
    pub tp: u32,
    pub pp: u32,
    pub vpp: u32,
    pub cp: u32,
    pub ep: u32,
    pub etp: u32,
    pub split: Split,
    pub schedule: Schedule,
    pub sharding: Sharding,
    /// The MoE dispatcher and overlap (None for dense models).
    pub moe: Option<MoeChoice>,
}

/// One way to recompute activations: the granularity and, for full, the per-chunk layer count
/// (0 = every layer), for selective the modules ([`ModuleSet::DEFAULT`] is Megatron's default
/// `[core_attn]`, written as no `recomputeModules`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecomputeChoice {
    pub recompute: Recompute,
    pub layers: u32,
    pub modules: ModuleSet,
}

impl RecomputeChoice {
    /// Nothing recomputed.
    pub const NONE: RecomputeChoice = RecomputeChoice {
        recompute: Recompute::None,
        layers: 0,
        modules: ModuleSet::EMPTY,
    };

    /// Full recompute of `layers` layers per chunk (0 = every layer).
    pub fn full(layers: u32) -> RecomputeChoice {
        RecomputeChoice {
            recompute: Recompute::Full,
            layers,
            modules: ModuleSet::EMPTY,
        }
    }

    /// Selective recompute of `modules`.
    pub fn selective(modules: ModuleSet) -> RecomputeChoice {
        RecomputeChoice {
            recompute: Recompute::Selective,
            layers: 0,
            modules,
        }
    }

    /// The choice a layout makes.
    pub fn of(l: &Layout) -> RecomputeChoice {
        RecomputeChoice {
            recompute: l.recompute,
            layers: l.recompute_layers,
            modules: l.recompute_set(),
        }
    }

    /// Set a layout's recompute fields (the default modules as no `recomputeModules`).
    pub fn apply(self, l: &mut Layout) {
        l.recompute = self.recompute;
        l.recompute_layer_ids = None;
        l.recompute_layers = if self.recompute == Recompute::Full {
            self.layers
        } else {
            0
        };
        l.recompute_modules = match self.recompute {
            Recompute::Selective if self.modules != ModuleSet::DEFAULT => {
                Some(self.modules.to_vec())
            }
            _ => None,
        };
    }
}

/// The selective-recompute module lists the tuner tries by default (see the module
/// documentation), least recomputation first, the union of the others last.
pub fn default_module_sets(s: &Scenario) -> Vec<ModuleSet> {
    use RecomputeModule::*;
    let m = &s.model;
    let fp8 = s.training.precision == Precision::Fp8;
    let set = ModuleSet::of;
    let mut out = vec![ModuleSet::DEFAULT];
    if m.moe.is_some() {
        if !fp8 {
            out.push(set(&[MoeAct]));
            out.push(set(&[MoeAct, Layernorm]));
        }
        let mut most = set(&[CoreAttn]);
        if !fp8 {
            most = most.with(MoeAct).with(Layernorm);
        }
        if m.mla.is_some() {
            most = most.with(MlaUpProj);
        }
        if most != ModuleSet::DEFAULT {
            out.push(most);
        }
    } else {
        out.push(set(&[Mlp]));
        let mut most = set(&[CoreAttn, Mlp]);
        if m.mla.is_some() {
            most = most.with(MlaUpProj);
        }
        out.push(most);
    }
    out
}

/// Whether a module applies to the model (the legality rules' test).
fn module_fits(s: &Scenario, m: RecomputeModule) -> bool {
    match m {
        RecomputeModule::MoeAct | RecomputeModule::Moe | RecomputeModule::SharedExperts => {
            s.model.moe.is_some()
        }
        RecomputeModule::MlaUpProj => s.model.mla.is_some(),
        _ => true,
    }
}

/// The search space of one plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    pub tp: Vec<u32>,
    pub pp: Vec<u32>,
    /// Allowed chunk counts; `None` = every count that fits the pipeline.
    pub vpp: Option<Vec<u32>>,
    pub cp: Vec<u32>,
    pub ep: Vec<u32>,
    /// Allowed expert-TP sizes; `None` = the divisors of each `tp`.
    pub etp: Option<Vec<u32>>,
    pub micro_batch_size: Vec<u32>,
    pub recompute: Vec<Recompute>,
    /// Pinned full-recompute layer count.
    pub recompute_layers: Option<u32>,
    /// Module sets of selective recompute, least recomputation first.
    pub recompute_modules: Vec<ModuleSet>,
    pub sharding: Vec<Sharding>,
    pub schedule: Vec<Schedule>,
    /// MoE dispatchers to try (empty for dense models).
    pub dispatch: Vec<Dispatch>,
    /// EP overlap values to try.
    pub ep_overlap: Vec<bool>,
    /// Values of the fields that are not searched (sequence parallel, overlap switches).
    pub base: Layout,
    /// Which of the options the grid holds fixed an agent proposal may set
    /// ([`Space::normalize_open`]).
    pub open: OpenOptions,
    gpus: u32,
    layers: u32,
    mtp: u32,
    /// The balanced pipeline layouts by (pp, vpp).
    balanced: BTreeMap<(u32, u32), PipelineLayout>,
}

/// The options outside the grid a proposal may change, where the plan does not pin them. The
/// overlap switches are never pinned (no `spec.tuning.fixed` field names them); an uneven
/// layer split is always open (the legality rules judge it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenOptions {
    /// `spec.tuning.fixed.sequenceParallel` is unset.
    pub sequence_parallel: bool,
    /// Neither `fixed` nor `allowed` names `recomputeModules`.
    pub recompute_modules: bool,
}

/// The divisors of `n`, ascending. O(sqrt n): callers pass bounded values (a global batch,
/// a GPU count, an expert count; [`crate::bounds::limits`]). `d <= n / d` never overflows.
fn divisors(n: u64) -> Vec<u64> {
    let mut small = Vec::new();
    let mut large = Vec::new();
    let mut d = 1;
    while d <= n / d {
        if n.is_multiple_of(d) {
            small.push(d);
            if d != n / d {
                large.push(n / d);
            }
        }
        d += 1;
    }
    small.extend(large.into_iter().rev());
    small
}

fn divisors_u32(n: u32) -> Vec<u32> {
    divisors(n as u64).into_iter().map(|d| d as u32).collect()
}

/// Most structures a search space may hold (the tuner keeps each, with its screening
/// results, in memory: about 100 bytes each). The MoE choices multiply the parallel
/// structures (DeepSeek-V3 on 1,024 H100: about 445k); 2^21 leaves room for 16k GPUs.
pub const MAX_STRUCTURES: usize = 1 << 21;

const ALLOWED: &str = "spec.tuning.allowed";
const FIXED: &str = "spec.tuning.fixed";

/// Narrow a default list by `allowed` and `fixed`, with errors naming the field.
fn narrow<T: Copy + PartialEq + std::fmt::Debug>(
    name: &str,
    default: Vec<T>,
    allowed: Option<&Vec<T>>,
    fixed: Option<T>,
    valid: impl Fn(&T) -> bool,
) -> Result<Vec<T>, FieldError> {
    if let Some(list) = allowed {
        if list.is_empty() {
            return Err(FieldError::new(
                format!("{ALLOWED}.{name}"),
                "must list at least one value",
            ));
        }
        if let Some(bad) = list.iter().find(|v| !valid(v)) {
            return Err(FieldError::new(
                format!("{ALLOWED}.{name}"),
                format!("{bad:?} is not a valid value"),
            ));
        }
    }
    if let Some(f) = fixed {
        if !valid(&f) {
            return Err(FieldError::new(
                format!("{FIXED}.{name}"),
                format!("{f:?} is not a valid value"),
            ));
        }
        if let Some(list) = allowed
            && !list.contains(&f)
        {
            return Err(FieldError::new(
                format!("{FIXED}.{name}"),
                format!("{f:?} is not among {ALLOWED}.{name} {list:?}"),
            ));
        }
        return Ok(vec![f]);
    }
    Ok(match allowed {
        Some(list) => {
            // Keep the user's values (even ones outside the defaults: the rules judge them),
            // sorted and without duplicates so the search order is stable.
            let mut out: Vec<T> = Vec::new();
            for v in default.iter().filter(|v| list.contains(v)) {
                out.push(*v);
            }
            for v in list {
                if !out.contains(v) {
                    out.push(*v);
                }
            }
            out
        }
        None => default,
    })
}

fn sort_dedup(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v.dedup();
    v
}

/// The default values of the numeric axes, before `allowed` and `fixed` (see the module doc).
struct DefaultAxes {
    tp: Vec<u32>,
    pp: Vec<u32>,
    cp: Vec<u32>,
    ep: Vec<u32>,
    micro_batch_size: Vec<u32>,
}

impl DefaultAxes {
    fn of(s: &Scenario) -> DefaultAxes {
        let gpus = s.cluster.gpus;
        let m = &s.model;
        let seq = s.training.seq_length;
        DefaultAxes {
            tp: divisors_u32(gpus)
                .into_iter()
                .filter(|d| *d <= m.attention_heads)
                .collect(),
            pp: divisors_u32(gpus)
                .into_iter()
                .filter(|d| *d <= m.layers)
                .collect(),
            cp: divisors_u32(gpus)
                .into_iter()
                .filter(|d| *d == 1 || seq.is_multiple_of(2 * *d as u64))
                .collect(),
            ep: match &m.moe {
                Some(moe) => divisors_u32(moe.num_experts)
                    .into_iter()
                    .filter(|d| gpus.is_multiple_of(*d))
                    .collect(),
                None => vec![1],
            },
            micro_batch_size: divisors(s.training.global_batch_size)
                .into_iter()
                .filter(|d| *d <= u32::MAX as u64)
                .map(|d| d as u32)
                .collect(),
        }
    }
}

/// The recomputation axes after `allowed` and `fixed`.
struct RecomputeAxes {
    recompute: Vec<Recompute>,
    recompute_layers: Option<u32>,
    recompute_modules: Vec<ModuleSet>,
}

/// Recompute granularity, full recompute's layer count and selective recompute's module
/// sets; a pinned layer count implies full recompute, pinned modules selective.
fn recompute_axes(
    s: &Scenario,
    fixed: &FixedAxes,
    allowed: &AllowedAxes,
) -> Result<RecomputeAxes, FieldError> {
    let mut recompute = narrow(
        "recompute",
        vec![Recompute::None, Recompute::Selective, Recompute::Full],
        allowed.recompute.as_ref(),
        fixed.recompute,
        |_| true,
    )?;
    recompute.sort();
    recompute.dedup();
    let recompute_layers = match fixed.recompute_layers {
        None => None,
        Some(0) => Some(0),
        Some(k) => {
            if !recompute.contains(&Recompute::Full) {
                return Err(FieldError::new(
                    format!("{FIXED}.recomputeLayers"),
                    format!("{k} layers need recompute full among the allowed values"),
                ));
            }
            // Only full recompute takes a layer count.
            recompute = vec![Recompute::Full];
            Some(k)
        }
    };
    let set_of = |list: &Vec<RecomputeModule>| ModuleSet::of(list);
    let allowed_sets: Option<Vec<ModuleSet>> = allowed
        .recompute_modules
        .as_ref()
        .map(|l| l.iter().map(set_of).collect());
    let fixed_set = fixed.recompute_modules.as_ref().map(set_of);
    let fits = |set: &ModuleSet| set.iter().all(|m| module_fits(s, m));
    let mut recompute_modules = narrow(
        "recomputeModules",
        default_module_sets(s),
        allowed_sets.as_ref(),
        fixed_set,
        fits,
    )?;
    let mut seen = Vec::new();
    recompute_modules.retain(|m| {
        let new = !seen.contains(m);
        seen.push(*m);
        new
    });
    if let Some(set) = fixed_set {
        if !recompute.contains(&Recompute::Selective) {
            return Err(FieldError::new(
                format!("{FIXED}.recomputeModules"),
                format!(
                    "[{}] needs recompute selective among the allowed values",
                    set.label().replace('+', ", ")
                ),
            ));
        }
        // Only selective recompute takes modules.
        recompute = vec![Recompute::Selective];
    }
    Ok(RecomputeAxes {
        recompute,
        recompute_layers,
        recompute_modules,
    })
}

/// The pipeline schedules after `allowed` and `fixed`.
fn schedule_axis(fixed: &FixedAxes, allowed: &AllowedAxes) -> Result<Vec<Schedule>, FieldError> {
    let mut schedule = narrow(
        "schedule",
        vec![
            Schedule::OneFOneB,
            Schedule::Interleaved,
            Schedule::ZeroBubble,
        ],
        allowed.schedule.as_ref(),
        fixed.schedule,
        |_| true,
    )?;
    schedule.sort();
    schedule.dedup();
    Ok(schedule)
}

/// The optimizer shardings `fixed.fsdp` and `fixed.distributedOptimizer` leave.
fn sharding_axis(fixed: &FixedAxes) -> Vec<Sharding> {
    match (fixed.fsdp, fixed.distributed_optimizer) {
        (Some(true), _) => vec![Sharding::Fsdp],
        (_, Some(true)) => vec![Sharding::DistributedOptimizer],
        (Some(false), Some(false)) => vec![Sharding::Replicated],
        (Some(false), None) => vec![Sharding::DistributedOptimizer],
        (None, Some(false)) => vec![Sharding::Fsdp, Sharding::Replicated],
        (None, None) => vec![Sharding::DistributedOptimizer, Sharding::Fsdp],
    }
}

/// The MoE dispatchers and EP-overlap values after `allowed` and `fixed` (empty for dense
/// models): by default the reference layout's dispatcher (when the plan gives one), alltoall
/// and the hardware profile's flex backends; a dispatcher the GPU's stack does not run is an
/// error naming the field.
fn moe_axes(
    s: &Scenario,
    fixed: &FixedAxes,
    allowed: &AllowedAxes,
    reference: Option<&Layout>,
) -> Result<(Vec<Dispatch>, Vec<bool>), FieldError> {
    if s.model.moe.is_none() {
        return Ok((Vec::new(), vec![false]));
    }
    let hw = &s.hardware;
    let runs = |d: &Dispatch| match d.parts().1 {
        Some(b) => hw.flex_backend(b).is_some(),
        None => true,
    };
    let listed = allowed.dispatch.iter().flatten().map(|d| (ALLOWED, *d));
    if let Some((at, d)) = listed
        .chain(fixed.dispatch.map(|d| (FIXED, d)))
        .find(|(_, d)| !runs(d))
    {
        let have: Vec<&str> = hw
            .flex_backends
            .iter()
            .map(|p| p.backend.as_str())
            .collect();
        return Err(FieldError::new(
            format!("{at}.dispatch"),
            format!(
                "{} does not run on {} (its flex backends: {})",
                d.as_str(),
                hw.name,
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            ),
        ));
    }
    // Allgather (Megatron's default) gathers every token of the TP x EP group on every rank:
    // searched only when the reference uses it or `allowed` lists it.
    let mut default: Vec<Dispatch> = reference.map(|r| r.moe.dispatch()).into_iter().collect();
    default.push(Dispatch::Alltoall);
    default.extend(
        hw.flex_backends
            .iter()
            .map(|p| Dispatch::of_backend(p.backend)),
    );
    let mut dispatch = narrow(
        "dispatch",
        default,
        allowed.dispatch.as_ref(),
        fixed.dispatch,
        runs,
    )?;
    let mut seen = Vec::new();
    dispatch.retain(|d| {
        let new = !seen.contains(d);
        seen.push(*d);
        new
    });
    let mut ep_overlap = narrow(
        "epOverlap",
        vec![false, true],
        allowed.ep_overlap.as_ref(),
        fixed.ep_overlap,
        |_| true,
    )?;
    ep_overlap.dedup();
    Ok((dispatch, ep_overlap))
}

/// Balanced pipeline layouts: every (pp, vpp) whose stages split the layers plus the
/// embedding, the loss and the MTP layers evenly, and whose text is within the field's bound
/// (the screen checks the structure of the layouts it builds, not their sizes again).
fn balanced_layouts(m: &ModelCard, pp: &[u32]) -> BTreeMap<(u32, u32), PipelineLayout> {
    let mut balanced = BTreeMap::new();
    let slots = m.layers + m.mtp_layers + 2;
    for &p in pp {
        if p < 2 {
            continue;
        }
        for v in 1..=slots / p {
            if let Some(text) =
                crate::validate::embedding_and_loss_split(m.layers, m.mtp_layers, p, v)
                && text.len() <= crate::bounds::limits::LAYOUT_TEXT as usize
                && (crate::bounds::patterns::LAYOUT_SYMBOLS.test)(&text)
                && let Ok(parsed) = PipelineLayout::parse(&text)
            {
                balanced.insert((p, v), parsed);
            }
        }
    }
    balanced
}

impl Space {
    /// The space of a scenario under `spec.tuning`; `reference` (`spec.parallelism`) supplies
    /// the values of the axes that are not searched. Errors name the `spec.tuning` field.
    pub fn new(
        s: &Scenario,
        tuning: &Tuning,
        reference: Option<&Layout>,
    ) -> Result<Space, FieldError> {
        let fixed: &FixedAxes = &tuning.fixed;
        let allowed: &AllowedAxes = &tuning.allowed;
        let m = &s.model;
        let positive = |v: &u32| *v > 0;
        let d = DefaultAxes::of(s);
        let tp = sort_dedup(narrow("tp", d.tp, allowed.tp.as_ref(), fixed.tp, positive)?);
        let pp = sort_dedup(narrow("pp", d.pp, allowed.pp.as_ref(), fixed.pp, positive)?);
        let cp = sort_dedup(narrow("cp", d.cp, allowed.cp.as_ref(), fixed.cp, positive)?);
        let ep = sort_dedup(narrow("ep", d.ep, allowed.ep.as_ref(), fixed.ep, positive)?);
        let micro_batch_size = sort_dedup(narrow(
            "microBatchSize",
            d.micro_batch_size,
            allowed.micro_batch_size.as_ref(),
            fixed.micro_batch_size,
            positive,
        )?);
        let vpp = match (fixed.vpp, allowed.vpp.as_ref()) {
            (None, None) => None,
            (f, a) => Some(sort_dedup(narrow("vpp", Vec::new(), a, f, positive)?)),
        };
        let etp = match (fixed.etp, allowed.etp.as_ref()) {
            (None, None) => None,
            (f, a) => Some(sort_dedup(narrow("etp", Vec::new(), a, f, positive)?)),
        };
        let rc = recompute_axes(s, fixed, allowed)?;
        let schedule = schedule_axis(fixed, allowed)?;
        let mut base = reference.cloned().unwrap_or_default();
        // The reference's own recompute list belongs to its split; candidates recompute by
        // Megatron's block method (RecomputeChoice).
        base.recompute_layer_ids = None;
        base.pipeline_layout = None;
        base.first_stage_layers = None;
        base.last_stage_layers = None;
        if let Some(sp) = fixed.sequence_parallel {
            base.sequence_parallel = sp;
        }
        let open = OpenOptions {
            sequence_parallel: fixed.sequence_parallel.is_none(),
            recompute_modules: fixed.recompute_modules.is_none()
                && allowed.recompute_modules.is_none(),
        };
        let (dispatch, ep_overlap) = moe_axes(s, fixed, allowed, reference)?;
        if m.moe.is_some() && reference.is_none() {
            // The options without a trade-off (module documentation); a reference keeps its
            // own: they are what its image runs.
            if base.moe.grouped_gemm == GroupedGemm::Sequential {
                base.moe.grouped_gemm = GroupedGemm::Grouped;
            }
            base.moe.permute_fusion = true;
            base.moe.router_fusion = true;
        }
        let space = Space {
            balanced: balanced_layouts(m, &pp),
            open,
            tp,
            pp,
            vpp,
            cp,
            ep,
            etp,
            micro_batch_size,
            recompute: rc.recompute,
            recompute_layers: rc.recompute_layers,
            recompute_modules: rc.recompute_modules,
            sharding: sharding_axis(fixed),
            schedule,
            dispatch,
            ep_overlap,
            base,
            gpus: s.cluster.gpus,
            layers: m.layers,
            mtp: m.mtp_layers,
        };
        let n = space.count_structures(s, MAX_STRUCTURES + 1);
        if n > MAX_STRUCTURES {
            return Err(FieldError::new(
                "spec.tuning",
                format!(
                    "the search space holds more than {MAX_STRUCTURES} layout structures (tp, pp, vpp, cp, ep, etp, split, schedule, sharding, MoE dispatch and overlap): pin or narrow axes with spec.tuning.fixed or spec.tuning.allowed"
                ),
            ));
        }
        Ok(space)
    }

    /// Layer splits to try for `pp` stages of `vpp` chunks: the even split or the balanced
    /// uneven ones ([`end_splits`]), and the balanced pipeline layout when it exists.
    pub fn splits(&self, pp: u32, vpp: u32) -> Vec<Split> {
        let mut out = end_splits(self.layers, pp, vpp);
        if self.balanced.contains_key(&(pp, vpp)) {
            out.push(Split::Balanced);
        }
        out
    }

    /// Set a layout's split fields.
    pub fn apply_split(&self, l: &mut Layout, split: Split) {
        let (first, last, layout) = match split {
            Split::Even => (None, None, None),
            Split::Ends(f, last) => (f, last, None),
            Split::Balanced => (None, None, self.balanced.get(&(l.pp, l.vpp)).cloned()),
        };
        l.first_stage_layers = first;
        l.last_stage_layers = last;
        l.pipeline_layout = layout;
    }

    /// Chunk counts to try for a pipeline of `pp` stages.
    pub fn vpp_values(&self, pp: u32) -> Vec<u32> {
        if pp <= 1 {
            return match &self.vpp {
                Some(v) if !v.contains(&1) => Vec::new(),
                _ => vec![1],
            };
        }
        let most = (self.layers / pp).max(1);
        let candidates: Vec<u32> = match &self.vpp {
            Some(v) => v.clone(),
            None => (1..=most).collect(),
        };
        candidates
            .into_iter()
            .filter(|v| !self.splits(pp, *v).is_empty())
            .collect()
    }

    /// Expert-TP sizes to try with `tp`.
    pub fn etp_values(&self, tp: u32, moe: bool) -> Vec<u32> {
        if !moe {
            return match &self.etp {
                Some(v) if !v.contains(&1) => Vec::new(),
                _ => vec![1],
            };
        }
        match &self.etp {
            Some(v) => v.clone(),
            None => divisors_u32(tp),
        }
    }

    /// Schedules to try for a pipeline of `pp` stages and `vpp` chunks.
    pub fn schedule_values(&self, pp: u32, vpp: u32) -> Vec<Schedule> {
        let legal: &[Schedule] = if pp <= 1 {
            &[Schedule::OneFOneB]
        } else if vpp > 1 {
            &[Schedule::Interleaved]
        } else {
            &[Schedule::OneFOneB, Schedule::ZeroBubble]
        };
        self.schedule
            .iter()
            .copied()
            .filter(|s| legal.contains(s))
            .collect()
    }

    /// Every structure (layout less micro-batch size and recompute) of the space, in a stable
    /// order (at most [`MAX_STRUCTURES`]: [`Space::new`] refuses larger spaces). Only (tp, pp,
    /// cp) whose product divides the GPU count are combined.
    pub fn structures(&self, s: &Scenario) -> Vec<Structure> {
        let mut out = Vec::new();
        self.each_structure(s, MAX_STRUCTURES, |st| out.push(st));
        out
    }

    /// How many structures the space holds, counting no further than `cap`.
    fn count_structures(&self, s: &Scenario, cap: usize) -> usize {
        let mut n = 0;
        self.each_structure(s, cap, |_| n += 1);
        n
    }

    /// Call `f` with each structure, in order, at most `cap` times.
    fn each_structure(&self, s: &Scenario, cap: usize, mut f: impl FnMut(Structure)) {
        let moe = s.model.moe.is_some();
        let mut seen = 0usize;
        for &tp in &self.tp {
            for &pp in &self.pp {
                for &cp in &self.cp {
                    let mp = tp as u64 * pp as u64 * cp as u64;
                    if mp == 0 || !(self.gpus as u64).is_multiple_of(mp) {
                        continue;
                    }
                    for vpp in self.vpp_values(pp) {
                        for split in self.splits(pp, vpp) {
                            for schedule in self.schedule_values(pp, vpp) {
                                for &ep in &self.ep {
                                    for etp in self.etp_values(tp, moe) {
                                        for &sharding in &self.sharding {
                                            for choice in self.moe_values(moe, pp, vpp, ep) {
                                                if seen == cap {
                                                    return;
                                                }
                                                seen += 1;
                                                f(Structure {
                                                    tp,
                                                    pp,
                                                    vpp,
                                                    cp,
                                                    ep,
                                                    etp,
                                                    split,
                                                    schedule,
                                                    sharding,
                                                    moe: choice,
                                                });
                                            }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The MoE choices to try for a pipeline of `pp` stages of `vpp` chunks at expert
    /// parallelism `ep`: `[None]` for dense models; every dispatcher, also without EP (the
    /// dispatchers still differ there: what they gather over expert TP, the fused permute of
    /// the flex ones, which the rules allow only with ETP x EP > 1); the overlap only where it
    /// is legal.
    pub fn moe_values(&self, moe: bool, pp: u32, vpp: u32, ep: u32) -> Vec<Option<MoeChoice>> {
        if !moe {
            return vec![None];
        }
        let mut out = Vec::new();
        for &dispatch in &self.dispatch {
            for &ep_overlap in &self.ep_overlap {
                let legal = !ep_overlap
                    || (ep > 1 && dispatch != Dispatch::Allgather && (pp <= 1 || vpp > 1));
                if legal {
                    out.push(Some(MoeChoice {
                        dispatch,
                        ep_overlap,
                    }));
                }
            }
        }
        out
    }

    /// The layout of a structure with a micro-batch size and recompute choice.
    pub fn layout(&self, st: &Structure, mbs: u32, rc: RecomputeChoice) -> Layout {
        let mut l = self.base.clone();
        l.tp = st.tp;
        l.pp = st.pp;
        l.vpp = st.vpp;
        l.cp = st.cp;
        l.ep = st.ep;
        l.etp = st.etp;
        l.schedule = st.schedule;
        self.apply_split(&mut l, st.split);
        st.sharding.apply(&mut l);
        l.micro_batch_size = mbs;
        rc.apply(&mut l);
        if let Some(choice) = st.moe {
            choice.apply(&mut l);
        }
        l
    }

    /// The structure of a layout.
    pub fn structure_of(l: &Layout) -> Structure {
        Structure {
            tp: l.tp,
            pp: l.pp,
            vpp: l.vpp,
            cp: l.cp,
            ep: l.ep,
            etp: l.etp,
            split: match (
                &l.pipeline_layout,
                l.first_stage_layers,
                l.last_stage_layers,
            ) {
                (Some(_), _, _) => Split::Balanced,
                (None, None, None) => Split::Even,
                (None, f, last) => Split::Ends(f, last),
            },
            schedule: l.schedule,
            sharding: Sharding::of(l),
            moe: None,
        }
    }

    /// The structure of a layout of a scenario's model (with its MoE choice).
    pub fn structure_in(s: &Scenario, l: &Layout) -> Structure {
        let mut st = Space::structure_of(l);
        if s.model.moe.is_some() {
            st.moe = Some(MoeChoice::of(l));
        }
        st
    }

    /// Most layers in one model chunk of a structure (what full recompute can count up to).
    pub fn max_chunk_layers(&self, st: &Structure) -> u32 {
        let l = self.layout(st, 1, RecomputeChoice::NONE);
        (0..st.pp.max(1))
            .map(|r| l.chunk_layers(self.layers, r))
            .max()
            .unwrap_or(0)
    }

    /// Full-recompute layer counts of a structure, fewest recomputed layers first; 0 (every
    /// layer) last. A count equal to the largest chunk is the same as 0 and left out.
    pub fn full_recompute_counts(&self, st: &Structure) -> Vec<u32> {
        if let Some(k) = self.recompute_layers {
            return vec![k];
        }
        let most = self.max_chunk_layers(st);
        let mut v: Vec<u32> = (1..most).collect();
        v.push(0);
        v
    }

    /// The union of the selective module sets: it keeps no more than any of them (adding a
    /// module never adds memory), so it bounds the selective family's memory from below.
    pub fn most_saving_modules(&self) -> ModuleSet {
        self.recompute_modules
            .iter()
            .fold(ModuleSet::EMPTY, |a, m| a.union(*m))
    }

    /// The recompute family of a structure without listing it: (first choice, a choice that
    /// saves at least as much memory as any member, number of choices), as
    /// [`Space::recompute_choices`] would list them. With selective recompute last, the
    /// memory-saving choice is the union of its module sets (a member when, as by default, the
    /// last set is the union).
    pub fn recompute_family(
        &self,
        st: &Structure,
    ) -> Option<(RecomputeChoice, RecomputeChoice, u64)> {
        if st.moe.is_some_and(|c| c.ep_overlap) {
            // The overlap's family (no full recompute, no `moe` module): listed.
            let choices = self.recompute_choices(st);
            let first = *choices.first()?;
            let most = choices
                .iter()
                .filter(|c| c.recompute == Recompute::Selective)
                .fold(ModuleSet::EMPTY, |a, c| a.union(c.modules));
            let last = if most.is_empty() {
                *choices.last()?
            } else {
                RecomputeChoice::selective(most)
            };
            return Some((first, last, choices.len() as u64));
        }
        let first = *self.recompute.first()?;
        let last = *self.recompute.last()?;
        let (full_first, full_len) = match self.recompute_layers {
            Some(k) => (k, 1),
            None if self.recompute.contains(&Recompute::Full) => {
                let most = self.max_chunk_layers(st);
                (if most > 1 { 1 } else { 0 }, most.max(1) as u64)
            }
            None => (0, 0),
        };
        let selective_len = self.recompute_modules.len() as u64;
        let len = self
            .recompute
            .iter()
            .map(|r| match r {
                Recompute::Full => full_len,
                Recompute::Selective => selective_len,
                Recompute::None => 1,
            })
            .sum();
        if len == 0 {
            return None;
        }
        let first = match first {
            Recompute::None => RecomputeChoice::NONE,
            Recompute::Selective => RecomputeChoice::selective(*self.recompute_modules.first()?),
            Recompute::Full => RecomputeChoice::full(full_first),
        };
        let last = match last {
            Recompute::None => RecomputeChoice::NONE,
            Recompute::Selective => RecomputeChoice::selective(self.most_saving_modules()),
            Recompute::Full => RecomputeChoice::full(self.recompute_layers.unwrap_or(0)),
        };
        Some((first, last, len))
    }

    /// Every recompute choice of a structure: none, the selective module sets, full with
    /// every layer count (fewest first, 0 = every layer last).
    pub fn recompute_choices(&self, st: &Structure) -> Vec<RecomputeChoice> {
        let mut out = Vec::new();
        let overlap = st.moe.is_some_and(|c| c.ep_overlap);
        for &r in &self.recompute {
            match r {
                // Megatron's EP overlap runs without full recompute and without the `moe`
                // recompute module (TransformerConfig.__post_init__).
                Recompute::Full if overlap => {}
                Recompute::Selective if overlap => out.extend(
                    self.recompute_modules
                        .iter()
                        .filter(|m| !m.contains(RecomputeModule::Moe))
                        .map(|m| RecomputeChoice::selective(*m)),
                ),
                Recompute::Full => out.extend(
                    self.full_recompute_counts(st)
                        .into_iter()
                        .map(RecomputeChoice::full),
                ),
                Recompute::Selective => out.extend(
                    self.recompute_modules
                        .iter()
                        .map(|m| RecomputeChoice::selective(*m)),
                ),
                Recompute::None => out.push(RecomputeChoice::NONE),
            }
        }
        out
    }

    /// Whether a layout is a member of the space (every searched axis takes an allowed value
    /// and every other field equals the space's).
    pub fn contains(&self, s: &Scenario, l: &Layout) -> bool {
        let st = Space::structure_in(s, l);
        let moe = s.model.moe.is_some();
        let mp = l.tp as u64 * l.pp as u64 * l.cp as u64;
        let structural = self.tp.contains(&l.tp)
            && self.pp.contains(&l.pp)
            && self.cp.contains(&l.cp)
            && mp > 0
            && (self.gpus as u64).is_multiple_of(mp)
            && self.vpp_values(l.pp).contains(&l.vpp)
            && self.splits(l.pp, l.vpp).contains(&st.split)
            && self.schedule_values(l.pp, l.vpp).contains(&l.schedule)
            && self.ep.contains(&l.ep)
            && self.etp_values(l.tp, moe).contains(&l.etp)
            && self.sharding.contains(&st.sharding)
            && self.micro_batch_size.contains(&l.micro_batch_size)
            && self.moe_values(moe, l.pp, l.vpp, l.ep).contains(&st.moe);
        if !structural {
            return false;
        }
        let rc = RecomputeChoice::of(l);
        if !self.recompute_choices(&st).contains(&rc) {
            return false;
        }
        // The fields the search does not touch (and a pipeline layout other than the balanced
        // one).
        self.layout(&st, l.micro_batch_size, rc) == *l
    }

    /// Bring a layout into the space where that is a matter of dependent fields: `vpp` falls
    /// back to 1 (or the first allowed) when the pipeline cannot take it, `etp` to the largest
    /// allowed value not above it, the schedule follows `vpp`, the layer split follows
    /// `pp`/`vpp`, the recompute layer count stays within the largest chunk, the unsearched
    /// fields take the space's values. `None` when an axis value is outside the space.
    pub fn normalize(&self, s: &Scenario, l: &Layout) -> Option<Layout> {
        let mut l = l.clone();
        let vpps = self.vpp_values(l.pp);
        if !vpps.contains(&l.vpp) {
            l.vpp = if vpps.contains(&1) { 1 } else { *vpps.first()? };
        }
        let etps = self.etp_values(l.tp, s.model.moe.is_some());
        if !etps.contains(&l.etp) {
            l.etp = etps
                .iter()
                .copied()
                .filter(|v| *v <= l.etp)
                .max()
                .or_else(|| etps.first().copied())?;
        }
        let base = &self.base;
        if s.model.moe.is_some() {
            // The unsearched MoE options take the space's values; the dispatcher and overlap
            // keep the layout's when the space has them, else its first.
            let choice = MoeChoice::of(&l);
            l.moe = base.moe.clone();
            let choices = self.moe_values(true, l.pp, l.vpp, l.ep);
            let keep = choices.contains(&Some(choice));
            (*choices.first()?)?.apply(&mut l);
            if keep {
                choice.apply(&mut l);
            }
        }
        l.sequence_parallel = base.sequence_parallel;
        l.tp_comm_overlap = base.tp_comm_overlap;
        l.overlap_grad_reduce = base.overlap_grad_reduce;
        l.overlap_param_gather = base.overlap_param_gather;
        l.grad_reduce_in_fp32 = base.grad_reduce_in_fp32;
        l.copy_memory_options(base);
        let schedules = self.schedule_values(l.pp, l.vpp);
        if !schedules.contains(&l.schedule) {
            l.schedule = *schedules.first()?;
        }
        let splits = self.splits(l.pp, l.vpp);
        let split = Space::structure_of(&l).split;
        let balanced_ok = split != Split::Balanced
            || self.balanced.get(&(l.pp, l.vpp)) == l.pipeline_layout.as_ref();
        if !splits.contains(&split) || !balanced_ok {
            self.apply_split(&mut l, *splits.first()?);
        }
        if l.recompute != Recompute::Selective {
            l.recompute_modules = None;
        } else {
            // The module list in the space's form (the default as no list); a set outside the
            // space falls back to the first of its sets.
            let mut set = l.recompute_set();
            if !self.recompute_modules.contains(&set) {
                set = *self.recompute_modules.first()?;
            }
            RecomputeChoice::selective(set).apply(&mut l);
        }
        if l.recompute != Recompute::Full {
            l.recompute_layers = 0;
        } else {
            let counts = self.full_recompute_counts(&Space::structure_in(s, &l));
            if !counts.contains(&l.recompute_layers) {
                l.recompute_layers = if self.recompute_layers.is_some() {
                    counts[0]
                } else {
                    0
                };
            }
        }
        self.contains(s, &l).then_some(l)
    }

    /// An agent proposal brought into the space: the grid's axes as [`Space::normalize`]
    /// brings them, then the options the grid holds fixed taken from the proposal where the
    /// plan leaves them open ([`OpenOptions`]): sequence parallelism, the overlap switches
    /// (`tpCommOverlap`, `overlapGradReduce`, `overlapParamGather`), a selective recompute
    /// module list outside the space's sets, and an explicit layer split
    /// (`firstStageLayers`/`lastStageLayers` or `pipelineLayout`) for the proposal's own
    /// pipeline. Returns the layout and the names of the options set beyond the grid; the
    /// legality rules and the memory pre-filter judge the result. `None`: outside the space.
    pub fn normalize_open(&self, s: &Scenario, p: &Layout) -> Option<(Layout, Vec<String>)> {
        let grid = self.normalize(s, p)?;
        let mut l = grid.clone();
        let mut beyond = Vec::new();
        if self.open.sequence_parallel && p.sequence_parallel != l.sequence_parallel {
            l.sequence_parallel = p.sequence_parallel;
            beyond.push("sequenceParallel".to_string());
        }
        for (name, from, to) in [
            ("tpCommOverlap", p.tp_comm_overlap, &mut l.tp_comm_overlap),
            (
                "overlapGradReduce",
                p.overlap_grad_reduce,
                &mut l.overlap_grad_reduce,
            ),
            (
                "overlapParamGather",
                p.overlap_param_gather,
                &mut l.overlap_param_gather,
            ),
        ] {
            if *to != from {
                *to = from;
                beyond.push(name.to_string());
            }
        }
        if self.open.recompute_modules
            && p.recompute == Recompute::Selective
            && l.recompute == Recompute::Selective
            && p.recompute_modules.as_ref().is_some_and(|m| !m.is_empty())
            && p.recompute_set() != l.recompute_set()
        {
            l.recompute_modules = p.recompute_modules.clone();
            beyond.push("recomputeModules".to_string());
        }
        let explicit = p.pipeline_layout.is_some()
            || p.first_stage_layers.is_some()
            || p.last_stage_layers.is_some();
        let split = |x: &Layout| {
            (
                x.first_stage_layers,
                x.last_stage_layers,
                x.pipeline_layout.as_ref().map(|pl| pl.as_str().to_string()),
            )
        };
        if explicit && (p.pp, p.vpp) == (l.pp, l.vpp) && split(p) != split(&l) {
            l.first_stage_layers = p.first_stage_layers;
            l.last_stage_layers = p.last_stage_layers;
            l.pipeline_layout = p.pipeline_layout.clone();
            beyond.push("layer split".to_string());
        }
        Some((l, beyond))
    }

    /// Number of layouts the space holds without pruning (structures x micro-batch sizes x
    /// recompute choices), before legality and memory.
    pub fn size(&self, s: &Scenario) -> u64 {
        self.structures(s)
            .iter()
            .map(|st| self.recompute_choices(st).len() as u64)
            .sum::<u64>()
            * self.micro_batch_size.len() as u64
    }
}

/// Layer splits by stage counts for `layers` decoder layers over `pp` stages of `vpp` chunks: the
/// even split when it exists, else the balanced uneven ones (every middle stage gets
/// `ceil(layers / (pp*vpp)) * vpp` layers, the first and/or last stage the rest).
pub fn end_splits(layers: u32, pp: u32, vpp: u32) -> Vec<Split> {
    let chunks = pp.saturating_mul(vpp);
    if chunks == 0 || layers < chunks {
        return Vec::new();
    }
    if layers.is_multiple_of(chunks) {
        return vec![Split::Even];
    }
    if pp < 2 {
        return Vec::new();
    }
    let per = layers.div_ceil(chunks) * vpp;
    let mut out = Vec::new();
    let ok = |v: u32| v > 0 && v.is_multiple_of(vpp);
    // One light end: the other pp-1 stages take `per` layers each.
    if let Some(rest) = layers.checked_sub((pp - 1) * per)
        && ok(rest)
    {
        out.push(Split::Ends(None, Some(rest)));
        out.push(Split::Ends(Some(rest), None));
    }
    // Both ends light: pp-2 middle stages of `per`, the rest shared by first and last.
    if pp >= 3
        && let Some(rest) = layers.checked_sub((pp - 2) * per)
    {
        let first = rest / 2 / vpp * vpp;
        let last = rest - first;
        if ok(first) && ok(last) && last <= per {
            out.push(Split::Ends(Some(first), Some(last)));
            if first != last {
                out.push(Split::Ends(Some(last), Some(first)));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors_are_sorted() {
        assert_eq!(divisors(12), vec![1, 2, 3, 4, 6, 12]);
        assert_eq!(divisors(1), vec![1]);
        assert_eq!(divisors(64), vec![1, 2, 4, 8, 16, 32, 64]);
    }

    #[test]
    fn splits_are_even_or_balanced() {
        assert_eq!(end_splits(80, 8, 5), vec![Split::Even]);
        // 126 layers over 8 stages: 7 x 16 + 14.
        let s = end_splits(126, 8, 1);
        assert!(s.contains(&Split::Ends(None, Some(14))));
        assert!(s.contains(&Split::Ends(Some(14), None)));
        assert!(s.contains(&Split::Ends(Some(15), Some(15))));
        for split in s {
            let Split::Ends(f, l) = split else {
                panic!("126 layers do not split evenly over 8")
            };
            let middle = 8 - f.is_some() as u32 - l.is_some() as u32;
            assert_eq!(f.unwrap_or(0) + l.unwrap_or(0) + middle * 16, 126);
        }
        // 62 layers over 8 stages of 2 chunks: middle stages of 8 layers.
        let s = end_splits(62, 8, 2);
        assert!(!s.is_empty());
        for split in s {
            let Split::Ends(f, l) = split else { panic!() };
            let ends = f.is_some() as u32 + l.is_some() as u32;
            let middle = 62 - f.unwrap_or(0) - l.unwrap_or(0);
            assert_eq!(middle, (8 - ends) * 8);
            assert_eq!(f.unwrap_or(2) % 2, 0);
            assert_eq!(l.unwrap_or(2) % 2, 0);
        }
        // An odd layer count never splits into chunks of an even count per stage.
        assert!(end_splits(61, 8, 2).is_empty());
        assert!(end_splits(5, 8, 1).is_empty());
        assert_eq!(end_splits(7, 1, 1), vec![Split::Even]);
    }

    #[test]
    fn balanced_layouts_count_embedding_and_loss() {
        let c = crate::profiles::Catalog::builtin().unwrap();
        let hardware = c.hardware("h100-sxm").unwrap().clone();
        let s = Scenario {
            model: c.model("deepseek-v3").unwrap().clone(),
            cluster: crate::scenario::Cluster {
                gpus: 1024,
                gpus_per_node: 8,
            },
            hardware,
            training: crate::scenario::Training {
                seq_length: 4096,
                global_batch_size: 8192,
                precision: crate::precision::Precision::Bf16,
            },
        };
        let space = Space::new(&s, &Tuning::default(), None).unwrap();
        // 61 layers + 1 MTP + embedding + loss = 64 slots: 8 stages x 4 chunks of 2.
        assert!(space.splits(8, 4).contains(&Split::Balanced));
        assert!(space.vpp_values(8).contains(&4));
        let st = space
            .structures(&s)
            .into_iter()
            .find(|st| st.pp == 8 && st.vpp == 4)
            .expect("interleaved DeepSeek-V3 layouts are in the space");
        let l = space.layout(&st, 1, RecomputeChoice::NONE);
        l.check(&s).expect("legal");
        assert!(space.contains(&s, &l));
        assert_eq!(Space::structure_of(&l).split, Split::Balanced);
        // A different explicit layout is not a member, and normalizes to the balanced one.
        let mut other = l.clone();
        other.pipeline_layout = Some(PipelineLayout::parse("Et|(tt|)*30mL").unwrap());
        if other != l {
            assert!(!space.contains(&s, &other));
            assert_eq!(space.normalize(&s, &other), Some(l));
        }
    }
}
