//! The memory model against known math: Korthikanti et al. 2022 ("Reducing Activation
//! Recomputation in Large Transformer Models", section 4) per-layer activations in their
//! regimes, Megatron's distributed-optimizer accounting (6 + 12/d bytes per parameter), the
//! in-flight micro-batch counts of each pipeline schedule, and `peak_bytes` == `estimate`.

use primus_oracle::layout::{Layout, Recompute, Schedule};
use primus_oracle::memory::{
    Keep, MemoryOptions, deferred_wgrad_microbatches, estimate, estimate_with, inflight_in_chunk,
    inflight_microbatches, layer_activation_bytes, peak_bytes, peak_bytes_with,
};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::scenario::Scenario;

mod common;

fn scenario(model: &str, gpu: &str, gpus: u32, seq: u64, gbs: u64) -> Scenario {
    common::scenario(model, gpu, gpus, Some(8), seq, gbs, Precision::Bf16)
}

/// Korthikanti's regime: GELU MLP of 4h, multi-head attention, no flash attention, and
/// dropout (the layout default, Megatron's 0.1).
const PAPER: MemoryOptions = MemoryOptions {
    flash_attention: false,
};

/// A layout without dropout (the Llama, Mixtral, Qwen, DeepSeek recipes).
fn no_dropout(l: Layout) -> Layout {
    Layout {
        attention_dropout: primus_oracle::layout::Fraction::ZERO,
        hidden_dropout: primus_oracle::layout::Fraction::ZERO,
        ..l
    }
}

fn tp_layout(tp: u32, sp: bool) -> Layout {
    Layout {
        tp,
        sequence_parallel: sp,
        ..Layout::default()
    }
}

// GPT-3 175B (h 12288, a 96, GELU 4h, MHA) at s 2048, b 1.
const S: f64 = 2048.0;
const B: f64 = 1.0;
const H: f64 = 12288.0;
const A: f64 = 96.0;

fn gpt3() -> Scenario {
    scenario("gpt3-175b", "h100-sxm", 64, 2048, 64)
}

fn dense(s: &Scenario, l: &Layout, keep: Keep) -> f64 {
    layer_activation_bytes(s, l, &PAPER, LayerKind::Dense, keep)
}

#[test]
fn korthikanti_no_parallelism() {
    // sbh(34 + 5as/h)
    let expected = S * B * H * (34.0 + 5.0 * A * S / H);
    assert_eq!(dense(&gpt3(), &tp_layout(1, false), Keep::All), expected);
}

#[test]
fn korthikanti_tensor_parallel() {
    // sbh(10 + 24/t + 5as/(ht)) with t = 8
    let t = 8.0;
    let expected = S * B * H * (10.0 + 24.0 / t + 5.0 * A * S / (H * t));
    assert_eq!(dense(&gpt3(), &tp_layout(8, false), Keep::All), expected);
}

#[test]
fn korthikanti_tensor_and_sequence_parallel() {
    // sbh(34 + 5as/h)/t
    let t = 8.0;
    let expected = S * B * H * (34.0 + 5.0 * A * S / H) / t;
    assert_eq!(dense(&gpt3(), &tp_layout(8, true), Keep::All), expected);
}

#[test]
fn korthikanti_selective_recompute() {
    // 34sbh/t with tensor + sequence parallelism and selective recompute
    let t = 8.0;
    let expected = 34.0 * S * B * H / t;
    assert_eq!(
        dense(&gpt3(), &tp_layout(8, true), Keep::Selective),
        expected
    );
}

#[test]
fn korthikanti_full_recompute() {
    // 2sbh per layer (the input), divided by t with sequence parallelism
    let s = gpt3();
    assert_eq!(
        dense(&s, &tp_layout(1, false), Keep::Input),
        2.0 * S * B * H
    );
    assert_eq!(
        dense(&s, &tp_layout(8, false), Keep::Input),
        2.0 * S * B * H
    );
    assert_eq!(
        dense(&s, &tp_layout(8, true), Keep::Input),
        2.0 * S * B * H / 8.0
    );
}

