//! The parallel layout of a job (TP, PP, VPP, CP, EP, ETP, micro-batch, recompute, optimizer
//! sharding, schedule, overlap), the data-parallel size derived from it, and its legality
//! rules. Field names are those of `spec.parallelism` in a TrainingPlan.

use serde::{Deserialize, Serialize};

use crate::bounds::{self, Bound, Bounded, Seen, limits, patterns};
use crate::error::FieldError;

mod exec;
mod memory_options;
mod moe;
mod offload;
mod pipeline;
mod recompute;
mod rules;

pub use exec::{
    CrossEntropyFusion, CudaGraph, CudaGraphImpl, CudaGraphModule, Fp8Recipe, FsdpKind,
};
pub use memory_options::{Fraction, MEGATRON_DROPOUT, OptimizerDtype};
pub use moe::{
    Dispatch, Factor, FlexBackend, GroupedGemm, LoadBalancing, MAX_FLEX_NUM_SMS, MoeOptions,
    RouterDtype, TokenDispatcher,
};
pub use offload::{OffloadModule, OffloadSet};
pub use pipeline::{
    PipelineLayout, SplitSlots, StageSpec, VirtualStage, even_split_layout, most_even_split_layout,
};
pub use recompute::{ModuleSet, RecomputeModule, RecomputedRuns, SubmoduleName, Submodules};
pub use rules::{
    Broken, LayoutError, MAX_CAPACITY_FACTOR, MIN_CAPACITY_FACTOR, RuleId, capacity_factor_in_range,
};

use memory_options::{
    full_fraction, is_false, is_fp32, is_full_fraction, is_megatron_dropout, is_zero,
    megatron_dropout,
};

/// Activation recomputation granularity.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    /// Keep every activation.
    #[default]
    None,
    /// Recompute the submodules `recomputeModules` lists; without it the attention core only
    /// (Korthikanti et al. 2022 "selective", Megatron's default `[core_attn]`).
    Selective,
    /// Keep only each layer's input; recompute the whole layer in the backward pass.
    Full,
}

/// Pipeline schedule.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub enum Schedule {
    /// Non-interleaved one-forward-one-backward (PipeDream-Flush).
    #[default]
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// Interleaved 1F1B with `vpp` virtual stages per GPU.
    #[serde(rename = "interleaved")]
    Interleaved,
    /// Zero-bubble ZB-H1 (backward split into input-grad and weight-grad passes).
    #[serde(rename = "zero-bubble")]
    ZeroBubble,
}

impl Schedule {
    pub fn as_str(self) -> &'static str {
        match self {
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved",
            Schedule::ZeroBubble => "zero-bubble",
        }
    }
}

