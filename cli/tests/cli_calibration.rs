//! `primus project --calibration REPORT` and `primus bench --compare` from the command line:
//! which terms the output marks measured and which analytic, the JSON contract, report files in
//! both forms (results JSON, BenchmarkReport YAML), and errors naming the option.

mod common;

use common::{example, primus};
use predicates::prelude::*;

const PLAN: &str = "llama3.1-8b-h100-benchmark.yaml";

/// A simulated report of the example plan, written to `dir/r.json`.
fn simulated_report(dir: &std::path::Path) -> (std::path::PathBuf, serde_json::Value) {
    let file = dir.join("r.json");
    primus()
        .args(["bench", "--simulate", "-f"])
        .arg(example(PLAN))
        .arg("-o")
        .arg(&file)
        .assert()
        .success();
    let v = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    (file, v)
}

fn project_json(extra: &[&std::ffi::OsStr]) -> serde_json::Value {
    let out = primus()
        .args(["project", "-o", "json", "-f"])
        .arg(example(PLAN))
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_table_marks_measured_and_analytic_terms() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = simulated_report(dir.path());
    let out = primus()
        .args(["project", "-f"])
        .arg(example(PLAN))
        .arg("--calibration")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("calibrated by"), "{text}");
    assert!(text.contains("backend simulate"), "{text}");
    let row = |label: &str| {
        text.lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row in\n{text}"))
            .to_string()
    };
    assert!(row("STEP BREAKDOWN").contains("SOURCE"));
    // The plan's TP 2 fits the node: its shapes and TP collectives were measured.
    assert!(row("compute").contains(" measured "), "{}", row("compute"));
    assert!(row("TP/SP communication").contains(" measured "));
    // DP over the two nodes (stride 2: 4 GPUs per node in each group): in-node part measured.
    assert!(row("DP/FSDP communication").contains("partly measured"));
    assert!(row("optimizer step").contains("analytic"));
    assert!(
        row("gemm").contains(' '),
        "the op-kind table has a gemm row"
    );
}

#[test]
fn json_output_carries_the_calibration_and_scales_with_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let (file, mut report) = simulated_report(dir.path());
    let analytic = project_json(&[]);
    let same = project_json(&["--calibration".as_ref(), file.as_os_str()]);
    // A simulated report reproduces the analytic projection.
    assert_eq!(same["stepTimeSeconds"], analytic["stepTimeSeconds"]);
    assert_eq!(same["calibration"]["backend"], "simulate");
    let terms = same["calibration"]["terms"].as_array().unwrap();
    let compute = terms.iter().find(|t| t["term"] == "compute").unwrap();
    assert_eq!(compute["source"], "measured");
    assert!(analytic.get("calibration").is_none());

    // Every kernel twice as slow: twice the compute term.
    for op in report["ops"].as_array_mut().unwrap() {
        let t = op["medianSeconds"].as_f64().unwrap();
        op["medianSeconds"] = serde_json::json!(2.0 * t);
    }
    let slow = dir.path().join("slow.json");
    std::fs::write(&slow, report.to_string()).unwrap();
    let calibrated = project_json(&["--calibration".as_ref(), slow.as_os_str()]);
    let c = calibrated["breakdown"]["compute"].as_f64().unwrap();
    let a = analytic["breakdown"]["compute"].as_f64().unwrap();
    assert!((c - 2.0 * a).abs() <= 1e-9 * c, "{c} vs 2 x {a}");

    // The same report as `kubectl get benchmarkreport -o yaml` prints it.
    let object = serde_json::json!({
        "apiVersion": "primus.dev/v1alpha1",
        "kind": "BenchmarkReport",
        "metadata": {"name": "llama3-8b-bench-bench-1", "namespace": "team"},
        "spec": {"plan": "llama3-8b-bench", "results": report},
    });
    let yaml = dir.path().join("report.yaml");
    std::fs::write(&yaml, serde_saphyr::to_string(&object).unwrap()).unwrap();
    let from_yaml = project_json(&["--calibration".as_ref(), yaml.as_os_str()]);
    assert_eq!(from_yaml["stepTimeSeconds"], calibrated["stepTimeSeconds"]);
}

#[test]
fn bad_reports_name_the_option() {
    let dir = tempfile::tempdir().unwrap();
    primus()
        .args(["project", "-f"])
        .arg(example(PLAN))
        .args(["--calibration", "/nonexistent/r.json"])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with(
            "error: --calibration: /nonexistent/r.json",
        ));
    let (_, mut report) = simulated_report(dir.path());
    report["gpu"] = "mi300x".into();
    report["gpuProduct"] = "AMD Instinct MI300X".into();
    let other = dir.path().join("other.json");
    std::fs::write(&other, report.to_string()).unwrap();
    primus()
        .args(["project", "-f"])
        .arg(example(PLAN))
        .arg("--calibration")
        .arg(&other)
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("the report measured mi300x")
                .and(predicate::str::is_match("^[^\n]*\n$").unwrap()),
        );
    report["ops"] = "none".into();
    std::fs::write(&other, report.to_string()).unwrap();
    primus()
        .args(["project", "-f"])
        .arg(example(PLAN))
        .arg("--calibration")
        .arg(&other)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(": ops: "));
}

#[test]
fn bench_compare_prints_measured_against_modelled() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r.json");
    let out = primus()
        .args(["bench", "--simulate", "--compare", "-f"])
        .arg(example(PLAN))
        .arg("-o")
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("MEAS TF/s"), "{text}");
    assert!(text.contains("dense.qkv.fwd"), "{text}");
    assert!(text.contains("gemm: "), "{text}");
    assert!(text.contains("MEAS busbw GB/s"), "{text}");
    // Simulated: every ratio is exactly 1.
    let qkv = text
        .lines()
        .find(|l| l.starts_with("dense.qkv.fwd"))
        .unwrap();
    assert!(qkv.trim_end().ends_with("1.000"), "{qkv}");
}

#[test]
fn tune_scores_with_the_calibrated_oracle() {
    let dir = tempfile::tempdir().unwrap();
    let (file, _) = simulated_report(dir.path());
    let tune = |extra: &[&std::ffi::OsStr]| -> serde_json::Value {
        let out = primus()
            .args(["tune", "-q", "-o", "json", "--searcher", "exhaustive", "-f"])
            .arg(example(PLAN))
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // A simulated report changes nothing; a report of another GPU is refused.
    let analytic = tune(&[]);
    let calibrated = tune(&["--calibration".as_ref(), file.as_os_str()]);
    assert_eq!(
        analytic["best"]["projection"]["stepTimeSeconds"],
        calibrated["best"]["projection"]["stepTimeSeconds"]
    );
    primus()
        .args(["tune", "-q", "-f"])
        .arg(example(PLAN))
        .args(["--calibration", "/nonexistent.json"])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("error: --calibration:"));
}