#[test]
fn flash_attention_keeps_only_softmax_statistics() {
    // Flash removes the 5as^2b score term and keeps a fp32 log-sum-exp per head and token:
    // 4*a*s*b/t bytes (dropout masks of the scores are regenerated from the RNG state).
    let s = gpt3();
    let l = tp_layout(8, true);
    let flash = MemoryOptions {
        flash_attention: true,
    };
    let got = layer_activation_bytes(&s, &l, &flash, LayerKind::Dense, Keep::All);
    let expected = (34.0 * S * B * H + 4.0 * A * S * B) / 8.0;
    assert_eq!(got, expected);
}

#[test]
fn without_dropout_no_masks() {
    // No dropout: the two hidden masks (sbh each) go, and the score term keeps only the
    // softmax output 2as^2b (no mask as^2b, no dropped-out copy 2as^2b): sbh(32 + 2as/h).
    let s = gpt3();
    let got = layer_activation_bytes(
        &s,
        &no_dropout(tp_layout(1, false)),
        &PAPER,
        LayerKind::Dense,
        Keep::All,
    );
    assert_eq!(got, S * B * H * (32.0 + 2.0 * A * S / H));
}

#[test]
fn context_parallel_divides_the_sequence() {
    // With cp = 2 each rank holds s/2 queries (all per-token terms halve); the non-flash score
    // matrix is (s/2) x s per head: sbh*34/2 + 5a*(s/2)*s*b.
    let s = gpt3();
    let l = Layout {
        cp: 2,
        ..Layout::default()
    };
    let expected = S / 2.0 * B * H * 34.0 + 5.0 * A * (S / 2.0) * S * B;
    assert_eq!(dense(&s, &l, Keep::All), expected);
}

#[test]
fn gqa_shrinks_key_and_value_activations() {
    // Llama 3.1 70B (a 64, g 8, d 128): K and V keep g*d instead of a*d elements each, so
    // against multi-head attention the layer saves 2 tensors * 2 bytes * (a - g)*d per token.
    let mut s = scenario("llama3.1-70b", "h100-sxm", 8, 4096, 8);
    let l = tp_layout(1, false);
    let opts = MemoryOptions::default();
    let gqa = layer_activation_bytes(&s, &l, &opts, LayerKind::Dense, Keep::All);
    s.model.kv_heads = Some(64);
    let mha = layer_activation_bytes(&s, &l, &opts, LayerKind::Dense, Keep::All);
    assert_eq!(mha - gqa, 4096.0 * 2.0 * 2.0 * (64.0 - 8.0) * 128.0);
}

#[test]
fn swiglu_keeps_more_than_gelu() {
    // SwiGLU of width f keeps its input 2f and output f (2 bytes each): 6f bytes per token;
    // GELU keeps f and f: 4f. Same card otherwise: difference 2f bytes per token.
    let mut s = scenario("llama3.1-8b", "h100-sxm", 8, 4096, 8);
    let l = tp_layout(1, false);
    let opts = MemoryOptions::default();
    let swiglu = layer_activation_bytes(&s, &l, &opts, LayerKind::Dense, Keep::All);
    s.model.activation = primus_oracle::model::Activation::Gelu;
    let gelu = layer_activation_bytes(&s, &l, &opts, LayerKind::Dense, Keep::All);
    assert_eq!(swiglu - gelu, 4096.0 * 2.0 * 14336.0);
}

#[test]
fn moe_layer_by_hand() {
    // Mixtral 8x7B MoE layer, s 4096, b 1, tp 1, flash, no dropout, bf16:
    // sequence terms: LN1 input 2h, QKV input 2h, LN2 input 2h, MLP/router input 2h = 32,768;
    //   router: fp32 scores 4*8 + routing map 8 + top-k probs 4*2 = 48;
    // tensor terms: Q 2*4096 + K 2*1024 + V 2*1024 + projection input 2*4096 = 20,480;
    //   flash log-sum-exp 4*32 = 128;
    // experts: top-2 copies x (fc1 input 2h 8,192 + SwiGLU input 4f 57,344 + output 2f
    //   28,672 + fp32 probability 4) = 2 * 94,212 = 188,424;
    // per token 241,848 bytes x 4096 tokens.
    let s = scenario("mixtral-8x7b", "h100-sxm", 8, 4096, 8);
    let got = layer_activation_bytes(
        &s,
        &no_dropout(tp_layout(1, false)),
        &MemoryOptions::default(),
        LayerKind::Moe,
        Keep::All,
    );
    assert_eq!(got, 241_848.0 * 4096.0);
}

