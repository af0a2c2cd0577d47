//! The plan's `spec.job.template`: a whole PyTorchJob or just its `spec`, parsed into the typed
//! job with errors that name the template field, and cleaned of what must not be copied onto
//! a new object (fields the API server owns, a GitOps tool's tracking labels).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use primus_oracle::FieldError;
use serde_json::Value;

use super::from_json_at;
use super::types::PyTorchJobSpec;

/// Where the template sits in a TrainingPlan.
pub const AT: &str = "spec.job.template";

/// A parsed template.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Template {
    /// The job's metadata (empty for a spec-only template).
    pub metadata: ObjectMeta,
    pub spec: PyTorchJobSpec,
    /// Where the spec sits, for messages: `spec.job.template` or `spec.job.template.spec`.
    pub spec_at: String,
    /// Whether the template gave a pod template for any replica (then its `pytorch`
    /// container must name an image; else the writer's default container is used).
    pub from_user: bool,
}

/// Parse a template: a whole PyTorchJob (with `spec`) or just its spec.
pub fn parse(template: Option<&Value>) -> Result<Template, FieldError> {
    let Some(t) = template else {
        return Ok(Template {
            spec_at: AT.to_string(),
            ..Template::default()
        });
    };
    let Value::Object(obj) = t else {
        return Err(FieldError::new(
            AT,
            "must be a PyTorchJob or its spec (a mapping)",
        ));
    };
    for (key, want) in [("kind", super::KIND), ("apiVersion", super::API_VERSION)] {
        if let Some(v) = obj.get(key)
            && v != want
        {
            return Err(FieldError::new(
                format!("{AT}.{key}"),
                format!("expected {want}, got {v}"),
            ));
        }
    }
    let whole = obj.contains_key("spec") && !obj.contains_key("pytorchReplicaSpecs");
    let (metadata, spec, spec_at) = if whole {
        let metadata: ObjectMeta = match obj.get("metadata") {
            None | Some(Value::Null) => ObjectMeta::default(),
            Some(m @ Value::Object(_)) => from_json_at(m, &format!("{AT}.metadata"))?,
            Some(_) => {
                return Err(FieldError::new(
                    format!("{AT}.metadata"),
                    "must be a mapping",
                ));
            }
        };
        let spec_at = format!("{AT}.spec");
        let spec: PyTorchJobSpec = match obj.get("spec") {
            Some(s @ Value::Object(_)) => from_json_at(s, &spec_at)?,
            _ => return Err(FieldError::new(spec_at, "must be a mapping")),
        };
        (metadata, spec, spec_at)
    } else {
        (ObjectMeta::default(), from_json_at(t, AT)?, AT.to_string())
    };
    let from_user = spec
        .pytorch_replica_specs
        .values()
        .any(|r| r.template.is_some());
    Ok(Template {
        metadata,
        spec,
        spec_at,
        from_user,
    })
}

/// Labels and annotations that belong to a GitOps tool tracking the template's owner; copying
/// them would make Argo CD adopt (and prune) the job.
fn is_tracking_key(key: &str) -> bool {
    key == "app.kubernetes.io/instance" || key.starts_with("argocd.argoproj.io/")
}

/// Metadata fit to copy onto a new object: without the fields the API server owns (uid,
/// resourceVersion, generation, timestamps, managedFields, selfLink, ownerReferences,
/// generateName) and without tracking labels and annotations.
pub fn clean_metadata(meta: &mut ObjectMeta) {
    meta.uid = None;
    meta.resource_version = None;
    meta.generation = None;
    meta.creation_timestamp = None;
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.managed_fields = None;
    meta.self_link = None;
    meta.owner_references = None;
    meta.generate_name = None;
    for map in [&mut meta.labels, &mut meta.annotations]
        .into_iter()
        .flatten()
    {
        map.retain(|k, _| !is_tracking_key(k));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_whole_job_and_a_spec_alone_are_both_templates() {
        let whole = parse(Some(&json!({"metadata": {"labels": {"a": "b"}},
            "spec": {"runPolicy": {"cleanPodPolicy": "None"}}})))
        .unwrap();
        assert_eq!(whole.spec_at, "spec.job.template.spec");
        assert_eq!(whole.metadata.labels.unwrap()["a"], "b");
        assert!(!whole.from_user);
        let spec = parse(Some(
            &json!({"pytorchReplicaSpecs": {"Worker": {"template": {}}}}),
        ))
        .unwrap();
        assert_eq!(spec.spec_at, "spec.job.template");
        assert!(spec.from_user);
        assert_eq!(parse(None).unwrap().spec_at, "spec.job.template");
    }

    #[test]
    fn nulls_read_as_absent() {
        let t = parse(Some(
            &json!({"pytorchReplicaSpecs": null, "runPolicy": null}),
        ))
        .unwrap();
        assert!(t.spec.pytorch_replica_specs.is_empty());
        assert!(t.spec.run_policy.is_none());
    }

    #[test]
    fn server_fields_and_tracking_keys_are_dropped() {
        let mut m: ObjectMeta = serde_json::from_value(json!({
            "name": "n", "uid": "u", "resourceVersion": "1", "generation": 2,
            "labels": {"app.kubernetes.io/instance": "x", "team": "t"},
            "annotations": {"argocd.argoproj.io/tracking-id": "y"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "K", "name": "o", "uid": "u"}]
        }))
        .unwrap();
        clean_metadata(&mut m);
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"name": "n", "labels": {"team": "t"}, "annotations": {}})
        );
    }
}
