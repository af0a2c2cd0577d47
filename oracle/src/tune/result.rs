//! What a tune reports (DESIGN.md section 4): `{best, top[], evaluated, rejectedByMemory,
//! rejectedByRules, reference?, gainOverReference?, searcher, seconds}`, where `best` and each
//! entry of `top` hold `layout` (the fields of `spec.parallelism`) and `projection` (the
//! object `primus project -o json` prints). Extra fields: `label` and `dominant` per entry,
//! `pruned`, `rejections` (counts by reason), `candidatesPerSecond`, `memoryHeadroom`, and the
//! agent's counters.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::layout::Layout;
use crate::plan::SearcherKind;
use crate::projection::Projection;
use crate::tune::Stats;
use crate::tune::agent::AgentStats;
use crate::tune::trials::{Trial, TrialLog, TrialSummary};

/// One reported layout.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// The layout, with the field names of `spec.parallelism`.
    pub layout: Layout,
    /// Its full projection.
    pub projection: Projection,
    /// One-line label, e.g. `TP4 PP8 VPP5 MBS1 interleaved`.
    pub label: String,
    /// What dominates the step: `compute`, `bubble`, `communication (ep)`, ...
    pub dominant: String,
}

impl Candidate {
    pub fn new(layout: Layout, projection: Projection) -> Candidate {
        let b = &projection.breakdown;
        let dominant = match projection.dominant {
            crate::projection::Dominant::Communication => {
                format!("communication ({})", b.largest_comm().0)
            }
            d => d.as_str().to_string(),
        };
        let mut label = layout.label();
        if let Some(pl) = &layout.pipeline_layout {
            // The explicit layout is in `layout`; the label names it by its stage count.
            label = label.replace(
                &format!("layout={}", pl.as_str()),
                &format!("layout({} stages)", pl.stages().len()),
            );
        }
        Candidate {
            label,
            layout,
            projection,
            dominant,
        }
    }

    pub fn tokens_per_second(&self) -> f64 {
        self.projection.tokens_per_second_per_gpu
    }
}

/// The reference layout (`spec.parallelism`) as projected.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Reference {
    #[serde(flatten)]
    pub candidate: Candidate,
    /// Whether it passes the memory pre-filter at the plan's headroom.
    pub fits_with_headroom: bool,
}

/// Rejection counts by reason.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejections {
    /// Legality rule id -> candidates.
    pub rules: BTreeMap<String, u64>,
    /// What overflows where -> candidates.
    pub memory: BTreeMap<String, u64>,
}

/// The result of a tune.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TuneResult {
    /// The best layout found; `null` when no candidate is legal and fits.
    pub best: Option<Candidate>,
    /// The best layouts, best first.
    pub top: Vec<Candidate>,
    /// Candidates whose step time was projected.
    pub evaluated: u64,
    /// Candidates the memory pre-filter rejected.
    pub rejected_by_memory: u64,
    /// Candidates a legality rule rejected.
    pub rejected_by_rules: u64,
    /// Candidates skipped by safe pruning (never better than one examined).
    pub pruned: u64,
    /// Rejections by reason.
    pub rejections: Rejections,
    /// The reference layout (`spec.parallelism`), when the plan gives one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<Reference>,
    /// best / reference tokens/s per GPU - 1 (0.27 = 27% faster), when both exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gain_over_reference: Option<f64>,
    /// The searcher that ran.
    pub searcher: SearcherKind,
    /// Wall time of the tune, seconds.
    pub seconds: f64,
    /// Candidates examined (projected or rejected) per second.
    pub candidates_per_second: f64,
    /// The usable fraction of memory the pre-filter applied.
    pub memory_headroom: f64,
    /// The memory model's error band the pre-filter widened the headroom limit by (layouts
    /// predicted up to `over` above it are kept).
    pub memory_band: crate::memory::Band,
    /// Of the layouts reported (best and top), those predicted above the headroom limit but
    /// within the band: kept because of it.
    pub within_band: Vec<String>,
    /// The agent's counters (searcher `agent`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStats>,
    /// The search stopped at its deadline ([`super::TuneOptions::deadline`]): the best found
    /// so far, not necessarily the best of the space. Absent when the search ran to the end.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
    /// Searcher `agent` whose endpoint never answered: why, and the best non-agent answer
    /// (the exhaustive search's) is reported instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_unavailable: Option<String>,
    /// Every layout tried, in order (bounded; `primus tune --trials` writes them).
    #[serde(skip)]
    pub trials: Vec<Trial>,
    /// The trials in brief: per source, the agent's proposals and failures.
    pub trial_summary: TrialSummary,
    /// The best layout against the reference, term by term.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Explanation>,
}

