//! The tuner: every legal layout of a plan, pre-filtered by memory, scored by the projection,
//! and the best handed back (as a [`result::TuneResult`], and as a PyTorchJob by [`job`]).
//!
//! - [`space`]: the search space of a plan (`spec.tuning.fixed` pins axes, `allowed` narrows
//!   them);
//! - [`prefilter`]: legality rules and the memory pre-filter, with rejection counts by reason;
//! - searchers behind one trait, [`Searcher`]: [`exhaustive`] (every candidate, safe pruning,
//!   all cores), [`seed`] (the paper's deterministic planner: single-axis sweeps from a
//!   baseline), [`evolutionary`] (seeded, deterministic) and [`agent`] (an LLM proposer behind
//!   the [`agent::Proposer`] trait; only the `agent` cargo feature's implementation touches the
//!   network);
//! - [`tune`] runs a searcher on a plan and reports the top layouts, the gain over the plan's
//!   reference layout and the counters.
//!
//! Candidates are ranked by projected tokens/s per GPU (the GPU count is fixed, so this is the
//! job's throughput); ties are broken by a stable key of the layout, so the same input always
//! gives the same answer. Searchers score with the time model alone
//! ([`projection::step_time_with`]) and the full projection (with the per-stage memory report)
//! is built only for the layouts reported. They take the op timer, so the operator can tune
//! with a benchmark-calibrated oracle.

use std::cmp::Ordering;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering as AtomicOrdering};
use std::time::Instant;

use crate::compute::{AnalyticTimer, OpTimer};
use crate::error::FieldError;
use crate::layout::{Layout, LayoutError, Recompute};
use crate::plan::{Plan, SearcherKind};
use crate::projection::{self, StepTime};
use crate::scenario::Scenario;

pub mod agent;
pub mod bound;
pub mod evolutionary;
pub mod exhaustive;
pub mod prefilter;
pub mod result;
pub mod seed;
pub mod space;
pub mod trials;

pub use prefilter::{Prefilter, Rejection, Stats};
pub use result::{Candidate, TuneResult};
pub use space::Space;

/// Why a tune could not run.
#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    /// A field of the plan is wrong (the tuning settings, or a reference layout that breaks a
    /// rule).
    #[error("{0}")]
    Field(#[from] FieldError),
    /// The searcher cannot run as configured (e.g. `agent` without an endpoint).
    #[error("{0}")]
    Searcher(String),
}

/// A candidate scored by the time model.
#[derive(Debug, Clone)]
pub struct Scored {
    pub layout: Layout,
    pub time: StepTime,
}

impl Scored {
    pub fn tokens_per_second(&self) -> f64 {
        self.time.tokens_per_second_per_gpu
    }
}

/// A stable total order on layouts, used to break ties between equal scores.
pub fn layout_key(l: &Layout) -> impl Ord + use<> {
    let sharding = space::Sharding::of(l);
    (
        (l.tp, l.pp, l.vpp, l.cp, l.ep, l.etp, l.micro_batch_size),
        (
            l.recompute,
            l.recompute_layers,
            l.recompute_set(),
            l.schedule,
            sharding,
        ),
        (l.first_stage_layers, l.last_stage_layers),
        (
            l.sequence_parallel,
            l.tp_comm_overlap,
            l.overlap_grad_reduce,
            l.overlap_param_gather,
            l.grad_reduce_in_fp32,
        ),
        l.pipeline_layout.as_ref().map(|p| p.as_str().to_string()),
        (l.moe.dispatch(), l.moe.ep_overlap),
    )
}

/// Ranking order: more tokens/s first, then the layout key.
pub fn rank_cmp(a: &Scored, b: &Scored) -> Ordering {
    b.tokens_per_second()
        .total_cmp(&a.tokens_per_second())
        .then_with(|| layout_key(&a.layout).cmp(&layout_key(&b.layout)))
}

/// The best `k` candidates seen, in ranking order.
#[derive(Debug, Clone)]
pub struct TopK {
    k: usize,
    items: Vec<Scored>,
}