#[test]
fn megatron_distributed_optimizer_accounting() {
    // Llama 2 7B (6,738,415,616 parameters; vocabulary 32000 is a multiple of 128) on 8 GPUs,
    // TP1 PP1 DP8: BF16 weight 2 + FP32 grad 4 + (master + Adam moments 12)/8 bytes.
    let s = scenario("llama2-7b", "h100-sxm", 8, 4096, 8);
    let p = 6_738_415_616.0;
    let r = estimate(&s, &Layout::default());
    let st = &r.stages[0];
    assert_eq!(st.parameters, p);
    assert_eq!(st.weights_bytes, 2.0 * p);
    assert_eq!(st.gradients_bytes, 4.0 * p);
    assert_eq!(st.optimizer_bytes, 12.0 * p / 8.0);
    assert_eq!(
        st.weights_bytes + st.gradients_bytes + st.optimizer_bytes,
        (6.0 + 12.0 / 8.0) * p
    );
    // Without the distributed optimizer: 2 + 4 + 12 = 18 bytes per parameter.
    let plain = Layout {
        distributed_optimizer: false,
        ..Layout::default()
    };
    let st = estimate(&s, &plain).stages[0].clone();
    assert_eq!(
        st.weights_bytes + st.gradients_bytes + st.optimizer_bytes,
        18.0 * p
    );
    // FSDP shards all 18 bytes over the 8 data-parallel ranks.
    let fsdp = Layout {
        fsdp: true,
        ..Layout::default()
    };
    let st = estimate(&s, &fsdp).stages[0].clone();
    assert_eq!(
        st.weights_bytes + st.gradients_bytes + st.optimizer_bytes,
        18.0 * p / 8.0
    );
    // BF16 gradients (`--grad-reduce-in-bf16`): 2 + 2 unsharded, FP32 gradient shard copy 4 +
    // 12 sharded: Megatron-LM docs/source/api-guide/dist_optimizer.md, the 16-bit-gradient row
    // "4 + 16/d" (and 20 without the distributed optimizer). The copy (`.float()` of the shard
    // in `_copy_model_grads_to_main_grads`) is made at the optimizer step and dropped by the
    // next step's `zero_grad` before its forward passes: it is the step's, not beside the
    // activations, so the peak is 4 + 12/d plus the activations.
    let bf16 = Layout {
        grad_reduce_in_fp32: false,
        ..Layout::default()
    };
    let st = estimate(&s, &bf16).stages[0].clone();
    assert_eq!(st.gradients_bytes, 2.0 * p);
    assert_eq!(st.optimizer_bytes, 12.0 * p / 8.0);
    assert_eq!(st.step_grad_copy_bytes, 4.0 * p / 8.0);
    assert_eq!(
        st.weights_bytes + st.gradients_bytes + st.optimizer_bytes + st.step_grad_copy_bytes,
        (4.0 + 16.0 / 8.0) * p
    );
    // The activations of one 4096-token micro-batch exceed the copy: the total is the
    // model state without it, plus the activations and the other bytes.
    assert!(st.activations_bytes > st.step_grad_copy_bytes);
    assert_eq!(
        st.total_bytes,
        st.weights_bytes
            + st.gradients_bytes
            + st.optimizer_bytes
            + st.activations_bytes
            + st.other_bytes
    );
    let fp32 = estimate(&s, &Layout::default()).stages[0].clone();
    assert_eq!(fp32.step_grad_copy_bytes, 0.0);
    let st = estimate(
        &s,
        &Layout {
            distributed_optimizer: false,
            ..bf16.clone()
        },
    )
    .stages[0]
        .clone();
    assert_eq!(
        st.weights_bytes + st.gradients_bytes + st.optimizer_bytes + st.step_grad_copy_bytes,
        20.0 * p
    );
    // Without the distributed optimizer the copy is of every parameter (4 bytes): more than a
    // 4096-token micro-batch's activations of Llama 2 7B (32 layers x ~0.4 GiB) here, so the
    // step sets the peak, by the copy's excess over the activations and buffers, which the
    // other bytes carry.
    let passes = st.activations_bytes + st.buffers_bytes;
    assert_eq!(st.step_grad_copy_bytes, 4.0 * p);
    assert!(st.step_grad_copy_bytes > passes);
    // Allocated at the step: weight 2 + gradient 2 + states 12, and the copy 4.
    let tensors = 16.0 * p + st.step_grad_copy_bytes;
    assert!((st.allocated_bytes - tensors).abs() <= 1e-6 * tensors);
    let excess = st.step_grad_copy_bytes - passes;
    assert!(
        (st.other_bytes
            - st.buffers_bytes
            - st.fragmentation_bytes
            - st.communicator_bytes
            - excess)
            .abs()
            <= 1e-6 * tensors
    );
}

