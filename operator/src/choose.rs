//! The pure part of a pass: validate a plan's spec with the oracle's rules (and the operator's
//! own fields), and choose its layout with the tuner. No API calls here; unit-tested.

use primus_crds::{FinalistsSummary, LayoutSummary, Runner, SearchSummary, TrainingPlanSpec};
use primus_oracle::FieldError;
use primus_oracle::calibrate::CalibratedTimer;
use primus_oracle::calibrate::finalists;
use primus_oracle::compute::{AnalyticTimer, OpTimer};
use primus_oracle::hardware::Vendor;
use primus_oracle::plan::{Plan, SearcherKind};
use primus_oracle::profiles::Catalog;
use primus_oracle::report::{Backend, BenchmarkResults};
use primus_oracle::tune::agent::AgentSearcher;
use primus_oracle::tune::trials::TrialSummary;
use primus_oracle::tune::{self, Candidate, TuneOptions, TuneResult};
use primus_oracle::units::GIB;
use primus_runtime::agent::ChatCompletions;
use std::time::{Duration, Instant};

/// Defaults of `spec.benchmark`.
pub const DEFAULT_BENCH_TIMEOUT_SECONDS: u32 = 900;
pub const DEFAULT_BENCH_MAX_ATTEMPTS: u32 = 3;
pub const DEFAULT_REUSE_WITHIN_HOURS: u32 = 168;
/// Default of `spec.drift.tolerance`.
pub const DEFAULT_DRIFT_TOLERANCE: f64 = 0.10;
/// Longest search of one plan: the tuner then reports the best layout found so far (a
/// bounded plan's largest space takes well under this; a reconcile never searches forever).
pub const SEARCH_BUDGET: Duration = Duration::from_secs(300);

/// The benchmark backend of a plan: the spec's, else the operator's default, else the vendor's.
pub fn bench_backend(spec: &TrainingPlanSpec, plan: &Plan, default: Option<Backend>) -> Backend {
    spec.benchmark
        .as_ref()
        .and_then(|b| b.backend)
        .or(default)
        .unwrap_or(match plan.scenario.hardware.vendor {
            Vendor::Amd => Backend::Rocm,
            Vendor::Nvidia => Backend::Cuda,
        })
}

/// Validate a spec with the one validator the webhook and the CLI share
/// ([`TrainingPlanSpec::validate`]: bounds, the oracle's rules, the reference layout's
/// legality, the tuner's space, the operator's fields). The error names the field.
pub fn validate(
    spec: &TrainingPlanSpec,
    name: &str,
    catalog: &Catalog,
) -> Result<Plan, FieldError> {
    spec.validate(name, catalog, Runner::Cluster)
}

/// Agent rounds when the plan gives none.
pub const DEFAULT_AGENT_ROUNDS: u32 = 3;

/// The cluster's LLM endpoint (the operator's configuration; never from a plan).
#[derive(Clone)]
pub struct AgentEndpoint {
    /// OpenAI-compatible API base, e.g. `http://llm.internal:8000/v1`.
    pub endpoint: String,
    /// Model when the plan names none.
    pub model: String,
    /// Bearer token, from the operator's Secret.
    pub api_key: Option<String>,
    /// Per-request timeout (a plan's `timeoutSeconds` may only lower it).
    pub timeout: Duration,
    /// Most wall time one plan's search may take (a plan's `budgetSeconds` may only lower it).
    pub max_budget: Duration,
}

impl std::fmt::Debug for AgentEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentEndpoint")
            .field("endpoint", &self.endpoint)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "(set)"))
            .field("timeout", &self.timeout)
            .field("max_budget", &self.max_budget)
            .finish()
    }
}

