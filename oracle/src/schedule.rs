//! Pipeline schedule simulation: 1F1B (PipeDream-Flush), Megatron's interleaved 1F1B with
//! virtual stages, and zero-bubble ZB-H1 (Qi et al. 2023). Each pipeline rank executes its
//! passes in the schedule's order; a pass starts when its rank is free and its input has
//! arrived (the previous virtual stage's forward, or the next one's backward, plus one
//! point-to-point message). The simulation gives the makespan, each rank's busy and idle time
//! (idle split into waiting on messages and the pipeline bubble proper) and the times the DP
//! overlap needs.
//!
//! Virtual stage `vs = chunk * pp + rank`: model chunk `chunk` of pipeline rank `rank`
//! (Megatron's interleaved assignment); with vpp = 1 it is the rank.
//!
//! Cost: O(pp x microbatches x vpp). For the 1F1B family the processing order (a topological
//! order of the passes that interleaves the ranks) depends only on (schedule, pp, vpp, m), so
//! it is built once and cached; the timing pass is then one tight loop. ZB-H1 places its
//! weight-gradient passes by looking at the gaps, so it runs the general event loop.
//!
//! `order.rs` holds each rank's pass order, `plan.rs` builds the cached processing order from
//! it, `steady.rs` finds and fills in its steady state, `zero_bubble.rs` runs ZB-H1,
//! `extrapolate.rs` serves schedules of more passes than [`MAX_PASSES`] in bounded memory.
//!
//! Nothing here panics or allocates by the micro-batch count beyond [`MAX_PASSES`]: a
//! schedule too large to simulate is a [`ScheduleError`].

use std::collections::VecDeque;

use crate::layout::Schedule;

mod extrapolate;
mod order;
mod plan;
mod steady;
mod zero_bubble;

use order::RankOrder;

use steady::{MAX_CYCLICITY, Period, repeats, time_passes};

/// Most passes (2 x virtual stages x micro-batches) simulated one by one; beyond, the
/// simulation extrapolates from its steady state ([`Simulator::run`]).
pub const MAX_PASSES: u64 = crate::bounds::limits::SCHEDULE_PASSES;

/// Why a schedule was not simulated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// More passes than [`MAX_PASSES`] and no steady state within them to extrapolate from,
    /// or more ranks and chunks than the pass indices hold.
    #[error(
        "the pipeline schedule of {pp} ranks x {vpp} chunks x {m} micro-batches is too large to simulate"
    )]
    TooLarge { pp: usize, vpp: usize, m: usize },
    /// The pass order could not be built (a bug, reported rather than a panic).
    #[error("pipeline schedule deadlock (pp={pp}, vpp={vpp}, m={m})")]
    Deadlock { pp: usize, vpp: usize, m: usize },
}

/// Per-micro-batch times of every virtual stage, and the pipeline message time.
#[derive(Debug, Clone, Copy)]
pub struct StageCosts<'a> {
    /// Pipeline ranks.
    pub pp: usize,
    /// Model chunks per rank.
    pub vpp: usize,
    /// Forward pass of one micro-batch, per virtual stage (`chunk * pp + rank`).
    pub forward: &'a [f64],
    /// Backward pass with respect to inputs (including recomputation), per virtual stage.
    pub backward: &'a [f64],
    /// Weight-gradient pass, per virtual stage (part of the backward except in ZB-H1).
    pub weight: &'a [f64],
    /// One activation (or gradient) message between consecutive virtual stages.
    pub p2p: f64,
    /// Under Megatron's EP overlap (`--overlap-moe-expert-parallel-comm`: interleaved, or no
    /// pipeline): the steady state pairs each forward with a backward, the warm-up (one
    /// micro-batch longer: `get_pp_rank_microbatches`) and cool-down passes run alone, at
    /// these durations. Not for zero-bubble schedules.
    pub alone: Option<AlonePasses<'a>>,
}

