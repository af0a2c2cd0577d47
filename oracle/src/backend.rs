//! What a GPU's software stack provides that a layout chooses between: Transformer Engine's
//! FP8 scaling recipes and the libraries behind Megatron's `flex` MoE token dispatcher. A leaf
//! module: hardware profiles list which of them their stack runs (`fp8Recipes`,
//! `flexBackends`), layouts pick one (`spec.parallelism.fp8Recipe`, `moe.flexBackend`), and
//! the legality rules check the pick against the list.

use serde::{Deserialize, Serialize};

/// Transformer Engine's FP8 scaling recipe (`--fp8-recipe`), read only with precision fp8.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Fp8Recipe {
    /// Per-tensor scales from an amax history (Megatron's default).
    Delayed,
    /// Per-tensor current scaling (NeMo/Megatron-Bridge "FP8-CS").
    Tensorwise,
    /// 1x128 activation and 128x128 weight blocks (DeepSeek-V3's recipe, "FP8-SC").
    Blockwise,
    /// MX block scaling, 1x32 blocks with E8M0 scales: Blackwell tensor cores (and CDNA 4).
    Mxfp8,
}

impl Fp8Recipe {
    pub const ALL: [Fp8Recipe; 4] = [
        Fp8Recipe::Delayed,
        Fp8Recipe::Tensorwise,
        Fp8Recipe::Blockwise,
        Fp8Recipe::Mxfp8,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Fp8Recipe::Delayed => "delayed",
            Fp8Recipe::Tensorwise => "tensorwise",
            Fp8Recipe::Blockwise => "blockwise",
            Fp8Recipe::Mxfp8 => "mxfp8",
        }
    }

    pub fn parse(v: &str) -> Option<Fp8Recipe> {
        Fp8Recipe::ALL.into_iter().find(|d| d.as_str() == v)
    }

    /// Kernel launches of one quantization of a GEMM input: amax reduction, scale update and
    /// cast+transpose for per-tensor scaling (delayed, tensorwise); a fused quantize with its
    /// scale-swizzle for the block recipes (blockwise two, MXFP8 one fused kernel).
    pub fn quantize_launches(self) -> f64 {
        match self {
            Fp8Recipe::Delayed | Fp8Recipe::Tensorwise => 3.0,
            Fp8Recipe::Blockwise => 2.0,
            Fp8Recipe::Mxfp8 => 1.0,
        }
    }

    /// Rows a routed expert's token count is padded to for the FP8 GEMMs
    /// (`moe_utils.py:get_align_size_for_quantization`): 32 for MXFP8, 16 otherwise.
    pub fn expert_align(self) -> f64 {
        match self {
            Fp8Recipe::Mxfp8 => 32.0,
            _ => 16.0,
        }
    }
}

/// The library behind the `flex` dispatcher: Megatron's `--moe-flex-dispatcher-backend`
/// (`deepep`, `hybridep`; `fused_a2a.py`) or Primus's Primus-Turbo DeepEP on AMD GPUs
/// (`--use_turbo_deepep`, `primus/backends/megatron/patches/turbo/moe_dispatcher_patches.py`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum FlexBackend {
    /// DeepEP (NVLink + RDMA kernels; Megatron's default flex backend).
    #[default]
    Deepep,
    /// HybridEP (DeepEP's hybrid-ep branch: TMA inside the NVLink domain, fewer SMs, MNNVL).
    Hybridep,
    /// Primus-Turbo's DeepEP for ROCm (AMD Instinct).
    PrimusTurboDeepep,
}

impl FlexBackend {
    pub const ALL: [FlexBackend; 3] = [
        FlexBackend::Deepep,
        FlexBackend::Hybridep,
        FlexBackend::PrimusTurboDeepep,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FlexBackend::Deepep => "deepep",
            FlexBackend::Hybridep => "hybridep",
            FlexBackend::PrimusTurboDeepep => "primus-turbo-deepep",
        }
    }

    pub fn parse(v: &str) -> Option<FlexBackend> {
        FlexBackend::ALL.into_iter().find(|d| d.as_str() == v)
    }
}
