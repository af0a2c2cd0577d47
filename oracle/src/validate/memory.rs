//! Validation of the memory model against measured peaks (`primus validate --memory FILE`):
//! one run per row (its full configuration, the framework, the measured peak as allocated,
//! reserved and/or device-used GiB, whether it ran or ran out of memory, and its source), the
//! predicted peak of the same metric, the signed error, and whether the verdict agrees — a run
//! that ran must not be denied (at most over usable within the error band, [`crate::memory::band`]),
//! a run that ran out of memory must be predicted over usable.
//!
//! A throughput CSV (`published.csv`, `extra.csv`) is read the same way: every row ran, none
//! gives a peak, so each is a "fits" row judged on the verdict alone.
//!
//! Columns beyond the throughput format (all optional, `oracle/tests/data/memory.csv` has them):
//! - `framework`: `megatron-lm`, `primus-megatron`, `megatron-bridge` (the Megatron family, whose
//!   rows gate the error) or `torchtitan` (reported separately); default `megatron-lm`;
//! - `outcome`: `ran` (default) or `oom`;
//! - `measuredPeakAllocatedGiB`, `measuredPeakReservedGiB`, `measuredPeakDeviceUsedGiB`,
//!   `measuredAllocatedAfterStepGiB`: GiB (2^30 bytes) of `max_memory_allocated`,
//!   `max_memory_reserved`, device-level used, and `memory_allocated` between iterations (the
//!   model state: weights, gradients, optimizer states, and the optimizer's FP32 gradient copy,
//!   which lives until the next step's `zero_grad`); the first given of reserved,
//!   allocated, device-used, after-step is the row's primary metric;
//! - `peakStage`: `max` (the largest over pipeline stages, default), `first` or `last` (the
//!   stage whose rank logged the number);
//! - `modelLayers`, `mtpLayers`: the run's layer counts where they differ from the model card;
//! - the layout's memory options (`attentionDropout`, `precisionAwareOptimizer`,
//!   `mainGradsDtype`, ..., `expandableSegments`; an empty `expandableSegments` is the
//!   framework's default);
//! - options the model does not have yet, each with the values it knows, so a row that needs
//!   one is reported (and kept out of the error gate) with the reason: `tokenDispatcher`
//!   (every value modelled: `alltoall`, `allgather`, and `deepep`, `primus-turbo-deepep`,
//!   `hybridep` with their buffers outside PyTorch's allocator, `memory::dispatcher`),
//!   `syncFreeMoeStage` (0, 1; 2, 3 preallocate worst-case buffers), `moeForceLoadBalancing`
//!   (`true`; `false` = real routing imbalance), `groupedGemm` (`legacy`; `turbo`),
//!   `ppAlgorithm` (Primus-pipeline schedules `zbb`, `zbv-formatted`, `v-half`, `v-min`).
//!   An unknown value is a bad row. (`recomputeLayerIds`, Primus' per-layer recompute list, is
//!   a layout column.)
//! - `cudaGraph`: the layout's words (`te(mlp)`, `local`, `full_iteration`; `memory::graphs`)
//!   or this set's `te-scoped` (Megatron-Bridge's MoE recipes' scopes,
//!   `te(attn+moe_router+moe_preprocess)`) and `full-iteration`; a Megatron-Bridge row with
//!   graphs captured at step 3 logged its peak before them, so its error stays out of the
//!   aggregates while its verdict counts;
//! - `source`, `measuredAsPublished`, `trust`, `notes`: where the number comes from and what was
//!   assumed.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    Row, RowStatus, check_with_balanced_split, figure, measured_figure, parse_csv, positive,
    row_layout, row_scenario,
};
use crate::error::PlanError;
use crate::hardware::{HardwareProfile, Vendor};
use crate::layout::{CudaGraphImpl, Layout};
use crate::memory::{self, Band, JobKind, MemoryReport, StageMemory, Verdict};
use crate::plan::DEFAULT_MEMORY_HEADROOM;
use crate::profiles::Catalog;
use crate::scenario::Scenario;
use crate::units::GIB;

pub mod ranks;

