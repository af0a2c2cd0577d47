//! Writing the plan's status: server-side apply on the status subresource under the field
//! manager `primus-operator`, with every field the operator owns and never `status.measured`
//! (owned by `primus report`). Nothing is sent when the status would not change, so a re-run
//! that reaches the same verdicts makes no write at all.

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use primus_crds::TrainingPlanStatus;
use primus_crds::annotations::OPERATOR_MANAGER;

use crate::conditions::Verdicts;
use crate::error::Error;
use crate::kubeapi::{call, plan_resource};

/// The status the operator owns, from a previous status: `measured` removed.
pub fn owned_part(s: &TrainingPlanStatus) -> TrainingPlanStatus {
    TrainingPlanStatus {
        measured: None,
        ..s.clone()
    }
}

/// The new status: `draft` with the conditions merged into the previous ones (transition
/// times kept unless a status flipped).
pub fn assemble(
    previous: &TrainingPlanStatus,
    mut draft: TrainingPlanStatus,
    verdicts: &Verdicts,
    now: Timestamp,
) -> TrainingPlanStatus {
    draft.measured = None;
    draft.conditions = verdicts.merge(&previous.conditions, draft.observed_generation, now);
    draft
}

/// The apply body for a status.
pub fn apply_body(status: &TrainingPlanStatus) -> Result<serde_json::Value, Error> {
    let status = serde_json::to_value(owned_part(status)).map_err(|source| Error::Serde {
        what: "trainingplan status".into(),
        source,
    })?;
    let mut body = serde_json::json!({
        "apiVersion": format!("{}/{}", primus_crds::GROUP, primus_crds::VERSION),
        "kind": "TrainingPlan",
        "status": status,
    });
    strip_nulls(&mut body);
    Ok(body)
}

/// Remove null-valued keys (absent and null mean the same for optional fields, and a CRD
/// schema without `nullable` rejects null).
pub fn strip_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Apply `status` to plan `ns/name` unless it equals `current` (what the server has); returns
/// whether it wrote. The call goes through the dynamic API: its answer is not decoded, so the
/// status of a plan whose spec the types cannot read is written too.
pub async fn apply(
    client: &kube::Client,
    (ns, name): (&str, &str),
    current: &TrainingPlanStatus,
    status: &TrainingPlanStatus,
) -> Result<bool, Error> {
    if owned_part(current) == owned_part(status) {
        return Ok(false);
    }
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &plan_resource());
    let body = apply_body(status)?;
    // Fields the new status drops are deleted first, by a merge patch of nulls: an apply that
    // merely omits an object field it owned leaves a husk of nulls behind on some API servers
    // (1.20), which the schema then refuses, and the whole write fails.
    let dropped = dropped_fields(&apply_body(current)?, &body);
    if !dropped.is_empty() {
        let nulls: serde_json::Map<String, serde_json::Value> = dropped
            .iter()
            .map(|k| (k.clone(), serde_json::Value::Null))
            .collect();
        let patch = serde_json::json!({"status": nulls});
        let pp = PatchParams {
            field_manager: Some(OPERATOR_MANAGER.into()),
            ..PatchParams::default()
        };
        call(
            format!(
                "remove status.{} of trainingplan {ns}/{name}",
                dropped.join(", status.")
            ),
            api.patch_status(name, &pp, &Patch::Merge(&patch)),
        )
        .await?;
    }
    call(
        format!("apply status of trainingplan {ns}/{name}"),
        api.patch_status(
            name,
            &PatchParams::apply(OPERATOR_MANAGER).force(),
            &Patch::Apply(&body),
        ),
    )
    .await?;
    Ok(true)
}

/// Top-level status fields `before` has and `after` does not.
pub fn dropped_fields(before: &serde_json::Value, after: &serde_json::Value) -> Vec<String> {
    let (Some(b), Some(a)) = (before["status"].as_object(), after["status"].as_object()) else {
        return Vec::new();
    };
    b.keys().filter(|k| !a.contains_key(*k)).cloned().collect()
}

/// Write only `observedGeneration`, `phase` and `conditions` of `status` (a merge patch that
/// leaves every other field as it is), unless they equal `current`'s. For a plan the types
/// cannot read: its last good choice stays visible, and no field is dropped (dropping nested
/// fields by apply is what the full write does).
pub async fn patch_conditions(
    client: &kube::Client,
    (ns, name): (&str, &str),
    current: &TrainingPlanStatus,
    status: &TrainingPlanStatus,
) -> Result<bool, Error> {
    let head = |s: &TrainingPlanStatus| (s.observed_generation, s.phase, s.conditions.clone());
    if head(current) == head(status) {
        return Ok(false);
    }
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &plan_resource());
    let body = serde_json::json!({"status": {
        "observedGeneration": status.observed_generation,
        "phase": status.phase,
        "conditions": status.conditions,
    }});
    let pp = PatchParams {
        field_manager: Some(OPERATOR_MANAGER.into()),
        ..PatchParams::default()
    };
    call(
        format!("patch status conditions of trainingplan {ns}/{name}"),
        api.patch_status(name, &pp, &Patch::Merge(&body)),
    )
    .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::{READY, State};
    use primus_crds::MeasuredThroughput;

    #[test]
    fn the_body_never_carries_measured() {
        let s = TrainingPlanStatus {
            phase: Some(primus_crds::Phase::Ready),
            measured: Some(MeasuredThroughput {
                tokens_per_second_per_gpu: 1.0,
                reported_at: None,
                source: None,
            }),
            ..TrainingPlanStatus::default()
        };
        let body = apply_body(&s).unwrap();
        assert!(body["status"].get("measured").is_none());
        assert_eq!(body["status"]["phase"], "Ready");
        assert_eq!(body["kind"], "TrainingPlan");
        assert!(body.get("spec").is_none());
    }

    #[test]
    fn dropped_fields_are_named() {
        let before = TrainingPlanStatus {
            phase: Some(primus_crds::Phase::Ready),
            gain_over_reference: Some(0.1),
            ..TrainingPlanStatus::default()
        };
        let after = TrainingPlanStatus {
            phase: Some(primus_crds::Phase::Stalled),
            ..TrainingPlanStatus::default()
        };
        let (b, a) = (apply_body(&before).unwrap(), apply_body(&after).unwrap());
        assert_eq!(dropped_fields(&b, &a), ["gainOverReference"]);
        assert!(dropped_fields(&a, &b).is_empty());
    }

    #[test]
    fn nulls_are_stripped_at_every_depth() {
        let mut v = serde_json::json!({"a": null, "b": {"c": null, "d": [{"e": null, "f": 1}]}});
        strip_nulls(&mut v);
        assert_eq!(v, serde_json::json!({"b": {"d": [{"f": 1}]}}));
    }

    #[test]
    fn assembling_twice_gives_the_same_status() {
        let mut v = Verdicts::default();
        v.set(READY, State::True, crate::reason::Reason::Ready, "ok");
        let draft = TrainingPlanStatus {
            observed_generation: Some(3),
            phase: Some(primus_crds::Phase::Ready),
            ..TrainingPlanStatus::default()
        };
        let t1 = Timestamp::from_second(10).unwrap();
        let t2 = Timestamp::from_second(20).unwrap();
        let first = assemble(&TrainingPlanStatus::default(), draft.clone(), &v, t1);
        let second = assemble(&first, draft, &v, t2);
        assert_eq!(owned_part(&first), owned_part(&second));
    }
}
