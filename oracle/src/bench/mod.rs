//! Single-node benchmarks: which layout a benchmark measures (the plan's layout shrunk to one
//! node, [`downscale()`]), what it measures there and how samples become a report ([`measure`]),
//! the key under which its results can be reused, and the `simulate` backend, which produces a
//! [`BenchmarkResults`](crate::report::BenchmarkResults) from the analytic model when no GPU is
//! there ([`simulate`]). The GPU backends (`rocm`: HIP, hipBLASLt, RCCL; `cuda`: CUDA, cuBLASLt,
//! NCCL) implement [`measure::Device`] in the `primus-bench` crate, outside this pure library.
//!
//! The operator and `primus bench` both call [`target_layout`] and [`shapes_key`], so the
//! report a benchmark pod posts carries exactly the key the operator looks for.

pub mod downscale;
pub mod measure;
pub mod simulate;

use crate::layout::Layout;
use crate::model::ModelCard;
use crate::plan::Plan;

pub use downscale::{Downscaled, downscale};

/// The layout a plan's benchmark targets: the plan's `spec.parallelism` when it gives one;
/// otherwise TP 1 and, for MoE models, the widest expert parallelism one node holds (the
/// tuner's candidates are then restored analytically from these shapes).
pub fn target_layout(plan: &Plan) -> Layout {
    if let Some(l) = &plan.layout {
        return l.clone();
    }
    let s = &plan.scenario;
    let node = s.cluster.gpus_per_node.min(s.cluster.gpus).max(1);
    let ep = match &s.model.moe {
        Some(m) => (1..=node.min(m.num_experts))
            .rev()
            .find(|d| m.num_experts.is_multiple_of(*d) && node.is_multiple_of(*d))
            .unwrap_or(1),
        None => 1,
    };
    Layout {
        ep,
        ..Layout::default()
    }
}

/// The measured (downscaled) layout of a plan's benchmark.
pub fn measured(plan: &Plan) -> Downscaled {
    downscale(&plan.scenario, &target_layout(plan))
}

/// FNV-1a, 64 bit: a hash that is stable across Rust versions and platforms (report names and
/// keys are stored in the cluster and compared by later versions).
pub fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// How a model is named in a shapes key: its preset name, or a hash of an inline card.
pub fn model_key(card: &ModelCard) -> String {
    if !card.name.is_empty() {
        return card.name.clone();
    }
    let json = serde_json::to_string(card).unwrap_or_default();
    format!("card-{:016x}", stable_hash(json.as_bytes()))
}

/// The key of the layer shapes a plan's benchmark measures: model, downscaled TP/CP/EP/ETP
/// (and experts), sequence parallelism, sequence length, micro-batch and precision. Two plans
/// with the same key on the same GPU product measure the same kernels.
pub fn shapes_key(plan: &Plan) -> String {
    let d = measured(plan);
    let s = &plan.scenario;
    let l = &d.layout;
    let mut key = format!(
        "{}/tp{}-cp{}-ep{}-etp{}-sp{}",
        model_key(&s.model),
        l.tp,
        l.cp,
        l.ep,
        l.etp,
        u8::from(l.sp())
    );
    if let Some(e) = d.experts {
        key.push_str(&format!("-experts{e}"));
    }
    key.push_str(&format!(
        "/seq{}-mbs{}-{}",
        s.training.seq_length,
        l.micro_batch_size,
        s.training.precision.as_str()
    ));
    key
}

/// Name of the BenchmarkReport for a plan and shapes key: `<plan>-bench-<8 hex digits>`, the
/// plan part shortened so the whole stays a valid object name.
pub fn report_name(plan_name: &str, key: &str) -> String {
    let plan: String = plan_name.chars().take(40).collect();
    let plan = plan.trim_end_matches(['-', '.']);
    format!(
        "{plan}-bench-{:08x}",
        stable_hash(key.as_bytes()) & 0xffff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::parse_plan;
    use crate::profiles::Catalog;

    fn plan(extra: &str) -> Plan {
        let c = Catalog::builtin().unwrap();
        let text = format!(
            "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata: {{name: p}}\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 16}}\n  training: {{seqLength: 8192, globalBatchSize: 64}}\n{extra}"
        );
        parse_plan(&text, "p.yaml", &c).unwrap()
    }

    #[test]
    fn the_key_follows_the_measured_shapes_not_the_pipeline() {
        let a = plan("  parallelism: {tp: 2, pp: 2}\n");
        let b = plan("  parallelism: {tp: 2, pp: 4}\n");
        let c = plan("  parallelism: {tp: 4, pp: 2}\n");
        // Pipeline depth does not change a layer's shapes: same TP, same key.
        assert_eq!(shapes_key(&a), shapes_key(&b));
        assert_ne!(shapes_key(&a), shapes_key(&c));
        assert_eq!(
            shapes_key(&a),
            "llama3.1-8b/tp2-cp1-ep1-etp1-sp1/seq8192-mbs1-bf16"
        );
    }

    #[test]
    fn without_a_layout_the_target_is_tp1() {
        let p = plan("");
        assert_eq!(target_layout(&p), Layout::default());
    }

    #[test]
    fn report_names_are_valid_and_stable() {
        let name = report_name(&"x".repeat(100), "k");
        assert!(name.len() <= 63, "{name}");
        assert_eq!(report_name("plan", "k"), report_name("plan", "k"));
        assert_ne!(report_name("plan", "k1"), report_name("plan", "k2"));
        assert!(report_name("plan", "k").starts_with("plan-bench-"));
    }
}