#[test]
fn expert_optimizer_shards_over_expert_data_parallel() {
    // Mixtral 8x7B on 16 GPUs, TP1 PP1 EP8: dp 16, expert-dp 16/8 = 2. Each GPU holds one
    // expert per layer: 32 x 176,160,768 = 5,637,144,576 expert parameters, and all
    // non-expert ones: 32 x (41,943,040 + 32,768 router + 8,192 norms) + 2 x 32000 x 4096 +
    // 4096 = 1,605,636,096. Optimizer: 12 x (1,605,636,096/16 + 5,637,144,576/2).
    let s = scenario("mixtral-8x7b", "h100-sxm", 16, 4096, 16);
    let l = Layout {
        ep: 8,
        ..Layout::default()
    };
    let st = estimate(&s, &l).stages[0].clone();
    assert_eq!(st.parameters, 1_605_636_096.0 + 5_637_144_576.0);
    assert_eq!(
        st.optimizer_bytes,
        12.0 * (1_605_636_096.0 / 16.0 + 5_637_144_576.0 / 2.0)
    );
}

#[test]
fn fp8_keeps_weight_copies() {
    // Transformer Engine keeps an FP8 copy and transpose (2 bytes) of each GEMM weight. Llama
    // 2 7B, TP1: GEMM weights are the layers' attention 67,108,864 and MLP 135,266,304, times
    // 32 = 6,476,005,376 (norms and embeddings excluded).
    let mut s = scenario("llama2-7b", "h100-sxm", 8, 4096, 8);
    let bf16 = estimate(&s, &Layout::default()).stages[0].weights_bytes;
    s.training.precision = Precision::Fp8;
    let fp8 = estimate(&s, &Layout::default()).stages[0].weights_bytes;
    assert_eq!(fp8 - bf16, 2.0 * 6_476_005_376.0);
}

#[test]
fn stage_activations_compose_layers_and_inflight_microbatches() {
    // GPT-3 175B, TP8 SP PP2 1F1B, MBS 1, selective recompute: stage 1 (last) holds 48 layers
    // x min(pp - 1, m) = 1 micro-batch of 34sbh/t, plus its loss-side tensors: final-norm and
    // output-layer inputs 2sbh/t each, the fp32 loss 4sb, and the logits (vocabulary 51200
    // padded to a multiple of 128*8: 51200) 4 bytes kept + 2 bytes during the cast per
    // s*b*V/t, and the selective recompute's transient (one layer's attention scores,
    // 5as^2b/t).
    let s = gpt3();
    let l = Layout {
        tp: 8,
        pp: 2,
        recompute: Recompute::Selective,
        ..Layout::default()
    };
    let r = estimate_with(&s, &l, &PAPER);
    let t = 8.0;
    let layer = 34.0 * S * B * H / t;
    let loss_side = 2.0 * 2.0 * S * B * H / t + 4.0 * S * B;
    let logits = S * B * 51200.0 / t * (4.0 + 2.0);
    let transient = 5.0 * A * S * S * B / t;
    let st = &r.stages[1];
    assert_eq!(st.inflight_microbatches, 1);
    assert_eq!(
        st.activations_bytes,
        48.0 * layer + loss_side + logits + transient
    );
    // Stage 0 holds min(pp - 0, m) = 2 micro-batches of its 48 layers, and of each the
    // embedding's hidden-dropout mask (1 byte per element, sequence-split: sbh/t).
    assert_eq!(r.stages[0].inflight_microbatches, 2);
    let embedding_mask = S * B * H / t;
    assert_eq!(
        r.stages[0].activations_bytes,
        2.0 * 48.0 * layer + 2.0 * embedding_mask + transient
    );
}

