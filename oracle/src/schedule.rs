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

use crate::layout::Schedule;

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

/// One pass in a cached processing order.
#[derive(Debug, Clone, Copy)]
struct PlanOp {
    rank: u32,
    vs: u32,
    mb: u32,
    backward: bool,
    /// Index (in the end-time array) of the pass this one waits for, or NONE.
    dep: u32,
    /// Whether that wait includes a pipeline message.
    cross: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PlanKey {
    interleaved: bool,
    pp: usize,
    vpp: usize,
    m: usize,
}

/// The pass order of one pipeline rank in Megatron's 1F1B-family schedules.
#[derive(Debug, Clone, Copy)]
struct RankOrder {
    vpp: usize,
    m: usize,
    /// Micro-batch group size per virtual stage (Megatron's
    /// `microbatch_group_size_per_vp_stage`, default pp).
    group: usize,
    warmup: usize,
    total: usize,
}

impl RankOrder {
    fn new(pp: usize, vpp: usize, m: usize, rank: usize) -> RankOrder {
        let total = m * vpp;
        let group = pp.min(m).max(1);
        let warmup = if vpp == 1 {
            // 1F1B: p - r - 1 warm-up forwards.
            (pp - rank - 1).min(m)
        } else {
            // Interleaved: (p - r - 1) * 2 + (v - 1) * group, all of them when that exceeds
            // the total (megatron/core/pipeline_parallel/schedules.py).
            ((pp - rank - 1) * 2 + (vpp - 1) * group).min(total)
        };
        RankOrder {
            vpp,
            m,
            group,
            warmup,
            total,
        }
    }

    /// Passes this rank runs (forwards and backwards).
    fn len(&self) -> usize {
        2 * self.total
    }

    /// The `k`-th entry of Megatron's schedule table: micro-batches in groups of `group`,
    /// each group walked through every chunk in turn.
    fn table(&self, k: usize) -> (usize, usize) {
        let g = self.group;
        let full_groups = self.m / g;
        let per_group = g * self.vpp;
        if k < full_groups * per_group {
            let grp = k / per_group;
            let rem = k % per_group;
            (grp * g + rem % g, rem / g)
        } else {
            let last = self.m - full_groups * g;
            let rem = k - full_groups * per_group;
            (full_groups * g + rem % last, rem / last)
        }
    }

    /// The `j`-th pass: (backward?, micro-batch, chunk). Warm-up forwards, then one forward
    /// and one backward in turn, then the cool-down backwards.
    fn pass(&self, j: usize) -> (bool, usize, usize) {
        let w = self.warmup;
        let steady = self.total - w;
        let (backward, k) = if j < w {
            (false, j)
        } else if j - w < 2 * steady {
            let i = j - w;
            if i % 2 == 0 {
                (false, w + i / 2)
            } else {
                (true, i / 2)
            }
        } else {
            (true, j - w - steady)
        };
        let (mb, chunk) = self.table(k);
        if backward {
            (true, mb, self.vpp - 1 - chunk)
        } else {
            (false, mb, chunk)
        }
    }
}

/// Reusable simulation state: keep one per thread and reuse it (no allocation per call once
/// warm).
#[derive(Debug, Default)]
pub struct Simulator {
    key: Option<PlanKey>,
    plan: Vec<PlanOp>,
    end: Vec<f64>,
    free: Vec<f64>,
    ranks: Vec<RankTimeline>,
    last_backward: Vec<LastBackward>,
    // ZB-H1 state.
    cursor: Vec<usize>,
    pending: Vec<u32>,
    pending_head: Vec<u32>,
    first_fwd_count: Vec<u32>,
    /// Recorded passes when tracing.
    pub trace: Option<Vec<Event>>,
}

impl Simulator {
    pub fn new() -> Simulator {
        Simulator::default()
    }

    /// A simulator that records every pass (for timelines).
    pub fn tracing() -> Simulator {
        Simulator {
            trace: Some(Vec::new()),
            ..Simulator::default()
        }
    }

    /// Per-rank results of the last run.
    pub fn ranks(&self) -> &[RankTimeline] {
        &self.ranks
    }

    /// Per-virtual-stage last backward pass of the last run.
    pub fn last_backward(&self) -> &[LastBackward] {
        &self.last_backward
    }

