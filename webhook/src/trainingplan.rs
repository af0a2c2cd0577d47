//! TrainingPlan validation: the semantic rules a CRD schema cannot express on old API servers
//! (a legal layout for the model and cluster, known presets and profiles, GPUs divisible by
//! GPUs per node, sane tuning lists), through the oracle's own parser so the messages name the
//! same fields `primus tune -f plan.yaml` names.

use primus_crds::TrainingPlanSpec;
use primus_oracle::FieldError;
use primus_oracle::memory;
use primus_oracle::parse::from_value_at;
use primus_oracle::plan::SearcherKind;
use primus_oracle::profiles::Catalog;
use serde_json::Value;

use crate::bounds::{self, limits};
use crate::validate::{Reason, Verdict, gib1};

fn invalid(e: FieldError) -> Verdict {
    Verdict::deny(Reason::PlanInvalid, 422, e.to_string())
}

/// Values of `spec.tuning.allowed` and `spec.tuning.fixed` must be usable sizes.
fn check_tuning_lists(spec: &Value) -> Result<(), FieldError> {
    let Some(tuning) = spec.get("tuning") else {
        return Ok(());
    };
    if let Some(allowed) = tuning.get("allowed").and_then(Value::as_object) {
        for (axis, list) in allowed {
            let Some(list) = list.as_array() else {
                continue;
            };
            if list.is_empty() {
                return Err(FieldError::new(
                    format!("spec.tuning.allowed.{axis}"),
                    "must list at least one value (omit the axis to search all)",
                ));
            }
            for (i, v) in list.iter().enumerate() {
                if let Some(n) = v.as_u64()
                    && (n == 0 || n > limits::AXIS as u64)
                {
                    return Err(FieldError::new(
                        format!("spec.tuning.allowed.{axis}[{i}]"),
                        format!("{n} is not a size in 1..={}", limits::AXIS),
                    ));
                }
            }
        }
    }
    if let Some(fixed) = tuning.get("fixed").and_then(Value::as_object) {
        for (axis, v) in fixed {
            if axis == "recomputeLayers" {
                continue;
            }
            if let Some(n) = v.as_u64()
                && (n == 0 || n > limits::AXIS as u64)
            {
                return Err(FieldError::new(
                    format!("spec.tuning.fixed.{axis}"),
                    format!("{n} is not a size in 1..={}", limits::AXIS),
                ));
            }
        }
    }
    Ok(())
}

/// Decide a TrainingPlan CREATE or UPDATE (`data` is the object without metadata).
pub fn validate(name: &str, data: &Value, catalog: &Catalog) -> Verdict {
    let Some(spec) = data.get("spec") else {
        return invalid(FieldError::new("spec", "missing"));
    };
    let typed: TrainingPlanSpec = match from_value_at(spec.clone(), "spec") {
        Ok(t) => t,
        Err(e) => return invalid(e),
    };
    if let Err(e) = check_tuning_lists(spec) {
        return invalid(e);
    }
    let oracle_spec = match typed.to_oracle() {
        Ok(s) => s,
        Err(e) => return invalid(e),
    };
    if let Some(card) = &oracle_spec.model.card
        && let Err(e) = bounds::check_card(card, "spec.model.card.")
    {
        return invalid(e);
    }
    let t = &oracle_spec.training;
    if t.seq_length > limits::SEQ {
        return invalid(FieldError::new(
            "spec.training.seqLength",
            format!(
                "{} is beyond any real job (at most {})",
                t.seq_length,
                limits::SEQ
            ),
        ));
    }
    if t.global_batch_size > limits::GBS {
        return invalid(FieldError::new(
            "spec.training.globalBatchSize",
            format!(
                "{} is beyond any real job (at most {})",
                t.global_batch_size,
                limits::GBS
            ),
        ));
    }
    if oracle_spec.cluster.gpus as u64 > limits::WORLD {
        return invalid(FieldError::new(
            "spec.cluster.gpus",
            format!("is beyond any real job (at most {})", limits::WORLD),
        ));
    }
    let plan = match oracle_spec.resolve(name, catalog) {
        Ok(p) => p,
        Err(e) => return invalid(e),
    };
    if let Err(e) = primus_crds::agent::check_agent(&plan) {
        return invalid(e);
    }
    let Some(layout) = &plan.layout else {
        return Verdict::allow(Reason::PlanValid);
    };
    let field = |f: &str| format!("spec.parallelism.{f}");
    if let Err(e) = bounds::check_layout(layout, plan.scenario.cluster.gpus as u64, &field) {
        return invalid(e);
    }
    if let Err(e) = layout.check(&plan.scenario) {
        return invalid(FieldError::new(
            e.field,
            format!("{} (rule {})", e.message, e.rule),
        ));
    }
    let (peak, stage) = memory::peak_bytes(&plan.scenario, layout);
    let usable = plan.scenario.hardware.usable_bytes();
    let mut v = Verdict::allow(Reason::PlanValid);
    if peak.is_nan() || peak > usable {
        let then = if plan.tuning.searcher == SearcherKind::None {
            "the job it creates will be denied at admission"
        } else {
            "the tuner will only choose layouts that fit"
        };
        v.warnings.push(format!(
            "spec.parallelism: predicted {} GiB on pipeline stage {stage} > {} GiB usable on {}; {then}",
            gib1(peak),
            gib1(usable),
            plan.scenario.hardware.name.to_uppercase()
        ));
    }
    v
}
