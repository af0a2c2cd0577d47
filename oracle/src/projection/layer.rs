//! Per-kind decoder-layer costs for the time model ([`super::model`]): the kernels of one
//! layer of a kind (dense or MoE, full or sliding attention) per micro-batch on one GPU, and
//! the communication each parallelism adds around them and leaves exposed: TP/SP collectives
//! around the attention and MLP blocks, the CP ring exchange of K and V, the EP dispatch and
//! combine with the MoE dispatcher's host sync, and FSDP's per-layer gathers. Recomputation's
//! extra forward work (full or selective) is priced from the same parts.

use crate::collectives::{self, Placement, Topology};
use crate::compute::{self, ACT_BYTES, Dims, LayerShape, OpTimer, OpTimes, TimerContext};
use crate::layout::Layout;
use crate::model::{LayerKind, ModelCard};

use super::{PARAM_BYTES, grad_bytes};

mod ep;

use ep::ep_cost;

/// Seconds of one pass split by cause.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Parts {
    pub compute: f64,
    pub tp: f64,
    pub cp: f64,
    pub ep: f64,
    pub dp: f64,
    /// Host-bound time (MoE dispatcher sync and expert section).
    pub host: f64,
    /// Activation offload copies over the host link the layer's compute does not hide.
    pub offload: f64,
}

impl Parts {
    pub fn total(&self) -> f64 {
        self.compute + self.tp + self.cp + self.ep + self.dp + self.host + self.offload
    }

    pub(super) fn add(&mut self, o: &Parts, times: f64) {
        self.compute += o.compute * times;
        self.tp += o.tp * times;
        self.cp += o.cp * times;
        self.ep += o.ep * times;
        self.dp += o.dp * times;
        self.host += o.host * times;
        self.offload += o.offload * times;
    }
}

/// Exposed seconds of one cost in the forward and in the backward pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct FwdBwd {
    pub forward: f64,
    pub backward: f64,
}

/// What a forward and a backward pass add (or, for the backward, may remove) when they run
/// unpaired under the EP overlap; zero without it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct AloneParts {
    pub forward: Parts,
    pub backward: Parts,
}

impl AloneParts {
    pub(super) fn add(&mut self, o: &AloneParts, times: f64) {
        self.forward.add(&o.forward, times);
        self.backward.add(&o.backward, times);
    }
}

/// One kind of decoder layer, per micro-batch on one GPU.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct KindCost {
    pub forward: Parts,
    /// Input-gradient side of the backward (GEMM dgrad, attention/element-wise backward) and
    /// the communication of the backward.
    pub backward: Parts,
    /// Weight-gradient GEMMs.
    pub weight: f64,
    /// What full recomputation of the layer adds to its backward.
    pub recompute_full: Parts,
    /// What selective recomputation of the layout's modules adds.
    pub recompute_selective: Parts,
    /// What a pass adds when it runs unpaired under the EP overlap (the warm-up forwards and
    /// cool-down backwards of an interleaved schedule; without a pipeline, the first forward
    /// and the last backward): its own dispatch and combine exposed in place of the paired
    /// exposure, and the host time that leaves.
    pub alone: AloneParts,
    /// Model FLOPs of the forward pass on this GPU.
    pub flops: f64,
}

/// The communicators and message sizes shared by all layer kinds.
pub(super) struct CommContext<'a> {
    pub topo: Topology,
    pub place: Placement,
    pub d: Dims,
    pub l: &'a Layout,
}

