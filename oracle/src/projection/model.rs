//! The time model behind [`super::step_time`], in four named steps: (1) the cost of every
//! virtual stage per micro-batch (`stage.rs`: decoder layers from [`super::layer`], the
//! embedding, the output layer with its loss, MTP modules), (2) the pipeline schedule over
//! those costs, (3) the data-parallel tail of each pipeline rank (`dp_tail.rs`: gradient
//! reduction, parameter gather and optimizer after its last pass), and (4) the breakdown of
//! the critical rank into the step's terms and figures.

use crate::collectives::{self, Placement, Topology};
use crate::compute::{ACT_BYTES, Dims, OpTimer, TimerContext};
use crate::layout::{Layout, LayoutError, Schedule};
use crate::scenario::Scenario;
use crate::schedule::{AlonePasses, ScheduleError, ScheduleSummary, StageCosts};

use super::layer::{CommContext, Parts};
use super::{Breakdown, StepTime, Workspace};

mod dp_tail;
mod stage;

use dp_tail::{RankFinish, dp_tail};
pub(super) use stage::GpuParams;
use stage::stage_costs;

/// The whole time model. A pipeline schedule too large to simulate is an error naming the
/// global batch (rule `schedule-size`).
pub(super) fn time_model(
    s: &Scenario,
    l: &Layout,
    timer: &dyn OpTimer,
    w: &mut Workspace,
) -> Result<StepTime, LayoutError> {
    let st = Setup::new(s, l, timer);
    let model_flops_forward = stage_costs(&st, w);
    let pipeline = pipeline(&st, w).map_err(|e| LayoutError {
        rule: "schedule-size",
        field: "spec.training.globalBatchSize".into(),
        message: format!("{e}: lower the global batch or raise microBatchSize"),
    })?;
    let critical = dp_tail(&st, w);
    Ok(breakdown(&st, w, model_flops_forward, &pipeline, &critical))
}

/// What every step reads: the scenario, the layout, the op timer and the communicators.
struct Setup<'a> {
    s: &'a Scenario,
    l: &'a Layout,
    timer: &'a dyn OpTimer,
    ctx: TimerContext<'a>,
    cc: CommContext<'a>,
    gpus: u32,
    /// Data-parallel replicas.
    dp: u32,
    /// Micro-batches per step.
    m: u64,
    /// Pipeline ranks.
    pp: usize,
    /// Model chunks (virtual stages) per pipeline rank.
    vpp: usize,
}

impl<'a> Setup<'a> {
    fn new(s: &'a Scenario, l: &'a Layout, timer: &'a dyn OpTimer) -> Self {
        let gpus = s.cluster.gpus;
        let dp = l.dp(gpus).unwrap_or(1).max(1);
        let topo = timer.topology(Topology::of_scenario(s));
        let place = Placement::of(&topo, gpus, l, dp);
        Setup {
            s,
            l,
            timer,
            ctx: TimerContext {
                hardware: &s.hardware,
                precision: s.training.precision,
                fp8_recipe: l.fp8_recipe(),
            },
            cc: CommContext {
                topo,
                place,
                d: Dims::of(s, l),
                l,
            },
            gpus,
            dp,
            m: l.num_microbatches(s).max(1),
            pp: l.pp.max(1) as usize,
            vpp: l.chunks().max(1) as usize,
        }
    }

    /// Bytes of one micro-batch's hidden states (the full sequence of the rank's tokens).
    fn activation_bytes(&self) -> f64 {
        self.cc.d.tokens() * self.s.model.hidden_size as f64 * ACT_BYTES
    }
}

/// The pipeline schedule over the stage costs.
struct PipelineRun {
    summary: ScheduleSummary,
}

