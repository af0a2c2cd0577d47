//! `primus validate --memory FILE`: the memory model against measured peaks, per row
//! (predicted vs measured, signed error, verdict agreement) and in aggregate, with the CI gate's
//! limits as flags.

use primus_oracle::bounds::{limits::TABLE_BYTES, read_input};
use primus_oracle::memory::Verdict;
use primus_oracle::validate::RowStatus;
use primus_oracle::validate::memory::ranks::{RankSeries, validate_ranks_text};
use primus_oracle::validate::memory::{
    Aggregate, Agreement, MemoryRow, MemoryValidation, group, validate_memory_text,
};

use super::{Args, abs_pct, pct};
use crate::{CliError, Output, catalog, print_json};

fn gib(v: Option<f64>) -> String {
    opt(v, 1)
}

/// The verdict column: what the webhook would do, and whether that matches the run.
fn verdict_cell(r: &MemoryRow) -> String {
    let v = match r.verdict {
        None => return "-".into(),
        Some(Verdict::Fits) => "fits",
        Some(Verdict::AtRisk) => "risk",
        Some(Verdict::WithinBand) => "warn",
        Some(Verdict::Exceeds) => "deny",
    };
    let a = match r.agreement {
        Some(Agreement::Agrees) => "ok",
        Some(Agreement::Warned) => "ok",
        Some(Agreement::FalseDenial) => "FALSE DENIAL",
        Some(Agreement::MissedOom) => "MISSED OOM",
        None => "",
    };
    format!("{v} {a}")
}

fn row_line(r: &MemoryRow) -> String {
    let primary = r.measurements.first();
    format!(
        "{:<8} {:<15} {:<16} {:<9} {:>5} {:<9} {:>9} {:>9} {:>8} {:>8} {:>7} {:<4} {:<17}\n",
        r.id,
        r.framework.as_str(),
        r.model,
        r.gpu,
        r.gpus,
        primary.map_or("-", |m| m.metric.as_str()),
        gib(primary.map(|m| m.measured_gib)),
        gib(primary.map(|m| m.predicted_gib)),
        pct(primary.map(|m| m.error)),
        gib(r.predicted_total_gib),
        gib(r.usable_gib),
        match r.outcome {
            primus_oracle::validate::memory::Outcome::Ran => "ran",
            primus_oracle::validate::memory::Outcome::Oom => "OOM",
        },
        verdict_cell(r),
    )
}

/// Indented detail lines of a row: its layout, other metrics, why it is kept out of the gate,
/// and why it could not be projected.
fn row_details(r: &MemoryRow) -> String {
    let mut out = String::new();
    if !r.layout.is_empty() {
        out.push_str(&format!("         layout: {}\n", r.layout));
    }
    for m in r.measurements.iter().skip(1) {
        out.push_str(&format!(
            "         also {}: measured {:.1}, predicted {:.1} GiB ({})\n",
            m.metric.as_str(),
            m.measured_gib,
            m.predicted_gib,
            pct(Some(m.error))
        ));
    }
    if r.outcome == primus_oracle::validate::memory::Outcome::Oom && r.fixed_segments_at_risk {
        out.push_str(&format!(
            "         fixed-size allocator segments: the allocated peak x {} is over usable (the webhook warns)\n",
            primus_oracle::memory::allocator::FIXED_SEGMENTS_WORST_RESERVED_RATIO
        ));
    }
    if let Some(n) = &r.needs_option {
        out.push_str(&format!("         not in the gate: {n}\n"));
    } else if let Some(n) = &r.peak_not_compared {
        out.push_str(&format!("         not in the error statistics: {n}\n"));
    } else if r.outcome == primus_oracle::validate::memory::Outcome::Oom
        && !r.measurements.is_empty()
    {
        out.push_str("         not in the error statistics: an OOM's number is a lower bound\n");
    }
    match &r.status {
        RowStatus::Ok => {}
        RowStatus::UnknownPreset(m) => out.push_str(&format!("         unknown preset: {m}\n")),
        RowStatus::IllegalLayout(m) => out.push_str(&format!("         illegal layout: {m}\n")),
        RowStatus::BadRow(m) => out.push_str(&format!("         bad row: {m}\n")),
    }
    for n in &r.notes {
        out.push_str(&format!("         note: {n}\n"));
    }
    out
}

fn aggregate_line(a: &Aggregate) -> String {
    format!(
        "  {:<34} {:>4} rows  median |error| {:>6}  max {:>6}  mean {:>7}\n",
        a.group,
        a.rows,
        abs_pct(a.median_abs_error),
        abs_pct(a.max_abs_error),
        pct(a.mean_error)
    )
}

