//! Megatron-Core's selective-recompute modules (`--recompute-modules`): the activation bytes
//! each one drops, derived by hand per module; the forward work each adds to the backward
//! pass; their legality rules; and the gpt-oss-120b runs published with
//! `recompute_modules=["layernorm", "moe_act"]` fitting the memory model.

use primus_oracle::compute::{AnalyticTimer, OpTimer, Pass};
use primus_oracle::compute::{Dims, LayerShape, OpTimes, TimerContext, layer_ops, recompute_ops};
use primus_oracle::layout::{
    Layout, ModuleSet, PipelineLayout, Recompute, RecomputeModule, Schedule,
};
use primus_oracle::memory::{self, Keep, MemoryOptions, layer_activation_bytes};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::projection;
use primus_oracle::scenario::{Cluster, Scenario, Training};
use primus_oracle::validate::{embedding_and_loss_split, validate_text};

use RecomputeModule::*;

mod common;

fn scenario(model: &str, gpu: &str, gpus: u32, seq: u64, gbs: u64) -> Scenario {
    common::scenario(model, gpu, gpus, Some(8), seq, gbs, Precision::Bf16)
}

fn tp1() -> Layout {
    Layout::default()
}

/// Bytes one layer keeps with the modules `m` recomputed.
fn kept(
    s: &Scenario,
    l: &Layout,
    opts: &MemoryOptions,
    kind: LayerKind,
    m: &[RecomputeModule],
) -> f64 {
    layer_activation_bytes(s, l, opts, kind, Keep::Modules(ModuleSet::of(m)))
}

/// What recomputing `m` saves in one layer of `kind`, bytes per token.
fn saved_per_token(s: &Scenario, kind: LayerKind, m: &[RecomputeModule]) -> f64 {
    let opts = MemoryOptions::default();
    let all = layer_activation_bytes(s, &tp1(), &opts, kind, Keep::All);
    (all - kept(s, &tp1(), &opts, kind, m)) / s.training.seq_length as f64
}

#[test]
fn each_moe_module_drops_its_own_tensors_mixtral() {
    // Mixtral 8x7B MoE layer, s 4096, b 1, tp 1, flash, no dropout, bf16 (h 4096, 32 heads,
    // top-2 of 8 experts of f 14336, SwiGLU, no shared experts); all of it is 241,848 bytes
    // per token (tests/memory.rs, moe_layer_by_hand).
    let s = scenario("mixtral-8x7b", "h100-sxm", 8, 4096, 8);
    let moe = LayerKind::Moe;
    // moe_act: the fc2 input of each of the 2 copies, 2f bytes: 2 * 2 * 14336 = 57,344.
    assert_eq!(saved_per_token(&s, moe, &[MoeAct]), 57_344.0);
    // layernorm: the pre-MLP norm's output (a separate module before the MoE block), 2h =
    // 8,192; the input norm is fused into the QKV linear and stays.
    assert_eq!(saved_per_token(&s, moe, &[Layernorm]), 8_192.0);
    // core_attn: the flash log-sum-exp, 4 bytes x 32 heads = 128.
    assert_eq!(saved_per_token(&s, moe, &[CoreAttn]), 128.0);
    // moe: everything inside the block but its input: router 4*8 + 8 + 4*2 = 48 and the
    // expert side 2 * (2h 8,192 + 4f 57,344 + 2f 28,672 + 4) = 188,424: 188,472.
    assert_eq!(saved_per_token(&s, moe, &[Moe]), 188_472.0);
    // moe + layernorm: also the block's input, 2h: 196,664.
    assert_eq!(saved_per_token(&s, moe, &[Moe, Layernorm]), 196_664.0);
    // Megatron-Bridge's gpt-oss choice, layernorm + moe_act: 8,192 + 57,344 = 65,536.
    assert_eq!(saved_per_token(&s, moe, &[Layernorm, MoeAct]), 65_536.0);
    // No shared experts, no dense MLP in an MoE layer: shared_experts and mlp save nothing.
    assert_eq!(saved_per_token(&s, moe, &[SharedExperts]), 0.0);
    assert_eq!(saved_per_token(&s, moe, &[Mlp]), 0.0);
}

