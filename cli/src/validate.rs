//! `primus validate FILE.csv [-o table|json] [--max-median-error PCT] [--max-error PCT]`:
//! project every row of a published-measurements file and compare; with `--memory`, compare
//! the memory model with the measured peaks of a memory-validation file ([`memory`]).

use std::path::PathBuf;

use super::{CliError, Common, Output, catalog, print_json};
use primus_oracle::validate::{
    Aggregate, Metric, Options, Repeat, Report, RowStatus, fit::Constant, validate_files_with,
    widest_repeat,
};

mod ablate;
pub mod memory;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// CSV file in the format of shared/validation/published.csv. Its `recompute` column
    /// takes none, selective, full, or selective(MODULES) with Megatron's --recompute-modules
    /// names joined by `+`, e.g. selective(layernorm+moe_act). Several files are validated as
    /// one set (aggregates, rank correlations and the refit over all their rows).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
    /// Validate the memory model: FILE gives measured peaks (oracle/tests/data/memory.csv's
    /// columns: framework, outcome, measuredPeakAllocatedGiB / ReservedGiB / DeviceUsedGiB,
    /// peakStage, ...); a throughput CSV is read as rows that ran ("fits" rows).
    #[arg(long)]
    pub memory: bool,
    /// With --memory: a file of peaks measured on every pipeline rank of runs of FILE
    /// (oracle/tests/data/memory-ranks.csv's columns: id, rank, metric, measuredPercent), each
    /// series compared with the model's stages of its run: rank correlation, the least-squares
    /// line measured = offset + slope x predicted, and the median difference.
    #[arg(long, value_name = "RANKS", requires = "memory")]
    pub ranks: Option<PathBuf>,
    /// Fail (exit 1) when the median absolute error exceeds this many percent (with --memory:
    /// of the Megatron-family rows).
    #[arg(long, value_name = "PCT")]
    pub max_median_error: Option<f64>,
    /// Fail (exit 1) when any row's absolute error exceeds this many percent (with --memory:
    /// any Megatron-family row's).
    #[arg(long, value_name = "PCT")]
    pub max_error: Option<f64>,
    /// Fail (exit 1) when a row cannot be projected (unknown preset, illegal layout, bad field);
    /// with --memory also on a false denial (a run that ran, predicted over usable by more than
    /// the error band) or a missed OOM.
    #[arg(long)]
    pub strict: bool,
    /// Skip the refit of the fitted MoE constants and the leave-one-model-out figure.
    #[arg(long)]
    pub no_refit: bool,
    /// Which modeled MoE option moves which row: every MoE row projected again with one of its
    /// execution options at Megatron-LM's default (dispatcher one step back, grouped GEMM,
    /// fusions, overlaps, forced balance, capacity, router dtype, FP8 recipe, CUDA graphs),
    /// with the row's error without it and a per-option summary.
    #[arg(long, conflicts_with = "memory")]
    pub ablate: bool,
}

/// A signed fraction as a percentage, `-` when absent.
fn pct(v: Option<f64>) -> String {
    v.map(|v| format!("{:+.1}%", v * 100.0))
        .unwrap_or_else(|| "-".into())
}

/// An unsigned fraction (an |error| statistic, an MFU) as a percentage, `-` when absent.
fn abs_pct(v: Option<f64>) -> String {
    v.map(|v| format!("{:.1}%", v * 100.0))
        .unwrap_or_else(|| "-".into())
}

fn num(v: Option<f64>, metric: Metric) -> String {
    match (v, metric) {
        (None, _) => "-".into(),
        (Some(v), Metric::SecondsPerIteration) => format!("{v:.2} s"),
        (Some(v), Metric::TokensPerSecondPerGpu) => format!("{v:.0}"),
        (Some(v), Metric::TflopsPerGpu) => format!("{v:.0} TF"),
    }
}

