//! The PyTorchJob writer: the emitted object has the kubeflow.org/v1 shape (checked against the
//! schema of the hand-written CRD in crds/thirdparty), carries the layout as Megatron flags that
//! parse back to the same layout, and merges a template without losing or leaking fields.
//! (Moved here from the oracle with the writer; the assertions read the job as JSON, as
//! `primus tune --emit pytorchjob` prints it.)

use primus_crds::annotations as annotation;
use primus_crds::pytorchjob::JobOptions;
use primus_oracle::FieldError;
use primus_oracle::layout::{Layout, Recompute};
use primus_oracle::megatron::MegatronArgs;
use primus_oracle::scenario::{Scenario, Training};
use serde_json::{Value, json};

/// The writer, its job as JSON.
fn pytorchjob(
    plan: &str,
    namespace: Option<&str>,
    s: &Scenario,
    l: &Layout,
    template: Option<&Value>,
    opts: &JobOptions,
) -> Result<Value, FieldError> {
    primus_crds::pytorchjob::pytorchjob(plan, namespace, s, l, template, opts)
        .map(|j| serde_json::to_value(j).expect("a job serializes"))
}

mod common;

use common::{layout, scenario};

/// The CRD's `openAPIV3Schema`.
fn crd_schema() -> Value {
    common::crd_schema("kubeflow.org_pytorchjobs.yaml")
}

fn container(job: &Value, role: &str) -> Value {
    let list = job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["containers"]
        .as_array()
        .unwrap_or_else(|| panic!("{role} has containers"))
        .clone();
    list.into_iter()
        .find(|c| c["name"] == "pytorch")
        .expect("a container named pytorch")
}

