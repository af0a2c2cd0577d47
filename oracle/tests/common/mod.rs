//! What several oracle integration tests build alike.

use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};

/// A scenario of built-in `model` and `gpu` on `gpus` GPUs, `gpus_per_node` of them per node
/// (`None`: the hardware profile's), sequence `seq`, global batch `gbs`.
pub fn scenario(
    model: &str,
    gpu: &str,
    gpus: u32,
    gpus_per_node: Option<u32>,
    seq: u64,
    gbs: u64,
    precision: Precision,
) -> Scenario {
    let c = Catalog::builtin().unwrap();
    let hardware = c.hardware(gpu).unwrap().clone();
    Scenario {
        model: c.model(model).unwrap().clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node: gpus_per_node.unwrap_or(hardware.gpus_per_node),
        },
        hardware,
        training: Training {
            seq_length: seq,
            global_batch_size: gbs,
            precision,
        },
    }
}

/// The attention core op of one full-attention layer of `kind` under layout `l`, BF16, and the
/// layer's attention (forward, backward) seconds per micro-batch by the analytic timer.
#[allow(dead_code)] // Not every test that shares this module times attention.
pub fn attention_core(
    s: &Scenario,
    l: &primus_oracle::layout::Layout,
    kind: primus_oracle::model::LayerKind,
) -> (primus_oracle::compute::Op, (f64, f64)) {
    use primus_oracle::compute::{AnalyticTimer, Dims, LayerShape, OpTimes, TimerContext};
    let ctx = TimerContext {
        hardware: &s.hardware,
        precision: Precision::Bf16,
        fp8_recipe: primus_oracle::backend::Fp8Recipe::Delayed,
    };
    let d = Dims::of(s, l);
    let shape = LayerShape {
        kind,
        sliding: false,
    };
    let ops = primus_oracle::compute::layer_ops(&s.model, &d, shape);
    let att = *ops
        .as_slice()
        .iter()
        .find(|o| o.name == "attention")
        .expect("an attention core");
    let t = OpTimes::of(&ops, &AnalyticTimer, &ctx);
    (att, (t.attention_forward, t.attention_backward))
}
