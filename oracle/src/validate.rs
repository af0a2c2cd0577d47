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
//! does the same.
//!
//! Gradient precision: a row reduces gradients in BF16 unless a `gradReduceInFp32` column says
//! `true`. The published throughput tables come from performance recipes that all do
//! (NVIDIA NeMo `scripts/performance` sets `grad_reduce_in_fp32 = False`, Megatron-Bridge's
//! performance configs likewise), while a TrainingPlan's layout defaults to Megatron-LM's FP32
//! gradients with `--bf16`.

use std::collections::BTreeMap;

use serde::Serialize;

pub mod memory;

use crate::error::PlanError;
use crate::layout::Layout;
use crate::parse::from_value_at;
use crate::precision::Precision;
use crate::profiles::Catalog;
use crate::projection::{self, Breakdown, Projection};
use crate::scenario::{Cluster, Scenario, Training};

/// The columns every row must have.
pub const REQUIRED_COLUMNS: &[&str] = &[
    "id",
    "model",
    "gpu",
    "gpus",
    "gpusPerNode",
    "precision",
    "seqLength",
    "globalBatchSize",
    "microBatchSize",
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "etp",
    "recompute",
    "distributedOptimizer",
    "fsdp",
    "schedule",
    "measuredTokensPerSecondPerGpu",
];

/// Columns that describe the layout (`spec.parallelism` field names).
pub(crate) const LAYOUT_COLUMNS: &[&str] = &[
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "etp",
    "microBatchSize",
    "recompute",
    "recomputeLayers",
    "recomputeModules",
    "sequenceParallel",
    "distributedOptimizer",
    "fsdp",
    "schedule",
    "firstStageLayers",
    "lastStageLayers",
    "pipelineLayout",
    "tpCommOverlap",
    "overlapGradReduce",
    "overlapParamGather",
    "gradReduceInFp32",
    "attentionDropout",
    "hiddenDropout",
    "precisionAwareOptimizer",
    "mainGradsDtype",
    "mainParamsDtype",
    "expAvgDtype",
    "expAvgSqDtype",
    "optimizerCpuOffload",
    "optimizerOffloadFraction",
    "activationOffloadLayers",
    "fp8ParamGather",
    "expandableSegments",
];

/// Gradient precision of a row without a `gradReduceInFp32` cell: BF16, as the published
/// performance recipes run (see the module documentation).
const ROW_GRAD_REDUCE_IN_FP32: bool = false;

/// Dropout of a row without `attentionDropout` / `hiddenDropout` cells: none, as the published
/// recipes' models (Llama, Qwen, Mixtral, DeepSeek, gpt-oss, and NeMo's GPT-3 performance
/// configs) are built from Hugging Face configurations without dropout, while a TrainingPlan's
/// layout defaults to Megatron-LM's 0.1.
const ROW_DROPOUT: f64 = 0.0;

/// What a row is compared on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Metric {
    TokensPerSecondPerGpu,
    SecondsPerIteration,
}

