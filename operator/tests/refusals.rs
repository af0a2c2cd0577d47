//! Writes the API server refuses show in the plan's status with the server's reason and
//! message, against the real test bed: a benchmark pod whose service account does not exist
//! (the ServiceAccount admission plugin refuses it), a PyTorchJob an admission webhook denies,
//! and a status write an admission webhook denies. Each plan turns Stalled with the refusal,
//! and recovers once the cause is gone.

mod common;

use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use primus_tests::deny_webhook::{DenyWebhook, rule};
use primus_tests::{TestBed, testbed};

fn plan_yaml(name: &str, spec_extra: &str) -> String {
    format!(
        "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata:\n  name: {name}\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 8}}\n  training: {{seqLength: 4096, globalBatchSize: 64}}\n  tuning: {{searcher: exhaustive, allowed: {{tp: [1, 2, 4], pp: [1]}}}}\n{spec_extra}"
    )
}

fn start(tb: &TestBed, ns: &str, name: &str, extra: &[&str]) -> Operator {
    let mut op = Operator::start(
        tb,
        name,
        OperatorArgs {
            namespace: ns,
            lease: "primus-operator-refusals",
            kubeconfig: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        },
    );
    op.wait_leading(Duration::from_secs(60));
    op
}

/// Poll until plan `name`'s condition `type_` has `reason`; the plan.
fn wait_reason(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    ns: &str,
    name: &'static str,
    type_: &'static str,
    reason: &'static str,
) -> primus_crds::TrainingPlan {
    rt.block_on(poll(
        Duration::from_secs(60),
        &format!("{name}: {type_} {reason}"),
        || {
            let client = client.clone();
            let ns = ns.to_string();
            async move {
                get_plan(&client, &ns, name)
                    .await
                    .filter(|p| condition(p, type_).is_some_and(|c| c.reason == reason))
            }
        },
    ))
}

#[test]
fn a_benchmark_pod_refused_for_a_missing_service_account_shows_in_the_status() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-refused-pod");
    let k = tb.kubectl();
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let _op = start(
        &tb,
        &ns.name,
        "op-refused-pod",
        &["--bench-service-account", "no-such-sa"],
    );
    let yaml = plan_yaml(
        "pod",
        "  benchmark: {enabled: true, backend: simulate, timeoutSeconds: 60}\n",
    );
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = wait_reason(
        &rt,
        &client,
        &ns.name,
        "pod",
        "Benchmarked",
        "BenchmarkPodRefused",
    );
    let c = condition(&plan, "Benchmarked").unwrap();
    assert_eq!(c.status, "False");
    assert!(
        c.message.contains("the API server refused to create pod"),
        "{}",
        c.message
    );
    assert!(c.message.contains("(Forbidden, 403)"), "{}", c.message);
    assert!(c.message.contains("no-such-sa"), "{}", c.message);
    assert!(has(&plan, "Stalled", "True"));
    assert_eq!(
        condition(&plan, "Stalled").unwrap().reason,
        "BenchmarkPodRefused"
    );

    // The cause goes away: the next attempt (with backoff) creates the pod.
    k.ok(&["create", "serviceaccount", "no-such-sa", "-n", &ns.name]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    rt.block_on(poll(
        Duration::from_secs(60),
        "the benchmark pod once the service account exists",
        || {
            let pods = pods.clone();
            async move {
                pods.list(&ListParams::default().labels("app.kubernetes.io/component=benchmark"))
                    .await
                    .ok()
                    .filter(|l| !l.items.is_empty())
            }
        },
    ));
    wait_reason(&rt, &client, &ns.name, "pod", "Benchmarked", "Benchmarking");
}

#[test]
fn a_job_and_a_status_an_admission_webhook_denies_show_in_the_status() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-refused-job");
    let k = tb.kubectl();
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let hook = DenyWebhook::start(
        &tb,
        &ns.name,
        vec![
            rule("kubeflow.org", "v1", &["pytorchjobs"], &["CREATE"]),
            rule(
                "primus.dev",
                "v1alpha1",
                &["trainingplans/status"],
                &["UPDATE"],
            ),
        ],
        |req| {
            let object = &req["object"];
            if req["kind"]["kind"] == "PyTorchJob" {
                return Some("no training jobs in this namespace (test webhook)".into());
            }
            let deny = object["metadata"]["labels"]["test/deny-status"] == "true";
            (deny && !object["status"]["chosen"].is_null())
                .then(|| "status.chosen is not accepted here (test webhook)".to_string())
        },
    );
    let _op = start(&tb, &ns.name, "op-refused-job", &[]);

    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &plan_yaml("job", ""));
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = wait_reason(&rt, &client, &ns.name, "job", "JobCreated", "JobRefused");
    let c = condition(&plan, "JobCreated").unwrap();
    assert!(
        c.message
            .contains("the API server refused to create PyTorchJob"),
        "{}",
        c.message
    );
    assert!(
        c.message
            .contains("no training jobs in this namespace (test webhook)"),
        "{}",
        c.message
    );
    assert!(has(&plan, "Stalled", "True"));
    assert!(has(&plan, "Ready", "False"));
    // The projection went through: the choice is in the status, only the job is missing.
    assert!(plan.status.as_ref().unwrap().chosen.is_some());

    // A status the webhook refuses: the narrower write of the conditions says why.
    let yaml = plan_yaml("status", "  job: {autoSubmit: false}\n").replace(
        "  name: status\n",
        "  name: status\n  labels: {test/deny-status: \"true\"}\n",
    );
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = wait_reason(
        &rt,
        &client,
        &ns.name,
        "status",
        "Stalled",
        "StatusWriteRefused",
    );
    let c = condition(&plan, "Stalled").unwrap();
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .contains("status.chosen is not accepted here (test webhook)"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains("apply status of trainingplan"),
        "{}",
        c.message
    );
    assert!(plan.status.unwrap().chosen.is_none());
    assert!(hook.calls() >= 2);

    // Lifting the refusal (the label): the plan becomes Ready.
    k.ok(&[
        "label",
        "tplan",
        "status",
        "-n",
        &ns.name,
        "test/deny-status-",
    ]);
    rt.block_on(poll(Duration::from_secs(60), "status Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "status")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
}
