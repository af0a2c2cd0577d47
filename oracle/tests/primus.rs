//! Primus in and out against AMD's own files (tests/data/primus/, vendored with their
//! source): every mapped model preset states the architecture of its built-in card; the
//! example experiments read to the layouts they set; and the flags of a layout written as
//! Primus overrides read back to the same layout, model and training settings.

use std::path::PathBuf;

use primus_oracle::layout::{CrossEntropyFusion, Layout, Recompute, RecomputeModule, Schedule};
use primus_oracle::megatron::{MegatronArgs, megatron_flags};
use primus_oracle::model::ModelCard;
use primus_oracle::precision::Precision;
use primus_oracle::primus::{self, experiment, presets};
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};
use serde_json::{Map, Value};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/primus")
        .join(rel)
}

/// A preset with its `extends:` chain merged (bases first, the file's own keys last).
fn resolved(stem: &str) -> Map<String, Value> {
    let path = data(&format!("models/megatron/{stem}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let doc = primus_oracle::parse::parse_yaml_value(&text, stem).expect("preset YAML");
    let mut out = Map::new();
    if let Some(bases) = doc.get("extends").and_then(Value::as_array) {
        for b in bases {
            out.extend(resolved(presets::stem(b.as_str().unwrap())));
        }
    }
    for (k, v) in doc.as_object().unwrap() {
        if k != "extends" {
            out.insert(k.clone(), v.clone());
        }
    }
    out
}

/// The architecture fields a preset states, compared with a card: (field, preset, card).
fn differences(p: &Map<String, Value>, card: &ModelCard) -> Vec<(String, String, String)> {
    let num = |k: &str| p.get(k).and_then(Value::as_u64);
    let flag = |k: &str| p.get(k).and_then(Value::as_bool).unwrap_or(false);
    let mut out = Vec::new();
    let mut cmp = |field: &str, preset: Option<u64>, card: Option<u64>| {
        if preset != card {
            out.push((
                field.to_string(),
                format!("{preset:?}"),
                format!("{card:?}"),
            ));
        }
    };
    let moe = card.moe.as_ref();
    let dense_layers = match &card.moe {
        None => card.layers,
        Some(m) => m.dense_layers,
    };
    cmp("num_layers", num("num_layers"), Some(card.layers.into()));
    cmp("hidden_size", num("hidden_size"), Some(card.hidden_size));
    cmp(
        "num_attention_heads",
        num("num_attention_heads"),
        Some(card.attention_heads.into()),
    );
    let groups = if flag("group_query_attention") {
        num("num_query_groups")
    } else {
        num("num_attention_heads")
    };
    if card.mla.is_none() {
        cmp("num_query_groups", groups, Some(card.kv_heads().into()));
        cmp(
            "kv_channels",
            num("kv_channels").or(Some(card.hidden_size / u64::from(card.attention_heads))),
            Some(card.head_dim()),
        );
        cmp(
            "qk_layernorm",
            Some(flag("qk_layernorm").into()),
            Some(card.qk_norm.into()),
        );
    }
    if dense_layers > 0 {
        cmp(
            "ffn_hidden_size",
            num("ffn_hidden_size"),
            Some(card.ffn_hidden_size),
        );
    }
    cmp(
        "num_experts",
        num("num_experts"),
        moe.map(|m| m.num_experts.into()),
    );
    if let Some(m) = moe {
        cmp(
            "moe_router_topk",
            num("moe_router_topk"),
            Some(m.top_k.into()),
        );
        let expert_ffn = num("moe_ffn_hidden_size").or(num("ffn_hidden_size"));
        cmp(
            "moe_ffn_hidden_size",
            expert_ffn,
            Some(m.moe_ffn_hidden_size),
        );
        let shared = (m.shared_experts > 0).then(|| {
            m.shared_expert_ffn_hidden_size
                .unwrap_or(m.moe_ffn_hidden_size)
                * u64::from(m.shared_experts)
        });
        cmp(
            "moe_shared_expert_intermediate_size",
            num("moe_shared_expert_intermediate_size"),
            shared,
        );
        let freq = p.get("moe_layer_freq").cloned().unwrap_or(Value::from(1));
        let dense = primus::overrides::dense_first_layers(&freq).map(u64::from);
        cmp(
            "moe_layer_freq (dense-first layers)",
            dense,
            Some(m.dense_layers.into()),
        );
    }
    if let Some(mla) = &card.mla {
        cmp(
            "multi_latent_attention",
            Some(flag("multi_latent_attention").into()),
            Some(1),
        );
        cmp("q_lora_rank", num("q_lora_rank"), mla.q_lora_rank);
        cmp("kv_lora_rank", num("kv_lora_rank"), Some(mla.kv_lora_rank));
        cmp(
            "qk_head_dim",
            num("qk_head_dim"),
            Some(mla.qk_nope_head_dim),
        );
        cmp(
            "qk_pos_emb_head_dim",
            num("qk_pos_emb_head_dim"),
            Some(mla.qk_rope_head_dim),
        );
        cmp("v_head_dim", num("v_head_dim"), Some(mla.v_head_dim));
    }
    cmp(
        "mtp_num_layers",
        num("mtp_num_layers").or(Some(0)),
        Some(card.mtp_layers.into()),
    );
    let rms = p.get("normalization").and_then(Value::as_str) == Some("RMSNorm");
    cmp(
        "normalization RMSNorm",
        Some(rms.into()),
        Some((card.norm == primus_oracle::model::Norm::Rmsnorm).into()),
    );
    cmp(
        "untie_embeddings_and_output_weights",
        Some(flag("untie_embeddings_and_output_weights").into()),
        Some((!card.tied_embeddings).into()),
    );
    cmp(
        "swiglu",
        Some(flag("swiglu").into()),
        Some((card.activation == primus_oracle::model::Activation::Swiglu).into()),
    );
    out
}

#[test]
fn every_mapped_primus_preset_states_its_cards_architecture() {
    let c = Catalog::builtin().unwrap();
    for p in presets::PRESETS {
        let card = c.model(p.card).unwrap();
        let diff = differences(&resolved(p.primus), card);
        match p.differs {
            None => assert!(diff.is_empty(), "{} vs {}: {diff:?}", p.primus, p.card),
            // gpt_oss_120B: the differences the table names, and no other.
            Some(why) => {
                let fields: Vec<&str> = diff.iter().map(|d| d.0.as_str()).collect();
                assert_eq!(
                    fields,
                    ["qk_layernorm", "moe_shared_expert_intermediate_size"],
                    "{}: {diff:?}",
                    p.primus
                );
                assert!(
                    why.contains("shared expert") && why.contains("QK layernorm"),
                    "{why}"
                );
            }
        }
    }
}

fn experiment(rel: &str) -> primus::Experiment {
    let path = data(rel);
    let text = std::fs::read_to_string(&path).unwrap();
    experiment::parse(&text, rel, &|_| None).unwrap()
}

#[test]
fn amds_example_experiments_read_to_the_layouts_they_set() {
    let c = Catalog::builtin().unwrap();
    // llama3.1_70B-BF16-pretrain.yaml (MI300X): TP1 PP1, FSDP2 instead of the distributed
    // optimizer, full recompute of all 80 layers, micro-batch 3, global batch 24, 8192 tokens.
    let e = experiment("examples/megatron/configs/MI300X/llama3.1_70B-BF16-pretrain.yaml");
    assert_eq!(e.model.as_deref(), Some("llama3.1_70B"));
    assert_eq!(e.card(), Some("llama3.1-70b"));
    let (words, notes) = primus::overrides::to_megatron(&e.overrides);
    assert!(notes.is_empty(), "{notes:?}");
    let args = MegatronArgs::parse(words.iter().map(String::as_str));
    let l = args.layout(c.model("llama3.1-70b").unwrap()).unwrap();
    let want = Layout {
        micro_batch_size: 3,
        recompute: Recompute::Full,
        recompute_layers: 0,
        fsdp: true,
        distributed_optimizer: false,
        overlap_param_gather: false,
        sequence_parallel: true,
        // The experiment fuses the loss with Transformer Engine's kernel (its overrides:
        // cross_entropy_fusion_impl: "te", cross_entropy_loss_fusion: true).
        cross_entropy_fusion: CrossEntropyFusion::Te,
        ..Layout::default()
    };
    assert_eq!(l, want);
    let t = args.training().unwrap().unwrap();
    assert_eq!(
        (t.seq_length, t.global_batch_size, t.precision),
        (8192, 24, Precision::Bf16)
    );

    // mixtral_8x7B_v0.1-BF16-pretrain.yaml (MI300X): EP8, micro-batch 2, global batch 32.
    let e = experiment("examples/megatron/configs/MI300X/mixtral_8x7B_v0.1-BF16-pretrain.yaml");
    assert_eq!(e.card(), Some("mixtral-8x7b"));
    let (words, _) = primus::overrides::to_megatron(&e.overrides);
    let args = MegatronArgs::parse(words.iter().map(String::as_str));
    let l = args.layout(c.model("mixtral-8x7b").unwrap()).unwrap();
    assert_eq!(
        (l.tp, l.pp, l.ep, l.etp, l.micro_batch_size),
        (1, 1, 8, 1, 2)
    );
    assert!(l.overlap_grad_reduce && l.overlap_param_gather && !l.distributed_optimizer);
    let t = args.training().unwrap().unwrap();
    assert_eq!((t.seq_length, t.global_batch_size), (4096, 32));
}

fn scenario(model: &str, gpus: u32) -> Scenario {
    let c = Catalog::builtin().unwrap();
    Scenario {
        model: c.model(model).unwrap().clone(),
        hardware: c.hardware("mi300x").unwrap().clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node: 8,
        },
        training: Training {
            seq_length: 4096,
            global_batch_size: 256,
            precision: Precision::Fp8,
        },
    }
}

#[test]
fn a_layout_written_as_primus_overrides_reads_back_the_same() {
    let cases = [
        (
            "llama3.1-70b",
            Layout {
                tp: 4,
                pp: 8,
                vpp: 5,
                schedule: Schedule::Interleaved,
                recompute: Recompute::Full,
                recompute_layers: 3,
                ..Layout::default()
            },
        ),
        (
            "llama3.1-70b",
            Layout {
                tp: 2,
                pp: 4,
                cp: 2,
                recompute: Recompute::Selective,
                recompute_modules: Some(vec![RecomputeModule::Mlp, RecomputeModule::CoreAttn]),
                schedule: Schedule::ZeroBubble,
                distributed_optimizer: false,
                fsdp: false,
                grad_reduce_in_fp32: false,
                tp_comm_overlap: true,
                // Megatron gathers parameters only with the distributed optimizer.
                overlap_param_gather: false,
                ..Layout::default()
            },
        ),
        (
            "deepseek-v3",
            Layout {
                tp: 2,
                pp: 8,
                ep: 32,
                etp: 1,
                first_stage_layers: Some(5),
                last_stage_layers: Some(6),
                overlap_param_gather: false,
                ..Layout::default()
            },
        ),
        (
            "mixtral-8x7b",
            Layout {
                ep: 8,
                fsdp: true,
                distributed_optimizer: false,
                sequence_parallel: false,
                overlap_grad_reduce: false,
                overlap_param_gather: false,
                ..Layout::default()
            },
        ),
    ];
    for (model, l) in cases {
        let s = scenario(model, 256);
        let flags = megatron_flags(&s, &l);
        let mut words = vec![
            "primus-cli",
            "direct",
            "--",
            "train",
            "pretrain",
            "--config",
            "exp.yaml",
        ];
        let written = primus::overrides::override_words(&flags);
        words.extend(written.iter().map(String::as_str));
        let job = primus::read(words, &[]).expect("a Primus command");
        assert!(job.notes.is_empty(), "{:?}", job.notes);
        let card = job
            .args
            .model_card()
            .unwrap()
            .expect("the architecture is written");
        assert_eq!(job.args.layout(&card).unwrap(), l, "{model}: {written:?}");
        assert_eq!(job.args.training().unwrap(), Some(s.training), "{model}");
        let m = &s.model;
        assert_eq!(
            (
                card.layers,
                card.hidden_size,
                card.ffn_hidden_size,
                card.kv_heads(),
                card.vocab_size
            ),
            (
                m.layers,
                m.hidden_size,
                m.ffn_hidden_size,
                m.kv_heads(),
                m.vocab_size
            ),
            "{model}"
        );
        assert_eq!(
            card.moe.map(|e| (e.num_experts, e.top_k, e.dense_layers)),
            m.moe
                .as_ref()
                .map(|e| (e.num_experts, e.top_k, e.dense_layers))
        );
        assert_eq!(card.mla.is_some(), m.mla.is_some());
    }
}