/// The columns every row must have (a throughput CSV has them too).
pub const REQUIRED_COLUMNS: &[&str] = &[
    "id",
    "model",
    "gpu",
    "gpus",
    "precision",
    "seqLength",
    "globalBatchSize",
    "microBatchSize",
    "tp",
    "pp",
];

/// The training framework of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Framework {
    MegatronLm,
    PrimusMegatron,
    MegatronBridge,
    #[serde(rename = "torchtitan")]
    TorchTitan,
}

impl Framework {
    pub const ALL: [Framework; 4] = [
        Framework::MegatronLm,
        Framework::PrimusMegatron,
        Framework::MegatronBridge,
        Framework::TorchTitan,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Framework::MegatronLm => "megatron-lm",
            Framework::PrimusMegatron => "primus-megatron",
            Framework::MegatronBridge => "megatron-bridge",
            Framework::TorchTitan => "torchtitan",
        }
    }

    pub fn parse(s: &str) -> Option<Framework> {
        Framework::ALL.into_iter().find(|f| f.as_str() == s)
    }

    /// Megatron-LM and the frameworks built on Megatron-Core: the jobs the webhook judges.
    pub fn megatron_family(self) -> bool {
        self != Framework::TorchTitan
    }

    /// Whether the framework's launcher turns on the allocator's expandable segments when the
    /// run does not say: TorchTitan's `run_train.sh` sets
    /// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; Megatron-Bridge's performance recipes
    /// and Slurm templates set it ("Most Slurm launch templates already include it",
    /// `skills/mbridge-perf-memory-tuning`); Megatron-LM and Primus set nothing (Primus' docs ask
    /// users to pass it, `docs/02-user-guide/megatron-lm-training.md`).
    pub fn default_expandable_segments(self) -> bool {
        matches!(self, Framework::TorchTitan | Framework::MegatronBridge)
    }
}

/// Whether the run ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ran,
    Oom,
}

/// What a measured peak is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PeakMetric {
    /// `torch.cuda.max_memory_allocated`.
    Allocated,
    /// `torch.cuda.max_memory_reserved`.
    Reserved,
    /// Device-level used memory (`mem_get_info`, `rocm-smi`, `nvidia-smi`).
    DeviceUsed,
    /// `torch.cuda.memory_allocated` between iterations, after the optimizer step: the model
    /// state (weights, gradients, optimizer states), activations freed.
    AfterStep,
}

impl PeakMetric {
    /// The CSV column of the metric.
    pub fn column(self) -> &'static str {
        match self {
            PeakMetric::Allocated => "measuredPeakAllocatedGiB",
            PeakMetric::Reserved => "measuredPeakReservedGiB",
            PeakMetric::DeviceUsed => "measuredPeakDeviceUsedGiB",
            PeakMetric::AfterStep => "measuredAllocatedAfterStepGiB",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PeakMetric::Allocated => "allocated",
            PeakMetric::Reserved => "reserved",
            PeakMetric::DeviceUsed => "device",
            PeakMetric::AfterStep => "after-step",
        }
    }

    /// The metric named by [`PeakMetric::as_str`].
    pub fn parse(s: &str) -> Option<PeakMetric> {
        Self::PRIORITY.into_iter().find(|m| m.as_str() == s)
    }

    /// The primary metric of a row is the first of these it gives.
    const PRIORITY: [PeakMetric; 4] = [
        PeakMetric::Reserved,
        PeakMetric::Allocated,
        PeakMetric::DeviceUsed,
        PeakMetric::AfterStep,
    ];

    /// The predicted value of this metric on one stage: allocated tensors, plus the allocator
    /// overhead, plus the communicator and dispatcher buffers and the runtime reserve.
    fn of(self, st: &StageMemory, runtime_reserve: f64) -> f64 {
        match self {
            PeakMetric::Allocated => st.allocated_bytes,
            PeakMetric::Reserved => st.reserved_bytes,
            PeakMetric::DeviceUsed => st.total_bytes + runtime_reserve,
            PeakMetric::AfterStep => {
                st.weights_bytes
                    + st.gradients_bytes
                    + st.optimizer_bytes
                    + st.step_grad_copy_bytes
                    + st.pipeline_inputs_bytes
            }
        }
    }
}

/// Which pipeline stage's number the row gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PeakStage {
    Max,
    First,
    Last,
}

