//! Shared by the writer tests: a vendored CRD's schema, a sample of every field it declares,
//! the structural check the API server applies to an object, and the scenario and layout the
//! writers are tried with.

#![allow(dead_code)]

use primus_oracle::layout::{Layout, Recompute, Schedule};
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};
use serde_json::{Map, Value, json};

/// Llama 3.1 70B on `gpus` GPUs of profile `gpu`, seq 8192, global batch 128, BF16.
pub fn scenario(gpu: &str, gpus: u32) -> Scenario {
    let c = Catalog::builtin().unwrap();
    let hardware = c.hardware(gpu).unwrap().clone();
    Scenario {
        model: c.model("llama3.1-70b").unwrap().clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node: hardware.gpus_per_node,
        },
        hardware,
        training: Training {
            seq_length: 8192,
            global_batch_size: 128,
            precision: Precision::Bf16,
        },
    }
}

/// TP4 PP4 VPP5, micro-batch 2, full recompute of 3 layers, interleaved.
pub fn layout() -> Layout {
    Layout {
        tp: 4,
        pp: 4,
        vpp: 5,
        micro_batch_size: 2,
        recompute: Recompute::Full,
        recompute_layers: 3,
        schedule: Schedule::Interleaved,
        ..Layout::default()
    }
}

/// A value of every property `schema` declares, `depth` levels deep at most (deeper objects
/// are empty), as the CRD allows it (an enum's first value).
pub fn sample(schema: &Value, depth: usize) -> Value {
    if depth == 0 {
        return json!({});
    }
    if let Some(props) = schema["properties"].as_object() {
        let m: Map<String, Value> = props
            .iter()
            .map(|(k, s)| (k.clone(), sample(s, depth - 1)))
            .collect();
        return Value::Object(m);
    }
    if let Some(first) = schema["enum"].as_array().and_then(|e| e.first()) {
        return first.clone();
    }
    match schema["type"].as_str() {
        Some("integer") => json!(1),
        Some("boolean") => json!(true),
        Some("string") => json!("8"),
        Some("array") => json!([]),
        _ => json!({}),
    }
}

/// The `openAPIV3Schema` of the vendored CRD `crds/thirdparty/{file}`.
pub fn crd_schema(file: &str) -> Value {
    let path = format!("{}/thirdparty/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let crd: Value = serde_saphyr::from_str(&text).expect("CRD YAML parses");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// The schema errors of `v` (empty when the API server would take it).
pub fn schema_errors(schema: &Value, v: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    validate(schema, v, "", &mut errors);
    errors
}

/// A small structural-schema check, as the API server applies it: types, enums, required keys,
/// minimums, and no unknown fields where the schema does not preserve them.
fn validate(schema: &Value, v: &Value, path: &str, errors: &mut Vec<String>) {
    if path == ".metadata" {
        // The API server validates the root metadata as ObjectMeta itself.
        return;
    }
    if schema["x-kubernetes-preserve-unknown-fields"] == json!(true)
        && schema.get("properties").is_none()
    {
        if !v.is_object() && schema["type"] == json!("object") {
            errors.push(format!("{path}: expected object"));
        }
        return;
    }
    let ty = schema["type"].as_str().unwrap_or("");
    let ok = match ty {
        "object" => v.is_object(),
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "number" => v.is_number(),
        _ => true,
    };
    if !ok {
        errors.push(format!("{path}: expected {ty}, got {v}"));
        return;
    }
    if let Some(e) = schema["enum"].as_array()
        && !e.contains(v)
    {
        errors.push(format!("{path}: {v} not in {e:?}"));
    }
    if let (Some(min), Some(n)) = (schema["minimum"].as_i64(), v.as_i64())
        && n < min
    {
        errors.push(format!("{path}: {n} < {min}"));
    }
    if let (Some(items), Some(list)) = (schema.get("items"), v.as_array()) {
        for (i, x) in list.iter().enumerate() {
            validate(items, x, &format!("{path}[{i}]"), errors);
        }
    }
    if let Some(obj) = v.as_object() {
        for r in schema["required"].as_array().into_iter().flatten() {
            if !obj.contains_key(r.as_str().unwrap()) {
                errors.push(format!("{path}: missing required {r}"));
            }
        }
        for (k, child) in obj {
            let p = format!("{path}.{k}");
            if let Some(s) = schema["properties"].get(k) {
                validate(s, child, &p, errors);
            } else if let Some(s) = schema.get("additionalProperties").filter(|s| s.is_object()) {
                validate(s, child, &p, errors);
            } else if schema["x-kubernetes-preserve-unknown-fields"] != json!(true) {
                errors.push(format!("{p}: unknown field"));
            }
        }
    }
}
