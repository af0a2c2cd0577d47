//! How a Megatron command line splits the layers over the pipeline (`primus import`, the
//! webhook's flag reader): the virtual pipeline size from layers per virtual stage, with the
//! embedding and the loss counted as layers under `--account-for-embedding-in-pipeline-split`
//! / `--account-for-loss-in-pipeline-split`, and the layout of that split.
//!
//! Source: Megatron-LM `megatron/training/arguments.py` (the counted layers must divide over
//! the pipeline stages, the layers per stage over the virtual stages; at most one of
//! `--num-layers-per-virtual-pipeline-stage`, `--num-virtual-stages-per-pipeline-rank`,
//! `--pipeline-model-parallel-layout`) and `megatron/core/transformer/transformer_config.py`
//! (neither accounting flag with an uneven first/last stage or a layout). The case is the
//! Megatron-MoE-ModelZoo Qwen3-235B-A22B H100 run (best_practice/qwen3/readme.md, 24.2 s per
//! step): `model_configs/benchmarking/Qwen3-235B-A22B.yaml` passes `--num-layers 94`, both
//! accounting flags and `--num-layers-per-virtual-pipeline-stage` = 96 / PP / VPP
//! (`runtime_configs/benchmarking/runtime.conf`: "Account loss and embedding for number of
//! layers"); at PP32 VPP3 that is one slot per virtual stage.

use primus_oracle::layout::Schedule;
use primus_oracle::megatron::MegatronArgs;
use primus_oracle::model::ModelCard;
use primus_oracle::profiles::Catalog;

fn card(name: &str) -> ModelCard {
    Catalog::builtin().unwrap().model(name).unwrap().clone()
}

fn args(line: &str) -> MegatronArgs {
    MegatronArgs::parse(line.split_whitespace())
}

const ACCOUNT: &str =
    "--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split";

#[test]
fn layers_per_virtual_stage_count_the_embedding_and_the_loss() {
    let a = args(&format!(
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 32 \
         --num-layers-per-virtual-pipeline-stage 1 --expert-model-parallel-size 8 {ACCOUNT}"
    ));
    let l = a.layout(&card("qwen3-235b-a22b")).unwrap();
    // (94 + 2) / 32 = 3 slots per rank, 1 per virtual stage: VPP 3 (94 / 32 floored gave 2).
    assert_eq!((l.pp, l.vpp), (32, 3));
    assert_eq!(l.schedule, Schedule::Interleaved);
    let layout = l
        .pipeline_layout
        .as_ref()
        .expect("the accounted split as a layout");
    let stages = layout.stages();
    assert_eq!(stages.len(), 96);
    assert_eq!(layout.layers(), 94);
    // The embedding alone first, the loss alone last, one decoder layer in between.
    assert_eq!(stages[0].layers, 0);
    assert_eq!(stages[95].layers, 0);
    assert!(stages[1..95].iter().all(|s| s.layers == 1));
    assert!(layout.as_str().starts_with("E|t|t|") && layout.as_str().ends_with("|t|L"));

    // PP8 VPP4 (the ModelZoo's default): 96 / 8 / 4 = 3 slots per virtual stage.
    let a = args(&format!(
        "--pipeline-model-parallel-size 8 --num-layers-per-virtual-pipeline-stage 3 {ACCOUNT}"
    ));
    let l = a.layout(&card("qwen3-235b-a22b")).unwrap();
    assert_eq!(l.vpp, 4);
    let layout = l.pipeline_layout.unwrap();
    assert!(
        layout.as_str().starts_with("Ett|ttt|"),
        "{}",
        layout.as_str()
    );
    assert!(layout.as_str().ends_with("|ttt|ttL"), "{}", layout.as_str());
}

#[test]
fn one_accounting_flag_takes_one_slot() {
    // Llama 3.1 405B's 126 layers + the loss = 127 slots do not divide over PP2; + the
    // embedding and the loss = 128 do: 64 per rank.
    let only_loss = args(
        "--pipeline-model-parallel-size 2 --account-for-loss-in-pipeline-split \
         --num-layers-per-virtual-pipeline-stage 1",
    );
    let e = only_loss.layout(&card("llama3.1-405b")).unwrap_err();
    assert_eq!(e.field, "--pipeline-model-parallel-size");
    assert!(e.message.contains("126 layers plus the loss"), "{e}");
    // DeepSeek-V3: 61 layers + the embedding = 62 slots over PP2, 31 each; its MTP layer rides
    // on the last stage, before the loss, as in Megatron (not a slot).
    let only_embedding =
        args("--pipeline-model-parallel-size 2 --account-for-embedding-in-pipeline-split");
    let l = only_embedding.layout(&card("deepseek-v3")).unwrap();
    let layout = l.pipeline_layout.unwrap();
    let stages = layout.stages();
    assert_eq!(stages.len(), 2);
    assert_eq!((stages[0].layers, stages[1].layers), (30, 31));
    assert_eq!(layout.mtp_layers(), card("deepseek-v3").mtp_layers);
    assert!(layout.as_str().ends_with("tmL"), "{}", layout.as_str());
}

#[test]
fn megatron_refuses_what_the_reader_refuses() {
    let qwen = card("qwen3-235b-a22b");
    // 94 layers over PP32 without the accounting flags: Megatron's divisibility assertion.
    let e = args("--pipeline-model-parallel-size 32 --num-layers-per-virtual-pipeline-stage 1")
        .layout(&qwen)
        .unwrap_err();
    assert_eq!(e.field, "--pipeline-model-parallel-size");
    assert!(e.message.contains("94 layers do not divide over 32"), "{e}");
    // Accounting with an uneven first stage, or with a layout.
    let e = args(&format!(
        "--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 22 {ACCOUNT}"
    ))
    .layout(&qwen)
    .unwrap_err();
    assert_eq!(e.field, "--account-for-embedding-in-pipeline-split");
    let e = args("--pipeline-model-parallel-size 2 --account-for-loss-in-pipeline-split --pipeline-model-parallel-layout Et*47|t*47L")
        .layout(&qwen)
        .unwrap_err();
    assert_eq!(e.field, "--account-for-loss-in-pipeline-split");
    // Two ways of giving the virtual pipeline.
    let e = args(
        "--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 47 \
         --num-virtual-stages-per-pipeline-rank 1",
    )
    .layout(&qwen)
    .unwrap_err();
    assert_eq!(e.field, "--num-virtual-stages-per-pipeline-rank");
    assert!(e.message.contains("at most one"), "{e}");
    // The accounted slots must also split over the virtual stages.
    let e = args(&format!(
        "--pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 5 {ACCOUNT}"
    ))
    .layout(&qwen)
    .unwrap_err();
    assert_eq!(e.field, "--account-for-embedding-in-pipeline-split");
    assert!(e.message.contains("over 40 virtual stages"), "{e}");
}

#[test]
fn virtual_stages_per_rank_set_the_virtual_pipeline() {
    let l = args(&format!(
        "--pipeline-model-parallel-size 8 --num-virtual-stages-per-pipeline-rank 4 {ACCOUNT}"
    ))
    .layout(&card("qwen3-235b-a22b"))
    .unwrap();
    assert_eq!(l.vpp, 4);
    assert_eq!(l.pipeline_layout.unwrap().stages().len(), 32);
    let e = args("--num-virtual-stages-per-pipeline-rank 0")
        .layout(&card("qwen3-235b-a22b"))
        .unwrap_err();
    assert_eq!(e.field, "--num-virtual-stages-per-pipeline-rank");
}
