//! A typed kubeflow.org/v1 `PyTorchJob`: the subset of the Kubeflow training operator's API
//! (`pkg/apis/kubeflow.org/v1`: PyTorchJobSpec, ReplicaSpec, RunPolicy, ElasticPolicy,
//! JobStatus) that Primus Projection writes and reads, and the job writer built on it.
//!
//! Kubeflow ships no Rust types, so these are written by hand after its Go types and the
//! vendored CRD (`crds/thirdparty/kubeflow.org_pytorchjobs.yaml`, which a test checks them
//! against). Pod templates are k8s-openapi's [`PodTemplateSpec`]; every struct defined here
//! keeps the fields it does not name in an `extra` map, so reading a job and writing it back
//! loses nothing outside the pod templates (there, fields Kubernetes 1.33 does not know are
//! dropped, as an API server prunes a Pod's).
//!
//! - [`types`]: the API types and what the operator and the webhook read from them;
//! - [`writer`]: a chosen layout as a complete job ([`pytorchjob`]), used by the operator and
//!   by `primus tune --emit pytorchjob`;
//! - [`template`]: the plan's `spec.job.template`, parsed and cleaned;
//! - [`args`]: the Megatron flags written into the container's command line.
//!
//! [`PodTemplateSpec`]: k8s_openapi::api::core::v1::PodTemplateSpec

pub mod args;
pub mod template;
pub mod types;
pub mod writer;

pub use types::{
    ElasticPolicy, JobCondition, PyTorchJob, PyTorchJobSpec, PyTorchJobStatus, ReplicaSpec,
    ReplicaStatus, RunPolicy, SchedulingPolicy,
};
pub use writer::{JobOptions, pytorchjob};

use primus_oracle::FieldError;
use serde_json::Value;

/// API group of the Kubeflow training operator.
pub const GROUP: &str = "kubeflow.org";
/// API version of PyTorchJob.
pub const VERSION: &str = "v1";
/// `group/version` of PyTorchJob (the `apiVersion` field).
pub const API_VERSION: &str = "kubeflow.org/v1";
/// Kind.
pub const KIND: &str = "PyTorchJob";
/// Resource name (URL path segment).
pub const PLURAL: &str = "pytorchjobs";
/// Name of the training container in every replica (the Kubeflow training operator's
/// convention for PyTorchJob).
pub const CONTAINER: &str = "pytorch";
/// The replica type that runs rank 0.
pub const MASTER: &str = "Master";
/// The replica type of the other nodes.
pub const WORKER: &str = "Worker";
/// Restart policy of replicas whose template sets none.
pub const DEFAULT_RESTART_POLICY: &str = "OnFailure";

/// Read `value` as `T` (a job, its spec, its metadata), nulls as absent (as the API server
/// prunes them); errors name the field under `at`.
pub fn from_json_at<T: serde::de::DeserializeOwned>(
    value: &Value,
    at: &str,
) -> Result<T, FieldError> {
    let mut v = value.clone();
    strip_nulls(&mut v);
    primus_oracle::parse::from_value_at(v, at)
}

/// Remove null-valued keys at every depth: absent and null mean the same here.
fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}
