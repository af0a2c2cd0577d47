//! `primus project`: JSON and table output, and bad input (moved from the oracle's
//! tests/projection.rs with the CLI).

mod common;

use common::primus;

fn write_plan(dir: &std::path::Path, parallelism: &str) -> std::path::PathBuf {
    let path = dir.join("plan.yaml");
    std::fs::write(
        &path,
        format!(
            "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata: {{name: t}}\nspec:\n  model: {{preset: llama3.1-70b}}\n  cluster: {{gpu: h100-sxm, gpus: 64}}\n  training: {{seqLength: 8192, globalBatchSize: 128, precision: bf16}}\n  parallelism: {parallelism}\n"
        ),
    )
    .expect("write plan");
    path
}

#[test]
fn cli_project_json_and_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = write_plan(dir.path(), "{tp: 4, pp: 4, vpp: 5, schedule: interleaved}");
    let out = primus()
        .args(["project", "-f"])
        .arg(&plan)
        .args(["-o", "json"])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert!(v["tokensPerSecondPerGpu"].as_f64().unwrap() > 0.0);
    assert!(v["memory"]["stages"].as_array().unwrap().len() == 4);
    let out = primus()
        .args(["project", "-f"])
        .arg(&plan)
        .output()
        .expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("STEP BREAKDOWN") && text.contains("pipeline bubble"),
        "{text}"
    );
    assert!(text.contains("bottleneck stage"), "{text}");
}

#[test]
fn cli_project_bad_input_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = write_plan(dir.path(), "{tp: 16}");
    let out = primus()
        .args(["project", "-f"])
        .arg(&plan)
        .output()
        .expect("runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("spec.parallelism.tp"), "{err}");
}
