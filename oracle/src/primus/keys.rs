//! Megatron flags <-> Primus config keys: the one table both directions use.
//!
//! Primus passes its experiment's `overrides` (and command-line overrides) to Megatron-LM as
//! argument values by their argparse `dest` names, and ignores keys Megatron does not define
//! (`primus/backends/megatron/argument_builder.py`, `MegatronArgBuilder.update`). A flag's key
//! is therefore its name without the leading dashes, with `-` as `_`
//! (`--tensor-model-parallel-size` -> `tensor_model_parallel_size`), except for the few
//! listed in [`RENAMED`]. Every flag [`crate::megatron::megatron_flags`] writes has a key this
//! way, including flags added to that table later.
//!
//! Primus's defaults are not Megatron's (`sequence_parallel: true` in
//! `primus/configs/models/megatron/language_model.yaml`, `use_distributed_optimizer: true` in
//! `primus/configs/modules/megatron/pre_trainer.yaml`), and an experiment YAML may set any
//! key. A flag the layout leaves out therefore does not mean Megatron's default in a Primus job:
//! the writer pins it ([`PINNED`]).

use crate::megatron::flag;

/// Megatron flags whose Primus key is not the flag's name with underscores.
pub const RENAMED: &[(&str, &str)] = &[
    // Megatron: `--fp8-format ... dest='fp8'` (megatron/training/arguments.py).
    (flag::FP8_FORMAT, "fp8"),
    // Megatron has no `--padded-vocab-size` argument (it pads `--vocab-size` itself), so
    // Primus would drop the key; the vocabulary goes as `vocab_size`.
    (flag::VOCAB, "vocab_size"),
    // Primus-Megatron's zero-bubble pipeline runs when `patch_zero_bubble` is true and
    // `enable_zero_bubble` (true by default, primus/configs/modules/megatron/zero_bubble.yaml)
    // is not false.
    (flag::ZERO_BUBBLE, "patch_zero_bubble"),
];

/// Megatron switches that turn a default off (`--no-X`, `dest='X'`, `store_false`): Primus
/// reads the argument's own key, set to false.
pub const NEGATED: &[(&str, &str)] =
    &[(flag::NO_GRAD_ACCUM_FUSION, "gradient_accumulation_fusion")];

/// Keys read as a flag besides that flag's own key: Primus's trainer reads the number of
/// virtual pipeline stages from `num_virtual_stages_per_pipeline_rank`, its projection from
/// `virtual_pipeline_model_parallel_size` (primus/agents/tuning_agent/evaluator.py sets both).
pub const ALIASES: &[(&str, &str)] = &[("num_virtual_stages_per_pipeline_rank", flag::VPP_SIZE)];

/// Keys the writer adds next to a flag's own key, with the same value (a switch's `True`).
pub const ALSO_WRITTEN: &[(&str, &str)] = &[
    (flag::VPP_SIZE, "num_virtual_stages_per_pipeline_rank"),
    (flag::ZERO_BUBBLE, "enable_zero_bubble"),
];

/// Dense-first MoE layers: Megatron (and Primus's presets) say it with `moe_layer_freq`, a
/// pattern such as `([0]*3+[1]*58)` (0 = dense layer, 1 = MoE layer; DeepSeek-V3's preset).
pub const MOE_LAYER_FREQ: &str = "moe_layer_freq";

/// A key the reader skips: meaningful only with another (`enable_zero_bubble` without
/// `patch_zero_bubble` selects nothing).
pub const ZERO_BUBBLE_ENABLE: &str = "enable_zero_bubble";

/// What the writer sets a flag to when the layout (or model) leaves it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pin {
    /// A switch: `False`.
    Off,
    /// A valued flag: `None` (Megatron's default).
    Null,
    /// A valued flag: this value.
    Value(&'static str),
}