/// The human table.
pub fn table(v: &MemoryValidation) -> String {
    let mut out = format!(
        "{:<8} {:<15} {:<16} {:<9} {:>5} {:<9} {:>9} {:>9} {:>8} {:>8} {:>7} {:<4} {:<17}\n",
        "ID",
        "FRAMEWORK",
        "MODEL",
        "GPU",
        "GPUS",
        "METRIC",
        "MEASURED",
        "PREDICTED",
        "ERROR",
        "TOTAL",
        "USABLE",
        "RUN",
        "VERDICT"
    );
    for r in &v.rows {
        out.push_str(&row_line(r));
        out.push_str(&row_details(r));
    }
    out.push_str(
        "\nGiB per GPU. PREDICTED is the row's metric (allocated, reserved or device-used) at its stage; TOTAL is the verdict's peak (reserved + communicator and dispatcher buffers) against USABLE.\n",
    );
    out.push_str(
        "Error statistics (rows that ran, with a peak logged where the model predicts it, needing no option the model lacks):\n",
    );
    for a in &v.aggregates {
        out.push_str(&aggregate_line(a));
    }
    let judged = v.rows.iter().filter(|r| r.agreement.is_some()).count();
    out.push_str(&format!(
        "Verdicts: {judged} rows judged, {} false denials{}, {} missed OOMs{}; {} rows not projected\n",
        v.false_denials.len(),
        list(&v.false_denials),
        v.missed_ooms.len(),
        list(&v.missed_ooms),
        v.failed
    ));
    out
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|v| format!("{v:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

/// The per-rank section: one line per series, then its ranks' measured / predicted GiB.
fn ranks_table(series: &[RankSeries]) -> String {
    let mut out = String::from(
        "\nPer pipeline rank (measured = offset + slope x predicted, least squares over the ranks):\n",
    );
    for s in series {
        out.push_str(&format!(
            "  {:<8} {:<9} {:>2} ranks  rho {:>5}  slope {:>5}  offset {:>6} GiB  median measured - predicted {:>6} GiB\n",
            s.id,
            s.metric.as_str(),
            s.points.len(),
            opt(s.spearman, 2),
            opt(s.slope, 3),
            opt(s.offset_gib, 1),
            opt(s.median_difference_gib, 1),
        ));
        out.push_str(&format!("           layout: {}\n", s.layout));
        let pairs: Vec<String> = s
            .points
            .iter()
            .map(|p| format!("{}:{:.0}/{:.0}", p.rank, p.measured_gib, p.predicted_gib))
            .collect();
        out.push_str(&format!(
            "           rank:measured/predicted GiB {}\n",
            pairs.join(" ")
        ));
        if let Some(n) = &s.not_compared {
            out.push_str(&format!("           not compared: {n}\n"));
        }
    }
    out
}

fn list(ids: &[String]) -> String {
    if ids.is_empty() {
        String::new()
    } else {
        format!(" ({})", ids.join(", "))
    }
}

/// Run `validate --memory`: print, then apply the gate flags to the Megatron-family rows.
pub fn run(args: &Args) -> Result<(), CliError> {
    let c = catalog(&args.common)?;
    let [file] = args.files.as_slice() else {
        return Err(CliError::Input(
            "validate --memory takes one FILE (the memory set or a throughput CSV)".into(),
        ));
    };
    // The memory set is read once: its runs are the rows and the per-rank series' jobs.
    let text = read_input(file, TABLE_BYTES)?;
    let mut v = validate_memory_text(&text, &c)?;
    if let Some(ranks) = &args.ranks {
        v.ranks = validate_ranks_text(&text, &read_input(ranks, TABLE_BYTES)?, &c)?;
    }
    match args.output {
        Output::Json => print_json(&v)?,
        Output::Table => {
            print!("{}", table(&v));
            if !v.ranks.is_empty() {
                print!("{}", ranks_table(&v.ranks));
            }
        }
    }
    let mut failures = Vec::new();
    let megatron = v.aggregate(group::MEGATRON);
    if let Some(limit) = args.max_median_error {
        match megatron.and_then(|a| a.median_abs_error) {
            Some(m) if m * 100.0 <= limit => {}
            Some(m) => failures.push(format!(
                "Megatron-family median |error| {:.1}% exceeds --max-median-error {limit}%",
                m * 100.0
            )),
            None => failures.push("no Megatron-family row with a measured peak".into()),
        }
    }
    if let Some(limit) = args.max_error
        && let Some(m) = megatron.and_then(|a| a.max_abs_error)
        && m * 100.0 > limit
    {
        failures.push(format!(
            "Megatron-family maximum |error| {:.1}% exceeds --max-error {limit}%",
            m * 100.0
        ));
    }
    if args.strict {
        if !v.false_denials.is_empty() {
            failures.push(format!("false denials: {}", v.false_denials.join(", ")));
        }
        if !v.missed_ooms.is_empty() {
            failures.push(format!("missed OOMs: {}", v.missed_ooms.join(", ")));
        }
        if v.failed > 0 {
            failures.push(format!("{} rows could not be projected", v.failed));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::Failed(failures.join("; ")))
    }
}
