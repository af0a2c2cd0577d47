//! Hostile admission requests against the webhook's request handler (`admission::handle`,
//! issue 13): PyTorchJobs with hostile `primus.dev/*` annotations (layouts with 300,000 `(`,
//! deep JSON, huge sizes, long and unicode strings), hostile Megatron arguments (huge values,
//! pipeline layouts, tens of thousands of words, `bash -c` scripts) and replica counts, and
//! TrainingPlans from the shared generator. Each request runs in a thread with a 512 KiB
//! stack under a time and an allocation budget, in a child process capped at 4 GiB of
//! address space ([`primus_tests::hostile`]): it must be answered (200 or 400, an
//! AdmissionReview), never panic (a caught panic shows as reason `internal`), overflow its
//! stack or allocate without bound.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use primus_tests::hostile::{self, Budget, Cases, Counting, inputs};
use primus_webhook::admission::{Endpoint, handle, review_for};
use primus_webhook::validate::{Reason, Validator};
use serde_json::{Value, json};

#[global_allocator]
static ALLOC: Counting = Counting;

const BUDGET: Budget = Budget {
    stack: 512 * 1024,
    time: Duration::from_secs(60),
    bytes: 512 << 20,
};

const ADDRESS_SPACE: u64 = 4 << 30;

/// Decisions of the cases, by reason.
static OUTCOMES: Mutex<BTreeMap<String, u32>> = Mutex::new(BTreeMap::new());

/// Answer one request body; the checks of `webhook/tests/fuzz.rs`.
fn answered(v: &Validator, ep: Endpoint, body: &[u8]) -> Result<(), String> {
    let reply = handle(v, ep, body, Instant::now() + Duration::from_secs(2));
    if let Ok(mut m) = OUTCOMES.lock() {
        *m.entry(format!("{} {}", ep.kind(), reply.reason.as_str()))
            .or_default() += 1;
    }
    if reply.status != 200 && reply.status != 400 {
        return Err(format!("status {}", reply.status));
    }
    let answer: Value = serde_json::from_slice(&reply.body).map_err(|e| e.to_string())?;
    if answer["kind"] != "AdmissionReview" || !answer["response"]["allowed"].is_boolean() {
        return Err("not an AdmissionReview".into());
    }
    if reply.reason == Reason::Internal {
        return Err(format!("the check failed internally: {}", reply.message));
    }
    if reply.message.chars().count() > 4_000 {
        return Err(format!("a {}-character message", reply.message.len()));
    }
    Ok(())
}

/// A review of `object` (CREATE), with every deep-nesting marker expanded in its text.
fn body(object: &Value, depth: usize, kind: Option<Value>) -> Vec<u8> {
    let mut r = review_for(object, "CREATE", None, false, "hostile");
    if let Some(k) = kind {
        r["request"]["kind"] = k.clone();
        r["request"]["requestKind"] = k;
    }
    inputs::expand_deep(&r, depth).into_bytes()
}

#[test]
fn webhook_handle_in_a_capped_child() {
    hostile::in_capped_child("webhook_handle_cases", ADDRESS_SPACE);
}

#[test]
fn webhook_handle_cases() {
    if !hostile::is_child() {
        return;
    }
    let v = Arc::new(common::validator());
    let strict = Arc::new(common::strict_validator());
    Cases {
        entry: "webhook handle: PyTorchJob (annotations, Megatron args, replicas)",
        cases: hostile::cases(250),
        budget: BUDGET,
    }
    .run(inputs::pytorchjob(), move |job| {
        let b = body(&job, 1, None);
        answered(&v, Endpoint::PyTorchJob { strict: false }, &b)?;
        answered(&strict, Endpoint::PyTorchJob { strict: true }, &b)
    });
    let v = Arc::new(common::validator());
    Cases {
        entry: "webhook handle: TrainingPlan",
        cases: hostile::cases(250),
        budget: BUDGET,
    }
    .run(inputs::plan_spec(), move |(spec, depth)| {
        let kind = json!({"group": "primus.dev", "version": "v1alpha1", "kind": "TrainingPlan"});
        let b = body(&inputs::plan_object(spec), depth, Some(kind));
        answered(&v, Endpoint::TrainingPlan, &b)
    });
    if let Ok(m) = OUTCOMES.lock() {
        println!("webhook outcomes: {m:?}");
    }
}

/// The issue's own reproductions, one by one: a `primus.dev/layout` annotation of 100,000 `(`
/// (it aborted `primus-webhook` with a stack overflow) and the same layout as a Megatron flag.
#[test]
fn the_issues_layout_of_100000_parens_is_denied_in_one_line() {
    let v = common::validator();
    let mut job = common::example("fitting-pytorchjob");
    let layout = json!({"tp": 8, "pp": 2, "pipelineLayout": "(".repeat(100_000)}).to_string();
    job["metadata"]["annotations"] = json!({"primus.dev/layout": layout});
    let reply = handle(
        &v,
        Endpoint::PyTorchJob { strict: true },
        &common::review(&job, None, false),
        Instant::now() + Duration::from_secs(5),
    );
    assert_eq!(reply.status, 200);
    assert_eq!(reply.decision, "deny", "{}", reply.message);
    assert!(
        reply.message.contains(
            "metadata.annotations[primus.dev/layout].pipelineLayout: is longer than 4096 characters"
        ),
        "{}",
        reply.message
    );
    let mut job = common::example("fitting-pytorchjob");
    common::edit_script(
        &mut job,
        "--use-flash-attn",
        &format!(
            "--use-flash-attn --pipeline-model-parallel-layout {}",
            "(".repeat(100_000)
        ),
    );
    let reply = handle(
        &v,
        Endpoint::PyTorchJob { strict: true },
        &common::review(&job, None, false),
        Instant::now() + Duration::from_secs(5),
    );
    assert_eq!(reply.decision, "deny", "{}", reply.message);
    assert!(
        reply
            .message
            .contains("--pipeline-model-parallel-layout: is longer than 4096 characters"),
        "{}",
        reply.message
    );
}
