//! One reconcile pass: validate -> benchmark -> project/tune -> job -> drift, then the status.
//! Each step observes (reads the cluster), decides (pure: the step's own `decide`, then
//! [`crate::decide`] for what it means to the status) and applies (writes). A step hands its
//! result on, or ends the pass with a [`Halt`] that says why and when to look again: never for
//! an invalid plan (a spec change triggers the next pass), soon while a benchmark runs, with
//! backoff on transient errors. [`Pass::halt`] is the one place the pass ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::controller::Action;
use kube::runtime::events::Event;
use primus_crds::{JobStatus, LayoutSummary, TrainingPlan, TrainingPlanStatus};
use primus_oracle::calibrate::Calibration;
use primus_oracle::plan::Plan;
use primus_oracle::report::BenchmarkResults;
use tracing::{info, warn};

use crate::benchmark::{self, Settings};
use crate::choose::{self, Choice, ChooseError, DEFAULT_DRIFT_TOLERANCE};
use crate::conditions::{self, BENCHMARKED, JOB_CREATED, READY, STALLED, Verdicts};
use crate::context::Context;
use crate::decide::{self, Halt, Next, Notice, Report, Requeue, Step};
use crate::decoded::{PlanObject, Undecodable};
use crate::drift;
use crate::error::Error;
use crate::job;
use crate::metrics::Metrics;
use crate::reason::Reason;
use crate::status;

/// How long a search may run before the status says `Tuning`.
const TUNING_NOTICE: Duration = Duration::from_secs(2);

/// Reconcile one plan (the controller's reconciler): a pass over a plan the types read, or
/// `Stalled` naming the field of one they cannot.
pub async fn reconcile(obj: Arc<PlanObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _running = ctx.enter();
    let start = Instant::now();
    let key = key(&obj.metadata);
    let result = match &obj.object {
        Ok(plan) => Pass::new(plan, &ctx).run().await,
        Err(bad) => undecodable(&obj, bad, &ctx).await.map(|a| (a, false)),
    };
    let refused = matches!(result, Ok((_, true)));
    let reason = match &result {
        Err(e) => Some(e.reason()),
        Ok((_, true)) => Some("refused"),
        Ok(_) => None,
    };
    ctx.metrics.observe(start.elapsed(), reason);
    if result.is_ok() && !refused {
        ctx.succeeded(&key);
    }
    result.map(|(action, _)| action)
}