#[test]
fn gpt3_175b_stage0_reproduces_korthikantis_selective_figure() {
    // Korthikanti et al. 2022, GPT-3 175B with tensor + sequence parallelism and selective
    // recompute (t = 8, p = 8, L = 96, s = 2048, b = 1, h = 12288, dropout 0.1): the first
    // stage holds p in-flight micro-batches x L/p layers = L layer-micro-batches of 34sbh/t,
    // 34 * 2048 * 12288 * 96 / 8 = 10,267,656,192 bytes = 9.5625 GiB (9.56 GiB in the paper).
    // The 34 include the two hidden-dropout masks (sbh each), which Megatron's default
    // dropout keeps; without dropout the same stage holds 32/34 of it, 9.00 GiB.
    let s = gpt3();
    let l = Layout {
        tp: 8,
        pp: 8,
        recompute: Recompute::Selective,
        ..Layout::default()
    };
    let m = l.num_microbatches(&s) as u32;
    let inflight = inflight_microbatches(&l, 0, m);
    assert_eq!(inflight, 8);
    let per_layer = layer_activation_bytes(&s, &l, &PAPER, LayerKind::Dense, Keep::Selective);
    let layers = 96.0 / 8.0;
    let stage0 = inflight as f64 * layers * per_layer;
    assert_eq!(stage0, 10_267_656_192.0);
    let gib = 1024.0 * 1024.0 * 1024.0;
    assert_eq!(stage0 / gib, 9.5625);
    // The stage's activations are those layers, the embedding's dropout mask of each
    // in-flight micro-batch (sbh/t), and the selective recompute's transient (one layer's
    // attention scores, 5as^2b/t, rematerialised during its backward).
    let r = estimate_with(&s, &l, &PAPER);
    let t = 8.0;
    let embedding_masks = 8.0 * S * B * H / t;
    let transient = 5.0 * A * S * S * B / t;
    assert_eq!(
        r.stages[0].activations_bytes,
        stage0 + embedding_masks + transient
    );
    // Without dropout (attentionDropout/hiddenDropout 0, what the Llama recipes set): 9.00 GiB.
    let quiet = no_dropout(l);
    let per_layer = layer_activation_bytes(&s, &quiet, &PAPER, LayerKind::Dense, Keep::Selective);
    assert_eq!(inflight as f64 * layers * per_layer / gib, 9.0);
}

#[test]
fn one_f_one_b_inflight() {
    // 1F1B: stage i holds min(pp - i, m).
    let l = Layout {
        pp: 4,
        ..Layout::default()
    };
    let got: Vec<u32> = (0..4).map(|i| inflight_microbatches(&l, i, 8)).collect();
    assert_eq!(got, [4, 3, 2, 1]);
    let got: Vec<u32> = (0..4).map(|i| inflight_microbatches(&l, i, 2)).collect();
    assert_eq!(got, [2, 2, 2, 1]);
}

#[test]
fn interleaved_inflight() {
    // Megatron: warm-up (pp - r - 1)*2 + (vpp - 1)*pp chunk-micro-batches, capped at m*vpp,
    // plus one. pp 4, vpp 2, m 8: rank 0: 6 + 4 = 10 -> 11; rank 3: 0 + 4 -> 5.
    let l = Layout {
        pp: 4,
        vpp: 2,
        schedule: Schedule::Interleaved,
        ..Layout::default()
    };
    let got: Vec<u32> = (0..4).map(|i| inflight_microbatches(&l, i, 8)).collect();
    assert_eq!(got, [11, 9, 7, 5]);
    // m = pp = 4: rank 0's warm-up 10 >= m*vpp = 8, so all 8 are in flight.
    assert_eq!(inflight_microbatches(&l, 0, 4), 8);
    assert_eq!(inflight_microbatches(&l, 3, 4), 5);
    // Forwards run in groups of pp per chunk, chunk 0 first: rank 0's 11 are 4 + 4 (one full
    // cycle of 8) then 3 more of chunk 0: chunk 0 holds 7, chunk 1 holds 4.
    assert_eq!(inflight_in_chunk(&l, 0, 8, 0), 7);
    assert_eq!(inflight_in_chunk(&l, 0, 8, 1), 4);
    // Rank 3's 5: 4 of chunk 0, 1 of chunk 1.
    assert_eq!(inflight_in_chunk(&l, 3, 8, 0), 4);
    assert_eq!(inflight_in_chunk(&l, 3, 8, 1), 1);
}

