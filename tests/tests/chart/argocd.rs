//! The Argo CD side: the TrainingPlan health check (charts/primus-projection/files/argocd-health.lua)
//! run by real `lua5.1` (the dialect of Argo CD's gopher-lua) against TrainingPlan objects shaped
//! like the operator's (each sample deserializes into the CRD's Rust type first), and the
//! snippets in docs/gitops.md and the chart README: the argocd-cm key holds exactly that file,
//! and the example Application's ignoreDifferences names the webhook configuration the chart
//! renders for that Application.

use std::process::Command;

use serde_json::{Value, json};

use super::helm::{Helm, chart_dir, parse_documents, repo_file};

const HEALTH_KEY: &str = "resource.customizations.health.primus.dev_TrainingPlan";

/// A Lua table constructor for a JSON value (null -> nil: absent, as Argo CD's conversion does).
fn lua(v: &Value) -> String {
    match v {
        Value::Null => "nil".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => {
            let mut out = String::from("\"");
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '"' => out.push_str("\\\""),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    c if (c as u32) < 0x20 => out.push_str(&format!("\\{:03}", c as u32)),
                    c => out.push(c),
                }
            }
            out.push('"');
            out
        }
        Value::Array(items) => format!(
            "{{{}}}",
            items.iter().map(lua).collect::<Vec<_>>().join(", ")
        ),
        Value::Object(map) => format!(
            "{{{}}}",
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| format!("[{}] = {}", lua(&Value::String(k.clone())), lua(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Run the health check on `obj`: (status, message).
fn health(lua_bin: &std::path::Path, obj: &Value) -> (String, String) {
    let script = chart_dir().join("files/argocd-health.lua");
    let harness = format!(
        "obj = {}\nlocal check = assert(loadfile({}))\nlocal hs = check()\nio.write(tostring(hs.status), \"\\n\", tostring(hs.message), \"\\n\")\n",
        lua(obj),
        lua(&Value::String(script.display().to_string()))
    );
    let out = Command::new(lua_bin)
        .args(["-e", &harness])
        .output()
        .expect("run lua5.1");
    assert!(
        out.status.success(),
        "lua5.1 failed: {}\nobject: {obj}",
        primus_tests::stderr(&out)
    );
    let text = primus_tests::stdout(&out);
    let mut lines = text.lines();
    (
        lines.next().unwrap_or_default().to_string(),
        lines.next().unwrap_or_default().to_string(),
    )
}

fn condition(kind: &str, status: &str, reason: &str, message: &str) -> Value {
    json!({
        "type": kind, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 2,
    })
}

/// The example plan at generation 2 with `status`.
fn plan(status: Option<Value>) -> Value {
    let text = repo_file("examples/llama3.1-8b-h100-benchmark.yaml");
    let mut obj: Value = serde_saphyr::from_str(&text).expect("example parses");
    obj["metadata"]["namespace"] = json!("team-a");
    obj["metadata"]["generation"] = json!(2);
    if let Some(s) = status {
        obj["status"] = s;
    }
    // Shaped like the operator's objects: it must be a TrainingPlan.
    serde_json::from_value::<primus_crds::TrainingPlan>(obj.clone())
        .unwrap_or_else(|e| panic!("sample is no TrainingPlan: {e}\n{obj}"));
    obj
}

fn ready_conditions(job_reason: &str) -> Vec<Value> {
    vec![
        condition(
            "Ready",
            "True",
            "Ready",
            "TP2 PP1 MBS1 1f1b projected at 9123 tokens/s/GPU",
        ),
        condition(
            "Reconciling",
            "False",
            "Ready",
            "nothing left to do for this generation",
        ),
        condition("Stalled", "False", "Ready", "the plan is not stalled"),
        condition(
            "JobCreated",
            "True",
            job_reason,
            "PyTorchJob llama3-8b-bench with TP2 PP1 MBS1 1f1b is created",
        ),
    ]
}

#[test]
fn health_check_maps_plan_status_to_argo_cd_health() {
    let Some(bin) = primus_tests::tools::require("lua5.1", module_path!()) else {
        return;
    };
    let status = |phase: &str, conditions: Vec<Value>| json!({"observedGeneration": 2, "phase": phase, "conditions": conditions});

    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "no status yet",
            plan(None),
            "Progressing",
            "pick the plan up",
        ),
        (
            "status of an older generation",
            plan(Some(
                json!({"observedGeneration": 1, "phase": "Ready", "conditions": ready_conditions("Created")}),
            )),
            "Progressing",
            "observe generation 2",
        ),
        (
            "benchmarking",
            plan(Some(status(
                "Benchmarking",
                vec![
                    condition(
                        "Ready",
                        "False",
                        "Benchmarking",
                        "waiting for benchmark pod llama3-8b-bench-bench-1a2b-1",
                    ),
                    condition(
                        "Reconciling",
                        "True",
                        "Benchmarking",
                        "waiting for benchmark pod llama3-8b-bench-bench-1a2b-1",
                    ),
                    condition("Stalled", "False", "Progressing", "the plan is progressing"),
                ],
            ))),
            "Progressing",
            "waiting for benchmark pod",
        ),
        (
            "ready",
            plan(Some(status("Ready", ready_conditions("Created")))),
            "Healthy",
            "projected at 9123",
        ),
        (
            "ready, drifting",
            plan(Some(status("Ready", {
                let mut c = ready_conditions("Started");
                c.push(condition(
                    "DriftWithinTolerance",
                    "False",
                    "OutsideTolerance",
                    "measured 7300 tokens/s/GPU, 20% below the projection",
                ));
                c
            }))),
            "Healthy",
            "20% below the projection",
        ),
        (
            "invalid spec",
            plan(Some(status(
                "Stalled",
                vec![
                    condition(
                        "Ready",
                        "False",
                        "InvalidSpec",
                        "the spec is invalid: spec.cluster.gpus: must be a multiple of gpusPerNode",
                    ),
                    condition(
                        "Reconciling",
                        "False",
                        "InvalidSpec",
                        "waiting for a spec change",
                    ),
                    condition(
                        "Stalled",
                        "True",
                        "InvalidSpec",
                        "spec.cluster.gpus: must be a multiple of gpusPerNode",
                    ),
                ],
            ))),
            "Degraded",
            "spec.cluster.gpus",
        ),
        (
            "benchmark failed",
            plan(Some(status(
                "Failed",
                vec![
                    condition(
                        "Benchmarked",
                        "False",
                        "BenchmarkFailed",
                        "3 attempts failed",
                    ),
                    condition("Stalled", "True", "BenchmarkFailed", "3 attempts failed"),
                ],
            ))),
            "Degraded",
            "3 attempts failed",
        ),
        (
            "suspended for review",
            plan(Some(status("Ready", ready_conditions("Suspended")))),
            "Suspended",
            "PyTorchJob llama3-8b-bench",
        ),
        (
            "stalled wins over suspended",
            plan(Some(status("Stalled", {
                let mut c = ready_conditions("Suspended");
                c[2] = condition(
                    "Stalled",
                    "True",
                    "PyTorchJobCRDMissing",
                    "the PyTorchJob CRD is not installed",
                );
                c
            }))),
            "Degraded",
            "CRD is not installed",
        ),
        (
            "observed but no conditions yet",
            plan(Some(json!({"observedGeneration": 2}))),
            "Progressing",
            "become Ready",
        ),
    ];
    for (what, obj, want_status, want_message) in cases {
        let (status, message) = health(&bin, &obj);
        assert_eq!(status, want_status, "{what}: message {message:?}");
        assert!(
            message.contains(want_message),
            "{what}: {message:?} lacks {want_message:?}"
        );
    }
}

/// The YAML code blocks of a markdown file.
fn yaml_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in markdown.lines() {
        match &mut current {
            None if line.trim_start().starts_with("```yaml") => current = Some(String::new()),
            Some(b) if line.trim_start().starts_with("```") => {
                blocks.push(std::mem::take(b));
                current = None;
            }
            Some(b) => {
                b.push_str(line);
                b.push('\n');
            }
            None => {}
        }
    }
    blocks
}

