//! `primus bench` and `primus report` from the command line, without a cluster: the simulate
//! backend's JSON, the GPU backends' one-line refusal, and input errors (exit 2, naming the
//! argument). Their cluster side (`--plan`, `--report-to`, `report`) runs in the operator's
//! end-to-end tests against the test bed.

mod common;

use common::{example, primus};
use predicates::prelude::*;

#[test]
fn simulate_prints_results_marked_as_simulated() {
    let out = primus()
        .args(["bench", "-f"])
        .arg(example("llama3.1-8b-h100-benchmark.yaml"))
        .env("NODE_NAME", "node-7")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["backend"], "simulate");
    assert_eq!(r["node"], "node-7");
    assert_eq!(r["gpu"], "h100-sxm");
    assert_eq!(r["gpuCount"], 8);
    assert_eq!(
        r["shapesKey"],
        "llama3.1-8b/tp2-cp1-ep1-etp1-sp1/seq8192-mbs1-bf16"
    );
    assert!(r["startedAt"].as_str().unwrap().ends_with('Z'));
    assert!(!r["ops"].as_array().unwrap().is_empty());
}

#[test]
fn output_file_and_moe_downscaling() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r.json");
    primus()
        .args(["bench", "--simulate", "-f"])
        .arg(example("mixtral-8x22b-mi355x.yaml"))
        .arg("-o")
        .arg(&file)
        .assert()
        .success()
        .stdout(predicate::str::is_empty());
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(r["backend"], "simulate");
    let reduced: Vec<String> = serde_json::from_value(r["reducedAxes"].clone()).unwrap();
    assert!(reduced.iter().any(|a| a.starts_with("pp ")), "{reduced:?}");
    assert!(
        r["collectives"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["op"] == "all-to-all")
    );
}

/// What `primus bench --backend B` must say on this machine: without the cargo feature, that
/// the backend is not built in; with it and no GPU, that no GPU is visible. `None` when a GPU
/// of that vendor is there (the command would benchmark it).
fn expected_refusal(backend: &str) -> Option<&'static str> {
    match backend {
        "cuda" if cfg!(feature = "cuda") => (!std::path::Path::new("/dev/nvidiactl").exists())
            .then_some("error: no NVIDIA GPU visible: "),
        "rocm" if cfg!(feature = "rocm") => {
            (!std::path::Path::new("/dev/kfd").exists()).then_some("error: no AMD GPU visible: ")
        }
        "cuda" => Some("error: the cuda backend is not built into this primus"),
        _ => Some("error: the rocm backend is not built into this primus"),
    }
}

#[test]
fn gpu_backends_refuse_with_one_line() {
    for (backend, plan) in [
        ("cuda", "llama3.1-8b-h100-benchmark.yaml"),
        ("rocm", "mixtral-8x22b-mi355x.yaml"),
    ] {
        let Some(start) = expected_refusal(backend) else {
            continue;
        };
        let out = primus()
            .args(["bench", "--backend", backend, "-f"])
            .arg(example(plan))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{backend}: {stderr}");
        assert!(out.stdout.is_empty(), "{backend}");
        assert!(
            stderr.starts_with(start) && stderr.ends_with('\n') && stderr.lines().count() == 1,
            "{backend}: expected one line starting {start:?}, got {stderr:?}"
        );
    }
}

#[test]
fn bad_input_names_the_argument() {
    primus()
        .args(["report", "--plan", "ns/p", "--tokens-per-second", "-5"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--tokens-per-second"));
    primus()
        .args(["report", "--plan", "Bad/Name", "--tokens-per-second", "5"])
        .env("KUBECONFIG", "/nonexistent")
        .assert()
        .failure()
        .stderr(predicate::str::contains("error:"));
    // Neither -f nor --plan.
    primus().args(["bench", "--simulate"]).assert().code(2);
}

#[test]
fn finalists_are_timed_at_their_own_shapes_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("r.json");
    let out = primus()
        .args(["bench", "--simulate", "--finalists", "4", "-f"])
        .arg(example("llama3.1-8b-h100-benchmark.yaml"))
        .arg("-o")
        .arg(&file)
        .assert()
        .success()
        .get_output()
        .clone();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("finalist(s) of the analytic search: "),
        "{err}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let finalists = r["finalists"].as_array().expect("finalists");
    assert!(!finalists.is_empty() && finalists.len() <= 4);
    let mut keys: Vec<&str> = finalists
        .iter()
        .map(|f| f["shapesKey"].as_str().unwrap())
        .collect();
    assert!(keys.iter().all(|k| *k != r["shapesKey"].as_str().unwrap()));
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), finalists.len(), "each shape timed once");
    // Beyond the bound: refused, naming the flag.
    primus()
        .args(["bench", "--simulate", "--finalists", "9", "-f"])
        .arg(example("llama3.1-8b-h100-benchmark.yaml"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--finalists"));
}