#[test]
fn mla_modules_drop_their_tensors_deepseek_v3() {
    // DeepSeek-V3 (h 7168, 128 heads, q rank 1536, kv rank 512, qk 128 + 64 rope, v 128,
    // one shared expert of 2048, top-8 of 256 experts of 2048), tp 1, flash, bf16.
    let s = scenario("deepseek-v3", "h100-sxm", 64, 4096, 64);
    let moe = LayerKind::Moe;
    let dense = LayerKind::Dense;
    // mla_up_proj: Q, K, V after the up-projections and rotary: 2 * 128 * (192 + 192 + 128)
    // = 131,072, in dense and MoE layers alike.
    assert_eq!(saved_per_token(&s, moe, &[MlaUpProj]), 131_072.0);
    assert_eq!(saved_per_token(&s, dense, &[MlaUpProj]), 131_072.0);
    // layernorm: MLA's input norm is a separate module (its output, the down-projections'
    // input, 2h = 14,336) and so is the MoE block's pre-MLP norm (2h = 14,336): 28,672 in an
    // MoE layer; a dense layer's pre-MLP norm is fused into fc1: 14,336.
    assert_eq!(saved_per_token(&s, moe, &[Layernorm]), 28_672.0);
    assert_eq!(saved_per_token(&s, dense, &[Layernorm]), 14_336.0);
    // shared_experts: SwiGLU input 4 * 2048 and output 2 * 2048 = 12,288.
    assert_eq!(saved_per_token(&s, moe, &[SharedExperts]), 12_288.0);
    // moe_act: 8 copies x 2 * 2048 = 32,768.
    assert_eq!(saved_per_token(&s, moe, &[MoeAct]), 32_768.0);
    // mlp in a dense layer: fc1 input 2h 14,336 + SwiGLU input 4 * 18432 73,728 + output
    // 2 * 18432 36,864 = 124,928; it does nothing to an MoE layer.
    assert_eq!(saved_per_token(&s, dense, &[Mlp]), 124_928.0);
    assert_eq!(saved_per_token(&s, moe, &[Mlp]), 0.0);
}

#[test]
fn mlp_recompute_in_korthikantis_regime() {
    // GPT-3 175B (h 12288, a 96, GELU 4h, MHA) at s 2048, b 1, TP 8 with sequence
    // parallelism, dropout, no flash: a layer keeps sbh(34 + 5as/h)/t. Recomputing the MLP
    // keeps its input (the residual, counted as the norm input) and its dropout mask (outside
    // the module), and drops the norm output 2sbh, the GELU input 8sbh and output 8sbh:
    // sbh(16 + 5as/h)/t; with core_attn as well, 16sbh/t.
    let (sq, b, h, a, t) = (2048.0, 1.0, 12288.0, 96.0, 8.0);
    let s = scenario("gpt3-175b", "h100-sxm", 64, 2048, 64);
    let l = Layout {
        tp: 8,
        ..Layout::default()
    };
    // Megatron's default dropout (0.1) is the layout default.
    let paper = MemoryOptions {
        flash_attention: false,
    };
    let got = kept(&s, &l, &paper, LayerKind::Dense, &[Mlp]);
    assert_eq!(got, sq * b * h * (16.0 + 5.0 * a * sq / h) / t);
    let got = kept(&s, &l, &paper, LayerKind::Dense, &[Mlp, CoreAttn]);
    assert_eq!(got, 16.0 * sq * b * h / t);
    // layernorm changes nothing here: both norms are fused into the QKV and fc1 linears.
    let all = layer_activation_bytes(&s, &l, &paper, LayerKind::Dense, Keep::All);
    assert_eq!(kept(&s, &l, &paper, LayerKind::Dense, &[Layernorm]), all);
    // The default module list is the selective recompute of tests/memory.rs: 34sbh/t.
    assert_eq!(
        kept(&s, &l, &paper, LayerKind::Dense, &[CoreAttn]),
        34.0 * sq * b * h / t
    );
}