impl CommContext<'_> {
    /// TP collectives around one block whose column-parallel input is `gather_bytes` (the
    /// gathered activation) and whose row-parallel output is `scatter_bytes`, forward and
    /// backward, exposed given the GEMM time they could hide behind.
    fn tp_block(&self, gather_bytes: f64, scatter_bytes: f64, gemm_f: f64, gemm_b: f64) -> FwdBwd {
        let g = &self.place.tp;
        if g.size <= 1 {
            return FwdBwd::default();
        }
        let (fwd, bwd, bwd_overlappable) = if self.d.sp {
            // SP: all-gather before the column-parallel GEMM, reduce-scatter after the
            // row-parallel one; backward mirrors them, and re-gathers the input for wgrad
            // (Megatron overlaps that one with the dgrad GEMM).
            let ag = collectives::all_gather(&self.topo, g, gather_bytes);
            let rs = collectives::reduce_scatter(&self.topo, g, scatter_bytes);
            (ag + rs, ag + rs, ag)
        } else {
            // No SP: all-reduce of the row-parallel output forward, of the column-parallel
            // input gradient backward.
            (
                collectives::all_reduce(&self.topo, g, scatter_bytes),
                collectives::all_reduce(&self.topo, g, gather_bytes),
                0.0,
            )
        };
        let bwd_hidden = (bwd_overlappable - gemm_b).max(0.0);
        if self.l.tp_comm_overlap {
            // Transformer Engine userbuffers: pipelined with the GEMMs.
            FwdBwd {
                forward: (fwd - gemm_f).max(0.0),
                backward: (bwd + bwd_overlappable - gemm_b).max(0.0),
            }
        } else {
            FwdBwd {
                forward: fwd,
                backward: bwd + bwd_hidden,
            }
        }
    }
}

/// What one layer of a kind is made of: its card, shape and kernel times.
struct LayerInput<'a> {
    card: &'a ModelCard,
    shape: LayerShape,
    cc: &'a CommContext<'a>,
    t: OpTimes,
    /// An MoE layer of an MoE model (routed experts).
    moe_layer: bool,
}

/// TP/SP collectives of a layer.
struct TpCost {
    /// Attention and MLP blocks together.
    total: FwdBwd,
    /// The forward of the dense MLP's (or the shared experts') block alone: what selective
    /// recompute of that block reruns.
    mlp_forward: f64,
}

/// The cost of one layer of `shape` under the communicators of `cc`.
pub(super) fn kind_cost(
    card: &ModelCard,
    shape: LayerShape,
    cc: &CommContext,
    timer: &dyn OpTimer,
    ctx: &TimerContext,
) -> KindCost {
    let x = LayerInput {
        card,
        shape,
        cc,
        t: OpTimes::of_layer(card, &cc.d, shape, timer, ctx),
        moe_layer: shape.kind == LayerKind::Moe && card.moe.is_some(),
    };
    let t = &x.t;
    let tp = tp_cost(&x);
    let cp = cp_cost(&x);
    let ep = ep_cost(&x, ctx);
    let dp = fsdp_cost(&x);
    let forward = Parts {
        compute: t.forward,
        tp: tp.total.forward,
        cp: cp.forward,
        ep: ep.ep.forward,
        dp: dp.forward,
        host: ep.host.forward,
        offload: 0.0,
    };
    let backward = Parts {
        compute: t.dgrad,
        tp: tp.total.backward,
        cp: cp.backward,
        ep: ep.ep.backward,
        dp: dp.backward,
        host: ep.host.backward,
        offload: 0.0,
    };
    // Full recompute reruns the forward, communication included (not the FSDP gather: the
    // backward gathers anyway); the rerun lengthens the backward that hides FSDP's traffic.
    let recompute_full = Parts {
        dp: dp.hidden_by_rerun(t.forward),
        ..forward
    };
    KindCost {
        forward,
        backward,
        weight: t.wgrad,
        recompute_full,
        recompute_selective: selective_recompute(&x, timer, ctx, &forward, tp.mlp_forward, &dp),
        alone: ep.alone,
        flops: t.model_flops_forward,
    }
}

