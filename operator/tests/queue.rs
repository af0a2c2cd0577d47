//! Queue-aware jobs against the real test bed (issue 18 item 1): another field manager (what
//! Kueue does to every job its queue has not admitted) suspends and then resumes the plan's
//! PyTorchJob, and the operator leaves both alone while its status tells "waiting in a queue"
//! from "suspended by the plan"; a change of `spec.job.suspend` itself is still passed on. The
//! queue and scheduling fields of the plan's job template reach the job.

mod common;

use std::time::Duration;

use common::*;
use kube::api::{DynamicObject, Patch, PatchParams};
use primus_tests::testbed;

/// The field manager that plays the queue controller.
const QUEUE_MANAGER: &str = "kueue-admission";

const PLAN: &str = r#"apiVersion: primus.dev/v1alpha1
kind: TrainingPlan
metadata:
  name: queued
spec:
  model: {preset: llama3.1-8b}
  cluster: {gpu: h100-sxm, gpus: 8}
  training: {seqLength: 4096, globalBatchSize: 64}
  parallelism: {tp: 2}
  tuning: {searcher: none}
  job:
    template:
      metadata:
        labels: {kueue.x-k8s.io/queue-name: team-a}
        annotations: {scheduling.volcano.sh/queue-name: team-a}
      spec:
        runPolicy: {schedulingPolicy: {queue: team-a, priorityClass: high}}
        pytorchReplicaSpecs:
          Worker:
            template:
              spec:
                priorityClassName: high
                schedulerName: volcano
                containers: [{name: pytorch, image: example/megatron:1}]
"#;

fn suspend_of(j: &DynamicObject) -> Option<bool> {
    j.data["spec"]["runPolicy"]["suspend"].as_bool()
}

/// Another manager sets `runPolicy.suspend`.
async fn queue_sets(jobs: &kube::Api<DynamicObject>, suspend: bool) {
    let patch = serde_json::json!({"spec": {"runPolicy": {"suspend": suspend}}});
    let pp = PatchParams {
        field_manager: Some(QUEUE_MANAGER.into()),
        ..PatchParams::default()
    };
    jobs.patch("queued", &pp, &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[test]
fn a_queue_controllers_suspend_and_resume_are_left_alone() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-queue");
    let k = tb.kubectl();
    let op = Operator::start_leading(&tb, "op-queue", &ns.name, vec![]);
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let jobs = jobs_api(&client, &ns.name);
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], PLAN);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));

    let job = rt.block_on(poll(Duration::from_secs(60), "the job", || {
        let jobs = jobs.clone();
        async move { jobs.get_opt("queued").await.ok().flatten() }
    }));
    // Queue and scheduling fields passed from the template.
    let meta = serde_json::to_value(&job.metadata).unwrap();
    assert_eq!(meta["labels"]["kueue.x-k8s.io/queue-name"], "team-a");
    assert_eq!(
        meta["annotations"]["scheduling.volcano.sh/queue-name"],
        "team-a"
    );
    assert_eq!(meta["annotations"]["primus.dev/suspend-applied"], "false");
    let spec = &job.data["spec"];
    assert_eq!(
        spec["runPolicy"]["schedulingPolicy"],
        serde_json::json!({"queue": "team-a", "priorityClass": "high"})
    );
    // One node: the Master, written from the template's Worker.
    let pod = &spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "high");
    assert_eq!(pod["schedulerName"], "volcano");
    assert_ne!(suspend_of(&job), Some(true));

    // The queue suspends it: the operator leaves it suspended and says it waits in the queue.
    rt.block_on(queue_sets(&jobs, true));
    let plan = rt.block_on(poll(Duration::from_secs(30), "JobCreated=Queued", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "queued")
                .await
                .filter(|p| condition(p, "JobCreated").is_some_and(|c| c.reason == "Queued"))
        }
    }));
    let c = condition(&plan, "JobCreated").unwrap();
    assert!(c.message.contains("waits in queue team-a"), "{}", c.message);
    assert!(
        plan.status
            .as_ref()
            .unwrap()
            .job
            .as_ref()
            .unwrap()
            .suspended
    );
    hold(&rt, &op, &k, &ns.name, &jobs, Some(true));

    // The queue admits it and resumes it: left running.
    rt.block_on(queue_sets(&jobs, false));
    rt.block_on(poll(Duration::from_secs(30), "JobCreated=Created", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "queued")
                .await
                .filter(|p| condition(p, "JobCreated").is_some_and(|c| c.reason == "Created"))
        }
    }));
    hold(&rt, &op, &k, &ns.name, &jobs, Some(false));

    // spec.job.suspend itself changes: passed on (the review flow), and recorded.
    k.ok(&[
        "patch",
        "tplan",
        "queued",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"job":{"suspend":true}}}"#,
    ]);
    let job = rt.block_on(poll(
        Duration::from_secs(30),
        "suspended by the plan",
        || {
            let jobs = jobs.clone();
            async move {
                jobs.get("queued")
                    .await
                    .ok()
                    .filter(|j| suspend_of(j) == Some(true))
            }
        },
    ));
    let ann = job.metadata.annotations.as_ref().unwrap();
    assert_eq!(ann["primus.dev/suspend-applied"], "true");
    rt.block_on(poll(
        Duration::from_secs(30),
        "JobCreated=Suspended",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "queued")
                    .await
                    .filter(|p| condition(p, "JobCreated").is_some_and(|c| c.reason == "Suspended"))
            }
        },
    ));
    // Someone else resumes it while the plan still says suspend: not reverted either.
    rt.block_on(queue_sets(&jobs, false));
    hold(&rt, &op, &k, &ns.name, &jobs, Some(false));
    let log = op.log_text();
    assert!(!log.contains("panicked"), "{log}");
}

/// The job keeps `want` through several operator passes: the plan is touched (an annotation,
/// which makes the controller reconcile it) and passes are counted, so the operator has looked
/// at the job after the other manager's change.
fn hold(
    rt: &tokio::runtime::Runtime,
    op: &Operator,
    k: &primus_tests::Kubectl,
    ns: &str,
    jobs: &kube::Api<DynamicObject>,
    want: Option<bool>,
) {
    for i in 0..3 {
        let before = op.reconciles();
        k.ok(&[
            "annotate",
            "--overwrite",
            "tplan",
            "queued",
            "-n",
            ns,
            &format!("test.primus.dev/touch={i}-{want:?}"),
        ]);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while op.reconciles() <= before {
            assert!(
                std::time::Instant::now() < deadline,
                "no pass after a touch"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let j = rt.block_on(jobs.get("queued")).unwrap();
        assert_eq!(
            suspend_of(&j),
            want,
            "pass {i}: the operator changed runPolicy.suspend"
        );
        let owners: Vec<String> = j
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| {
                m.fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.to_string().contains("\"f:suspend\""))
            })
            .filter_map(|m| m.manager.clone())
            .collect();
        assert_eq!(owners, vec![QUEUE_MANAGER.to_string()], "suspend managers");
    }
}