/// Per virtual stage: the duration of a forward and of a backward (input gradients) that run
/// unpaired.
#[derive(Debug, Clone, Copy)]
pub struct AlonePasses<'a> {
    pub forward: &'a [f64],
    pub backward: &'a [f64],
}

/// What one pipeline rank did.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RankTimeline {
    /// When its last pass ends.
    pub end: f64,
    /// Time spent in passes.
    pub busy: f64,
    /// Idle time spent waiting for a message in flight (at most one message time per wait).
    pub p2p_wait: f64,
    /// When its first micro-batch's forward passes (all chunks) have ended.
    pub first_forward_end: f64,
}

impl RankTimeline {
    /// Idle time that is pipeline bubble rather than message latency.
    pub fn bubble(&self) -> f64 {
        (self.end - self.busy - self.p2p_wait).max(0.0)
    }
}

/// Start and end of the last micro-batch's backward pass of one virtual stage: its weight
/// gradients are complete at `end`, and the data-parallel reduction can overlap from `start`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LastBackward {
    pub start: f64,
    pub end: f64,
}

/// Summary of one simulation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScheduleSummary {
    /// Time from the first forward to the last backward (weight) pass.
    pub makespan: f64,
    /// Bubble time of the busiest rank: makespan minus its busy time.
    pub bubble: f64,
    /// `bubble / makespan`.
    pub bubble_fraction: f64,
    /// The busiest rank.
    pub busiest_rank: usize,
}

/// Kind of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PassKind {
    Forward,
    /// Backward (input gradients; the whole backward outside ZB-H1).
    Backward,
    /// Weight gradients (ZB-H1 only).
    Weight,
}

/// One executed pass, for timelines.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Event {
    pub rank: u32,
    pub chunk: u32,
    pub microbatch: u32,
    pub kind: PassKind,
    pub start: f64,
    pub end: f64,
}

const NONE: u32 = u32::MAX;

/// One pass in a cached processing order, compact for the timing loop.
#[derive(Debug, Clone, Copy)]
struct PlanOp {
    /// Plan position of the pass this one waits for (the sentinel `plan.len()` for none).
    dep: u32,
    /// Plan position of the same rank's previous pass (the sentinel for its first).
    prev: u32,
    /// Pipeline rank.
    rank: u16,
    /// Index of its duration: the virtual stage for a forward, `nvs + vs` for a backward.
    dur: u16,
    /// 1 when the wait includes a pipeline message, else 0.
    cross: u8,
}

/// One pass of one rank, for the per-rank message-wait account.
#[derive(Debug, Clone, Copy)]
struct RankOp {
    pos: u32,
    dur: u16,
    cross: u8,
}

