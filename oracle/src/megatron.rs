//! Megatron-LM command-line flags: written into the PyTorchJobs the tuner and the operator
//! create, and read back by the admission webhook from jobs users submit. One table of flag
//! names serves both directions, so what we write is exactly what we can parse.
//!
//! Flag names follow Megatron-LM's `megatron/training/arguments.py` (core_r0.12+); the
//! zero-bubble flag is Primus-Megatron's (AMD's fork), FSDP is Megatron's torch FSDP2 switch.

use std::collections::BTreeMap;

use crate::bounds::limits;
mod moe;

pub use moe::{FUSED_GROUPED_MLP_ENV, moe_flag};

/// The checkpoint format Megatron-FSDP asserts (`arguments.py`: "Megatron-FSDP requires the
/// `fsdp_dtensor` checkpointing format"), written with `--use-megatron-fsdp`.
pub const FSDP_CKPT_FORMAT: &str = "fsdp_dtensor";

/// The number of hardware work queues per GPU the CUDA runtime opens, which Megatron-LM
/// constrains (`megatron/training/arguments.py`): torch FSDP2 and Megatron-FSDP assert it is
/// not 1; TP or CP > 1 on pre-Blackwell GPUs asserts it is 1 unless FSDP or the EP overlap
/// (`--overlap-moe-expert-parallel-comm`) is on.
pub const MAX_CONNECTIONS_ENV: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
/// NCCL's CUDA-graph buffer registration, which Megatron-LM requires off (`0`) when Transformer
/// Engine's CUDA graphs run with the allocator's expandable segments (`arguments.py`: "to
/// avoid illegal memory access").
pub const NCCL_GRAPH_REGISTER_ENV: &str = "NCCL_GRAPH_REGISTER";

/// The `CUDA_DEVICE_MAX_CONNECTIONS` a job of layout `l` runs with when its template does not
/// set it, as Megatron-Bridge's performance scripts pick it (`scripts/performance/utils/
/// overrides.py`) within Megatron-LM's asserts: 1 with TP or CP > 1 (neither FSDP nor the EP
/// overlap on: the value every GPU generation accepts), 32 with the DeepEP or HybridEP
/// dispatcher, 8 otherwise (CUDA's own default). Never 1 under FSDP.
pub fn max_connections(l: &Layout) -> &'static str {
    use crate::backend::FlexBackend;
    if (l.tp > 1 || l.cp > 1) && !l.fsdp && !l.moe.ep_overlap {
        "1"
    } else if l.moe.token_dispatcher == crate::layout::TokenDispatcher::Flex
        && matches!(
            l.moe.flex_backend,
            None | Some(FlexBackend::Deepep) | Some(FlexBackend::Hybridep)
        )
    {
        "32"
    } else {
        "8"
    }
}

/// The environment variable Megatron-LM requires beside `--fine-grained-activation-offloading`
/// with Transformer Engine 2.10 or later (`megatron/training/arguments.py`: the run asserts
/// `NVTE_CPU_OFFLOAD_V1 == 1`, which keeps TE's CPU offload from moving weights); the job
/// writer sets it to 1 with the flag. Older Transformer Engines ignore it.
pub const FINE_GRAINED_OFFLOAD_ENV: &str = "NVTE_CPU_OFFLOAD_V1";

use crate::error::FieldError;
use crate::layout::{
    CrossEntropyFusion, Fraction, Layout, MEGATRON_DROPOUT, OffloadModule, OffloadSet,
    OptimizerDtype, Recompute, RecomputeModule, Schedule,
};
use crate::model::{Activation, MlaConfig, ModelCard, MoeConfig, Norm};
use crate::parse::quote;
use crate::precision::Precision;
use crate::scenario::{Scenario, Training};

/// Flag names, one constant each, shared by the writer and the parser.
pub mod flag {
    pub const TP: &str = "--tensor-model-parallel-size";
    pub const PP: &str = "--pipeline-model-parallel-size";
    pub const VPP_LAYERS: &str = "--num-layers-per-virtual-pipeline-stage";
    pub const VPP_SIZE: &str = "--virtual-pipeline-model-parallel-size";
    pub const CP: &str = "--context-parallel-size";
    pub const EP: &str = "--expert-model-parallel-size";
    pub const ETP: &str = "--expert-tensor-parallel-size";
    pub const MBS: &str = "--micro-batch-size";
    pub const GBS: &str = "--global-batch-size";
    pub const SEQ: &str = "--seq-length";
    pub const RECOMPUTE_GRANULARITY: &str = "--recompute-granularity";
    pub const RECOMPUTE_METHOD: &str = "--recompute-method";
    pub const RECOMPUTE_NUM_LAYERS: &str = "--recompute-num-layers";
    /// Takes a list: the values up to the next flag.
    pub const RECOMPUTE_MODULES: &str = "--recompute-modules";
    /// Primus-Megatron's per-layer full recompute (`recompute_layer_ids`, global layer
    /// indices; `primus/backends/megatron/patches/recompute_layer_patches.py`): a list, read
    /// comma- or space-separated.
    pub const RECOMPUTE_LAYER_IDS: &str = "--recompute-layer-ids";
    pub const DIST_OPT: &str = "--use-distributed-optimizer";
    pub const SP: &str = "--sequence-parallel";
    pub const FSDP: &str = "--use-torch-fsdp2";
    /// Off under torch FSDP2, which asserts it (Megatron's default is on).
    pub const NO_GRAD_ACCUM_FUSION: &str = "--no-gradient-accumulation-fusion";
    /// The checkpoint format; Megatron-FSDP asserts `fsdp_dtensor` ([`super::FSDP_CKPT_FORMAT`]).
    pub const CKPT_FORMAT: &str = "--ckpt-format";
    pub const ZERO_BUBBLE: &str = "--enable-zero-bubble";
    pub const FIRST_STAGE_LAYERS: &str = "--decoder-first-pipeline-num-layers";
    pub const LAST_STAGE_LAYERS: &str = "--decoder-last-pipeline-num-layers";
    pub const PIPELINE_LAYOUT: &str = "--pipeline-model-parallel-layout";
    pub const VPP_STAGES: &str = "--num-virtual-stages-per-pipeline-rank";
    pub const ACCOUNT_EMBEDDING: &str = "--account-for-embedding-in-pipeline-split";
    pub const ACCOUNT_LOSS: &str = "--account-for-loss-in-pipeline-split";
    pub const TP_COMM_OVERLAP: &str = "--tp-comm-overlap";
    pub const OVERLAP_GRAD_REDUCE: &str = "--overlap-grad-reduce";
    pub const OVERLAP_PARAM_GATHER: &str = "--overlap-param-gather";
    pub const GRAD_REDUCE_IN_BF16: &str = "--grad-reduce-in-bf16";
    pub const BF16: &str = "--bf16";
    pub const FP8_FORMAT: &str = "--fp8-format";
    pub const NUM_LAYERS: &str = "--num-layers";
    pub const HIDDEN: &str = "--hidden-size";
    pub const FFN_HIDDEN: &str = "--ffn-hidden-size";
    pub const HEADS: &str = "--num-attention-heads";
    pub const GQA: &str = "--group-query-attention";
    pub const QUERY_GROUPS: &str = "--num-query-groups";
    pub const KV_CHANNELS: &str = "--kv-channels";
    pub const VOCAB: &str = "--padded-vocab-size";
    pub const VOCAB_ALT: &str = "--vocab-size";
    pub const SWIGLU: &str = "--swiglu";
    pub const NORMALIZATION: &str = "--normalization";
    pub const UNTIE: &str = "--untie-embeddings-and-output-weights";
    pub const QK_LAYERNORM: &str = "--qk-layernorm";
    pub const NUM_EXPERTS: &str = "--num-experts";
    pub const MOE_TOPK: &str = "--moe-router-topk";
    pub const MOE_FFN_HIDDEN: &str = "--moe-ffn-hidden-size";
    pub const MOE_SHARED_FFN: &str = "--moe-shared-expert-intermediate-size";
    pub const MOE_FIRST_DENSE: &str = "--moe-first-k-dense-replace";
    pub const MOE_CAPACITY: &str = "--moe-expert-capacity-factor";
    pub const MLA: &str = "--multi-latent-attention";
    pub const Q_LORA: &str = "--q-lora-rank";
    pub const KV_LORA: &str = "--kv-lora-rank";
    pub const QK_HEAD_DIM: &str = "--qk-head-dim";
    pub const QK_POS_HEAD_DIM: &str = "--qk-pos-emb-head-dim";
    pub const V_HEAD_DIM: &str = "--v-head-dim";
    pub const MTP_LAYERS: &str = "--mtp-num-layers";
    // Optimizer and activation memory options (layout/memory_options.rs).
    pub const ATTENTION_DROPOUT: &str = "--attention-dropout";
    pub const HIDDEN_DROPOUT: &str = "--hidden-dropout";
    pub const PRECISION_AWARE_OPTIMIZER: &str = "--use-precision-aware-optimizer";
    pub const MAIN_GRADS_DTYPE: &str = "--main-grads-dtype";
    pub const MAIN_PARAMS_DTYPE: &str = "--main-params-dtype";
    pub const EXP_AVG_DTYPE: &str = "--exp-avg-dtype";
    pub const EXP_AVG_SQ_DTYPE: &str = "--exp-avg-sq-dtype";
    pub const OPTIMIZER_CPU_OFFLOAD: &str = "--optimizer-cpu-offload";
    pub const OPTIMIZER_OFFLOAD_FRACTION: &str = "--optimizer-offload-fraction";
    /// Layer-level activation offload (TransformerConfig `cpu_offloading_num_layers`; a
    /// positive value turns `cpu_offloading` on).
    pub const CPU_OFFLOADING_NUM_LAYERS: &str = "--cpu-offloading-num-layers";
    /// Fine-grained activation offloading (TransformerConfig
    /// `fine_grained_activation_offloading`, `offload_modules`).
    pub const FINE_GRAINED_OFFLOAD: &str = "--fine-grained-activation-offloading";
    pub const OFFLOAD_MODULES: &str = "--offload-modules";
    pub const FP8_PARAM_GATHER: &str = "--fp8-param-gather";
    /// The fused vocab-parallel cross-entropy, and which implementation (`native`, `te`).
    pub const CE_FUSION: &str = "--cross-entropy-loss-fusion";
    pub const CE_FUSION_IMPL: &str = "--cross-entropy-fusion-impl";
}

