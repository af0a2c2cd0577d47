//! Primus jobs through the `primus-webhook` binary over real TLS (issue 18 item 3): a
//! PyTorchJob running AMD's own example experiment (tests/data/primus, vendored with its
//! source) is admitted with the experiment's layout and denied with one that does not fit,
//! with the usual message and fixes named as Primus overrides; a job that leaves its layout
//! to the experiment YAML cannot be checked (a warning, a denial when strict); and a job the
//! writer emits with `launcher: primus` derives back to the plan's layout.

mod common;

use std::path::PathBuf;

use common::*;
use primus_crds::Launcher;
use primus_crds::pytorchjob::{JobOptions, pytorchjob};
use primus_oracle::layout::{CrossEntropyFusion, Layout, Recompute};
use primus_oracle::memory;
use primus_oracle::precision::Precision;
use primus_oracle::primus::experiment;
use primus_oracle::scenario::Scenario;
use primus_webhook::validate::gib1;
use serde_json::{Value, json};

/// AMD's Llama 3.1 70B pretraining experiment for one MI300X node.
const EXP: &str = "examples/megatron/configs/MI300X/llama3.1_70B-BF16-pretrain.yaml";
/// AMD's Mixtral 8x7B pretraining experiment for one MI300X node.
const MIXTRAL: &str = "examples/megatron/configs/MI300X/mixtral_8x7B_v0.1-BF16-pretrain.yaml";

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/primus")
        .join(rel)
}

/// The experiment's own overrides as `--key value` words, as a user who writes them out on
/// the `primus-cli` command line passes them.
fn experiment_words(exp: &str) -> Vec<String> {
    let text = std::fs::read_to_string(data(exp)).unwrap();
    let e = experiment::parse(&text, exp, &|_| None).unwrap();
    let mut out = Vec::new();
    for (k, v) in &e.overrides {
        let v = match v {
            Value::Null => "None".to_string(),
            Value::Bool(true) => "True".to_string(),
            Value::Bool(false) => "False".to_string(),
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        out.push(format!("--{k}"));
        out.push(v);
    }
    out
}

/// A one-node MI300X PyTorchJob whose container runs `primus-cli` on the example with
/// `overrides` and `env`.
fn primus_job(name: &str, overrides: &[String], env: &[(&str, &str)]) -> Value {
    primus_job_of(EXP, name, overrides, env)
}

fn primus_job_of(exp: &str, name: &str, overrides: &[String], env: &[(&str, &str)]) -> Value {
    let mut args = vec![
        "direct".to_string(),
        "--".into(),
        "train".into(),
        "pretrain".into(),
        "--config".into(),
        exp.into(),
    ];
    args.extend(overrides.iter().cloned());
    let env: Vec<Value> = env
        .iter()
        .map(|(n, v)| json!({"name": n, "value": v}))
        .collect();
    json!({
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"nprocPerNode": "8", "pytorchReplicaSpecs": {"Master": {"replicas": 1,
            "template": {"spec": {
                "nodeSelector": {"amd.com/gpu.product-name": "AMD_Instinct_MI300X"},
                "containers": [{"name": "pytorch", "image": "docker.io/rocm/primus:v26.2",
                    "command": ["primus-cli"], "args": args, "env": env,
                    "resources": {"limits": {"amd.com/gpu": 8}}}]}}}}}
    })
}

fn scenario(gpus: u32, seq: u64, gbs: u64) -> Scenario {
    common::scenario("llama3.1-70b", "mi300x", gpus, 8, seq, gbs, Precision::Bf16)
}

fn post(w: &WebhookProcess, ca: &[u8], path: &str, job: &Value) -> Value {
    let a = https(w.addr(), ca, "POST", path, Some(review(job, None, false))).unwrap();
    assert_eq!(a.status, 200);
    serde_json::from_slice(&a.body).unwrap()
}