impl Recompute {
    pub fn as_str(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}

/// One parallel layout: the axes the tuner searches.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<Layout>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Layout {
    /// Tensor-parallel size.
    #[serde(default = "one")]
    pub tp: u32,
    /// Pipeline-parallel size.
    #[serde(default = "one")]
    pub pp: u32,
    /// Virtual pipeline stages per GPU (model chunks); 1 = not interleaved.
    #[serde(default = "one")]
    pub vpp: u32,
    /// Context-parallel size.
    #[serde(default = "one")]
    pub cp: u32,
    /// Expert-parallel size.
    #[serde(default = "one")]
    pub ep: u32,
    /// Expert tensor-parallel size (MoE parallel folding); 1 = experts not split by TP.
    #[serde(default = "one")]
    pub etp: u32,
    /// Micro-batch size.
    #[serde(default = "one")]
    pub micro_batch_size: u32,
    /// Activation recomputation granularity.
    #[serde(default)]
    pub recompute: Recompute,
    /// With full recompute: layers recomputed in each model chunk (the whole stage when
    /// vpp = 1), counted from the chunk's first layer, as Megatron's `--recompute-method block
    /// --recompute-num-layers N`; 0 = every layer.
    #[serde(default)]
    pub recompute_layers: u32,
    /// With full recompute: exactly the layers recomputed, by global index (decoder layers
    /// `0..layers`, MTP depth d at `layers + d`), as Primus-Megatron's
    /// `--recompute_layer_ids` (`primus/backends/megatron/patches/recompute_layer_patches.py`);
    /// every other layer keeps its activations. Replaces recomputeLayers (which must be 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute_layer_ids: Option<Vec<u32>>,
    /// With selective recompute: the submodules recomputed, as Megatron's
    /// `--recompute-modules` (core_attn, moe_act, layernorm, mla_up_proj, mlp, moe,
    /// shared_experts); absent = Megatron's default `[core_attn]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recompute_modules: Option<Vec<RecomputeModule>>,
    /// Sequence parallelism over the TP group (only meaningful with tp > 1).
    #[serde(default = "yes")]
    pub sequence_parallel: bool,
    /// Megatron's distributed optimizer (ZeRO-1: optimizer state sharded over DP).
    #[serde(default = "yes")]
    pub distributed_optimizer: bool,
    /// Fully sharded data parallel (weights, grads and optimizer sharded over DP).
    #[serde(default)]
    pub fsdp: bool,
    /// Pipeline schedule.
    #[serde(default)]
    pub schedule: Schedule,
    /// Layers on the first pipeline stage when it differs from the even split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_stage_layers: Option<u32>,
    /// Layers on the last pipeline stage when it differs from the even split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_stage_layers: Option<u32>,
    /// Megatron's `--pipeline-model-parallel-layout`: the contents of every virtual pipeline
    /// stage, e.g. `Et|(tt|)*30mL` (E embedding, t decoder layer, m MTP layer, L loss, `|`
    /// between stages, `(...)*n` repeats). Stage k runs on pipeline rank k % pp as model chunk
    /// k / pp. Replaces firstStageLayers/lastStageLayers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(with = "Option<String>"))]
    pub pipeline_layout: Option<PipelineLayout>,
    /// Overlap TP/SP collectives with GEMMs (Transformer Engine userbuffers).
    #[serde(default)]
    pub tp_comm_overlap: bool,
    /// Overlap the DP gradient reduce-scatter/all-reduce with the backward pass.
    #[serde(default = "yes")]
    pub overlap_grad_reduce: bool,
    /// Overlap the distributed optimizer's parameter all-gather with the forward pass.
    #[serde(default = "yes")]
    pub overlap_param_gather: bool,
    /// Accumulate and reduce gradients in FP32 (Megatron-LM's behaviour with `--bf16`);
    /// false = BF16 gradient buffers and reduction (`--grad-reduce-in-bf16`, NeMo's and
    /// Megatron-Bridge's performance recipes): half the gradient memory and DP traffic, and
    /// the distributed optimizer keeps an FP32 copy of its gradient shard.
    #[serde(default = "yes")]
    pub grad_reduce_in_fp32: bool,
    /// With `fsdp`: which implementation, torch (FSDP2, the default) or megatron
    /// (Megatron-FSDP, which combines with expert parallelism).
    #[serde(default, skip_serializing_if = "FsdpKind::is_torch")]
    pub fsdp_kind: FsdpKind,
    // --- MoE execution options and the options MoE recipes use (issue 16); kept together
    // --- so other additions to the layout merge around them.
    /// Mixture-of-experts execution options (dispatcher, grouped GEMM, overlap, routing).
    #[serde(default, skip_serializing_if = "MoeOptions::is_default")]
    pub moe: MoeOptions,
    /// With precision fp8: Transformer Engine's scaling recipe (`--fp8-recipe`); absent =
    /// Megatron's default, delayed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_recipe: Option<Fp8Recipe>,
    /// CUDA graphs (`--cuda-graph-impl`, `--cuda-graph-modules`); absent = none.
    #[serde(default, skip_serializing_if = "CudaGraph::is_none")]
    pub cuda_graph: CudaGraph,
    /// The cross-entropy kernel: `none` (Megatron without `--cross-entropy-loss-fusion`: the
    /// unfused loss, more passes over the logits), `native` (the flag: the default here,
    /// written by the job writer) or `te` (`--cross-entropy-fusion-impl te`).
    #[serde(default, skip_serializing_if = "CrossEntropyFusion::is_native")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = "native")))]
    pub cross_entropy_fusion: CrossEntropyFusion,

