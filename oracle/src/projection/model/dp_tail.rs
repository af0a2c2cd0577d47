//! Step 3 of the time model: the data-parallel tail of each pipeline rank after its last
//! pass: gradient reduction (overlapped with the backward when the layout overlaps it), the
//! distributed optimizer's parameter gather, and the optimizer step over the rank's shard
//! (Megatron-Core DDP buckets and Adam's HBM traffic; constants in [`crate::projection`]).
//! The rank that finishes last sets the step time.

use crate::collectives::{self, Group};
use crate::units::MICROSECOND;

use super::Setup;
use super::stage::GpuParams;
use crate::projection::{
    ADAM_BYTES_PER_PARAM, BUCKET_PARAMS, CPU_ADAM_PARAMS_PER_SECOND, OPTIMIZER_KERNELS,
    PARAM_BYTES, Workspace, grad_bytes,
};
use crate::units::FP32_BYTES;

/// The end of one pipeline rank's step after its last pass.
#[derive(Debug, Clone, Copy)]
pub(super) struct RankFinish {
    pub rank: usize,
    /// When the rank's optimizer step ends.
    pub finish: f64,
    /// Gradient reduction and parameter gather not hidden behind the passes.
    pub dp_exposed: f64,
    /// The optimizer step over the rank's shard.
    pub optimizer: f64,
}

/// Seconds of one chunk's gradient reduction and parameter gather over data parallelism.
#[derive(Debug, Clone, Copy, PartialEq)]
struct ChunkDpCost {
    reduce: f64,
    gather: f64,
}

/// [`ChunkDpCost`] by the chunk's parameters: most chunks hold the same, so each distinct
/// count is priced once; counts beyond the few slots are priced every time.
#[derive(Default)]
struct DpCostCache {
    entries: [Option<(GpuParams, ChunkDpCost)>; 4],
}

impl DpCostCache {
    fn get_or_insert_with(
        &mut self,
        key: GpuParams,
        price: impl FnOnce() -> ChunkDpCost,
    ) -> ChunkDpCost {
        for entry in self.entries.iter().flatten() {
            if entry.0 == key {
                return entry.1;
            }
        }
        let cost = price();
        if let Some(free) = self.entries.iter_mut().find(|e| e.is_none()) {
            *free = Some((key, cost));
        }
        cost
    }
}

/// What every rank's tail reads.
struct DpTail {
    /// Effective HBM bandwidth of the optimizer, bytes/s.
    hbm: f64,
    /// One kernel launch, seconds.
    overhead: f64,
    /// Expert-data-parallel replicas.
    edp: f64,
    /// DP x CP replicas of non-expert parameters.
    dp_cp: f64,
}

/// The data-parallel reduction, parameter gather and optimizer of every pipeline rank after
/// its last pass; the rank that finishes last is the critical one.
pub(super) fn dp_tail(st: &Setup, w: &Workspace) -> RankFinish {
    let (hw, l) = (&st.s.hardware, st.l);
    let tail = DpTail {
        hbm: hw.memory_bandwidth() * hw.efficiency.memory_bound,
        overhead: hw.efficiency.kernel_overhead_us * MICROSECOND,
        edp: (st.gpus / l.pp.max(1) / (l.ep * l.etp).max(1)).max(1) as f64,
        dp_cp: (st.dp * l.cp) as f64,
    };
    let mut best = RankFinish {
        rank: 0,
        finish: f64::MIN,
        dp_exposed: 0.0,
        optimizer: 0.0,
    };
    let mut cache = DpCostCache::default();
    for r in 0..st.pp {
        let rank = rank_finish(st, &tail, w, &mut cache, r);
        if rank.finish > best.finish {
            best = rank;
        }
    }
    best
}

