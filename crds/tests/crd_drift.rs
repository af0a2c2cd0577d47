//! The checked-in CRD manifests must equal what the Rust types generate: edit the types, then
//! run `cargo run -p primus-crds --bin crdgen` and commit the YAML.

use std::path::Path;

#[test]
fn checked_in_crds_match_the_generated_ones() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rendered = primus_crds::crdgen::render().expect("CRDs render");
    assert_eq!(rendered.len(), 2, "TrainingPlan and BenchmarkReport");
    for (name, text) in rendered {
        let path = dir.join(&name);
        let current = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run crdgen)", path.display()));
        assert!(
            current == text,
            "{} differs from the generated CRD: run `cargo run -p primus-crds --bin crdgen` and commit",
            path.display()
        );
    }
}

#[test]
fn chart_crds_match_the_generated_ones() {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/primus-projection/crds");
    if !chart.exists() {
        // The chart arrives with its own issue; until then there is nothing to compare.
        return;
    }
    for (name, text) in primus_crds::crdgen::render().expect("CRDs render") {
        let path = chart.join(&name);
        let current = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!("{}: {e} (copy crds/*.yaml into the chart)", path.display())
        });
        assert!(
            current == text,
            "{} differs from crds/{name}",
            path.display()
        );
    }
}

#[test]
fn every_spec_field_is_documented() {
    // `kubectl explain` shows these descriptions: a field without one is a documentation bug.
    for (name, text) in primus_crds::crdgen::render().expect("CRDs render") {
        let value: serde_json::Value = serde_saphyr::from_str(&text).expect("CRD YAML parses");
        let schema = &value["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        let mut missing = Vec::new();
        walk(schema, "", &mut missing);
        assert!(
            missing.is_empty(),
            "{name}: fields without a description: {missing:?}"
        );
    }
}

fn walk(schema: &serde_json::Value, path: &str, missing: &mut Vec<String>) {
    if let Some(props) = schema.get("properties").and_then(|p| p.as_object()) {
        for (key, sub) in props {
            let here = format!("{path}.{key}");
            // metadata, apiVersion and kind are Kubernetes' own.
            let k8s_own =
                path.is_empty() && ["metadata", "apiVersion", "kind"].contains(&key.as_str());
            let conditions = path.ends_with(".conditions");
            if !k8s_own && !conditions && sub.get("description").is_none() {
                missing.push(here.clone());
            }
            walk(sub, &here, missing);
        }
    }
    if let Some(items) = schema.get("items") {
        walk(items, &format!("{path}[]"), missing);
    }
}
