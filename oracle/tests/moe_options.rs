//! The MoE execution options (issue 16): each legality rule with the rule id and field it
//! names (Megatron-LM's own checks: `TransformerConfig.__post_init__`, the flex dispatcher's
//! constructor, Primus's ROCm argument validation), and the Megatron flags written for every
//! option reading back to the same layout.

use primus_oracle::layout::{
    CudaGraph, CudaGraphImpl, CudaGraphModule, Dispatch, Factor, Fp8Recipe, GroupedGemm, Layout,
    LayoutError, LoadBalancing, Recompute, RecomputeModule, RouterDtype, Schedule, TokenDispatcher,
};
use primus_oracle::megatron::{MegatronArgs, layout_args};
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::Scenario;

mod common;

fn scenario(model: &str, gpu: &str, gpus: u32, precision: Precision) -> Scenario {
    common::scenario(model, gpu, gpus, None, 4096, 256, precision)
}

/// Mixtral 8x7B on 16 H100, TP1 PP2 VPP2 EP8: legal with every dispatcher.
fn mixtral() -> (Scenario, Layout) {
    let s = scenario("mixtral-8x7b", "h100-sxm", 16, Precision::Bf16);
    let l = Layout {
        pp: 2,
        vpp: 2,
        ep: 8,
        schedule: Schedule::Interleaved,
        ..Layout::default()
    };
    (s, l)
}

fn broken(s: &Scenario, l: &Layout) -> LayoutError {
    l.check(s).expect_err("layout should be illegal")
}

fn expect(s: &Scenario, l: &Layout, rule: &str, field: &str) {
    let e = broken(s, l);
    assert_eq!((e.rule, e.field.as_str()), (rule, field), "{e}");
}

#[test]
fn every_dispatcher_the_profile_runs_is_legal() {
    let (s, mut l) = mixtral();
    for d in [
        Dispatch::Allgather,
        Dispatch::Alltoall,
        Dispatch::Deepep,
        Dispatch::Hybridep,
    ] {
        l.moe.set_dispatch(d);
        l.check(&s)
            .unwrap_or_else(|e| panic!("{}: {e}", d.as_str()));
    }
    // Primus-Turbo DeepEP is AMD's: not on H100, legal on MI355X (with fp32 router probs).
    l.moe.set_dispatch(Dispatch::PrimusTurboDeepep);
    expect(
        &s,
        &l,
        "flex-backend-on-gpu",
        "spec.parallelism.moe.flexBackend",
    );
    let amd = scenario("mixtral-8x7b", "mi355x", 16, Precision::Bf16);
    l.check(&amd).expect("Primus-Turbo DeepEP on MI355X");
    l.moe.router_dtype = None;
    expect(
        &amd,
        &l,
        "turbo-deepep-fp32-router",
        "spec.parallelism.moe.routerDtype",
    );
    // DeepEP is NVIDIA's: not on MI355X.
    l.moe.set_dispatch(Dispatch::Deepep);
    expect(
        &amd,
        &l,
        "flex-backend-on-gpu",
        "spec.parallelism.moe.flexBackend",
    );
}

#[test]
fn the_flex_dispatcher_needs_expert_tp_or_ep() {
    // MoEFlexTokenDispatcher: "Flex token dispatcher requires TPxEP > 1" (its TP is the
    // expert TP group).
    let (s, mut l) = mixtral();
    l.ep = 1;
    l.moe.set_dispatch(Dispatch::Deepep);
    let e = broken(&s, &l);
    assert_eq!(e.rule, "flex-needs-etp-ep", "{e}");
    assert_eq!(e.field, "spec.parallelism.moe.tokenDispatcher");
    l.moe.set_dispatch(Dispatch::Alltoall);
    l.check(&s).expect("alltoall without EP");
    // A flex backend without the flex dispatcher.
    l.ep = 8;
    l.moe.flex_backend = Some(primus_oracle::layout::FlexBackend::Deepep);
    expect(
        &s,
        &l,
        "flex-backend-needs-flex",
        "spec.parallelism.moe.flexBackend",
    );
}