impl Metric {
    pub fn unit(self) -> &'static str {
        match self {
            Metric::TokensPerSecondPerGpu => "tok/s/GPU",
            Metric::SecondsPerIteration => "s/iter",
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
}

impl Report {
    /// Rows that could not be projected.
    pub fn failures(&self) -> impl Iterator<Item = &RowResult> {
        self.rows.iter().filter(|r| r.status != RowStatus::Ok)
    }
}

/// Split CSV text into records (RFC 4180: quoted fields may hold commas, doubled quotes and
/// newlines). Returns (line number of the record's start, fields).
pub fn parse_csv(text: &str) -> Result<Vec<(usize, Vec<String>)>, String> {
    let mut records = Vec::new();
    let mut field = String::new();
    let mut fields = Vec::new();
    let mut line = 1usize;
    let mut start_line = 1usize;
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    let mut any = false;
    while let Some(ch) = chars.next() {
        any = true;
        if quoted {
            match ch {
                '"' if chars.peek() == Some(&'"') => {
                    chars.next();
                    field.push('"');
                }
                '"' => quoted = false,
                '\n' => {
                    line += 1;
                    field.push('\n');
                }
                c => field.push(c),
            }
            continue;
        }
        match ch {
            '"' if field.is_empty() => quoted = true,
            ',' => fields.push(std::mem::take(&mut field)),
            '\r' => {}
            '\n' => {
                fields.push(std::mem::take(&mut field));
                if !(fields.len() == 1 && fields[0].trim().is_empty()) {
                    records.push((start_line, std::mem::take(&mut fields)));
                } else {
                    fields.clear();
                }
                line += 1;
                start_line = line;
            }
            c => field.push(c),
        }
    }
    if quoted {
        return Err(format!("line {start_line}: unterminated quoted field"));
    }
    if any && (!field.is_empty() || !fields.is_empty()) {
        fields.push(field);
        if !(fields.len() == 1 && fields[0].trim().is_empty()) {
            records.push((start_line, fields));
        }
    }
    Ok(records)
}

/// Seconds per iteration from a note such as "1.42 s per iteration".
pub fn seconds_per_iteration(note: &str) -> Option<f64> {
    let lower = note.to_ascii_lowercase();
    let at = lower.find("s per iteration")?;
    let before = lower[..at].trim_end();
    let start = before
        .rfind(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|i| i + 1)
        .unwrap_or(0);
    before[start..].parse::<f64>().ok().filter(|v| *v > 0.0)
}

/// Megatron's `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`
/// split, written as a pipeline layout: the embedding and the loss (and each MTP layer) count
/// as one layer each, and the `layers + 2 + mtp` slots split evenly over the `pp * vpp`
/// virtual stages. `None` when they do not split evenly either.
pub fn embedding_and_loss_split(layers: u32, mtp: u32, pp: u32, vpp: u32) -> Option<String> {
    let stages = pp.max(1) * vpp.max(1);
    let slots = layers + mtp + 2;
    if stages < 2 || !slots.is_multiple_of(stages) {
        return None;
    }
    let per = slots / stages;
    let mut symbols = Vec::with_capacity(slots as usize);
    symbols.push('E');
    symbols.extend(std::iter::repeat_n('t', layers as usize));
    symbols.extend(std::iter::repeat_n('m', mtp as usize));
    symbols.push('L');
    let mut text = String::with_capacity(symbols.len() + stages as usize);
    for (i, chunk) in symbols.chunks(per as usize).enumerate() {
        if i > 0 {
            text.push('|');
        }
        text.extend(chunk.iter());
    }
    Some(text)
}

pub(crate) struct Row<'a> {
    pub(crate) line: usize,
    pub(crate) cells: BTreeMap<&'a str, &'a str>,
}

impl Row<'_> {
    pub(crate) fn get(&self, col: &str) -> &str {
        self.cells.get(col).map(|s| s.trim()).unwrap_or("")
    }

    pub(crate) fn num<T: std::str::FromStr>(&self, col: &str) -> Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        let v = self.get(col);
        v.parse::<T>()
            .map_err(|e| format!("column {col}: {v:?} is not a valid number ({e})"))
    }
}

/// Module names of a `+`-joined list (`layernorm+moe_act`), as the JSON list
/// `spec.parallelism.recomputeModules` takes (the layout's deserializer judges the names).
fn module_list(v: &str) -> serde_json::Value {
    serde_json::Value::Array(
        v.split('+')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(|w| serde_json::Value::String(w.to_string()))
            .collect(),
    )
}

/// Split a `recompute` cell: `selective(layernorm+moe_act)` is selective recompute with those
/// modules; other values pass through.
fn recompute_cell(v: &str) -> (&str, Option<serde_json::Value>) {
    match v
        .strip_prefix("selective(")
        .and_then(|rest| rest.strip_suffix(')'))
    {
        Some(list) => ("selective", Some(module_list(list))),
        None => (v, None),
    }
}

/// Turn a layout cell into the JSON value the `spec.parallelism` field expects.
fn layout_value(col: &str, v: &str) -> serde_json::Value {
    match col {
        "recomputeModules" => module_list(v),
        "recompute" | "schedule" | "pipelineLayout" => serde_json::Value::String(v.to_string()),
        _ => match v.to_ascii_lowercase().as_str() {
            "true" => serde_json::Value::Bool(true),
            "false" => serde_json::Value::Bool(false),
            _ => match (v.parse::<u64>(), v.parse::<f64>()) {
                (Ok(n), _) => serde_json::Value::from(n),
                (_, Ok(x)) if x.is_finite() => serde_json::Value::from(x),
                _ => serde_json::Value::String(v.to_string()),
            },
        },
    }
}

/// Validate CSV text against a catalog.
pub fn validate_text(text: &str, catalog: &Catalog) -> Result<Report, PlanError> {
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
    for (line, fields) in records.iter().skip(1) {
        let mut cells = BTreeMap::new();
        for (i, h) in header.iter().enumerate() {
            cells.insert(h.as_str(), fields.get(i).map(String::as_str).unwrap_or(""));
        }
        let row = Row { line: *line, cells };
        let bad_width = fields.len() != header.len();
        let mut result = validate_row(&row, catalog, &header);
        if bad_width && result.status == RowStatus::Ok {
            result.notes.push(format!(
                "row has {} fields, the header {}",
                fields.len(),
                header.len()
            ));
        }
        rows.push(result);
    }
    Ok(summarize(rows, &records, &header))
}

