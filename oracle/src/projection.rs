//! The step-time projection: per-layer compute ([`crate::compute`]), the communication each
//! layer exposes (TP/SP, CP, EP, FSDP; [`crate::collectives`]), the pipeline schedule
//! ([`crate::schedule`]) with point-to-point messages between stages, the data-parallel
//! gradient reduction and parameter gather overlapped with the backward and forward passes, the
//! optimizer step and per-iteration overheads. Output: step time, tokens/s/GPU, model
//! TFLOP/s/GPU, MFU, the breakdown of the step (DESIGN.md section 4) and the memory report.
//!
//! Costs are computed once per kind of decoder layer (dense/MoE, full/sliding attention;
//! `layer.rs`) and summed per virtual stage in O(1) per stage; the schedule simulation is
//! O(pp x m x vpp) with a cached pass order; scratch buffers are reused per thread, so a
//! projection allocates only what the memory report returns. `model.rs` runs the time model's
//! steps: stage costs, pipeline, data-parallel tail, breakdown.

use std::cell::RefCell;

use serde::Serialize;

use crate::compute::{AnalyticTimer, OpTimer};
use crate::layout::{Layout, LayoutError};
use crate::memory::{self, MemoryReport};
use crate::scenario::Scenario;
use crate::schedule::{Event, Simulator};

mod layer;
mod model;

pub use layer::Parts;
use model::{GpuParams, time_model};

/// Bytes of one gradient element in the data-parallel reduction: FP32 with Megatron-LM's
/// `--bf16` default, BF16 with `--grad-reduce-in-bf16` (the memory model's gradient buffer:
/// one source for both).
pub fn grad_bytes(l: &crate::layout::Layout) -> f64 {
    crate::memory::state_bytes(l, false).grad
}
/// Bytes of one parameter in the distributed optimizer's all-gather (BF16 model weights).
pub const PARAM_BYTES: f64 = 2.0;
/// HBM traffic of one Adam step per parameter of the local shard: read FP32 master weight,
/// gradient, first and second moments (4 x 4), write weight and moments (3 x 4), write the
/// BF16 model copy (2), read the gradient once more for the norm/clipping (4): 34 bytes.
pub const ADAM_BYTES_PER_PARAM: f64 = 34.0;
/// Parameters per second one rank's host-side Adam updates under optimizer CPU offload
/// (Megatron-Core `HybridDeviceOptimizer` with `torch.optim.AdamW(fused=True)` on the CPU,
/// FP32 master weights and moments). From the one public measurement that isolates it,
/// NVIDIA-NeMo/RL pull request 3628 (Qwen3-0.6B, ~0.6e9 parameters, on one H100: 100%
/// offload adds 0.93 s per step, of which the copies take ~0.07 s at the host link's rate):
/// ~0.7e9 per second. Not fitted to any row here; with eight ranks sharing a host's cores and
/// memory bandwidth a rank may get less.
pub const CPU_ADAM_PARAMS_PER_SECOND: f64 = 0.7e9;
/// Kernels of one optimizer step (multi-tensor apply chunks, norm, clip, copies).
pub const OPTIMIZER_KERNELS: f64 = 20.0;
/// Parameters per data-parallel bucket: Megatron-Core DDP's default
/// `bucket_size = max(40_000_000, 1_000_000 * dp)`.
pub const BUCKET_PARAMS: f64 = 40_000_000.0;
/// FP32 scalars per token the vocab-parallel cross-entropy all-reduces over TP (max logit,
/// sum of exponentials, target logit).
pub const LOSS_ALLREDUCE_SCALARS: f64 = 3.0;

/// Exposed seconds of one step, by cause; they sum to the step time (DESIGN.md section 4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Breakdown {
    /// Forward, backward and recompute kernels of the critical pipeline rank.
    pub compute: f64,
    /// Tensor/sequence-parallel collectives on the critical path.
    pub tp_comm: f64,
    /// Context-parallel KV exchange not hidden behind attention.
    pub cp_comm: f64,
    /// Expert-parallel dispatch/combine all-to-all (and the dispatcher's host sync).
    pub ep_comm: f64,
    /// Pipeline point-to-point messages the schedule waits for.
    pub pp_comm: f64,
    /// Data-parallel gradient reduction and parameter gather not hidden by the overlap, and
    /// FSDP's per-layer gathers.
    pub dp_comm: f64,
    /// Pipeline bubble of the critical rank.
    pub bubble: f64,
    /// GPU idle while the host issues kernels: the MoE dispatcher's host synchronisation and
    /// the expert section it leaves host-bound.
    pub host: f64,
    /// Activation offload copies over the host link (fine-grained `offloadModules`,
    /// layer-level `activationOffloadLayers`) that the layers' compute does not hide.
    pub offload: f64,
    /// Optimizer step over the local shard (with optimizer CPU offload, the host's share:
    /// the gradients' copy to the host, the CPU step and the parameters' copy back).
    pub optimizer: f64,
    /// Per-iteration overheads.
    pub other: f64,
}