#[test]
fn ep_overlap_rules() {
    let (s, mut l) = mixtral();
    l.moe.set_dispatch(Dispatch::Alltoall);
    l.moe.ep_overlap = true;
    l.check(&s).expect("overlap with alltoall, EP 8, VPP 2");
    l.moe.delay_wgrad = true;
    l.check(&s).expect("with delayed weight gradients");
    type Change = fn(&mut Layout);
    let cases: [(&str, Change); 5] = [
        ("ep", |l| {
            l.ep = 1;
        }),
        ("allgather", |l| l.moe.set_dispatch(Dispatch::Allgather)),
        ("vpp", |l| {
            l.vpp = 1;
            l.schedule = Schedule::OneFOneB;
        }),
        ("full recompute", |l| l.recompute = Recompute::Full),
        ("moe module", |l| {
            l.recompute = Recompute::Selective;
            l.recompute_modules = Some(vec![RecomputeModule::Moe]);
        }),
    ];
    for (what, change) in cases {
        let mut x = l.clone();
        change(&mut x);
        let e = broken(&s, &x);
        assert_eq!(
            (e.rule, e.field.as_str()),
            ("ep-overlap", "spec.parallelism.moe.epOverlap"),
            "{what}: {e}"
        );
    }
    let mut x = l.clone();
    x.moe.ep_overlap = false;
    expect(
        &s,
        &x,
        "delay-wgrad-needs-overlap",
        "spec.parallelism.moe.delayWgrad",
    );
}

#[test]
fn capacity_rules() {
    let (s, mut l) = mixtral();
    l.moe.set_dispatch(Dispatch::Alltoall);
    l.moe.capacity_factor = Some(Factor(1.25));
    l.moe.pad_to_capacity = true;
    l.check(&s).expect("capacity 1.25 with padding");
    let mut x = l.clone();
    x.moe.capacity_factor = Some(Factor(0.0));
    expect(
        &s,
        &x,
        "capacity-factor-range",
        "spec.parallelism.moe.capacityFactor",
    );
    // A subnormal factor priced the experts' GEMMs at a vanishing fraction of a row, the step
    // time infinite: refused, the value shown readably; the smallest allowed one projects a
    // finite step, padded or dropping.
    x.moe.capacity_factor = Some(Factor(1e-310));
    let e = broken(&s, &x);
    assert_eq!(e.rule, "capacity-factor-range");
    assert!(e.to_string().contains("got 1e-310"), "{e}");
    for pad in [true, false] {
        x.moe.capacity_factor = Some(Factor(primus_oracle::layout::MIN_CAPACITY_FACTOR));
        x.moe.pad_to_capacity = pad;
        x.check(&s).expect("the smallest capacity factor");
        let p = primus_oracle::projection::project(&s, &x).unwrap();
        assert!(p.step_time_seconds.is_finite() && p.step_time_seconds > 0.0);
    }
    // A model card's default capacity factor is held to the same range.
    let mut card = s.model.clone();
    card.moe.as_mut().unwrap().capacity_factor = Some(1e300);
    let err = card.validate("spec.model.card").unwrap_err().to_string();
    assert!(
        err.contains("spec.model.card.moe.capacityFactor") && err.contains("got 1e300"),
        "{err}"
    );
    let mut x = l.clone();
    x.moe.capacity_factor = None;
    expect(
        &s,
        &x,
        "pad-needs-capacity",
        "spec.parallelism.moe.padToCapacity",
    );
    let mut x = l.clone();
    x.moe.set_dispatch(Dispatch::Deepep);
    expect(
        &s,
        &x,
        "pad-not-with-deepep",
        "spec.parallelism.moe.padToCapacity",
    );
}