impl TopK {
    pub fn new(k: usize) -> TopK {
        // The list grows as candidates arrive: never allocate by the requested k.
        let reserve = k.clamp(1, crate::bounds::limits::TOP_K as usize) + 1;
        TopK {
            k: k.max(1),
            items: Vec::with_capacity(reserve),
        }
    }

    /// Whether a score would enter the list.
    pub fn admits(&self, tokens_per_second: f64) -> bool {
        self.items.len() < self.k
            || self
                .items
                .last()
                .is_some_and(|w| tokens_per_second >= w.tokens_per_second())
    }

    pub fn push(&mut self, c: Scored) {
        if !self.admits(c.tokens_per_second()) {
            return;
        }
        let pos = self
            .items
            .binary_search_by(|x| rank_cmp(x, &c))
            .unwrap_or_else(|p| p);
        self.items.insert(pos, c);
        self.items.truncate(self.k);
    }

    pub fn merge(mut self, other: TopK) -> TopK {
        for c in other.items {
            self.push(c);
        }
        self
    }

    pub fn best(&self) -> Option<&Scored> {
        self.items.first()
    }

    pub fn into_vec(self) -> Vec<Scored> {
        self.items
    }

    pub fn as_slice(&self) -> &[Scored] {
        &self.items
    }
}

/// Live counters of a running search, for a progress display on another thread.
#[derive(Debug, Default)]
pub struct Progress {
    examined: AtomicU64,
    evaluated: AtomicU64,
    best_bits: AtomicU64,
    done: AtomicU64,
    total: AtomicU64,
}

impl Progress {
    pub fn new() -> Progress {
        Progress::default()
    }

    /// Record work: candidates examined (projected or rejected) and projected.
    pub fn add(&self, examined: u64, evaluated: u64) {
        self.examined.fetch_add(examined, AtomicOrdering::Relaxed);
        self.evaluated.fetch_add(evaluated, AtomicOrdering::Relaxed);
    }

    /// Offer a score as the best so far.
    pub fn offer_best(&self, tokens_per_second: f64) {
        if tokens_per_second.is_finite() && tokens_per_second > 0.0 {
            // Positive finite floats order like their bit patterns.
            self.best_bits
                .fetch_max(tokens_per_second.to_bits(), AtomicOrdering::Relaxed);
        }
    }

    /// Work units (searcher-defined) done and in total.
    pub fn set_total(&self, total: u64) {
        self.total.store(total, AtomicOrdering::Relaxed);
    }

    pub fn step(&self, n: u64) {
        self.done.fetch_add(n, AtomicOrdering::Relaxed);
    }

    /// (examined, evaluated, best tokens/s/GPU so far, units done, units total).
    pub fn snapshot(&self) -> (u64, u64, Option<f64>, u64, u64) {
        let bits = self.best_bits.load(AtomicOrdering::Relaxed);
        (
            self.examined.load(AtomicOrdering::Relaxed),
            self.evaluated.load(AtomicOrdering::Relaxed),
            (bits != 0).then(|| f64::from_bits(bits)),
            self.done.load(AtomicOrdering::Relaxed),
            self.total.load(AtomicOrdering::Relaxed),
        )
    }
}

/// Everything a searcher needs.
pub struct Context<'a> {
    pub scenario: &'a Scenario,
    pub space: &'a Space,
    pub filter: Prefilter,
    pub timer: &'a dyn OpTimer,
    /// How many of the best layouts to keep.
    pub top_k: usize,
    pub progress: &'a Progress,
    /// The plan's reference layout (`spec.parallelism`), a starting point for the seed
    /// planner.
    pub reference: Option<&'a Layout>,
    /// When the search must stop and report what it has ([`TuneOptions::deadline`]).
    pub deadline: Option<Instant>,
    /// Set once a searcher stopped at the deadline.
    pub timed_out: AtomicBool,
    /// The space's structures, enumerated once for every searcher that walks them (the seed
    /// planner's warm start and the exhaustive search: 445,032 on DeepSeek-V3 at 1,024 GPUs).
    pub structures: std::sync::OnceLock<Vec<space::Structure>>,
}