/// Validate a CSV file.
pub fn validate_file(path: &std::path::Path, catalog: &Catalog) -> Result<Report, PlanError> {
    let text = std::fs::read_to_string(path).map_err(|source| PlanError::Io {
        path: path.display().to_string(),
        source,
    })?;
    validate_text(&text, catalog)
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
        measured_tflops_per_gpu: row.get("measuredTflopsPerGpu").parse().ok(),
        projected_tflops_per_gpu: None,
        projected_tokens_per_second_per_gpu: None,
        mfu: None,
        dominant: None,
        fits: None,
        breakdown: None,
        bubble_fraction: None,
        status,
        notes: Vec::new(),
    }
}

fn validate_row(row: &Row, catalog: &Catalog, header: &[String]) -> RowResult {
    let bad = |m: String| empty_result(row, RowStatus::BadRow(m));
    if row.get("id").is_empty() {
        return bad("column id: empty".into());
    }
    let scenario = match row_scenario(row, catalog) {
        Ok(s) => s,
        Err(status) => return empty_result(row, status),
    };
    let layout = match row_layout(row, header) {
        Ok(l) => l,
        Err(e) => return bad(e),
    };
    let (metric, measured) = match row_measurement(row) {
        Ok(m) => m,
        Err(e) => return bad(e),
    };
    let checked = check_with_balanced_split(row, &scenario, layout);
    let mut result = empty_result(row, RowStatus::Ok);
    result.layout = checked.layout.label();
    result.metric = metric;
    result.measured = Some(measured);
    if let Err(e) = checked.verdict {
        result.status = RowStatus::IllegalLayout(e.to_string());
        return result;
    }
    let p: Projection = match projection::project(&scenario, &checked.layout) {
        Ok(p) => p,
        Err(e) => {
            result.status = RowStatus::IllegalLayout(e.to_string());
            return result;
        }
    };
    let projected = match metric {
        Metric::TokensPerSecondPerGpu => p.tokens_per_second_per_gpu,
        Metric::SecondsPerIteration => p.step_time_seconds,
    };
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
    result
}

/// A numeric column that must be greater than 0.
pub(crate) fn positive<T>(row: &Row, col: &str) -> Result<T, String>
where
    T: std::str::FromStr + PartialOrd + Default,
    T::Err: std::fmt::Display,
{
    match row.num::<T>(col) {
        Ok(v) if v > T::default() => Ok(v),
        Ok(_) => Err(format!("column {col}: must be greater than 0")),
        Err(e) => Err(e),
    }
}

/// The row's scenario: model and GPU from the catalog, cluster and training columns.
pub(crate) fn row_scenario(row: &Row, catalog: &Catalog) -> Result<Scenario, RowStatus> {
    let model = row.get("model");
    let Some(card) = catalog.model(model) else {
        return Err(RowStatus::UnknownPreset(format!(
            "unknown model preset {model:?}; known: {}",
            catalog.model_names().join(", ")
        )));
    };
    let gpu = row.get("gpu");
    let Some(hw) = catalog.hardware(gpu) else {
        return Err(RowStatus::UnknownPreset(format!(
            "unknown hardware profile {gpu:?}; known: {}",
            catalog.hardware_names().join(", ")
        )));
    };
    let bad = RowStatus::BadRow;
    let gpus: u32 = positive(row, "gpus").map_err(bad)?;
    let gpus_per_node: u32 = match row.get("gpusPerNode") {
        "" => hw.gpus_per_node,
        _ => positive(row, "gpusPerNode").map_err(bad)?,
    };
    let precision = match row.get("precision").to_ascii_lowercase().as_str() {
        "bf16" => Precision::Bf16,
        "fp8" => Precision::Fp8,
        other => {
            return Err(bad(format!(
                "column precision: {other:?} is not bf16 or fp8"
            )));
        }
    };
    let seq_length: u64 = positive(row, "seqLength").map_err(bad)?;
    let global_batch_size: u64 = positive(row, "globalBatchSize").map_err(bad)?;
    Ok(Scenario {
        model: card.clone(),
        hardware: hw.clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node,
        },
        training: Training {
            seq_length,
            global_batch_size,
            precision,
        },
    })
}

/// The row's layout, through the same deserializer as `spec.parallelism`.
pub(crate) fn row_layout(row: &Row, header: &[String]) -> Result<Layout, String> {
    let mut obj = serde_json::Map::new();
    for col in header {
        if LAYOUT_COLUMNS.contains(&col.as_str()) {
            let v = row.get(col);
            if col == "recompute" {
                let (granularity, modules) = recompute_cell(v);
                if let Some(m) = modules {
                    obj.insert("recomputeModules".into(), m);
                }
                if !granularity.is_empty() {
                    obj.insert(col.clone(), layout_value(col, granularity));
                }
            } else if !v.is_empty() {
                obj.insert(col.clone(), layout_value(col, v));
            }
        }
    }
    obj.entry("gradReduceInFp32")
        .or_insert(serde_json::Value::Bool(ROW_GRAD_REDUCE_IN_FP32));
    for col in ["attentionDropout", "hiddenDropout"] {
        obj.entry(col)
            .or_insert(serde_json::Value::from(ROW_DROPOUT));
    }
    from_value_at(serde_json::Value::Object(obj), "column").map_err(|e| e.to_string())
}

