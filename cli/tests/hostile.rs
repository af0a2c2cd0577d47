//! The hostile plans of issue 13, against `primus` as a user runs it: each capped at 2 GiB of
//! address space (`ulimit -v`) and 10 s, as the issue tried them. Before the fix 7 of the 11
//! aborted (a stack overflow, a pre-allocation of 3.7 TB, a 17 GB schedule, an `assert`, an
//! allocation of 8 GB) or ran past 10 s; each must now exit 2 with one line naming the field.
//! Plans at the bounds must still work, within the same caps. Generated hostile plans (the
//! shared generator of `primus_tests::hostile::inputs`) run through `primus memory` and
//! `primus project` under the same caps.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use primus_tests::hostile::{self, inputs};
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const BASE: &str = "model: {preset: llama3.1-8b}\ncluster: {gpu: h100-sxm, gpus: 8}\n";
const TRAINING: &str = "training: {seqLength: 4096, globalBatchSize: 64}\n";

/// `primus ARGS` under `ulimit -v 2 GiB` and a 10 s timeout.
fn capped<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    let exe = std::process::Command::cargo_bin("primus").expect("the primus binary");
    let exe = exe.get_program().to_owned();
    let mut cmd = assert_cmd::Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -v 2097152 && exec \"$0\" \"$@\"")
        .arg(exe)
        .args(args)
        .timeout(Duration::from_secs(10));
    cmd.output().expect("run primus")
}

/// `primus ARGS -f PLAN` under the same caps ([`capped`]).
fn primus_capped(dir: &Path, plan: &str, args: &[&str]) -> Output {
    let file = dir.join("plan.yaml");
    std::fs::write(&file, plan).expect("write the plan");
    let mut all: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    all.push("-f".into());
    all.push(file.into_os_string());
    capped(&all)
}

/// The plan is refused: exit 2, one line `error: FIELD: ...` (and `expect` in it).
fn refused(name: &str, out: &Output, field: &str, expect: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{name}: expected exit 2 (a signal is an abort), got {:?}: {err}",
        out.status
    );
    assert_eq!(err.lines().count(), 1, "{name}: one line, got {err:?}");
    assert!(
        err.starts_with(&format!("error: {field}")),
        "{name}: the line names {field}: {err}"
    );
    assert!(err.contains(expect), "{name}: {expect:?} in {err}");
    assert!(
        err.len() < 1000,
        "{name}: a short line, got {} bytes",
        err.len()
    );
}

#[test]
fn the_eleven_hostile_plans_of_the_issue_exit_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let card_2e9 = "model: {card: {layers: 2000000000, hiddenSize: 4096, ffnHiddenSize: 14336, attentionHeads: 32, kvHeads: 8, vocabSize: 128256, activation: swiglu, norm: rmsnorm}}\ncluster: {gpu: h100-sxm, gpus: 8}\n";
    let ep_3000 = format!(
        "model: {{preset: mixtral-8x7b}}\ncluster: {{gpu: h100-sxm, gpus: 8}}\n{TRAINING}tuning: {{allowed: {{ep: [{}]}}}}\n",
        (1..=3000)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let gbs = |n: u64, layout: &str| {
        format!("{BASE}training: {{seqLength: 4096, globalBatchSize: {n}}}\n{layout}")
    };
    let cases: Vec<(&str, String, &[&str], &str, &str)> = vec![
        (
            "pipelineLayout of 200,000 `(` (a stack overflow)",
            format!(
                "{BASE}{TRAINING}parallelism: {{pp: 2, pipelineLayout: '{}'}}\n",
                "(".repeat(200_000)
            ),
            &["memory"],
            "spec.parallelism.pipelineLayout",
            "longer than 4096 characters",
        ),
        (
            "topK 4294967295 (a 3.7 TB pre-allocation)",
            format!("{BASE}{TRAINING}tuning: {{topK: 4294967295}}\n"),
            &["tune", "-q"],
            "spec.tuning.topK",
            "at most 64",
        ),
        (
            "global batch 2^31-2 with TP 8 on 8 GPUs (a 17 GB schedule)",
            gbs((1 << 31) - 2, "parallelism: {tp: 8}\n"),
            &["project"],
            "spec.training.globalBatchSize",
            "at most 16777216",
        ),
        (
            "global batch 2^63-1 with TP 8 on 8 GPUs (an assert)",
            gbs((1 << 63) - 1, "parallelism: {tp: 8}\n"),
            &["project"],
            "spec.training.globalBatchSize",
            "at most 16777216",
        ),
        (
            "tune with a global batch of 2^62 (divisors of 2^62)",
            gbs(1 << 62, ""),
            &["tune", "-q"],
            "spec.training.globalBatchSize",
            "at most 16777216",
        ),
        (
            "allowed.ep with 3,000 values on Mixtral 8x7B",
            ep_3000,
            &["tune", "-q"],
            "spec.tuning.allowed.ep",
            "lists 3000 values (at most 64)",
        ),
        (
            "an inline card with 2e9 layers (an 8 GB allocation)",
            format!("{card_2e9}{TRAINING}"),
            &["tune", "-q"],
            "spec.model.card.layers",
            "at most 4096",
        ),
        (
            "tp 4294967296 (beyond u32)",
            format!("{BASE}{TRAINING}parallelism: {{tp: 4294967296}}\n"),
            &["memory"],
            "spec.parallelism.tp",
            "u32",
        ),
        (
            "pipelineLayout x",
            format!("{BASE}{TRAINING}parallelism: {{pipelineLayout: x}}\n"),
            &["memory"],
            "spec.parallelism.pipelineLayout",
            "unexpected 'x'",
        ),
        (
            "tp*pp = 65536*65536 (wrapped to 0 in u32)",
            "model: {preset: llama3.1-8b}\ncluster: {gpu: h100-sxm, gpus: 65536}\ntraining: {seqLength: 4096, globalBatchSize: 65536}\nparallelism: {tp: 65536, pp: 65536}\n".to_string(),
            &["memory"],
            "spec.cluster.gpus",
            "tp*pp*cp = 65536*65536*1 = 4294967296",
        ),
        (
            "benchmark timeoutSeconds 0 (the webhook admitted it, the operator stalled)",
            format!("{BASE}{TRAINING}parallelism: {{tp: 8}}\nbenchmark: {{enabled: true, timeoutSeconds: 0}}\n"),
            &["project"],
            "spec.benchmark.timeoutSeconds",
            "greater than 0",
        ),
    ];
    assert_eq!(cases.len(), 11);
    for (name, plan, args, field, expect) in &cases {
        let out = primus_capped(dir.path(), plan, args);
        refused(name, &out, field, expect);
    }
}