/// The op timer of a plan: calibrated by its benchmark report when there is one and it can
/// calibrate the plan (it measured the plan's GPU and holds a usable measurement), else the
/// analytic roofline. Returns whether the timer is calibrated.
pub fn timer_for(
    plan: &Plan,
    report: Option<&BenchmarkResults>,
) -> (Box<dyn OpTimer + Send>, bool) {
    match report.map(|r| CalibratedTimer::new(&plan.scenario, r)) {
        Some(Ok(timer)) => (Box::new(timer), true),
        Some(Err(e)) => {
            tracing::warn!(plan = %plan.name, error = %e, "benchmark report not used; projecting analytically");
            (Box::new(AnalyticTimer), false)
        }
        None => (Box::new(AnalyticTimer), false),
    }
}

/// What the tuner chose, as the status records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    pub chosen: LayoutSummary,
    pub reference: Option<LayoutSummary>,
    pub gain_over_reference: Option<f64>,
    pub candidates: Vec<LayoutSummary>,
    pub search: SearchSummary,
}

impl Choice {
    /// Why the agent was not used (its endpoint failed), when it was not.
    pub fn agent_unavailable(&self) -> Option<&str> {
        self.search.agent_unavailable.as_deref()
    }
}

/// Why no layout was chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChooseError {
    /// A field of the plan is wrong.
    #[error("{0}")]
    Field(#[from] FieldError),
    /// No candidate is legal and fits in memory.
    #[error("{0}")]
    NoFeasibleLayout(String),
}

/// Round to `digits` decimals: the status (and `kubectl get`'s columns) show what a human can
/// read, far finer than the model's accuracy.
fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn summary(c: &Candidate, calibrated: bool, measured_kernels: bool) -> LayoutSummary {
    let p = &c.projection;
    LayoutSummary {
        label: c.label.clone(),
        layout: c.layout.clone(),
        dp: p.dp,
        tokens_per_second_per_gpu: round(p.tokens_per_second_per_gpu, 1),
        tflops_per_gpu: round(p.tflops_per_gpu, 1),
        mfu: round(p.mfu, 4),
        step_time_seconds: round(p.step_time_seconds, 4),
        peak_memory_bytes: p.memory.peak_bytes.round(),
        usable_memory_bytes: p.memory.usable_bytes.round(),
        dominant: c.dominant.clone(),
        calibrated,
        measured_kernels,
    }
}

fn no_layout_message(r: &TuneResult) -> String {
    let mut m = format!(
        "no layout is legal and fits in memory ({} evaluated, {} rejected by memory, {} by rules)",
        r.evaluated, r.rejected_by_memory, r.rejected_by_rules
    );
    if let Some((why, n)) = r.rejections.memory.iter().max_by_key(|(_, n)| **n) {
        m.push_str(&format!("; most common memory overflow: {why} ({n})"));
    }
    m.push_str("; give more GPUs, allow recompute, or lower spec.tuning.memoryHeadroom");
    m
}

/// Choose the plan's layout: `spec.parallelism` as given with searcher `none`, else the
/// tuner's best, scored with the (possibly calibrated) timer, within [`SEARCH_BUDGET`].
/// Searcher `agent` without an endpoint configured, or whose endpoint never answers, falls
/// back to the exhaustive search's answer ([`Choice::agent_unavailable`] says why).
pub fn choose(plan: &Plan, report: Option<&BenchmarkResults>) -> Result<Choice, ChooseError> {
    choose_with(plan, report, None)
}

/// [`choose`] with the operator's LLM endpoint.
pub fn choose_with(
    plan: &Plan,
    report: Option<&BenchmarkResults>,
    agent: Option<&AgentEndpoint>,
) -> Result<Choice, ChooseError> {
    choose_within(plan, report, agent, SEARCH_BUDGET)
}

