//! Bytes per parameter of the model state: the weight (and its FP8 forms), the gradient
//! buffer, and the optimizer's states, under the layout's gradient precision, precision-aware
//! optimizer, optimizer CPU offload and FP8 parameters. The caller shards them (the optimizer
//! bytes over the distributed-optimizer group, everything over the FSDP group).
//!
//! Megatron-Core, term by term:
//! - gradient buffer (`DistributedDataParallel`): FP32 when gradients are accumulated and
//!   reduced in FP32, which with `--bf16` is the default unless `--grad-reduce-in-bf16` or the
//!   precision-aware optimizer's `--main-grads-dtype bf16` says otherwise
//!   (`megatron/training/arguments.py`: accumulate in FP32 only with FP32 main grads);
//! - without the precision-aware optimizer the distributed optimizer keeps an FP32 master
//!   shard and Adam's two FP32 moments (12 bytes), and with a BF16 gradient buffer casts the
//!   gradient shard to FP32 for the update (`distrib_optimizer.py`,
//!   `shard_main_param.grad = shard_model_grad.float()`). That copy lives from the optimizer
//!   step to the next step's `optimizer.zero_grad()` (`training.py` `train_step`, before its
//!   forward passes; `DistributedOptimizer.zero_grad` sets the shard gradients to None "as a
//!   memory optimization"), so it never meets the activations: it is
//!   [`StateBytes::step_grad_copy`], not part of the states the forward and backward passes
//!   run beside;
//! - with it (`--use-precision-aware-optimizer`) Transformer Engine's FusedAdam holds the master
//!   weights in `--main-params-dtype` (FP32 master of BF16 weights stored as their 16-bit
//!   remainders, `store_param_remainders`, TE >= 2.1) and the moments in `--exp-avg-dtype` /
//!   `--exp-avg-sq-dtype`, and reads the gradient buffer in place (`decoupled_grad`): no copy.
//!   Except under an FP8 recipe other than delayed scaling with an FP32 master and no CPU
//!   offload (`optimizer_config.py`: `use_precision_aware_optimizer_no_fp8_or_ds_fp8` false):
//!   then MCore keeps the FP32 master itself (`distrib_optimizer.py`,
//!   `shard_model_param.clone().float()`, 4 bytes, no remainders) and hands the optimizer
//!   `param.grad`, the FP32 cast of a BF16 gradient shard (`shard_model_grad.float()`): the
//!   moments stay in their dtypes, the step makes the copy ([`te_holds_master`]);
//! - optimizer CPU offload (`HybridDeviceOptimizer`, `cpu_offloading/hybrid_optimizer.py`): the
//!   first `fraction` of the optimizer's parameters get a pinned CPU copy and their Adam states
//!   live on the CPU. Without the precision-aware optimizer the optimizer's parameters are the
//!   MCore FP32 master shards, which stay referenced on the GPU: only the two moments (8 bytes)
//!   leave (Megatron-Bridge's measured sweep: 3.8 GB less per 25% on Qwen3-30B-A3B, 8 bytes x
//!   ~1.9e9 sharded parameters, oracle/tests/data/memory.csv MB-O1..O5). With it they are the
//!   BF16 shards: the GPU part gets an FP32 copy and FP32 moments (12 bytes), the offloaded
//!   part nothing;
//! - FP8 (Transformer Engine): without FP8 parameters every GEMM weight keeps, beside its BF16
//!   weight, an FP8 copy and its transpose for the backward GEMMs (2 bytes); with
//!   `--fp8-param-gather` the weight itself is the FP8 tensor (1 byte) with its transpose
//!   (1 byte), and no BF16 weight remains.

use crate::backend::Fp8Recipe;
use crate::layout::{Layout, OptimizerDtype};

/// BF16 model weight, bytes per parameter.
pub const WEIGHT_BYTES: f64 = 2.0;
/// FP32 main gradient (Megatron accumulates and reduces gradients in FP32 with BF16 training),
/// bytes per parameter.
pub const MAIN_GRAD_BYTES: f64 = 4.0;
/// BF16 gradient (`--grad-reduce-in-bf16`, or `--main-grads-dtype bf16` with the
/// precision-aware optimizer), bytes per parameter.
pub const BF16_GRAD_BYTES: f64 = 2.0;
/// Adam optimizer state: FP32 master weight 4 + first moment 4 + second moment 4, bytes per
/// parameter.
pub const OPTIMIZER_STATE_BYTES: f64 = 12.0;
/// FP32 master weight, bytes per parameter.
pub const FP32_MASTER_BYTES: f64 = 4.0;
/// Adam's two FP32 moments, bytes per parameter (what CPU offload moves when the FP32 master
/// stays on the GPU).
pub const FP32_MOMENTS_BYTES: f64 = 8.0;
/// With a BF16 gradient buffer the optimizer casts its gradient shard to an FP32 copy for the
/// update, bytes per parameter (Megatron-LM `docs/source/api-guide/dist_optimizer.md`, the
/// 16-bit gradient rows: 4 + 16/d with the distributed optimizer, 20 without).
pub const FP32_GRAD_COPY_BYTES: f64 = 4.0;
/// The FP32 master of a BF16 weight stored as the 16 bits the BF16 weight lacks
/// (`store_param_remainders`, Transformer Engine FusedAdam >= 2.1), bytes per parameter.
pub const PARAM_REMAINDER_BYTES: f64 = 2.0;
/// Transformer Engine FP8 training keeps, per GEMM weight, an FP8 copy (1 byte) and its
/// transpose (1 byte) for the backward GEMMs, cached across micro-batches.
pub const FP8_WEIGHT_COPY_BYTES: f64 = 2.0;
/// With FP8 parameters (`--fp8-param-gather`) a GEMM weight is its FP8 data (1 byte) and its
/// transpose (1 byte): bytes per parameter, instead of BF16 2 + the FP8 copies 2.
pub const FP8_PARAM_BYTES: f64 = 2.0;