fn args(c: &Value) -> Vec<String> {
    c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn default_job_has_the_kubeflow_shape_and_the_layout() {
    let s = scenario("mi300x", 32);
    let l = layout();
    let opts = JobOptions {
        projected_tokens_per_second: Some(1234.5),
        ..JobOptions::default()
    };
    let job = pytorchjob("llama3-70b", Some("team-a"), &s, &l, None, &opts).unwrap();
    let errors = common::schema_errors(&crd_schema(), &job);
    assert!(errors.is_empty(), "schema errors: {errors:#?}");

    assert_eq!(job["apiVersion"], "kubeflow.org/v1");
    assert_eq!(job["kind"], "PyTorchJob");
    assert_eq!(job["metadata"]["name"], "llama3-70b");
    assert_eq!(job["metadata"]["namespace"], "team-a");
    let specs = job["spec"]["pytorchReplicaSpecs"].as_object().unwrap();
    assert_eq!(specs.len(), 2);
    assert_eq!(specs["Master"]["replicas"], 1);
    assert_eq!(
        specs["Worker"]["replicas"], 3,
        "4 nodes: 1 master + 3 workers"
    );
    assert_eq!(job["spec"]["nprocPerNode"], "8");
    assert!(job["spec"].get("runPolicy").is_none());

    for role in ["Master", "Worker"] {
        let c = container(&job, role);
        assert!(c["image"].as_str().unwrap().contains("rocm"), "{c}");
        assert_eq!(c["resources"]["limits"]["amd.com/gpu"], "8");
        assert_eq!(c["resources"]["requests"]["amd.com/gpu"], "8");
        let sel = &job["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]["nodeSelector"];
        assert_eq!(
            sel[&s.hardware.kubernetes.product_label],
            s.hardware.kubernetes.product_values[0].as_str()
        );
        let a = args(&c);
        let parsed = MegatronArgs::parse(a.iter().map(String::as_str));
        let mut back = parsed.layout(&s.model).unwrap();
        back.etp = l.etp;
        assert_eq!(back, l, "args {a:?}");
        assert_eq!(parsed.training().unwrap(), Some(s.training));
        let card = parsed.model_card().unwrap().expect("architecture flags");
        assert_eq!(card.layers, s.model.layers);
    }

    let ann = &job["metadata"]["annotations"];
    assert_eq!(ann[annotation::PLAN], "llama3-70b");
    assert_eq!(ann[annotation::MODEL], "llama3.1-70b");
    assert_eq!(ann[annotation::GPU], "mi300x");
    assert_eq!(ann[annotation::PROJECTED_TOKENS_PER_SECOND], "1234.5");
    let back: Layout = serde_json::from_str(ann[annotation::LAYOUT].as_str().unwrap()).unwrap();
    assert_eq!(back, l);
    let t: Training = serde_json::from_str(ann[annotation::TRAINING].as_str().unwrap()).unwrap();
    assert_eq!(t, s.training);
}

#[test]
fn one_node_has_no_worker_and_suspend_is_written() {
    let s = scenario("h100-sxm", 8);
    let l = Layout {
        tp: 8,
        ..Layout::default()
    };
    let opts = JobOptions {
        suspend: true,
        name: Some("custom".into()),
        ..JobOptions::default()
    };
    let job = pytorchjob("p", None, &s, &l, None, &opts).unwrap();
    let specs = job["spec"]["pytorchReplicaSpecs"].as_object().unwrap();
    assert_eq!(specs.keys().collect::<Vec<_>>(), vec!["Master"]);
    assert_eq!(job["spec"]["runPolicy"]["suspend"], true);
    assert_eq!(job["metadata"]["name"], "custom");
    assert!(job["metadata"].get("namespace").is_none());
    let c = container(&job, "Master");
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "8");
    let errors = common::schema_errors(&crd_schema(), &job);
    assert!(errors.is_empty(), "schema errors: {errors:#?}");
}

#[test]
fn template_is_merged_without_tracking_labels_and_with_its_own_args() {
    let s = scenario("mi300x", 16);
    let l = layout();
    let template = json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "ignored",
            "namespace": "ignored-too",
            "resourceVersion": "42",
            "labels": {
                "team": "llm",
                "app.kubernetes.io/instance": "argo-app",
                "argocd.argoproj.io/instance": "x"
            },
            "annotations": {
                "argocd.argoproj.io/tracking-id": "app:kubeflow.org/PyTorchJob:ns/x",
                "note": "kept"
            }
        },
        "spec": {
            "runPolicy": {"cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 99,
                    "restartPolicy": "Never",
                    "template": {
                        "metadata": {"labels": {"app.kubernetes.io/instance": "argo-app", "pod": "yes"}},
                        "spec": {
                            "nodeSelector": {"amd.com/gpu.product-name": "MI300X-custom"},
                            "tolerations": [{"key": "gpu", "operator": "Exists"}],
                            "containers": [
                                {"name": "sidecar", "image": "busybox"},
                                {
                                    "name": "pytorch",
                                    "image": "registry.local/megatron:1",
                                    "command": ["torchrun", "/m/pretrain_gpt.py"],
                                    "args": [
                                        "--tensor-model-parallel-size", "2",
                                        "--data-path", "/data/x",
                                        "--sequence-parallel",
                                        "--micro-batch-size=7",
                                        "--num-layers-per-virtual-pipeline-stage", "4",
                                        "--pipeline-model-parallel-layout", "Et|(tt|)*39L",
                                        "--lr", "3e-4"
                                    ],
                                    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                                    "resources": {"limits": {"memory": "1Ti"}}
                                }
                            ]
                        }
                    }
                }
            }
        }
    });
    let job = pytorchjob(
        "plan-a",
        Some("ns"),
        &s,
        &l,
        Some(&template),
        &JobOptions::default(),
    )
    .unwrap();
    let errors = common::schema_errors(&crd_schema(), &job);
    assert!(errors.is_empty(), "schema errors: {errors:#?}");

    let text = job.to_string();
    assert!(!text.contains("argo"), "tracking keys leaked: {text}");
    assert!(!text.contains("resourceVersion"));
    assert_eq!(job["metadata"]["name"], "plan-a");
    assert_eq!(job["metadata"]["namespace"], "ns");
    assert_eq!(job["metadata"]["labels"]["team"], "llm");
    assert_eq!(job["metadata"]["annotations"]["note"], "kept");
    assert_eq!(job["spec"]["runPolicy"]["cleanPodPolicy"], "None");
    for role in ["Master", "Worker"] {
        let r = &job["spec"]["pytorchReplicaSpecs"][role];
        assert_eq!(r["restartPolicy"], "Never");
        assert_eq!(r["template"]["metadata"]["labels"]["pod"], "yes");
        assert_eq!(
            r["template"]["spec"]["nodeSelector"]["amd.com/gpu.product-name"], "MI300X-custom",
            "the template's own selector wins"
        );
        assert_eq!(r["template"]["spec"]["tolerations"][0]["key"], "gpu");
        assert_eq!(
            r["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .len(),
            2
        );
        let c = container(&job, role);
        assert_eq!(c["image"], "registry.local/megatron:1");
        assert_eq!(c["command"], json!(["torchrun", "/m/pretrain_gpt.py"]));
        assert_eq!(c["resources"]["limits"]["memory"], "1Ti");
        assert_eq!(c["resources"]["limits"]["amd.com/gpu"], "8");
        assert_eq!(c["env"][0]["name"], "NCCL_DEBUG");
        let a = args(&c);
        // The template's other arguments are kept, in order, before ours.
        assert_eq!(&a[..4], &["--data-path", "/data/x", "--lr", "3e-4"]);
        // Each flag of ours appears once, with our value.
        for f in ["--tensor-model-parallel-size", "--micro-batch-size"] {
            assert_eq!(
                a.iter().filter(|x| x.starts_with(f)).count(),
                1,
                "{f} in {a:?}"
            );
        }
        assert!(
            !a.iter()
                .any(|x| x == "--num-layers-per-virtual-pipeline-stage")
        );
        assert!(
            !a.iter().any(|x| x == "--pipeline-model-parallel-layout"),
            "the template's explicit pipeline layout goes with its split: {a:?}"
        );
        let parsed = MegatronArgs::parse(a.iter().map(String::as_str));
        let mut back = parsed.layout(&s.model).unwrap();
        back.etp = l.etp;
        assert_eq!(back, l);
    }
    assert_eq!(job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"], 1);
}

#[test]
fn a_spec_only_template_with_a_shell_script_gets_the_flags_in_the_script() {
    let s = scenario("mi300x", 16);
    let l = Layout {
        tp: 8,
        pp: 2,
        ..Layout::default()
    };
    let script = "cd /workspace && \\\n  torchrun pretrain_gpt.py --tensor-model-parallel-size 4 \\\n  --save /ckpt \\\n";
    let template = json!({
        "pytorchReplicaSpecs": {
            "Master": {"template": {"spec": {"containers": [{
                "name": "pytorch", "image": "img", "command": ["bash", "-c"], "args": [script]
            }]}}}
        }
    });
    let job = pytorchjob("p", None, &s, &l, Some(&template), &JobOptions::default()).unwrap();
    let c = container(&job, "Worker");
    let a = args(&c);
    assert_eq!(a.len(), 1, "still one script");
    let script = &a[0];
    assert!(
        script.starts_with("cd /workspace && \\\n  torchrun pretrain_gpt.py"),
        "{script}"
    );
    assert!(script.contains("--save /ckpt"), "{script}");
    assert_eq!(
        script.matches("--tensor-model-parallel-size").count(),
        1,
        "{script}"
    );
    let parsed = MegatronArgs::parse(["bash", "-c", script.as_str()]);
    let back = parsed.layout(&s.model).unwrap();
    assert_eq!((back.tp, back.pp), (8, 2), "{script}");
}

#[test]
fn bad_templates_name_the_field() {
    let s = scenario("mi300x", 16);
    let l = layout();
    let cases = [
        (json!("a string"), "spec.job.template"),
        (json!({"kind": "Job", "spec": {}}), "spec.job.template.kind"),
        (
            json!({"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [{"name": "pytorch"}]}}}}}),
            "spec.job.template.pytorchReplicaSpecs.Master.template.spec.containers[0].image",
        ),
        (
            json!({"spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [{"name": "pytorch", "image": "i", "args": [1]}]}}}}}}),
            "spec.job.template.spec.pytorchReplicaSpecs.Master.template.spec.containers[0].args[0]",
        ),
        (
            json!({"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": "x"}}}}}),
            "spec.job.template.pytorchReplicaSpecs.Worker.template.spec.containers",
        ),
    ];
    for (t, field) in cases {
        let e = pytorchjob("p", None, &s, &l, Some(&t), &JobOptions::default()).unwrap_err();
        assert_eq!(e.field, field, "{e}");
    }
}

#[test]
fn the_templates_recompute_module_list_is_replaced_by_the_layouts() {
    // A template that recomputes other modules (a list flag: every word up to the next flag)
    // gets the layout's list instead, in argument lists and in shell scripts alike.
    use primus_oracle::layout::RecomputeModule::{CoreAttn, Mlp};
    let s = scenario("mi300x", 16);
    let l = Layout {
        tp: 8,
        pp: 2,
        recompute: Recompute::Selective,
        recompute_modules: Some(vec![Mlp, CoreAttn]),
        ..Layout::default()
    };
    let args_template = json!({
        "pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [{
            "name": "pytorch", "image": "img",
            "args": ["--recompute-granularity", "selective", "--recompute-modules", "core_attn",
                     "layernorm", "--lr", "3e-4", "--recompute-modules=mlp"]
        }]}}}}
    });
    let job = pytorchjob(
        "p",
        None,
        &s,
        &l,
        Some(&args_template),
        &JobOptions::default(),
    )
    .unwrap();
    let a = args(&container(&job, "Worker"));
    assert_eq!(&a[..2], &["--lr", "3e-4"], "{a:?}");
    assert!(
        !a.iter()
            .any(|w| w == "layernorm" || w.starts_with("--recompute-modules="))
    );
    let at = a.iter().position(|w| w == "--recompute-modules").unwrap();
    assert_eq!(&a[at + 1..at + 3], &["mlp", "core_attn"], "{a:?}");
    let back = MegatronArgs::parse(a.iter().map(String::as_str))
        .layout(&s.model)
        .unwrap();
    assert_eq!(back.recompute_modules, l.recompute_modules);

    let script = "torchrun pretrain_gpt.py --recompute-granularity selective \\\n  --recompute-modules core_attn layernorm \\\n  --save /ckpt";
    let script_template = json!({
        "pytorchReplicaSpecs": {"Master": {"template": {"spec": {"containers": [{
            "name": "pytorch", "image": "img", "command": ["bash", "-c"], "args": [script]
        }]}}}}
    });
    let job = pytorchjob(
        "p",
        None,
        &s,
        &l,
        Some(&script_template),
        &JobOptions::default(),
    )
    .unwrap();
    let a = args(&container(&job, "Worker"));
    let script = &a[0];
    assert!(!script.contains("layernorm"), "{script}");
    assert!(script.contains("--save /ckpt"), "{script}");
    let back = MegatronArgs::parse(["bash", "-c", script.as_str()])
        .layout(&s.model)
        .unwrap();
    assert_eq!(back.recompute_modules, l.recompute_modules, "{script}");
}

