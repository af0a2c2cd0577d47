//! The optimizer and activation memory options against hand-derived bytes (issue 15): the
//! precision-aware optimizer's dtypes, optimizer CPU offload, FP8 parameters, dropout masks,
//! layer-level activation offload, the allocator's overhead, the communicator buffers and the
//! fused token dispatchers' buffers; and their legality rules.

use primus_oracle::backend::Fp8Recipe;
use primus_oracle::layout::{
    FlexBackend, Fraction, Layout, MoeOptions, OptimizerDtype, Recompute, TokenDispatcher,
};
use primus_oracle::memory::allocator::{COMMUNICATOR_BYTES, communicators};
use primus_oracle::memory::dispatcher::{
    DEEPEP_CONFIGS, MEGATRON_DEEPEP_SMS, PRIMUS_TURBO_CONFIGS, PRIMUS_TURBO_DEEPEP_CUS,
    deepep_config, deepep_nvl_bytes, deepep_rdma_bytes, dispatcher_bytes, hybridep_bytes,
};
use primus_oracle::memory::{
    Keep, MemoryOptions, estimate, layer_activation_bytes, optimizer::PARAM_REMAINDER_BYTES,
};
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::scenario::Scenario;

mod common;

fn scenario(model: &str, gpu: &str, gpus: u32, seq: u64, gbs: u64) -> Scenario {
    common::scenario(model, gpu, gpus, Some(8), seq, gbs, Precision::Bf16)
}

/// Llama 2 7B (6,738,415,616 parameters) on 8 GPUs, TP1 PP1 DP8.
const P: f64 = 6_738_415_616.0;

fn llama2_7b() -> Scenario {
    scenario("llama2-7b", "h100-sxm", 8, 4096, 8)
}

fn state(l: &Layout) -> (f64, f64, f64) {
    let st = estimate(&llama2_7b(), l).stages[0].clone();
    (st.weights_bytes, st.gradients_bytes, st.optimizer_bytes)
}

#[test]
fn precision_aware_optimizer_bytes_per_parameter() {
    // Primus' MI355X recipes: BF16 main grads and moments, FP32 master stored as the 16-bit
    // remainders of the BF16 weights (TE FusedAdam store_param_remainders): 2 + 2 unsharded,
    // remainder 2 + m 2 + v 2 sharded: 4 + 6/d; the optimizer reads the BF16 gradient buffer in
    // place, so no FP32 gradient copy.
    let bf16 = Layout {
        precision_aware_optimizer: true,
        main_grads_dtype: OptimizerDtype::Bf16,
        exp_avg_dtype: OptimizerDtype::Bf16,
        exp_avg_sq_dtype: OptimizerDtype::Bf16,
        ..Layout::default()
    };
    let (w, g, o) = state(&bf16);
    assert_eq!((w, g, o), (2.0 * P, 2.0 * P, 6.0 * P / 8.0));
    assert_eq!(PARAM_REMAINDER_BYTES, 2.0);
    // All-FP32 dtypes: 2 + 4 unsharded, remainder 2 + 4 + 4 sharded: 6 + 10/d.
    let fp32 = Layout {
        precision_aware_optimizer: true,
        ..Layout::default()
    };
    assert_eq!(state(&fp32), (2.0 * P, 4.0 * P, 10.0 * P / 8.0));
    // Megatron-Bridge's Qwen3 recipe: FP32 dtypes with grad_reduce_in_fp32 False: a BF16
    // gradient buffer read in place (2 + 2 + 10/d).
    let bridge = Layout {
        grad_reduce_in_fp32: false,
        ..fp32.clone()
    };
    assert_eq!(state(&bridge), (2.0 * P, 2.0 * P, 10.0 * P / 8.0));
    // FP16 master weights and FP8 moments: 2 + 1 + 1 = 4 bytes sharded.
    let small = Layout {
        main_params_dtype: OptimizerDtype::Fp16,
        exp_avg_dtype: OptimizerDtype::Fp8,
        exp_avg_sq_dtype: OptimizerDtype::Fp8,
        ..fp32
    };
    assert_eq!(state(&small).2, 4.0 * P / 8.0);
}

