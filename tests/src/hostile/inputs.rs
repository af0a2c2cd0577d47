//! Generators of hostile input: numbers at and beyond every bound and at the edges of every
//! integer type, non-numbers where numbers belong, long and unicode strings, long lists, deep
//! nesting, and pipeline layouts built to exhaust a recursive parser or an expansion. Plans,
//! PyTorchJobs (annotations and Megatron arguments) are valid ones with a few fields replaced
//! by such values, so the cases reach past the first check.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Placeholder replaced in the serialized text by deep nesting ([`expand_deep`]).
pub const DEEP: &str = "@@DEEP@@";

/// What kind of value a field holds (a hostile value is sometimes of another kind).
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Num,
    Float,
    Str,
    /// One of these words, or a hostile string.
    Word(&'static [&'static str]),
    Layout,
    List,
    /// A list of hostile strings.
    Words,
    Card,
    Deep,
}

/// Numbers at and beyond the bounds, the edges of the integer types, and a few non-numbers.
pub fn number() -> BoxedStrategy<Value> {
    let edges: Vec<Value> = [
        0u64,
        1,
        2,
        64,
        65,
        4096,
        4097,
        65536,
        65537,
        1 << 24,
        (1 << 24) + 1,
        (1 << 31) - 2,
        1 << 31,
        u32::MAX as u64,
        u32::MAX as u64 + 1,
        1 << 62,
        i64::MAX as u64,
        u64::MAX,
        14_414_400,
    ]
    .iter()
    .map(|n| json!(n))
    .collect();
    let weird = vec![
        json!(-1),
        json!(i64::MIN),
        json!(2e9),
        json!(1e308),
        json!(-0.0),
        json!(0.5),
        json!("8"),
        Value::Null,
        json!(true),
        json!([]),
    ];
    prop_oneof![
        4 => proptest::sample::select(edges),
        3 => (0u64..70_000).prop_map(|n| json!(n)),
        1 => any::<u64>().prop_map(|n| json!(n)),
        1 => proptest::sample::select(weird),
    ]
    .boxed()
}

/// Fractions and floats: 0, negative, above 1, huge, tiny, not a number.
pub fn float() -> BoxedStrategy<Value> {
    prop_oneof![
        proptest::sample::select(vec![
            json!(0.0),
            json!(-0.0),
            json!(-1.0),
            json!(1.0),
            json!(1.0000001),
            json!(2.0),
            json!(1e308),
            json!(-1e308),
            json!(f64::MIN_POSITIVE),
            json!(5e-324),
            json!("0.9"),
            // Not numbers in JSON; as Megatron flag values they parse to NaN and infinities.
            json!("nan"),
            json!("inf"),
            json!("-inf"),
            Value::Null,
        ]),
        (0.0f64..2.0).prop_map(|f| json!(f)),
    ]
    .boxed()
}

/// Long, empty, unicode, control-character and injection-shaped strings.
pub fn text() -> BoxedStrategy<String> {
    prop_oneof![
        proptest::sample::select(vec![
            String::new(),
            " ".into(),
            "x".into(),
            "\0".into(),
            "\u{202e}rtl".into(),
            "e\u{301}\u{301}\u{301}".into(),
            "🦀".repeat(1000),
            "../../etc/passwd".into(),
            "http://".into(),
            "file:///etc/passwd".into(),
            "http://169.254.169.254/latest".into(),
            "$(reboot)".into(),
            "a\nb\rc".into(),
            "Bad_Name".into(),
            "-".into(),
        ]),
        (0usize..300_000).prop_map(|n| "a".repeat(n)),
        (0usize..3_000).prop_map(|n| "é".repeat(n)),
        ".{0,40}",
    ]
    .boxed()
}