/// What a pass is (cold data, for traces and the per-stage results).
#[derive(Debug, Clone, Copy)]
struct PlanMeta {
    vs: u32,
    mb: u32,
    backward: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlanKey {
    interleaved: bool,
    /// The EP overlap's schedule: a longer warm-up, and the unpaired passes at the
    /// [`AlonePasses`] durations.
    paired: bool,
    pp: usize,
    vpp: usize,
    m: usize,
}

/// A built processing order of a 1F1B-family schedule and the indexes the timing reads from
/// it; one key's worth (see `plan.rs`).
#[derive(Debug, Default)]
struct BuiltPlan {
    key: Option<PlanKey>,
    plan: Vec<PlanOp>,
    meta: Vec<PlanMeta>,
    /// Plan positions of each rank's last-micro-batch backward per chunk and first forward of
    /// its last chunk: (virtual stage, position).
    last_backward_at: Vec<(u32, u32)>,
    first_forward_at: Vec<(u32, u32)>,
    /// Each rank's passes in order, flattened; `rank_ops_at[r]..[r+1]`.
    rank_ops: Vec<RankOp>,
    rank_ops_at: Vec<usize>,
    /// Plan position of each rank's last pass.
    last_of_rank: Vec<u32>,
    /// Each unpaired pass (an [`AlonePasses`] duration): its rank and duration index.
    alone: Vec<(u16, u16)>,
    /// The periodic middle of the plan (steady state), if any.
    period: Option<Period>,
}

/// Reusable simulation state: keep one per thread and reuse it (no allocation per call once
/// warm).
#[derive(Debug, Default)]
pub struct Simulator {
    /// The current 1F1B-family plan (built by `ensure_plan`).
    built: BuiltPlan,
    /// Plans built before and put aside, most recent last.
    stash: Vec<BuiltPlan>,
    /// Simulate every pass even in a repeating steady state (for checking the shortcut).
    no_skip: bool,
    /// Passes of the last run filled in from the repeating steady state.
    filled: usize,
    durations: Vec<f64>,
    message: f64,
    /// Whether the last run was a 1F1B-family plan run (waits computed on demand).
    planned: bool,
    end: Vec<f64>,
    free: Vec<f64>,
    ranks: Vec<RankTimeline>,
    last_backward: Vec<LastBackward>,
    // ZB-H1 state.
    /// End of each forward and backward pass (`index`), `None` until it has run.
    zb_end: Vec<Option<f64>>,
    cursor: Vec<usize>,
    pending: Vec<u32>,
    pending_head: Vec<u32>,
    first_fwd_count: Vec<u32>,
    /// The idle gap before each of the last `zb_gap_window` passes of each rank (0: none
    /// kept): the extrapolation's check that a ZB-H1 run's end repeats.
    zb_gaps: Vec<VecDeque<f64>>,
    zb_gap_window: usize,
    /// Recorded passes when tracing.
    pub trace: Option<Vec<Event>>,
    /// Passes simulated one by one at most (0: [`MAX_PASSES`]).
    budget: u64,
}

impl Simulator {
    pub fn new() -> Simulator {
        Simulator::default()
    }

    /// A simulator that times every pass one by one, without filling in a repeating steady
    /// state (the reference the shortcut is checked against).
    pub fn exhaustive() -> Simulator {
        Simulator {
            no_skip: true,
            ..Simulator::default()
        }
    }

    /// A simulator that records every pass (for timelines).
    pub fn tracing() -> Simulator {
        Simulator {
            trace: Some(Vec::new()),
            ..Simulator::default()
        }
    }

    /// The same simulator timing at most `passes` passes one by one (beyond, it
    /// extrapolates; for checking the extrapolation against a full run).
    pub fn with_budget(mut self, passes: u64) -> Simulator {
        self.budget = passes;
        self
    }

    /// Passes simulated one by one at most.
    fn budget(&self) -> u64 {
        if self.budget == 0 {
            MAX_PASSES
        } else {
            self.budget
        }
    }

    /// Passes of the last run whose times were filled in from a repeating steady state
    /// rather than simulated one by one.
    pub fn filled_passes(&self) -> usize {
        self.filled
    }

    /// Per-rank results of the last run.
    pub fn ranks(&self) -> &[RankTimeline] {
        &self.ranks
    }

    /// The passes the last planned run ran unpaired ([`StageCosts::alone`]): (rank, backward?,
    /// virtual stage), one entry per pass.
    pub fn unpaired_passes(&self) -> impl Iterator<Item = (usize, bool, usize)> + '_ {
        let nvs = match self.built.key {
            Some(k) if self.planned => k.pp * k.vpp,
            _ => 0,
        };
        let alone: &[(u16, u16)] = if nvs > 0 { &self.built.alone } else { &[] };
        alone.iter().map(move |&(r, dur)| {
            let d = dur as usize - 2 * nvs;
            (r as usize, d >= nvs, d % nvs)
        })
    }

    /// Per-virtual-stage last backward pass of the last run.
    pub fn last_backward(&self) -> &[LastBackward] {
        &self.last_backward
    }