/// One measured metric of a row against its prediction.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Measurement {
    pub metric: PeakMetric,
    pub measured_gib: f64,
    pub predicted_gib: f64,
    /// (predicted - measured) / measured.
    pub error: f64,
}

/// How the verdict compares with what happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Agreement {
    /// Ran and predicted to fit, or ran out of memory and predicted over usable.
    Agrees,
    /// Ran, predicted over usable within the band: admitted with a warning.
    Warned,
    /// Ran, but predicted over usable by more than the band: a false denial.
    FalseDenial,
    /// Ran out of memory, but predicted to fit.
    MissedOom,
}

/// One validated row.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRow {
    pub line: usize,
    pub id: String,
    pub framework: Framework,
    pub model: String,
    pub gpu: String,
    pub vendor: Option<Vendor>,
    pub gpus: u32,
    pub moe: bool,
    pub layout: String,
    pub outcome: Outcome,
    /// Every metric the row measured, the primary one first.
    pub measurements: Vec<Measurement>,
    /// Predicted peak total (reserved + communicator and dispatcher buffers) of the bottleneck
    /// stage, GiB.
    pub predicted_total_gib: Option<f64>,
    pub usable_gib: Option<f64>,
    /// The error band of the row's kind of job (Megatron-family rows).
    pub band: Option<Band>,
    pub verdict: Option<Verdict>,
    pub agreement: Option<Agreement>,
    /// An option the row's run used that the model does not have yet: the row's error is kept
    /// out of the aggregates and the gate, and a missed OOM is reported but not counted.
    pub needs_option: Option<String>,
    /// Why the row's measured peak is not the one the model predicts (it predates the
    /// CUDA graphs' capture): kept out of the error aggregates; its verdict counts.
    pub peak_not_compared: Option<String>,
    /// With fixed-size allocator segments, the predicted allocated peak times the worst
    /// fragmentation measured is over usable ([`memory::allocator::fixed_segments_at_risk`]):
    /// the webhook warns of it whatever the verdict.
    pub fixed_segments_at_risk: bool,
    pub status: RowStatus,
    pub notes: Vec<String>,
}

impl MemoryRow {
    /// The error of the row's primary metric.
    pub fn error(&self) -> Option<f64> {
        self.measurements.first().map(|m| m.error)
    }

    /// Counted in the error aggregates: projected, ran, measured, nothing excluded.
    pub fn counted(&self) -> bool {
        self.status == RowStatus::Ok
            && self.outcome == Outcome::Ran
            && self.needs_option.is_none()
            && self.peak_not_compared.is_none()
            && self.error().is_some()
    }

    /// Counted and Megatron-family: the rows the error gate and the band are measured on.
    pub fn gated(&self) -> bool {
        self.counted() && self.framework.megatron_family()
    }

    /// The kind of job of a gated row.
    pub fn kind(&self) -> JobKind {
        if self.moe {
            JobKind::MegatronMoe
        } else {
            JobKind::MegatronDense
        }
    }
}

/// Error statistics of a group of rows.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Aggregate {
    pub group: String,
    pub rows: usize,
    pub median_abs_error: Option<f64>,
    pub max_abs_error: Option<f64>,
    /// Mean signed error (positive: the model over-predicts).
    pub mean_error: Option<f64>,
}

impl Aggregate {
    /// Statistics of `errors`.
    pub fn of(group: impl Into<String>, errors: &[f64]) -> Aggregate {
        let mut abs: Vec<f64> = errors.iter().map(|e| e.abs()).collect();
        abs.sort_by(f64::total_cmp);
        let n = abs.len();
        let median = match n {
            0 => None,
            _ if n % 2 == 1 => Some(abs[n / 2]),
            _ => Some((abs[n / 2 - 1] + abs[n / 2]) / 2.0),
        };
        Aggregate {
            group: group.into(),
            rows: n,
            median_abs_error: median,
            max_abs_error: abs.last().copied(),
            mean_error: (n > 0).then(|| errors.iter().sum::<f64>() / n as f64),
        }
    }
}

