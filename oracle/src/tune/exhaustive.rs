//! Exhaustive search: every layout of the space (structures, i.e. layouts less their
//! micro-batch size and recomputation, times micro-batch sizes times recompute choices),
//! spread over all cores with rayon.
//!
//! Safe pruning (on by default; [`Exhaustive::prune`]) skips only candidates that provably
//! cannot enter the top list, given properties of the model that hold by construction (and
//! that the tests check: against the unpruned search, a brute-force loop, and the bound
//! against the projection):
//! - memory grows with the micro-batch size and shrinks with more recomputation: once the
//!   most memory-saving recompute choice fails at a micro-batch size, every larger size fails;
//!   the fewest full-recompute layers that fit are found by bisection;
//! - recomputation only adds time: when nothing is recomputed and the layout fits, the
//!   recomputing variants are slower; among full-recompute layer counts the fewest that fit is
//!   the fastest;
//! - branch and bound, best first: [`ThroughputBound`] bounds the throughput of every layout
//!   sharing a compute key from above, whatever its pipeline and sharding. Phase 1 screens
//!   every structure and micro-batch size (rules, the memory of the most memory-saving choice,
//!   the bound against the seed planner's k-th best). Phase 2 projects the survivors in
//!   descending order of their bound, in rounds of 64, and stops when the next bound is
//!   below the k-th best found: nothing after it can enter the top list. The bar rises only
//!   between rounds, so what is projected, and every counter, is the same on any number of
//!   threads.
//!
//! The top list holds the best layouts that are not dominated: a layout is left out when the
//! same layout with less recomputation fits (it is slower by construction): nothing recomputed
//! when that fits, else selective and the fewest full-recompute layers that fit. The unpruned
//! search examines everything and reports the same way.

use std::collections::BTreeMap;

use rayon::prelude::*;

use super::bound::ThroughputBound;
use super::prefilter::{Rejection, memory_reason};
use super::seed::SeedPlanner;
use super::space::{MoeChoice, RecomputeChoice, Structure};
use super::trials::{Source, Trial, TrialLog};
use super::{Context, Outcome, Scored, Searcher, Stats, TopK, least_fitting, non_dominated};
use crate::layout::{ModuleSet, Recompute, RuleId};
use crate::memory;
use crate::plan::SearcherKind;

/// The exhaustive searcher.
#[derive(Debug, Clone, Copy)]
pub struct Exhaustive {
    /// Skip candidates that provably cannot win (see the module documentation).
    pub prune: bool,
}

impl Default for Exhaustive {
    fn default() -> Self {
        Exhaustive { prune: true }
    }
}

/// Relative slack on the bound, for rounding between two projections.
const BOUND_MARGIN: f64 = 1e-9;

struct Task {
    top: TopK,
    stats: Stats,
    /// The layouts projected (memory and rule rejections are only counted: there are
    /// millions).
    trials: TrialLog,
}

impl Task {
    fn new(k: usize) -> Task {
        Task {
            top: TopK::new(k),
            stats: Stats::default(),
            trials: TrialLog::default(),
        }
    }

    fn merge(mut self, o: Task) -> Task {
        self.stats.merge(&o.stats);
        self.top = self.top.merge(o.top);
        self.trials.extend(o.trials);
        self
    }
}

impl Exhaustive {
    /// Project a layout that passed the pre-filter.
    fn project(ctx: &Context<'_>, l: crate::layout::Layout, task: &mut Task) -> Option<Scored> {
        match ctx.step_time(&l) {
            Ok(time) => {
                task.stats.evaluated += 1;
                ctx.progress.add(1, 1);
                ctx.progress.offer_best(time.tokens_per_second_per_gpu);
                task.trials.push(Trial::scored(
                    Source::Exhaustive,
                    &l,
                    time.tokens_per_second_per_gpu,
                ));
                Some(Scored { layout: l, time })
            }
            Err(e) => {
                // The rules passed before; a projection-time rule still counts as a rule.
                task.stats
                    .reject(ctx.scenario, &l, &super::Rejection::Rule(e), 1);
                ctx.progress.add(1, 0);
                None
            }
        }
    }

