//! TrainingPlan validation: the shared validator ([`TrainingPlanSpec::validate`], the same
//! the operator and `primus` run, with the operator's view of the agent searcher), so every
//! plan admitted here is one the operator accepts, and a denial names the same field the
//! operator's `Stalled` condition would. An admitted plan whose reference layout does not fit
//! in memory gets a warning.

use primus_crds::{Runner, TrainingPlanSpec};
use primus_oracle::FieldError;
use primus_oracle::memory;
use primus_oracle::parse::from_value_at;
use primus_oracle::plan::SearcherKind;
use primus_oracle::profiles::Catalog;
use serde_json::Value;

use crate::validate::{Reason, Verdict, gib1};

fn invalid(e: FieldError) -> Verdict {
    Verdict::deny(Reason::PlanInvalid, 422, e.to_string())
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
    let plan = match typed.validate(name, catalog, Runner::Cluster) {
        Ok(p) => p,
        Err(e) => return invalid(e),
    };
    if let Err(e) = primus_crds::agent::check_agent(&plan) {
        return invalid(e);
    }
    let Some(layout) = &plan.layout else {
        return Verdict::allow(Reason::PlanValid);
    };
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
