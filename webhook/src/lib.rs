//! Primus Projection's validating admission webhook: PyTorchJobs whose parallel layout the
//! oracle's memory model predicts will run out of GPU memory are denied at `kubectl apply`
//! time, with the predicted and usable GiB per stage and the nearest layouts that fit;
//! TrainingPlans get the semantic checks their CRD schema cannot express.
//!
//! The library is synchronous and pure up to [`server`]: [`admission::handle`] turns the bytes
//! of an AdmissionReview into the bytes of the answer, so tests and the fuzzer call it without
//! a network.

pub mod admission;
pub mod ca_secret;
pub mod client;
pub mod gpu;
pub mod metrics;
pub mod pki;
pub mod primus;
pub mod pytorchjob;
pub mod rotation;
pub mod server;
pub mod suggest;
pub mod tls;
pub mod trainingplan;
pub mod trainjob;
pub mod validate;

pub use admission::{Endpoint, Reply, handle};
pub use validate::{Reason, Settings, Validator, Verdict};

/// Paths of the admission endpoints (what a ValidatingWebhookConfiguration's
/// `clientConfig.service.path` or `clientConfig.url` names).
pub mod paths {
    /// PyTorchJob CREATE/UPDATE: underivable jobs are allowed with a warning (unless the
    /// server runs with `--strict`).
    pub const PYTORCHJOB: &str = "/validate/pytorchjob";
    /// The same in strict mode: underivable jobs are denied. The chart routes namespaces
    /// labelled `primus.dev/admission=strict` here, so the server reads no namespaces.
    pub const PYTORCHJOB_STRICT: &str = "/validate/pytorchjob/strict";
    /// TrainingPlan CREATE/UPDATE.
    pub const TRAININGPLAN: &str = "/validate/trainingplan";
    /// Liveness.
    pub const HEALTHZ: &str = "/healthz";
    /// Readiness: certificate loaded (and, in self-signed mode, caBundle patched).
    pub const READYZ: &str = "/readyz";
    /// Prometheus text exposition.
    pub const METRICS: &str = "/metrics";
}
