//! Primus model presets (`model: llama3.1_70B.yaml` in an experiment, the files of
//! primus/configs/models/megatron/) mapped to the built-in model cards
//! (profiles/models/*.yaml). A test reads the vendored Primus presets
//! (tests/data/primus/models/) and checks each mapped card against the architecture the
//! preset states.

use crate::model::ModelCard;

/// One Primus preset and the built-in card of the same architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// The preset's file stem in primus/configs/models/megatron/.
    pub primus: &'static str,
    /// The built-in model card.
    pub card: &'static str,
    /// Where Primus's preset differs from the card (which follows the published model), if
    /// anywhere.
    pub differs: Option<&'static str>,
}

const fn same(primus: &'static str, card: &'static str) -> Preset {
    Preset {
        primus,
        card,
        differs: None,
    }
}

/// Every built-in card Primus has a preset for; the first preset of a card is the one the
/// writer names (the other presets of the same architecture follow it).
pub const PRESETS: &[Preset] = &[
    same("llama2_7B", "llama2-7b"),
    same("llama2_70B", "llama2-70b"),
    same("llama3.1_8B", "llama3.1-8b"),
    // Llama 3 and 3.1 8B share the architecture (the context length differs).
    same("llama3_8B", "llama3.1-8b"),
    same("llama3.1_70B", "llama3.1-70b"),
    same("llama3_70B", "llama3.1-70b"),
    same("llama3.3_70B", "llama3.1-70b"),
    same("llama3.1_405B", "llama3.1-405b"),
    same("mixtral_8x7B_v0.1", "mixtral-8x7b"),
    same("mixtral_8x22B_v0.1", "mixtral-8x22b"),
    same("qwen3_30B_A3B", "qwen3-30b-a3b"),
    same("qwen3_235B_A22B", "qwen3-235b-a22b"),
    same("deepseek_v3", "deepseek-v3"),
    Preset {
        primus: "gpt_oss_120B",
        card: "gpt-oss-120b",
        differs: Some(
            "Primus's preset adds a 2880-wide shared expert to every layer (moe_shared_expert_intermediate_size: 2880) and QK layernorm (qk_layernorm: true, from deepseek_v2_base.yaml), which the published model does not have; the shared experts are under 1% of its parameters",
        ),
    },
];

/// A preset's stem from how an experiment names it: `llama3.1_70B.yaml`,
/// `models/megatron/llama3.1_70B.yaml` or `llama3.1_70B`.
pub fn stem(name: &str) -> &str {
    let base = name.trim().rsplit('/').next().unwrap_or(name);
    base.strip_suffix(".yaml")
        .or_else(|| base.strip_suffix(".yml"))
        .unwrap_or(base)
}

/// The preset entry of a Primus preset name.
pub fn by_primus(name: &str) -> Option<&'static Preset> {
    let s = stem(name);
    PRESETS.iter().find(|p| p.primus == s)
}

/// The Primus preset the writer names for a built-in card.
pub fn by_card(card: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.card == card)
}

/// The preset an experiment file's name starts with, as AMD's examples are named
/// (`llama3.1_70B-BF16-pretrain.yaml`): the longest preset followed by `-`.
pub fn in_file_name(path: &str) -> Option<&'static Preset> {
    let s = stem(path);
    PRESETS
        .iter()
        .filter(|p| {
            s.strip_prefix(p.primus)
                .is_some_and(|rest| rest.starts_with('-'))
        })
        .max_by_key(|p| p.primus.len())
}

/// Whether an experiment file's name says FP8 (`...-FP8-pretrain.yaml`).
pub fn fp8_in_file_name(path: &str) -> bool {
    stem(path).split(['-', '_']).any(|w| w == "FP8")
}

/// The card of a preset with a Primus preset's architecture keys applied: what
/// `--num_layers 4` on a DeepSeek-V3 preset (a proxy run) trains.
pub fn with_architecture(
    mut card: ModelCard,
    args: &crate::megatron::MegatronArgs,
) -> Result<ModelCard, crate::FieldError> {
    use crate::megatron::flag;
    fn num<T: std::str::FromStr>(
        args: &crate::megatron::MegatronArgs,
        f: &str,
    ) -> Result<Option<T>, crate::FieldError> {
        match args.get(f) {
            None => Ok(None),
            Some(v) => v
                .parse()
                .map(Some)
                .map_err(|_| crate::FieldError::new(f, format!("{v:?} is not a valid number"))),
        }
    }
    if let Some(n) = num(args, flag::NUM_LAYERS)? {
        card.layers = n;
    }
    if let Some(n) = num(args, flag::HIDDEN)? {
        card.hidden_size = n;
    }
    if let Some(n) = num(args, flag::FFN_HIDDEN)? {
        card.ffn_hidden_size = n;
    }
    if let Some(n) = num(args, flag::HEADS)? {
        card.attention_heads = n;
    }
    if let Some(n) = num(args, flag::QUERY_GROUPS)? {
        card.kv_heads = Some(n);
    }
    if let Some(n) = num(args, flag::MTP_LAYERS)? {
        card.mtp_layers = n;
    }
    if let Some(moe) = &mut card.moe {
        if let Some(n) = num(args, flag::NUM_EXPERTS)? {
            moe.num_experts = n;
        }
        if let Some(n) = num(args, flag::MOE_TOPK)? {
            moe.top_k = n;
        }
        if let Some(n) = num(args, flag::MOE_FFN_HIDDEN)? {
            moe.moe_ffn_hidden_size = n;
        }
        if let Some(n) = num(args, flag::MOE_FIRST_DENSE)? {
            moe.dense_layers = n;
        }
    }
    Ok(card)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::Catalog;

    #[test]
    fn every_mapped_card_is_built_in_and_names_are_found() {
        let c = Catalog::builtin().unwrap();
        for p in PRESETS {
            assert!(c.model(p.card).is_some(), "{} -> {}", p.primus, p.card);
        }
        assert_eq!(by_primus("llama3.1_70B.yaml").unwrap().card, "llama3.1-70b");
        assert_eq!(by_primus("x/y/llama3_8B").unwrap().card, "llama3.1-8b");
        assert_eq!(by_card("llama3.1-70b").unwrap().primus, "llama3.1_70B");
        let f = in_file_name("examples/megatron/configs/MI300X/llama3.1_70B-BF16-pretrain.yaml");
        assert_eq!(f.unwrap().primus, "llama3.1_70B");
        assert_eq!(
            in_file_name("llama3_70B-FP8-pretrain.yaml").unwrap().primus,
            "llama3_70B"
        );
        assert!(in_file_name("llama3.1_70Bx-pretrain.yaml").is_none());
        assert!(fp8_in_file_name("qwen3_30B_A3B-FP8-pretrain.yaml"));
        assert!(!fp8_in_file_name("qwen3_30B_A3B-BF16-pretrain.yaml"));
    }
}
