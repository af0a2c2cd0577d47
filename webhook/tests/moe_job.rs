//! Every emitted MoE job names its dispatcher and grouped-GEMM choice, and the webhook reads
//! the emitted job back to the same layout, MoE options included (issue 16). The jobs are
//! written by the tuner's job writer (`primus_crds::pytorchjob::pytorchjob`, what
//! `primus tune --emit pytorchjob` and the operator run) and derived through the webhook's
//! `pytorchjob::derive`, from the Megatron flags alone (layout annotation removed) and from the
//! annotation; the layouts are the tuner's best for MoE plans on both vendors and hand-set ones
//! with every option away from its default.

use std::collections::BTreeMap;

use primus_crds::annotations;
use primus_crds::pytorchjob::{JobOptions, pytorchjob};
use primus_oracle::layout::{
    CudaGraph, CudaGraphImpl, CudaGraphModule, Dispatch, Factor, Fp8Recipe, GroupedGemm, Layout,
    LoadBalancing, Recompute, RouterDtype, Schedule,
};
use primus_oracle::plan::{SearcherKind, parse_plan};
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};
use primus_oracle::tune::tune_plan;
use primus_webhook::pytorchjob::{LayoutSource, derive};
use serde_json::Value;

fn scenario(model: &str, gpu: &str, gpus: u32, precision: Precision) -> Scenario {
    let c = Catalog::builtin().unwrap();
    let hardware = c.hardware(gpu).unwrap().clone();
    Scenario {
        model: c.model(model).unwrap().clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node: hardware.gpus_per_node,
        },
        hardware,
        training: Training {
            seq_length: 4096,
            global_batch_size: 1024,
            precision,
        },
    }
}

/// The value after `flag` in the job's arguments.
fn value_of<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).map(String::as_str)
}

