//! Objects decoded one by one. The API server accepts whatever the CRD's schema allows, and the
//! Rust types are stricter (a `pipelineLayout` that does not parse, a number that does not fit
//! a `u32`). Decoded as a list, one such object would fail the whole list, and with it every
//! plan of every namespace at each relist. [`Decoded`] decodes each object on its own: a good
//! one as its type, a bad one as its metadata and a [`FieldError`] naming the field (the path
//! serde reached), so the controller keeps reconciling the others and tells the bad one why.

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use primus_crds::{TrainingPlan, TrainingPlanStatus};
use primus_oracle::FieldError;
use primus_oracle::parse::from_value_at;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// An object of type `K` as the API server sent it: decoded, or why not.
#[derive(Debug, Clone)]
pub struct Decoded<K> {
    pub metadata: ObjectMeta,
    pub object: Result<K, Undecodable>,
}

/// An object the Rust type cannot read: the field and what is wrong with it, and the object
/// as sent (to read what can still be read, e.g. the status a bad spec sits beside).
#[derive(Debug, Clone)]
pub struct Undecodable {
    pub error: FieldError,
    pub raw: Value,
}

impl<K: DeserializeOwned> Decoded<K> {
    /// Decode `value` (an object with at least valid metadata).
    pub fn from_value(value: Value) -> Result<Decoded<K>, FieldError> {
        let metadata: ObjectMeta = from_value_at(
            value.get("metadata").cloned().unwrap_or(Value::Null),
            "metadata",
        )?;
        let object = from_value_at::<K>(value.clone(), "")
            .map_err(|error| Undecodable { error, raw: value });
        Ok(Decoded { metadata, object })
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Decoded<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Only metadata that does not decode fails here (the API server always sends valid
        // metadata); anything else is kept as an Undecodable.
        Decoded::from_value(Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Decoded<K> {
    type DynamicType = ();
    type Scope = K::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A TrainingPlan as the controller watches it.
pub type PlanObject = Decoded<TrainingPlan>;

impl Undecodable {
    /// As much of the status as can be read beside a bad spec: all of it, else its conditions
    /// (so the pass that reports the error keeps their transition times), else nothing.
    pub fn status(&self) -> TrainingPlanStatus {
        let status = self.raw.get("status").cloned().unwrap_or(Value::Null);
        if let Ok(s) = serde_json::from_value::<TrainingPlanStatus>(status.clone()) {
            return s;
        }
        let conditions = status.get("conditions").cloned().unwrap_or(Value::Null);
        TrainingPlanStatus {
            conditions: serde_json::from_value(conditions).unwrap_or_default(),
            ..TrainingPlanStatus::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(spec: Value, status: Value) -> Value {
        json!({
            "apiVersion": "primus.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": "p", "namespace": "team", "uid": "u1", "generation": 2},
            "spec": spec, "status": status,
        })
    }

    fn good_spec() -> Value {
        json!({"model": {"preset": "llama3.1-8b"}, "cluster": {"gpu": "h100-sxm", "gpus": 8},
               "training": {"seqLength": 4096, "globalBatchSize": 64}})
    }

    #[test]
    fn a_list_with_one_bad_plan_decodes_the_others() {
        let mut bad = good_spec();
        bad["parallelism"] = json!({"tp": 4294967296u64});
        let mut layout = good_spec();
        layout["parallelism"] = json!({"microBatchSize": "two"});
        let list = json!([
            plan(good_spec(), json!({})),
            plan(bad, json!({})),
            plan(layout, json!({}))
        ]);
        let items: Vec<PlanObject> = serde_json::from_value(list).expect("the list decodes");
        assert!(items[0].object.is_ok());
        let e = &items[1].object.as_ref().unwrap_err().error;
        assert_eq!(e.field, "spec.parallelism.tp");
        assert!(e.message.contains("4294967296"), "{e}");
        let e = &items[2].object.as_ref().unwrap_err().error;
        assert_eq!(e.field, "spec.parallelism.microBatchSize");
        // Metadata is there for every item, so the controller can name and address it.
        assert!(items.iter().all(|i| i.meta().name.as_deref() == Some("p")));
        assert_eq!(items[1].meta().generation, Some(2));
    }

    #[test]
    fn the_status_beside_a_bad_spec_is_read_as_far_as_it_goes() {
        let conditions = json!([{"type": "Ready", "status": "False", "reason": "InvalidSpec",
            "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]);
        let mut bad = good_spec();
        bad["cluster"]["gpus"] = json!("eight");
        let o: PlanObject = serde_json::from_value(plan(
            bad.clone(),
            json!({"phase": "Stalled", "conditions": conditions}),
        ))
        .unwrap();
        let s = o.object.unwrap_err().status();
        assert_eq!(s.phase, Some(primus_crds::Phase::Stalled));
        assert_eq!(s.conditions.len(), 1);
        // A status that itself does not decode still gives its conditions.
        let o: PlanObject = serde_json::from_value(plan(
            bad,
            json!({"phase": "Sideways", "conditions": conditions}),
        ))
        .unwrap();
        let s = o.object.unwrap_err().status();
        assert_eq!((s.phase, s.conditions.len()), (None, 1));
    }

    #[test]
    fn bad_metadata_fails_the_object() {
        let v = json!({"metadata": {"name": 3}, "spec": good_spec()});
        assert!(serde_json::from_value::<PlanObject>(v).is_err());
    }
}