/// Requeue after a failed pass, with per-plan exponential backoff.
pub fn error_policy(obj: Arc<PlanObject>, err: &Error, ctx: Arc<Context>) -> Action {
    let key = key(&obj.metadata);
    let wait = ctx.failed(&key);
    warn!(plan = %key, error = %err, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

/// `namespace/name` of a plan: its key in the backoff map and in logs.
pub fn key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

/// A plan the types cannot read (the CRD accepted it, Rust does not): `Stalled` with reason
/// `InvalidSpec` naming the field, written through the dynamic API, until the plan changes.
/// The status beside it is read as far as it goes, so an unchanged verdict writes nothing.
async fn undecodable(obj: &PlanObject, bad: &Undecodable, ctx: &Context) -> Result<Action, Error> {
    let meta = &obj.metadata;
    if meta.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let (ns, name) = (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    );
    warn!(plan = %key(meta), error = %bad.error, "the plan does not decode");
    let previous = bad.status();
    let halt = decide::invalid(&bad.error);
    let draft = TrainingPlanStatus {
        observed_generation: meta.generation,
        phase: Some(halt.phase),
        ..TrainingPlanStatus::default()
    };
    let status = status::assemble(&previous, draft, &halt.conditions, Timestamp::now());
    let wrote = status::patch_conditions(&ctx.client, (ns, name), &previous, &status).await?;
    let m = &ctx.metrics;
    Metrics::set_plan(&m.stalled, ns, name, Some(1.0));
    Metrics::set_plan(&m.ready, ns, name, Some(0.0));
    if wrote {
        let reference = obj.object_ref(&());
        for n in decide::flip_notices(&previous.conditions, &status.conditions, &halt.conditions) {
            publish(ctx, &reference, n).await;
        }
    }
    Ok(Action::await_change())
}

/// The state of one pass: what the server has, and what the pass decided so far.
struct Pass<'a> {
    obj: &'a TrainingPlan,
    ctx: &'a Context,
    ns: String,
    name: String,
    /// The status as last written (by an earlier pass, or by this one's interim write).
    previous: TrainingPlanStatus,
    draft: TrainingPlanStatus,
    verdicts: Verdicts,
    /// The job part of the status: the previous one until the job step replaces it.
    job: Option<JobStatus>,
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
            job: previous.job.clone(),
            previous,
            verdicts: Verdicts::default(),
        }
    }

    /// The pass; with the action, whether a write was refused (the backoff then stays).
    async fn run(mut self) -> Result<(Action, bool), Error> {
        if self.obj.metadata.deletion_timestamp.is_some() {
            return Ok((Action::await_change(), false));
        }
        let plan = match choose::validate(&self.obj.spec, &self.name, &self.ctx.catalog) {
            Ok(p) => p,
            Err(e) => return self.halt(decide::invalid(&e)).await,
        };
        let report = match self.benchmark(&plan).await? {
            Next::Go(r) => r,
            Next::Halt(h) => return self.halt(h).await,
        };
        let choice = match self.tune(&plan, report).await? {
            Next::Go(c) => c,
            Next::Halt(h) => return self.halt(h).await,
        };
        let end = match self.job(&plan, &choice.chosen).await? {
            Next::Go(end) => end,
            Next::Halt(h) => return self.halt(h).await,
        };
        self.drift(choice.chosen.tokens_per_second_per_gpu).await;
        self.halt(end).await
    }

    /// Benchmark (when the plan asks for one): observe -> decide -> apply.
    async fn benchmark(&mut self, plan: &Plan) -> Result<Next<Option<Report>>, Error> {
        let spec = self.obj.spec.benchmark.clone().unwrap_or_default();
        if !spec.enabled {
            return Ok(self.take(decide::benchmarked(None)).await);
        }
        let (ctx, obj) = (self.ctx, self.obj);
        let backend = choose::bench_backend(&obj.spec, plan, ctx.config.bench_backend);
        let settings = Settings::of(&spec, backend, &ctx.config);
        if !benchmark::image_allowed(&settings.image, &ctx.config) {
            let allowed = benchmark::allowed_images(&ctx.config);
            return Ok(self
                .take(decide::image_not_allowed(&settings.image, &allowed))
                .await);
        }
        let report_key = &ctx.config.report_key;
        let seen = benchmark::observe(&ctx.client, obj, plan, &settings, report_key).await?;
        if let Some((name, why)) = seen.ignored.iter().find(|(n, _)| *n == seen.report) {
            let note = format!("BenchmarkReport {name} is ignored: {why}");
            warn!(plan = %key(&obj.metadata), "{note}");
            let reason = Reason::ReportIgnored;
            let action = "VerifyReport".into();
            self.publish(Notice {
                reason,
                action,
                note,
            })
            .await;
        }
        let previous = self.previous.benchmark.as_ref();
        let grace = ctx.config.bench_grace;
        let d = benchmark::decide(&seen, plan, &settings, grace, previous, Timestamp::now());
        let outcome =
            match benchmark::apply(&ctx.client, &ctx.config, obj, plan, &settings, d).await {
                Ok(o) => o,
                Err(e) => {
                    return self
                        .refused(e, BENCHMARKED, Reason::BenchmarkPodRefused)
                        .await;
                }
            };
        self.draft.benchmark = Some(benchmark::status_of(&outcome));
        if let benchmark::Outcome::Waiting {
            created: Some(pod), ..
        } = &outcome
        {
            ctx.metrics.benchmark_pods_created.inc();
            info!(plan = %key(&obj.metadata), pod = %pod, "benchmark pod created");
        }
        let next = self.take(decide::benchmarked(Some(outcome))).await;
        if let Next::Go(Some(r)) = &next
            && let Ok(c) = Calibration::new(&plan.scenario, &r.results)
            && let Some(v) = decide::clamped(&r.name, c.clamped())
        {
            warn!(plan = %key(&obj.metadata), report = %r.name, "measurements clamped");
            self.verdicts.extend(v);
        }
        Ok(next)
    }

    /// Project and tune: the status's choice for this generation and report, else a search.
    async fn tune(&mut self, plan: &Plan, report: Option<Report>) -> Result<Next<Choice>, Error> {
        let report_name = report.as_ref().map(|r| r.name.clone());
        let generation = self.obj.metadata.generation;
        let result = match decide::cached_choice(&self.previous, generation, report_name.as_deref())
        {
            Some(c) => Ok(c),
            None => self.search(plan, report.map(|r| r.results)).await?,
        };
        let next = self.take(decide::chosen(result)).await;
        if let Next::Go(c) = &next {
            self.record(c);
        }
        Ok(next)
    }

    /// Run the tuner off the async threads; a long search shows phase `Tuning` meanwhile.
    async fn search(
        &mut self,
        plan: &Plan,
        report: Option<BenchmarkResults>,
    ) -> Result<Result<Choice, ChooseError>, Error> {
        let plan = plan.clone();
        let agent = self.ctx.config.agent.clone();
        // Off the async threads: an agent search waits on its LLM for up to its budget while
        // other plans go on reconciling.
        let mut task = tokio::task::spawn_blocking(move || {
            choose::choose_with(&plan, report.as_ref(), agent.as_ref())
        });
        let result = match tokio::time::timeout(TUNING_NOTICE, &mut task).await {
            Ok(r) => r,
            Err(_) => {
                self.interim(decide::searching()).await?;
                task.await
            }
        };
        result.map_err(|e| Error::Task(e.to_string()))
    }

    /// The choice in the status and the projected-throughput gauge.
    fn record(&mut self, c: &Choice) {
        let tokens = c.chosen.tokens_per_second_per_gpu;
        let m = &self.ctx.metrics;
        Metrics::set_plan(&m.projected, &self.ns, &self.name, Some(tokens));
        self.draft.chosen = Some(c.chosen.clone());
        self.draft.reference = c.reference.clone();
        self.draft.gain_over_reference = c.gain_over_reference;
        self.draft.candidates = c.candidates.clone();
        self.draft.search = Some(c.search.clone());
    }

    /// The job: observe -> decide -> apply. Hands on how the pass ends after drift.
    async fn job(&mut self, plan: &Plan, chosen: &LayoutSummary) -> Result<Next<Halt>, Error> {
        let (ctx, obj) = (self.ctx, self.obj);
        let tokens = chosen.tokens_per_second_per_gpu;
        let desired = match job::desired(obj, plan, &chosen.layout, tokens) {
            Ok(j) => j,
            Err(e) => return Ok(Next::Halt(decide::invalid(&e))),
        };
        let seen = job::observe(ctx, obj).await?;
        let d = job::decide(obj, &seen, desired, &chosen.layout);
        let outcome = match job::apply(ctx, obj, d).await {
            Ok(o) => o,
            Err(e) => return self.refused(e, JOB_CREATED, Reason::JobRefused).await,
        };
        self.job = outcome.status();
        if let job::Outcome::Created { name, .. } = &outcome {
            info!(plan = %key(&obj.metadata), job = %name, kind = ?job::job_kind(obj), layout = %chosen.label, "job created");
        }
        Ok(self
            .take(decide::job(&outcome, chosen, job::job_kind(obj)))
            .await)
    }

    /// Drift: measure (the plan's Prometheus query, else `status.measured`), compare, export.
    async fn drift(&mut self, projected: f64) {
        let spec = self.obj.spec.drift.clone().unwrap_or_default();
        let rules = &self.ctx.config.drift_urls;
        let recorded = self.previous.measured.as_ref();
        let measured = match drift::measure(&self.ctx.http, rules, &spec, recorded).await {
            Ok(m) => m,
            Err(e) => return self.verdicts.extend(decide::drift_unknown(&e)),
        };
        let tolerance = spec.tolerance.unwrap_or(DEFAULT_DRIFT_TOLERANCE);
        let plan = (self.ns.as_str(), self.name.as_str());
        let (verdicts, compared) = decide::drift(projected, tolerance, measured, plan);
        let m = &self.ctx.metrics;
        Metrics::set_plan(&m.drift_tolerance, plan.0, plan.1, Some(tolerance));
        Metrics::set_plan(&m.measured, plan.0, plan.1, compared.as_ref().map(|c| c.0));
        Metrics::set_plan(
            &m.drift,
            plan.0,
            plan.1,
            compared.as_ref().map(|c| c.1.ratio),
        );
        self.verdicts.extend(verdicts);
        self.draft.drift = compared.map(|c| c.1);
    }

    /// A step's write failed: refused by the API server, the step's condition quotes its
    /// answer and the pass ends Stalled (with backoff); else the error goes to the error policy.
    async fn refused<T>(
        &mut self,
        e: Error,
        step: &'static str,
        reason: Reason,
    ) -> Result<Next<T>, Error> {
        let Some(r) = e.refusal() else {
            return Err(e);
        };
        warn!(plan = %key(&self.obj.metadata), refusal = %r, "a write was refused");
        Ok(self.take(decide::refused(step, reason, &r)).await)
    }

    /// Keep a step's conditions, announce its action, and hand on where the pass goes.
    async fn take<T>(&mut self, step: Step<T>) -> Next<T> {
        self.verdicts.extend(step.conditions);
        if let Some(n) = step.notice {
            self.publish(n).await;
        }
        step.next
    }

    /// End the pass: the halt's conditions and phase, the job as the pass leaves it, the
    /// status written once, and when to look again.
    async fn halt(mut self, h: Halt) -> Result<(Action, bool), Error> {
        let requeue = h.requeue;
        self.settle(h);
        self.finish().await?;
        let prometheus = self
            .obj
            .spec
            .drift
            .as_ref()
            .and_then(|d| d.prometheus.as_ref());
        let config = &self.ctx.config;
        Ok(match requeue {
            Requeue::OnChange => (Action::await_change(), false),
            Requeue::After(d) => (Action::requeue(d), false),
            Requeue::Resync if prometheus.is_some() => {
                (Action::requeue(config.drift_interval), false)
            }
            Requeue::Resync => (Action::requeue(config.resync), false),
            Requeue::Backoff => {
                let wait = self.ctx.failed(&key(&self.obj.metadata));
                (Action::requeue(wait), true)
            }
        })
    }

    /// Write the status a halt would, and go on from where the pass was (a long search).
    async fn interim(&mut self, h: Halt) -> Result<(), Error> {
        let saved = (self.verdicts.clone(), self.draft.clone());
        self.settle(h);
        self.finish().await?;
        (self.verdicts, self.draft) = saved;
        Ok(())
    }

    fn settle(&mut self, h: Halt) {
        self.verdicts.extend(h.conditions);
        self.draft.phase = Some(h.phase);
        self.draft.job = self.job.clone();
    }

    /// Write the status (when it changed), publish Events for conditions that flipped, and
    /// update the per-plan gauges.
    async fn finish(&mut self) -> Result<(), Error> {
        let draft = self.draft.clone();
        let status = status::assemble(&self.previous, draft, &self.verdicts, Timestamp::now());
        let at = (self.ns.as_str(), self.name.as_str());
        let wrote = match status::apply(&self.ctx.client, at, &self.previous, &status).await {
            Ok(w) => w,
            Err(e) => return Err(self.status_refused(e).await),
        };
        if wrote {
            let ready = conditions::find(&status.conditions, READY);
            info!(
                plan = %key(&self.obj.metadata),
                generation = ?status.observed_generation,
                phase = status.phase.map(|p| p.as_str()).unwrap_or_default(),
                reason = ready.map(|c| c.reason.as_str()).unwrap_or_default(),
                message = ready.map(|c| c.message.as_str()).unwrap_or_default(),
                "status written"
            );
        }
        let m = &self.ctx.metrics;
        let gauge = |b: bool| Some(f64::from(u8::from(b)));
        let (stalled, ready) = (self.verdicts.is_true(STALLED), self.verdicts.is_true(READY));
        Metrics::set_plan(&m.stalled, &self.ns, &self.name, gauge(stalled));
        Metrics::set_plan(&m.ready, &self.ns, &self.name, gauge(ready));
        if wrote {
            let before = &self.previous.conditions;
            for n in decide::flip_notices(before, &status.conditions, &self.verdicts) {
                self.publish(n).await;
            }
        }
        // The next step of this pass (a notice during tuning) starts from what was written.
        self.previous = status;
        Ok(())
    }

    /// The status write failed. When the API server refused it, say so with its answer through
    /// the narrower write of phase and conditions (best effort: it may be refused too); the
    /// error goes on to the error policy either way.
    async fn status_refused(&mut self, e: Error) -> Error {
        let Some(r) = e.refusal() else {
            return e;
        };
        warn!(plan = %key(&self.obj.metadata), refusal = %r, "the status write was refused");
        let verdicts = decide::status_refused(&r);
        let draft = TrainingPlanStatus {
            observed_generation: self.obj.metadata.generation,
            phase: Some(primus_crds::Phase::Stalled),
            ..TrainingPlanStatus::default()
        };
        let status = status::assemble(&self.previous, draft, &verdicts, Timestamp::now());
        let at = (self.ns.as_str(), self.name.as_str());
        match status::patch_conditions(&self.ctx.client, at, &self.previous, &status).await {
            Ok(true) => {
                let before = &self.previous.conditions;
                for n in decide::flip_notices(before, &status.conditions, &verdicts) {
                    self.publish(n).await;
                }
            }
            Ok(false) => {}
            Err(e2) => {
                warn!(plan = %key(&self.obj.metadata), error = %e2, "could not say so either")
            }
        }
        e
    }

    /// Publish an Event on the plan (best effort).
    async fn publish(&self, n: Notice) {
        publish(self.ctx, &self.obj.object_ref(&()), n).await;
    }
}

/// Publish an Event on the plan `reference` names (best effort).
async fn publish(ctx: &Context, reference: &ObjectReference, n: Notice) {
    let ev = Event {
        type_: n.reason.severity().event_type(),
        reason: n.reason.as_str().chars().take(128).collect(),
        note: Some(n.note.chars().take(1000).collect()),
        action: n.action.chars().take(128).collect(),
        secondary: None,
    };
    let plan = format!(
        "{}/{}",
        reference.namespace.as_deref().unwrap_or_default(),
        reference.name.as_deref().unwrap_or_default()
    );
    let publish = ctx.recorder.publish(&ev, reference);
    match tokio::time::timeout(crate::kubeapi::CALL_TIMEOUT, publish).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => warn!(plan = %plan, error = %e, "publishing an event failed"),
        Err(_) => warn!(plan = %plan, "publishing an event timed out"),
    }
}
