//! Reading a validation CSV: RFC 4180 records, the columns (required, layout, MoE execution
//! options), and one row's scenario, layout and measurement through the same deserializers as
//! a TrainingPlan's `spec`.

use std::collections::BTreeMap;

use super::{Metric, RowStatus};
use crate::backend::Fp8Recipe;
use crate::bounds::limits;
use crate::layout::Layout;
use crate::parse::from_value_at;
use crate::precision::Precision;
use crate::profiles::Catalog;
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
pub const LAYOUT_COLUMNS: &[&str] = &[
    "tp",
    "pp",
    "vpp",
    "cp",
    "ep",
    "etp",
    "microBatchSize",
    "recompute",
    "recomputeLayers",
    "recomputeLayerIds",
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
    "fsdpKind",
    "fp8Recipe",
    "cudaGraph",
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
    "offloadModules",
    "fp8ParamGather",
    "expandableSegments",
    "crossEntropyFusion",
];

/// Columns of the MoE execution options: the fields of `spec.parallelism.moe`.
pub const MOE_COLUMNS: &[&str] = &[
    "tokenDispatcher",
    "flexBackend",
    "groupedGemm",
    "permuteFusion",
    "routerFusion",
    "fusedGroupedMlp",
    "sharedExpertOverlap",
    "sharedExpertStreamPerLayer",
    "epOverlap",
    "delayWgrad",
    "loadBalancing",
    "forceLoadBalancing",
    "capacityFactor",
    "padToCapacity",
    "rankCapacityFactor",
    "routerDtype",
    "flexNumSms",
];

/// Gradient precision of a row without a `gradReduceInFp32` cell: BF16, as the published
/// performance recipes run (see the module documentation).
pub(super) const ROW_GRAD_REDUCE_IN_FP32: bool = false;

/// Dropout of a row without `attentionDropout` / `hiddenDropout` cells: none, as the published
/// recipes' models (Llama, Qwen, Mixtral, DeepSeek, gpt-oss, and NeMo's GPT-3 performance
/// configs) are built from Hugging Face configurations without dropout, while a TrainingPlan's
/// layout defaults to Megatron-LM's 0.1.
const ROW_DROPOUT: f64 = 0.0;

/// MoE execution options of a row whose cell (or column) is empty: what the published
/// performance recipes run, not Megatron-LM's bare defaults (allgather, sequential experts,
/// auxiliary-loss routing), which a TrainingPlan's layout keeps because a job without the
/// flags runs them. Of the 64 MoE rows with the options written out (published.csv,
/// extra.csv, moe.csv: Megatron-Bridge / NeMo performance recipes, Megatron-MoE-ModelZoo,
/// Primus), 60 use grouped experts, 58 fused permutation, 56 forced load balancing (NVIDIA's
/// performance tables set `moe_router_force_load_balancing`), and every one a token-routing
/// dispatcher (alltoall, or flex where the GPU's library runs it); alltoall needs no library.
/// A row from a table that lists only the parallel layout (shared/validation/published.csv's
/// columns) is projected as such a recipe.
const ROW_MOE_DEFAULTS: &[(&str, &str)] = &[
    ("tokenDispatcher", "alltoall"),
    ("groupedGemm", "grouped"),
    ("permuteFusion", "true"),
    ("forceLoadBalancing", "true"),
];

/// FP8 recipe of an FP8 row whose `fp8Recipe` cell (or column) is empty: the recipe the
/// published performance tables run on the row's GPU, not Megatron-LM's bare default (delayed
/// scaling), which a TrainingPlan's layout keeps because a job without the flag runs it.
/// NVIDIA's tables run MX block scaling on Blackwell ("FP8-MX": 103 of the 113 Blackwell FP8
/// MoE rows whose recipe is written out in published.csv, extra.csv, moe.csv and
/// moe-nongated.csv; the other ten are NeMo 25.0x rows) and per-tensor current scaling on
/// Hopper ("FP8-CS": all 14 Hopper ones); AMD's Primus rows name no recipe consistently (4
/// delayed, 4 current scaling), so they keep Megatron's default. None: the layout's default.
pub(super) fn row_fp8_recipe(hw: &crate::hardware::HardwareProfile) -> Option<Fp8Recipe> {
    if hw.vendor != crate::hardware::Vendor::Nvidia {
        return None;
    }
    Some(if hw.supports_fp8_recipe(Fp8Recipe::Mxfp8) {
        Fp8Recipe::Mxfp8
    } else {
        Fp8Recipe::Tensorwise
    })
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
    before[start..]
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v > 0.0 && *v <= limits::SECONDS_PER_ITERATION)
}