#[test]
fn the_writer_writes_the_plans_memory_options_over_the_templates() {
    use primus_oracle::layout::{Fraction, OptimizerDtype};
    // A Primus-style template that sets dropout 0, BF16 moments and expandable segments; the
    // plan says Megatron's default dropout (0.1), the precision-aware optimizer with BF16
    // gradients only, and no expandable segments: the job must run what the plan says.
    let s = scenario("mi300x", 16);
    let template = json!({"spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {
        "containers": [{
            "name": "pytorch",
            "image": "registry.local/primus:1",
            "args": [
                "--hidden-dropout", "0.0", "--attention-dropout=0.0",
                "--exp-avg-dtype", "bf16", "--fp8-param-gather", "--lr", "3e-4"
            ],
            "env": [
                {"name": "PYTORCH_HIP_ALLOC_CONF", "value": "expandable_segments:True,max_split_size_mb:512"},
                {"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "expandable_segments:True"}
            ]
        }]
    }}}}}});
    let l = Layout {
        tp: 8,
        pp: 2,
        precision_aware_optimizer: true,
        main_grads_dtype: OptimizerDtype::Bf16,
        ..Layout::default()
    };
    let job = pytorchjob("p", None, &s, &l, Some(&template), &JobOptions::default()).unwrap();
    let c = container(&job, "Master");
    let a = args(&c);
    for gone in [
        "--hidden-dropout",
        "--attention-dropout=0.0",
        "--exp-avg-dtype",
        "--fp8-param-gather",
    ] {
        assert!(!a.contains(&gone.to_string()), "{gone} left in {a:?}");
    }
    let parsed = MegatronArgs::parse(a.iter().map(String::as_str));
    let back = parsed.layout(&s.model).unwrap();
    assert_eq!(back.hidden_dropout, Fraction::new(0.1));
    assert_eq!(back.exp_avg_dtype, OptimizerDtype::Fp32);
    assert!(back.precision_aware_optimizer && !back.fp8_param_gather);
    assert_eq!(back.main_grads_dtype, OptimizerDtype::Bf16);
    assert!(
        a.contains(&"--lr".to_string()),
        "the template's own flags stay: {a:?}"
    );
    let env = c["env"].as_array().unwrap();
    let value = |name: &str| {
        env.iter()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap().to_string())
    };
    assert_eq!(
        value("PYTORCH_HIP_ALLOC_CONF").as_deref(),
        Some("max_split_size_mb:512")
    );
    assert_eq!(value("PYTORCH_CUDA_ALLOC_CONF"), None, "emptied, removed");
    // With expandable segments on, the vendor's variable (AMD: PYTORCH_HIP_ALLOC_CONF) has it.
    let on = Layout {
        expandable_segments: true,
        attention_dropout: Fraction::ZERO,
        hidden_dropout: Fraction::ZERO,
        ..l
    };
    let job = pytorchjob("p", None, &s, &on, None, &JobOptions::default()).unwrap();
    let c = container(&job, "Master");
    let env = c["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "PYTORCH_HIP_ALLOC_CONF"
                && e["value"] == "expandable_segments:True"),
        "{env:?}"
    );
    let a = args(&c);
    let at = a.iter().position(|x| x == "--hidden-dropout").unwrap();
    assert_eq!(a[at + 1], "0");
    let back = MegatronArgs::parse(a.iter().map(String::as_str))
        .layout(&s.model)
        .unwrap();
    assert_eq!(back.hidden_dropout, Fraction::ZERO);
}

