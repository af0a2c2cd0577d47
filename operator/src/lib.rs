//! The Primus operator: a TrainingPlan becomes (optionally) single-node benchmark pods, a
//! projection and a tuned layout, a PyTorchJob with that layout, and a drift measurement once
//! the job reports its throughput. Everything it decided is written to the plan's status
//! (server-side apply under the field manager `primus-operator`); it never writes the spec.
//!
//! One reconcile pass ([`reconcile::reconcile`]) runs validate -> benchmark -> project/tune ->
//! job -> drift and is idempotent: deterministic object names, server-side apply of identical
//! content, and the tuning result cached in the status for the generation it describes.
//!
//! Each step observes, decides and applies: [`benchmark`] and [`job`] each have `observe`
//! (reads), `decide` (pure) and `apply` (writes); [`decide`] says what every outcome means to
//! the status (conditions with typed [`reason::Reason`]s, the phase, when to look again);
//! [`status`] writes it.

pub mod benchmark;
pub mod choose;
pub mod conditions;
pub mod context;
pub mod controller;
pub mod decide;
pub mod decoded;
pub mod drift;
pub mod error;
pub mod fence;
pub mod http;
pub mod job;
pub mod kubeapi;
pub mod leader;
pub mod metrics;
pub mod reason;
pub mod reconcile;
pub mod report_key;
pub mod status;
#[cfg(test)]
mod testing;

pub use context::{Config, Context};
pub use error::Error;

/// Name of this controller in Events and logs (and its field manager).
pub const CONTROLLER: &str = primus_crds::annotations::OPERATOR_MANAGER;

/// Install rustls' ring provider once (the project's single TLS stack).
pub use primus_runtime::tls::install_ring_provider as install_crypto_provider;
