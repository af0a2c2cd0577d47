//! Primus Projection's oracle: a pure library (no Kubernetes, no async runtime, no network)
//! that projects, for one parallel layout of a Megatron-style training job, the per-GPU memory
//! of every pipeline stage and the step time, tokens/s/GPU, TFLOP/s/GPU and MFU at full scale.
//!
//! Inputs are plain data: a [`scenario::Scenario`] (a [`model::ModelCard`], a
//! [`hardware::HardwareProfile`], a [`scenario::Cluster`] and the [`scenario::Training`]
//! settings) and a [`layout::Layout`]. The [`plan`] module parses the same TrainingPlan YAML
//! that `kubectl apply` sends into them.
//!
//! The top-level modules depend on each other without cycles (`tests/module_graph.rs` checks
//! it): `error`, `units`, `precision` and `backend` are leaves; `bounds` (the limits of every
//! input field) sits on `error`; `parse`, `model` and `hardware` sit on them; `scenario` on
//! those; then `layout`, `profiles`, `plan`, the models (`collectives`,
//! `compute`, `memory`, `schedule`, `projection`), `report` and, on top, `bench`,
//! `calibrate`, `megatron` (and `primus`, its Primus keys, command lines and presets),
//! `validate` and `tune`.
//!
//! Everything that touches the outside world lives in the crates around it: the `primus`
//! command line (`primus-cli`), the GPU benchmark backends (`primus-bench`), the Kubernetes
//! types (`primus-crds`), the operator and the webhook. They depend on this crate, never the
//! reverse; `tests/tests/oracle_deps.rs` keeps its dependency list pure.

#![forbid(unsafe_code)]

pub mod backend;
pub mod bench;
pub mod bounds;
pub mod calibrate;
pub mod collectives;
pub mod compute;
pub mod error;
pub mod hardware;
pub mod layout;
pub mod megatron;
pub mod memory;
pub mod model;
pub mod parse;
pub mod plan;
pub mod precision;
pub mod primus;
pub mod profiles;
pub mod projection;
pub mod report;
pub mod scenario;
pub mod schedule;
pub mod tune;
pub mod units;
pub mod validate;

pub use error::{FieldError, PlanError};
