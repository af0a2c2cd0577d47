//! What each step's outcome means for the plan's status, decided without the API server: the
//! conditions a step sets, whether the pass goes on ([`Next`]), an action to announce
//! ([`Notice`]), and how the pass ends ([`Halt`]: Ready, Reconciling and Stalled, the phase,
//! when to look again). Pure: everything comes in as arguments (outcomes of the steps'
//! observe -> decide -> apply, the previous status), nothing is read or written here.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use primus_crds::{DriftStatus, LayoutSummary, Phase, TrainingPlanStatus};
use primus_oracle::FieldError;
use primus_oracle::report::BenchmarkResults;
use primus_oracle::units::GIB;

use crate::benchmark::{self, backend_name};
use crate::choose::{Choice, ChooseError};
use crate::conditions::{
    self, BENCHMARKED, DRIFT_WITHIN_TOLERANCE, JOB_CREATED, PROJECTED, READY, RECONCILING, STALLED,
    State, TUNED, Verdicts,
};
use crate::drift::{self, Measurement};
use crate::job;
use crate::reason::Reason;

/// How often a plan whose job CRD is missing is looked at again.
pub const CRD_RECHECK: Duration = Duration::from_secs(15);
/// How soon a plan whose job is being replaced is looked at again.
pub const REPLACE_RECHECK: Duration = Duration::from_secs(1);

/// When to look at the plan again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// On the next change of the plan (or of what it owns).
    OnChange,
    /// After this long.
    After(Duration),
    /// After the operator's resync interval (the drift interval with a Prometheus source).
    Resync,
}

/// How a pass ends: Ready, Reconciling and Stalled (and any other condition the end sets),
/// the phase, and when to look again.
#[derive(Debug, Clone, PartialEq)]
pub struct Halt {
    pub conditions: Verdicts,
    pub phase: Phase,
    pub requeue: Requeue,
}

impl Halt {
    /// Work goes on (a benchmark, a search, a replacement): not Ready, Reconciling, not
    /// Stalled.
    pub fn progressing(
        phase: Phase,
        ready: Reason,
        reconciling: Reason,
        message: &str,
        requeue: Requeue,
    ) -> Halt {
        let conditions = Verdicts::default()
            .with(READY, State::False, ready, message)
            .with(RECONCILING, State::True, reconciling, message)
            .with(
                STALLED,
                State::False,
                Reason::Progressing,
                "the plan is progressing",
            );
        Halt {
            conditions,
            phase,
            requeue,
        }
    }

    /// Nothing happens until something changes: not Ready, not Reconciling, Stalled. Phase
    /// `Failed` for a failed benchmark, else `Stalled`.
    pub fn stalled(reason: Reason, message: &str, requeue: Requeue) -> Halt {
        let ready = match reason {
            Reason::InvalidSpec => format!("the spec is invalid: {message}"),
            _ => message.to_string(),
        };
        let conditions = Verdicts::default()
            .with(READY, State::False, reason, ready)
            .with(RECONCILING, State::False, reason, reason.waiting_for())
            .with(STALLED, State::True, reason, message);
        let phase = match reason {
            Reason::BenchmarkFailed => Phase::Failed,
            _ => Phase::Stalled,
        };
        Halt {
            conditions,
            phase,
            requeue,
        }
    }

    /// Done for this generation: Ready, not Reconciling, not Stalled.
    pub fn ready(chosen: &LayoutSummary) -> Halt {
        let message = format!(
            "{} projected at {:.0} tokens/s/GPU",
            chosen.label, chosen.tokens_per_second_per_gpu
        );
        let conditions = Verdicts::default()
            .with(READY, State::True, Reason::Ready, message)
            .with(
                RECONCILING,
                State::False,
                Reason::Ready,
                "nothing left to do for this generation",
            )
            .with(
                STALLED,
                State::False,
                Reason::Ready,
                "the plan is not stalled",
            );
        Halt {
            conditions,
            phase: Phase::Ready,
            requeue: Requeue::Resync,
        }
    }
}

/// Whether a pass goes on with a step's result or ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Next<T> {
    Go(T),
    Halt(Halt),
}

/// An action taken, announced as an Event (its type from the reason's severity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub reason: Reason,
    /// What was done (`CreateJob`), or the condition that flipped.
    pub action: String,
    pub note: String,
}

/// What one step decided for the status.
#[derive(Debug, Clone, PartialEq)]
pub struct Step<T> {
    /// The conditions the step sets.
    pub conditions: Verdicts,
    pub next: Next<T>,
    pub notice: Option<Notice>,
}

