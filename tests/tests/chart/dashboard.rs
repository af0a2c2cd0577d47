//! The Grafana dashboard (`metrics.grafanaDashboard`): the ConfigMap the chart renders for
//! Grafana's sidecar, a well-formed dashboard in it, every PromQL query naming only metrics the
//! code exports (the names registered in operator/src/metrics.rs and webhook/src/metrics.rs,
//! with the `_bucket`/`_sum`/`_count` series of histograms), the panels the issue asks for, and
//! every query parsed by real `promtool` (as recording rules of a rules file).

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use super::fixtures::{FULL, NS, RELEASE};
use super::helm::{Helm, repo_file};

/// Series names the code exports: every `"primus_..."` string literal of the two metrics
/// modules; a literal that opens `HistogramOpts::new(` also exports its `_bucket`, `_sum` and
/// `_count` series.
fn exported_metrics() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for file in ["operator/src/metrics.rs", "webhook/src/metrics.rs"] {
        let src = repo_file(file);
        for (pos, _) in src.match_indices("\"primus_") {
            let rest = &src[pos + 1..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            if !rest[end..].starts_with('"') {
                continue;
            }
            let name = rest[..end].to_string();
            let before: String = src[..pos].chars().filter(|c| !c.is_whitespace()).collect();
            if before.ends_with("HistogramOpts::new(") {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
            out.insert(name);
        }
    }
    out
}

const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
    // Aggregations, which may be followed by `by (...)` before their `(`.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Index just past the bracket that closes the one opening at `open`, skipping strings.
fn skip_balanced(b: &[u8], open: usize, close: u8) -> usize {
    let start = b[open];
    let mut depth = 0usize;
    let mut i = open;
    while i < b.len() {
        match b[i] {
            q @ (b'"' | b'\'' | b'`') => i = skip_string(b, i, q) - 1,
            c if c == start => depth += 1,
            c if c == close => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// Index just past the string literal that opens at `open` with quote `q`.
fn skip_string(b: &[u8], open: usize, q: u8) -> usize {
    let mut i = open + 1;
    while i < b.len() && b[i] != q {
        i += if b[i] == b'\\' { 2 } else { 1 };
    }
    i + 1
}

/// The metric names a PromQL expression selects: identifiers that are not functions,
/// aggregations, keywords, label names (in `{}`, `by (...)`, `on (...)` and the like),
/// strings, numbers or durations.
fn metric_names(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let next_non_space = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i = skip_string(b, i, c);
        } else if c == b'{' {
            i = skip_balanced(b, i, b'}');
        } else if c == b'[' {
            i = skip_balanced(b, i, b']');
        } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit))
        {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == b'_' || c == b':' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let word = &expr[start..i];
            let j = next_non_space(i);
            let lower = word.to_ascii_lowercase();
            if [
                "by",
                "without",
                "on",
                "ignoring",
                "group_left",
                "group_right",
            ]
            .contains(&lower.as_str())
            {
                // Its label list.
                if b.get(j) == Some(&b'(') {
                    i = skip_balanced(b, j, b')');
                }
            } else if KEYWORDS.contains(&lower.as_str()) || b.get(j) == Some(&b'(') {
                // A keyword, or a function or aggregation called here.
            } else {
                out.push(word.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Grafana's variables replaced by values Prometheus accepts.
fn substitute(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$__interval", "1m")
        .replace("${namespace}", ".*")
        .replace("$namespace", ".*")
        .replace("${plan}", ".*")
        .replace("$plan", ".*")
}

/// Every panel, rows' collapsed panels included.
fn all_panels(dash: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner.iter());
        }
    }
    out
}

fn rendered_dashboard(helm: &Helm) -> (Value, Value) {
    let r = helm.render(
        RELEASE,
        NS,
        &["--set", "metrics.grafanaDashboard.enabled=true"],
    );
    let cm = r.get("ConfigMap", &format!("{FULL}-dashboard")).clone();
    let text = cm["data"]["primus-projection.json"]
        .as_str()
        .expect("the dashboard JSON in the ConfigMap");
    let dash: Value = serde_json::from_str(text).expect("the dashboard is JSON");
    (cm, dash)
}

#[test]
fn the_lexer_finds_metric_names_and_nothing_else() {
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (le) (rate(a_bucket{job=~"x|y", le!="1"}[5m]))) / on (namespace, plan) group_left b offset 5m or -c > bool 0.1e3 and vector(0)"#
        ),
        ["a_bucket", "b", "c"]
    );
    assert_eq!(
        metric_names(r#"count(abs(d) > on (ns) e{p="}"}) by (x) or sum without (y) (f)"#),
        ["d", "e", "f"]
    );
    assert!(metric_names("time() - vector(1)").is_empty());
}

