//! Primus-Megatron's per-layer full recompute (`recompute_layer_ids`,
//! `primus/backends/megatron/patches/recompute_layer_patches.py`: a layer is checkpointed iff
//! its global index is listed; MTP depth d is `layers + d`): the memory each listed layer
//! gives up and the forward it reruns, by hand against the block method; the flags written
//! into a job and read back (Megatron words and Primus overrides); the legality rules; and, over
//! random ID sets, that one more ID never shortens the step nor raises the peak.

use primus_oracle::layout::{Layout, PipelineLayout, Recompute};
use primus_oracle::megatron::{self, MegatronArgs, flag};
use primus_oracle::memory::{self, Keep, MemoryOptions, layer_activation_bytes};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::primus::overrides;
use primus_oracle::projection;
use primus_oracle::scenario::Scenario;
use proptest::prelude::*;

mod common;

/// Llama 3.1 70B (80 layers) on 32 H100, TP8 PP4 (20 layers a stage), MBS 1, sequence 8192,
/// global batch 64: 16 micro-batches of a DP1 pipeline.
fn llama70() -> (Scenario, Layout) {
    let s = common::scenario(
        "llama3.1-70b",
        "h100-sxm",
        32,
        Some(8),
        8192,
        16,
        Precision::Bf16,
    );
    let l = Layout {
        tp: 8,
        pp: 4,
        micro_batch_size: 1,
        recompute: Recompute::Full,
        recompute_layers: 5,
        ..Layout::default()
    };
    (s, l)
}

fn with_ids(l: &Layout, ids: Vec<u32>) -> Layout {
    Layout {
        recompute_layers: 0,
        recompute_layer_ids: Some(ids),
        ..l.clone()
    }
}

/// The block method's layers as IDs: the first `k` of each `per`-layer stage.
fn block_ids(stages: u32, per: u32, k: u32) -> Vec<u32> {
    (0..stages).flat_map(|st| st * per..st * per + k).collect()
}

#[test]
fn ids_of_the_blocks_layers_project_exactly_as_the_block_method() {
    let (s, block) = llama70();
    let ids = with_ids(&block, block_ids(4, 20, 5));
    ids.check(&s).expect("legal");
    let (a, b) = (memory::estimate(&s, &block), memory::estimate(&s, &ids));
    for (x, y) in a.stages.iter().zip(&b.stages) {
        assert_eq!(x.total_bytes, y.total_bytes, "stage {}", x.stage);
        assert_eq!(x.activations_bytes, y.activations_bytes);
    }
    let (pa, pb) = (
        projection::project(&s, &block).unwrap(),
        projection::project(&s, &ids).unwrap(),
    );
    assert_eq!(pa.step_time_seconds, pb.step_time_seconds);
    assert_eq!(pa.breakdown.compute, pb.breakdown.compute);
}

#[test]
fn a_layer_left_off_the_list_keeps_its_activations_by_hand() {
    // Stage 0 recomputes layers 1..5 instead of 0..5: one more layer keeps everything, so its
    // activations grow by (all - input) bytes per in-flight micro-batch, 4 on the first stage
    // of 1F1B with pp 4; the other stages do not change. One layer's recomputed forward less
    // makes the step faster.
    let (s, block) = llama70();
    let mut list = block_ids(4, 20, 5);
    list.remove(0);
    let ids = with_ids(&block, list);
    ids.check(&s).expect("legal");
    let (a, b) = (memory::estimate(&s, &block), memory::estimate(&s, &ids));
    let opts = MemoryOptions::default();
    let all = layer_activation_bytes(&s, &block, &opts, LayerKind::Dense, Keep::All);
    let input = layer_activation_bytes(&s, &block, &opts, LayerKind::Dense, Keep::Input);
    assert_eq!(a.stages[0].inflight_microbatches, 4);
    let grown = b.stages[0].activations_bytes - a.stages[0].activations_bytes;
    let expected = 4.0 * (all - input);
    assert!(
        (grown / expected - 1.0).abs() < 1e-12,
        "{grown} vs {expected}"
    );
    for (x, y) in a.stages.iter().zip(&b.stages).skip(1) {
        assert_eq!(x.total_bytes, y.total_bytes, "stage {}", x.stage);
    }
    let (pa, pb) = (
        projection::project(&s, &block).unwrap(),
        projection::project(&s, &ids).unwrap(),
    );
    assert!(pb.breakdown.compute < pa.breakdown.compute);
    assert!(pb.step_time_seconds < pa.step_time_seconds);
}