/// Pipeline layouts: deep `(` (the recursive parser's stack overflow), unbalanced and
/// unicode text, exponential and huge repeats, very long layouts, and valid ones.
pub fn layout_text() -> BoxedStrategy<String> {
    prop_oneof![
        (1usize..300_000).prop_map(|n| "(".repeat(n)),
        (1usize..3_000).prop_map(|n| format!("Et|{}t{}|L", "(".repeat(n), ")".repeat(n))),
        (1usize..40).prop_map(|n| format!("Et|{}t{}L", "(".repeat(n), ")*16".repeat(n))),
        proptest::sample::select(vec![
            "x".to_string(),
            String::new(),
            "(t|)*999999999".into(),
            "Et|()*18446744073709551615|L".into(),
            "Et|(t|)*99999999999999999999999|L".into(),
            "Et|t*4294967296|L".into(),
            ")))".into(),
            "Et|(tt|)*30mL".into(),
            "Et|(tttt|)*7tttL".into(),
            "E|L".into(),
            "EtL".into(),
            "Et|t|t|t|t|t|t|tL".into(),
            "Et|tt|\u{ff08}t\u{ff09}|L".into(),
        ]),
        "[EtmL|()*0-9, ]{0,2000}",
        (1usize..5_000).prop_map(|n| format!("E{}L", "t|".repeat(n))),
    ]
    .boxed()
}

/// Lists: long ones of numbers, of zeros, empty.
pub fn list() -> BoxedStrategy<Value> {
    prop_oneof![
        Just(json!([])),
        prop::collection::vec(number(), 0..8).prop_map(Value::Array),
        (0usize..20_000).prop_map(|n| Value::Array((1..=n as u64).map(|i| json!(i)).collect())),
        (0usize..5_000).prop_map(|n| Value::Array(vec![json!(0); n])),
    ]
    .boxed()
}

/// A hostile value for a field of `kind`: usually of the kind, sometimes not.
pub fn value(kind: Kind) -> BoxedStrategy<Value> {
    let own = match kind {
        Kind::Num => number(),
        Kind::Float => float(),
        Kind::Str => text().prop_map(Value::String).boxed(),
        Kind::Word(words) => {
            let words: Vec<Value> = words.iter().map(|w| json!(w)).collect();
            prop_oneof![
                3 => proptest::sample::select(words),
                1 => text().prop_map(Value::String),
            ]
            .boxed()
        }
        Kind::Layout => layout_text().prop_map(Value::String).boxed(),
        Kind::List => list(),
        Kind::Words => prop_oneof![
            prop::collection::vec(text(), 0..6).prop_map(|v| json!(v)),
            (0usize..20_000).prop_map(|n| json!(vec!["core_attn"; n])),
        ]
        .boxed(),
        Kind::Card => card(),
        Kind::Deep => Just(json!(DEEP)).boxed(),
    };
    prop_oneof![
        18 => own,
        1 => number(),
        1 => Just(json!(DEEP)),
    ]
    .boxed()
}

/// Set `value` at a dotted `path`, creating objects on the way (replacing non-objects).
pub fn set_path(root: &mut Value, path: &str, value: Value) {
    let mut cur = root;
    let mut parts = path.split('.').peekable();
    while let Some(p) = parts.next() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(map) = cur else { return };
        if parts.peek().is_none() {
            map.insert(p.to_string(), value);
            return;
        }
        cur = map.entry(p.to_string()).or_insert_with(|| json!({}));
    }
}

/// `base` with 1 to `most` of `fields` replaced by hostile values.
pub fn mutate(
    base: BoxedStrategy<Value>,
    fields: &'static [(&'static str, Kind)],
    most: usize,
) -> BoxedStrategy<Value> {
    let edits = prop::collection::vec(
        (0..fields.len()).prop_flat_map(move |i| (Just(i), value(fields[i].1))),
        1..=most,
    );
    (base, edits)
        .prop_map(move |(mut v, edits)| {
            for (i, x) in edits {
                set_path(&mut v, fields[i].0, x);
            }
            v
        })
        .boxed()
}

