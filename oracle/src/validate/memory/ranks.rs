//! Per-pipeline-rank memory (`primus validate --memory FILE --ranks RANKS`): the model's
//! per-stage prediction against a peak measured on every pipeline rank of one run of the memory
//! set. A row of the memory set compares one number per run, the largest over its ranks; a
//! series of ranks checks the shape under it: how the peak falls from the first pipeline rank,
//! which holds the most in-flight micro-batches, to the last, and whether what the model misses
//! is the same on every rank or grows with the ranks' activations.
//!
//! The file (`oracle/tests/data/memory-ranks.csv`) has one measured rank per row:
//! - `id`: the run's id in the memory set, whose configuration the series uses;
//! - `rank`: the pipeline rank, 0 to pp - 1, each once per series;
//! - `metric`: `reserved`, `allocated`, `device` or `after-step` (as the memory set's columns);
//! - `measuredPercent`: the peak in percent of the GPU's memory (`memoryGib` of its profile),
//!   as the per-rank charts publish it;
//! - `source`, `read`: where the number comes from and how it was read.
//!
//! Per series: each rank's measured and predicted GiB, Spearman's rho of the two over the ranks,
//! and the least-squares line measured = offset + slope x predicted. A slope near 1 says the
//! per-stage accounting (in-flight micro-batches, the stage's layers and their recomputation,
//! its model state) scales as measured; the offset is what the model misses on every rank. A
//! series whose run needs an option the model lacks (its memory-set row's `needs_option`) is
//! reported with the reason and left out of the checks.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{PeakMetric, RowJob, row_jobs};
use crate::error::PlanError;
use crate::memory;
use crate::profiles::Catalog;
use crate::units::GIB;
use crate::validate::stats::median;
use crate::validate::{parse_csv, spearman};

/// The columns a rank file must have.
pub const RANK_COLUMNS: &[&str] = &["id", "rank", "metric", "measuredPercent"];

/// One pipeline rank of a series.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RankPoint {
    pub rank: u32,
    /// The stage's decoder layers and in-flight micro-batches in the model.
    pub layers: u32,
    pub inflight_microbatches: u32,
    pub measured_gib: f64,
    pub predicted_gib: f64,
}

/// One run measured on every pipeline rank.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RankSeries {
    pub id: String,
    pub layout: String,
    pub metric: PeakMetric,
    pub source: String,
    pub points: Vec<RankPoint>,
    /// Spearman's rho of measured and predicted over the ranks.
    pub spearman: Option<f64>,
    /// Least-squares slope of measured against predicted over the ranks.
    pub slope: Option<f64>,
    /// Least-squares offset (GiB): measured = offset + slope x predicted.
    pub offset_gib: Option<f64>,
    /// Median over the ranks of measured minus predicted (GiB).
    pub median_difference_gib: Option<f64>,
    /// Why the series is left out of the checks (the run needs an option the model lacks).
    pub not_compared: Option<String>,
}

