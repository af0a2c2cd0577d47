//! The operator when things go wrong or change, against the real test bed: an invalid plan
//! stalls with a message naming the field (and no requeue storm) until it is fixed; a restart
//! in the middle of a benchmark duplicates nothing; a benchmark pod that keeps dying is retried
//! up to the limit and then reported; a layout change replaces a job that has not started and
//! leaves a started one alone; suspend and autoSubmit.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams};
use primus_crds::{BenchmarkReport, Phase};
use primus_tests::node_agent::{NodeAgent, Policy};
use primus_tests::testbed;

const BENCH_PODS: &str = "app.kubernetes.io/component=benchmark";

fn plan_yaml(name: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata:\n  name: {name}\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 8}}\n  training: {{seqLength: 4096, globalBatchSize: 64}}\n  tuning: {{searcher: exhaustive, allowed: {{tp: [1, 2, 4], pp: [1]}}}}\n{spec_extra}"
    )
}

fn start(tb: &primus_tests::TestBed, ns: &str, name: &str) -> Operator {
    let mut op = Operator::start(
        tb,
        name,
        OperatorArgs {
            namespace: ns,
            lease: "primus-operator-test",
            kubeconfig: None,
            extra: vec![],
        },
    );
    op.wait_leading(Duration::from_secs(60));
    op
}

#[test]
fn an_invalid_plan_stalls_naming_the_field_until_it_is_fixed() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-invalid");
    let k = tb.kubectl();
    let op = start(&tb, &ns.name, "op-invalid");
    let rt = runtime();
    let client = rt.block_on(tb.client());

    let bad = plan_yaml("typo", "").replace("llama3.1-8b", "llama3.1-8bb");
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &bad);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = rt.block_on(poll(Duration::from_secs(30), "Stalled", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "typo")
                .await
                .filter(|p| has(p, "Stalled", "True"))
        }
    }));
    let c = condition(&plan, "Stalled").unwrap();
    assert_eq!(c.reason, "InvalidSpec");
    assert!(c.message.contains("spec.model.preset"), "{}", c.message);
    assert!(c.message.contains("llama3.1-8bb"), "{}", c.message);
    assert!(has(&plan, "Ready", "False"));
    assert_eq!(plan.status.as_ref().unwrap().phase, Some(Phase::Stalled));
    assert_eq!(
        plan.status.as_ref().unwrap().observed_generation,
        plan.metadata.generation
    );
    assert!(
        rt.block_on(jobs_api(&client, &ns.name).get_opt("typo"))
            .unwrap()
            .is_none()
    );
    let series = format!(
        "primus_plan_stalled{{namespace=\"{}\",plan=\"typo\"}}",
        ns.name
    );
    assert_eq!(op.metrics().and_then(|m| metric(&m, &series)), Some(1.0));

    // No requeue storm: a stalled plan waits for a change (absence needs a time window).
    // The pass that wrote the status and the one its own write triggered settle first.
    let mut settled = op.reconciles();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let n = op.reconciles();
        if n == settled {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "passes never settle: {n}"
        );
        settled = n;
    }
    std::thread::sleep(Duration::from_secs(3));
    let after = op.reconciles();
    assert_eq!(
        after,
        settled,
        "{} passes in 3 s on a stalled plan",
        after - settled
    );

    // Fixing the field: Ready, and the job.
    k.ok(&[
        "patch",
        "tplan",
        "typo",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"model":{"preset":"llama3.1-8b"}}}"#,
    ]);
    let plan = rt.block_on(poll(Duration::from_secs(60), "Ready after the fix", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "typo")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    assert!(has(&plan, "Stalled", "False"));
    assert_eq!(
        plan.status.as_ref().unwrap().observed_generation,
        plan.metadata.generation
    );
    assert!(
        rt.block_on(jobs_api(&client, &ns.name).get_opt("typo"))
            .unwrap()
            .is_some()
    );
    assert_eq!(op.metrics().and_then(|m| metric(&m, &series)), Some(0.0));
}