/// TP / SP: the attention block's collectives and, unless the layer's MLP is routed experts
/// only, the MLP block's.
fn tp_cost(x: &LayerInput) -> TpCost {
    let (card, cc, t) = (x.card, x.cc, &x.t);
    let tok = cc.d.tokens();
    let act = tok * card.hidden_size as f64 * ACT_BYTES;
    let gemm_b = t.gemm_forward * 2.0;
    let attn_gather = match &card.mla {
        // MLA: the duplicated down-projections run on the SP shard; what is gathered is their
        // compressed output (q and kv latents plus the shared rotary key).
        Some(m) => {
            tok * (m.q_lora_rank.unwrap_or(0) as f64
                + m.kv_lora_rank as f64
                + m.qk_rope_head_dim as f64)
                * ACT_BYTES
        }
        None => act,
    };
    let mut total = cc.tp_block(attn_gather, act, t.gemm_forward / 2.0, gemm_b / 2.0);
    let mlp_tp = !x.moe_layer || card.shared_expert_ffn() > 0;
    let mut mlp_forward = 0.0;
    if mlp_tp {
        let mlp = cc.tp_block(act, act, t.gemm_forward / 2.0, gemm_b / 2.0);
        total.forward += mlp.forward;
        total.backward += mlp.backward;
        mlp_forward = mlp.forward;
    }
    TpCost { total, mlp_forward }
}

/// CP: ring exchange of K and V, hidden behind the attention of the other chunks.
fn cp_cost(x: &LayerInput) -> FwdBwd {
    let (card, cc, t) = (x.card, x.cc, &x.t);
    if cc.place.cp.size <= 1 {
        return FwdBwd::default();
    }
    let d = &cc.d;
    let c = d.cp;
    let (kv_heads, dqk, dv) = match &card.mla {
        Some(m) => (
            card.attention_heads as f64,
            (m.qk_nope_head_dim + m.qk_rope_head_dim) as f64,
            m.v_head_dim as f64,
        ),
        None => (
            card.kv_heads() as f64,
            card.head_dim() as f64,
            card.head_dim() as f64,
        ),
    };
    // K and V of the local heads for this rank's b*s/cp tokens.
    let kv_bytes = d.tokens() * kv_heads * (dqk + dv) / d.tp * ACT_BYTES;
    let crosses = cc.place.cp.domains > 1;
    let step_f = collectives::p2p(&cc.topo, crosses, kv_bytes);
    // Backward sends K, V and their gradients.
    let step_b = collectives::p2p(&cc.topo, crosses, 2.0 * kv_bytes);
    // c-1 exchanges, each overlapping the attention of one of the c chunks.
    FwdBwd {
        forward: ((c - 1.0) * step_f - (c - 1.0) / c * t.attention_forward).max(0.0),
        backward: ((c - 1.0) * step_b - (c - 1.0) / c * t.attention_backward).max(0.0),
    }
}

/// FSDP's exposed traffic of one layer: what its gather and reduce-scatter leave uncovered
/// in each pass.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct FsdpCost {
    forward: f64,
    backward: f64,
}

impl FsdpCost {
    /// What a recompute rerun of `rerun` GPU seconds hides of the backward's exposed traffic
    /// (negative: it is added to the backward): the layer's gather for the backward and the
    /// previous layer's reduce-scatter are prefetched and drained behind the whole backward
    /// of the layer, the rerun included (Megatron-FSDP and FSDP2 gather once for the rerun and
    /// the gradient computation).
    fn hidden_by_rerun(&self, rerun: f64) -> f64 {
        -self.backward.min(rerun.max(0.0))
    }
}

/// FSDP: gather the layer's weights forward and backward, reduce-scatter its gradients, each
/// prefetched behind the layer's compute.
fn fsdp_cost(x: &LayerInput) -> FsdpCost {
    let (card, cc, t) = (x.card, x.cc, &x.t);
    let l = cc.l;
    if !l.fsdp {
        return FsdpCost::default();
    }
    let p = card.layer_params(x.shape.kind);
    let dense = p.non_expert_per_gpu(l.tp);
    let experts = p.experts_per_gpu(l.ep, l.etp);
    let ag = collectives::all_gather(&cc.topo, &cc.place.dp_cp, dense * PARAM_BYTES)
        + collectives::all_gather(&cc.topo, &cc.place.edp, experts * PARAM_BYTES);
    let rs = collectives::reduce_scatter(&cc.topo, &cc.place.dp_cp, dense * grad_bytes(l))
        + collectives::reduce_scatter(&cc.topo, &cc.place.edp, experts * grad_bytes(l));
    FsdpCost {
        forward: (ag - t.forward).max(0.0),
        backward: (ag + rs - t.backward()).max(0.0),
    }
}

