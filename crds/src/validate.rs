//! The one validator of a TrainingPlan: the webhook (admission), the operator (its validate
//! step) and the `primus` CLI (plan files) all call [`TrainingPlanSpec::validate`], so a plan
//! one of them accepts, the others accept, and a bad plan is named the same way everywhere.
//!
//! In order: the oracle's fields through the oracle's parser ([`PlanSpec::resolve`]: every
//! size, count and length within [`primus_oracle::bounds`], presets and profiles, the cluster
//! in whole nodes, the training settings, the tuning settings); the reference layout's
//! legality ([`Layout::check`], products in checked arithmetic) and time projection (what only
//! the projection finds: a pipeline schedule too large to simulate); the tuner's search space
//! ([`Space::new`]: pinned and allowed values agree, the space is not too large); who runs the
//! searcher ([`Runner`]); then the operator's fields (benchmark, job, drift), each bounded by
//! its table below and checked by its rules. The same tables are the CRD schema's bounds.
//!
//! To add a field: a row in its type's [`Bounded`] table (beside the type for the oracle's
//! types, here for the operator's), and a rule below when it relates to other fields.

use primus_oracle::FieldError;
use primus_oracle::bounds::{self, Bound, Bounded, Seen, limits, patterns};
use primus_oracle::hardware::Vendor;
use primus_oracle::layout::Layout;
use primus_oracle::plan::{Plan, SearcherKind, check_spec_keys};
use primus_oracle::profiles::Catalog;
use primus_oracle::projection;
use primus_oracle::report::Backend;
use primus_oracle::tune::Space;

use crate::pytorchjob;
use crate::training_plan::{
    BenchmarkSpec, DriftSpec, JobSpec, PrometheusSource, RuntimeRef, TrainingPlanSpec,
};

/// Who runs the plan's search: the cluster (operator and webhook) does not run the `agent`
/// searcher (it needs an LLM endpoint; issue 17), the CLI does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runner {
    /// The operator, and the webhook that admits plans for it.
    Cluster,
    /// `primus` on a plan file.
    Cli,
}

/// Deepest nesting of `spec.job.template` (a PyTorchJob nests about 12 levels; the job
/// writer and the webhook read it with recursive decoders).
pub const TEMPLATE_DEPTH: usize = 32;

/// How deeply `v` nests (a scalar is 1), counted without recursion and no further than
/// `limit + 1`.
pub fn depth(v: &serde_json::Value, limit: usize) -> usize {
    use serde_json::Value;
    let mut deepest = 0;
    let mut stack: Vec<(&Value, usize)> = vec![(v, 1)];
    while let Some((v, d)) = stack.pop() {
        deepest = deepest.max(d);
        if deepest > limit {
            break;
        }
        match v {
            Value::Array(a) => stack.extend(a.iter().map(|x| (x, d + 1))),
            Value::Object(m) => stack.extend(m.values().map(|x| (x, d + 1))),
            _ => {}
        }
    }
    deepest
}

/// Benchmark settings, bounded.
impl Bounded for BenchmarkSpec {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("image", limits::TEXT, |b| b.image.as_ref().into()),
        Bound::items("tolerations", limits::LIST, |b| {
            b.tolerations
                .as_ref()
                .map_or(Seen::Absent, |t| Seen::Items(t.len()))
        }),
        Bound::int("timeoutSeconds", 1, limits::SECONDS, |b| {
            b.timeout_seconds.into()
        }),
        Bound::int("maxAttempts", 1, limits::ATTEMPTS, |b| {
            b.max_attempts.into()
        }),
        Bound::int("reuseWithinHours", 0, limits::HOURS, |b| {
            b.reuse_within_hours.into()
        }),
    ];
}

/// Job settings, bounded (the template is checked by the job writer).
impl Bounded for JobSpec {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::matching("name", 63, patterns::DNS_LABEL, |j| j.name.as_ref().into()),
        Bound::text("experiment", limits::TEXT, |j| j.experiment.as_ref().into()),
    ];

    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        bounds::check_rows(self, at, Self::BOUNDS)?;
        match &self.runtime_ref {
            Some(r) => bounds::check(r, &bounds::path(at, "runtimeRef")),
            None => Ok(()),
        }
    }
}

/// A TrainJob's runtime reference, bounded.
impl Bounded for RuntimeRef {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("name", limits::NAME, |r| r.name.as_ref().into()),
        Bound::text("kind", limits::NAME, |r| r.kind.as_ref().into()),
    ];
}

