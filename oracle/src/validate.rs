//! Validation of the projection against published training measurements: read rows in the
//! format of `shared/validation/published.csv` (one run per row, with its complete layout),
//! project each, and report the signed error per row, the median and maximum absolute error,
//! and whether the ranking inside groups of rows of the same job (full vs selective recompute)
//! is preserved. Rows that cannot be projected (unknown preset, illegal layout, malformed
//! field) are reported with the reason, never skipped silently.
//!
//! The metric is tokens/s/GPU when the row gives `measuredTokensPerSecondPerGpu`; rows that
//! give seconds per iteration in `notes` ("1.42 s per iteration", the Korthikanti et al. rows)
//! are compared on seconds per iteration.
//!
//! Columns beyond the published ones are accepted when they name a layout field
//! (`pipelineLayout`, `firstStageLayers`, `tpCommOverlap`, ...): they are passed to the layout
//! as given.
//!
//! The `recompute` column takes `none`, `full`, `selective` (Megatron's default modules,
//! `[core_attn]`) or `selective(MODULES)` with Megatron's `--recompute-modules` names joined by
//! `+`, e.g. `selective(layernorm+moe_act)`; a `recomputeModules` column in the same `+` form
//! does the same. A `recomputeLayerIds` column (Primus' `recompute_layer_ids`, e.g.
//! `0,1,2,4`) recomputes exactly those layers with `recompute` `full`.
//!
//! Gradient precision: a row reduces gradients in BF16 unless a `gradReduceInFp32` column says
//! `true`. The published throughput tables come from performance recipes that all do
//! (NVIDIA NeMo `scripts/performance` sets `grad_reduce_in_fp32 = False`, Megatron-Bridge's
//! performance configs likewise), while a TrainingPlan's layout defaults to Megatron-LM's FP32
//! gradients with `--bf16`.
//!
//! FP8 recipe: an FP8 row without an `fp8Recipe` cell runs the recipe NVIDIA's performance tables
//! run on its GPU (MXFP8 on Blackwell, per-tensor current scaling on Hopper; AMD rows keep
//! Megatron-LM's delayed scaling), `csv::row_fp8_recipe`; a TrainingPlan's layout keeps
//! Megatron-LM's default, which a job without the flag runs.

use std::collections::BTreeMap;

use serde::Serialize;

pub mod ablate;
mod csv;
pub mod fit;
pub mod memory;
mod repeats;
mod stats;

use csv::{
    CheckedLayout, Row, check_with_balanced_split, figure, measured_figure, positive,
    row_fp8_recipe, row_layout, row_measurement, row_moe_defaults, row_scenario,
};
pub use csv::{
    LAYOUT_COLUMNS, MOE_COLUMNS, REQUIRED_COLUMNS, embedding_and_loss_split, most_even_split,
    parse_csv, seconds_per_iteration,
};
pub use fit::{GenerationFit, HeldOut, Prepared};
pub use repeats::{Repeat, error_floor, widest_repeat};
pub use stats::{Aggregate, RankGroup, spearman};

use crate::bounds::limits;
use crate::error::PlanError;
use crate::precision::Precision;
use crate::profiles::Catalog;
use crate::projection::{self, Breakdown, Projection};

/// What a row is compared on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Metric {
    TokensPerSecondPerGpu,
    SecondsPerIteration,
    /// Model TFLOP/s per GPU, for rows that publish nothing else (the convention of
    /// NVIDIA's tables, which the projection's model FLOPs follow: causal attention, MTP
    /// included when the model has it, backward twice the forward).
    TflopsPerGpu,
}

impl Metric {
    /// This metric of a projection: tokens/s/GPU, seconds per iteration or TFLOP/s/GPU.
    pub fn pick(self, tokens_per_second_per_gpu: f64, seconds: f64, tflops_per_gpu: f64) -> f64 {
        match self {
            Metric::TokensPerSecondPerGpu => tokens_per_second_per_gpu,
            Metric::SecondsPerIteration => seconds,
            Metric::TflopsPerGpu => tflops_per_gpu,
        }
    }

