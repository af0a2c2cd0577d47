//! Hostile TrainingPlans through the operator's decide path (issue 13): the spec decoded as the
//! controller decodes it, validated (`choose::validate`, the shared validator), tuned with a
//! search budget (`choose::choose_within`) and turned into the status decision
//! (`decide::chosen`). Each plan runs in a thread with a 512 KiB stack under a time and an
//! allocation budget, in a child process capped at 6 GiB of address space
//! ([`primus_tests::hostile`]): it must end in a decision (Stalled naming a field, or a chosen
//! layout) without panicking, overflowing its stack, allocating without bound or searching
//! past its budget. Hostile BenchmarkReports (genuine simulated ones with hostile values,
//! absurd medians, thousands of measurements) are decoded as the controller decodes them
//! (`decode_reports`: the CRD's bounds apply) and those kept go the same way as the plan's
//! report.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::DynamicObject;
use primus_crds::TrainingPlanSpec;
use primus_operator::benchmark::decode_reports;
use primus_operator::choose;
use primus_operator::decide::{self, Next};
use primus_operator::kubeapi::report_resource;
use primus_oracle::plan::Plan;
use primus_oracle::profiles::Catalog;
use primus_oracle::report::BenchmarkResults;
use primus_tests::hostile::{self, Budget, Cases, Counting, inputs};
use proptest::strategy::Just;
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
    decide_with(&plan, None)
}

/// A valid plan (and its report) through choose -> decide: a decision, a finite projection,
/// within the search budget.
fn decide_with(plan: &Plan, report: Option<&BenchmarkResults>) -> Result<(), String> {
    let start = Instant::now();
    let result = choose::choose_within(plan, report, None, SEARCH);
    let took = start.elapsed();
    if took > SEARCH + Duration::from_secs(30) {
        return Err(format!(
            "the search took {took:?} with a budget of {SEARCH:?}"
        ));
    }
    match decide::chosen(result).next {
        Next::Go(c) => {
            let (tps, step) = (
                c.chosen.tokens_per_second_per_gpu,
                c.chosen.step_time_seconds,
            );
            if !(tps.is_finite() && tps > 0.0 && step.is_finite() && step > 0.0) {
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
        cases: hostile::cases(100),
        budget: BUDGET,
    }
    .run(inputs::plan_spec(), move |(spec, depth)| {
        decide_path(&catalog, &spec, depth)
    });
    if let Ok(m) = OUTCOMES.lock() {
        println!("operator outcomes: {m:?}");
    }
}

/// The plans the hostile reports are for (one with a reference layout and no search, one
/// searched), with the genuine report of each: a simulated run on one node.
fn report_bases(catalog: &Catalog) -> Vec<(Plan, Value)> {
    [
        r#"{"model": {"preset": "llama3.1-8b"}, "cluster": {"gpu": "h100-sxm", "gpus": 16},
            "training": {"seqLength": 4096, "globalBatchSize": 64},
            "parallelism": {"tp": 4, "pp": 2}, "tuning": {"searcher": "none"}}"#,
        r#"{"model": {"preset": "mixtral-8x7b"}, "cluster": {"gpu": "h100-sxm", "gpus": 16},
            "training": {"seqLength": 4096, "globalBatchSize": 64},
            "parallelism": {"tp": 2, "ep": 8}, "tuning": {"searcher": "seed", "topK": 3}}"#,
    ]
    .iter()
    .map(|text| {
        let spec: TrainingPlanSpec = serde_json::from_str(text).expect("a base plan");
        let plan = choose::validate(&spec, "hostile", catalog).expect("a valid base plan");
        // With the kernels of its finalists, as the operator's benchmark pod times them.
        let finalists = primus_oracle::calibrate::finalists::analytic_finalists(&plan, 3, None);
        let report = primus_oracle::bench::simulate::simulate_with_finalists(
            &plan,
            &finalists,
            Default::default(),
        );
        let value = serde_json::to_value(&report).expect("a report serializes");
        (plan, value)
    })
    .collect()
}

#[test]
fn operator_reports_in_a_capped_child() {
    hostile::in_capped_child("operator_report_cases", ADDRESS_SPACE);
}

#[test]
fn operator_report_cases() {
    if !hostile::is_child() {
        return;
    }
    let catalog = Catalog::builtin().expect("built-in profiles");
    let bases = report_bases(&catalog);
    let plans: Arc<Vec<Plan>> = Arc::new(bases.iter().map(|(p, _)| p.clone()).collect());
    let reports = proptest::strategy::Union::new(
        bases
            .into_iter()
            .enumerate()
            .map(|(i, (_, v))| (Just(i), inputs::report(v), inputs::depth())),
    );
    Cases {
        entry: "operator decide path with a BenchmarkReport (decode, calibrate, choose_within, decide::chosen)",
        cases: hostile::cases(200),
        budget: BUDGET,
    }
    .run(reports, move |(i, report, depth)| {
        // The controller decodes reports from the API server's JSON, object by object, and
        // keeps those within the CRD's bounds (`benchmark::observe::decode_reports`).
        let results = if inputs::has_deep(&report) {
            let Some(text) = inputs::expand_deep_within(&report, depth, inputs::MAX_REQUEST_BYTES)
            else {
                count("report larger than the API server takes");
                return Ok(());
            };
            match serde_json::from_str::<Value>(&text) {
                Ok(v) => v,
                Err(_) => {
                    count("report nested past what JSON readers take");
                    return Ok(());
                }
            }
        } else {
            report
        };
        let mut object = DynamicObject::new("hostile-bench", &report_resource());
        object.data = serde_json::json!({"spec": {"plan": "hostile", "results": results}});
        let (mut good, bad) = decode_reports(vec![object]);
        let Some(report) = good.pop() else {
            if bad.iter().any(|(_, why)| why.contains('\n') || why.is_empty()) {
                return Err(format!("a refusal that is not one line: {bad:?}"));
            }
            count("report refused at decode");
            return Ok(());
        };
        decide_with(&plans[i], Some(&report.spec.results))
    });
    if let Ok(m) = OUTCOMES.lock() {
        println!("operator report outcomes: {m:?}");
    }
}
