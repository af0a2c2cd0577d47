//! One reconcile pass: validate -> benchmark -> project/tune -> job -> drift, then the status.
//! Each step either completes (and the pass goes on) or ends the pass with a status that says
//! why, and when to look again: never for an invalid plan (a spec change triggers the next
//! pass), soon while a benchmark runs, with backoff on transient errors.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use primus_crds::{TrainingPlan, TrainingPlanStatus};
use primus_oracle::FieldError;
use primus_oracle::report::BenchmarkResults;
use primus_oracle::units::GIB;
use tracing::{info, warn};

use crate::benchmark::{self, Settings};
use crate::choose::{self, Choice, ChooseError, DEFAULT_DRIFT_TOLERANCE};
use crate::conditions::{
    self, BENCHMARKED, DRIFT_WITHIN_TOLERANCE, JOB_CREATED, PROJECTED, READY, RECONCILING, STALLED,
    State, TUNED, Verdicts,
};
use crate::context::Context;
use crate::drift;
use crate::error::Error;
use crate::job;
use crate::metrics::Metrics;
use crate::status;

/// How often a plan whose job CRD is missing is looked at again.
const CRD_RECHECK: Duration = Duration::from_secs(15);
/// How long a search may run before the status says `Tuning`.
const TUNING_NOTICE: Duration = Duration::from_secs(2);

/// Reconcile one plan (the controller's reconciler).
pub async fn reconcile(obj: Arc<TrainingPlan>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _running = ctx.enter();
    let start = Instant::now();
    let key = key(&obj);
    let result = Pass::new(&obj, &ctx).run().await;
    ctx.metrics
        .observe(start.elapsed(), result.as_ref().err().map(Error::reason));
    if result.is_ok() {
        ctx.succeeded(&key);
    }
    result
}