#[test]
fn an_mtp_depth_id_recomputes_the_mtp_module() {
    // DeepSeek-V3 (61 layers, MTP 1) on 256 H100, TP1 PP16 EP16: ID 61 is MTP depth 0, on
    // the last stage. The module keeps its two inputs (previous hidden states and the next
    // tokens' embeddings) instead of its layer and the inputs of its norms and eh_proj.
    let s = common::scenario(
        "deepseek-v3",
        "h100-sxm",
        256,
        Some(8),
        4096,
        256,
        Precision::Fp8,
    );
    let base = Layout {
        pp: 16,
        ep: 16,
        micro_batch_size: 1,
        recompute: Recompute::Full,
        recompute_layer_ids: Some(vec![0]),
        pipeline_layout: Some(PipelineLayout::parse("Et|(tttt|)*14ttttmL").unwrap()),
        ..Layout::default()
    };
    base.check(&s).expect("legal");
    let mtp = Layout {
        recompute_layer_ids: Some(vec![0, 61]),
        ..base.clone()
    };
    mtp.check(&s).expect("legal");
    let (a, b) = (memory::estimate(&s, &base), memory::estimate(&s, &mtp));
    let last = a.stages.len() - 1;
    let opts = MemoryOptions::default();
    let layer = layer_activation_bytes(&s, &base, &opts, LayerKind::Moe, Keep::All);
    let input = layer_activation_bytes(&s, &base, &opts, LayerKind::Moe, Keep::Input);
    // eh_proj's and the norms' inputs: 6h bf16 per token (sequence-split; TP1 here).
    let extra = 4096.0 * 2.0 * 6.0 * 7168.0;
    let count = a.stages[last].inflight_microbatches as f64;
    // The rebuilt module is the stage's largest recompute transient (its decoder layer is
    // not recomputed).
    let expected = count * (layer + extra - 2.0 * input) - (layer + extra);
    let dropped = a.stages[last].activations_bytes - b.stages[last].activations_bytes;
    assert!(
        (dropped / expected - 1.0).abs() < 1e-9,
        "{dropped} vs {expected}"
    );
    for (x, y) in a.stages.iter().zip(&b.stages).take(last) {
        assert_eq!(x.total_bytes, y.total_bytes, "stage {}", x.stage);
    }
    let (pa, pb) = (
        projection::project(&s, &base).unwrap(),
        projection::project(&s, &mtp).unwrap(),
    );
    // The last stage (four layers, the MTP module and the loss) is the slowest: its rerun
    // module forward lengthens the step.
    assert!(pb.step_time_seconds > pa.step_time_seconds);
}

#[test]
fn the_job_writes_the_ids_without_a_method_and_reads_them_back() {
    let (s, block) = llama70();
    let ids = with_ids(&block, vec![0, 3, 4, 7, 20, 41, 79]);
    let flags = megatron::megatron_flags(&s, &ids);
    let at = flags
        .iter()
        .position(|f| f == flag::RECOMPUTE_LAYER_IDS)
        .expect("the IDs are written");
    assert_eq!(
        flags[at + 1..at + 8],
        ["0", "3", "4", "7", "20", "41", "79"]
    );
    assert!(!flags.iter().any(|f| f == flag::RECOMPUTE_METHOD));
    assert!(!flags.iter().any(|f| f == flag::RECOMPUTE_NUM_LAYERS));
    let back = MegatronArgs::parse(flags.iter().map(String::as_str))
        .layout(&s.model)
        .expect("reads back");
    assert_eq!(back.recompute, Recompute::Full);
    assert_eq!(back.recompute_layer_ids, ids.recompute_layer_ids);
    assert_eq!(back.recompute_layers, 0);
    // As Primus overrides: the list, and the method pinned to None (a shipped experiment's
    // own list or block method cannot survive beside the plan's).
    let words = overrides::override_words(&flags);
    let value = |key: &str| {
        let i = words.iter().position(|w| *w == format!("--{key}")).unwrap();
        words[i + 1].clone()
    };
    assert_eq!(
        value("recompute_layer_ids"),
        "['0','3','4','7','20','41','79']"
    );
    assert_eq!(value("recompute_method"), "None");
    let (o, _) = overrides::parse(&words);
    let (mw, _) = overrides::to_megatron(&o);
    let back = MegatronArgs::parse(mw.iter().map(String::as_str))
        .layout(&s.model)
        .expect("reads back from the overrides");
    assert_eq!(back.recompute_layer_ids, ids.recompute_layer_ids);
    // A block-method job pins the IDs off.
    let words = overrides::override_words(&megatron::megatron_flags(&s, &block));
    let i = words
        .iter()
        .position(|w| w == "--recompute_layer_ids")
        .unwrap();
    assert_eq!(words[i + 1], "None");
}

