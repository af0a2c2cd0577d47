//! Aggregates of a validation: |error| over the dense rows and over the mixture-of-experts rows
//! separately, and how well the projection ranks the rows of one model on one GPU (Spearman's
//! rank correlation of projected against measured throughput within each model x GPU group).

use serde::Serialize;

use super::{Metric, RowResult};

/// Median, mean and maximum |error| of a set of rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Aggregate {
    /// Rows projected.
    pub rows: usize,
    pub median_abs_error: Option<f64>,
    pub mean_abs_error: Option<f64>,
    pub max_abs_error: Option<f64>,
}

impl Aggregate {
    /// The aggregate of some errors (signed; their absolute values are aggregated).
    pub fn of(errors: impl IntoIterator<Item = f64>) -> Aggregate {
        let mut e: Vec<f64> = errors.into_iter().map(f64::abs).collect();
        let Some(median) = median(&mut e) else {
            return Aggregate::default();
        };
        let n = e.len();
        Aggregate {
            rows: n,
            median_abs_error: Some(median),
            mean_abs_error: Some(e.iter().sum::<f64>() / n as f64),
            max_abs_error: e.last().copied(),
        }
    }
}

/// The median of some values (sorted in place); `None` when there are none.
pub(super) fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Spearman's rho of projected against measured throughput over the rows of one model on one
/// GPU kind.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RankGroup {
    pub model: String,
    pub gpu: String,
    /// The rows' metric (rows of one model and GPU published in different metrics are ranked
    /// separately).
    pub metric: Metric,
    pub rows: usize,
    /// None with fewer than 3 rows (a rank correlation of two points is always +-1).
    pub rho: Option<f64>,
}

/// Throughput of a row for ranking (higher is faster), measured or projected.
pub(super) fn speed(r: &RowResult, projected: bool) -> Option<f64> {
    let v = if projected { r.projected } else { r.measured }?;
    Some(match r.metric {
        Metric::TokensPerSecondPerGpu | Metric::TflopsPerGpu => v,
        Metric::SecondsPerIteration => 1.0 / v,
    })
}

/// Average ranks (1-based; ties share their mean rank).
fn ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|a, b| v[*a].total_cmp(&v[*b]));
    let mut r = vec![0.0; v.len()];
    let mut i = 0;
    while i < idx.len() {
        let mut j = i;
        while j + 1 < idx.len() && v[idx[j + 1]] == v[idx[i]] {
            j += 1;
        }
        let mean = (i + j) as f64 / 2.0 + 1.0;
        for k in &idx[i..=j] {
            r[*k] = mean;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation: Pearson's correlation of the ranks. None for fewer than 3
/// points or a constant series.
pub fn spearman(x: &[f64], y: &[f64]) -> Option<f64> {
    if x.len() != y.len() || x.len() < 3 {
        return None;
    }
    let (rx, ry) = (ranks(x), ranks(y));
    let n = rx.len() as f64;
    let (mx, my) = (rx.iter().sum::<f64>() / n, ry.iter().sum::<f64>() / n);
    let mut sxy = 0.0;
    let mut sxx = 0.0;
    let mut syy = 0.0;
    for (a, b) in rx.iter().zip(&ry) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    if sxx <= 0.0 || syy <= 0.0 {
        return None;
    }
    Some(sxy / (sxx * syy).sqrt())
}

/// Spearman's rho within each model x GPU group of projected rows, in a stable order.
pub(super) fn rank_groups(rows: &[RowResult]) -> Vec<RankGroup> {
    let mut keys: Vec<(String, String, Metric)> = Vec::new();
    for r in rows.iter().filter(|r| r.error.is_some()) {
        let k = (r.model.clone(), r.gpu.clone(), r.metric);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.sort_by(|a, b| (&a.0, &a.1, a.2.unit()).cmp(&(&b.0, &b.1, b.2.unit())));
    keys.into_iter()
        .map(|(model, gpu, metric)| {
            let members: Vec<&RowResult> = rows
                .iter()
                .filter(|r| {
                    r.error.is_some() && r.model == model && r.gpu == gpu && r.metric == metric
                })
                .collect();
            let m: Vec<f64> = members.iter().filter_map(|r| speed(r, false)).collect();
            let p: Vec<f64> = members.iter().filter_map(|r| speed(r, true)).collect();
            RankGroup {
                metric,
                rows: members.len(),
                rho: spearman(&m, &p),
                model,
                gpu,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spearman_of_known_series() {
        // Same order: +1; reversed: -1; one swap of five: 1 - 6*2/(5*24) = 0.9.
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(spearman(&x, &[10.0, 20.0, 30.0, 40.0, 50.0]), Some(1.0));
        assert_eq!(spearman(&x, &[5.0, 4.0, 3.0, 2.0, 1.0]), Some(-1.0));
        let r = spearman(&x, &[1.0, 2.0, 4.0, 3.0, 5.0]).unwrap();
        assert!((r - 0.9).abs() < 1e-12, "{r}");
        assert_eq!(spearman(&x[..2], &x[..2]), None);
        assert_eq!(spearman(&x[..3], &[1.0, 1.0, 1.0]), None);
    }

    #[test]
    fn aggregate_of_signed_errors() {
        let a = Aggregate::of([0.1, -0.3, 0.2, -0.05]);
        assert_eq!(a.rows, 4);
        assert!((a.median_abs_error.unwrap() - 0.15).abs() < 1e-12);
        assert_eq!(a.max_abs_error, Some(0.3));
        assert_eq!(Aggregate::of([]).median_abs_error, None);
    }

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&mut []), None);
    }
}
