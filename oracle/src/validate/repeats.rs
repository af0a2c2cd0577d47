//! Repeated configurations: rows identical in every configuration column of the validation
//! files (model, GPU, GPU count, batch, layout and every execution option: all columns but the
//! row's id, source, notes, quality and measurements) whose measurements differ. In the
//! published tables these are one configuration measured again in a later container release
//! (Megatron-Bridge's performance archive re-runs each recipe at every release).
//!
//! No projection can tell such rows apart, so they bound its accuracy from below: for two
//! measurements `a < b` of one configuration, any single projected value `p` has
//! `max(|p - a| / a, |p - b| / b) >= (b - a) / (a + b)`, with equality at `p = 2ab / (a + b)`
//! (the first term grows with `p`, the second falls, and they meet there). Over a group the
//! widest pair decides. The largest such floor over a file's rows is the smallest maximum
//! |error| any projection of those rows can have: a target below it cannot be met on them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Metric, RowResult};

/// Columns that are not configuration: which row it is, where it comes from, what was
/// measured, and what was said about it.
const NOT_CONFIGURATION: &[&str] = &[
    "id",
    "source",
    "notes",
    "quality",
    "excluded",
    "measuredTokensPerSecondPerGpu",
    "measuredTflopsPerGpu",
];

/// A row's configuration: its non-empty configuration cells by column name (files with
/// different column sets compare equal where one leaves a column out and the other leaves it
/// empty: both mean the column's default).
pub(super) type ConfigKey = Vec<(String, String)>;

/// The configuration of one row of a CSV file with `header`.
pub(super) fn config_key(header: &[String], fields: &[String]) -> ConfigKey {
    let mut key: ConfigKey = header
        .iter()
        .zip(fields)
        .filter(|(h, _)| !NOT_CONFIGURATION.contains(&h.as_str()))
        .map(|(h, f)| (h.clone(), f.trim().to_string()))
        .filter(|(_, f)| !f.is_empty())
        .collect();
    key.sort();
    key
}

/// Rows of one configuration measured more than once.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Repeat {
    /// The rows, in file order.
    pub ids: Vec<String>,
    pub model: String,
    pub gpu: String,
    pub gpus: u32,
    pub metric: Metric,
    pub moe: bool,
    /// Their measurements, in the order of `ids`.
    pub measured: Vec<f64>,
    /// (largest - smallest) / (largest + smallest): the least maximum |error| a projection can
    /// have over these rows.
    pub error_floor: f64,
}

/// `(max - min) / (max + min)` of some measurements; `None` for fewer than two or a value that
/// is not positive and finite.
pub fn error_floor(measured: &[f64]) -> Option<f64> {
    if measured.len() < 2 || measured.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
        return None;
    }
    let lo = measured.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = measured.iter().copied().fold(0.0, f64::max);
    Some((hi - lo) / (hi + lo))
}

/// The repeated configurations among the rows with an error (`keys[i]` is `rows[i]`'s
/// configuration), widest first.
pub(super) fn repeats(rows: &[RowResult], keys: &[ConfigKey]) -> Vec<Repeat> {
    let mut by_key: BTreeMap<(&str, &ConfigKey), Vec<&RowResult>> = BTreeMap::new();
    for (r, k) in rows.iter().zip(keys) {
        if r.error.is_some() && r.measured.is_some() {
            by_key.entry((r.metric.unit(), k)).or_default().push(r);
        }
    }
    let mut out: Vec<Repeat> = by_key
        .into_values()
        .filter(|members| members.len() > 1)
        .filter_map(|members| {
            let measured: Vec<f64> = members.iter().filter_map(|r| r.measured).collect();
            let first = members[0];
            Some(Repeat {
                error_floor: error_floor(&measured)?,
                ids: members.iter().map(|r| r.id.clone()).collect(),
                model: first.model.clone(),
                gpu: first.gpu.clone(),
                gpus: first.gpus,
                metric: first.metric,
                moe: first.moe,
                measured,
            })
        })
        .collect();
    out.sort_by(|a, b| {
        b.error_floor
            .total_cmp(&a.error_floor)
            .then_with(|| a.ids.cmp(&b.ids))
    });
    out
}

/// The widest repeat of one kind (dense or MoE): `repeats` are sorted widest first.
pub fn widest_repeat(repeats: &[Repeat], moe: bool) -> Option<&Repeat> {
    repeats.iter().find(|r| r.moe == moe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_is_met_at_the_harmonic_mean_and_nowhere_lower() {
        let (a, b) = (100.0, 150.0);
        let floor = error_floor(&[a, b]).unwrap();
        assert!((floor - 0.2).abs() < 1e-12, "{floor}");
        let worst = |p: f64| ((p - a) / a).abs().max(((p - b) / b).abs());
        let h = 2.0 * a * b / (a + b);
        assert!((worst(h) - floor).abs() < 1e-12);
        for i in 0..=200 {
            let p = 50.0 + i as f64;
            assert!(worst(p) >= floor - 1e-12, "p {p}: {}", worst(p));
        }
        // The widest pair of a group decides; one value or a bad one gives none.
        assert_eq!(error_floor(&[100.0, 120.0, 150.0]), Some(floor));
        assert_eq!(error_floor(&[100.0]), None);
        assert_eq!(error_floor(&[100.0, 0.0]), None);
        assert_eq!(error_floor(&[100.0, f64::NAN]), None);
    }

    #[test]
    fn keys_ignore_what_is_not_configuration_and_empty_cells() {
        let header: Vec<String> = ["id", "model", "tp", "notes", "measuredTflopsPerGpu", "vpp"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let row = |f: [&str; 6]| -> Vec<String> { f.iter().map(|s| s.to_string()).collect() };
        let a = config_key(&header, &row(["A", "m", "2", "x", "100", ""]));
        let b = config_key(&header, &row(["B", "m", " 2 ", "y", "150", ""]));
        let c = config_key(&header, &row(["C", "m", "2", "x", "100", "2"]));
        assert_eq!(a, b);
        assert_ne!(a, c);
        // A file without the column reads like one that leaves it empty.
        let short: Vec<String> = header[..5].to_vec();
        assert_eq!(
            config_key(&short, &row(["D", "m", "2", "z", "9", ""])[..5]),
            a
        );
    }
}
