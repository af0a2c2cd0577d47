//! TrainJobs (Kubeflow Trainer v2) through the admission handler, as the API server sends them
//! to `/validate/trainjob`: the OOM example (webhook/examples/oom-trainjob.yaml, the same job as
//! oom-pytorchjob.yaml) is denied with the same numbers as its PyTorchJob twin; the same
//! trainer with a layout that fits is admitted; a TrainJob the webhook cannot read is admitted
//! with a warning, denied on the strict path; a TrainJob sent to the PyTorchJob path is a 400.
//! The same through a real API server is in e2e.rs.

mod common;

use common::*;
use primus_webhook::admission::Endpoint;
use serde_json::json;

const TRAINJOB: Endpoint = Endpoint::TrainJob { strict: false };
const TRAINJOB_STRICT: Endpoint = Endpoint::TrainJob { strict: true };

/// The OOM example with its layout flags replaced.
fn with_layout(tp: u32, pp: u32) -> serde_json::Value {
    let mut job = example("oom-trainjob");
    for a in job["spec"]["trainer"]["args"].as_array_mut().unwrap() {
        match a.as_str().unwrap() {
            "--tensor-model-parallel-size=1" => {
                *a = json!(format!("--tensor-model-parallel-size={tp}"))
            }
            "--pipeline-model-parallel-size=1" => {
                *a = json!(format!("--pipeline-model-parallel-size={pp}"))
            }
            _ => {}
        }
    }
    job
}

#[test]
fn the_oom_trainjob_is_denied_like_its_pytorchjob_twin() {
    let v = validator();
    let (status, a) = answer(&v, TRAINJOB, &review(&example("oom-trainjob"), None, false));
    assert_eq!(status, 200);
    assert!(!allowed(&a));
    let m = message(&a);
    assert!(m.starts_with("predicted "), "{m}");
    assert!(m.contains(" GiB usable on MI300X (weights "), "{m}");
    // The same job as a PyTorchJob: the same prediction.
    let (_, twin) = answer(
        &v,
        PYTORCHJOB,
        &review(&example("oom-pytorchjob"), None, false),
    );
    let predicted = |m: &str| m.split(" GiB").next().unwrap().to_string();
    assert_eq!(
        predicted(&m),
        predicted(&message(&twin)),
        "{m}\n{}",
        message(&twin)
    );
}

#[test]
fn a_fitting_trainjob_is_admitted() {
    let v = validator();
    let (status, a) = answer(&v, TRAINJOB, &review(&with_layout(8, 4), None, false));
    assert_eq!(status, 200);
    assert!(allowed(&a), "{a}");
}

#[test]
fn an_unreadable_trainjob_warns_and_strict_denies() {
    let mut job = example("oom-trainjob");
    job["spec"]["trainer"]["resourcesPerNode"] = json!({});
    job["spec"]["trainer"]
        .as_object_mut()
        .unwrap()
        .remove("numProcPerNode");
    let v = validator();
    let (_, a) = answer(&v, TRAINJOB, &review(&job, None, false));
    assert!(allowed(&a));
    let w = warnings(&a).join("\n");
    assert!(
        w.contains("spec.trainer.resourcesPerNode has no GPU limit"),
        "{w}"
    );
    let (_, a) = answer(&v, TRAINJOB_STRICT, &review(&job, None, false));
    assert!(!allowed(&a));
    assert!(message(&a).contains("GPUs per node"), "{}", message(&a));
}

#[test]
fn a_suspend_flip_is_not_projected_again_and_kinds_do_not_mix() {
    let v = validator();
    let old = example("oom-trainjob");
    let mut new = old.clone();
    new["spec"]["suspend"] = json!(true);
    let (_, a) = answer(&v, TRAINJOB, &review(&new, Some(&old), false));
    assert!(
        allowed(&a),
        "a suspend flip of a job that exists is not re-judged: {a}"
    );
    let (status, _) = answer(&v, PYTORCHJOB, &review(&old, None, false));
    assert_eq!(status, 400, "a TrainJob on the PyTorchJob path");
}