#[test]
fn zero_bubble_inflight() {
    // ZB-H1 keeps 1F1B's forwards in flight and defers up to i weight-gradient passes on
    // stage i (Qi et al. 2023, ZB-H1).
    let l = Layout {
        pp: 4,
        schedule: Schedule::ZeroBubble,
        ..Layout::default()
    };
    let got: Vec<u32> = (0..4).map(|i| inflight_microbatches(&l, i, 8)).collect();
    assert_eq!(got, [4, 3, 2, 1]);
    let got: Vec<u32> = (0..4)
        .map(|i| deferred_wgrad_microbatches(&l, i, 8))
        .collect();
    assert_eq!(got, [0, 1, 2, 3]);
    let one_f_one_b = Layout {
        pp: 4,
        ..Layout::default()
    };
    assert_eq!(deferred_wgrad_microbatches(&one_f_one_b, 3, 8), 0);
}

#[test]
fn peak_bytes_agrees_with_estimate() {
    let cases = [
        (
            scenario("llama3.1-70b", "h100-sxm", 64, 8192, 128),
            Layout {
                tp: 4,
                pp: 8,
                vpp: 5,
                schedule: Schedule::Interleaved,
                ..Layout::default()
            },
        ),
        (
            scenario("deepseek-v3", "h100-sxm", 1024, 4096, 8192),
            Layout {
                tp: 2,
                pp: 8,
                vpp: 4,
                ep: 64,
                schedule: Schedule::Interleaved,
                pipeline_layout: Some(
                    primus_oracle::layout::PipelineLayout::parse("Et|(tt|)*30mL").unwrap(),
                ),
                ..Layout::default()
            },
        ),
        (
            scenario("mixtral-8x22b", "mi300x", 32, 4096, 256),
            Layout {
                tp: 2,
                pp: 4,
                ep: 8,
                recompute: Recompute::Full,
                recompute_layers: 3,
                schedule: Schedule::ZeroBubble,
                ..Layout::default()
            },
        ),
    ];
    for (s, l) in cases {
        l.check(&s).unwrap();
        let r = estimate(&s, &l);
        assert_eq!(peak_bytes(&s, &l), (r.peak_bytes, r.bottleneck_stage));
        let max = r.stages.iter().map(|st| st.total_bytes).fold(0.0, f64::max);
        assert_eq!(r.peak_bytes, max);
        assert_eq!(r.fits, r.peak_bytes <= r.usable_bytes);
        assert_eq!(r.headroom_bytes, r.usable_bytes - r.peak_bytes);
        for st in &r.stages {
            let sum = st.weights_bytes
                + st.gradients_bytes
                + st.optimizer_bytes
                + st.activations_bytes
                + st.other_bytes;
            assert!((sum - st.total_bytes).abs() <= 1e-6 * st.total_bytes);
        }
        assert_eq!(peak_bytes_with(&s, &l, &PAPER), {
            let r = estimate_with(&s, &l, &PAPER);
            (r.peak_bytes, r.bottleneck_stage)
        });
    }
}

#[test]
fn runtime_reserve_separates_capacity_from_usable() {
    // H100 profile: 80 GiB, reserve 1.25 GiB (context, workspaces, hidden HBM; the
    // communicator buffers are counted per layout).
    let s = scenario("llama3.1-8b", "h100-sxm", 8, 4096, 8);
    let r = estimate(&s, &Layout::default());
    let gib = 1024.0 * 1024.0 * 1024.0;
    assert_eq!(r.capacity_bytes, 80.0 * gib);
    assert_eq!(r.usable_bytes, (80.0 - 1.25) * gib);
}

#[test]
fn fragmentation_is_the_profile_fraction_of_tensor_memory() {
    let s = scenario("llama3.1-8b", "h100-sxm", 8, 4096, 8);
    let st = estimate(&s, &Layout::default()).stages[0].clone();
    let tensors = st.weights_bytes
        + st.gradients_bytes
        + st.optimizer_bytes
        + st.activations_bytes
        + st.buffers_bytes;
    assert_eq!(
        st.fragmentation_bytes,
        s.hardware.overheads.allocator_fragmentation * tensors
    );
    assert_eq!(
        st.other_bytes,
        st.buffers_bytes + st.fragmentation_bytes + st.communicator_bytes
    );
    assert_eq!(st.allocated_bytes, tensors);
    assert_eq!(st.reserved_bytes, tensors + st.fragmentation_bytes);
    assert_eq!(st.total_bytes, st.reserved_bytes + st.communicator_bytes);
}

