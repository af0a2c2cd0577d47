//! The time model behind [`super::step_time`]: per-kind layer costs with the communication
//! each exposes, per-virtual-stage sums, the pipeline schedule, and the data-parallel
//! reduction, parameter gather and optimizer per pipeline rank.

use super::*;

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
}

impl Parts {
    pub fn total(&self) -> f64 {
        self.compute + self.tp + self.cp + self.ep + self.dp + self.host
    }

    fn add(&mut self, o: &Parts, times: f64) {
        self.compute += o.compute * times;
        self.tp += o.tp * times;
        self.cp += o.cp * times;
        self.ep += o.ep * times;
        self.dp += o.dp * times;
        self.host += o.host * times;
    }
}

/// One kind of decoder layer, per micro-batch on one GPU.
#[derive(Debug, Clone, Copy, Default)]
struct KindCost {
    forward: Parts,
    /// Input-gradient side of the backward (GEMM dgrad, attention/element-wise backward) and
    /// the communication of the backward.
    backward: Parts,
    /// Weight-gradient GEMMs.
    weight: f64,
    /// What full recomputation of the layer adds to its backward.
    recompute_full: Parts,
    /// What selective recomputation of the layout's modules adds.
    recompute_selective: Parts,
    /// Model FLOPs of the forward pass on this GPU.
    flops: f64,
}

/// The communicators and message sizes shared by all layer kinds.
struct CommContext<'a> {
    topo: Topology,
    place: Placement,
    d: Dims,
    l: &'a Layout,
}

impl CommContext<'_> {
    /// TP collectives around one block whose column-parallel input is `gather_bytes` (the
    /// gathered activation) and whose row-parallel output is `scatter_bytes`, forward and
    /// backward, exposed given the GEMM time they could hide behind.
    fn tp_block(
        &self,
        gather_bytes: f64,
        scatter_bytes: f64,
        gemm_f: f64,
        gemm_b: f64,
    ) -> (f64, f64) {
        let g = &self.place.tp;
        if g.size <= 1 {
            return (0.0, 0.0);
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
            (
                (fwd - gemm_f).max(0.0),
                (bwd + bwd_overlappable - gemm_b).max(0.0),
            )
        } else {
            (fwd, bwd + bwd_hidden)
        }
    }
}

