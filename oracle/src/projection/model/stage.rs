//! Step 1 of the time model: the cost of every virtual stage per micro-batch on one GPU, from
//! the per-kind decoder-layer costs ([`crate::projection`]'s `layer.rs`), the embedding, the
//! output layer with its loss and the MTP modules each stage holds, and the parameters each
//! stage keeps (what the data-parallel tail reduces and the optimizer updates).

use crate::collectives;
use crate::compute::{self, LayerShape, OpTimes};
use crate::layout::Recompute;
use crate::memory::{self, HostCopyBytes};
use crate::model::LayerKind;

use super::Setup;
use crate::projection::layer::{
    AloneParts, FwdBwd, KindCost, Parts, kind_cost, shape_counts, shape_index,
};
use crate::projection::{LOSS_ALLREDUCE_SCALARS, Workspace};

/// Parameters one GPU holds, split by how data parallelism shards them: non-expert (over the
/// DP x CP group) and expert (over the expert-data-parallel group).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(in crate::projection) struct GpuParams {
    pub non_expert: f64,
    pub expert: f64,
}

/// The embedding, the output layer with its loss, and the extras of one MTP module, per
/// micro-batch, with the TP collectives each exposes.
pub(super) struct EdgeCosts {
    embedding: OpTimes,
    head: OpTimes,
    /// One MTP module beyond its decoder layer: projection, norms, output layer and loss.
    mtp_extra: OpTimes,
    /// The embedding's TP collective, forward and backward alike.
    embedding_tp: f64,
    head_tp: FwdBwd,
}

impl EdgeCosts {
    fn of(st: &Setup) -> EdgeCosts {
        let (card, d, cc) = (&st.s.model, &st.cc.d, &st.cc);
        let (timer, ctx) = (st.timer, &st.ctx);
        let act = st.activation_bytes();
        let tpg = &cc.place.tp;
        let tp = tpg.size > 1;
        // The SP reduce-scatter (or the all-reduce without SP) of one hidden-state tensor.
        let scatter = || {
            if d.sp {
                collectives::reduce_scatter(&cc.topo, tpg, act)
            } else {
                collectives::all_reduce(&cc.topo, tpg, act)
            }
        };
        EdgeCosts {
            embedding: OpTimes::of(&compute::embedding_ops(card, d), timer, ctx),
            head: OpTimes::of(&compute::head_ops(card, d), timer, ctx),
            mtp_extra: if card.mtp_layers > 0 {
                OpTimes::of(&compute::mtp_extra_ops(card, d), timer, ctx)
            } else {
                OpTimes::default()
            },
            // Embedding output: reduce-scatter (SP) or all-reduce over TP of the vocab-parallel
            // lookup; backward gathers the gradient.
            embedding_tp: if tp { scatter() } else { 0.0 },
            // Head: gather the input (SP) forward, scatter its gradient backward; three FP32
            // all-reduces per token for the vocab-parallel loss.
            head_tp: FwdBwd {
                forward: if tp {
                    let loss = collectives::all_reduce(
                        &cc.topo,
                        tpg,
                        d.tokens() * LOSS_ALLREDUCE_SCALARS * 4.0,
                    );
                    loss + if d.sp {
                        collectives::all_gather(&cc.topo, tpg, act)
                    } else {
                        0.0
                    }
                } else {
                    0.0
                },
                backward: if tp { scatter() } else { 0.0 },
            },
        }
    }
}

/// Per-kind layer costs, each computed on first use.
pub(super) struct KindCosts {
    costs: [Option<KindCost>; 4],
    /// Parameters per GPU of one dense layer and of one MoE layer.
    dense_params: GpuParams,
    moe_params: GpuParams,
}

impl KindCosts {
    fn new(st: &Setup) -> KindCosts {
        let (card, l) = (&st.s.model, st.l);
        let per_gpu = |k: LayerKind| {
            let p = card.layer_params(k);
            GpuParams {
                non_expert: p.non_expert_per_gpu(l.tp),
                expert: p.experts_per_gpu(l.ep, l.etp),
            }
        };
        let dense_params = per_gpu(LayerKind::Dense);
        KindCosts {
            costs: [None; 4],
            dense_params,
            moe_params: if card.moe.is_some() {
                per_gpu(LayerKind::Moe)
            } else {
                dense_params
            },
        }
    }

    fn get(&mut self, st: &Setup, shape: LayerShape) -> KindCost {
        *self.costs[shape_index(shape)]
            .get_or_insert_with(|| kind_cost(&st.s.model, shape, &st.cc, st.timer, &st.ctx))
    }

    fn params(&self, kind: LayerKind) -> GpuParams {
        if kind == LayerKind::Moe {
            self.moe_params
        } else {
            self.dense_params
        }
    }
}