#[test]
fn embedding_and_output_layer_sit_on_the_first_and_last_stage() {
    // Llama 3.1 8B, PP4 TP2: vocabulary 128256 padded to a multiple of 128*2 = 256: 128256.
    // Each stage holds 8 layers of 218,112,000 / ... split over TP2: attention and MLP halve,
    // norms (8,192) stay: (41,943,040 + 176,160,768)/2 + 8,192 = 109,060,096. Stage 0 adds
    // the embedding 128256*4096/2 = 262,668,288; stage 3 the output layer (same) and the
    // final norm 4,096.
    let s = scenario("llama3.1-8b", "h100-sxm", 8, 4096, 8);
    let l = Layout {
        tp: 2,
        pp: 4,
        ..Layout::default()
    };
    let r = estimate(&s, &l);
    let layer = 109_060_096.0;
    let table = 262_668_288.0;
    assert_eq!(r.stages[0].parameters, 8.0 * layer + table);
    assert_eq!(r.stages[1].parameters, 8.0 * layer);
    assert_eq!(r.stages[3].parameters, 8.0 * layer + table + 4096.0);
    assert!(r.stages[0].embedding && r.stages[3].loss);
}

#[test]
fn tied_embedding_gets_a_copy_on_the_last_stage() {
    // GPT-22B ties its embedding; with PP > 1 Megatron keeps the word embedding on the last
    // stage too: 51200*6144/1 on both ends (positions 2048*6144 on the first only).
    let s = scenario("gpt-22b", "h100-sxm", 8, 2048, 8);
    let pp1 = estimate(&s, &Layout::default()).stages[0].parameters;
    assert_eq!(pp1, 22_074_273_792.0);
    let l = Layout {
        pp: 2,
        ..Layout::default()
    };
    let r = estimate(&s, &l);
    let total: f64 = r.stages.iter().map(|st| st.parameters).sum();
    assert_eq!(total, 22_074_273_792.0 + 51200.0 * 6144.0);
}

/// A layout's capacity factor with padding (`--moe-expert-capacity-factor` with
/// `--moe-pad-expert-input-to-capacity`: every expert runs exactly its capacity,
/// Megatron-Core `moe_utils.py:get_capacity`) sizes the experts' saved activations: a rank holds
/// capacityFactor x the balanced copies. Without padding (tokens beyond capacity dropped) and
/// dropless the rank holds the balanced count on average over the layers it keeps, whatever the
/// routing balance. Qwen3-30B-A3B, BF16, TP1 EP8, seq 4096, MBS 1: one routed copy keeps fc1's
/// input 2h = 4,096 B, the SwiGLU input 2 x 2f = 3,072 B, fc2's input 2f = 1,536 B and its
/// fp32 probability 4 B = 8,708 B; 8 copies per token; capacity 1.5 adds half of them:
/// 0.5 x 8 x 8,708 x 4,096 tokens = 142,671,872 B per layer. Until stop 26 the memory model
/// read only the model card's capacity factor and ignored the layout's.
#[test]
fn padded_capacity_scales_the_experts_activations() {
    use primus_oracle::layout::Factor;
    let s = scenario("qwen3-30b-a3b", "h100-sxm", 8, 4096, 64);
    let dropless = no_dropout(Layout {
        ep: 8,
        ..Layout::default()
    });
    let opts = MemoryOptions::default();
    let bytes = |l: &Layout| layer_activation_bytes(&s, l, &opts, LayerKind::Moe, Keep::All);
    let mut padded = dropless.clone();
    padded.moe.capacity_factor = Some(Factor(1.5));
    padded.moe.pad_to_capacity = true;
    assert_eq!(bytes(&padded) - bytes(&dropless), 142_671_872.0);
    // Dropping beyond capacity, forced balance and auxiliary-loss routing: the balanced count.
    let mut dropping = padded.clone();
    dropping.moe.pad_to_capacity = false;
    assert_eq!(bytes(&dropping), bytes(&dropless));
    let mut forced = dropless.clone();
    forced.moe.force_load_balancing = true;
    assert_eq!(bytes(&forced), bytes(&dropless));
    // The whole stage follows: the padded layout's estimate holds the difference per layer
    // and in-flight micro-batch.
    let (a, b) = (estimate(&s, &dropless), estimate(&s, &padded));
    assert!(b.stages[0].activations_bytes > a.stages[0].activations_bytes);
}
