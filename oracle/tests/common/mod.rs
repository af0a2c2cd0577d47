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