    /// Simulate `m` micro-batches. Up to [`MAX_PASSES`] passes every pass is timed; beyond,
    /// three shorter runs a whole number of steady-state periods apart are extrapolated to
    /// `m` (O(1) memory in `m`), or the schedule is [`ScheduleError::TooLarge`].
    pub fn run(
        &mut self,
        schedule: Schedule,
        c: &StageCosts,
        m: usize,
    ) -> Result<ScheduleSummary, ScheduleError> {
        self.run_with(schedule, c, m, false)
    }

    /// Simulate without filling `RankTimeline::p2p_wait` for the 1F1B family (ask
    /// [`Simulator::p2p_wait`] for the ranks that matter): the projection's fast path.
    pub fn run_lean(
        &mut self,
        schedule: Schedule,
        c: &StageCosts,
        m: usize,
    ) -> Result<ScheduleSummary, ScheduleError> {
        self.run_with(schedule, c, m, true)
    }

    fn run_with(
        &mut self,
        schedule: Schedule,
        c: &StageCosts,
        m: usize,
        lean: bool,
    ) -> Result<ScheduleSummary, ScheduleError> {
        let pp = c.pp.max(1);
        let vpp = if schedule == Schedule::Interleaved {
            c.vpp.max(1)
        } else {
            1
        };
        let m = m.max(1);
        let too_large = ScheduleError::TooLarge { pp, vpp, m };
        self.zb_gap_window = 0;
        // Pass indices are u32, ranks u16 and durations u16 (`3 * nvs + vs`).
        let nvs = pp.checked_mul(vpp).ok_or(too_large.clone())?;
        let short = |v: &[f64]| v.len() < nvs;
        if nvs >= u16::MAX as usize / 4
            || short(c.forward)
            || short(c.backward)
            || c.alone
                .is_some_and(|a| short(a.forward) || short(a.backward))
        {
            return Err(too_large);
        }
        let passes = (2 * nvs as u64).checked_mul(m as u64);
        if passes.is_some_and(|p| p <= self.budget()) {
            return self.simulate_exact(schedule, c, (pp, vpp), m, lean);
        }
        if self.trace.is_some() {
            return Err(too_large);
        }
        self.extrapolate(schedule, c, (pp, vpp), m)
    }

    /// Time every pass of `m` micro-batches (at most [`MAX_PASSES`] passes).
    fn simulate_exact(
        &mut self,
        schedule: Schedule,
        c: &StageCosts,
        (pp, vpp): (usize, usize),
        m: usize,
        lean: bool,
    ) -> Result<ScheduleSummary, ScheduleError> {
        let nvs = pp * vpp;
        self.ranks.clear();
        self.ranks.resize(pp, RankTimeline::default());
        self.last_backward.clear();
        self.last_backward.resize(nvs, LastBackward::default());
        self.free.clear();
        self.free.resize(pp, 0.0);
        if let Some(t) = self.trace.as_mut() {
            t.clear();
        }
        self.filled = 0;
        if schedule == Schedule::ZeroBubble {
            self.planned = false;
            self.run_zero_bubble(c, pp, m)?;
        } else {
            self.ensure_plan(PlanKey {
                interleaved: vpp > 1,
                paired: c.alone.is_some(),
                pp,
                vpp,
                m,
            })?;
            self.run_plan(c, pp, vpp, m);
            self.planned = true;
            if !lean {
                for r in 0..pp {
                    self.ranks[r].p2p_wait = self.p2p_wait(r);
                }
            }
        }
        Ok(self.summarize())
    }

