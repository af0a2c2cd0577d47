//! The operator end to end against the real test bed: `kubectl apply` of the example plan ->
//! a benchmark pod (run by the test's node agent) -> a BenchmarkReport -> a tuned PyTorchJob
//! with the layout's Megatron flags and GPU resources -> the plan `Ready` with its status
//! filled; a re-run changes nothing; `primus report` -> drift condition and metrics; deleting
//! the plan garbage-collects the pods, the report and the job.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use primus_crds::{BenchmarkReport, Phase, TrainingPlan};
use primus_tests::node_agent::{NodeAgent, binary};
use primus_tests::testbed;

const PLAN: &str = "llama3-8b-bench";
const BENCH_PODS: &str = "app.kubernetes.io/component=benchmark";

#[test]
fn apply_benchmark_tune_job_ready_report_drift_and_garbage_collection() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-lifecycle");
    let k = tb.kubectl();
    let agent = NodeAgent::start(&tb, &ns.name, BENCH_PODS);
    let op = Operator::start_leading(&tb, "op-a", &ns.name, vec![]);
    let rt = runtime();
    let client = rt.block_on(tb.client());

    // Apply, and time until the PyTorchJob exists.
    let t0 = Instant::now();
    let out = k.run_stdin(
        &["apply", "-n", &ns.name, "-f", "-"],
        &example("llama3.1-8b-h100-benchmark.yaml"),
    );
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let jobs = jobs_api(&client, &ns.name);
    let job = rt.block_on(poll(Duration::from_secs(120), "the PyTorchJob", || {
        let jobs = jobs.clone();
        async move { jobs.get_opt(PLAN).await.ok().flatten() }
    }));
    let apply_to_job = t0.elapsed();
    let runs = agent.runs();
    let bench: Duration = runs.iter().map(|r| r.duration()).sum();
    let latency = apply_to_job.saturating_sub(bench);
    primus_tests::loud(&format!(
        "\n==== apply -> PyTorchJob: {:.2} s in all, {:.2} s of it the simulated benchmark process, {:.2} s operator latency (target < 5 s)\n",
        apply_to_job.as_secs_f64(),
        bench.as_secs_f64(),
        latency.as_secs_f64()
    ));
    assert!(
        latency < Duration::from_secs(10),
        "apply -> job took {latency:?} besides the benchmark"
    );

    // One benchmark pod, run to success on our node, owned by the plan.
    assert_eq!(runs.len(), 1, "one benchmark process: {runs:?}");
    assert_eq!(
        runs[0].exit_code,
        Some(0),
        "bench log: {}",
        std::fs::read_to_string(&runs[0].log).unwrap_or_default()
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let bench_pods = rt
        .block_on(pods.list(&ListParams::default().labels(BENCH_PODS)))
        .unwrap()
        .items;
    assert_eq!(bench_pods.len(), 1);
    let pod = &bench_pods[0];
    let spec = pod.spec.as_ref().unwrap();
    let c = &spec.containers[0];
    let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(
        limits.get("nvidia.com/gpu").map(|q| q.0.as_str()),
        Some("8")
    );
    assert_eq!(
        spec.node_selector
            .as_ref()
            .unwrap()
            .get("nvidia.com/gpu.product")
            .map(String::as_str),
        Some("NVIDIA-H100-80GB-HBM3")
    );
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(c.image.as_deref(), Some("primus:test"));
    let cmd = c.command.as_ref().unwrap().join(" ");
    assert!(
        cmd.starts_with(&format!(
            "primus bench --plan {}/{PLAN} --backend simulate --report-to {}/",
            ns.name, ns.name
        )),
        "{cmd}"
    );
    assert!(
        spec.tolerations
            .as_ref()
            .is_some_and(|t| t.iter().any(|t| t.key.as_deref() == Some("nvidia.com/gpu")))
    );
    // The pod also times the kernels of the plan's top 5 (spec.tuning.topK) finalists.
    assert!(cmd.ends_with(" --finalists 5"), "{cmd}");

    // The report: simulated, from our node, owned by the plan.
    let reports: Api<BenchmarkReport> = Api::namespaced(client.clone(), &ns.name);
    let list = rt
        .block_on(reports.list(&ListParams::default()))
        .unwrap()
        .items;
    assert_eq!(list.len(), 1);
    let report = &list[0];
    assert_eq!(report.spec.plan, PLAN);
    assert_eq!(report.spec.results.node, agent.node_name());
    assert_eq!(
        report.spec.results.gpu_product,
        "NVIDIA H100 80GB HBM3 (SXM5)"
    );
    assert!(!report.spec.results.ops.is_empty());
    // Finalists at other shapes than the benchmark's TP 2 MBS 1, each timed once.
    let finalists = &report.spec.results.finalists;
    assert!(!finalists.is_empty() && finalists.len() <= 5);
    assert!(
        finalists
            .iter()
            .all(|f| f.shapes_key != report.spec.results.shapes_key && !f.ops.is_empty())
    );
    let owner = &report
        .metadata
        .owner_references
        .as_ref()
        .expect("the report is owned")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("TrainingPlan", PLAN)
    );

    // The plan becomes Ready with its status filled.
    let plan = rt.block_on(poll(Duration::from_secs(60), "plan Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, PLAN)
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    let st = plan.status.clone().unwrap();
    assert_eq!(st.observed_generation, plan.metadata.generation);
    assert_eq!(st.phase, Some(Phase::Ready));
    for (t, s) in [
        ("Ready", "True"),
        ("Reconciling", "False"),
        ("Stalled", "False"),
        ("Benchmarked", "True"),
        ("Projected", "True"),
        ("Tuned", "True"),
        ("JobCreated", "True"),
        ("DriftWithinTolerance", "Unknown"),
    ] {
        let c = condition(&plan, t)
            .unwrap_or_else(|| panic!("condition {t} missing: {:?}", st.conditions));
        assert_eq!(c.status, s, "{t}: {c:?}");
        assert!(!c.reason.is_empty());
        assert_eq!(c.observed_generation, plan.metadata.generation);
    }
    let chosen = st.chosen.clone().expect("status.chosen");
    assert!(chosen.tokens_per_second_per_gpu > 0.0 && chosen.mfu > 0.0);
    // Scored by the oracle the benchmark report calibrated.
    assert!(chosen.calibrated);
    assert!(
        chosen.peak_memory_bytes > 0.0 && chosen.peak_memory_bytes <= chosen.usable_memory_bytes
    );
    assert!(st.reference.is_some() && st.gain_over_reference.is_some());
    // The finalists ranked by kernels measured at their own shapes: simulated kernels are
    // the model, so every finalist measured at its shapes keeps its place.
    let f = st
        .search
        .as_ref()
        .and_then(|s| s.finalists.clone())
        .expect("status.search.finalists");
    assert_eq!(f.finalists as usize, 1 + st.candidates.len());
    assert!(!f.order_changed && f.change.is_empty(), "{f:?}");
    let measured = std::iter::once(&chosen)
        .chain(&st.candidates)
        .filter(|c| c.measured_kernels)
        .count();
    assert_eq!(measured as u32, f.measured);
    assert!(
        chosen.measured_kernels,
        "the chosen layout's shapes were timed"
    );
    // ... and are the trials of source `benchmark` in the status's trial summary.
    let trials = st
        .search
        .as_ref()
        .and_then(|s| s.trials.clone())
        .expect("status.search.trials");
    let bench = trials
        .by_source
        .iter()
        .find(|s| s.source == "benchmark")
        .expect("benchmark trials");
    assert_eq!(bench.trials, u64::from(f.measured));
    assert!(
        st.search
            .as_ref()
            .is_some_and(|s| s.searcher == "exhaustive" && s.evaluated > 0)
    );
    let b = st.benchmark.clone().expect("status.benchmark");
    assert_eq!(b.report.as_deref(), report.metadata.name.as_deref());
    assert_eq!(b.node.as_deref(), Some(agent.node_name()));
    assert!(b.simulated && !b.reused);
    assert_eq!(b.attempts, 1);
    let js = st.job.clone().expect("status.job");
    assert_eq!(js.name.as_deref(), Some(PLAN));
    assert!(js.layout_matches_plan && !js.started && !js.suspended);

    // The job: owned, annotated, the chosen layout's flags, GPU resources, no tracking labels.
    let job = serde_json::to_value(&job).unwrap();
    let ann = &job["metadata"]["annotations"];
    assert_eq!(ann["primus.dev/plan"], PLAN);
    let layout: primus_oracle::layout::Layout =
        serde_json::from_str(ann["primus.dev/layout"].as_str().unwrap()).unwrap();
    assert_eq!(layout, chosen.layout);
    let projected: f64 = ann["primus.dev/projected-tokens-per-second"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((projected - chosen.tokens_per_second_per_gpu).abs() < 0.1);
    assert_eq!(job["metadata"]["ownerReferences"][0]["name"], PLAN);
    assert_eq!(job["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(job["metadata"]["labels"]["team"], "llm-training");
    let master = &job["spec"]["pytorchReplicaSpecs"]["Master"];
    let worker = &job["spec"]["pytorchReplicaSpecs"]["Worker"];
    assert_eq!(master["replicas"], 1);
    assert_eq!(worker["replicas"], 1, "two nodes: one master, one worker");
    assert_eq!(job["spec"]["nprocPerNode"], "8");
    let container = &master["template"]["spec"]["containers"][0];
    assert_eq!(container["name"], "pytorch");
    assert_eq!(container["image"], "nvcr.io/nvidia/nemo:25.02");
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "8");
    assert_eq!(container["resources"]["requests"]["nvidia.com/gpu"], "8");
    let args: Vec<String> = serde_json::from_value(container["args"].clone()).unwrap();
    let joined = args.join(" ");
    for flag in [
        format!("--tensor-model-parallel-size {}", chosen.layout.tp),
        format!("--pipeline-model-parallel-size {}", chosen.layout.pp),
        format!("--micro-batch-size {}", chosen.layout.micro_batch_size),
        "--global-batch-size 128".to_string(),
        "--seq-length 8192".to_string(),
        "--num-layers 32".to_string(),
        "--lr 3.0e-4".to_string(),
    ] {
        assert!(joined.contains(&flag), "{flag} missing from {joined}");
    }

    // kubectl get with the short name shows the printer columns with values.
    let table = k.ok(&["get", "tplan", "-n", &ns.name]);
    let mut lines = table.lines();
    let header = lines.next().unwrap_or_default();
    for col in ["NAME", "PHASE", "GPUS", "LAYOUT", "TOK/S/GPU", "AGE"] {
        assert!(header.contains(col), "column {col} missing: {table}");
    }
    let row = lines.next().unwrap_or_default();
    assert!(
        row.contains(PLAN) && row.contains("Ready") && row.contains("16"),
        "{table}"
    );
    assert!(row.contains(&format!("TP{}", chosen.layout.tp)), "{table}");
    let tok = format!("{}", chosen.tokens_per_second_per_gpu.trunc() as i64);
    assert!(
        row.contains(&tok[..tok.len().min(3)]),
        "tokens/s column: {table}"
    );

    // A pass that finds everything in place changes nothing: touch the plan's metadata.
    let before = op.reconciles();
    let job_rv = job["metadata"]["resourceVersion"].clone();
    let status_before = plan.status.clone();
    k.ok(&["annotate", "tplan", PLAN, "-n", &ns.name, "test/poke=1"]);
    rt.block_on(poll(
        Duration::from_secs(30),
        "a reconcile after the poke",
        || {
            let n = op.reconciles();
            async move { (n > before).then_some(()) }
        },
    ));
    let again = rt.block_on(get_plan(&client, &ns.name, PLAN)).unwrap();
    assert_eq!(again.status, status_before, "a re-run rewrote the status");
    let job_again = rt.block_on(jobs.get(PLAN)).unwrap();
    assert_eq!(
        serde_json::to_value(&job_again).unwrap()["metadata"]["resourceVersion"],
        job_rv
    );
    assert_eq!(
        rt.block_on(pods.list(&ListParams::default().labels(BENCH_PODS)))
            .unwrap()
            .items
            .len(),
        1
    );
    assert_eq!(
        rt.block_on(reports.list(&ListParams::default()))
            .unwrap()
            .items
            .len(),
        1
    );

    // primus report -> drift within tolerance, visible on /metrics.
    let projected = chosen.tokens_per_second_per_gpu;
    let report_cmd = |x: f64| {
        let out = Command::new(binary("primus"))
            .args([
                "report",
                "--plan",
                &format!("{}/{PLAN}", ns.name),
                "--tokens-per-second",
                &format!("{x:.3}"),
            ])
            .env("KUBECONFIG", &tb.kubeconfig)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "primus report: {}",
            primus_tests::stderr(&out)
        );
    };
    report_cmd(projected * 0.95);
    let plan = rt.block_on(poll(
        Duration::from_secs(30),
        "DriftWithinTolerance True",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, PLAN)
                    .await
                    .filter(|p| has(p, "DriftWithinTolerance", "True"))
            }
        },
    ));
    let d = plan
        .status
        .as_ref()
        .unwrap()
        .drift
        .clone()
        .expect("status.drift");
    assert!((d.ratio + 0.05).abs() < 1e-3, "{d:?}");
    assert!(d.within_tolerance && (d.tolerance - 0.10).abs() < 1e-12);
    let measured = plan
        .status
        .as_ref()
        .unwrap()
        .measured
        .clone()
        .expect("status.measured kept");
    assert!((measured.tokens_per_second_per_gpu - projected * 0.95).abs() < 0.01);
    let series = |name: &str| format!("{name}{{namespace=\"{}\",plan=\"{PLAN}\"}}", ns.name);
    let text = rt.block_on(poll(Duration::from_secs(10), "drift on /metrics", || {
        let m = op.metrics();
        let s = series("primus_plan_drift_ratio");
        async move { m.filter(|m| metric(m, &s).is_some()) }
    }));
    assert!(
        (metric(&text, &series("primus_plan_drift_ratio")).unwrap() + 0.05).abs() < 1e-3,
        "{text}"
    );
    assert!(
        (metric(&text, &series("primus_plan_measured_tokens_per_second")).unwrap()
            - projected * 0.95)
            .abs()
            < 0.01
    );
    assert!(
        (metric(&text, &series("primus_plan_projected_tokens_per_second")).unwrap() - projected)
            .abs()
            < 1e-6
    );
    assert_eq!(metric(&text, &series("primus_plan_stalled")), Some(0.0));
    assert_eq!(metric(&text, &series("primus_plan_ready")), Some(1.0));
    // The alert compares |drift| with the plan's own tolerance (spec.drift.tolerance).
    assert_eq!(
        metric(&text, &series("primus_plan_drift_tolerance")),
        Some(d.tolerance)
    );

    // Far below the projection: the condition flips, the status says so.
    report_cmd(projected * 0.5);
    let plan = rt.block_on(poll(
        Duration::from_secs(30),
        "DriftWithinTolerance False",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, PLAN)
                    .await
                    .filter(|p| has(p, "DriftWithinTolerance", "False"))
            }
        },
    ));
    let c = condition(&plan, "DriftWithinTolerance").unwrap();
    assert_eq!(c.reason, "OutsideTolerance");
    assert!(c.message.contains("-50.0%"), "{}", c.message);
    // Who owns what: measured by primus-report, the rest by primus-operator.
    let managed = serde_json::to_value(&plan.metadata.managed_fields)
        .unwrap()
        .to_string();
    assert!(
        managed.contains("primus-report") && managed.contains("primus-operator"),
        "{managed}"
    );

    // Events for the steps.
    let events = k.ok(&[
        "get",
        "events.events.k8s.io",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.items[*].reason}",
    ]);
    for reason in [
        "BenchmarkStarted",
        "ReportReceived",
        "Tuned",
        "JobCreated",
        "OutsideTolerance",
    ] {
        assert!(events.contains(reason), "event {reason} missing: {events}");
    }

    // Deleting the plan garbage-collects the pod, the report and the job.
    k.ok(&["delete", "tplan", PLAN, "-n", &ns.name, "--wait=false"]);
    rt.block_on(poll(
        Duration::from_secs(120),
        "garbage collection of pods, reports and the job",
        || {
            let (pods, reports, jobs) = (pods.clone(), reports.clone(), jobs.clone());
            async move {
                let p = pods.list(&ListParams::default()).await.ok()?.items.len();
                let r = reports.list(&ListParams::default()).await.ok()?.items.len();
                let j = jobs.list(&ListParams::default()).await.ok()?.items.len();
                (p + r + j == 0).then_some(())
            }
        },
    ));
    let plans: Api<TrainingPlan> = Api::namespaced(client.clone(), &ns.name);
    assert!(rt.block_on(plans.get_opt(PLAN)).unwrap().is_none());
    // Its series leave /metrics.
    rt.block_on(poll(
        Duration::from_secs(30),
        "the plan's series to leave /metrics",
        || {
            let m = op.metrics();
            let s = series("primus_plan_projected_tokens_per_second");
            async move { m.filter(|m| metric(m, &s).is_none()) }
        },
    ));
    drop(agent);
}

