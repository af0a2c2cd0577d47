//! What each step's outcome means for the plan's status, decided without the API server: the
//! conditions a step sets, whether the pass goes on ([`Next`]), an action to announce
//! ([`Notice`]), and how the pass ends ([`Halt`]: Ready, Reconciling and Stalled, the phase,
//! when to look again). Pure: everything comes in as arguments (outcomes of the steps'
//! observe -> decide -> apply, the previous status), nothing is read or written here.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use primus_crds::{DriftStatus, JobKind, LayoutSummary, Phase, TrainingPlanStatus};
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
    /// After the plan's error backoff (a write the API server refused; the backoff is not
    /// reset by the pass).
    Backoff,
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

    pub(crate) fn halt(conditions: Verdicts, halt: Halt) -> Step<T> {
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
pub(crate) fn downstream(from: &'static str, reason: Reason) -> Verdicts {
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
    if let Some(f) = s.finalists.as_ref().filter(|f| f.order_changed) {
        tuned.push_str(&format!(
            "; {} ({} of {} finalists measured at their own shapes)",
            f.change, f.measured, f.finalists
        ));
    }
    if let Some(t) = &s.trials
        && t.agent_rounds > 0
    {
        tuned.push_str(&format!(
            "; agent: {} rounds, {} proposals accepted, {} rejected by rule, {} by memory",
            t.agent_rounds,
            t.proposals_accepted,
            t.proposals_rejected_by_rule,
            t.proposals_rejected_by_memory
        ));
    }
    let reason = match c.agent_unavailable() {
        Some(why) => {
            tuned = format!(
                "agent unavailable ({}); the exhaustive search's answer is used: {tuned}",
                why.chars().take(300).collect::<String>()
            );
            Reason::AgentUnavailable
        }
        None => reason,
    };
    Verdicts::default()
        .with(PROJECTED, State::True, Reason::Projected, projected)
        .with(TUNED, State::True, reason, tuned)
}

/// The job's state as the condition tells it.
struct JobState<'a> {
    kind: &'static str,
    started: bool,
    suspended: bool,
    plan_suspends: bool,
    queue: Option<&'a str>,
}

/// The field a job kind is suspended by.
fn suspend_field(kind: &str) -> &'static str {
    if kind == primus_crds::trainjob::KIND {
        "spec.suspend"
    } else {
        "runPolicy.suspend"
    }
}

/// Reason and message of `JobCreated` for a job with the chosen layout: the same words whether
/// this pass created it or found it, so a re-run writes the same status. A suspended job is
/// `Suspended` when the plan suspends it and `Queued` when something else did (a queue
/// controller holding it until its queue admits it).
fn job_condition(name: &str, label: &str, j: &JobState) -> (Reason, String) {
    if j.started {
        (
            Reason::Started,
            format!("{} {name} runs {label} (started)", j.kind),
        )
    } else if j.suspended && j.plan_suspends {
        (
            Reason::Suspended,
            format!(
                "{} {name} with {label} is suspended: review it, then set spec.job.suspend to false",
                j.kind
            ),
        )
    } else if j.suspended {
        let by = match j.queue {
            Some(q) => format!("waits in queue {q}"),
            None => "is suspended by another controller or by spec.job.template".to_string(),
        };
        (
            Reason::Queued,
            format!(
                "{} {name} with {label} {by} (spec.job.suspend is false): it starts when admitted; the operator leaves {} to its queue",
                j.kind,
                suspend_field(j.kind)
            ),
        )
    } else {
        (
            Reason::Created,
            format!("{} {name} with {label} is created", j.kind),
        )
    }
}