/// Megatron's `--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split`
/// split, written as a pipeline layout: the embedding and the loss (and each MTP layer) count
/// as one layer each, and the `layers + 2 + mtp` slots split evenly over the `pp * vpp`
/// virtual stages. `None` when they do not split evenly either.
pub fn embedding_and_loss_split(layers: u32, mtp: u32, pp: u32, vpp: u32) -> Option<String> {
    let slots = crate::layout::SplitSlots {
        embedding: true,
        loss: true,
        mtp: true,
    };
    crate::layout::even_split_layout(layers, mtp, pp.max(1) * vpp.max(1), slots)
}

/// The most even split of a run whose layers do not split evenly over its `pp * vpp` virtual
/// stages even with the embedding and the loss counted as one layer each: the embedding, the
/// decoder layers, the MTP layers and the loss, in model order, each taking a slot, the first
/// `slots % stages` stages one slot more than the others (so the loss's stage is the lighter,
/// as the published recipes' layouts make it). A published row names no layout while its run
/// had to set one (Megatron refuses an uneven split without it); this is the assumption, noted
/// on the row. `None` with fewer than two stages, fewer slots than stages, or MTP layers that
/// would leave the last stage (Megatron builds them there).
pub fn most_even_split(layers: u32, mtp: u32, pp: u32, vpp: u32) -> Option<String> {
    let stages = (pp.max(1) as usize).checked_mul(vpp.max(1) as usize)?;
    crate::layout::most_even_split_layout(layers, mtp, stages)
}

pub(super) struct Row<'a> {
    pub(super) line: usize,
    pub(super) cells: BTreeMap<&'a str, &'a str>,
}

impl Row<'_> {
    pub(super) fn get(&self, col: &str) -> &str {
        self.cells.get(col).map(|s| s.trim()).unwrap_or("")
    }

    pub(super) fn num<T: std::str::FromStr>(&self, col: &str) -> Result<T, String>
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

/// A `cudaGraph` cell: `none`, an implementation (`full_iteration`, `local`,
/// `transformer_engine`, or `te` for it) optionally with its capture modules in parentheses
/// joined by `+`, e.g. `te(attn+moe_router+moe_preprocess)`.
fn cuda_graph_cell(v: &str) -> serde_json::Value {
    let (name, modules) = match v.split_once('(') {
        Some((n, rest)) => (n, rest.strip_suffix(')').map(module_list)),
        None => (v, None),
    };
    let name = if name == "te" {
        "transformer_engine"
    } else {
        name
    };
    let mut obj = serde_json::Map::new();
    obj.insert("impl".into(), serde_json::Value::String(name.to_string()));
    if let Some(m) = modules {
        obj.insert("modules".into(), m);
    }
    serde_json::Value::Object(obj)
}

