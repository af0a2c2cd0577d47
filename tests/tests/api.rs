//! The TrainingPlan API against a real kube-apiserver: the generated CRDs install, `kubectl
//! apply` of an example plan round-trips through the Rust client, the server's schema rejects
//! bad plans naming the field, and `kubectl explain` shows the field docs.

use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use primus_crds::{TrainingPlan, TrainingPlanSpec};
use primus_tests::{repo_root, stderr, stdout, testbed, wait_for};

#[test]
fn generated_crds_are_established() {
    let Some(tb) = testbed!() else { return };
    let k = tb.kubectl();
    for name in ["trainingplans.primus.dev", "benchmarkreports.primus.dev"] {
        // `testbed.sh up` applied crds/*.yaml; re-applying the checked-in files is a no-op.
        let file = repo_root().join("crds").join(format!("{name}.yaml"));
        k.ok(&["apply", "-f", file.to_str().unwrap()]);
        let status = wait_for(Duration::from_secs(20), "CRD Established", || {
            let s = k.ok(&[
                "get",
                "crd",
                name,
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Established")].status}"#,
            ]);
            (s == "True").then_some(s)
        });
        assert_eq!(status, "True");
    }
}

#[test]
fn kubectl_apply_round_trips_every_field() {
    let Some(tb) = testbed!() else { return };
    let ns = tb.namespace("api-roundtrip");
    let example = repo_root().join("examples/llama3.1-70b-mi300x.yaml");
    let k = tb.kubectl();
    k.ok(&["apply", "-n", &ns.name, "-f", example.to_str().unwrap()]);

    let text = std::fs::read_to_string(&example).unwrap();
    let local: TrainingPlan =
        serde_saphyr::from_str(&text).expect("example parses as a TrainingPlan");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let remote = rt.block_on(async {
        let api: Api<TrainingPlan> = Api::namespaced(tb.client().await, &ns.name);
        api.get("llama3-70b").await.expect("plan readable")
    });
    assert_eq!(remote.spec, local.spec, "the server kept every spec field");
    // The oracle reads the stored object exactly like the file.
    let oracle = remote
        .spec
        .to_oracle()
        .expect("stored spec is a valid oracle plan");
    let layout = oracle.parallelism.expect("layout kept");
    assert_eq!((layout.tp, layout.pp, layout.vpp), (4, 8, 5));

    // The short name and the printer columns work.
    let table = k.ok(&["get", "tplan", "-n", &ns.name]);
    let header = table.lines().next().unwrap_or_default();
    for col in ["NAME", "PHASE", "GPUS", "LAYOUT", "TOK/S/GPU", "AGE"] {
        assert!(header.contains(col), "column {col} missing in {header:?}");
    }
    assert!(
        table.contains("llama3-70b") && table.contains("64"),
        "{table}"
    );
}

#[test]
fn rust_client_create_round_trips() {
    let Some(tb) = testbed!() else { return };
    let ns = tb.namespace("api-create");
    let text =
        std::fs::read_to_string(repo_root().join("examples/llama3.1-70b-mi300x.yaml")).unwrap();
    let mut plan: TrainingPlan = serde_saphyr::from_str(&text).unwrap();
    plan.metadata.name = Some("from-rust".into());
    plan.spec.parallelism.as_mut().unwrap().micro_batch_size = 2;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let back: TrainingPlanSpec = rt.block_on(async {
        let api: Api<TrainingPlan> = Api::namespaced(tb.client().await, &ns.name);
        api.create(&PostParams::default(), &plan)
            .await
            .expect("create");
        api.get("from-rust").await.expect("get").spec
    });
    assert_eq!(back, plan.spec);
    let mbs = tb.kubectl().ok(&[
        "get",
        "tplan",
        "from-rust",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.spec.parallelism.microBatchSize}",
    ]);
    assert_eq!(mbs, "2");
}

fn apply_plan_text(tb: &primus_tests::TestBed, ns: &str, body: &str) -> std::process::Output {
    tb.kubectl()
        .run_stdin(&["apply", "-n", ns, "-f", "-"], body)
}

const BAD_GPUS: &str = r#"
apiVersion: primus.dev/v1alpha1
kind: TrainingPlan
metadata: {name: bad-gpus}
spec:
  model: {preset: llama3.1-70b}
  cluster: {gpu: mi300x, gpus: -4}
  training: {seqLength: 8192, globalBatchSize: 128}
"#;

const BAD_TYPE: &str = r#"
apiVersion: primus.dev/v1alpha1
kind: TrainingPlan
metadata: {name: bad-type}
spec:
  model: {preset: llama3.1-70b}
  cluster: {gpu: mi300x, gpus: 64}
  training: {seqLength: 8192, globalBatchSize: 128}
  parallelism: {tp: four}
"#;

const BAD_ENUM: &str = r#"
apiVersion: primus.dev/v1alpha1
kind: TrainingPlan
metadata: {name: bad-enum}
spec:
  model: {preset: llama3.1-70b}
  cluster: {gpu: mi300x, gpus: 64}
  training: {seqLength: 8192, globalBatchSize: 128}
  parallelism: {recompute: sometimes}
"#;

#[test]
fn schema_rejects_invalid_plans_naming_the_field() {
    let Some(tb) = testbed!() else { return };
    let ns = tb.namespace("api-invalid");
    for (body, field, what) in [
        (BAD_GPUS, "spec.cluster.gpus", "greater than or equal to 1"),
        (BAD_TYPE, "spec.parallelism.tp", "integer"),
        (BAD_ENUM, "spec.parallelism.recompute", "Unsupported value"),
    ] {
        let out = apply_plan_text(&tb, &ns.name, body);
        assert!(!out.status.success(), "{field}: the server accepted {body}");
        let err = stderr(&out);
        assert!(err.contains(field), "error does not name {field}: {err}");
        assert!(err.contains(what), "error does not say {what:?}: {err}");
    }
    // Nothing was stored.
    let list = tb
        .kubectl()
        .ok(&["get", "tplan", "-n", &ns.name, "-o", "name"]);
    assert!(list.trim().is_empty(), "{list}");
}

#[test]
fn kubectl_explain_shows_the_field_docs() {
    let Some(tb) = testbed!() else { return };
    // The API server publishes CRD schemas to OpenAPI shortly after they are established.
    let text = wait_for(Duration::from_secs(30), "explain output", || {
        let out = tb
            .kubectl()
            .run(&["explain", "trainingplan.spec.parallelism"]);
        out.status.success().then(|| stdout(&out))
    });
    for needle in [
        "Tensor-parallel size",
        "Pipeline-parallel size",
        "Virtual pipeline stages per GPU",
        "microBatchSize",
        "schedule",
    ] {
        assert!(text.contains(needle), "explain lacks {needle:?}:\n{text}");
    }
    let model = tb.kubectl().ok(&["explain", "trainingplan.spec.model"]);
    assert!(model.contains("preset"), "{model}");
}
