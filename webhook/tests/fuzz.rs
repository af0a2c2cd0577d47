//! Property tests: whatever the body, `admission::handle` answers (200 or 400, JSON) and never
//! panics — not in the webhook, and not in the oracle it calls (a caught panic would show as
//! reason `internal`, which fails these tests too).

mod common;

use std::time::{Duration, Instant};

use common::*;
use primus_webhook::admission::{Endpoint, handle};
use primus_webhook::validate::{Reason, Validator};
use proptest::prelude::*;
use serde_json::{Value, json};

fn check(v: &Validator, ep: Endpoint, body: &[u8]) -> primus_webhook::admission::Reply {
    let reply = handle(v, ep, body, Instant::now() + Duration::from_secs(2));
    assert!(
        reply.status == 200 || reply.status == 400,
        "status {}",
        reply.status
    );
    let answer: Value = serde_json::from_slice(&reply.body).expect("the answer is JSON");
    assert_eq!(answer["kind"], "AdmissionReview");
    assert!(answer["response"]["allowed"].is_boolean());
    assert_ne!(
        reply.reason,
        Reason::Internal,
        "the check panicked: {}",
        reply.message
    );
    reply
}

fn endpoints() -> impl Strategy<Value = Endpoint> {
    prop_oneof![
        Just(Endpoint::PyTorchJob { strict: false }),
        Just(Endpoint::PyTorchJob { strict: true }),
        Just(Endpoint::TrainingPlan),
    ]
}

/// Arbitrary JSON, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("[a-zA-Z]{1,8}", inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Values a Megatron flag might be given, sane and not.
fn flag_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..300).prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<u32>().prop_map(|n| n.to_string()),
        Just("0".to_string()),
        Just("-1".to_string()),
        Just("1e9".to_string()),
        Just(String::new()),
        Just("full".to_string()),
        Just("selective".to_string()),
        // --recompute-layer-ids: lists, brackets, repeats, out of range.
        Just("0,1,2".to_string()),
        Just("[0,5]".to_string()),
        Just("3,1,1".to_string()),
        Just("4294967295,0".to_string()),
        "[0-9,]{1,12}",
        "[a-z]{1,6}",
    ]
}

