//! Primus overrides: `key: value` pairs (an experiment's `overrides`, or the words after
//! `train pretrain --config exp.yaml`), read as Primus reads them and turned into Megatron
//! flags, and the other way: the Megatron flags of a layout as Primus overrides.
//!
//! Parsing follows Primus's `parse_cli_overrides` (primus/core/utils/arg_utils.py):
//! `key=value`, `--key=value` and `--key value` set a key, a bare `--key` sets it true, other
//! words are skipped; values become booleans (`true`/`false` in any case), `None`, lists
//! (`[a, b]`), integers, floats, else strings ("modern" coercion). The last setting wins.

use std::collections::BTreeMap;

use serde_json::Value;

use super::keys::{self, ALSO_WRITTEN, MOE_LAYER_FREQ, Pin, ZERO_BUBBLE_ENABLE};
use crate::megatron::{flag, is_list, is_switch};

/// Overrides by key (the last setting of a key wins).
pub type Overrides = BTreeMap<String, Value>;

/// A command-line value as Primus coerces it.
pub fn coerce(raw: &str) -> Value {
    let v = raw.trim();
    match v.to_ascii_lowercase().as_str() {
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if v == "None" {
        return Value::Null;
    }
    if let Some(inner) = v
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .or_else(|| v.strip_prefix('(').and_then(|s| s.strip_suffix(')')))
    {
        // Python's literal_eval: items are quoted strings or literals; `[a, b]` with bare
        // names is no literal and stays a string.
        let items: Option<Vec<Value>> = inner
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(|w| {
                let quoted = ['\'', '"'].iter().find_map(|q| {
                    w.strip_prefix(*q)
                        .and_then(|x| x.strip_suffix(*q))
                        .map(|x| Value::String(x.to_string()))
                });
                quoted.or_else(|| Some(coerce(w)).filter(|c| !c.is_string()))
            })
            .collect();
        if let Some(items) = items {
            return Value::Array(items);
        }
        return Value::String(v.to_string());
    }
    if let Ok(n) = v.parse::<i64>() {
        return Value::from(n);
    }
    if v.contains('.')
        && let Ok(x) = v.parse::<f64>()
        && x.is_finite()
    {
        return Value::from(x);
    }
    Value::String(v.to_string())
}

/// Parse override words as Primus does; returns the overrides and the words it skips.
pub fn parse(words: &[String]) -> (Overrides, Vec<String>) {
    let mut out = Overrides::new();
    let mut skipped = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i].trim();
        i += 1;
        if w.is_empty() {
            continue;
        }
        if let Some((k, v)) = w.split_once('=') {
            out.insert(k.trim_start_matches('-').trim().to_string(), coerce(v));
            continue;
        }
        if let Some(k) = w.strip_prefix("--") {
            match words.get(i).filter(|n| !n.starts_with("--")) {
                Some(v) => {
                    out.insert(k.to_string(), coerce(v));
                    i += 1;
                }
                None => {
                    out.insert(k.to_string(), Value::Bool(true));
                }
            }
            continue;
        }
        skipped.push(w.to_string());
    }
    (out, skipped)
}

/// Python's truthiness of a coerced value (`sequence_parallel: 1` is on).
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(if *b { "1" } else { "0" }.into()),
        _ => None,
    }
}

/// Dense-first layers from a `moe_layer_freq` pattern: `([0]*3+[1]*58)` -> 3; `1` -> 0;
/// a list `[0, 0, 1, ...]` -> its leading zeros. `None` for other patterns (a dense layer
/// every k-th layer: the oracle's cards have no such layout).
pub fn dense_first_layers(v: &Value) -> Option<u32> {
    match v {
        Value::Number(n) if n.as_u64() == Some(1) => Some(0),
        Value::Array(a) => {
            let zeros = a.iter().take_while(|x| x.as_u64() == Some(0)).count();
            let rest_ones = a[zeros..].iter().all(|x| x.as_u64() == Some(1));
            rest_ones.then_some(zeros as u32)
        }
        Value::String(s) => {
            let t: String = s.chars().filter(|c| !c.is_whitespace()).collect();
            if t == "1" {
                return Some(0);
            }
            let inner = t.strip_prefix('(')?.strip_suffix(')')?;
            let (dense, moe) = inner.split_once('+')?;
            let n = dense.strip_prefix("[0]*")?.parse().ok()?;
            moe.strip_prefix("[1]*")?.parse::<u32>().ok()?;
            Some(n)
        }
        _ => None,
    }
}