    /// Simulate `m` micro-batches.
    pub fn run(&mut self, schedule: Schedule, c: &StageCosts, m: usize) -> ScheduleSummary {
        let pp = c.pp.max(1);
        let vpp = if schedule == Schedule::Interleaved {
            c.vpp.max(1)
        } else {
            1
        };
        let m = m.max(1);
        let nvs = pp * vpp;
        debug_assert!(c.forward.len() >= nvs && c.backward.len() >= nvs);
        self.ranks.clear();
        self.ranks.resize(pp, RankTimeline::default());
        self.last_backward.clear();
        self.last_backward.resize(nvs, LastBackward::default());
        self.free.clear();
        self.free.resize(pp, 0.0);
        if let Some(t) = self.trace.as_mut() {
            t.clear();
        }
        if schedule == Schedule::ZeroBubble {
            self.run_zero_bubble(c, pp, m);
        } else {
            self.ensure_plan(PlanKey {
                interleaved: vpp > 1,
                pp,
                vpp,
                m,
            });
            self.run_plan(c, pp, vpp, m);
        }
        self.summarize()
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

    /// Build (or reuse) the processing order of a 1F1B-family schedule.
    fn ensure_plan(&mut self, key: PlanKey) {
        if self.key == Some(key) {
            return;
        }
        let PlanKey { pp, vpp, m, .. } = key;
        let nvs = pp * vpp;
        let orders: Vec<RankOrder> = (0..pp).map(|r| RankOrder::new(pp, vpp, m, r)).collect();
        let mut done = vec![false; 2 * nvs * m];
        let mut cursor = vec![0usize; pp];
        let mut plan = Vec::with_capacity(2 * nvs * m);
        let total_ops = 2 * nvs * m;
        let mut forward_sweep = true;
        while plan.len() < total_ops {
            let before = plan.len();
            for i in 0..pp {
                let r = if forward_sweep { i } else { pp - 1 - i };
                let o = &orders[r];
                while cursor[r] < o.len() {
                    let (backward, mb, chunk) = o.pass(cursor[r]);
                    let vs = chunk * pp + r;
                    let (dep, cross) = dependency(backward, vs, mb, nvs, m);
                    if dep != NONE && !done[dep as usize] {
                        break;
                    }
                    let me = index(backward, vs, mb, nvs, m);
                    done[me] = true;
                    plan.push(PlanOp {
                        rank: r as u32,
                        vs: vs as u32,
                        mb: mb as u32,
                        backward,
                        dep,
                        cross,
                    });
                    cursor[r] += 1;
                }
            }
            forward_sweep = !forward_sweep;
            assert!(
                plan.len() > before,
                "pipeline schedule deadlock (pp={pp}, vpp={vpp}, m={m})"
            );
        }
        self.plan = plan;
        self.key = Some(key);
    }

    fn run_plan(&mut self, c: &StageCosts, pp: usize, vpp: usize, m: usize) {
        let nvs = pp * vpp;
        self.end.clear();
        self.end.resize(2 * nvs * m, 0.0);
        let p2p = c.p2p;
        let last_mb = (m - 1) as u32;
        let first_fwd_last_chunk = (vpp - 1) * pp;
        for op in &self.plan {
            let vs = op.vs as usize;
            let r = op.rank as usize;
            let dur = if op.backward {
                c.backward[vs] + c.weight[vs]
            } else {
                c.forward[vs]
            };
            let (ready, msg) = if op.dep == NONE {
                (0.0, 0.0)
            } else if op.cross {
                (self.end[op.dep as usize] + p2p, p2p)
            } else {
                (self.end[op.dep as usize], 0.0)
            };
            let free = self.free[r];
            let start = free.max(ready);
            let end = start + dur;
            let me = index(op.backward, vs, op.mb as usize, nvs, m);
            self.end[me] = end;
            self.free[r] = end;
            let rt = &mut self.ranks[r];
            rt.busy += dur;
            rt.p2p_wait += (start - free).min(msg);
            if op.backward && op.mb == last_mb {
                self.last_backward[vs] = LastBackward { start, end };
            }
            if !op.backward && op.mb == 0 && vs - r == first_fwd_last_chunk {
                rt.first_forward_end = end;
            }
            if let Some(t) = self.trace.as_mut() {
                t.push(Event {
                    rank: op.rank,
                    chunk: (vs / pp) as u32,
                    microbatch: op.mb,
                    kind: if op.backward {
                        PassKind::Backward
                    } else {
                        PassKind::Forward
                    },
                    start,
                    end,
                });
            }
        }
        for r in 0..pp {
            self.ranks[r].end = self.free[r];
        }
    }

    /// ZB-H1: the 1F1B order of forwards and (input-gradient) backwards; each rank defers its
    /// weight-gradient passes and runs them in the gaps while it waits for an input, keeping at
    /// most `rank + 1` of them pending (so no rank holds more micro-batches than the first
    /// rank of 1F1B), and drains the rest at the end.
    fn run_zero_bubble(&mut self, c: &StageCosts, pp: usize, m: usize) {
        let nvs = pp;
        self.end.clear();
        self.end.resize(2 * nvs * m, f64::NAN);
        self.cursor.clear();
        self.cursor.resize(pp, 0);
        self.pending.clear();
        self.pending.resize(pp, 0);
        self.pending_head.clear();
        self.pending_head.resize(pp, 0);
        self.first_fwd_count.clear();
        self.first_fwd_count.resize(pp, 0);
        let mut remaining = 2 * nvs * m;
        let mut forward_sweep = true;
        while remaining > 0 {
            let mut progressed = false;
            for i in 0..pp {
                let r = if forward_sweep { i } else { pp - 1 - i };
                let o = RankOrder::new(pp, 1, m, r);
                while self.cursor[r] < o.len() {
                    let (backward, mb, _) = o.pass(self.cursor[r]);
                    let vs = r;
                    let (dep, cross) = dependency(backward, vs, mb, nvs, m);
                    let (ready, msg) = if dep == NONE {
                        (0.0, 0.0)
                    } else {
                        let e = self.end[dep as usize];
                        if e.is_nan() {
                            break;
                        }
                        if cross { (e + c.p2p, c.p2p) } else { (e, 0.0) }
                    };
                    // Fill the gap before this pass with deferred weight passes.
                    while self.pending[r] > 0 && ready > self.free[r] {
                        self.weight_pass(c, r, m);
                    }
                    let free = self.free[r];
                    let start = free.max(ready);
                    let dur = if backward {
                        c.backward[vs]
                    } else {
                        c.forward[vs]
                    };
                    let end = start + dur;
                    self.end[index(backward, vs, mb, nvs, m)] = end;
                    self.free[r] = end;
                    let rt = &mut self.ranks[r];
                    rt.busy += dur;
                    rt.p2p_wait += (start - free).min(msg);
                    if !backward && mb == 0 {
                        rt.first_forward_end = end;
                    }
                    if backward && mb == m - 1 {
                        self.last_backward[vs].start = start;
                    }
                    self.record(r, mb, PassKind::from_backward(backward), start, end);
                    if backward {
                        self.pending[r] += 1;
                        // Keep at most rank + 1 weight passes pending: with the (pp - rank - 1)
                        // warm-up forwards still in flight, no rank holds more than the pp
                        // micro-batches the first rank of 1F1B holds (ZB-H1's memory bound).
                        while self.pending[r] as usize > r + 1 {
                            self.weight_pass(c, r, m);
                        }
                    }
                    self.cursor[r] += 1;
                    remaining -= 1;
                    progressed = true;
                }
                if self.cursor[r] == o.len() {
                    while self.pending[r] > 0 {
                        self.weight_pass(c, r, m);
                    }
                }
            }
            forward_sweep = !forward_sweep;
            assert!(progressed, "zero-bubble schedule deadlock (pp={pp}, m={m})");
        }
        for r in 0..pp {
            self.ranks[r].end = self.free[r];
        }
    }

    /// Run the oldest pending weight pass of rank `r` now.
    fn weight_pass(&mut self, c: &StageCosts, r: usize, m: usize) {
        let mb = self.pending_head[r] as usize;
        let start = self.free[r];
        let dur = c.weight[r];
        let end = start + dur;
        self.free[r] = end;
        self.ranks[r].busy += dur;
        self.pending[r] -= 1;
        self.pending_head[r] += 1;
        if mb == m - 1 {
            self.last_backward[r].end = end;
        }
        self.record(r, mb, PassKind::Weight, start, end);
    }

    fn record(&mut self, r: usize, mb: usize, kind: PassKind, start: f64, end: f64) {
        if let Some(t) = self.trace.as_mut() {
            t.push(Event {
                rank: r as u32,
                chunk: 0,
                microbatch: mb as u32,
                kind,
                start,
                end,
            });
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
) -> (ScheduleSummary, Vec<RankTimeline>) {
    let mut sim = Simulator::new();
    let s = sim.run(schedule, c, m);
    (s, sim.ranks().to_vec())
}
