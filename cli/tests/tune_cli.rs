//! `primus tune`: the JSON contract (DESIGN.md section 4), `--emit pytorchjob|trainjob`, searcher `none`,
//! pinned axes from the plan, and exit 2 with one line naming the field for bad plans.

mod common;

use common::{example, plan_file, primus};
use serde_json::Value;

const SMALL: &str = "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata: {name: small}\nspec:\n  model: {preset: llama3.1-8b}\n  cluster: {gpu: h100-sxm, gpus: 16}\n  training: {seqLength: 4096, globalBatchSize: 64}\n";

fn json_of(args: &[&str]) -> Value {
    let out = primus()
        .args(args)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    serde_json::from_slice(&out).expect("one JSON object on stdout")
}

#[test]
fn json_output_has_the_documented_fields() {
    let f = plan_file(&format!(
        "{SMALL}  parallelism: {{tp: 8, pp: 2, microBatchSize: 1, recompute: full}}\n"
    ));
    let v = json_of(&[
        "tune",
        "-f",
        f.path().to_str().unwrap(),
        "-o",
        "json",
        "--top",
        "3",
    ]);
    for key in [
        "best",
        "top",
        "evaluated",
        "rejectedByMemory",
        "rejectedByRules",
        "reference",
        "gainOverReference",
        "searcher",
        "seconds",
        "memoryBand",
        "withinBand",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["searcher"], "exhaustive");
    assert_eq!(v["top"].as_array().unwrap().len(), 3);
    assert_eq!(v["best"], v["top"][0]);
    let best = &v["best"];
    for key in [
        "tp",
        "pp",
        "vpp",
        "cp",
        "ep",
        "etp",
        "microBatchSize",
        "recompute",
        "schedule",
    ] {
        assert!(best["layout"].get(key).is_some(), "layout.{key}");
    }
    for key in [
        "tokensPerSecondPerGpu",
        "tflopsPerGpu",
        "mfu",
        "stepTimeSeconds",
        "breakdown",
    ] {
        assert!(best["projection"].get(key).is_some(), "projection.{key}");
    }
    assert!(best["projection"]["memory"]["peakBytes"].is_number());
    assert!(best["projection"]["memory"]["stages"][0]["totalBytes"].is_number());
    let gain = v["gainOverReference"].as_f64().unwrap();
    let b = best["projection"]["tokensPerSecondPerGpu"]
        .as_f64()
        .unwrap();
    let r = v["reference"]["projection"]["tokensPerSecondPerGpu"]
        .as_f64()
        .unwrap();
    assert!((gain - (b / r - 1.0)).abs() < 1e-9);
    assert!(v["evaluated"].as_u64().unwrap() > 0);
}

