//! The flags of the MoE execution options and of the execution options MoE recipes use
//! (`spec.parallelism.moe`, `fp8Recipe`, `cudaGraph`, `fsdpKind`): written by
//! [`super::layout_args`], read back by [`super::MegatronArgs::layout`]. Megatron-Core generates
//! most of them from `TransformerConfig` fields (`megatron/training/argument_utils.py`:
//! `moe_token_dispatcher_type` -> `--moe-token-dispatcher-type`); Primus-Turbo's DeepEP is
//! switched on by Primus's own overrides (`--enable_primus_turbo True --use_turbo_deepep True`,
//! `docs/04-technical-guides/moe-training.md`).
//!
//! Every MoE job names its dispatcher (`--moe-token-dispatcher-type`, also Megatron's default
//! `allgather`) and its load balancing; the other options are written when they differ from
//! Megatron's default, which is exactly what Megatron runs without the flag (sequential experts
//! without `--moe-grouped-gemm`).

use crate::error::FieldError;
use crate::layout::{
    CudaGraphImpl, CudaGraphModule, Factor, FlexBackend, Fp8Recipe, FsdpKind, GroupedGemm, Layout,
    LoadBalancing, RouterDtype, TokenDispatcher,
};
use crate::scenario::Scenario;

use super::{MegatronArgs, flag};

/// The option flags, one constant each, shared by the writer and the parser.
pub mod moe_flag {
    pub const DISPATCHER: &str = "--moe-token-dispatcher-type";
    pub const FLEX_BACKEND: &str = "--moe-flex-dispatcher-backend";
    /// Primus: turn on Primus-Turbo (needed by the next).
    pub const PRIMUS_TURBO: &str = "--enable_primus_turbo";
    /// Primus: Primus-Turbo's DeepEP dispatcher.
    pub const TURBO_DEEPEP: &str = "--use_turbo_deepep";
    pub const GROUPED_GEMM: &str = "--moe-grouped-gemm";
    pub const LEGACY_GROUPED_GEMM: &str = "--moe-use-legacy-grouped-gemm";
    pub const PERMUTE_FUSION: &str = "--moe-permute-fusion";
    pub const ROUTER_FUSION: &str = "--moe-router-fusion";
    /// Transformer Engine's op fuser for the experts (`fusedGroupedMlp`, with
    /// [`crate::megatron::FUSED_GROUPED_MLP_ENV`]).
    pub const TE_OP_FUSER: &str = "--use-transformer-engine-op-fuser";
    pub const SHARED_EXPERT_OVERLAP: &str = "--moe-shared-expert-overlap";
    pub const EP_OVERLAP: &str = "--overlap-moe-expert-parallel-comm";
    pub const DELAY_WGRAD: &str = "--delay-wgrad-compute";
    pub const LOAD_BALANCING: &str = "--moe-router-load-balancing-type";
    pub const FORCE_BALANCE: &str = "--moe-router-force-load-balancing";
    pub const PAD_TO_CAPACITY: &str = "--moe-pad-expert-input-to-capacity";
    pub const RANK_CAPACITY: &str = "--moe-expert-rank-capacity-factor";
    pub const ROUTER_DTYPE: &str = "--moe-router-dtype";
    /// SMs of the flex dispatcher's kernels (Megatron-Core 0.16+; the deprecated per-backend
    /// `--moe-deepep-num-sms` / `--moe-hybridep-num-sms` are read too).
    pub const FLEX_NUM_SMS: &str = "--moe-flex-dispatcher-num-sms";
    pub const DEEPEP_NUM_SMS: &str = "--moe-deepep-num-sms";
    pub const HYBRIDEP_NUM_SMS: &str = "--moe-hybridep-num-sms";
    /// Primus: the CUs of Primus-Turbo's DeepEP (`turbo_deepep_num_cu`, default 32).
    pub const TURBO_DEEPEP_NUM_CU: &str = "--turbo_deepep_num_cu";
    pub const FP8_RECIPE: &str = "--fp8-recipe";
    pub const CUDA_GRAPH_IMPL: &str = "--cuda-graph-impl";
    /// Takes a list: the values up to the next flag.
    pub const CUDA_GRAPH_MODULES: &str = "--cuda-graph-modules";
    /// Full-iteration graphs need it (`megatron/training/arguments.py`).
    pub const NO_NAN_CHECK: &str = "--no-check-for-nan-in-loss-and-grad";
    pub const MEGATRON_FSDP: &str = "--use-megatron-fsdp";
    pub const SHARDING_STRATEGY: &str = "--data-parallel-sharding-strategy";
}

use moe_flag as f;

/// The environment variable under which Transformer Engine's op fuser runs the experts'
/// CuTe-DSL fused grouped MLP (Megatron-Core `moe/experts.py`, `_is_fused_impl_supported`:
/// `NVTE_CUTEDSL_FUSED_GROUPED_MLP` > 0); the job writer sets it to 1 with the flag.
pub const FUSED_GROUPED_MLP_ENV: &str = "NVTE_CUTEDSL_FUSED_GROUPED_MLP";