/// Qwen3-30B-A3B on 8 GPUs of `gpu`, seq 4096, global batch 64, EP8 with the alltoall
/// dispatcher and the grouped GEMM.
fn qwen3_30b_ep8(gpu: &str) -> (Scenario, Layout) {
    use primus_oracle::layout::{GroupedGemm, TokenDispatcher};
    let mut s = scenario(gpu, 8);
    s.model = primus_oracle::profiles::Catalog::builtin()
        .unwrap()
        .model("qwen3-30b-a3b")
        .unwrap()
        .clone();
    s.training.seq_length = 4096;
    s.training.global_batch_size = 64;
    let mut l = Layout {
        ep: 8,
        ..Layout::default()
    };
    l.moe.token_dispatcher = TokenDispatcher::Alltoall;
    l.moe.grouped_gemm = GroupedGemm::Grouped;
    (s, l)
}

#[test]
fn a_fused_grouped_mlp_job_gets_the_op_fuser_flag_and_its_cutedsl_switch() {
    // Qwen3-30B-A3B on 8 GB200 with the experts' fused grouped MLP: Megatron takes the fused
    // path only with NVTE_CUTEDSL_FUSED_GROUPED_MLP > 0, so the writer sets it to 1, over a
    // template that turned it off.
    let (s, mut l) = qwen3_30b_ep8("gb200");
    l.moe.fused_grouped_mlp = true;
    assert!(l.check(&s).is_ok(), "{:?}", l.check(&s));
    let template = json!({"spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {
        "containers": [{
            "name": "pytorch",
            "image": "registry.local/megatron:1",
            "env": [{"name": "NVTE_CUTEDSL_FUSED_GROUPED_MLP", "value": "0"}]
        }]
    }}}}}});
    let env_of = |job: &Value| -> Vec<(String, String)> {
        container(job, "Master")["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_string(),
                    e["value"].as_str().unwrap_or("").to_string(),
                )
            })
            .filter(|(n, _)| n == "NVTE_CUTEDSL_FUSED_GROUPED_MLP")
            .collect()
    };
    let job = pytorchjob("p", None, &s, &l, Some(&template), &JobOptions::default()).unwrap();
    let a = args(&container(&job, "Master"));
    assert!(
        a.contains(&"--use-transformer-engine-op-fuser".to_string()),
        "{a:?}"
    );
    assert_eq!(
        env_of(&job),
        vec![(
            "NVTE_CUTEDSL_FUSED_GROUPED_MLP".to_string(),
            "1".to_string()
        )]
    );
    let back = MegatronArgs::parse(a.iter().map(String::as_str))
        .layout(&s.model)
        .unwrap();
    assert!(back.moe.fused_grouped_mlp);
    // Without the option: no flag, and the template's own setting is left alone.
    l.moe.fused_grouped_mlp = false;
    let job = pytorchjob("p", None, &s, &l, Some(&template), &JobOptions::default()).unwrap();
    assert!(
        !args(&container(&job, "Master"))
            .contains(&"--use-transformer-engine-op-fuser".to_string())
    );
    assert_eq!(
        env_of(&job),
        vec![(
            "NVTE_CUTEDSL_FUSED_GROUPED_MLP".to_string(),
            "0".to_string()
        )]
    );
}