    pub fn unit(self) -> &'static str {
        match self {
            Metric::TokensPerSecondPerGpu => "tok/s/GPU",
            Metric::SecondsPerIteration => "s/iter",
            Metric::TflopsPerGpu => "TFLOP/s/GPU",
        }
    }
}

/// Outcome of one row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind", content = "reason")]
pub enum RowStatus {
    /// Projected.
    Ok,
    /// The model or GPU is not in the catalog.
    UnknownPreset(String),
    /// The layout breaks a legality rule.
    IllegalLayout(String),
    /// A field could not be read.
    BadRow(String),
}

/// One validated row.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RowResult {
    /// 1-based line number in the file (header = 1).
    pub line: usize,
    pub id: String,
    pub model: String,
    pub gpu: String,
    pub gpus: u32,
    /// Compact layout label.
    pub layout: String,
    pub metric: Metric,
    pub measured: Option<f64>,
    pub projected: Option<f64>,
    /// (projected - measured) / measured.
    pub error: Option<f64>,
    pub measured_tflops_per_gpu: Option<f64>,
    pub projected_tflops_per_gpu: Option<f64>,
    pub projected_tokens_per_second_per_gpu: Option<f64>,
    pub mfu: Option<f64>,
    /// What dominates the projected step.
    pub dominant: Option<String>,
    /// The memory model says the layout fits.
    pub fits: Option<bool>,
    /// Projected step breakdown (seconds).
    pub breakdown: Option<Breakdown>,
    /// Projected bubble fraction.
    pub bubble_fraction: Option<f64>,
    pub status: RowStatus,
    /// The model is a mixture of experts (the row counts in the MoE aggregate).
    pub moe: bool,
    /// Assumptions made for the row (e.g. the pipeline split).
    pub notes: Vec<String>,
}

/// Rows of one job that differ only in recomputation.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupResult {
    pub ids: Vec<String>,
    /// Ids from fastest to slowest, measured.
    pub measured_order: Vec<String>,
    /// Ids from fastest to slowest, projected.
    pub projected_order: Vec<String>,
    pub preserved: bool,
}

/// The whole validation.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub rows: Vec<RowResult>,
    pub projected: usize,
    pub failed: usize,
    /// Median of |error| over the projected rows.
    pub median_abs_error: Option<f64>,
    pub max_abs_error: Option<f64>,
    pub mean_abs_error: Option<f64>,
    pub groups: Vec<GroupResult>,
    pub rankings_preserved: bool,
    /// |error| over the dense rows.
    pub dense: Aggregate,
    /// |error| over the mixture-of-experts rows.
    pub moe: Aggregate,
    /// Spearman's rho of projected vs measured throughput within each model x GPU group.
    pub ranks: Vec<RankGroup>,
    /// The fitted MoE constants per GPU generation: the profiles' values and their refit on
    /// this file's MoE rows (empty with [`Options::refit`] off).
    pub generations: Vec<GenerationFit>,
    /// Every MoE row projected with its generation's constants refitted without its model's
    /// rows (leave one model out; empty with [`Options::refit`] off).
    pub held_out: Vec<HeldOut>,
    /// |error| of the held-out projections.
    pub held_out_moe: Aggregate,
    /// Rows identical in every configuration column, measured differently (one recipe in
    /// successive releases), widest first: see [`repeats`].
    pub repeats: Vec<Repeat>,
    /// The least maximum |error| any projection can have over the dense rows (the widest
    /// dense repeat's floor); `None` without dense repeats.
    pub dense_error_floor: Option<f64>,
    /// The same over the mixture-of-experts rows.
    pub moe_error_floor: Option<f64>,
}

/// What a validation computes beyond the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Refit the fitted MoE constants on the MoE rows and compute the leave-one-model-out
    /// figure (a few thousand projections).
    pub refit: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { refit: true }
    }
}

impl Report {
    /// Rows that could not be projected.
    pub fn failures(&self) -> impl Iterator<Item = &RowResult> {
        self.rows.iter().filter(|r| r.status != RowStatus::Ok)
    }
}

