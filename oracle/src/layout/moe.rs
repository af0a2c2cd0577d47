//! The mixture-of-experts execution options of a layout (`spec.parallelism.moe`): how tokens
//! reach the experts and back, how the experts' GEMMs run, how the router balances load, and
//! which MoE communication is overlapped. Each field is one Megatron-Core `TransformerConfig`
//! (or `ModelParallelConfig`) field, spelled as its command-line flag spells its values
//! (`megatron/core/transformer/transformer_config.py`, flags generated from the fields by
//! `megatron/training/argument_utils.py:ArgumentGroupFactory`: `moe_token_dispatcher_type` is
//! `--moe-token-dispatcher-type`). A layout that does not mention an option gets Megatron's
//! default for it: the `allgather` dispatcher, sequential experts (`SequentialMLP`), no
//! permute or router fusion, no overlap, auxiliary-loss routing without forced balance,
//! dropless, router in the input dtype.
//!
//! What each option does to time and memory is modelled in `compute/ops.rs` (op lists),
//! `projection/layer.rs` (dispatch, overlap, host time) and `memory/` (buffers); the legality
//! rules (Megatron's own asserts, cited there) are in `rules/moe.rs`.

use serde::{Deserialize, Serialize};

use crate::bounds::{Bound, Bounded};

pub use crate::backend::FlexBackend;

/// A positive real factor (capacity factors): compared and hashed by its bits, so a layout
/// stays a hashable key. The legality rules keep it finite and positive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(transparent)]
pub struct Factor(pub f64);

impl Eq for Factor {}

impl std::hash::Hash for Factor {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

impl Factor {
    pub fn get(self) -> f64 {
        self.0
    }
}

/// Megatron's `--moe-token-dispatcher-type` (`MoEAllGatherTokenDispatcher`,
/// `MoEAlltoAllTokenDispatcher`, `MoEFlexTokenDispatcher` in
/// `megatron/core/transformer/moe/token_dispatcher.py`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum TokenDispatcher {
    /// All-gather the tokens over the TP x EP group, mask the local experts, reduce-scatter
    /// the outputs (Megatron's default).
    #[default]
    Allgather,
    /// Permute k copies per token and exchange them with NCCL all-to-all over EP.
    Alltoall,
    /// A fused dispatch/combine library (`flexBackend`): one copy per token and destination
    /// rank, the permute inside the communication kernel.
    Flex,
}

impl TokenDispatcher {
    pub const ALL: [TokenDispatcher; 3] = [
        TokenDispatcher::Allgather,
        TokenDispatcher::Alltoall,
        TokenDispatcher::Flex,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TokenDispatcher::Allgather => "allgather",
            TokenDispatcher::Alltoall => "alltoall",
            TokenDispatcher::Flex => "flex",
        }
    }

    pub fn parse(v: &str) -> Option<TokenDispatcher> {
        TokenDispatcher::ALL.into_iter().find(|d| d.as_str() == v)
    }
}

/// Host synchronisations of Megatron-Core's unfused dropless token permutation per MoE layer
/// forward (`moe_utils.py:permute`: `masked_select` of the token indices and of the
/// probabilities).
pub const UNFUSED_PERMUTE_SYNCS: u32 = 2;
/// Host synchronisations of the DeepEP managers' unfused index-to-multihot conversion per MoE
/// layer forward (`indices[mask]`, `repeat_interleave`'s output size and its non-negative
/// check, `probs[mask]`), and in the backward (the `probs[mask]` gradient's boolean
/// `index_put_`).
pub const UNFUSED_MULTIHOT_SYNCS: u32 = 4;
pub const UNFUSED_MULTIHOT_BACKWARD_SYNCS: u32 = 1;

/// A dispatcher as one choice (what the tuner searches and `spec.tuning` names): the
/// dispatcher, with the flex backend for the flex ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "kebab-case")]
pub enum Dispatch {
    Allgather,
    Alltoall,
    Deepep,
    Hybridep,
    PrimusTurboDeepep,
}

