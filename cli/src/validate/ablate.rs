//! `primus validate --ablate FILE...`: which modeled MoE execution option moves which row.
//! Every MoE row is projected again with one of its options at Megatron-LM's default
//! (`primus_oracle::validate::ablate`); the table lists, per row, what each option is worth in
//! the model and the row's error without it, then per option over all rows.

use std::path::PathBuf;

use primus_oracle::validate::ablate::{OptionSummary, RowAblation, ablate, summarize};
use primus_oracle::validate::{moe_rows, read_texts};
use serde::Serialize;

use super::{Args, abs_pct, pct};
use crate::{CliError, Output, catalog, print_json};

/// The JSON output: every row's effects and the per-option summary.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Ablations {
    rows: Vec<RowAblation>,
    options: Vec<OptionSummary>,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let c = catalog(&args.common)?;
    let paths: Vec<&std::path::Path> = args.files.iter().map(PathBuf::as_path).collect();
    let texts = read_texts(&paths)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let prepared = moe_rows(&refs, &c)?;
    eprintln!(
        "ablating {} MoE rows, one option at a time ...",
        prepared.len()
    );
    let rows = ablate(&prepared);
    let options = summarize(&rows);
    match args.output {
        Output::Json => print_json(&Ablations { rows, options }),
        Output::Table => {
            print!("{}", table(&rows, &options));
            Ok(())
        }
    }
}

fn table(rows: &[RowAblation], options: &[OptionSummary]) -> String {
    let w = rows.iter().map(|r| r.id.len()).max().unwrap_or(2).max(2);
    let mut out = format!(
        "{:<w$} {:>7}  each option: speed-up it brings in the model (the row's error without it)\n",
        "ID", "ERROR"
    );
    for r in rows {
        let effects: Vec<String> = r
            .effects
            .iter()
            .map(|e| match (&e.illegal, e.speedup) {
                (Some(_), _) => format!("{} illegal alone", e.option.name()),
                (None, s) => format!("{} {} ({})", e.option.name(), pct(s), pct(e.error_without)),
            })
            .collect();
        out.push_str(&format!(
            "{:<w$} {:>7}  {}\n",
            r.id,
            pct(Some(r.error)),
            if effects.is_empty() {
                "no option away from Megatron's defaults".to_string()
            } else {
                effects.join(", ")
            }
        ));
    }
    out.push_str(&format!(
        "\n{:<20} {:>5} {:>8} {:>15} {:>12} {:>15} {:>7}\n",
        "OPTION", "ROWS", "ILLEGAL", "MEDIAN SPEEDUP", "|ERR| WITH", "|ERR| WITHOUT", "CLOSER"
    ));
    for o in options {
        out.push_str(&format!(
            "{:<20} {:>5} {:>8} {:>15} {:>12} {:>15} {:>7}\n",
            o.option.name(),
            o.rows,
            o.illegal,
            pct(o.median_speedup),
            abs_pct(o.with.median_abs_error),
            abs_pct(o.without.median_abs_error),
            o.rows_closer,
        ));
    }
    out.push_str(
        "(|ERR| WITH / WITHOUT: median |error| of the rows whose reverted layout is legal, with \
         the option modelled and without it; CLOSER: rows the option brings closer to their \
         measurement)\n",
    );
    out
}