/// Every flag the layout writer can write (and a job writer therefore owns), with whether it
/// takes a value, beyond the [`flag`] constants: the MoE and execution option flags.
pub fn option_flags() -> impl Iterator<Item = (&'static str, bool)> {
    moe::VALUED
        .iter()
        .map(|f| (*f, true))
        .chain(moe::SWITCHES.iter().map(|f| (*f, false)))
}

/// Environment variables that configure PyTorch's caching allocator (`expandable_segments`):
/// the CUDA name, the ROCm name, and the vendor-neutral name of PyTorch >= 2.7.
pub const ALLOC_CONF_ENV: [&str; 3] = [
    "PYTORCH_CUDA_ALLOC_CONF",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_ALLOC_CONF",
];

/// The allocator option the layout's `expandableSegments` sets.
pub const EXPANDABLE_SEGMENTS_OPTION: &str = "expandable_segments";

/// Whether an allocator configuration value (`expandable_segments:True,max_split_size_mb:512`)
/// turns expandable segments on (`None` when it does not mention them).
pub fn expandable_segments_in(conf: &str) -> Option<bool> {
    conf.split(',').rev().find_map(|opt| {
        let (k, v) = opt.split_once(':')?;
        (k.trim() == EXPANDABLE_SEGMENTS_OPTION).then(|| v.trim().eq_ignore_ascii_case("true"))
    })
}

/// `conf` with `expandable_segments` set as the layout says: added (`:True`) or removed.
pub fn with_expandable_segments(conf: &str, on: bool) -> String {
    let mut opts: Vec<&str> = conf
        .split(',')
        .map(str::trim)
        .filter(|o| {
            !o.is_empty()
                && o.split_once(':').map(|(k, _)| k.trim()) != Some(EXPANDABLE_SEGMENTS_OPTION)
        })
        .collect();
    let set = format!("{EXPANDABLE_SEGMENTS_OPTION}:True");
    if on {
        opts.insert(0, &set);
    }
    opts.join(",")
}

/// Memory-relevant Megatron flags the memory model does not model, with what each changes: a
/// job carrying one is admitted with a warning naming it, never denied on memory.
pub const UNMODELLED_MEMORY_FLAGS: &[(&str, &str)] = &[
    (
        "--activation-offload-fraction",
        "a partial fine-grained activation offload",
    ),
    (
        "--delta-offload-bytes-across-pp-ranks",
        "a fine-grained activation offload that varies over pipeline ranks",
    ),
    ("--cpu-offloading-weights", "weight offloading"),
    // The legacy CUDA-graph switches are not read into a layout (`--cuda-graph-impl` and
    // `--cuda-graph-modules` are, and `memory::graphs` models them).
    ("--enable-cuda-graph", "CUDA-graph memory pools"),
    ("--external-cuda-graph", "CUDA-graph memory pools"),
    // The legacy DeepEP switch is not read into a layout (`--moe-token-dispatcher-type flex`
    // with `--moe-flex-dispatcher-backend` is, and `memory::dispatcher` sizes its buffers).
    ("--moe-enable-deepep", "DeepEP dispatcher buffers"),
    ("--use-megatron-fsdp", "Megatron-FSDP sharding"),
    ("--use-custom-fsdp", "Megatron-FSDP sharding"),
    ("--use-nccl-ub", "NCCL user-buffer registration"),
    (
        "--num-distributed-optimizer-instances",
        "a partially sharded distributed optimizer",
    ),
    (
        "--reuse-grad-buf-for-mxfp8-param-ag",
        "MXFP8 parameter all-gather buffers",
    ),
];

/// Memory-relevant environment settings the memory model does not count and that can only add
/// memory: (variable, the value that matters, what it adds). A job whose container sets one is
/// warned, naming it; unlike [`UNMODELLED_MEMORY_FLAGS`] (whose effect may go either way) it
/// does not stop a denial: with it the prediction is a lower bound of the peak.
pub const UNMODELLED_MEMORY_ENV: &[(&str, &str, &str)] = &[(
    // ROCr (rocm-systems projects/rocr-runtime/runtime/docs/data/env_variables.rst, and
    // GpuAgent::AcquireQueueMainScratch): with it every scratch (private-segment) request is
    // sized for the whole device and stays assigned to its hardware queue until the process
    // exits, "not available to other queues or processes". AMD's Primus MoE scripts set it
    // (examples/moe_package, later Primus images globally); how much it holds depends on the
    // kernels' private-segment sizes, which nothing published states (memory.csv MP-V1..V4:
    // ~18.5 GiB of device-level memory the model does not account for, a candidate).
    "HSA_NO_SCRATCH_RECLAIM",
    "1",
    "ROCm scratch memory kept assigned to each hardware queue for the process's life, outside PyTorch's allocator",
)];

/// The settings of [`UNMODELLED_MEMORY_ENV`] among `vars` (name, value), each as
/// `NAME=value` with what it changes; the last value of a repeated name counts, as in a
/// container's environment. One pass, memory bounded by the table, not by `vars` (an
/// environment comes from an untrusted job).
pub fn unmodelled_memory_env<'a>(
    vars: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(String, &'static str)> {
    let mut set = [false; UNMODELLED_MEMORY_ENV.len()];
    for (name, value) in vars {
        if let Some(i) = UNMODELLED_MEMORY_ENV
            .iter()
            .position(|(n, _, _)| *n == name)
        {
            set[i] = value.trim() == UNMODELLED_MEMORY_ENV[i].1;
        }
    }
    UNMODELLED_MEMORY_ENV
        .iter()
        .zip(set)
        .filter(|(_, on)| *on)
        .map(|((name, value, what), _)| (format!("{name}={value}"), *what))
        .collect()
}

/// Flags that take no value.
const SWITCHES: &[&str] = &[
    flag::CE_FUSION,
    flag::PRECISION_AWARE_OPTIMIZER,
    flag::OPTIMIZER_CPU_OFFLOAD,
    flag::FP8_PARAM_GATHER,
    flag::FINE_GRAINED_OFFLOAD,
    "--cpu-offloading-weights",
    "--enable-cuda-graph",
    "--external-cuda-graph",
    "--moe-enable-deepep",
    "--use-megatron-fsdp",
    "--use-custom-fsdp",
    "--use-nccl-ub",
    "--reuse-grad-buf-for-mxfp8-param-ag",
    flag::DIST_OPT,
    flag::SP,
    flag::FSDP,
    flag::ZERO_BUBBLE,
    flag::ACCOUNT_EMBEDDING,
    flag::ACCOUNT_LOSS,
    flag::TP_COMM_OVERLAP,
    flag::OVERLAP_GRAD_REDUCE,
    flag::OVERLAP_PARAM_GATHER,
    flag::GRAD_REDUCE_IN_BF16,
    "--accumulate-allreduce-grads-in-fp32",
    flag::BF16,
    "--fp16",
    flag::GQA,
    flag::SWIGLU,
    flag::UNTIE,
    flag::QK_LAYERNORM,
    flag::MLA,
    "--use-flash-attn",
    "--use-mcore-models",
    "--no-masked-softmax-fusion",
    "--disable-bias-linear",
    "--add-qkv-bias",
    "--no-position-embedding",
    "--use-rotary-position-embeddings",
];

