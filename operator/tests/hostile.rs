//! Hostile TrainingPlans through the operator's decide path (issue 13): the spec decoded as the
//! controller decodes it, validated (`choose::validate`, the shared validator), tuned with a
//! search budget (`choose::choose_within`) and turned into the status decision
//! (`decide::chosen`). Each plan runs in a thread with a 512 KiB stack under a time and an
//! allocation budget, in a child process capped at 6 GiB of address space
//! ([`primus_tests::hostile`]): it must end in a decision (Stalled naming a field, or a chosen
//! layout) without panicking, overflowing its stack, allocating without bound or searching
//! past its budget.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use primus_crds::TrainingPlanSpec;
use primus_operator::choose;
use primus_operator::decide::{self, Next};
use primus_oracle::profiles::Catalog;
use primus_tests::hostile::{self, Budget, Cases, Counting, inputs};
use serde_json::Value;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The search budget of a case, and how far past it the case may end (the searchers check
/// the deadline between units of work; this is a debug build).
const SEARCH: Duration = Duration::from_secs(2);
const BUDGET: Budget = Budget {
    stack: 512 * 1024,
    time: Duration::from_secs(90),
    bytes: 1 << 30,
};

const ADDRESS_SPACE: u64 = 6 << 30;

/// Decisions of the cases.
static OUTCOMES: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

fn count(outcome: &str) {
    if let Ok(mut m) = OUTCOMES.lock() {
        *m.entry(outcome.to_string()).or_default() += 1;
    }
}

/// One plan through validate -> choose -> decide.
fn decide_path(catalog: &Catalog, spec: &Value, depth: usize) -> Result<(), String> {
    let text = inputs::expand_deep(spec, depth);
    // The controller decodes the object from the API server's JSON (serde_json).
    let Ok(spec) = serde_json::from_str::<TrainingPlanSpec>(&text) else {
        count("undecodable");
        return Ok(());
    };
    let plan = match choose::validate(&spec, "hostile", catalog) {
        Ok(p) => p,
        Err(e) => {
            let halt = decide::invalid(&e);
            let stalled = halt.conditions.get("Stalled").map(|v| v.message.clone());
            if e.to_string().contains('\n') || stalled.is_none() {
                return Err(format!("no one-line Stalled condition: {e}"));
            }
            count("stalled: invalid spec");
            return Ok(());
        }
    };
    let start = Instant::now();
    let result = choose::choose_within(&plan, None, SEARCH);
    let took = start.elapsed();
    if took > SEARCH + Duration::from_secs(30) {
        return Err(format!(
            "the search took {took:?} with a budget of {SEARCH:?}"
        ));
    }
    match decide::chosen(result).next {
        Next::Go(c) => {
            if !c.chosen.tokens_per_second_per_gpu.is_finite() {
                return Err(format!("a non-finite projection: {:?}", c.chosen));
            }
            count("chosen");
        }
        Next::Halt(h) => count(&format!("halted: {:?}", h.phase)),
    }
    Ok(())
}

#[test]
fn operator_decide_path_in_a_capped_child() {
    hostile::in_capped_child("operator_decide_path_cases", ADDRESS_SPACE);
}

#[test]
fn operator_decide_path_cases() {
    if !hostile::is_child() {
        return;
    }
    let catalog = Arc::new(Catalog::builtin().expect("built-in profiles"));
    Cases {
        entry: "operator decide path (validate, choose_within, decide::chosen)",
        cases: hostile::cases(300),
        budget: BUDGET,
    }
    .run(inputs::plan_spec(), move |(spec, depth)| {
        decide_path(&catalog, &spec, depth)
    });
    if let Ok(m) = OUTCOMES.lock() {
        println!("operator outcomes: {m:?}");
    }
}