impl Dispatch {
    pub const ALL: [Dispatch; 5] = [
        Dispatch::Allgather,
        Dispatch::Alltoall,
        Dispatch::Deepep,
        Dispatch::Hybridep,
        Dispatch::PrimusTurboDeepep,
    ];

    /// The dispatcher and flex backend.
    pub fn parts(self) -> (TokenDispatcher, Option<FlexBackend>) {
        match self {
            Dispatch::Allgather => (TokenDispatcher::Allgather, None),
            Dispatch::Alltoall => (TokenDispatcher::Alltoall, None),
            Dispatch::Deepep => (TokenDispatcher::Flex, Some(FlexBackend::Deepep)),
            Dispatch::Hybridep => (TokenDispatcher::Flex, Some(FlexBackend::Hybridep)),
            Dispatch::PrimusTurboDeepep => {
                (TokenDispatcher::Flex, Some(FlexBackend::PrimusTurboDeepep))
            }
        }
    }

    /// The choice of a flex backend.
    pub fn of_backend(b: FlexBackend) -> Dispatch {
        match b {
            FlexBackend::Deepep => Dispatch::Deepep,
            FlexBackend::Hybridep => Dispatch::Hybridep,
            FlexBackend::PrimusTurboDeepep => Dispatch::PrimusTurboDeepep,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Dispatch::Allgather => "allgather",
            Dispatch::Alltoall => "alltoall",
            Dispatch::Deepep => "deepep",
            Dispatch::Hybridep => "hybridep",
            Dispatch::PrimusTurboDeepep => "primus-turbo-deepep",
        }
    }
}

/// How the local experts' GEMMs run.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum GroupedGemm {
    /// `SequentialMLP`: a Python loop over the local experts, one MLP module each (Megatron's
    /// default without `--moe-grouped-gemm`).
    #[default]
    Sequential,
    /// `TEGroupedMLP`: Transformer Engine's grouped linear (`--moe-grouped-gemm`).
    Grouped,
    /// The legacy `GroupedMLP` on the grouped_gemm package (`gmm`), which issues one cuBLAS
    /// (hipBLAS on ROCm) GEMM per local expert from C++, round-robin on four streams, in BF16
    /// only, also under FP8 training (`--moe-grouped-gemm --moe-use-legacy-grouped-gemm`;
    /// Megatron-Core 0.14-0.17, Primus).
    Legacy,
}

impl GroupedGemm {
    pub const ALL: [GroupedGemm; 3] = [
        GroupedGemm::Sequential,
        GroupedGemm::Grouped,
        GroupedGemm::Legacy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GroupedGemm::Sequential => "sequential",
            GroupedGemm::Grouped => "grouped",
            GroupedGemm::Legacy => "legacy",
        }
    }

    pub fn parse(v: &str) -> Option<GroupedGemm> {
        GroupedGemm::ALL.into_iter().find(|d| d.as_str() == v)
    }

    /// Whether the experts' GEMMs run in FP8 under FP8 training: not on the legacy grouped
    /// GEMM, whose grouped_gemm `gmm` takes BF16 operands only (`csrc/grouped_gemm.cu`:
    /// TORCH_CHECK kBFloat16), so its experts keep BF16 GEMMs, BF16 weights without FP8 forms,
    /// BF16 saved inputs and no FP8 row padding.
    pub fn runs_fp8(self) -> bool {
        self != GroupedGemm::Legacy
    }
}

/// Megatron's `--moe-router-load-balancing-type`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum LoadBalancing {
    /// Auxiliary load-balancing loss over the micro-batch (Megatron's default).
    #[default]
    AuxLoss,
    /// Auxiliary loss per sequence (DeepSeek-V3).
    SeqAuxLoss,
    /// Auxiliary loss over the global batch.
    GlobalAuxLoss,
    /// Sinkhorn balancing (S-BASE).
    Sinkhorn,
    /// No balancing term (gpt-oss; DeepSeek's bias-based balancing rides on it).
    None,
}