/// Least-squares line y = offset + slope x; None for fewer than 2 points or a constant x.
pub fn line_fit(x: &[f64], y: &[f64]) -> Option<(f64, f64)> {
    if x.len() != y.len() || x.len() < 2 {
        return None;
    }
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let sxx: f64 = x.iter().map(|a| (a - mx) * (a - mx)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = x.iter().zip(y).map(|(a, b)| (a - mx) * (b - my)).sum();
    let slope = sxy / sxx;
    Some((my - slope * mx, slope))
}

fn bad(line: usize, message: String) -> PlanError {
    PlanError::field(format!("ranks.line{line}"), message)
}

/// One series' measured ranks as read: (rank, percent) by rank, the metric, the source.
#[derive(Debug)]
struct Measured {
    metric: PeakMetric,
    source: String,
    ranks: BTreeMap<u32, f64>,
}

/// Read the rank file: every row checked, every series' ranks unique.
fn read_ranks(text: &str) -> Result<BTreeMap<String, Measured>, PlanError> {
    let records = parse_csv(text).map_err(|m| PlanError::Syntax {
        source_name: "ranks csv".into(),
        message: m,
    })?;
    let Some((_, header)) = records.first() else {
        return Err(PlanError::field(
            "ranks",
            "empty file: expected a header row",
        ));
    };
    let header: Vec<String> = header.iter().map(|h| h.trim().to_string()).collect();
    for col in RANK_COLUMNS {
        if !header.iter().any(|h| h == col) {
            return Err(PlanError::field(
                format!("ranks.header.{col}"),
                "missing required column",
            ));
        }
    }
    let at = |name: &str| header.iter().position(|h| h == name);
    let mut out: BTreeMap<String, Measured> = BTreeMap::new();
    for (line, fields) in records.iter().skip(1) {
        let line = *line;
        if fields.len() != header.len() {
            return Err(bad(
                line,
                format!(
                    "row has {} fields, the header {}",
                    fields.len(),
                    header.len()
                ),
            ));
        }
        let cell = |name: &str| at(name).map_or("", |i| fields[i].trim());
        let id = cell("id");
        if id.is_empty() {
            return Err(bad(line, "column id: empty".into()));
        }
        let rank: u32 = cell("rank").parse().map_err(|_| {
            bad(
                line,
                format!("column rank: {:?} is not a pipeline rank", cell("rank")),
            )
        })?;
        let metric = PeakMetric::parse(cell("metric")).ok_or_else(|| {
            bad(
                line,
                format!(
                    "column metric: {:?} is none of reserved, allocated, device, after-step",
                    cell("metric")
                ),
            )
        })?;
        let percent: f64 = cell("measuredPercent")
            .parse()
            .ok()
            .filter(|p: &f64| p.is_finite() && (0.0..=100.0).contains(p))
            .ok_or_else(|| {
                bad(
                    line,
                    format!(
                        "column measuredPercent: {:?} is not a percentage from 0 to 100",
                        cell("measuredPercent")
                    ),
                )
            })?;
        let series = out.entry(id.to_string()).or_insert_with(|| Measured {
            metric,
            source: cell("source").to_string(),
            ranks: BTreeMap::new(),
        });
        if series.metric != metric {
            return Err(bad(
                line,
                format!(
                    "series {id}: metric {} after {}",
                    metric.as_str(),
                    series.metric.as_str()
                ),
            ));
        }
        if series.ranks.insert(rank, percent).is_some() {
            return Err(bad(line, format!("series {id}: rank {rank} given twice")));
        }
    }
    Ok(out)
}

/// Compare one series with the model's stages of its run.
fn series(id: &str, m: &Measured, job: &RowJob) -> Result<RankSeries, PlanError> {
    let report = memory::estimate(&job.scenario, &job.layout);
    let pp = report.stages.len();
    let expected: Vec<u32> = (0..pp as u32).collect();
    let given: Vec<u32> = m.ranks.keys().copied().collect();
    if given != expected {
        return Err(PlanError::field(
            format!("ranks.{id}"),
            format!(
                "the series gives ranks {given:?}; its run has pipeline ranks 0 to {}",
                pp.saturating_sub(1)
            ),
        ));
    }
    let capacity = job.scenario.hardware.memory_gib;
    let reserve = job.scenario.hardware.overheads.runtime_reserve_gib * GIB;
    let points: Vec<RankPoint> = report
        .stages
        .iter()
        .zip(m.ranks.values())
        .enumerate()
        .map(|(rank, (st, percent))| RankPoint {
            rank: rank as u32,
            layers: st.layers,
            inflight_microbatches: st.inflight_microbatches,
            measured_gib: percent / 100.0 * capacity,
            predicted_gib: m.metric.of(st, reserve) / GIB,
        })
        .collect();
    let measured: Vec<f64> = points.iter().map(|p| p.measured_gib).collect();
    let predicted: Vec<f64> = points.iter().map(|p| p.predicted_gib).collect();
    let fit = line_fit(&predicted, &measured);
    Ok(RankSeries {
        id: id.to_string(),
        layout: job.layout.label(),
        metric: m.metric,
        source: m.source.clone(),
        spearman: spearman(&predicted, &measured),
        slope: fit.map(|f| f.1),
        offset_gib: fit.map(|f| f.0),
        median_difference_gib: median(
            &mut measured
                .iter()
                .zip(&predicted)
                .map(|(a, b)| a - b)
                .collect::<Vec<_>>(),
        ),
        not_compared: job.needs_option.clone(),
        points,
    })
}

/// Every series of a rank file against the runs of the memory set (`memory_text`): a series
/// whose id is no run of the set, or whose ranks are not exactly its run's pipeline ranks, is an
/// error.
pub fn validate_ranks_text(
    memory_text: &str,
    ranks_text: &str,
    catalog: &Catalog,
) -> Result<Vec<RankSeries>, PlanError> {
    let measured = read_ranks(ranks_text)?;
    let jobs = row_jobs(memory_text, catalog)?;
    measured
        .iter()
        .map(|(id, m)| {
            let job = jobs.jobs.iter().find(|j| &j.id == id).ok_or_else(|| {
                let why = jobs
                    .skipped
                    .iter()
                    .find(|s| &s.id == id)
                    .map_or("no run of the memory set has this id".to_string(), |s| {
                        format!("its run is not projected: {}", s.reason)
                    });
                PlanError::field(format!("ranks.{id}"), why)
            })?;
            series(id, m, job)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_fit_recovers_a_line() {
        // y = 10 + 2x exactly.
        let x = [1.0, 2.0, 4.0, 8.0];
        let y: Vec<f64> = x.iter().map(|v| 10.0 + 2.0 * v).collect();
        let (offset, slope) = line_fit(&x, &y).unwrap();
        assert!((offset - 10.0).abs() < 1e-12 && (slope - 2.0).abs() < 1e-12);
        assert!(line_fit(&[3.0, 3.0], &[1.0, 2.0]).is_none());
        assert!(line_fit(&[1.0], &[1.0]).is_none());
    }

    #[test]
    fn hostile_rank_files_are_refused() {
        let head = "id,rank,metric,measuredPercent\n";
        for (body, needle) in [
            ("X,0,reserved,101\n", "percentage"),
            ("X,0,reserved,NaN\n", "percentage"),
            ("X,-1,reserved,50\n", "pipeline rank"),
            ("X,0,peak,50\n", "metric"),
            ("X,0,reserved,50\nX,0,reserved,51\n", "twice"),
            ("X,0,reserved,50\nX,1,allocated,51\n", "after"),
            (",0,reserved,50\n", "empty"),
            ("X,0,reserved\n", "fields"),
        ] {
            let err = read_ranks(&format!("{head}{body}")).expect_err(body);
            assert!(err.to_string().contains(needle), "{body}: {err}");
        }
        let err = read_ranks("id,rank,metric\n").err().unwrap();
        assert!(err.to_string().contains("measuredPercent"), "{err}");
    }
}
