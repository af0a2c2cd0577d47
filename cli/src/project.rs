//! `primus project -f PLAN [-o table|json] [--calibration REPORT]`: project the plan's layout
//! (`spec.parallelism`) exactly as given: step time, tokens/s/GPU, model TFLOP/s/GPU, MFU, the
//! breakdown of the step and the memory summary. With `--calibration`, a single-node benchmark
//! report calibrates the projection (`calibrate.rs`) and the output says which terms are
//! measured and which analytic.

use std::path::{Path, PathBuf};

use super::{CliError, Common, Output, plan, print_json};
use primus_oracle::calibrate::{CalibratedTimer, Coverage, coverage, parse_report};
use primus_oracle::projection::{Projection, project, project_with};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// The TrainingPlan (YAML or JSON); its `spec.parallelism` is the layout to project.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
    /// Calibrate with a benchmark report: the JSON `primus bench -o` writes, or a
    /// BenchmarkReport as `kubectl get benchmarkreport NAME -o yaml` prints it.
    #[arg(long, value_name = "REPORT")]
    pub calibration: Option<PathBuf>,
}

/// Read a report file and build the calibrated timer of a scenario; errors name the option.
pub fn load_calibration(
    path: &Path,
    s: &primus_oracle::scenario::Scenario,
) -> Result<CalibratedTimer, CliError> {
    let text =
        super::read_input_file(path).map_err(|e| CliError::Input(format!("--calibration: {e}")))?;
    let report = parse_report(&text, &path.display().to_string())
        .map_err(|e| CliError::Input(format!("--calibration: {e}")))?;
    CalibratedTimer::new(s, &report)
        .map_err(|e| CliError::Input(format!("--calibration: {}: {e}", path.display())))
}

/// The breakdown table with a SOURCE column: measured, interpolated, analytic per term.
pub fn breakdown_table_with_sources(p: &Projection, cov: &Coverage) -> String {
    let step = p.step_time_seconds;
    let mut out = format!(
        "{:<26} {:>11} {:>7}  {:<21} {}\n",
        "STEP BREAKDOWN", "SECONDS", "SHARE", "SOURCE", "DETAIL"
    );
    for ((key, v), (_, label)) in p.breakdown.terms().iter().zip(TERM_LABELS.iter()) {
        let (source, detail) = cov
            .term(key)
            .map(|t| (t.source.as_str(), t.detail.as_str()))
            .unwrap_or(("analytic", ""));
        out.push_str(&format!(
            "{:<26} {:>11.4} {:>6.1}%  {:<21} {}\n",
            label,
            v,
            if step > 0.0 { v / step * 100.0 } else { 0.0 },
            source,
            detail
        ));
    }
    out.push_str(&format!("{:<26} {:>11.4} {:>6.1}%\n", "step", step, 100.0));
    out
}

/// Op kinds of the calibration: measured points, and how the target's op passes are timed.
pub fn op_kinds_table(cov: &Coverage) -> String {
    let mut out = format!(
        "{:<14} {:>9} {:>16} {:>13} {:>9}\n",
        "OP KIND", "MEASURED", "AT MEASURED", "INTERPOLATED", "ANALYTIC"
    );
    for k in &cov.op_kinds {
        out.push_str(&format!(
            "{:<14} {:>9} {:>16} {:>13} {:>9}\n",
            k.kind, k.measured_points, k.exact, k.interpolated, k.analytic
        ));
    }
    out
}

const TERM_LABELS: [(&str, &str); 11] = [
    ("compute", "compute"),
    ("tp", "TP/SP communication"),
    ("cp", "CP communication"),
    ("ep", "EP all-to-all"),
    ("pp", "PP point-to-point"),
    ("dp", "DP/FSDP communication"),
    ("bubble", "pipeline bubble"),
    ("host", "host-bound (MoE)"),
    ("offload", "offload copies (host)"),
    ("optimizer", "optimizer step"),
    ("other", "other overheads"),
];