/// The whole memory validation.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryValidation {
    pub rows: Vec<MemoryRow>,
    pub aggregates: Vec<Aggregate>,
    /// Ids of rows that ran but would be denied.
    pub false_denials: Vec<String>,
    /// Ids of rows that ran out of memory but are predicted to fit (rows that need an option the
    /// model does not have are reported per row, not here).
    pub missed_ooms: Vec<String>,
    /// Rows that could not be projected.
    pub failed: usize,
    /// Runs measured on every pipeline rank (`--ranks`), against the model's stages
    /// ([`ranks`]); absent when no rank file was given.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<ranks::RankSeries>,
}

impl MemoryValidation {
    /// The aggregate of a group by name.
    pub fn aggregate(&self, group: &str) -> Option<&Aggregate> {
        self.aggregates.iter().find(|a| a.group == group)
    }
}

/// Aggregate group names.
pub mod group {
    pub const MEGATRON: &str = "Megatron family";
    pub const MEGATRON_DENSE: &str = "Megatron family, dense";
    pub const MEGATRON_MOE: &str = "Megatron family, MoE";
    pub const MEGATRON_AMD: &str = "Megatron family, AMD";
    pub const MEGATRON_NVIDIA: &str = "Megatron family, NVIDIA";
    pub const OTHER: &str = "other frameworks (TorchTitan)";
}

/// Validate memory CSV text against a catalog.
pub fn validate_memory_text(text: &str, catalog: &Catalog) -> Result<MemoryValidation, PlanError> {
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
        let mut result = validate_row(&row, catalog, &header);
        if fields.len() != header.len() && result.status == RowStatus::Ok {
            result.status = RowStatus::BadRow(format!(
                "row has {} fields, the header {}",
                fields.len(),
                header.len()
            ));
        }
        rows.push(result);
    }
    Ok(summarize(rows))
}

/// The framework, outcome, stage and option cells of a row, read strictly.
struct RowMeta {
    framework: Framework,
    outcome: Outcome,
    stage: PeakStage,
    needs_option: Option<String>,
}

fn bad(row: &Row, status: RowStatus) -> MemoryRow {
    MemoryRow {
        line: row.line,
        id: row.get("id").to_string(),
        framework: Framework::parse(row.get("framework")).unwrap_or(Framework::MegatronLm),
        model: row.get("model").to_string(),
        gpu: row.get("gpu").to_string(),
        vendor: None,
        gpus: row.get("gpus").parse().unwrap_or(0),
        moe: false,
        layout: String::new(),
        outcome: Outcome::Ran,
        measurements: Vec::new(),
        predicted_total_gib: None,
        usable_gib: None,
        band: None,
        verdict: None,
        agreement: None,
        needs_option: None,
        peak_not_compared: None,
        fixed_segments_at_risk: false,
        status,
        notes: Vec::new(),
    }
}

/// One row as a job: what the webhook would be asked to admit.
#[derive(Debug, Clone)]
pub struct RowJob {
    pub id: String,
    pub framework: Framework,
    pub outcome: Outcome,
    pub needs_option: Option<String>,
    pub scenario: Scenario,
    /// The row's layout after the legality check (a balanced split where the row needs one).
    pub layout: Layout,
}

/// A row of a memory or throughput CSV that could not be made a job, and why (a field that
/// cannot be read, a model or GPU the catalog lacks, a layout that breaks a rule).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedRow {
    /// 1-based line number in the file (header = 1).
    pub line: usize,
    pub id: String,
    pub reason: String,
}

/// Every row of a memory or throughput CSV: those that can be projected as jobs, and those
/// that cannot, each with its reason, so that a walk over a file accounts for all of its rows.
#[derive(Debug, Clone, Default)]
pub struct RowJobs {
    pub jobs: Vec<RowJob>,
    pub skipped: Vec<SkippedRow>,
}