    /// Memory, then time, of one legal layout.
    fn try_layout(ctx: &Context<'_>, l: crate::layout::Layout, task: &mut Task) -> Option<Scored> {
        match ctx.filter.memory(ctx.scenario, &l) {
            Ok(()) => Self::project(ctx, l, task),
            Err(r) => {
                task.stats.reject(ctx.scenario, &l, &r, 1);
                ctx.progress.add(1, 0);
                None
            }
        }
    }

    /// One task of the unpruned search: structures that share the pipeline shape and the
    /// data-parallel size, so at a given micro-batch size they share the number of
    /// micro-batches and the schedule simulator's cached pass order serves them all.
    /// Micro-batch sizes outside, structures inside.
    fn run_group(&self, ctx: &Context<'_>, group: &[Structure]) -> Task {
        let space = ctx.space;
        let mut task = Task::new(ctx.top_k);
        let bound = ThroughputBound::new();
        for &mbs in &space.micro_batch_size {
            for st in group {
                let choices = space.recompute_choices(st);
                if choices.is_empty() {
                    continue;
                }
                if ctx
                    .filter
                    .rules(ctx.scenario, &space.layout(st, mbs, choices[0]))
                    .is_ok()
                    && flex_dominated(ctx, &bound, st, mbs)
                {
                    task.stats.pruned += choices.len() as u64;
                    continue;
                }
                self.run_one(ctx, st, &choices, mbs, 0.0, None, &mut task);
            }
        }
        task
    }

    /// One structure at one micro-batch size (`upper`: the throughput bound of its compute
    /// key); false when pruning found that nothing of this micro-batch size fits (so no larger
    /// one does).
    #[allow(clippy::too_many_arguments)]
    fn run_one(
        &self,
        ctx: &Context<'_>,
        st: &Structure,
        choices: &[RecomputeChoice],
        mbs: u32,
        known: f64,
        upper: Option<f64>,
        task: &mut Task,
    ) -> bool {
        let space = ctx.space;
        let s = ctx.scenario;
        let family = choices.len() as u64;
        if self.prune && cannot_win(ctx, known, upper, task) {
            task.stats.pruned += family;
            return true;
        }
        // The rules do not depend on the recompute choice (the layer counts are generated
        // within the chunks), so one check speaks for the whole family.
        let first = space.layout(st, mbs, choices[0]);
        if let Err(r) = ctx.filter.rules(s, &first) {
            task.stats.reject(s, &first, &r, family);
            ctx.progress.add(family, 0);
            return true;
        }
        if !self.prune {
            Self::examine_family(ctx, st, choices, mbs, task);
            return true;
        }
        Self::bound_family(ctx, st, mbs, first, family, task)
    }

    /// The unpruned search: examine every recompute choice and report what the pruned search
    /// reports (the layouts that no less-recomputing variant of the same layout beats).
    fn examine_family(
        ctx: &Context<'_>,
        st: &Structure,
        choices: &[RecomputeChoice],
        mbs: u32,
        task: &mut Task,
    ) {
        let space = ctx.space;
        let mut none = None;
        let mut selective: Vec<(ModuleSet, Scored)> = Vec::new();
        let mut full = None;
        for &rc in choices {
            let r = Self::try_layout(ctx, space.layout(st, mbs, rc), task);
            match rc.recompute {
                Recompute::None => none = r,
                Recompute::Selective => selective.extend(r.map(|c| (rc.modules, c))),
                Recompute::Full => {
                    if full.is_none() {
                        full = r;
                    }
                }
            }
        }
        match none {
            Some(c) => task.top.push(c),
            None => {
                // A module set is beaten by any fitting set of fewer of its modules.
                let fitting: Vec<ModuleSet> = selective.iter().map(|(m, _)| *m).collect();
                selective
                    .into_iter()
                    .filter(|(m, _)| !fitting.iter().any(|f| f != m && f.is_subset(*m)))
                    .map(|(_, c)| c)
                    .chain(full)
                    .for_each(|c| task.top.push(c));
            }
        }
    }