#[test]
fn adding_modules_never_adds_memory_and_full_recompute_saves_the_most() {
    // Every module subset and every superset of it, over MoE, MLA and dense models and a
    // few layouts: the stage activations (transient rematerialisation included) never grow,
    // and full recompute keeps no more than any selective choice.
    let cases = [
        (
            scenario("gpt-oss-120b", "h100-sxm", 64, 4096, 512),
            1,
            4,
            1,
            8,
        ),
        (
            scenario("deepseek-v3", "h100-sxm", 256, 4096, 512),
            2,
            8,
            2,
            32,
        ),
        (scenario("mixtral-8x7b", "mi300x", 16, 4096, 64), 2, 2, 1, 4),
        (
            scenario("llama3.1-70b", "h100-sxm", 64, 8192, 128),
            4,
            4,
            2,
            1,
        ),
    ];
    for (s, tp, pp, vpp, ep) in cases {
        // DeepSeek-V3's 61 layers (+ MTP, embedding, loss) split as Megatron-Bridge does.
        let pipeline_layout = (s.model.layers % (pp * vpp) != 0).then(|| {
            let text = embedding_and_loss_split(s.model.layers, s.model.mtp_layers, pp, vpp)
                .expect("a balanced split");
            PipelineLayout::parse(&text).unwrap()
        });
        let base = Layout {
            pipeline_layout,
            tp,
            pp,
            vpp,
            ep,
            schedule: if vpp > 1 {
                Schedule::Interleaved
            } else {
                Schedule::OneFOneB
            },
            recompute: Recompute::Selective,
            ..Layout::default()
        };
        let legal: Vec<RecomputeModule> = RecomputeModule::ALL
            .into_iter()
            .filter(|m| {
                let l = Layout {
                    recompute_modules: Some(vec![*m]),
                    ..base.clone()
                };
                l.check(&s).is_ok()
            })
            .collect();
        let acts = |set: ModuleSet| -> Vec<f64> {
            let l = Layout {
                recompute_modules: Some(set.to_vec()),
                ..base.clone()
            };
            l.check(&s).unwrap_or_else(|e| panic!("{}: {e}", l.label()));
            memory::estimate(&s, &l)
                .stages
                .iter()
                .map(|st| st.activations_bytes)
                .collect()
        };
        let full = memory::estimate(
            &s,
            &Layout {
                recompute: Recompute::Full,
                ..base.clone()
            },
        );
        let n = legal.len();
        for bits in 0u32..(1 << n) {
            let set = ModuleSet::of(
                &(0..n)
                    .filter(|i| bits & (1 << i) != 0)
                    .map(|i| legal[i])
                    .collect::<Vec<_>>(),
            );
            let a = acts(set);
            for (i, m) in legal.iter().enumerate() {
                if bits & (1 << i) != 0 {
                    continue;
                }
                let b = acts(set.with(*m));
                for (x, y) in b.iter().zip(&a) {
                    assert!(
                        *x <= *y,
                        "{}: adding {m} to [{}] grows {y} -> {x}",
                        s.model.name,
                        set.label()
                    );
                }
            }
            for (st, y) in full.stages.iter().zip(&a) {
                assert!(
                    st.activations_bytes <= *y,
                    "{}: full {} > selective [{}] {y}",
                    s.model.name,
                    st.activations_bytes,
                    set.label()
                );
            }
        }
    }
}