#[test]
fn fp8_recipe_and_cuda_graph_rules() {
    let (s, mut l) = mixtral();
    l.fp8_recipe = Some(Fp8Recipe::Blockwise);
    expect(&s, &l, "fp8-recipe-needs-fp8", "spec.parallelism.fp8Recipe");
    let fp8 = scenario("mixtral-8x7b", "h100-sxm", 16, Precision::Fp8);
    l.check(&fp8).expect("blockwise on H100");
    l.fp8_recipe = Some(Fp8Recipe::Mxfp8);
    expect(&fp8, &l, "fp8-recipe-on-gpu", "spec.parallelism.fp8Recipe");
    let b200 = scenario("mixtral-8x7b", "b200", 16, Precision::Fp8);
    l.check(&b200).expect("MXFP8 on B200");
    let (s, mut l) = mixtral();
    l.cuda_graph = CudaGraph {
        implementation: CudaGraphImpl::FullIteration,
        modules: vec![CudaGraphModule::Attn],
    };
    expect(
        &s,
        &l,
        "cuda-graph-modules-need-per-layer",
        "spec.parallelism.cudaGraph.modules",
    );
}

#[test]
fn megatron_fsdp_combines_with_ep_and_torch_fsdp_does_not() {
    let s = scenario("qwen3-30b-a3b", "h100-sxm", 16, Precision::Bf16);
    let mut l = Layout {
        ep: 8,
        fsdp: true,
        distributed_optimizer: false,
        ..Layout::default()
    };
    assert!(l.check(&s).is_err(), "torch FSDP2 with EP");
    l.fsdp_kind = primus_oracle::layout::FsdpKind::Megatron;
    l.check(&s).expect("Megatron-FSDP with EP 8");
}

/// Flags written for a layout, parsed back.
fn flags_round_trip(s: &Scenario, l: &Layout) -> (Vec<String>, Layout) {
    let args = layout_args(s, l);
    let mut back = MegatronArgs::parse(args.iter().map(String::as_str))
        .layout(&s.model)
        .expect("the written flags parse");
    if l.tp == 1 {
        // Sequence parallelism means nothing at TP 1 and is not written.
        back.sequence_parallel = l.sequence_parallel;
    }
    (args, back)
}

#[test]
fn every_option_is_written_and_read_back() {
    let (s, base) = mixtral();
    let mut variants = Vec::new();
    for d in [
        Dispatch::Allgather,
        Dispatch::Alltoall,
        Dispatch::Deepep,
        Dispatch::Hybridep,
    ] {
        let mut l = base.clone();
        l.moe.set_dispatch(d);
        variants.push(l);
    }
    let mut all = base.clone();
    all.moe.set_dispatch(Dispatch::Alltoall);
    all.moe.grouped_gemm = GroupedGemm::Legacy;
    all.moe.permute_fusion = true;
    all.moe.router_fusion = true;
    all.moe.ep_overlap = true;
    all.moe.delay_wgrad = true;
    all.moe.load_balancing = LoadBalancing::SeqAuxLoss;
    all.moe.force_load_balancing = true;
    all.moe.capacity_factor = Some(Factor(1.5));
    all.moe.pad_to_capacity = true;
    all.moe.router_dtype = Some(RouterDtype::Fp64);
    all.cuda_graph = CudaGraph {
        implementation: CudaGraphImpl::TransformerEngine,
        modules: vec![CudaGraphModule::Attn, CudaGraphModule::MoeRouter],
    };
    variants.push(all);
    let mut rank = base.clone();
    rank.moe.set_dispatch(Dispatch::Hybridep);
    rank.moe.rank_capacity_factor = Some(Factor(1.5));
    rank.moe.grouped_gemm = GroupedGemm::Grouped;
    rank.moe.flex_num_sms = Some(16);
    variants.push(rank);
    let mut sms = base.clone();
    sms.moe.set_dispatch(Dispatch::Deepep);
    sms.moe.flex_num_sms = Some(24);
    variants.push(sms);
    for l in &variants {
        l.check(&s).unwrap_or_else(|e| panic!("{}: {e}", l.label()));
        let (args, back) = flags_round_trip(&s, l);
        assert_eq!(&back, l, "{args:?}");
        // The dispatcher is always named, also Megatron's default.
        let at = args
            .iter()
            .position(|a| a == "--moe-token-dispatcher-type")
            .expect("the dispatcher is named");
        assert_eq!(args[at + 1], l.moe.token_dispatcher.as_str());
    }
    // FP8 recipe, Primus-Turbo DeepEP (Primus's own switches).
    let fp8 = scenario("mixtral-8x7b", "mi355x", 16, Precision::Fp8);
    let mut l = base.clone();
    l.fp8_recipe = Some(Fp8Recipe::Mxfp8);
    l.moe.set_dispatch(Dispatch::PrimusTurboDeepep);
    l.moe.grouped_gemm = GroupedGemm::Grouped;
    l.check(&fp8).expect("legal on MI355X");
    let (args, back) = flags_round_trip(&fp8, &l);
    assert_eq!(back, l, "{args:?}");
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--use_turbo_deepep" && w[1] == "True")
    );
    assert_eq!(back.moe.token_dispatcher, TokenDispatcher::Flex);
    // Its CUs under Primus's own flag (`turbo_deepep_num_cu`).
    l.moe.flex_num_sms = Some(64);
    let (args, back) = flags_round_trip(&fp8, &l);
    assert_eq!(back, l, "{args:?}");
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--turbo_deepep_num_cu" && w[1] == "64"),
        "{args:?}"
    );
    assert!(!args.iter().any(|a| a == "--moe-flex-dispatcher-num-sms"));
}