impl Context<'_> {
    /// Whether the deadline has passed (searchers check between units of work and stop,
    /// keeping what they found); remembered for the result.
    pub fn expired(&self) -> bool {
        if self.timed_out.load(AtomicOrdering::Relaxed) {
            return true;
        }
        let late = self.deadline.is_some_and(|d| Instant::now() >= d);
        if late {
            self.timed_out.store(true, AtomicOrdering::Relaxed);
        }
        late
    }

    /// The space's structures ([`Space::structures`]), enumerated on first use.
    pub fn structures(&self) -> &[space::Structure] {
        self.structures
            .get_or_init(|| self.space.structures(self.scenario))
    }

    /// The time projection of a layout (rules checked by the projection).
    pub fn step_time(&self, l: &Layout) -> Result<StepTime, LayoutError> {
        projection::step_time_with(self.scenario, l, self.timer)
    }

    /// Rules, memory and time of one layout, counted into `stats` (and the progress).
    pub fn evaluate(&self, l: &Layout, stats: &mut Stats) -> Result<Scored, Rejection> {
        let s = self.scenario;
        let outcome = self.filter.check(s, l).and_then(|()| {
            self.step_time(l)
                .map(|time| Scored {
                    layout: l.clone(),
                    time,
                })
                .map_err(Rejection::Rule)
        });
        match &outcome {
            Ok(c) => {
                stats.evaluated += 1;
                self.progress.add(1, 1);
                self.progress.offer_best(c.tokens_per_second());
            }
            Err(r) => {
                stats.reject(s, l, r, 1);
                self.progress.add(1, 0);
            }
        }
        outcome
    }

    /// With full recompute: the layout recomputing the fewest layers per chunk that still
    /// fits (the fastest of the full-recompute family, as recomputing more only adds time).
    /// Other layouts are returned as they are. Probes are counted into `stats`; `None` when no
    /// count fits.
    pub fn fewest_recomputed(&self, l: &Layout, stats: &mut Stats) -> Option<Layout> {
        if l.recompute != Recompute::Full
            || self.space.recompute_layers.is_some()
            || l.recompute_layer_ids.is_some()
        {
            return Some(l.clone());
        }
        let st = Space::structure_in(self.scenario, l);
        let counts = self.space.full_recompute_counts(&st);
        let with = |k: u32| {
            let mut x = l.clone();
            x.recompute_layers = k;
            x
        };
        least_fitting(self, &counts, with, stats).map(|i| with(counts[i]))
    }
}

/// Binary search over `counts` (ordered by decreasing memory) for the first layout that passes
/// the pre-filter. Failing probes are counted as rejections; the other members of the family
/// (those that fit but recompute more) as pruned. The winner is left for the caller to project.
/// `None` when even the last does not fit (the rest of the family is then pruned: it needs more
/// memory).
pub(crate) fn least_fitting(
    ctx: &Context<'_>,
    counts: &[u32],
    with: impl Fn(u32) -> Layout,
    stats: &mut Stats,
) -> Option<usize> {
    let s = ctx.scenario;
    let n = counts.len();
    if n == 0 {
        return None;
    }
    let mut failed = 0u64;
    let mut probe = |i: usize, stats: &mut Stats| -> bool {
        let l = with(counts[i]);
        match ctx.filter.check(s, &l) {
            Ok(()) => true,
            Err(r) => {
                failed += 1;
                stats.reject(s, &l, &r, 1);
                ctx.progress.add(1, 0);
                false
            }
        }
    };
    if !probe(n - 1, stats) {
        stats.pruned += n as u64 - 1;
        return None;
    }
    let (mut lo, mut hi) = (0usize, n - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if probe(mid, stats) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    stats.pruned += n as u64 - failed - 1;
    Some(lo)
}

/// The candidates that no less-recomputing variant of the same layout beats: a layout with
/// recomputation is dropped when the same layout recomputing nothing passes the pre-filter.
/// (Full recompute is always resolved to the fewest layers that fit.) Order is kept.
pub fn non_dominated(ctx: &Context<'_>, list: Vec<Scored>) -> Vec<Scored> {
    list.into_iter()
        .filter(|c| {
            if c.layout.recompute == Recompute::None
                || !ctx.space.recompute.contains(&Recompute::None)
            {
                return true;
            }
            let mut plain = c.layout.clone();
            space::RecomputeChoice::NONE.apply(&mut plain);
            ctx.filter.check(ctx.scenario, &plain).is_err()
        })
        .collect()
}

/// What a searcher returns.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The best candidates, in ranking order.
    pub top: Vec<Scored>,
    pub stats: Stats,
    /// The agent's own counters.
    pub agent: Option<agent::AgentStats>,
    /// Every layout tried, in order (bounded).
    pub trials: trials::TrialLog,
}