/// One virtual stage per micro-batch on one GPU.
pub(super) struct StageCost {
    forward: Parts,
    /// Input-gradient backward, recomputation included.
    backward: Parts,
    /// Weight-gradient GEMMs.
    weight: f64,
    /// What recomputation adds to each backward pass.
    recompute: Parts,
    /// Model FLOPs of the forward.
    flops: f64,
    params: GpuParams,
    /// What its forward and backward add when they run unpaired under the EP overlap.
    alone: AloneParts,
}

/// Fill the workspace's per-virtual-stage costs (`chunk * pp + rank`) and return the model
/// FLOPs of one micro-batch's forward over all stages.
pub(super) fn stage_costs(st: &Setup, w: &mut Workspace) -> f64 {
    let nvs = st.pp * st.vpp;
    w.forward.clear();
    w.forward.resize(nvs, 0.0);
    w.backward.clear();
    w.backward.resize(nvs, 0.0);
    w.weight.clear();
    w.weight.resize(nvs, 0.0);
    w.parts.clear();
    w.parts.resize(nvs, Parts::default());
    w.params.clear();
    w.params.resize(nvs, GpuParams::default());
    w.recompute.clear();
    w.recompute.resize(nvs, 0.0);
    w.alone.clear();
    w.alone.resize(nvs, AloneParts::default());
    let mut kinds = KindCosts::new(st);
    let edges = EdgeCosts::of(st);
    let copies = memory::host_copy_bytes(st.s, st.l);
    let mut model_flops_all = 0.0;
    for r in 0..st.pp {
        for c in 0..st.vpp {
            let vs = c * st.pp + r;
            let cost = stage_cost(st, &mut kinds, &edges, &copies, r, c);
            model_flops_all += cost.flops;
            w.recompute[vs] = cost.recompute.total();
            w.forward[vs] = cost.forward.total();
            w.backward[vs] = cost.backward.total();
            w.weight[vs] = cost.weight;
            let mut both = cost.forward;
            both.add(&cost.backward, 1.0);
            both.compute += cost.weight;
            w.parts[vs] = both;
            w.params[vs] = cost.params;
            w.alone[vs] = cost.alone;
        }
    }
    model_flops_all
}

/// Chunk `c` of pipeline rank `r`: its decoder layers by shape, then the embedding, the loss
/// head and the MTP modules it holds.
fn stage_cost(
    st: &Setup,
    kinds: &mut KindCosts,
    edges: &EdgeCosts,
    copies: &HostCopyBytes,
    r: usize,
    c: usize,
) -> StageCost {
    let (card, l) = (&st.s.model, st.l);
    let vstage = l.virtual_stage(card.layers, card.mtp_layers, r as u32, c as u32);
    let mut cost = StageCost {
        forward: Parts::default(),
        backward: Parts::default(),
        weight: 0.0,
        recompute: Parts::default(),
        flops: 0.0,
        params: GpuParams::default(),
        alone: AloneParts::default(),
    };
    let range = vstage.range();
    let counts = shape_counts(card, range.clone());
    // Fully recomputed layers by shape: the block method's first ones or Primus' listed IDs.
    let mut recomputed = shape_counts(card, range.start..range.start);
    for run in l.recomputed_runs(range.clone()) {
        for (sum, part) in recomputed.iter_mut().zip(shape_counts(card, run)) {
            sum.layers += part.layers;
        }
    }
    // Layer-level activation offload moves the chunk's first layers (Megatron keeps the
    // last one: the rule caps the count below the chunk's layers).
    let offloaded_end = (range.start + l.activation_offload_layers).min(range.end);
    let offloaded = shape_counts(card, range.start..offloaded_end);
    for (i, sc) in counts.iter().enumerate() {
        if sc.layers == 0 {
            continue;
        }
        let k = kinds.get(st, sc.shape);
        let n = sc.layers as f64;
        cost.forward.add(&k.forward, n);
        cost.backward.add(&k.backward, n);
        cost.alone.add(&k.alone, n);
        cost.weight += k.weight * n;
        cost.flops += k.flops * n;
        match l.recompute {
            Recompute::Full => cost
                .recompute
                .add(&k.recompute_full, recomputed[i].layers as f64),
            Recompute::Selective => cost.recompute.add(&k.recompute_selective, n),
            Recompute::None => {}
        }
        let full = match l.recompute {
            Recompute::Full => recomputed[i].layers,
            _ => 0,
        };
        let whole = offloaded[i].layers;
        let groups = sc.layers.saturating_sub(full).saturating_sub(whole);
        add_offload_copies(st, &k, sc.shape.kind, copies, groups, whole, &mut cost);
        let p = kinds.params(sc.shape.kind);
        cost.params.non_expert += p.non_expert * n;
        cost.params.expert += p.expert * n;
    }
    if vstage.embedding {
        add_embedding(st, edges, &mut cost);
    }
    if vstage.loss {
        add_loss_head(st, edges, vstage.embedding, &mut cost);
    }
    if vstage.mtp > 0 {
        let recomputed = vstage.recomputed_mtp(l, card.layers);
        add_mtp(st, kinds, edges, (vstage.mtp, recomputed), &mut cost);
    }
    cost.backward.add(&cost.recompute, 1.0);
    cost
}

