//! ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 3.1): the backward
//! pass split into input-gradient (B) and weight-gradient (W) passes, W deferred into the
//! gaps. Runs the general event loop (W placement depends on the times).

use std::collections::VecDeque;

use super::{
    Event, NONE, PassKind, RankOrder, ScheduleError, Simulator, StageCosts, dependency, index,
};

impl Simulator {
    /// ZB-H1: the 1F1B order of forwards and (input-gradient) backwards; each rank defers its
    /// weight-gradient passes and runs them in the gaps while it waits for an input, keeping at
    /// most `rank + 1` of them pending (so no rank holds more micro-batches than the first
    /// rank of 1F1B), and drains the rest at the end.
    pub(super) fn run_zero_bubble(
        &mut self,
        c: &StageCosts,
        pp: usize,
        m: usize,
    ) -> Result<(), ScheduleError> {
        let nvs = pp;
        self.zb_end.clear();
        self.zb_end.resize(2 * nvs * m, None);
        self.cursor.clear();
        self.cursor.resize(pp, 0);
        self.pending.clear();
        self.pending.resize(pp, 0);
        self.pending_head.clear();
        self.pending_head.resize(pp, 0);
        self.first_fwd_count.clear();
        self.first_fwd_count.resize(pp, 0);
        self.zb_gaps.resize_with(pp, VecDeque::new);
        for kept in &mut self.zb_gaps[..pp] {
            kept.clear();
        }
        let mut remaining = 2 * nvs * m;
        let mut forward_sweep = true;
        while remaining > 0 {
            let mut progressed = false;
            for i in 0..pp {
                let r = if forward_sweep { i } else { pp - 1 - i };
                let o = RankOrder::new(pp, 1, m, r, false);
                while self.cursor[r] < o.len() {
                    let (backward, mb, _) = o.pass(self.cursor[r]);
                    let vs = r;
                    let (dep, cross) = dependency(backward, vs, mb, nvs, m);
                    let (ready, msg) = if dep == NONE {
                        (0.0, 0.0)
                    } else {
                        // The pass this one waits for has not run yet: next rank.
                        let Some(e) = self.zb_end[dep as usize] else {
                            break;
                        };
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
                    self.keep_gap(r, start - free);
                    self.zb_end[index(backward, vs, mb, nvs, m)] = Some(end);
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
            if !progressed {
                return Err(ScheduleError::Deadlock { pp, vpp: 1, m });
            }
        }
        for r in 0..pp {
            self.ranks[r].end = self.free[r];
        }
        Ok(())
    }

    /// Run the oldest pending weight pass of rank `r` now.
    fn weight_pass(&mut self, c: &StageCosts, r: usize, m: usize) {
        let mb = self.pending_head[r] as usize;
        let start = self.free[r];
        let dur = c.weight[r];
        let end = start + dur;
        self.keep_gap(r, 0.0);
        self.free[r] = end;
        self.ranks[r].busy += dur;
        self.pending[r] -= 1;
        self.pending_head[r] += 1;
        if mb == m - 1 {
            self.last_backward[r].end = end;
        }
        self.record(r, mb, PassKind::Weight, start, end);
    }

    /// Keep the idle gap before rank `r`'s latest pass (the last `zb_gap_window` of them).
    fn keep_gap(&mut self, r: usize, gap: f64) {
        if self.zb_gap_window == 0 {
            return;
        }
        let kept = &mut self.zb_gaps[r];
        if kept.len() == self.zb_gap_window {
            kept.pop_front();
        }
        kept.push_back(gap);
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