impl LoadBalancing {
    pub const ALL: [LoadBalancing; 5] = [
        LoadBalancing::AuxLoss,
        LoadBalancing::SeqAuxLoss,
        LoadBalancing::GlobalAuxLoss,
        LoadBalancing::Sinkhorn,
        LoadBalancing::None,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LoadBalancing::AuxLoss => "aux_loss",
            LoadBalancing::SeqAuxLoss => "seq_aux_loss",
            LoadBalancing::GlobalAuxLoss => "global_aux_loss",
            LoadBalancing::Sinkhorn => "sinkhorn",
            LoadBalancing::None => "none",
        }
    }

    pub fn parse(v: &str) -> Option<LoadBalancing> {
        LoadBalancing::ALL.into_iter().find(|d| d.as_str() == v)
    }
}

/// Megatron's `--moe-router-dtype`: the precision of the router's scores, top-k and losses
/// (absent: the input dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum RouterDtype {
    Fp32,
    Fp64,
}

impl RouterDtype {
    pub const ALL: [RouterDtype; 2] = [RouterDtype::Fp32, RouterDtype::Fp64];

    pub fn as_str(self) -> &'static str {
        match self {
            RouterDtype::Fp32 => "fp32",
            RouterDtype::Fp64 => "fp64",
        }
    }

    pub fn parse(v: &str) -> Option<RouterDtype> {
        RouterDtype::ALL.into_iter().find(|d| d.as_str() == v)
    }

    /// Bytes per router score element.
    pub fn bytes(self) -> f64 {
        match self {
            RouterDtype::Fp32 => 4.0,
            RouterDtype::Fp64 => 8.0,
        }
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// `spec.parallelism.moe`: the MoE execution options (see the module documentation). Every
/// field defaults to what Megatron-LM does without its flag.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<MoeOptions>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MoeOptions {
    /// Token dispatcher (`--moe-token-dispatcher-type`): allgather (default), alltoall, flex.
    #[serde(default)]
    pub token_dispatcher: TokenDispatcher,
    /// The flex dispatcher's library (`--moe-flex-dispatcher-backend`, or Primus's
    /// `--use_turbo_deepep`): deepep (Megatron's default with flex), hybridep,
    /// primus-turbo-deepep. Only with tokenDispatcher flex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flex_backend: Option<FlexBackend>,
    /// Expert GEMMs: sequential (default, `SequentialMLP`), grouped (`--moe-grouped-gemm`,
    /// Transformer Engine's grouped linear), legacy (`--moe-use-legacy-grouped-gemm`).
    #[serde(default)]
    pub grouped_gemm: GroupedGemm,
    /// Fused permute/unpermute kernels (`--moe-permute-fusion`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub permute_fusion: bool,
    /// Fused router top-k and aux-loss kernels (`--moe-router-fusion`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub router_fusion: bool,
    /// The routed experts as one fused grouped MLP (`--use-transformer-engine-op-fuser` with
    /// `NVTE_CUTEDSL_FUSED_GROUPED_MLP=1`): fc1, the probability-scaled (clamped) GLU and fc2
    /// with its scaled bias in cuDNN's CuTe-DSL grouped-GEMM kernels, the GLU and its
    /// backward in the GEMM epilogues (Megatron-Core `moe/experts.py`,
    /// `_is_fused_impl_supported`); needs the grouped GEMM, expert TP 1, a gated activation and
    /// a GPU whose hardware profile lists the kernels.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fused_grouped_mlp: bool,
    /// Run the shared experts on a side stream during dispatch/combine
    /// (`--moe-shared-expert-overlap`); alltoall or flex only.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared_expert_overlap: bool,
    /// With sharedExpertOverlap: the image's Megatron-Core gives every MoE layer its own side
    /// stream, as releases before 0.18 do (`shared_experts.py`: `self.stream =
    /// torch.cuda.Stream()` per layer; one shared stream since PR #3752, core_v0.18.0), e.g.
    /// rocm/megatron-lm v25.10 and Primus' 2025 images. Each stream's caching-allocator pool
    /// then keeps its layer's shared-expert backward buffers. Not a Megatron flag: the
    /// webhook cannot read it from a job and assumes a current Megatron-Core.
    #[serde(default, skip_serializing_if = "is_false")]
    pub shared_expert_stream_per_layer: bool,
    /// Overlap the EP dispatch/combine of one micro-batch with the computation of another
    /// (`--overlap-moe-expert-parallel-comm`, Megatron's combined 1F1B schedule).
    #[serde(default, skip_serializing_if = "is_false")]
    pub ep_overlap: bool,
    /// Delay the experts' weight-gradient GEMMs to fill the overlap's communication gaps
    /// (`--delay-wgrad-compute`); needs epOverlap.
    #[serde(default, skip_serializing_if = "is_false")]
    pub delay_wgrad: bool,
    /// Load-balancing loss (`--moe-router-load-balancing-type`), default aux_loss.
    #[serde(default)]
    pub load_balancing: LoadBalancing,
    /// Replace the router's choice by uniformly random experts, a benchmark setting that
    /// every published MoE throughput table uses (`--moe-router-force-load-balancing`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub force_load_balancing: bool,
    /// Tokens per expert as a multiple of the balanced load (`--moe-expert-capacity-factor`);
    /// absent = dropless. Tokens beyond capacity are dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_factor: Option<Factor>,
    /// Pad every expert's input to its capacity (`--moe-pad-expert-input-to-capacity`): static
    /// shapes, no host synchronisation; needs capacityFactor.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pad_to_capacity: bool,
    /// Per-EP-rank token budget of the hybridep backend as a multiple of the balanced load
    /// (`--moe-expert-rank-capacity-factor`): static receive buffers, no host sync.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_capacity_factor: Option<Factor>,
    /// Router precision (`--moe-router-dtype`): fp32, fp64; absent = the input dtype.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_dtype: Option<RouterDtype>,
    /// SMs (CUs on AMD) the flex dispatcher's kernels run on
    /// (`--moe-flex-dispatcher-num-sms`; Primus-Turbo DeepEP: `--turbo_deepep_num_cu`): an even
    /// number from 2 to 1024; absent = the library's default (DeepEP under
    /// Megatron 20, Primus-Turbo DeepEP 32). DeepEP sizes its buffers by it (one channel per
    /// two SMs); the time model does not use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flex_num_sms: Option<u32>,
}