    /// The pruned search over the recompute choices of one legal layout (`first`, nothing
    /// recomputed when the space allows it): the least recomputation that fits wins, so stop
    /// at it. False when nothing fits.
    fn bound_family(
        ctx: &Context<'_>,
        st: &Structure,
        mbs: u32,
        first: crate::layout::Layout,
        family: u64,
        task: &mut Task,
    ) -> bool {
        let space = ctx.space;
        // Nothing recomputed: when it fits, every recomputing variant is slower.
        if space.recompute.contains(&Recompute::None)
            && let Some(c) = Self::try_layout(ctx, first, task)
        {
            task.top.push(c);
            task.stats.pruned += family - 1;
            return true;
        }
        let mut any_fit = false;
        if space.recompute.contains(&Recompute::Selective) {
            // Fewest modules first: a set with a fitting subset recomputes more for nothing
            // (recomputation only adds time) and is skipped.
            let mut sets = space.recompute_modules.clone();
            sets.sort_by_key(|m| m.len());
            let mut fitting: Vec<ModuleSet> = Vec::new();
            for m in sets {
                if fitting.iter().any(|f| f.is_subset(m)) {
                    task.stats.pruned += 1;
                    continue;
                }
                let rc = RecomputeChoice::selective(m);
                if let Some(c) = Self::try_layout(ctx, space.layout(st, mbs, rc), task) {
                    task.top.push(c);
                    fitting.push(m);
                    any_fit = true;
                }
            }
        }
        if space.recompute.contains(&Recompute::Full) {
            let counts = space.full_recompute_counts(st);
            let with = |k: u32| space.layout(st, mbs, RecomputeChoice::full(k));
            if let Some(idx) = least_fitting(ctx, &counts, with, &mut task.stats) {
                any_fit = true;
                if let Some(c) = Self::project(ctx, with(counts[idx]), task) {
                    task.top.push(c);
                }
            }
        }
        any_fit
    }
}

/// Branch and bound: a family whose throughput bound `upper` (nothing recomputed is the least
/// work of the family) is below the best `top_k`-th found so far (or `known`) cannot win.
fn cannot_win(ctx: &Context<'_>, known: f64, upper: Option<f64>, task: &Task) -> bool {
    let threshold = match task.top.as_slice() {
        t if t.len() >= ctx.top_k => known.max(t[t.len() - 1].tokens_per_second()),
        _ => known,
    };
    threshold > 0.0 && upper.is_some_and(|ub| ub * (1.0 + BOUND_MARGIN) < threshold)
}

/// Whether another flex backend of the space beats this structure's at this micro-batch size
/// (EP overlap off) and fits wherever it fits: the flex backends differ in time only in the
/// dispatch and combine, which enter the forward and the backward of every MoE layer alike,
/// so the one with the larger throughput bound is faster for every pipeline and recomputation
/// (ties go to the backend listed first); in memory only in their buffers
/// ([`crate::memory::dispatcher`]), added alike to every stage, so a backend with no more
/// buffer bytes fits whenever this one does (one with more may not: no pruning then; test
/// `a_flex_backend_is_not_pruned_for_a_faster_one_with_larger_buffers`). With EP overlap the
/// dispatch hides behind other work to a degree the bound does not see, and the order can
/// flip (Qwen3-30B-A3B on 16 H100, TP2 EP8 MBS2: without overlap DeepEP 8,181 > HybridEP
/// 7,347 tok/s/GPU, with it HybridEP 9,731 > DeepEP 9,332): no pruning then.
fn flex_dominated(ctx: &Context<'_>, bound: &ThroughputBound, st: &Structure, mbs: u32) -> bool {
    let Some(choice) = st.moe else {
        return false;
    };
    if choice.dispatch.parts().1.is_none() || choice.ep_overlap {
        return false;
    }
    let space = ctx.space;
    let s = ctx.scenario;
    let layout_of = |d| {
        let mut other = *st;
        other.moe = Some(MoeChoice {
            dispatch: d,
            ep_overlap: choice.ep_overlap,
        });
        space.layout(&other, mbs, RecomputeChoice::NONE)
    };
    let own_layout = layout_of(choice.dispatch);
    let own = bound.upper(ctx, &own_layout).unwrap_or(0.0);
    let own_buffers = memory::dispatcher::dispatcher_bytes(s, &own_layout);
    let own_index = space.dispatch.iter().position(|d| *d == choice.dispatch);
    space.dispatch.iter().enumerate().any(|(i, &d)| {
        if d == choice.dispatch || d.parts().1.is_none() {
            return false;
        }
        let l = layout_of(d);
        if memory::dispatcher::dispatcher_bytes(s, &l) > own_buffers {
            return false;
        }
        let other = bound.upper(ctx, &l).unwrap_or(0.0);
        other > own * (1.0 + BOUND_MARGIN)
            || (other >= own * (1.0 - BOUND_MARGIN) && Some(i) < own_index)
    })
}

