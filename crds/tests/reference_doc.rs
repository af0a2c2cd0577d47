//! docs/trainingplan-reference.md is generated from the CRD schema by the `crddoc` binary; the
//! checked-in page must equal its output. After changing the API types, run
//! `cargo run -p primus-crds --bin crdgen && cargo run -p primus-crds --bin crddoc -- --write`.

use std::path::Path;
use std::process::Command;

fn crddoc() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_crddoc"))
        .output()
        .expect("run crddoc");
    assert!(
        out.status.success(),
        "crddoc failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 markdown")
}

#[test]
fn the_checked_in_reference_is_what_crddoc_renders() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/trainingplan-reference.md");
    let current = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run crddoc --write)", path.display()));
    let rendered = crddoc();
    if current != rendered {
        let first = current
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(current.lines().count().min(rendered.lines().count()));
        panic!(
            "docs/trainingplan-reference.md is stale (first difference at line {}): run `cargo run -p primus-crds --bin crddoc -- --write` and commit",
            first + 1
        );
    }
}

#[test]
fn the_reference_documents_every_spec_field_of_the_schema() {
    // Each leaf path of the schema appears as a row, so a renderer bug cannot drop fields
    // silently.
    let page = crddoc();
    let crd: serde_json::Value = serde_saphyr::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("trainingplans.primus.dev.yaml"),
        )
        .expect("CRD file"),
    )
    .expect("CRD YAML");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut paths = Vec::new();
    collect(&schema["properties"]["spec"], "spec", &mut paths);
    collect(&schema["properties"]["status"], "status", &mut paths);
    assert!(paths.len() > 50, "only {} fields found", paths.len());
    for p in paths {
        assert!(
            page.contains(&format!("| `{p}` |")),
            "the reference has no row for {p}"
        );
    }
    for needle in [
        "`primus.dev/v1alpha1`",
        "`tplan`",
        "## spec",
        "## status",
        "| Phase |",
    ] {
        assert!(page.contains(needle), "the reference lacks {needle}");
    }
}

fn collect(schema: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    if let Some(props) = schema["properties"].as_object() {
        for (k, v) in props {
            let here = format!("{path}.{k}");
            out.push(here.clone());
            collect(v, &here, out);
            if v["type"] == "array" {
                collect(&v["items"], &format!("{here}[]"), out);
            }
        }
    }
}