/// Overrides as Megatron command-line words (for [`crate::megatron::MegatronArgs::parse`]),
/// and notes on keys Primus ignores. Switches are present when their value is true; `None`
/// values are left out (Megatron's default).
pub fn to_megatron(overrides: &Overrides) -> (Vec<String>, Vec<String>) {
    let mut words = Vec::new();
    let mut notes = Vec::new();
    let dashed: Vec<&str> = overrides
        .keys()
        .filter(|k| k.contains('-'))
        .map(String::as_str)
        .collect();
    if !dashed.is_empty() {
        notes.push(format!(
            "Primus ignores the overrides {}: its keys are Megatron's argument names with underscores (e.g. micro_batch_size)",
            dashed.join(", ")
        ));
    }
    for (key, value) in overrides {
        let Some(f) = keys::flag_of(key) else {
            continue;
        };
        if key == MOE_LAYER_FREQ {
            if let Some(n) = dense_first_layers(value).filter(|n| *n > 0) {
                words.extend([f, n.to_string()]);
            }
            continue;
        }
        if f == flag::ZERO_BUBBLE {
            let enabled = overrides.get(ZERO_BUBBLE_ENABLE).is_none_or(truthy);
            if truthy(value) && enabled {
                words.push(f);
            }
            continue;
        }
        if is_switch(&f) {
            if truthy(value) {
                words.push(f);
            }
            continue;
        }
        match value {
            Value::Null => {}
            Value::Array(items) if is_list(&f) => {
                words.push(f);
                words.extend(items.iter().filter_map(scalar));
            }
            v => {
                if let Some(s) = scalar(v).filter(|s| !s.contains(char::is_whitespace)) {
                    words.push(format!("{f}={s}"));
                }
            }
        }
    }
    (words, notes)
}

/// How a value is written on a Primus command line (`True`, `None`, `['a', 'b']`).
fn written(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(|x| format!("'{}'", written(x))).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(_) => v.to_string(),
    }
}

/// The Megatron flags of a layout and model ([`crate::megatron::megatron_flags`]) as Primus
/// overrides `(key, value)` in a stable order: the flags' keys in their order, the keys
/// written along with some ([`ALSO_WRITTEN`]), then the pinned keys the flags leave out
/// ([`keys::PINNED`]).
pub fn from_flags(flags: &[String]) -> Vec<(String, String)> {
    let layers = flags
        .iter()
        .position(|f| f == flag::NUM_LAYERS)
        .and_then(|i| flags.get(i + 1))
        .and_then(|v| v.parse::<u32>().ok());
    let mut out: Vec<(String, Value)> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    let mut i = 0;
    while i < flags.len() {
        let f = flags[i].as_str();
        i += 1;
        if !f.starts_with("--") {
            continue;
        }
        seen.push(f);
        let mut values = Vec::new();
        while let Some(v) = flags.get(i).filter(|v| !v.starts_with("--")) {
            values.push(v.clone());
            i += 1;
            if !is_list(f) {
                break;
            }
        }
        let value = if keys::NEGATED.iter().any(|(fl, _)| *fl == f) {
            Value::Bool(false)
        } else if f == flag::MOE_FIRST_DENSE {
            let n: u32 = values.first().and_then(|v| v.parse().ok()).unwrap_or(0);
            let moe = layers.unwrap_or(n).saturating_sub(n);
            Value::String(format!("([0]*{n}+[1]*{moe})"))
        } else if is_list(f) {
            Value::Array(values.into_iter().map(Value::String).collect())
        } else if let Some(v) = values.into_iter().next() {
            Value::String(v)
        } else {
            Value::Bool(true)
        };
        out.push((keys::key_of(f), value.clone()));
        for (fl, extra) in ALSO_WRITTEN {
            if *fl == f {
                out.push((extra.to_string(), value.clone()));
            }
        }
    }
    for (f, pin) in keys::PINNED {
        if seen.contains(f) {
            continue;
        }
        let value = match pin {
            Pin::Off => Value::Bool(false),
            Pin::Null => Value::Null,
            Pin::Value(v) => Value::String(v.to_string()),
        };
        out.push((keys::key_of(f), value));
    }
    // One setting per key: the first (a flag's own value beats a pin of the same key).
    let mut unique: Vec<(String, String)> = Vec::new();
    for (k, v) in out {
        if !unique.iter().any(|(u, _)| *u == k) {
            unique.push((k, written(&v)));
        }
    }
    unique
}