impl<T> Step<T> {
    fn go(conditions: Verdicts, value: T) -> Step<T> {
        Step {
            conditions,
            next: Next::Go(value),
            notice: None,
        }
    }

    fn halt(conditions: Verdicts, halt: Halt) -> Step<T> {
        Step {
            conditions,
            next: Next::Halt(halt),
            notice: None,
        }
    }
}

/// A benchmark report the projection is calibrated with.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub name: String,
    pub results: BenchmarkResults,
}

/// The plan is invalid: `Stalled` naming the field, until the spec changes.
pub fn invalid(e: &FieldError) -> Halt {
    Halt::stalled(Reason::InvalidSpec, &e.to_string(), Requeue::OnChange)
}

/// The steps after `from` have not been reached.
fn downstream(from: &'static str, reason: Reason) -> Verdicts {
    let steps = [
        BENCHMARKED,
        PROJECTED,
        TUNED,
        JOB_CREATED,
        DRIFT_WITHIN_TOLERANCE,
    ];
    let at = steps.iter().position(|s| *s == from).unwrap_or(0);
    let mut v = Verdicts::default();
    for s in &steps[at + 1..] {
        v.set(s, State::Unknown, reason, "waiting for the previous step");
    }
    v
}

/// The benchmark's outcome (`None`: benchmarking is disabled).
pub fn benchmarked(outcome: Option<benchmark::Outcome>) -> Step<Option<Report>> {
    use benchmark::Outcome;
    let Some(outcome) = outcome else {
        let v = Verdicts::default().with(
            BENCHMARKED,
            State::False,
            Reason::Disabled,
            "spec.benchmark.enabled is false: the projection uses the analytic model alone",
        );
        return Step::go(v, None);
    };
    match outcome {
        Outcome::Done {
            report,
            results,
            reused,
            ..
        } => {
            let reduced = if results.reduced_axes.is_empty() {
                String::new()
            } else {
                format!(", downscaled {}", results.reduced_axes.join(", "))
            };
            let message = format!(
                "BenchmarkReport {report} {}: {} on node {} ({}, {} ops{reduced})",
                if reused { "reused" } else { "received" },
                results.gpu_product,
                results.node,
                backend_name(results.backend),
                results.ops.len(),
            );
            let reason = if reused {
                Reason::ReportReused
            } else {
                Reason::ReportReceived
            };
            let v = Verdicts::default().with(BENCHMARKED, State::True, reason, message);
            let report = Report {
                name: report,
                results: *results,
            };
            Step::go(v, Some(report))
        }
        Outcome::Waiting {
            message,
            requeue,
            created,
            ..
        } => {
            let mut v = downstream(BENCHMARKED, Reason::WaitingForBenchmark);
            v.set(BENCHMARKED, State::False, Reason::Benchmarking, &message);
            let halt = Halt::progressing(
                Phase::Benchmarking,
                Reason::Benchmarking,
                Reason::Benchmarking,
                &message,
                Requeue::After(requeue),
            );
            let notice = created.map(|_| Notice {
                reason: Reason::BenchmarkStarted,
                action: "Benchmark".into(),
                note: message.clone(),
            });
            Step {
                notice,
                ..Step::halt(v, halt)
            }
        }
        Outcome::Failed { message, .. } => {
            let mut v = downstream(BENCHMARKED, Reason::BenchmarkFailed);
            v.set(BENCHMARKED, State::False, Reason::BenchmarkFailed, &message);
            let halt = Halt::stalled(Reason::BenchmarkFailed, &message, Requeue::OnChange);
            Step::halt(v, halt)
        }
    }
}

/// The choice the status holds for this generation and benchmark report, if any (then the
/// pass does not search again).
pub fn cached_choice(
    previous: &TrainingPlanStatus,
    generation: Option<i64>,
    report: Option<&str>,
) -> Option<Choice> {
    let tuned = conditions::find(&previous.conditions, TUNED)?;
    if tuned.status != "True"
        || tuned.observed_generation != generation
        || previous
            .benchmark
            .as_ref()
            .and_then(|b| b.report.as_deref())
            != report
    {
        return None;
    }
    Some(Choice {
        chosen: previous.chosen.clone()?,
        reference: previous.reference.clone(),
        gain_over_reference: previous.gain_over_reference,
        candidates: previous.candidates.clone(),
        search: previous.search.clone()?,
    })
}

/// What a long search writes meanwhile: Tuned unknown, phase `Tuning`.
pub fn searching() -> Halt {
    let m = "the tuner is searching layouts";
    let mut h = Halt::progressing(
        Phase::Tuning,
        Reason::Tuning,
        Reason::Tuning,
        m,
        Requeue::OnChange,
    );
    h.conditions
        .set(TUNED, State::Unknown, Reason::Searching, m);
    h
}