/// Every row of a memory or throughput CSV as a job, or as a skipped row with its reason
/// ([`validate_memory_text`] reports the same reasons per row).
pub fn row_jobs(text: &str, catalog: &Catalog) -> Result<RowJobs, PlanError> {
    let records = parse_csv(text).map_err(|m| PlanError::Syntax {
        source_name: "csv".into(),
        message: m,
    })?;
    let Some((_, header)) = records.first() else {
        return Err(PlanError::field("csv", "empty file: expected a header row"));
    };
    let header: Vec<String> = header.iter().map(|h| h.trim().to_string()).collect();
    let mut out = RowJobs::default();
    for (line, fields) in records.iter().skip(1) {
        let mut cells = BTreeMap::new();
        for (i, h) in header.iter().enumerate() {
            cells.insert(h.as_str(), fields.get(i).map(String::as_str).unwrap_or(""));
        }
        let row = Row { line: *line, cells };
        let skip = |reason: String| SkippedRow {
            line: row.line,
            id: row.get("id").to_string(),
            reason,
        };
        match row_job(&row, catalog, &header) {
            Ok((meta, scenario, checked)) => match checked.verdict {
                Ok(()) => out.jobs.push(RowJob {
                    id: row.get("id").to_string(),
                    framework: meta.framework,
                    outcome: meta.outcome,
                    needs_option: meta.needs_option,
                    scenario,
                    layout: checked.layout,
                }),
                Err(e) => out.skipped.push(skip(format!("illegal layout: {e}"))),
            },
            Err(status) => out.skipped.push(skip(status_reason(&status))),
        }
    }
    Ok(out)
}

/// A row status's reason in words.
fn status_reason(status: &RowStatus) -> String {
    match status {
        RowStatus::Ok => "projected".to_string(),
        RowStatus::UnknownPreset(m) => format!("unknown preset: {m}"),
        RowStatus::IllegalLayout(m) => format!("illegal layout: {m}"),
        RowStatus::BadRow(m) => format!("bad row: {m}"),
    }
}

/// A row's metadata, scenario and checked layout.
/// A row with this set's own words for the MoE execution options (`tokenDispatcher: deepep`,
/// `cudaGraph: te-scoped`, `groupedGemm: turbo`; see `needs_option`) put in the layout's
/// (`tokenDispatcher: flex` with `flexBackend: deepep`, which is Primus-Turbo's on AMD,
/// Primus-Turbo DeepEP with the fp32
/// router it requires, `cudaGraph: te(attn+moe_router+moe_preprocess)`, `groupedGemm:
/// grouped`); the throughput CSVs already
/// use the layout's words.
fn in_layout_words<'a>(row: &Row<'a>, amd: bool) -> Row<'a> {
    let mut cells = row.cells.clone();
    let dispatcher = match row.get("tokenDispatcher") {
        // DeepEP on AMD Instinct is Primus-Turbo's.
        "deepep" if amd => "primus-turbo-deepep",
        d => d,
    };
    if let Some(backend) = ["deepep", "primus-turbo-deepep", "hybridep"]
        .into_iter()
        .find(|b| *b == dispatcher)
    {
        cells.insert("tokenDispatcher", "flex");
        cells.insert("flexBackend", backend);
        if backend == "primus-turbo-deepep" && row.get("routerDtype").is_empty() {
            cells.insert("routerDtype", "fp32");
        }
    }
    match row.get("cudaGraph") {
        "te-scoped" => {
            // Megatron-Bridge's scoped graphs (its MoE recipes' cuda_graph_scope).
            cells.insert("cudaGraph", "te(attn+moe_router+moe_preprocess)");
        }
        "full-iteration" => {
            cells.insert("cudaGraph", "full_iteration");
        }
        _ => {}
    }
    if row.get("groupedGemm") == "turbo" {
        cells.insert("groupedGemm", "grouped");
    }
    // IDs the source does not list (`needs_option` keeps the row out of the gate): the row is
    // projected with its recomputeLayers stand-in.
    if !unlisted_ids(row.get("recomputeLayerIds")).is_empty() {
        cells.remove("recomputeLayerIds");
    }
    Row {
        line: row.line,
        cells,
    }
}