impl TuneResult {
    pub(crate) fn assemble(
        searcher: SearcherKind,
        top: Vec<Candidate>,
        stats: Stats,
        reference: Option<(Candidate, bool)>,
        agent: Option<AgentStats>,
        filter: &super::prefilter::Prefilter,
        seconds: f64,
    ) -> TuneResult {
        let within_band = top
            .iter()
            .filter(|c| filter.within_band(c.projection.memory.peak_bytes))
            .map(|c| c.layout.label())
            .collect();
        let best = top.first().cloned();
        let gain_over_reference = match (&best, &reference) {
            (Some(b), Some((r, _))) if r.tokens_per_second() > 0.0 => {
                Some(b.tokens_per_second() / r.tokens_per_second() - 1.0)
            }
            _ => None,
        };
        let examined = stats.examined();
        TuneResult {
            best,
            top,
            evaluated: stats.evaluated,
            rejected_by_memory: stats.rejected_by_memory,
            rejected_by_rules: stats.rejected_by_rules,
            pruned: stats.pruned,
            rejections: Rejections {
                rules: Stats::owned(&stats.rules),
                memory: Stats::owned(&stats.memory),
            },
            reference: reference.map(|(candidate, fits_with_headroom)| Reference {
                candidate,
                fits_with_headroom,
            }),
            gain_over_reference,
            searcher,
            seconds,
            candidates_per_second: if seconds > 0.0 {
                examined as f64 / seconds
            } else {
                0.0
            },
            memory_headroom: filter.headroom,
            memory_band: filter.band,
            within_band,
            agent,
            timed_out: false,
            agent_unavailable: None,
            trials: Vec::new(),
            trial_summary: TrialSummary::default(),
            explanation: None,
        }
    }

    /// Attach the trial log (numbered, best-so-far filled in) and its summary, and the
    /// explanation of the best against the reference.
    pub(crate) fn with_trials(mut self, log: TrialLog) -> TuneResult {
        let log = log.finish();
        self.trial_summary = TrialSummary::of(&log, self.agent.as_ref());
        self.trials = log.trials;
        self.explanation = match (&self.best, &self.reference) {
            (Some(b), Some(r)) => Some(Explanation::of(&b.projection, &r.candidate.projection)),
            _ => None,
        };
        self
    }
}

/// One term of the step, best against reference (seconds per step; memory in GiB).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Term {
    /// `compute`, `bubble`, `exposed tp`, ..., `memory headroom`.
    pub term: String,
    pub best: f64,
    pub reference: f64,
    /// best - reference (negative time = the best saves it; positive headroom = more room).
    pub delta: f64,
}

/// Why the best beats (or not) the reference: the step's terms side by side.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// Step time, seconds.
    pub step_seconds: Term,
    /// Compute, bubble, each exposed communication (seconds per step) and the memory
    /// headroom (GiB left at the bottleneck stage).
    pub terms: Vec<Term>,
}

impl Explanation {
    pub fn of(best: &Projection, reference: &Projection) -> Explanation {
        let term = |name: &str, b: f64, r: f64| Term {
            term: name.to_string(),
            best: b,
            reference: r,
            delta: b - r,
        };
        // The projection's own terms (compute, each exposed communication, bubble, host,
        // optimizer, overheads), named as it names them.
        let mut terms: Vec<Term> = best
            .breakdown
            .terms()
            .into_iter()
            .zip(reference.breakdown.terms())
            .filter(|((_, b), (_, r))| *b > 0.0 || *r > 0.0)
            .map(|((name, b), (_, r))| {
                let name = match name {
                    "tp" | "cp" | "ep" | "pp" | "dp" => format!("exposed {name} comm"),
                    n => n.to_string(),
                };
                term(&name, b, r)
            })
            .collect();
        terms.push(term(
            "memory headroom GiB",
            best.memory.headroom_bytes / crate::units::GIB,
            reference.memory.headroom_bytes / crate::units::GIB,
        ));
        Explanation {
            step_seconds: term("step", best.step_time_seconds, reference.step_time_seconds),
            terms,
        }
    }

    /// One line per term, for the CLI's table and the status message.
    pub fn lines(&self) -> Vec<String> {
        let mut out = vec![format!(
            "step {:.3} s vs {:.3} s ({:+.3} s)",
            self.step_seconds.best, self.step_seconds.reference, self.step_seconds.delta
        )];
        for t in &self.terms {
            out.push(if t.term.ends_with("GiB") {
                format!(
                    "{}: {:.1} vs {:.1} ({:+.1})",
                    t.term, t.best, t.reference, t.delta
                )
            } else {
                format!(
                    "{}: {:.3} s vs {:.3} s ({:+.3} s)",
                    t.term, t.best, t.reference, t.delta
                )
            });
        }
        out
    }
}
