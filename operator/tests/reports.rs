//! Benchmark reports are believed only when genuine, against the real test bed: a report
//! written with `kubectl` (no signature) or by a process holding another plan's benchmark
//! token is ignored, and the status says so, while the plan's own pod's report is used; a
//! genuine report with absurd measurements is clamped and flagged; a benchmark image off the
//! operator's allow-list stalls the plan before any pod is made.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams};
use primus_crds::annotations::REPORT_SIGNATURE;
use primus_crds::provenance::{self, Subject, TOKEN_KEY};
use primus_crds::{BenchmarkReport, BenchmarkReportSpec};
use primus_oracle::report::BenchmarkResults;
use primus_tests::node_agent::{NodeAgent, Policy, binary};
use primus_tests::{TestBed, testbed};

const BENCH_PODS: &str = "app.kubernetes.io/component=benchmark";

fn plan_yaml(name: &str, bench_extra: &str) -> String {
    format!(
        "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata:\n  name: {name}\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 8}}\n  training: {{seqLength: 4096, globalBatchSize: 64}}\n  tuning: {{searcher: exhaustive, allowed: {{tp: [1, 2, 4], pp: [1]}}}}\n  job: {{autoSubmit: false}}\n  benchmark: {{enabled: true, backend: simulate, timeoutSeconds: 120{bench_extra}}}\n"
    )
}

fn start(tb: &TestBed, ns: &str, name: &str, extra: &[&str]) -> Operator {
    let mut op = Operator::start(
        tb,
        name,
        OperatorArgs {
            namespace: ns,
            lease: "primus-operator-reports",
            kubeconfig: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        },
    );
    op.wait_leading(Duration::from_secs(60));
    op
}