fn row_job(
    row: &Row,
    catalog: &Catalog,
    header: &[String],
) -> Result<(RowMeta, Scenario, super::CheckedLayout), RowStatus> {
    if row.get("id").is_empty() {
        return Err(RowStatus::BadRow("column id: empty".into()));
    }
    let meta = row_meta(row).map_err(RowStatus::BadRow)?;
    let scenario = row_scenario(row, catalog).and_then(|s| model_overrides(row, s))?;
    let amd = scenario.hardware.vendor == Vendor::Amd;
    let mut columns = header.to_vec();
    for c in ["flexBackend", "routerDtype"] {
        if !columns.iter().any(|h| h == c) {
            columns.push(c.to_string());
        }
    }
    let mut layout =
        row_layout(&in_layout_words(row, amd), &columns, false).map_err(RowStatus::BadRow)?;
    if row.get("expandableSegments").is_empty() {
        layout.expandable_segments = meta.framework.default_expandable_segments();
    }
    let checked =
        check_with_balanced_split(row, &scenario, layout, meta.framework.megatron_family());
    Ok((meta, scenario, checked))
}

fn validate_row(row: &Row, catalog: &Catalog, header: &[String]) -> MemoryRow {
    let (meta, scenario, checked) = match row_job(row, catalog, header) {
        Ok(j) => j,
        Err(status) => return bad(row, status),
    };
    let measured = match measured(row, &scenario.hardware) {
        Ok(m) => m,
        Err(e) => return bad(row, RowStatus::BadRow(e)),
    };
    let mut r = bad(row, RowStatus::Ok);
    r.framework = meta.framework;
    r.outcome = meta.outcome;
    r.needs_option = meta.needs_option;
    r.vendor = Some(scenario.hardware.vendor);
    r.moe = scenario.model.moe.is_some();
    r.layout = checked.layout.label();
    r.peak_not_compared = peak_predates_graphs(meta.framework, &checked.layout);
    r.notes = checked.notes;
    if let Err(e) = checked.verdict {
        r.status = RowStatus::IllegalLayout(e.to_string());
        return r;
    }
    judge(&mut r, &scenario, &checked.layout, meta.stage, &measured);
    r
}

/// Predict the row's metrics and judge its verdict.
fn judge(
    r: &mut MemoryRow,
    s: &Scenario,
    l: &Layout,
    stage: PeakStage,
    measured: &[(PeakMetric, f64)],
) {
    let report = memory::estimate(s, l);
    let reserve = s.hardware.overheads.runtime_reserve_gib * GIB;
    r.measurements = measured
        .iter()
        .map(|&(metric, gib)| {
            let predicted = predicted(&report, metric, stage, reserve) / GIB;
            Measurement {
                metric,
                measured_gib: gib,
                predicted_gib: predicted,
                error: (predicted - gib) / gib,
            }
        })
        .collect();
    r.predicted_total_gib = Some(report.peak_bytes / GIB);
    r.usable_gib = Some(report.usable_bytes / GIB);
    r.fixed_segments_at_risk = report.fixed_segments_at_risk(l);
    if !r.framework.megatron_family() {
        return;
    }
    let band = Band::of(s);
    let verdict = Verdict::of(
        report.peak_bytes,
        report.usable_bytes,
        DEFAULT_MEMORY_HEADROOM,
        &band,
    );
    r.band = Some(band);
    r.verdict = Some(verdict);
    let over = report.peak_bytes > report.usable_bytes;
    r.agreement = Some(match (r.outcome, verdict) {
        (Outcome::Oom, _) if over => Agreement::Agrees,
        (Outcome::Oom, _) => Agreement::MissedOom,
        (Outcome::Ran, Verdict::Exceeds) => Agreement::FalseDenial,
        (Outcome::Ran, Verdict::WithinBand) => Agreement::Warned,
        (Outcome::Ran, _) => Agreement::Agrees,
    });
}

/// The predicted value of `metric` at the row's stage.
fn predicted(report: &MemoryReport, metric: PeakMetric, stage: PeakStage, reserve: f64) -> f64 {
    let stages = &report.stages;
    match stage {
        PeakStage::Max => stages
            .iter()
            .map(|st| metric.of(st, reserve))
            .fold(0.0, f64::max),
        PeakStage::First => stages.first().map_or(0.0, |st| metric.of(st, reserve)),
        PeakStage::Last => stages.last().map_or(0.0, |st| metric.of(st, reserve)),
    }
}

