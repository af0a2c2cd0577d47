//! Decisions and messages of the webhook, through `admission::handle` (no network): deriving
//! jobs from flags and annotations, denials with numbers and suggestions, headroom warnings,
//! strict mode, updates, dry runs, malformed requests and TrainingPlans.

mod common;

use std::collections::BTreeMap;

use common::*;
use primus_crds::annotations;
use primus_oracle::layout::Recompute;
use primus_oracle::memory;
use primus_oracle::profiles::Catalog;
use primus_oracle::units::gib;
use primus_webhook::admission::Endpoint;
use primus_webhook::pytorchjob::{DeriveError, LayoutSource, derive};
use serde_json::{Value, json};

/// The nearest layouts that fit under `limit` bytes, at most `max`, with a deadline far beyond
/// what the search takes.
fn nearest(
    s: &primus_oracle::scenario::Scenario,
    l: &primus_oracle::layout::Layout,
    limit: f64,
    max: usize,
) -> primus_webhook::suggest::SearchOutcome {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    primus_webhook::suggest::search(s, l, limit, deadline, max)
}

/// The flags of every suggestion of a search, for assertion messages.
fn flags(out: &primus_webhook::suggest::SearchOutcome) -> Vec<String> {
    out.suggestions.iter().map(|x| x.flags()).collect()
}

fn no_annotations() -> BTreeMap<String, String> {
    BTreeMap::new()
}

#[test]
fn derives_the_oom_example_from_megatron_flags_and_node_selector() {
    let c = Catalog::builtin().unwrap();
    let job = example("oom-pytorchjob");
    let d = derive(&job, &no_annotations(), &c).expect("derivable");
    assert_eq!(
        d.scenario.cluster.gpus, 64,
        "1 Master + 7 Workers x nprocPerNode 8"
    );
    assert_eq!(d.scenario.cluster.gpus_per_node, 8);
    assert_eq!(d.scenario.hardware.name, "mi300x");
    assert!(
        d.gpu_source
            .contains("amd.com/gpu.product-name=AMD_Instinct_MI300X")
    );
    assert_eq!(d.scenario.model.layers, 80);
    assert_eq!(d.scenario.model.hidden_size, 8192);
    assert_eq!(d.scenario.model.kv_heads(), 8);
    assert_eq!(d.scenario.training.seq_length, 8192);
    assert_eq!(d.scenario.training.global_batch_size, 128);
    assert_eq!((d.layout.tp, d.layout.pp, d.layout.cp), (1, 1, 1));
    assert_eq!(d.layout.recompute, Recompute::None);
    assert!(d.layout.distributed_optimizer);
    assert_eq!(d.layout_source, LayoutSource::Flags);
}

