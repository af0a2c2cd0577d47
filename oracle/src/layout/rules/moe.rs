//! Legality of the MoE execution options and the execution options MoE recipes use
//! (`spec.parallelism.moe`, `fp8Recipe`, `cudaGraph`, `fsdpKind`), against the model, the
//! precision and the GPU's software stack. Each rule is Megatron-LM's own check, cited where it
//! lives (TC = `megatron/core/transformer/transformer_config.py`,
//! `TransformerConfig.__post_init__`), or the bounds a plan's numbers must keep.

use super::{Layout, LayoutError, Recompute, RecomputeModule, broken};
use crate::layout::{
    CudaGraphImpl, CudaGraphModule, FlexBackend, GroupedGemm, LoadBalancing, OffloadSet,
    RouterDtype, TokenDispatcher,
};
use crate::precision::Precision;
use crate::scenario::Scenario;

pub use crate::model::{MAX_CAPACITY_FACTOR, MIN_CAPACITY_FACTOR, capacity_factor_in_range};

impl Layout {
    /// Every rule of this module.
    pub(super) fn check_moe_options(&self, s: &Scenario) -> Result<(), LayoutError> {
        self.check_moe_model(s)?;
        self.check_dispatcher(s)?;
        self.check_capacity()?;
        self.check_ep_overlap(s)?;
        self.check_fp8_recipe(s)?;
        self.check_cuda_graph(s)?;
        self.check_fused_grouped_mlp(s)?;
        Ok(())
    }

    /// `moe.fusedGroupedMlp`: what Megatron-Core's `_is_fused_impl_supported`
    /// (`moe/experts.py`) needs to take the fused path: Transformer Engine's grouped linear
    /// (the grouped GEMM, not the legacy one), no tensor parallelism inside the experts, a
    /// gated SiLU/quick-GELU activation (the GLU the kernels fuse), no expert_fc1/moe_act
    /// offload; and the GPU's stack must run the CuTe-DSL kernels (the hardware profile's
    /// `fusedGroupedMlp`). Megatron does not refuse the op fuser otherwise, it silently runs
    /// the unfused experts: a plan saying fused must be what runs.
    fn check_fused_grouped_mlp(&self, s: &Scenario) -> Result<(), LayoutError> {
        const F: &str = "moe.fusedGroupedMlp";
        if !self.moe.fused_grouped_mlp {
            return Ok(());
        }
        let needs = if self.moe.grouped_gemm != GroupedGemm::Grouped {
            Some("groupedGemm grouped (Transformer Engine's grouped linear)")
        } else if self.etp > 1 {
            Some("etp 1 (no tensor parallelism inside the experts)")
        } else if s.model.activation != crate::model::Activation::Swiglu {
            Some("a gated (GLU) activation")
        } else if self.offload_set().intersects(OffloadSet::experts()) {
            Some("no expert_fc1 or moe_act in offloadModules")
        } else {
            None
        };
        if let Some(needs) = needs {
            return broken("fused-grouped-mlp-fits", F, || {
                format!(
                    "the fused grouped MLP needs {needs}; Megatron would run the unfused experts"
                )
            });
        }
        if !s.hardware.fused_grouped_mlp {
            return broken("fused-grouped-mlp-on-gpu", F, || {
                format!(
                    "{} does not run the fused grouped MLP's CuTe-DSL kernels (Blackwell only; the hardware profile's fusedGroupedMlp)",
                    s.hardware.product
                )
            });
        }
        Ok(())
    }

    /// The options only mean something for a mixture-of-experts model; legacy grouped GEMM has
    /// no bias (`experts.py:GroupedMLP` asserts `add_bias_linear == False`).
    fn check_moe_model(&self, s: &Scenario) -> Result<(), LayoutError> {
        if s.model.moe.is_none() && !self.moe.is_default() {
            return broken("moe-options-need-moe", "moe", || {
                format!(
                    "MoE execution options need a mixture-of-experts model; model {} is dense",
                    s.model.name
                )
            });
        }
        if self.moe.grouped_gemm == GroupedGemm::Legacy && s.model.mlp_bias {
            return broken("legacy-grouped-gemm-no-bias", "moe.groupedGemm", || {
                format!(
                    "legacy grouped GEMM (GroupedMLP) has no expert biases; model {} has them: use grouped (TEGroupedMLP)",
                    s.model.name
                )
            });
        }
        Ok(())
    }