#[test]
fn precision_aware_optimizer_under_current_scaling_fp8_keeps_mcores_fp32_master() {
    // Megatron-Core optimizer_config.py: use_precision_aware_optimizer_no_fp8_or_ds_fp8 is
    // false with an FP32 master under an FP8 recipe other than delayed scaling (no CPU
    // offload). distrib_optimizer.py then keeps its own FP32 master shard
    // (shard_model_param.clone().float(): 4 bytes, no remainders) and gives the optimizer
    // param.grad = shard_model_grad.float(), an FP32 copy of a BF16 gradient shard made at the
    // step. Primus' MI355X dtypes (BF16 grads and moments) in FP8: 4 + 2 + 2 = 8/d sharded and
    // a 4/d step copy, where delayed scaling (TE holds the master as remainders) has 6/d and
    // none.
    let mut s = llama2_7b();
    s.training.precision = Precision::Fp8;
    let pao = |recipe: Fp8Recipe| Layout {
        precision_aware_optimizer: true,
        grad_reduce_in_fp32: false,
        main_grads_dtype: OptimizerDtype::Bf16,
        exp_avg_dtype: OptimizerDtype::Bf16,
        exp_avg_sq_dtype: OptimizerDtype::Bf16,
        fp8_recipe: Some(recipe),
        ..Layout::default()
    };
    let stage = |l: &Layout| estimate(&s, l).stages[0].clone();
    let delayed = stage(&pao(Fp8Recipe::Delayed));
    assert_eq!(delayed.optimizer_bytes, 6.0 * P / 8.0);
    assert_eq!(delayed.step_grad_copy_bytes, 0.0);
    for recipe in [
        Fp8Recipe::Tensorwise,
        Fp8Recipe::Blockwise,
        Fp8Recipe::Mxfp8,
    ] {
        let st = stage(&pao(recipe));
        assert_eq!(st.optimizer_bytes, 8.0 * P / 8.0, "{recipe:?}");
        assert_eq!(st.step_grad_copy_bytes, 4.0 * P / 8.0, "{recipe:?}");
        // The gradient buffer stays BF16 and the weights are unchanged.
        assert_eq!(st.gradients_bytes, delayed.gradients_bytes);
        assert_eq!(st.weights_bytes, delayed.weights_bytes);
    }
    // An FP32 gradient buffer needs no cast: .float() of an FP32 tensor is the tensor itself.
    let fp32_grads = Layout {
        grad_reduce_in_fp32: true,
        main_grads_dtype: OptimizerDtype::Fp32,
        ..pao(Fp8Recipe::Tensorwise)
    };
    assert_eq!(stage(&fp32_grads).step_grad_copy_bytes, 0.0);
    // A 16-bit master, BF16 training or CPU offload leave TE's FusedAdam in charge.
    let bf16_master = Layout {
        main_params_dtype: OptimizerDtype::Bf16,
        ..pao(Fp8Recipe::Tensorwise)
    };
    assert_eq!(stage(&bf16_master).optimizer_bytes, 6.0 * P / 8.0);
    assert_eq!(
        estimate(&llama2_7b(), &pao(Fp8Recipe::Tensorwise)).stages[0].optimizer_bytes,
        6.0 * P / 8.0
    );
}

