//! Hostile input against the shared TrainingPlan validator and the oracle's parsers of
//! untrusted text (issue 13): generated plans (huge numbers, wrong types, long and unicode
//! strings, long lists, deep nesting, hostile pipeline layouts), pipeline layouts and
//! Megatron argument lists. Every case runs in a thread with a 512 KiB stack under a time and
//! an allocation budget, in a child process capped at 4 GiB of address space
//! ([`primus_tests::hostile`]); it must answer (valid, or one line naming a field), never
//! panic, overflow its stack or allocate without bound.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use primus_crds::{Runner, TrainingPlanSpec};
use primus_oracle::FieldError;
use primus_oracle::layout::PipelineLayout;
use primus_oracle::megatron::MegatronArgs;
use primus_oracle::model::ModelCard;
use primus_oracle::profiles::Catalog;
use primus_tests::hostile::{self, Budget, Cases, Counting, inputs};
use serde_json::Value;

#[global_allocator]
static ALLOC: Counting = Counting;

const BUDGET: Budget = Budget {
    stack: 512 * 1024,
    time: Duration::from_secs(60),
    bytes: 512 << 20,
};

const ADDRESS_SPACE: u64 = 4 << 30;

/// A rejection is one line naming a field, and short.
fn one_line(e: &FieldError) -> Result<(), String> {
    let text = e.to_string();
    if e.field.is_empty() || text.contains('\n') || text.chars().count() > 2_000 {
        return Err(format!(
            "not one short line naming a field: {}",
            hostile::short(&text)
        ));
    }
    Ok(())
}

/// Outcomes of the validator cases: "valid", "unparsable" or the top of the field named.
static OUTCOMES: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

fn count(outcome: &str) {
    if let Ok(mut m) = OUTCOMES.lock() {
        *m.entry(outcome.to_string()).or_default() += 1;
    }
}

/// Decode a generated spec the way the API server's JSON reaches the operator and the CLI's
/// plan files reach the validator, then validate it as both.
fn validate(catalog: &Catalog, spec: &Value, depth: usize) -> Result<(), String> {
    let text = inputs::expand_deep(spec, depth);
    let Ok(value) = serde_json::from_str::<Value>(&text) else {
        // Nesting beyond serde_json's recursion limit: a parse error, the case is answered.
        count("unparsable");
        return Ok(());
    };
    let spec = match TrainingPlanSpec::from_json(value) {
        Ok(s) => s,
        Err(e) => {
            count("undecodable");
            return one_line(&e);
        }
    };
    for runner in [Runner::Cluster, Runner::Cli] {
        match spec.validate("hostile", catalog, runner) {
            Err(e) => {
                one_line(&e)?;
                if runner == Runner::Cluster {
                    count(
                        e.field
                            .split('.')
                            .take(2)
                            .collect::<Vec<_>>()
                            .join(".")
                            .as_str(),
                    );
                }
            }
            Ok(_) if runner == Runner::Cluster => count("valid"),
            Ok(_) => {}
        }
    }
    Ok(())
}

#[test]
fn shared_validator_in_a_capped_child() {
    hostile::in_capped_child("shared_validator_cases", ADDRESS_SPACE);
}

#[test]
fn shared_validator_cases() {
    if !hostile::is_child() {
        return;
    }
    let catalog = Arc::new(Catalog::builtin().expect("built-in profiles"));
    Cases {
        entry: "shared validator (TrainingPlanSpec::validate)",
        cases: hostile::cases(500),
        budget: BUDGET,
    }
    .run(inputs::plan_spec(), move |(spec, depth)| {
        validate(&catalog, &spec, depth)
    });
    if let Ok(m) = OUTCOMES.lock() {
        println!("validator outcomes: {m:?}");
    }
}

#[test]
fn parsers_in_a_capped_child() {
    hostile::in_capped_child("parser_cases", ADDRESS_SPACE);
}

#[test]
fn parser_cases() {
    if !hostile::is_child() {
        return;
    }
    Cases {
        entry: "pipeline layout parser (PipelineLayout::parse and deserialize)",
        cases: hostile::cases(500),
        budget: BUDGET,
    }
    .run(inputs::layout_text(), |text| {
        let parsed = PipelineLayout::parse(&text);
        let read: PipelineLayout =
            serde_json::from_value(Value::String(text)).map_err(|e| e.to_string())?;
        match (parsed, read.error()) {
            (Ok(p), None) if p == read => Ok(()),
            (Err(a), Some(b)) if a == b && !a.contains('\n') && a.len() < 200 => Ok(()),
            (a, b) => Err(format!("parse and deserialize disagree: {a:?} / {b:?}")),
        }
    });
    let card: ModelCard = serde_json::from_value(serde_json::json!({
        "layers": 32, "hiddenSize": 4096, "ffnHiddenSize": 14336, "attentionHeads": 32,
        "kvHeads": 8, "vocabSize": 128256, "activation": "swiglu", "norm": "rmsnorm"
    }))
    .expect("a card");
    Cases {
        entry: "Megatron arguments (MegatronArgs::parse, check_bounds, model_card, layout, training)",
        cases: hostile::cases(500),
        budget: BUDGET,
    }
    .run(inputs::megatron_args(), move |words| {
        let args = MegatronArgs::parse(words.iter().map(String::as_str));
        if let Err(e) = args.check_bounds() {
            return one_line(&e);
        }
        if let Ok(Some(c)) = args.model_card() {
            let _ = c.validate("megatron flags").map_err(|e| one_line(&e));
        }
        match args.layout(&card) {
            Ok(l) => {
                let _ = l.label();
            }
            Err(e) => one_line(&e)?,
        }
        if let Err(e) = args.training() {
            one_line(&e)?;
        }
        Ok(())
    });
}