/// A second plan with the same GPU product and layer shapes reuses the first plan's report
/// instead of benchmarking again.
#[test]
fn a_matching_recent_report_is_reused_instead_of_benchmarking_again() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-reuse");
    let k = tb.kubectl();
    let agent = NodeAgent::start(&tb, &ns.name, BENCH_PODS);
    let _op = Operator::start_leading(&tb, "op-reuse", &ns.name, vec![]);
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let ready = |name: &'static str| {
        let client = client.clone();
        let ns = ns.name.clone();
        rt.block_on(poll(Duration::from_secs(90), name, move || {
            let client = client.clone();
            let ns = ns.clone();
            async move {
                get_plan(&client, &ns, name)
                    .await
                    .filter(|p| has(p, "Ready", "True"))
            }
        }))
    };

    let first = example("llama3.1-8b-h100-benchmark.yaml");
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &first);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let a = ready(PLAN);
    // Same model, GPU, shapes; another global batch and name.
    let second = first
        .replace(&format!("name: {PLAN}"), "name: second")
        .replace("globalBatchSize: 128", "globalBatchSize: 256");
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &second);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let b = ready("second");
    let c = condition(&b, "Benchmarked").unwrap();
    assert_eq!(c.reason, "ReportReused", "{c:?}");
    let bs = b.status.as_ref().unwrap().benchmark.clone().unwrap();
    assert!(bs.reused);
    assert_eq!(
        bs.report,
        a.status
            .as_ref()
            .unwrap()
            .benchmark
            .as_ref()
            .unwrap()
            .report
    );
    assert_eq!(bs.attempts, 0, "no pod for the second plan");
    assert_eq!(agent.runs().len(), 1, "one benchmark in all");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    assert_eq!(
        rt.block_on(pods.list(&ListParams::default().labels(BENCH_PODS)))
            .unwrap()
            .items
            .len(),
        1
    );
    assert!(
        rt.block_on(jobs_api(&client, &ns.name).get_opt("second"))
            .unwrap()
            .is_some()
    );
}