/// `flexNumSms` (`--moe-flex-dispatcher-num-sms`): only with the flex dispatcher, even (DeepEP
/// pairs its SMs: `EP_HOST_ASSERT(num_sms % 2 == 0)`), within its bound, and at most 32 CUs for
/// Primus-Turbo DeepEP across 16+ ranks (Primus `rocm_arg_validation.py`); Megatron's
/// deprecated per-backend flags read as the unified one.
#[test]
fn flex_num_sms_rules_and_flags() {
    const F: &str = "spec.parallelism.moe.flexNumSms";
    let (s, base) = mixtral();
    let amd = scenario("qwen3-30b-a3b", "mi355x", 32, Precision::Bf16);
    let ep16 = Layout {
        ep: 16,
        ..Layout::default()
    };
    // (scenario, layout, dispatcher, SMs, the rule it breaks; None = legal)
    for (sc, l, d, n, rule) in [
        (
            &s,
            &base,
            Dispatch::Alltoall,
            24,
            Some("flex-num-sms-needs-flex"),
        ),
        (&s, &base, Dispatch::Deepep, 24, None),
        (&s, &base, Dispatch::Deepep, 23, Some("flex-num-sms-even")),
        (&s, &base, Dispatch::Deepep, 2048, Some("within-bounds")),
        (&s, &base, Dispatch::Deepep, 0, Some("within-bounds")),
        (
            &amd,
            &ep16,
            Dispatch::PrimusTurboDeepep,
            64,
            Some("turbo-deepep-cus-internode"),
        ),
        (&amd, &ep16, Dispatch::PrimusTurboDeepep, 32, None),
    ] {
        let mut l = l.clone();
        l.moe.set_dispatch(d);
        l.moe.flex_num_sms = Some(n);
        match rule {
            Some(r) => expect(sc, &l, r, F),
            None => l.check(sc).unwrap_or_else(|e| panic!("{n} SMs: {e}")),
        }
    }
    // The deprecated per-backend flags (Megatron routes them to the unified field).
    let c = Catalog::builtin().unwrap();
    let card = c.model("mixtral-8x7b").unwrap();
    for (flag, backend) in [
        ("--moe-deepep-num-sms", "deepep"),
        ("--moe-hybridep-num-sms", "hybridep"),
    ] {
        let args = MegatronArgs::parse([
            "--expert-model-parallel-size",
            "8",
            "--moe-token-dispatcher-type",
            "flex",
            "--moe-flex-dispatcher-backend",
            backend,
            flag,
            "36",
        ]);
        let read = args.layout(card).expect("layout");
        assert_eq!(read.moe.flex_num_sms, Some(36), "{flag}");
    }
}
