//! `primus tune -f PLAN [-o table|json] [--searcher ...] [--top K] [-q] [--emit pytorchjob|trainjob]
//! [--agent-endpoint URL --agent-model M --agent-api-key-env VAR --agent-timeout-seconds S]`:
//! search the plan's layouts and report the best (DESIGN.md section 4), or print the best as a
//! PyTorchJob.
//!
//! A progress bar (candidates/s, best so far) appears on stderr for searches longer than a
//! second, unless `-q` is given or stderr is not a terminal.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use primus_crds::job;
use primus_crds::pytorchjob::JobOptions;
use primus_crds::{JobKind, JobSpec};
use serde_json::Value;

use super::{CliError, Common, Output, plan, print_json};
use primus_oracle::compute::AnalyticTimer;
use primus_oracle::parse::parse_yaml_value;
use primus_oracle::plan::{Plan, SearcherKind};
use primus_oracle::tune::exhaustive::Exhaustive;
use primus_oracle::tune::{
    Candidate, Progress, Searcher, TuneError, TuneOptions, TuneResult, evolutionary, trials, tune,
};
use primus_oracle::units::GIB;

/// Searcher names on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SearcherArg {
    Exhaustive,
    Seed,
    Evolutionary,
    Agent,
    None,
}

impl From<SearcherArg> for SearcherKind {
    fn from(a: SearcherArg) -> SearcherKind {
        match a {
            SearcherArg::Exhaustive => SearcherKind::Exhaustive,
            SearcherArg::Seed => SearcherKind::Seed,
            SearcherArg::Evolutionary => SearcherKind::Evolutionary,
            SearcherArg::Agent => SearcherKind::Agent,
            SearcherArg::None => SearcherKind::None,
        }
    }
}

/// What `--emit` prints instead of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Emit {
    /// A complete kubeflow.org/v1 PyTorchJob running the best layout (YAML; JSON with -o json).
    Pytorchjob,
    /// A Kubeflow Trainer v2 TrainJob (trainer.kubeflow.org/v1alpha1) running the best layout
    /// on the plan's `spec.job.runtimeRef` (default `torch-distributed`).
    Trainjob,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// The TrainingPlan (YAML or JSON).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
    /// Search strategy (default: the plan's `spec.tuning.searcher`, else exhaustive).
    #[arg(long, value_enum)]
    pub searcher: Option<SearcherArg>,
    /// How many of the best layouts to report (default: `spec.tuning.topK`, else 5; at most
    /// 64, the bound of `spec.tuning.topK`).
    #[arg(long, value_parser = top_k)]
    pub top: Option<usize>,
    /// No progress bar and no summary on stderr.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print the best layout as a Kubernetes object instead of the report.
    #[arg(long, value_enum)]
    pub emit: Option<Emit>,
    /// Namespace of the emitted job.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Emit the job suspended (`spec.runPolicy.suspend: true`).
    #[arg(long)]
    pub suspend: bool,
    /// Exhaustive search without pruning (every candidate examined; slower, same answer).
    #[arg(long)]
    pub no_prune: bool,
    /// Score the candidates with an oracle calibrated by a benchmark report (as
    /// `primus project --calibration`).
    #[arg(long, value_name = "REPORT")]
    pub calibration: Option<PathBuf>,
    /// Seed of the evolutionary searcher.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Agent: OpenAI-compatible API base URL, e.g. http://localhost:8000/v1 (overrides
    /// `spec.tuning.agent.endpoint`).
    #[arg(long, env = "PRIMUS_AGENT_ENDPOINT")]
    pub agent_endpoint: Option<String>,
    /// Agent: model name sent with each request.
    #[arg(long, env = "PRIMUS_AGENT_MODEL")]
    pub agent_model: Option<String>,
    /// Agent: environment variable holding the API key (sent as a bearer token).
    #[arg(long, env = "PRIMUS_AGENT_API_KEY_ENV")]
    pub agent_api_key_env: Option<String>,
    /// Agent: proposal rounds (default 3).
    #[arg(long, env = "PRIMUS_AGENT_ROUNDS")]
    pub agent_rounds: Option<u32>,
    /// Agent: seconds to wait for each reply (default 60, at least 1).
    #[arg(
        long,
        env = "PRIMUS_AGENT_TIMEOUT_SECONDS",
        value_name = "SECONDS",
        value_parser = primus_runtime::flags::positive_seconds
    )]
    pub agent_timeout_seconds: Option<Duration>,
    /// Agent: wall time for the whole search; no round starts after it (default: none).
    #[arg(
        long,
        env = "PRIMUS_AGENT_BUDGET_SECONDS",
        value_name = "SECONDS",
        value_parser = primus_runtime::flags::positive_seconds
    )]
    pub agent_budget_seconds: Option<Duration>,
    /// Agent: layouts asked for per round at most (default 8; the reply schema's maxItems).
    #[arg(long, env = "PRIMUS_AGENT_PROPOSALS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub agent_proposals: Option<u32>,
    /// Agent: when the endpoint never answers, report the best non-agent answer (the
    /// exhaustive search's) and exit 0; without it that exits 1.
    #[arg(long)]
    pub agent_fallback: bool,
    /// Write every layout tried (source, layout, projected tokens/s, verdict, best so far) to
    /// FILE as JSON lines.
    #[arg(long, value_name = "FILE")]
    pub trials: Option<PathBuf>,
    /// Draw the best tokens/s/GPU so far per trial to FILE (SVG).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