/// [`choose_with`] with a search budget: at its end the tuner reports the best found so far.
pub fn choose_within(
    plan: &Plan,
    report: Option<&BenchmarkResults>,
    agent: Option<&AgentEndpoint>,
    budget: Duration,
) -> Result<Choice, ChooseError> {
    let (timer, calibrated) = timer_for(plan, report);
    let opts = TuneOptions {
        timer: timer.as_ref(),
        deadline: Instant::now().checked_add(budget),
        ..TuneOptions::default()
    };
    let result = match plan.tuning.searcher {
        SearcherKind::None => tune::tune(plan, None, &opts),
        SearcherKind::Agent => run_agent(plan, agent, &opts),
        kind => tune::searcher(kind).and_then(|mut s| tune::tune(plan, Some(s.as_mut()), &opts)),
    }
    .map_err(|e| match e {
        tune::TuneError::Field(f) => ChooseError::Field(f),
        tune::TuneError::Searcher(m) => {
            ChooseError::Field(FieldError::new("spec.tuning.searcher", m))
        }
    })?;
    if plan.tuning.searcher == SearcherKind::None
        && let Some(r) = &result.reference
        && !r.fits_with_headroom
    {
        let m = &r.candidate.projection.memory;
        return Err(ChooseError::NoFeasibleLayout(format!(
            "spec.parallelism: the layout needs {:.1} GiB per GPU, {:.1} GiB usable at memoryHeadroom {} (searcher none uses it as given)",
            m.peak_bytes / GIB,
            m.usable_bytes * plan.tuning.memory_headroom / GIB,
            plan.tuning.memory_headroom
        )));
    }
    if result.timed_out {
        tracing::warn!(plan = %plan.name, budget = ?budget, "the search ran out of time: the best layout found so far is chosen");
    }
    if result.best.is_none() {
        return Err(ChooseError::NoFeasibleLayout(no_layout_message(&result)));
    }
    let reference = result
        .reference
        .as_ref()
        .map(|r| summary(&r.candidate, calibrated, false));
    let ranked = ranked(plan, report.filter(|_| calibrated), &result);
    // Measured kernels may have put another layout first: its gain, not the tuner's best's.
    let gain_over_reference = match (&result.reference, &ranked.new_first) {
        (Some(r), Some(c)) if r.candidate.tokens_per_second() > 0.0 => {
            Some(c.tokens_per_second() / r.candidate.tokens_per_second() - 1.0)
        }
        _ => result.gain_over_reference,
    };
    let mut listed = ranked.summaries.into_iter();
    let Some(chosen) = listed.next() else {
        return Err(ChooseError::NoFeasibleLayout(no_layout_message(&result)));
    };
    Ok(Choice {
        chosen,
        reference,
        gain_over_reference,
        candidates: listed.collect(),
        search: SearchSummary {
            searcher: result.searcher.as_str().to_string(),
            evaluated: result.evaluated,
            rejected_by_memory: result.rejected_by_memory,
            rejected_by_rules: result.rejected_by_rules,
            seconds: result.seconds,
            trials: Some(
                ranked
                    .trials
                    .unwrap_or_else(|| result.trial_summary.clone()),
            ),
            explanation: result
                .explanation
                .as_ref()
                .map(|e| e.lines())
                .unwrap_or_default(),
            agent_unavailable: result.agent_unavailable.clone(),
            finalists: ranked.finalists,
        },
    })
}

/// The tuner's best layouts as the status lists them.
struct Ranked {
    /// Best first.
    summaries: Vec<LayoutSummary>,
    /// The new first one, when measured kernels put another layout than the tuner's first.
    new_first: Option<Candidate>,
    /// What the measured kernels did (with a report).
    finalists: Option<FinalistsSummary>,
    /// The trial summary with the measured finalists as `benchmark` trials (with a report).
    trials: Option<TrialSummary>,
}