/// Megatron flags of a layout and training settings, in a stable order.
pub fn layout_args(s: &Scenario, l: &Layout) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut kv = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };
    kv(flag::TP, l.tp.to_string());
    kv(flag::PP, l.pp.to_string());
    if l.vpp > 1 {
        kv(flag::VPP_SIZE, l.vpp.to_string());
    }
    if let Some(n) = l.first_stage_layers {
        kv(flag::FIRST_STAGE_LAYERS, n.to_string());
    }
    if let Some(n) = l.last_stage_layers {
        kv(flag::LAST_STAGE_LAYERS, n.to_string());
    }
    if let Some(p) = &l.pipeline_layout {
        kv(flag::PIPELINE_LAYOUT, p.to_string());
    }
    kv(flag::CP, l.cp.to_string());
    if s.model.moe.is_some() {
        kv(flag::EP, l.ep.to_string());
        kv(flag::ETP, l.etp.to_string());
    }
    kv(flag::MBS, l.micro_batch_size.to_string());
    kv(flag::GBS, s.training.global_batch_size.to_string());
    kv(flag::SEQ, s.training.seq_length.to_string());
    match l.recompute {
        Recompute::None => {}
        Recompute::Selective => {
            kv(flag::RECOMPUTE_GRANULARITY, "selective".into());
            if let Some(modules) = &l.recompute_modules {
                a.push(flag::RECOMPUTE_MODULES.into());
                a.extend(modules.iter().map(|m| m.as_str().to_string()));
            }
        }
        Recompute::Full if l.recompute_layer_ids.is_some() => {
            // Primus requires recompute_method None beside the IDs (the writer's Primus
            // overrides pin it so).
            kv(flag::RECOMPUTE_GRANULARITY, "full".into());
            a.push(flag::RECOMPUTE_LAYER_IDS.into());
            a.extend(
                l.recompute_layer_ids
                    .iter()
                    .flatten()
                    .map(|i| i.to_string()),
            );
        }
        Recompute::Full => {
            kv(flag::RECOMPUTE_GRANULARITY, "full".into());
            kv(flag::RECOMPUTE_METHOD, "block".into());
            let per_stage = s.model.layers.div_ceil(l.pp.max(1));
            let n = if l.recompute_layers == 0 {
                per_stage
            } else {
                l.recompute_layers
            };
            kv(flag::RECOMPUTE_NUM_LAYERS, n.to_string());
        }
    }
    match s.training.precision {
        Precision::Bf16 => a.push(flag::BF16.into()),
        Precision::Fp8 => {
            a.push(flag::BF16.into());
            a.push(flag::FP8_FORMAT.into());
            a.push("hybrid".into());
        }
    }
    if l.fsdp && l.fsdp_kind == crate::layout::FsdpKind::Megatron {
        // Megatron-FSDP (v1) runs on the distributed optimizer (arguments.py turns it on) and
        // asserts its own checkpoint format.
        a.push(moe_flag::MEGATRON_FSDP.into());
        a.push(flag::DIST_OPT.into());
        a.push(flag::CKPT_FORMAT.into());
        a.push(FSDP_CKPT_FORMAT.into());
    } else if l.fsdp {
        // torch FSDP2 asserts that the fused gradient accumulation is off (arguments.py).
        a.push(flag::FSDP.into());
        a.push(flag::NO_GRAD_ACCUM_FUSION.into());
    } else if l.distributed_optimizer {
        a.push(flag::DIST_OPT.into());
    }
    if l.sp() {
        a.push(flag::SP.into());
    }
    if l.schedule == Schedule::ZeroBubble {
        a.push(flag::ZERO_BUBBLE.into());
    }
    if l.tp_comm_overlap {
        a.push(flag::TP_COMM_OVERLAP.into());
    }
    if l.overlap_grad_reduce {
        a.push(flag::OVERLAP_GRAD_REDUCE.into());
    }
    if l.overlap_param_gather && l.distributed_optimizer && !l.fsdp {
        a.push(flag::OVERLAP_PARAM_GATHER.into());
    }
    if !l.grad_reduce_in_fp32 {
        a.push(flag::GRAD_REDUCE_IN_BF16.into());
    }
    moe::write(s, l, &mut a);
    memory_option_args(l, &mut a);
    a
}

/// The flags of the layout's memory options that differ from Megatron's defaults (a job
/// without them runs with the defaults, which are the layout's).
fn memory_option_args(l: &Layout, a: &mut Vec<String>) {
    let mut kv = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };
    if l.attention_dropout != MEGATRON_DROPOUT {
        kv(flag::ATTENTION_DROPOUT, l.attention_dropout.to_string());
    }
    if l.hidden_dropout != MEGATRON_DROPOUT {
        kv(flag::HIDDEN_DROPOUT, l.hidden_dropout.to_string());
    }
    for (f, d) in [
        (flag::MAIN_GRADS_DTYPE, l.main_grads_dtype),
        (flag::MAIN_PARAMS_DTYPE, l.main_params_dtype),
        (flag::EXP_AVG_DTYPE, l.exp_avg_dtype),
        (flag::EXP_AVG_SQ_DTYPE, l.exp_avg_sq_dtype),
    ] {
        if !d.is_fp32() {
            kv(f, d.as_str().to_string());
        }
    }
    if l.optimizer_cpu_offload && l.optimizer_offload_fraction != Fraction::ONE {
        kv(
            flag::OPTIMIZER_OFFLOAD_FRACTION,
            l.optimizer_offload_fraction.to_string(),
        );
    }
    if l.activation_offload_layers > 0 {
        kv(
            flag::CPU_OFFLOADING_NUM_LAYERS,
            l.activation_offload_layers.to_string(),
        );
    }
    let offload = l.offload_set();
    if !offload.is_empty() {
        a.push(flag::FINE_GRAINED_OFFLOAD.into());
        a.push(flag::OFFLOAD_MODULES.into());
        a.extend(offload.iter().map(|m| m.as_str().to_string()));
    }
    if l.precision_aware_optimizer {
        a.push(flag::PRECISION_AWARE_OPTIMIZER.into());
    }
    if l.optimizer_cpu_offload {
        a.push(flag::OPTIMIZER_CPU_OFFLOAD.into());
    }
    if l.fp8_param_gather {
        a.push(flag::FP8_PARAM_GATHER.into());
    }
    match l.cross_entropy_fusion {
        CrossEntropyFusion::None => {}
        CrossEntropyFusion::Native => a.push(flag::CE_FUSION.into()),
        CrossEntropyFusion::Te => {
            a.push(flag::CE_FUSION.into());
            a.push(flag::CE_FUSION_IMPL.into());
            a.push("te".into());
        }
    }
}

/// The Megatron flags of a layout and model: what a training container's arguments end with
/// (the layout and training flags, then the architecture's).
pub fn megatron_flags(s: &Scenario, l: &Layout) -> Vec<String> {
    let mut flags = layout_args(s, l);
    flags.extend(model_args(&s.model));
    flags
}

/// Megatron flags describing a model card's architecture.
pub fn model_args(m: &ModelCard) -> Vec<String> {
    let mut a: Vec<String> = Vec::new();
    let mut kv = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };
    kv(flag::NUM_LAYERS, m.layers.to_string());
    kv(flag::HIDDEN, m.hidden_size.to_string());
    kv(flag::FFN_HIDDEN, m.ffn_hidden_size.to_string());
    kv(flag::HEADS, m.attention_heads.to_string());
    if m.kv_heads() != m.attention_heads {
        kv(flag::QUERY_GROUPS, m.kv_heads().to_string());
    }
    if m.head_dim.is_some() {
        kv(flag::KV_CHANNELS, m.head_dim().to_string());
    }
    kv(flag::VOCAB, m.vocab_size.to_string());
    kv(
        flag::NORMALIZATION,
        match m.norm {
            Norm::Rmsnorm => "RMSNorm".into(),
            Norm::Layernorm => "LayerNorm".into(),
        },
    );
    if let Some(e) = &m.moe {
        kv(flag::NUM_EXPERTS, e.num_experts.to_string());
        kv(flag::MOE_TOPK, e.top_k.to_string());
        kv(flag::MOE_FFN_HIDDEN, e.moe_ffn_hidden_size.to_string());
        if e.shared_experts > 0 {
            let f = e
                .shared_expert_ffn_hidden_size
                .unwrap_or(e.moe_ffn_hidden_size)
                * e.shared_experts as u64;
            kv(flag::MOE_SHARED_FFN, f.to_string());
        }
        if e.dense_layers > 0 {
            kv(flag::MOE_FIRST_DENSE, e.dense_layers.to_string());
        }
        if let Some(c) = e.capacity_factor {
            kv(flag::MOE_CAPACITY, c.to_string());
        }
    }
    if let Some(mla) = &m.mla {
        if let Some(q) = mla.q_lora_rank {
            kv(flag::Q_LORA, q.to_string());
        }
        kv(flag::KV_LORA, mla.kv_lora_rank.to_string());
        kv(flag::QK_HEAD_DIM, mla.qk_nope_head_dim.to_string());
        kv(flag::QK_POS_HEAD_DIM, mla.qk_rope_head_dim.to_string());
        kv(flag::V_HEAD_DIM, mla.v_head_dim.to_string());
    }
    if m.mtp_layers > 0 {
        kv(flag::MTP_LAYERS, m.mtp_layers.to_string());
    }
    if m.kv_heads() != m.attention_heads {
        a.push(flag::GQA.into());
    }
    if m.activation == Activation::Swiglu {
        a.push(flag::SWIGLU.into());
    }
    if !m.tied_embeddings {
        a.push(flag::UNTIE.into());
    }
    if m.qk_norm {
        a.push(flag::QK_LAYERNORM.into());
    }
    if m.mla.is_some() {
        a.push(flag::MLA.into());
    }
    a
}