/// A layout label with a long pipeline-layout string cut to its stage count.
fn short_layout(label: &str) -> String {
    label
        .split(' ')
        .map(|part| match part.strip_prefix("layout=") {
            Some(pl) if pl.len() > 16 => format!("layout({} stages)", pl.split('|').count()),
            _ => part.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The human table.
pub fn table(r: &Report) -> String {
    let w = r
        .rows
        .iter()
        .map(|row| row.id.len())
        .max()
        .unwrap_or(0)
        .max(5);
    let mut out = format!(
        "{:<w$} {:<16} {:<10} {:>5} {:<44} {:>10} {:>10} {:>8} {:>8} {:>8} {:>6} {:<13}\n",
        "ID",
        "MODEL",
        "GPU",
        "GPUS",
        "LAYOUT",
        "MEASURED",
        "PROJECTED",
        "ERROR",
        "TF MEAS",
        "TF PROJ",
        "MFU",
        "DOMINANT"
    );
    for row in &r.rows {
        out.push_str(&format!(
            "{:<w$} {:<16} {:<10} {:>5} {:<44} {:>10} {:>10} {:>8} {:>8} {:>8} {:>6} {:<13}\n",
            row.id,
            row.model,
            row.gpu,
            row.gpus,
            short_layout(&row.layout),
            num(row.measured, row.metric),
            num(row.projected, row.metric),
            pct(row.error),
            row.measured_tflops_per_gpu
                .map(|v| format!("{v:.0}"))
                .unwrap_or_else(|| "-".into()),
            row.projected_tflops_per_gpu
                .map(|v| format!("{v:.0}"))
                .unwrap_or_else(|| "-".into()),
            abs_pct(row.mfu),
            row.dominant.clone().unwrap_or_default(),
        ));
        match &row.status {
            RowStatus::Ok => {}
            RowStatus::UnknownPreset(m) => {
                out.push_str(&format!("      line {}: unknown preset: {m}\n", row.line))
            }
            RowStatus::IllegalLayout(m) => {
                out.push_str(&format!("      line {}: illegal layout: {m}\n", row.line))
            }
            RowStatus::BadRow(m) => {
                out.push_str(&format!("      line {}: bad row: {m}\n", row.line))
            }
        }
        for n in &row.notes {
            out.push_str(&format!("      note: {n}\n"));
        }
        if row.fits == Some(false) {
            out.push_str("      note: the memory model says this published layout does not fit\n");
        }
    }
    out.push_str(&format!(
        "\n{} rows projected, {} not projected. |error|: median {}, mean {}, max {} (P rows: seconds per iteration; others: tokens/s/GPU)\n",
        r.projected,
        r.failed,
        abs_pct(r.median_abs_error),
        abs_pct(r.mean_abs_error),
        abs_pct(r.max_abs_error),
    ));
    for g in &r.groups {
        out.push_str(&format!(
            "ranking {}: measured {} | projected {} -> {}\n",
            g.ids.join("/"),
            g.measured_order.join(" > "),
            g.projected_order.join(" > "),
            if g.preserved {
                "preserved"
            } else {
                "NOT preserved"
            }
        ));
    }
    out.push_str(&summary(r));
    out
}

fn aggregate(name: &str, a: &Aggregate) -> String {
    format!(
        "{name}: {} rows, |error| median {}, mean {}, max {}\n",
        a.rows,
        abs_pct(a.median_abs_error),
        abs_pct(a.mean_abs_error),
        abs_pct(a.max_abs_error)
    )
}

/// The dense and MoE aggregates, the rank correlations, the leave-one-model-out figure and
/// the fitted MoE constants.
fn summary(r: &Report) -> String {
    let mut out = String::new();
    out.push_str(&aggregate("dense", &r.dense));
    out.push_str(&aggregate("MoE", &r.moe));
    if !r.held_out.is_empty() {
        out.push_str(&aggregate(
            "MoE, leave one model out (constants refitted without the model's rows)",
            &r.held_out_moe,
        ));
    }
    out.push_str(&repeats(r));
    let ranked: Vec<String> = r
        .ranks
        .iter()
        .filter_map(|g| {
            g.rho.map(|rho| {
                format!(
                    "{} on {} ({} rows, {}) {rho:+.2}",
                    g.model,
                    g.gpu,
                    g.rows,
                    g.metric.unit()
                )
            })
        })
        .collect();
    if !ranked.is_empty() {
        out.push_str(&format!(
            "Spearman rho, projected vs measured, per model x GPU (3+ rows): {}\n",
            ranked.join("; ")
        ));
    }
    for g in &r.generations {
        let values: Vec<String> = g
            .profile
            .values
            .iter()
            .zip(&g.refit.values)
            .map(|((k, p), (_, f))| format!("{} {} -> {}", constant_name(*k), round(*p), round(*f)))
            .collect();
        out.push_str(&format!(
            "fitted MoE constants, {} ({} rows; profile -> refit on these rows): {}\n",
            g.generation,
            g.rows,
            values.join(", ")
        ));
    }
    out
}

/// Repeated configurations: how many, the least maximum |error| they allow any projection
/// (dense and MoE), and the groups whose floor is 5% or more.
fn repeats(r: &Report) -> String {
    if r.repeats.is_empty() {
        return String::new();
    }
    let widest = |kind: &str, moe: bool| -> Option<String> {
        let g = widest_repeat(&r.repeats, moe)?;
        Some(format!(
            "{} for the {kind} rows ({})",
            abs_pct(Some(g.error_floor)),
            measured_list(g)
        ))
    };
    let floors: Vec<String> = [widest("dense", false), widest("MoE", true)]
        .into_iter()
        .flatten()
        .collect();
    let mut out = format!(
        "repeated configurations: {} groups of rows identical in every configuration column, measured apart (mostly one recipe re-measured in a later release); no projection of these rows can keep its max |error| below {}\n",
        r.repeats.len(),
        floors.join(", nor below ")
    );
    for g in r.repeats.iter().filter(|g| g.error_floor >= 0.05) {
        out.push_str(&format!(
            "  repeat {} (floor {}): {}\n",
            g.model,
            abs_pct(Some(g.error_floor)),
            measured_list(g)
        ));
    }
    out
}

fn measured_list(g: &Repeat) -> String {
    g.ids
        .iter()
        .zip(&g.measured)
        .map(|(id, m)| format!("{id} {m}"))
        .collect::<Vec<_>>()
        .join(" vs ")
        + " "
        + g.metric.unit()
}

fn round(v: f64) -> String {
    format!("{}", (v * 1000.0).round() / 1000.0)
}

fn constant_name(k: Constant) -> String {
    k.path()
}

pub fn run(args: &Args) -> Result<(), CliError> {
    if args.memory {
        return memory::run(args);
    }
    if args.ablate {
        return ablate::run(args);
    }
    let c = catalog(&args.common)?;
    let paths: Vec<&std::path::Path> = args.files.iter().map(PathBuf::as_path).collect();
    let report = validate_files_with(
        &paths,
        &c,
        Options {
            refit: !args.no_refit,
        },
    )?;
    match args.output {
        Output::Json => print_json(&report)?,
        Output::Table => print!("{}", table(&report)),
    }
    let mut failures = Vec::new();
    if let Some(limit) = args.max_median_error {
        match report.median_abs_error {
            Some(m) if m * 100.0 <= limit => {}
            Some(m) => failures.push(format!(
                "median absolute error {:.1}% exceeds --max-median-error {limit}%",
                m * 100.0
            )),
            None => failures.push("no row could be projected".into()),
        }
    }
    if let Some(limit) = args.max_error
        && let Some(m) = report.max_abs_error
        && m * 100.0 > limit
    {
        failures.push(format!(
            "maximum absolute error {:.1}% exceeds --max-error {limit}%",
            m * 100.0
        ));
    }
    if args.strict && report.failed > 0 {
        failures.push(format!("{} rows could not be projected", report.failed));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(failures.join("; ")))
    }
}
