//! The checks a candidate passes before any time projection: Megatron's legality rules
//! ([`Layout::check`]) and the analytic memory estimate against the usable memory times
//! `spec.tuning.memoryHeadroom`, widened by the memory model's measured over-prediction band
//! for the kind of job ([`crate::memory::band`], the same band the admission webhook denies
//! beyond): a layout predicted a few hundred MiB over the headroom limit may still fit, so it
//! is kept (and counted) rather than thrown away. Every rejection is counted by its reason: the
//! rule's id, or for memory the pipeline stage that overflows and what dominates it there.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::layout::{Layout, LayoutError, RuleId};
use crate::memory::{self, Band};
use crate::scenario::Scenario;

/// Why a candidate was dropped before projection.
#[derive(Debug, Clone, PartialEq)]
pub enum Rejection {
    /// A legality rule failed.
    Rule(LayoutError),
    /// The bottleneck stage needs more than the usable memory times the headroom, by more
    /// than the model's error band (`limit_bytes` is that bound).
    Memory {
        peak_bytes: f64,
        limit_bytes: f64,
        stage: u32,
    },
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Rejection::Rule(e) => write!(f, "rule {}: {e}", e.rule),
            Rejection::Memory {
                peak_bytes,
                limit_bytes,
                stage,
            } => write!(
                f,
                "memory: pipeline stage {stage} needs {:.1} GiB, {:.1} GiB usable",
                peak_bytes / crate::units::GIB,
                limit_bytes / crate::units::GIB
            ),
        }
    }
}

/// The pre-filter of one scenario.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prefilter {
    /// Usable fraction of the profile's usable memory.
    pub headroom: f64,
    /// `headroom * usable bytes`: a candidate predicted above it is kept only within the band.
    pub limit_bytes: f64,
    /// The memory model's error band for the scenario's kind of job.
    pub band: Band,
    /// `limit_bytes * (1 + band.over)`: candidates predicted above it are rejected.
    pub reject_above_bytes: f64,
}

impl Prefilter {
    pub fn new(s: &Scenario, headroom: f64) -> Prefilter {
        let limit_bytes = headroom * s.hardware.usable_bytes();
        let band = Band::of(s);
        Prefilter {
            headroom,
            limit_bytes,
            band,
            reject_above_bytes: band.deny_above(limit_bytes),
        }
    }

    /// A predicted peak above the headroom limit but within the band: kept, but worth saying.
    pub fn within_band(&self, peak_bytes: f64) -> bool {
        peak_bytes > self.limit_bytes && peak_bytes <= self.reject_above_bytes
    }

    /// The legality rules alone.
    pub fn rules(&self, s: &Scenario, l: &Layout) -> Result<(), Rejection> {
        l.check(s).map_err(Rejection::Rule)
    }

    /// Whether a predicted peak is rejected: above the headroom limit widened by the band.
    pub fn rejects(&self, peak_bytes: f64) -> bool {
        peak_bytes > self.reject_above_bytes
    }

    /// The memory check alone (the layout is assumed legal): no allocation.
    pub fn memory(&self, s: &Scenario, l: &Layout) -> Result<(), Rejection> {
        let (peak, stage) = memory::peak_bytes(s, l);
        if !self.rejects(peak) {
            Ok(())
        } else {
            Err(Rejection::Memory {
                peak_bytes: peak,
                limit_bytes: self.reject_above_bytes,
                stage,
            })
        }
    }

    /// Rules, then memory.
    pub fn check(&self, s: &Scenario, l: &Layout) -> Result<(), Rejection> {
        self.rules(s, l)?;
        self.memory(s, l)
    }
}

/// What dominates stage `stage` of an overflowing layout (the reason the counters keep).
pub(crate) fn memory_reason(s: &Scenario, l: &Layout, stage: u32) -> &'static str {
    let pp = l.pp.max(1);
    let position = if pp == 1 {
        0
    } else if stage == 0 {
        1
    } else if stage == pp - 1 {
        2
    } else {
        3
    };
    // The overflowing stage alone (the whole estimate allocates a report of every stage).
    let st = memory::stage_memory(s, l, stage);
    let states = st.weights_bytes + st.gradients_bytes + st.optimizer_bytes;
    let activations = st.activations_bytes;
    let other = st.other_bytes;
    let what = if states >= activations && states >= other {
        0
    } else if activations >= other {
        1
    } else {
        2
    };
    const NAMES: [[&str; 3]; 4] = [
        [
            "model states (no pipeline)",
            "activations (no pipeline)",
            "buffers (no pipeline)",
        ],
        [
            "model states (first stage)",
            "activations (first stage)",
            "buffers (first stage)",
        ],
        [
            "model states (last stage)",
            "activations (last stage)",
            "buffers (last stage)",
        ],
        [
            "model states (middle stage)",
            "activations (middle stage)",
            "buffers (middle stage)",
        ],
    ];
    NAMES[position][what]
}

/// Counts of rejections by reason, and the other counters of a search.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Stats {
    /// Candidates whose step time was projected.
    pub evaluated: u64,
    /// Candidates a legality rule rejected.
    pub rejected_by_rules: u64,
    /// Candidates the memory pre-filter rejected.
    pub rejected_by_memory: u64,
    /// Candidates skipped unexamined because a safe bound rules them out (more memory than
    /// one that already failed, or slower than one that fits).
    pub pruned: u64,
    /// Rule id -> candidates it rejected (static keys: a search counts into hundreds of
    /// thousands of these maps, one per run of structures, and merges them).
    pub rules: BTreeMap<&'static str, u64>,
    /// Memory reason (what dominates which stage) -> candidates.
    pub memory: BTreeMap<&'static str, u64>,
}

impl Stats {
    /// Count one rejection (`count` identical candidates).
    pub fn reject(&mut self, s: &Scenario, l: &Layout, r: &Rejection, count: u64) {
        match r {
            Rejection::Rule(e) => self.reject_rule(RuleId(e.rule), count),
            Rejection::Memory { stage, .. } => {
                self.reject_memory(memory_reason(s, l, *stage), count);
            }
        }
    }

    /// Count `count` layouts the memory pre-filter rejects for `reason` (what
    /// `memory_reason` gave for one of them).
    pub fn reject_memory(&mut self, reason: &'static str, count: u64) {
        self.rejected_by_memory += count;
        *self.memory.entry(reason).or_default() += count;
    }

    /// Count `count` layouts that break rule `rule` (no layout needed, nothing copied).
    pub fn reject_rule(&mut self, rule: RuleId, count: u64) {
        self.rejected_by_rules += count;
        *self.rules.entry(rule.0).or_default() += count;
    }

    /// Add another search's counters.
    pub fn merge(&mut self, o: &Stats) {
        self.evaluated += o.evaluated;
        self.rejected_by_rules += o.rejected_by_rules;
        self.rejected_by_memory += o.rejected_by_memory;
        self.pruned += o.pruned;
        for (k, v) in &o.rules {
            *self.rules.entry(k).or_default() += v;
        }
        for (k, v) in &o.memory {
            *self.memory.entry(k).or_default() += v;
        }
    }

    /// A counter map ([`Stats::rules`], [`Stats::memory`]) with owned keys, as results carry it.
    pub fn owned(counts: &BTreeMap<&'static str, u64>) -> BTreeMap<String, u64> {
        counts.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// Candidates examined (projected or rejected).
    pub fn examined(&self) -> u64 {
        self.evaluated + self.rejected_by_rules + self.rejected_by_memory
    }
}
