//! The expert-parallel part of a MoE layer's cost: the token dispatch and combine of the
//! layout's dispatcher, what the MoE overlaps hide of them, and the host-bound time around the
//! dispatcher's host synchronisation, with CUDA graphs.
//!
//! Dispatchers (Megatron-Core `megatron/core/transformer/moe/token_dispatcher.py`,
//! `fused_a2a.py`):
//! - `allgather` (`MoEAllGatherTokenDispatcher`): all-gather of every token of the TP x EP group
//!   before the experts, reduce-scatter of the outputs after (volume independent of top-k and of
//!   the routing);
//! - `alltoall` (`MoEAlltoAllTokenDispatcher`): NCCL all-to-all over EP of the k copies of each
//!   token, the busiest rank receiving the most;
//! - `flex` (DeepEP `_DeepepManager`, HybridEP `_HybridEPManager`, Primus-Turbo's DeepEP):
//!   one copy per token and destination rank (`get_dispatch_layout`: `is_token_in_rank`), and
//!   across scale-up domains one copy per destination domain over RDMA, forwarded inside it
//!   over NVLink; at the fraction of the link bandwidth each library reaches on the GPU
//!   (`flexBackends` in the hardware profile). Under balanced routing the expected distinct
//!   destinations of a token follow from [`compute::hit_probability`].
//!
//! Overlaps:
//! - `sharedExpertOverlap` (`shared_experts.py`, side stream): the dispatch and combine hide
//!   behind the shared experts;
//! - `epOverlap` (`--overlap-moe-expert-parallel-comm`, `pipeline_parallel/combined_1f1b.py`):
//!   the forward of one micro-batch and the backward of another are scheduled layer by layer
//!   on a compute and a communication stream, so a layer's dispatch and combine (both passes)
//!   hide behind the `epOverlap` fraction of the two passes' computation (with
//!   `delayWgrad`, the experts' weight gradients too).
//!
//! Host time: after the dispatcher's device-to-host copy of the per-expert token counts
//! (`moeHostSyncUs`, once per synchronisation: the unfused permutation and DeepEP's unfused
//! multihot conversion add theirs, [`crate::layout::MoeOptions::host_syncs`], each idling the
//! GPU for at least one launch), the GPU waits for the host to issue the rest of the layer; a
//! section lasts at least its framework calls x `cpuLaunchUs` plus its library-launched
//! kernels x `libraryLaunchUs` (a captured CUDA-graph scope: one `graphLaunchUs`). The EP
//! overlap does not remove it: the sync of one micro-batch drains the queue of the other.
//! Static shapes (drop-and-pad capacity, HybridEP with a per-rank capacity) have no sync;
//! full-iteration graphs replay the whole step with no host time at all.

use crate::backend::FlexBackend;
use crate::collectives;
use crate::compute::{self, ACT_BYTES, OpTimes, Part, TimerContext};
use crate::layout::{CudaGraphImpl, CudaGraphModule, Layout, TokenDispatcher};
use crate::model::{ModelCard, MoeConfig};
use crate::units::MICROSECOND;

use super::{AloneParts, CommContext, FwdBwd, LayerInput, Parts};

/// The dispatch/combine of an MoE layer (and its expert-TP collectives), and the host-bound
/// time around the dispatcher's sync.
#[derive(Default)]
pub(super) struct EpCost {
    pub ep: FwdBwd,
    pub host: FwdBwd,
    /// Under the EP overlap, what each pass adds when it runs unpaired: Megatron pairs a
    /// forward with a backward only in the steady state; the interleaved schedule runs its
    /// warm-up forwards and cool-down backwards alone (`schedules.py`,
    /// `forward_backward_helper_wrapper` with one of the two micro-batch ids unset), and
    /// without a pipeline the first forward and the last backward
    /// (`combined_1f1b_schedule_for_no_pipelining`), each exposing its own dispatch and
    /// combine. Per pass: that exposure and its host time minus what the paired pass is
    /// charged (the backward carries the pair's exposure, so an unpaired backward may cost
    /// less than a paired one). EP and host parts only.
    pub alone: AloneParts,
}

