//! Every legality rule of a layout, each with the field it names and its message, plus the
//! pipeline layer assignment (even, uneven first/last, interleaved, explicit layout).

use primus_oracle::layout::{Layout, LayoutError, PipelineLayout, Recompute, Schedule};
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};

fn scenario(model: &str, gpus: u32, seq: u64, gbs: u64) -> Scenario {
    let c = Catalog::builtin().unwrap();
    Scenario {
        model: c.model(model).unwrap().clone(),
        hardware: c.hardware("h100-sxm").unwrap().clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node: 8,
        },
        training: Training {
            seq_length: seq,
            global_batch_size: gbs,
            precision: Precision::Bf16,
        },
    }
}

fn llama70(gpus: u32) -> Scenario {
    scenario("llama3.1-70b", gpus, 8192, 128)
}

fn broken(s: &Scenario, l: Layout) -> LayoutError {
    l.check(s).expect_err("layout should be illegal")
}

fn expect(e: LayoutError, rule: &str, field: &str, message: &str) {
    assert_eq!(e.rule, rule, "{e}");
    assert_eq!(e.field, field, "{e}");
    assert_eq!(e.message, message, "{e}");
    assert_eq!(e.to_string(), format!("{field}: {message}"));
}

#[test]
fn legal_layouts_pass() {
    let s = llama70(64);
    let l = Layout {
        tp: 4,
        pp: 8,
        vpp: 5,
        schedule: Schedule::Interleaved,
        ..Layout::default()
    };
    l.check(&s).unwrap();
    assert_eq!(l.num_microbatches(&s), 64);
    let ds = scenario("deepseek-v3", 1024, 4096, 8192);
    let l = Layout {
        tp: 2,
        pp: 8,
        vpp: 4,
        ep: 64,
        schedule: Schedule::Interleaved,
        pipeline_layout: Some(PipelineLayout::parse("Et|(tt|)*30mL").unwrap()),
        ..Layout::default()
    };
    l.check(&ds).unwrap();
    assert_eq!(l.num_microbatches(&ds), 128);
}

#[test]
fn sizes_must_be_positive_and_bounded() {
    let e = broken(
        &llama70(64),
        Layout {
            cp: 0,
            ..Layout::default()
        },
    );
    expect(
        e,
        "within-bounds",
        "spec.parallelism.cp",
        "must be greater than 0",
    );
    // Beyond the bound of each axis (bounds::limits::AXIS = 65536).
    let e = broken(
        &llama70(64),
        Layout {
            ep: 1 << 20,
            ..Layout::default()
        },
    );
    expect(
        e,
        "within-bounds",
        "spec.parallelism.ep",
        "1048576 is beyond any real job (at most 65536)",
    );
}

#[test]
fn products_of_sizes_never_wrap() {
    // 65536 * 65536 * 1 wraps to 0 in u32: the grid is computed in u64.
    let e = broken(
        &llama70(64),
        Layout {
            tp: 65536,
            pp: 65536,
            ..Layout::default()
        },
    );
    expect(
        e,
        "gpus-divisible",
        "spec.cluster.gpus",
        "64 GPUs are not divisible by tp*pp*cp = 65536*65536*1 = 4294967296",
    );
    // pp * vpp is bounded before any rule multiplies them (u32).
    let e = broken(
        &llama70(65536),
        Layout {
            pp: 65536,
            vpp: 65536,
            schedule: Schedule::Interleaved,
            ..Layout::default()
        },
    );
    expect(
        e,
        "virtual-stages",
        "spec.parallelism.vpp",
        "pp*vpp = 65536*65536 exceeds 8192",
    );
    // ep * etp likewise (in u64).
    let e = broken(
        &scenario("mixtral-8x22b", 64, 4096, 64),
        Layout {
            ep: 65536,
            etp: 65536,
            ..Layout::default()
        },
    );
    assert_eq!(e.rule, "ep-divides-experts", "{e}");
}

#[test]
fn gpus_divisible_by_model_parallel_grid() {
    let e = broken(
        &llama70(48),
        Layout {
            tp: 8,
            pp: 4,
            ..Layout::default()
        },
    );
    expect(
        e,
        "gpus-divisible",
        "spec.cluster.gpus",
        "48 GPUs are not divisible by tp*pp*cp = 8*4*1 = 32",
    );
}