/// Validate CSV text against a catalog, with the refit and leave-one-model-out figure.
pub fn validate_text(text: &str, catalog: &Catalog) -> Result<Report, PlanError> {
    validate_text_with(text, catalog, Options::default())
}

/// Validate CSV text against a catalog.
pub fn validate_text_with(
    text: &str,
    catalog: &Catalog,
    options: Options,
) -> Result<Report, PlanError> {
    validate_texts(&[text], catalog, options)
}

/// Validate several CSV texts as one set: the rows of all of them, each file's ranking groups,
/// aggregates, rank correlations, refit and leave-one-model-out over all rows.
pub fn validate_texts(
    texts: &[&str],
    catalog: &Catalog,
    options: Options,
) -> Result<Report, PlanError> {
    let mut rows = Vec::new();
    let mut groups = Vec::new();
    let mut prepared = Vec::new();
    let mut keys = Vec::new();
    for text in texts {
        let file = read_rows(text, catalog)?;
        rows.extend(file.rows);
        groups.extend(file.groups);
        prepared.extend(file.prepared);
        keys.extend(file.keys);
    }
    let mut report = summarize(rows, groups, &keys);
    if options.refit {
        report.generations = fit::refit_all(&prepared);
        report.held_out = fit::leave_one_model_out(&prepared);
        report.held_out_moe = Aggregate::of(report.held_out.iter().map(|h| h.error));
    }
    Ok(report)
}

/// The mixture-of-experts rows of some CSV texts that project, ready to re-project (the
/// fitter's and the ablation's input).
pub fn moe_rows(texts: &[&str], catalog: &Catalog) -> Result<Vec<Prepared>, PlanError> {
    let mut prepared = Vec::new();
    for text in texts {
        prepared.extend(read_rows(text, catalog)?.prepared);
    }
    Ok(prepared)
}

/// One file's rows, their ranking groups, and the MoE rows the fitter re-projects.
struct FileRows {
    rows: Vec<RowResult>,
    groups: Vec<GroupResult>,
    prepared: Vec<Prepared>,
    /// Each row's configuration, in the order of `rows`.
    keys: Vec<repeats::ConfigKey>,
}

/// Read, check and project the rows of one CSV text.
fn read_rows(text: &str, catalog: &Catalog) -> Result<FileRows, PlanError> {
    let records = parse_csv(text).map_err(|m| PlanError::Syntax {
        source_name: "csv".into(),
        message: m,
    })?;
    let Some((_, header)) = records.first() else {
        return Err(PlanError::field("csv", "empty file: expected a header row"));
    };
    let header: Vec<String> = header.iter().map(|h| h.trim().to_string()).collect();
    for col in REQUIRED_COLUMNS {
        if !header.iter().any(|h| h == col) {
            return Err(PlanError::field(
                format!("csv.header.{col}"),
                "missing required column",
            ));
        }
    }
    let mut rows = Vec::new();
    let mut prepared = Vec::new();
    let mut keys = Vec::new();
    for (line, fields) in records.iter().skip(1) {
        keys.push(repeats::config_key(&header, fields));
        let mut cells = BTreeMap::new();
        for (i, h) in header.iter().enumerate() {
            cells.insert(h.as_str(), fields.get(i).map(String::as_str).unwrap_or(""));
        }
        let row = Row { line: *line, cells };
        let bad_width = fields.len() != header.len();
        let (mut result, p) = validate_row(&row, catalog, &header);
        if bad_width && result.status == RowStatus::Ok {
            result.notes.push(format!(
                "row has {} fields, the header {}",
                fields.len(),
                header.len()
            ));
        }
        if result.moe {
            prepared.extend(p);
        }
        rows.push(result);
    }
    let groups = ranking_groups(&rows, &records, &header);
    Ok(FileRows {
        rows,
        groups,
        prepared,
        keys,
    })
}

/// Validate a CSV file.
pub fn validate_file(path: &std::path::Path, catalog: &Catalog) -> Result<Report, PlanError> {
    validate_file_with(path, catalog, Options::default())
}