#[test]
fn the_recomputed_forward_is_added_to_the_backward_and_not_to_model_flops() {
    // gpt-oss-120b on 8 H100, one pipeline stage: the recomputation inside one backward pass
    // of the stage is the layers' count times the forward time of the recomputed ops.
    let s = scenario("gpt-oss-120b", "h100-sxm", 8, 4096, 64);
    let hw = &s.hardware;
    let ctx = TimerContext {
        hardware: hw,
        precision: Precision::Bf16,
        fp8_recipe: primus_oracle::backend::Fp8Recipe::Delayed,
    };
    let layers = s.model.layers as f64;
    let with = |m: Option<Vec<RecomputeModule>>, r: Recompute| Layout {
        ep: 8,
        recompute: r,
        recompute_modules: m,
        ..Layout::default()
    };
    // moe_act by hand: every MoE layer reruns the experts' SwiGLU on the routed copies
    // reaching this GPU (4096 tokens x top-4, the busiest of 8 EP ranks of 16 experts:
    // 1 + cv / sqrt(16) * sqrt(2 ln 8), cv the expert-load spread MOE_EXPERT_LOAD_CV), reading gate
    // and up (2f) and writing f, 2 bytes
    // each: routed * 3 * 2880 * 2 bytes, at the profile's memory-bound bandwidth, plus one
    // launch per local expert (Megatron's SequentialMLP, the layout's default); and the
    // eager clamp in front of it (gpt-oss's clamped GLU, `fused_bias_geglu.py`): two clamps
    // reading and writing f each and the concatenation 2f, routed * 8 * 2880 * 2 bytes, three
    // kernels per local expert.
    let l = with(Some(vec![MoeAct]), Recompute::Selective);
    let tl = projection::timeline(&s, &l).unwrap();
    let imbalance =
        1.0 + primus_oracle::compute::MOE_EXPERT_LOAD_CV / 16f64.sqrt() * (2.0 * 8f64.ln()).sqrt();
    let routed = 4096.0 * 4.0 * imbalance;
    let bytes = routed * 3.0 * 2880.0 * 2.0 + routed * 8.0 * 2880.0 * 2.0;
    let e = &hw.efficiency;
    let one = bytes / (hw.memory_bandwidth() * e.memory_bound)
        + (16.0 + 3.0 * 16.0) * e.kernel_overhead_us * 1e-6;
    let want = layers * one;
    assert!(
        (tl.recompute[0] - want).abs() <= 1e-12 * want,
        "moe_act recompute {} s, by hand {want} s",
        tl.recompute[0]
    );
    // Every module list: the layers' count times the forward time of `recompute_ops`; the
    // default list is the attention core alone.
    let d = Dims::of(&s, &l);
    let shapes = [
        LayerShape {
            kind: LayerKind::Moe,
            sliding: true,
        },
        LayerShape {
            kind: LayerKind::Moe,
            sliding: false,
        },
    ];
    for set in [
        vec![CoreAttn],
        vec![MoeAct],
        vec![Layernorm],
        vec![Layernorm, MoeAct],
        vec![SharedExperts],
    ] {
        let l = with(Some(set.clone()), Recompute::Selective);
        let tl = projection::timeline(&s, &l).unwrap();
        let ms = ModuleSet::of(&set);
        // gpt-oss alternates sliding-window and full attention layers: 18 of each.
        let per_pair: f64 = shapes
            .iter()
            .map(|sh| {
                OpTimes::of(&recompute_ops(&s.model, &d, *sh, ms), &AnalyticTimer, &ctx).forward
            })
            .sum();
        let want = layers / 2.0 * per_pair;
        assert!(
            (tl.recompute[0] - want).abs() <= 1e-12 * want.max(1e-30),
            "{set:?}: {} vs {want}",
            tl.recompute[0]
        );
    }
    let core = recompute_ops(&s.model, &d, shapes[0], ModuleSet::DEFAULT);
    assert_eq!(
        core.iter().map(|o| o.name).collect::<Vec<_>>(),
        ["attention"]
    );
    // The default list gives exactly the selective recompute of before: the attention core.
    let attention = layer_ops(&s.model, &d, shapes[0])
        .iter()
        .find(|o| o.name == "attention")
        .copied()
        .unwrap();
    assert_eq!(
        OpTimes::of(&core, &AnalyticTimer, &ctx).forward,
        AnalyticTimer.op_seconds(&ctx, &attention, Pass::Forward)
    );
    // Model FLOPs (and so TFLOP/s per GPU) exclude the recomputation; the step takes longer.
    let none = projection::step_time(&s, &with(None, Recompute::None)).unwrap();
    let act = projection::step_time(
        &s,
        &with(Some(vec![Layernorm, MoeAct]), Recompute::Selective),
    )
    .unwrap();
    assert_eq!(act.model_flops_per_step, none.model_flops_per_step);
    assert!(act.step_time_seconds > none.step_time_seconds);
}

#[test]
fn the_recomputed_parts_are_parts_of_the_layers_element_wise_work() {
    // The element-wise ops `recompute_ops` adds (norms, rotary, activations) move no more bytes
    // than the merged ops of the layer they come out of.
    for (model, gpus) in [
        ("deepseek-v3", 64),
        ("gpt-oss-120b", 8),
        ("llama3.1-70b", 8),
    ] {
        let s = scenario(model, "h100-sxm", gpus, 4096, 64);
        let l = Layout {
            tp: 2,
            ep: if s.model.moe.is_some() { 4 } else { 1 },
            ..Layout::default()
        };
        let d = Dims::of(&s, &l);
        for kind in [LayerKind::Dense, LayerKind::Moe] {
            let shape = LayerShape {
                kind,
                sliding: false,
            };
            let layer = layer_ops(&s.model, &d, shape);
            let merged: f64 = layer
                .iter()
                .filter(|o| o.name == "elementwise" || o.name == "moe_expert_elementwise")
                .map(|o| o.bytes)
                .sum();
            let every = ModuleSet::of(&RecomputeModule::ALL);
            let parts: f64 = recompute_ops(&s.model, &d, shape, every)
                .iter()
                .filter(|o| o.name.ends_with("_recompute"))
                .map(|o| o.bytes)
                .sum();
            assert!(parts <= merged, "{model} {kind:?}: {parts} > {merged}");
        }
    }
}