/// The tuner's best layouts, best first: with a benchmark report, re-ranked by the kernels
/// measured at each one's own shapes ([`finalists::rank`]), and what that changed.
fn ranked(plan: &Plan, report: Option<&BenchmarkResults>, result: &TuneResult) -> Ranked {
    let top: Vec<Candidate> = match (&result.best, result.top.is_empty()) {
        (Some(b), true) => vec![b.clone()],
        _ => result.top.clone(),
    };
    let Some(report) = report else {
        return Ranked {
            summaries: top.iter().map(|c| summary(c, false, false)).collect(),
            new_first: None,
            finalists: None,
            trials: None,
        };
    };
    let ranking = finalists::rank(plan, report, &top);
    let first = ranking.finalists.first();
    let new_first = first.filter(|f| f.tuned_rank != 0);
    let change = match new_first {
        Some(f) => format!(
            "measured kernels put {} (tuned #{}) first, ahead of {} (tuned #1)",
            f.candidate.label,
            f.tuned_rank + 1,
            top.first().map(|c| c.label.as_str()).unwrap_or("?")
        ),
        None if ranking.order_changed() => {
            "measured kernels reordered the candidates after the first".to_string()
        }
        None => String::new(),
    };
    Ranked {
        summaries: ranking
            .finalists
            .iter()
            .map(|f| summary(&f.candidate, true, f.measured))
            .collect(),
        new_first: new_first.map(|f| f.candidate.clone()),
        finalists: Some(FinalistsSummary {
            finalists: ranking.finalists.len() as u32,
            measured: ranking.measured() as u32,
            order_changed: ranking.order_changed(),
            change,
        }),
        trials: Some(ranking.trial_summary(result)),
    }
}