#[test]
fn a_restart_in_the_middle_of_a_benchmark_duplicates_nothing() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-restart");
    let k = tb.kubectl();
    let agent = NodeAgent::start(&tb, &ns.name, BENCH_PODS);
    agent.set_policy(Policy::Hold);
    let mut op = start(&tb, &ns.name, "op-first");
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let yaml = plan_yaml(
        "restart",
        "  benchmark: {enabled: true, backend: simulate, timeoutSeconds: 120}\n",
    );
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    rt.block_on(poll(
        Duration::from_secs(30),
        "the first benchmark pod",
        || {
            let pods = pods.clone();
            async move {
                pods.list(&ListParams::default().labels(BENCH_PODS))
                    .await
                    .ok()
                    .filter(|l| !l.items.is_empty())
            }
        },
    ));

    // Kill the operator mid-reconcile (no clean-up), start another one.
    op.kill();
    let mut second = start(&tb, &ns.name, "op-second");
    let plan = rt.block_on(poll(
        Duration::from_secs(30),
        "the new operator to look at the plan",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            let n = second.reconciles();
            async move {
                get_plan(&client, &ns, "restart")
                    .await
                    .filter(|p| has(p, "Benchmarked", "False") && n >= 1.0)
            }
        },
    ));
    assert_eq!(
        condition(&plan, "Benchmarked").unwrap().reason,
        "Benchmarking"
    );
    assert_eq!(
        rt.block_on(pods.list(&ListParams::default().labels(BENCH_PODS)))
            .unwrap()
            .items
            .len(),
        1,
        "no second pod while the first one is pending"
    );

    // Let the node run it: one report, one job, still one pod.
    agent.set_policy(Policy::Run);
    rt.block_on(poll(Duration::from_secs(90), "Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "restart")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    let pod_names: Vec<String> = rt
        .block_on(pods.list(&ListParams::default().labels(BENCH_PODS)))
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    assert_eq!(pod_names.len(), 1, "{pod_names:?}");
    assert!(pod_names[0].ends_with("-1"), "{pod_names:?}");
    let reports: Api<BenchmarkReport> = Api::namespaced(client.clone(), &ns.name);
    assert_eq!(
        rt.block_on(reports.list(&ListParams::default()))
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        rt.block_on(jobs_api(&client, &ns.name).list(&ListParams::default()))
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(agent.runs().len(), 1);
    assert!(second.running());
}

#[test]
fn a_benchmark_pod_that_keeps_dying_is_retried_then_reported() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-retry");
    let k = tb.kubectl();
    let agent = NodeAgent::start(&tb, &ns.name, BENCH_PODS);
    agent.set_policy(Policy::Kill);
    let _op = start(&tb, &ns.name, "op-retry");
    let rt = runtime();
    let client = rt.block_on(tb.client());

    let yaml = plan_yaml(
        "dies",
        "  benchmark: {enabled: true, backend: simulate, timeoutSeconds: 60, maxAttempts: 2}\n",
    );
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = rt.block_on(poll(
        Duration::from_secs(60),
        "the benchmark to fail",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "dies").await.filter(|p| {
                    condition(p, "Benchmarked").is_some_and(|c| c.reason == "BenchmarkFailed")
                })
            }
        },
    ));
    let c = condition(&plan, "Benchmarked").unwrap();
    assert_eq!(c.status, "False");
    assert!(c.message.contains("2 of 2 attempts"), "{}", c.message);
    assert!(c.message.contains("exited with code 137"), "{}", c.message);
    assert!(has(&plan, "Stalled", "True"));
    assert!(has(&plan, "Ready", "False"));
    let st = plan.status.as_ref().unwrap();
    assert_eq!(st.phase, Some(Phase::Failed));
    assert_eq!(st.benchmark.as_ref().unwrap().attempts, 2);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let list = rt
        .block_on(pods.list(&ListParams::default().labels(BENCH_PODS)))
        .unwrap()
        .items;
    assert_eq!(list.len(), 2, "exactly maxAttempts pods");
    for p in &list {
        assert_eq!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Failed")
        );
    }
    assert_eq!(agent.runs().len(), 2);
    assert!(
        rt.block_on(jobs_api(&client, &ns.name).get_opt("dies"))
            .unwrap()
            .is_none()
    );
}