fn kind_cost(
    card: &ModelCard,
    shape: LayerShape,
    cc: &CommContext,
    timer: &dyn OpTimer,
    ctx: &TimerContext,
) -> KindCost {
    let d = &cc.d;
    let l = cc.l;
    let t = OpTimes::of_layer(card, d, shape, timer, ctx);
    let h = card.hidden_size as f64;
    let tok = d.tokens();
    let act = tok * h * ACT_BYTES;
    let hw = ctx.hardware;
    let gemm_b = t.gemm_forward * 2.0;

    // --- TP / SP ---
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
    let (mut tp_f, mut tp_b) = cc.tp_block(attn_gather, act, t.gemm_forward / 2.0, gemm_b / 2.0);
    let moe_layer = shape.kind == LayerKind::Moe && card.moe.is_some();
    let mlp_tp = !moe_layer || card.shared_expert_ffn() > 0;
    let mut mlp_tp_f = 0.0;
    if mlp_tp {
        let (f, b) = cc.tp_block(act, act, t.gemm_forward / 2.0, gemm_b / 2.0);
        tp_f += f;
        tp_b += b;
        mlp_tp_f = f;
    }

    // --- CP: ring exchange of K and V, hidden behind the attention of the other chunks ---
    let (mut cp_f, mut cp_b) = (0.0, 0.0);
    if cc.place.cp.size > 1 {
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
        let kv_bytes = tok * kv_heads * (dqk + dv) / d.tp * ACT_BYTES;
        let crosses = cc.place.cp.domains > 1;
        let step_f = collectives::p2p(&cc.topo, crosses, kv_bytes);
        // Backward sends K, V and their gradients.
        let step_b = collectives::p2p(&cc.topo, crosses, 2.0 * kv_bytes);
        // c-1 exchanges, each overlapping the attention of one of the c chunks.
        cp_f = ((c - 1.0) * step_f - (c - 1.0) / c * t.attention_forward).max(0.0);
        cp_b = ((c - 1.0) * step_b - (c - 1.0) / c * t.attention_backward).max(0.0);
    }

    // --- EP: dispatch and combine all-to-all, plus the dispatcher's host sync ---
    let (mut ep_f, mut ep_b) = (0.0, 0.0);
    let (mut host_f, mut host_b) = (0.0, 0.0);
    if moe_layer && let Some(moe) = &card.moe {
        // Each GPU sends its k copies of its tokens; the busiest one receives more.
        let local = (moe.num_experts as f64 / d.ep).max(1.0);
        let routed_bytes = d.tokens_dispatched() * moe.top_k as f64 * h * ACT_BYTES;
        let a2a = collectives::all_to_all(&cc.topo, &cc.place.ep, routed_bytes)
            * compute::moe_load_imbalance(local, d.ep);
        let e = &hw.efficiency;
        let sync = e.moe_host_sync_us * MICROSECOND;
        // After the sync the host must issue the whole expert section before the GPU can run
        // it: the section lasts at least its launches x the host's cost per launch (backward:
        // autograd issues dgrad and wgrad, twice the launches).
        let host = e.cpu_launch_us * MICROSECOND * t.after_sync_launches;
        host_f = sync + (host - t.after_sync_forward - 2.0 * a2a).max(0.0);
        host_b = sync + (2.0 * host - t.after_sync_backward - 2.0 * a2a).max(0.0);
        ep_f = 2.0 * a2a;
        ep_b = 2.0 * a2a;
        if cc.place.etp.size > 1 {
            // Expert-TP: all-gather of the routed tokens before the experts, reduce-scatter
            // after; mirrored in the backward.
            let etp_bytes = d.routed_tokens(moe.top_k as f64) * h * ACT_BYTES;
            let x = collectives::all_gather(&cc.topo, &cc.place.etp, etp_bytes)
                + collectives::reduce_scatter(&cc.topo, &cc.place.etp, etp_bytes);
            ep_f += x;
            ep_b += x;
        }
    }

    // --- FSDP: gather the layer's weights forward and backward, reduce-scatter its
    // gradients, each prefetched behind the layer's compute ---
    let (mut dp_f, mut dp_b) = (0.0, 0.0);
    if l.fsdp {
        let p = card.layer_params(shape.kind);
        let dense = p.non_expert_per_gpu(l.tp);
        let experts = p.experts_per_gpu(l.ep, l.etp);
        let ag = collectives::all_gather(&cc.topo, &cc.place.dp_cp, dense * PARAM_BYTES)
            + collectives::all_gather(&cc.topo, &cc.place.edp, experts * PARAM_BYTES);
        let rs = collectives::reduce_scatter(&cc.topo, &cc.place.dp_cp, dense * grad_bytes(l))
            + collectives::reduce_scatter(&cc.topo, &cc.place.edp, experts * grad_bytes(l));
        dp_f = (ag - t.forward).max(0.0);
        dp_b = (ag + rs - t.backward()).max(0.0);
    }

    let forward = Parts {
        compute: t.forward,
        tp: tp_f,
        cp: cp_f,
        ep: ep_f,
        dp: dp_f,
        host: host_f,
    };
    let backward = Parts {
        compute: t.dgrad,
        tp: tp_b,
        cp: cp_b,
        ep: ep_b,
        dp: dp_b,
        host: host_b,
    };
    // Full recompute reruns the forward, communication included (not the FSDP gather: the
    // backward gathers anyway).
    let recompute_full = Parts { dp: 0.0, ..forward };
    // Selective recompute reruns the forward of its modules (`compute::recompute_ops`) and the
    // communication inside them: the attention core's CP exchange (core_attn), the dense
    // MLP's or the shared experts' TP collectives (mlp; moe, shared_experts), the MoE block's
    // dispatch and combine with the dispatcher's host sync (moe).
    let set = l.recompute_set();
    let recompute_selective = if set.is_empty() {
        Parts::default()
    } else {
        use crate::layout::RecomputeModule as M;
        let rerun = OpTimes::of(&compute::recompute_ops(card, d, shape, set), timer, ctx);
        let moe_block = moe_layer && set.contains(M::Moe);
        let mlp_comm = if moe_layer {
            moe_block || set.contains(M::SharedExperts)
        } else {
            set.contains(M::Mlp)
        };
        Parts {
            compute: rerun.forward,
            cp: if set.contains(M::CoreAttn) { cp_f } else { 0.0 },
            tp: if mlp_comm { mlp_tp_f } else { 0.0 },
            ep: if moe_block { ep_f } else { 0.0 },
            host: if moe_block { host_f } else { 0.0 },
            dp: 0.0,
        }
    };
    KindCost {
        forward,
        backward,
        weight: t.wgrad,
        recompute_full,
        recompute_selective,
        flops: t.model_flops_forward,
    }
}