#[test]
fn optimizer_cpu_offload_moves_what_megatron_moves() {
    // Without the precision-aware optimizer the HybridDeviceOptimizer gets MCore's FP32 master
    // shards, which stay referenced on the GPU: a fraction f of the parameters moves its two
    // FP32 moments (8 bytes) to the CPU: (4 + 8(1 - f))/d. Megatron-Bridge's sweep on
    // Qwen3-30B-A3B measured exactly that (memory.csv MB-O1..O5, within 1%).
    for (f, bytes) in [(0.0, 12.0), (0.25, 10.0), (0.5, 8.0), (1.0, 4.0)] {
        let l = Layout {
            optimizer_cpu_offload: true,
            optimizer_offload_fraction: Fraction::new(f),
            ..Layout::default()
        };
        assert_eq!(state(&l).2, bytes * P / 8.0, "fraction {f}");
    }
    // With it, the optimizer's parameters are the BF16 shards: the part left on the GPU gets
    // an FP32 copy and FP32 moments, 12(1 - f)/d; with BF16 gradients also an FP32 gradient,
    // 4(1 - f)/d, which exists for the step only (the next step's zero_grad drops it).
    let l = Layout {
        precision_aware_optimizer: true,
        optimizer_cpu_offload: true,
        optimizer_offload_fraction: Fraction::new(0.5),
        ..Layout::default()
    };
    assert_eq!(state(&l).2, 6.0 * P / 8.0);
    let l = Layout {
        main_grads_dtype: OptimizerDtype::Bf16,
        ..l
    };
    assert_eq!(state(&l).2, 6.0 * P / 8.0);
    let st = estimate(&llama2_7b(), &l).stages[0].clone();
    assert_eq!(st.step_grad_copy_bytes, 2.0 * P / 8.0);
}

#[test]
fn fp8_parameters_replace_the_bf16_weight_and_its_fp8_copies() {
    // Without --fp8-param-gather every GEMM weight is BF16 (2) + FP8 copy and transpose (2);
    // with it, FP8 data (1) + transpose (1). Llama 2 7B's GEMM weights: 6,476,005,376.
    let mut s = llama2_7b();
    s.training.precision = Precision::Fp8;
    let copies = estimate(&s, &Layout::default()).stages[0].weights_bytes;
    let l = Layout {
        fp8_param_gather: true,
        ..Layout::default()
    };
    let fp8 = estimate(&s, &l).stages[0].weights_bytes;
    assert_eq!(copies - fp8, 2.0 * 6_476_005_376.0);
    assert_eq!(fp8, 2.0 * P);
}

#[test]
fn hidden_dropout_keeps_two_masks_per_layer_attention_dropout_none_with_flash() {
    // Llama 3.1 8B, s 4096, b 1, TP2 with sequence parallelism: a 1-byte mask of s*b*h/t after
    // the attention block and after the MLP.
    let s = scenario("llama3.1-8b", "h100-sxm", 8, 4096, 8);
    let base = Layout {
        tp: 2,
        attention_dropout: Fraction::ZERO,
        hidden_dropout: Fraction::ZERO,
        ..Layout::default()
    };
    let flash = MemoryOptions::default();
    let bytes = |l: &Layout| layer_activation_bytes(&s, l, &flash, LayerKind::Dense, Keep::All);
    let none = bytes(&base);
    let hidden = bytes(&Layout {
        hidden_dropout: Fraction::new(0.1),
        ..base.clone()
    });
    assert_eq!(hidden - none, 2.0 * 4096.0 * 4096.0 / 2.0);
    // Attention dropout under flash attention: the mask is regenerated, nothing kept.
    let attention = bytes(&Layout {
        attention_dropout: Fraction::new(0.1),
        ..base.clone()
    });
    assert_eq!(attention, none);
    // Without flash: the mask (1 byte) and the dropped-out probabilities (2 bytes) per score,
    // a*s*s*b/t each.
    let plain = MemoryOptions {
        flash_attention: false,
    };
    let with = |l: &Layout| layer_activation_bytes(&s, l, &plain, LayerKind::Dense, Keep::All);
    let scores = 32.0 * 4096.0 * 4096.0 / 2.0;
    assert_eq!(
        with(&Layout {
            attention_dropout: Fraction::new(0.1),
            ..base.clone()
        }) - with(&base),
        3.0 * scores
    );
    // Megatron's default (0.1 for both) is the layout default.
    assert_eq!(Layout::default().hidden_dropout, Fraction::new(0.1));
    assert_eq!(Layout::default().attention_dropout, Fraction::new(0.1));
}