    // ---- Optimizer and activation memory options (layout/memory_options.rs; Megatron flags
    // in megatron.rs; memory terms in memory/optimizer.rs, memory/activations.rs and
    // memory/allocator.rs). Defaults are what a Megatron-LM job without the flag does. ----
    /// Attention dropout probability (`--attention-dropout`, Megatron's default 0.1). Only
    /// without fused attention does it keep memory (the dropped-out probabilities and their
    /// mask); flash attention regenerates the mask from the RNG state.
    #[serde(
        default = "megatron_dropout",
        skip_serializing_if = "is_megatron_dropout"
    )]
    #[cfg_attr(feature = "schema", schemars(extend("default" = 0.1)))]
    pub attention_dropout: Fraction,
    /// Hidden dropout probability (`--hidden-dropout`, Megatron's default 0.1; Llama, Qwen,
    /// Mixtral, DeepSeek and gpt-oss recipes set 0). Above 0 every layer keeps two 1-byte
    /// masks (after attention and after the MLP) and the first stage one after the embedding.
    #[serde(
        default = "megatron_dropout",
        skip_serializing_if = "is_megatron_dropout"
    )]
    #[cfg_attr(feature = "schema", schemars(extend("default" = 0.1)))]
    pub hidden_dropout: Fraction,
    /// Transformer Engine's precision-aware optimizer (`--use-precision-aware-optimizer`):
    /// master weights and Adam moments in the dtypes below, gradients read in place. Under an
    /// FP8 recipe other than delayed with an FP32 master, Megatron keeps a full FP32 master
    /// and casts a BF16 gradient shard to FP32 at the step.
    #[serde(default, skip_serializing_if = "is_false")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = false)))]
    pub precision_aware_optimizer: bool,
    /// Gradient buffer dtype with the precision-aware optimizer (`--main-grads-dtype`: fp32,
    /// bf16).
    #[serde(default, skip_serializing_if = "is_fp32")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = "fp32")))]
    pub main_grads_dtype: OptimizerDtype,
    /// Master weight dtype (`--main-params-dtype`: fp32, fp16).
    #[serde(default, skip_serializing_if = "is_fp32")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = "fp32")))]
    pub main_params_dtype: OptimizerDtype,
    /// Adam first moment dtype (`--exp-avg-dtype`: fp32, fp16, bf16, fp8).
    #[serde(default, skip_serializing_if = "is_fp32")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = "fp32")))]
    pub exp_avg_dtype: OptimizerDtype,
    /// Adam second moment dtype (`--exp-avg-sq-dtype`: fp32, fp16, bf16, fp8).
    #[serde(default, skip_serializing_if = "is_fp32")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = "fp32")))]
    pub exp_avg_sq_dtype: OptimizerDtype,
    /// Optimizer states on the CPU (`--optimizer-cpu-offload`; Megatron-LM also requires the
    /// precision-aware optimizer, Megatron-Bridge does not).
    #[serde(default, skip_serializing_if = "is_false")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = false)))]
    pub optimizer_cpu_offload: bool,
    /// Fraction of the optimizer's parameters whose states go to the CPU
    /// (`--optimizer-offload-fraction`, default 1.0).
    #[serde(default = "full_fraction", skip_serializing_if = "is_full_fraction")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = 1.0)))]
    pub optimizer_offload_fraction: Fraction,
    /// Layers whose activations are offloaded to the CPU (`--cpu-offloading-num-layers`;
    /// needs pp = 1 and no recompute); 0 = none.
    #[serde(default, skip_serializing_if = "is_zero")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = 0)))]
    pub activation_offload_layers: u32,
    /// Fine-grained activation offloading (`--fine-grained-activation-offloading
    /// --offload-modules ...`): the submodules whose saved activations go to the host
    /// (attn_norm, qkv_linear, core_attn, attn_proj, mlp_norm, expert_fc1, moe_act); absent =
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload_modules: Option<Vec<OffloadModule>>,
    /// FP8 parameters (`--fp8-param-gather`): GEMM weights stored in FP8 (and gathered in
    /// FP8), with no BF16 weight beside the FP8 copy.
    #[serde(default, skip_serializing_if = "is_false")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = false)))]
    pub fp8_param_gather: bool,
    /// PyTorch's allocator with expandable segments
    /// (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`; `PYTORCH_HIP_ALLOC_CONF` on ROCm):
    /// far less fragmentation between the allocated and the reserved peak.
    #[serde(default, skip_serializing_if = "is_false")]
    #[cfg_attr(feature = "schema", schemars(extend("default" = false)))]
    pub expandable_segments: bool,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            tp: 1,
            pp: 1,
            vpp: 1,
            cp: 1,
            ep: 1,
            etp: 1,
            micro_batch_size: 1,
            recompute: Recompute::None,
            recompute_layers: 0,
            recompute_layer_ids: None,
            recompute_modules: None,
            sequence_parallel: true,
            distributed_optimizer: true,
            fsdp: false,
            schedule: Schedule::OneFOneB,
            first_stage_layers: None,
            last_stage_layers: None,
            pipeline_layout: None,
            tp_comm_overlap: false,
            overlap_grad_reduce: true,
            overlap_param_gather: true,
            grad_reduce_in_fp32: true,
            fsdp_kind: FsdpKind::Torch,
            moe: MoeOptions::default(),
            fp8_recipe: None,
            cuda_graph: CudaGraph::default(),
            cross_entropy_fusion: CrossEntropyFusion::Native,
            attention_dropout: megatron_dropout(),
            hidden_dropout: megatron_dropout(),
            precision_aware_optimizer: false,
            main_grads_dtype: OptimizerDtype::Fp32,
            main_params_dtype: OptimizerDtype::Fp32,
            exp_avg_dtype: OptimizerDtype::Fp32,
            exp_avg_sq_dtype: OptimizerDtype::Fp32,
            optimizer_cpu_offload: false,
            optimizer_offload_fraction: full_fraction(),
            activation_offload_layers: 0,
            offload_modules: None,
            fp8_param_gather: false,
            expandable_segments: false,
        }
    }
}