/// Validate a CSV file with options.
pub fn validate_file_with(
    path: &std::path::Path,
    catalog: &Catalog,
    options: Options,
) -> Result<Report, PlanError> {
    validate_files_with(&[path], catalog, options)
}

/// Validate several CSV files as one set (see [`validate_texts`]).
pub fn validate_files_with(
    paths: &[&std::path::Path],
    catalog: &Catalog,
    options: Options,
) -> Result<Report, PlanError> {
    let texts = read_texts(paths)?;
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    validate_texts(&refs, catalog, options)
}

/// The text of each file.
pub fn read_texts(paths: &[&std::path::Path]) -> Result<Vec<String>, PlanError> {
    paths
        .iter()
        .map(|path| crate::bounds::read_input(path, crate::bounds::limits::TABLE_BYTES))
        .collect()
}

fn empty_result(row: &Row, status: RowStatus) -> RowResult {
    RowResult {
        line: row.line,
        id: row.get("id").to_string(),
        model: row.get("model").to_string(),
        gpu: row.get("gpu").to_string(),
        gpus: row.get("gpus").parse().unwrap_or(0),
        layout: String::new(),
        metric: Metric::TokensPerSecondPerGpu,
        measured: None,
        projected: None,
        error: None,
        measured_tflops_per_gpu: measured_figure(
            row,
            "measuredTflopsPerGpu",
            limits::TFLOPS_PER_GPU,
            "TFLOP/s",
        )
        .ok(),
        projected_tflops_per_gpu: None,
        projected_tokens_per_second_per_gpu: None,
        mfu: None,
        dominant: None,
        fits: None,
        breakdown: None,
        bubble_fraction: None,
        status,
        moe: false,
        notes: Vec::new(),
    }
}

fn validate_row(row: &Row, catalog: &Catalog, header: &[String]) -> (RowResult, Option<Prepared>) {
    let bad = |m: String| (empty_result(row, RowStatus::BadRow(m)), None);
    if row.get("id").is_empty() {
        return bad("column id: empty".into());
    }
    let scenario = match row_scenario(row, catalog) {
        Ok(s) => s,
        Err(status) => return (empty_result(row, status), None),
    };
    let mut layout = match row_layout(row, header, scenario.model.moe.is_some()) {
        Ok(l) => l,
        Err(e) => return bad(e),
    };
    let mut defaults: Vec<String> = if scenario.model.moe.is_some() {
        row_moe_defaults(row)
            .into_iter()
            .map(|(col, v)| format!("{col}={v}"))
            .collect()
    } else {
        Vec::new()
    };
    if layout.fp8_recipe.is_none() && scenario.training.precision == Precision::Fp8 {
        layout.fp8_recipe = row_fp8_recipe(&scenario.hardware);
        if let Some(r) = layout.fp8_recipe {
            defaults.push(format!("fp8Recipe={}", r.as_str()));
        }
    }
    let (metric, measured) = match row_measurement(row) {
        Ok(m) => m,
        Err(e) => return bad(e),
    };
    let checked = check_with_balanced_split(row, &scenario, layout, true);
    let mut result = empty_result(row, RowStatus::Ok);
    result.moe = scenario.model.moe.is_some();
    result.layout = checked.layout.label();
    result.metric = metric;
    result.measured = Some(measured);
    if let Err(e) = checked.verdict {
        result.status = RowStatus::IllegalLayout(e.to_string());
        return (result, None);
    }
    let p: Projection = match projection::project(&scenario, &checked.layout) {
        Ok(p) => p,
        Err(e) => {
            result.status = RowStatus::IllegalLayout(e.to_string());
            return (result, None);
        }
    };
    let projected = metric.pick(
        p.tokens_per_second_per_gpu,
        p.step_time_seconds,
        p.tflops_per_gpu,
    );
    result.projected = Some(projected);
    result.error = Some((projected - measured) / measured);
    result.projected_tflops_per_gpu = Some(p.tflops_per_gpu);
    result.projected_tokens_per_second_per_gpu = Some(p.tokens_per_second_per_gpu);
    result.mfu = Some(p.mfu);
    result.dominant = Some(p.dominant.as_str().to_string());
    result.fits = Some(p.memory.fits);
    result.breakdown = Some(p.breakdown);
    result.bubble_fraction = Some(p.bubble_fraction);
    result.notes = checked.notes;
    if !defaults.is_empty() {
        result.notes.push(format!(
            "not written on the row, run as the published recipes do: {}",
            defaults.join(", ")
        ));
    }
    let prepared = Prepared {
        id: result.id.clone(),
        model: result.model.clone(),
        scenario,
        layout: checked.layout,
        metric,
        measured,
    };
    (result, Some(prepared))
}