/// Fields of an inline model card.
pub const CARD_FIELDS: &[(&str, Kind)] = &[
    ("layers", Kind::Num),
    ("hiddenSize", Kind::Num),
    ("ffnHiddenSize", Kind::Num),
    ("attentionHeads", Kind::Num),
    ("kvHeads", Kind::Num),
    ("headDim", Kind::Num),
    ("vocabSize", Kind::Num),
    ("mtpLayers", Kind::Num),
    ("positionEmbeddings", Kind::Num),
    ("slidingWindow", Kind::Num),
    ("fullAttentionEvery", Kind::Num),
    ("name", Kind::Str),
    ("activation", Kind::Word(&["swiglu", "gelu"])),
    ("moe.numExperts", Kind::Num),
    ("moe.topK", Kind::Num),
    ("moe.moeFfnHiddenSize", Kind::Num),
    ("moe.sharedExperts", Kind::Num),
    ("moe.sharedExpertFfnHiddenSize", Kind::Num),
    ("moe.denseLayers", Kind::Num),
    ("moe.capacityFactor", Kind::Float),
    ("mla.kvLoraRank", Kind::Num),
    ("mla.qLoraRank", Kind::Num),
    ("mla.qkNopeHeadDim", Kind::Num),
    ("mla.qkRopeHeadDim", Kind::Num),
    ("mla.vHeadDim", Kind::Num),
];

fn base_card() -> Value {
    json!({"layers": 32, "hiddenSize": 4096, "ffnHiddenSize": 14336, "attentionHeads": 32,
        "kvHeads": 8, "vocabSize": 128256, "activation": "swiglu", "norm": "rmsnorm"})
}

/// A card with hostile sizes (a whole object; the card's fields are mutated once more).
pub fn card() -> BoxedStrategy<Value> {
    mutate(Just(base_card()).boxed(), CARD_FIELDS, 4)
}

/// Fields of a TrainingPlan's spec.
pub const PLAN_FIELDS: &[(&str, Kind)] = &[
    (
        "model.preset",
        Kind::Word(&["llama3.1-8b", "mixtral-8x22b", "deepseek-v3"]),
    ),
    ("model.card", Kind::Card),
    ("cluster.gpu", Kind::Word(&["h100-sxm", "mi300x"])),
    ("cluster.gpus", Kind::Num),
    ("cluster.gpusPerNode", Kind::Num),
    ("training.seqLength", Kind::Num),
    ("training.globalBatchSize", Kind::Num),
    ("training.precision", Kind::Word(&["bf16", "fp8"])),
    ("parallelism.tp", Kind::Num),
    ("parallelism.pp", Kind::Num),
    ("parallelism.vpp", Kind::Num),
    ("parallelism.cp", Kind::Num),
    ("parallelism.ep", Kind::Num),
    ("parallelism.etp", Kind::Num),
    ("parallelism.microBatchSize", Kind::Num),
    ("parallelism.recomputeLayers", Kind::Num),
    ("parallelism.firstStageLayers", Kind::Num),
    ("parallelism.lastStageLayers", Kind::Num),
    ("parallelism.pipelineLayout", Kind::Layout),
    ("parallelism.recomputeModules", Kind::Words),
    (
        "parallelism.schedule",
        Kind::Word(&["1f1b", "interleaved", "zero-bubble"]),
    ),
    (
        "parallelism.recompute",
        Kind::Word(&["none", "selective", "full"]),
    ),
    // The optimizer and activation memory options (issue 15).
    ("parallelism.attentionDropout", Kind::Float),
    ("parallelism.hiddenDropout", Kind::Float),
    ("parallelism.precisionAwareOptimizer", Kind::Word(&["true"])),
    (
        "parallelism.expAvgDtype",
        Kind::Word(&["fp32", "bf16", "fp16", "fp8"]),
    ),
    ("parallelism.mainGradsDtype", Kind::Word(&["fp32", "bf16"])),
    ("parallelism.optimizerCpuOffload", Kind::Word(&["true"])),
    ("parallelism.optimizerOffloadFraction", Kind::Float),
    ("parallelism.activationOffloadLayers", Kind::Num),
    (
        "tuning.searcher",
        Kind::Word(&["exhaustive", "seed", "evolutionary", "agent", "none"]),
    ),
    ("tuning.topK", Kind::Num),
    ("tuning.memoryHeadroom", Kind::Float),
    ("tuning.allowed.tp", Kind::List),
    ("tuning.allowed.ep", Kind::List),
    ("tuning.allowed.microBatchSize", Kind::List),
    ("tuning.allowed.vpp", Kind::List),
    ("tuning.allowed.recompute", Kind::Words),
    ("tuning.fixed.tp", Kind::Num),
    ("tuning.fixed.pp", Kind::Num),
    ("tuning.fixed.recomputeLayers", Kind::Num),
    ("tuning.agent.endpoint", Kind::Str),
    ("tuning.agent.apiKeyEnv", Kind::Str),
    ("tuning.agent.rounds", Kind::Num),
    ("tuning.agent.timeoutSeconds", Kind::Num),
    ("benchmark.enabled", Kind::Word(&["true"])),
    ("benchmark.timeoutSeconds", Kind::Num),
    ("benchmark.maxAttempts", Kind::Num),
    ("benchmark.reuseWithinHours", Kind::Num),
    ("benchmark.image", Kind::Str),
    (
        "benchmark.backend",
        Kind::Word(&["rocm", "cuda", "simulate"]),
    ),
    ("benchmark.tolerations", Kind::List),
    ("job.name", Kind::Str),
    ("job.template", Kind::Deep),
    (
        "job.template.spec.pytorchReplicaSpecs.Master.replicas",
        Kind::Num,
    ),
    ("job.template.spec.nprocPerNode", Kind::Num),
    ("drift.tolerance", Kind::Float),
    ("drift.prometheus.url", Kind::Str),
    ("drift.prometheus.query", Kind::Str),
];