/// The tuner's answer: Projected and Tuned, or why no layout was chosen.
pub fn chosen(result: Result<Choice, ChooseError>) -> Step<Choice> {
    match result {
        Ok(c) => Step::go(choice_conditions(&c), c),
        Err(ChooseError::Field(e)) => Step::halt(Verdicts::default(), invalid(&e)),
        Err(ChooseError::NoFeasibleLayout(m)) => {
            let mut v = downstream(TUNED, Reason::NoFeasibleLayout);
            v.set(PROJECTED, State::False, Reason::NoFeasibleLayout, &m);
            v.set(TUNED, State::False, Reason::NoFeasibleLayout, &m);
            let halt = Halt::stalled(Reason::NoFeasibleLayout, &m, Requeue::OnChange);
            Step::halt(v, halt)
        }
    }
}

fn choice_conditions(c: &Choice) -> Verdicts {
    let chosen = &c.chosen;
    let calibrated = if chosen.calibrated {
        "calibrated by the benchmark"
    } else {
        "analytic model"
    };
    let projected = format!(
        "{}: {:.0} tokens/s/GPU, {:.0} TFLOP/s/GPU, MFU {:.1}%, step {:.2}s, peak memory {:.1} of {:.1} GiB ({calibrated})",
        chosen.label,
        chosen.tokens_per_second_per_gpu,
        chosen.tflops_per_gpu,
        chosen.mfu * 100.0,
        chosen.step_time_seconds,
        chosen.peak_memory_bytes / GIB,
        chosen.usable_memory_bytes / GIB,
    );
    let s = &c.search;
    let (reason, mut tuned) = if s.searcher == "none" {
        (
            Reason::LayoutGiven,
            format!(
                "searcher none: spec.parallelism ({}) is used as given",
                chosen.label
            ),
        )
    } else {
        (
            Reason::Tuned,
            format!(
                "{} searcher chose {} ({} layouts evaluated, {} rejected by memory, {} by rules, {:.2}s)",
                s.searcher,
                chosen.label,
                s.evaluated,
                s.rejected_by_memory,
                s.rejected_by_rules,
                s.seconds
            ),
        )
    };
    if let Some(g) = c.gain_over_reference {
        tuned.push_str(&format!("; {:+.1}% over spec.parallelism", g * 100.0));
    }
    Verdicts::default()
        .with(PROJECTED, State::True, Reason::Projected, projected)
        .with(TUNED, State::True, reason, tuned)
}

/// Reason and message of `JobCreated` for a job with the chosen layout: the same words whether
/// this pass created it or found it, so a re-run writes the same status.
fn job_condition(name: &str, label: &str, started: bool, suspended: bool) -> (Reason, String) {
    if started {
        (
            Reason::Started,
            format!("PyTorchJob {name} runs {label} (started)"),
        )
    } else if suspended {
        (
            Reason::Suspended,
            format!(
                "PyTorchJob {name} with {label} is suspended: review it, then set spec.job.suspend to false"
            ),
        )
    } else {
        (
            Reason::Created,
            format!("PyTorchJob {name} with {label} is created"),
        )
    }
}

