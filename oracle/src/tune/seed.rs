//! The seed planner, after the paper's deterministic planner: start from a baseline and sweep
//! one axis at a time (every value of that axis, the others held), move to the best layout
//! found, and repeat the sweeps until a full round improves nothing.
//!
//! The baseline is the plan's reference layout when it lies in the space, is legal and fits;
//! otherwise the first layout that is legal and fits in a fixed order of simplicity: the
//! distributed optimizer before FSDP, the shortest pipeline, the smallest tensor- and
//! context-parallel groups, the widest expert parallelism, the smallest micro-batch, the least
//! recomputation. A variant that does not fit is retried with more recomputation (selective,
//! then full with the fewest layers that fit). Every layout it scores is a member of the space,
//! so it never beats the exhaustive search.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};

use rayon::prelude::*;

use super::space::{RecomputeChoice, Space};
use super::trials::{Source, Trial, TrialLog};
use super::{Context, Outcome, Rejection, Scored, Searcher, Stats, TopK, rank_cmp};
use crate::layout::{Layout, Recompute};
use crate::plan::SearcherKind;

/// The axes swept, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    Tp,
    Pp,
    Vpp,
    Schedule,
    Split,
    Cp,
    Ep,
    Etp,
    MicroBatch,
    Recompute,
    Sharding,
    /// The MoE dispatcher and EP overlap.
    Moe,
}

impl Axis {
    pub const ALL: [Axis; 12] = [
        Axis::Tp,
        Axis::Pp,
        Axis::Vpp,
        Axis::Schedule,
        Axis::Split,
        Axis::Cp,
        Axis::Ep,
        Axis::Etp,
        Axis::MicroBatch,
        Axis::Recompute,
        Axis::Sharding,
        Axis::Moe,
    ];
}

/// Scores layouts once each: normalizes them into the space, resolves full recompute to the
/// fewest layers that fit, and keeps the best.
pub(crate) struct Scorer {
    cache: HashMap<Layout, Option<Scored>>,
    pub stats: Stats,
    pub top: TopK,
    /// Every layout evaluated, in order.
    pub trials: TrialLog,
    /// Whose trials these are now (the agent switches to [`Source::Agent`] after the seed
    /// planner's sweeps).
    pub source: Source,
    /// The agent's round, for its trials.
    pub round: Option<u32>,
}

impl Scorer {
    pub fn new(top_k: usize) -> Scorer {
        Scorer {
            cache: HashMap::new(),
            stats: Stats::default(),
            // Room for the dominated variants the report leaves out.
            top: TopK::new(top_k * 3),
            trials: TrialLog::default(),
            source: Source::Seed,
            round: None,
        }
    }

    /// Record the trial of one evaluated layout.
    fn record(&mut self, l: &Layout, outcome: &Result<Scored, Rejection>) {
        let mut t = match outcome {
            Ok(c) => Trial::scored(self.source, l, c.tokens_per_second()),
            Err(r) => Trial::rejected(self.source, l, r),
        };
        t.round = self.round;
        self.trials.push(t);
    }

    /// The search's outcome.
    pub fn outcome(self, agent: Option<super::agent::AgentStats>) -> Outcome {
        Outcome {
            top: self.top.into_vec(),
            stats: self.stats,
            agent,
            trials: self.trials,
        }
    }

    /// Distinct layouts scored (or rejected) so far.
    pub fn unique(&self) -> usize {
        self.cache.len()
    }

    /// Score a layout (already in the space, or repairable into it).
    pub fn score(&mut self, ctx: &Context<'_>, l: &Layout) -> Option<Scored> {
        let l = ctx.space.normalize(ctx.scenario, l)?;
        self.score_exact(ctx, l)
    }

    /// Score a layout as it is (an agent proposal already normalized, possibly beyond the
    /// grid): full recompute still resolved to the fewest layers that fit.
    pub fn score_exact(&mut self, ctx: &Context<'_>, l: Layout) -> Option<Scored> {
        if let Some(hit) = self.cache.get(&l) {
            return hit.clone();
        }
        let resolved = ctx.fewest_recomputed(&l, &mut self.stats);
        let scored = match resolved {
            None => None,
            Some(r) => match self.cache.get(&r) {
                Some(hit) => hit.clone(),
                None => {
                    let outcome = ctx.evaluate(&r, &mut self.stats);
                    self.record(&r, &outcome);
                    let v = outcome.ok();
                    if let Some(c) = &v {
                        self.top.push(c.clone());
                    }
                    self.cache.insert(r, v.clone());
                    v
                }
            },
        };
        self.cache.insert(l, scored.clone());
        scored
    }