    /// The flex backend: only with the flex dispatcher (TC), run by the GPU's stack (the
    /// hardware profile's `flexBackends`); the flex dispatcher needs ETP x EP > 1
    /// (`token_dispatcher.py`); Primus-Turbo DeepEP needs fp32 router probabilities
    /// and no shared-expert overlap (Primus `patches/args/rocm_arg_validation.py`); shared
    /// expert overlap needs alltoall or flex (TC).
    fn check_dispatcher(&self, s: &Scenario) -> Result<(), LayoutError> {
        let m = &self.moe;
        if m.flex_backend.is_some() && m.token_dispatcher != TokenDispatcher::Flex {
            return broken("flex-backend-needs-flex", "moe.flexBackend", || {
                format!(
                    "a flex backend needs tokenDispatcher flex (got {})",
                    m.token_dispatcher.as_str()
                )
            });
        }
        if let Some(b) = m.backend()
            && s.hardware.flex_backend(b).is_none()
        {
            let known: Vec<&str> = s
                .hardware
                .flex_backends
                .iter()
                .map(|p| p.backend.as_str())
                .collect();
            return broken("flex-backend-on-gpu", "moe.flexBackend", || {
                format!(
                    "{} does not run on {} (its stack runs: {})",
                    b.as_str(),
                    if s.hardware.name.is_empty() {
                        &s.hardware.product
                    } else {
                        &s.hardware.name
                    },
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                )
            });
        }
        if m.token_dispatcher == TokenDispatcher::Flex && self.ep as u64 * self.etp as u64 <= 1 {
            // MoEFlexTokenDispatcher.__init__ (megatron/core/transformer/moe/token_dispatcher.py):
            // "Flex token dispatcher requires TPxEP > 1" (its TP is the expert TP group).
            return broken(
                "flex-needs-etp-ep",
                "moe.tokenDispatcher",
                || "the flex dispatcher needs etp x ep > 1 (Megatron's MoEFlexTokenDispatcher)",
            );
        }
        if let Some(n) = m.flex_num_sms {
            if m.token_dispatcher != TokenDispatcher::Flex {
                return broken("flex-num-sms-needs-flex", "moe.flexNumSms", || {
                    format!(
                        "flexNumSms needs tokenDispatcher flex (got {})",
                        m.token_dispatcher.as_str()
                    )
                });
            }
            // DeepEP's kernels split their SMs into send/receive pairs
            // (`csrc/kernels/legacy/intranode.cu`: `EP_HOST_ASSERT(num_sms % 2 == 0)`); the
            // range is the field's bound.
            if n % 2 != 0 {
                return broken("flex-num-sms-even", "moe.flexNumSms", || {
                    format!("must be even (DeepEP pairs its SMs), got {n}")
                });
            }
            // Primus `rocm_arg_validation.py`: "Set `turbo_deepep_num_cu<=32` when using
            // ep_size >= 16" (its internode dispatch and combine).
            if m.backend() == Some(FlexBackend::PrimusTurboDeepep) && self.ep >= 16 && n > 32 {
                return broken("turbo-deepep-cus-internode", "moe.flexNumSms", || {
                    format!(
                        "Primus-Turbo DeepEP runs at most 32 CUs with ep >= 16 (got {n} with ep {})",
                        self.ep
                    )
                });
            }
        }
        if m.backend() == Some(FlexBackend::PrimusTurboDeepep) {
            if m.router_dtype != Some(RouterDtype::Fp32) {
                return broken(
                    "turbo-deepep-fp32-router",
                    "moe.routerDtype",
                    || "Primus-Turbo DeepEP needs routerDtype fp32",
                );
            }
            if m.shared_expert_overlap {
                return broken(
                    "turbo-deepep-no-shared-overlap",
                    "moe.sharedExpertOverlap",
                    || "Primus-Turbo DeepEP does not run with shared-expert overlap",
                );
            }
        }
        if m.shared_expert_stream_per_layer && !m.shared_expert_overlap {
            return broken(
                "shared-streams-need-overlap",
                "moe.sharedExpertStreamPerLayer",
                || "per-layer shared-expert streams exist only with sharedExpertOverlap",
            );
        }
        if m.shared_expert_overlap && m.token_dispatcher == TokenDispatcher::Allgather {
            return broken(
                "shared-overlap-needs-a2a",
                "moe.sharedExpertOverlap",
                || "shared-expert overlap works with the alltoall or flex dispatcher only",
            );
        }
        Ok(())
    }