const FLAGS: &[&str] = &[
    "--num-layers",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--num-query-groups",
    "--padded-vocab-size",
    "--num-experts",
    "--moe-router-topk",
    "--moe-ffn-hidden-size",
    "--seq-length",
    "--micro-batch-size",
    "--global-batch-size",
    "--tensor-model-parallel-size",
    "--pipeline-model-parallel-size",
    "--context-parallel-size",
    "--expert-model-parallel-size",
    "--expert-tensor-parallel-size",
    "--num-layers-per-virtual-pipeline-stage",
    "--virtual-pipeline-model-parallel-size",
    "--recompute-granularity",
    "--recompute-method",
    "--recompute-num-layers",
    "--recompute-layer-ids",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--kv-channels",
    "--moe-first-k-dense-replace",
    "--mtp-num-layers",
    "--q-lora-rank",
    "--kv-lora-rank",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..2048), ep in endpoints()) {
        let v = validator();
        let r = check(&v, ep, &body);
        prop_assert_eq!(r.status, 400);
    }

    #[test]
    fn truncated_reviews_never_panic(cut in 0.0f64..1.0, which in 0usize..3, ep in endpoints()) {
        let names = ["oom-pytorchjob", "fitting-pytorchjob", "near-limit-pytorchjob"];
        let body = review(&example(names[which]), None, false);
        let n = ((body.len() as f64) * cut) as usize;
        let v = validator();
        let r = check(&v, ep, &body[..n]);
        prop_assert_eq!(r.status, 400);
    }

    #[test]
    fn random_json_in_the_object_never_panics(spec in any_json(), meta in any_json(), ep in endpoints()) {
        let obj = json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta, "spec": spec});
        let mut r = primus_webhook::admission::review_for(&obj, "CREATE", None, false, "fuzz");
        if ep == Endpoint::TrainingPlan {
            r["request"]["kind"] = json!({"group": "primus.dev", "version": "v1alpha1", "kind": "TrainingPlan"});
        }
        let v = validator();
        check(&v, ep, &serde_json::to_vec(&r).unwrap());
    }

    #[test]
    fn random_flag_values_never_panic(
        edits in prop::collection::vec((0usize..FLAGS.len(), flag_value()), 1..6),
        moe in any::<bool>(),
        which in 0usize..3,
    ) {
        let names = ["oom-pytorchjob", "fitting-pytorchjob", "near-limit-pytorchjob"];
        let mut job = example(names[which]);
        let mut extra = String::new();
        if moe {
            extra.push_str(" --num-experts 8 --moe-router-topk 2");
        }
        for (i, value) in &edits {
            extra.push_str(&format!(" {} {}", FLAGS[*i], value));
        }
        // Appended flags win (argparse: the last occurrence counts).
        edit_script(&mut job, "--use-flash-attn", &format!("--use-flash-attn{extra}"));
        let v = validator();
        let r = check(&v, Endpoint::PyTorchJob { strict: false }, &review(&job, None, false));
        prop_assert_eq!(r.status, 200);
    }

    #[test]
    fn random_annotations_never_panic(layout in any_json(), training in any_json(), card in any_json(), gpu in ".{0,10}") {
        let mut job = example("fitting-pytorchjob");
        job["metadata"]["annotations"] = json!({
            "primus.dev/layout": layout.to_string(),
            "primus.dev/training": training.to_string(),
            "primus.dev/model-card": card.to_string(),
            "primus.dev/gpu": gpu,
        });
        let v = validator();
        let r = check(&v, Endpoint::PyTorchJob { strict: true }, &review(&job, None, false));
        prop_assert_eq!(r.status, 200);
    }

    #[test]
    fn random_layout_numbers_never_panic(
        tp in 0u32..70_000, pp in 0u32..300, vpp in 0u32..20, cp in 0u32..40,
        ep in 0u32..300, etp in 0u32..20, mbs in 0u32..5000, rl in 0u32..5000,
        seq in 0u64..(1 << 25), gbs in 0u64..100_000,
        full in any::<bool>(), preset in 0usize..4,
    ) {
        let presets = ["llama3.1-70b", "mixtral-8x22b", "deepseek-v3", "gpt-oss-120b"];
        let mut job = example("fitting-pytorchjob");
        let mut layout = json!({"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "ep": ep, "etp": etp,
            "microBatchSize": mbs, "recomputeLayers": rl});
        if full {
            layout["recompute"] = json!("full");
        }
        if vpp > 1 {
            layout["schedule"] = json!("interleaved");
        }
        job["metadata"]["annotations"] = json!({
            "primus.dev/layout": layout.to_string(),
            "primus.dev/model": presets[preset],
            "primus.dev/training": json!({"seqLength": seq, "globalBatchSize": gbs}).to_string(),
        });
        let v = validator();
        let r = check(&v, Endpoint::PyTorchJob { strict: false }, &review(&job, None, false));
        prop_assert_eq!(r.status, 200);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn random_plan_numbers_never_panic(
        tp in 0u32..100_000, pp in 0u32..500, vpp in 0u32..10, cp in 0u32..64, mbs in 0u32..100_000,
        gpus in any::<u32>(), gpus_per_node in proptest::option::of(0u32..100),
        seq in any::<u64>(), gbs in any::<u64>(), preset in 0usize..4, card in any::<bool>(),
        layers in any::<u32>(), hidden in any::<u64>(), heads in any::<u32>(),
    ) {
        let presets = ["llama3.1-70b", "mixtral-8x22b", "deepseek-v3", "no-such-model"];
        let model = if card {
            json!({"card": {"layers": layers, "hiddenSize": hidden, "ffnHiddenSize": hidden,
                "attentionHeads": heads, "vocabSize": 32000, "activation": "swiglu", "norm": "rmsnorm"}})
        } else {
            json!({"preset": presets[preset]})
        };
        let mut cluster = json!({"gpu": "mi300x", "gpus": gpus});
        if let Some(n) = gpus_per_node {
            cluster["gpusPerNode"] = json!(n);
        }
        let obj = json!({
            "apiVersion": "primus.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": "fuzz", "namespace": "default"},
            "spec": {
                "model": model, "cluster": cluster,
                "training": {"seqLength": seq, "globalBatchSize": gbs},
                "parallelism": {"tp": tp, "pp": pp, "vpp": vpp, "cp": cp, "microBatchSize": mbs},
            }
        });
        let r = primus_webhook::admission::review_for(&obj, "CREATE", None, false, "fuzz");
        let v = validator();
        let reply = check(&v, Endpoint::TrainingPlan, &serde_json::to_vec(&r).unwrap());
        prop_assert_eq!(reply.status, 200);
    }
}