/// `--top`: 1 to the bound of `spec.tuning.topK`.
fn top_k(s: &str) -> Result<usize, String> {
    let most = primus_oracle::bounds::limits::TOP_K as usize;
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=most).contains(&n) => Ok(n),
        _ => Err(format!("expected a number of layouts in 1..={most}")),
    }
}

impl From<TuneError> for CliError {
    fn from(e: TuneError) -> Self {
        match e {
            TuneError::Field(f) => CliError::Input(f.to_string()),
            TuneError::Searcher(m) => CliError::Input(m),
        }
    }
}

/// `spec.job` and whether the model came from a preset, read from the raw plan file (the
/// resolved plan keeps neither).
fn raw_job_settings(path: &std::path::Path) -> Result<(Value, bool), CliError> {
    let text = super::read_input_file(path)?;
    let doc = parse_yaml_value(&text, &path.display().to_string())?;
    let spec = doc.get("spec").cloned().unwrap_or(doc);
    let preset = spec
        .get("model")
        .and_then(|m| m.get("preset"))
        .is_some_and(|p| !p.is_null());
    Ok((spec.get("job").cloned().unwrap_or(Value::Null), preset))
}

fn agent_searcher(
    args: &Args,
    plan: &primus_oracle::plan::Plan,
) -> Result<Box<dyn Searcher>, CliError> {
    use crate::agent::ChatCompletions;
    use primus_oracle::tune::agent::AgentSearcher;
    let spec = plan.tuning.agent.clone().unwrap_or_default();
    let endpoint = args
        .agent_endpoint
        .clone()
        .or(spec.endpoint)
        .ok_or_else(|| {
            CliError::Input(
                "spec.tuning.agent.endpoint: missing: searcher agent needs an endpoint (or --agent-endpoint)"
                    .into(),
            )
        })?;
    let model = args.agent_model.clone().or(spec.model).ok_or_else(|| {
        CliError::Input(
            "spec.tuning.agent.model: missing: searcher agent needs a model name (or --agent-model)"
                .into(),
        )
    })?;
    let key = match args.agent_api_key_env.clone().or(spec.api_key_env) {
        Some(var) => Some(std::env::var(&var).map_err(|_| {
            CliError::Input(format!(
                "spec.tuning.agent.apiKeyEnv: environment variable {var} is not set"
            ))
        })?),
        None => None,
    };
    let timeout = args
        .agent_timeout_seconds
        .or(spec
            .timeout_seconds
            .map(|s| Duration::from_secs(u64::from(s))))
        .unwrap_or(Duration::from_secs(60))
        .max(Duration::from_secs(1));
    let rounds = args.agent_rounds.or(spec.rounds).unwrap_or(3);
    let budget = args
        .agent_budget_seconds
        .or(spec.budget_seconds.map(|s| Duration::from_secs(s.into())));
    let per_round = args.agent_proposals.unwrap_or(8) as usize;
    let mut proposer = ChatCompletions::new(&endpoint, &model, key, timeout)
        .map_err(|e| CliError::Failed(format!("agent: {e}")))?
        .per_round(per_round);
    if let Some(b) = budget {
        proposer = proposer.deadline(Instant::now() + b);
    }
    let mut agent = AgentSearcher::new(Box::new(proposer), rounds);
    agent.budget = budget;
    agent.per_round = per_round;
    Ok(Box::new(agent))
}