/// Selective recompute reruns the forward of its modules (`compute::recompute_ops`) and the
/// communication inside them: the attention core's CP exchange (core_attn), the dense MLP's
/// or the shared experts' TP collectives (mlp; moe, shared_experts), the MoE block's dispatch
/// and combine with the dispatcher's host sync (moe); the rerun hides FSDP traffic as full
/// recompute's does. `forward` is the layer's forward; `mlp_tp_forward` its MLP block's TP
/// collectives; `dp` its FSDP exposure.
fn selective_recompute(
    x: &LayerInput,
    timer: &dyn OpTimer,
    ctx: &TimerContext,
    forward: &Parts,
    mlp_tp_forward: f64,
    dp: &FsdpCost,
) -> Parts {
    use crate::layout::RecomputeModule as M;
    let set = x.cc.l.recompute_set();
    if set.is_empty() {
        return Parts::default();
    }
    let rerun = OpTimes::of(
        &compute::recompute_ops(x.card, &x.cc.d, x.shape, set),
        timer,
        ctx,
    );
    let moe_block = x.moe_layer && set.contains(M::Moe);
    let mlp_comm = if x.moe_layer {
        moe_block || set.contains(M::SharedExperts)
    } else {
        set.contains(M::Mlp)
    };
    Parts {
        compute: rerun.forward,
        cp: if set.contains(M::CoreAttn) {
            forward.cp
        } else {
            0.0
        },
        tp: if mlp_comm { mlp_tp_forward } else { 0.0 },
        ep: if moe_block { forward.ep } else { 0.0 },
        host: if moe_block { forward.host } else { 0.0 },
        dp: dp.hidden_by_rerun(rerun.forward),
        offload: 0.0,
    }
}

/// Decoder layers of one shape in a range of layers.
#[derive(Debug, Clone, Copy)]
pub(super) struct ShapeCount {
    pub shape: LayerShape,
    pub layers: u32,
}

/// Counts of each layer shape in a range of decoder layers, in [`shape_index`] order.
pub(super) fn shape_counts(card: &ModelCard, range: std::ops::Range<u32>) -> [ShapeCount; 4] {
    let (a, b) = (range.start, range.end.max(range.start));
    let dense_layers = card
        .moe
        .as_ref()
        .map(|m| m.dense_layers)
        .unwrap_or(card.layers);
    let moe_start = dense_layers.clamp(a, b);
    // Full-attention layers in [x, y): layer i is full when (i + 1) % every == 0 (gpt-oss
    // alternates sliding and full, starting with sliding); all full without a window.
    let full_in = |x: u32, y: u32| -> u32 {
        match (card.sliding_window, card.full_attention_every) {
            (None, _) => y - x,
            (Some(_), None) => 0,
            (Some(_), Some(e)) => {
                let e = e.max(1);
                y / e - x / e
            }
        }
    };
    let dense_n = moe_start - a;
    let moe_n = b - moe_start;
    let dense_full = full_in(a, moe_start);
    let moe_full = full_in(moe_start, b);
    let count = |kind, sliding, layers| ShapeCount {
        shape: LayerShape { kind, sliding },
        layers,
    };
    [
        count(LayerKind::Dense, false, dense_full),
        count(LayerKind::Dense, true, dense_n - dense_full),
        count(LayerKind::Moe, false, moe_full),
        count(LayerKind::Moe, true, moe_n - moe_full),
    ]
}

/// Index of a shape among the four of [`shape_counts`].
pub(super) fn shape_index(shape: LayerShape) -> usize {
    (shape.kind == LayerKind::Moe) as usize * 2 + shape.sliding as usize
}