/// The layout's sizes, bounded (one row per field). Products of sizes are bounded by the
/// legality rules ([`Layout::check`]), in checked arithmetic.
impl Bounded for Layout {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::int("tp", 1, limits::AXIS, |l| l.tp.into()),
        Bound::int("pp", 1, limits::AXIS, |l| l.pp.into()),
        Bound::int("vpp", 1, limits::AXIS, |l| l.vpp.into()),
        Bound::int("cp", 1, limits::AXIS, |l| l.cp.into()),
        Bound::int("ep", 1, limits::AXIS, |l| l.ep.into()),
        Bound::int("etp", 1, limits::AXIS, |l| l.etp.into()),
        Bound::int("microBatchSize", 1, limits::AXIS, |l| {
            l.micro_batch_size.into()
        }),
        Bound::int("recomputeLayers", 0, limits::LAYERS, |l| {
            l.recompute_layers.into()
        }),
        Bound::ints(
            "recomputeLayerIds",
            limits::LAYERS + limits::MTP_LAYERS,
            0,
            limits::LAYERS + limits::MTP_LAYERS - 1,
            |l| {
                l.recompute_layer_ids
                    .as_deref()
                    .map_or(Seen::Absent, Seen::Ints)
            },
        ),
        Bound::items("recomputeModules", limits::MODULES, |l| {
            l.recompute_modules
                .as_ref()
                .map_or(Seen::Absent, |m| Seen::Items(m.len()))
        }),
        Bound::int("firstStageLayers", 0, limits::LAYERS, |l| {
            l.first_stage_layers.into()
        }),
        Bound::int("lastStageLayers", 0, limits::LAYERS, |l| {
            l.last_stage_layers.into()
        }),
        Bound::int("activationOffloadLayers", 0, limits::LAYERS, |l| {
            l.activation_offload_layers.into()
        }),
        Bound::items("offloadModules", limits::MODULES, |l| {
            l.offload_modules
                .as_ref()
                .map_or(Seen::Absent, |m| Seen::Items(m.len()))
        }),
        Bound::matching(
            "pipelineLayout",
            limits::LAYOUT_TEXT,
            patterns::LAYOUT_SYMBOLS,
            |l| {
                l.pipeline_layout
                    .as_ref()
                    .map_or(Seen::Absent, |p| Seen::Text(p.as_str()))
            },
        ),
    ];

    /// The pipeline layout's syntax (the parser's message says where it fails; the row's
    /// pattern is the API server's coarser check), then the rows.
    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        if let Some(e) = self.pipeline_layout.as_ref().and_then(|p| p.error()) {
            return Err(FieldError::new(bounds::path(at, "pipelineLayout"), e));
        }
        bounds::check_rows(self, at, Self::BOUNDS)?;
        // The paths are built only for an error: this runs for every layout the tuner checks.
        bounds::check(&self.cuda_graph, "").map_err(|e| {
            FieldError::new(
                bounds::path(&bounds::path(at, "cudaGraph"), &e.field),
                e.message,
            )
        })?;
        bounds::check(&self.moe, "").map_err(|e| {
            FieldError::new(bounds::path(&bounds::path(at, "moe"), &e.field), e.message)
        })
    }
}