/// `--trials FILE` (JSON lines) and `--plot FILE.svg`.
fn write_trials(args: &Args, name: &str, r: &TuneResult) -> Result<(), CliError> {
    let write = |path: &std::path::Path, text: &str| {
        std::fs::write(path, text).map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))
    };
    if let Some(path) = &args.trials {
        let mut text = String::new();
        for t in &r.trials {
            let line =
                serde_json::to_string(t).map_err(|e| CliError::Failed(format!("trials: {e}")))?;
            text.push_str(&line);
            text.push('\n');
        }
        write(path, &text)?;
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "{name}: {} search, best tokens/s/GPU so far",
            r.searcher.as_str()
        );
        write(path, &trials::plot_svg(&r.trials, &title))?;
    }
    Ok(())
}

/// A progress bar that appears once the search has run for a second.
struct ProgressDisplay {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProgressDisplay {
    fn start(progress: Arc<Progress>, enabled: bool) -> ProgressDisplay {
        let done = Arc::new(AtomicBool::new(false));
        if !enabled {
            return ProgressDisplay { done, thread: None };
        }
        let flag = done.clone();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(1) {
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let (.., total) = progress.snapshot();
            let bar = indicatif::ProgressBar::new(total.max(1)).with_elapsed(start.elapsed());
            let style = indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:20} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            bar.set_style(style);
            while !flag.load(Ordering::Relaxed) {
                let (examined, _, best, done_units, total) = progress.snapshot();
                bar.set_length(total.max(1));
                bar.set_position(done_units);
                let rate = examined as f64 / start.elapsed().as_secs_f64().max(1e-9);
                bar.set_message(format!(
                    "{} candidates, {}/s, best {}",
                    short(examined as f64),
                    short(rate),
                    best.map_or("-".into(), |b| format!("{b:.0} tok/s/GPU"))
                ));
                std::thread::sleep(Duration::from_millis(100));
            }
            bar.finish_and_clear();
        });
        ProgressDisplay {
            done,
            thread: Some(thread),
        }
    }

    fn stop(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// 1234567 -> "1.2M".
fn short(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn gib(b: f64) -> f64 {
    b / GIB
}

/// The report as text.
pub fn report_table(name: &str, r: &TuneResult, s: &primus_oracle::scenario::Scenario) -> String {
    let mut out = String::new();
    report_header(&mut out, name, r, s);
    report_rows(&mut out, r);
    report_trailer(&mut out, r);
    out
}

/// The search's headline: what was tuned, how much was evaluated, the memory pre-filter.
fn report_header(
    out: &mut String,
    name: &str,
    r: &TuneResult,
    s: &primus_oracle::scenario::Scenario,
) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "{name}: {} tune of {}",
        r.searcher.as_str(),
        crate::scenario_headline(s)
    );
    let _ = writeln!(
        out,
        "{} evaluated, {} rejected by memory, {} by rules, {} pruned in {:.2} s ({:.0} candidates/s); memory headroom {:.0}%",
        r.evaluated,
        r.rejected_by_memory,
        r.rejected_by_rules,
        r.pruned,
        r.seconds,
        r.candidates_per_second,
        r.memory_headroom * 100.0,
    );
    let _ = writeln!(
        out,
        "memory pre-filter: layouts up to {:.0}% over the headroom limit are kept, the memory model's measured error band {} (the admission webhook denies only beyond it)",
        r.memory_band.over * 100.0,
        r.memory_band.describe(),
    );
    if !r.within_band.is_empty() {
        let _ = writeln!(
            out,
            "kept within the band (predicted over the headroom limit): {}",
            r.within_band.join("; ")
        );
    }
}

/// The top layouts and the reference, one row each.
fn report_rows(out: &mut String, r: &TuneResult) {
    use std::fmt::Write as _;
    let _ = writeln!(
        out,
        "\n{:>3}  {:<52} {:>10} {:>6} {:>14} {:>9}  DOMINATED BY",
        "#", "LAYOUT", "TOK/S/GPU", "MFU", "PEAK GiB (PP)", "FREE GiB"
    );
    let row = |out: &mut String, tag: &str, c: &primus_oracle::tune::Candidate| {
        let m = &c.projection.memory;
        let _ = writeln!(
            out,
            "{:>3}  {:<52} {:>10.1} {:>5.1}% {:>9.1} ({:>2}) {:>9.1}  {} (bubble {:.0}%, exposed comm {:.0}%)",
            tag,
            c.label,
            c.tokens_per_second(),
            c.projection.mfu * 100.0,
            gib(m.peak_bytes),
            m.bottleneck_stage,
            gib(m.headroom_bytes),
            c.dominant,
            c.projection.breakdown.bubble / c.projection.step_time_seconds.max(1e-12) * 100.0,
            c.projection.breakdown.exposed_comm() / c.projection.step_time_seconds.max(1e-12)
                * 100.0,
        );
    };
    for (i, c) in r.top.iter().enumerate() {
        row(out, &(i + 1).to_string(), c);
    }
    if let Some(reference) = &r.reference {
        row(out, "ref", &reference.candidate);
        if !reference.fits_with_headroom {
            let _ = writeln!(
                out,
                "     (the reference does not fit within the memory headroom)"
            );
        }
    }
}

