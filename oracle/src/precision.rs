//! The numeric precision of a job's matrix math (`spec.training.precision`): a leaf that the
//! hardware profiles (peak FLOP/s per precision), the scenario and the time and memory models
//! all read, so it depends on nothing else in the oracle.

use serde::{Deserialize, Serialize};

/// Numeric precision of the matrix math.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// BF16 weights and GEMMs.
    #[default]
    Bf16,
    /// FP8 GEMMs (Transformer Engine delayed/current scaling or MXFP8), BF16 weights.
    Fp8,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
        }
    }
}