impl Layout {
    /// GPUs in one model replica's TP x PP x CP grid (u64: never wraps).
    pub fn model_parallel_size(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.pp) * u64::from(self.cp)
    }

    /// Data-parallel size for `gpus` GPUs (None when it does not divide).
    pub fn dp(&self, gpus: u32) -> Option<u32> {
        let mp = self.model_parallel_size();
        if mp == 0 || !u64::from(gpus).is_multiple_of(mp) {
            None
        } else {
            u32::try_from(u64::from(gpus) / mp).ok()
        }
    }

    /// Expert data-parallel size: GPUs of one PP stage divided by the expert grid EP x ETP
    /// (MoE parallel folding: the attention grid TP x CP x DP is re-folded as ETP x EP x EDP).
    pub fn expert_dp(&self, gpus: u32) -> Option<u32> {
        let per_stage = u64::from(gpus / self.pp.max(1));
        let grid = u64::from(self.ep) * u64::from(self.etp);
        if grid == 0 || !per_stage.is_multiple_of(grid) {
            None
        } else {
            u32::try_from(per_stage / grid).ok()
        }
    }

    /// Sequence parallel is in effect (it needs TP > 1).
    pub fn sp(&self) -> bool {
        self.sequence_parallel && self.tp > 1
    }

    /// The submodules selective recompute reruns: `recomputeModules` (or Megatron's default
    /// `[core_attn]`) with recompute selective, none otherwise. The fused grouped MLP
    /// (`moe.fusedGroupedMlp`) runs the experts' activation inside its kernels, where the
    /// unfused path's `moe_act` checkpoint does not reach (`moe/experts.py`): `moe_act` does
    /// nothing there and is left out.
    pub fn recompute_set(&self) -> ModuleSet {
        let set = match (self.recompute, &self.recompute_modules) {
            (Recompute::Selective, Some(m)) => ModuleSet::of(m),
            (Recompute::Selective, None) => ModuleSet::DEFAULT,
            _ => ModuleSet::EMPTY,
        };
        if self.moe.fused_grouped_mlp {
            set.without(RecomputeModule::MoeAct)
        } else {
            set
        }
    }

    /// Compact one-line label, e.g. `TP4 PP8 VPP5 MBS1 interleaved`, with
    /// `recompute=selective(moe_act+layernorm)` when recompute modules are given.
    pub fn label(&self) -> String {
        let mut s = format!("TP{} PP{}", self.tp, self.pp);
        if self.vpp > 1 {
            s.push_str(&format!(" VPP{}", self.vpp));
        }
        if self.cp > 1 {
            s.push_str(&format!(" CP{}", self.cp));
        }
        if self.ep > 1 {
            s.push_str(&format!(" EP{}", self.ep));
        }
        if self.etp > 1 {
            s.push_str(&format!(" ETP{}", self.etp));
        }
        if let Some(pl) = &self.pipeline_layout {
            s.push_str(&format!(" layout={pl}"));
        } else if self.first_stage_layers.is_some() || self.last_stage_layers.is_some() {
            let show = |v: Option<u32>| v.map_or("-".to_string(), |n| n.to_string());
            s.push_str(&format!(
                " split={}/{}",
                show(self.first_stage_layers),
                show(self.last_stage_layers)
            ));
        }
        s.push_str(&format!(" MBS{}", self.micro_batch_size));
        match self.recompute {
            Recompute::None => {}
            Recompute::Selective => match &self.recompute_modules {
                Some(m) => s.push_str(&format!(
                    " recompute=selective({})",
                    m.iter().map(|m| m.as_str()).collect::<Vec<_>>().join("+")
                )),
                None => s.push_str(" recompute=selective"),
            },
            Recompute::Full if self.recompute_layer_ids.is_some() => s.push_str(&format!(
                " recompute=full(ids {})",
                crate::layout::recompute::id_list(self.recompute_layer_ids.as_deref())
            )),
            Recompute::Full if self.recompute_layers > 0 => {
                s.push_str(&format!(" recompute=full({})", self.recompute_layers))
            }
            Recompute::Full => s.push_str(" recompute=full"),
        }
        if self.fsdp && self.fsdp_kind == FsdpKind::Megatron {
            s.push_str(" mfsdp");
        } else if self.fsdp {
            s.push_str(" fsdp");
        } else if !self.distributed_optimizer {
            s.push_str(" no-distopt");
        }
        if !self.grad_reduce_in_fp32 {
            s.push_str(" bf16-grads");
        }
        let moe = self.moe.label();
        if !moe.is_empty() {
            s.push(' ');
            s.push_str(&moe);
        }
        let graphs = self.cuda_graph.label();
        if !graphs.is_empty() {
            s.push(' ');
            s.push_str(&graphs);
        }
        for w in self.memory_options_label() {
            s.push(' ');
            s.push_str(&w);
        }
        s.push(' ');
        s.push_str(self.schedule.as_str());
        s
    }

    /// The FP8 recipe in effect (Megatron's default, delayed, when none is named).
    pub fn fp8_recipe(&self) -> Fp8Recipe {
        self.fp8_recipe.unwrap_or(Fp8Recipe::Delayed)
    }

    /// Torch FSDP2 is in effect (`fsdp` with the torch kind).
    pub fn torch_fsdp(&self) -> bool {
        self.fsdp && self.fsdp_kind == FsdpKind::Torch
    }
}