#[test]
fn activation_offload_keeps_one_offloaded_layer_on_the_gpu() {
    // Qwen3-30B-A3B on 16 H100, TP2 EP4 PP1 (Megatron-Bridge's activation-offload experiment,
    // memory.csv MB-O7): offloading 24 of 48 layers keeps 24 layers' activations plus one
    // layer in transit.
    let s = scenario("qwen3-30b-a3b", "h100-sxm", 16, 4096, 32);
    let l = Layout {
        tp: 2,
        ep: 4,
        micro_batch_size: 2,
        attention_dropout: Fraction::ZERO,
        hidden_dropout: Fraction::ZERO,
        ..Layout::default()
    };
    let flash = MemoryOptions::default();
    let per_layer = layer_activation_bytes(&s, &l, &flash, LayerKind::Moe, Keep::All);
    let all = estimate(&s, &l).stages[0].activations_bytes;
    let off = estimate(
        &s,
        &Layout {
            activation_offload_layers: 24,
            ..l.clone()
        },
    )
    .stages[0]
        .activations_bytes;
    assert!(
        ((all - off) - 23.0 * per_layer).abs() < 1.0,
        "{}",
        all - off
    );
}

#[test]
fn communicator_buffers_are_counted_per_process_group() {
    // Llama 3.1 70B on 64 GPUs, TP4 PP8 (DP2): TP, DP and PP communicators; with CP2 (DP1)
    // TP, CP, DP x CP, PP. Each holds NCCL's 9.19 MiB of buffers per channel and connection.
    let s = scenario("llama3.1-70b", "h100-sxm", 64, 8192, 128);
    let l = Layout {
        tp: 4,
        pp: 8,
        ..Layout::default()
    };
    assert_eq!(communicators(&s, &l), 3);
    let cp = Layout { cp: 2, ..l.clone() };
    assert_eq!(communicators(&s, &cp), 4);
    let st = estimate(&s, &l).stages[0].clone();
    assert_eq!(st.communicator_bytes, 3.0 * COMMUNICATOR_BYTES);
    // 9.1875 MiB x 16 channels x 2 connections.
    assert_eq!(st.communicator_bytes / 3.0 / 1024f64.powi(2), 294.0);
}

fn flex(backend: FlexBackend, ep: u32) -> Layout {
    Layout {
        ep,
        moe: MoeOptions {
            token_dispatcher: TokenDispatcher::Flex,
            flex_backend: Some(backend),
            ..MoeOptions::default()
        },
        ..Layout::default()
    }
}

