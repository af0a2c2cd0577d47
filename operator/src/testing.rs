//! Fixtures of the unit tests: plans as the API server would hand them to a pass.

use primus_crds::{TrainingPlan, TrainingPlanSpec};
use primus_oracle::plan::Plan;
use primus_oracle::profiles::Catalog;
use serde_json::{Value, json};

/// A plan `team/p` (uid `uid-1`, generation 1): Llama 3.1 8B on 16 H100, with `extra` merged
/// into its spec; and the oracle's view of it.
pub fn plan_with(extra: Value) -> (TrainingPlan, Plan) {
    let mut spec = json!({
        "model": {"preset": "llama3.1-8b"},
        "cluster": {"gpu": "h100-sxm", "gpus": 16},
        "training": {"seqLength": 4096, "globalBatchSize": 64},
    });
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    let spec: TrainingPlanSpec = serde_json::from_value(spec).unwrap();
    let mut obj = TrainingPlan::new("p", spec);
    obj.metadata.namespace = Some("team".into());
    obj.metadata.uid = Some("uid-1".into());
    obj.metadata.generation = Some(1);
    let plan = crate::choose::validate(&obj.spec, "p", &Catalog::builtin().unwrap()).unwrap();
    (obj, plan)
}

/// [`plan_with`] a simulated benchmark (timeout 120 s, a pod security context).
pub fn bench_plan() -> (TrainingPlan, Plan) {
    plan_with(json!({
        "benchmark": {"enabled": true, "backend": "simulate", "timeoutSeconds": 120,
                      "securityContext": {"supplementalGroups": [44, 109]}},
    }))
}