impl Breakdown {
    /// Sum of the terms: the step time.
    pub fn total(&self) -> f64 {
        self.compute
            + self.tp_comm
            + self.cp_comm
            + self.ep_comm
            + self.pp_comm
            + self.dp_comm
            + self.bubble
            + self.host
            + self.offload
            + self.optimizer
            + self.other
    }

    /// All exposed communication.
    pub fn exposed_comm(&self) -> f64 {
        self.tp_comm + self.cp_comm + self.ep_comm + self.pp_comm + self.dp_comm
    }

    /// The named terms, in display order.
    pub fn terms(&self) -> [(&'static str, f64); 11] {
        [
            ("compute", self.compute),
            ("tp", self.tp_comm),
            ("cp", self.cp_comm),
            ("ep", self.ep_comm),
            ("pp", self.pp_comm),
            ("dp", self.dp_comm),
            ("bubble", self.bubble),
            ("host", self.host),
            ("offload", self.offload),
            ("optimizer", self.optimizer),
            ("other", self.other),
        ]
    }

    /// What dominates the step: compute, the bubble, exposed communication (all kinds
    /// together), host-bound time, offload copies, the optimizer or overheads.
    pub fn dominant(&self) -> Dominant {
        let candidates = [
            (Dominant::Compute, self.compute),
            (Dominant::Bubble, self.bubble),
            (Dominant::Communication, self.exposed_comm()),
            (Dominant::Host, self.host),
            (Dominant::Offload, self.offload),
            (Dominant::Optimizer, self.optimizer),
            (Dominant::Overhead, self.other),
        ];
        candidates
            .into_iter()
            .fold(
                (Dominant::Compute, f64::MIN),
                |a, b| if b.1 > a.1 { b } else { a },
            )
            .0
    }

    /// The largest single exposed communication term and its name (`tp`, `cp`, `ep`, `pp`,
    /// `dp`).
    pub fn largest_comm(&self) -> (&'static str, f64) {
        [
            ("tp", self.tp_comm),
            ("cp", self.cp_comm),
            ("ep", self.ep_comm),
            ("pp", self.pp_comm),
            ("dp", self.dp_comm),
        ]
        .into_iter()
        .fold(("tp", f64::MIN), |a, b| if b.1 > a.1 { b } else { a })
    }
}

/// What dominates a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Dominant {
    Compute,
    Bubble,
    Communication,
    Host,
    /// Activation offload copies over the host link.
    Offload,
    Optimizer,
    Overhead,
}

impl Dominant {
    pub fn as_str(self) -> &'static str {
        match self {
            Dominant::Compute => "compute",
            Dominant::Bubble => "bubble",
            Dominant::Communication => "communication",
            Dominant::Host => "host",
            Dominant::Offload => "offload",
            Dominant::Optimizer => "optimizer",
            Dominant::Overhead => "overhead",
        }
    }
}

/// The time part of a projection (no memory): what the tuner ranks by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepTime {
    pub step_time_seconds: f64,
    pub tokens_per_second_per_gpu: f64,
    pub tflops_per_gpu: f64,
    pub mfu: f64,
    pub breakdown: Breakdown,
    pub bubble_fraction: f64,
    pub num_microbatches: u64,
    pub dp: u32,
    /// Pipeline rank whose finish sets the step time.
    pub critical_stage: u32,
    /// Model FLOPs of one step over all GPUs (no recompute, causal attention).
    pub model_flops_per_step: f64,
    /// Pipeline makespan (first forward to last backward), seconds.
    pub pipeline_seconds: f64,
    /// Of `breakdown.epComm`: what the passes the EP overlap leaves unpaired add (or, on
    /// balance, the steady state's pairs would not have exposed); not in the JSON.
    #[serde(skip)]
    pub unpaired_ep_seconds: f64,
}