#[test]
fn the_oom_example_is_denied_with_numbers_and_a_suggestion() {
    let v = validator();
    let (status, a) = answer(
        &v,
        PYTORCHJOB,
        &review(&example("oom-pytorchjob"), None, false),
    );
    assert_eq!(status, 200);
    assert!(!allowed(&a), "{a}");
    let m = message(&a);
    assert!(m.starts_with("predicted "), "{m}");
    assert!(
        m.contains(" GiB on pipeline stage 0 > 190.6 GiB usable on MI300X"),
        "{m}"
    );
    for part in [
        "(weights ",
        "grads ",
        "optimizer ",
        "activations ",
        "other ",
    ] {
        assert!(m.contains(part), "no {part:?} in {m}");
    }
    assert!(m.contains("; fits with --"), "no suggestion in {m}");
    // The denial states the measured error band it is beyond.
    assert!(
        m.contains("beyond the memory model's measured error band -3%/+11% (Megatron dense jobs)"),
        "{m}"
    );
    assert_eq!(a["response"]["status"]["code"], 403);
    assert_eq!(a["response"]["uid"], "3f1c-test-uid");
    assert_eq!(a["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(a["kind"], "AdmissionReview");
    // The predicted figure is the oracle's.
    let d = derive(&example("oom-pytorchjob"), &no_annotations(), &v.catalog).unwrap();
    let (peak, _) = memory::peak_bytes(&d.scenario, &d.layout);
    assert!(
        m.contains(&format!("predicted {:.1} GiB", gib(peak))),
        "{m}"
    );
    assert_eq!(
        a["response"]["auditAnnotations"]["predicted-gib"],
        format!("{:.1}", gib(peak))
    );
}

#[test]
fn every_suggestion_is_a_legal_layout_that_fits_and_applying_it_is_admitted() {
    let v = validator();
    let job = example("oom-pytorchjob");
    let (_, a) = answer(&v, PYTORCHJOB, &review(&job, None, false));
    let m = message(&a);
    let fixes = m.split("; fits with ").nth(1).expect("suggestions");
    let d = derive(&job, &no_annotations(), &v.catalog).unwrap();
    let out = nearest(
        &d.scenario,
        &d.layout,
        0.92 * d.scenario.hardware.usable_bytes(),
        3,
    );
    assert!(!out.suggestions.is_empty());
    for s in &out.suggestions {
        assert!(s.layout.check(&d.scenario).is_ok());
        assert!(s.peak_bytes <= 0.92 * d.scenario.hardware.usable_bytes());
        assert!(fixes.contains(&s.flags()), "{} not in {fixes}", s.flags());
        // Apply the suggested flags to the job: the result must be admitted without warnings
        // about memory.
        let mut fixed = job.clone();
        let mut flags = String::new();
        for (f, val) in [
            ("--tensor-model-parallel-size", s.layout.tp),
            ("--pipeline-model-parallel-size", s.layout.pp),
            ("--context-parallel-size", s.layout.cp),
            ("--micro-batch-size", s.layout.micro_batch_size),
        ] {
            flags.push_str(&format!("{f} {val} "));
        }
        match s.layout.recompute {
            Recompute::None => {}
            Recompute::Selective => {
                flags.push_str("--recompute-granularity selective ");
                if let Some(m) = &s.layout.recompute_modules {
                    flags.push_str("--recompute-modules ");
                    for x in m {
                        flags.push_str(x.as_str());
                        flags.push(' ');
                    }
                }
            }
            Recompute::Full if s.layout.recompute_layers == 0 => flags.push_str(
                "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 ",
            ),
            Recompute::Full => flags.push_str(&format!(
                "--recompute-granularity full --recompute-method block --recompute-num-layers {} ",
                s.layout.recompute_layers
            )),
        }
        if s.layout.sequence_parallel && s.layout.tp > 1 {
            flags.push_str("--sequence-parallel ");
        }
        if s.layout.distributed_optimizer {
            flags.push_str("--use-distributed-optimizer ");
        }
        if s.layout.fsdp {
            flags.push_str("--use-torch-fsdp2 ");
        }
        if s.layout.activation_offload_layers > 0 {
            flags.push_str(&format!(
                "--cpu-offloading-num-layers {} ",
                s.layout.activation_offload_layers
            ));
        }
        set_layout_flags(&mut fixed, &flags);
        edit_script(&mut fixed, "--micro-batch-size 1 --global", "--global");
        let (_, a) = answer(&v, PYTORCHJOB, &review(&fixed, None, false));
        assert!(
            allowed(&a),
            "suggestion {} still denied: {}",
            s.flags(),
            message(&a)
        );
        // Nothing but, past 1.44x its allocated peak, the fixed-size segments' warning (the
        // example job sets no PYTORCH_HIP_ALLOC_CONF).
        assert!(
            warnings(&a)
                .iter()
                .all(|w| w.contains("fixed-size segments can fragment")),
            "{:?}",
            warnings(&a)
        );
    }
}

#[test]
fn recompute_modules_are_suggested_when_they_are_the_nearest_fix() {
    // gpt-oss-120b on 64 B200, PP1 EP8 MBS2, no dropout, under a 162 GiB limit: ~168 GiB as
    // is; Megatron's default selective recompute (the attention core) saves only its softmax
    // statistics, while recomputing the experts' activation (moe_act) brings it under the
    // limit (~161 GiB), a smaller change than full recompute.
    use primus_oracle::layout::{Layout, RecomputeModule};
    use primus_oracle::precision::Precision;
    use primus_webhook::suggest::Move;
    let s = scenario("gpt-oss-120b", "b200", 64, 8, 4096, 512, Precision::Bf16);
    let l = Layout {
        ep: 8,
        micro_batch_size: 2,
        // The gpt-oss recipes train without dropout.
        attention_dropout: primus_oracle::layout::Fraction::ZERO,
        hidden_dropout: primus_oracle::layout::Fraction::ZERO,
        ..Layout::default()
    };
    let limit = 162.0 * 1024f64.powi(3);
    assert!(memory::peak_bytes(&s, &l).0 > limit);
    let out = nearest(&s, &l, limit, 5);
    let modules = out
        .suggestions
        .iter()
        .position(|x| matches!(x.moves[..], [Move::RecomputeModules(_)]))
        .expect("a recompute-modules suggestion");
    let m = &out.suggestions[modules];
    assert_eq!(
        m.flags(),
        "--recompute-granularity selective --recompute-modules moe_act"
    );
    assert_eq!(
        m.layout.recompute_modules,
        Some(vec![RecomputeModule::MoeAct])
    );
    assert!(m.layout.check(&s).is_ok() && m.peak_bytes <= limit);
    // One suggestion per kind of change: the recompute one is the cheapest fitting recompute.
    assert!(
        !out.suggestions
            .iter()
            .any(|x| matches!(x.moves[..], [Move::Recompute(..)])),
        "{:?}",
        flags(&out)
    );
}

/// NVIDIA's Llama 3 70B FP8-CS run on 64 GB300 (Megatron-Bridge 26.04.01; extra.csv XN22):
/// TP1 PP1, Megatron-FSDP, MBS 2, seq 8192 runs because its recipe offloads 20 layers'
/// activations to the host. Without the offload the model predicts ~323 GiB of 286 usable and
/// the job is denied; the denial's suggestions include the offload, with the fewest layers that
/// fit (no more than the recipe's 20), and that layout is legal and fits.
#[test]
fn activation_offloading_is_suggested_with_the_fewest_layers_that_fit() {
    use primus_oracle::layout::{FsdpKind, Layout};
    use primus_oracle::precision::Precision;
    use primus_webhook::suggest::Move;
    let s = scenario("llama3.1-70b", "gb300", 64, 4, 8192, 256, Precision::Fp8);
    let l = Layout {
        micro_batch_size: 2,
        fsdp: true,
        fsdp_kind: FsdpKind::Megatron,
        distributed_optimizer: false,
        attention_dropout: primus_oracle::layout::Fraction::ZERO,
        hidden_dropout: primus_oracle::layout::Fraction::ZERO,
        ..Layout::default()
    };
    assert!(l.check(&s).is_ok());
    let limit = s.hardware.usable_bytes();
    assert!(memory::peak_bytes(&s, &l).0 > limit);
    let out = nearest(&s, &l, limit, 8);
    let o = out
        .suggestions
        .iter()
        .find(|x| matches!(x.moves[..], [Move::ActivationOffload(_)]))
        .unwrap_or_else(|| panic!("no offload suggestion: {:?}", flags(&out)));
    let n = o.layout.activation_offload_layers;
    eprintln!("offload {n} layers: {:.1} GiB", gib(o.peak_bytes));
    assert!((1..=20).contains(&n), "{n} layers");
    assert_eq!(o.flags(), format!("--cpu-offloading-num-layers {n}"));
    assert!(o.layout.check(&s).is_ok() && o.peak_bytes <= limit);
    // The fewest: one layer fewer does not fit.
    let mut fewer = l.clone();
    fewer.activation_offload_layers = n - 1;
    assert!(memory::peak_bytes(&s, &fewer).0 > limit);
}

#[test]
fn the_fitting_example_is_allowed_without_warnings() {
    let (status, a) = answer(
        &validator(),
        PYTORCHJOB,
        &review(&example("fitting-pytorchjob"), None, false),
    );
    assert_eq!(status, 200);
    assert!(allowed(&a), "{a}");
    assert!(warnings(&a).is_empty(), "{:?}", warnings(&a));
}

#[test]
fn the_near_limit_example_is_allowed_with_a_headroom_warning() {
    let v = validator();
    let job = example("near-limit-pytorchjob");
    let d = derive(&job, &no_annotations(), &v.catalog).unwrap();
    let (peak, _) = memory::peak_bytes(&d.scenario, &d.layout);
    let usable = d.scenario.hardware.usable_bytes();
    assert!(
        peak > 0.92 * usable && peak <= usable,
        "the near-limit example predicts {:.1} GiB, outside ({:.1}, {:.1}]: update the example",
        gib(peak),
        gib(0.92 * usable),
        gib(usable)
    );
    let (_, a) = answer(&v, PYTORCHJOB, &review(&job, None, false));
    assert!(allowed(&a), "{a}");
    let w = warnings(&a);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains(&format!("predicted {:.1} GiB", gib(peak))),
        "{w:?}"
    );
    assert!(w[0].contains("190.6 GiB usable on MI300X"), "{w:?}");
    assert!(w[0].contains("--use-distributed-optimizer"), "{w:?}");
    assert!(!w[0].contains('\n'));
}

#[test]
fn dry_run_gets_the_same_answer() {
    let v = validator();
    for name in [
        "oom-pytorchjob",
        "fitting-pytorchjob",
        "near-limit-pytorchjob",
    ] {
        let job = example(name);
        let (_, wet) = answer(&v, PYTORCHJOB, &review(&job, None, false));
        let (_, dry) = answer(&v, PYTORCHJOB, &review(&job, None, true));
        assert_eq!(wet, dry, "{name}");
    }
}

#[test]
fn annotations_take_precedence_over_flags() {
    let v = validator();
    let mut job = example("oom-pytorchjob");
    job["metadata"]["annotations"] = json!({
        annotations::LAYOUT: r#"{"tp": 8, "pp": 4, "sequenceParallel": true}"#,
        annotations::MODEL: "llama3.1-70b",
        annotations::TRAINING: r#"{"seqLength": 4096, "globalBatchSize": 256}"#,
    });
    let ann: BTreeMap<String, String> =
        serde_json::from_value(job["metadata"]["annotations"].clone()).unwrap();
    let d = derive(&job, &ann, &v.catalog).unwrap();
    assert_eq!((d.layout.tp, d.layout.pp), (8, 4));
    assert_eq!(d.layout_source, LayoutSource::Annotation);
    assert_eq!(d.scenario.model.name, "llama3.1-70b");
    assert_eq!(d.scenario.training.seq_length, 4096);
    let (_, a) = answer(&v, PYTORCHJOB, &review(&job, None, false));
    assert!(allowed(&a), "{}", message(&a));
}

#[test]
fn model_preset_annotation_is_a_shortcut_for_architecture_flags() {
    let v = validator();
    let mut job = example("oom-pytorchjob");
    edit_script(
        &mut job,
        "--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64",
        "",
    );
    // Without the architecture the job cannot be checked: allowed with a warning.
    let (_, a) = answer(&v, PYTORCHJOB, &review(&job, None, false));
    assert!(allowed(&a));
    let w = warnings(&a).join("\n");
    assert!(w.contains("cannot check GPU memory: model"), "{w}");
    assert!(w.contains(annotations::MODEL), "{w}");
    job["metadata"]["annotations"] = json!({annotations::MODEL: "llama3.1-70b"});
    let (_, a) = answer(&v, PYTORCHJOB, &review(&job, None, false));
    assert!(!allowed(&a), "with the preset the OOM is found");
}

#[test]
fn unknown_model_and_unknown_gpu_warn_by_default_and_deny_in_strict_mode() {
    let mut job = example("fitting-pytorchjob");
    job["metadata"]["annotations"] = json!({annotations::MODEL: "llama9-1t"});
    for r in ["Master", "Worker"] {
        job["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]["nodeSelector"] =
            json!({"amd.com/gpu.product-name": "AMD_Instinct_MI9000"});
    }
    let body = review(&job, None, false);
    let (_, a) = answer(&validator(), PYTORCHJOB, &body);
    assert!(allowed(&a));
    let w = warnings(&a);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("unknown preset \"llama9-1t\""), "{w:?}");
    assert!(w[1].contains("AMD_Instinct_MI9000"), "{w:?}");
    // Strict via the endpoint, and via the server flag.
    for (v, ep) in [
        (validator(), PYTORCHJOB_STRICT),
        (strict_validator(), PYTORCHJOB),
    ] {
        let (_, a) = answer(&v, ep, &body);
        assert!(!allowed(&a));
        let m = message(&a);
        assert!(m.starts_with("strict admission"), "{m}");
        assert!(
            m.contains("llama9-1t") && m.contains("AMD_Instinct_MI9000"),
            "{m}"
        );
    }
}

#[test]
fn gpu_kind_from_resource_alone_is_ambiguous_and_from_annotation_or_affinity_is_not() {
    let v = validator();
    let mut job = example("fitting-pytorchjob");
    for r in ["Master", "Worker"] {
        job["spec"]["pytorchReplicaSpecs"][r]["template"]["spec"]
            .as_object_mut()
            .unwrap()
            .remove("nodeSelector");
    }
    let (_, a) = answer(&v, PYTORCHJOB, &review(&job, None, false));
    assert!(allowed(&a));
    let w = warnings(&a).join("\n");
    assert!(
        w.contains("asks for amd.com/gpu but not which product"),
        "{w}"
    );
    assert!(w.contains("mi300x"), "{w}");

    let mut annotated = job.clone();
    annotated["metadata"]["annotations"] = json!({annotations::GPU: "mi300x"});
    let (_, a) = answer(&v, PYTORCHJOB, &review(&annotated, None, false));
    assert!(allowed(&a) && warnings(&a).is_empty(), "{a}");

    let mut affinity = job.clone();
    affinity["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["affinity"] = json!({
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "amd.com/gpu.product-name", "operator": "In", "values": ["AMD_Instinct_MI300X"]}]}
        ]}}
    });
    let d = derive(&affinity, &no_annotations(), &v.catalog).unwrap();
    assert_eq!(d.scenario.hardware.name, "mi300x");
    assert!(
        d.gpu_source.starts_with("node affinity"),
        "{}",
        d.gpu_source
    );
}