/// A search strategy.
pub trait Searcher {
    /// Which searcher this is.
    fn kind(&self) -> SearcherKind;
    /// Search the space of `ctx`.
    fn search(&mut self, ctx: &Context<'_>) -> Outcome;
}

/// Options of [`tune`].
pub struct TuneOptions<'a> {
    /// The op timer of the projection (the analytic roofline, or a calibrated one).
    pub timer: &'a dyn OpTimer,
    /// How many layouts to report; defaults to `spec.tuning.topK`.
    pub top_k: Option<usize>,
    /// Live counters for a progress display.
    pub progress: Option<&'a Progress>,
    /// Stop searching at this instant and report the best found so far
    /// ([`TuneResult::timed_out`]); `None`: search to the end.
    pub deadline: Option<Instant>,
}

impl Default for TuneOptions<'_> {
    fn default() -> Self {
        TuneOptions {
            timer: &AnalyticTimer,
            top_k: None,
            progress: None,
            deadline: None,
        }
    }
}

/// The searcher for a kind: exhaustive, seed or evolutionary with their defaults. `agent` needs
/// a proposer ([`agent::AgentSearcher::new`]) and `none` needs no searcher ([`tune`] handles
/// it), so both are an error here.
pub fn searcher(kind: SearcherKind) -> Result<Box<dyn Searcher>, TuneError> {
    match kind {
        SearcherKind::Exhaustive => Ok(Box::new(exhaustive::Exhaustive::default())),
        SearcherKind::Seed => Ok(Box::new(seed::SeedPlanner::default())),
        SearcherKind::Evolutionary => Ok(Box::new(evolutionary::Evolutionary::default())),
        SearcherKind::Agent => Err(TuneError::Searcher(
            "searcher agent needs an LLM proposer (an endpoint and model)".into(),
        )),
        SearcherKind::None => Err(TuneError::Searcher(
            "searcher none projects spec.parallelism; it has no search".into(),
        )),
    }
}

/// The reference layout's projection, with errors naming the field.
fn reference(plan: &Plan, timer: &dyn OpTimer) -> Result<Option<Candidate>, TuneError> {
    let Some(l) = &plan.layout else {
        return Ok(None);
    };
    let p = projection::project_with(&plan.scenario, l, timer).map_err(FieldError::from)?;
    Ok(Some(Candidate::new(l.clone(), p)))
}