/// What was measured: tokens/s/GPU, else seconds per iteration from the notes.
fn row_measurement(row: &Row) -> Result<(Metric, f64), String> {
    match row.get("measuredTokensPerSecondPerGpu") {
        "" => match seconds_per_iteration(row.get("notes")) {
            Some(s) => Ok((Metric::SecondsPerIteration, s)),
            None => Err(
                "no measurement: measuredTokensPerSecondPerGpu is empty and notes give no \"<x> s per iteration\"".into(),
            ),
        },
        _ => match row.num::<f64>("measuredTokensPerSecondPerGpu") {
            Ok(v) if v > 0.0 => Ok((Metric::TokensPerSecondPerGpu, v)),
            Ok(_) => Err("column measuredTokensPerSecondPerGpu: must be positive".into()),
            Err(e) => Err(e),
        },
    }
}

/// A row's layout after the legality check, with the notes on what was adjusted.
pub(crate) struct CheckedLayout {
    pub(crate) layout: Layout,
    pub(crate) verdict: Result<(), crate::layout::LayoutError>,
    pub(crate) notes: Vec<String>,
}

/// Check the layout; when its layers do not split evenly over the stages and the row gives
/// no split of its own, retry with the embedding and the loss counted as one layer each.
pub(crate) fn check_with_balanced_split(
    row: &Row,
    scenario: &Scenario,
    layout: Layout,
) -> CheckedLayout {
    let card = &scenario.model;
    let mut notes = Vec::new();
    let explicit_split = ["pipelineLayout", "firstStageLayers", "lastStageLayers"]
        .iter()
        .any(|c| !row.get(c).is_empty());
    let verdict = layout.check(scenario);
    if let Err(e) = &verdict
        && e.rule == "pp-divides-layers"
        && !explicit_split
        && let Some(text) =
            embedding_and_loss_split(card.layers, card.mtp_layers, layout.pp, layout.vpp)
        && let Ok(pl) = crate::layout::PipelineLayout::parse(&text)
    {
        // The published recipes split such models with Megatron's
        // --account-for-embedding/loss-in-pipeline-split; the CSV has no column for it.
        let mut l2 = layout.clone();
        l2.pipeline_layout = Some(pl);
        if l2.check(scenario).is_ok() {
            notes.push(format!(
                "{} layers do not split evenly over pp*vpp = {}: embedding and loss counted as one layer each in the pipeline split",
                card.layers + card.mtp_layers,
                layout.pp * layout.vpp
            ));
            return CheckedLayout {
                layout: l2,
                verdict: Ok(()),
                notes,
            };
        }
    }
    CheckedLayout {
        layout,
        verdict,
        notes,
    }
}

/// Throughput of a row for ranking (higher is faster), measured or projected.
fn speed(r: &RowResult, projected: bool) -> Option<f64> {
    let v = if projected { r.projected } else { r.measured }?;
    Some(match r.metric {
        Metric::TokensPerSecondPerGpu => v,
        Metric::SecondsPerIteration => 1.0 / v,
    })
}

fn summarize(rows: Vec<RowResult>, records: &[(usize, Vec<String>)], header: &[String]) -> Report {
    let mut errors: Vec<f64> = rows.iter().filter_map(|r| r.error.map(f64::abs)).collect();
    errors.sort_by(|a, b| a.total_cmp(b));
    let median = if errors.is_empty() {
        None
    } else if errors.len() % 2 == 1 {
        Some(errors[errors.len() / 2])
    } else {
        Some((errors[errors.len() / 2 - 1] + errors[errors.len() / 2]) / 2.0)
    };
    let max = errors.last().copied();
    let mean = if errors.is_empty() {
        None
    } else {
        Some(errors.iter().sum::<f64>() / errors.len() as f64)
    };

    // Groups: rows equal in every column but id, source, recompute, measurements and notes.
    let ignore = [
        "id",
        "source",
        "recompute",
        "recomputeLayers",
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
                speed(b, projected)
                    .unwrap_or(0.0)
                    .total_cmp(&speed(a, projected).unwrap_or(0.0))
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
    let projected = rows.iter().filter(|r| r.status == RowStatus::Ok).count();
    Report {
        failed: rows.len() - projected,
        projected,
        median_abs_error: median,
        max_abs_error: max,
        mean_abs_error: mean,
        rankings_preserved: groups.iter().all(|g| g.preserved),
        groups,
        rows,
    }
}
