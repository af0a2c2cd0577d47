//! The Mixtral 8x22B case study, like for like (issue 16, item 5; docs/mixtral-case-study.md).
//!
//! Reference: Primus's published MI355X BF16 recipe on 4 nodes (32 GPUs), as the ROCm blog on
//! the Primus tuning agent ran it (rocm/primus:v26.2; recipe
//! `examples/megatron/configs/MI355X/mixtral_8x22B_v0.1-BF16-pretrain.yaml` at v26.2): sequence
//! 8192, micro-batch 2, global batch 512 (the case study's), TP1 PP4 EP8, full recompute, the
//! alltoall dispatcher with TE grouped GEMM and Primus's forced (even) balancing, no DeepEP,
//! measured 3,475 tokens/s/GPU (row XA4 of `data/extra.csv`). The agent's winner: micro-batch
//! 1, no recompute, Primus-Turbo DeepEP, measured 4,402 (+26.7%, row XA4-tuned-deepep of
//! `data/moe.csv`).
//!
//! The tuner gets the options the agent had: the micro-batch size, the recompute choice and
//! the dispatcher (alltoall or Primus-Turbo DeepEP) on the recipe's parallel layout
//! (TP1 PP4 EP8, 1F1B); and, beside it, the whole space.

use primus_oracle::layout::Dispatch;
use primus_oracle::plan::{Plan, SearcherKind, parse_plan};
use primus_oracle::profiles::Catalog;
use primus_oracle::projection;
use primus_oracle::tune::tune_plan;

/// Measured tokens/s/GPU of the reference and of the agent's winner (ROCm blog, rows XA4 and
/// XA4-tuned-deepep).
const REFERENCE_MEASURED: f64 = 3475.0;
const TUNED_MEASURED: f64 = 4402.0;

const REFERENCE: &str = "spec:
  model: {preset: mixtral-8x22b}
  cluster: {gpu: mi355x, gpus: 32, gpusPerNode: 8}
  training: {seqLength: 8192, globalBatchSize: 512, precision: bf16}
  parallelism:
    tp: 1
    pp: 4
    vpp: 1
    ep: 8
    etp: 1
    microBatchSize: 2
    recompute: full
    distributedOptimizer: true
    gradReduceInFp32: false
    attentionDropout: 0
    hiddenDropout: 0
    schedule: 1f1b
    moe: {tokenDispatcher: alltoall, groupedGemm: grouped, forceLoadBalancing: true}
";

fn plan(tuning: &str) -> Plan {
    let text = format!("{REFERENCE}  tuning: {tuning}\n");
    parse_plan(
        &text,
        "mixtral-case-study.yaml",
        &Catalog::builtin().unwrap(),
    )
    .unwrap()
}

/// The agent's options: micro-batch size, recompute, dispatcher, on the recipe's layout.
const AGENT_OPTIONS: &str = "{topK: 5, fixed: {tp: 1, pp: 4, vpp: 1, cp: 1, ep: 8, etp: 1, schedule: 1f1b, epOverlap: false}, allowed: {microBatchSize: [1, 2, 4], recompute: [none, selective, full], dispatch: [alltoall, primus-turbo-deepep]}}";

#[test]
fn the_reference_projects_within_the_band_of_its_measurement() {
    let p = plan("{}");
    let l = p.layout.clone().unwrap();
    let t = projection::project(&p.scenario, &l).unwrap();
    let error = t.tokens_per_second_per_gpu / REFERENCE_MEASURED - 1.0;
    eprintln!(
        "reference {} projects {:.0} ({:+.1}%)",
        l.label(),
        t.tokens_per_second_per_gpu,
        100.0 * error
    );
    // The MoE rows' median |error| gate (validate_moe.rs): 12%.
    assert!(
        error.abs() <= 0.12,
        "reference projects {:.0} vs measured {REFERENCE_MEASURED} ({:+.1}%)",
        t.tokens_per_second_per_gpu,
        100.0 * error
    );
}

#[test]
fn the_tuned_gain_with_the_agents_options() {
    let p = plan(AGENT_OPTIONS);
    let r = tune_plan(&p, SearcherKind::Exhaustive).unwrap();
    let best = r.best.as_ref().expect("a layout fits");
    let gain = r.gain_over_reference.expect("a reference");
    let measured_gain = TUNED_MEASURED / REFERENCE_MEASURED - 1.0;
    eprintln!(
        "agent's options: best {} {:.0} tok/s/GPU, gain {:+.1}% (measured {:+.1}%)",
        best.label,
        best.projection.tokens_per_second_per_gpu,
        100.0 * gain,
        100.0 * measured_gain
    );
    // The tuner finds the agent's micro-batch size and recompute (MBS 1, none).
    assert_eq!(best.layout.micro_batch_size, 1, "{}", best.label);
    assert_eq!(
        best.layout.recompute,
        primus_oracle::layout::Recompute::None,
        "{}",
        best.label
    );
    // The projected gain is within 10 points of the measured one.
    assert!(
        (gain - measured_gain).abs() <= 0.10,
        "gain {gain} vs measured {measured_gain}"
    );
    // The agent's winner itself projects within the band of its measurement.
    let mut winner = p.layout.clone().unwrap();
    winner.micro_batch_size = 1;
    winner.recompute = primus_oracle::layout::Recompute::None;
    winner.recompute_layers = 0;
    winner.moe.set_dispatch(Dispatch::PrimusTurboDeepep);
    let t = projection::project(&p.scenario, &winner).unwrap();
    let error = t.tokens_per_second_per_gpu / TUNED_MEASURED - 1.0;
    eprintln!(
        "agent's winner {} projects {:.0} ({:+.1}%)",
        winner.label(),
        t.tokens_per_second_per_gpu,
        100.0 * error
    );
    assert!(error.abs() <= 0.12, "winner error {error}");
    // The same with alltoall: what the model ranks between the two dispatchers.
    let mut a2a = winner.clone();
    a2a.moe.set_dispatch(Dispatch::Alltoall);
    a2a.moe.router_dtype = None;
    let t2 = projection::project(&p.scenario, &a2a).unwrap();
    eprintln!(
        "the same with alltoall projects {:.0} ({:+.1}% vs DeepEP)",
        t2.tokens_per_second_per_gpu,
        100.0 * (t2.tokens_per_second_per_gpu / t.tokens_per_second_per_gpu - 1.0)
    );
}

#[test]
fn the_tuned_gain_over_the_whole_space_is_at_least_the_agents() {
    let agent = tune_plan(&plan(AGENT_OPTIONS), SearcherKind::Exhaustive).unwrap();
    let free = tune_plan(&plan("{topK: 5}"), SearcherKind::Exhaustive).unwrap();
    let (a, f) = (
        agent.gain_over_reference.unwrap(),
        free.gain_over_reference.unwrap(),
    );
    eprintln!(
        "whole space: best {} gain {:+.1}% (agent's options {:+.1}%)",
        free.best.as_ref().unwrap().label,
        100.0 * f,
        100.0 * a
    );
    assert!(
        f >= a - 1e-12,
        "the whole space {f} < the agent's options {a}"
    );
}