/// Run a searcher on a plan (`None` = searcher `none`: project `spec.parallelism` as given).
pub fn tune(
    plan: &Plan,
    searcher: Option<&mut dyn Searcher>,
    opts: &TuneOptions<'_>,
) -> Result<TuneResult, TuneError> {
    let start = Instant::now();
    let s = &plan.scenario;
    let top_k = opts.top_k.unwrap_or(plan.tuning.top_k as usize).max(1);
    let headroom = plan.tuning.memory_headroom;
    let filter = Prefilter::new(s, headroom);
    let reference = reference(plan, opts.timer)?;
    let local_progress = Progress::new();
    let progress = opts.progress.unwrap_or(&local_progress);

    let Some(searcher) = searcher else {
        let Some(r) = reference else {
            return Err(FieldError::new(
                "spec.parallelism",
                "missing: searcher none projects spec.parallelism as given",
            )
            .into());
        };
        progress.add(1, 1);
        let fits = r.projection.memory.peak_bytes <= filter.limit_bytes;
        let stats = Stats {
            evaluated: 1,
            ..Stats::default()
        };
        let mut log = trials::TrialLog::default();
        log.push(trials::Trial::scored(
            trials::Source::Reference,
            &r.layout,
            r.tokens_per_second(),
        ));
        return Ok(TuneResult::assemble(
            SearcherKind::None,
            vec![r.clone()],
            stats,
            Some((r, fits)),
            None,
            &filter,
            start.elapsed().as_secs_f64(),
        )
        .with_trials(log));
    };

    let space = Space::new(s, &plan.tuning, plan.layout.as_ref())?;
    let ctx = Context {
        scenario: s,
        space: &space,
        filter,
        timer: opts.timer,
        top_k,
        progress,
        reference: plan.layout.as_ref(),
        deadline: opts.deadline,
        timed_out: AtomicBool::new(false),
        structures: Default::default(),
    };
    let outcome = searcher.search(&ctx);
    let mut top = Vec::new();
    for c in non_dominated(&ctx, outcome.top).iter().take(top_k) {
        let p = projection::project_with(s, &c.layout, opts.timer).map_err(FieldError::from)?;
        top.push(Candidate::new(c.layout.clone(), p));
    }
    // The reference first: the curve starts where the plan does.
    let mut log = trials::TrialLog::default();
    if let Some(r) = &reference {
        log.push(trials::Trial::scored(
            trials::Source::Reference,
            &r.layout,
            r.tokens_per_second(),
        ));
    }
    log.extend(outcome.trials);
    let reference = reference.map(|r| {
        let fits = r.projection.memory.peak_bytes <= filter.limit_bytes;
        (r, fits)
    });
    let unavailable = outcome.agent.as_ref().and_then(|a| a.unavailable.clone());
    let mut result = TuneResult::assemble(
        searcher.kind(),
        top,
        outcome.stats,
        reference,
        outcome.agent,
        &filter,
        start.elapsed().as_secs_f64(),
    )
    .with_trials(log);
    result.agent_unavailable = unavailable;
    result.timed_out = ctx.timed_out.load(AtomicOrdering::Relaxed);
    Ok(result)
}

/// After an agent run whose endpoint never answered (`agent_unavailable`): the best non-agent
/// answer, the exhaustive search's, with the agent's counters, its trials (the seed planner's
/// sweeps and the failed rounds) ahead of the exhaustive search's, and the reason kept.
/// Any other result is returned as it is.
pub fn agent_fallback(
    plan: &Plan,
    failed: TuneResult,
    opts: &TuneOptions<'_>,
) -> Result<TuneResult, TuneError> {
    let Some(why) = failed.agent_unavailable.clone() else {
        return Ok(failed);
    };
    let mut exhaustive = exhaustive::Exhaustive::default();
    let mut r = tune(plan, Some(&mut exhaustive), opts)?;
    let mut log = trials::TrialLog::default();
    for mut t in failed
        .trials
        .into_iter()
        .chain(std::mem::take(&mut r.trials))
    {
        // The second reference trial (the exhaustive run's) is the same layout.
        if t.source == trials::Source::Reference && !log.trials.is_empty() {
            continue;
        }
        t.best_so_far = None;
        log.push(t);
    }
    r.agent = failed.agent;
    r.seconds += failed.seconds;
    r.agent_unavailable = Some(why);
    Ok(r.with_trials(log))
}

/// [`tune`] with the searcher of a kind (all but `agent`) and the analytic timer.
pub fn tune_plan(plan: &Plan, kind: SearcherKind) -> Result<TuneResult, TuneError> {
    let opts = TuneOptions::default();
    if kind == SearcherKind::None {
        return tune(plan, None, &opts);
    }
    let mut s = searcher(kind)?;
    tune(plan, Some(s.as_mut()), &opts)
}