/// The job's outcome: `JobCreated`, and how the pass ends once drift is measured.
pub fn job(outcome: &job::Outcome, chosen: &LayoutSummary) -> Step<Halt> {
    use job::Outcome;
    let label = &chosen.label;
    let (state, reason, message) = match outcome {
        Outcome::NotSubmitted => (
            State::False,
            Reason::AutoSubmitDisabled,
            "spec.job.autoSubmit is false: the chosen layout is reported only, no PyTorchJob is created".to_string(),
        ),
        Outcome::CrdMissing => (
            State::False,
            Reason::PyTorchJobCrdMissing,
            "the PyTorchJob CRD (pytorchjobs.kubeflow.org, kubeflow.org/v1) is not installed: install the Kubeflow training operator (or crds/thirdparty/kubeflow.org_pytorchjobs.yaml); the job is created once it is there".to_string(),
        ),
        Outcome::NameTaken { name } => (
            State::False,
            Reason::JobNameTaken,
            format!("a PyTorchJob named {name} exists and is not owned by this plan: delete it or set spec.job.name"),
        ),
        Outcome::Created { name, suspended } => {
            let (reason, m) = job_condition(name, label, false, *suspended);
            (State::True, reason, m)
        }
        Outcome::UpToDate { name, started, suspended } => {
            let (reason, m) = job_condition(name, label, *started, *suspended);
            (State::True, reason, m)
        }
        Outcome::Replacing { name, old } => (
            State::False,
            Reason::Replacing,
            format!("PyTorchJob {name} ({old}) had not started and the plan now chooses {label}: replacing it"),
        ),
        Outcome::Differs { name, job_layout, .. } => (
            State::True,
            Reason::LayoutDiffers,
            format!("PyTorchJob {name} has started with {job_layout}; the plan now chooses {label}. The running job is left untouched: delete it to apply the new layout"),
        ),
    };
    let end = match outcome {
        Outcome::CrdMissing => Halt::stalled(reason, &message, Requeue::After(CRD_RECHECK)),
        Outcome::NameTaken { .. } => Halt::stalled(reason, &message, Requeue::Resync),
        Outcome::Replacing { .. } => Halt::progressing(
            Phase::Pending,
            Reason::Reconciling,
            Reason::ReplacingJob,
            "replacing the PyTorchJob",
            Requeue::After(REPLACE_RECHECK),
        ),
        _ => Halt::ready(chosen),
    };
    let notice = match outcome {
        Outcome::Created { name, .. } => Some(Notice {
            reason: Reason::JobCreated,
            action: "CreateJob".into(),
            note: format!("created PyTorchJob {name} with {label}"),
        }),
        Outcome::Replacing { old, .. } if !old.is_empty() => Some(Notice {
            reason: Reason::JobReplaced,
            action: "ReplaceJob".into(),
            note: message.clone(),
        }),
        _ => None,
    };
    let v = Verdicts::default().with(JOB_CREATED, state, reason, message);
    Step {
        notice,
        ..Step::go(v, end)
    }
}

/// The drift source could not be read.
pub fn drift_unknown(error: &str) -> Verdicts {
    Verdicts::default().with(
        DRIFT_WITHIN_TOLERANCE,
        State::Unknown,
        Reason::QueryFailed,
        format!("spec.drift.prometheus: {error}"),
    )
}

/// Measured against projected: `DriftWithinTolerance`, and the measurement with its drift
/// when there is one.
pub fn drift(
    projected: f64,
    tolerance: f64,
    measured: Option<Measurement>,
    plan: (&str, &str),
) -> (Verdicts, Option<(f64, DriftStatus)>) {
    let compared = measured.and_then(|x| {
        drift::drift(projected, x.tokens_per_second_per_gpu, tolerance).map(|d| (x, d))
    });
    let Some((x, d)) = compared else {
        let (ns, name) = plan;
        let v = Verdicts::default().with(
            DRIFT_WITHIN_TOLERANCE,
            State::Unknown,
            Reason::NoMeasurement,
            format!(
                "no measured throughput yet: the job reports it with `primus report --plan {ns}/{name} --tokens-per-second X`, or set spec.drift.prometheus"
            ),
        );
        return (v, None);
    };
    let message = format!(
        "measured {:.0} tokens/s/GPU ({}) vs projected {:.0}: drift {:+.1}% (tolerance ±{:.1}%)",
        x.tokens_per_second_per_gpu,
        x.source,
        projected,
        d.ratio * 100.0,
        d.tolerance * 100.0
    );
    let (state, reason) = if d.within_tolerance {
        (State::True, Reason::WithinTolerance)
    } else {
        (State::False, Reason::OutsideTolerance)
    };
    let v = Verdicts::default().with(DRIFT_WITHIN_TOLERANCE, state, reason, message);
    (v, Some((x.tokens_per_second_per_gpu, d)))
}

/// Events for the conditions a status write flipped (`before` -> `after`, whose reasons are
/// `verdicts`'): not for Reconciling, Unknown, or Stalled turning False.
pub fn flip_notices(before: &[Condition], after: &[Condition], verdicts: &Verdicts) -> Vec<Notice> {
    conditions::flipped(before, after)
        .into_iter()
        .filter(|c| {
            c.type_ != RECONCILING
                && c.status != "Unknown"
                && !(c.type_ == STALLED && c.status != "True")
        })
        .filter_map(|c| {
            let v = verdicts.get(&c.type_)?;
            Some(Notice {
                reason: v.reason,
                action: c.type_.clone(),
                note: c.message.clone(),
            })
        })
        .collect()
}

