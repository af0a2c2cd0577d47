//! Everything about a training job except its parallel layout: the model card, the GPU
//! profile, the cluster after defaults and the training settings. The memory model, the
//! projection and the tuner evaluate layouts against a [`Scenario`]; the `plan` module builds
//! one from a TrainingPlan's `spec.model`, `spec.cluster` and `spec.training`. It sits below the
//! layout and the plan (it depends only on the model, hardware and precision modules), so
//! every model can read it without a module cycle.

use serde::{Deserialize, Serialize};

use crate::bounds::{Bound, Bounded, limits};
use crate::hardware::HardwareProfile;
use crate::model::ModelCard;
use crate::precision::Precision;

/// Training settings that are not part of the layout (`spec.training`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<Training>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Training {
    /// Sequence length in tokens.
    pub seq_length: u64,
    /// Global batch size in sequences.
    pub global_batch_size: u64,
    /// Matrix precision.
    #[serde(default)]
    pub precision: Precision,
}

/// The training settings, bounded.
impl Bounded for Training {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::int("seqLength", 1, limits::SEQ, |t| t.seq_length.into()),
        Bound::int("globalBatchSize", 1, limits::GLOBAL_BATCH, |t| {
            t.global_batch_size.into()
        }),
    ];
}

/// The cluster after defaults: GPU count and packaging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    pub gpus: u32,
    pub gpus_per_node: u32,
}

impl Cluster {
    pub fn nodes(&self) -> u32 {
        self.gpus.div_ceil(self.gpus_per_node.max(1))
    }
}

/// Everything about a job except its layout: what the memory model, the projection and the
/// tuner evaluate layouts against.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub model: ModelCard,
    pub hardware: HardwareProfile,
    pub cluster: Cluster,
    pub training: Training,
}