#[test]
fn layout_changes_replace_a_job_that_has_not_started_and_spare_a_started_one() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-replace");
    let k = tb.kubectl();
    let _op = start(&tb, &ns.name, "op-replace");
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let jobs = jobs_api(&client, &ns.name);

    let yaml = plan_yaml("fixed", "  parallelism: {tp: 2}\n  job: {suspend: true}\n")
        .replace("searcher: exhaustive", "searcher: none");
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let layout_of = |j: &kube::api::DynamicObject| -> primus_oracle::layout::Layout {
        serde_json::from_str(j.metadata.annotations.as_ref().unwrap()["primus.dev/layout"].as_str())
            .unwrap()
    };
    let first = rt.block_on(poll(Duration::from_secs(60), "the suspended job", || {
        let jobs = jobs.clone();
        async move { jobs.get_opt("fixed").await.ok().flatten() }
    }));
    assert_eq!(layout_of(&first).tp, 2);
    assert_eq!(first.data["spec"]["runPolicy"]["suspend"], true);
    let plan = rt.block_on(poll(Duration::from_secs(30), "Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "fixed")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    assert_eq!(condition(&plan, "JobCreated").unwrap().reason, "Suspended");

    // The reviewer unsuspends it through the plan.
    k.ok(&[
        "patch",
        "tplan",
        "fixed",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"job":{"suspend":false}}}"#,
    ]);
    rt.block_on(poll(Duration::from_secs(30), "the job unsuspended", || {
        let jobs = jobs.clone();
        async move {
            jobs.get("fixed")
                .await
                .ok()
                .filter(|j| j.data["spec"]["runPolicy"]["suspend"] == false)
        }
    }));

    // Not started: a new layout replaces it.
    k.ok(&[
        "patch",
        "tplan",
        "fixed",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"parallelism":{"tp":4}}}"#,
    ]);
    let second = rt.block_on(poll(Duration::from_secs(60), "the replaced job", || {
        let jobs = jobs.clone();
        let uid = first.metadata.uid.clone();
        async move {
            jobs.get_opt("fixed")
                .await
                .ok()
                .flatten()
                .filter(|j| j.metadata.uid != uid)
        }
    }));
    assert_eq!(layout_of(&second).tp, 4);

    // Started (the training operator would set this): never touched again.
    let running = serde_json::json!({"status": {"conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running"}]}});
    rt.block_on(jobs.patch_status("fixed", &PatchParams::default(), &Patch::Merge(&running)))
        .unwrap();
    k.ok(&[
        "patch",
        "tplan",
        "fixed",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"parallelism":{"tp":8}}}"#,
    ]);
    let plan = rt.block_on(poll(
        Duration::from_secs(60),
        "the plan to say the job differs",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "fixed").await.filter(|p| {
                    p.status
                        .as_ref()
                        .is_some_and(|s| s.observed_generation == p.metadata.generation)
                        && condition(p, "JobCreated").is_some_and(|c| c.reason == "LayoutDiffers")
                })
            }
        },
    ));
    let js = plan.status.as_ref().unwrap().job.clone().unwrap();
    assert!(!js.layout_matches_plan && js.started);
    assert!(
        condition(&plan, "JobCreated")
            .unwrap()
            .message
            .contains("left untouched")
    );
    let still = rt.block_on(jobs.get("fixed")).unwrap();
    assert_eq!(still.metadata.uid, second.metadata.uid);
    assert_eq!(layout_of(&still).tp, 4);

    // autoSubmit: false on another plan: no job, the status says why.
    let yaml = plan_yaml("report-only", "  job: {autoSubmit: false}\n");
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = rt.block_on(poll(Duration::from_secs(60), "report-only Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "report-only")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    assert_eq!(
        condition(&plan, "JobCreated").unwrap().reason,
        "AutoSubmitDisabled"
    );
    assert!(plan.status.as_ref().unwrap().chosen.is_some());
    assert!(rt.block_on(jobs.get_opt("report-only")).unwrap().is_none());
}

#[test]
fn a_benchmark_pod_no_node_takes_times_out_and_counts_as_an_attempt() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-timeout");
    let k = tb.kubectl();
    // No node agent: nothing ever runs the pods (as with no GPU node of the kind).
    let op = Operator::start_leading(
        &tb,
        "op-timeout",
        &ns.name,
        vec!["--bench-grace-seconds".into(), "0.5".into()],
    );
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let yaml = plan_yaml(
        "stuck",
        "  benchmark: {enabled: true, backend: simulate, timeoutSeconds: 1, maxAttempts: 2}\n",
    );
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = rt.block_on(poll(
        Duration::from_secs(60),
        "the benchmark to time out",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "stuck").await.filter(|p| {
                    condition(p, "Benchmarked").is_some_and(|c| c.reason == "BenchmarkFailed")
                })
            }
        },
    ));
    let c = condition(&plan, "Benchmarked").unwrap();
    assert!(c.message.contains("2 of 2 attempts"), "{}", c.message);
    assert!(
        c.message.contains("gave no report within 1s"),
        "{}",
        c.message
    );
    assert_eq!(
        plan.status
            .as_ref()
            .unwrap()
            .benchmark
            .as_ref()
            .unwrap()
            .attempts,
        2
    );
    // The first (timed-out) pod was removed, the last one stays; nothing new is started.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let names = || -> Vec<String> {
        rt.block_on(pods.list(&ListParams::default().labels(BENCH_PODS)))
            .unwrap()
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect()
    };
    let now = names();
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(now[0].ends_with("-2"), "{now:?}");
    // Later passes (the resync of the failed plan, the pod's own events) start nothing new.
    // Count before poking: the pass the poke triggers may finish before the next line runs.
    let before = op.reconciles();
    k.ok(&["annotate", "tplan", "stuck", "-n", &ns.name, "test/poke=1"]);
    rt.block_on(poll(
        Duration::from_secs(30),
        "a pass after the poke",
        || {
            let n = op.reconciles();
            async move { (n > before).then_some(()) }
        },
    ));
    assert_eq!(names(), now);
    let again = rt.block_on(get_plan(&client, &ns.name, "stuck")).unwrap();
    assert_eq!(condition(&again, "Benchmarked"), Some(c));
}