/// The breakdown table: seconds and share of the step per term.
pub fn breakdown_table(p: &Projection) -> String {
    let step = p.step_time_seconds;
    let mut out = format!(
        "{:<26} {:>11} {:>7}\n",
        "STEP BREAKDOWN", "SECONDS", "SHARE"
    );
    for ((_, v), (_, label)) in p.breakdown.terms().iter().zip(TERM_LABELS.iter()) {
        out.push_str(&format!(
            "{:<26} {:>11.4} {:>6.1}%\n",
            label,
            v,
            if step > 0.0 { v / step * 100.0 } else { 0.0 }
        ));
    }
    out.push_str(&format!("{:<26} {:>11.4} {:>6.1}%\n", "step", step, 100.0));
    out
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let (_, p) = plan(&args.common, &args.file)?;
    let layout = p.layout()?;
    let s = &p.scenario;
    let calibration = match &args.calibration {
        Some(path) => Some(load_calibration(path, s)?),
        None => None,
    };
    let proj = match &calibration {
        Some(timer) => project_with(s, layout, timer),
        None => project(s, layout),
    }
    .map_err(|e| CliError::Input(e.to_string()))?;
    let calibrated = calibration
        .as_ref()
        .map(|t| (t, coverage(&t.calibration, s, layout)));
    let calibrated = calibrated.as_ref().map(|(t, c)| (*t, c));
    match args.output {
        Output::Json => print_projection_json(args, &proj, calibrated),
        Output::Table => {
            print_projection_table(args, &p, layout, &proj, calibrated);
            Ok(())
        }
    }
}

/// The projection as JSON; with a calibration, where it came from and what it covers.
fn print_projection_json(
    args: &Args,
    proj: &Projection,
    calibrated: Option<(&CalibratedTimer, &Coverage)>,
) -> Result<(), CliError> {
    let Some((timer, cov)) = calibrated else {
        return print_json(proj);
    };
    let mut v =
        serde_json::to_value(proj).map_err(|e| CliError::Failed(format!("JSON output: {e}")))?;
    let c = &timer.calibration;
    v["calibration"] = serde_json::json!({
        "report": args.calibration.as_ref().map(|p| p.display().to_string()),
        "backend": c.backend,
        "gpu": c.gpu,
        "gpuProduct": c.gpu_product,
        "node": c.node,
        "startedAt": c.started_at,
        "shapesKey": c.shapes_key,
        "measuredLayout": c.measured_layout,
        "reducedAxes": c.reduced_axes,
        "terms": cov.terms,
        "opKinds": cov.op_kinds,
    });
    print_json(&v)
}

/// The projection as the human table: headline, calibration source, breakdown, memory.
fn print_projection_table(
    args: &Args,
    p: &primus_oracle::plan::Plan,
    layout: &primus_oracle::layout::Layout,
    proj: &Projection,
    calibrated: Option<(&CalibratedTimer, &Coverage)>,
) {
    let s = &p.scenario;
    println!("{}: {}", p.name, crate::scenario_headline(s));
    println!(
        "layout: {} (dp {}, {} micro-batches per step)",
        layout.label(),
        proj.dp,
        proj.num_microbatches
    );
    println!(
        "step {:.3} s | {:.0} tokens/s/GPU | {:.1} model TFLOP/s/GPU | MFU {:.1}% | bubble {:.1}% | dominated by {}",
        proj.step_time_seconds,
        proj.tokens_per_second_per_gpu,
        proj.tflops_per_gpu,
        proj.mfu * 100.0,
        proj.bubble_fraction * 100.0,
        proj.dominant.as_str(),
    );
    if let Some((timer, cov)) = calibrated {
        print_calibration_source(args, timer);
        println!();
        print!("{}", breakdown_table_with_sources(proj, cov));
        println!();
        print!("{}", op_kinds_table(cov));
    } else {
        println!();
        print!("{}", breakdown_table(proj));
    }
    println!(
        "(exposed seconds on the critical pipeline stage {})",
        proj.critical_stage
    );
    println!();
    print!("{}", super::memory::table(&proj.memory));
}

/// One line: which report calibrated the projection, measured on what and where.
fn print_calibration_source(args: &Args, timer: &CalibratedTimer) {
    let c = &timer.calibration;
    println!(
        "calibrated by {}: backend {}, {} ({}) on {}, {}; measured {}{}",
        args.calibration
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        serde_json::to_value(c.backend)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default(),
        c.gpu,
        c.gpu_product,
        if c.node.is_empty() { "?" } else { &c.node },
        if c.started_at.is_empty() {
            "?"
        } else {
            &c.started_at
        },
        c.measured_layout.label(),
        if c.reduced_axes.is_empty() {
            String::new()
        } else {
            format!(" (reduced: {})", c.reduced_axes.join(", "))
        }
    );
}