    /// [`Scorer::score`] for many layouts at once, the new ones in parallel: the same results,
    /// counters and top list as scoring them one after the other.
    pub fn score_many(&mut self, ctx: &Context<'_>, ls: &[Layout]) -> Vec<Option<Scored>> {
        let normalized: Vec<Option<Layout>> = ls
            .iter()
            .map(|l| ctx.space.normalize(ctx.scenario, l))
            .collect();
        let mut misses: Vec<Layout> = Vec::new();
        let mut seen = HashSet::new();
        for n in normalized.iter().flatten() {
            if !self.cache.contains_key(n) && seen.insert(n.clone()) {
                misses.push(n.clone());
            }
        }
        let resolved: Vec<(Option<Layout>, Stats)> = misses
            .par_iter()
            .map(|l| {
                let mut st = Stats::default();
                let r = ctx.fewest_recomputed(l, &mut st);
                (r, st)
            })
            .collect();
        let mut to_eval: Vec<Layout> = Vec::new();
        let mut seen = HashSet::new();
        for r in resolved.iter().filter_map(|(r, _)| r.as_ref()) {
            if !self.cache.contains_key(r) && seen.insert(r.clone()) {
                to_eval.push(r.clone());
            }
        }
        let evaluated: Vec<(Result<Scored, Rejection>, Stats)> = to_eval
            .par_iter()
            .map(|r| {
                let mut st = Stats::default();
                let v = ctx.evaluate(r, &mut st);
                (v, st)
            })
            .collect();
        for (r, (outcome, st)) in to_eval.into_iter().zip(evaluated) {
            self.stats.merge(&st);
            self.record(&r, &outcome);
            let v = outcome.ok();
            if let Some(c) = &v {
                self.top.push(c.clone());
            }
            self.cache.insert(r, v);
        }
        for (l, (r, st)) in misses.into_iter().zip(resolved) {
            self.stats.merge(&st);
            let v = r.and_then(|r| self.cache.get(&r).cloned().flatten());
            self.cache.insert(l, v);
        }
        normalized
            .into_iter()
            .map(|n| n.and_then(|n| self.cache.get(&n).cloned().flatten()))
            .collect()
    }
}

/// The seed planner.
#[derive(Debug, Clone, Copy)]
pub struct SeedPlanner {
    /// Sweep rounds at most (each round sweeps every axis once).
    pub max_rounds: u32,
}

impl Default for SeedPlanner {
    fn default() -> Self {
        SeedPlanner { max_rounds: 10 }
    }
}

/// Layouts that differ from `l` in one axis.
pub fn variants(ctx: &Context<'_>, l: &Layout, axis: Axis) -> Vec<Layout> {
    let sp = ctx.space;
    let s = ctx.scenario;
    let moe = s.model.moe.is_some();
    let with = |f: &dyn Fn(&mut Layout)| {
        let mut x = l.clone();
        f(&mut x);
        x
    };
    match axis {
        Axis::Tp => sp.tp.iter().map(|&v| with(&|x| x.tp = v)).collect(),
        Axis::Pp => sp.pp.iter().map(|&v| with(&|x| x.pp = v)).collect(),
        Axis::Vpp => sp
            .vpp_values(l.pp)
            .into_iter()
            .map(|v| with(&|x| x.vpp = v))
            .collect(),
        Axis::Schedule => sp
            .schedule_values(l.pp, l.vpp)
            .into_iter()
            .map(|v| with(&|x| x.schedule = v))
            .collect(),
        Axis::Split => sp
            .splits(l.pp, l.vpp)
            .into_iter()
            .map(|split| with(&|x| sp.apply_split(x, split)))
            .collect(),
        Axis::Cp => sp.cp.iter().map(|&v| with(&|x| x.cp = v)).collect(),
        Axis::Ep => sp.ep.iter().map(|&v| with(&|x| x.ep = v)).collect(),
        Axis::Etp => sp
            .etp_values(l.tp, moe)
            .into_iter()
            .map(|v| with(&|x| x.etp = v))
            .collect(),
        Axis::MicroBatch => sp
            .micro_batch_size
            .iter()
            .map(|&v| with(&|x| x.micro_batch_size = v))
            .collect(),
        Axis::Recompute => sp
            .recompute
            .iter()
            .flat_map(|&r| match r {
                Recompute::None => vec![RecomputeChoice::NONE],
                Recompute::Selective => sp
                    .recompute_modules
                    .iter()
                    .map(|m| RecomputeChoice::selective(*m))
                    .collect(),
                Recompute::Full => vec![RecomputeChoice::full(sp.recompute_layers.unwrap_or(0))],
            })
            .map(|rc| with(&|x| rc.apply(x)))
            .collect(),
        Axis::Moe => sp
            .moe_values(moe, l.pp, l.vpp, l.ep)
            .into_iter()
            .flatten()
            .map(|c| with(&|x| c.apply(x)))
            .collect(),
        Axis::Sharding => sp
            .sharding
            .iter()
            .map(|&v| {
                with(&|x| {
                    x.fsdp = v == super::space::Sharding::Fsdp;
                    x.distributed_optimizer = v == super::space::Sharding::DistributedOptimizer;
                })
            })
            .collect(),
    }
}