/// Numeric flags and their largest values (the bounds of the card, layout and training fields
/// they set, [`crate::bounds::limits`]), checked before the flags become a model, a layout
/// and training settings, so a message names the flag.
pub const BOUNDED_FLAGS: &[(&str, u64)] = &[
    (flag::NUM_LAYERS, limits::LAYERS),
    (flag::HIDDEN, limits::HIDDEN),
    (flag::FFN_HIDDEN, limits::FFN),
    (flag::HEADS, limits::HEADS),
    (flag::QUERY_GROUPS, limits::HEADS),
    (flag::KV_CHANNELS, limits::HIDDEN),
    (flag::VOCAB, limits::VOCAB),
    (flag::VOCAB_ALT, limits::VOCAB),
    (flag::NUM_EXPERTS, limits::EXPERTS),
    (flag::MOE_TOPK, limits::EXPERTS),
    (flag::MOE_FFN_HIDDEN, limits::FFN),
    (flag::MOE_SHARED_FFN, limits::FFN),
    (flag::MOE_FIRST_DENSE, limits::LAYERS),
    (flag::Q_LORA, limits::HIDDEN),
    (flag::KV_LORA, limits::HIDDEN),
    (flag::QK_HEAD_DIM, limits::HIDDEN),
    (flag::QK_POS_HEAD_DIM, limits::HIDDEN),
    (flag::V_HEAD_DIM, limits::HIDDEN),
    (flag::MTP_LAYERS, limits::MTP_LAYERS),
    (flag::SEQ, limits::SEQ),
    (flag::GBS, limits::GLOBAL_BATCH),
    (flag::MBS, limits::AXIS),
    (flag::TP, limits::AXIS),
    (flag::PP, limits::AXIS),
    (flag::CP, limits::AXIS),
    (flag::EP, limits::AXIS),
    (flag::ETP, limits::AXIS),
    (flag::VPP_SIZE, limits::AXIS),
    (flag::VPP_LAYERS, limits::LAYERS),
    (flag::VPP_STAGES, limits::AXIS),
    (flag::RECOMPUTE_NUM_LAYERS, limits::LAYERS),
    (flag::FIRST_STAGE_LAYERS, limits::LAYERS),
    (flag::LAST_STAGE_LAYERS, limits::LAYERS),
    (flag::CPU_OFFLOADING_NUM_LAYERS, limits::LAYERS),
];

/// Flags that take a list of values (argparse `nargs='*'`): every word up to the next flag.
pub const LISTS: &[&str] = &[
    flag::RECOMPUTE_MODULES,
    flag::RECOMPUTE_LAYER_IDS,
    moe_flag::CUDA_GRAPH_MODULES,
    flag::OFFLOAD_MODULES,
];

/// Megatron's offload module names the memory model does not represent (Transformer Engine's
/// fused grouped MLP, GatedDeltaProduct mixers): a job offloading them is admitted with a
/// warning, and the other names are modelled.
pub const UNMODELLED_OFFLOAD_MODULES: &[&str] = &["fused_group_mlp", "gdp_qkv"];

/// Flags found in a command line: flag -> value (None for switches; the words of a list flag
/// joined by single spaces). The last occurrence wins, as with argparse.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MegatronArgs {
    values: BTreeMap<String, Option<String>>,
}

/// Split a shell command string into words (quotes and backslashes, no expansion).
pub fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = s.chars();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('"'), '\\') => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            (Some(_), c) => cur.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '\\') => {
                if let Some(n) = chars.next()
                    && n != '\n'
                {
                    cur.push(n);
                    in_word = true;
                }
            }
            (None, c) if c.is_whitespace() || c == ';' || c == '&' || c == '|' => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    words
}

