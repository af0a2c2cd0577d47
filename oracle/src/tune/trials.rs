//! The record of a search: one [`Trial`] per layout a searcher scored or rejected (the seed
//! planner's probes, the evolutionary generations, the exhaustive search's projections, each
//! agent proposal), in the order they were tried, with where it came from, what was scored and
//! the verdict. `primus tune --trials FILE` writes them as JSON lines and `--plot FILE.svg`
//! draws the best-so-far curve (the paper's Fig. 3a); the operator keeps the bounded
//! [`TrialSummary`] in the plan's status.
//!
//! The log is bounded ([`MAX_TRIALS`]): past it, trials are counted, not kept.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Rejection;
use crate::layout::Layout;

/// Trials kept per search at most (the rest are counted in [`TrialLog::dropped`]).
pub const MAX_TRIALS: usize = 20_000;

/// Where a trial came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Source {
    /// The plan's reference layout (`spec.parallelism`).
    Reference,
    /// The seed planner (also the agent's and the pruned exhaustive search's start).
    Seed,
    Exhaustive,
    Evolutionary,
    /// A language-model proposal.
    Agent,
    /// A finalist ranked with measured kernels.
    Benchmark,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Reference => "reference",
            Source::Seed => "seed",
            Source::Exhaustive => "exhaustive",
            Source::Evolutionary => "evolutionary",
            Source::Agent => "agent",
            Source::Benchmark => "benchmark",
        }
    }
}

/// What happened to a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Legal, fits, projected.
    Scored,
    /// Scored before (the same layout after normalization).
    Repeated,
    /// A legality rule rejected it.
    RejectedByRule,
    /// The memory pre-filter rejected it.
    RejectedByMemory,
    /// Outside the search space (a pinned or disallowed value).
    OutsideSpace,
    /// Not a layout (agent replies): unknown fields, wrong types, no JSON.
    Malformed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Scored => "scored",
            Verdict::Repeated => "repeated",
            Verdict::RejectedByRule => "rejected by rule",
            Verdict::RejectedByMemory => "rejected by memory",
            Verdict::OutsideSpace => "outside the space",
            Verdict::Malformed => "malformed",
        }
    }
}

/// One layout tried.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trial {
    /// 1-based position in the search.
    pub n: u64,
    pub source: Source,
    /// The agent's round (1-based), for agent trials.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub round: Option<u32>,
    /// The layout as scored (after normalization); `None` for a malformed proposal.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub layout: Option<Layout>,
    /// Its label.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// What the agent proposed, when normalization changed it before scoring.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proposed: Option<Layout>,
    /// The options set beyond the grid the exhaustive search covers (agent proposals).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub beyond_grid: Vec<String>,
    /// Projected tokens/s per GPU, when scored.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_second: Option<f64>,
    pub verdict: Verdict,
    /// The rule, the memory reason, or why it is not a layout.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The best tokens/s per GPU of this and every earlier trial.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_so_far: Option<f64>,
}

impl Trial {
    /// A trial of `layout` from `source`, without a verdict's details.
    pub fn new(source: Source, layout: &Layout, verdict: Verdict) -> Trial {
        Trial {
            n: 0,
            source,
            round: None,
            label: Some(layout.label()),
            layout: Some(layout.clone()),
            proposed: None,
            beyond_grid: Vec::new(),
            tokens_per_second: None,
            verdict,
            reason: None,
            best_so_far: None,
        }
    }

    /// A scored trial.
    pub fn scored(source: Source, layout: &Layout, tokens_per_second: f64) -> Trial {
        Trial {
            tokens_per_second: Some(tokens_per_second),
            ..Trial::new(source, layout, Verdict::Scored)
        }
    }

    /// A rejected trial, with the rejection's reason.
    pub fn rejected(source: Source, layout: &Layout, r: &Rejection) -> Trial {
        let (verdict, reason) = match r {
            Rejection::Rule(e) => (Verdict::RejectedByRule, e.to_string()),
            Rejection::Memory { .. } => (Verdict::RejectedByMemory, r.to_string()),
        };
        Trial {
            reason: Some(reason),
            ..Trial::new(source, layout, verdict)
        }
    }

    /// A proposal that is not a layout.
    pub fn malformed(round: u32, why: &str) -> Trial {
        Trial {
            n: 0,
            source: Source::Agent,
            round: Some(round),
            layout: None,
            label: None,
            proposed: None,
            beyond_grid: Vec::new(),
            tokens_per_second: None,
            verdict: Verdict::Malformed,
            reason: Some(why.chars().take(300).collect()),
            best_so_far: None,
        }
    }
}

/// The trials of one search, bounded.
#[derive(Debug, Clone, Default)]
pub struct TrialLog {
    pub trials: Vec<Trial>,
    /// Trials past [`MAX_TRIALS`], counted only.
    pub dropped: u64,
}