/// Switches among the option flags.
pub const SWITCHES: &[&str] = &[
    f::GROUPED_GEMM,
    f::LEGACY_GROUPED_GEMM,
    f::PERMUTE_FUSION,
    f::ROUTER_FUSION,
    f::TE_OP_FUSER,
    f::SHARED_EXPERT_OVERLAP,
    f::EP_OVERLAP,
    f::DELAY_WGRAD,
    f::FORCE_BALANCE,
    f::PAD_TO_CAPACITY,
    f::NO_NAN_CHECK,
    f::MEGATRON_FSDP,
];

/// Valued flags among the option flags (what a job writer removes from a template, with its
/// value, before appending a layout's).
pub const VALUED: &[&str] = &[
    f::DISPATCHER,
    f::FLEX_BACKEND,
    f::PRIMUS_TURBO,
    f::TURBO_DEEPEP,
    f::LOAD_BALANCING,
    f::RANK_CAPACITY,
    f::ROUTER_DTYPE,
    f::FP8_RECIPE,
    f::CUDA_GRAPH_IMPL,
    f::CUDA_GRAPH_MODULES,
    f::SHARDING_STRATEGY,
];

/// The option flags of a layout, in a stable order.
pub(super) fn write(s: &Scenario, l: &Layout, a: &mut Vec<String>) {
    let mut kv = |k: &str, v: &str| {
        a.push(k.to_string());
        a.push(v.to_string());
    };
    if let Some(card) = &s.model.moe {
        let m = &l.moe;
        kv(f::DISPATCHER, m.token_dispatcher.as_str());
        match m.flex_backend {
            Some(FlexBackend::PrimusTurboDeepep) => {
                kv(f::PRIMUS_TURBO, "True");
                kv(f::TURBO_DEEPEP, "True");
            }
            Some(b) => kv(f::FLEX_BACKEND, b.as_str()),
            None => {}
        }
        kv(f::LOAD_BALANCING, m.load_balancing.as_str());
        if let Some(c) = m.capacity_factor
            && card.capacity_factor != Some(c.get())
        {
            kv(flag::MOE_CAPACITY, &c.get().to_string());
        }
        if let Some(c) = m.rank_capacity_factor {
            kv(f::RANK_CAPACITY, &c.get().to_string());
        }
        if let Some(d) = m.router_dtype {
            kv(f::ROUTER_DTYPE, d.as_str());
        }
        if let Some(n) = m.flex_num_sms {
            let name = match m.backend() {
                Some(FlexBackend::PrimusTurboDeepep) => f::TURBO_DEEPEP_NUM_CU,
                _ => f::FLEX_NUM_SMS,
            };
            kv(name, &n.to_string());
        }
    }
    if let Some(r) = l.fp8_recipe {
        kv(f::FP8_RECIPE, r.as_str());
    }
    if !l.cuda_graph.is_none() {
        kv(f::CUDA_GRAPH_IMPL, l.cuda_graph.implementation.as_str());
    }
    if l.fsdp && l.fsdp_kind == FsdpKind::Megatron {
        kv(f::SHARDING_STRATEGY, "optim_grads_params");
    }
    if !l.cuda_graph.modules.is_empty() {
        a.push(f::CUDA_GRAPH_MODULES.into());
        a.extend(l.cuda_graph.modules.iter().map(|m| m.as_str().to_string()));
    }
    let m = &l.moe;
    for (on, name) in [
        (m.grouped_gemm != GroupedGemm::Sequential, f::GROUPED_GEMM),
        (
            m.grouped_gemm == GroupedGemm::Legacy,
            f::LEGACY_GROUPED_GEMM,
        ),
        (m.permute_fusion, f::PERMUTE_FUSION),
        (m.router_fusion, f::ROUTER_FUSION),
        (m.fused_grouped_mlp, f::TE_OP_FUSER),
        (m.shared_expert_overlap, f::SHARED_EXPERT_OVERLAP),
        (m.ep_overlap, f::EP_OVERLAP),
        (m.delay_wgrad, f::DELAY_WGRAD),
        (m.force_load_balancing, f::FORCE_BALANCE),
        (m.pad_to_capacity, f::PAD_TO_CAPACITY),
        (
            l.cuda_graph.implementation == CudaGraphImpl::FullIteration,
            f::NO_NAN_CHECK,
        ),
    ] {
        if on {
            a.push(name.to_string());
        }
    }
}

/// Whether a Primus-style boolean override (`True`, `true`, `1`) is on.
fn truthy(v: Option<&str>) -> bool {
    matches!(v, Some("True" | "true" | "1"))
}

/// A capacity factor flag (Megatron: a negative value means none).
fn factor(args: &MegatronArgs, name: &str) -> Result<Option<Factor>, FieldError> {
    Ok(args.num::<f64>(name)?.filter(|v| *v >= 0.0).map(Factor))
}