/// Counts of each layer shape in a range of decoder layers.
fn shape_counts(card: &ModelCard, range: std::ops::Range<u32>) -> [(LayerShape, u32); 4] {
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
    let shape = |kind, sliding| LayerShape { kind, sliding };
    [
        (shape(LayerKind::Dense, false), dense_full),
        (shape(LayerKind::Dense, true), dense_n - dense_full),
        (shape(LayerKind::Moe, false), moe_full),
        (shape(LayerKind::Moe, true), moe_n - moe_full),
    ]
}

fn shape_index(shape: LayerShape) -> usize {
    (shape.kind == LayerKind::Moe) as usize * 2 + shape.sliding as usize
}

/// The whole time model.
pub(super) fn time_model(
    s: &Scenario,
    l: &Layout,
    timer: &dyn OpTimer,
    w: &mut Workspace,
) -> StepTime {
    let card = &s.model;
    let hw = &s.hardware;
    let gpus = s.cluster.gpus;
    let dp = l.dp(gpus).unwrap_or(1).max(1);
    let m = l.num_microbatches(s).max(1);
    let pp = l.pp.max(1) as usize;
    let vpp = l.chunks().max(1) as usize;
    let nvs = pp * vpp;
    let ctx = TimerContext {
        hardware: hw,
        precision: s.training.precision,
    };
    let topo = timer.topology(Topology::of_scenario(s));
    let place = Placement::of(&topo, gpus, l, dp);
    let d = Dims::of(s, l);
    let cc = CommContext { topo, place, d, l };

    // Per-kind layer costs, computed lazily once.
    let mut kinds: [Option<KindCost>; 4] = [None; 4];
    let mut kind = |shape: LayerShape| -> KindCost {
        let i = shape_index(shape);
        *kinds[i].get_or_insert_with(|| kind_cost(card, shape, &cc, timer, &ctx))
    };

    // Embedding, head and MTP extras.
    let h = card.hidden_size as f64;
    let act = d.tokens() * h * ACT_BYTES;
    let emb = OpTimes::of(&compute::embedding_ops(card, &d), timer, &ctx);
    let head = OpTimes::of(&compute::head_ops(card, &d), timer, &ctx);
    let mtp_extra = if card.mtp_layers > 0 {
        OpTimes::of(&compute::mtp_extra_ops(card, &d), timer, &ctx)
    } else {
        OpTimes::default()
    };
    let tpg = &cc.place.tp;
    // Embedding output: reduce-scatter (SP) or all-reduce over TP of the vocab-parallel
    // lookup; backward gathers the gradient.
    let emb_tp = if tpg.size > 1 {
        if d.sp {
            collectives::reduce_scatter(&cc.topo, tpg, act)
        } else {
            collectives::all_reduce(&cc.topo, tpg, act)
        }
    } else {
        0.0
    };
    // Head: gather the input (SP) forward, scatter its gradient backward; three FP32
    // all-reduces per token for the vocab-parallel loss.
    let head_tp_f = if tpg.size > 1 {
        let loss =
            collectives::all_reduce(&cc.topo, tpg, d.tokens() * LOSS_ALLREDUCE_SCALARS * 4.0);
        loss + if d.sp {
            collectives::all_gather(&cc.topo, tpg, act)
        } else {
            0.0
        }
    } else {
        0.0
    };
    let head_tp_b = if tpg.size > 1 {
        if d.sp {
            collectives::reduce_scatter(&cc.topo, tpg, act)
        } else {
            collectives::all_reduce(&cc.topo, tpg, act)
        }
    } else {
        0.0
    };

    // Per virtual stage costs and parameters.
    w.forward.clear();
    w.forward.resize(nvs, 0.0);
    w.backward.clear();
    w.backward.resize(nvs, 0.0);
    w.weight.clear();
    w.weight.resize(nvs, 0.0);
    w.parts.clear();
    w.parts.resize(nvs, Parts::default());
    w.params.clear();
    w.params.resize(nvs, (0.0, 0.0));
    w.recompute.clear();
    w.recompute.resize(nvs, 0.0);
    let mut model_flops_all = 0.0;
    // (non-expert, expert) parameters one GPU holds per layer of each kind.
    let per_gpu = |k: LayerKind| -> (f64, f64) {
        let p = card.layer_params(k);
        (p.non_expert_per_gpu(l.tp), p.experts_per_gpu(l.ep, l.etp))
    };
    let dense_params = per_gpu(LayerKind::Dense);
    let moe_params = if card.moe.is_some() {
        per_gpu(LayerKind::Moe)
    } else {
        dense_params
    };
    let params_of = |k: LayerKind| -> (f64, f64) {
        if k == LayerKind::Moe {
            moe_params
        } else {
            dense_params
        }
    };
    for r in 0..pp {
        for c in 0..vpp {
            let vs = c * pp + r;
            let st = l.virtual_stage(card.layers, card.mtp_layers, r as u32, c as u32);
            let mut fwd = Parts::default();
            let mut bwd = Parts::default();
            let mut wgt = 0.0;
            let mut flops = 0.0;
            let mut params = (0.0, 0.0);
            let mut recompute = Parts::default();
            let range = st.range();
            let recomputed_end = match l.recompute {
                Recompute::Full if l.recompute_layers > 0 => {
                    (range.start + l.recompute_layers).min(range.end)
                }
                _ => range.end,
            };
            let counts = shape_counts(card, range.clone());
            let recomputed = shape_counts(card, range.start..recomputed_end);
            for (i, &(shape, n)) in counts.iter().enumerate() {
                if n == 0 {
                    continue;
                }
                let k = kind(shape);
                let n = n as f64;
                fwd.add(&k.forward, n);
                bwd.add(&k.backward, n);
                wgt += k.weight * n;
                flops += k.flops * n;
                match l.recompute {
                    Recompute::Full => recompute.add(&k.recompute_full, recomputed[i].1 as f64),
                    Recompute::Selective => recompute.add(&k.recompute_selective, n),
                    Recompute::None => {}
                }
                let (pd, pe) = params_of(shape.kind);
                params.0 += pd * n;
                params.1 += pe * n;
            }
            if st.embedding {
                fwd.compute += emb.forward;
                fwd.tp += emb_tp;
                bwd.compute += emb.dgrad;
                bwd.tp += emb_tp;
                params.0 += card.embedding_params() as f64 / l.tp as f64;
            }
            if st.loss {
                fwd.compute += head.forward;
                fwd.tp += head_tp_f;
                bwd.compute += head.dgrad;
                bwd.tp += head_tp_b;
                wgt += head.wgrad;
                flops += head.model_flops_forward;
                // The output layer's weights; a tied one is the embedding, already counted when
                // it lives on the same stage (Megatron keeps a copy on the last stage otherwise).
                let output = if card.tied_embeddings && st.embedding {
                    0.0
                } else {
                    card.output_params() as f64 / l.tp as f64
                };
                params.0 += output + card.final_norm_params() as f64;
            }
            if st.mtp > 0 {
                // Each MTP module: a decoder layer of the last layer's kind plus its own
                // projection, norms, output layer and loss.
                let last = card.layer_kind(card.layers.saturating_sub(1));
                let shape = LayerShape {
                    kind: last,
                    sliding: false,
                };
                let k = kind(shape);
                let n = st.mtp as f64;
                fwd.add(&k.forward, n);
                bwd.add(&k.backward, n);
                wgt += (k.weight + mtp_extra.wgrad) * n;
                fwd.compute += mtp_extra.forward * n;
                bwd.compute += mtp_extra.dgrad * n;
                fwd.tp += head_tp_f * n;
                bwd.tp += head_tp_b * n;
                flops += (k.flops + mtp_extra.model_flops_forward) * n;
                let (pd, pe) = params_of(last);
                params.0 += (pd + 2.0 * h * h / l.tp as f64) * n;
                params.1 += pe * n;
            }
            model_flops_all += flops;
            bwd.add(&recompute, 1.0);
            w.recompute[vs] = recompute.total();
            w.forward[vs] = fwd.total();
            w.backward[vs] = bwd.total();
            w.weight[vs] = wgt;
            let mut both = fwd;
            both.add(&bwd, 1.0);
            both.compute += wgt;
            w.parts[vs] = both;
            w.params[vs] = params;
        }
    }

    // Pipeline messages: the hidden states of one micro-batch (scattered over TP under SP,
    // Megatron's scatter-gather optimisation).
    let p2p_bytes = if d.sp { act / d.tp } else { act };
    let p2p = if pp > 1 {
        collectives::p2p(&cc.topo, cc.place.pp_crosses_domain, p2p_bytes)
    } else {
        0.0
    };
    let schedule = if vpp > 1 {
        Schedule::Interleaved
    } else if l.schedule == Schedule::ZeroBubble {
        Schedule::ZeroBubble
    } else {
        Schedule::OneFOneB
    };
    w.p2p = p2p;
    let costs = StageCosts {
        pp,
        vpp,
        forward: &w.forward,
        backward: &w.backward,
        weight: &w.weight,
        p2p,
    };
    let summary = w.sim.run_lean(schedule, &costs, m as usize);

    // Data-parallel reduction, parameter gather and optimizer, per pipeline rank.
    let hbm = hw.memory_bandwidth() * hw.efficiency.memory_bound;
    let overhead = hw.efficiency.kernel_overhead_us * MICROSECOND;
    let edp = (gpus / l.pp.max(1) / (l.ep * l.etp).max(1)).max(1) as f64;
    let dp_cp = (dp * l.cp) as f64;
    let mut best = (f64::MIN, 0usize, 0.0, 0.0);
    // Gradient reduction and parameter gather of one chunk depend only on its (non-expert,
    // expert) parameters, and most chunks hold the same: compute each distinct pair once.
    let mut dp_costs: [((f64, f64), (f64, f64)); 4] = [((f64::NAN, f64::NAN), (0.0, 0.0)); 4];
    let mut dp_costs_len = 0usize;
    for r in 0..pp {
        let tl = w.sim.ranks()[r];
        let mut grad_finish: f64 = 0.0;
        let mut ag_total = 0.0;
        let mut ag_bucket: f64 = 0.0;
        let mut local = (0.0, 0.0);
        // Chunks in the order their gradients complete (last chunk first).
        for c in (0..vpp).rev() {
            let vs = c * pp + r;
            let (pd, pe) = w.params[vs];
            local.0 += pd;
            local.1 += pe;
            if l.fsdp {
                continue;
            }
            let lb = w.sim.last_backward()[vs];
            let reduce = |g: &Group, n: f64| -> f64 {
                if l.distributed_optimizer {
                    collectives::reduce_scatter(&cc.topo, g, n * grad_bytes(l))
                } else {
                    collectives::all_reduce(&cc.topo, g, n * grad_bytes(l))
                }
            };
            let gather = |g: &Group, n: f64| -> f64 {
                if l.distributed_optimizer {
                    collectives::all_gather(&cc.topo, g, n * PARAM_BYTES)
                } else {
                    0.0
                }
            };
            let (comm, ag) = match dp_costs[..dp_costs_len]
                .iter()
                .find(|(key, _)| *key == (pd, pe))
            {
                Some(&(_, costs)) => costs,
                None => {
                    let costs = (
                        reduce(&cc.place.dp_cp, pd) + reduce(&cc.place.edp, pe),
                        gather(&cc.place.dp_cp, pd) + gather(&cc.place.edp, pe),
                    );
                    if dp_costs_len < dp_costs.len() {
                        dp_costs[dp_costs_len] = ((pd, pe), costs);
                        dp_costs_len += 1;
                    }
                    costs
                }
            };
            let chunk_params = pd + pe;
            let bucket_share = if chunk_params > 0.0 {
                (BUCKET_PARAMS.max(1e6 * dp as f64) / chunk_params).min(1.0)
            } else {
                1.0
            };
            grad_finish = if l.overlap_grad_reduce {
                // Buckets are released while the last micro-batch's backward runs; the stream
                // finishes after its work, and no earlier than the last bucket after the end.
                (grad_finish.max(lb.start) + comm).max(lb.end + comm * bucket_share)
            } else {
                grad_finish.max(tl.end) + comm
            };
            if l.distributed_optimizer {
                ag_total += ag;
                ag_bucket = ag_bucket.max(ag * bucket_share);
            }
        }
        let grad_exposed = (grad_finish - tl.end).max(0.0);
        let ag_exposed = if l.overlap_param_gather {
            (ag_total - tl.first_forward_end).max(0.0) + ag_bucket
        } else {
            ag_total
        };
        let shard = if l.distributed_optimizer || l.fsdp {
            local.0 / dp_cp + local.1 / edp
        } else {
            local.0 + local.1
        };
        // Adam over the shard, and zeroing the local gradient buffer.
        let optimizer = shard * ADAM_BYTES_PER_PARAM / hbm
            + (local.0 + local.1) * grad_bytes(l) / hbm
            + OPTIMIZER_KERNELS * overhead;
        let finish = tl.end + grad_exposed + ag_exposed + optimizer;
        if finish > best.0 {
            best = (finish, r, grad_exposed + ag_exposed, optimizer);
        }
    }
    let (finish, critical, dp_exposed, optimizer) = best;
    let other = hw.efficiency.step_overhead_ms * 1e-3;
    let step = finish + other;

    // Breakdown of the critical rank.
    let mut tl = w.sim.ranks()[critical];
    let p2p_wait = w.sim.p2p_wait(critical);
    tl.p2p_wait = p2p_wait;
    let mut parts = Parts::default();
    for c in 0..vpp {
        parts.add(&w.parts[c * pp + critical], m as f64);
    }
    let breakdown = Breakdown {
        compute: parts.compute,
        tp_comm: parts.tp,
        cp_comm: parts.cp,
        ep_comm: parts.ep,
        pp_comm: p2p_wait,
        dp_comm: parts.dp + dp_exposed,
        bubble: tl.bubble(),
        host: parts.host,
        optimizer,
        other,
    };

    // Model FLOPs: every GPU of a TP x CP group computes its share of each micro-batch; the
    // backward counts twice the forward (no recompute).
    let model_flops_per_step =
        3.0 * model_flops_all * (l.tp * l.cp) as f64 * (m * dp as u64) as f64;
    let tokens = (m * dp as u64 * l.micro_batch_size as u64) as f64 * s.training.seq_length as f64;
    let tflops = model_flops_per_step / step / gpus as f64 / 1e12;
    StepTime {
        step_time_seconds: step,
        tokens_per_second_per_gpu: tokens / step / gpus as f64,
        tflops_per_gpu: tflops,
        mfu: tflops * 1e12 / hw.peak_flops(s.training.precision),
        breakdown,
        bubble_fraction: summary.bubble_fraction,
        num_microbatches: m,
        dp,
        critical_stage: critical as u32,
        model_flops_per_step,
        pipeline_seconds: summary.makespan,
    }
}