/// The host-link copies of the layout's activation offloads that a layer's compute does not
/// hide, added to the stage per micro-batch: `groups` layers of this kind copy their
/// fine-grained offload groups and `whole` layers all their activations (layer-level offload)
/// to the host in the forward, on a side stream behind the layer's forward kernels
/// (Megatron-Core `fine_grained_activation_offload.py`: `group_offload` on `d2h_stream`;
/// Transformer Engine's CPU offload handler), and back in the backward, where the reload
/// must arrive before the layer's backward can start and is prefetched behind the backward
/// of the layer after it (`h2d_stream`; the compute stream waits on it). Each direction costs
/// what the copy takes beyond the GPU time of one layer's pass (a layer's neighbours run the
/// same kernels). The margin of groups Megatron keeps on the GPU (two layers of a micro-batch,
/// see the memory model) is copied here too: at most two layers' copies too many per
/// micro-batch, on the safe side.
fn add_offload_copies(
    st: &Setup,
    k: &KindCost,
    kind: LayerKind,
    copies: &HostCopyBytes,
    groups: u32,
    whole: u32,
    cost: &mut StageCost,
) {
    let hw = &st.s.hardware;
    let (group_bytes, layer_bytes) = match kind {
        LayerKind::Moe if st.s.model.moe.is_some() => (copies.moe_groups, copies.moe_layer),
        _ => (copies.dense_groups, copies.dense_layer),
    };
    let forward = k.forward.total();
    let backward = k.backward.total() + k.weight;
    for (layers, bytes) in [(groups, group_bytes), (whole, layer_bytes)] {
        if layers == 0 || bytes <= 0.0 {
            continue;
        }
        let copy = hw.host_copy_seconds(bytes);
        let n = layers as f64;
        cost.forward.offload += n * (copy - forward).max(0.0);
        cost.backward.offload += n * (copy - backward).max(0.0);
    }
}

/// The embedding lookup and its table.
fn add_embedding(st: &Setup, edges: &EdgeCosts, cost: &mut StageCost) {
    let e = &edges.embedding;
    cost.forward.compute += e.forward;
    cost.forward.tp += edges.embedding_tp;
    cost.backward.compute += e.dgrad;
    cost.backward.tp += edges.embedding_tp;
    cost.params.non_expert += st.s.model.embedding_params() as f64 / st.l.tp as f64;
}

/// The output layer with its loss and the final norm; `embedding` when the same stage holds
/// the embedding.
fn add_loss_head(st: &Setup, edges: &EdgeCosts, embedding: bool, cost: &mut StageCost) {
    let (card, head) = (&st.s.model, &edges.head);
    cost.forward.compute += head.forward;
    cost.forward.tp += edges.head_tp.forward;
    cost.backward.compute += head.dgrad;
    cost.backward.tp += edges.head_tp.backward;
    cost.weight += head.wgrad;
    cost.flops += head.model_flops_forward;
    // The output layer's weights; a tied one is the embedding, already counted when it lives
    // on the same stage (Megatron keeps a copy on the last stage otherwise).
    let output = if card.tied_embeddings && embedding {
        0.0
    } else {
        card.output_params() as f64 / st.l.tp as f64
    };
    cost.params.non_expert += output + card.final_norm_params() as f64;
}

/// `modules` MTP modules, each a decoder layer of the last layer's kind plus its own
/// projection, norms, output layer and loss.
fn add_mtp(
    st: &Setup,
    kinds: &mut KindCosts,
    edges: &EdgeCosts,
    (modules, recomputed): (u32, u32),
    cost: &mut StageCost,
) {
    let card = &st.s.model;
    let h = card.hidden_size as f64;
    let extra = &edges.mtp_extra;
    let last = card.mtp_layer_kind();
    let k = kinds.get(
        st,
        LayerShape {
            kind: last,
            sliding: false,
        },
    );
    let n = modules as f64;
    cost.forward.add(&k.forward, n);
    cost.backward.add(&k.backward, n);
    cost.alone.add(&k.alone, n);
    cost.weight += (k.weight + extra.wgrad) * n;
    cost.forward.compute += extra.forward * n;
    cost.backward.compute += extra.dgrad * n;
    cost.forward.tp += edges.head_tp.forward * n;
    cost.backward.tp += edges.head_tp.backward * n;
    cost.flops += (k.flops + extra.model_flops_forward) * n;
    // Depths Primus' layer IDs recompute rerun their layer's forward in the backward.
    cost.recompute.add(&k.recompute_full, recomputed as f64);
    let p = kinds.params(last);
    cost.params.non_expert += (p.non_expert + 2.0 * h * h / st.l.tp as f64) * n;
    cost.params.expert += p.expert * n;
}