/// Drift from a Prometheus query (`spec.drift.prometheus`): the operator queries the HTTP API
/// (here a local server speaking it) and sets the condition and the metrics.
#[test]
fn drift_from_a_prometheus_query() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use warp::Filter;

    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-prom");
    let k = tb.kubectl();
    let rt = runtime();
    let client = rt.block_on(tb.client());

    // The value the query returns (f64 bits); 0 = no series yet.
    let value = Arc::new(AtomicU64::new(0));
    let served = value.clone();
    let seen_query = Arc::new(std::sync::Mutex::new(String::new()));
    let seen = seen_query.clone();
    let route = warp::path!("api" / "v1" / "query")
        .and(warp::query::<std::collections::HashMap<String, String>>())
        .map(move |q: std::collections::HashMap<String, String>| {
            *seen.lock().unwrap() = q.get("query").cloned().unwrap_or_default();
            let bits = served.load(Ordering::SeqCst);
            let result = if bits == 0 {
                serde_json::json!([])
            } else {
                serde_json::json!([{"metric": {"job": "train"}, "value": [1.0, f64::from_bits(bits).to_string()]}])
            };
            warp::reply::json(&serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}}))
        });
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(warp::serve(route).incoming(listener).run());

    let op = Operator::start_leading(
        &tb,
        "op-prom",
        &ns.name,
        vec![
            "--drift-interval-seconds".into(),
            "1".into(),
            "--drift-url-allow".into(),
            format!("http://127.0.0.1:{}", addr.port()),
        ],
    );
    let yaml = format!(
        "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata:\n  name: prom\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 8}}\n  training: {{seqLength: 4096, globalBatchSize: 64}}\n  tuning: {{searcher: exhaustive, allowed: {{tp: [1, 2], pp: [1]}}}}\n  job: {{autoSubmit: false}}\n  drift:\n    tolerance: 0.2\n    prometheus: {{url: 'http://{addr}', query: 'avg(megatron_tokens_per_second_per_gpu{{job=\"train\"}})'}}\n"
    );
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &yaml);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = rt.block_on(poll(
        Duration::from_secs(60),
        "Ready without a sample",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "prom")
                    .await
                    .filter(|p| has(p, "Ready", "True"))
            }
        },
    ));
    assert_eq!(
        condition(&plan, "DriftWithinTolerance").unwrap().reason,
        "NoMeasurement"
    );
    let projected = plan
        .status
        .as_ref()
        .unwrap()
        .chosen
        .as_ref()
        .unwrap()
        .tokens_per_second_per_gpu;

    // The job starts reporting 10% above the projection.
    value.store((projected * 1.1).to_bits(), Ordering::SeqCst);
    let plan = rt.block_on(poll(
        Duration::from_secs(30),
        "drift from Prometheus",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "prom")
                    .await
                    .filter(|p| has(p, "DriftWithinTolerance", "True"))
            }
        },
    ));
    let d = plan.status.as_ref().unwrap().drift.clone().unwrap();
    assert!((d.ratio - 0.1).abs() < 1e-6, "{d:?}");
    assert!(
        condition(&plan, "DriftWithinTolerance")
            .unwrap()
            .message
            .contains("Prometheus")
    );
    assert_eq!(
        *seen_query.lock().unwrap(),
        "avg(megatron_tokens_per_second_per_gpu{job=\"train\"})"
    );
    let series = format!(
        "primus_plan_drift_ratio{{namespace=\"{}\",plan=\"prom\"}}",
        ns.name
    );
    let m = op.metrics().unwrap();
    assert!((metric(&m, &series).unwrap() - 0.1).abs() < 1e-6, "{m}");

    // Then 30% below: outside the 20% tolerance.
    value.store((projected * 0.7).to_bits(), Ordering::SeqCst);
    rt.block_on(poll(
        Duration::from_secs(30),
        "drift outside tolerance",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "prom")
                    .await
                    .filter(|p| has(p, "DriftWithinTolerance", "False"))
            }
        },
    ));

    // A URL the operator's allow-list does not name (another port of the same host): the
    // condition says why (the unit tests in drift.rs show that no request is sent).
    let other = yaml
        .replace("name: prom", "name: elsewhere")
        .replace(&format!("http://{addr}"), "http://127.0.0.1:1");
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &other);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = rt.block_on(poll(Duration::from_secs(60), "URLNotAllowed", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "elsewhere").await.filter(|p| {
                condition(p, "DriftWithinTolerance").is_some_and(|c| c.reason == "URLNotAllowed")
            })
        }
    }));
    let c = condition(&plan, "DriftWithinTolerance").unwrap();
    assert_eq!(c.status, "Unknown");
    assert!(c.message.contains("--drift-url-allow"), "{}", c.message);
    assert!(
        has(&plan, "Ready", "True"),
        "drift does not hold the plan back"
    );
}