/// The agent search under the plan's budget, on its own thread (the transport runs its own
/// one-thread runtime, which must not nest in the caller's); the exhaustive search's answer
/// when no endpoint is configured or it never answered.
fn run_agent(
    plan: &Plan,
    agent: Option<&AgentEndpoint>,
    opts: &TuneOptions<'_>,
) -> Result<TuneResult, tune::TuneError> {
    let spec = plan.tuning.agent.clone().unwrap_or_default();
    let Some(cfg) = agent else {
        let mut exhaustive = tune::exhaustive::Exhaustive::default();
        let mut r = tune::tune(plan, Some(&mut exhaustive), opts)?;
        r.agent_unavailable =
            Some("the operator has no LLM endpoint configured (Helm values operator.agent)".into());
        return Ok(r);
    };
    let secs = |s: u32| Duration::from_secs(s.into());
    let timeout = spec
        .timeout_seconds
        .map_or(cfg.timeout, |s| cfg.timeout.min(secs(s)));
    let budget = spec
        .budget_seconds
        .map_or(cfg.max_budget, |s| cfg.max_budget.min(secs(s)));
    let model = spec.model.clone().unwrap_or_else(|| cfg.model.clone());
    let rounds = spec
        .rounds
        .unwrap_or(DEFAULT_AGENT_ROUNDS)
        .min(primus_crds::agent::MAX_AGENT_ROUNDS);
    let failed = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let proposer =
                    ChatCompletions::new(&cfg.endpoint, &model, cfg.api_key.clone(), timeout)
                        .map_err(|e| tune::TuneError::Searcher(format!("agent: {e}")))?
                        .deadline(Instant::now() + budget);
                let mut searcher = AgentSearcher::new(Box::new(proposer), rounds);
                searcher.budget = Some(budget);
                tune::tune(plan, Some(&mut searcher), opts)
            })
            .join()
            .unwrap_or_else(|_| {
                Err(tune::TuneError::Searcher(
                    "the agent search panicked".into(),
                ))
            })
    })?;
    tune::agent_fallback(plan, failed, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml: &str) -> TrainingPlanSpec {
        let doc: serde_json::Value = serde_saphyr_free(yaml);
        serde_json::from_value(doc).expect("spec deserializes")
    }

    /// Parse YAML through the oracle's parser (the operator has no YAML crate of its own).
    fn serde_saphyr_free(yaml: &str) -> serde_json::Value {
        primus_oracle::parse::parse_yaml_value(yaml, "test").expect("valid YAML")
    }

    const BASE: &str = "model: {preset: llama3.1-8b}\ncluster: {gpu: h100-sxm, gpus: 8}\ntraining: {seqLength: 4096, globalBatchSize: 64}\n";

    #[test]
    fn an_unknown_preset_names_the_field() {
        let c = Catalog::builtin().unwrap();
        let s = spec(
            "model: {preset: llama-9000}\ncluster: {gpu: h100-sxm, gpus: 8}\ntraining: {seqLength: 4096, globalBatchSize: 64}\n",
        );
        let e = validate(&s, "p", &c).unwrap_err();
        assert_eq!(e.field, "spec.model.preset");
    }

    #[test]
    fn an_illegal_reference_layout_names_the_field() {
        let c = Catalog::builtin().unwrap();
        let s = spec(&format!("{BASE}parallelism: {{tp: 2, vpp: 4}}\n"));
        let e = validate(&s, "p", &c).unwrap_err();
        assert!(e.field.starts_with("spec.parallelism"), "{e}");
    }

    #[test]
    fn operator_fields_are_checked() {
        let c = Catalog::builtin().unwrap();
        for (extra, field) in [
            (
                "benchmark: {enabled: true, maxAttempts: 0}\n",
                "spec.benchmark.maxAttempts",
            ),
            (
                "benchmark: {enabled: true, backend: rocm}\n",
                "spec.benchmark.backend",
            ),
            ("drift: {tolerance: -1}\n", "spec.drift.tolerance"),
            (
                "drift: {prometheus: {url: 'prom:9090', query: up}}\n",
                "spec.drift.prometheus.url",
            ),
            ("job: {name: Bad_Name}\n", "spec.job.name"),
            (
                "tuning: {searcher: agent, agent: {endpoint: 'http://x/v1'}}\n",
                "spec.tuning.agent.endpoint",
            ),
            (
                "tuning: {searcher: agent, agent: {apiKeyEnv: HOME}}\n",
                "spec.tuning.agent.apiKeyEnv",
            ),
            (
                "tuning: {searcher: agent, agent: {rounds: 0}}\n",
                "spec.tuning.agent.rounds",
            ),
        ] {
            let e = validate(&spec(&format!("{BASE}{extra}")), "p", &c).unwrap_err();
            assert_eq!(e.field, field, "{extra}: {e}");
        }
        assert!(validate(&spec(BASE), "p", &c).is_ok());
    }

    #[test]
    fn the_tuner_chooses_a_layout_and_reports_alternatives() {
        let c = Catalog::builtin().unwrap();
        let s = spec(&format!(
            "{BASE}parallelism: {{tp: 8}}\ntuning: {{searcher: exhaustive, topK: 3}}\n"
        ));
        let plan = validate(&s, "p", &c).unwrap();
        let choice = choose(&plan, None).unwrap();
        assert!(choice.chosen.tokens_per_second_per_gpu > 0.0);
        assert!(choice.chosen.peak_memory_bytes <= choice.chosen.usable_memory_bytes);
        assert!(!choice.chosen.calibrated);
        assert!(choice.candidates.len() <= 2);
        let r = choice
            .reference
            .as_ref()
            .expect("the reference is projected");
        assert_eq!(r.layout.tp, 8);
        assert!(choice.gain_over_reference.unwrap() >= -1e-9);
        assert_eq!(choice.search.searcher, "exhaustive");
        // Deterministic: the same plan chooses the same layout.
        assert_eq!(
            choose(&plan, None).unwrap().chosen.layout,
            choice.chosen.layout
        );
    }

    #[test]
    fn a_benchmark_report_calibrates_the_choice() {
        let c = Catalog::builtin().unwrap();
        let s = spec(&format!(
            "{BASE}parallelism: {{tp: 2, pp: 2}}\ntuning: {{searcher: none}}\n"
        ));
        let plan = validate(&s, "p", &c).unwrap();
        let analytic = choose(&plan, None).unwrap();
        // A simulated report calibrates to exactly the analytic numbers, marked calibrated.
        let simulated = primus_oracle::bench::simulate::simulate(&plan, Default::default());
        let same = choose(&plan, Some(&simulated)).unwrap();
        assert!(same.chosen.calibrated);
        assert_eq!(
            same.chosen.step_time_seconds,
            analytic.chosen.step_time_seconds
        );
        // Kernels measured at half the analytic speed: a slower step, still calibrated.
        let mut slow = simulated.clone();
        for o in &mut slow.ops {
            o.median_seconds *= 2.0;
        }
        let slower = choose(&plan, Some(&slow)).unwrap();
        assert!(slower.chosen.calibrated);
        assert!(slower.chosen.step_time_seconds > 1.5 * analytic.chosen.step_time_seconds);
        // A report of another GPU is not used.
        let mut other = simulated;
        other.gpu = "mi300x".into();
        other.gpu_product = "AMD Instinct MI300X".into();
        let (_, calibrated) = timer_for(&plan, Some(&other));
        assert!(!calibrated);
    }

    #[test]
    fn measured_finalists_reorder_the_choice_and_the_status_says_so() {
        let c = Catalog::builtin().unwrap();
        let s = spec(&format!(
            "{BASE}parallelism: {{tp: 2}}\ntuning: {{topK: 5}}\n"
        ));
        let plan = validate(&s, "p", &c).unwrap();
        let finalists = primus_oracle::calibrate::finalists::analytic_finalists(&plan, 5, None);
        let mut report = primus_oracle::bench::simulate::simulate_with_finalists(
            &plan,
            &finalists,
            Default::default(),
        );
        let tuned = choose(&plan, Some(&report)).unwrap();
        let f = tuned.search.finalists.clone().unwrap();
        assert!(!f.order_changed && f.change.is_empty());
        // The measured finalists are trials of source `benchmark` in the summary.
        let trials = tuned.search.trials.clone().unwrap();
        let bench = trials
            .by_source
            .iter()
            .find(|s| s.source == "benchmark")
            .expect("benchmark trials");
        assert_eq!(bench.trials, u64::from(f.measured));
        assert_eq!(f.finalists as usize, 1 + tuned.candidates.len());
        // The tuner's best runs its kernels 1.6x slower at its own shapes than modelled.
        let best = primus_oracle::bench::shapes_key(&plan.with_layout(tuned.chosen.layout.clone()));
        let entry = report
            .finalists
            .iter_mut()
            .find(|f| f.shapes_key == best)
            .expect("the best has shapes of its own");
        for o in entry.ops.iter_mut() {
            o.median_seconds *= 1.6;
        }
        let measured = choose(&plan, Some(&report)).unwrap();
        assert_ne!(measured.chosen.layout, tuned.chosen.layout);
        assert!(measured.chosen.measured_kernels);
        let f = measured.search.finalists.clone().unwrap();
        assert!(f.order_changed);
        assert!(
            f.change.starts_with(&format!(
                "measured kernels put {} (tuned #",
                measured.chosen.label
            )),
            "{}",
            f.change
        );
        // The gain is the new first one's.
        let r = measured
            .reference
            .as_ref()
            .unwrap()
            .tokens_per_second_per_gpu;
        let g = measured.gain_over_reference.unwrap();
        assert!((g - (measured.chosen.tokens_per_second_per_gpu / r - 1.0)).abs() < 1e-3);
        // The Tuned condition says what the measured kernels changed.
        let step = crate::decide::chosen(Ok(measured));
        let tuned_msg = step.conditions.get("Tuned").unwrap().message.clone();
        assert!(tuned_msg.contains("measured kernels put "), "{tuned_msg}");
    }

    #[test]
    fn searcher_none_uses_the_layout_as_given() {
        let c = Catalog::builtin().unwrap();
        let s = spec(&format!(
            "{BASE}parallelism: {{tp: 2, pp: 2}}\ntuning: {{searcher: none}}\n"
        ));
        let plan = validate(&s, "p", &c).unwrap();
        let choice = choose(&plan, None).unwrap();
        assert_eq!((choice.chosen.layout.tp, choice.chosen.layout.pp), (2, 2));
        assert!(choice.candidates.is_empty());
    }
}