fn apply(tb: &TestBed, ns: &str, yaml: &str) {
    let out = tb
        .kubectl()
        .run_stdin(&["apply", "-n", ns, "-f", "-"], yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
}

/// The first benchmark pod of plan `name` (waits for it); its report's name.
fn first_pod(rt: &tokio::runtime::Runtime, pods: &Api<Pod>, plan: &str) -> (String, String) {
    let pod = rt.block_on(poll(
        Duration::from_secs(60),
        &format!("{plan}'s benchmark pod"),
        || {
            let pods = pods.clone();
            let sel = format!("{BENCH_PODS},primus.dev/plan={plan}");
            async move {
                pods.list(&ListParams::default().labels(&sel))
                    .await
                    .ok()
                    .and_then(|l| l.items.into_iter().next())
            }
        },
    ));
    let name = pod.metadata.name.unwrap();
    let report = name.strip_suffix("-1").expect("attempt 1").to_string();
    (name, report)
}

/// What `primus bench` measures for the plan (simulated), from a plan file.
fn measured(plan_yaml: &str) -> BenchmarkResults {
    let dir = tempfile::tempdir().unwrap();
    let (plan, out) = (dir.path().join("plan.yaml"), dir.path().join("r.json"));
    std::fs::write(&plan, plan_yaml).unwrap();
    let status = Command::new(binary("primus"))
        .args([
            "bench",
            "-f",
            plan.to_str().unwrap(),
            "--simulate",
            "-q",
            "-o",
        ])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap()
}

/// Write report `name` owned (controller) by plan `plan`, with `annotation` as its signature.
fn write_report(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    ns: &str,
    name: &str,
    plan: &primus_crds::TrainingPlan,
    spec: &BenchmarkReportSpec,
    annotation: Option<String>,
) {
    let mut owner = kube::Resource::controller_owner_ref(plan, &()).unwrap();
    owner.block_owner_deletion = None;
    let mut body = serde_json::json!({
        "apiVersion": "primus.dev/v1alpha1", "kind": "BenchmarkReport",
        "metadata": {"name": name, "namespace": ns, "ownerReferences": [owner]},
        "spec": spec,
    });
    if let Some(a) = annotation {
        body["metadata"]["annotations"] = serde_json::json!({ REPORT_SIGNATURE: a });
    }
    let api: Api<BenchmarkReport> = Api::namespaced(client.clone(), ns);
    rt.block_on(api.patch(
        name,
        &PatchParams::apply("forger").force(),
        &Patch::Apply(&body),
    ))
    .expect("the report is written");
}

fn benchmarked(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    ns: &str,
    plan: &'static str,
    what: &str,
    f: impl Fn(&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition) -> bool + Clone,
) -> primus_crds::TrainingPlan {
    rt.block_on(poll(Duration::from_secs(60), what, || {
        let (client, ns, f) = (client.clone(), ns.to_string(), f.clone());
        async move {
            get_plan(&client, &ns, plan)
                .await
                .filter(|p| condition(p, "Benchmarked").is_some_and(&f))
        }
    }))
}

#[test]
fn forged_reports_are_ignored_and_the_genuine_one_is_used() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-forged");
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let agent = NodeAgent::start(&tb, &ns.name, BENCH_PODS);
    agent.set_policy(Policy::Hold);
    let _op = start(&tb, &ns.name, "op-forged", &[]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let victim_yaml = plan_yaml("victim", ", reuseWithinHours: 0");
    apply(&tb, &ns.name, &victim_yaml);
    apply(&tb, &ns.name, &plan_yaml("other", ", reuseWithinHours: 0"));
    let (_, report) = first_pod(&rt, &pods, "victim");
    let (other_pod, _) = first_pod(&rt, &pods, "other");
    let victim = rt.block_on(get_plan(&client, &ns.name, "victim")).unwrap();

    // 1. Plain kubectl-style write (an admin, or anyone allowed to write reports): owned by
    // the plan, plausible content, no signature.
    let spec = BenchmarkReportSpec {
        plan: "victim".into(),
        results: measured(&victim_yaml),
    };
    write_report(&rt, &client, &ns.name, &report, &victim, &spec, None);
    let plan = benchmarked(&rt, &client, &ns.name, "victim", "unsigned ignored", |c| {
        c.message
            .contains("is ignored: it is not signed by a benchmark pod")
    });
    assert!(has(&plan, "Benchmarked", "False"));
    assert!(!has(&plan, "Ready", "True"));

    // 2. Another identity: a process holding the other plan's benchmark token (what that
    // plan's pod, running an image its author chose, could do) writes the victim's report.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let other_token = rt.block_on(secrets.get(&other_pod)).unwrap().data.unwrap()[TOKEN_KEY]
        .0
        .clone();
    let out = Command::new(binary("primus"))
        .args([
            "bench",
            "--plan",
            &format!("{}/victim", ns.name),
            "--backend",
            "simulate",
            "-q",
            "--report-to",
            &format!("{}/{report}", ns.name),
            "--report-attempt",
            "1",
        ])
        .env("KUBECONFIG", &tb.kubeconfig)
        .env(
            "PRIMUS_REPORT_TOKEN",
            String::from_utf8(other_token).unwrap(),
        )
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    benchmarked(
        &rt,
        &client,
        &ns.name,
        "victim",
        "forged signature ignored",
        |c| {
            c.message
                .contains("is ignored: its signature does not match")
        },
    );
    let events = tb.kubectl().run(&[
        "get",
        "events",
        "-n",
        &ns.name,
        "--field-selector",
        "reason=ReportIgnored",
        "-o",
        "name",
    ]);
    assert!(
        !primus_tests::stdout(&events).trim().is_empty(),
        "a ReportIgnored event"
    );

    // 3. The victim's own pod runs and writes the genuine report (over the forged one).
    agent.set_policy(Policy::Run);
    let plan = benchmarked(
        &rt,
        &client,
        &ns.name,
        "victim",
        "the genuine report",
        |c| c.reason == "ReportReceived",
    );
    let st = plan.status.as_ref().unwrap();
    assert_eq!(
        st.benchmark.as_ref().unwrap().report.as_deref(),
        Some(report.as_str())
    );
    assert_eq!(
        st.benchmark.as_ref().unwrap().attempts,
        1,
        "no attempt was wasted"
    );
    let r = rt
        .block_on(Api::<BenchmarkReport>::namespaced(client.clone(), &ns.name).get(&report))
        .unwrap();
    let sig = r.metadata.annotations.unwrap()[REPORT_SIGNATURE].clone();
    assert!(sig.starts_with("v1.1."), "{sig}");
    rt.block_on(poll(Duration::from_secs(60), "victim Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "victim")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
}

#[test]
fn a_genuine_report_with_absurd_ratios_is_clamped_and_flagged() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-absurd");
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let agent = NodeAgent::start(&tb, &ns.name, BENCH_PODS);
    agent.set_policy(Policy::Hold);
    let _op = start(&tb, &ns.name, "op-absurd", &[]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let yaml = plan_yaml("slow", "");
    apply(&tb, &ns.name, &yaml);
    let (pod, report) = first_pod(&rt, &pods, "slow");
    let plan = rt.block_on(get_plan(&client, &ns.name, "slow")).unwrap();

    // The plan's own pod, signing with its own token, reports kernels a million times slower
    // than the roofline (a broken clock, a throttled GPU).
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let token = rt.block_on(secrets.get(&pod)).unwrap().data.unwrap()[TOKEN_KEY]
        .0
        .clone();
    let mut results = measured(&yaml);
    for o in &mut results.ops {
        o.median_seconds *= 1e6;
    }
    let spec = BenchmarkReportSpec {
        plan: "slow".into(),
        results,
    };
    let subject = Subject {
        namespace: &ns.name,
        report: &report,
        plan_uid: plan.metadata.uid.as_deref().unwrap(),
        attempt: 1,
    };
    let sig = provenance::sign(&String::from_utf8(token).unwrap(), &subject, &spec);
    write_report(&rt, &client, &ns.name, &report, &plan, &spec, Some(sig));

    let plan = benchmarked(&rt, &client, &ns.name, "slow", "RatiosClamped", |c| {
        c.reason == "RatiosClamped"
    });
    let c = condition(&plan, "Benchmarked").unwrap();
    assert_eq!(c.status, "True");
    assert!(
        c.message
            .contains("op ratios (measured / analytic) outside [1/10, 10]"),
        "{}",
        c.message
    );
    let plan = rt.block_on(poll(Duration::from_secs(60), "Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "slow")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    let chosen = plan.status.unwrap().chosen.unwrap();
    assert!(chosen.calibrated);
    // Clamped at 10x: the step time is bounded, not a million times the analytic one.
    assert!(chosen.step_time_seconds < 1000.0, "{chosen:?}");
    drop(agent);
}

#[test]
fn a_benchmark_image_off_the_allow_list_stalls_the_plan() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-image");
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let _op = start(
        &tb,
        &ns.name,
        "op-image",
        &["--bench-image-allow", "registry.test/ml/primus:*"],
    );
    apply(
        &tb,
        &ns.name,
        &plan_yaml("miner", ", image: evil.example/miner:1"),
    );
    let plan = benchmarked(&rt, &client, &ns.name, "miner", "ImageNotAllowed", |c| {
        c.reason == "ImageNotAllowed"
    });
    let c = condition(&plan, "Benchmarked").unwrap();
    assert!(
        c.message
            .contains("\"evil.example/miner:1\" is not allowed"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains("registry.test/ml/primus:*"),
        "{}",
        c.message
    );
    assert!(has(&plan, "Stalled", "True"));
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let none = rt
        .block_on(pods.list(&ListParams::default().labels(BENCH_PODS)))
        .unwrap();
    assert!(none.items.is_empty(), "no pod for a refused image");

    // An image under an allowed prefix (and the operator's default, primus:test) go ahead.
    apply(
        &tb,
        &ns.name,
        &plan_yaml("lab", ", image: registry.test/ml/primus:rocm"),
    );
    let (pod, _) = first_pod(&rt, &pods, "lab");
    let p = rt.block_on(pods.get(&pod)).unwrap();
    assert_eq!(
        p.spec.unwrap().containers[0].image.as_deref(),
        Some("registry.test/ml/primus:rocm")
    );
}