/// What the structures of one MoE run share during the screen: the structure rules per
/// micro-batch size with the layouts they rejected so far, the memory peaks found so far
/// (see [`RunPeak`]) and the memory rejections (see [`MemoryRejection`]), and the examined
/// layouts not yet reported to the progress. The counts go into the run's `Stats` once at
/// its end (one map update per rule, not per structure).
struct Shared<'a> {
    structure_rules: &'a [Result<(), RuleId>],
    rule_rejected: &'a mut [u64],
    peaks: &'a mut Vec<RunPeak>,
    memory: &'a mut Vec<MemoryRejection>,
    examined: &'a mut u64,
}

/// A memory peak of a run: micro-batch size, recompute choice, the peak without the fused
/// dispatcher's buffers (the only memory the MoE choice moves: each structure adds its own,
/// `memory::peak_bytes_before_dispatcher`) and its stage.
type RunPeak = (u32, RecomputeChoice, f64, u32);

/// Memory rejections of a run: micro-batch size, recompute choice, the dispatcher's buffer
/// bytes (as bits, compared exactly), the reason, and how many layouts it rejected.
type MemoryRejection = (u32, RecomputeChoice, u64, &'static str, u64);

/// Runs of adjacent structures that differ only in the MoE choice ([`Space::structures`]
/// enumerates it innermost), as index ranges.
fn moe_runs(structures: &[Structure]) -> Vec<std::ops::Range<usize>> {
    let same = |a: &Structure, b: &Structure| Structure { moe: b.moe, ..*a } == *b;
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=structures.len() {
        if i == structures.len() || !same(&structures[i], &structures[start]) {
            out.push(start..i);
            start = i;
        }
    }
    out
}

/// Structures grouped by pipeline shape and data-parallel size, in a stable order.
fn groups(structures: &[Structure]) -> Vec<Vec<Structure>> {
    let mut map: BTreeMap<_, Vec<Structure>> = BTreeMap::new();
    for &st in structures {
        let key = (st.pp, st.vpp, st.schedule, st.tp * st.cp, st.split);
        map.entry(key).or_default().push(st);
    }
    map.into_values().collect()
}

/// A structure and micro-batch size worth projecting, with its throughput bound.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    structure: usize,
    mbs: u32,
    upper: f64,
}

/// What phase 1 found for one run of structures: its counters, the candidates worth
/// projecting, and each structure's family size.
struct Screened {
    stats: Stats,
    candidates: Vec<Candidate>,
    families: Vec<u64>,
}

/// Candidates projected per round of the best-first phase: the bar rises between rounds only,
/// so what is projected does not depend on thread timing.
const ROUND: usize = 64;

impl Exhaustive {
    /// Phase 1 for a run of structures that differ only in the MoE choice (`first` is the
    /// index of the run's first): the structure rules are checked once per micro-batch size
    /// for the run, the memory once per micro-batch size and recompute family (the MoE
    /// choice moves only the dispatcher's buffers, added per structure).
    fn screen_run(
        &self,
        ctx: &Context<'_>,
        first: usize,
        run: &[Structure],
        known: f64,
        bound: &ThroughputBound,
    ) -> Screened {
        let space = ctx.space;
        let s = ctx.scenario;
        let structure_rules: Vec<Result<(), RuleId>> = space
            .micro_batch_size
            .iter()
            .map(|&mbs| {
                space
                    .layout(&run[0], mbs, RecomputeChoice::NONE)
                    .check_structure_rule(s)
            })
            .collect();
        let mut rule_rejected = vec![0u64; structure_rules.len()];
        let mut peaks: Vec<RunPeak> = Vec::new();
        let mut memory: Vec<MemoryRejection> = Vec::new();
        let mut examined = 0u64;
        let mut out = Screened {
            stats: Stats::default(),
            candidates: Vec::new(),
            families: Vec::with_capacity(run.len()),
        };
        for (i, st) in run.iter().enumerate() {
            let shared = Shared {
                structure_rules: &structure_rules,
                rule_rejected: &mut rule_rejected,
                peaks: &mut peaks,
                memory: &mut memory,
                examined: &mut examined,
            };
            let family = self.screen(ctx, first + i, st, known, bound, shared, &mut out);
            out.families.push(family);
        }
        for (verdict, &count) in structure_rules.iter().zip(&rule_rejected) {
            if let Err(r) = verdict
                && count > 0
            {
                out.stats.reject_rule(*r, count);
            }
        }
        for &(_, _, _, reason, count) in &memory {
            out.stats.reject_memory(reason, count);
        }
        ctx.progress.add(examined, 0);
        out
    }