fn audit<'a>(v: &'a Value, key: &str) -> &'a str {
    v["response"]["auditAnnotations"][key]
        .as_str()
        .unwrap_or_else(|| panic!("no audit {key}: {v}"))
}

#[test]
fn amds_example_is_admitted_as_written_and_denied_without_sharded_state() {
    let mut w = WebhookProcess::self_signed(&[], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);

    // Mixtral 8x7B as AMD wrote it (EP8, micro-batch 2, global batch 32, 4096 tokens): fits.
    let v = post(
        &w,
        &ca,
        "/validate/pytorchjob",
        &primus_job_of(MIXTRAL, "mixtral", &experiment_words(MIXTRAL), &[]),
    );
    assert!(allowed(&v), "{v}");
    assert_eq!(audit(&v, "layout-source"), "primus", "{v}");
    assert!(audit(&v, "layout").contains("EP8"), "{v}");
    assert!(
        audit(&v, "predicted-gib").parse::<f64>().unwrap() < 190.6,
        "{v}"
    );

    // Llama 3.1 70B as AMD wrote it: TP1 PP1, FSDP2, full recompute of all 80 layers,
    // micro-batch 3, global batch 24, 8192 tokens (oracle/tests/primus.rs reads the same
    // layout from the YAML). The webhook's layout and prediction are the memory model's for
    // that layout, and its verdict the model's band rule. (The model predicts 237 GiB, over
    // the 211.6 GiB it denies above on MI300X, although AMD publishes the experiment for one
    // MI300X node: a finding about the model's FSDP2 accounting, not about reading Primus.)
    let v = post(
        &w,
        &ca,
        "/validate/pytorchjob",
        &primus_job("as-written", &experiment_words(EXP), &[]),
    );
    let want = Layout {
        micro_batch_size: 3,
        recompute: Recompute::Full,
        recompute_layers: 0,
        fsdp: true,
        distributed_optimizer: false,
        overlap_param_gather: false,
        sequence_parallel: true,
        grad_reduce_in_fp32: false,
        // The experiment's loss: Transformer Engine's fused cross-entropy.
        cross_entropy_fusion: CrossEntropyFusion::Te,
        ..Layout::default()
    };
    let s = scenario(8, 8192, 24);
    let peak = memory::estimate(&s, &want).peak_bytes;
    assert_eq!(audit(&v, "layout-source"), "primus", "{v}");
    assert_eq!(audit(&v, "layout"), want.label(), "{v}");
    assert_eq!(audit(&v, "predicted-gib"), gib1(peak), "{v}");
    let band = memory::Band::of(&s);
    let usable = s.hardware.usable_bytes();
    assert_eq!(allowed(&v), peak <= band.deny_above(usable), "{v}");
    // grad_reduce_in_bf16 is the one memory setting the experiment leaves to Primus's
    // defaults: assumed at its most saving, and said.
    let ws = warnings(&v).join("\n");
    assert!(
        ws.contains("leaves grad_reduce_in_bf16 to the experiment YAML"),
        "{ws}"
    );

    // The same experiment with the layout from PRIMUS_* variables and the optimizer state
    // neither sharded (no FSDP2, no distributed optimizer): 70.6e9 parameters x 18 bytes
    // (BF16 weights and gradients, FP32 master weights and two Adam moments) is ~1180 GiB on
    // every GPU, beyond 192 GB whatever the YAML's other settings.
    let overrides: Vec<String> = [
        "--micro_batch_size",
        "1",
        "global_batch_size=24",
        "--use_torch_fsdp2",
        "False",
        "--use_distributed_optimizer",
        "False",
    ]
    .map(str::to_string)
    .to_vec();
    let job = primus_job(
        "unsharded",
        &overrides,
        &[
            ("PRIMUS_TP", "1"),
            ("PRIMUS_PP", "1"),
            ("PRIMUS_SEQ_LENGTH", "8192"),
        ],
    );
    let v = post(&w, &ca, "/validate/pytorchjob", &job);
    assert!(!allowed(&v), "{v}");
    let m = message(&v);
    assert!(m.contains("GiB usable on MI300X"), "{m}");
    assert!(m.starts_with("predicted "), "{m}");
    let predicted: f64 = m["predicted ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(predicted > 1000.0, "{m}");
    // Fixes are Primus overrides, not Megatron flags.
    assert!(m.contains("fits with --") || m.contains("no layout"), "{m}");
    assert!(!m.contains("-model-parallel-size"), "{m}");
    assert_eq!(audit(&v, "layout-source"), "primus");
    // The settings the command line leaves to the YAML were taken at their most saving.
    let ws = warnings(&v).join("\n");
    assert!(ws.contains("recompute_granularity"), "{ws}");
    w.stop(std::time::Duration::from_secs(5));
}

#[test]
fn a_layout_left_to_the_experiment_cannot_be_checked_and_strict_denies_it() {
    let mut w = WebhookProcess::self_signed(&[], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let job = primus_job("yaml-only", &[], &[]);
    let v = post(&w, &ca, "/validate/pytorchjob", &job);
    assert!(allowed(&v), "{v}");
    let ws = warnings(&v).join("\n");
    assert!(
        ws.contains("the Primus command line sets no tensor_model_parallel_size"),
        "{ws}"
    );
    let v = post(&w, &ca, "/validate/pytorchjob/strict", &job);
    assert!(!allowed(&v), "{v}");
    assert!(message(&v).contains("global_batch_size"), "{v}");
    w.stop(std::time::Duration::from_secs(5));
}

#[test]
fn a_primus_job_the_writer_emits_derives_back_to_the_plans_layout() {
    let s = scenario(16, 8192, 128);
    let cases = [
        Layout {
            tp: 4,
            pp: 2,
            micro_batch_size: 1,
            ..Layout::default()
        },
        Layout {
            tp: 8,
            pp: 2,
            recompute: Recompute::Full,
            recompute_layers: 4,
            distributed_optimizer: false,
            fsdp: false,
            overlap_param_gather: false,
            ..Layout::default()
        },
    ];
    let opts = JobOptions {
        launcher: Launcher::Primus,
        ..JobOptions::default()
    };
    let mut w = WebhookProcess::self_signed(&[], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    for l in cases {
        l.check(&s).unwrap();
        let job = pytorchjob("p", Some("team-a"), &s, &l, None, &opts).unwrap();
        let mut v = serde_json::to_value(&job).unwrap();
        let c = &v["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "docker.io/rocm/primus:v26.2");
        let cmd: Vec<&str> = c["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap())
            .collect();
        assert_eq!(
            cmd,
            [
                "primus-cli",
                "direct",
                "--",
                "train",
                "pretrain",
                "--config",
                "examples/megatron/exp_pretrain.yaml"
            ]
        );
        let args = c["args"].as_array().unwrap();
        assert!(
            args.iter().any(|a| a == "--tensor_model_parallel_size"),
            "{args:?}"
        );
        assert!(
            !args
                .iter()
                .any(|a| a.as_str().unwrap().starts_with("--tensor-model")),
            "{args:?}"
        );
        // Without the operator's annotations the webhook reads the overrides alone.
        v["metadata"]["annotations"] = json!({});
        let a = post(&w, &ca, "/validate/pytorchjob", &v);
        assert_eq!(audit(&a, "layout-source"), "primus", "{a}");
        assert_eq!(audit(&a, "layout"), l.label(), "{a}");
        let peak = memory::estimate(&s, &l).peak_bytes;
        assert_eq!(audit(&a, "predicted-gib"), gib1(peak), "{a}");
        let ws = warnings(&a).join("\n");
        assert!(!ws.contains("cannot check"), "{ws}");
        assert!(
            !ws.contains("most memory-saving"),
            "everything is on the command line: {ws}"
        );
    }
    w.stop(std::time::Duration::from_secs(5));
}