impl MegatronArgs {
    /// Parse words of a command line (`--flag value`, `--flag=value`, switches). Words that
    /// contain spaces (a `bash -c "..."` script) are split as shell words first.
    pub fn parse<'a>(words: impl IntoIterator<Item = &'a str>) -> MegatronArgs {
        let mut tokens: Vec<String> = Vec::new();
        for w in words {
            if w.contains(char::is_whitespace) {
                tokens.extend(shell_words(w));
            } else {
                tokens.push(w.to_string());
            }
        }
        let mut values = BTreeMap::new();
        let mut i = 0;
        while i < tokens.len() {
            let t = &tokens[i];
            i += 1;
            if !t.starts_with("--") || t.len() <= 2 {
                continue;
            }
            if let Some((k, v)) = t.split_once('=') {
                values.insert(k.to_string(), Some(v.to_string()));
                continue;
            }
            if is_switch(t) {
                values.insert(t.clone(), None);
                continue;
            }
            if LISTS.contains(&t.as_str()) {
                let mut words = Vec::new();
                while let Some(n) = tokens.get(i).filter(|n| !n.starts_with("--")) {
                    words.push(n.as_str());
                    i += 1;
                }
                values.insert(t.clone(), Some(words.join(" ")));
                continue;
            }
            let value = tokens.get(i).filter(|n| !n.starts_with("--")).cloned();
            if value.is_some() {
                i += 1;
            }
            values.insert(t.clone(), value);
        }
        MegatronArgs { values }
    }

    /// The numeric flags within their bounds ([`BOUNDED_FLAGS`]); the error names the flag.
    pub fn check_bounds(&self) -> Result<(), FieldError> {
        for &(f, max) in BOUNDED_FLAGS {
            if let Some(v) = self.get(f)
                && let Ok(n) = v.trim().parse::<u128>()
                && n > u128::from(max)
            {
                return Err(FieldError::new(
                    f,
                    format!("{n} is beyond any real job (at most {max})"),
                ));
            }
        }
        if let Some(l) = self.get(flag::PIPELINE_LAYOUT)
            && l.chars().nth(limits::LAYOUT_TEXT as usize).is_some()
        {
            return Err(FieldError::new(
                flag::PIPELINE_LAYOUT,
                format!("is longer than {} characters", limits::LAYOUT_TEXT),
            ));
        }
        Ok(())
    }

    /// Whether a flag (switch or valued) is present.
    pub fn has(&self, f: &str) -> bool {
        self.values.contains_key(f)
    }

    /// The raw value of a flag.
    pub fn get(&self, f: &str) -> Option<&str> {
        self.values.get(f).and_then(|v| v.as_deref())
    }

    /// Whether any flag was found.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// An enum flag's value (`None` when absent), or an error naming the flag and the values
    /// it takes.
    fn choice<T>(
        &self,
        f: &str,
        parse: impl Fn(&str) -> Option<T>,
        allowed: &[&str],
    ) -> Result<Option<T>, FieldError> {
        match self.values.get(f) {
            None => Ok(None),
            Some(None) => Err(FieldError::new(f, "needs a value")),
            Some(Some(v)) => parse(v).map(Some).ok_or_else(|| {
                FieldError::new(
                    f,
                    format!("{} is not one of {}", quote(v), allowed.join(", ")),
                )
            }),
        }
    }

    fn num<T: std::str::FromStr>(&self, f: &str) -> Result<Option<T>, FieldError> {
        match self.values.get(f) {
            None => Ok(None),
            Some(None) => Err(FieldError::new(f, "needs a value")),
            Some(Some(v)) => v
                .parse::<T>()
                .map(Some)
                .map_err(|_| FieldError::new(f, format!("{} is not a valid number", quote(v)))),
        }
    }

    /// The virtual pipeline size and the split of the layers over the stages, as Megatron's
    /// `arguments.py` and `TransformerConfig` derive them: at most one of
    /// `--num-layers-per-virtual-pipeline-stage`, `--num-virtual-stages-per-pipeline-rank` and
    /// `--pipeline-model-parallel-layout`; layers per virtual stage count the embedding and the
    /// loss as one layer each under `--account-for-embedding-in-pipeline-split` /
    /// `--account-for-loss-in-pipeline-split` (the counted layers must divide over the pipeline
    /// stages, and the layers per stage over the virtual stages); those two flags combine with
    /// neither an uneven first/last stage nor a layout, and become the layout of their even
    /// split (MTP layers ride on the last stage).
    fn pipeline_split(&self, model: &ModelCard, l: &mut Layout) -> Result<(), FieldError> {
        let layers = model.layers;
        let embedding = self.has(flag::ACCOUNT_EMBEDDING);
        let loss = self.has(flag::ACCOUNT_LOSS);
        // The accounting flag an error names.
        let account = if embedding {
            flag::ACCOUNT_EMBEDDING
        } else {
            flag::ACCOUNT_LOSS
        };
        let accounted = || -> String {
            let mut what = String::new();
            if embedding {
                what.push_str(" plus the embedding");
            }
            if loss {
                what.push_str(if embedding {
                    " and the loss"
                } else {
                    " plus the loss"
                });
            }
            format!("the model's {layers} layers{what}")
        };
        let ways = [flag::VPP_LAYERS, flag::VPP_STAGES, flag::PIPELINE_LAYOUT];
        let given: Vec<&str> = ways.into_iter().filter(|f| self.has(f)).collect();
        if given.len() > 1 {
            return Err(FieldError::new(
                given[1],
                format!(
                    "Megatron takes at most one of {}; got {}",
                    ways.join(", "),
                    given.join(" and ")
                ),
            ));
        }
        let uneven = l.first_stage_layers.is_some() || l.last_stage_layers.is_some();
        if (embedding || loss) && (uneven || l.pipeline_layout.is_some()) {
            return Err(FieldError::new(
                account,
                "Megatron does not combine it with --decoder-first/last-pipeline-num-layers or \
                 --pipeline-model-parallel-layout",
            ));
        }
        let pp = l.pp.max(1);
        if let Some(v) = self.num::<u32>(flag::VPP_SIZE)? {
            l.vpp = v;
        } else if let Some(v) = self.num::<u32>(flag::VPP_STAGES)? {
            if v == 0 {
                return Err(FieldError::new(flag::VPP_STAGES, "must be greater than 0"));
            }
            l.vpp = v;
        } else if let Some(per_chunk) = self.num::<u32>(flag::VPP_LAYERS)? {
            if per_chunk == 0 {
                return Err(FieldError::new(flag::VPP_LAYERS, "must be greater than 0"));
            }
            if uneven {
                return Err(FieldError::new(
                    flag::VPP_LAYERS,
                    "with an uneven first or last stage Megatron takes the virtual stages per \
                     rank (--num-virtual-stages-per-pipeline-rank)",
                ));
            }
            let counted = layers + u32::from(embedding) + u32::from(loss);
            if !counted.is_multiple_of(pp) {
                return Err(FieldError::new(
                    flag::PP,
                    format!("{} do not divide over {pp} pipeline stages", accounted()),
                ));
            }
            let per_stage = counted / pp;
            if !per_stage.is_multiple_of(per_chunk) {
                return Err(FieldError::new(
                    flag::VPP_LAYERS,
                    format!(
                        "{per_chunk} does not divide the {per_stage} layers per pipeline stage"
                    ),
                ));
            }
            l.vpp = per_stage / per_chunk;
        }
        let stages = pp * l.vpp.max(1);
        if (embedding || loss) && stages > 1 {
            let slots = crate::layout::SplitSlots {
                embedding,
                loss,
                mtp: false,
            };
            let text = crate::layout::even_split_layout(layers, model.mtp_layers, stages, slots)
                .ok_or_else(|| {
                    FieldError::new(
                        account,
                        format!(
                            "{} do not split evenly over {stages} virtual stages",
                            accounted()
                        ),
                    )
                })?;
            let parsed = crate::layout::PipelineLayout::parse(&text)
                .map_err(|e| FieldError::new(account, format!("its split {e}")))?;
            l.pipeline_layout = Some(parsed);
        }
        Ok(())
    }

    /// The layout these flags describe for `model` (defaults as Megatron's: sizes 1, no
    /// recompute, no distributed optimizer; `--expert-tensor-parallel-size` defaults to TP for
    /// MoE models and means nothing for dense ones). The model's layer count turns
    /// layers-per-virtual-stage into VPP.
    pub fn layout(&self, model: &ModelCard) -> Result<Layout, FieldError> {
        let layers = model.layers;
        let mut l = Layout {
            sequence_parallel: self.has(flag::SP),
            distributed_optimizer: self.has(flag::DIST_OPT),
            fsdp: self.has(flag::FSDP),
            tp_comm_overlap: self.has(flag::TP_COMM_OVERLAP),
            overlap_grad_reduce: self.has(flag::OVERLAP_GRAD_REDUCE),
            overlap_param_gather: self.has(flag::OVERLAP_PARAM_GATHER),
            grad_reduce_in_fp32: !self.has(flag::GRAD_REDUCE_IN_BF16),
            ..Layout::default()
        };
        l.tp = self.num(flag::TP)?.unwrap_or(1);
        l.pp = self.num(flag::PP)?.unwrap_or(1);
        l.cp = self.num(flag::CP)?.unwrap_or(1);
        l.ep = self.num(flag::EP)?.unwrap_or(1);
        let default_etp = if model.moe.is_some() { l.tp } else { 1 };
        l.etp = self.num(flag::ETP)?.unwrap_or(default_etp);
        l.micro_batch_size = self.num(flag::MBS)?.unwrap_or(1);
        l.first_stage_layers = self.num(flag::FIRST_STAGE_LAYERS)?;
        l.last_stage_layers = self.num(flag::LAST_STAGE_LAYERS)?;
        if let Some(text) = self.get(flag::PIPELINE_LAYOUT) {
            let parsed = crate::layout::PipelineLayout::parse(text)
                .map_err(|e| FieldError::new(flag::PIPELINE_LAYOUT, e))?;
            l.pipeline_layout = Some(parsed);
        }
        self.pipeline_split(model, &mut l)?;
        l.schedule = if self.has(flag::ZERO_BUBBLE) {
            Schedule::ZeroBubble
        } else if l.vpp > 1 {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        };
        l.recompute = match self.get(flag::RECOMPUTE_GRANULARITY) {
            None if self.has(flag::RECOMPUTE_GRANULARITY) => {
                return Err(FieldError::new(
                    flag::RECOMPUTE_GRANULARITY,
                    "needs a value: full or selective",
                ));
            }
            None => Recompute::None,
            Some("full") => Recompute::Full,
            Some("selective") => Recompute::Selective,
            Some(other) => {
                return Err(FieldError::new(
                    flag::RECOMPUTE_GRANULARITY,
                    format!("{} is not full or selective", quote(other)),
                ));
            }
        };
        // Megatron reads --recompute-modules only with selective granularity.
        if l.recompute == Recompute::Selective
            && let Some(list) = self.get(flag::RECOMPUTE_MODULES)
        {
            let modules = list
                .split_whitespace()
                .map(|w| {
                    RecomputeModule::parse(w).ok_or_else(|| {
                        FieldError::new(
                            flag::RECOMPUTE_MODULES,
                            format!(
                                "{} is not a recompute module ({})",
                                quote(w),
                                RecomputeModule::ALL.map(|m| m.as_str()).join(", ")
                            ),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            l.recompute_modules = Some(modules);
        }
        if let Some(ids) = self.recompute_layer_ids()? {
            // Primus checks them at start (validate_specified_recompute_layers): full
            // granularity, no method beside them; the layout rules judge the granularity
            // and the range.
            if let Some(m) = self.get(flag::RECOMPUTE_METHOD).filter(|m| *m != "None") {
                return Err(FieldError::new(
                    flag::RECOMPUTE_LAYER_IDS,
                    format!(
                        "Primus refuses recompute_layer_ids beside recompute_method {} (it must be None)",
                        quote(m)
                    ),
                ));
            }
            l.recompute_layer_ids = Some(ids);
        } else if l.recompute == Recompute::Full {
            let n: u32 = self.num(flag::RECOMPUTE_NUM_LAYERS)?.unwrap_or(0);
            let per_stage = layers.div_ceil(l.pp.max(1));
            // `--recompute-method uniform` recomputes every layer in groups of n.
            let block = self.get(flag::RECOMPUTE_METHOD) == Some("block");
            l.recompute_layers = if block && n < per_stage { n } else { 0 };
        }
        moe::read(self, model, &mut l)?;
        self.memory_options(&mut l)?;
        Ok(l)
    }

    /// Primus' `recompute_layer_ids` as it normalises them: comma- or space-separated (a
    /// Python list's brackets and quotes ignored), sorted, repeats collapsed; `None` when
    /// absent or `None`. At most [`limits::LAYERS`] + [`limits::MTP_LAYERS`] IDs, each below
    /// that bound.
    fn recompute_layer_ids(&self) -> Result<Option<Vec<u32>>, FieldError> {
        const F: &str = flag::RECOMPUTE_LAYER_IDS;
        let Some(raw) = self.values.get(F) else {
            return Ok(None);
        };
        let raw = raw.as_deref().unwrap_or("").trim();
        if raw == "None" || raw == "null" {
            return Ok(None);
        }
        let most = limits::LAYERS + limits::MTP_LAYERS;
        let words = raw
            .split(|c: char| c == ',' || c.is_whitespace() || "[]()'\"".contains(c))
            .filter(|w| !w.is_empty());
        if words.clone().count() as u64 > most {
            return Err(FieldError::new(
                F,
                format!("lists more than {most} layers, beyond any real model"),
            ));
        }
        let mut ids = Vec::new();
        for w in words {
            match w.parse::<u32>() {
                Ok(i) if u64::from(i) < most => ids.push(i),
                _ => {
                    return Err(FieldError::new(
                        F,
                        format!("{} is not a layer index (0 to {})", quote(w), most - 1),
                    ));
                }
            }
        }
        if ids.is_empty() {
            return Err(FieldError::new(
                F,
                "is empty (Primus refuses an empty list: omit it to recompute by recompute_method)",
            ));
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(Some(ids))
    }

    /// The memory options of the layout (Megatron's defaults where a flag is absent). Ranges
    /// are the layout rules' to judge; a value that is not a number or dtype names its flag.
    fn memory_options(&self, l: &mut Layout) -> Result<(), FieldError> {
        let fraction = |f: &str| -> Result<Option<Fraction>, FieldError> {
            Ok(self.num::<f64>(f)?.map(Fraction::new))
        };
        let dtypes = OptimizerDtype::ALL.map(|d| d.as_str());
        let dtype = |f: &str| -> Result<OptimizerDtype, FieldError> {
            Ok(self
                .choice(f, OptimizerDtype::parse, &dtypes)?
                .unwrap_or(OptimizerDtype::Fp32))
        };
        l.attention_dropout = fraction(flag::ATTENTION_DROPOUT)?.unwrap_or(MEGATRON_DROPOUT);
        l.hidden_dropout = fraction(flag::HIDDEN_DROPOUT)?.unwrap_or(MEGATRON_DROPOUT);
        l.precision_aware_optimizer = self.has(flag::PRECISION_AWARE_OPTIMIZER);
        l.main_grads_dtype = dtype(flag::MAIN_GRADS_DTYPE)?;
        l.main_params_dtype = dtype(flag::MAIN_PARAMS_DTYPE)?;
        l.exp_avg_dtype = dtype(flag::EXP_AVG_DTYPE)?;
        l.exp_avg_sq_dtype = dtype(flag::EXP_AVG_SQ_DTYPE)?;
        l.optimizer_cpu_offload = self.has(flag::OPTIMIZER_CPU_OFFLOAD);
        l.optimizer_offload_fraction =
            fraction(flag::OPTIMIZER_OFFLOAD_FRACTION)?.unwrap_or(Fraction::ONE);
        l.activation_offload_layers = self.num(flag::CPU_OFFLOADING_NUM_LAYERS)?.unwrap_or(0);
        l.offload_modules = self.offload_modules()?;
        l.fp8_param_gather = self.has(flag::FP8_PARAM_GATHER);
        // Without the fusion flag Megatron computes the loss unfused, whatever the impl says
        // (argparse still judges the impl's value).
        let te = self
            .choice(
                flag::CE_FUSION_IMPL,
                |v| match v {
                    "native" => Some(false),
                    "te" => Some(true),
                    _ => None,
                },
                &["native", "te"],
            )?
            .unwrap_or(false);
        l.cross_entropy_fusion = match (self.has(flag::CE_FUSION), te) {
            (false, _) => CrossEntropyFusion::None,
            (true, false) => CrossEntropyFusion::Native,
            (true, true) => CrossEntropyFusion::Te,
        };
        Ok(())
    }

    /// `--offload-modules` under `--fine-grained-activation-offloading` (Megatron reads the list
    /// only with the switch): the modelled names, in Megatron's order (None without the switch
    /// or with only unmodelled names, [`UNMODELLED_OFFLOAD_MODULES`]); an unknown name is an
    /// error.
    fn offload_modules(&self) -> Result<Option<Vec<OffloadModule>>, FieldError> {
        if !self.has(flag::FINE_GRAINED_OFFLOAD) {
            return Ok(None);
        }
        let mut modules = Vec::new();
        for w in self
            .get(flag::OFFLOAD_MODULES)
            .unwrap_or("")
            .split_whitespace()
        {
            if UNMODELLED_OFFLOAD_MODULES.contains(&w) {
                continue;
            }
            let m = OffloadModule::parse(w).ok_or_else(|| {
                FieldError::new(
                    flag::OFFLOAD_MODULES,
                    format!(
                        "{} is not an offload module ({})",
                        quote(w),
                        OffloadModule::ALL
                            .map(|m| m.as_str())
                            .iter()
                            .chain(UNMODELLED_OFFLOAD_MODULES)
                            .copied()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                )
            })?;
            if !modules.contains(&m) {
                modules.push(m);
            }
        }
        Ok((!modules.is_empty()).then(|| OffloadSet::of(&modules).to_vec()))
    }

    /// The memory-relevant flags of [`UNMODELLED_MEMORY_FLAGS`] this command line carries (and
    /// `--moe-token-dispatcher-type flex`, and offload modules the model does not represent),
    /// each with what it changes.
    pub fn unmodelled_memory_flags(&self) -> Vec<(String, &'static str)> {
        let mut found: Vec<(String, &'static str)> = UNMODELLED_MEMORY_FLAGS
            .iter()
            .filter(|(f, _)| self.has(f) && self.get(f) != Some("none"))
            .map(|(f, what)| (f.to_string(), *what))
            .collect();
        if self.has(flag::FINE_GRAINED_OFFLOAD) {
            for w in self
                .get(flag::OFFLOAD_MODULES)
                .unwrap_or("")
                .split_whitespace()
            {
                if UNMODELLED_OFFLOAD_MODULES.contains(&w) {
                    found.push((
                        format!("{} {w}", flag::OFFLOAD_MODULES),
                        "offloading a module the memory model does not represent",
                    ));
                }
            }
        }
        found
    }

    /// The training settings these flags give, when sequence length and global batch are set.
    pub fn training(&self) -> Result<Option<Training>, FieldError> {
        let (Some(seq), Some(gbs)) = (self.num(flag::SEQ)?, self.num(flag::GBS)?) else {
            return Ok(None);
        };
        let precision = if self.has(flag::FP8_FORMAT) {
            Precision::Fp8
        } else {
            Precision::Bf16
        };
        Ok(Some(Training {
            seq_length: seq,
            global_batch_size: gbs,
            precision,
        }))
    }

    /// The model card these flags describe, when the architecture flags are all present.
    pub fn model_card(&self) -> Result<Option<ModelCard>, FieldError> {
        let (Some(layers), Some(hidden), Some(heads)) = (
            self.num::<u32>(flag::NUM_LAYERS)?,
            self.num::<u64>(flag::HIDDEN)?,
            self.num::<u32>(flag::HEADS)?,
        ) else {
            return Ok(None);
        };
        let vocab = match self.num::<u64>(flag::VOCAB)? {
            Some(v) => v,
            None => match self.num::<u64>(flag::VOCAB_ALT)? {
                Some(v) => v,
                None => return Ok(None),
            },
        };
        let swiglu = self.has(flag::SWIGLU);
        let ffn = self
            .num::<u64>(flag::FFN_HIDDEN)?
            .unwrap_or(hidden.saturating_mul(4));
        let moe = match self.num::<u32>(flag::NUM_EXPERTS)? {
            None => None,
            Some(n) => {
                let moe_ffn = self.num::<u64>(flag::MOE_FFN_HIDDEN)?.unwrap_or(ffn);
                let shared = self.num::<u64>(flag::MOE_SHARED_FFN)?;
                Some(MoeConfig {
                    num_experts: n,
                    top_k: self.num(flag::MOE_TOPK)?.unwrap_or(2),
                    moe_ffn_hidden_size: moe_ffn,
                    shared_experts: u32::from(shared.is_some()),
                    shared_expert_ffn_hidden_size: shared,
                    dense_layers: self.num(flag::MOE_FIRST_DENSE)?.unwrap_or(0),
                    router: Default::default(),
                    router_bias: false,
                    capacity_factor: self.num(flag::MOE_CAPACITY)?,
                })
            }
        };
        let mla = if self.has(flag::MLA) {
            Some(MlaConfig {
                q_lora_rank: self.num(flag::Q_LORA)?,
                kv_lora_rank: self.num(flag::KV_LORA)?.unwrap_or(512),
                qk_nope_head_dim: self.num(flag::QK_HEAD_DIM)?.unwrap_or(128),
                qk_rope_head_dim: self.num(flag::QK_POS_HEAD_DIM)?.unwrap_or(64),
                v_head_dim: self.num(flag::V_HEAD_DIM)?.unwrap_or(128),
            })
        } else {
            None
        };
        let kv_heads = if self.has(flag::GQA) || self.has(flag::QUERY_GROUPS) {
            self.num(flag::QUERY_GROUPS)?
        } else {
            None
        };
        let norm = match self.get(flag::NORMALIZATION) {
            Some("RMSNorm") => Norm::Rmsnorm,
            _ => Norm::Layernorm,
        };
        Ok(Some(ModelCard {
            name: "from-megatron-args".into(),
            layers,
            hidden_size: hidden,
            ffn_hidden_size: ffn,
            attention_heads: heads,
            kv_heads,
            head_dim: self.num(flag::KV_CHANNELS)?,
            vocab_size: vocab,
            tied_embeddings: !self.has(flag::UNTIE),
            activation: if swiglu {
                Activation::Swiglu
            } else {
                Activation::Gelu
            },
            norm,
            qk_norm: self.has(flag::QK_LAYERNORM),
            attention_bias: !self.has("--disable-bias-linear") || self.has("--add-qkv-bias"),
            mlp_bias: !self.has("--disable-bias-linear"),
            position_embeddings: 0,
            attention_sinks: false,
            sliding_window: None,
            full_attention_every: None,
            moe,
            mla,
            mtp_layers: self.num(flag::MTP_LAYERS)?.unwrap_or(0),
            // Model-config fields with no command-line flag (set by Megatron-Bridge's
            // providers), like the attention sinks and window above.
            activation_clamp: false,
            yarn_scaling_factor: None,
        }))
    }
}

/// Whether a flag takes no value (a switch such as `--sequence-parallel`, or a MoE option
/// switch such as `--moe-grouped-gemm`).
pub fn is_switch(f: &str) -> bool {
    SWITCHES.contains(&f) || moe::SWITCHES.contains(&f)
}

/// Whether a flag takes a list of values (every word up to the next flag).
pub fn is_list(f: &str) -> bool {
    LISTS.contains(&f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::HardwareProfile;
    use crate::profiles::Catalog;
    use crate::scenario::Cluster;

    fn scenario(model: &str, gpu: &str, gpus: u32) -> Scenario {
        let c = Catalog::builtin().unwrap();
        let hardware: HardwareProfile = c.hardware(gpu).unwrap().clone();
        Scenario {
            model: c.model(model).unwrap().clone(),
            cluster: Cluster {
                gpus,
                gpus_per_node: hardware.gpus_per_node,
            },
            hardware,
            training: Training {
                seq_length: 8192,
                global_batch_size: 128,
                precision: Precision::Bf16,
            },
        }
    }

    fn llama70() -> ModelCard {
        Catalog::builtin()
            .unwrap()
            .model("llama3.1-70b")
            .unwrap()
            .clone()
    }

    #[test]
    fn expert_tensor_parallel_defaults_to_tp_only_for_moe_models() {
        let a = MegatronArgs::parse(["--tensor-model-parallel-size", "4"]);
        assert_eq!(
            a.layout(&llama70()).unwrap().etp,
            1,
            "dense: no expert grid"
        );
        let mixtral = Catalog::builtin()
            .unwrap()
            .model("mixtral-8x7b")
            .unwrap()
            .clone();
        assert_eq!(
            a.layout(&mixtral).unwrap().etp,
            4,
            "MoE: Megatron's default ETP = TP"
        );
        let a = MegatronArgs::parse([
            "--tensor-model-parallel-size",
            "4",
            "--expert-tensor-parallel-size",
            "1",
        ]);
        assert_eq!(a.layout(&mixtral).unwrap().etp, 1);
    }

    #[test]
    fn pipeline_layout_round_trips_and_bad_ones_name_the_flag() {
        let c = Catalog::builtin().unwrap();
        let ds = c.model("deepseek-v3").unwrap().clone();
        let s = Scenario {
            model: ds.clone(),
            ..scenario("llama3.1-70b", "h100-sxm", 1024)
        };
        let l = Layout {
            tp: 2,
            pp: 8,
            vpp: 4,
            ep: 64,
            schedule: Schedule::Interleaved,
            pipeline_layout: Some(crate::layout::PipelineLayout::parse("Et|(tt|)*30mL").unwrap()),
            ..Layout::default()
        };
        let args = layout_args(&s, &l);
        assert!(
            args.contains(&"--pipeline-model-parallel-layout".to_string()),
            "{args:?}"
        );
        let back = MegatronArgs::parse(args.iter().map(String::as_str))
            .layout(&ds)
            .unwrap();
        assert_eq!(back.pipeline_layout, l.pipeline_layout);
        let bad = MegatronArgs::parse(["--pipeline-model-parallel-layout", "E(t|"]);
        assert_eq!(
            bad.layout(&ds).unwrap_err().field,
            "--pipeline-model-parallel-layout"
        );
    }

    #[test]
    fn absurd_hidden_size_does_not_overflow() {
        let a = MegatronArgs::parse([
            "--num-layers",
            "2",
            "--hidden-size",
            "18446744073709551615",
            "--num-attention-heads",
            "1",
            "--vocab-size",
            "10",
        ]);
        let card = a.model_card().unwrap().unwrap();
        assert_eq!(card.ffn_hidden_size, u64::MAX);
    }

    #[test]
    fn written_layout_flags_parse_back_to_the_same_layout() {
        let s = scenario("llama3.1-70b", "mi300x", 64);
        let cases = [
            Layout {
                tp: 4,
                pp: 8,
                vpp: 5,
                schedule: Schedule::Interleaved,
                ..Layout::default()
            },
            Layout {
                tp: 8,
                pp: 2,
                micro_batch_size: 2,
                recompute: Recompute::Full,
                recompute_layers: 10,
                ..Layout::default()
            },
            Layout {
                tp: 2,
                pp: 4,
                cp: 2,
                recompute: Recompute::Selective,
                schedule: Schedule::ZeroBubble,
                overlap_param_gather: true,
                ..Layout::default()
            },
            Layout {
                tp: 4,
                pp: 4,
                recompute: Recompute::Selective,
                recompute_modules: Some(vec![RecomputeModule::Mlp, RecomputeModule::CoreAttn]),
                ..Layout::default()
            },
            Layout {
                tp: 8,
                pp: 2,
                grad_reduce_in_fp32: false,
                ..Layout::default()
            },
        ];
        for l in cases {
            let args = layout_args(&s, &l);
            let parsed = MegatronArgs::parse(args.iter().map(String::as_str));
            let back = parsed.layout(&s.model).unwrap();
            assert_eq!(back, l, "flags {args:?}");
            assert_eq!(parsed.training().unwrap(), Some(s.training));
        }
    }

    #[test]
    fn recompute_modules_round_trip_as_a_list_up_to_the_next_flag() {
        use RecomputeModule::*;
        let c = Catalog::builtin().unwrap();
        let s = Scenario {
            model: c.model("gpt-oss-120b").unwrap().clone(),
            ..scenario("llama3.1-70b", "h100-sxm", 64)
        };
        // The Megatron-Bridge gpt-oss-120b H100 recipe's modules (layernorm, moe_act).
        let l = Layout {
            pp: 4,
            ep: 8,
            recompute: Recompute::Selective,
            recompute_modules: Some(vec![Layernorm, MoeAct]),
            sequence_parallel: false,
            ..Layout::default()
        };
        let args = layout_args(&s, &l);
        let at = args
            .iter()
            .position(|a| a == "--recompute-modules")
            .unwrap();
        assert_eq!(args[at + 1..at + 3], ["layernorm", "moe_act"], "{args:?}");
        assert!(args[at + 3].starts_with("--"), "{args:?}");
        let parsed = MegatronArgs::parse(args.iter().map(String::as_str));
        assert_eq!(
            parsed.get(flag::RECOMPUTE_MODULES),
            Some("layernorm moe_act")
        );
        assert_eq!(parsed.layout(&s.model).unwrap(), l);
        // In a shell script, at the end of the line, and in the equals form.
        let script = "python pretrain_gpt.py --recompute-granularity selective \
            --recompute-modules core_attn moe_act --seq-length 4096";
        let a = MegatronArgs::parse(["bash", "-c", script]);
        let got = a.layout(&s.model).unwrap();
        assert_eq!(got.recompute_modules, Some(vec![CoreAttn, MoeAct]));
        assert_eq!(a.get(flag::SEQ), Some("4096"));
        let a = MegatronArgs::parse([
            "--recompute-granularity",
            "selective",
            "--recompute-modules",
            "mlp",
        ]);
        assert_eq!(
            a.layout(&s.model).unwrap().recompute_modules,
            Some(vec![Mlp])
        );
        let a = MegatronArgs::parse([
            "--recompute-granularity=selective",
            "--recompute-modules=moe",
        ]);
        assert_eq!(
            a.layout(&s.model).unwrap().recompute_modules,
            Some(vec![Moe])
        );
        // An empty list (argparse nargs='*') recomputes nothing; without selective granularity
        // Megatron ignores the list, and so do we; unknown names are an error naming the flag.
        let a = MegatronArgs::parse([
            "--recompute-granularity",
            "selective",
            "--recompute-modules",
            "--bf16",
        ]);
        assert_eq!(a.layout(&s.model).unwrap().recompute_modules, Some(vec![]));
        assert!(a.has(flag::BF16));
        let a = MegatronArgs::parse(["--recompute-modules", "moe_act"]);
        let got = a.layout(&s.model).unwrap();
        assert_eq!(
            (got.recompute, got.recompute_modules),
            (Recompute::None, None)
        );
        let a = MegatronArgs::parse([
            "--recompute-granularity",
            "selective",
            "--recompute-modules",
            "moe_act",
            "attention",
        ]);
        let e = a.layout(&s.model).unwrap_err();
        assert_eq!(e.field, "--recompute-modules");
        assert!(e.message.contains("\"attention\""), "{e}");
    }

    #[test]
    fn written_model_flags_parse_back_to_the_same_architecture() {
        let c = Catalog::builtin().unwrap();
        let m = c.model("llama3.1-70b").unwrap();
        let args = model_args(m);
        let back = MegatronArgs::parse(args.iter().map(String::as_str))
            .model_card()
            .unwrap()
            .expect("complete architecture");
        assert_eq!(back.layers, m.layers);
        assert_eq!(back.hidden_size, m.hidden_size);
        assert_eq!(back.ffn_hidden_size, m.ffn_hidden_size);
        assert_eq!(back.kv_heads(), m.kv_heads());
        assert_eq!(back.vocab_size, m.vocab_size);
        assert_eq!(back.activation, m.activation);
        assert_eq!(back.tied_embeddings, m.tied_embeddings);
    }

    #[test]
    fn parses_equals_form_shell_scripts_and_layers_per_virtual_stage() {
        let script = "torchrun --nproc-per-node 8 pretrain_gpt.py --num-layers 80 \
            --tensor-model-parallel-size=4 --pipeline-model-parallel-size 8 \
            --num-layers-per-virtual-pipeline-stage 2 --sequence-parallel \
            --recompute-granularity 'selective' --seq-length 8192 --global-batch-size 128";
        let a = MegatronArgs::parse(["bash", "-c", script]);
        let l = a.layout(&llama70()).unwrap();
        assert_eq!(
            (l.tp, l.pp, l.vpp),
            (4, 8, 5),
            "80 layers / 8 stages / 2 per chunk"
        );
        assert_eq!(l.schedule, Schedule::Interleaved);
        assert_eq!(l.recompute, Recompute::Selective);
        assert!(l.sequence_parallel && !l.distributed_optimizer);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let a = MegatronArgs::parse(["--tensor-model-parallel-size", "four"]);
        let e = a.layout(&llama70()).unwrap_err();
        assert_eq!(e.field, "--tensor-model-parallel-size");
        assert!(e.message.contains("\"four\""), "{e}");
        let a = MegatronArgs::parse(["--recompute-granularity", "sometimes"]);
        assert_eq!(
            a.layout(&llama70()).unwrap_err().field,
            "--recompute-granularity"
        );
        let a = MegatronArgs::parse([
            "--num-layers-per-virtual-pipeline-stage",
            "3",
            "--pipeline-model-parallel-size",
            "8",
        ]);
        assert!(
            a.layout(&llama70())
                .unwrap_err()
                .message
                .contains("does not divide")
        );
    }

    #[test]
    fn memory_options_round_trip_and_defaults_write_nothing() {
        use crate::layout::{Fraction, OptimizerDtype};
        let mut s = scenario("llama3.1-70b", "h100-sxm", 64);
        s.training.precision = Precision::Fp8;
        let defaults = layout_args(&s, &Layout::default());
        for f in [
            flag::ATTENTION_DROPOUT,
            flag::HIDDEN_DROPOUT,
            flag::PRECISION_AWARE_OPTIMIZER,
            flag::MAIN_GRADS_DTYPE,
            flag::OPTIMIZER_CPU_OFFLOAD,
            flag::OPTIMIZER_OFFLOAD_FRACTION,
            flag::CPU_OFFLOADING_NUM_LAYERS,
            flag::FP8_PARAM_GATHER,
        ] {
            assert!(!defaults.contains(&f.to_string()), "{f} in {defaults:?}");
        }
        let pao = Layout {
            tp: 8,
            pp: 2,
            attention_dropout: Fraction::ZERO,
            hidden_dropout: Fraction::new(0.05),
            precision_aware_optimizer: true,
            main_grads_dtype: OptimizerDtype::Bf16,
            main_params_dtype: OptimizerDtype::Fp16,
            exp_avg_dtype: OptimizerDtype::Bf16,
            exp_avg_sq_dtype: OptimizerDtype::Fp8,
            optimizer_cpu_offload: true,
            optimizer_offload_fraction: Fraction::new(0.5),
            fp8_param_gather: true,
            ..Layout::default()
        };
        let offload = Layout {
            tp: 8,
            activation_offload_layers: 20,
            ..Layout::default()
        };
        for l in [pao, offload] {
            l.check(&s).unwrap();
            let args = layout_args(&s, &l);
            let back = MegatronArgs::parse(args.iter().map(String::as_str))
                .layout(&s.model)
                .unwrap();
            assert_eq!(back, l, "flags {args:?}");
        }
        let args = layout_args(
            &s,
            &Layout {
                attention_dropout: Fraction::ZERO,
                ..Layout::default()
            },
        );
        let at = args
            .iter()
            .position(|a| a == flag::ATTENTION_DROPOUT)
            .unwrap();
        assert_eq!(args[at + 1], "0");
        // A value that is not a number or a dtype names its flag.
        let bad = MegatronArgs::parse(["--exp-avg-dtype", "int4"]);
        assert_eq!(bad.layout(&llama70()).unwrap_err().field, "--exp-avg-dtype");
        // A hostile value is quoted cut short (the webhook's fuzz found the whole value echoed).
        let long = "a".repeat(100_000);
        let bad = MegatronArgs::parse(["--exp-avg-dtype", long.as_str()]);
        assert!(bad.layout(&llama70()).unwrap_err().message.len() < 200);
        let bad = MegatronArgs::parse(["--hidden-dropout", "lots"]);
        assert_eq!(
            bad.layout(&llama70()).unwrap_err().field,
            "--hidden-dropout"
        );
    }

    #[test]
    fn unmodelled_memory_env_is_found_only_with_its_value() {
        let found =
            unmodelled_memory_env([("HSA_NO_SCRATCH_RECLAIM", "1"), ("NCCL_DEBUG", "INFO")]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "HSA_NO_SCRATCH_RECLAIM=1");
        assert!(found[0].1.contains("scratch"));
        assert!(unmodelled_memory_env([("HSA_NO_SCRATCH_RECLAIM", "0")]).is_empty());
        assert!(unmodelled_memory_env([("NCCL_DEBUG", "1")]).is_empty());
        // The last setting of a name counts.
        assert!(
            unmodelled_memory_env([
                ("HSA_NO_SCRATCH_RECLAIM", "1"),
                ("HSA_NO_SCRATCH_RECLAIM", "0")
            ])
            .is_empty()
        );
    }

    #[test]
    fn unmodelled_memory_flags_are_found_and_modelled_values_are_not() {
        // The CUDA graphs and the flex dispatcher are read into the layout and modelled
        // (`memory::graphs`, `memory::dispatcher`); the legacy switches are not.
        let a = MegatronArgs::parse([
            "--cuda-graph-impl",
            "transformer_engine",
            "--moe-token-dispatcher-type",
            "flex",
            "--moe-flex-dispatcher-backend",
            "hybridep",
            "--enable-cuda-graph",
            "--use-nccl-ub",
        ]);
        let found: Vec<String> = a
            .unmodelled_memory_flags()
            .into_iter()
            .map(|f| f.0)
            .collect();
        assert_eq!(found, ["--enable-cuda-graph", "--use-nccl-ub"]);
        let a = MegatronArgs::parse([
            "--cuda-graph-impl",
            "none",
            "--moe-token-dispatcher-type",
            "alltoall",
        ]);
        assert!(a.unmodelled_memory_flags().is_empty());
    }

    #[test]
    fn allocator_configuration_reads_and_writes_expandable_segments() {
        assert_eq!(
            expandable_segments_in("expandable_segments:True"),
            Some(true)
        );
        assert_eq!(
            expandable_segments_in("max_split_size_mb:512, expandable_segments:False"),
            Some(false)
        );
        assert_eq!(expandable_segments_in("max_split_size_mb:512"), None);
        assert_eq!(
            with_expandable_segments("max_split_size_mb:512", true),
            "expandable_segments:True,max_split_size_mb:512"
        );
        assert_eq!(
            with_expandable_segments("expandable_segments:True,max_split_size_mb:512", false),
            "max_split_size_mb:512"
        );
        assert_eq!(
            with_expandable_segments("expandable_segments:True", false),
            ""
        );
    }

    #[test]
    fn shell_words_handle_quotes_and_escapes() {
        assert_eq!(
            shell_words(r#"a 'b c' "d \"e\"" f\ g; h"#),
            vec!["a", "b c", "d \"e\"", "f g", "h"]
        );
    }
}