/// Emit `l` as a job, check that it names the dispatcher and grouped GEMM, derive it back
/// through the webhook from its flags and from its annotation.
fn round_trip(s: &Scenario, l: &Layout) {
    l.check(s).expect("a legal layout");
    let c = Catalog::builtin().unwrap();
    let job = pytorchjob("moe", Some("training"), s, l, None, &JobOptions::default()).unwrap();
    let job: Value = serde_json::to_value(job).unwrap();
    let args: Vec<String> =
        job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .expect("the job has arguments")
            .iter()
            .map(|a| a.as_str().unwrap().to_string())
            .collect();
    let what = l.label();
    assert_eq!(
        value_of(&args, "--moe-token-dispatcher-type"),
        Some(l.moe.token_dispatcher.as_str()),
        "{what}: {args:?}"
    );
    assert_eq!(
        args.iter().any(|a| a == "--moe-grouped-gemm"),
        l.moe.grouped_gemm != GroupedGemm::Sequential,
        "{what}"
    );
    match l.moe.dispatch() {
        Dispatch::Deepep | Dispatch::Hybridep => assert_eq!(
            value_of(&args, "--moe-flex-dispatcher-backend"),
            Some(l.moe.dispatch().as_str()),
            "{what}"
        ),
        Dispatch::PrimusTurboDeepep => {
            assert_eq!(
                value_of(&args, "--use_turbo_deepep"),
                Some("True"),
                "{what}"
            )
        }
        _ => assert!(
            !args.iter().any(|a| a == "--moe-flex-dispatcher-backend"),
            "{what}"
        ),
    }
    let mut notes: BTreeMap<String, String> = job["metadata"]["annotations"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect();
    let from_annotation = derive(&job, &notes, &c).expect("derivable");
    assert_eq!(from_annotation.layout_source, LayoutSource::Annotation);
    assert_eq!(&from_annotation.layout, l, "{what}: annotation");
    notes.remove(annotations::LAYOUT);
    let mut from_flags = derive(&job, &notes, &c).expect("derivable from the flags");
    assert_eq!(from_flags.layout_source, LayoutSource::Flags);
    if l.tp == 1 {
        // Sequence parallelism means nothing at TP 1 and is not written.
        from_flags.layout.sequence_parallel = l.sequence_parallel;
    }
    assert_eq!(&from_flags.layout, l, "{what}: flags");
    assert_eq!(from_flags.scenario.model.name, s.model.name);
    assert_eq!(from_flags.scenario.hardware.name, s.hardware.name);
    assert_eq!(from_flags.scenario.cluster.gpus, s.cluster.gpus);
}

#[test]
fn the_tuners_moe_jobs_read_back_to_the_same_layout() {
    let c = Catalog::builtin().unwrap();
    for (model, gpu, gpus, precision) in [
        ("mixtral-8x22b", "mi355x", 32, "bf16"),
        ("qwen3-30b-a3b", "h100-sxm", 16, "fp8"),
        ("deepseek-v3", "b200", 256, "fp8"),
    ] {
        let yaml = format!(
            "spec:\n  model: {{preset: {model}}}\n  cluster: {{gpu: {gpu}, gpus: {gpus}}}\n  training: {{seqLength: 4096, globalBatchSize: 1024, precision: {precision}}}\n"
        );
        let plan = parse_plan(&yaml, "t.yaml", &c).unwrap();
        let best = tune_plan(&plan, SearcherKind::Seed)
            .unwrap()
            .best
            .expect("a layout fits")
            .layout;
        round_trip(&plan.scenario, &best);
    }
}

#[test]
fn every_moe_option_reads_back() {
    // H100, FP8: DeepEP, the EP overlap with delayed weight gradients, legacy grouped GEMM,
    // capacity with padding, blockwise FP8, CUDA graphs of TE scopes.
    let s = scenario("deepseek-v3", "h100-sxm", 1024, Precision::Fp8);
    let mut l = Layout {
        tp: 2,
        pp: 8,
        vpp: 4,
        ep: 64,
        schedule: Schedule::Interleaved,
        recompute: Recompute::Selective,
        fp8_recipe: Some(Fp8Recipe::Blockwise),
        cuda_graph: CudaGraph {
            implementation: CudaGraphImpl::TransformerEngine,
            modules: vec![CudaGraphModule::Attn, CudaGraphModule::MoeRouter],
        },
        pipeline_layout: Some(
            primus_oracle::layout::PipelineLayout::parse("Et|(tt|)*30mL").unwrap(),
        ),
        ..Layout::default()
    };
    l.moe.set_dispatch(Dispatch::Deepep);
    l.moe.grouped_gemm = GroupedGemm::Grouped;
    l.moe.permute_fusion = true;
    l.moe.router_fusion = true;
    l.moe.ep_overlap = true;
    l.moe.delay_wgrad = true;
    l.moe.load_balancing = LoadBalancing::SeqAuxLoss;
    l.moe.router_dtype = Some(RouterDtype::Fp32);
    round_trip(&s, &l);
    // Alltoall with capacity and padding, shared-expert overlap.
    let mut a = l.clone();
    a.moe.set_dispatch(Dispatch::Alltoall);
    a.moe.ep_overlap = false;
    a.moe.delay_wgrad = false;
    a.moe.shared_expert_overlap = true;
    a.moe.capacity_factor = Some(Factor(1.25));
    a.moe.pad_to_capacity = true;
    a.moe.load_balancing = LoadBalancing::AuxLoss;
    a.moe.force_load_balancing = true;
    round_trip(&s, &a);
    // Megatron's defaults are named too: allgather and sequential experts.
    let mut d = Layout {
        tp: 1,
        pp: 4,
        ep: 8,
        ..Layout::default()
    };
    let m = scenario("mixtral-8x22b", "mi355x", 32, Precision::Bf16);
    round_trip(&m, &d);
    // Primus-Turbo DeepEP on MI355X.
    d.moe.set_dispatch(Dispatch::PrimusTurboDeepep);
    d.moe.grouped_gemm = GroupedGemm::Grouped;
    round_trip(&m, &d);
}