#[test]
fn the_dashboard_queries_only_metrics_the_code_exports() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    // Off by default (nothing optional), on with the sidecar's label.
    let plain = helm.render(RELEASE, NS, &[]);
    assert!(plain.kind("ConfigMap").is_empty());
    let (cm, dash) = rendered_dashboard(&helm);
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(cm["metadata"]["namespace"], NS);
    let moved = helm.render(
        RELEASE,
        NS,
        &[
            "--set",
            "metrics.grafanaDashboard.enabled=true",
            "--set",
            "metrics.grafanaDashboard.namespace=monitoring",
            "--set",
            "metrics.grafanaDashboard.annotations.grafana_folder=Training",
        ],
    );
    let cm = moved.get("ConfigMap", &format!("{FULL}-dashboard"));
    assert_eq!(cm["metadata"]["namespace"], "monitoring");
    assert_eq!(cm["metadata"]["annotations"]["grafana_folder"], "Training");

    // A dashboard Grafana loads: uid, title, schema version, unique panel ids with a place
    // on the grid, queries against the datasource variable.
    assert_eq!(dash["uid"], "primus-projection");
    assert!(dash["title"].is_string() && dash["schemaVersion"].as_u64() >= Some(30));
    let panels = all_panels(&dash);
    let ids: BTreeSet<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let exported = exported_metrics();
    assert!(
        exported.contains("primus_plan_drift_ratio")
            && exported.contains("primus_webhook_admission_duration_seconds_bucket"),
        "the scan of the metrics modules found {exported:?}"
    );
    let mut used = BTreeSet::new();
    let mut queries = Vec::new();
    for p in &panels {
        let title = p["title"].as_str().unwrap_or("?");
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title}: no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            let names = metric_names(expr);
            assert!(!names.is_empty(), "{title}: `{expr}` selects no metric");
            for n in names {
                assert!(
                    exported.contains(&n),
                    "{title}: `{expr}` queries {n}, which the code does not export"
                );
                used.insert(n);
            }
            queries.push((title.to_string(), expr.to_string()));
        }
    }
    // The template variables' label_values() queries too.
    for v in dash["templating"]["list"].as_array().expect("templating") {
        if let Some(q) = v["query"]["query"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|r| r.rsplit_once(','))
                .map(|(m, _)| m)
                .expect("label_values(METRIC, LABEL)");
            for n in metric_names(inner) {
                assert!(exported.contains(&n), "variable {}: {n}", v["name"]);
            }
        }
    }
    // What the dashboard is for.
    for want in [
        "primus_plan_projected_tokens_per_second",
        "primus_plan_measured_tokens_per_second",
        "primus_plan_drift_ratio",
        "primus_plan_drift_tolerance",
        "primus_webhook_admissions_total",
        "primus_webhook_admission_duration_seconds_bucket",
        "primus_reconcile_errors_total",
    ] {
        assert!(used.contains(want), "no panel queries {want}");
    }
    assert!(
        queries
            .iter()
            .any(|(_, e)| e.contains("primus_webhook_admissions_total{decision=\"deny\"}")),
        "no panel of denials"
    );

    // promtool parses every query (as a recording rule), and would reject a broken one.
    let Some(promtool) = primus_tests::tools::require("promtool", module_path!()) else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("primus-dashboard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = |exprs: &[String]| -> String {
        let rules: Vec<Value> = exprs
            .iter()
            .enumerate()
            .map(|(i, e)| serde_json::json!({"record": format!("primus:dashboard:query{i}"), "expr": e}))
            .collect();
        serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]}).to_string()
    };
    let check = |name: &str, text: String| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let out = Command::new(&promtool)
            .args(["check", "rules"])
            .arg(&path)
            .output()
            .expect("promtool");
        (
            out.status.success(),
            format!(
                "{}{}",
                primus_tests::stdout(&out),
                primus_tests::stderr(&out)
            ),
        )
    };
    let exprs: Vec<String> = queries.iter().map(|(_, e)| substitute(e)).collect();
    let (ok, text) = check("dashboard-rules.yaml", rules(&exprs));
    assert!(
        ok,
        "promtool check rules on the dashboard's queries:\n{text}"
    );
    assert!(
        text.contains(&format!("{} rules found", exprs.len())),
        "{text}"
    );
    let (ok, _) = check(
        "broken-rules.yaml",
        rules(&["sum by (le (rate(x[5m]))".to_string()]),
    );
    assert!(!ok, "promtool accepted a broken expression");
}
