//! Derive what the memory model needs from a Kubeflow Trainer v2 TrainJob
//! (trainer.kubeflow.org/v1alpha1), as [`crate::pytorchjob`] does from a PyTorchJob.
//!
//! A TrainJob says what its nodes run in `spec.trainer`: image, command, args and env (the
//! Megatron flags or Primus overrides), `numNodes`, `numProcPerNode` and `resourcesPerNode`.
//! Its pod templates live in the training runtime it names, which the webhook does not read:
//! the GPU kind comes from the `primus.dev/gpu` annotation (the operator writes it) or from the
//! GPU resource name (vendor only, with a note). The trainer is read as the `pytorch`
//! container of a one-replica-type PyTorchJob with `numNodes` replicas and `numProcPerNode`
//! processes each (absent: one per GPU of `resourcesPerNode`, as Trainer's torch runtime does
//! with `auto`), so both kinds go through one derivation; messages name the TrainJob's fields.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use primus_crds::pytorchjob::{CONTAINER, PyTorchJobSpec, ReplicaSpec, WORKER, from_json_at};
use primus_crds::trainjob::TrainJobSpec;
use primus_oracle::FieldError;
use primus_oracle::profiles::Catalog;
use serde_json::Value;

use crate::pytorchjob::{DeriveError, DerivedJob, derive_spec};

/// The fields of the PyTorchJob view and where the TrainJob says them, longest first.
const RENAMES: &[(&str, &str)] = &[
    (
        "spec.pytorchReplicaSpecs.Worker.replicas",
        "spec.trainer.numNodes",
    ),
    ("spec.pytorchReplicaSpecs", "spec.trainer.numNodes"),
    ("spec.nprocPerNode", "spec.trainer.numProcPerNode"),
    (
        "containers[pytorch].resources.",
        "spec.trainer.resourcesPerNode.",
    ),
    ("GPUs per Worker replica", "GPUs per node"),
    (
        "the pytorch container has no GPU limit",
        "spec.trainer.resourcesPerNode has no GPU limit",
    ),
    (
        "no container named pytorch in its pod template",
        "spec.trainer is missing",
    ),
    ("replicas x nprocPerNode", "numNodes x numProcPerNode"),
    ("nprocPerNode", "numProcPerNode"),
];

/// A message of the PyTorchJob view in the TrainJob's words.
fn rename(text: &str) -> String {
    RENAMES
        .iter()
        .fold(text.to_string(), |t, (from, to)| t.replace(from, to))
}

fn renamed(e: DeriveError) -> DeriveError {
    match e {
        DeriveError::Missing(lines) => {
            DeriveError::Missing(lines.iter().map(|l| rename(l)).collect())
        }
        DeriveError::Invalid(f) => {
            DeriveError::Invalid(FieldError::new(rename(&f.field), rename(&f.message)))
        }
    }
}

/// The PyTorchJob spec that runs what the TrainJob's trainer runs.
fn as_pytorchjob(spec: &TrainJobSpec) -> Result<PyTorchJobSpec, DeriveError> {
    let Some(t) = &spec.trainer else {
        return Err(DeriveError::Missing(vec![
            "spec.trainer is missing: the job's command line and GPUs are in its runtime, out of the webhook's sight; give spec.trainer (image, args with the Megatron flags, numNodes, resourcesPerNode) or the primus.dev annotations".into(),
        ]));
    };
    let container = Container {
        name: CONTAINER.to_string(),
        image: t.image.clone(),
        command: t.command.clone(),
        args: t.args.clone(),
        env: t.env.clone(),
        resources: t.resources_per_node.clone(),
        ..Container::default()
    };
    let replica = ReplicaSpec {
        replicas: Some(t.num_nodes.unwrap_or(1)),
        template: Some(PodTemplateSpec {
            metadata: None,
            spec: Some(PodSpec {
                containers: vec![container],
                ..PodSpec::default()
            }),
        }),
        ..ReplicaSpec::default()
    };
    Ok(PyTorchJobSpec {
        pytorch_replica_specs: BTreeMap::from([(WORKER.to_string(), replica)]),
        nproc_per_node: t.num_proc_per_node.map(IntOrString::Int),
        ..PyTorchJobSpec::default()
    })
}