#[test]
fn world_size_from_nproc_gpu_or_gpu_limits() {
    let c = Catalog::builtin().unwrap();
    let mut job = example("fitting-pytorchjob");
    job["spec"]["nprocPerNode"] = json!("gpu");
    assert_eq!(
        derive(&job, &no_annotations(), &c)
            .unwrap()
            .scenario
            .cluster
            .gpus,
        64
    );
    job["spec"].as_object_mut().unwrap().remove("nprocPerNode");
    assert_eq!(
        derive(&job, &no_annotations(), &c)
            .unwrap()
            .scenario
            .cluster
            .gpus,
        64
    );
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = json!(3);
    assert_eq!(
        derive(&job, &no_annotations(), &c)
            .unwrap()
            .scenario
            .cluster
            .gpus,
        32
    );
    job["spec"]["nprocPerNode"] = json!("cpu");
    match derive(&job, &no_annotations(), &c) {
        Err(DeriveError::Missing(m)) => assert!(m.join(" ").contains("not a GPU job"), "{m:?}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_bad_flag_value_is_named() {
    let mut job = example("fitting-pytorchjob");
    edit_script(
        &mut job,
        "--tensor-model-parallel-size 8",
        "--tensor-model-parallel-size eight",
    );
    let body = review(&job, None, false);
    let (_, a) = answer(&validator(), PYTORCHJOB, &body);
    assert!(allowed(&a));
    assert!(
        warnings(&a)[0].contains("--tensor-model-parallel-size: \"eight\" is not a valid number"),
        "{:?}",
        warnings(&a)
    );
    let (_, a) = answer(&validator(), PYTORCHJOB_STRICT, &body);
    assert!(!allowed(&a));
    assert!(
        message(&a).contains("--tensor-model-parallel-size"),
        "{}",
        message(&a)
    );
}

#[test]
fn an_illegal_layout_names_the_flag() {
    let mut job = example("fitting-pytorchjob");
    edit_script(
        &mut job,
        "--tensor-model-parallel-size 8",
        "--tensor-model-parallel-size 16",
    );
    let (_, a) = answer(&validator(), PYTORCHJOB_STRICT, &review(&job, None, false));
    assert!(!allowed(&a));
    let m = message(&a);
    assert!(
        m.contains(
            "--tensor-model-parallel-size: 16 does not divide the model's 8 key/value heads"
        ),
        "{m}"
    );
    // A size that does not divide the world names the world size.
    edit_script(
        &mut job,
        "--tensor-model-parallel-size 16",
        "--tensor-model-parallel-size 3",
    );
    let (_, a) = answer(&validator(), PYTORCHJOB_STRICT, &review(&job, None, false));
    assert!(
        message(&a).contains("world size (replicas x nprocPerNode): 64 GPUs"),
        "{}",
        message(&a)
    );
}

#[test]
fn suspend_flips_and_metadata_updates_are_allowed_without_projection() {
    let v = validator();
    // Even an OOM job: it was admitted before (e.g. created with skip-validation) and a queue
    // manager flips suspend.
    let old = example("oom-pytorchjob");
    let mut new = old.clone();
    new["spec"]["runPolicy"]["suspend"] = json!(true);
    let (_, a) = answer(&v, PYTORCHJOB, &review(&new, Some(&old), false));
    assert!(allowed(&a), "{}", message(&a));
    let mut relabelled = old.clone();
    relabelled["metadata"]["labels"] = json!({"team": "llm"});
    let (_, a) = answer(&v, PYTORCHJOB, &review(&relabelled, Some(&old), false));
    assert!(allowed(&a), "{}", message(&a));
    // suspend removed entirely counts as a flip too.
    let mut unset = old.clone();
    unset["spec"].as_object_mut().unwrap().remove("runPolicy");
    let (_, a) = answer(&v, PYTORCHJOB, &review(&unset, Some(&old), false));
    assert!(allowed(&a), "{}", message(&a));
    // A real change is projected.
    let mut changed = new.clone();
    edit_script(
        &mut changed,
        "--global-batch-size 128",
        "--global-batch-size 256",
    );
    let (_, a) = answer(&v, PYTORCHJOB, &review(&changed, Some(&old), false));
    assert!(!allowed(&a));
}

#[test]
fn the_skip_label_opts_out() {
    let mut job = example("oom-pytorchjob");
    job["metadata"]["labels"] = json!({annotations::SKIP_VALIDATION: "true"});
    let (_, a) = answer(&validator(), PYTORCHJOB, &review(&job, None, false));
    assert!(allowed(&a));
}

#[test]
fn delete_and_status_requests_are_not_checked() {
    let job = example("oom-pytorchjob");
    let mut r = primus_webhook::admission::review_for(&job, "DELETE", None, false, "u1");
    r["request"]["object"] = Value::Null;
    r["request"]["oldObject"] = job.clone();
    let (status, a) = answer(&validator(), PYTORCHJOB, &serde_json::to_vec(&r).unwrap());
    assert_eq!(status, 200);
    assert!(allowed(&a));
    let mut r = primus_webhook::admission::review_for(&job, "UPDATE", Some(&job), false, "u2");
    r["request"]["subResource"] = json!("status");
    let (_, a) = answer(&validator(), PYTORCHJOB, &serde_json::to_vec(&r).unwrap());
    assert!(allowed(&a));
}

#[test]
fn malformed_requests_get_400_with_a_reason() {
    let v = validator();
    let (status, a) = answer(&v, PYTORCHJOB, b"{not json");
    assert_eq!(status, 400);
    assert!(!allowed(&a));
    assert!(message(&a).contains("not an AdmissionReview"), "{a}");
    assert_eq!(a["response"]["status"]["code"], 400);

    let (status, a) = answer(
        &v,
        PYTORCHJOB,
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
    );
    assert_eq!(status, 400);
    assert!(message(&a).contains("no request"), "{a}");

    let (status, a) = answer(&v, PYTORCHJOB, br#"{"apiVersion":"v1","kind":"Pod"}"#);
    assert_eq!(status, 400);
    assert!(message(&a).contains("expected kind AdmissionReview"), "{a}");

    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}});
    let body = serde_json::to_vec(&primus_webhook::admission::review_for(
        &pod, "CREATE", None, false, "u3",
    ))
    .unwrap();
    let (status, a) = answer(&v, PYTORCHJOB, &body);
    assert_eq!(status, 400);
    assert_eq!(a["response"]["uid"], "u3");
    assert!(
        message(&a).contains("validates kubeflow.org/PyTorchJob, not core/v1 Pod"),
        "{a}"
    );

    let mut r = primus_webhook::admission::review_for(
        &example("oom-pytorchjob"),
        "CREATE",
        None,
        false,
        "u4",
    );
    r["request"]["object"] = Value::Null;
    let (status, a) = answer(&v, PYTORCHJOB, &serde_json::to_vec(&r).unwrap());
    assert_eq!(status, 400);
    assert!(message(&a).contains("request.object is missing"), "{a}");
}