    fn summarize(&self) -> ScheduleSummary {
        let makespan = self.ranks.iter().map(|r| r.end).fold(0.0, f64::max);
        let (busiest_rank, busy) = self
            .ranks
            .iter()
            .enumerate()
            .map(|(i, r)| (i, r.busy))
            .fold((0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
        let bubble = (makespan - busy).max(0.0);
        ScheduleSummary {
            makespan,
            bubble,
            bubble_fraction: if makespan > 0.0 {
                bubble / makespan
            } else {
                0.0
            },
            busiest_rank,
        }
    }

    /// Idle time of `rank` spent waiting for a message in flight in the last run (at most one
    /// message time per wait).
    pub fn p2p_wait(&self, rank: usize) -> f64 {
        if !self.planned {
            return self.ranks.get(rank).map(|r| r.p2p_wait).unwrap_or(0.0);
        }
        let message = [0.0, self.message];
        self.gaps(rank, usize::MAX).fold(0.0, |wait, (waited, op)| {
            wait + waited.min(message[op.cross as usize])
        })
    }

    /// The idle gap before each of the last `count` passes of `rank` in the last planned run,
    /// uncapped (what [`Simulator::p2p_wait`] caps at one message time), appended to `out`.
    fn tail_gaps(&self, rank: usize, count: usize, out: &mut Vec<f64>) {
        if self.planned {
            out.extend(self.gaps(rank, count).map(|(gap, _)| gap));
        } else if let Some(kept) = self.zb_gaps.get(rank) {
            out.extend(kept.iter().copied());
        }
    }

    /// The idle gap before each of the last `count` passes of `rank` in the current plan, with
    /// the pass (none for a rank the plan lacks).
    fn gaps(&self, rank: usize, count: usize) -> impl Iterator<Item = (f64, &RankOp)> {
        let ops = match self.built.key {
            Some(k) if rank < k.pp => {
                &self.built.rank_ops[self.built.rank_ops_at[rank]..self.built.rank_ops_at[rank + 1]]
            }
            _ => &[],
        };
        let from = ops.len().saturating_sub(count);
        let mut prev = match from {
            0 => 0.0,
            f => self.end[ops[f - 1].pos as usize],
        };
        ops[from..].iter().map(move |op| {
            let e = self.end[op.pos as usize];
            let gap = (e - self.durations[op.dur as usize] - prev).max(0.0);
            prev = e;
            (gap, op)
        })
    }

    fn run_plan(&mut self, c: &StageCosts, pp: usize, vpp: usize, m: usize) {
        let nvs = pp * vpp;
        let n = self.built.plan.len();
        // Durations: forwards, then backwards (input and weight gradients together), then the
        // same run unpaired (`dur + 2 * nvs`).
        self.durations.clear();
        self.durations.extend_from_slice(&c.forward[..nvs]);
        self.durations
            .extend((0..nvs).map(|vs| c.backward[vs] + c.weight[vs]));
        let alone = c.alone.unwrap_or(AlonePasses {
            forward: c.forward,
            backward: c.backward,
        });
        self.durations.extend_from_slice(&alone.forward[..nvs]);
        self.durations
            .extend((0..nvs).map(|vs| alone.backward[vs] + c.weight[vs]));
        // Every entry is written before it is read; only the sentinel needs a value.
        if self.end.len() != n + 1 {
            self.end.resize(n + 1, 0.0);
        }
        self.end[n] = 0.0;
        self.message = c.p2p;
        let message = [0.0, c.p2p];
        // end[n] is the sentinel 0.0 that passes with no input wait for.
        let end = &mut self.end[..];
        let durations = &self.durations[..];
        let plan = &self.built.plan[..];
        let mut done = 0;
        let mut filled = 0;
        if let Some(per) = self.built.period.filter(|_| !self.no_skip) {
            // Simulate until one lookback window lies inside the periodic region, then, once
            // the last window repeats the one a period earlier shifted by a constant, every
            // later pass of the region does too (same predecessors, shifted): fill them in.
            // The steady state may repeat only every few groups (max-plus cyclicity), so
            // compare with 1 to 4 periods back.
            let mut q = per.first + per.lookback;
            'search: while q + per.len <= per.last {
                time_passes(plan, end, durations, &message, done, q);
                done = q;
                for k in 1..=MAX_CYCLICITY {
                    let back = k * per.len;
                    if q < per.lookback + back + per.first - per.len {
                        break;
                    }
                    if let Some(shift) = repeats(end, q, back, per.lookback) {
                        for i in q..per.last {
                            end[i] = end[i - back] + shift;
                        }
                        filled = per.last - q;
                        done = per.last;
                        break 'search;
                    }
                }
                q += per.len;
            }
        }
        time_passes(plan, end, durations, &message, done, plan.len());
        self.filled = filled;
        let free = &mut self.free[..];
        for (f, &last) in free.iter_mut().zip(&self.built.last_of_rank) {
            *f = end[last as usize];
        }
        // Per-rank results.
        for (r, (rank, &end_r)) in self.ranks.iter_mut().zip(free.iter()).enumerate() {
            let busy: f64 = (0..vpp)
                .map(|c| {
                    let vs = c * pp + r;
                    durations[vs] + durations[nvs + vs]
                })
                .sum::<f64>()
                * m as f64;
            *rank = RankTimeline {
                end: end_r,
                busy,
                p2p_wait: 0.0,
                first_forward_end: 0.0,
            };
        }
        for &(r, dur) in &self.built.alone {
            let d = dur as usize;
            self.ranks[r as usize].busy += durations[d] - durations[d - 2 * nvs];
        }
        for &(r, pos) in &self.built.first_forward_at {
            self.ranks[r as usize].first_forward_end = end[pos as usize];
        }
        for &(vs, pos) in &self.built.last_backward_at {
            let e = end[pos as usize];
            self.last_backward[vs as usize] = LastBackward {
                start: e - durations[self.built.plan[pos as usize].dur as usize],
                end: e,
            };
        }
        if let Some(t) = self.trace.as_mut() {
            for (i, (op, meta)) in self.built.plan.iter().zip(&self.built.meta).enumerate() {
                let e = end[i];
                t.push(Event {
                    rank: op.rank as u32,
                    chunk: meta.vs / pp as u32,
                    microbatch: meta.mb,
                    kind: if meta.backward {
                        PassKind::Backward
                    } else {
                        PassKind::Forward
                    },
                    start: e - durations[op.dur as usize],
                    end: e,
                });
            }
        }
    }
}

impl PassKind {
    fn from_backward(backward: bool) -> PassKind {
        if backward {
            PassKind::Backward
        } else {
            PassKind::Forward
        }
    }
}

/// Index of a pass in the end-time array: forwards first, then backwards.
#[inline]
fn index(backward: bool, vs: usize, mb: usize, nvs: usize, m: usize) -> usize {
    (if backward { nvs * m } else { 0 }) + vs * m + mb
}

/// What a pass waits for: a forward for the previous virtual stage's forward (a message), a
/// backward for the next virtual stage's backward (a message) or, on the last virtual stage,
/// for its own forward (same rank, no message).
#[inline]
fn dependency(backward: bool, vs: usize, mb: usize, nvs: usize, m: usize) -> (u32, bool) {
    if !backward {
        if vs == 0 {
            (NONE, false)
        } else {
            (index(false, vs - 1, mb, nvs, m) as u32, true)
        }
    } else if vs + 1 == nvs {
        (index(false, vs, mb, nvs, m) as u32, false)
    } else {
        (index(true, vs + 1, mb, nvs, m) as u32, true)
    }
}

/// Simulate once with a fresh simulator (convenience for tests and one-off calls).
pub fn simulate(
    schedule: Schedule,
    c: &StageCosts,
    m: usize,
) -> Result<(ScheduleSummary, Vec<RankTimeline>), ScheduleError> {
    let mut sim = Simulator::new();
    let s = sim.run(schedule, c, m)?;
    Ok((s, sim.ranks().to_vec()))
}