#[test]
fn module_rules_name_the_field() {
    let oss = scenario("gpt-oss-120b", "h100-sxm", 64, 4096, 512);
    let llama = scenario("llama3.1-70b", "h100-sxm", 64, 8192, 128);
    let l = |r: Recompute, m: Vec<RecomputeModule>| Layout {
        pp: 4,
        ep: 8,
        recompute: r,
        recompute_modules: Some(m),
        ..Layout::default()
    };
    assert!(
        l(Recompute::Selective, vec![Layernorm, MoeAct])
            .check(&oss)
            .is_ok()
    );
    let e = l(Recompute::Full, vec![MoeAct]).check(&oss).unwrap_err();
    assert_eq!(e.field, "spec.parallelism.recomputeModules");
    assert!(
        e.message.contains("selective") && e.message.contains("full"),
        "{e}"
    );
    let e = l(Recompute::Selective, vec![MlaUpProj])
        .check(&oss)
        .unwrap_err();
    assert_eq!(e.field, "spec.parallelism.recomputeModules");
    assert!(
        e.message
            .contains("mla_up_proj needs multi-latent attention"),
        "{e}"
    );
    let e = l(Recompute::Selective, vec![MoeAct, MoeAct])
        .check(&oss)
        .unwrap_err();
    assert!(e.message.contains("moe_act twice"), "{e}");
    let dense = |m| Layout {
        tp: 8,
        recompute: Recompute::Selective,
        recompute_modules: Some(vec![m]),
        ..Layout::default()
    };
    for m in [MoeAct, Moe, SharedExperts] {
        let e = dense(m).check(&llama).unwrap_err();
        assert!(
            e.message.contains("needs a mixture-of-experts model"),
            "{m}: {e}"
        );
    }
    assert!(dense(Mlp).check(&llama).is_ok());
    assert!(dense(Layernorm).check(&llama).is_ok());
    // The label shows the list.
    assert_eq!(
        l(Recompute::Selective, vec![Layernorm, MoeAct]).label(),
        "TP1 PP4 EP8 MBS1 recompute=selective(layernorm+moe_act) 1f1b"
    );
    // YAML spelling: camelCase field, Megatron's module names.
    let y: Layout = serde_json::from_str(
        r#"{"recompute": "selective", "recomputeModules": ["moe_act", "layernorm"]}"#,
    )
    .unwrap();
    assert_eq!(y.recompute_modules, Some(vec![MoeAct, Layernorm]));
    let bad = serde_json::from_str::<Layout>(r#"{"recomputeModules": ["attention"]}"#);
    assert!(bad.is_err());
    // Absent stays absent when written back.
    let text = serde_json::to_string(&Layout::default()).unwrap();
    assert!(!text.contains("recomputeModules"), "{text}");
}

/// The gpt-oss-120b rows N4 (DGX-H100) and N12 (DGX-B200) of Megatron-Bridge 25.11, as
/// `data/published.csv` held them before issue 16 moved them (with the recipe's MoE options) to
/// `data/moe-nongated.csv`; their `recompute` column says none. The recipes behind them set
/// `recompute_modules=["layernorm", "moe_act"]` (NVIDIA-NeMo/Megatron-Bridge,
/// scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py,
/// GPT_OSS_120B_PRETRAIN_CONFIG_H100_BF16_V1 and ..._B200_BF16_V1), which Megatron-Bridge
/// applies as selective recompute of those modules. The modules take 15.4 GiB off the
/// activations of N12 and of N4's first stage:
/// - N12 (B200, PP1 EP8 MBS4) fits with them: the recipe also reduces gradients in BF16
///   (`set_gpt_oss_common_configs` in scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py:
///   `grad_reduce_in_fp32 = False`; `primus validate` rows default to it), which Megatron's
///   distributed optimizer accounts as 4 + 16/d bytes per parameter instead of 6 + 12/d; with
///   FP32 gradients (a TrainingPlan's default) the same layout stays 22.3 GiB over;
/// - N4 (H100, PP4 EP8) is listed with MBS 4, which contradicts the same table's GA 2
///   (512 / (4 x DP 16) = 8 micro-batches) and the recipe, whose H100 config keeps the base
///   micro-batch size of 1; with MBS 1 the layout fits, with or without the modules.
#[test]
fn published_gpt_oss_runs_with_the_recipes_recompute_modules() {
    const PUBLISHED: &str = "id,source,model,gpu,gpus,gpusPerNode,precision,seqLength,globalBatchSize,microBatchSize,tp,pp,vpp,cp,ep,etp,recompute,distributedOptimizer,fsdp,schedule,measuredTokensPerSecondPerGpu,measuredTflopsPerGpu,notes\n\
N4,same (25.11 DGX-H100),gpt-oss-120b,h100-sxm,64,8,bf16,4096,512,4,1,4,1,1,8,1,none,true,false,1f1b,5630,153,\n\
N12,same (25.11 DGX-B200),gpt-oss-120b,b200,64,8,bf16,4096,512,4,1,1,1,1,8,1,none,true,false,1f1b,8213,223,";
    let mut lines = PUBLISHED.lines();
    let header = lines.next().unwrap();
    let col = |name: &str| header.split(',').position(|c| c == name).unwrap();
    let (rc, mbs) = (col("recompute"), col("microBatchSize"));
    let row = |id: &str| {
        PUBLISHED
            .lines()
            .find(|l| l.starts_with(&format!("{id},")))
            .unwrap()
            .to_string()
    };
    let c = Catalog::builtin().unwrap();
    // One row with its recompute (and micro-batch) cells replaced: its memory report.
    let project = |id: &str, recompute: &str, micro_batch: Option<&str>| {
        let r = row(id);
        let mut cells: Vec<&str> = r.split(',').collect();
        assert_eq!(cells[rc], "none", "{id} is published without recompute");
        cells[rc] = recompute;
        if let Some(m) = micro_batch {
            cells[mbs] = m;
        }
        let report = validate_text(&format!("{header}\n{}", cells.join(",")), &c).unwrap();
        let result = report.rows[0].clone();
        assert_eq!(
            result.status,
            primus_oracle::validate::RowStatus::Ok,
            "{id}"
        );
        result
    };
    let modules = "selective(layernorm+moe_act)";
    for id in ["N4", "N12"] {
        let plain = project(id, "none", None);
        let recipe = project(id, modules, None);
        assert!(
            recipe
                .layout
                .contains("recompute=selective(layernorm+moe_act)"),
            "{}",
            recipe.layout
        );
        assert_eq!(
            plain.fits,
            Some(false),
            "{id} as published: {}",
            plain.layout
        );
        assert!(recipe.layout.contains("bf16-grads"), "{}", recipe.layout);
        assert_eq!(
            recipe.fits,
            Some(id == "N12"),
            "{id} with the modules: {}",
            recipe.layout
        );
    }
    // The memory reports behind the verdicts.
    let gib = 1024f64.powi(3);
    let stage = |id: &str, recompute: &str, micro_batch: Option<&str>| {
        let r = row(id);
        let mut cells: Vec<String> = r.split(',').map(String::from).collect();
        cells[rc] = recompute.to_string();
        if let Some(m) = micro_batch {
            cells[mbs] = m.to_string();
        }
        let (s, l) = scenario_of(&c, header, &cells);
        let m = memory::estimate(&s, &l);
        (
            m.stages[m.bottleneck_stage as usize].clone(),
            m.usable_bytes,
        )
    };
    // N12: the modules save 40.0 GiB of activations (layernorm 2h + moe_act 4 copies x 2f =
    // 28,800 bytes per token, and the clamped GLU's second copy of its input, 4 copies x 2 x
    // 2f = 46,080, of 36 layers of 16,384 tokens, less one layer rematerialised:
    // 74,880 x 16,384 x 35 = 39.99 GiB) and, with FP32 gradients, leave it 23.0 GiB over; BF16
    // gradient reduction takes off more than that (the fit asserted above).
    let (none, _) = stage("N12", "none", None);
    let (with, usable) = stage("N12", modules, None);
    let saved = none.activations_bytes - with.activations_bytes;
    assert!(
        (saved - (28_800.0 + 46_080.0) * 16_384.0 * 35.0).abs() < 1.0,
        "{}",
        saved / gib
    );
    let over = with.total_bytes - usable;
    assert!(
        over > 20.0 * gib && over < 25.0 * gib,
        "{} GiB over",
        over / gib
    );
    let bf16_grads = with.gradients_bytes / 2.0 - with.optimizer_bytes / 3.0;
    assert!(bf16_grads > over, "{} < {}", bf16_grads / gib, over / gib);
    // N4 at the recipe's micro-batch size of 1 fits, with and without the modules.
    assert_eq!(project("N4", "none", Some("1")).fits, Some(true));
    assert_eq!(project("N4", modules, Some("1")).fits, Some(true));
}

/// The scenario and layout of a published row (the columns this test needs).
fn scenario_of(c: &Catalog, header: &str, cells: &[String]) -> (Scenario, Layout) {
    let get = |name: &str| -> &str {
        let i = header.split(',').position(|c| c == name).unwrap();
        cells[i].as_str()
    };
    let num = |name: &str| -> u32 { get(name).parse().unwrap() };
    let s = Scenario {
        model: c.model(get("model")).unwrap().clone(),
        hardware: c.hardware(get("gpu")).unwrap().clone(),
        cluster: Cluster {
            gpus: num("gpus"),
            gpus_per_node: num("gpusPerNode"),
        },
        training: Training {
            seq_length: get("seqLength").parse().unwrap(),
            global_batch_size: get("globalBatchSize").parse().unwrap(),
            precision: Precision::Bf16,
        },
    };
    let (recompute, modules) = match get("recompute") {
        "none" => (Recompute::None, None),
        "selective(layernorm+moe_act)" => (Recompute::Selective, Some(vec![Layernorm, MoeAct])),
        other => panic!("{other}"),
    };
    let l = Layout {
        tp: num("tp"),
        pp: num("pp"),
        vpp: num("vpp"),
        cp: num("cp"),
        ep: num("ep"),
        etp: num("etp"),
        micro_batch_size: num("microBatchSize"),
        recompute,
        recompute_modules: modules,
        // As `primus validate` reads a published row: no dropout.
        attention_dropout: primus_oracle::layout::Fraction::ZERO,
        hidden_dropout: primus_oracle::layout::Fraction::ZERO,
        ..Layout::default()
    };
    l.check(&s).unwrap();
    (s, l)
}

/// Context parallelism's ring attention merges each of its `cp` steps' partial output into the
/// running one (Transformer Engine `AttnFuncWithCPAndKVP2P`: `flash_attn_fwd_out_correction`
/// and `flash_attn_fwd_softmax_lse_correction` per step): by hand for Llama 3.1 8B, seq 8192,
/// CP2, TP1, MBS1: 2 steps x 4,096 local tokens x 32 heads x 128 (d_v) x (2 B read of the BF16
/// step output + 8 B read and write of the FP32 accumulator) = 335,544,320 B, two kernels per
/// step; none without CP; rerun by `core_attn` recompute with the attention core.
#[test]
fn ring_attention_merges_each_steps_partial_output() {
    let s = scenario("llama3.1-8b", "h100-sxm", 8, 8192, 64);
    let shape = LayerShape {
        kind: LayerKind::Dense,
        sliding: false,
    };
    let cp2 = Layout { cp: 2, ..tp1() };
    let ops = layer_ops(&s.model, &Dims::of(&s, &cp2), shape);
    let merge = ops.iter().find(|o| o.name == "cp_merge").expect("merge op");
    assert_eq!(merge.bytes, 2.0 * 4096.0 * 32.0 * 128.0 * 10.0);
    assert_eq!(merge.bytes, 335_544_320.0);
    assert_eq!(merge.kernels, 4.0);
    let none = layer_ops(&s.model, &Dims::of(&s, &tp1()), shape);
    assert!(none.iter().all(|o| o.name != "cp_merge"));
    let core = recompute_ops(&s.model, &Dims::of(&s, &cp2), shape, ModuleSet::DEFAULT);
    assert_eq!(
        core.iter().map(|o| o.name).collect::<Vec<_>>(),
        ["attention", "cp_merge"]
    );
}