/// The job's outcome: `JobCreated`, and how the pass ends once drift is measured.
pub fn job(outcome: &job::Outcome, chosen: &LayoutSummary, kind: JobKind) -> Step<Halt> {
    use job::Outcome;
    let label = &chosen.label;
    let names = primus_crds::job::names(kind);
    let k = names.kind;
    let (state, reason, message) = match outcome {
        Outcome::NotSubmitted => (
            State::False,
            Reason::AutoSubmitDisabled,
            format!(
                "spec.job.autoSubmit is false: the chosen layout is reported only, no {k} is created"
            ),
        ),
        Outcome::CrdMissing => (
            State::False,
            match kind {
                JobKind::PyTorchJob => Reason::PyTorchJobCrdMissing,
                JobKind::TrainJob => Reason::TrainJobCrdMissing,
            },
            format!(
                "the {k} CRD ({}.{}, {}) is not installed: {}; the job is created once it is there",
                names.plural, names.group, names.api_version, names.install
            ),
        ),
        Outcome::NameTaken { name } => (
            State::False,
            Reason::JobNameTaken,
            format!(
                "a {k} named {name} exists and is not owned by this plan: delete it or set spec.job.name"
            ),
        ),
        Outcome::Created {
            name,
            suspended,
            plan_suspends,
            queue,
        } => {
            let j = JobState {
                kind: k,
                started: false,
                suspended: *suspended,
                plan_suspends: *plan_suspends,
                queue: queue.as_deref(),
            };
            let (reason, m) = job_condition(name, label, &j);
            (State::True, reason, m)
        }
        Outcome::UpToDate {
            name,
            started,
            suspended,
            plan_suspends,
            queue,
        } => {
            let j = JobState {
                kind: k,
                started: *started,
                suspended: *suspended,
                plan_suspends: *plan_suspends,
                queue: queue.as_deref(),
            };
            let (reason, m) = job_condition(name, label, &j);
            (State::True, reason, m)
        }
        Outcome::Replacing { name, old } => (
            State::False,
            Reason::Replacing,
            format!(
                "{k} {name} ({old}) had not started and the plan now chooses {label}: replacing it"
            ),
        ),
        Outcome::Differs {
            name, job_layout, ..
        } => (
            State::True,
            Reason::LayoutDiffers,
            format!(
                "{k} {name} has started with {job_layout}; the plan now chooses {label}. The running job is left untouched: delete it to apply the new layout"
            ),
        ),
    };
    let end = match outcome {
        Outcome::CrdMissing => Halt::stalled(reason, &message, Requeue::After(CRD_RECHECK)),
        Outcome::NameTaken { .. } => Halt::stalled(reason, &message, Requeue::Resync),
        Outcome::Replacing { .. } => Halt::progressing(
            Phase::Pending,
            Reason::Reconciling,
            Reason::ReplacingJob,
            &format!("replacing the {k}"),
            Requeue::After(REPLACE_RECHECK),
        ),
        _ => Halt::ready(chosen),
    };
    let notice = match outcome {
        Outcome::Created { name, .. } => Some(Notice {
            reason: Reason::JobCreated,
            action: "CreateJob".into(),
            note: format!("created {k} {name} with {label}"),
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

/// The drift source could not be read (its URL not allowed, or the query failed).
pub fn drift_unknown(error: &drift::QueryError) -> Verdicts {
    let reason = if error.not_allowed() {
        Reason::UrlNotAllowed
    } else {
        Reason::QueryFailed
    };
    Verdicts::default().with(
        DRIFT_WITHIN_TOLERANCE,
        State::Unknown,
        reason,
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
    let unusable = measured
        .as_ref()
        .filter(|x| !drift::plausible(x.tokens_per_second_per_gpu))
        .map(|x| (x.tokens_per_second_per_gpu, x.source.clone()));
    let compared = measured.and_then(|x| {
        drift::drift(projected, x.tokens_per_second_per_gpu, tolerance).map(|d| (x, d))
    });
    let Some((x, d)) = compared else {
        let (ns, name) = plan;
        let message = match unusable {
            Some((v, source)) => format!(
                "the measured throughput from {source} ({v:e} tokens/s/GPU) is no figure a run can have (negative, not finite, or above {:e}): not compared; report the run's own with `primus report --plan {ns}/{name} --tokens-per-second X`",
                primus_oracle::bounds::limits::TOKENS_PER_SECOND_PER_GPU
            ),
            None => format!(
                "no measured throughput yet: the job reports it with `primus report --plan {ns}/{name} --tokens-per-second X`, or set spec.drift.prometheus"
            ),
        };
        let v = Verdicts::default().with(
            DRIFT_WITHIN_TOLERANCE,
            State::Unknown,
            Reason::NoMeasurement,
            message,
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

mod refused;
pub use refused::{clamped, image_not_allowed, refused, status_refused};

#[cfg(test)]
mod tests;
