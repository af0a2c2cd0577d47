//! The fitted constants of the MoE time model, and the leave-one-model-out figure.
//!
//! A handful of hardware-profile constants are fitted on the mixture-of-experts rows, never
//! per row: per GPU generation ([`GENERATIONS`]: the profiles of one generation share their
//! values), the host cost of a framework call (`efficiency.cpuLaunchUs`) and of a
//! library-launched kernel (`efficiency.libraryLaunchUs`), the fraction of the paired
//! micro-batch's computation the EP overlap hides communication behind (`efficiency.epOverlap`),
//! and the link-bandwidth fractions of the flex dispatch libraries the profiles list
//! (`flexBackends[].scaleUp`, `scaleOut`). [`fit`] reproduces them: a deterministic coordinate
//! descent (multiplicative steps within physical bounds) on a robust squared log error,
//! started from the profiles' values; the profiles hold its result on the project's
//! validation files, which the validation checks (`refit` in the report).
//!
//! Leave one model out: for each MoE model, the constants of every generation it was measured
//! on are refitted without its rows, and its rows projected with them: an out-of-sample error
//! for every MoE row. The per-expert load spread under auxiliary-loss routing
//! ([`crate::compute::MOE_EXPERT_LOAD_CV`]) is fitted separately, on the four ModelZoo
//! forced/dropless pairs of Qwen3-235B, and is not refitted here.

use serde::Serialize;

use super::Metric;
use crate::backend::FlexBackend;
use crate::hardware::HardwareProfile;
use crate::layout::{Layout, LayoutError};
use crate::projection;
use crate::scenario::Scenario;

/// The GPU generations whose profiles share fitted constants: (name, profiles).
pub const GENERATIONS: &[(&str, &[&str])] = &[
    ("hopper", &["h100-sxm", "h100-96gb", "h200"]),
    ("blackwell-hgx", &["b200", "b300"]),
    ("blackwell-nvl72", &["gb200", "gb300"]),
    ("cdna", &["mi300x", "mi325x", "mi355x"]),
];

/// A row the fitter can re-project: its scenario, layout and measurement.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub id: String,
    pub model: String,
    pub scenario: Scenario,
    pub layout: Layout,
    pub metric: Metric,
    pub measured: f64,
}

impl Prepared {
    /// The generation of the row's GPU, when it has one.
    fn generation(&self) -> Option<&'static str> {
        let name = self.scenario.hardware.name.as_str();
        GENERATIONS
            .iter()
            .find(|(_, profiles)| profiles.contains(&name))
            .map(|(g, _)| *g)
    }

    /// The row's metric projected for scenario `s` and layout `l` (checked first: an illegal
    /// layout is the rule it breaks).
    pub fn projected(&self, s: &Scenario, l: &Layout) -> Result<f64, LayoutError> {
        let t = projection::step_time(s, l)?;
        Ok(self.metric.pick(
            t.tokens_per_second_per_gpu,
            t.step_time_seconds,
            t.tflops_per_gpu,
        ))
    }

    /// Signed relative error with a hardware profile's constants replaced by `c`.
    fn error_with(&self, c: &Constants) -> Option<f64> {
        let mut s = self.scenario.clone();
        c.apply(&mut s.hardware);
        let projected = self.projected(&s, &self.layout).ok()?;
        Some((projected - self.measured) / self.measured)
    }
}

/// One fitted constant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "name", content = "backend")]
pub enum Constant {
    CpuLaunchUs,
    LibraryLaunchUs,
    EpOverlap,
    FlexScaleUp(FlexBackend),
    FlexScaleOut(FlexBackend),
}

impl Constant {
    /// Its path in a hardware profile.
    pub fn path(self) -> String {
        match self {
            Constant::CpuLaunchUs => "efficiency.cpuLaunchUs".into(),
            Constant::LibraryLaunchUs => "efficiency.libraryLaunchUs".into(),
            Constant::EpOverlap => "efficiency.epOverlap".into(),
            Constant::FlexScaleUp(b) => format!("flexBackends[{}].scaleUp", b.as_str()),
            Constant::FlexScaleOut(b) => format!("flexBackends[{}].scaleOut", b.as_str()),
        }
    }

    /// Physical bounds of the search: host costs of tens of microseconds, fractions.
    fn bounds(self) -> (f64, f64) {
        match self {
            Constant::CpuLaunchUs => (20.0, 100.0),
            Constant::LibraryLaunchUs => (5.0, 60.0),
            Constant::EpOverlap => (0.3, 1.0),
            Constant::FlexScaleUp(_) => (0.4, 0.9),
            Constant::FlexScaleOut(_) => (0.3, 0.95),
        }
    }

    fn get(self, hw: &HardwareProfile) -> Option<f64> {
        let e = &hw.efficiency;
        match self {
            Constant::CpuLaunchUs => Some(e.cpu_launch_us),
            Constant::LibraryLaunchUs => Some(e.library_launch_us),
            Constant::EpOverlap => Some(e.ep_overlap),
            Constant::FlexScaleUp(b) => hw.flex_backend(b).map(|p| p.scale_up),
            Constant::FlexScaleOut(b) => hw.flex_backend(b).map(|p| p.scale_out),
        }
    }

    fn set(self, hw: &mut HardwareProfile, v: f64) {
        let e = &mut hw.efficiency;
        match self {
            Constant::CpuLaunchUs => e.cpu_launch_us = v,
            Constant::LibraryLaunchUs => e.library_launch_us = v,
            Constant::EpOverlap => e.ep_overlap = v,
            Constant::FlexScaleUp(b) | Constant::FlexScaleOut(b) => {
                if let Some(p) = hw.flex_backends.iter_mut().find(|p| p.backend == b) {
                    if matches!(self, Constant::FlexScaleUp(_)) {
                        p.scale_up = v;
                    } else {
                        p.scale_out = v;
                    }
                }
            }
        }
    }
}