/// Derive the scenario and layout of a TrainJob (`data` is the object without metadata;
/// `annotations` its metadata annotations).
pub fn derive(
    data: &Value,
    annotations: &BTreeMap<String, String>,
    catalog: &Catalog,
) -> Result<DerivedJob, DeriveError> {
    let Some(spec) = data.get("spec").filter(|s| s.is_object()) else {
        return Err(DeriveError::Missing(vec!["the job has no spec".into()]));
    };
    let spec: TrainJobSpec = from_json_at(spec, "spec").map_err(DeriveError::Invalid)?;
    let view = as_pytorchjob(&spec)?;
    derive_spec(&view, annotations, catalog).map_err(renamed)
}

/// Whether an UPDATE changes nothing the memory check reads: the spec is the same but for
/// `suspend` (Kueue and the review flow flip it).
pub fn unchanged_but_suspend(old: &Value, new: &Value) -> bool {
    let strip = |v: Option<&Value>| {
        let mut s = v.cloned().unwrap_or(Value::Null);
        if let Some(m) = s.as_object_mut() {
            m.remove("suspend");
        }
        s
    };
    strip(old.get("spec")) == strip(new.get("spec"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_trainjob_is_read_as_its_trainer_on_num_nodes() {
        let catalog = Catalog::builtin().unwrap();
        let data = json!({"spec": {"runtimeRef": {"name": "torch-distributed"},
            "trainer": {"image": "i", "numNodes": 2, "numProcPerNode": 8,
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "8"}},
                "args": ["--num-layers", "32", "--hidden-size", "4096", "--ffn-hidden-size",
                    "14336", "--num-attention-heads", "32", "--num-query-groups", "8",
                    "--padded-vocab-size", "128256", "--seq-length", "4096",
                    "--micro-batch-size", "1", "--global-batch-size", "64",
                    "--tensor-model-parallel-size", "2", "--bf16"]}}});
        let ann = BTreeMap::from([("primus.dev/gpu".to_string(), "h100-sxm".to_string())]);
        let job = derive(&data, &ann, &catalog).unwrap();
        assert_eq!(job.scenario.cluster.gpus, 16);
        assert_eq!(job.scenario.cluster.gpus_per_node, 8);
        assert_eq!(job.layout.tp, 2);
        assert_eq!(job.scenario.hardware.name, "h100-sxm");
    }

    #[test]
    fn what_is_missing_is_named_in_the_trainjobs_words() {
        let catalog = Catalog::builtin().unwrap();
        let none = BTreeMap::new();
        let Err(DeriveError::Missing(lines)) = derive(
            &json!({"spec": {"runtimeRef": {"name": "r"}}}),
            &none,
            &catalog,
        ) else {
            panic!("a TrainJob without a trainer cannot be derived")
        };
        assert!(lines[0].starts_with("spec.trainer is missing"), "{lines:?}");
        let data = json!({"spec": {"trainer": {"image": "i", "numNodes": 2,
            "args": ["--tensor-model-parallel-size", "2"]}}});
        let Err(DeriveError::Missing(lines)) = derive(&data, &none, &catalog) else {
            panic!("no GPUs, no model: cannot be derived")
        };
        let text = lines.join("; ");
        assert!(
            text.contains("spec.trainer.resourcesPerNode has no GPU limit"),
            "{text}"
        );
        assert!(!text.contains("pytorch"), "{text}");
        let data = json!({"spec": {"trainer": {"numProcPerNode": -1, "image": "i"}}});
        let Err(DeriveError::Invalid(e)) = derive(&data, &none, &catalog) else {
            panic!("a negative process count is invalid")
        };
        assert_eq!(e.field, "spec.trainer.numProcPerNode", "{e}");
    }

    #[test]
    fn only_suspend_flips_are_unchanged() {
        let old = json!({"spec": {"suspend": true, "trainer": {"numNodes": 2}}});
        let mut new = old.clone();
        new["spec"]["suspend"] = json!(false);
        assert!(unchanged_but_suspend(&old, &new));
        new["spec"]["trainer"]["numNodes"] = json!(4);
        assert!(!unchanged_but_suspend(&old, &new));
    }
}
