//! `spec.job.kind: TrainJob` against the real test bed (issue 18 item 4): the operator writes
//! the chosen layout into a Kubeflow Trainer v2 TrainJob on the plan's runtime (nodes, processes
//! per node, GPUs per node, the Megatron flags of the template's trainer), owned by the plan and
//! created suspended for review; the plan's status names the TrainJob; a queue controller that
//! resumes it (`spec.suspend`) is left alone.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use primus_tests::testbed;

const PLAN: &str = r#"apiVersion: primus.dev/v1alpha1
kind: TrainingPlan
metadata:
  name: trainer-v2
spec:
  model: {preset: llama3.1-8b}
  cluster: {gpu: h100-sxm, gpus: 16}
  training: {seqLength: 4096, globalBatchSize: 64}
  parallelism: {tp: 2, pp: 2}
  tuning: {searcher: none}
  job:
    kind: TrainJob
    suspend: true
    runtimeRef: {name: megatron-runtime}
    template:
      metadata:
        labels: {kueue.x-k8s.io/queue-name: team-a}
      spec:
        trainer:
          image: example/megatron:1
          command: [torchrun, /opt/megatron-lm/pretrain_gpt.py]
          args: [--lr, "1e-4"]
"#;

fn trainjobs(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource {
        group: "trainer.kubeflow.org".into(),
        version: "v1alpha1".into(),
        api_version: "trainer.kubeflow.org/v1alpha1".into(),
        kind: "TrainJob".into(),
        plural: "trainjobs".into(),
    };
    Api::namespaced_with(client.clone(), ns, &ar)
}

#[test]
fn a_plan_asking_for_a_trainjob_gets_one_with_its_layout() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    ensure_trainjob_crd(&tb);
    let ns = tb.namespace("op-trainjob");
    let k = tb.kubectl();
    let op = Operator::start_leading(&tb, "op-trainjob", &ns.name, vec![]);
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let jobs = trainjobs(&client, &ns.name);
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], PLAN);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));

    let job = rt.block_on(poll(Duration::from_secs(60), "the TrainJob", || {
        let jobs = jobs.clone();
        async move { jobs.get_opt("trainer-v2").await.ok().flatten() }
    }));
    let spec = &job.data["spec"];
    assert_eq!(
        spec["runtimeRef"],
        serde_json::json!({"name": "megatron-runtime", "kind": "ClusterTrainingRuntime",
                           "apiGroup": "trainer.kubeflow.org"})
    );
    assert_eq!(spec["suspend"], true);
    let t = &spec["trainer"];
    // 16 H100 = 2 nodes of 8.
    assert_eq!(
        (t["numNodes"].as_i64(), t["numProcPerNode"].as_i64()),
        (Some(2), Some(8))
    );
    assert_eq!(t["resourcesPerNode"]["limits"]["nvidia.com/gpu"], "8");
    assert_eq!(t["image"], "example/megatron:1");
    let args: Vec<&str> = t["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let args = args.join(" ");
    assert!(args.contains("--tensor-model-parallel-size 2"), "{args}");
    assert!(args.contains("--pipeline-model-parallel-size 2"), "{args}");
    assert!(args.contains("--lr 1e-4"), "{args}");
    let meta = serde_json::to_value(&job.metadata).unwrap();
    assert_eq!(meta["labels"]["kueue.x-k8s.io/queue-name"], "team-a");
    assert_eq!(meta["ownerReferences"][0]["kind"], "TrainingPlan");
    assert_eq!(meta["ownerReferences"][0]["controller"], true);
    assert!(meta["annotations"]["primus.dev/layout"].is_string());

    // The status names the TrainJob, suspended by the plan for review.
    let plan = rt.block_on(poll(
        Duration::from_secs(30),
        "JobCreated=Suspended",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "trainer-v2")
                    .await
                    .filter(|p| condition(p, "JobCreated").is_some_and(|c| c.reason == "Suspended"))
            }
        },
    ));
    let c = condition(&plan, "JobCreated").unwrap();
    assert!(
        c.message.starts_with("TrainJob trainer-v2 with "),
        "{}",
        c.message
    );

    // A queue controller resumes it: left alone (the plan's suspend did not change).
    let pp = PatchParams {
        field_manager: Some("kueue-admission".into()),
        ..PatchParams::default()
    };
    let patch = serde_json::json!({"spec": {"suspend": false}});
    rt.block_on(jobs.patch("trainer-v2", &pp, &Patch::Merge(&patch)))
        .unwrap();
    let plan = rt.block_on(poll(Duration::from_secs(30), "JobCreated=Created", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "trainer-v2")
                .await
                .filter(|p| condition(p, "JobCreated").is_some_and(|c| c.reason == "Created"))
        }
    }));
    assert!(plan.status.as_ref().and_then(|s| s.job.as_ref()).is_some());
    std::thread::sleep(Duration::from_secs(2));
    let job = rt.block_on(jobs.get("trainer-v2")).unwrap();
    assert_eq!(
        job.data["spec"]["suspend"], false,
        "the queue's resume was kept"
    );
    drop(op);
}