#[test]
fn tp_divides_heads() {
    // GPT-22B: 64 heads (multi-head attention), 48 layers.
    let s = scenario("gpt-22b", 48, 2048, 48);
    let e = broken(
        &s,
        Layout {
            tp: 3,
            ..Layout::default()
        },
    );
    expect(
        e,
        "tp-divides-heads",
        "spec.parallelism.tp",
        "3 does not divide the model's 64 attention heads",
    );
}

#[test]
fn tp_divides_kv_heads() {
    // Llama 3.1 70B: 64 query heads but 8 key/value heads.
    let e = broken(
        &llama70(64),
        Layout {
            tp: 16,
            pp: 4,
            ..Layout::default()
        },
    );
    expect(
        e,
        "tp-divides-kv-heads",
        "spec.parallelism.tp",
        "16 does not divide the model's 8 key/value heads (GQA groups); Megatron splits whole groups over TP",
    );
}

#[test]
fn tp_divides_ffn() {
    let mut s = llama70(64);
    s.model.ffn_hidden_size = 28670;
    let e = broken(
        &s,
        Layout {
            tp: 4,
            pp: 8,
            ..Layout::default()
        },
    );
    expect(
        e,
        "tp-divides-ffn",
        "spec.parallelism.tp",
        "4 does not divide ffnHiddenSize 28670",
    );
}

#[test]
fn vpp_needs_pp() {
    let e = broken(
        &llama70(64),
        Layout {
            tp: 8,
            vpp: 2,
            schedule: Schedule::Interleaved,
            ..Layout::default()
        },
    );
    expect(
        e,
        "vpp-needs-pp",
        "spec.parallelism.vpp",
        "2 virtual stages need pp > 1",
    );
}

#[test]
fn layers_split_evenly_over_pp_and_vpp() {
    let e = broken(
        &llama70(48),
        Layout {
            tp: 8,
            pp: 6,
            ..Layout::default()
        },
    );
    expect(
        e,
        "pp-divides-layers",
        "spec.parallelism.pp",
        "the model's 80 layers do not split evenly over pp*vpp = 6*1 = 6 chunks; set firstStageLayers/lastStageLayers or pipelineLayout for an uneven split",
    );
}

#[test]
fn uneven_split_rules() {
    // Llama 3.1 405B: 126 layers on 16 stages works with 7 + 14*8 + 7.
    let s = scenario("llama3.1-405b", 128, 8192, 128);
    let ok = Layout {
        tp: 8,
        pp: 16,
        first_stage_layers: Some(7),
        last_stage_layers: Some(7),
        ..Layout::default()
    };
    ok.check(&s).unwrap();
    let e = broken(
        &s,
        Layout {
            first_stage_layers: Some(6),
            ..ok.clone()
        },
    );
    expect(
        e,
        "uneven-split",
        "spec.parallelism.firstStageLayers",
        "the remaining 113 layers do not split evenly (and non-empty) over the 14 middle stages x vpp = 1 chunks",
    );
    let e = broken(
        &s,
        Layout {
            tp: 8,
            pp: 1,
            first_stage_layers: Some(7),
            ..Layout::default()
        },
    );
    expect(
        e,
        "uneven-split",
        "spec.parallelism.firstStageLayers",
        "an uneven pipeline split needs pp > 1",
    );
    let e = broken(
        &s,
        Layout {
            first_stage_layers: Some(100),
            last_stage_layers: Some(30),
            ..ok.clone()
        },
    );
    expect(
        e,
        "uneven-split",
        "spec.parallelism.firstStageLayers",
        "first + last stage layers 130 exceed the model's 126",
    );
    let e = broken(
        &s,
        Layout {
            vpp: 2,
            schedule: Schedule::Interleaved,
            ..ok.clone()
        },
    );
    expect(
        e,
        "uneven-split",
        "spec.parallelism.firstStageLayers",
        "7 layers do not split evenly over vpp = 2 chunks",
    );
    let two = Layout {
        tp: 8,
        pp: 2,
        first_stage_layers: Some(60),
        last_stage_layers: Some(60),
        ..Layout::default()
    };
    let s2 = scenario("llama3.1-405b", 16, 8192, 128);
    expect(
        broken(&s2, two),
        "uneven-split",
        "spec.parallelism.firstStageLayers",
        "with pp = 2 there are no middle stages, so first + last must be the model's 126 layers (got 120)",
    );
}