#[test]
fn deepep_buffers_are_its_size_hints() {
    // deepseek-ai/DeepEP csrc/legacy/config.hpp get_nvl_buffer_size_hint, by hand for
    // DeepSeek-V3 (hidden 7168, BF16: 14,336 bytes) on 8 ranks with Megatron's 20 SMs
    // (10 channels, 8 NVLink ranks, 1 RDMA rank, 256-token receive chunks):
    // 10*8*(2*1+3)*4 = 1,600 + 10*8*256 * (14,336 + 8 source meta + 128*(8+4) top-k + 128*4
    // scales = 16,392) = 335,708,160 -> 335,709,760, rounded up to 128: 335,709,824.
    let c8 = deepep_config(&DEEPEP_CONFIGS, 8);
    assert_eq!(
        deepep_nvl_bytes(c8, MEGATRON_DEEPEP_SMS, 14_336.0, 8),
        335_709_824.0
    );
    assert_eq!(deepep_rdma_bytes(c8, MEGATRON_DEEPEP_SMS, 14_336.0, 8), 0.0);
    // 32 ranks (4 RDMA ranks; 288-token NVLink and 128-token RDMA chunks):
    // NVLink 10*8*(2*4+3)*4 = 3,520 + 10*8*288*16,392 = 377,675,200 -> 377,675,264;
    // RDMA 10*4*(8*2+2)*2*4 = 5,760 + 10*4*128 * 2*(16,392 + 16 int4) = 168,017,920 ->
    // 168,023,680 (a multiple of 128).
    let c32 = deepep_config(&DEEPEP_CONFIGS, 32);
    assert_eq!(
        deepep_nvl_bytes(c32, MEGATRON_DEEPEP_SMS, 14_336.0, 32),
        377_675_264.0
    );
    assert_eq!(
        deepep_rdma_bytes(c32, MEGATRON_DEEPEP_SMS, 14_336.0, 32),
        168_023_680.0
    );
    // A size the table lacks takes the next larger row (DeepEP refuses it at start-up).
    assert_eq!(deepep_config(&DEEPEP_CONFIGS, 12).ranks, 16);
    assert_eq!(deepep_config(&DEEPEP_CONFIGS, 512).ranks, 160);
    assert_eq!(deepep_config(&PRIMUS_TURBO_CONFIGS, 48).ranks, 64);

    // In the estimate: DeepSeek-V3 on 64 H100, EP8 with DeepEP; none with alltoall.
    let s = scenario("deepseek-v3", "h100-sxm", 64, 4096, 64);
    let deepep = flex(FlexBackend::Deepep, 8);
    assert_eq!(dispatcher_bytes(&s, &deepep), 335_709_824.0);
    let alltoall = Layout {
        ep: 8,
        moe: MoeOptions {
            token_dispatcher: TokenDispatcher::Alltoall,
            ..MoeOptions::default()
        },
        ..Layout::default()
    };
    assert_eq!(dispatcher_bytes(&s, &alltoall), 0.0);
    // Outside PyTorch's allocator: in the total and the other bytes, not in reserved.
    let with = estimate(&s, &deepep).stages[0].clone();
    let without = estimate(&s, &alltoall).stages[0].clone();
    assert_eq!(with.dispatcher_bytes, 335_709_824.0);
    assert_eq!(without.dispatcher_bytes, 0.0);
    assert_eq!(
        with.total_bytes,
        with.reserved_bytes + with.communicator_bytes + with.dispatcher_bytes
    );
    assert_eq!(with.reserved_bytes, without.reserved_bytes);
    assert_eq!(with.total_bytes - without.total_bytes, 335_709_824.0);
    // A dense model has no dispatcher whatever the options say.
    assert_eq!(dispatcher_bytes(&llama2_7b(), &deepep), 0.0);
}

#[test]
fn primus_turbo_deepep_buffers_use_its_cu_count() {
    // AMD-AGI/Primus-Turbo config.hpp (the same hint) with EPBufferConfig's 32 CUs (16
    // channels), DeepSeek-V2-Lite (hidden 2048: 4,096 bytes) on 8 MI355X:
    // 16*8*5*4 = 2,560 + 16*8*256 * (4,096 + 8 + 1,536 + 512 = 6,152) = 201,588,736 ->
    // 201,591,296 (a multiple of 128).
    let s = scenario("deepseek-v2-lite", "mi355x", 8, 4096, 64);
    let l = flex(FlexBackend::PrimusTurboDeepep, 8);
    assert_eq!(PRIMUS_TURBO_DEEPEP_CUS, 32);
    assert_eq!(dispatcher_bytes(&s, &l), 201_591_296.0);
    // With `flexNumSms` 64 (`turbo_deepep_num_cu: 64`, Primus's MI300X example configs): 32
    // channels, 32*8*5*4 = 5,120 + 32*8*256*6,152 = 403,177,472 -> 403,182,592 B.
    let mut wide = l.clone();
    wide.moe.flex_num_sms = Some(64);
    assert_eq!(dispatcher_bytes(&s, &wide), 403_182_592.0);
}

