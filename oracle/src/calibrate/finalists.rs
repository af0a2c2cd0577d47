//! The tuner's finalists ranked by measured kernels (issue 17): the tuner ranks every layout
//! with one calibration, whose ratios are exact only at the benchmark's own shapes and
//! interpolated elsewhere. A benchmark that also timed the finalists' kernels at their own
//! one-node shapes ([`BenchmarkResults::finalists`]) lets each finalist be projected with its
//! own measurements; the final order among them follows those projections.
//!
//! A finalist is *measured* when its shapes are the benchmark's own (the report itself) or a
//! finalist entry of the report has its shapes key; the others keep the tuner's projection.

use crate::bench::shapes_key;
use crate::calibrate::CalibratedTimer;
use crate::layout::Layout;
use crate::plan::Plan;
use crate::projection::project_with;
use crate::report::BenchmarkResults;
use crate::tune::trials::{Source, Trial, TrialLog, TrialSummary};
use crate::tune::{Candidate, TuneResult};

/// One finalist after ranking.
#[derive(Debug, Clone)]
pub struct Finalist {
    /// Projected with the kernels measured at its own shapes when `measured`, else as tuned.
    pub candidate: Candidate,
    /// Whether its projection uses kernels timed at its own shapes.
    pub measured: bool,
    /// Its place in the tuner's order (0 = the tuner's best).
    pub tuned_rank: usize,
}

/// The finalists in their final order, best first.
#[derive(Debug, Clone)]
pub struct Ranking {
    pub finalists: Vec<Finalist>,
}

impl Ranking {
    /// Finalists projected with their own measured kernels.
    pub fn measured(&self) -> usize {
        self.finalists.iter().filter(|f| f.measured).count()
    }

    /// The search's trial summary with the finalists ranked by measured kernels added as
    /// trials of source `benchmark` (after the search's own).
    pub fn trial_summary(&self, result: &TuneResult) -> TrialSummary {
        let mut log = TrialLog {
            trials: result.trials.clone(),
            dropped: result.trial_summary.dropped,
        };
        for f in self.finalists.iter().filter(|f| f.measured) {
            log.push(Trial::scored(
                Source::Benchmark,
                &f.candidate.layout,
                f.candidate.tokens_per_second(),
            ));
        }
        TrialSummary::of(&log.finish(), result.agent.as_ref())
    }

    /// Whether the measured kernels changed the tuner's order.
    pub fn order_changed(&self) -> bool {
        self.finalists
            .iter()
            .enumerate()
            .any(|(i, f)| f.tuned_rank != i)
    }
}

/// The report whose kernels were timed at `layout`'s own shapes: `report` itself when its
/// shapes are the benchmark's, the report with a finalist's kernels in place of its own when a
/// finalist entry has them, else None.
pub fn report_for(
    plan: &Plan,
    report: &BenchmarkResults,
    layout: &Layout,
) -> Option<BenchmarkResults> {
    let key = shapes_key(&plan.with_layout(layout.clone()));
    if key == report.shapes_key {
        return Some(report.clone());
    }
    let f = report.finalists.iter().find(|f| f.shapes_key == key)?;
    Some(BenchmarkResults {
        shapes_key: f.shapes_key.clone(),
        target_layout: f.layout.clone(),
        measured_layout: f.measured_layout.clone(),
        ops: f.ops.clone(),
        finalists: Vec::new(),
        ..report.clone()
    })
}

/// Rank the tuner's `top` (best first) by projections with the kernels measured at each one's
/// own shapes; finalists without such kernels keep the tuner's projection. Ties keep the
/// tuner's order.
pub fn rank(plan: &Plan, report: &BenchmarkResults, top: &[Candidate]) -> Ranking {
    let s = &plan.scenario;
    let mut finalists: Vec<Finalist> = top
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let remeasured = report_for(plan, report, &c.layout)
                .and_then(|r| CalibratedTimer::new(s, &r).ok())
                .and_then(|timer| project_with(s, &c.layout, &timer).ok())
                .filter(|p| p.tokens_per_second_per_gpu.is_finite());
            match remeasured {
                Some(p) => Finalist {
                    candidate: Candidate::new(c.layout.clone(), p),
                    measured: true,
                    tuned_rank: i,
                },
                None => Finalist {
                    candidate: c.clone(),
                    measured: false,
                    tuned_rank: i,
                },
            }
        })
        .collect();
    finalists.sort_by(|a, b| {
        b.candidate
            .tokens_per_second()
            .total_cmp(&a.candidate.tokens_per_second())
            .then(a.tuned_rank.cmp(&b.tuned_rank))
    });
    Ranking { finalists }
}