#[test]
fn pipeline_layout_rules() {
    let s = scenario("deepseek-v3", 1024, 4096, 8192);
    let base = Layout {
        tp: 2,
        pp: 8,
        vpp: 4,
        ep: 64,
        schedule: Schedule::Interleaved,
        ..Layout::default()
    };
    let with = |text: &str| Layout {
        pipeline_layout: Some(PipelineLayout::parse(text).unwrap()),
        ..base.clone()
    };
    expect(
        broken(&s, with("Et|(tt|)*29mL")),
        "pipeline-layout-stages",
        "spec.parallelism.pipelineLayout",
        "has 31 stages, but pp*vpp = 8*4 = 32 (one per virtual stage)",
    );
    expect(
        broken(&s, with("Et|(tt|)*29t|mL")),
        "pipeline-layout-layers",
        "spec.parallelism.pipelineLayout",
        "places 60 decoder layers `t`, the model has 61",
    );
    expect(
        broken(&s, with("Et|(tt|)*29t|tL")),
        "pipeline-layout-layers",
        "spec.parallelism.pipelineLayout",
        "places 0 MTP layers `m`, the model has 1",
    );
    expect(
        broken(
            &s,
            Layout {
                first_stage_layers: Some(1),
                ..with("Et|(tt|)*30mL")
            },
        ),
        "pipeline-layout-exclusive",
        "spec.parallelism.pipelineLayout",
        "give either pipelineLayout or firstStageLayers/lastStageLayers, not both",
    );
}

#[test]
fn pipeline_layout_syntax_errors_name_the_problem() {
    assert_eq!(
        PipelineLayout::parse("Et|(tt|*30mL").unwrap_err(),
        "unclosed `(` at position 12 of the layout"
    );
    assert_eq!(
        PipelineLayout::parse("Et|x|L").unwrap_err(),
        "unexpected 'x' (expected E, t, m, L, |, (, ) or *n) at position 3 of the layout"
    );
    assert_eq!(
        PipelineLayout::parse("t|Et|L").unwrap_err(),
        "the embedding `E` must appear once, in the first stage"
    );
    assert_eq!(
        PipelineLayout::parse("Et|tL|t").unwrap_err(),
        "the loss `L` must appear once, in the last stage"
    );
    assert_eq!(
        PipelineLayout::parse("Et|t*|L").unwrap_err(),
        "expected a repeat count after `*` at position 5 of the layout"
    );
}

#[test]
fn pipeline_layout_parsing_is_bounded() {
    // 200,000 `(` (issue 13: a stack overflow before): one line, before any parsing.
    let e = PipelineLayout::parse(&"(".repeat(200_000)).unwrap_err();
    assert_eq!(e, "is longer than 4096 characters");
    // Within the length, nesting is cut at 32 levels (the parser keeps its own stack).
    let e = PipelineLayout::parse(&"(".repeat(4000)).unwrap_err();
    assert_eq!(
        e,
        "groups nested deeper than 32 levels at position 33 of the layout"
    );
    let deep = format!("Et|{}t{}|L", "(".repeat(32), ")".repeat(32));
    assert_eq!(PipelineLayout::parse(&deep).unwrap().layers(), 2);
    // An empty group repeated 2^64-1 times expands to nothing, at once.
    let l = PipelineLayout::parse("Et|()*18446744073709551615t|L").unwrap();
    assert_eq!(l.stages().len(), 3);
    // Nested repeats stop at 65,536 symbols.
    let e = PipelineLayout::parse("Et|((((t*16)*16)*16)*16)*16|L").unwrap_err();
    assert!(e.contains("expands to too many symbols"), "{e}");
    // Read from an input, a bad layout decodes (an object the API server accepted always
    // does) and the legality check names the field.
    let l: Layout = serde_json::from_str(r#"{"pp": 2, "pipelineLayout": "((("}"#).unwrap();
    let e = broken(&llama70(64), l);
    expect(
        e,
        "within-bounds",
        "spec.parallelism.pipelineLayout",
        "unclosed `(` at position 3 of the layout",
    );
}

#[test]
fn pipeline_layout_in_a_plan_names_the_field() {
    let c = Catalog::builtin().unwrap();
    let plan = r#"
spec:
  model: {preset: deepseek-v3}
  cluster: {gpu: h100-sxm, gpus: 1024}
  training: {seqLength: 4096, globalBatchSize: 8192}
  parallelism: {tp: 2, pp: 8, vpp: 4, ep: 64, pipelineLayout: "Et|(tt|)*30mX"}
"#;
    let e = primus_oracle::plan::parse_plan(plan, "plan.yaml", &c).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("spec.parallelism.pipelineLayout: unexpected 'X'"),
        "{msg}"
    );
}