/// Values of the fitted constants of one generation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Constants {
    pub values: Vec<(Constant, f64)>,
}

impl Constants {
    /// The constants a profile holds (the flex backends it lists).
    fn of(hw: &HardwareProfile) -> Constants {
        let mut keys = vec![
            Constant::CpuLaunchUs,
            Constant::LibraryLaunchUs,
            Constant::EpOverlap,
        ];
        for p in &hw.flex_backends {
            keys.push(Constant::FlexScaleUp(p.backend));
            keys.push(Constant::FlexScaleOut(p.backend));
        }
        Constants {
            values: keys
                .into_iter()
                .filter_map(|k| k.get(hw).map(|v| (k, v)))
                .collect(),
        }
    }

    fn apply(&self, hw: &mut HardwareProfile) {
        for (k, v) in &self.values {
            k.set(hw, *v);
        }
    }
}

/// The fitted constants of one generation: the profiles' values and the refit.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GenerationFit {
    pub generation: String,
    pub rows: usize,
    pub profile: Constants,
    pub refit: Constants,
}

/// Robust loss of a set of rows: squared log error, capped at |ln| = 0.4 (a 50% miss counts as
/// one, so one outlier cannot pull every constant).
fn loss(rows: &[&Prepared], c: &Constants) -> f64 {
    rows.iter()
        .map(|r| match r.error_with(c) {
            Some(e) if e > -1.0 => (1.0 + e).ln().abs().min(0.4).powi(2),
            _ => 0.16,
        })
        .sum()
}

/// Multiplicative steps of the coordinate descent.
const STEPS: [f64; 4] = [0.7, 0.85, 1.18, 1.4];
/// Rounds over the constants at most.
const ROUNDS: usize = 3;

/// Fit the constants on `rows` (of one generation), from `start`; constants no row depends on
/// keep their value.
pub fn fit(rows: &[&Prepared], start: &Constants) -> Constants {
    let mut c = start.clone();
    if rows.is_empty() {
        return c;
    }
    let mut best = loss(rows, &c);
    for _ in 0..ROUNDS {
        let mut improved = false;
        for i in 0..c.values.len() {
            let (k, v0) = c.values[i];
            let (lo, hi) = k.bounds();
            let mut v_best = v0;
            for m in STEPS {
                let v = (v0 * m).clamp(lo, hi);
                if v == v_best {
                    continue;
                }
                c.values[i].1 = v;
                let l = loss(rows, &c);
                if l < best - 1e-9 {
                    best = l;
                    v_best = v;
                    improved = true;
                }
            }
            c.values[i].1 = v_best;
        }
        if !improved {
            break;
        }
    }
    c
}

/// The refit on every MoE row, per generation.
pub fn refit_all(rows: &[Prepared]) -> Vec<GenerationFit> {
    GENERATIONS
        .iter()
        .filter_map(|(g, _)| {
            let members: Vec<&Prepared> =
                rows.iter().filter(|r| r.generation() == Some(*g)).collect();
            let first = members.first()?;
            let profile = Constants::of(&first.scenario.hardware);
            Some(GenerationFit {
                generation: g.to_string(),
                rows: members.len(),
                refit: fit(&members, &profile),
                profile,
            })
        })
        .collect()
}

/// One row's out-of-sample error.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldOut {
    pub id: String,
    pub model: String,
    /// Error with the constants refitted without the row's model.
    pub error: f64,
}

/// Leave one model out: every MoE row projected with its generation's constants refitted
/// without its model's rows.
pub fn leave_one_model_out(rows: &[Prepared]) -> Vec<HeldOut> {
    let mut models: Vec<&str> = rows.iter().map(|r| r.model.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    let mut out = Vec::new();
    for m in models {
        for (g, _) in GENERATIONS {
            let held: Vec<&Prepared> = rows
                .iter()
                .filter(|r| r.model == m && r.generation() == Some(*g))
                .collect();
            let Some(first) = held.first() else { continue };
            let others: Vec<&Prepared> = rows
                .iter()
                .filter(|r| r.model != m && r.generation() == Some(*g))
                .collect();
            let c = fit(&others, &Constants::of(&first.scenario.hardware));
            for r in held {
                if let Some(error) = r.error_with(&c) {
                    out.push(HeldOut {
                        id: r.id.clone(),
                        model: r.model.clone(),
                        error,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Catalog;

    /// The constants are fitted per generation, never per profile: every profile of a
    /// generation holds the same values (a refit written into one profile and not its siblings
    /// would make B300 or H200 project with constants no row supports).
    #[test]
    fn every_profile_of_a_generation_holds_the_generations_constants() {
        let c = Catalog::builtin().expect("catalog");
        for (generation, profiles) in GENERATIONS {
            let first = Constants::of(c.hardware(profiles[0]).expect("profile"));
            for name in &profiles[1..] {
                let hw = c.hardware(name).expect("profile");
                // A sibling may list fewer flex backends (GB300 runs no DeepEP); the ones
                // it lists, and the host and overlap constants, are the generation's.
                for (k, v) in Constants::of(hw).values {
                    let want = first.values.iter().find(|(f, _)| *f == k).map(|(_, v)| *v);
                    assert_eq!(Some(v), want, "{generation}: {name} {}", k.path());
                }
            }
        }
    }
}