/// Bytes per parameter of the model state under a layout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StateBytes {
    /// A parameter that is not a GEMM weight (norms, embeddings, router, biases).
    pub weight: f64,
    /// A GEMM weight, with its FP8 forms under FP8 training.
    pub linear_weight: f64,
    /// The gradient buffer.
    pub grad: f64,
    /// The optimizer's states on the GPU, per parameter of its shard.
    pub optimizer: f64,
    /// The FP32 gradient copy the optimizer makes of its shard for the update, per parameter
    /// of the shard: live only from the optimizer step to the next step's `zero_grad`.
    pub step_grad_copy: f64,
}

/// The gradient buffer is FP32: accumulation in FP32 (no `--grad-reduce-in-bf16`) and FP32
/// main gradients.
pub fn fp32_grad_buffer(l: &Layout) -> bool {
    l.grad_reduce_in_fp32 && l.main_grads_dtype.is_fp32()
}

/// Bytes per parameter of the weights, gradients and optimizer states of layout `l`; `fp8`
/// when the GEMMs run in FP8.
pub fn state_bytes(l: &Layout, fp8: bool) -> StateBytes {
    let fp32_grads = fp32_grad_buffer(l);
    let grad = if fp32_grads {
        MAIN_GRAD_BYTES
    } else {
        BF16_GRAD_BYTES
    };
    let linear_weight = match (fp8, l.fp8_param_gather) {
        (true, true) => FP8_PARAM_BYTES,
        (true, false) => WEIGHT_BYTES + FP8_WEIGHT_COPY_BYTES,
        (false, _) => WEIGHT_BYTES,
    };
    let (optimizer, step_grad_copy) = optimizer_bytes(l, fp32_grads, fp8);
    StateBytes {
        weight: WEIGHT_BYTES,
        linear_weight,
        grad,
        optimizer,
        step_grad_copy,
    }
}

/// Whether, with the precision-aware optimizer, Transformer Engine's FusedAdam holds the master
/// weights and reads the gradient buffer in place: Megatron-Core's
/// `use_precision_aware_optimizer_no_fp8_or_ds_fp8` (`optimizer_config.py`), true unless the
/// master is FP32, the GEMMs run an FP8 recipe other than delayed scaling (whose casts TE's
/// Adam kernel cannot do) and the optimizer is not offloaded. `fp8` when the job trains in FP8.
pub fn te_holds_master(l: &Layout, fp8: bool) -> bool {
    l.main_params_dtype != OptimizerDtype::Fp32
        || !fp8
        || l.fp8_recipe() == Fp8Recipe::Delayed
        || l.optimizer_cpu_offload
}

/// The optimizer's GPU bytes per parameter of its shard (see the module documentation): the
/// states it keeps, and the FP32 gradient copy of the step.
fn optimizer_bytes(l: &Layout, fp32_grads: bool, fp8: bool) -> (f64, f64) {
    let grad_copy = if fp32_grads {
        0.0
    } else {
        FP32_GRAD_COPY_BYTES
    };
    if l.optimizer_cpu_offload {
        let on_gpu = 1.0 - l.optimizer_offload_fraction.get().clamp(0.0, 1.0);
        return if l.precision_aware_optimizer {
            // HybridDeviceOptimizer over BF16 shards: FP32 copy + FP32 moments (and an FP32
            // gradient for the update) for the part left on the GPU.
            (
                on_gpu * (FP32_MASTER_BYTES + FP32_MOMENTS_BYTES),
                on_gpu * grad_copy,
            )
        } else {
            // Over MCore's FP32 master shards, which stay on the GPU.
            (FP32_MASTER_BYTES + on_gpu * FP32_MOMENTS_BYTES, grad_copy)
        };
    }
    let moments = l.exp_avg_dtype.bytes() + l.exp_avg_sq_dtype.bytes();
    if l.precision_aware_optimizer && !te_holds_master(l, fp8) {
        // MCore's FP32 master (a full copy, no remainders) and the cast gradient of the step.
        (FP32_MASTER_BYTES + moments, grad_copy)
    } else if l.precision_aware_optimizer {
        // The BF16 gradient buffer is read in place (`decoupled_grad`): no copy.
        (master_bytes(l) + moments, 0.0)
    } else {
        (OPTIMIZER_STATE_BYTES, grad_copy)
    }
}

/// The precision-aware optimizer's master weight, bytes per parameter: an FP32 master of BF16
/// weights is stored as remainders; FP8 parameters keep MCore's full FP32 master.
fn master_bytes(l: &Layout) -> f64 {
    match l.main_params_dtype {
        OptimizerDtype::Fp32 if l.fp8_param_gather => FP32_MASTER_BYTES,
        OptimizerDtype::Fp32 => PARAM_REMAINDER_BYTES,
        d => d.bytes(),
    }
}