/// Simulate the schedule (interleaved with virtual stages, else zero-bubble or 1F1B) with one
/// point-to-point message per pass boundary; the simulator keeps every rank's timeline.
fn pipeline(st: &Setup, w: &mut Workspace) -> Result<PipelineRun, ScheduleError> {
    let d = &st.cc.d;
    let act = st.activation_bytes();
    // Pipeline messages: the hidden states of one micro-batch (scattered over TP under SP,
    // Megatron's scatter-gather optimisation).
    let p2p_bytes = if d.sp { act / d.tp } else { act };
    let p2p = if st.pp > 1 {
        collectives::p2p(&st.cc.topo, st.cc.place.pp_crosses_domain, p2p_bytes)
    } else {
        0.0
    };
    let schedule = if st.vpp > 1 {
        Schedule::Interleaved
    } else if st.l.schedule == Schedule::ZeroBubble {
        Schedule::ZeroBubble
    } else {
        Schedule::OneFOneB
    };
    w.p2p = p2p;
    // The EP overlap pairs passes only in the steady state of an interleaved schedule or of
    // one without a pipeline (the rules allow it with no other).
    let paired = st.l.moe.ep_overlap && (schedule == Schedule::Interleaved || st.pp == 1);
    w.forward_alone.clear();
    w.backward_alone.clear();
    if paired {
        w.forward_alone.extend(
            w.forward
                .iter()
                .zip(&w.alone)
                .map(|(f, a)| f + a.forward.total()),
        );
        w.backward_alone.extend(
            w.backward
                .iter()
                .zip(&w.alone)
                .map(|(b, a)| b + a.backward.total()),
        );
    }
    let costs = StageCosts {
        pp: st.pp,
        vpp: st.vpp,
        forward: &w.forward,
        backward: &w.backward,
        weight: &w.weight,
        p2p,
        alone: paired.then_some(AlonePasses {
            forward: &w.forward_alone,
            backward: &w.backward_alone,
        }),
    };
    let m = usize::try_from(st.m).unwrap_or(usize::MAX);
    Ok(PipelineRun {
        summary: w.sim.run_lean(schedule, &costs, m)?,
    })
}

/// The step time, throughput and MFU, and the breakdown of the critical rank: its passes'
/// parts over all micro-batches, the pipeline messages it waited for, its bubble and DP tail.
fn breakdown(
    st: &Setup,
    w: &Workspace,
    model_flops_forward: f64,
    pipeline: &PipelineRun,
    critical: &RankFinish,
) -> StepTime {
    let (s, l, hw) = (st.s, st.l, &st.s.hardware);
    let (m, dp, gpus) = (st.m, st.dp, st.gpus);
    let other = hw.efficiency.step_overhead_ms * 1e-3;
    let step = critical.finish + other;

    let mut tl = w.sim.ranks()[critical.rank];
    let p2p_wait = w.sim.p2p_wait(critical.rank);
    tl.p2p_wait = p2p_wait;
    let mut parts = Parts::default();
    for c in 0..st.vpp {
        parts.add(&w.parts[c * st.pp + critical.rank], m as f64);
    }
    let mut unpaired = Parts::default();
    for (r, backward, vs) in w.sim.unpaired_passes() {
        if r == critical.rank {
            let a = &w.alone[vs];
            unpaired.add(if backward { &a.backward } else { &a.forward }, 1.0);
        }
    }
    parts.add(&unpaired, 1.0);
    let breakdown = Breakdown {
        compute: parts.compute,
        tp_comm: parts.tp,
        cp_comm: parts.cp,
        ep_comm: parts.ep,
        pp_comm: p2p_wait,
        dp_comm: parts.dp + critical.dp_exposed,
        bubble: tl.bubble(),
        host: parts.host,
        offload: parts.offload,
        optimizer: critical.optimizer,
        other,
    };

    // Model FLOPs: every GPU of a TP x CP group computes its share of each micro-batch; the
    // backward counts twice the forward (no recompute).
    let model_flops_per_step =
        3.0 * model_flops_forward * (l.tp * l.cp) as f64 * (m * dp as u64) as f64;
    let tokens = (m * dp as u64 * l.micro_batch_size as u64) as f64 * s.training.seq_length as f64;
    let tflops = model_flops_per_step / step / gpus as f64 / 1e12;
    StepTime {
        step_time_seconds: step,
        tokens_per_second_per_gpu: tokens / step / gpus as f64,
        tflops_per_gpu: tflops,
        mfu: tflops * 1e12 / hw.peak_flops(s.training.precision),
        breakdown,
        bubble_fraction: pipeline.summary.bubble_fraction,
        num_microbatches: m,
        dp,
        critical_stage: critical.rank as u32,
        model_flops_per_step,
        pipeline_seconds: pipeline.summary.makespan,
        unpaired_ep_seconds: unpaired.ep,
    }
}