#[test]
fn ep_needs_moe() {
    let e = broken(
        &llama70(64),
        Layout {
            tp: 8,
            ep: 2,
            ..Layout::default()
        },
    );
    expect(
        e,
        "ep-needs-moe",
        "spec.parallelism.ep",
        "expert parallelism needs a mixture-of-experts model",
    );
}

#[test]
fn ep_divides_experts() {
    let s = scenario("mixtral-8x7b", 48, 4096, 48);
    let e = broken(
        &s,
        Layout {
            ep: 3,
            ..Layout::default()
        },
    );
    expect(
        e,
        "ep-divides-experts",
        "spec.parallelism.ep",
        "3 does not divide the model's 8 experts",
    );
}

#[test]
fn etp_divides_moe_ffn() {
    let mut s = scenario("mixtral-8x7b", 48, 4096, 48);
    s.model.moe.as_mut().unwrap().moe_ffn_hidden_size = 14335;
    let e = broken(
        &s,
        Layout {
            ep: 8,
            etp: 2,
            ..Layout::default()
        },
    );
    expect(
        e,
        "etp-divides-moe-ffn",
        "spec.parallelism.etp",
        "2 does not divide moeFfnHiddenSize 14335",
    );
}

#[test]
fn expert_grid_fits_one_pipeline_stage() {
    // Qwen3-30B-A3B on 16 GPUs with PP4: 4 GPUs per stage cannot hold EP 8.
    let s = scenario("qwen3-30b-a3b", 16, 4096, 64);
    let e = broken(
        &s,
        Layout {
            pp: 4,
            ep: 8,
            ..Layout::default()
        },
    );
    expect(
        e,
        "expert-grid-fits",
        "spec.parallelism.ep",
        "ep*etp = 8*1 = 8 does not divide the 4 GPUs of one pipeline stage (tp*cp*dp); MoE parallel folding needs it",
    );
}

#[test]
fn moe_with_tp_needs_sequence_parallel() {
    let s = scenario("mixtral-8x7b", 16, 4096, 16);
    let e = broken(
        &s,
        Layout {
            tp: 2,
            ep: 8,
            sequence_parallel: false,
            ..Layout::default()
        },
    );
    expect(
        e,
        "moe-needs-sp",
        "spec.parallelism.sequenceParallel",
        "a mixture-of-experts model with tp > 1 needs sequence parallelism",
    );
}

#[test]
fn cp_divides_sequence() {
    let s = scenario("llama3.1-8b", 24, 6008, 24);
    let e = broken(
        &s,
        Layout {
            cp: 8,
            ..Layout::default()
        },
    );
    expect(
        e,
        "cp-divides-seq",
        "spec.parallelism.cp",
        "seqLength 6008 is not divisible by 2*cp = 16 (context parallelism splits each sequence into 2*cp chunks)",
    );
}

#[test]
fn sequence_parallel_divides_tokens_over_tp() {
    let s = scenario("llama3.1-8b", 8, 4100, 8);
    let e = broken(
        &s,
        Layout {
            tp: 8,
            ..Layout::default()
        },
    );
    expect(
        e,
        "sp-divides-seq",
        "spec.parallelism.sequenceParallel",
        "the 4100 tokens per context-parallel rank are not divisible by tp = 8 (sequence parallelism splits them over TP)",
    );
}

#[test]
fn global_batch_divisible_by_mbs_and_dp() {
    let s = scenario("llama3.1-8b", 64, 4096, 100);
    let e = broken(
        &s,
        Layout {
            tp: 2,
            micro_batch_size: 2,
            ..Layout::default()
        },
    );
    expect(
        e,
        "gbs-divisible",
        "spec.training.globalBatchSize",
        "100 is not divisible by microBatchSize*dp = 2*32 = 64",
    );
}