    /// Capacity: a positive factor up to [`MAX_CAPACITY_FACTOR`]; only with the aux-loss family
    /// or no balancing (TC); padding needs a capacity factor and is not supported by DeepEP
    /// (TC); a per-rank capacity needs the hybridep backend (TC).
    fn check_capacity(&self) -> Result<(), LayoutError> {
        let m = &self.moe;
        for (name, v) in [
            ("moe.capacityFactor", m.capacity_factor),
            ("moe.rankCapacityFactor", m.rank_capacity_factor),
        ] {
            if let Some(f) = v
                && !capacity_factor_in_range(f.get())
            {
                return broken("capacity-factor-range", name, || {
                    format!(
                        "must be a number in [{MIN_CAPACITY_FACTOR}, {MAX_CAPACITY_FACTOR}], got {}",
                        crate::bounds::shown(f.get())
                    )
                });
            }
        }
        if m.capacity_factor.is_some() && m.load_balancing == LoadBalancing::Sinkhorn {
            return broken(
                "capacity-needs-aux-loss",
                "moe.capacityFactor",
                || "a capacity factor works with aux_loss, seq_aux_loss, global_aux_loss or none load balancing, not sinkhorn",
            );
        }
        if m.pad_to_capacity && m.capacity_factor.is_none() {
            return broken(
                "pad-needs-capacity",
                "moe.padToCapacity",
                || "padding to capacity needs a capacityFactor",
            );
        }
        if m.pad_to_capacity && m.backend() == Some(FlexBackend::Deepep) {
            return broken(
                "pad-not-with-deepep",
                "moe.padToCapacity",
                || "DeepEP does not pad expert inputs to capacity",
            );
        }
        if m.rank_capacity_factor.is_some() && m.backend() != Some(FlexBackend::Hybridep) {
            return broken(
                "rank-capacity-needs-hybridep",
                "moe.rankCapacityFactor",
                || "a per-rank capacity needs tokenDispatcher flex with flexBackend hybridep",
            );
        }
        Ok(())
    }

    /// `epOverlap` (TC, "Check if overlap_moe_expert_parallel_comm ..."): EP > 1, alltoall or
    /// flex, VPP with a pipeline, no full recompute nor `moe` in the recompute modules, no
    /// shared-expert overlap, at most one MTP layer; `delayWgrad` needs it.
    fn check_ep_overlap(&self, s: &Scenario) -> Result<(), LayoutError> {
        let m = &self.moe;
        if m.delay_wgrad && !m.ep_overlap {
            return broken(
                "delay-wgrad-needs-overlap",
                "moe.delayWgrad",
                || "delayWgrad needs epOverlap",
            );
        }
        if !m.ep_overlap {
            return Ok(());
        }
        const F: &str = "moe.epOverlap";
        let why = if self.ep <= 1 {
            "needs expert parallelism (ep > 1)"
        } else if m.token_dispatcher == TokenDispatcher::Allgather {
            "needs the alltoall or flex dispatcher"
        } else if self.pp > 1 && self.chunks() < 2 {
            "needs virtual pipeline stages (vpp > 1) with pipeline parallelism"
        } else if self.recompute == Recompute::Full {
            "does not run with full recompute"
        } else if self.recompute_set().contains(RecomputeModule::Moe) {
            "does not run with the moe recompute module"
        } else if m.shared_expert_overlap {
            "does not run with sharedExpertOverlap"
        } else if s.model.mtp_layers > 1 {
            "supports at most one MTP layer"
        } else {
            return Ok(());
        };
        broken("ep-overlap", F, || {
            format!("EP communication overlap {why}")
        })
    }