#[test]
fn absurd_sizes_are_refused_as_invalid_not_computed() {
    let v = validator();
    for (from, to) in [
        ("--hidden-size 8192", "--hidden-size 18446744073709551615"),
        ("--num-layers 80", "--num-layers 4000000000"),
        (
            "--tensor-model-parallel-size 8",
            "--tensor-model-parallel-size 4294967295",
        ),
        ("--seq-length 8192", "--seq-length 99999999999999"),
        ("--global-batch-size 128", "--global-batch-size 0"),
    ] {
        let mut job = example("fitting-pytorchjob");
        edit_script(&mut job, from, to);
        let (_, a) = answer(&v, PYTORCHJOB_STRICT, &review(&job, None, false));
        assert!(!allowed(&a), "{to}");
        assert!(
            message(&a).contains(to.split(' ').next().unwrap()),
            "{to}: {}",
            message(&a)
        );
    }
}

fn plan(spec: Value) -> Vec<u8> {
    let obj = json!({
        "apiVersion": "primus.dev/v1alpha1",
        "kind": "TrainingPlan",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": spec,
    });
    serde_json::to_vec(&primus_webhook::admission::review_for(
        &obj, "CREATE", None, false, "tp-1",
    ))
    .unwrap()
}

#[test]
fn trainingplans_get_the_semantic_rules_with_field_names() {
    let v = validator();
    let good = json!({
        "model": {"preset": "llama3.1-70b"},
        "cluster": {"gpu": "mi300x", "gpus": 64},
        "training": {"seqLength": 8192, "globalBatchSize": 128},
        "parallelism": {"tp": 8, "pp": 4},
    });
    let (status, a) = answer(&v, Endpoint::TrainingPlan, &plan(good.clone()));
    assert_eq!(status, 200);
    assert!(allowed(&a), "{a}");
    let cases = [
        ("/parallelism/tp", json!(16), "spec.parallelism.tp"),
        ("/model/preset", json!("llama9"), "spec.model.preset"),
        ("/cluster/gpus", json!(60), "spec.cluster.gpus"),
        ("/cluster/gpu", json!("tpu-v5"), "spec.cluster.gpu"),
        (
            "/training/globalBatchSize",
            json!(127),
            "spec.training.globalBatchSize",
        ),
    ];
    for (ptr, value, field) in cases {
        let mut spec = good.clone();
        *spec.pointer_mut(ptr).unwrap() = value;
        let (_, a) = answer(&v, Endpoint::TrainingPlan, &plan(spec));
        assert!(!allowed(&a), "{ptr}");
        assert!(message(&a).starts_with(field), "{ptr}: {}", message(&a));
        assert_eq!(a["response"]["status"]["code"], 422);
    }
    // Searcher agent: admitted with the settings a plan may give; an endpoint or a key
    // variable of the plan's own is the operator's configuration, refused naming the field.
    let mut agent = good.clone();
    agent["tuning"] = json!({"searcher": "agent", "agent": {"model": "qwen3", "rounds": 4, "budgetSeconds": 120}});
    let (_, a) = answer(&v, Endpoint::TrainingPlan, &plan(agent.clone()));
    assert!(allowed(&a), "{a}");
    for (key, value, field) in [
        (
            "endpoint",
            json!("http://elsewhere:8000/v1"),
            "spec.tuning.agent.endpoint",
        ),
        ("apiKeyEnv", json!("HOME"), "spec.tuning.agent.apiKeyEnv"),
        ("rounds", json!(0), "spec.tuning.agent.rounds"),
    ] {
        let mut spec = agent.clone();
        spec["tuning"]["agent"][key] = value;
        let (_, a) = answer(&v, Endpoint::TrainingPlan, &plan(spec));
        assert!(!allowed(&a), "{key}");
        assert!(message(&a).starts_with(field), "{key}: {}", message(&a));
    }
    // An OOM reference layout is a warning (the tuner searches for one that fits).
    let mut oom = good.clone();
    oom["parallelism"] = json!({"tp": 1, "pp": 1});
    let (_, a) = answer(&v, Endpoint::TrainingPlan, &plan(oom));
    assert!(allowed(&a));
    assert!(
        warnings(&a)[0].starts_with("spec.parallelism: predicted"),
        "{a}"
    );
}

