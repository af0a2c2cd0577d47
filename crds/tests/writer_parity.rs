//! Temporary: the typed writer in crds writes exactly what the oracle's JSON writer wrote, for
//! every template the tests and examples use (deleted with the oracle's writer).

use primus_crds::pytorchjob::JobOptions;
use primus_oracle::layout::{Layout, Recompute, RecomputeModule, Schedule};
use primus_oracle::plan::{Cluster, Precision, Scenario, Training};
use primus_oracle::profiles::Catalog;
use primus_oracle::tune::job as old;
use serde_json::{Value, json};

fn scenario(model: &str, gpu: &str, gpus: u32) -> Scenario {
    let c = Catalog::builtin().unwrap();
    let hardware = c.hardware(gpu).unwrap().clone();
    Scenario {
        model: c.model(model).unwrap().clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node: hardware.gpus_per_node,
        },
        hardware,
        training: Training {
            seq_length: 8192,
            global_batch_size: 128,
            precision: Precision::Bf16,
        },
    }
}

fn templates() -> Vec<Option<Value>> {
    let example: Value = {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/llama3.1-8b-h100-benchmark.yaml"
        ))
        .unwrap();
        let doc: Value = serde_saphyr::from_str(&text).unwrap();
        doc["spec"]["job"]["template"].clone()
    };
    let script = "cd /workspace && \\\n  torchrun pretrain_gpt.py --tensor-model-parallel-size 4 \\\n  --save /ckpt \\\n";
    vec![
        None,
        Some(example),
        Some(
            json!({"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [{
            "name": "pytorch", "image": "img", "command": ["bash", "-c"], "args": [script]}]}}}}}),
        ),
        Some(
            json!({"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [{
            "name": "pytorch", "image": "img", "command": ["sh", "-c", script]}]}}}}}),
        ),
        Some(json!({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "ignored", "namespace": "x", "resourceVersion": "42", "uid": "u",
                "labels": {"team": "llm", "app.kubernetes.io/instance": "argo-app"},
                "annotations": {"argocd.argoproj.io/tracking-id": "t", "note": "kept",
                                "primus.dev/model": "stale", "primus.dev/projected-tokens-per-second": "1"}},
            "spec": {
                "runPolicy": {"cleanPodPolicy": "None", "schedulingPolicy": {"queue": "q"}},
                "elasticPolicy": {"rdzvBackend": "c10d"},
                "futureKnob": {"a": 1},
                "pytorchReplicaSpecs": {
                    "Worker": {"replicas": 99, "restartPolicy": "Never", "extraKey": [1, 2],
                        "template": {
                            "metadata": {"labels": {"app.kubernetes.io/instance": "argo", "pod": "yes"},
                                         "annotations": {"x": "y"}},
                            "spec": {
                                "nodeSelector": {"amd.com/gpu.product-name": "MI300X-custom"},
                                "tolerations": [{"key": "gpu", "operator": "Exists"}],
                                "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}},
                                            {"name": "d", "emptyDir": {}}],
                                "containers": [
                                    {"name": "sidecar", "image": "busybox", "ports": [{"containerPort": 80}]},
                                    {"name": "pytorch", "image": "registry.local/megatron:1",
                                     "command": ["torchrun", "/m/pretrain_gpt.py"],
                                     "args": ["--tensor-model-parallel-size", "2", "--data-path", "/data/x",
                                              "--sequence-parallel", "--micro-batch-size=7",
                                              "--recompute-modules", "core_attn", "layernorm", "--lr", "3e-4"],
                                     "env": [{"name": "NCCL_DEBUG", "value": "WARN"},
                                             {"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "8"}],
                                     "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                                     "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}},
                                     "resources": {"limits": {"memory": "1Ti", "rdma/ib": "1"},
                                                   "requests": {"cpu": "16"}}}
                                ]
                            }
                        }
                    },
                    "Launcher": {"replicas": 1}
                }
            }
        })),
        Some(json!({"spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}}})),
        Some(json!({"nprocPerNode": "auto", "runPolicy": {"suspend": false}})),
    ]
}

fn layouts() -> Vec<Layout> {
    vec![
        Layout::default(),
        Layout {
            tp: 4,
            pp: 4,
            vpp: 5,
            micro_batch_size: 2,
            recompute: Recompute::Full,
            recompute_layers: 3,
            schedule: Schedule::Interleaved,
            ..Layout::default()
        },
        Layout {
            tp: 8,
            pp: 2,
            recompute: Recompute::Selective,
            recompute_modules: Some(vec![RecomputeModule::Mlp, RecomputeModule::CoreAttn]),
            ..Layout::default()
        },
    ]
}

#[test]
fn the_typed_writer_writes_what_the_json_writer_wrote() {
    let scenarios = [
        scenario("llama3.1-70b", "mi300x", 32),
        scenario("llama3.1-8b", "h100-sxm", 8),
        scenario("mixtral-8x22b", "mi300x", 16),
    ];
    let mut n = 0;
    for s in &scenarios {
        for l in layouts() {
            for t in templates() {
                for opts in [
                    JobOptions::default(),
                    JobOptions {
                        name: Some("n".into()),
                        suspend: true,
                        projected_tokens_per_second: Some(1234.56),
                        inline_model_card: true,
                    },
                ] {
                    let o = old::JobOptions {
                        name: opts.name.clone(),
                        suspend: opts.suspend,
                        projected_tokens_per_second: opts.projected_tokens_per_second,
                        inline_model_card: opts.inline_model_card,
                    };
                    let want = old::pytorchjob("plan", Some("ns"), s, &l, t.as_ref(), &o);
                    let got = primus_crds::pytorchjob::pytorchjob(
                        "plan",
                        Some("ns"),
                        s,
                        &l,
                        t.as_ref(),
                        &opts,
                    )
                    .map(|j| serde_json::to_value(j).unwrap());
                    match (want, got) {
                        (Ok(w), Ok(g)) => assert_eq!(g, w, "template {t:?}"),
                        (Err(w), Err(g)) => assert_eq!(g.field, w.field, "template {t:?}"),
                        (w, g) => panic!("template {t:?}: {w:?} vs {g:?}"),
                    }
                    n += 1;
                }
            }
        }
    }
    assert_eq!(n, 3 * 3 * 7 * 2);
}

#[test]
fn bad_templates_fail_on_the_same_field() {
    let s = scenario("llama3.1-70b", "mi300x", 16);
    let l = Layout::default();
    for t in [
        json!("a string"),
        json!({"kind": "Job", "spec": {}}),
        json!({"apiVersion": "v1", "spec": {}}),
        json!({"metadata": 3, "spec": {}}),
        json!({"spec": []}),
        json!({"pytorchReplicaSpecs": 5}),
        json!({"pytorchReplicaSpecs": {"Master": 5}}),
        json!({"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [{"name": "pytorch"}]}}}}}),
        json!({"spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [{"name": "pytorch", "image": "i", "args": [1]}]}}}}}}),
        json!({"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": "x"}}}}}),
        json!({"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [{"name": "pytorch", "image": "i", "command": "x"}]}}}}}),
        json!({"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [{"name": "pytorch", "image": "i", "env": {}}]}}}}}),
        json!({"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [{"name": "pytorch", "image": "i", "resources": {"limits": []}}]}}}}}),
        json!({"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"nodeSelector": 1}}}}}),
        json!({"pytorchReplicaSpecs": {"Worker": {"template": {"metadata": {"labels": []}}}}}),
    ] {
        let want = old::pytorchjob("p", None, &s, &l, Some(&t), &old::JobOptions::default())
            .expect_err("the JSON writer refused it");
        let got = primus_crds::pytorchjob::pytorchjob(
            "p",
            None,
            &s,
            &l,
            Some(&t),
            &JobOptions::default(),
        )
        .expect_err("the typed writer refuses it");
        assert_eq!(got.field, want.field, "{t}: {got} vs {want}");
    }
}