/// Valid plans the hostile ones start from: small ones mostly (the tuner runs on what passes).
pub fn base_plan() -> BoxedStrategy<Value> {
    let small = json!({
        "model": {"preset": "llama3.1-8b"},
        "cluster": {"gpu": "h100-sxm", "gpus": 8},
        "training": {"seqLength": 4096, "globalBatchSize": 64},
        "tuning": {"searcher": "seed"},
    });
    let layout = json!({
        "model": {"preset": "llama3.1-8b"},
        "cluster": {"gpu": "h100-sxm", "gpus": 16},
        "training": {"seqLength": 4096, "globalBatchSize": 64},
        "parallelism": {"tp": 4, "pp": 2, "microBatchSize": 1},
        "tuning": {"searcher": "none"},
    });
    let moe = json!({
        "model": {"preset": "mixtral-8x22b"},
        "cluster": {"gpu": "mi300x", "gpus": 64},
        "training": {"seqLength": 4096, "globalBatchSize": 256},
        "parallelism": {"tp": 2, "pp": 4, "ep": 8, "microBatchSize": 1},
        "tuning": {"searcher": "seed", "topK": 3},
    });
    let card = json!({
        "model": {"card": base_card()},
        "cluster": {"gpu": "h100-sxm", "gpus": 8},
        "training": {"seqLength": 4096, "globalBatchSize": 64},
        "parallelism": {"tp": 8},
        "tuning": {"searcher": "none"},
    });
    prop_oneof![
        3 => Just(small),
        3 => Just(layout),
        1 => Just(moe),
        2 => Just(card),
    ]
    .boxed()
}

/// A hostile plan spec (as a value with [`DEEP`] markers) and the depth the markers expand to.
pub fn plan_spec() -> BoxedStrategy<(Value, usize)> {
    (mutate(base_plan(), PLAN_FIELDS, 3), depth()).boxed()
}

/// Nesting depth of a [`DEEP`] marker: shallow to far beyond any parser's limit.
pub fn depth() -> BoxedStrategy<usize> {
    prop_oneof![4 => 1usize..200, 1 => 100usize..200_000].boxed()
}

/// Whether `v` holds a [`DEEP`] marker (anywhere, as a string value).
pub fn has_deep(v: &Value) -> bool {
    match v {
        Value::String(s) => s == DEEP,
        Value::Array(a) => a.iter().any(has_deep),
        Value::Object(m) => m.values().any(has_deep),
        _ => false,
    }
}

/// JSON text of `v` with every [`DEEP`] marker replaced by `depth` nested arrays.
pub fn expand_deep(v: &Value, depth: usize) -> String {
    let text = v.to_string();
    let marker = format!("\"{DEEP}\"");
    if !text.contains(&marker) {
        return text;
    }
    let nest = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    text.replace(&marker, &nest)
}

