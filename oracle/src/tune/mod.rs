//! The tuner: every legal layout of a plan, pre-filtered by memory, scored by the projection,
//! and the best handed back as a PyTorchJob.

pub mod job;
