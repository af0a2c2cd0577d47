//! An upper bound on the tokens/s per GPU of every layout that shares a "compute key" (TP, CP,
//! EP, ETP, micro-batch size, recomputation and its modules, sequence parallelism, TP overlap) whatever its
//! pipeline (PP, VPP, schedule, split) and optimizer sharding: the branch-and-bound of the
//! exhaustive search.
//!
//! Why it holds: in the time model every pipeline rank runs its passes one after the other,
//! so the step takes at least the busiest rank's work, which is at least the average over the
//! `pp` ranks: `m / pp` micro-batches' worth of the whole model's per-micro-batch work (compute,
//! and the TP, CP and EP communication on the rank's stream, none of which depends on the
//! pipeline: their groups are placed inside a stage, at strides below the stage size). That
//! per-micro-batch work is what the same layout without a pipeline does for one micro-batch,
//! which one cheap projection (`pp = 1`, one micro-batch) gives. With full recompute of `k`
//! layers per chunk, the unpipelined layout recomputes `k` layers in all, never more than the
//! pipelined one. And `m / pp = globalBatch * tp * cp / (mbs * gpus)` does not depend on the
//! pipeline either. The per-step overhead is added; the bubble, pipeline transfers,
//! data-parallel communication and the optimizer step only make a step longer.
//!
//! A test checks the bound against the full projection over many layouts.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::RwLock;

use crate::layout::{Layout, ModuleSet, Recompute, Schedule};
use crate::scenario::Scenario;

use super::Context;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    tp: u32,
    cp: u32,
    ep: u32,
    etp: u32,
    mbs: u32,
    recompute: Recompute,
    recompute_layers: u32,
    recompute_modules: ModuleSet,
    sp: bool,
    tp_comm_overlap: bool,
    /// The MoE dispatcher and EP overlap.
    moe: (crate::layout::Dispatch, bool),
}

/// A fast hasher for small integer keys (multiply-rotate, as rustc's FxHasher): the cache is
/// read once per candidate structure and micro-batch size.
#[derive(Debug, Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(i as u64);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type Cache = HashMap<Key, Option<(f64, f64)>, BuildHasherDefault<KeyHasher>>;

/// Per-micro-batch work of the whole model (seconds) and the per-step overhead, by compute key.
#[derive(Debug, Default)]
pub struct ThroughputBound {
    cache: RwLock<Cache>,
}

impl ThroughputBound {
    pub fn new() -> ThroughputBound {
        ThroughputBound::default()
    }

    fn work(&self, ctx: &Context<'_>, l: &Layout) -> Option<(f64, f64)> {
        let key = Key {
            tp: l.tp,
            cp: l.cp,
            ep: l.ep,
            etp: l.etp,
            mbs: l.micro_batch_size,
            recompute: l.recompute,
            recompute_layers: l.recompute_layers,
            recompute_modules: l.recompute_set(),
            sp: l.sequence_parallel,
            tp_comm_overlap: l.tp_comm_overlap,
            moe: (l.moe.dispatch(), l.moe.ep_overlap),
        };
        if let Some(v) = self.cache.read().ok().and_then(|c| c.get(&key).copied()) {
            return v;
        }
        let v = unpipelined_work(ctx.scenario, ctx, l);
        if let Ok(mut c) = self.cache.write() {
            c.insert(key, v);
        }
        v
    }

    /// An upper bound on the tokens/s per GPU of `l` and of every layout that differs from it
    /// only in the pipeline (pp, vpp, schedule, split) or the optimizer sharding. `None` when
    /// it cannot be computed (the unpipelined layout breaks a rule).
    pub fn upper(&self, ctx: &Context<'_>, l: &Layout) -> Option<f64> {
        let s = ctx.scenario;
        let (busy, other) = self.work(ctx, l)?;
        let gpus = s.cluster.gpus as f64;
        let gbs = s.training.global_batch_size as f64;
        let m_per_rank = gbs * l.tp as f64 * l.cp as f64 / (l.micro_batch_size as f64 * gpus);
        let step = m_per_rank * busy + other;
        if step > 0.0 {
            Some(gbs * s.training.seq_length as f64 / (step * gpus))
        } else {
            None
        }
    }
}

/// One micro-batch of the layout without a pipeline: (compute + TP + CP + EP seconds, per-step
/// overhead seconds). Its one micro-batch runs unpaired under the EP overlap; the work per
/// micro-batch is the steady state's, so the unpaired exposure is taken out (a pipelined
/// layout's unpaired passes only add to its steady-state work).
fn unpipelined_work(s: &Scenario, ctx: &Context<'_>, l: &Layout) -> Option<(f64, f64)> {
    let mut flat = l.clone();
    flat.pp = 1;
    flat.vpp = 1;
    flat.schedule = Schedule::OneFOneB;
    flat.first_stage_layers = None;
    flat.last_stage_layers = None;
    flat.pipeline_layout = None;
    let dp = flat.dp(s.cluster.gpus)?;
    let mut one = s.clone();
    one.training.global_batch_size = flat.micro_batch_size as u64 * dp as u64;
    let t = crate::projection::step_time_with(&one, &flat, ctx.timer).ok()?;
    if t.num_microbatches != 1 {
        return None;
    }
    let b = &t.breakdown;
    let ep = b.ep_comm - t.unpaired_ep_seconds;
    Some((b.compute + b.tp_comm + b.cp_comm + ep, b.other))
}