/// The measured metrics of a row, the primary first.
fn measured(row: &Row, gpu: &HardwareProfile) -> Result<Vec<(PeakMetric, f64)>, String> {
    let mut out = Vec::new();
    for metric in PeakMetric::PRIORITY {
        let col = metric.column();
        if row.get(col).is_empty() {
            continue;
        }
        let v = measured_figure(row, col, f64::MAX, "GiB")?;
        // No run measures more memory than its GPU has.
        if v > gpu.memory_gib {
            return Err(format!(
                "column {col}: {} GiB is more than the {}'s {} GiB",
                figure(v),
                gpu.product,
                gpu.memory_gib
            ));
        }
        out.push((metric, v));
    }
    Ok(out)
}

/// The run's layer counts where they differ from the card (`modelLayers`, `mtpLayers`).
fn model_overrides(row: &Row, mut s: Scenario) -> Result<Scenario, RowStatus> {
    let bad = RowStatus::BadRow;
    if !row.get("modelLayers").is_empty() {
        let layers: u32 = positive(row, "modelLayers").map_err(bad)?;
        s.model.name = format!("{} ({layers} layers)", s.model.name);
        s.model.layers = layers;
    }
    if !row.get("mtpLayers").is_empty() {
        s.model.mtp_layers = row.num("mtpLayers").map_err(bad)?;
    }
    Ok(s)
}

/// One option cell: `Ok(None)` for a modelled value, `Ok(Some(reason))` for a known value the
/// model does not have yet, `Err` for an unknown value.
fn option_cell(
    row: &Row,
    col: &str,
    modelled: &[&str],
    needs: &[(&str, &str)],
) -> Result<Option<String>, String> {
    let v = row.get(col);
    if v.is_empty() || modelled.contains(&v) {
        return Ok(None);
    }
    match needs.iter().find(|(name, _)| *name == v) {
        Some((_, why)) => Ok(Some(format!("needs option {col}={v} ({why})"))),
        None => {
            let known: Vec<&str> = modelled
                .iter()
                .copied()
                .chain(needs.iter().map(|(n, _)| *n))
                .collect();
            Err(format!(
                "column {col}: {v:?} is not one of {}",
                known.join(", ")
            ))
        }
    }
}

/// Framework, outcome, stage, and the options that keep a row out of the gate.
fn row_meta(row: &Row) -> Result<RowMeta, String> {
    let framework = match row.get("framework") {
        "" => Framework::MegatronLm,
        f => Framework::parse(f).ok_or_else(|| {
            format!(
                "column framework: {f:?} is not one of {}",
                Framework::ALL.map(|f| f.as_str()).join(", ")
            )
        })?,
    };
    let outcome = match row.get("outcome") {
        "" | "ran" => Outcome::Ran,
        "oom" => Outcome::Oom,
        o => return Err(format!("column outcome: {o:?} is not ran or oom")),
    };
    let stage = match row.get("peakStage") {
        "" | "max" => PeakStage::Max,
        "first" => PeakStage::First,
        "last" => PeakStage::Last,
        o => return Err(format!("column peakStage: {o:?} is not max, first or last")),
    };
    let needs_option = needs_option(row)?;
    Ok(RowMeta {
        framework,
        outcome,
        stage,
        needs_option,
    })
}

/// Why a row's logged peak is not the one the model predicts for its layout's CUDA graphs, if
/// it is not: Megatron-Core captures Transformer Engine and full-iteration graphs at the start
/// of step `cuda_graph_warmup_steps` (3; `megatron/training/training.py`, Megatron-Bridge
/// `training/train.py`), and Megatron-Bridge logs memory once, after iteration 1 (2 since its
/// #3169, "to include optimizer state memory"), never resetting the peaks
/// (`training/utils/train_utils.py` `report_memory`): the logged peak is the eager run's,
/// possibly without the optimizer's states. The row's verdict still counts (its outcome is
/// the run's, graphs and all).
fn peak_predates_graphs(framework: Framework, l: &Layout) -> Option<String> {
    let captured_late = matches!(
        l.cuda_graph.implementation,
        CudaGraphImpl::TransformerEngine | CudaGraphImpl::FullIteration
    );
    (framework == Framework::MegatronBridge && captured_late).then(|| {
        "logged after iteration 1 or 2, before its CUDA graphs' capture at step 3 and \
         possibly before the optimizer's states (Megatron-Bridge #3169)"
            .to_string()
    })
}

