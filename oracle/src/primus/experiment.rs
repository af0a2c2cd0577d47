//! A Primus experiment YAML (examples/megatron/configs/*/*.yaml): the training module's model
//! preset and overrides, with `${VAR}` / `${VAR:default}` replaced as Primus's YAML loader
//! does (primus/core/config/yaml_loader.py) from the environment given.

use serde_json::Value;

use super::overrides::Overrides;
use super::presets;
use crate::FieldError;

/// The module Primus trains with `train pretrain` (primus/cli/subcommands/train.py), then
/// `train posttrain`'s.
pub const MODULES: &[&str] = &["pre_trainer", "post_trainer"];

/// What an experiment says about its training module.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Experiment {
    /// The module read (`pre_trainer`).
    pub module: String,
    /// Its `framework` (`megatron`).
    pub framework: Option<String>,
    /// Its model preset's stem (`llama3.1_70B`).
    pub model: Option<String>,
    /// Its overrides.
    pub overrides: Overrides,
}

impl Experiment {
    /// The built-in card of the experiment's model preset, if it has one.
    pub fn card(&self) -> Option<&'static str> {
        self.model
            .as_deref()
            .and_then(presets::by_primus)
            .map(|p| p.card)
    }
}

/// The most `${...}` references one file may hold (bounds the work on untrusted text).
const MAX_REFERENCES: usize = 10_000;

/// Replace `${VAR}` and `${VAR:default}` with `env(VAR)`, else the default (else nothing).
pub fn substitute(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, FieldError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut n = 0;
    while let Some(at) = rest.find("${") {
        n += 1;
        if n > MAX_REFERENCES {
            return Err(FieldError::new(
                "experiment",
                format!("more than {MAX_REFERENCES} ${{...}} references"),
            ));
        }
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[at..]);
            rest = "";
            break;
        };
        let inner = &after[..end];
        let (name, default) = match inner.split_once(':') {
            Some((n, d)) => (n, Some(d)),
            None => (inner, None),
        };
        let value = env(name.trim()).or_else(|| default.map(str::to_string));
        out.push_str(&value.unwrap_or_default());
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Read an experiment's training module (the first of [`MODULES`] it has, else its only
/// module).
pub fn parse(
    text: &str,
    source: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Experiment, FieldError> {
    let text = substitute(text, env)?;
    let doc = crate::parse::parse_yaml_value(&text, source)
        .map_err(|e| FieldError::new(source, e.to_string()))?;
    let modules = doc
        .get("modules")
        .and_then(Value::as_object)
        .ok_or_else(|| FieldError::new("modules", "missing: not a Primus experiment"))?;
    let name = MODULES
        .iter()
        .find(|m| modules.contains_key(**m))
        .map(|m| m.to_string())
        .or_else(|| {
            (modules.len() == 1)
                .then(|| modules.keys().next().cloned())
                .flatten()
        })
        .ok_or_else(|| {
            FieldError::new(
                "modules",
                format!(
                    "no {} module (has: {})",
                    MODULES.join(" or "),
                    modules.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )
        })?;
    let m = &modules[&name];
    let at = format!("modules.{name}");
    let text_of = |k: &str| m.get(k).and_then(Value::as_str).map(str::to_string);
    let overrides = match m.get("overrides") {
        None | Some(Value::Null) => Overrides::new(),
        Some(Value::Object(o)) => o.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Some(_) => {
            return Err(FieldError::new(
                format!("{at}.overrides"),
                "must be a mapping",
            ));
        }
    };
    Ok(Experiment {
        framework: text_of("framework"),
        model: text_of("model").map(|s| presets::stem(&s).to_string()),
        module: name,
        overrides,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_take_the_environment_then_the_default() {
        let env = |n: &str| (n == "PRIMUS_TP").then(|| "4".to_string());
        let t = substitute(
            "a: ${PRIMUS_TP:1}\nb: ${PRIMUS_PP:2}\nc: ${X}\nd: ${open",
            &env,
        )
        .unwrap();
        assert_eq!(t, "a: 4\nb: 2\nc: \nd: ${open");
    }

    #[test]
    fn reads_the_training_module() {
        let text = "modules:\n  pre_trainer:\n    framework: megatron\n    model: ${PRIMUS_MODEL:llama3_8B}.yaml\n    overrides:\n      micro_batch_size: 2\n      sequence_parallel: 1\n      recompute_granularity: null\n";
        let e = parse(text, "exp.yaml", &|_| None).unwrap();
        assert_eq!(e.module, "pre_trainer");
        assert_eq!(e.model.as_deref(), Some("llama3_8B"));
        assert_eq!(e.card(), Some("llama3.1-8b"));
        assert_eq!(e.overrides["micro_batch_size"], json!(2));
        assert_eq!(e.overrides["recompute_granularity"], Value::Null);
        let err = parse("a: 1\n", "x.yaml", &|_| None).unwrap_err();
        assert_eq!(err.field, "modules");
    }
}
