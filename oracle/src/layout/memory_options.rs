//! The optimizer and activation memory options of a layout (issue 15): dropout, the
//! precision-aware optimizer and its state dtypes, optimizer CPU offload, layer-level activation
//! offload, FP8 parameters and the allocator's expandable segments. They change memory (and
//! little else): the memory model reads them in `memory/optimizer.rs`, `memory/activations.rs`
//! and `memory/allocator.rs`; the Megatron flags that set them are in `megatron.rs`.
//!
//! Megatron-LM's defaults (a job without the flag): dropout 0.1 for both
//! (`megatron/core/transformer/transformer_config.py`, `hidden_dropout` / `attention_dropout`),
//! no precision-aware optimizer and FP32 for every optimizer dtype
//! (`megatron/core/optimizer/optimizer_config.py`), no CPU offload, offload fraction 1.0 (the
//! `--optimizer-offload-fraction` default, `megatron/training/arguments.py`), no activation
//! offload, no FP8 parameters, and PyTorch's allocator without expandable segments.

use serde::{Deserialize, Serialize};

use super::rules::{LayoutError, broken};
use super::{Layout, Recompute};
use crate::precision::Precision;
use crate::scenario::Scenario;

/// A fraction in [0, 1] (dropout probability, offload fraction), compared and hashed by value
/// so that layouts stay `Eq + Hash`.
#[derive(Debug, Clone, Copy, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Fraction(f64);

impl Fraction {
    pub const ZERO: Fraction = Fraction(0.0);
    pub const ONE: Fraction = Fraction(1.0);

    pub const fn new(v: f64) -> Fraction {
        Fraction(v)
    }

    pub fn get(self) -> f64 {
        self.0
    }

    /// Positive (a dropout that keeps masks, an offload that moves something).
    pub fn positive(self) -> bool {
        self.0 > 0.0
    }
}

impl PartialEq for Fraction {
    fn eq(&self, other: &Self) -> bool {
        // +0.0 and -0.0 are the same fraction; NaN never passes the layout rules.
        self.0 == other.0 || self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Fraction {}

impl std::hash::Hash for Fraction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let v = if self.0 == 0.0 { 0.0f64 } else { self.0 };
        v.to_bits().hash(state);
    }
}

impl std::fmt::Display for Fraction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(feature = "schema")]
impl schemars::JsonSchema for Fraction {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Fraction".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "number", "format": "double", "minimum": 0.0, "maximum": 1.0})
    }
    fn inline_schema() -> bool {
        true
    }
}

/// Megatron's default dropout probability (`hidden_dropout`, `attention_dropout`).
pub const MEGATRON_DROPOUT: Fraction = Fraction(0.1);

/// The data type of an optimizer state or gradient buffer under the precision-aware optimizer,
/// spelled as Megatron's `--main-grads-dtype`, `--main-params-dtype`, `--exp-avg-dtype` and
/// `--exp-avg-sq-dtype` spell it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum OptimizerDtype {
    #[default]
    Fp32,
    Bf16,
    Fp16,
    /// One byte per element (Transformer Engine's FusedAdam, moments only).
    Fp8,
}

impl OptimizerDtype {
    pub const ALL: [OptimizerDtype; 4] = [
        OptimizerDtype::Fp32,
        OptimizerDtype::Bf16,
        OptimizerDtype::Fp16,
        OptimizerDtype::Fp8,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerDtype::Fp32 => "fp32",
            OptimizerDtype::Bf16 => "bf16",
            OptimizerDtype::Fp16 => "fp16",
            OptimizerDtype::Fp8 => "fp8",
        }
    }

    pub fn parse(s: &str) -> Option<OptimizerDtype> {
        OptimizerDtype::ALL.into_iter().find(|d| d.as_str() == s)
    }

    /// Bytes per element.
    pub fn bytes(self) -> f64 {
        match self {
            OptimizerDtype::Fp32 => 4.0,
            OptimizerDtype::Bf16 | OptimizerDtype::Fp16 => 2.0,
            OptimizerDtype::Fp8 => 1.0,
        }
    }

    pub fn is_fp32(self) -> bool {
        self == OptimizerDtype::Fp32
    }
}

/// The dtypes each optimizer field accepts (Megatron's argparse `choices`).
const MAIN_GRADS: &[OptimizerDtype] = &[OptimizerDtype::Fp32, OptimizerDtype::Bf16];
const MAIN_PARAMS: &[OptimizerDtype] = &[OptimizerDtype::Fp32, OptimizerDtype::Fp16];
const MOMENTS: &[OptimizerDtype] = &OptimizerDtype::ALL;