impl SeedPlanner {
    /// The starting layout (see the module documentation).
    pub(crate) fn baseline(ctx: &Context<'_>, scorer: &mut Scorer) -> Option<Scored> {
        if let Some(r) = ctx.reference
            && let Some(c) = scorer.score(ctx, r)
        {
            return Some(c);
        }
        let sp: &Space = ctx.space;
        let structures = ctx.structures();
        // Simplest first (ties in the space's order). The walk usually stops after a few
        // structures, so they come off a heap (O(n) to build) instead of a sorted copy of
        // millions (a DeepSeek-V3 space on 1,024 GPUs: 6 % of its tune was this sort).
        let mut order: BinaryHeap<Reverse<(_, usize)>> = structures
            .iter()
            .enumerate()
            .map(|(i, st)| {
                Reverse((
                    (
                        st.sharding,
                        st.pp,
                        st.tp,
                        st.cp,
                        Reverse(st.ep),
                        st.etp,
                        st.vpp,
                        st.schedule,
                        st.split,
                    ),
                    i,
                ))
            })
            .collect();
        let recompute_order = [Recompute::None, Recompute::Selective, Recompute::Full];
        while let Some(Reverse((_, i))) = order.pop() {
            let st = &structures[i];
            if ctx.expired() {
                return None;
            }
            for &mbs in &sp.micro_batch_size {
                // Skip micro-batch sizes the rules reject without scoring them all.
                let probe = sp.layout(st, mbs, RecomputeChoice::NONE);
                if probe.check(ctx.scenario).is_err() {
                    continue;
                }
                for r in recompute_order {
                    if !sp.recompute.contains(&r) {
                        continue;
                    }
                    let rc = match r {
                        Recompute::None => RecomputeChoice::NONE,
                        Recompute::Selective => match sp.recompute_modules.first() {
                            Some(m) => RecomputeChoice::selective(*m),
                            None => continue,
                        },
                        Recompute::Full => RecomputeChoice::full(sp.recompute_layers.unwrap_or(0)),
                    };
                    let l = sp.layout(st, mbs, rc);
                    if let Some(c) = scorer.score(ctx, &l) {
                        return Some(c);
                    }
                }
                // The smallest legal micro-batch does not fit: larger ones fit less.
                break;
            }
        }
        None
    }

    /// Score variants; one that does not fit is retried with more recomputation (selective,
    /// then full with the fewest layers that fit), so a sweep of the micro-batch size or the
    /// pipeline is not stopped by memory alone.
    fn score_fitting(ctx: &Context<'_>, scorer: &mut Scorer, vs: &[Layout]) -> Vec<Option<Scored>> {
        let sp = ctx.space;
        let mut out = scorer.score_many(ctx, vs);
        for r in [Recompute::Selective, Recompute::Full] {
            if !sp.recompute.contains(&r) {
                continue;
            }
            let idx: Vec<usize> = (0..vs.len())
                .filter(|&i| out[i].is_none() && vs[i].recompute < r)
                .collect();
            if idx.is_empty() {
                continue;
            }
            let retry: Vec<Layout> = idx
                .iter()
                .map(|&i| {
                    let mut x = vs[i].clone();
                    let rc = match r {
                        Recompute::Selective => RecomputeChoice::selective(
                            sp.recompute_modules
                                .first()
                                .copied()
                                .unwrap_or(crate::layout::ModuleSet::DEFAULT),
                        ),
                        _ => RecomputeChoice::full(sp.recompute_layers.unwrap_or(0)),
                    };
                    rc.apply(&mut x);
                    x
                })
                .collect();
            for (k, c) in scorer.score_many(ctx, &retry).into_iter().enumerate() {
                out[idx[k]] = c;
            }
        }
        out
    }

    /// Sweep single axes from `start` until a round improves nothing.
    pub(crate) fn sweep(&self, ctx: &Context<'_>, scorer: &mut Scorer, start: Scored) -> Scored {
        let mut current = start;
        for _ in 0..self.max_rounds {
            let mut improved = false;
            for axis in Axis::ALL {
                if ctx.expired() {
                    return current;
                }
                let mut best = current.clone();
                let vs = variants(ctx, &current.layout, axis);
                for c in Self::score_fitting(ctx, scorer, &vs).into_iter().flatten() {
                    if rank_cmp(&c, &best) == Ordering::Less {
                        best = c;
                    }
                }
                if best.layout != current.layout {
                    current = best;
                    improved = true;
                }
            }
            if !improved {
                break;
            }
        }
        current
    }
}

impl Searcher for SeedPlanner {
    fn kind(&self) -> SearcherKind {
        SearcherKind::Seed
    }

    fn search(&mut self, ctx: &Context<'_>) -> Outcome {
        let mut scorer = Scorer::new(ctx.top_k);
        if let Some(start) = Self::baseline(ctx, &mut scorer) {
            self.sweep(ctx, &mut scorer, start);
        }
        scorer.outcome(None)
    }
}