    /// Phase 1 of the pruned search, for one structure: the micro-batch sizes that pass the
    /// rules, whose most memory-saving choice fits, and whose bound clears `known`, added to
    /// `out`; the structure's family size (layouts per micro-batch size).
    #[allow(clippy::too_many_arguments)]
    fn screen(
        &self,
        ctx: &Context<'_>,
        index: usize,
        st: &Structure,
        known: f64,
        bound: &ThroughputBound,
        shared: Shared<'_>,
        out: &mut Screened,
    ) -> u64 {
        let space = ctx.space;
        let s = ctx.scenario;
        let stats = &mut out.stats;
        let Some((first_choice, most_saving, family)) = space.recompute_family(st) else {
            return 0;
        };
        if ctx.expired() {
            return family;
        }
        let none = RecomputeChoice::NONE;
        let mbs_list = &space.micro_batch_size;
        for (i, &mbs) in mbs_list.iter().enumerate() {
            // The run's structure verdict: no layout to build, no error to copy.
            if shared.structure_rules[i].is_err() {
                shared.rule_rejected[i] += family;
                *shared.examined += family;
                continue;
            }
            // The bounds and the structure passed for the run: only the options' rules are
            // left of the whole check (phase 2 checks every projected layout whole again).
            let first = space.layout(st, mbs, first_choice);
            if let Err(e) = first.check_options(s) {
                stats.reject(s, &first, &Rejection::Rule(e), family);
                *shared.examined += family;
                continue;
            }
            // The run shares the memory peak (the MoE choice moves only the dispatcher's
            // buffers, which do not depend on recomputation: each structure adds its own) and
            // the reasons of its rejections: a layout is built only to compute one.
            let (base, stage) = match shared
                .peaks
                .iter()
                .find(|(m, c, _, _)| *m == mbs && *c == most_saving)
            {
                Some(&(_, _, peak, stage)) => (peak, stage),
                None => {
                    let most = space.layout(st, mbs, most_saving);
                    let (peak, stage) = memory::peak_bytes_before_dispatcher(s, &most);
                    shared.peaks.push((mbs, most_saving, peak, stage));
                    (peak, stage)
                }
            };
            let buffers = memory::dispatcher::dispatcher_bytes(s, &first);
            if ctx.filter.rejects(base + buffers) {
                // Nothing of this micro-batch size fits, nor of any larger one.
                let bits = buffers.to_bits();
                match shared
                    .memory
                    .iter_mut()
                    .find(|(m, c, b, _, _)| *m == mbs && *c == most_saving && *b == bits)
                {
                    Some(r) => r.4 += 1,
                    None => {
                        let most = space.layout(st, mbs, most_saving);
                        let reason = memory_reason(s, &most, stage);
                        shared.memory.push((mbs, most_saving, bits, reason, 1));
                    }
                }
                *shared.examined += 1;
                stats.pruned += family - 1 + (mbs_list.len() - i - 1) as u64 * family;
                break;
            }
            let upper = if first_choice == none {
                bound.upper(ctx, &first)
            } else {
                bound.upper(ctx, &space.layout(st, mbs, none))
            }
            .unwrap_or(f64::INFINITY);
            if upper * (1.0 + BOUND_MARGIN) < known || flex_dominated(ctx, bound, st, mbs) {
                stats.pruned += family;
                continue;
            }
            out.candidates.push(Candidate {
                structure: index,
                mbs,
                upper,
            });
        }
        family
    }