/// The first option cell the model does not have yet (see the module documentation).
fn needs_option(row: &Row) -> Result<Option<String>, String> {
    // Every dispatcher is modelled, the fused ones' buffers outside PyTorch's allocator
    // included (`memory::dispatcher`); the cell is still checked for a known word.
    let dispatcher = option_cell(
        row,
        "tokenDispatcher",
        &[
            "alltoall",
            "allgather",
            "deepep",
            "primus-turbo-deepep",
            "hybridep",
            // The throughput CSVs' word (with `flexBackend`).
            "flex",
        ],
        &[],
    )?;
    let checks = [
        dispatcher,
        option_cell(
            row,
            "syncFreeMoeStage",
            &["0", "1"],
            &[
                ("2", "worst-case dispatch buffers; issue 16"),
                ("3", "worst-case dispatch buffers; issue 16"),
            ],
        )?,
        option_cell(
            row,
            "moeForceLoadBalancing",
            &["true"],
            // The model counts a rank's balanced share under any routing (the per-layer
            // busiest rank does not add up over the layers a stage keeps); the real-routing
            // runs it has (MB-M, Moonlight-16B) measure 13-15% more, not explained.
            &[("false", "real routing; issue 15")],
        )?,
        option_cell(
            row,
            "groupedGemm",
            &["legacy", "grouped", "sequential"],
            &[("turbo", "Primus-Turbo grouped-GEMM workspaces")],
        )?,
        option_cell(
            row,
            "ppAlgorithm",
            &[],
            &[
                ("zbb", "a Primus-pipeline schedule"),
                ("zbv-formatted", "a Primus-pipeline schedule"),
                ("v-half", "a Primus-pipeline schedule"),
                ("v-min", "a Primus-pipeline schedule"),
            ],
        )?,
    ];
    if let Some(reason) = checks.into_iter().flatten().next() {
        return Ok(Some(reason));
    }
    let ids = unlisted_ids(row.get("recomputeLayerIds"));
    if !ids.is_empty() {
        return Ok(Some(format!(
            "needs the recompute layer IDs, which the source does not list ({ids})"
        )));
    }
    Ok(None)
}

/// A `recomputeLayerIds` cell that is not a list of layer numbers (a description such as
/// `17 ids (not listed)`); empty for a list or an empty cell.
fn unlisted_ids(cell: &str) -> &str {
    if cell.split(',').all(|w| w.trim().parse::<u32>().is_ok()) {
        ""
    } else {
        cell
    }
}

/// Aggregates and the verdict lists.
fn summarize(rows: Vec<MemoryRow>) -> MemoryValidation {
    let errors = |keep: &dyn Fn(&MemoryRow) -> bool| -> Vec<f64> {
        rows.iter()
            .filter(|r| keep(r))
            .filter_map(MemoryRow::error)
            .collect()
    };
    let megatron = |r: &MemoryRow| r.gated();
    let aggregates = vec![
        Aggregate::of(group::MEGATRON, &errors(&megatron)),
        Aggregate::of(group::MEGATRON_DENSE, &errors(&|r| megatron(r) && !r.moe)),
        Aggregate::of(group::MEGATRON_MOE, &errors(&|r| megatron(r) && r.moe)),
        Aggregate::of(
            group::MEGATRON_AMD,
            &errors(&|r| megatron(r) && r.vendor == Some(Vendor::Amd)),
        ),
        Aggregate::of(
            group::MEGATRON_NVIDIA,
            &errors(&|r| megatron(r) && r.vendor == Some(Vendor::Nvidia)),
        ),
        Aggregate::of(
            group::OTHER,
            &errors(&|r| r.counted() && !r.framework.megatron_family()),
        ),
    ];
    let ids = |a: Agreement, all: bool| -> Vec<String> {
        rows.iter()
            .filter(|r| r.agreement == Some(a) && (all || r.needs_option.is_none()))
            .map(|r| r.id.clone())
            .collect()
    };
    MemoryValidation {
        false_denials: ids(Agreement::FalseDenial, true),
        missed_ooms: ids(Agreement::MissedOom, false),
        failed: rows.iter().filter(|r| r.status != RowStatus::Ok).count(),
        aggregates,
        rows,
        ranks: Vec::new(),
    }
}
