//! The steady state of a 1F1B-family schedule: find the periodic middle of a cached pass
//! order, and time passes (the hot loop). Once the pass times of one lookback window repeat
//! those of a period (or a few periods) earlier shifted by a constant, every later pass of the
//! periodic part repeats too: its predecessors are the shifted predecessors of its
//! counterpart, so `end = max(prev, input + message) + duration` shifts by the same constant.

use super::{PlanMeta, PlanOp};

/// Longest cycle (in micro-batch groups) of a steady state the simulation looks for.
pub(super) const MAX_CYCLICITY: usize = 4;

/// The steady-state part of a plan: positions `first..last` hold the passes of positions
/// `first - len..last - len` one micro-batch group later, with every predecessor shifted by
/// `len` too; no pass there looks back further than `lookback` positions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Period {
    pub len: usize,
    pub first: usize,
    pub last: usize,
    pub lookback: usize,
}

/// Find the periodic part of a plan (micro-batch groups of `group`).
pub(super) fn find_period(
    plan: &[PlanOp],
    meta: &[PlanMeta],
    nvs: usize,
    group: usize,
) -> Option<Period> {
    let n = plan.len();
    let len = 2 * nvs * group;
    if n < 3 * len {
        return None;
    }
    let sentinel = n as u32;
    let shifted = |x: u32, y: u32| {
        (x == sentinel && y == sentinel) || (x != sentinel && y as usize == x as usize + len)
    };
    let same = |i: usize| {
        let (a, b) = (&plan[i], &plan[i + len]);
        a.rank == b.rank
            && a.dur == b.dur
            && a.cross == b.cross
            && meta[i + len].mb as usize == meta[i].mb as usize + group
            && shifted(a.dep, b.dep)
            && shifted(a.prev, b.prev)
    };
    // Longest run of positions whose pass repeats one period later.
    let (mut best, mut run_start) = ((0, 0), None);
    for i in 0..=n - len {
        let ok = i < n - len && same(i);
        match (ok, run_start) {
            (true, None) => run_start = Some(i),
            (false, Some(a)) => {
                if i - a > best.1 - best.0 {
                    best = (a, i);
                }
                run_start = None;
            }
            _ => {}
        }
    }
    let (a, b) = best;
    let (first, last) = (a + len, b + len);
    if last - first < 2 * len {
        return None;
    }
    let mut lookback = len;
    for (i, op) in plan.iter().enumerate().take(last).skip(first) {
        for p in [op.dep, op.prev] {
            if p != sentinel {
                lookback = lookback.max(i - p as usize);
            }
        }
    }
    if first + lookback + len > last {
        return None;
    }
    Some(Period {
        len,
        first,
        last,
        lookback,
    })
}

/// Time passes `from..to` of a plan: each starts when its rank's previous pass has ended and
/// its input has arrived (`end[plan.len()]` is the 0.0 sentinel).
#[inline]
pub(super) fn time_passes(
    plan: &[PlanOp],
    end: &mut [f64],
    durations: &[f64],
    message: &[f64; 2],
    from: usize,
    to: usize,
) {
    for i in from..to {
        let op = &plan[i];
        let ready = end[op.dep as usize] + message[op.cross as usize];
        let f = end[op.prev as usize];
        // Plain compares (no NaN handling: every time here is finite).
        let start = if ready > f { ready } else { f };
        end[i] = start + durations[op.dur as usize];
    }
}

/// Whether `end[q - window..q]` repeats `end[q - window - len..q - len]` shifted by one
/// constant; the shift.
pub(super) fn repeats(end: &[f64], q: usize, len: usize, window: usize) -> Option<f64> {
    let shift = end[q - 1] - end[q - 1 - len];
    let tolerance = 1e-12 * end[q - 1].abs().max(1e-30);
    (q - window..q)
        .all(|i| (end[i] - end[i - len] - shift).abs() <= tolerance)
        .then_some(shift)
}