#[test]
fn rules_the_operator_applied_alone_are_the_clis_too() {
    let dir = tempfile::tempdir().unwrap();
    for (plan, field, expect) in [
        (
            "drift: {prometheus: {url: 'prom:9090', query: up}}\n",
            "spec.drift.prometheus.url",
            "not an http(s) URL",
        ),
        (
            "benchmark: {enabled: true, backend: rocm}\n",
            "spec.benchmark.backend",
            "rocm cannot measure",
        ),
        (
            "job: {name: Bad_Name}\n",
            "spec.job.name",
            "not a valid object name",
        ),
        (
            "tuning: {fixed: {tp: 4}, allowed: {tp: [1, 2]}}\n",
            "spec.tuning.fixed.tp",
            "not among",
        ),
    ] {
        let out = primus_capped(
            dir.path(),
            &format!("{BASE}{TRAINING}parallelism: {{tp: 8}}\n{plan}"),
            &["project"],
        );
        refused(plan, &out, field, expect);
    }
}

#[test]
fn deep_yaml_and_huge_flags_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    // 100,000 nested sequences: serde-saphyr's depth budget.
    let deep = format!("spec: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let out = primus_capped(dir.path(), &deep, &["memory"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("recursion limit") && !err.contains("error: line"),
        "{err}"
    );
    // Nine levels of ten aliases each ("billion laughs"): 10^9 nodes if expanded.
    let mut laughs = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..9 {
        let p = format!("*a{}", i - 1);
        laughs.push_str(&format!("a{i}: &a{i} [{}]\n", [p.as_str(); 10].join(", ")));
    }
    laughs.push_str("spec: *a8\n");
    let out = primus_capped(dir.path(), &laughs, &["memory"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("more YAML than any plan or profile"), "{err}");
    // `--top` is bounded like spec.tuning.topK.
    let out = primus_capped(
        dir.path(),
        &format!("{BASE}{TRAINING}"),
        &["tune", "-q", "--top", "4294967295"],
    );
    assert_eq!(out.status.code(), Some(2), "{:?}", out);
}

