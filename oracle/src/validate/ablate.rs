//! Which modeled MoE execution option moves which row: every MoE row projected again with one
//! of its options set back to Megatron-LM's default (the rest of the layout as the recipe ran),
//! so the closing table can say what each option is worth in the model and whether modelling
//! it brings the row closer to its measurement.
//!
//! One option at a time, never combinations: the dispatcher goes back one step (a flex library
//! to NCCL's `alltoall` with the library's own settings, `alltoall` to `allgather`), the EP overlap takes `delayWgrad` with it
//! (which needs it), a capacity factor takes its padding. A reverted layout that breaks one of
//! Megatron's rules (e.g. the EP overlap with the `allgather` dispatcher) is reported as such,
//! never projected.

use serde::Serialize;

use super::stats::{Aggregate, median};
use super::{Metric, Prepared};
use crate::layout::{CudaGraph, GroupedGemm, Layout, TokenDispatcher};

/// One MoE execution option, as the ablation reverts it (serialized as its field name).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ablation {
    /// flex (DeepEP, HybridEP, Primus-Turbo DeepEP) -> alltoall -> allgather.
    Dispatcher,
    /// grouped or legacy grouped GEMM -> sequential experts.
    GroupedGemm,
    PermuteFusion,
    RouterFusion,
    SharedExpertOverlap,
    /// `--overlap-moe-expert-parallel-comm` (with `--delay-wgrad-compute`).
    EpOverlap,
    /// Forced balance -> the router's auxiliary-loss imbalance.
    ForcedBalance,
    /// Capacity factor (and padding) -> dropless.
    Capacity,
    /// HybridEP's per-rank capacity -> none (a host sync per layer).
    RankCapacity,
    RouterDtype,
    /// The FP8 recipe -> the precision's default.
    Fp8Recipe,
    /// CUDA graphs -> none.
    CudaGraph,
}

impl Ablation {
    pub const ALL: [Ablation; 12] = [
        Ablation::Dispatcher,
        Ablation::GroupedGemm,
        Ablation::PermuteFusion,
        Ablation::RouterFusion,
        Ablation::SharedExpertOverlap,
        Ablation::EpOverlap,
        Ablation::ForcedBalance,
        Ablation::Capacity,
        Ablation::RankCapacity,
        Ablation::RouterDtype,
        Ablation::Fp8Recipe,
        Ablation::CudaGraph,
    ];

    /// The layout field's name (`spec.parallelism.moe.*` or the layout's own).
    pub fn name(self) -> &'static str {
        match self {
            Ablation::Dispatcher => "tokenDispatcher",
            Ablation::GroupedGemm => "groupedGemm",
            Ablation::PermuteFusion => "permuteFusion",
            Ablation::RouterFusion => "routerFusion",
            Ablation::SharedExpertOverlap => "sharedExpertOverlap",
            Ablation::EpOverlap => "epOverlap",
            Ablation::ForcedBalance => "forceLoadBalancing",
            Ablation::Capacity => "capacityFactor",
            Ablation::RankCapacity => "rankCapacityFactor",
            Ablation::RouterDtype => "routerDtype",
            Ablation::Fp8Recipe => "fp8Recipe",
            Ablation::CudaGraph => "cudaGraph",
        }
    }

    /// The layout with this option set back, or `None` when the layout does not use it.
    pub fn revert(self, l: &Layout) -> Option<Layout> {
        let mut r = l.clone();
        let m = &mut r.moe;
        match self {
            Ablation::Dispatcher => match m.token_dispatcher {
                TokenDispatcher::Flex => {
                    // With the library go its own settings.
                    m.token_dispatcher = TokenDispatcher::Alltoall;
                    m.flex_backend = None;
                    m.rank_capacity_factor = None;
                    m.flex_num_sms = None;
                }
                TokenDispatcher::Alltoall => m.token_dispatcher = TokenDispatcher::Allgather,
                TokenDispatcher::Allgather => return None,
            },
            Ablation::GroupedGemm if m.grouped_gemm != GroupedGemm::Sequential => {
                m.grouped_gemm = GroupedGemm::Sequential;
            }
            Ablation::PermuteFusion if m.permute_fusion => m.permute_fusion = false,
            Ablation::RouterFusion if m.router_fusion => m.router_fusion = false,
            Ablation::SharedExpertOverlap if m.shared_expert_overlap => {
                m.shared_expert_overlap = false;
                m.shared_expert_stream_per_layer = false;
            }
            Ablation::EpOverlap if m.ep_overlap => {
                m.ep_overlap = false;
                m.delay_wgrad = false;
            }
            Ablation::ForcedBalance if m.force_load_balancing => m.force_load_balancing = false,
            Ablation::Capacity if m.capacity_factor.is_some() => {
                m.capacity_factor = None;
                m.pad_to_capacity = false;
            }
            Ablation::RankCapacity if m.rank_capacity_factor.is_some() => {
                m.rank_capacity_factor = None;
            }
            Ablation::RouterDtype if m.router_dtype.is_some() => m.router_dtype = None,
            Ablation::Fp8Recipe if r.fp8_recipe.is_some() => r.fp8_recipe = None,
            Ablation::CudaGraph if r.cuda_graph != CudaGraph::default() => {
                r.cuda_graph = CudaGraph::default();
            }
            _ => return None,
        }
        Some(r)
    }
}

