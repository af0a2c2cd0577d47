//! Properties of the memory model over random legal layouts: memory is never negative; more
//! recomputation (a coarser granularity, more layers, one more selective-recompute module)
//! never increases activation memory, nor does one more layer ID of Primus' per-layer
//! recompute (and every layer listed is the uniform full recompute); more data parallelism
//! never increases the per-GPU optimizer memory with the distributed optimizer; more pipeline
//! parallelism never increases the bottleneck stage's weights.

use primus_oracle::layout::{Layout, Recompute, RecomputeModule, Schedule};
use primus_oracle::memory::estimate;
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};
use proptest::prelude::*;

const MODELS: &[&str] = &[
    "llama2-7b",
    "llama3.1-8b",
    "llama3.1-70b",
    "mixtral-8x7b",
    "qwen3-30b-a3b",
    "gpt-22b",
    "gpt-oss-120b",
];
const GPUS: &[&str] = &["h100-sxm", "mi300x", "b200"];

#[derive(Debug, Clone)]
struct Case {
    model: usize,
    gpu: usize,
    tp: u32,
    pp: u32,
    vpp: u32,
    cp: u32,
    ep: u32,
    dp: u32,
    mbs: u32,
    m_groups: u64,
    seq: u64,
    recompute: Recompute,
    fsdp: bool,
    distopt: bool,
    schedule: u8,
    fp8: bool,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            0..MODELS.len(),
            0..GPUS.len(),
            prop::sample::select(vec![1u32, 2, 4, 8]),
            prop::sample::select(vec![1u32, 2, 4]),
            prop::sample::select(vec![1u32, 2]),
            prop::sample::select(vec![1u32, 2]),
            prop::sample::select(vec![1u32, 2, 4, 8]),
            prop::sample::select(vec![1u32, 2, 4, 8]),
        ),
        (
            prop::sample::select(vec![1u32, 2]),
            1u64..4,
            prop::sample::select(vec![2048u64, 4096, 8192]),
            prop::sample::select(vec![Recompute::None, Recompute::Selective, Recompute::Full]),
            any::<bool>(),
            any::<bool>(),
            0u8..3,
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (model, gpu, tp, pp, vpp, cp, ep, dp),
                (mbs, m_groups, seq, recompute, fsdp, distopt, schedule, fp8),
            )| Case {
                model,
                gpu,
                tp,
                pp,
                vpp,
                cp,
                ep,
                dp,
                mbs,
                m_groups,
                seq,
                recompute,
                fsdp,
                distopt,
                schedule,
                fp8,
            },
        )
}

fn build(c: &Case) -> (Scenario, Layout) {
    let cat = Catalog::builtin().unwrap();
    let model = cat.model(MODELS[c.model]).unwrap().clone();
    let moe = model.moe.is_some();
    let schedule = match (c.schedule, c.pp > 1 && c.vpp > 1) {
        (_, true) => Schedule::Interleaved,
        (2, false) if c.pp > 1 => Schedule::ZeroBubble,
        _ => Schedule::OneFOneB,
    };
    let vpp = if schedule == Schedule::Interleaved {
        c.vpp
    } else {
        1
    };
    let gpus = c.tp * c.pp * c.cp * c.dp;
    // Micro-batches: a multiple of pp (the interleaved schedule needs it).
    let m = c.m_groups * c.pp as u64;
    let l = Layout {
        tp: c.tp,
        pp: c.pp,
        vpp,
        cp: c.cp,
        ep: if moe { c.ep } else { 1 },
        micro_batch_size: c.mbs,
        recompute: c.recompute,
        fsdp: c.fsdp,
        distributed_optimizer: c.distopt,
        schedule,
        ..Layout::default()
    };
    let s = Scenario {
        model,
        hardware: cat.hardware(GPUS[c.gpu]).unwrap().clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node: 8,
        },
        training: Training {
            seq_length: c.seq,
            global_batch_size: m * c.mbs as u64 * c.dp as u64,
            precision: if c.fp8 {
                Precision::Fp8
            } else {
                Precision::Bf16
            },
        },
    };
    (s, l)
}

/// Each stage's activation bytes (rematerialisation included) of `l`.
fn activations(s: &Scenario, l: &Layout) -> Vec<f64> {
    estimate(s, l)
        .stages
        .iter()
        .map(|st| st.activations_bytes)
        .collect()
}