#[test]
fn hybridep_buffers_hold_the_worst_case_of_the_group() {
    // DeepEP hybrid-ep branch csrc/hybrid_ep/buffer/intranode.cu and internode_doca.cu, by
    // hand for Qwen3-30B-A3B (hidden 2048, 128 experts) on 16 H100, EP16 (2 NVLink domains of
    // 8, 8 local experts), 4,096 tokens per rank:
    // NVLink 4,096*8*2 tokens * (2048*2 + 8*8*4 probabilities + 2048/128*4 scales = 4,416)
    //   = 289,406,976;
    // RDMA dispatch 4,096 * (4,096 + 8*8*2*4 + 64) + 4,096*1 * 4,416 = 37,224,448;
    // RDMA combine 2 * 4,096*1 * (4,096 + 256) = 35,651,584; total 362,283,008.
    assert_eq!(hybridep_bytes(4096, 2048.0, 8, 2, 8.0), 362_283_008.0);
    let s = scenario("qwen3-30b-a3b", "h100-sxm", 16, 4096, 16);
    let l = flex(FlexBackend::Hybridep, 16);
    assert_eq!(dispatcher_bytes(&s, &l), 362_283_008.0);
    // One domain: the NVLink buffers alone (EP8 on 8 GPUs: 4,096*8 tokens of 4,096 + 16*8*4
    // + 64 bytes).
    let s8 = scenario("qwen3-30b-a3b", "h100-sxm", 8, 4096, 8);
    let l8 = flex(FlexBackend::Hybridep, 8);
    assert_eq!(
        dispatcher_bytes(&s8, &l8),
        4096.0 * 8.0 * (4096.0 + 16.0 * 8.0 * 4.0 + 64.0)
    );
}

#[test]
fn expandable_segments_change_the_allocator_overhead_term() {
    let s = llama2_7b();
    let l = Layout::default();
    let off = estimate(&s, &l).stages[0].clone();
    assert_eq!(
        off.fragmentation_bytes,
        s.hardware.overheads.allocator_fragmentation * off.allocated_bytes
    );
    let on = estimate(
        &s,
        &Layout {
            expandable_segments: true,
            ..l
        },
    )
    .stages[0]
        .clone();
    assert_eq!(
        on.fragmentation_bytes,
        primus_oracle::memory::allocator::EXPANDABLE_SEGMENTS_OVERHEAD * on.allocated_bytes
    );
}

#[test]
fn memory_option_rules_name_the_field() {
    let s = llama2_7b();
    let rule = |l: Layout| l.check(&s).map_err(|e| (e.rule, e.field)).err();
    assert_eq!(
        rule(Layout {
            main_grads_dtype: OptimizerDtype::Bf16,
            ..Layout::default()
        }),
        Some((
            "optimizer-dtype-needs-pao",
            "spec.parallelism.mainGradsDtype".to_string()
        ))
    );
    assert_eq!(
        rule(Layout {
            precision_aware_optimizer: true,
            main_params_dtype: OptimizerDtype::Bf16,
            ..Layout::default()
        })
        .unwrap()
        .0,
        "optimizer-dtype"
    );
    assert_eq!(
        rule(Layout {
            precision_aware_optimizer: true,
            distributed_optimizer: false,
            ..Layout::default()
        })
        .unwrap()
        .0,
        "pao-needs-distributed-optimizer"
    );
    assert_eq!(
        rule(Layout {
            hidden_dropout: Fraction::new(1.0),
            ..Layout::default()
        })
        .unwrap()
        .0,
        "dropout-range"
    );
    assert_eq!(
        rule(Layout {
            optimizer_cpu_offload: true,
            optimizer_offload_fraction: Fraction::new(1.5),
            ..Layout::default()
        })
        .unwrap()
        .0,
        "offload-fraction-range"
    );
    assert_eq!(
        rule(Layout {
            fp8_param_gather: true,
            ..Layout::default()
        })
        .unwrap()
        .0,
        "fp8-param-gather-needs-fp8"
    );
    for (l, id) in [
        (
            Layout {
                activation_offload_layers: 32,
                ..Layout::default()
            },
            "activation-offload-layers",
        ),
        (
            Layout {
                activation_offload_layers: 4,
                recompute: Recompute::Selective,
                ..Layout::default()
            },
            "activation-offload-no-recompute",
        ),
    ] {
        assert_eq!(rule(l).unwrap().0, id);
    }
    let s64 = scenario("llama2-7b", "h100-sxm", 16, 4096, 16);
    let pp = Layout {
        pp: 2,
        activation_offload_layers: 4,
        ..Layout::default()
    };
    assert_eq!(pp.check(&s64).unwrap_err().rule, "activation-offload-no-pp");
    // NaN never passes.
    assert!(
        rule(Layout {
            attention_dropout: Fraction::new(f64::NAN),
            ..Layout::default()
        })
        .is_some()
    );
}