#[test]
fn the_reader_takes_primus_spellings_and_refuses_what_primus_refuses() {
    let (s, block) = llama70();
    let read = |words: &[&str]| MegatronArgs::parse(words.iter().copied()).layout(&s.model);
    let full = ["--recompute-granularity", "full"];
    // Primus' YAML string (examples/megatron/configs/MI355X/deepseek_v3-FP8-pretrain.yaml
    // writes "0,3,4,..."), unsorted with a repeat: sorted and collapsed as Primus does.
    let l = read(&[&full[..], &["--recompute-layer-ids=7,3,0,3"]].concat()).unwrap();
    assert_eq!(l.recompute_layer_ids, Some(vec![0, 3, 7]));
    // One ID, and None (absent).
    let l = read(&[&full[..], &["--recompute-layer-ids", "5"]].concat()).unwrap();
    assert_eq!(l.recompute_layer_ids, Some(vec![5]));
    let l = read(&[&full[..], &["--recompute-layer-ids=None"]].concat()).unwrap();
    assert_eq!(l.recompute_layer_ids, None);
    let err = |words: &[&str]| read(&[&full[..], words].concat()).unwrap_err().to_string();
    let e = err(&["--recompute-layer-ids", "1", "x"]);
    assert!(e.contains("\"x\" is not a layer index"), "{e}");
    let e = err(&["--recompute-layer-ids", "99999"]);
    assert!(e.contains("is not a layer index (0 to 4159)"), "{e}");
    let e = err(&[
        "--recompute-layer-ids",
        "1,2",
        "--recompute-method",
        "block",
    ]);
    assert!(e.contains("recompute_method \"block\""), "{e}");
    let e = err(&["--recompute-layer-ids="]);
    assert!(e.contains("is empty"), "{e}");
    // More words than any model has layers: refused before they are parsed one by one.
    let many = vec!["1"; 5000].join(",");
    let e = err(&[&format!("--recompute-layer-ids={many}")]);
    assert!(e.contains("more than 4160 layers"), "{e}");
    // Selective granularity beside the IDs: read, then refused by the rules.
    let l = read(&[
        "--recompute-granularity",
        "selective",
        "--recompute-layer-ids",
        "1",
    ])
    .unwrap();
    let e = Layout {
        recompute: l.recompute,
        recompute_layer_ids: l.recompute_layer_ids,
        recompute_layers: 0,
        ..block
    }
    .check(&s)
    .unwrap_err();
    assert_eq!(e.rule, "recompute-layer-ids-need-full");
}

#[test]
fn rules_name_what_primus_refuses() {
    let (s, block) = llama70();
    let rule = |l: Layout| l.check(&s).unwrap_err();
    let e = rule(Layout {
        recompute_layer_ids: Some(vec![1]),
        ..block.clone()
    });
    assert_eq!(e.rule, "recompute-layer-ids-replace-count");
    assert_eq!(e.field, "spec.parallelism.recomputeLayerIds");
    let e = rule(with_ids(&block, vec![]));
    assert_eq!(e.rule, "recompute-layer-ids-not-empty");
    let e = rule(with_ids(&block, vec![3, 1]));
    assert_eq!(e.rule, "recompute-layer-ids-ascending");
    assert_eq!(e.message, "the IDs must ascend without repeats (3 then 1)");
    let e = rule(with_ids(&block, vec![2, 2]));
    assert_eq!(e.rule, "recompute-layer-ids-ascending");
    let e = rule(with_ids(&block, vec![1, 80]));
    assert_eq!(e.rule, "recompute-layer-ids-fit");
    assert_eq!(
        e.message,
        "layer 80 is past model llama3.1-70b: 0..79 are its decoder layers"
    );
    let e = rule(Layout {
        recompute: Recompute::None,
        ..with_ids(&block, vec![1])
    });
    assert_eq!(e.rule, "recompute-layer-ids-need-full");
    // The bound on the list itself (the CRD's maxItems and item range).
    let e = rule(with_ids(&block, vec![5000]));
    assert!(e.to_string().contains("recomputeLayerIds"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn one_more_id_never_shortens_the_step_nor_raises_the_peak(
        low in any::<u64>(),
        high in any::<u16>(),
        added in 0u32..80,
    ) {
        // Llama 3.1 70B TP8 PP4 (1F1B, a fixed pass order, so the step is monotone in each
        // pass's duration): a random set of its 80 layers, then the set with one more. The
        // added layer's forward is rerun in the backward (the step does not get shorter) and
        // it keeps only its input (the peak does not rise).
        let (s, block) = llama70();
        let ids: Vec<u32> = (0..80u32)
            .filter(|&i| i != added)
            .filter(|&i| if i < 64 { low & (1 << i) != 0 } else { high & (1 << (i - 64)) != 0 })
            .collect();
        prop_assume!(!ids.is_empty());
        let mut more = ids.clone();
        more.push(added);
        more.sort_unstable();
        let (a, b) = (with_ids(&block, ids), with_ids(&block, more));
        prop_assert!(a.check(&s).is_ok() && b.check(&s).is_ok());
        let (pa, pb) = (projection::project(&s, &a).unwrap(), projection::project(&s, &b).unwrap());
        prop_assert!(pb.step_time_seconds >= pa.step_time_seconds,
            "{} -> {}", pa.step_time_seconds, pb.step_time_seconds);
        prop_assert!(pb.breakdown.compute >= pa.breakdown.compute);
        prop_assert!(memory::estimate(&s, &b).peak_bytes <= memory::estimate(&s, &a).peak_bytes);
    }
}
