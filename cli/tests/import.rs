//! `primus import` (issue 18 item 3): AMD's example experiments (tests/data/primus, vendored
//! with their source) and a Megatron command line become TrainingPlans whose fields are the
//! recipe's, which `primus project` accepts; the imported experiment emits a Primus job
//! (`primus tune --emit pytorchjob`) that runs the same experiment with the layout as
//! overrides.

mod common;

use primus_oracle::layout::{CrossEntropyFusion, Layout, Recompute};
use primus_oracle::plan::load_plan;
use primus_oracle::profiles::Catalog;

fn data(rel: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/primus")
        .join(rel)
}

/// `primus ARGS` with the environment's TP override removed.
fn primus(args: &[&str]) -> std::process::Output {
    common::primus()
        .args(args)
        .env_remove("PRIMUS_TP")
        .output()
        .expect("runs")
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn amds_llama_experiment_imports_to_a_plan_with_its_fields() {
    let dir = tempfile::tempdir().unwrap();
    let exp = data("examples/megatron/configs/MI300X/llama3.1_70B-BF16-pretrain.yaml");
    let plan = dir.path().join("plan.yaml");
    ok(&primus(&[
        "import",
        exp.to_str().unwrap(),
        "-o",
        plan.to_str().unwrap(),
    ]));
    let text = std::fs::read_to_string(&plan).unwrap();
    let p = load_plan(&plan, &Catalog::builtin().unwrap()).unwrap();
    // The GPU from the directory (MI300X/), one node of it.
    assert!(
        p.scenario.hardware.name.eq_ignore_ascii_case("mi300x"),
        "{text}"
    );
    assert_eq!(
        (p.scenario.cluster.gpus, p.scenario.cluster.gpus_per_node),
        (8, 8)
    );
    assert_eq!(p.scenario.model.name, "llama3.1-70b");
    assert!(text.contains("preset: llama3.1-70b"), "{text}");
    let t = &p.scenario.training;
    assert_eq!((t.seq_length, t.global_batch_size), (8192, 24));
    // The experiment's overrides: TP1 PP1, FSDP2, full recompute, micro-batch 3.
    let want = Layout {
        micro_batch_size: 3,
        recompute: Recompute::Full,
        recompute_layers: 0,
        fsdp: true,
        distributed_optimizer: false,
        overlap_param_gather: false,
        sequence_parallel: true,
        // The experiment's loss: Transformer Engine's fused cross-entropy.
        cross_entropy_fusion: CrossEntropyFusion::Te,
        ..Layout::default()
    };
    assert_eq!(p.layout.as_ref(), Some(&want));
    assert!(text.contains("launcher: primus"), "{text}");
    assert!(text.contains("name: llama3-1-70b-bf16-pretrain"), "{text}");
    // The plan projects.
    let out = ok(&primus(&[
        "project",
        "-f",
        plan.to_str().unwrap(),
        "-o",
        "json",
    ]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["tokensPerSecondPerGpu"].as_f64().unwrap() > 0.0);

    // Overrides after the file win over the experiment's, both forms.
    let out = ok(&primus(&[
        "import",
        exp.to_str().unwrap(),
        "--gpus",
        "16",
        "--",
        "--tensor_model_parallel_size",
        "2",
        "micro_batch_size=1",
    ]));
    let p2 = dir.path().join("p2.yaml");
    std::fs::write(&p2, &out).unwrap();
    let p = load_plan(&p2, &Catalog::builtin().unwrap()).unwrap();
    let l = p.layout.unwrap();
    assert_eq!(
        (l.tp, l.micro_batch_size, p.scenario.cluster.gpus),
        (2, 1, 16)
    );
}

#[test]
fn the_imported_experiment_emits_a_primus_job_running_it() {
    let dir = tempfile::tempdir().unwrap();
    let exp = data("examples/megatron/configs/MI300X/mixtral_8x7B_v0.1-BF16-pretrain.yaml");
    let plan = dir.path().join("plan.yaml");
    ok(&primus(&[
        "import",
        exp.to_str().unwrap(),
        "-o",
        plan.to_str().unwrap(),
    ]));
    let p = load_plan(&plan, &Catalog::builtin().unwrap()).unwrap();
    let l = p.layout.clone().unwrap();
    assert_eq!((l.tp, l.pp, l.ep, l.micro_batch_size), (1, 1, 8, 2));
    let yaml = ok(&primus(&[
        "tune",
        "-f",
        plan.to_str().unwrap(),
        "--emit",
        "pytorchjob",
    ]));
    let job: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
    let c = &job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0];
    let cmd: Vec<&str> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(
        &cmd[..5],
        ["primus-cli", "direct", "--", "train", "pretrain"]
    );
    assert_eq!(cmd[6], exp.to_str().unwrap());
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    let at = args
        .iter()
        .position(|a| *a == "--expert_model_parallel_size")
        .expect("EP override");
    assert!(args[at + 1].parse::<u32>().is_ok(), "{args:?}");
}

#[test]
fn a_megatron_command_line_imports_too() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("train.sh");
    std::fs::write(
        &script,
        "torchrun --nproc-per-node 8 pretrain_gpt.py \\\n  --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 --group-query-attention --num-query-groups 8 --padded-vocab-size 128256 --swiglu --normalization RMSNorm --untie-embeddings-and-output-weights --disable-bias-linear \\\n  --seq-length 8192 --max-position-embeddings 131072 --micro-batch-size 1 --global-batch-size 128 --bf16 \\\n  --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer\n",
    )
    .unwrap();
    let out = ok(&primus(&[
        "import",
        script.to_str().unwrap(),
        "--gpu",
        "mi300x",
        "--gpus",
        "64",
    ]));
    let plan = dir.path().join("plan.yaml");
    std::fs::write(&plan, &out).unwrap();
    let p = load_plan(&plan, &Catalog::builtin().unwrap()).unwrap();
    let l = p.layout.unwrap();
    assert_eq!((l.tp, l.pp, l.micro_batch_size), (8, 4, 1));
    assert!(l.sequence_parallel && l.distributed_optimizer);
    assert_eq!(p.scenario.model.layers, 80);
    assert!(!out.contains("launcher"), "{out}");
    // Without --gpu and no directory naming one: a clear error.
    let bad = primus(&["import", script.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--gpu"));
}
