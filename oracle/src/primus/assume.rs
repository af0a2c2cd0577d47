//! What a memory check of a Primus job can know. The experiment YAML usually lives in the
//! image or a volume, out of sight; only the command line and the environment are. The
//! layout's shape (TP, PP, micro-batch, sequence, global batch; EP of an MoE model) must be
//! there ([`missing`]): without it there is nothing to check. The settings that only save
//! memory (recomputation, sequence parallelism, optimizer sharding, BF16 gradient reduction)
//! are taken at their most saving value when the command line leaves them to the YAML
//! ([`best_case`]): a job denied then runs out of memory whatever its YAML sets.

use super::overrides::Overrides;
use crate::layout::{Layout, Recompute};
use crate::memory;
use crate::scenario::Scenario;

/// Keys that give the layout's shape, and for which models each is needed.
const SHAPE: &[(&str, bool)] = &[
    ("tensor_model_parallel_size", false),
    ("pipeline_model_parallel_size", false),
    ("micro_batch_size", false),
    ("seq_length", false),
    ("global_batch_size", false),
    ("expert_model_parallel_size", true),
];

/// Shape keys the overrides do not set (`moe`: the model has experts).
pub fn missing(overrides: &Overrides, moe: bool) -> Vec<&'static str> {
    SHAPE
        .iter()
        .filter(|(k, only_moe)| (moe || !only_moe) && !overrides.contains_key(*k))
        .map(|(k, _)| *k)
        .collect()
}

/// Whether any of `keys` is set.
fn any(overrides: &Overrides, keys: &[&str]) -> bool {
    keys.iter().any(|k| overrides.contains_key(*k))
}

/// The layout with the memory-saving settings the overrides leave open at their most saving
/// legal values, and the keys so assumed (empty: the layout is as given).
pub fn best_case(s: &Scenario, l: &Layout, overrides: &Overrides) -> (Layout, Vec<&'static str>) {
    let mut best = l.clone();
    let mut assumed = Vec::new();
    if !any(
        overrides,
        &[
            "recompute_granularity",
            "recompute_method",
            "recompute_num_layers",
        ],
    ) {
        best.recompute = Recompute::Full;
        best.recompute_layers = 0;
        assumed.push("recompute_granularity");
    }
    if !any(overrides, &["sequence_parallel"]) && l.tp > 1 {
        best.sequence_parallel = true;
        assumed.push("sequence_parallel");
    }
    if !any(overrides, &["grad_reduce_in_bf16"]) {
        best.grad_reduce_in_fp32 = false;
        assumed.push("grad_reduce_in_bf16");
    }
    if !any(overrides, &["use_distributed_optimizer", "use_torch_fsdp2"]) {
        assumed.push("use_distributed_optimizer/use_torch_fsdp2");
        let variants = [(true, false), (false, true)].map(|(dist, fsdp)| Layout {
            distributed_optimizer: dist,
            fsdp,
            ..best.clone()
        });
        let peak = |v: &Layout| memory::estimate(s, v).peak_bytes;
        best = variants
            .into_iter()
            .filter(|v| v.check(s).is_ok())
            .min_by(|a, b| peak(a).total_cmp(&peak(b)))
            .unwrap_or(best);
    }
    (best, assumed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::precision::Precision;
    use crate::profiles::Catalog;
    use crate::scenario::{Cluster, Training};
    use serde_json::json;

    fn scenario() -> Scenario {
        let c = Catalog::builtin().unwrap();
        Scenario {
            model: c.model("llama3.1-70b").unwrap().clone(),
            hardware: c.hardware("mi300x").unwrap().clone(),
            cluster: Cluster {
                gpus: 8,
                gpus_per_node: 8,
            },
            training: Training {
                seq_length: 8192,
                global_batch_size: 24,
                precision: Precision::Bf16,
            },
        }
    }

    #[test]
    fn shape_keys_are_required_and_ep_only_for_moe() {
        let o: Overrides = [("micro_batch_size".to_string(), json!(1))].into();
        assert_eq!(
            missing(&o, false),
            [
                "tensor_model_parallel_size",
                "pipeline_model_parallel_size",
                "seq_length",
                "global_batch_size"
            ]
        );
        assert!(missing(&o, true).contains(&"expert_model_parallel_size"));
    }

    #[test]
    fn open_settings_are_taken_at_their_most_saving_and_given_ones_kept() {
        let s = scenario();
        let l = Layout {
            tp: 8,
            sequence_parallel: false,
            distributed_optimizer: false,
            ..Layout::default()
        };
        let (best, assumed) = best_case(&s, &l, &Overrides::new());
        assert_eq!(best.recompute, Recompute::Full);
        assert!(best.sequence_parallel && !best.grad_reduce_in_fp32);
        assert!(best.fsdp || best.distributed_optimizer);
        assert_eq!(assumed.len(), 4, "{assumed:?}");
        let saved = memory::estimate(&s, &best).peak_bytes;
        assert!(saved < memory::estimate(&s, &l).peak_bytes);
        // Given on the command line: kept as given.
        let o: Overrides = [
            ("recompute_granularity".to_string(), json!(null)),
            ("sequence_parallel".to_string(), json!(false)),
            ("grad_reduce_in_bf16".to_string(), json!(false)),
            ("use_distributed_optimizer".to_string(), json!(false)),
        ]
        .into();
        let (kept, assumed) = best_case(&s, &l, &o);
        assert_eq!((kept, assumed.len()), (l, 0));
    }
}