/// Turn a layout cell into the JSON value the `spec.parallelism` field expects.
fn layout_value(col: &str, v: &str) -> serde_json::Value {
    match col {
        "recomputeModules" | "offloadModules" => module_list(v),
        // Primus' layer-ID list, comma- or space-separated as it is written (`0,1,2`).
        "recomputeLayerIds" => serde_json::Value::Array(
            v.split([',', ' ', '+'])
                .map(str::trim)
                .filter(|w| !w.is_empty())
                .map(|w| match w.parse::<u64>() {
                    Ok(n) => serde_json::Value::from(n),
                    Err(_) => serde_json::Value::String(w.to_string()),
                })
                .collect(),
        ),
        "cudaGraph" => cuda_graph_cell(v),
        "capacityFactor" | "rankCapacityFactor" => v
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map(serde_json::Value::Number)
            .unwrap_or_else(|| serde_json::Value::String(v.to_string())),
        "recompute" | "schedule" | "pipelineLayout" | "tokenDispatcher" | "flexBackend"
        | "groupedGemm" | "loadBalancing" | "routerDtype" | "fp8Recipe" | "fsdpKind" => {
            serde_json::Value::String(v.to_string())
        }
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

/// A measured figure: a finite number greater than 0 and at most `max` (`unit` names it in
/// the error).
pub(super) fn measured_figure(row: &Row, col: &str, max: f64, unit: &str) -> Result<f64, String> {
    let v: f64 = row.num(col)?;
    if !v.is_finite() {
        return Err(format!(
            "column {col}: {:?} is not a finite number",
            row.get(col)
        ));
    }
    if v <= 0.0 {
        return Err(format!("column {col}: must be greater than 0"));
    }
    if v > max {
        return Err(format!(
            "column {col}: {} {unit} is beyond any real run (at most {})",
            figure(v),
            figure(max)
        ));
    }
    Ok(v)
}

/// A figure for a message: plain up to a million, in scientific notation beyond.
pub(super) fn figure(v: f64) -> String {
    if v.abs() < 1e6 {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// A numeric column that must be greater than 0.
pub(super) fn positive<T>(row: &Row, col: &str) -> Result<T, String>
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
pub(super) fn row_scenario(row: &Row, catalog: &Catalog) -> Result<Scenario, RowStatus> {
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
    let mut card = card.clone();
    // A run without the card's multi-token-prediction layers (`mtp_num_layers 0`).
    if !row.get("mtpLayers").is_empty() {
        let mtp: u32 = row.num("mtpLayers").map_err(bad)?;
        if mtp > card.mtp_layers {
            return Err(bad(format!(
                "column mtpLayers: {mtp} exceeds the card's {} MTP layers",
                card.mtp_layers
            )));
        }
        card.mtp_layers = mtp;
    }
    Ok(Scenario {
        model: card,
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

/// The [`ROW_MOE_DEFAULTS`] a MoE model's row runs because its cell (or column) is empty: the
/// ones [`row_layout`] applies and the row's note names, so a default is never silent.
pub(super) fn row_moe_defaults<'a>(row: &Row) -> Vec<&'a (&'static str, &'static str)> {
    ROW_MOE_DEFAULTS
        .iter()
        .filter(|(col, _)| row.get(col).is_empty())
        .collect()
}

/// The row's layout, through the same deserializer as `spec.parallelism`.
/// A row's layout; `recipe_moe`: a MoE model's row whose MoE option cells are empty runs
/// [`ROW_MOE_DEFAULTS`].
pub(super) fn row_layout(row: &Row, header: &[String], recipe_moe: bool) -> Result<Layout, String> {
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
    let mut moe = serde_json::Map::new();
    for col in header {
        let v = row.get(col);
        if MOE_COLUMNS.contains(&col.as_str()) && !v.is_empty() {
            moe.insert(col.clone(), layout_value(col, v));
        }
    }
    if recipe_moe {
        for (col, v) in row_moe_defaults(row) {
            moe.insert((*col).into(), layout_value(col, v));
        }
    }
    if !moe.is_empty() {
        obj.insert("moe".into(), serde_json::Value::Object(moe));
    }
    obj.entry("gradReduceInFp32")
        .or_insert(serde_json::Value::Bool(ROW_GRAD_REDUCE_IN_FP32));
    for col in ["attentionDropout", "hiddenDropout"] {
        obj.entry(col)
            .or_insert(serde_json::Value::from(ROW_DROPOUT));
    }
    from_value_at(serde_json::Value::Object(obj), "column").map_err(|e| e.to_string())
}

/// What was measured: tokens/s/GPU, else seconds per iteration from the notes, else model
/// TFLOP/s per GPU.
pub(super) fn row_measurement(row: &Row) -> Result<(Metric, f64), String> {
    match row.get("measuredTokensPerSecondPerGpu") {
        "" => match seconds_per_iteration(row.get("notes")) {
            Some(s) => Ok((Metric::SecondsPerIteration, s)),
            None => match row.get("measuredTflopsPerGpu") {
                "" => Err(
                    "no measurement: measuredTokensPerSecondPerGpu and measuredTflopsPerGpu are empty and notes give no \"<x> s per iteration\"".into(),
                ),
                _ => measured_figure(row, "measuredTflopsPerGpu", limits::TFLOPS_PER_GPU, "TFLOP/s")
                    .map(|v| (Metric::TflopsPerGpu, v)),
            },
        },
        _ => measured_figure(
            row,
            "measuredTokensPerSecondPerGpu",
            limits::TOKENS_PER_SECOND_PER_GPU,
            "tokens/s",
        )
        .map(|v| (Metric::TokensPerSecondPerGpu, v)),
    }
}

/// A row's layout after the legality check, with the notes on what was adjusted.
pub(super) struct CheckedLayout {
    pub(super) layout: Layout,
    pub(super) verdict: Result<(), crate::layout::LayoutError>,
    pub(super) notes: Vec<String>,
}

/// Check the layout; when its layers do not split evenly over the stages and the row gives
/// no split of its own, retry with the embedding and the loss counted as one layer each, and
/// failing that with the most even split ([`most_even_split`]).
///
/// With `infer_fsdp` (a Megatron-family row), a row with `fsdp` and no `fsdpKind` cell whose
/// layout only Megatron-FSDP runs (expert or pipeline parallelism, or tied embeddings: torch
/// FSDP2 refuses each in Megatron-LM's `arguments.py`) is projected as Megatron-FSDP, noted:
/// the published run ran, so it was not torch FSDP2.
pub(super) fn check_with_balanced_split(
    row: &Row,
    scenario: &Scenario,
    mut layout: Layout,
    infer_fsdp: bool,
) -> CheckedLayout {
    let card = &scenario.model;
    let mut notes = Vec::new();
    if infer_fsdp
        && layout.fsdp
        && row.get("fsdpKind").is_empty()
        && layout.fsdp_kind == crate::layout::FsdpKind::Torch
        && (layout.ep > 1 || layout.pp > 1 || card.tied_embeddings)
    {
        layout.fsdp_kind = crate::layout::FsdpKind::Megatron;
        notes.push(
            "FSDP with expert or pipeline parallelism or tied embeddings runs only as Megatron-FSDP in Megatron-LM (torch FSDP2 refuses it); the row names no FSDP kind, so Megatron-FSDP is assumed"
                .to_string(),
        );
    }
    let explicit_split = ["pipelineLayout", "firstStageLayers", "lastStageLayers"]
        .iter()
        .any(|c| !row.get(c).is_empty());
    let verdict = layout.check(scenario);
    let even = embedding_and_loss_split(card.layers, card.mtp_layers, layout.pp, layout.vpp);
    let most_even = even.is_none();
    if let Err(e) = &verdict
        && e.rule == "pp-divides-layers"
        && !explicit_split
        && let Some(text) =
            even.or_else(|| most_even_split(card.layers, card.mtp_layers, layout.pp, layout.vpp))
        && let Ok(pl) = crate::layout::PipelineLayout::parse(&text)
    {
        // The published recipes split such models with Megatron's
        // --account-for-embedding/loss-in-pipeline-split; the CSV has no column for it.
        let mut l2 = layout.clone();
        l2.pipeline_layout = Some(pl);
        let again = l2.check(scenario);
        if let Err(e) = again {
            // Split fixed, another rule broken: that is the row's verdict.
            return CheckedLayout {
                layout: l2,
                verdict: Err(e),
                notes,
            };
        }
        {
            notes.push(if most_even {
                format!(
                    "{} layers do not split evenly over pp*vpp = {}, not even with embedding and loss counted as one layer each: the row names no layout, so the most even one is assumed ({})",
                    card.layers + card.mtp_layers,
                    layout.pp * layout.vpp,
                    text
                )
            } else {
                format!(
                    "{} layers do not split evenly over pp*vpp = {}: embedding and loss counted as one layer each in the pipeline split",
                    card.layers + card.mtp_layers,
                    layout.pp * layout.vpp
                )
            });
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