impl TrialLog {
    pub fn push(&mut self, t: Trial) {
        if self.trials.len() < MAX_TRIALS {
            self.trials.push(t);
        } else {
            self.dropped += 1;
        }
    }

    pub fn extend(&mut self, other: TrialLog) {
        self.dropped += other.dropped;
        for t in other.trials {
            self.push(t);
        }
    }

    /// Number the trials and fill in the best-so-far column.
    pub fn finish(mut self) -> TrialLog {
        let mut best: Option<f64> = None;
        for (i, t) in self.trials.iter_mut().enumerate() {
            t.n = i as u64 + 1;
            if let Some(v) = t.tokens_per_second
                && best.is_none_or(|b| v > b)
            {
                best = Some(v);
            }
            t.best_so_far = best;
        }
        self
    }
}

/// Per-source figures of the summary.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct SourceSummary {
    /// `reference`, `seed`, `exhaustive`, `evolutionary`, `agent` or `benchmark`.
    pub source: String,
    /// Layouts this source tried.
    pub trials: u64,
    /// Of them, legal, fitting and projected.
    pub scored: u64,
    /// The best tokens/s per GPU this source scored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_tokens_per_second: Option<f64>,
    /// Its layout's label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_label: Option<String>,
}

/// The bounded summary the status keeps (one entry per source, fixed counters).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct TrialSummary {
    /// Layouts tried in all.
    pub trials: u64,
    /// Trials counted past the log's bound.
    pub dropped: u64,
    /// Per source, in a fixed order.
    pub by_source: Vec<SourceSummary>,
    /// Agent rounds run.
    pub agent_rounds: u32,
    /// Agent proposals scored (new layouts).
    pub proposals_accepted: u64,
    /// Agent proposals a legality rule rejected.
    pub proposals_rejected_by_rule: u64,
    /// Agent proposals the memory pre-filter rejected.
    pub proposals_rejected_by_memory: u64,
    /// Proposals outside the space, repeated or malformed.
    pub proposals_other: u64,
    /// Agent requests that failed.
    pub failures: u32,
}

impl TrialSummary {
    pub fn of(log: &TrialLog, agent: Option<&super::agent::AgentStats>) -> TrialSummary {
        let mut by: BTreeMap<Source, SourceSummary> = BTreeMap::new();
        for t in &log.trials {
            let e = by.entry(t.source).or_insert_with(|| SourceSummary {
                source: t.source.as_str().into(),
                ..SourceSummary::default()
            });
            e.trials += 1;
            if let Some(v) = t.tokens_per_second {
                e.scored += 1;
                if e.best_tokens_per_second.is_none_or(|b| v > b) {
                    e.best_tokens_per_second = Some(v);
                    e.best_label = t.label.clone();
                }
            }
        }
        let mut s = TrialSummary {
            trials: log.trials.len() as u64 + log.dropped,
            dropped: log.dropped,
            by_source: by.into_values().collect(),
            ..TrialSummary::default()
        };
        if let Some(a) = agent {
            s.agent_rounds = a.rounds;
            s.proposals_accepted = a.scored as u64;
            s.proposals_rejected_by_rule = a.rejected_by_rules as u64;
            s.proposals_rejected_by_memory = a.rejected_by_memory as u64;
            s.proposals_other = (a.outside_space + a.repeated + a.malformed_proposals) as u64;
            s.failures = a.failed_requests;
        }
        s
    }
}

/// The best-so-far curve as an SVG line chart: x the trial number, y the best tokens/s per
/// GPU so far; scored trials are dots coloured by source.
pub fn plot_svg(trials: &[Trial], title: &str) -> String {
    use std::fmt::Write as _;
    let scored: Vec<(u64, f64, Source)> = trials
        .iter()
        .filter_map(|t| t.tokens_per_second.map(|v| (t.n, v, t.source)))
        .filter(|(_, v, _)| v.is_finite())
        .collect();
    let (lo, hi) = scored
        .iter()
        .fold((f64::MAX, 0.0f64), |(lo, hi), (_, v, _)| {
            (lo.min(*v), hi.max(*v))
        });
    let lo = if scored.is_empty() { 0.0 } else { lo * 0.95 };
    let hi = if hi > lo { hi * 1.02 } else { lo + 1.0 };
    let f = Frame {
        lo,
        hi,
        n: trials.len().max(1) as f64,
    };
    let mut o = String::new();
    f.axes(&mut o, title, trials.len());
    for (i, v, s) in &scored {
        let _ = writeln!(
            o,
            r#"<circle cx="{:.1}" cy="{:.1}" r="2" fill="{}" opacity="0.5"/>"#,
            f.x(*i as f64),
            f.y(*v),
            source_colour(*s)
        );
    }
    let mut points = String::new();
    for t in trials {
        if let Some(b) = t.best_so_far {
            let _ = write!(points, "{:.1},{:.1} ", f.x(t.n as f64), f.y(b));
        }
    }
    let _ = writeln!(
        o,
        r#"<polyline points="{}" fill="none" stroke="black" stroke-width="2"/>"#,
        points.trim_end()
    );
    let mut sources: Vec<Source> = scored.iter().map(|(_, _, s)| *s).collect();
    sources.sort();
    sources.dedup();
    legend(&mut o, &sources);
    o.push_str("</svg>\n");
    o
}