/// The gain, the explanation, the trials, the rejections and the agent's counters.
fn report_trailer(out: &mut String, r: &TuneResult) {
    use std::fmt::Write as _;
    if let Some(g) = r.gain_over_reference {
        let _ = writeln!(
            out,
            "\ngain of the best over the reference: {:+.1}%",
            g * 100.0
        );
    }
    if let Some(e) = &r.explanation {
        let _ = writeln!(out, "best vs reference, per step:");
        for line in e.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    let ts = &r.trial_summary;
    let _ = writeln!(
        out,
        "\ntrials: {}{}",
        ts.trials,
        ts.by_source
            .iter()
            .map(|s| format!(
                "; {} {} ({} scored{})",
                s.source,
                s.trials,
                s.scored,
                s.best_tokens_per_second
                    .map_or(String::new(), |b| format!(", best {b:.1}"))
            ))
            .collect::<String>()
    );
    if let Some(why) = &r.agent_unavailable {
        let _ = writeln!(
            out,
            "agent unavailable ({why}): the exhaustive search's answer is reported"
        );
    }
    if !r.rejections.rules.is_empty() {
        let _ = writeln!(out, "\nrejected by rules:");
        for (k, v) in &r.rejections.rules {
            let _ = writeln!(out, "  {k:<32} {v:>10}");
        }
    }
    if !r.rejections.memory.is_empty() {
        let _ = writeln!(out, "rejected by memory:");
        for (k, v) in &r.rejections.memory {
            let _ = writeln!(out, "  {k:<32} {v:>10}");
        }
    }
    if let Some(a) = &r.agent {
        let _ = writeln!(
            out,
            "\nagent: {} rounds, {} requests ({} failed), {} malformed replies, {} proposals: {} scored ({} beyond the grid), {} repeated, {} malformed, {} outside the space, {} rejected by rules, {} by memory, {} improvements",
            a.rounds,
            a.requests,
            a.failed_requests,
            a.malformed_replies,
            a.proposals,
            a.scored,
            a.beyond_grid,
            a.repeated,
            a.malformed_proposals,
            a.outside_space,
            a.rejected_by_rules,
            a.rejected_by_memory,
            a.improvements,
        );
    }
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let (_, p) = plan(&args.common, &args.file)?;
    let kind: SearcherKind = args
        .searcher
        .map(SearcherKind::from)
        .unwrap_or(p.tuning.searcher);
    if kind == SearcherKind::None && p.layout.is_none() {
        return Err(CliError::Input(
            "spec.parallelism: missing: searcher none projects spec.parallelism as given".into(),
        ));
    }
    if args.top == Some(0) {
        return Err(CliError::Input("--top: must be greater than 0".into()));
    }
    let searcher = searcher_of(args, &p, kind)?;
    let (job_spec, preset) = if args.emit.is_some() {
        raw_job_settings(&args.file)?
    } else {
        (Value::Null, true)
    };
    let result = search(args, &p, searcher)?;
    write_trials(args, &p.name, &result)?;

    let Some(best) = &result.best else {
        if args.output == Output::Json && args.emit.is_none() {
            print_json(&result)?;
        }
        return Err(CliError::Failed(format!(
            "no layout is legal and fits in memory ({} rejected by rules, {} by memory at headroom {}); see spec.tuning.memoryHeadroom, fixed and allowed",
            result.rejected_by_rules, result.rejected_by_memory, result.memory_headroom
        )));
    };

    if let Some(emit) = args.emit {
        let kind = match emit {
            Emit::Pytorchjob => JobKind::PyTorchJob,
            Emit::Trainjob => JobKind::TrainJob,
        };
        return emit_job(args, &p, (best, kind), &result, &job_spec, preset);
    }
    match args.output {
        Output::Json => print_json(&result),
        Output::Table => {
            print!("{}", report_table(&p.name, &result, &p.scenario));
            Ok(())
        }
    }
}

/// The searcher `--searcher` (else the plan) names; `None` for searcher none.
fn searcher_of(
    args: &Args,
    p: &Plan,
    kind: SearcherKind,
) -> Result<Option<Box<dyn Searcher>>, CliError> {
    Ok(match kind {
        SearcherKind::None => None,
        SearcherKind::Exhaustive => Some(Box::new(Exhaustive {
            prune: !args.no_prune,
        })),
        SearcherKind::Evolutionary => Some(Box::new(evolutionary::Evolutionary {
            seed: args
                .seed
                .unwrap_or(evolutionary::Evolutionary::default().seed),
            ..Default::default()
        })),
        SearcherKind::Agent => Some(agent_searcher(args, p)?),
        SearcherKind::Seed => Some(primus_oracle::tune::searcher(kind)?),
    })
}

/// Run the search (with progress on a terminal and the calibration, if any); an agent whose
/// endpoint never answered is an error unless `--agent-fallback`.
fn search(
    args: &Args,
    p: &Plan,
    mut searcher: Option<Box<dyn Searcher>>,
) -> Result<TuneResult, CliError> {
    let calibrated = match &args.calibration {
        Some(path) => Some(super::project::load_calibration(path, &p.scenario)?),
        None => None,
    };
    let progress = Arc::new(Progress::new());
    let show = !args.quiet && std::io::stderr().is_terminal();
    let display = ProgressDisplay::start(progress.clone(), show);
    let opts = TuneOptions {
        timer: match &calibrated {
            Some(t) => t,
            None => &AnalyticTimer,
        },
        top_k: args.top,
        progress: Some(&progress),
        deadline: None,
    };
    let result = match searcher.as_mut() {
        Some(b) => tune(p, Some(&mut **b), &opts),
        None => tune(p, None, &opts),
    };
    display.stop();
    let result = result?;
    let Some(why) = result.agent_unavailable.clone() else {
        return Ok(result);
    };
    if !args.agent_fallback {
        return Err(CliError::Failed(format!(
            "agent: the endpoint never answered ({why}); give --agent-fallback to use the best non-agent answer instead"
        )));
    }
    if !args.quiet {
        eprintln!(
            "warning: agent unavailable ({why}); reporting the exhaustive search's answer (--agent-fallback)"
        );
    }
    Ok(primus_oracle::tune::agent_fallback(p, result, &opts)?)
}

/// `--emit pytorchjob|trainjob`: the job of the best layout with the plan file's `spec.job`
/// settings.
fn emit_job(
    args: &Args,
    p: &Plan,
    (best, kind): (&Candidate, JobKind),
    result: &TuneResult,
    job_spec: &Value,
    preset: bool,
) -> Result<(), CliError> {
    let template = job_spec.get("template").filter(|t| !t.is_null()).cloned();
    let runtime_ref = match job_spec.get("runtimeRef").filter(|r| !r.is_null()) {
        Some(r) => Some(
            serde_json::from_value(r.clone())
                .map_err(|e| CliError::Input(format!("spec.job.runtimeRef: {e}")))?,
        ),
        None => None,
    };
    let spec = JobSpec {
        template,
        kind: Some(kind),
        // The runtime belongs to a TrainJob; a PyTorchJob emitted from a TrainJob plan has none.
        runtime_ref: runtime_ref.filter(|_| kind == JobKind::TrainJob),
        ..JobSpec::default()
    };
    let opts = JobOptions {
        name: job_spec
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string),
        suspend: args.suspend
            || job_spec
                .get("suspend")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        projected_tokens_per_second: Some(best.tokens_per_second()),
        inline_model_card: !preset,
        launcher: job_spec
            .get("launcher")
            .cloned()
            .and_then(|l| serde_json::from_value(l).ok())
            .unwrap_or_default(),
        experiment: job_spec
            .get("experiment")
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    let job = job::write(
        &p.name,
        args.namespace.as_deref(),
        &p.scenario,
        &best.layout,
        &spec,
        &opts,
    )?;
    // Through a JSON value, so that keys print sorted as they always have.
    let job = serde_json::to_value(&job)
        .map_err(|e| CliError::Failed(format!("{kind:?} output: {e}")))?;
    match args.output {
        Output::Json => print_json(&job)?,
        Output::Table => {
            let text = serde_saphyr::to_string(&job)
                .map_err(|e| CliError::Failed(format!("YAML output: {e}")))?;
            print!("{text}");
        }
    }
    if !args.quiet {
        eprintln!(
            "{}: {} ({:.1} tokens/s/GPU){}",
            p.name,
            best.label,
            best.tokens_per_second(),
            result
                .gain_over_reference
                .map_or(String::new(), |g| format!(
                    ", {:+.1}% over the reference",
                    g * 100.0
                ))
        );
    }
    Ok(())
}