/// A full projection (DESIGN.md section 4).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Projection {
    pub tokens_per_second_per_gpu: f64,
    pub tflops_per_gpu: f64,
    pub mfu: f64,
    pub step_time_seconds: f64,
    pub memory: MemoryReport,
    pub breakdown: Breakdown,
    pub bubble_fraction: f64,
    pub num_microbatches: u64,
    pub dp: u32,
    /// What dominates the step.
    pub dominant: Dominant,
    pub critical_stage: u32,
    pub model_flops_per_step: f64,
}

/// Project a layout with the analytic time model.
pub fn project(s: &Scenario, l: &Layout) -> Result<Projection, LayoutError> {
    project_with(s, l, &AnalyticTimer)
}

/// Project a layout with a given op timer (measured times from benchmark calibration).
pub fn project_with(
    s: &Scenario,
    l: &Layout,
    timer: &dyn OpTimer,
) -> Result<Projection, LayoutError> {
    let t = step_time_with(s, l, timer)?;
    let memory = memory::estimate(s, l);
    Ok(Projection {
        tokens_per_second_per_gpu: t.tokens_per_second_per_gpu,
        tflops_per_gpu: t.tflops_per_gpu,
        mfu: t.mfu,
        step_time_seconds: t.step_time_seconds,
        memory,
        breakdown: t.breakdown,
        bubble_fraction: t.bubble_fraction,
        num_microbatches: t.num_microbatches,
        dp: t.dp,
        dominant: t.breakdown.dominant(),
        critical_stage: t.critical_stage,
        model_flops_per_step: t.model_flops_per_step,
    })
}

/// The time projection alone (checks the layout first).
pub fn step_time(s: &Scenario, l: &Layout) -> Result<StepTime, LayoutError> {
    step_time_with(s, l, &AnalyticTimer)
}

/// The time projection alone with a given op timer.
pub fn step_time_with(
    s: &Scenario,
    l: &Layout,
    timer: &dyn OpTimer,
) -> Result<StepTime, LayoutError> {
    l.check(s)?;
    WORKSPACE.with(|w| time_model(s, l, timer, &mut w.borrow_mut()))
}

/// A projection with every pass of its pipeline schedule, for timelines.
#[derive(Debug, Clone)]
pub struct Timeline {
    pub step: StepTime,
    /// Every pass: rank, chunk, micro-batch, kind, start, end.
    pub events: Vec<Event>,
    pub pp: usize,
    pub vpp: usize,
    /// One pipeline message, seconds.
    pub p2p: f64,
    /// Per virtual stage (`chunk * pp + rank`): the recomputation at the start of each of its
    /// backward passes, seconds.
    pub recompute: Vec<f64>,
}

/// The time projection and every pass of the pipeline schedule (for timelines).
pub fn timeline(s: &Scenario, l: &Layout) -> Result<Timeline, LayoutError> {
    l.check(s)?;
    let mut w = Workspace {
        sim: Simulator::tracing(),
        ..Workspace::default()
    };
    let step = time_model(s, l, &AnalyticTimer, &mut w)?;
    Ok(Timeline {
        step,
        events: w.sim.trace.take().unwrap_or_default(),
        pp: l.pp.max(1) as usize,
        vpp: l.chunks().max(1) as usize,
        p2p: w.p2p,
        recompute: std::mem::take(&mut w.recompute),
    })
}

thread_local! {
    static WORKSPACE: RefCell<Workspace> = RefCell::new(Workspace::default());
}

/// Scratch reused between projections on one thread.
#[derive(Debug, Default)]
struct Workspace {
    sim: Simulator,
    forward: Vec<f64>,
    backward: Vec<f64>,
    weight: Vec<f64>,
    /// Per virtual stage: exposed parts of one micro-batch's forward + backward.
    parts: Vec<Parts>,
    /// Per virtual stage: parameters one GPU holds.
    params: Vec<GpuParams>,
    /// Per virtual stage: recomputation inside one backward pass.
    recompute: Vec<f64>,
    /// Per virtual stage: what a forward and a backward add when they run unpaired under the
    /// EP overlap.
    alone: Vec<layer::AloneParts>,
    /// Per virtual stage: an unpaired forward's and backward's duration.
    forward_alone: Vec<f64>,
    backward_alone: Vec<f64>,
    /// One pipeline message.
    p2p: f64,
}
