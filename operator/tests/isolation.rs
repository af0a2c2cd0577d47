//! One plan cannot take the others down, against the real test bed: a plan the CRD accepts but
//! the Rust types reject stalls naming the field while its neighbour keeps reconciling, also
//! after an operator restart (whose initial list holds the bad plan); and a deleted plan leaves
//! no series on `/metrics`, also one deleted while Stalled that owned nothing.

mod common;

use std::time::{Duration, Instant};

use common::*;
use kube::api::{Api, DynamicObject};
use primus_crds::TrainingPlan;
use primus_tests::{TestBed, testbed};

fn plan_yaml(name: &str, gbs: u32) -> String {
    format!(
        "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata:\n  name: {name}\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 8}}\n  training: {{seqLength: 4096, globalBatchSize: {gbs}}}\n  tuning: {{searcher: exhaustive, allowed: {{tp: [1, 2, 4], pp: [1]}}}}\n"
    )
}

fn start(tb: &TestBed, ns: &str, name: &str) -> Operator {
    let mut op = Operator::start(
        tb,
        name,
        OperatorArgs {
            namespace: ns,
            lease: "primus-operator-isolation",
            kubeconfig: None,
            extra: vec![],
        },
    );
    op.wait_leading(Duration::from_secs(60));
    op
}

/// Writes the API server accepts (the CRD's schema allows them) but the Rust types reject,
/// each with the field the operator must name. The schema grows stricter over time (bounds,
/// patterns), so the test does not rely on one: it takes the first candidate the API server
/// stores AND the Rust types fail to decode (checked here, with the operator's own types). The
/// first one cannot be ruled out by any schema: balanced parentheses are beyond a `pattern`.
const CANDIDATES: &[(&str, &str)] = &[
    (
        r#"{"spec":{"parallelism":{"pipelineLayout":"Et|((t|tL"}}}"#,
        "spec.parallelism.pipelineLayout",
    ),
    (
        r#"{"spec":{"parallelism":{"tp":4294967296}}}"#,
        "spec.parallelism.tp",
    ),
    (
        r#"{"spec":{"benchmark":{"timeoutSeconds":4294967296}}}"#,
        "spec.benchmark.timeoutSeconds",
    ),
];

/// Make plan `name` one the API server holds and the types cannot read; the field to expect.
fn break_plan(tb: &TestBed, client: &kube::Client, ns: &str, name: &str) -> (&'static str, bool) {
    let k = tb.kubectl();
    let rt = runtime();
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &primus_operator::kubeapi::plan_resource(),
    );
    let mut tried = Vec::new();
    let mut stored_field = None;
    for (patch, field) in CANDIDATES {
        let out = k.run(&[
            "patch", "tplan", name, "-n", ns, "--type", "merge", "-p", patch,
        ]);
        if !out.status.success() {
            tried.push(format!(
                "{field}: refused by the API server: {}",
                primus_tests::stderr(&out).trim()
            ));
            continue;
        }
        let stored = rt.block_on(api.get(name)).expect("the plan is there");
        let value = serde_json::to_value(stored).unwrap();
        match serde_json::from_value::<TrainingPlan>(value) {
            Err(_) => return (field, true),
            Ok(_) => {
                tried.push(format!("{field}: stored, but the types read it"));
                stored_field.get_or_insert((patch, field));
            }
        }
    }
    // Every object the API server accepts now decodes (the CRD carries the bounds of the
    // shared validator, and a pipeline layout's syntax error is kept, not a decode error):
    // the stored candidate the validator rejects stands in, so the stall and the neighbour's
    // reconciles across a restart are still shown; the decode path is unit-tested
    // (`decoded::tests`).
    let Some((patch, field)) = stored_field else {
        panic!(
            "no candidate is stored by the API server; add one to CANDIDATES:\n{}",
            tried.join("\n")
        );
    };
    let out = k.run(&[
        "patch", "tplan", name, "-n", ns, "--type", "merge", "-p", patch,
    ]);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    eprintln!(
        "no candidate is accepted by the CRD and rejected by the types ({}); using {field}, which the validator rejects",
        tried.join("; ")
    );
    (field, false)
}