#[test]
fn a_fine_grained_offload_job_gets_transformer_engines_cpu_offload_v1_switch() {
    use primus_oracle::layout::OffloadModule;
    // Megatron-LM refuses to start fine-grained activation offloading on Transformer Engine
    // 2.10+ unless NVTE_CPU_OFFLOAD_V1=1 (megatron/training/arguments.py): the writer sets it
    // beside the flags, over a template that said 0, and leaves it alone without the offload.
    let (s, mut l) = qwen3_30b_ep8("h100-sxm");
    l.offload_modules = Some(vec![OffloadModule::ExpertFc1, OffloadModule::MoeAct]);
    assert!(l.check(&s).is_ok(), "{:?}", l.check(&s));
    let template = json!({"spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {
        "containers": [{
            "name": "pytorch",
            "image": "registry.local/megatron:1",
            "env": [{"name": "NVTE_CPU_OFFLOAD_V1", "value": "0"}]
        }]
    }}}}}});
    let switch_of = |job: &Value, replica: &str| -> Vec<String> {
        container(job, replica)["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == "NVTE_CPU_OFFLOAD_V1")
            .map(|e| e["value"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let job = pytorchjob("p", None, &s, &l, Some(&template), &JobOptions::default()).unwrap();
    let a = args(&container(&job, "Master"));
    let joined = a.join(" ");
    assert!(
        joined
            .contains("--fine-grained-activation-offloading --offload-modules expert_fc1 moe_act"),
        "{a:?}"
    );
    assert_eq!(switch_of(&job, "Master"), vec!["1".to_string()]);
    let back = MegatronArgs::parse(a.iter().map(String::as_str))
        .layout(&s.model)
        .unwrap();
    assert_eq!(back.offload_modules, l.offload_modules);
    // Without the offload: no flag, and the template's setting stays.
    l.offload_modules = None;
    let job = pytorchjob("p", None, &s, &l, Some(&template), &JobOptions::default()).unwrap();
    assert!(
        !args(&container(&job, "Master"))
            .contains(&"--fine-grained-activation-offloading".to_string())
    );
    assert_eq!(switch_of(&job, "Master"), vec!["0".to_string()]);
}

#[test]
fn the_job_runs_with_the_queue_settings_megatron_asserts_on() {
    use primus_oracle::layout::{
        CudaGraph, CudaGraphImpl, CudaGraphModule, FlexBackend, TokenDispatcher,
    };
    // Megatron-LM's start-up asserts (megatron/training/arguments.py): TP/CP > 1 on Hopper
    // wants CUDA_DEVICE_MAX_CONNECTIONS=1; FSDP refuses 1; Transformer Engine's CUDA graphs
    // over expandable segments want NCCL_GRAPH_REGISTER=0. Megatron-Bridge's scripts give the
    // DeepEP/HybridEP dispatchers 32 queues and everything else CUDA's 8.
    let value_of = |job: &Value, name: &str| -> Vec<String> {
        container(job, "Master")["env"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["name"] == name)
            .map(|e| e["value"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let write = |s: &Scenario, l: &Layout, template: Option<&Value>| {
        l.check(s).unwrap_or_else(|e| panic!("{e}"));
        pytorchjob("p", None, s, l, template, &JobOptions::default()).unwrap()
    };
    let one = || vec!["1".to_string()];
    // Llama 3.1 70B TP4 PP4 on 32 H100: 1.
    let s = scenario("h100-sxm", 32);
    let job = write(&s, &layout(), None);
    assert_eq!(value_of(&job, "CUDA_DEVICE_MAX_CONNECTIONS"), one());
    assert!(value_of(&job, "NCCL_GRAPH_REGISTER").is_empty());
    // FSDP (TP1, 32 GPUs): 8, over a template's 1 that Megatron would refuse.
    let fsdp = Layout {
        fsdp: true,
        distributed_optimizer: false,
        micro_batch_size: 1,
        recompute: primus_oracle::layout::Recompute::Full,
        ..Layout::default()
    };
    let job = write(&s, &fsdp, None);
    assert_eq!(value_of(&job, "CUDA_DEVICE_MAX_CONNECTIONS"), vec!["8"]);
    // torch FSDP2 also asserts the fused gradient accumulation off; Megatron-FSDP its
    // checkpoint format. Both jobs read back to their layout.
    let a = args(&container(&job, "Master"));
    assert!(
        a.contains(&"--no-gradient-accumulation-fusion".to_string()),
        "{a:?}"
    );
    let back = MegatronArgs::parse(a.iter().map(String::as_str))
        .layout(&s.model)
        .unwrap();
    assert!(back.fsdp && back.fsdp_kind == primus_oracle::layout::FsdpKind::Torch);
    let mfsdp = Layout {
        fsdp_kind: primus_oracle::layout::FsdpKind::Megatron,
        ..fsdp.clone()
    };
    let a = args(&container(&write(&s, &mfsdp, None), "Master"));
    let at = a
        .iter()
        .position(|x| x == "--ckpt-format")
        .expect("--ckpt-format");
    assert_eq!(a[at + 1], "fsdp_dtensor");
    let back = MegatronArgs::parse(a.iter().map(String::as_str))
        .layout(&s.model)
        .unwrap();
    assert!(back.fsdp && back.fsdp_kind == primus_oracle::layout::FsdpKind::Megatron);
    let template = json!({"spec": {"pytorchReplicaSpecs": {"Master": {"template": {"spec": {
        "containers": [{
            "name": "pytorch",
            "image": "registry.local/megatron:1",
            "env": [{"name": "CUDA_DEVICE_MAX_CONNECTIONS", "value": "1"}]
        }]
    }}}}}});
    let job = write(&s, &fsdp, Some(&template));
    assert_eq!(value_of(&job, "CUDA_DEVICE_MAX_CONNECTIONS"), vec!["8"]);
    // Without FSDP the template's own value stays.
    let job = write(&s, &layout(), Some(&template));
    assert_eq!(value_of(&job, "CUDA_DEVICE_MAX_CONNECTIONS"), one());
    // Qwen3-30B-A3B EP8 with DeepEP: 32.
    let (s, mut l) = qwen3_30b_ep8("h100-sxm");
    l.moe.token_dispatcher = TokenDispatcher::Flex;
    l.moe.flex_backend = Some(FlexBackend::Deepep);
    let job = write(&s, &l, None);
    assert_eq!(value_of(&job, "CUDA_DEVICE_MAX_CONNECTIONS"), vec!["32"]);
    // Transformer Engine CUDA graphs with expandable segments: NCCL_GRAPH_REGISTER=0; with
    // either alone, nothing.
    let (s, mut l) = qwen3_30b_ep8("h100-sxm");
    l.cuda_graph = CudaGraph {
        implementation: CudaGraphImpl::TransformerEngine,
        modules: vec![CudaGraphModule::Attn],
    };
    let job = write(&s, &l, None);
    assert!(value_of(&job, "NCCL_GRAPH_REGISTER").is_empty());
    l.expandable_segments = true;
    let job = write(&s, &l, None);
    assert_eq!(value_of(&job, "NCCL_GRAPH_REGISTER"), vec!["0"]);
    assert_eq!(value_of(&job, "CUDA_DEVICE_MAX_CONNECTIONS"), vec!["8"]);
}
