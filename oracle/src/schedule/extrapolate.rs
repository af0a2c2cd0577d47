//! Schedules of more than [`super::MAX_PASSES`] passes (or the simulator's own budget), in memory independent of the micro-batch
//! count. Past its warm-up a 1F1B-family (or ZB-H1) schedule repeats every few micro-batch
//! groups, each repeat shifting every later time by the same amount, so every result the
//! projection reads (each rank's end, busy time, message waits and first forward, each
//! virtual stage's last backward) is affine in the micro-batch count `m` along `m1 + k*P`.
//! Three runs `P` micro-batches apart measure the slope and check that it holds (equal
//! differences) and that each rank's last step of passes waits the same gaps in all three (a
//! gap that still drifts, hidden while it exceeds the message time the waits are capped at,
//! changes the waits later); the results at `m` follow from the first run and the slope. When
//! the three runs do not fit in the budget, or disagree, the schedule is
//! [`ScheduleError::TooLarge`].

use super::{LastBackward, RankTimeline, ScheduleError, ScheduleSummary, Simulator, StageCosts};
use crate::layout::Schedule;

/// Micro-batch groups (of `pp` micro-batches) in one extrapolation step: a multiple of every
/// steady-state cyclicity up to 4 (the shortcut's `MAX_CYCLICITY`) and of 6.
const GROUPS_PER_STEP: usize = 12;
/// Steps of warm-up simulated before the three measured runs: a few first (a 1F1B-family
/// warm-up is shorter than one step unless vpp >= 12), more when the differences disagree.
const WARMUP_STEPS: [usize; 2] = [3, 12];
/// Relative disagreement between the two measured differences still taken as equal.
const TOLERANCE: f64 = 1e-9;

/// The results one run leaves, as plain numbers in a fixed order.
fn snapshot(sim: &Simulator) -> Vec<f64> {
    let mut v = Vec::with_capacity(4 * sim.ranks.len() + 2 * sim.last_backward.len());
    for r in &sim.ranks {
        v.extend([r.end, r.busy, r.p2p_wait, r.first_forward_end]);
    }
    for b in &sim.last_backward {
        v.extend([b.start, b.end]);
    }
    v
}

impl Simulator {
    /// Results at `m` micro-batches from three runs at `m1`, `m1 + P`, `m1 + 2P` (`P` =
    /// [`GROUPS_PER_STEP`] groups, `m1` congruent to `m` modulo `P`).
    pub(super) fn extrapolate(
        &mut self,
        schedule: Schedule,
        c: &StageCosts,
        (pp, vpp): (usize, usize),
        m: usize,
    ) -> Result<ScheduleSummary, ScheduleError> {
        let too_large = ScheduleError::TooLarge { pp, vpp, m };
        let nvs = pp * vpp;
        let step = GROUPS_PER_STEP * pp;
        // Most micro-batches one run may simulate.
        let most = (self.budget() / (2 * nvs as u64)) as usize;
        let room = most.checked_sub(2 * step).ok_or(too_large.clone())?;
        let rest = m % step;
        let fit = room.saturating_sub(rest) / step;
        for warmup in WARMUP_STEPS {
            let steps = warmup.min(fit);
            if steps == 0 || m < rest + (steps + 2) * step {
                break;
            }
            if let Some(summary) =
                self.extrapolate_from(schedule, c, (pp, vpp), m, rest + steps * step)?
            {
                return Ok(summary);
            }
            if steps == fit {
                break;
            }
        }
        Err(too_large)
    }

    /// [`Simulator::extrapolate`] from runs at `m1`, `m1 + P`, `m1 + 2P`; `None` when their
    /// differences disagree (no steady state yet).
    fn extrapolate_from(
        &mut self,
        schedule: Schedule,
        c: &StageCosts,
        (pp, vpp): (usize, usize),
        m: usize,
        m1: usize,
    ) -> Result<Option<ScheduleSummary>, ScheduleError> {
        let nvs = pp * vpp;
        let step = GROUPS_PER_STEP * pp;
        let mut runs = Vec::with_capacity(3);
        let mut gaps = Vec::with_capacity(3);
        // One step's passes per rank (two per micro-batch and chunk) and the cool-down after.
        let tail = 2 * vpp * step;
        // ZB-H1 keeps its own: one step's passes per rank (three per micro-batch), whose
        // placement of the deferred weight passes must repeat too.
        if schedule == Schedule::ZeroBubble {
            self.zb_gap_window = 3 * step;
        }
        for k in 0..3 {
            self.simulate_exact(schedule, c, (pp, vpp), m1 + k * step, false)?;
            runs.push(snapshot(self));
            let mut g = Vec::new();
            for r in 0..pp {
                self.tail_gaps(r, tail, &mut g);
            }
            gaps.push(g);
        }
        let makespan = runs[2].chunks(4).take(pp).map(|r| r[0]).fold(0.0, f64::max);
        let tol = TOLERANCE * makespan.abs().max(f64::MIN_POSITIVE);
        // In a periodic steady state every rank ends, and every virtual stage's last backward
        // happens, one period later per step: a rank whose end moves slower still drifts (its
        // slack grows until another dependency path takes over, a kink three runs cannot
        // see), so it is no steady state yet.
        let makespan_of = |run: &[f64]| run.chunks(4).take(pp).map(|r| r[0]).fold(0.0, f64::max);
        let period = makespan_of(&runs[1]) - makespan_of(&runs[0]);
        let ends = (0..pp).map(|r| 4 * r).chain(4 * pp..runs[0].len());
        for i in ends {
            if !((runs[1][i] - runs[0][i]) - period).abs().le(&tol) {
                return Ok(None);
            }
        }
        // Nor is one whose period is shorter than some rank's work per step: that rank is
        // spending idle time it saved earlier (ZB-H1's greedy weight passes trade slack between
        // two ranks of almost equal cost for dozens of groups before the bottleneck takes
        // over), so the slope does not last.
        for r in 0..pp {
            let work = runs[1][4 * r + 1] - runs[0][4 * r + 1];
            if work - period > tol {
                return Ok(None);
            }
        }
        // A steady state waits the same gaps at its end, whatever its length.
        for (g0, g) in gaps.iter().zip(&gaps[1..]) {
            if g0.len() != g.len() || g0.iter().zip(g).any(|(a, b)| !(a - b).abs().le(&tol)) {
                return Ok(None);
            }
        }
        let steps_to_m = ((m - m1) / step) as f64;
        let mut at_m = Vec::with_capacity(runs[0].len());
        for ((a, b), c3) in runs[0].iter().zip(&runs[1]).zip(&runs[2]) {
            let (d1, d2) = (b - a, c3 - b);
            if !(d1 - d2).abs().le(&tol) {
                return Ok(None);
            }
            at_m.push(a + steps_to_m * (c3 - a) / 2.0);
        }
        for (r, v) in self.ranks.iter_mut().zip(at_m.chunks(4)) {
            *r = RankTimeline {
                end: v[0],
                busy: v[1],
                p2p_wait: v[2],
                first_forward_end: v[3],
            };
        }
        for (b, v) in self.last_backward.iter_mut().zip(at_m[4 * pp..].chunks(2)) {
            *b = LastBackward {
                start: v[0],
                end: v[1],
            };
        }
        // Waits are now in the ranks, not computed from the (shorter) cached plan.
        self.planned = false;
        self.filled = (2 * nvs).saturating_mul(m - (m1 + 2 * step));
        Ok(Some(self.summarize()))
    }
}