/// Each outcome of a pass, from what the steps observed to the status the pass writes.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::benchmark::Outcome as BenchOutcome;
    use crate::job::{self, Action as JobAction};
    use crate::reason::Severity;
    use crate::testing::plan_with;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use primus_crds::{PyTorchJob, SearchSummary, TrainingPlan};
    use primus_oracle::layout::Layout;
    use primus_oracle::plan::Plan;
    use serde_json::json;

    /// (state, reason, message) of a condition.
    fn cond(v: &Verdicts, type_: &str) -> (State, Reason, String) {
        let c = v.get(type_).unwrap_or_else(|| panic!("no {type_}"));
        (c.state, c.reason, c.message.clone())
    }

    fn halted<T: std::fmt::Debug>(s: &Step<T>) -> &Halt {
        match &s.next {
            Next::Halt(h) => h,
            Next::Go(v) => panic!("the pass goes on with {v:?}"),
        }
    }

    fn summary(label: &str, layout: Layout) -> LayoutSummary {
        LayoutSummary {
            label: label.into(),
            layout,
            dp: 8,
            tokens_per_second_per_gpu: 9876.4,
            tflops_per_gpu: 400.0,
            mfu: 0.4,
            step_time_seconds: 3.5,
            peak_memory_bytes: 40.0 * GIB,
            usable_memory_bytes: 75.0 * GIB,
            dominant: "compute".into(),
            calibrated: false,
        }
    }

    #[test]
    fn benchmark_pending_progresses_and_looks_again_soon() {
        let s = benchmarked(Some(BenchOutcome::Waiting {
            report: "p-bench-1".into(),
            attempts: 1,
            message: "benchmark pod p-bench-1-1 started".into(),
            requeue: Duration::from_secs(30),
            created: Some("p-bench-1-1".into()),
        }));
        let h = halted(&s);
        assert_eq!(h.phase, Phase::Benchmarking);
        assert_eq!(h.requeue, Requeue::After(Duration::from_secs(30)));
        let m = "benchmark pod p-bench-1-1 started".to_string();
        assert_eq!(
            cond(&h.conditions, READY),
            (State::False, Reason::Benchmarking, m.clone())
        );
        assert_eq!(
            cond(&h.conditions, RECONCILING),
            (State::True, Reason::Benchmarking, m.clone())
        );
        assert_eq!(cond(&h.conditions, STALLED).1, Reason::Progressing);
        assert_eq!(
            cond(&s.conditions, BENCHMARKED),
            (State::False, Reason::Benchmarking, m)
        );
        for later in [PROJECTED, TUNED, JOB_CREATED, DRIFT_WITHIN_TOLERANCE] {
            let (state, reason, _) = cond(&s.conditions, later);
            assert_eq!(
                (state, reason),
                (State::Unknown, Reason::WaitingForBenchmark)
            );
        }
        let n = s.notice.as_ref().expect("the new pod is announced");
        assert_eq!(
            (n.reason, n.action.as_str()),
            (Reason::BenchmarkStarted, "Benchmark")
        );
        assert_eq!(n.reason.severity(), Severity::Normal);
        // A pod that was already running is not announced again.
        let s = benchmarked(Some(BenchOutcome::Waiting {
            report: "p-bench-1".into(),
            attempts: 1,
            message: "waiting".into(),
            requeue: Duration::from_secs(5),
            created: None,
        }));
        assert!(s.notice.is_none());
    }

    #[test]
    fn benchmark_failed_stalls_until_the_spec_changes() {
        let s = benchmarked(Some(BenchOutcome::Failed {
            report: "p-bench-1".into(),
            attempts: 3,
            message: "the benchmark failed 3 of 3 attempts".into(),
        }));
        let h = halted(&s);
        assert_eq!((h.phase, h.requeue), (Phase::Failed, Requeue::OnChange));
        assert_eq!(cond(&h.conditions, STALLED).0, State::True);
        assert_eq!(cond(&h.conditions, STALLED).1, Reason::BenchmarkFailed);
        assert_eq!(
            cond(&h.conditions, RECONCILING),
            (
                State::False,
                Reason::BenchmarkFailed,
                "waiting for a spec change".into()
            )
        );
        assert_eq!(cond(&s.conditions, BENCHMARKED).1, Reason::BenchmarkFailed);
        assert_eq!(cond(&s.conditions, TUNED).1, Reason::BenchmarkFailed);
        assert_eq!(Reason::BenchmarkFailed.severity(), Severity::Warning);
    }

    #[test]
    fn benchmark_done_hands_the_report_on() {
        let (_, plan) = crate::testing::bench_plan();
        let mut results = primus_oracle::bench::simulate::simulate(&plan, Default::default());
        results.node = "gpu-1".into();
        let s = benchmarked(Some(BenchOutcome::Done {
            report: "other-bench-1".into(),
            results: Box::new(results.clone()),
            reused: true,
            attempts: 0,
        }));
        let Next::Go(Some(r)) = &s.next else {
            panic!("{:?}", s.next)
        };
        assert_eq!((r.name.as_str(), &r.results), ("other-bench-1", &results));
        let (state, reason, m) = cond(&s.conditions, BENCHMARKED);
        assert_eq!((state, reason), (State::True, Reason::ReportReused));
        assert!(
            m.starts_with("BenchmarkReport other-bench-1 reused: "),
            "{m}"
        );
        assert!(m.contains("on node gpu-1 (simulate, "), "{m}");
        // Disabled: the analytic model alone, no report.
        let s = benchmarked(None);
        assert!(matches!(s.next, Next::Go(None)));
        assert_eq!(cond(&s.conditions, BENCHMARKED).1, Reason::Disabled);
    }

    #[test]
    fn tune_infeasible_stalls_with_the_tuners_words() {
        let s = chosen(Err(ChooseError::NoFeasibleLayout("no layout fits".into())));
        let h = halted(&s);
        assert_eq!((h.phase, h.requeue), (Phase::Stalled, Requeue::OnChange));
        assert_eq!(
            cond(&h.conditions, READY),
            (
                State::False,
                Reason::NoFeasibleLayout,
                "no layout fits".into()
            )
        );
        for t in [PROJECTED, TUNED] {
            assert_eq!(cond(&s.conditions, t).1, Reason::NoFeasibleLayout);
        }
        assert_eq!(cond(&s.conditions, JOB_CREATED).0, State::Unknown);
        assert!(s.conditions.get(BENCHMARKED).is_none());
    }

    #[test]
    fn a_choice_is_projected_and_tuned() {
        let c = Choice {
            chosen: summary("TP2 PP1", Layout::default()),
            reference: None,
            gain_over_reference: Some(0.125),
            candidates: Vec::new(),
            search: SearchSummary {
                searcher: "exhaustive".into(),
                evaluated: 10,
                rejected_by_memory: 2,
                rejected_by_rules: 3,
                seconds: 0.5,
            },
        };
        let s = chosen(Ok(c.clone()));
        assert!(matches!(&s.next, Next::Go(x) if *x == c));
        assert_eq!(
            cond(&s.conditions, TUNED).2,
            "exhaustive searcher chose TP2 PP1 (10 layouts evaluated, 2 rejected by memory, 3 by rules, 0.50s); +12.5% over spec.parallelism"
        );
        assert!(
            cond(&s.conditions, PROJECTED)
                .2
                .starts_with("TP2 PP1: 9876 tokens/s/GPU")
        );
    }

    #[test]
    fn an_invalid_spec_stalls_naming_the_field() {
        let h = invalid(&FieldError::new("spec.model.preset", "unknown preset"));
        assert_eq!((h.phase, h.requeue), (Phase::Stalled, Requeue::OnChange));
        let m = "spec.model.preset: unknown preset";
        assert_eq!(
            cond(&h.conditions, STALLED),
            (State::True, Reason::InvalidSpec, m.into())
        );
        assert_eq!(
            cond(&h.conditions, READY).2,
            format!("the spec is invalid: {m}")
        );
        assert_eq!(
            cond(&h.conditions, RECONCILING).2,
            "waiting for a spec change"
        );
        // Through the tuner's field errors too.
        let s = chosen(Err(ChooseError::Field(FieldError::new(
            "spec.tuning.searcher",
            "x",
        ))));
        assert_eq!(cond(&halted(&s).conditions, STALLED).1, Reason::InvalidSpec);
    }

    /// The job step from what it observed: (the decided action, the status step).
    fn job_step(
        plan: &(TrainingPlan, Plan),
        seen: &job::Observed,
        layout: &Layout,
    ) -> (Option<JobAction>, Step<Halt>) {
        let (obj, p) = plan;
        let desired = job::desired(obj, p, layout, 9876.5).unwrap();
        let d = job::decide(obj, seen, desired, layout);
        (
            d.action,
            job(&d.outcome, &summary(&layout.label(), layout.clone())),
        )
    }

    /// The plan's job as the cluster has it: owned by `owner`, running `layout`.
    fn existing(
        plan: &(TrainingPlan, Plan),
        owner: &str,
        layout: &Layout,
        status: serde_json::Value,
    ) -> job::Observed {
        let mut j: PyTorchJob = job::desired(&plan.0, &plan.1, layout, 1.0).unwrap();
        j.metadata.uid = Some("job-uid".into());
        j.metadata.resource_version = Some("7".into());
        j.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "primus.dev/v1alpha1".into(),
            kind: "TrainingPlan".into(),
            name: "p".into(),
            uid: owner.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        j.status = serde_json::from_value(status).unwrap();
        job::Observed {
            crd_present: true,
            existing: Some(j),
        }
    }

    fn tp(tp: u32) -> Layout {
        Layout {
            tp,
            ..Layout::default()
        }
    }

    fn ends_ready(s: &Step<Halt>) {
        match &s.next {
            Next::Go(end) => {
                assert_eq!((end.phase, end.requeue), (Phase::Ready, Requeue::Resync));
                assert_eq!(cond(&end.conditions, READY).0, State::True);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn job_created_when_there_is_none() {
        let plan = plan_with(json!({"job": {"suspend": true}}));
        let seen = job::Observed {
            crd_present: true,
            existing: None,
        };
        let (action, s) = job_step(&plan, &seen, &tp(2));
        let Some(JobAction::Create(j)) = action else {
            panic!("{action:?}")
        };
        assert_eq!(j.metadata.name.as_deref(), Some("p"));
        assert!(j.suspended());
        let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
        assert_eq!((state, reason), (State::True, Reason::Suspended));
        assert!(m.starts_with("PyTorchJob p with TP2"), "{m}");
        let n = s.notice.as_ref().unwrap();
        assert_eq!(
            (n.reason, n.action.as_str()),
            (Reason::JobCreated, "CreateJob")
        );
        ends_ready(&s);
    }

    #[test]
    fn job_replaced_when_it_has_not_started_with_another_layout() {
        let plan = plan_with(json!({}));
        let seen = existing(
            &plan,
            "uid-1",
            &tp(4),
            json!({"conditions": [{"type": "Created", "status": "True"}]}),
        );
        let (action, s) = job_step(&plan, &seen, &tp(2));
        assert_eq!(
            action,
            Some(JobAction::Delete {
                uid: Some("job-uid".into()),
                resource_version: Some("7".into())
            })
        );
        let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
        assert_eq!((state, reason), (State::False, Reason::Replacing));
        assert!(
            m.contains("had not started and the plan now chooses TP2"),
            "{m}"
        );
        let Next::Go(end) = &s.next else { panic!() };
        assert_eq!(
            (end.phase, end.requeue),
            (Phase::Pending, Requeue::After(REPLACE_RECHECK))
        );
        assert_eq!(cond(&end.conditions, READY).1, Reason::Reconciling);
        assert_eq!(
            cond(&end.conditions, RECONCILING),
            (
                State::True,
                Reason::ReplacingJob,
                "replacing the PyTorchJob".into()
            )
        );
        assert_eq!(s.notice.as_ref().unwrap().reason, Reason::JobReplaced);
    }

    #[test]
    fn job_left_alone_when_it_started_with_another_layout() {
        let plan = plan_with(json!({}));
        let running = json!({"conditions": [{"type": "Running", "status": "True"}]});
        let seen = existing(&plan, "uid-1", &tp(4), running.clone());
        let (action, s) = job_step(&plan, &seen, &tp(2));
        assert_eq!(action, None);
        let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
        assert_eq!((state, reason), (State::True, Reason::LayoutDiffers));
        assert!(m.contains("has started with TP4"), "{m}");
        ends_ready(&s);
        // With the chosen layout it is up to date; a started job is never suspended.
        let plan = plan_with(json!({"job": {"suspend": true}}));
        let seen = existing(&plan, "uid-1", &tp(2), running);
        let (action, s) = job_step(&plan, &seen, &tp(2));
        assert_eq!(action, None);
        assert_eq!(cond(&s.conditions, JOB_CREATED).1, Reason::Started);
        // Not started: spec.job.suspend is passed on.
        let seen = existing(&plan_with(json!({})), "uid-1", &tp(2), json!({}));
        let (action, s) = job_step(&plan, &seen, &tp(2));
        assert_eq!(action, Some(JobAction::Suspend(true)));
        assert_eq!(cond(&s.conditions, JOB_CREATED).1, Reason::Suspended);
    }

    #[test]
    fn job_name_taken_stalls() {
        let plan = plan_with(json!({}));
        let seen = existing(&plan, "someone-else", &tp(2), json!({}));
        let (action, s) = job_step(&plan, &seen, &tp(2));
        assert_eq!(action, None);
        let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
        assert_eq!((state, reason), (State::False, Reason::JobNameTaken));
        assert!(m.starts_with("a PyTorchJob named p exists and is not owned by this plan"));
        let Next::Go(end) = &s.next else { panic!() };
        assert_eq!((end.phase, end.requeue), (Phase::Stalled, Requeue::Resync));
        assert_eq!(
            cond(&end.conditions, RECONCILING).2,
            "waiting for an outside change"
        );
        assert!(s.notice.is_none());
    }

    #[test]
    fn crd_missing_stalls_and_looks_again() {
        let plan = plan_with(json!({}));
        let (action, s) = job_step(&plan, &job::Observed::default(), &tp(2));
        assert_eq!(action, None);
        assert_eq!(
            cond(&s.conditions, JOB_CREATED).1,
            Reason::PyTorchJobCrdMissing
        );
        assert_eq!(
            Reason::PyTorchJobCrdMissing.as_str(),
            "PyTorchJobCRDMissing"
        );
        let Next::Go(end) = &s.next else { panic!() };
        assert_eq!(
            (end.phase, end.requeue),
            (Phase::Stalled, Requeue::After(CRD_RECHECK))
        );
        assert_eq!(cond(&end.conditions, STALLED).0, State::True);
    }

    #[test]
    fn auto_submit_disabled_reports_the_layout_only() {
        let plan = plan_with(json!({"job": {"autoSubmit": false}}));
        // Whatever exists: the decision does not look.
        let seen = existing(&plan, "someone-else", &tp(4), json!({}));
        let (action, s) = job_step(&plan, &seen, &tp(2));
        assert_eq!(action, None);
        assert_eq!(
            cond(&s.conditions, JOB_CREATED),
            (
                State::False,
                Reason::AutoSubmitDisabled,
                "spec.job.autoSubmit is false: the chosen layout is reported only, no PyTorchJob is created".into()
            )
        );
        ends_ready(&s);
        assert_eq!(Reason::AutoSubmitDisabled.severity(), Severity::Normal);
    }

    #[test]
    fn the_cached_choice_needs_the_same_generation_and_report() {
        let c = chosen(Ok(Choice {
            chosen: summary("TP2", tp(2)),
            reference: None,
            gain_over_reference: None,
            candidates: Vec::new(),
            search: SearchSummary {
                searcher: "none".into(),
                evaluated: 1,
                rejected_by_memory: 0,
                rejected_by_rules: 0,
                seconds: 0.0,
            },
        }));
        let Next::Go(choice) = &c.next else { panic!() };
        let previous = TrainingPlanStatus {
            conditions: c
                .conditions
                .merge(&[], Some(3), k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            chosen: Some(choice.chosen.clone()),
            search: Some(choice.search.clone()),
            benchmark: Some(primus_crds::BenchmarkStatus {
                report: Some("r".into()),
                ..Default::default()
            }),
            ..TrainingPlanStatus::default()
        };
        assert_eq!(
            cached_choice(&previous, Some(3), Some("r")).as_ref(),
            Some(choice)
        );
        assert!(cached_choice(&previous, Some(4), Some("r")).is_none());
        assert!(cached_choice(&previous, Some(3), None).is_none());
    }

    #[test]
    fn flips_are_announced_with_the_reasons_severity() {
        let before = Verdicts::default()
            .with(READY, State::True, Reason::Ready, "ok")
            .with(STALLED, State::False, Reason::Ready, "ok")
            .merge(&[], None, k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let after_v = searching().conditions;
        let after = after_v.merge(&before, None, k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let n = flip_notices(&before, &after, &after_v);
        // Ready -> False (Tuning): announced; Reconciling, Stalled False, Tuned Unknown: not.
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(
            (n[0].reason, n[0].action.as_str()),
            (Reason::Tuning, "Ready")
        );
        assert_eq!(n[0].reason.severity(), Severity::Warning);
        let stalled = Halt::stalled(Reason::JobNameTaken, "taken", Requeue::Resync).conditions;
        let after = stalled.merge(&before, None, k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let n = flip_notices(&before, &after, &stalled);
        let types: Vec<&str> = n.iter().map(|n| n.action.as_str()).collect();
        assert_eq!(types, [READY, STALLED]);
        assert!(n.iter().all(|n| n.reason.severity() == Severity::Warning));
    }

    #[test]
    fn drift_compares_a_measurement_and_says_when_there_is_none() {
        let m = Measurement {
            tokens_per_second_per_gpu: 500.0,
            source: "status.measured".into(),
        };
        let (v, compared) = drift(1000.0, 0.1, Some(m), ("team", "p"));
        let (state, reason, msg) = cond(&v, DRIFT_WITHIN_TOLERANCE);
        assert_eq!((state, reason), (State::False, Reason::OutsideTolerance));
        assert!(msg.contains("drift -50.0%"), "{msg}");
        assert_eq!(compared.map(|c| c.0), Some(500.0));
        let (v, compared) = drift(1000.0, 0.1, None, ("team", "p"));
        assert!(
            cond(&v, DRIFT_WITHIN_TOLERANCE)
                .2
                .contains("primus report --plan team/p")
        );
        assert!(compared.is_none());
        assert_eq!(
            cond(&drift_unknown("down"), DRIFT_WITHIN_TOLERANCE).1,
            Reason::QueryFailed
        );
    }
}