pub(super) fn megatron_dropout() -> Fraction {
    MEGATRON_DROPOUT
}
pub(super) fn full_fraction() -> Fraction {
    Fraction::ONE
}
pub(super) fn is_megatron_dropout(f: &Fraction) -> bool {
    *f == MEGATRON_DROPOUT
}
pub(super) fn is_full_fraction(f: &Fraction) -> bool {
    *f == Fraction::ONE
}
pub(super) fn is_fp32(d: &OptimizerDtype) -> bool {
    d.is_fp32()
}
pub(super) fn is_false(b: &bool) -> bool {
    !*b
}
pub(super) fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Layout {
    /// Copy the memory options of `from` (the fields of this section) into `self`: the tuner's
    /// candidates keep the reference layout's options, which it does not search.
    pub fn copy_memory_options(&mut self, from: &Layout) {
        self.attention_dropout = from.attention_dropout;
        self.hidden_dropout = from.hidden_dropout;
        self.precision_aware_optimizer = from.precision_aware_optimizer;
        self.main_grads_dtype = from.main_grads_dtype;
        self.main_params_dtype = from.main_params_dtype;
        self.exp_avg_dtype = from.exp_avg_dtype;
        self.exp_avg_sq_dtype = from.exp_avg_sq_dtype;
        self.optimizer_cpu_offload = from.optimizer_cpu_offload;
        self.optimizer_offload_fraction = from.optimizer_offload_fraction;
        self.activation_offload_layers = from.activation_offload_layers;
        self.offload_modules = from.offload_modules.clone();
        self.fp8_param_gather = from.fp8_param_gather;
        self.expandable_segments = from.expandable_segments;
        self.cross_entropy_fusion = from.cross_entropy_fusion;
    }

    /// The memory options in a stable order, for the tuner's tie-break key.
    pub fn memory_options_key(&self) -> impl Ord + use<> {
        (
            (
                self.attention_dropout.get().to_bits(),
                self.hidden_dropout.get().to_bits(),
            ),
            (
                self.precision_aware_optimizer,
                self.main_grads_dtype,
                self.main_params_dtype,
                self.exp_avg_dtype,
                self.exp_avg_sq_dtype,
            ),
            (
                self.optimizer_cpu_offload,
                self.optimizer_offload_fraction.get().to_bits(),
                self.activation_offload_layers,
                self.offload_set(),
                self.fp8_param_gather,
                self.expandable_segments,
                self.cross_entropy_fusion,
            ),
        )
    }

    /// The optimizer, offload and allocator options that differ from Megatron's defaults, as
    /// label words (`pao(grads:bf16,m:bf16)`, `opt-offload(0.5)`, ...). Dropout is left out:
    /// it is a training setting more than a layout choice.
    pub(super) fn memory_options_label(&self) -> Vec<String> {
        let mut words = Vec::new();
        if self.precision_aware_optimizer {
            let dtypes = [
                ("grads", self.main_grads_dtype),
                ("params", self.main_params_dtype),
                ("m", self.exp_avg_dtype),
                ("v", self.exp_avg_sq_dtype),
            ]
            .iter()
            .filter(|(_, d)| !d.is_fp32())
            .map(|(n, d)| format!("{n}:{}", d.as_str()))
            .collect::<Vec<_>>();
            if dtypes.is_empty() {
                words.push("pao".to_string());
            } else {
                words.push(format!("pao({})", dtypes.join(",")));
            }
        }
        if self.optimizer_cpu_offload {
            words.push(format!("opt-offload({})", self.optimizer_offload_fraction));
        }
        if self.activation_offload_layers > 0 {
            words.push(format!("act-offload({})", self.activation_offload_layers));
        }
        let offload = self.offload_set();
        if !offload.is_empty() {
            words.push(format!("offload({})", offload.label()));
        }
        if self.fp8_param_gather {
            words.push("fp8-params".to_string());
        }
        if self.expandable_segments {
            words.push("expandable-segments".to_string());
        }
        if !self.cross_entropy_fusion.is_native() {
            words.push(format!("ce={}", self.cross_entropy_fusion.as_str()));
        }
        words
    }

    /// The legality rules of this section: value ranges, and Megatron's asserts between the
    /// options and the rest of the layout (`megatron/training/arguments.py`,
    /// `megatron/core/optimizer/optimizer_config.py`, `megatron/core/optimizer/__init__.py`,
    /// `megatron/core/transformer/transformer_config.py`).
    pub(super) fn check_memory_options(&self, s: &Scenario) -> Result<(), LayoutError> {
        for (name, f) in [
            ("attentionDropout", self.attention_dropout),
            ("hiddenDropout", self.hidden_dropout),
        ] {
            if !(0.0..1.0).contains(&f.get()) {
                return broken("dropout-range", name, || {
                    format!("{f} is not a dropout probability in [0, 1)")
                });
            }
        }
        self.check_optimizer_dtypes()?;
        if self.optimizer_cpu_offload || !is_full_fraction(&self.optimizer_offload_fraction) {
            let f = self.optimizer_offload_fraction.get();
            if !(0.0..=1.0).contains(&f) {
                return broken("offload-fraction-range", "optimizerOffloadFraction", || {
                    format!("{f} is not a fraction in [0, 1]")
                });
            }
        }
        if self.optimizer_cpu_offload && !self.distributed_optimizer {
            return broken(
                "optimizer-offload-needs-distributed-optimizer",
                "optimizerCpuOffload",
                || "optimizer CPU offload shards what it offloads: it needs distributedOptimizer: true",
            );
        }
        if self.fp8_param_gather {
            if s.training.precision != Precision::Fp8 {
                return broken(
                    "fp8-param-gather-needs-fp8",
                    "fp8ParamGather",
                    || "FP8 parameters need spec.training.precision: fp8",
                );
            }
            if !(self.distributed_optimizer || self.fsdp) {
                return broken(
                    "fp8-param-gather-needs-sharding",
                    "fp8ParamGather",
                    || "--fp8-param-gather needs the distributed optimizer or FSDP",
                );
            }
        }
        self.check_activation_offload(s)?;
        self.check_offload_modules(s)
    }

    /// Dtype choices, and Megatron's rule that non-FP32 optimizer dtypes need the
    /// precision-aware optimizer, which needs the distributed optimizer.
    fn check_optimizer_dtypes(&self) -> Result<(), LayoutError> {
        for (name, d, allowed) in [
            ("mainGradsDtype", self.main_grads_dtype, MAIN_GRADS),
            ("mainParamsDtype", self.main_params_dtype, MAIN_PARAMS),
            ("expAvgDtype", self.exp_avg_dtype, MOMENTS),
            ("expAvgSqDtype", self.exp_avg_sq_dtype, MOMENTS),
        ] {
            if !allowed.contains(&d) {
                return broken("optimizer-dtype", name, || {
                    format!(
                        "{} is not one of {}",
                        d.as_str(),
                        allowed
                            .iter()
                            .map(|d| d.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                });
            }
            if !d.is_fp32() && !self.precision_aware_optimizer {
                return broken("optimizer-dtype-needs-pao", name, || {
                    format!(
                        "{} needs precisionAwareOptimizer: true (Megatron asserts it)",
                        d.as_str()
                    )
                });
            }
        }
        if self.precision_aware_optimizer && !(self.distributed_optimizer || self.fsdp) {
            return broken(
                "pao-needs-distributed-optimizer",
                "precisionAwareOptimizer",
                || "the precision-aware optimizer is only supported with distributedOptimizer: true",
            );
        }
        Ok(())
    }

    /// Layer-level activation offload (`--cpu-offloading-num-layers`): fewer layers than the
    /// model, no pipeline parallelism and no recompute (TransformerConfig's asserts).
    fn check_activation_offload(&self, s: &Scenario) -> Result<(), LayoutError> {
        let n = self.activation_offload_layers;
        if n == 0 {
            return Ok(());
        }
        if n >= s.model.layers {
            return broken(
                "activation-offload-layers",
                "activationOffloadLayers",
                || format!("{n} must be below the model's {} layers", s.model.layers),
            );
        }
        if self.pp > 1 {
            return broken(
                "activation-offload-no-pp",
                "activationOffloadLayers",
                || {
                    format!(
                        "activation CPU offloading does not support pipeline parallelism (pp = {})",
                        self.pp
                    )
                },
            );
        }
        if self.recompute != Recompute::None {
            return broken(
                "activation-offload-no-recompute",
                "activationOffloadLayers",
                || "activation CPU offloading does not support activation recomputation",
            );
        }
        Ok(())
    }
}