/// Requeue after a failed pass, with per-plan exponential backoff.
pub fn error_policy(obj: Arc<TrainingPlan>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = key(&obj);
    let wait = ctx.failed(&key);
    warn!(plan = %key, error = %err, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

fn key(obj: &TrainingPlan) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or_default(),
        obj.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Reason and message of `JobCreated` for a job with the chosen layout: the same words whether
/// this pass created it or found it, so a re-run writes the same status.
fn job_condition(
    name: &str,
    label: &str,
    started: bool,
    suspended: bool,
) -> (&'static str, String) {
    if started {
        (
            "Started",
            format!("PyTorchJob {name} runs {label} (started)"),
        )
    } else if suspended {
        (
            "Suspended",
            format!(
                "PyTorchJob {name} with {label} is suspended: review it, then set spec.job.suspend to false"
            ),
        )
    } else {
        (
            "Created",
            format!("PyTorchJob {name} with {label} is created"),
        )
    }
}

/// The state of one pass.
struct Pass<'a> {
    obj: &'a TrainingPlan,
    ctx: &'a Context,
    ns: String,
    name: String,
    previous: TrainingPlanStatus,
    draft: TrainingPlanStatus,
    verdicts: Verdicts,
}

impl<'a> Pass<'a> {
    fn new(obj: &'a TrainingPlan, ctx: &'a Context) -> Pass<'a> {
        let previous = obj.status.clone().unwrap_or_default();
        Pass {
            obj,
            ctx,
            ns: obj.metadata.namespace.clone().unwrap_or_default(),
            name: obj.metadata.name.clone().unwrap_or_default(),
            draft: TrainingPlanStatus {
                observed_generation: obj.metadata.generation,
                ..TrainingPlanStatus::default()
            },
            previous,
            verdicts: Verdicts::default(),
        }
    }

    fn set(&mut self, t: &'static str, s: State, reason: &str, message: impl Into<String>) {
        self.verdicts.set(t, s, reason, message);
    }

    /// Mark the steps after a pending or failed one as not reached.
    fn downstream_unknown(&mut self, from: &'static str, reason: &str) {
        let steps = [
            BENCHMARKED,
            PROJECTED,
            TUNED,
            JOB_CREATED,
            DRIFT_WITHIN_TOLERANCE,
        ];
        let at = steps.iter().position(|s| *s == from).unwrap_or(0);
        for s in &steps[at + 1..] {
            self.set(s, State::Unknown, reason, "waiting for the previous step");
        }
    }

    async fn run(mut self) -> Result<Action, Error> {
        if self.obj.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        // 1. Validate.
        let plan = match choose::validate(&self.obj.spec, &self.name, &self.ctx.catalog) {
            Ok(p) => p,
            Err(e) => return self.invalid(&e).await,
        };

        // 2. Benchmark.
        let mut report: Option<(String, BenchmarkResults)> = None;
        let bench_spec = self.obj.spec.benchmark.clone().unwrap_or_default();
        if bench_spec.enabled {
            let backend =
                choose::bench_backend(&self.obj.spec, &plan, self.ctx.config.bench_backend);
            let settings = Settings::of(&bench_spec, backend, &self.ctx.config);
            let outcome = benchmark::ensure(
                &self.ctx.client,
                &self.ctx.config,
                self.obj,
                &plan,
                &settings,
                self.previous.benchmark.as_ref(),
            )
            .await?;
            self.draft.benchmark = Some(benchmark::status_of(&outcome));
            match outcome {
                benchmark::Outcome::Done {
                    report: name,
                    results,
                    reused,
                    ..
                } => {
                    let how = if reused { "reused" } else { "received" };
                    let msg = format!(
                        "BenchmarkReport {name} {how}: {} on node {} ({}, {} ops{})",
                        results.gpu_product,
                        results.node,
                        benchmark::backend_name(results.backend),
                        results.ops.len(),
                        if results.reduced_axes.is_empty() {
                            String::new()
                        } else {
                            format!(", downscaled {}", results.reduced_axes.join(", "))
                        }
                    );
                    let reason = if reused {
                        "ReportReused"
                    } else {
                        "ReportReceived"
                    };
                    self.set(BENCHMARKED, State::True, reason, msg);
                    report = Some((name, *results));
                }
                benchmark::Outcome::Waiting {
                    message,
                    requeue,
                    created,
                    ..
                } => {
                    if let Some(pod) = created {
                        self.ctx.metrics.benchmark_pods_created.inc();
                        self.event(EventType::Normal, "BenchmarkStarted", "Benchmark", &message)
                            .await;
                        info!(plan = %key(self.obj), pod = %pod, "benchmark pod created");
                    }
                    self.set(BENCHMARKED, State::False, "Benchmarking", &message);
                    self.downstream_unknown(BENCHMARKED, "WaitingForBenchmark");
                    self.set(READY, State::False, "Benchmarking", &message);
                    self.set(RECONCILING, State::True, "Benchmarking", message);
                    self.set(
                        STALLED,
                        State::False,
                        "Progressing",
                        "the plan is progressing",
                    );
                    self.draft.phase = Some("Benchmarking".into());
                    self.draft.job = self.previous.job.clone();
                    self.finish().await?;
                    return Ok(Action::requeue(requeue));
                }
                benchmark::Outcome::Failed { message, .. } => {
                    self.set(BENCHMARKED, State::False, "BenchmarkFailed", &message);
                    self.downstream_unknown(BENCHMARKED, "BenchmarkFailed");
                    self.set(READY, State::False, "BenchmarkFailed", &message);
                    self.set(
                        RECONCILING,
                        State::False,
                        "BenchmarkFailed",
                        "waiting for a spec change",
                    );
                    self.set(STALLED, State::True, "BenchmarkFailed", message);
                    self.draft.phase = Some("Failed".into());
                    self.draft.job = self.previous.job.clone();
                    self.finish().await?;
                    return Ok(Action::await_change());
                }
            }
        } else {
            self.set(
                BENCHMARKED,
                State::False,
                "Disabled",
                "spec.benchmark.enabled is false: the projection uses the analytic model alone",
            );
        }

        // 3. Project and tune.
        let report_name = report.as_ref().map(|(n, _)| n.clone());
        let choice = match self.cached_choice(&report_name) {
            Some(c) => c,
            None => match self.search(&plan, report.map(|(_, r)| r)).await? {
                Ok(c) => c,
                Err(ChooseError::Field(e)) => return self.invalid(&e).await,
                Err(ChooseError::NoFeasibleLayout(m)) => {
                    self.set(PROJECTED, State::False, "NoFeasibleLayout", &m);
                    self.set(TUNED, State::False, "NoFeasibleLayout", &m);
                    self.downstream_unknown(TUNED, "NoFeasibleLayout");
                    self.set(READY, State::False, "NoFeasibleLayout", &m);
                    self.set(
                        RECONCILING,
                        State::False,
                        "NoFeasibleLayout",
                        "waiting for a spec change",
                    );
                    self.set(STALLED, State::True, "NoFeasibleLayout", m);
                    self.draft.phase = Some("Stalled".into());
                    self.draft.job = self.previous.job.clone();
                    self.finish().await?;
                    return Ok(Action::await_change());
                }
            },
        };
        self.record_choice(&choice);
        let chosen = choice.chosen.clone();

        // 4. The job.
        let desired = match job::desired(
            self.obj,
            &plan,
            &chosen.layout,
            chosen.tokens_per_second_per_gpu,
        ) {
            Ok(j) => j,
            Err(e) => return self.invalid(&e).await,
        };
        let outcome = job::ensure(self.ctx, self.obj, &desired, &chosen.layout).await?;
        self.draft.job = outcome.status();
        let mut requeue = None;
        let mut stalled: Option<(String, String)> = None;
        match &outcome {
            job::Outcome::NotSubmitted => self.set(
                JOB_CREATED,
                State::False,
                "AutoSubmitDisabled",
                "spec.job.autoSubmit is false: the chosen layout is reported only, no PyTorchJob is created",
            ),
            job::Outcome::CrdMissing => {
                let m = "the PyTorchJob CRD (pytorchjobs.kubeflow.org, kubeflow.org/v1) is not installed: install the Kubeflow training operator (or crds/thirdparty/kubeflow.org_pytorchjobs.yaml); the job is created once it is there".to_string();
                self.set(JOB_CREATED, State::False, "PyTorchJobCRDMissing", &m);
                stalled = Some(("PyTorchJobCRDMissing".into(), m));
                requeue = Some(CRD_RECHECK);
            }
            job::Outcome::NameTaken { name } => {
                let m = format!("a PyTorchJob named {name} exists and is not owned by this plan: delete it or set spec.job.name");
                self.set(JOB_CREATED, State::False, "JobNameTaken", &m);
                stalled = Some(("JobNameTaken".into(), m));
            }
            job::Outcome::Created { name, suspended } => {
                let m = format!("created PyTorchJob {name} with {}", chosen.label);
                self.event(EventType::Normal, "JobCreated", "CreateJob", &m).await;
                info!(plan = %key(self.obj), job = %name, layout = %chosen.label, "PyTorchJob created");
                let (reason, m) = job_condition(name, &chosen.label, false, *suspended);
                self.set(JOB_CREATED, State::True, reason, m);
            }
            job::Outcome::UpToDate { name, started, suspended } => {
                let (reason, m) = job_condition(name, &chosen.label, *started, *suspended);
                self.set(JOB_CREATED, State::True, reason, m);
            }
            job::Outcome::Replacing { name, old } => {
                let m = format!(
                    "PyTorchJob {name} ({old}) had not started and the plan now chooses {}: replacing it",
                    chosen.label
                );
                if !old.is_empty() {
                    self.event(EventType::Normal, "JobReplaced", "ReplaceJob", &m).await;
                }
                self.set(JOB_CREATED, State::False, "Replacing", m);
                requeue = Some(Duration::from_secs(1));
            }
            job::Outcome::Differs { name, job_layout, .. } => self.set(
                JOB_CREATED,
                State::True,
                "LayoutDiffers",
                format!(
                    "PyTorchJob {name} has started with {job_layout}; the plan now chooses {}. The running job is left untouched: delete it to apply the new layout",
                    chosen.label
                ),
            ),
        }

        // 5. Drift.
        let prometheus = self
            .obj
            .spec
            .drift
            .as_ref()
            .and_then(|d| d.prometheus.clone());
        self.drift(chosen.tokens_per_second_per_gpu).await;

        // Verdict.
        if let Some((reason, m)) = stalled {
            self.set(READY, State::False, &reason, &m);
            self.set(
                RECONCILING,
                State::False,
                &reason,
                "waiting for an outside change",
            );
            self.set(STALLED, State::True, &reason, m);
            self.draft.phase = Some("Stalled".into());
        } else if requeue.is_some() {
            self.set(
                READY,
                State::False,
                "Reconciling",
                "replacing the PyTorchJob",
            );
            self.set(
                RECONCILING,
                State::True,
                "ReplacingJob",
                "replacing the PyTorchJob",
            );
            self.set(
                STALLED,
                State::False,
                "Progressing",
                "the plan is progressing",
            );
            self.draft.phase = Some("Pending".into());
        } else {
            self.set(
                READY,
                State::True,
                "Ready",
                format!(
                    "{} projected at {:.0} tokens/s/GPU",
                    chosen.label, chosen.tokens_per_second_per_gpu
                ),
            );
            self.set(
                RECONCILING,
                State::False,
                "Ready",
                "nothing left to do for this generation",
            );
            self.set(STALLED, State::False, "Ready", "the plan is not stalled");
            self.draft.phase = Some("Ready".into());
        }
        self.finish().await?;
        Ok(Action::requeue(requeue.unwrap_or(
            if prometheus.is_some() {
                self.ctx.config.drift_interval
            } else {
                self.ctx.config.resync
            },
        )))
    }

    /// The plan is invalid: `Stalled` naming the field, no further work.
    async fn invalid(mut self, e: &FieldError) -> Result<Action, Error> {
        let m = e.to_string();
        self.set(STALLED, State::True, "InvalidSpec", &m);
        self.set(
            READY,
            State::False,
            "InvalidSpec",
            format!("the spec is invalid: {m}"),
        );
        self.set(
            RECONCILING,
            State::False,
            "InvalidSpec",
            "waiting for a spec change",
        );
        self.draft.phase = Some("Stalled".into());
        self.draft.job = self.previous.job.clone();
        self.finish().await?;
        Ok(Action::await_change())
    }

    /// The choice recorded in the status for this generation and benchmark report, if any.
    fn cached_choice(&self, report: &Option<String>) -> Option<Choice> {
        let p = &self.previous;
        let tuned = conditions::find(&p.conditions, TUNED)?;
        if tuned.status != "True"
            || tuned.observed_generation != self.obj.metadata.generation
            || p.benchmark.as_ref().and_then(|b| b.report.clone()) != *report
        {
            return None;
        }
        Some(Choice {
            chosen: p.chosen.clone()?,
            reference: p.reference.clone(),
            gain_over_reference: p.gain_over_reference,
            candidates: p.candidates.clone(),
            search: p.search.clone()?,
        })
    }

    /// Run the tuner off the async threads; a long search shows phase `Tuning` meanwhile.
    async fn search(
        &mut self,
        plan: &primus_oracle::plan::Plan,
        report: Option<BenchmarkResults>,
    ) -> Result<Result<Choice, ChooseError>, Error> {
        let plan = plan.clone();
        let mut task = tokio::task::spawn_blocking(move || choose::choose(&plan, report.as_ref()));
        let result = match tokio::time::timeout(TUNING_NOTICE, &mut task).await {
            Ok(r) => r,
            Err(_) => {
                let (verdicts, draft) = (self.verdicts.clone(), self.draft.clone());
                self.draft.job = self.previous.job.clone();
                self.set(
                    TUNED,
                    State::Unknown,
                    "Searching",
                    "the tuner is searching layouts",
                );
                self.set(
                    READY,
                    State::False,
                    "Tuning",
                    "the tuner is searching layouts",
                );
                self.set(
                    RECONCILING,
                    State::True,
                    "Tuning",
                    "the tuner is searching layouts",
                );
                self.set(
                    STALLED,
                    State::False,
                    "Progressing",
                    "the plan is progressing",
                );
                self.draft.phase = Some("Tuning".into());
                self.finish().await?;
                (self.verdicts, self.draft) = (verdicts, draft);
                task.await
            }
        };
        result.map_err(|e| Error::Task(e.to_string()))
    }

    fn record_choice(&mut self, c: &Choice) {
        let chosen = &c.chosen;
        Metrics::set_plan(
            &self.ctx.metrics.projected,
            &self.ns,
            &self.name,
            Some(chosen.tokens_per_second_per_gpu),
        );
        let calibrated = if chosen.calibrated {
            "calibrated by the benchmark"
        } else {
            "analytic model"
        };
        self.set(
            PROJECTED,
            State::True,
            "Projected",
            format!(
                "{}: {:.0} tokens/s/GPU, {:.0} TFLOP/s/GPU, MFU {:.1}%, step {:.2}s, peak memory {:.1} of {:.1} GiB ({calibrated})",
                chosen.label,
                chosen.tokens_per_second_per_gpu,
                chosen.tflops_per_gpu,
                chosen.mfu * 100.0,
                chosen.step_time_seconds,
                chosen.peak_memory_bytes / GIB,
                chosen.usable_memory_bytes / GIB,
            ),
        );
        let s = &c.search;
        let (reason, mut m) = if s.searcher == "none" {
            (
                "LayoutGiven",
                format!(
                    "searcher none: spec.parallelism ({}) is used as given",
                    chosen.label
                ),
            )
        } else {
            (
                "Tuned",
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
            m.push_str(&format!("; {:+.1}% over spec.parallelism", g * 100.0));
        }
        self.set(TUNED, State::True, reason, m);
        self.draft.chosen = Some(c.chosen.clone());
        self.draft.reference = c.reference.clone();
        self.draft.gain_over_reference = c.gain_over_reference;
        self.draft.candidates = c.candidates.clone();
        self.draft.search = Some(c.search.clone());
    }

    async fn drift(&mut self, projected: f64) {
        let spec = self.obj.spec.drift.clone().unwrap_or_default();
        let tolerance = spec.tolerance.unwrap_or(DEFAULT_DRIFT_TOLERANCE);
        let measurement = match &spec.prometheus {
            Some(p) => match drift::query(&self.ctx.http, p).await {
                Ok(Some(v)) => Some(drift::Measurement {
                    tokens_per_second_per_gpu: v,
                    source: format!("Prometheus query at {}", p.url),
                }),
                Ok(None) => None,
                Err(e) => {
                    self.set(
                        DRIFT_WITHIN_TOLERANCE,
                        State::Unknown,
                        "QueryFailed",
                        format!("spec.drift.prometheus: {e}"),
                    );
                    return;
                }
            },
            None => self.previous.measured.as_ref().map(|m| drift::Measurement {
                tokens_per_second_per_gpu: m.tokens_per_second_per_gpu,
                source: m.source.clone().unwrap_or_else(|| "status.measured".into()),
            }),
        };
        let (ns, name) = (self.ns.clone(), self.name.clone());
        let m = &self.ctx.metrics;
        Metrics::set_plan(&m.drift_tolerance, &ns, &name, Some(tolerance));
        match measurement.and_then(|x| {
            drift::drift(projected, x.tokens_per_second_per_gpu, tolerance).map(|d| (x, d))
        }) {
            Some((x, d)) => {
                Metrics::set_plan(&m.measured, &ns, &name, Some(x.tokens_per_second_per_gpu));
                Metrics::set_plan(&m.drift, &ns, &name, Some(d.ratio));
                let msg = format!(
                    "measured {:.0} tokens/s/GPU ({}) vs projected {:.0}: drift {:+.1}% (tolerance ±{:.1}%)",
                    x.tokens_per_second_per_gpu,
                    x.source,
                    projected,
                    d.ratio * 100.0,
                    d.tolerance * 100.0
                );
                let (state, reason) = if d.within_tolerance {
                    (State::True, "WithinTolerance")
                } else {
                    (State::False, "OutsideTolerance")
                };
                self.set(DRIFT_WITHIN_TOLERANCE, state, reason, msg);
                self.draft.drift = Some(d);
            }
            None => {
                Metrics::set_plan(&m.measured, &ns, &name, None);
                Metrics::set_plan(&m.drift, &ns, &name, None);
                self.set(
                    DRIFT_WITHIN_TOLERANCE,
                    State::Unknown,
                    "NoMeasurement",
                    format!(
                        "no measured throughput yet: the job reports it with `primus report --plan {ns}/{name} --tokens-per-second X`, or set spec.drift.prometheus"
                    ),
                );
            }
        }
    }

    /// Write the status (when it changed), publish Events for conditions that flipped, and
    /// update the per-plan gauges.
    async fn finish(&mut self) -> Result<(), Error> {
        let status = status::assemble(
            &self.previous,
            self.draft.clone(),
            &self.verdicts,
            Timestamp::now(),
        );
        let wrote = status::apply(&self.ctx.client, self.obj, &self.previous, &status).await?;
        if wrote {
            let ready = conditions::find(&status.conditions, READY);
            info!(
                plan = %key(self.obj),
                generation = ?status.observed_generation,
                phase = status.phase.as_deref().unwrap_or_default(),
                reason = ready.map(|c| c.reason.as_str()).unwrap_or_default(),
                message = ready.map(|c| c.message.as_str()).unwrap_or_default(),
                "status written"
            );
        }
        let stalled = self.verdicts.is_true(STALLED);
        let ready = self.verdicts.is_true(READY);
        Metrics::set_plan(
            &self.ctx.metrics.stalled,
            &self.ns,
            &self.name,
            Some(f64::from(u8::from(stalled))),
        );
        Metrics::set_plan(
            &self.ctx.metrics.ready,
            &self.ns,
            &self.name,
            Some(f64::from(u8::from(ready))),
        );
        if wrote {
            let flips: Vec<_> = conditions::flipped(&self.previous.conditions, &status.conditions)
                .into_iter()
                .filter(|c| {
                    c.type_ != RECONCILING
                        && c.status != "Unknown"
                        && !(c.type_ == STALLED && c.status != "True")
                })
                .cloned()
                .collect();
            for c in flips {
                let warning = (c.type_ == STALLED && c.status == "True")
                    || (c.status == "False"
                        && !matches!(
                            c.reason.as_str(),
                            "Benchmarking"
                                | "Disabled"
                                | "AutoSubmitDisabled"
                                | "Replacing"
                                | "Reconciling"
                        ));
                let kind = if warning {
                    EventType::Warning
                } else {
                    EventType::Normal
                };
                self.event(kind, &c.reason, &c.type_, &c.message).await;
            }
        }
        // The next step of this pass (a notice during tuning) starts from what was written.
        self.previous = status;
        Ok(())
    }

    async fn event(&self, type_: EventType, reason: &str, action: &str, note: &str) {
        let ev = Event {
            type_,
            reason: reason.chars().take(128).collect(),
            note: Some(note.chars().take(1000).collect()),
            action: action.chars().take(128).collect(),
            secondary: None,
        };
        let reference = self.obj.object_ref(&());
        match tokio::time::timeout(
            crate::kubeapi::CALL_TIMEOUT,
            self.ctx.recorder.publish(&ev, &reference),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(e)) => warn!(plan = %key(self.obj), error = %e, "publishing an event failed"),
            Err(_) => warn!(plan = %key(self.obj), "publishing an event timed out"),
        }
    }
}