/// [`from_flags`] as command-line words: `--key value` pairs.
pub fn override_words(flags: &[String]) -> Vec<String> {
    from_flags(flags)
        .into_iter()
        .flat_map(|(k, v)| [format!("--{k}"), v])
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn a_negated_megatron_switch_is_its_argument_set_false() {
        // `--no-gradient-accumulation-fusion` (torch FSDP2 asserts the fusion off) is Megatron's
        // `gradient_accumulation_fusion` set to false; Primus reads that key.
        let o = from_flags(&words(
            "--use-torch-fsdp2 --no-gradient-accumulation-fusion",
        ));
        let get = |k: &str| o.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
        assert_eq!(
            get("gradient_accumulation_fusion"),
            Some(written(&Value::Bool(false)))
        );
        assert_eq!(get("use_torch_fsdp2"), Some(written(&Value::Bool(true))));
        assert_eq!(get("no_gradient_accumulation_fusion"), None);
    }

    #[test]
    fn both_forms_and_bare_flags_parse_as_primus_does() {
        let (o, skipped) = parse(&words(
            "--micro_batch_size 2 global_batch_size=128 --seq_length=4096 --use_torch_fsdp2 \
             --sequence_parallel False stray --recompute_modules ['core_attn','mlp'] --lr 1.0e-5 \
             --fp8 None --micro_batch_size 3 --bare [a,b]",
        ));
        assert_eq!(o["micro_batch_size"], json!(3), "the last setting wins");
        assert_eq!(o["global_batch_size"], json!(128));
        assert_eq!(o["seq_length"], json!(4096));
        assert_eq!(o["use_torch_fsdp2"], json!(true));
        assert_eq!(o["sequence_parallel"], json!(false));
        assert_eq!(o["recompute_modules"], json!(["core_attn", "mlp"]));
        assert_eq!(o["lr"], json!(1.0e-5));
        assert_eq!(o["fp8"], Value::Null);
        assert_eq!(
            o["bare"],
            json!("[a,b]"),
            "bare names are no Python literal"
        );
        assert_eq!(skipped, ["stray"]);
    }

    #[test]
    fn moe_layer_freq_patterns_give_dense_first_layers() {
        assert_eq!(dense_first_layers(&json!("([0]*3+[1]*58)")), Some(3));
        assert_eq!(dense_first_layers(&json!("( [0]*1 + [1]*26 )")), Some(1));
        assert_eq!(dense_first_layers(&json!(1)), Some(0));
        assert_eq!(dense_first_layers(&json!("1")), Some(0));
        assert_eq!(dense_first_layers(&json!([0, 0, 1, 1])), Some(2));
        assert_eq!(dense_first_layers(&json!("([1]*3+[0]*1)*2")), None);
        assert_eq!(dense_first_layers(&json!([1, 0, 1])), None);
    }

    #[test]
    fn overrides_become_megatron_words() {
        let (o, _) = parse(&words(
            "--tensor_model_parallel_size 4 --sequence_parallel 1 --use_distributed_optimizer false \
             --recompute_granularity full --recompute_num_layers 2 --recompute_modules ['mlp'] \
             --fp8 hybrid --patch_zero_bubble True --moe_layer_freq ([0]*3+[1]*58) --seq-length 9",
        ));
        let (w, notes) = to_megatron(&o);
        let text = w.join(" ");
        for want in [
            "--tensor-model-parallel-size=4",
            "--sequence-parallel",
            "--recompute-granularity=full",
            "--recompute-num-layers=2",
            "--recompute-modules mlp",
            "--fp8-format=hybrid",
            "--enable-zero-bubble",
            "--moe-first-k-dense-replace 3",
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        assert!(!text.contains("--use-distributed-optimizer"), "{text}");
        assert!(
            !text.contains("--seq-length"),
            "a dashed key sets nothing: {text}"
        );
        assert!(notes[0].contains("seq-length"), "{notes:?}");
        // Zero bubble needs both keys.
        let (o, _) = parse(&words(
            "--patch_zero_bubble True --enable_zero_bubble False",
        ));
        assert!(to_megatron(&o).0.is_empty());
        let (o, _) = parse(&words("--enable_zero_bubble True"));
        assert!(to_megatron(&o).0.is_empty());
    }

    #[test]
    fn flags_become_overrides_with_pins_for_what_they_leave_out() {
        let flags = words(
            "--tensor-model-parallel-size 2 --virtual-pipeline-model-parallel-size 5 \
             --recompute-granularity selective --recompute-modules core_attn mlp --bf16 \
             --num-layers 61 --moe-first-k-dense-replace 3 --padded-vocab-size 129280 --enable-zero-bubble",
        );
        let o = from_flags(&flags);
        let get = |k: &str| o.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
        assert_eq!(get("tensor_model_parallel_size"), Some("2"));
        assert_eq!(get("virtual_pipeline_model_parallel_size"), Some("5"));
        assert_eq!(get("num_virtual_stages_per_pipeline_rank"), Some("5"));
        assert_eq!(get("recompute_modules"), Some("['core_attn','mlp']"));
        assert_eq!(get("bf16"), Some("True"));
        assert_eq!(get("moe_layer_freq"), Some("([0]*3+[1]*58)"));
        assert_eq!(get("vocab_size"), Some("129280"));
        assert_eq!(get("patch_zero_bubble"), Some("True"));
        assert_eq!(get("enable_zero_bubble"), Some("True"));
        // Pinned: what the layout leaves out keeps its meaning whatever Primus's defaults.
        assert_eq!(get("sequence_parallel"), Some("False"));
        assert_eq!(get("use_distributed_optimizer"), Some("False"));
        assert_eq!(get("recompute_num_layers"), Some("None"));
        assert_eq!(get("expert_model_parallel_size"), Some("1"));
        let keys: Vec<&str> = o.iter().map(|(k, _)| k.as_str()).collect();
        let mut unique = keys.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), keys.len(), "one setting per key: {keys:?}");
    }
}
