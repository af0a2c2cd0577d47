//! The pass order of Megatron's 1F1B-family schedules (megatron/core/pipeline_parallel/
//! schedules.py): warm-up forwards, one forward and one backward in turn, cool-down backwards;
//! with interleaving, micro-batches in groups of `pp` walked through every model chunk.

/// The pass order of one pipeline rank in Megatron's 1F1B-family schedules.
#[derive(Debug, Clone, Copy)]
pub(super) struct RankOrder {
    vpp: usize,
    m: usize,
    /// Micro-batch group size per virtual stage (Megatron's
    /// `microbatch_group_size_per_vp_stage`, default pp).
    group: usize,
    warmup: usize,
    total: usize,
}

impl RankOrder {
    /// `paired`: the schedule of Megatron's EP overlap, whose warm-up runs one more forward
    /// (interleaved: `get_pp_rank_microbatches`; without a pipeline: the first forward runs
    /// alone, `combined_1f1b_schedule_for_no_pipelining`) so every steady-state forward pairs
    /// with a backward of an earlier micro-batch.
    #[inline]
    pub(super) fn new(pp: usize, vpp: usize, m: usize, rank: usize, paired: bool) -> RankOrder {
        let total = m * vpp;
        let group = pp.min(m).max(1);
        let warmup = if vpp == 1 {
            // 1F1B: p - r - 1 warm-up forwards.
            (pp - rank - 1 + usize::from(paired)).min(m)
        } else {
            // Interleaved: (p - r - 1) * 2 + (v - 1) * group, all of them when that exceeds
            // the total (megatron/core/pipeline_parallel/schedules.py).
            ((pp - rank - 1) * 2 + (vpp - 1) * group + usize::from(paired)).min(total)
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
    #[inline]
    pub(super) fn len(&self) -> usize {
        2 * self.total
    }

    /// Whether the `j`-th pass runs outside the steady state's forward-backward pairs: a
    /// warm-up forward or a cool-down backward.
    #[inline]
    pub(super) fn unpaired(&self, j: usize) -> bool {
        j < self.warmup || j >= self.total + (self.total - self.warmup)
    }

    /// The `k`-th entry of Megatron's schedule table: micro-batches in groups of `group`,
    /// each group walked through every chunk in turn.
    #[inline]
    pub(super) fn table(&self, k: usize) -> (usize, usize) {
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
    #[inline]
    pub(super) fn pass(&self, j: usize) -> (bool, usize, usize) {
        let w = self.warmup;
        let steady = self.total - w;
        let (backward, k) = if j < w {
            (false, j)
        } else if j - w < 2 * steady {
            let i = j - w;
            if i.is_multiple_of(2) {
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