#[test]
fn schedule_rules() {
    let s = llama70(64);
    let e = broken(
        &s,
        Layout {
            tp: 4,
            pp: 8,
            schedule: Schedule::Interleaved,
            ..Layout::default()
        },
    );
    expect(
        e,
        "interleaved-needs-vpp",
        "spec.parallelism.schedule",
        "interleaved needs vpp > 1 model chunks per rank (got 1)",
    );
    let e = broken(
        &s,
        Layout {
            tp: 4,
            pp: 8,
            vpp: 5,
            ..Layout::default()
        },
    );
    expect(
        e,
        "vpp-needs-interleaved",
        "spec.parallelism.schedule",
        "1f1b runs one model chunk per rank; vpp = 5 needs schedule interleaved",
    );
    let e = broken(
        &s,
        Layout {
            tp: 8,
            schedule: Schedule::ZeroBubble,
            ..Layout::default()
        },
    );
    expect(
        e,
        "zero-bubble-needs-pp",
        "spec.parallelism.schedule",
        "zero-bubble (ZB-H1) schedules a pipeline: it needs pp > 1",
    );
    // 64 GPUs, TP4 PP8: dp 2; global batch 24 / (1*2) = 12 micro-batches, not a multiple of 8.
    let s = scenario("llama3.1-70b", 64, 8192, 24);
    let e = broken(
        &s,
        Layout {
            tp: 4,
            pp: 8,
            vpp: 5,
            schedule: Schedule::Interleaved,
            ..Layout::default()
        },
    );
    expect(
        e,
        "interleaved-microbatches",
        "spec.training.globalBatchSize",
        "the interleaved schedule needs the number of micro-batches (12) to be a multiple of pp = 8 (Megatron's schedule groups micro-batches by pp)",
    );
}

#[test]
fn recompute_layer_rules() {
    let s = llama70(64);
    let e = broken(
        &s,
        Layout {
            tp: 8,
            pp: 8,
            recompute: Recompute::Selective,
            recompute_layers: 2,
            ..Layout::default()
        },
    );
    expect(
        e,
        "recompute-layers-need-full",
        "spec.parallelism.recomputeLayers",
        "recomputeLayers counts fully recomputed layers: it needs recompute full (got selective)",
    );
    let e = broken(
        &s,
        Layout {
            tp: 8,
            pp: 8,
            recompute: Recompute::Full,
            recompute_layers: 11,
            ..Layout::default()
        },
    );
    expect(
        e,
        "recompute-layers-fit",
        "spec.parallelism.recomputeLayers",
        "11 exceeds the 10 layers of the largest model chunk (use 0 to recompute every layer)",
    );
}

#[test]
fn even_interleaved_layer_ranges() {
    // 16 layers, pp 4, vpp 2: 2 layers per chunk; chunk c of rank r is slice c*4 + r.
    let l = Layout {
        pp: 4,
        vpp: 2,
        schedule: Schedule::Interleaved,
        ..Layout::default()
    };
    assert_eq!(
        l.layer_ranges(16),
        vec![
            vec![0..2, 8..10],
            vec![2..4, 10..12],
            vec![4..6, 12..14],
            vec![6..8, 14..16]
        ]
    );
}

#[test]
fn uneven_layer_ranges() {
    // 126 layers on 16 stages, first and last 7: the middle 14 stages hold 8 each.
    let l = Layout {
        pp: 16,
        first_stage_layers: Some(7),
        last_stage_layers: Some(7),
        ..Layout::default()
    };
    let r = l.layer_ranges(126);
    assert_eq!(r[0], vec![0..7]);
    assert_eq!(r[1], vec![7..15]);
    assert_eq!(r[14], vec![111..119]);
    assert_eq!(r[15], vec![119..126]);
    // Only the first stage given: the other 15 stages split the rest (the last is a middle
    // stage): 32 layers, pp 4, first 2 -> 10 each.
    let l = Layout {
        pp: 4,
        first_stage_layers: Some(2),
        ..Layout::default()
    };
    assert_eq!(
        l.layer_ranges(32),
        vec![vec![0..2], vec![2..12], vec![12..22], vec![22..32]]
    );
}

#[test]
fn uneven_interleaved_layer_ranges() {
    // Megatron's get_transformer_layer_offset with VPP: 28 layers, pp 4, vpp 2, first 4 and
    // last 4: chunks of 2 (first), 5, 5 (middle) and 2 (last) layers; each round covers
    // 28/2 = 14 layers.
    let l = Layout {
        pp: 4,
        vpp: 2,
        first_stage_layers: Some(4),
        last_stage_layers: Some(4),
        schedule: Schedule::Interleaved,
        ..Layout::default()
    };
    assert_eq!(
        l.layer_ranges(28),
        vec![
            vec![0..2, 14..16],
            vec![2..7, 16..21],
            vec![7..12, 21..26],
            vec![12..14, 26..28]
        ]
    );
}