/// Rows equal in every column but id, source, recompute, measurements and notes: the ranking
/// groups (full vs selective recompute of one job).
fn ranking_groups(
    rows: &[RowResult],
    records: &[(usize, Vec<String>)],
    header: &[String],
) -> Vec<GroupResult> {
    // Groups: rows equal in every column but id, source, recompute, measurements and notes.
    let ignore = [
        "id",
        "source",
        "recompute",
        "recomputeLayers",
        "recomputeLayerIds",
        "recomputeModules",
        "measuredTokensPerSecondPerGpu",
        "measuredTflopsPerGpu",
        "notes",
    ];
    let mut by_key: BTreeMap<Vec<String>, Vec<usize>> = BTreeMap::new();
    for (i, (_, fields)) in records.iter().skip(1).enumerate() {
        let key: Vec<String> = header
            .iter()
            .enumerate()
            .filter(|(_, h)| !ignore.contains(&h.as_str()))
            .map(|(j, _)| {
                fields
                    .get(j)
                    .map(|f| f.trim().to_string())
                    .unwrap_or_default()
            })
            .collect();
        by_key.entry(key).or_default().push(i);
    }
    let mut groups = Vec::new();
    for idx in by_key.values().filter(|v| v.len() > 1) {
        let members: Vec<&RowResult> = idx.iter().map(|&i| &rows[i]).collect();
        if members.iter().any(|r| r.projected.is_none()) {
            continue;
        }
        let order = |projected: bool| -> Vec<String> {
            let mut m: Vec<&&RowResult> = members.iter().collect();
            m.sort_by(|a, b| {
                stats::speed(b, projected)
                    .unwrap_or(0.0)
                    .total_cmp(&stats::speed(a, projected).unwrap_or(0.0))
            });
            m.iter().map(|r| r.id.clone()).collect()
        };
        let measured_order = order(false);
        let projected_order = order(true);
        groups.push(GroupResult {
            ids: members.iter().map(|r| r.id.clone()).collect(),
            preserved: measured_order == projected_order,
            measured_order,
            projected_order,
        });
    }
    groups
}

/// The report over all rows and their ranking groups.
fn summarize(
    rows: Vec<RowResult>,
    groups: Vec<GroupResult>,
    keys: &[repeats::ConfigKey],
) -> Report {
    let all = Aggregate::of(rows.iter().filter_map(|r| r.error));
    let projected = rows.iter().filter(|r| r.status == RowStatus::Ok).count();
    let errors = |moe: bool| {
        rows.iter()
            .filter(move |r| r.moe == moe)
            .filter_map(|r| r.error)
            .collect::<Vec<f64>>()
    };
    let (dense, moe) = (Aggregate::of(errors(false)), Aggregate::of(errors(true)));
    let ranks = stats::rank_groups(&rows);
    let repeats = repeats::repeats(&rows, keys);
    let floor = |moe: bool| widest_repeat(&repeats, moe).map(|r| r.error_floor);
    Report {
        dense_error_floor: floor(false),
        moe_error_floor: floor(true),
        repeats,
        dense,
        moe,
        ranks,
        generations: Vec::new(),
        held_out: Vec::new(),
        held_out_moe: Aggregate::default(),
        failed: rows.len() - projected,
        projected,
        median_abs_error: all.median_abs_error,
        max_abs_error: all.max_abs_error,
        mean_abs_error: all.mean_abs_error,
        rankings_preserved: groups.iter().all(|g| g.preserved),
        groups,
        rows,
    }
}