/// EP: dispatch and combine, the overlaps, and the host time of a MoE layer.
pub(super) fn ep_cost(x: &LayerInput, ctx: &TimerContext) -> EpCost {
    let (card, cc, t) = (x.card, x.cc, &x.t);
    let Some(moe) = card.moe.as_ref().filter(|_| x.moe_layer) else {
        return EpCost::default();
    };
    let d = &cc.d;
    let h = card.hidden_size as f64;
    let mut comm = 2.0 * dispatch_seconds(cc, moe, h, ctx);
    if cc.place.etp.size > 1 {
        // Expert-TP: all-gather of the routed tokens before the experts, reduce-scatter
        // after; mirrored in the backward.
        let etp_bytes = d.routed_tokens(moe.top_k as f64) * h * ACT_BYTES;
        comm += collectives::all_gather(&cc.topo, &cc.place.etp, etp_bytes)
            + collectives::reduce_scatter(&cc.topo, &cc.place.etp, etp_bytes);
    }
    let opts = &cc.l.moe;
    let ep = if opts.ep_overlap {
        overlapped(cc, t, comm, ctx)
    } else if opts.shared_expert_overlap {
        // The shared experts run on a side stream while the tokens travel.
        let shared = t.part(Part::SharedExperts);
        FwdBwd {
            forward: (comm - shared.forward).max(0.0),
            backward: (comm - shared.backward).max(0.0),
        }
    } else {
        FwdBwd {
            forward: comm,
            backward: comm,
        }
    };
    // The host catches up while the GPU runs the layer's computation and its exposed
    // communication; what an overlap hides behind the computation gives it no extra time.
    // Under the EP overlap the paired passes' exposure is charged to the backward: half of
    // it to each pass.
    let exposed = if opts.ep_overlap {
        FwdBwd {
            forward: ep.backward / 2.0,
            backward: ep.backward / 2.0,
        }
    } else {
        FwdBwd {
            forward: ep.forward,
            backward: ep.backward,
        }
    };
    let syncs = layer_syncs(card, cc.l);
    let host = host_time(cc, t, &exposed, syncs, ctx);
    let alone = if opts.ep_overlap {
        // Unpaired: the pass's own dispatch and combine, exposed as without the overlap.
        let own = FwdBwd {
            forward: comm,
            backward: comm,
        };
        let own_host = host_time(cc, t, &own, syncs, ctx);
        AloneParts {
            forward: Parts {
                ep: comm - ep.forward,
                host: own_host.forward - host.forward,
                ..Parts::default()
            },
            backward: Parts {
                ep: comm - ep.backward,
                host: own_host.backward - host.backward,
                ..Parts::default()
            },
        }
    } else {
        AloneParts::default()
    };
    EpCost { ep, host, alone }
}

/// Exposed dispatch + combine of both passes under `--overlap-moe-expert-parallel-comm`: the
/// paired passes hide `comm` (per pass) behind the `epOverlap` fraction of their computation.
/// Charged to the backward, which the pairing merges the forward into. The passes the schedule
/// runs unpaired (the warm-up and cool-down; without a pipeline, the first forward and the
/// last backward) pay [`EpCost::alone`] on top.
fn overlapped(cc: &CommContext, t: &OpTimes, comm: f64, ctx: &TimerContext) -> FwdBwd {
    let eff = ctx.hardware.efficiency.ep_overlap;
    let wgrad = if cc.l.moe.delay_wgrad { t.wgrad } else { 0.0 };
    let window = eff * (t.forward + t.dgrad + wgrad);
    FwdBwd {
        forward: 0.0,
        backward: (2.0 * comm - window).max(0.0),
    }
}

/// Seconds of one dispatch (a combine costs the same) on the busiest rank.
fn dispatch_seconds(cc: &CommContext, moe: &MoeConfig, h: f64, ctx: &TimerContext) -> f64 {
    let d = &cc.d;
    let x = &d.moe;
    let (routed, local) = compute::busiest_rank(d, moe);
    let load = routed / d.routed_tokens(moe.top_k as f64).max(f64::MIN_POSITIVE);
    let tokens = d.tokens_dispatched();
    match x.dispatcher {
        TokenDispatcher::Allgather => {
            // Every rank gathers the tokens of the whole TP x EP group.
            let g = &cc.place.tp_ep;
            collectives::all_gather(&cc.topo, g, g.size as f64 * tokens * h * ACT_BYTES)
        }
        TokenDispatcher::Alltoall => {
            let bytes = tokens * moe.top_k as f64 * h * ACT_BYTES;
            collectives::all_to_all(&cc.topo, &cc.place.ep, bytes) * load
        }
        TokenDispatcher::Flex => {
            let backend = cc.l.moe.backend().unwrap_or_default();
            flex_seconds(cc, moe, local, tokens * h * ACT_BYTES, backend, ctx) * load
        }
    }
}

/// One flex dispatch of `token_bytes` per token copy: copies to the distinct destination ranks
/// of the sender's domain over the scale-up links, one copy per distinct other domain over
/// the NIC, forwarded inside the destination domain; both tiers at once.
fn flex_seconds(
    cc: &CommContext,
    moe: &MoeConfig,
    local: f64,
    token_bytes: f64,
    backend: FlexBackend,
    ctx: &TimerContext,
) -> f64 {
    let g = &cc.place.ep;
    if g.size <= 1 || token_bytes <= 0.0 {
        return 0.0;
    }
    let hw = ctx.hardware;
    let e = moe.num_experts as f64;
    let k = moe.top_k as f64;
    let per_domain = g.in_domain() as f64;
    let domains = (g.size as f64 / per_domain).ceil();
    let p_rank = compute::hit_probability(e, local, k);
    let p_domain = compute::hit_probability(e, per_domain * local, k);
    // Distinct other ranks of the own domain, and distinct other domains, a token goes to.
    let own = (per_domain - 1.0) * p_rank;
    let other = (domains - 1.0) * p_domain;
    // An RDMA copy fans out to the ranks it was meant for inside its domain.
    let fan_out = if p_domain > 0.0 {
        per_domain * p_rank / p_domain
    } else {
        0.0
    };
    let (up_eff, out_eff) = match hw.flex_backend(backend) {
        Some(p) => (p.scale_up, p.scale_out),
        None => (
            hw.efficiency.collective,
            hw.efficiency.scale_out_collective(),
        ),
    };
    let intra = token_bytes * (own + other * fan_out) / (hw.scale_up.bytes_per_second() * up_eff);
    let inter = token_bytes * other / (hw.scale_out.bytes_per_second() * out_eff);
    intra.max(inter) + 2.0 * cc.topo.latency(g)
}