/// The Prometheus source, bounded.
impl Bounded for PrometheusSource {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::matching("url", limits::URL, patterns::HTTP_URL, |p| (&p.url).into()),
        Bound::text("query", limits::TEXT, |p| (&p.query).into()),
    ];
}

/// Drift settings, bounded (the tolerance is checked by its rule).
impl Bounded for DriftSpec {
    const BOUNDS: &'static [Bound<Self>] = &[];

    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        match &self.prometheus {
            Some(p) => bounds::check(p, &bounds::path(at, "prometheus")),
            None => Ok(()),
        }
    }
}

impl TrainingPlanSpec {
    /// Validate the whole plan (see the module documentation) and resolve it; the error names
    /// the first bad field, in one line.
    pub fn validate(
        &self,
        name: &str,
        catalog: &Catalog,
        runner: Runner,
    ) -> Result<Plan, FieldError> {
        if let Some(t) = self.job.as_ref().and_then(|j| j.template.as_ref())
            && depth(t, TEMPLATE_DEPTH) > TEMPLATE_DEPTH
        {
            return Err(FieldError::new(
                "spec.job.template",
                format!("nests deeper than {TEMPLATE_DEPTH} levels"),
            ));
        }
        let plan = self.to_oracle()?.resolve(name, catalog)?;
        if let Some(l) = &plan.layout {
            // The legality rules, then what only the projection finds (a pipeline schedule
            // too large to simulate): the operator projects the reference layout.
            l.check(&plan.scenario).map_err(FieldError::from)?;
            projection::step_time(&plan.scenario, l).map_err(FieldError::from)?;
        }
        if plan.tuning.searcher != SearcherKind::None {
            Space::new(&plan.scenario, &plan.tuning, plan.layout.as_ref())?;
        }
        if runner == Runner::Cluster {
            // The operator runs the agent with its own endpoint: what a plan may set.
            crate::agent::check_agent(&plan)?;
        }
        if let Some(b) = &self.benchmark {
            check_benchmark(b, &plan)?;
        }
        if let Some(d) = &self.drift {
            check_drift(d)?;
        }
        if let Some(j) = &self.job {
            check_job(j, name, &plan)?;
        }
        Ok(plan)
    }

    /// Read a spec from JSON (a plan file's `spec`, a request's object): unknown keys are a
    /// typo, named; a field of the wrong type is named.
    pub fn from_json(spec: serde_json::Value) -> Result<TrainingPlanSpec, FieldError> {
        check_spec_keys(&spec)?;
        primus_oracle::parse::from_value_at(spec, "spec")
    }
}

/// `spec.benchmark`: bounded, and a backend that can measure the plan's GPUs.
fn check_benchmark(b: &BenchmarkSpec, plan: &Plan) -> Result<(), FieldError> {
    bounds::check(b, "spec.benchmark")?;
    let hw = &plan.scenario.hardware;
    let wrong = match (b.backend, hw.vendor) {
        (Some(Backend::Rocm), Vendor::Nvidia) => Some("rocm"),
        (Some(Backend::Cuda), Vendor::Amd) => Some("cuda"),
        _ => None,
    };
    match wrong {
        Some(backend) => Err(FieldError::new(
            "spec.benchmark.backend",
            format!("{backend} cannot measure the plan's {} GPUs", hw.product),
        )),
        None => Ok(()),
    }
}

/// `spec.drift`: bounded, a finite non-negative tolerance, a query.
fn check_drift(d: &DriftSpec) -> Result<(), FieldError> {
    bounds::check(d, "spec.drift")?;
    if let Some(t) = d.tolerance
        && !(t.is_finite() && t >= 0.0)
    {
        return Err(FieldError::new(
            "spec.drift.tolerance",
            format!("must be a non-negative fraction, got {t}"),
        ));
    }
    if let Some(p) = &d.prometheus
        && p.query.trim().is_empty()
    {
        return Err(FieldError::new(
            "spec.drift.prometheus.query",
            "must not be empty",
        ));
    }
    Ok(())
}

/// `spec.job`: bounded, and a template the job writer can use (checked now rather than after
/// benchmarking and tuning).
fn check_job(j: &JobSpec, name: &str, plan: &Plan) -> Result<(), FieldError> {
    bounds::check(j, "spec.job")?;
    crate::job::write(
        name,
        None,
        &plan.scenario,
        &Layout::default(),
        j,
        &pytorchjob::JobOptions::default(),
    )?;
    Ok(())
}