/// The plot's size and margins, pixels.
const W: f64 = 720.0;
const H: f64 = 400.0;
const L: f64 = 70.0;
const R: f64 = 20.0;
const T: f64 = 40.0;
const B: f64 = 50.0;

/// The plotted ranges: tokens/s/GPU from `lo` to `hi`, trials 1 to `n`.
struct Frame {
    lo: f64,
    hi: f64,
    n: f64,
}

impl Frame {
    fn x(&self, i: f64) -> f64 {
        L + (i - 1.0).max(0.0) / (self.n - 1.0).max(1.0) * (W - L - R)
    }

    fn y(&self, v: f64) -> f64 {
        T + (self.hi - v) / (self.hi - self.lo) * (H - T - B)
    }

    /// The document's head, the title, both axes with their ticks and labels.
    fn axes(&self, o: &mut String, title: &str, trials: usize) {
        use std::fmt::Write as _;
        let _ = writeln!(
            o,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(o, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
        let _ = writeln!(
            o,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
            W / 2.0,
            xml_escape(title)
        );
        let _ = writeln!(
            o,
            r#"<line x1="{L}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{L}" y1="{T}" x2="{L}" y2="{}" stroke="black"/>"#,
            H - B,
            W - R,
            H - B,
            H - B
        );
        for k in 0..=4 {
            let v = self.lo + (self.hi - self.lo) * k as f64 / 4.0;
            let _ = writeln!(
                o,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{v:.0}</text>"#,
                L - 6.0,
                self.y(v) + 4.0
            );
        }
        let _ = writeln!(
            o,
            r#"<text x="{}" y="{}" text-anchor="middle">trial (of {trials})</text>"#,
            (L + W - R) / 2.0,
            H - 12.0,
        );
        let _ = writeln!(
            o,
            r#"<text x="16" y="{}" transform="rotate(-90 16 {})" text-anchor="middle">best tokens/s/GPU so far</text>"#,
            H / 2.0,
            H / 2.0
        );
    }
}

/// Text for an SVG element.
fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The colour of a trial's source in the plot.
fn source_colour(s: Source) -> &'static str {
    match s {
        Source::Reference => "#777777",
        Source::Seed => "#1f77b4",
        Source::Exhaustive => "#2ca02c",
        Source::Evolutionary => "#9467bd",
        Source::Agent => "#d62728",
        Source::Benchmark => "#ff7f0e",
    }
}

/// One coloured dot and name per source, along the top.
fn legend(o: &mut String, sources: &[Source]) {
    use std::fmt::Write as _;
    for (k, s) in sources.iter().enumerate() {
        let lx = L + 10.0 + 110.0 * k as f64;
        let _ = writeln!(
            o,
            r#"<circle cx="{lx}" cy="{}" r="4" fill="{}"/><text x="{}" y="{}">{}</text>"#,
            T + 6.0,
            source_colour(*s),
            lx + 8.0,
            T + 10.0,
            s.as_str()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_so_far_is_a_running_maximum_and_the_log_is_bounded() {
        let l = Layout::default();
        let mut log = TrialLog::default();
        for v in [3.0, 1.0, 5.0, 4.0] {
            log.push(Trial::scored(Source::Seed, &l, v));
        }
        log.push(Trial::malformed(1, "no JSON"));
        let log = log.finish();
        let best: Vec<Option<f64>> = log.trials.iter().map(|t| t.best_so_far).collect();
        assert_eq!(
            best,
            [Some(3.0), Some(3.0), Some(5.0), Some(5.0), Some(5.0)]
        );
        assert_eq!(log.trials[4].n, 5);
        let mut big = TrialLog::default();
        for _ in 0..MAX_TRIALS + 7 {
            big.push(Trial::scored(Source::Exhaustive, &l, 1.0));
        }
        assert_eq!((big.trials.len(), big.dropped), (MAX_TRIALS, 7));
        let s = TrialSummary::of(&big, None);
        assert_eq!(s.trials, MAX_TRIALS as u64 + 7);
        assert_eq!(s.by_source.len(), 1);
        let svg = plot_svg(&log.trials, "a <plan>");
        assert!(svg.starts_with("<svg") && svg.contains("a &lt;plan&gt;"));
        assert_eq!(svg.matches("<circle").count(), 4 + 1);
    }
}
