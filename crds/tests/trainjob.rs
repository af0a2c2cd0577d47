//! The TrainJob writer (`spec.job.kind: TrainJob`, Kubeflow Trainer v2): the emitted object
//! passes the vendored trainer.kubeflow.org/v1alpha1 CRD's schema, runs on the named runtime,
//! and carries the layout as Megatron flags that parse back to the same layout, with one node
//! per `numNodes` and one process per GPU. The types round-trip every field the CRD declares.

mod common;

use common::{layout, scenario};

use primus_crds::annotations as annotation;
use primus_crds::job::{self, Job};
use primus_crds::pytorchjob::JobOptions;
use primus_crds::training_plan::{JobKind, JobSpec, Launcher, RuntimeRef};
use primus_crds::trainjob::TrainJob;
use primus_oracle::layout::Layout;
use primus_oracle::megatron::MegatronArgs;
use primus_oracle::scenario::Scenario;
use serde_json::{Value, json};

const CRD: &str = "trainer.kubeflow.org_trainjobs.yaml";

/// The TrainJob of `job` for layout `l`, as JSON.
fn write(s: &Scenario, l: &Layout, job: &JobSpec, opts: &JobOptions) -> Result<Value, String> {
    let spec = JobSpec {
        kind: Some(JobKind::TrainJob),
        ..job.clone()
    };
    match job::write("llama3-70b", Some("team-a"), s, l, &spec, opts) {
        Ok(Job::Train(j)) => Ok(serde_json::to_value(j).unwrap()),
        Ok(other) => Err(format!("not a TrainJob: {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

fn words(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|w| w.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn the_default_trainjob_passes_the_crd_and_carries_the_layout() {
    // 32 MI300X = 4 nodes of 8.
    let (s, l) = (scenario("mi300x", 32), layout());
    let opts = JobOptions {
        suspend: true,
        projected_tokens_per_second: Some(1234.5),
        ..JobOptions::default()
    };
    let job = write(&s, &l, &JobSpec::default(), &opts).unwrap();
    let errors = common::schema_errors(&common::crd_schema(CRD), &job);
    assert!(errors.is_empty(), "schema errors: {errors:#?}\n{job:#}");

    assert_eq!(job["apiVersion"], "trainer.kubeflow.org/v1alpha1");
    assert_eq!(job["kind"], "TrainJob");
    assert_eq!(job["metadata"]["namespace"], "team-a");
    assert_eq!(
        job["spec"]["runtimeRef"],
        json!({"name": "torch-distributed", "kind": "ClusterTrainingRuntime",
               "apiGroup": "trainer.kubeflow.org"})
    );
    assert_eq!(job["spec"]["suspend"], true);
    let t = &job["spec"]["trainer"];
    assert_eq!(t["numNodes"], 4);
    assert_eq!(t["numProcPerNode"], 8);
    assert_eq!(t["resourcesPerNode"]["limits"]["amd.com/gpu"], "8");
    assert_eq!(t["resourcesPerNode"]["requests"]["amd.com/gpu"], "8");
    assert!(t["image"].as_str().unwrap().contains("rocm"), "{t}");
    // No working directory in a trainer: the default script has its full path.
    assert_eq!(
        words(&t["command"]),
        ["torchrun", "/workspace/Megatron-LM/pretrain_gpt.py"]
    );
    let args = words(&t["args"]);
    let parsed = MegatronArgs::parse(args.iter().map(String::as_str));
    let mut back = parsed.layout(&s.model).unwrap();
    back.etp = l.etp;
    assert_eq!(back, l, "args {args:?}");
    assert_eq!(parsed.training().unwrap(), Some(s.training));
    assert!(args.contains(&"--mock-data".to_string()), "{args:?}");

    let ann = &job["metadata"]["annotations"];
    assert_eq!(ann[annotation::GPU], "mi300x");
    assert_eq!(ann[annotation::PROJECTED_TOKENS_PER_SECOND], "1234.5");
    let annotated: Layout =
        serde_json::from_str(ann[annotation::LAYOUT].as_str().unwrap()).unwrap();
    assert_eq!(annotated, l);
    let typed: TrainJob = serde_json::from_value(job).unwrap();
    assert!(typed.suspended() && !typed.started());
    assert_eq!(typed.annotated_layout(), Some(l));
}

#[test]
fn a_template_keeps_its_trainer_and_queue_and_the_plan_names_the_runtime() {
    let (s, l) = (scenario("h100-sxm", 16), layout());
    let template = json!({
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a",
                                "app.kubernetes.io/instance": "argo"}},
        "spec": {"runtimeRef": {"name": "from-template"},
                 "trainer": {"image": "example/megatron:1",
                             "command": ["torchrun", "/src/pretrain_gpt.py"],
                             "args": ["--lr", "1e-4", "--tensor-model-parallel-size", "1"],
                             "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}}});
    let spec = JobSpec {
        template: Some(template),
        runtime_ref: Some(RuntimeRef {
            name: Some("megatron".into()),
            kind: Some("TrainingRuntime".into()),
        }),
        ..JobSpec::default()
    };
    let job = write(&s, &l, &spec, &JobOptions::default()).unwrap();
    let errors = common::schema_errors(&common::crd_schema(CRD), &job);
    assert!(errors.is_empty(), "schema errors: {errors:#?}");
    assert_eq!(job["spec"]["runtimeRef"]["name"], "megatron");
    assert_eq!(job["spec"]["runtimeRef"]["kind"], "TrainingRuntime");
    assert!(job["spec"].get("suspend").is_none());
    let labels = &job["metadata"]["labels"];
    assert_eq!(labels["kueue.x-k8s.io/queue-name"], "team-a");
    assert!(labels.get("app.kubernetes.io/instance").is_none());
    let t = &job["spec"]["trainer"];
    assert_eq!(t["image"], "example/megatron:1");
    assert_eq!(words(&t["command"]), ["torchrun", "/src/pretrain_gpt.py"]);
    assert_eq!(t["numNodes"], 2);
    assert_eq!(t["resourcesPerNode"]["limits"]["nvidia.com/gpu"], "8");
    let args = words(&t["args"]).join(" ");
    assert!(args.contains("--lr 1e-4"), "{args}");
    // The template's TP 1 is replaced by the layout's.
    assert!(args.contains("--tensor-model-parallel-size 4"), "{args}");
    assert!(!args.contains("--tensor-model-parallel-size 1"), "{args}");
    assert!(
        t["env"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "NCCL_DEBUG")
    );
    let typed: TrainJob = serde_json::from_value(job).unwrap();
    assert_eq!(typed.queue().as_deref(), Some("team-a"));
}

#[test]
fn a_primus_trainjob_runs_primus_cli_with_overrides() {
    let (s, l) = (scenario("mi300x", 8), layout());
    let opts = JobOptions {
        launcher: Launcher::Primus,
        ..JobOptions::default()
    };
    let job = write(&s, &l, &JobSpec::default(), &opts).unwrap();
    let t = &job["spec"]["trainer"];
    assert_eq!(words(&t["command"])[0], "primus-cli");
    let args = words(&t["args"]).join(" ");
    assert!(args.contains("--tensor_model_parallel_size 4"), "{args}");
    assert_eq!(t["numNodes"], 1);
}

#[test]
fn bad_job_settings_name_the_field() {
    let (s, l) = (scenario("h100-sxm", 8), layout());
    let bad_kind = JobSpec {
        runtime_ref: Some(RuntimeRef {
            name: None,
            kind: Some("Deployment".into()),
        }),
        ..JobSpec::default()
    };
    let e = write(&s, &l, &bad_kind, &JobOptions::default()).unwrap_err();
    assert!(e.starts_with("spec.job.runtimeRef.kind"), "{e}");
    let cases = [
        (json!("x"), "spec.job.template"),
        (
            json!({"kind": "PyTorchJob", "spec": {}}),
            "spec.job.template.kind",
        ),
        (
            json!({"spec": {"trainer": {"numNodes": "two"}}}),
            "spec.job.template.spec",
        ),
        (
            json!({"trainer": {"args": ["--lr", "1e-4"]}}),
            "spec.job.template.trainer.image",
        ),
        (
            json!({"spec": {"runtimeRef": {"name": "r", "kind": "Pod"}}}),
            "spec.job.template.spec.runtimeRef.kind",
        ),
        // A PyTorchJob's template (its spec alone, or whole without its kind).
        (
            json!({"pytorchReplicaSpecs": {"Worker": {}}}),
            "spec.job.template.pytorchReplicaSpecs",
        ),
        (
            json!({"spec": {"nprocPerNode": "8"}}),
            "spec.job.template.spec.nprocPerNode",
        ),
    ];
    for (template, field) in cases {
        let spec = JobSpec {
            template: Some(template.clone()),
            ..JobSpec::default()
        };
        let e = write(&s, &l, &spec, &JobOptions::default()).unwrap_err();
        assert!(e.starts_with(field), "{template}: {e}");
    }
    // A runtime only a TrainJob has, on a PyTorchJob.
    let pytorch = JobSpec {
        runtime_ref: Some(RuntimeRef {
            name: Some("torch-distributed".into()),
            kind: None,
        }),
        kind: Some(JobKind::PyTorchJob),
        ..JobSpec::default()
    };
    let e = job::write("p", None, &s, &l, &pytorch, &JobOptions::default()).unwrap_err();
    assert!(e.to_string().starts_with("spec.job.runtimeRef"), "{e}");
}

#[test]
fn the_fields_the_types_name_round_trip_and_the_rest_is_kept() {
    let schema = common::crd_schema(CRD);
    let mut doc = common::sample(&schema, 4);
    doc["metadata"] = json!({"name": "j"});
    doc["spec"]["trainer"]["env"] = json!([{"name": "A", "value": "b"}]);
    doc["spec"]["trainer"]["resourcesPerNode"] = json!({"limits": {"nvidia.com/gpu": "8"}});
    doc["status"]["jobsStatus"] = json!([{"name": "node", "active": 1, "ready": 1,
        "succeeded": 0, "failed": 0, "suspended": 0}]);
    doc["status"]["conditions"] = json!([{"type": "Complete", "status": "False",
        "reason": "r", "message": "m", "lastTransitionTime": "2026-12-01T00:00:00Z"}]);
    let job: TrainJob = serde_json::from_value(doc.clone()).expect("the sample deserializes");
    let t = job.spec.trainer.as_ref().unwrap();
    for named in [
        "image",
        "command",
        "args",
        "env",
        "numNodes",
        "numProcPerNode",
        "resourcesPerNode",
    ] {
        assert!(!t.extra.contains_key(named), "{named} is typed");
    }
    assert!(
        job.spec.extra.contains_key("initializer"),
        "unnamed fields are kept"
    );
    assert!(job.started(), "an active node pod has started");
    assert_eq!(serde_json::to_value(&job).unwrap(), doc);
}