/// Flags [`crate::megatron::megatron_flags`] writes only for some layouts or models, with
/// the value that means "not set": the Primus writer pins them so that neither Primus's own
/// defaults nor the experiment YAML change the layout the plan chose.
pub const PINNED: &[(&str, Pin)] = &[
    // Layout switches.
    (flag::DIST_OPT, Pin::Off),
    (flag::SP, Pin::Off),
    (flag::FSDP, Pin::Off),
    (flag::ZERO_BUBBLE, Pin::Off),
    (flag::TP_COMM_OVERLAP, Pin::Off),
    (flag::OVERLAP_GRAD_REDUCE, Pin::Off),
    (flag::OVERLAP_PARAM_GATHER, Pin::Off),
    (flag::GRAD_REDUCE_IN_BF16, Pin::Off),
    // Layout values.
    (flag::VPP_SIZE, Pin::Null),
    (flag::VPP_LAYERS, Pin::Null),
    (flag::FIRST_STAGE_LAYERS, Pin::Null),
    (flag::LAST_STAGE_LAYERS, Pin::Null),
    (flag::PIPELINE_LAYOUT, Pin::Null),
    (flag::VPP_STAGES, Pin::Null),
    // Megatron refuses them beside a layout: the plan's split is written whole.
    (flag::ACCOUNT_EMBEDDING, Pin::Off),
    (flag::ACCOUNT_LOSS, Pin::Off),
    // The loss kernel the plan projected (written when fused).
    (flag::CE_FUSION, Pin::Off),
    (flag::CE_FUSION_IMPL, Pin::Value("native")),
    (flag::EP, Pin::Value("1")),
    (flag::ETP, Pin::Null),
    (flag::RECOMPUTE_GRANULARITY, Pin::Null),
    (flag::RECOMPUTE_METHOD, Pin::Null),
    (flag::RECOMPUTE_NUM_LAYERS, Pin::Null),
    (flag::RECOMPUTE_MODULES, Pin::Null),
    // Primus' own: a shipped experiment (DeepSeek-V3 on MI355X) lists IDs, which Primus
    // refuses beside the block method the writer otherwise sets.
    (flag::RECOMPUTE_LAYER_IDS, Pin::Null),
    (flag::FINE_GRAINED_OFFLOAD, Pin::Off),
    (flag::OFFLOAD_MODULES, Pin::Null),
    (flag::FP8_FORMAT, Pin::Null),
    // Architecture.
    (flag::GQA, Pin::Off),
    (flag::SWIGLU, Pin::Off),
    (flag::UNTIE, Pin::Off),
    (flag::QK_LAYERNORM, Pin::Off),
    (flag::MLA, Pin::Off),
    (flag::QUERY_GROUPS, Pin::Null),
    (flag::KV_CHANNELS, Pin::Null),
    (flag::NUM_EXPERTS, Pin::Null),
    (flag::MOE_FFN_HIDDEN, Pin::Null),
    (flag::MOE_SHARED_FFN, Pin::Null),
    (flag::MOE_FIRST_DENSE, Pin::Value("1")),
    (flag::MOE_CAPACITY, Pin::Null),
    (flag::Q_LORA, Pin::Null),
    (flag::MTP_LAYERS, Pin::Null),
];

/// The Primus key of a Megatron flag.
pub fn key_of(f: &str) -> String {
    if f == flag::MOE_FIRST_DENSE {
        return MOE_LAYER_FREQ.to_string();
    }
    if let Some((_, k)) = NEGATED.iter().find(|(fl, _)| *fl == f) {
        return k.to_string();
    }
    match RENAMED.iter().find(|(fl, _)| *fl == f) {
        Some((_, k)) => k.to_string(),
        None => f.trim_start_matches('-').replace('-', "_"),
    }
}

/// The Megatron flag a Primus key sets; `None` for keys with dashes (Primus passes them to no
/// Megatron argument) and for keys read only together with another.
pub fn flag_of(key: &str) -> Option<String> {
    if key.is_empty() || key.contains(['-', '.']) || key == ZERO_BUBBLE_ENABLE {
        return None;
    }
    if key == MOE_LAYER_FREQ {
        return Some(flag::MOE_FIRST_DENSE.to_string());
    }
    if let Some((f, _)) = RENAMED.iter().find(|(_, k)| *k == key) {
        return Some(f.to_string());
    }
    if let Some((_, f)) = ALIASES.iter().find(|(k, _)| *k == key) {
        return Some(f.to_string());
    }
    Some(format!("--{}", key.replace('_', "-")))
}

/// The pin of a flag, if the writer pins it.
pub fn pin_of(f: &str) -> Option<Pin> {
    PINNED.iter().find(|(fl, _)| *fl == f).map(|(_, p)| *p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::megatron::is_switch;

    #[test]
    fn keys_are_argparse_dests_except_the_renamed() {
        assert_eq!(key_of(flag::TP), "tensor_model_parallel_size");
        assert_eq!(key_of(flag::RECOMPUTE_NUM_LAYERS), "recompute_num_layers");
        assert_eq!(key_of(flag::FSDP), "use_torch_fsdp2");
        assert_eq!(key_of(flag::FP8_FORMAT), "fp8");
        assert_eq!(key_of(flag::MOE_FIRST_DENSE), "moe_layer_freq");
        // A flag added to the Megatron table later has a key without a change here.
        assert_eq!(key_of("--some-new-flag"), "some_new_flag");
        for f in [
            flag::TP,
            flag::FP8_FORMAT,
            flag::VOCAB,
            flag::ZERO_BUBBLE,
            "--x-y",
        ] {
            assert_eq!(flag_of(&key_of(f)).as_deref(), Some(f), "{f}");
        }
        assert_eq!(
            flag_of("num_virtual_stages_per_pipeline_rank").as_deref(),
            Some(flag::VPP_SIZE)
        );
        // Primus drops dashed keys (they name no Megatron argument).
        assert_eq!(flag_of("micro-batch-size"), None);
        assert_eq!(flag_of("model.layers"), None);
    }

    #[test]
    fn switches_pin_off_and_values_pin_to_a_value() {
        for (f, p) in PINNED {
            assert_eq!(is_switch(f), *p == Pin::Off, "{f}: {p:?}");
        }
    }
}