/// Read the option flags into a layout (the rest of it already read).
pub(super) fn read(
    args: &MegatronArgs,
    model: &crate::model::ModelCard,
    l: &mut Layout,
) -> Result<(), FieldError> {
    let names = |all: &[&'static str]| all.to_vec();
    let m = &mut l.moe;
    if let Some(d) = args.choice(
        f::DISPATCHER,
        TokenDispatcher::parse,
        &names(&TokenDispatcher::ALL.map(|d| d.as_str())),
    )? {
        m.token_dispatcher = d;
    }
    m.flex_backend = args.choice(
        f::FLEX_BACKEND,
        |v| FlexBackend::parse(v).filter(|b| *b != FlexBackend::PrimusTurboDeepep),
        &["deepep", "hybridep"],
    )?;
    if truthy(args.get(f::TURBO_DEEPEP)) {
        m.token_dispatcher = TokenDispatcher::Flex;
        m.flex_backend = Some(FlexBackend::PrimusTurboDeepep);
    }
    m.grouped_gemm = match (args.has(f::GROUPED_GEMM), args.has(f::LEGACY_GROUPED_GEMM)) {
        (true, true) => GroupedGemm::Legacy,
        (true, false) => GroupedGemm::Grouped,
        (false, _) => GroupedGemm::Sequential,
    };
    m.permute_fusion = args.has(f::PERMUTE_FUSION);
    m.router_fusion = args.has(f::ROUTER_FUSION);
    // The op fuser runs the fused kernels only with the CuTe-DSL environment variable, which
    // the job writer sets beside the flag (`FUSED_GROUPED_MLP_ENV`); a flag alone is read as
    // the layout asks, the memory model being the same either way.
    m.fused_grouped_mlp = args.has(f::TE_OP_FUSER) && model.moe.is_some();
    m.shared_expert_overlap = args.has(f::SHARED_EXPERT_OVERLAP);
    m.ep_overlap = args.has(f::EP_OVERLAP);
    m.delay_wgrad = args.has(f::DELAY_WGRAD);
    m.force_load_balancing = args.has(f::FORCE_BALANCE);
    m.pad_to_capacity = args.has(f::PAD_TO_CAPACITY);
    if let Some(b) = args.choice(
        f::LOAD_BALANCING,
        LoadBalancing::parse,
        &names(&LoadBalancing::ALL.map(|d| d.as_str())),
    )? {
        m.load_balancing = b;
    }
    let card_capacity = model.moe.as_ref().and_then(|c| c.capacity_factor);
    m.capacity_factor =
        factor(args, flag::MOE_CAPACITY)?.filter(|c| Some(c.get()) != card_capacity);
    m.rank_capacity_factor = factor(args, f::RANK_CAPACITY)?;
    m.router_dtype = args.choice(
        f::ROUTER_DTYPE,
        RouterDtype::parse,
        &names(&RouterDtype::ALL.map(|d| d.as_str())),
    )?;
    // The flex dispatcher's SMs: Primus-Turbo's own flag for its DeepEP, else Megatron's
    // (the unified flag before the deprecated per-backend ones, as Megatron routes them).
    let sms_flags: &[&str] = match m.backend() {
        Some(FlexBackend::PrimusTurboDeepep) => &[f::TURBO_DEEPEP_NUM_CU],
        Some(FlexBackend::Hybridep) => &[f::FLEX_NUM_SMS, f::HYBRIDEP_NUM_SMS],
        Some(FlexBackend::Deepep) => &[f::FLEX_NUM_SMS, f::DEEPEP_NUM_SMS],
        None => &[],
    };
    m.flex_num_sms = None;
    for name in sms_flags {
        if let Some(n) = args.num::<u32>(name)? {
            m.flex_num_sms = Some(n);
            break;
        }
    }
    l.fp8_recipe = args.choice(
        f::FP8_RECIPE,
        Fp8Recipe::parse,
        &names(&Fp8Recipe::ALL.map(|d| d.as_str())),
    )?;
    if let Some(i) = args.choice(
        f::CUDA_GRAPH_IMPL,
        CudaGraphImpl::parse,
        &names(&CudaGraphImpl::ALL.map(|d| d.as_str())),
    )? {
        l.cuda_graph.implementation = i;
    }
    if let Some(list) = args.get(f::CUDA_GRAPH_MODULES) {
        l.cuda_graph.modules = list
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|w| !w.is_empty())
            .map(|w| {
                CudaGraphModule::parse(w).ok_or_else(|| {
                    FieldError::new(
                        f::CUDA_GRAPH_MODULES,
                        format!(
                            "{w:?} is not a capture module ({})",
                            CudaGraphModule::ALL.map(|m| m.as_str()).join(", ")
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
    }
    if args.has(f::MEGATRON_FSDP) {
        l.fsdp = true;
        l.fsdp_kind = FsdpKind::Megatron;
        l.distributed_optimizer = false;
    }
    Ok(())
}