    /// `fp8Recipe`: with precision fp8 only, and a recipe the GPU's tensor cores run (MXFP8:
    /// Blackwell and CDNA 4; the hardware profile's `fp8Recipes`).
    fn check_fp8_recipe(&self, s: &Scenario) -> Result<(), LayoutError> {
        let Some(r) = self.fp8_recipe else {
            return Ok(());
        };
        if s.training.precision != Precision::Fp8 {
            return broken("fp8-recipe-needs-fp8", "fp8Recipe", || {
                format!("{} needs spec.training.precision fp8", r.as_str())
            });
        }
        if !s.hardware.supports_fp8_recipe(r) {
            return broken("fp8-recipe-on-gpu", "fp8Recipe", || {
                format!("{} does not run on {}", r.as_str(), s.hardware.product)
            });
        }
        Ok(())
    }

    /// `cudaGraph` (TC, the CUDA-graph checks): modules only with a per-layer implementation;
    /// `moe_preprocess` needs `moe_router`; capturing the MoE block (`moe`, or the whole layer
    /// of a MoE model) needs drop-and-pad routing; `mlp` needs dense layers; full recompute
    /// only with full-iteration graphs.
    fn check_cuda_graph(&self, s: &Scenario) -> Result<(), LayoutError> {
        let g = &self.cuda_graph;
        const F: &str = "cudaGraph.modules";
        match g.implementation {
            CudaGraphImpl::None | CudaGraphImpl::FullIteration if !g.modules.is_empty() => {
                return broken("cuda-graph-modules-need-per-layer", F, || {
                    format!(
                        "capture modules need impl local or transformer_engine (impl is {})",
                        g.implementation.as_str()
                    )
                });
            }
            CudaGraphImpl::None => return Ok(()),
            _ => {}
        }
        for (i, m) in g.modules.iter().enumerate() {
            if g.modules[..i].contains(m) {
                return broken("cuda-graph-modules-unique", F, || {
                    format!("lists {} twice", m.as_str())
                });
            }
        }
        let per_layer = g.implementation != CudaGraphImpl::FullIteration;
        let has = |m| g.modules.contains(&m);
        if has(CudaGraphModule::MoePreprocess) && !has(CudaGraphModule::MoeRouter) {
            return broken(
                "cuda-graph-preprocess-needs-router",
                F,
                || "moe_preprocess needs moe_router",
            );
        }
        if let Some(moe) = &s.model.moe {
            let whole_block = per_layer && (g.modules.is_empty() || has(CudaGraphModule::Moe));
            let drop_pad = self.moe.capacity_factor.is_some() || moe.capacity_factor.is_some();
            if whole_block && !(drop_pad && self.moe.pad_to_capacity) {
                return broken(
                    "cuda-graph-moe-needs-drop-pad",
                    F,
                    || "capturing the MoE block (moe, or the whole layer) needs capacityFactor with padToCapacity",
                );
            }
            if has(CudaGraphModule::Mlp) && moe.dense_layers == 0 {
                return broken(
                    "cuda-graph-mlp-needs-dense",
                    F,
                    || "mlp captures dense MLPs; every layer of this model is a MoE layer",
                );
            }
        }
        if self.recompute == Recompute::Full && per_layer {
            return broken(
                "cuda-graph-full-recompute",
                "cudaGraph.impl",
                || "full recompute runs with full_iteration graphs only",
            );
        }
        Ok(())
    }
}