#[test]
fn a_plan_the_types_cannot_read_stalls_and_its_neighbour_reconciles_across_a_restart() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-undecodable");
    let k = tb.kubectl();
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let mut first = start(&tb, &ns.name, "op-first");
    for name in ["good", "bad"] {
        let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &plan_yaml(name, 64));
        assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    }
    let ready = |name: &'static str, generation: i64| {
        let client = client.clone();
        let ns = ns.name.clone();
        move || {
            let client = client.clone();
            let ns = ns.clone();
            async move {
                get_plan(&client, &ns, name).await.filter(|p| {
                    has(p, "Ready", "True")
                        && p.status.as_ref().and_then(|s| s.observed_generation) == Some(generation)
                })
            }
        }
    };
    rt.block_on(poll(
        Duration::from_secs(60),
        "good Ready",
        ready("good", 1),
    ));
    rt.block_on(poll(Duration::from_secs(60), "bad Ready", ready("bad", 1)));

    let (field, undecodable) = break_plan(&tb, &client, &ns.name, "bad");
    let stalled = |plans: Api<DynamicObject>| async move {
        let o = plans.get("bad").await.ok()?;
        let conditions = o.data["status"]["conditions"].as_array()?.clone();
        let generation = o.metadata.generation;
        let observed = o.data["status"]["observedGeneration"].as_i64();
        conditions
            .into_iter()
            .find(|c| c["type"] == "Stalled" && c["status"] == "True")
            .filter(|_| observed == generation)
            .map(|c| (c, o))
    };
    let plans: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &primus_operator::kubeapi::plan_resource(),
    );
    let (c, _) = rt.block_on(poll(Duration::from_secs(30), "bad Stalled", || {
        stalled(plans.clone())
    }));
    assert_eq!(c["reason"], "InvalidSpec", "{c}");
    let message = c["message"].as_str().unwrap();
    assert!(message.starts_with(field), "{message}");
    if undecodable {
        assert!(
            first.log_text().contains("the plan does not decode"),
            "the bad plan went through the decode path"
        );
    }

    // A restart: the new operator's initial list holds the bad plan; the good one still
    // reconciles a change.
    first.kill();
    let second = start(&tb, &ns.name, "op-second");
    k.ok(&[
        "patch",
        "tplan",
        "good",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"training":{"globalBatchSize":128}}}"#,
    ]);
    rt.block_on(poll(
        Duration::from_secs(60),
        "good Ready for generation 2 after the restart",
        ready("good", 2),
    ));
    // The bad plan stays Stalled, its status written once: no write loop.
    let (_, before) = rt.block_on(poll(Duration::from_secs(30), "bad still Stalled", || {
        stalled(plans.clone())
    }));
    std::thread::sleep(Duration::from_secs(3));
    let after = rt.block_on(plans.get("bad")).unwrap();
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "the stalled plan's status keeps being rewritten"
    );
    let series = format!(
        "primus_plan_stalled{{namespace=\"{}\",plan=\"bad\"}}",
        ns.name
    );
    assert_eq!(
        second.metrics().and_then(|m| metric(&m, &series)),
        Some(1.0)
    );

    // Fixing it ends the stall.
    k.ok(&[
        "patch",
        "tplan",
        "bad",
        "-n",
        &ns.name,
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec","value":{"model":{"preset":"llama3.1-8b"},"cluster":{"gpu":"h100-sxm","gpus":8},"training":{"seqLength":4096,"globalBatchSize":64}}}]"#,
    ]);
    let fixed = rt.block_on(poll(Duration::from_secs(60), "bad fixed and Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "bad")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    assert!(has(&fixed, "Stalled", "False"));
}

#[test]
fn a_plan_deleted_while_stalled_leaves_no_series() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-forget");
    let k = tb.kubectl();
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let op = start(&tb, &ns.name, "op-forget");
    // Stalled and owning nothing (no benchmark pod, no report, no job): nothing it owns can
    // trigger a pass once it is gone.
    let bad = plan_yaml("typo", 64).replace("llama3.1-8b", "llama3.1-8bb");
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &bad);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    rt.block_on(poll(Duration::from_secs(30), "Stalled", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "typo")
                .await
                .filter(|p| has(p, "Stalled", "True"))
        }
    }));
    let labels = format!("{{namespace=\"{}\",plan=\"typo\"}}", ns.name);
    let stalled = format!("primus_plan_stalled{labels}");
    rt.block_on(poll(Duration::from_secs(10), "the stalled series", || {
        let v = op.metrics().and_then(|m| metric(&m, &stalled));
        async move { (v == Some(1.0)).then_some(()) }
    }));

    k.ok(&["delete", "tplan", "typo", "-n", &ns.name, "--wait=true"]);
    let deleted = Instant::now();
    rt.block_on(poll(
        Duration::from_secs(15),
        "no series of the deleted plan",
        || {
            let text = op.metrics().unwrap_or_default();
            let labels = labels.clone();
            async move { (!text.is_empty() && !text.contains(&labels)).then_some(()) }
        },
    ));
    primus_tests::loud(&format!(
        "\n==== a plan deleted while Stalled: its series gone {:.2} s after the delete\n",
        deleted.elapsed().as_secs_f64()
    ));
}

/// A Ready plan whose spec turns invalid drops its choice from the status and stalls (the
/// write removes object fields it owned: deleted explicitly, since an apply that only omits
/// them leaves nulls the schema refuses on some API servers, and the plan would stay Ready).
#[test]
fn a_ready_plan_turned_invalid_drops_its_choice_and_stalls() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-turned");
    let k = tb.kubectl();
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let _op = start(&tb, &ns.name, "op-turned");
    let out = k.run_stdin(
        &["apply", "-n", &ns.name, "-f", "-"],
        &plan_yaml("turned", 64),
    );
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = rt.block_on(poll(Duration::from_secs(60), "Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "turned")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    assert!(plan.status.unwrap().chosen.is_some());
    k.ok(&[
        "patch",
        "tplan",
        "turned",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"model":{"preset":"llama3.1-8bb"}}}"#,
    ]);
    let plan = rt.block_on(poll(Duration::from_secs(30), "Stalled", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "turned")
                .await
                .filter(|p| has(p, "Stalled", "True"))
        }
    }));
    let st = plan.status.unwrap();
    assert_eq!(st.phase, Some(primus_crds::Phase::Stalled));
    assert!(st.chosen.is_none() && st.search.is_none(), "{st:?}");
}