/// Request bodies the API server takes (its `--max-request-bytes` default, 3 MiB): a larger
/// object never reaches a controller.
pub const MAX_REQUEST_BYTES: usize = 3 << 20;

/// [`expand_deep`], or None when the text would be longer than `cap` bytes (computed before
/// building it: a marker cycled into thousands of list items expands to gigabytes).
pub fn expand_deep_within(v: &Value, depth: usize, cap: usize) -> Option<String> {
    let text = v.to_string();
    let marker = format!("\"{DEEP}\"");
    let markers = text.matches(&marker).count();
    let len = (text.len() - markers * marker.len())
        .checked_add(markers.checked_mul(depth.checked_mul(2)?)?)?;
    if len > cap {
        return None;
    }
    Some(text.replace(
        &marker,
        &format!("{}{}", "[".repeat(depth), "]".repeat(depth)),
    ))
}

/// A whole TrainingPlan object around a spec (for admission requests).
pub fn plan_object(spec: Value) -> Value {
    json!({"apiVersion": "primus.dev/v1alpha1", "kind": "TrainingPlan",
        "metadata": {"name": "hostile", "namespace": "default"}, "spec": spec})
}

/// Megatron flags and the values hostile arguments give them.
pub const FLAGS: &[(&str, Kind)] = &[
    ("--num-layers", Kind::Num),
    ("--hidden-size", Kind::Num),
    ("--ffn-hidden-size", Kind::Num),
    ("--num-attention-heads", Kind::Num),
    ("--num-query-groups", Kind::Num),
    ("--padded-vocab-size", Kind::Num),
    ("--num-experts", Kind::Num),
    ("--moe-router-topk", Kind::Num),
    ("--moe-ffn-hidden-size", Kind::Num),
    ("--seq-length", Kind::Num),
    ("--micro-batch-size", Kind::Num),
    ("--global-batch-size", Kind::Num),
    ("--tensor-model-parallel-size", Kind::Num),
    ("--pipeline-model-parallel-size", Kind::Num),
    ("--context-parallel-size", Kind::Num),
    ("--expert-model-parallel-size", Kind::Num),
    ("--expert-tensor-parallel-size", Kind::Num),
    ("--num-layers-per-virtual-pipeline-stage", Kind::Num),
    ("--virtual-pipeline-model-parallel-size", Kind::Num),
    (
        "--recompute-granularity",
        Kind::Word(&["full", "selective"]),
    ),
    ("--recompute-method", Kind::Word(&["block", "uniform"])),
    ("--recompute-num-layers", Kind::Num),
    ("--recompute-modules", Kind::Str),
    ("--decoder-first-pipeline-num-layers", Kind::Num),
    ("--decoder-last-pipeline-num-layers", Kind::Num),
    ("--pipeline-model-parallel-layout", Kind::Layout),
    ("--attention-dropout", Kind::Float),
    ("--hidden-dropout", Kind::Float),
    ("--exp-avg-dtype", Kind::Word(&["fp32", "bf16", "fp8"])),
    ("--optimizer-offload-fraction", Kind::Float),
    ("--cpu-offloading-num-layers", Kind::Num),
    ("--kv-channels", Kind::Num),
    ("--mtp-num-layers", Kind::Num),
    ("--kv-lora-rank", Kind::Num),
    ("--moe-expert-capacity-factor", Kind::Float),
];