/// The most SMs or CUs a plan may give the flex dispatcher (`flexNumSms`): above any GPU's
/// count (MI355X has 256 CUs, B200 148 SMs).
pub const MAX_FLEX_NUM_SMS: u32 = 1024;

/// The options' numbers, bounded (the factors' range is a legality rule: they are floats).
impl Bounded for MoeOptions {
    const BOUNDS: &'static [Bound<Self>] =
        &[Bound::int("flexNumSms", 2, MAX_FLEX_NUM_SMS as u64, |m| {
            m.flex_num_sms.into()
        })];
}

impl MoeOptions {
    /// Every option at Megatron's default.
    pub fn is_default(&self) -> bool {
        *self == MoeOptions::default()
    }

    /// The flex backend in effect (Megatron's default deepep when flex names none); `None`
    /// for the other dispatchers.
    pub fn backend(&self) -> Option<FlexBackend> {
        match self.token_dispatcher {
            TokenDispatcher::Flex => Some(self.flex_backend.unwrap_or_default()),
            _ => None,
        }
    }

    /// The dispatcher as one word: allgather, alltoall, or the flex backend.
    pub fn dispatch_label(&self) -> &'static str {
        self.dispatch().as_str()
    }

    /// The dispatcher as one choice.
    pub fn dispatch(&self) -> Dispatch {
        match (self.token_dispatcher, self.backend()) {
            (TokenDispatcher::Allgather, _) => Dispatch::Allgather,
            (TokenDispatcher::Alltoall, _) => Dispatch::Alltoall,
            (TokenDispatcher::Flex, b) => Dispatch::of_backend(b.unwrap_or_default()),
        }
    }

    /// Set the dispatcher of a choice, with what it needs: Primus-Turbo DeepEP takes fp32
    /// router probabilities and no shared-expert overlap (Primus `rocm_arg_validation.py`).
    pub fn set_dispatch(&mut self, d: Dispatch) {
        let (dispatcher, backend) = d.parts();
        self.token_dispatcher = dispatcher;
        self.flex_backend = backend;
        if d == Dispatch::PrimusTurboDeepep {
            self.router_dtype = Some(RouterDtype::Fp32);
            self.shared_expert_overlap = false;
            self.shared_expert_stream_per_layer = false;
        }
    }

    /// Whether the dispatcher needs the per-expert token counts on the host before it can
    /// launch the rest of the layer (a device-to-host synchronisation per MoE layer pass).
    /// Static shapes avoid it: drop-and-pad capacity, and the hybridep backend with a
    /// per-rank capacity (`_HybridEPManager`: "None means no up-bound, will cause a CPU
    /// sync").
    pub fn host_sync(&self) -> bool {
        if self.capacity_factor.is_some() && self.pad_to_capacity {
            return false;
        }
        !(self.backend() == Some(FlexBackend::Hybridep) && self.rank_capacity_factor.is_some())
    }

    /// Device-to-host synchronisations of one MoE layer per micro-batch, forward and backward.
    /// The dispatcher's own (the token counts' copy; DeepEP's host busy-wait on the receive
    /// counter) whenever [`MoeOptions::host_sync`], and the ones the unfused token
    /// permutation adds (dropless): Megatron-Core's `moe_utils.py:permute` without
    /// `--moe-permute-fusion` selects the token indices and the probabilities with two
    /// `masked_select` calls, each a `nonzero` whose output size the host must read; the
    /// DeepEP managers' unfused `_indices_to_multihot` (`token_dispatcher.py`; Primus-Turbo's
    /// `indices_converter.py` alike) add four more (`indices[mask]`, `repeat_interleave`'s two
    /// size checks, `probs[mask]`) and one in the backward (the boolean-index gradient's
    /// `index_put_`). The fused kernels take their sizes from the host's counts; HybridEP
    /// permutes inside its dispatch kernels.
    pub fn host_syncs(&self) -> (u32, u32) {
        if !self.host_sync() {
            return (0, 0);
        }
        let unfused = !self.permute_fusion;
        match self.dispatch() {
            Dispatch::Hybridep => (1, 0),
            Dispatch::Allgather | Dispatch::Alltoall if unfused => (1 + UNFUSED_PERMUTE_SYNCS, 0),
            Dispatch::Deepep | Dispatch::PrimusTurboDeepep if unfused => (
                1 + UNFUSED_PERMUTE_SYNCS + UNFUSED_MULTIHOT_SYNCS,
                UNFUSED_MULTIHOT_BACKWARD_SYNCS,
            ),
            _ => (1, 0),
        }
    }

    /// The options in a compact label, e.g. `alltoall grouped permute-fusion ep-overlap
    /// forced`; empty at Megatron's defaults.
    pub fn label(&self) -> String {
        if self.is_default() {
            return String::new();
        }
        let mut parts: Vec<String> = vec![self.dispatch_label().to_string()];
        if self.grouped_gemm != GroupedGemm::Sequential {
            parts.push(self.grouped_gemm.as_str().to_string());
        }
        for (on, name) in [
            (self.permute_fusion, "pf"),
            (self.fused_grouped_mlp, "fused-mlp"),
            (self.shared_expert_overlap, "seo"),
            (self.shared_expert_stream_per_layer, "seo-streams"),
            (self.ep_overlap, "a2a-ovl"),
            (self.delay_wgrad, "dwg"),
            (self.force_load_balancing, "forced"),
        ] {
            if on {
                parts.push(name.to_string());
            }
        }
        if let Some(c) = self.capacity_factor {
            parts.push(format!(
                "cf{}{}",
                c.get(),
                if self.pad_to_capacity { "pad" } else { "" }
            ));
        }
        if let Some(c) = self.rank_capacity_factor {
            parts.push(format!("rcf{}", c.get()));
        }
        if let Some(n) = self.flex_num_sms {
            parts.push(format!("sms{n}"));
        }
        parts.join(",")
    }
}
