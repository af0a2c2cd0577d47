//! The chart's Prometheus alerts under real `promtool`: the PrometheusRule is rendered by helm
//! (so the test sees exactly what ships, placeholders replaced), its `spec` becomes a rules file,
//! and `promtool test rules tests/prometheus/alerts_test.yaml` replays synthetic series: drift
//! fires only after `for: 30m` beyond the tolerance and recovers, per-plan tolerances win over the
//! chart's default, stalled plans fire, and so do webhook errors, latency, TLS failures, a
//! missing webhook, reconcile errors and a missing leader.

use std::path::PathBuf;
use std::process::Command;

use super::helm::{Helm, repo_file};

const RELEASE: &str = "primus-projection";
const NS: &str = "primus-system";

/// Render the PrometheusRule and write its spec and the promtool test file into a fresh dir.
fn prepare(helm: &Helm, extra: &[&str], tag: &str) -> (PathBuf, serde_json::Value) {
    let mut args = vec![
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--show-only",
        "templates/prometheusrule.yaml",
    ];
    args.extend_from_slice(extra);
    let r = helm.render(RELEASE, NS, &args);
    let rule = r.get("PrometheusRule", RELEASE).clone();
    let dir = std::env::temp_dir().join(format!("primus-promtool-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    std::fs::write(
        dir.join("rules.yaml"),
        serde_json::to_string_pretty(&rule["spec"]).expect("JSON"),
    )
    .expect("rules.yaml");
    std::fs::write(
        dir.join("alerts_test.yaml"),
        repo_file("tests/prometheus/alerts_test.yaml"),
    )
    .expect("test file");
    (dir, rule)
}

fn promtool(bin: &PathBuf, dir: &PathBuf, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("promtool {args:?}: {e}"));
    (
        out.status.success(),
        format!(
            "{}{}",
            primus_tests::stdout(&out),
            primus_tests::stderr(&out)
        ),
    )
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let Some(bin) = primus_tests::tools::require("promtool", module_path!()) else {
        return;
    };
    let (dir, rule) = prepare(&helm, &[], "default");
    let (ok, out) = promtool(&bin, &dir, &["check", "rules", "rules.yaml"]);
    assert!(ok, "promtool check rules:\n{out}");
    let (ok, out) = promtool(&bin, &dir, &["test", "rules", "alerts_test.yaml"]);
    assert!(ok, "promtool test rules:\n{out}");
    assert!(out.contains("SUCCESS"), "{out}");

    // Every alert: a severity, a summary, a description and a runbook link whose anchor is a
    // section of docs/alerts.md; and a test case in alerts_test.yaml.
    let runbooks = repo_file("docs/alerts.md");
    let tests = repo_file("tests/prometheus/alerts_test.yaml");
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().expect("groups") {
        for r in group["rules"].as_array().expect("rules") {
            let Some(name) = r["alert"].as_str() else {
                continue;
            };
            alerts.push(name.to_string());
            assert!(r["labels"]["severity"].is_string(), "{name}: severity");
            for a in ["summary", "description", "runbook_url"] {
                assert!(
                    r["annotations"][a].as_str().is_some_and(|s| !s.is_empty()),
                    "{name}: annotation {a}"
                );
            }
            let anchor = name.to_lowercase();
            assert!(
                r["annotations"]["runbook_url"]
                    .as_str()
                    .unwrap()
                    .ends_with(&format!("docs/alerts.md#{anchor}")),
                "{name}: runbook_url"
            );
            assert!(
                runbooks.lines().any(|l| l.trim() == format!("## {name}")),
                "docs/alerts.md has no `## {name}` section"
            );
            assert!(
                tests.contains(&format!("alertname: {name}")),
                "tests/prometheus/alerts_test.yaml does not test {name}"
            );
        }
    }
    assert!(alerts.len() >= 8, "{alerts:?}");
}

#[test]
fn the_unit_tests_catch_a_changed_threshold() {
    // The same unit tests against rules rendered with other values must fail: they test the
    // values that ship, not rules that would pass anyway.
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let Some(bin) = primus_tests::tools::require("promtool", module_path!()) else {
        return;
    };
    for (set, tag) in [
        ("metrics.prometheusRule.driftTolerance=0.3", "tolerance"),
        ("metrics.prometheusRule.driftFor=20m", "for"),
        ("metrics.prometheusRule.stalledFor=30m", "stalled"),
    ] {
        let (dir, _) = prepare(&helm, &["--set", set], tag);
        let (ok, out) = promtool(&bin, &dir, &["test", "rules", "alerts_test.yaml"]);
        assert!(!ok, "promtool test rules passed with {set}:\n{out}");
        assert!(out.contains("FAILED"), "{out}");
    }
}