#[test]
fn docs_carry_the_health_check_and_a_matching_application() {
    let lua_file = std::fs::read_to_string(chart_dir().join("files/argocd-health.lua")).unwrap();
    for doc in ["docs/gitops.md", "charts/primus-projection/README.md"] {
        let snippet = yaml_blocks(&repo_file(doc))
            .into_iter()
            .find(|b| b.contains(HEALTH_KEY))
            .unwrap_or_else(|| panic!("{doc} has no argocd-cm snippet with {HEALTH_KEY}"));
        let cm: Value = serde_saphyr::from_str(&snippet).expect("the snippet is YAML");
        assert_eq!(cm["kind"], "ConfigMap", "{doc}");
        assert_eq!(cm["metadata"]["name"], "argocd-cm", "{doc}");
        assert_eq!(
            cm["data"][HEALTH_KEY].as_str().unwrap_or_default(),
            lua_file,
            "{doc}: the health check differs from charts/primus-projection/files/argocd-health.lua"
        );
    }

    // The Application example: its ignoreDifferences must name what the chart renders for it.
    let app_text = yaml_blocks(&repo_file("docs/gitops.md"))
        .into_iter()
        .find(|b| b.contains("kind: Application"))
        .expect("docs/gitops.md has an Application example");
    let app = parse_documents(&app_text)
        .into_iter()
        .find(|d| d["kind"] == "Application")
        .expect("Application");
    let spec = &app["spec"];
    assert_eq!(spec["source"]["path"], "charts/primus-projection");
    let release = spec["source"]["helm"]["releaseName"]
        .as_str()
        .expect("releaseName");
    let namespace = spec["destination"]["namespace"]
        .as_str()
        .expect("destination namespace");
    let ignore = spec["ignoreDifferences"]
        .as_array()
        .expect("ignoreDifferences");
    let entry = ignore
        .iter()
        .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
        .expect("ignoreDifferences for the webhook configuration");
    assert_eq!(entry["group"], "admissionregistration.k8s.io");
    assert!(
        serde_json::to_string(&entry["jqPathExpressions"])
            .unwrap()
            .contains("clientConfig.caBundle"),
        "{entry}"
    );
    let sync = serde_json::to_string(&spec["syncPolicy"]["syncOptions"]).unwrap();
    assert!(sync.contains("RespectIgnoreDifferences=true"), "{sync}");
    assert!(sync.contains("ServerSideApply=true"), "{sync}");

    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let values = spec["source"]["helm"]["valuesObject"].clone();
    let file =
        std::env::temp_dir().join(format!("primus-argocd-values-{}.yaml", std::process::id()));
    std::fs::write(&file, serde_json::to_string(&values).unwrap()).unwrap();
    let r = helm.render(release, namespace, &["-f", file.to_str().unwrap()]);
    let vwc = r.kind("ValidatingWebhookConfiguration");
    assert_eq!(vwc.len(), 1);
    assert_eq!(
        entry["name"], vwc[0]["metadata"]["name"],
        "ignoreDifferences names another configuration"
    );
}