#[test]
fn table_output_lists_the_top_layouts_and_the_reference() {
    let out = primus()
        .args([
            "tune",
            "-f",
            &example("mixtral-8x22b-mi355x.yaml"),
            "--top",
            "4",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("TOK/S/GPU") && text.contains("DOMINATED BY"),
        "{text}"
    );
    assert!(
        text.contains("ref  TP1 PP4 VPP2 EP8 MBS2 alltoall,grouped,forced interleaved"),
        "{text}"
    );
    assert!(
        text.contains("gain of the best over the reference"),
        "{text}"
    );
    assert!(text.contains("rejected by memory:"), "{text}");
    // The pre-filter's widening by the memory model's measured error band is stated.
    let band = primus_oracle::memory::JobKind::MegatronMoe.band();
    assert!(
        text.contains(&format!(
            "memory pre-filter: layouts up to {:.0}% over the headroom limit are kept, the memory model's measured error band {}",
            band.over * 100.0,
            band.describe()
        )),
        "{text}"
    );
    for rank in 1..=4 {
        assert!(
            text.contains(&format!("\n{rank:>3}  TP")),
            "row {rank}: {text}"
        );
    }
}

#[test]
fn searcher_none_projects_the_plan_layout() {
    let f = plan_file(&format!(
        "{SMALL}  parallelism: {{tp: 2, pp: 2, microBatchSize: 2}}\n  tuning: {{searcher: none}}\n"
    ));
    let v = json_of(&["tune", "-f", f.path().to_str().unwrap(), "-o", "json"]);
    assert_eq!(v["searcher"], "none");
    assert_eq!(v["evaluated"], 1);
    let l = &v["best"]["layout"];
    assert_eq!(
        (
            l["tp"].as_u64(),
            l["pp"].as_u64(),
            l["microBatchSize"].as_u64()
        ),
        (Some(2), Some(2), Some(2))
    );
    let projected = json_of(&["project", "-f", f.path().to_str().unwrap(), "-o", "json"]);
    assert_eq!(
        v["best"]["projection"]["tokensPerSecondPerGpu"],
        projected["tokensPerSecondPerGpu"]
    );
}

#[test]
fn the_plan_pins_axes_and_the_flag_overrides_the_searcher() {
    // `searcher: none` without a layout is a bad plan.
    let f = plan_file(&format!("{SMALL}  tuning: {{searcher: none}}\n"));
    let out = primus()
        .args(["tune", "-f", f.path().to_str().unwrap()])
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    assert!(String::from_utf8(out).unwrap().contains("spec.parallelism"));
    let f = plan_file(&format!(
        "{SMALL}  tuning:\n    searcher: seed\n    fixed: {{tp: 2, fsdp: false}}\n    allowed: {{microBatchSize: [1, 2]}}\n    topK: 10\n"
    ));
    for searcher in ["exhaustive", "seed", "evolutionary"] {
        let v = json_of(&[
            "tune",
            "-f",
            f.path().to_str().unwrap(),
            "-o",
            "json",
            "--searcher",
            searcher,
        ]);
        assert_eq!(v["searcher"], searcher);
        assert!(!v["top"].as_array().unwrap().is_empty());
        for c in v["top"].as_array().unwrap() {
            assert_eq!(c["layout"]["tp"], 2, "{searcher}");
            assert_eq!(c["layout"]["fsdp"], false, "{searcher}");
            assert!(c["layout"]["microBatchSize"].as_u64().unwrap() <= 2);
        }
    }
}

#[test]
fn emit_pytorchjob_prints_the_best_layout_as_a_job() {
    let out = primus()
        .args([
            "tune",
            "-f",
            &example("mixtral-8x22b-mi355x.yaml"),
            "--emit",
            "pytorchjob",
            "-o",
            "json",
            "-n",
            "training",
            "--suspend",
        ])
        .assert()
        .success()
        .get_output()
        .clone();
    let job: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(job["apiVersion"], "kubeflow.org/v1");
    assert_eq!(job["kind"], "PyTorchJob");
    assert_eq!(job["metadata"]["namespace"], "training");
    assert_eq!(job["spec"]["runPolicy"]["suspend"], true);
    assert_eq!(job["spec"]["nprocPerNode"], "8");
    assert_eq!(job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"], 3);
    let tuned = json_of(&[
        "tune",
        "-f",
        &example("mixtral-8x22b-mi355x.yaml"),
        "-o",
        "json",
    ]);
    let annotated: Value = serde_json::from_str(
        job["metadata"]["annotations"]["primus.dev/layout"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        annotated, tuned["best"]["layout"],
        "the job runs the best layout"
    );
    let args: Vec<&str> =
        job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
    let tp = args
        .iter()
        .position(|a| *a == "--tensor-model-parallel-size")
        .unwrap();
    assert_eq!(args[tp + 1], tuned["best"]["layout"]["tp"].to_string());
    assert!(
        String::from_utf8(out.stderr)
            .unwrap()
            .contains("over the reference")
    );

    // YAML by default.
    let yaml = primus()
        .args([
            "tune",
            "-q",
            "-f",
            &example("mixtral-8x22b-mi355x.yaml"),
            "--emit",
            "pytorchjob",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(yaml).unwrap();
    assert!(text.contains("kind: PyTorchJob"), "{text}");
}

#[test]
fn bad_plans_exit_2_with_one_line_naming_the_field() {
    let cases = [
        ("  tuning: {allowed: {tp: []}}\n", "spec.tuning.allowed.tp"),
        (
            "  tuning: {fixed: {tp: 4}, allowed: {tp: [1, 2]}}\n",
            "spec.tuning.fixed.tp",
        ),
        (
            "  tuning: {memoryHeadroom: 1.5}\n",
            "spec.tuning.memoryHeadroom",
        ),
        ("  tuning: {searcher: sometimes}\n", "spec.tuning.searcher"),
        ("  parallelism: {tp: 16}\n", "spec.parallelism.tp"),
        (
            "  tuning: {searcher: agent}\n",
            "spec.tuning.agent.endpoint",
        ),
    ];
    for (extra, field) in cases {
        let f = plan_file(&format!("{SMALL}{extra}"));
        let out = primus()
            .args(["tune", "-f", f.path().to_str().unwrap()])
            .assert()
            .code(2)
            .get_output()
            .clone();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "one line for {extra}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(field),
            "{extra}: {err}"
        );
        assert!(out.stdout.is_empty());
    }
}

#[test]
fn nothing_fits_is_a_failure_with_the_counts() {
    let f = plan_file(
        "spec:\n  model: {preset: llama3.1-405b}\n  cluster: {gpu: h100-sxm, gpus: 8}\n  training: {seqLength: 8192, globalBatchSize: 16}\n",
    );
    let out = primus()
        .args(["tune", "-q", "-f", f.path().to_str().unwrap()])
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(out).unwrap();
    assert!(
        err.contains("no layout") && err.contains("by memory"),
        "{err}"
    );
}

#[test]
fn emit_trainjob_prints_the_best_layout_as_a_trainjob_on_the_plans_runtime() {
    let plan = plan_file(&format!(
        "{SMALL}  job:\n    kind: TrainJob\n    runtimeRef: {{name: megatron, kind: TrainingRuntime}}\n"
    ));
    let path = plan.path().to_str().unwrap();
    let out = primus()
        .args([
            "tune",
            "-f",
            path,
            "--emit",
            "trainjob",
            "-o",
            "json",
            "--suspend",
        ])
        .assert()
        .success()
        .get_output()
        .clone();
    let job: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(job["apiVersion"], "trainer.kubeflow.org/v1alpha1");
    assert_eq!(job["kind"], "TrainJob");
    assert_eq!(job["spec"]["suspend"], true);
    assert_eq!(job["spec"]["runtimeRef"]["name"], "megatron");
    assert_eq!(job["spec"]["runtimeRef"]["kind"], "TrainingRuntime");
    assert_eq!(job["spec"]["trainer"]["numNodes"], 2);
    assert_eq!(job["spec"]["trainer"]["numProcPerNode"], 8);
    let tuned = json_of(&["tune", "-f", path, "-o", "json"]);
    let annotated: Value = serde_json::from_str(
        job["metadata"]["annotations"]["primus.dev/layout"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        annotated, tuned["best"]["layout"],
        "the job runs the best layout"
    );
    // The same plan emitted as a PyTorchJob has no runtime (`--emit` chooses the kind).
    let out = primus()
        .args(["tune", "-f", path, "--emit", "pytorchjob", "-o", "json"])
        .assert()
        .success()
        .get_output()
        .clone();
    let job: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(job["kind"], "PyTorchJob");
    assert!(job["spec"].get("runtimeRef").is_none());
}