    /// The pruned search: screen every structure (in parallel), then project the candidates
    /// best bound first, in rounds, until the next bound falls below the k-th best found.
    fn search_pruned(&self, ctx: &Context<'_>) -> Outcome {
        // The seed planner's k-th best is the first bar the bound must clear.
        let warm = SeedPlanner::default().search(ctx);
        let mut trials = warm.trials;
        let warm = non_dominated(ctx, warm.top);
        let known = warm
            .get(ctx.top_k.max(1) - 1)
            .map_or(0.0, |c| c.tokens_per_second());
        let bound = ThroughputBound::new();
        let structures = ctx.structures();
        ctx.progress.set_total(structures.len() as u64);
        let screened: Vec<Screened> = moe_runs(structures)
            .par_iter()
            .map(|r| {
                let out = self.screen_run(ctx, r.start, &structures[r.clone()], known, &bound);
                ctx.progress.step(r.len() as u64);
                out
            })
            .collect();
        let mut stats = Stats::default();
        let mut candidates = Vec::new();
        let mut families: Vec<u64> = Vec::with_capacity(structures.len());
        // Runs are consecutive ranges in order: their families line up with `structures`.
        for run in screened {
            stats.merge(&run.stats);
            candidates.extend(run.candidates);
            families.extend(run.families);
        }
        candidates.sort_by(|a, b| {
            b.upper
                .total_cmp(&a.upper)
                .then(a.structure.cmp(&b.structure))
                .then(a.mbs.cmp(&b.mbs))
        });
        ctx.progress
            .set_total((structures.len() + candidates.len()) as u64);
        let mut top = TopK::new(ctx.top_k);
        let mut next = 0;
        while next < candidates.len() && !ctx.expired() {
            let bar = match top.as_slice() {
                t if t.len() >= ctx.top_k => known.max(t[t.len() - 1].tokens_per_second()),
                _ => known,
            };
            if candidates[next].upper * (1.0 + BOUND_MARGIN) < bar {
                // Sorted by bound: nothing left can enter the top list.
                stats.pruned += candidates[next..]
                    .iter()
                    .map(|c| families[c.structure])
                    .sum::<u64>();
                break;
            }
            let round = &candidates[next..(next + ROUND).min(candidates.len())];
            // Candidates of one pipeline shape and micro-batch count run on one thread, one
            // after the other: the schedule simulator keeps the pass order it built.
            let mut by_shape: BTreeMap<_, Vec<&Candidate>> = BTreeMap::new();
            for c in round {
                let st = &structures[c.structure];
                let key = (st.pp, st.vpp, st.schedule, st.tp * st.cp, c.mbs);
                by_shape.entry(key).or_default().push(c);
            }
            let shapes: Vec<Vec<&Candidate>> = by_shape.into_values().collect();
            let tasks: Vec<Task> = shapes
                .par_iter()
                .map(|cs| {
                    let mut task = Task::new(ctx.top_k);
                    for c in cs {
                        let st = &structures[c.structure];
                        if c.upper * (1.0 + BOUND_MARGIN) < bar {
                            task.stats.pruned += families[c.structure];
                        } else {
                            let family = ctx.space.recompute_choices(st);
                            self.run_one(ctx, st, &family, c.mbs, 0.0, None, &mut task);
                        }
                        ctx.progress.step(1);
                    }
                    task
                })
                .collect();
            for t in tasks {
                stats.merge(&t.stats);
                top = top.merge(t.top);
                trials.extend(t.trials);
            }
            next += round.len();
        }
        Outcome {
            top: top.into_vec(),
            stats,
            agent: None,
            trials,
        }
    }
}

impl Searcher for Exhaustive {
    fn kind(&self) -> SearcherKind {
        SearcherKind::Exhaustive
    }

    fn search(&mut self, ctx: &Context<'_>) -> Outcome {
        if self.prune {
            return self.search_pruned(ctx);
        }
        let groups = groups(ctx.structures());
        ctx.progress.set_total(groups.len() as u64);
        let empty = || Task::new(ctx.top_k);
        let task = groups
            .par_iter()
            .map(|g| {
                if ctx.expired() {
                    return empty();
                }
                let t = self.run_group(ctx, g);
                ctx.progress.step(1);
                t
            })
            .reduce(empty, Task::merge);
        Outcome {
            top: task.top.into_vec(),
            stats: task.stats,
            agent: None,
            trials: task.trials,
        }
    }
}