#[test]
fn grad_reduce_in_bf16_is_read_from_the_flags_and_counted() {
    // The OOM example (Llama 3.1 70B, TP1 PP1 CP1 on 64 MI300X: DP 64) with
    // `--grad-reduce-in-bf16`: BF16 gradients (2 instead of 4 bytes per parameter) and an FP32
    // copy of the optimizer's gradient shard (4/64): Megatron's 6 + 12/d becomes 4 + 16/d
    // (docs/source/api-guide/dist_optimizer.md), 2 - 4/64 bytes less per parameter.
    let c = Catalog::builtin().unwrap();
    let fp32_job = example("oom-pytorchjob");
    let mut bf16_job = fp32_job.clone();
    let script = &mut bf16_job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
        [0]["args"][0];
    let text = script.as_str().expect("the launch script").to_string();
    assert!(text.contains("--use-distributed-optimizer"), "{text}");
    *script = Value::String(text.replace(
        "--use-distributed-optimizer",
        "--use-distributed-optimizer --grad-reduce-in-bf16",
    ));
    let fp32 = derive(&fp32_job, &no_annotations(), &c).expect("derivable");
    let bf16 = derive(&bf16_job, &no_annotations(), &c).expect("derivable");
    assert!(fp32.layout.grad_reduce_in_fp32);
    assert!(!bf16.layout.grad_reduce_in_fp32);
    let a = memory::estimate(&fp32.scenario, &fp32.layout).stages[0].clone();
    let b = memory::estimate(&bf16.scenario, &bf16.layout).stages[0].clone();
    assert_eq!(a.parameters, b.parameters);
    let state = |st: &memory::StageMemory| {
        st.gradients_bytes + st.optimizer_bytes + st.step_grad_copy_bytes
    };
    let saved = state(&a) - state(&b);
    let expected = (2.0 - 4.0 / 64.0) * a.parameters;
    assert!(
        (saved - expected).abs() < 1e-6 * expected,
        "{saved} vs {expected}"
    );
    // The copy exists for the optimizer step only (the next step's zero_grad drops it), so
    // beside the activations the BF16 job holds the full 2 bytes per parameter less.
    assert_eq!(a.step_grad_copy_bytes, 0.0);
    assert!((b.step_grad_copy_bytes - 4.0 / 64.0 * b.parameters).abs() < 1e-6 * b.parameters);
    let beside = (a.gradients_bytes + a.optimizer_bytes) - (b.gradients_bytes + b.optimizer_bytes);
    assert!((beside - 2.0 * a.parameters).abs() < 1e-6 * a.parameters);
    // Still far too big for a 192 GiB GPU: the denial quotes the smaller prediction.
    let v = validator();
    let (_, ans) = answer(&v, PYTORCHJOB, &review(&bf16_job, None, false));
    assert!(!allowed(&ans), "{ans}");
    let quoted = format!("grads {:.1}", b.gradients_bytes / 1024f64.powi(3));
    assert!(
        message(&ans).contains(&quoted),
        "{quoted}: {}",
        message(&ans)
    );
}