#[test]
fn shared_expert_side_streams_keep_their_backward_buffers_reserved() {
    // DeepSeek-V2-Lite on 8 MI355X, TP1 PP1 EP8, MBS 1, alltoall with shared-expert overlap
    // (memory.csv MP-V1). Per token, one stream's pool keeps the shared experts' backward
    // buffers: the gradients of fc1's output (2 x 2,816), of the activation's output (2,816)
    // and of the input (2,048), at 2 bytes: 20,992 B, over the micro-batch's 4,096 tokens.
    // Megatron-Core before 0.18 gives each of the 26 MoE layers its own stream; later ones
    // share one; without the overlap there is none. Reserved only: allocated is unchanged.
    let s = scenario("deepseek-v2-lite", "mi355x", 8, 4096, 64);
    let mut base = Layout {
        ep: 8,
        ..Layout::default()
    };
    base.moe.token_dispatcher = TokenDispatcher::Alltoall;
    base.moe.grouped_gemm = primus_oracle::layout::GroupedGemm::Legacy;
    base.moe.force_load_balancing = true;
    let mut shared = base.clone();
    shared.moe.shared_expert_overlap = true;
    let mut per_layer = shared.clone();
    per_layer.moe.shared_expert_stream_per_layer = true;
    let stage = |l: &Layout| {
        l.check(&s).expect("legal");
        estimate(&s, l).stages[0].clone()
    };
    let one = 20_992.0 * 4096.0;
    let (none, shared, per_layer) = (stage(&base), stage(&shared), stage(&per_layer));
    assert_eq!(none.side_stream_pool_bytes, 0.0);
    assert_eq!(shared.side_stream_pool_bytes, one);
    assert_eq!(per_layer.side_stream_pool_bytes, 26.0 * one);
    for st in [&shared, &per_layer] {
        assert_eq!(st.allocated_bytes, none.allocated_bytes);
        assert_eq!(
            st.reserved_bytes - st.side_stream_pool_bytes,
            none.reserved_bytes
        );
        assert_eq!(st.total_bytes - st.side_stream_pool_bytes, none.total_bytes);
    }
    // 2.08 GiB per unit of MBS with per-layer streams: 25.0 GiB at MBS 12 (MP-V6), where the
    // run without the overlap measured 24.6 GiB less (MP-V7).
    let s12 = scenario("deepseek-v2-lite", "mi355x", 8, 4096, 768);
    let mbs12 = Layout {
        micro_batch_size: 12,
        ..per_layer_layout(&base)
    };
    mbs12.check(&s12).expect("legal");
    let gib = estimate(&s12, &mbs12).stages[0].side_stream_pool_bytes / (1u64 << 30) as f64;
    assert!((gib - 25.0).abs() < 0.05, "{gib}");
    // Per-layer streams need the overlap.
    let mut orphan = base.clone();
    orphan.moe.shared_expert_stream_per_layer = true;
    let e = orphan
        .check(&s)
        .expect_err("per-layer streams without the overlap");
    assert_eq!(
        (e.rule, e.field.as_str()),
        (
            "shared-streams-need-overlap",
            "spec.parallelism.moe.sharedExpertStreamPerLayer"
        )
    );
    // The tuner's screen leaves the pools out (the MoE choice can drop the overlap): a lower
    // bound of the peak, exact without them.
    let (screen, _) = primus_oracle::memory::peak_bytes_before_dispatcher(&s12, &mbs12);
    let (peak, _) = primus_oracle::memory::peak_bytes(&s12, &mbs12);
    assert!(
        (peak - screen - 26.0 * 12.0 * one).abs() < 1.0,
        "{peak} {screen}"
    );
    let (screen, _) = primus_oracle::memory::peak_bytes_before_dispatcher(&s, &base);
    assert_eq!(screen, primus_oracle::memory::peak_bytes(&s, &base).0);
}

fn per_layer_layout(base: &Layout) -> Layout {
    let mut l = base.clone();
    l.moe.shared_expert_overlap = true;
    l.moe.shared_expert_stream_per_layer = true;
    l
}
