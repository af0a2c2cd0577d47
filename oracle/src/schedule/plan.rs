//! The cached processing order of a 1F1B-family schedule: every pass of every rank, in an
//! order where each pass comes after the pass it waits for and its rank's previous pass, so
//! the timing loop ([`super::steady::time_passes`]) is one pass over an array. It depends only
//! on (schedule, pp, vpp, m) and is built once per key: sweep the ranks placing every pass
//! whose input is placed, reorder by start time in a reference run so consecutive passes
//! belong to different ranks, then index each rank's passes and the positions the results
//! read.

use super::order::RankOrder;
use super::steady::find_period;
use super::{NONE, PlanKey, PlanMeta, PlanOp, RankOp, ScheduleError, Simulator, dependency, index};

/// Passes in a processing order, and the plan position of each pass by [`index`].
struct Placed {
    plan: Vec<PlanOp>,
    meta: Vec<PlanMeta>,
    position: Vec<u32>,
}

impl Simulator {
    /// Build (or reuse) the processing order of a 1F1B-family schedule. The caller keeps
    /// `2 * pp * vpp * m` within [`super::MAX_PASSES`] and `pp * vpp` within the u16 indices.
    pub(super) fn ensure_plan(&mut self, key: PlanKey) -> Result<(), ScheduleError> {
        if self.built.key == Some(key) {
            return Ok(());
        }
        self.stash_current();
        if let Some(i) = self.stash.iter().position(|p| p.key == Some(key)) {
            self.built = self.stash.remove(i);
            return Ok(());
        }
        let PlanKey { pp, vpp, m, .. } = key;
        let nvs = pp * vpp;
        let total_ops = 2 * nvs * m;
        let placed = reorder_by_reference_start(place_passes(key)?, nvs, pp);
        // Each pass's predecessor on its rank (the timing loop reads its end instead of
        // keeping a per-rank "free" time: one array, no read-modify-write per rank).
        let mut plan = placed.plan;
        let mut last = vec![total_ops as u32; pp];
        for (i, op) in plan.iter_mut().enumerate() {
            op.prev = last[op.rank as usize];
            last[op.rank as usize] = i as u32;
        }
        self.built.last_of_rank = last;
        self.built.alone = plan
            .iter()
            .filter(|op| op.dur as usize >= 2 * nvs)
            .map(|op| (op.rank, op.dur))
            .collect();
        let position = placed.position;
        self.built.last_backward_at = (0..nvs)
            .map(|vs| (vs as u32, position[index(true, vs, m - 1, nvs, m)]))
            .collect();
        self.built.first_forward_at = (0..pp)
            .map(|r| {
                let vs = (vpp - 1) * pp + r;
                (r as u32, position[index(false, vs, 0, nvs, m)])
            })
            .collect();
        let (rank_ops, rank_ops_at) = rank_ops(&plan, pp);
        self.built.period = find_period(&plan, &placed.meta, nvs, pp.min(m));
        self.built.rank_ops = rank_ops;
        self.built.rank_ops_at = rank_ops_at;
        self.built.plan = plan;
        self.built.meta = placed.meta;
        self.built.key = Some(key);
        Ok(())
    }
}

/// Passes of the plans a simulator keeps besides its current one, at most (each pass takes
/// about 36 bytes in all its indexes: 18 MiB per thread at most). A DeepSeek-V3 tune on 1,024
/// H100 projects ~5,000 layouts of 49 plan shapes (617k passes together) in an order that
/// switched plans ~650 times, each a rebuild (a quarter of the tune) before plans were kept.
const STASH_PASSES: usize = 1 << 19;

impl Simulator {
    /// Put the current plan aside (most recent last), dropping the oldest kept plans beyond
    /// [`STASH_PASSES`] passes; the simulator is left without a current plan.
    fn stash_current(&mut self) {
        let current = std::mem::take(&mut self.built);
        if current.key.is_none() || current.plan.len() > STASH_PASSES {
            return;
        }
        let mut passes =
            current.plan.len() + self.stash.iter().map(|p| p.plan.len()).sum::<usize>();
        self.stash.push(current);
        while passes > STASH_PASSES {
            passes -= self.stash.remove(0).plan.len();
        }
    }
}

