//! The paper's downscaling rule: shrink a target layout until one node holds it, so one dense
//! and one MoE layer can be measured there at (as close as possible to) the target TP/EP.
//! Drop pipeline parallelism first (a layer's shapes do not depend on it), then expert
//! parallelism keeping the experts per rank (so the grouped GEMMs keep their shapes), then
//! tensor parallelism, then context parallelism. Every reduction is reported.

use crate::layout::{Layout, Schedule};
use crate::scenario::Scenario;

/// A layout shrunk to fit one node.
#[derive(Debug, Clone, PartialEq)]
pub struct Downscaled {
    /// The single-node layout to measure.
    pub layout: Layout,
    /// GPUs the measurement uses (one node, or fewer when the whole job is smaller).
    pub gpus: u32,
    /// Routed experts of the measured MoE layer (the card's count divided like EP), when the
    /// model has experts.
    pub experts: Option<u32>,
    /// Axes that were reduced, e.g. `["pp 8->1", "ep 64->8 (experts 256->32, 4 per rank)"]`.
    pub reduced_axes: Vec<String>,
}

/// Whether `l` fits `n` GPUs: the attention grid TP x CP x PP and the expert grid EP x ETP of
/// one stage both fit.
fn fits(l: &Layout, n: u32) -> bool {
    let mp = l.tp as u64 * l.cp as u64 * l.pp as u64;
    let expert = l.ep as u64 * l.etp as u64 * l.pp as u64;
    mp <= n as u64 && expert <= n as u64
}

/// Largest divisor of `v` that is at most `limit` (at least 1).
fn largest_divisor_at_most(v: u32, limit: u32) -> u32 {
    let limit = limit.max(1);
    (1..=v.min(limit))
        .rev()
        .find(|d| v.is_multiple_of(*d))
        .unwrap_or(1)
}

/// Shrink `target` to fit one node of scenario `s`.
pub fn downscale(s: &Scenario, target: &Layout) -> Downscaled {
    let n = s.cluster.gpus_per_node.min(s.cluster.gpus).max(1);
    let mut l = target.clone();
    let mut reduced = Vec::new();
    let mut experts = s.model.moe.as_ref().map(|m| m.num_experts);

    if !fits(&l, n) && l.pp > 1 {
        reduced.push(format!("pp {}->1", l.pp));
        if l.vpp > 1 {
            reduced.push(format!("vpp {}->1", l.vpp));
        }
        l.pp = 1;
        l.vpp = 1;
        l.schedule = Schedule::OneFOneB;
        l.first_stage_layers = None;
        l.last_stage_layers = None;
        l.pipeline_layout = None;
    }
    if !fits(&l, n) && l.ep > 1 {
        let ep = largest_divisor_at_most(l.ep, n / l.etp.max(1));
        if ep < l.ep {
            let note = match experts {
                Some(e) if e.is_multiple_of(l.ep) => {
                    let per_rank = e / l.ep;
                    let fewer = per_rank * ep;
                    experts = Some(fewer);
                    format!(
                        "ep {}->{ep} (experts {e}->{fewer}, {per_rank} per rank)",
                        l.ep
                    )
                }
                _ => format!("ep {}->{ep}", l.ep),
            };
            reduced.push(note);
            l.ep = ep;
        }
    }
    if !fits(&l, n) && l.tp > 1 {
        let tp = largest_divisor_at_most(l.tp, n / l.cp.max(1));
        if tp < l.tp {
            reduced.push(format!("tp {}->{tp}", l.tp));
            l.tp = tp;
        }
    }
    if !fits(&l, n) && l.etp > 1 {
        let etp = largest_divisor_at_most(l.etp, n / l.ep.max(1));
        if etp < l.etp {
            reduced.push(format!("etp {}->{etp}", l.etp));
            l.etp = etp;
        }
    }
    if !fits(&l, n) && l.cp > 1 {
        let cp = largest_divisor_at_most(l.cp, n / l.tp.max(1));
        if cp < l.cp {
            reduced.push(format!("cp {}->{cp}", l.cp));
            l.cp = cp;
        }
    }
    Downscaled {
        layout: l,
        gpus: n,
        experts,
        reduced_axes: reduced,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Precision;
    use crate::profiles::Catalog;
    use crate::scenario::{Cluster, Training};

    fn scenario(model: &str, gpus: u32) -> Scenario {
        let c = Catalog::builtin().unwrap();
        let hardware = c.hardware("mi300x").unwrap().clone();
        Scenario {
            model: c.model(model).unwrap().clone(),
            cluster: Cluster {
                gpus,
                gpus_per_node: 8,
            },
            hardware,
            training: Training {
                seq_length: 4096,
                global_batch_size: 256,
                precision: Precision::Bf16,
            },
        }
    }

    #[test]
    fn a_layout_that_fits_is_measured_as_is() {
        let s = scenario("llama3.1-70b", 64);
        let l = Layout {
            tp: 8,
            ..Layout::default()
        };
        let d = downscale(&s, &l);
        assert_eq!(d.layout, l);
        assert!(d.reduced_axes.is_empty());
        assert_eq!(d.gpus, 8);
    }

    #[test]
    fn pipeline_parallelism_goes_first() {
        let s = scenario("llama3.1-70b", 64);
        let l = Layout {
            tp: 4,
            pp: 8,
            vpp: 5,
            schedule: Schedule::Interleaved,
            ..Layout::default()
        };
        let d = downscale(&s, &l);
        assert_eq!((d.layout.tp, d.layout.pp, d.layout.vpp), (4, 1, 1));
        assert_eq!(d.layout.schedule, Schedule::OneFOneB);
        assert_eq!(d.reduced_axes, vec!["pp 8->1", "vpp 5->1"]);
    }

    #[test]
    fn expert_parallelism_shrinks_keeping_experts_per_rank() {
        let s = scenario("deepseek-v3", 1024);
        let experts = s.model.moe.as_ref().unwrap().num_experts;
        let l = Layout {
            tp: 1,
            pp: 16,
            ep: 64,
            ..Layout::default()
        };
        let d = downscale(&s, &l);
        assert_eq!((d.layout.pp, d.layout.ep, d.layout.tp), (1, 8, 1));
        let per_rank = experts / 64;
        assert_eq!(d.experts, Some(per_rank * 8));
        assert_eq!(d.reduced_axes[0], "pp 16->1");
        assert!(
            d.reduced_axes[1].starts_with("ep 64->8"),
            "{:?}",
            d.reduced_axes
        );
        assert!(
            d.reduced_axes[1].contains(&format!("{per_rank} per rank")),
            "{:?}",
            d.reduced_axes
        );
    }

    #[test]
    fn tensor_parallelism_goes_last() {
        let s = scenario("llama3.1-405b", 256);
        let l = Layout {
            tp: 16,
            pp: 2,
            ..Layout::default()
        };
        let d = downscale(&s, &l);
        assert_eq!((d.layout.tp, d.layout.pp), (8, 1));
        assert_eq!(d.reduced_axes, vec!["pp 2->1", "tp 16->8"]);
    }

    #[test]
    fn small_jobs_use_fewer_gpus_than_a_node() {
        let s = scenario("llama3.1-8b", 4);
        let l = Layout {
            tp: 2,
            pp: 2,
            ..Layout::default()
        };
        let d = downscale(&s, &l);
        assert_eq!(d.gpus, 4);
        assert_eq!((d.layout.tp, d.layout.pp), (2, 2));
    }
}