/// The base Megatron arguments (Llama 3.1 8B, TP 8 on one 8-GPU H100 node).
pub fn base_args() -> Vec<String> {
    "--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
     --group-query-attention --num-query-groups 8 --padded-vocab-size 128256 --swiglu \
     --seq-length 4096 --global-batch-size 64 --micro-batch-size 1 \
     --tensor-model-parallel-size 8 --pipeline-model-parallel-size 1 --bf16 \
     --use-distributed-optimizer --sequence-parallel"
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

fn flag_value(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Megatron argument lists: the base with hostile flags appended (the last occurrence wins),
/// thousands of filler words, or the whole line as one `bash -c` script.
pub fn megatron_args() -> BoxedStrategy<Vec<String>> {
    let edits = prop::collection::vec(
        (0..FLAGS.len()).prop_flat_map(|i| (Just(i), value(FLAGS[i].1))),
        0..4,
    );
    (edits, 0usize..3, 0usize..30_000)
        .prop_map(|(edits, shape, filler)| {
            let mut args = base_args();
            for (i, v) in edits {
                args.push(FLAGS[i].0.to_string());
                args.push(flag_value(&v));
            }
            match shape {
                0 => args,
                1 => {
                    let mut with = vec!["--tokenizer-type".to_string(); filler];
                    with.extend(args);
                    with
                }
                _ => vec![
                    "bash".into(),
                    "-c".into(),
                    format!("torchrun pretrain_gpt.py {} \"'", args.join(" ")),
                ],
            }
        })
        .boxed()
}

/// Fields of the layout annotation.
pub const LAYOUT_FIELDS: &[(&str, Kind)] = &[
    ("tp", Kind::Num),
    ("pp", Kind::Num),
    ("vpp", Kind::Num),
    ("cp", Kind::Num),
    ("ep", Kind::Num),
    ("etp", Kind::Num),
    ("microBatchSize", Kind::Num),
    ("recomputeLayers", Kind::Num),
    ("pipelineLayout", Kind::Layout),
    ("recomputeModules", Kind::Words),
    ("schedule", Kind::Word(&["interleaved", "zero-bubble"])),
    ("hiddenDropout", Kind::Float),
    ("optimizerOffloadFraction", Kind::Float),
    ("activationOffloadLayers", Kind::Num),
];

/// Annotation text: JSON of a hostile layout, card or training object, deep nesting, or
/// arbitrary text.
pub fn annotation() -> BoxedStrategy<String> {
    prop_oneof![
        3 => mutate(Just(json!({"tp": 8})).boxed(), LAYOUT_FIELDS, 3).prop_map(|v| v.to_string()),
        2 => card().prop_map(|v| v.to_string()),
        2 => mutate(
            Just(json!({"seqLength": 4096, "globalBatchSize": 64})).boxed(),
            &[("seqLength", Kind::Num), ("globalBatchSize", Kind::Num), ("precision", Kind::Str)],
            2,
        )
        .prop_map(|v| v.to_string()),
        1 => depth().prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d))),
        1 => depth().prop_map(|d| "{\"a\":".repeat(d)),
        1 => text(),
    ]
    .boxed()
}