#[test]
fn explicit_layout_layer_ranges() {
    // DeepSeek-V3 on PP8 VPP4: stage 0 "Et" holds layer 0, stages 1..=30 two layers each,
    // stage 31 "mL" none (MTP and loss). Stage k is rank k % 8, chunk k / 8.
    let l = Layout {
        pp: 8,
        vpp: 4,
        schedule: Schedule::Interleaved,
        pipeline_layout: Some(PipelineLayout::parse("Et|(tt|)*30mL").unwrap()),
        ..Layout::default()
    };
    let r = l.layer_ranges(61);
    assert_eq!(r[0], vec![0..1, 15..17, 31..33, 47..49]);
    assert_eq!(r[1], vec![1..3, 17..19, 33..35, 49..51]);
    assert_eq!(r[7], vec![13..15, 29..31, 45..47, 61..61]);
    assert_eq!(l.stage_layers(61, 0), 7);
    assert_eq!(l.stage_layers(61, 7), 6);
    let last = l.virtual_stage(61, 1, 7, 3);
    assert!(last.loss && last.mtp == 1 && last.layers == 0);
}

#[test]
fn fsdp_excludes_pipeline_and_expert_parallelism() {
    let s = llama70(64);
    let e = broken(
        &s,
        Layout {
            pp: 2,
            fsdp: true,
            ..Layout::default()
        },
    );
    expect(
        e,
        "fsdp-no-pp",
        "spec.parallelism.fsdp",
        "FSDP does not support pipeline parallelism (pp = 2)",
    );
    let moe = scenario("mixtral-8x7b", 64, 4096, 256);
    let e = broken(
        &moe,
        Layout {
            ep: 8,
            fsdp: true,
            ..Layout::default()
        },
    );
    expect(
        e,
        "fsdp-no-ep",
        "spec.parallelism.fsdp",
        "FSDP does not support expert parallelism (ep = 8)",
    );
    Layout {
        tp: 2,
        fsdp: true,
        ..Layout::default()
    }
    .check(&s)
    .unwrap();
    // torch FSDP2 asserts untied embeddings (arguments.py); GPT-3 175B ties them, and
    // Megatron-FSDP takes it.
    let gpt3 = scenario("gpt3-175b", 64, 2048, 256);
    let e = broken(
        &gpt3,
        Layout {
            tp: 8,
            fsdp: true,
            ..Layout::default()
        },
    );
    assert_eq!(
        (e.rule, e.field.as_str()),
        ("fsdp-needs-untied-embeddings", "spec.parallelism.fsdp"),
        "{e}"
    );
    Layout {
        tp: 8,
        fsdp: true,
        fsdp_kind: primus_oracle::layout::FsdpKind::Megatron,
        ..Layout::default()
    }
    .check(&gpt3)
    .unwrap();
}

#[test]
fn the_tuners_rule_ids_are_the_rules_users_see() {
    // `check_structure_rule` (the tuner's screen: the broken rule's id, no message built) and
    // `check_structure` (what users read) run the same rules: over a grid of layouts, legal
    // and not, both give the same verdict and the same rule, in the same order.
    let mut seen = std::collections::BTreeSet::new();
    let mut checked = 0;
    for s in [
        scenario("deepseek-v3", 1024, 4096, 8192),
        scenario("llama3.1-70b", 96, 8192, 120),
    ] {
        for tp in [1, 2, 3, 8] {
            for pp in [1, 2, 4, 16] {
                for vpp in [1, 2, 5] {
                    for ep in [1, 8, 64, 96] {
                        for cp in [1, 2] {
                            for mbs in [1, 3] {
                                for fsdp in [false, true] {
                                    let l = Layout {
                                        tp,
                                        pp,
                                        vpp,
                                        ep,
                                        cp,
                                        micro_batch_size: mbs,
                                        fsdp,
                                        distributed_optimizer: !fsdp,
                                        sequence_parallel: tp > 1 && ep < 96,
                                        schedule: if vpp > 1 {
                                            Schedule::Interleaved
                                        } else {
                                            Schedule::OneFOneB
                                        },
                                        ..Layout::default()
                                    };
                                    let full = l.check_structure(&s).map_err(|e| e.rule);
                                    let id = l.check_structure_rule(&s).map_err(|r| r.0);
                                    assert_eq!(full, id, "{l:?}");
                                    seen.insert(full.err().unwrap_or("legal"));
                                    checked += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // The grid reaches legal layouts and many different rules.
    assert!(checked > 3000, "{checked}");
    assert!(seen.contains("legal"), "{seen:?}");
    assert!(seen.len() >= 8, "{seen:?}");
}