/// Sweep the ranks (alternately forward and backward over them), placing every pass of each
/// rank's order whose input pass is already placed; a sweep that places nothing is a
/// deadlock.
fn place_passes(key: PlanKey) -> Result<Placed, ScheduleError> {
    let PlanKey {
        pp, vpp, m, paired, ..
    } = key;
    let nvs = pp * vpp;
    let total_ops = 2 * nvs * m;
    let orders: Vec<RankOrder> = (0..pp)
        .map(|r| RankOrder::new(pp, vpp, m, r, paired))
        .collect();
    // Plan position of each pass once placed (forwards first, then backwards).
    let mut position = vec![NONE; total_ops];
    let mut cursor = vec![0usize; pp];
    let mut plan = Vec::with_capacity(total_ops);
    let mut meta = Vec::with_capacity(total_ops);
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
                let dep_pos = if dep == NONE {
                    total_ops as u32
                } else {
                    let p = position[dep as usize];
                    if p == NONE {
                        break;
                    }
                    p
                };
                position[index(backward, vs, mb, nvs, m)] = plan.len() as u32;
                let alone = if paired && o.unpaired(cursor[r]) {
                    2 * nvs
                } else {
                    0
                };
                plan.push(PlanOp {
                    dep: dep_pos,
                    prev: total_ops as u32,
                    rank: r as u16,
                    dur: (alone + if backward { nvs + vs } else { vs }) as u16,
                    cross: cross as u8,
                });
                meta.push(PlanMeta {
                    vs: vs as u32,
                    mb: mb as u32,
                    backward,
                });
                cursor[r] += 1;
            }
        }
        forward_sweep = !forward_sweep;
        if plan.len() == before {
            return Err(ScheduleError::Deadlock { pp, vpp, m });
        }
    }
    Ok(Placed {
        plan,
        meta,
        position,
    })
}

/// Reorder by start time in a reference run (forward 1, backward 2, no messages): still a
/// topological order (a pass starts after its input's pass and its rank's previous pass
/// started), and consecutive passes now belong to different ranks, so the timing loop's
/// per-rank chains overlap in the CPU instead of running back to back.
fn reorder_by_reference_start(placed: Placed, nvs: usize, pp: usize) -> Placed {
    let Placed {
        plan,
        meta,
        mut position,
    } = placed;
    let total_ops = plan.len();
    let mut start = vec![0.0f64; total_ops];
    let mut end_ref = vec![0.0f64; total_ops + 1];
    let mut free = vec![0.0f64; pp];
    for (i, op) in plan.iter().enumerate() {
        let ready = end_ref[op.dep as usize];
        let st = free[op.rank as usize].max(ready);
        let forward = (op.dur as usize) % (2 * nvs) < nvs;
        let dur = if forward { 1.0 } else { 2.0 };
        start[i] = st;
        end_ref[i] = st + dur;
        free[op.rank as usize] = st + dur;
    }
    let mut order: Vec<usize> = (0..total_ops).collect();
    // Ties (passes of different ranks starting together) by rank, which keeps the order
    // of one steady-state period the same as the next.
    order.sort_by(|&a, &b| {
        start[a]
            .total_cmp(&start[b])
            .then(plan[a].rank.cmp(&plan[b].rank))
    });
    let mut new_pos = vec![0u32; total_ops + 1];
    for (new, &old) in order.iter().enumerate() {
        new_pos[old] = new as u32;
    }
    new_pos[total_ops] = total_ops as u32;
    let reordered: Vec<PlanOp> = order
        .iter()
        .map(|&old| {
            let mut op = plan[old];
            op.dep = new_pos[op.dep as usize];
            op
        })
        .collect();
    for p in position.iter_mut() {
        if *p != NONE {
            *p = new_pos[*p as usize];
        }
    }
    Placed {
        plan: reordered,
        meta: order.iter().map(|&old| meta[old]).collect(),
        position,
    }
}

/// Each rank's passes in plan order, flattened, and where each rank's run starts (`pp + 1`
/// offsets).
fn rank_ops(plan: &[PlanOp], pp: usize) -> (Vec<RankOp>, Vec<usize>) {
    let mut rank_ops = Vec::with_capacity(plan.len());
    let mut rank_ops_at = Vec::with_capacity(pp + 1);
    for r in 0..pp {
        rank_ops_at.push(rank_ops.len());
        rank_ops.extend(
            plan.iter()
                .enumerate()
                .filter(|(_, op)| op.rank as usize == r)
                .map(|(i, op)| RankOp {
                    pos: i as u32,
                    dur: op.dur,
                    cross: op.cross,
                }),
        );
    }
    rank_ops_at.push(rank_ops.len());
    (rank_ops, rank_ops_at)
}