/// No stage of `a` holds more than the same stage of `b` (up to rounding).
fn no_larger(a: &[f64], b: &[f64]) -> bool {
    a.iter().zip(b).all(|(x, y)| *x <= *y * (1.0 + 1e-12))
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        max_global_rejects: 100_000,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn memory_is_never_negative(c in case()) {
        let (s, l) = build(&c);
        prop_assume!(l.check(&s).is_ok());
        let r = estimate(&s, &l);
        for st in &r.stages {
            for v in [st.weights_bytes, st.gradients_bytes, st.optimizer_bytes,
                      st.activations_bytes, st.other_bytes, st.total_bytes, st.parameters,
                      st.logits_bytes, st.buffers_bytes, st.fragmentation_bytes] {
                prop_assert!(v.is_finite() && v >= 0.0, "{v} in {st:?}");
            }
            prop_assert!(st.total_bytes > 0.0);
        }
        prop_assert!(r.peak_bytes > 0.0 && r.capacity_bytes >= r.usable_bytes);
    }

    #[test]
    fn more_recompute_never_increases_activations(c in case()) {
        let (s, base) = build(&c);
        let with = |recompute, recompute_layers| Layout { recompute, recompute_layers, ..base.clone() };
        let none = with(Recompute::None, 0);
        prop_assume!(none.check(&s).is_ok());
        let a_none = activations(&s, &none);
        let a_sel = activations(&s, &with(Recompute::Selective, 0));
        let a_full = activations(&s, &with(Recompute::Full, 0));
        prop_assert!(no_larger(&a_sel, &a_none), "selective {a_sel:?} > none {a_none:?}");
        prop_assert!(no_larger(&a_full, &a_sel), "full {a_full:?} > selective {a_sel:?}");
        // Partial full recompute: more recomputed layers per chunk, less memory.
        let most = (0..base.pp).map(|r| base.chunk_layers(s.model.layers, r)).max().unwrap();
        let mut prev = a_none.clone();
        for n in 1..=most {
            let a = activations(&s, &with(Recompute::Full, n));
            prop_assert!(no_larger(&a, &prev), "full({n}) {a:?} > {prev:?}");
            prev = a;
        }
        prop_assert!(no_larger(&a_full, &prev));
    }

    #[test]
    fn more_dp_never_increases_optimizer_memory(c in case()) {
        let (s, l) = build(&Case { distopt: true, ..c.clone() });
        prop_assume!(l.check(&s).is_ok());
        let (s2, l2) = build(&Case { distopt: true, dp: c.dp * 2, ..c });
        prop_assume!(l2.check(&s2).is_ok());
        let a = estimate(&s, &l);
        let b = estimate(&s2, &l2);
        for (x, y) in a.stages.iter().zip(&b.stages) {
            prop_assert!(y.optimizer_bytes <= x.optimizer_bytes,
                "dp {} -> {}: {} > {}", c.dp, c.dp * 2, y.optimizer_bytes, x.optimizer_bytes);
        }
    }

    #[test]
    fn more_pp_never_increases_bottleneck_weights(c in case(), factor in prop::sample::select(vec![2u32, 4])) {
        let (s, l) = build(&c);
        prop_assume!(l.check(&s).is_ok());
        let (s2, l2) = build(&Case { pp: c.pp * factor, ..c });
        prop_assume!(l2.check(&s2).is_ok());
        let a = estimate(&s, &l);
        let b = estimate(&s2, &l2);
        let wa = a.stages[a.bottleneck_stage as usize].weights_bytes;
        let wb = b.stages[b.bottleneck_stage as usize].weights_bytes;
        prop_assert!(wb <= wa, "pp {} -> {}: bottleneck weights {wa} -> {wb}", l.pp, l2.pp);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..config() })]

    #[test]
    fn adding_a_recompute_module_never_increases_activations(
        c in case(),
        bits in 0u8..128,
        added in 0usize..7,
    ) {
        // Selective recompute of a random module set, then of the set with one more module:
        // no stage's activations (rematerialisation included) grow.
        let (s, base) = build(&c);
        let legal = |m: &RecomputeModule| match m {
            RecomputeModule::MoeAct | RecomputeModule::Moe | RecomputeModule::SharedExperts => {
                s.model.moe.is_some()
            }
            RecomputeModule::MlaUpProj => s.model.mla.is_some(),
            _ => true,
        };
        let set: Vec<RecomputeModule> = RecomputeModule::ALL
            .into_iter()
            .enumerate()
            .filter(|(i, m)| bits & (1 << i) != 0 && legal(m))
            .map(|(_, m)| m)
            .collect();
        let m = RecomputeModule::ALL[added];
        prop_assume!(legal(&m) && !set.contains(&m));
        let with = |modules: Vec<RecomputeModule>| Layout {
            recompute: Recompute::Selective,
            recompute_modules: Some(modules),
            ..base.clone()
        };
        let before = with(set.clone());
        prop_assume!(before.check(&s).is_ok());
        let mut more = set.clone();
        more.push(m);
        let after = with(more);
        let (a, b) = (activations(&s, &before), activations(&s, &after));
        prop_assert!(no_larger(&b, &a), "adding {m} to {set:?}: {a:?} -> {b:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..config() })]

    #[test]
    fn adding_a_recompute_layer_id_never_increases_activations(
        c in case(),
        mask in any::<u64>(),
        added in 0u32..4096,
    ) {
        // Primus' per-layer full recompute (`recompute_layer_ids`) of a random set of decoder
        // layers, then of the set with one more layer: no stage's activations (the rebuilt
        // layer's transient included) grow, none exceeds no recompute at all, and listing
        // every layer is the uniform full recompute.
        let (s, base) = build(&Case { recompute: Recompute::Full, ..c });
        let layers = s.model.layers;
        let ids: Vec<u32> = (0..layers.min(64)).filter(|i| mask & (1 << i) != 0).collect();
        let x = added % layers;
        prop_assume!(!ids.is_empty() && !ids.contains(&x));
        let with = |ids: Vec<u32>| Layout {
            recompute: Recompute::Full,
            recompute_layers: 0,
            recompute_layer_ids: Some(ids),
            ..base.clone()
        };
        let before = with(ids.clone());
        prop_assume!(before.check(&s).is_ok());
        let mut more = ids.clone();
        more.push(x);
        more.sort_unstable();
        let after = with(more);
        prop_assert!(after.check(&s).is_ok(), "{:?}", after.check(&s));
        let none = activations(&s, &Layout { recompute: Recompute::None, ..base.clone() });
        let (a, b) = (activations(&s, &before), activations(&s, &after));
        prop_assert!(no_larger(&b, &a), "adding layer {x} to {ids:?}: {a:?} -> {b:?}");
        prop_assert!(no_larger(&a, &none), "{ids:?} {a:?} > none {none:?}");
        let every = activations(&s, &with((0..layers).collect()));
        let uniform = activations(&s, &Layout { recompute: Recompute::Full, recompute_layers: 0, ..base.clone() });
        prop_assert_eq!(every, uniform);
    }
}