/// A PyTorchJob with hostile annotations, Megatron arguments, replica counts and
/// `nprocPerNode`.
pub fn pytorchjob() -> BoxedStrategy<Value> {
    let annotations = prop::collection::vec(
        (
            proptest::sample::select(vec![
                "primus.dev/layout",
                "primus.dev/model-card",
                "primus.dev/training",
                "primus.dev/model",
                "primus.dev/gpu",
            ]),
            prop_oneof![
                annotation(),
                proptest::sample::select(vec![
                    "llama3.1-8b".to_string(),
                    "h100-sxm".to_string(),
                    "deepseek-v3".to_string(),
                ]),
            ],
        ),
        0..3,
    );
    (
        megatron_args(),
        annotations,
        prop_oneof![4 => Just(json!(1)), 1 => number()],
        prop_oneof![
            4 => Just(json!("8")),
            1 => number(),
            1 => text().prop_map(Value::String),
        ],
    )
        .prop_map(|(args, annotations, replicas, nproc)| {
            let annotations: Map<String, Value> = annotations
                .into_iter()
                .map(|(k, v)| (k.to_string(), Value::String(v)))
                .collect();
            json!({
                "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                "metadata": {"name": "hostile", "namespace": "default", "annotations": annotations},
                "spec": {
                    "nprocPerNode": nproc,
                    "pytorchReplicaSpecs": {"Master": {"replicas": replicas, "template": {"spec": {
                        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                        "containers": [{"name": "pytorch", "image": "x", "args": args,
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}}
                }
            })
        })
        .boxed()
}

/// Fields of a report's op measurement.
pub const OP_FIELDS: &[(&str, Kind)] = &[
    ("medianSeconds", Kind::Float),
    ("flops", Kind::Float),
    ("bytes", Kind::Float),
    ("spread", Kind::Float),
    ("runs", Kind::Num),
    ("name", Kind::Str),
    (
        "kind",
        Kind::Word(&["gemm", "grouped-gemm", "attention", "memory-bound"]),
    ),
    ("shape", Kind::List),
    ("precision", Kind::Word(&["bf16", "fp8"])),
];

/// Fields of a report's collective measurement.
pub const COLLECTIVE_FIELDS: &[(&str, Kind)] = &[
    (
        "op",
        Kind::Word(&[
            "all-reduce",
            "reduce-scatter",
            "all-gather",
            "all-to-all",
            "p2p",
        ]),
    ),
    ("groupSize", Kind::Num),
    ("bytes", Kind::Float),
    ("medianSeconds", Kind::Float),
    ("spread", Kind::Float),
    ("busBandwidthGbps", Kind::Float),
    ("runs", Kind::Num),
];

/// Fields of a report's results (`spec.results` of a BenchmarkReport).
pub const REPORT_FIELDS: &[(&str, Kind)] = &[
    ("backend", Kind::Word(&["simulate", "rocm", "cuda"])),
    ("gpu", Kind::Word(&["h100-sxm", "mi300x"])),
    ("gpuProduct", Kind::Str),
    ("gpuCount", Kind::Num),
    ("node", Kind::Str),
    ("model", Kind::Str),
    ("shapesKey", Kind::Str),
    ("reducedAxes", Kind::Words),
    ("peakMemoryBytes", Kind::Float),
    ("targetLayout.tp", Kind::Num),
    ("targetLayout.pipelineLayout", Kind::Layout),
    ("measuredLayout.tp", Kind::Num),
    ("measuredLayout.ep", Kind::Num),
    ("measuredLayout.pipelineLayout", Kind::Layout),
    ("ops", Kind::Deep),
    ("finalists", Kind::Deep),
    ("finalists", Kind::Words),
];

/// One edit of one list item: (index, field, value).
fn item_edits(
    fields: &'static [(&'static str, Kind)],
) -> BoxedStrategy<Vec<(usize, usize, Value)>> {
    prop::collection::vec(
        (any::<usize>(), 0..fields.len())
            .prop_flat_map(move |(at, i)| (Just(at), Just(i), value(fields[i].1))),
        0..4,
    )
    .boxed()
}

/// A benchmark report's results built from a genuine one (`base`, e.g. a simulated run of
/// the plan): hostile values in its fields and in some of its measurements, every median
/// scaled by an absurd factor, the measurement lists emptied or made thousands long.
pub fn report(base: Value) -> BoxedStrategy<Value> {
    let factors = vec![1.0, 1.0, 0.0, -1.0, 1e-300, 1e-12, 1e12, 1e300];
    (
        mutate(Just(base).boxed(), REPORT_FIELDS, 3),
        item_edits(OP_FIELDS),
        item_edits(COLLECTIVE_FIELDS),
        proptest::sample::select(factors),
        // Past both bounds (4,096 ops, 1,024 collectives) and below what the API server
        // stores; larger lists only cost time in this debug build.
        prop_oneof![6 => Just(1usize), 1 => Just(0usize), 1 => 2usize..6_000],
    )
        .prop_map(|(mut v, ops, collectives, factor, repeat)| {
            for (key, edits, fields) in [
                ("ops", ops, OP_FIELDS),
                ("collectives", collectives, COLLECTIVE_FIELDS),
            ] {
                let Some(list) = v.get_mut(key).and_then(Value::as_array_mut) else {
                    continue;
                };
                let n = list.len();
                if n == 0 {
                    continue;
                }
                for (at, i, x) in edits {
                    set_path(&mut list[at % n], fields[i].0, x);
                }
                for m in list.iter_mut() {
                    if let Some(s) = m["medianSeconds"].as_f64() {
                        m["medianSeconds"] = json!(s * factor);
                    }
                }
                // `repeat` measurements in all (the API server stores objects up to ~1.5 MB:
                // some thousands of measurements).
                let total = if repeat == 1 { n } else { repeat };
                let one = list.clone();
                *list = one.iter().cycle().take(total).cloned().collect();
            }
            v
        })
        .boxed()
}