#[test]
fn plans_at_the_bounds_still_project_within_the_caps() {
    let dir = tempfile::tempdir().unwrap();
    // A global batch of 2^24 on 8 GPUs with TP 8: 2^24 micro-batches, whose schedule the
    // simulator extrapolates from its steady state in bounded memory.
    let plan = format!(
        "{BASE}training: {{seqLength: 4096, globalBatchSize: 16777216}}\nparallelism: {{tp: 8}}\n"
    );
    for args in [&["project", "-o", "json"][..], &["memory"][..]] {
        let out = primus_capped(dir.path(), &plan, args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = primus_capped(dir.path(), &plan, &["project", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["numMicrobatches"], 16777216);
    let tps = v["tokensPerSecondPerGpu"].as_f64().unwrap();
    // The same layout at a global batch of 64 (simulated pass by pass): with 2^24
    // micro-batches the pipeline fills and drains once per step, so the throughput is no
    // lower, and the DP and step overheads are amortised.
    let small = primus_capped(
        dir.path(),
        &format!("{BASE}{TRAINING}parallelism: {{tp: 8}}\n"),
        &["project", "-o", "json"],
    );
    let s: serde_json::Value = serde_json::from_slice(&small.stdout).unwrap();
    let small_tps = s["tokensPerSecondPerGpu"].as_f64().unwrap();
    assert!(
        tps.is_finite() && tps >= small_tps * 0.999,
        "{tps} vs {small_tps}"
    );
}

/// One generated plan through one command: exit 0 (an answer), 1 or 2 (one line `error: ...`),
/// never a signal (an abort: stack overflow, allocation failure, the 10 s timeout) nor a panic
/// (exit 101).
fn answered_or_refused(out: &Output) -> Result<(), String> {
    let err = String::from_utf8_lossy(&out.stderr);
    match out.status.code() {
        Some(0) => Ok(()),
        Some(1 | 2) if err.lines().count() == 1 && err.starts_with("error: ") => {
            if err.chars().count() > 4_000 {
                Err(format!("a {}-character error line", err.chars().count()))
            } else {
                Ok(())
            }
        }
        _ => Err(format!("{:?}: {}", out.status, hostile::short(&err))),
    }
}

#[test]
fn generated_hostile_plans_end_in_an_answer_or_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let mut runner = TestRunner::new(Config {
        cases: hostile::cases(60),
        failure_persistence: None,
        ..Config::default()
    });
    let ran = std::cell::Cell::new(0u32);
    let outcomes = std::cell::RefCell::new(std::collections::BTreeMap::<String, u32>::new());
    let result = runner.run(&inputs::plan_spec(), |(spec, depth)| {
        ran.set(ran.get() + 1);
        let text = inputs::expand_deep(&spec, depth);
        for args in [&["memory"][..], &["project", "-o", "json"][..]] {
            let out = primus_capped(dir.path(), &text, args);
            *outcomes
                .borrow_mut()
                .entry(format!("{} exit {:?}", args[0], out.status.code()))
                .or_default() += 1;
            answered_or_refused(&out).map_err(|e| {
                TestCaseError::fail(format!(
                    "primus {}: {e}: {}",
                    args[0],
                    hostile::short(&text)
                ))
            })?;
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    println!(
        "hostile cases: {} CLI (primus memory and primus project, a capped process each)",
        ran.get()
    );
    println!("CLI outcomes: {:?}", outcomes.borrow());
}

#[test]
fn a_file_that_never_ends_is_refused_not_read_whole() {
    // Every command that reads a file reads at most its kind's bound (a plan or report: 4 MiB,
    // a validation table: 64 MiB) plus one byte: `/dev/zero` was read until memory ran out.
    let zero = Path::new("/dev/zero");
    if !zero.exists() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = dir.path().join("plan.yaml");
    std::fs::write(
        &plan,
        format!("{BASE}{TRAINING}parallelism: {{tp: 1, pp: 1, microBatchSize: 1}}\n"),
    )
    .expect("write the plan");
    let plan = plan.to_str().expect("utf-8 path");
    for (args, bound) in [
        (vec!["project", "-f", "/dev/zero"], "4 MiB"),
        (vec!["memory", "-f", "/dev/zero"], "4 MiB"),
        (vec!["tune", "-f", "/dev/zero"], "4 MiB"),
        (vec!["import", "/dev/zero"], "4 MiB"),
        (
            vec!["project", "-f", plan, "--calibration", "/dev/zero"],
            "4 MiB",
        ),
        (vec!["validate", "/dev/zero"], "64 MiB"),
        (vec!["validate", "--memory", "/dev/zero"], "64 MiB"),
        (
            vec![
                "validate",
                "--memory",
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../oracle/tests/data/memory.csv"
                ),
                "--ranks",
                "/dev/zero",
            ],
            "64 MiB",
        ),
    ] {
        let out = capped(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("larger than {bound}")) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_profiles_directory_is_listed_to_its_bound() {
    // A directory of model cards adds to the built-in ones; one of more than
    // bounds::limits::PROFILE_FILES entries (4,096) is refused in one line, not collected.
    let dir = tempfile::tempdir().expect("temp dir");
    let models = dir.path().join("models");
    std::fs::create_dir_all(&models).expect("models/");
    let card = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/models/llama3.1-8b.yaml"),
    )
    .expect("the built-in card");
    std::fs::write(models.join("my-llama.yaml"), &card).expect("write the card");
    let list = |d: &Path| {
        let mut cmd = assert_cmd::Command::cargo_bin("primus").expect("the primus binary");
        cmd.args(["profiles", "--profiles-dir"])
            .arg(d)
            .timeout(Duration::from_secs(10));
        cmd.output().expect("run primus")
    };
    let out = list(dir.path());
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("my-llama"));
    for i in 0..4096 {
        std::fs::write(models.join(format!("n{i}.txt")), "").expect("an entry");
    }
    let out = list(dir.path());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("more than 4096 entries") && err.lines().count() == 1,
        "{err}"
    );
}