/// The analytic finalists of `plan`: the `k` best layouts of its searcher (exhaustive for the
/// agent, whose proposals need an endpoint; none for searcher `none`, which ranks nothing),
/// searched until `deadline`. What a benchmark times beside the plan's own shapes.
pub fn analytic_finalists(
    plan: &Plan,
    k: usize,
    deadline: Option<std::time::Instant>,
) -> Vec<Layout> {
    use crate::plan::SearcherKind;
    use crate::tune::{self, TuneOptions};
    let kind = match plan.tuning.searcher {
        SearcherKind::None => return Vec::new(),
        SearcherKind::Agent => SearcherKind::Exhaustive,
        k => k,
    };
    let opts = TuneOptions {
        top_k: Some(k.min(crate::report::MAX_FINALISTS as usize)),
        deadline,
        ..TuneOptions::default()
    };
    tune::searcher(kind)
        .and_then(|mut s| tune::tune(plan, Some(s.as_mut()), &opts))
        .map(|r| r.top.into_iter().map(|c| c.layout).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::Provenance;
    use crate::bench::simulate::simulate_with_finalists;
    use crate::plan::parse_plan;
    use crate::profiles::Catalog;
    use crate::tune::{self, TuneOptions};

    /// Llama 3.1 8B on 16 H100 with a reference layout (TP 2): the finalists span TP 1, 2,
    /// 4 and micro-batch sizes, so their one-node shapes differ from the benchmark's.
    fn plan() -> Plan {
        let c = Catalog::builtin().unwrap();
        let text = "metadata: {name: p}\nspec:\n  model: {preset: llama3.1-8b}\n  cluster: {gpu: h100-sxm, gpus: 16}\n  training: {seqLength: 4096, globalBatchSize: 64}\n  parallelism: {tp: 2}\n  tuning: {topK: 5}\n";
        parse_plan(text, "p.yaml", &c).unwrap()
    }

    fn top(plan: &Plan, report: &BenchmarkResults) -> Vec<Candidate> {
        let timer = CalibratedTimer::new(&plan.scenario, report).unwrap();
        let opts = TuneOptions {
            timer: &timer,
            ..TuneOptions::default()
        };
        let mut s = tune::searcher(crate::plan::SearcherKind::Exhaustive).unwrap();
        tune::tune(plan, Some(s.as_mut()), &opts).unwrap().top
    }

    #[test]
    fn finalists_at_other_shapes_are_timed_once_each() {
        let p = plan();
        let finalists = analytic_finalists(&p, 5, None);
        assert_eq!(finalists.len(), 5);
        let r = simulate_with_finalists(&p, &finalists, Provenance::default());
        let keys: Vec<&str> = r.finalists.iter().map(|f| f.shapes_key.as_str()).collect();
        // Each entry has shapes the benchmark did not time, and no two share them.
        assert!(!keys.is_empty());
        assert!(keys.iter().all(|k| *k != r.shapes_key), "{keys:?}");
        let mut unique = keys.clone();
        unique.dedup();
        assert_eq!(unique.len(), keys.len());
        for f in &r.finalists {
            assert_eq!(f.shapes_key, shapes_key(&p.with_layout(f.layout.clone())));
            assert!(!f.ops.is_empty() && f.ops.iter().all(|o| o.median_seconds > 0.0));
        }
    }

    #[test]
    fn simulated_kernels_measure_every_finalist_and_keep_the_order() {
        // Simulated kernels are the analytic model: every finalist is measured, and the
        // measured projections are the tuner's, so the order stands.
        let p = plan();
        let finalists = analytic_finalists(&p, 5, None);
        let r = simulate_with_finalists(&p, &finalists, Provenance::default());
        let top = top(&p, &r);
        let ranking = rank(&p, &r, &top);
        assert_eq!(ranking.measured(), top.len());
        assert!(!ranking.order_changed());
        for (f, c) in ranking.finalists.iter().zip(&top) {
            let (a, b) = (f.candidate.tokens_per_second(), c.tokens_per_second());
            assert!((a - b).abs() <= 1e-9 * b, "{a} vs {b}");
        }
    }

    #[test]
    fn a_finalist_whose_kernels_run_slow_drops_and_the_order_changes() {
        let p = plan();
        let finalists = analytic_finalists(&p, 5, None);
        let mut r = simulate_with_finalists(&p, &finalists, Provenance::default());
        let top = top(&p, &r);
        // The tuner's best, measured at its own shapes, runs its GEMMs 1.6x slower than
        // modelled (a shape the library handles badly).
        let best_key = shapes_key(&p.with_layout(top[0].layout.clone()));
        let f = r
            .finalists
            .iter_mut()
            .find(|f| f.shapes_key == best_key)
            .expect("the tuner's best has shapes of its own here");
        for o in f.ops.iter_mut().filter(|o| o.kind == "gemm") {
            o.median_seconds *= 1.6;
        }
        let ranking = rank(&p, &r, &top);
        assert!(ranking.order_changed());
        assert_ne!(ranking.finalists[0].tuned_rank, 0);
        let dropped = ranking
            .finalists
            .iter()
            .find(|f| f.tuned_rank == 0)
            .unwrap();
        assert!(dropped.measured);
        assert!(dropped.candidate.tokens_per_second() < 0.9 * top[0].tokens_per_second());
        // Without finalist kernels only layouts at the benchmark's own shapes are measured.
        r.finalists.clear();
        let ranking = rank(&p, &r, &top);
        let at_reference = top
            .iter()
            .filter(|c| shapes_key(&p.with_layout(c.layout.clone())) == r.shapes_key)
            .count();
        assert_eq!(ranking.measured(), at_reference);
    }
}