/// Pipeline rank `r`: its chunks' gradient reductions in the order their gradients complete
/// (last chunk first), overlapped with the backward when the layout overlaps them, the
/// distributed optimizer's parameter gather, and the optimizer step over its shard.
fn rank_finish(
    st: &Setup,
    tail: &DpTail,
    w: &Workspace,
    cache: &mut DpCostCache,
    r: usize,
) -> RankFinish {
    let l = st.l;
    let tl = w.sim.ranks()[r];
    let mut grad_finish: f64 = 0.0;
    let mut ag_total = 0.0;
    let mut ag_bucket: f64 = 0.0;
    let mut local = GpuParams::default();
    for c in (0..st.vpp).rev() {
        let vs = c * st.pp + r;
        let p = w.params[vs];
        local.non_expert += p.non_expert;
        local.expert += p.expert;
        if l.fsdp {
            continue;
        }
        let lb = w.sim.last_backward()[vs];
        let cost = cache.get_or_insert_with(p, || chunk_dp_cost(st, p));
        let chunk_params = p.non_expert + p.expert;
        let bucket_share = if chunk_params > 0.0 {
            (BUCKET_PARAMS.max(1e6 * st.dp as f64) / chunk_params).min(1.0)
        } else {
            1.0
        };
        grad_finish = if l.overlap_grad_reduce {
            // Buckets are released while the last micro-batch's backward runs; the stream
            // finishes after its work, and no earlier than the last bucket after the end.
            (grad_finish.max(lb.start) + cost.reduce).max(lb.end + cost.reduce * bucket_share)
        } else {
            grad_finish.max(tl.end) + cost.reduce
        };
        if l.distributed_optimizer {
            ag_total += cost.gather;
            ag_bucket = ag_bucket.max(cost.gather * bucket_share);
        }
    }
    let grad_exposed = (grad_finish - tl.end).max(0.0);
    let ag_exposed = if l.overlap_param_gather {
        (ag_total - tl.first_forward_end).max(0.0) + ag_bucket
    } else {
        ag_total
    };
    let shard = if l.distributed_optimizer || l.fsdp {
        local.non_expert / tail.dp_cp + local.expert / tail.edp
    } else {
        local.non_expert + local.expert
    };
    // Adam over the GPU's part of the shard, the host's part (optimizer CPU offload), and
    // zeroing the local gradient buffer.
    let on_host = shard * cpu_offload_fraction(l);
    let optimizer = (shard - on_host) * ADAM_BYTES_PER_PARAM / tail.hbm
        + cpu_optimizer_seconds(st, on_host)
        + (local.non_expert + local.expert) * grad_bytes(l) / tail.hbm
        + OPTIMIZER_KERNELS * tail.overhead;
    RankFinish {
        rank: r,
        finish: tl.end + grad_exposed + ag_exposed + optimizer,
        dp_exposed: grad_exposed + ag_exposed,
        optimizer,
    }
}

/// The fraction of the optimizer's shard whose Adam step runs on the host
/// (`--optimizer-cpu-offload`, `--optimizer-offload-fraction`); 0 without the offload.
fn cpu_offload_fraction(l: &crate::layout::Layout) -> f64 {
    if l.optimizer_cpu_offload {
        l.optimizer_offload_fraction.get().clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// The host's part of the optimizer step for `params` parameters of the shard (Megatron-Core
/// `HybridDeviceOptimizer`, `cpu_offloading/hybrid_optimizer.py`): the gradients copied to
/// pinned host memory (the main gradients, [`grad_bytes`]), `torch.optim.AdamW` on the CPU at
/// [`CPU_ADAM_PARAMS_PER_SECOND`], and the updated parameters copied back (the FP32 master
/// shards, or with the precision-aware optimizer the BF16 shards). One after the other:
/// `--overlap-cpu-optimizer-d2h-h2d` is off by default and not a layout option.
fn cpu_optimizer_seconds(st: &Setup, params: f64) -> f64 {
    if params <= 0.0 {
        return 0.0;
    }
    let (hw, l) = (&st.s.hardware, st.l);
    let param_bytes = if l.precision_aware_optimizer {
        PARAM_BYTES
    } else {
        FP32_BYTES
    };
    hw.host_copy_seconds(params * grad_bytes(l))
        + params / CPU_ADAM_PARAMS_PER_SECOND
        + hw.host_copy_seconds(params * param_bytes)
}

/// Gradient reduction (reduce-scatter with the distributed optimizer, else all-reduce) and
/// parameter gather (distributed optimizer only) of a chunk holding `p`.
fn chunk_dp_cost(st: &Setup, p: GpuParams) -> ChunkDpCost {
    let (l, topo, place) = (st.l, &st.cc.topo, &st.cc.place);
    let reduce = |g: &Group, n: f64| -> f64 {
        if l.distributed_optimizer {
            collectives::reduce_scatter(topo, g, n * grad_bytes(l))
        } else {
            collectives::all_reduce(topo, g, n * grad_bytes(l))
        }
    };
    let gather = |g: &Group, n: f64| -> f64 {
        if l.distributed_optimizer {
            collectives::all_gather(topo, g, n * PARAM_BYTES)
        } else {
            0.0
        }
    };
    ChunkDpCost {
        reduce: reduce(&place.dp_cp, p.non_expert) + reduce(&place.edp, p.expert),
        gather: gather(&place.dp_cp, p.non_expert) + gather(&place.edp, p.expert),
    }
}