impl Serialize for Ablation {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// One option of one row: the projection without it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OptionEffect {
    pub option: Ablation,
    /// Projected without the option (the row's metric); `None` when that layout is illegal.
    pub without: Option<f64>,
    /// What modelling the option changes: projected / without - 1 (on seconds per iteration,
    /// without / projected - 1, so a positive change is always "faster").
    pub speedup: Option<f64>,
    /// The row's signed error without the option.
    pub error_without: Option<f64>,
    /// The rule the reverted layout breaks.
    pub illegal: Option<String>,
}

/// One MoE row with the effect of each option it uses.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RowAblation {
    pub id: String,
    pub model: String,
    pub gpu: String,
    pub metric: Metric,
    pub measured: f64,
    pub projected: f64,
    pub error: f64,
    pub effects: Vec<OptionEffect>,
}

/// One option over the rows that use it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OptionSummary {
    pub option: Ablation,
    /// Rows that use the option.
    pub rows: usize,
    /// Of them, rows whose reverted layout is illegal.
    pub illegal: usize,
    /// Median speed-up the option brings in the model.
    pub median_speedup: Option<f64>,
    /// |error| of those rows with the option modelled, and without it.
    pub with: Aggregate,
    pub without: Aggregate,
    /// Rows whose |error| the option makes smaller.
    pub rows_closer: usize,
}

/// Every row projected once as it ran and once without each option it uses.
pub fn ablate(rows: &[Prepared]) -> Vec<RowAblation> {
    rows.iter()
        .filter_map(|p| {
            let base = p.projected(&p.scenario, &p.layout).ok()?;
            let faster = |without: f64| match p.metric {
                Metric::SecondsPerIteration => without / base - 1.0,
                _ => base / without - 1.0,
            };
            let effects = Ablation::ALL
                .iter()
                .filter_map(|&a| {
                    let reverted = a.revert(&p.layout)?;
                    Some(match p.projected(&p.scenario, &reverted) {
                        Ok(w) => OptionEffect {
                            option: a,
                            without: Some(w),
                            speedup: Some(faster(w)),
                            error_without: Some((w - p.measured) / p.measured),
                            illegal: None,
                        },
                        Err(e) => OptionEffect {
                            option: a,
                            without: None,
                            speedup: None,
                            error_without: None,
                            illegal: Some(e.to_string()),
                        },
                    })
                })
                .collect();
            Some(RowAblation {
                id: p.id.clone(),
                model: p.model.clone(),
                gpu: p.scenario.hardware.name.clone(),
                metric: p.metric,
                measured: p.measured,
                projected: base,
                error: (base - p.measured) / p.measured,
                effects,
            })
        })
        .collect()
}

/// Per option: how many rows use it, what it is worth, and whether modelling it helps.
pub fn summarize(rows: &[RowAblation]) -> Vec<OptionSummary> {
    Ablation::ALL
        .iter()
        .filter_map(|&a| {
            let used: Vec<(&RowAblation, &OptionEffect)> = rows
                .iter()
                .filter_map(|r| r.effects.iter().find(|e| e.option == a).map(|e| (r, e)))
                .collect();
            if used.is_empty() {
                return None;
            }
            let legal: Vec<&(&RowAblation, &OptionEffect)> =
                used.iter().filter(|(_, e)| e.illegal.is_none()).collect();
            let mut speedups: Vec<f64> = legal.iter().filter_map(|(_, e)| e.speedup).collect();
            let median_speedup = median(&mut speedups);
            Some(OptionSummary {
                option: a,
                rows: used.len(),
                illegal: used.len() - legal.len(),
                median_speedup,
                with: Aggregate::of(legal.iter().map(|(r, _)| r.error)),
                without: Aggregate::of(legal.iter().filter_map(|(_, e)| e.error_without)),
                rows_closer: legal
                    .iter()
                    .filter(|(r, e)| e.error_without.is_some_and(|w| r.error.abs() < w.abs()))
                    .count(),
            })
        })
        .collect()
}
