//! The typed PyTorchJob against the vendored CRD (crds/thirdparty/kubeflow.org_pytorchjobs.yaml,
//! what the test bed installs): every field the CRD declares is a named field of the types (none
//! lands in an `extra` map), and what the types write passes the CRD's structural schema.

mod common;

use primus_crds::PyTorchJob;
use serde_json::{Value, json};

/// The CRD's `openAPIV3Schema`.
fn crd_schema() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/thirdparty/kubeflow.org_pytorchjobs.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the PyTorchJob CRD is in the repository");
    let crd: Value = serde_saphyr::from_str(&text).expect("CRD YAML parses");
    assert_eq!(crd["spec"]["group"], primus_crds::pytorchjob::GROUP);
    assert_eq!(crd["spec"]["names"]["kind"], primus_crds::pytorchjob::KIND);
    assert_eq!(
        crd["spec"]["names"]["plural"],
        primus_crds::pytorchjob::PLURAL
    );
    assert_eq!(
        crd["spec"]["versions"][0]["name"],
        primus_crds::pytorchjob::VERSION
    );
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

#[test]
fn every_field_the_crd_declares_is_typed() {
    let schema = crd_schema();
    let mut doc = common::sample(&schema, usize::MAX);
    doc["apiVersion"] = json!("kubeflow.org/v1");
    doc["kind"] = json!("PyTorchJob");
    doc["metadata"] = json!({"name": "j"});
    let replica = common::sample(
        &schema["properties"]["spec"]["properties"]["pytorchReplicaSpecs"]["additionalProperties"],
        usize::MAX,
    );
    doc["spec"]["pytorchReplicaSpecs"] = json!({"Master": replica, "Worker": replica});
    let job: PyTorchJob = serde_json::from_value(doc.clone()).expect("the sample deserializes");
    assert!(job.extra.is_empty(), "{:?}", job.extra);
    assert!(job.spec.extra.is_empty(), "spec: {:?}", job.spec.extra);
    let rp = job.spec.run_policy.as_ref().expect("runPolicy");
    assert!(rp.extra.is_empty(), "runPolicy: {:?}", rp.extra);
    assert!(rp.scheduling_policy.is_some());
    assert!(job.spec.elastic_policy.is_some());
    for (name, r) in &job.spec.pytorch_replica_specs {
        assert!(r.extra.is_empty(), "{name}: {:?}", r.extra);
        assert!(r.replicas.is_some() && r.restart_policy.is_some() && r.template.is_some());
    }
    assert!(job.status.is_some());
    // And back, unchanged.
    assert_eq!(serde_json::to_value(&job).unwrap(), doc);
}

/// Types, enums and required keys where the schema names them (the API server's check).
fn check(schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    if let Some(e) = schema["enum"].as_array()
        && !e.contains(v)
    {
        errors.push(format!("{path}: {v} not in {e:?}"));
    }
    let ok = match schema["type"].as_str() {
        Some("object") => v.is_object(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("boolean") => v.is_boolean(),
        _ => true,
    };
    if !ok {
        errors.push(format!("{path}: {v} is not of type {}", schema["type"]));
        return;
    }
    let Some(obj) = v.as_object() else { return };
    for r in schema["required"].as_array().into_iter().flatten() {
        if !obj.contains_key(r.as_str().unwrap_or_default()) {
            errors.push(format!("{path}: missing {r}"));
        }
    }
    for (k, child) in obj {
        let p = format!("{path}.{k}");
        if let Some(s) = schema["properties"].get(k) {
            check(s, child, &p, errors);
        } else if let Some(s) = schema.get("additionalProperties").filter(|s| s.is_object()) {
            check(s, child, &p, errors);
        } else if schema["x-kubernetes-preserve-unknown-fields"] != json!(true)
            && path != ".metadata"
        {
            errors.push(format!("{p}: unknown field"));
        }
    }
}

#[test]
fn a_typed_job_passes_the_crd_schema() {
    let job: PyTorchJob = serde_json::from_value(json!({
        "metadata": {"name": "j"},
        "spec": {"nprocPerNode": "8", "runPolicy": {"suspend": true, "cleanPodPolicy": "None"},
                 "pytorchReplicaSpecs": {"Master": {"replicas": 1, "restartPolicy": "OnFailure",
                     "template": {"spec": {"containers": [{"name": "pytorch", "image": "i"}]}}}}}
    }))
    .unwrap();
    let v = serde_json::to_value(&job).unwrap();
    assert_eq!(v["apiVersion"], "kubeflow.org/v1");
    assert_eq!(v["kind"], "PyTorchJob");
    let mut errors = Vec::new();
    check(&crd_schema(), &v, "", &mut errors);
    assert!(errors.is_empty(), "{errors:#?}");
    // A number where the CRD wants a string is caught by the check (it can fail).
    let mut bad = v.clone();
    bad["spec"]["nprocPerNode"] = json!(8);
    let mut errors = Vec::new();
    check(&crd_schema(), &bad, "", &mut errors);
    assert_eq!(errors.len(), 1, "{errors:?}");
}