/// Host synchronisations of one MoE layer per micro-batch, forward and backward: the
/// dispatcher path's ([`crate::layout::MoeOptions::host_syncs`]) and, for a card with the
/// clamped quick-GeGLU (`activationClamp`, gpt-oss), one more per forward: Megatron-Core's
/// `weighted_bias_quick_geglu_impl` (`fusions/fused_bias_geglu.py`) makes its linear offset a
/// device tensor on every call (`torch.tensor(linear_offset, device=input.device)`, a
/// blocking host-to-device copy that synchronises the stream). The fused grouped MLP applies
/// the activation in its GEMM epilogue: no call. A recomputed activation's rerun is left out,
/// like the rest of recomputation's host time.
pub(super) fn layer_syncs(card: &ModelCard, l: &Layout) -> (u32, u32) {
    let (forward, backward) = l.moe.host_syncs();
    let activation = (card.activation_clamp && !l.moe.fused_grouped_mlp) as u32;
    (forward + activation, backward)
}

/// The host-bound time of a MoE layer, forward and backward (see the module documentation):
/// per pass, the launches of each part of the layer (a captured part: one graph launch) against
/// its GPU time; the sync and the section after it in the forward, the whole layer in the
/// backward (its split sizes are known from the forward: no sync). `comm`: each pass's exposed
/// dispatch and combine, GPU time the host issues behind.
fn host_time(
    cc: &CommContext,
    t: &OpTimes,
    comm: &FwdBwd,
    (syncs_f, syncs_b): (u32, u32),
    ctx: &TimerContext,
) -> FwdBwd {
    let l = cc.l;
    if l.cuda_graph.implementation == CudaGraphImpl::FullIteration {
        return FwdBwd::default();
    }
    let e = &ctx.hardware.efficiency;
    let launch = e.cpu_launch_us * MICROSECOND;
    let library = e.library_launch_us * MICROSECOND;
    let graph = e.graph_launch_seconds();
    // (host, GPU) seconds before and after the sync, forward; and the backward's.
    let mut pre = (0.0, 0.0);
    let mut post = (0.0, 0.0);
    let mut bwd = (0.0, 0.0);
    for part in [
        Part::Attention,
        Part::Mlp,
        Part::SharedExperts,
        Part::Router,
        Part::Experts,
    ] {
        let p = t.part(part);
        let (gf, gb) = (p.forward, p.backward);
        let issue = p.host_ops * launch + p.library * library;
        if issue <= 0.0 {
            continue;
        }
        let captured = captured(cc, part);
        let host_f = if captured { graph } else { issue };
        // Autograd issues dgrad and wgrad: twice the launches.
        let host_b = if captured { graph } else { 2.0 * issue };
        let side = if part.after_sync() {
            &mut post
        } else {
            &mut pre
        };
        side.0 += host_f;
        side.1 += gf;
        bwd.0 += host_b;
        bwd.1 += gb;
    }
    // With the EP overlap the host still waits at every sync, with the other micro-batch's
    // kernels queued before the copy: the same exposure. Each synchronisation beyond the
    // dispatcher's first drains the queue again and leaves the GPU idle for at least the next
    // launch (the first one's is in the section's deficit, which the launch costs are fitted
    // with): `extra` launches, unless the section is host-bound anyway.
    let sync = e.moe_host_sync_us * MICROSECOND;
    // The backward's own syncs (none on most paths: then only its deficit).
    let backward =
        syncs_b as f64 * sync + (bwd.0 - bwd.1 - comm.backward).max(syncs_b as f64 * launch);
    let forward = if syncs_f > 0 {
        let extra = (syncs_f - 1) as f64;
        syncs_f as f64 * sync
            + (post.0 - post.1 - comm.forward).max(extra * launch)
            + (pre.0 - pre.1).max(0.0)
    } else {
        (pre.0 + post.0 - pre.1 - post.1 - comm.forward).max(0.0)
    };
    FwdBwd { forward, backward }
}

/// Whether the layout's CUDA graphs capture a part of the layer.
fn captured(cc: &CommContext, part: Part) -> bool {
    let g = &cc.l.cuda_graph;
    match part {
        Part::Attention => g.captures(CudaGraphModule::Attn),
        Part::Mlp => g.captures(CudaGraphModule::Mlp),
        Part::Router => g.captures(CudaGraphModule::MoeRouter),
        Part::SharedExperts | Part::Experts => g.captures(CudaGraphModule::Moe),
    }
}
