//! Hardware profiles: what one GPU kind can do (peak FLOP/s, HBM capacity and bandwidth,
//! links), how it is packaged (GPUs per node, per fast-interconnect domain), how Kubernetes
//! names it, and the efficiency parameters the time model uses. Loaded from
//! `profiles/hardware/*.yaml` or inlined in a plan under `spec.cluster.gpuProfile`.

use serde::{Deserialize, Serialize};

use crate::backend::{FlexBackend, Fp8Recipe};
use crate::bounds::{self, Bound, Bounded, Seen, limits, shown};
use crate::error::FieldError;
use crate::precision::Precision;
use crate::units::{GB, GIB, MICROSECOND, TERA};

/// GPU vendor; decides the Kubernetes resource and label conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    Amd,
    Nvidia,
}

/// Dense (non-sparse) peak throughput per precision, in TFLOP/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PeakTflops {
    /// BF16/FP16 dense matrix peak.
    pub bf16: f64,
    /// FP8 dense matrix peak.
    pub fp8: f64,
}

/// A link tier: bandwidth per GPU in one direction, and per-message latency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Link {
    /// Unidirectional bandwidth available to one GPU on this tier, GB/s (10^9 bytes/s).
    pub bandwidth_gbps: f64,
    /// Latency of one message on this tier, microseconds (the alpha of alpha-beta).
    pub latency_us: f64,
}

impl Link {
    /// Bandwidth in bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        self.bandwidth_gbps * GB
    }
    /// Latency in seconds.
    pub fn latency_seconds(&self) -> f64 {
        self.latency_us * MICROSECOND
    }
}

/// Fraction of the host link's bandwidth one copy engine reaches with pinned host memory
/// (`cudaMemcpyAsync` / `hipMemcpyAsync`): PCIe's 128b/130b encoding and TLP headers leave
/// about 85% of a Gen5 x16 link's 64 GB/s (NVIDIA's nvbandwidth `host_to_device_memcpy_ce`
/// reads ~55 GB/s on H100 SXM); NVLink-C2C is assumed to reach the same fraction of its
/// 450 GB/s (no public copy-engine figure here). One constant for every link, not fitted.
pub const HOST_COPY_EFFICIENCY: f64 = 0.85;

/// How Kubernetes exposes this GPU kind on a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<KubernetesNames>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct KubernetesNames {
    /// Extended resource name: `amd.com/gpu` or `nvidia.com/gpu`.
    pub resource: String,
    /// Node label whose value identifies the product: `amd.com/gpu.product-name` or
    /// `nvidia.com/gpu.product`.
    pub product_label: String,
    /// Values of that label that denote this GPU (device plugins spell them differently).
    pub product_values: Vec<String>,
}

/// Memory the job cannot use for tensors: named, so no formula carries a magic number.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MemoryOverheads {
    /// Driver, CUDA/HIP context, kernels and library workspaces per GPU, GiB.
    pub runtime_reserve_gib: f64,
    /// Fraction of allocated tensor memory lost to caching-allocator fragmentation.
    pub allocator_fragmentation: f64,
}

/// Efficiency parameters of the time model (fractions of peak actually reached). Calibrated
/// once per GPU generation; each value's source is given in the profile YAML. Fields added
/// after the first profiles have defaults that leave the time model as it was without them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Efficiency {
    /// Best GEMM efficiency (fraction of dense peak) on large, square-ish BF16 shapes.
    pub gemm_bf16_max: f64,
    /// Best GEMM efficiency (fraction of dense FP8 peak) on large FP8 shapes.
    pub gemm_fp8_max: f64,
    /// GEMM size (M*N*K, in units of 2^30) at which efficiency reaches half of its maximum:
    /// small and skinny GEMMs run far below peak.
    pub gemm_half_size_gflop: f64,
    /// Smallest GEMM dimension at which efficiency reaches half of its maximum (tile
    /// under-fill of skinny GEMMs: a 768-wide expert runs below a 8192-wide one); 0 = off.
    #[serde(default)]
    pub gemm_half_dim: f64,
    /// Grouped (MoE expert) GEMM efficiency relative to a dense GEMM of the same per-expert
    /// shape (ragged groups, per-group scheduling); 1 = as dense.
    #[serde(default = "one")]
    pub grouped_gemm: f64,
    /// Flash-attention core efficiency (fraction of the BF16 matrix peak), forward pass.
    pub attention: f64,
    /// Flash-attention backward efficiency (fraction of the BF16 peak); defaults to `attention`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_backward: Option<f64>,
    /// Throughput of the attention kernels on an unmasked (non-causal) block over a causal
    /// one of the same shape, both passes, in [1, 2]: `attention` and `attentionBackward` are
    /// causal figures, and context parallelism's ring runs (cp - 1) / cp of its pairs
    /// unmasked; absent = 1 (no measurement of the library Megatron runs on this generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_unmasked_gain: Option<f64>,
    /// Fraction of HBM bandwidth reached by memory-bound (element-wise, norm) kernels.
    pub memory_bound: f64,
    /// Fraction of the scale-up link bandwidth reached by collectives (bus bandwidth
    /// efficiency).
    pub collective: f64,
    /// Fraction of the NIC bandwidth reached by collectives across domains; defaults to
    /// `collective`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_out_collective: Option<f64>,
    /// Fixed per-kernel launch/sync overhead, microseconds.
    pub kernel_overhead_us: f64,
    /// One host-device synchronisation in a MoE layer pass (the dropless token dispatcher copies
    /// the tokens-per-expert counts to the host before its all-to-all; the unfused permutation
    /// adds its own), microseconds, charged per synchronisation.
    #[serde(default)]
    pub moe_host_sync_us: f64,
    /// Host (CPU) time to issue one kernel from the framework: Python, PyTorch dispatch,
    /// Transformer Engine and the launch itself, microseconds. After the MoE dispatcher's host
    /// synchronisation the GPU waits for the host, so the expert section runs at no less than
    /// its launches x this; 0 = not modelled.
    #[serde(default)]
    pub cpu_launch_us: f64,
    /// Host cost of one kernel launched from library code rather than the framework (the
    /// per-expert GEMMs of a grouped linear, FP8 quantization inside a Transformer Engine
    /// module), microseconds; 0 = not modelled.
    #[serde(default)]
    pub library_launch_us: f64,
    /// Host cost of replaying one captured CUDA graph (a whole captured scope of a layer),
    /// microseconds; absent = one kernel's `cpuLaunchUs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_launch_us: Option<f64>,
    /// Fraction of the partner micro-batch's computation behind which Megatron's EP
    /// all-to-all overlap (`--overlap-moe-expert-parallel-comm`) hides the dispatch and
    /// combine of a layer; 0 = not modelled (nothing hidden).
    #[serde(default)]
    pub ep_overlap: f64,
    /// Fixed per-iteration overhead (data loading, logging, gradient-norm and loss
    /// all-reduces, Python), milliseconds.
    #[serde(default)]
    pub step_overhead_ms: f64,
}

fn one() -> f64 {
    1.0
}

/// The largest unmasked-over-causal attention gain a profile may state: a causal kernel does
/// half the work of an unmasked one of the same shape, so no measurement is near 2.
pub const MAX_ATTENTION_UNMASKED_GAIN: f64 = 2.0;

impl Efficiency {
    /// Flash-attention backward efficiency.
    pub fn attention_backward(&self) -> f64 {
        self.attention_backward.unwrap_or(self.attention)
    }

    /// Unmasked-over-causal attention throughput (1 when the profile gives none).
    pub fn attention_unmasked_gain(&self) -> f64 {
        self.attention_unmasked_gain.unwrap_or(1.0)
    }

    /// Collective efficiency across domains.
    pub fn scale_out_collective(&self) -> f64 {
        self.scale_out_collective.unwrap_or(self.collective)
    }

    /// Host seconds of replaying one captured graph.
    pub fn graph_launch_seconds(&self) -> f64 {
        self.graph_launch_us.unwrap_or(self.cpu_launch_us) * MICROSECOND
    }
}

/// One flex-dispatcher library the GPU's software stack runs, with the fractions of the
/// scale-up and scale-out link bandwidth its dispatch and combine kernels reach (fitted per
/// GPU generation; see each profile).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FlexBackendProfile {
    /// The library.
    pub backend: FlexBackend,
    /// Fraction of the scale-up (NVLink, xGMI) bandwidth reached inside a domain.
    pub scale_up: f64,
    /// Fraction of the NIC bandwidth reached across domains.
    pub scale_out: f64,
}

/// One GPU kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(transform = crate::bounds::schema::<HardwareProfile>))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HardwareProfile {
    /// Profile name, e.g. `mi300x`, `h100-sxm`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Human product name, e.g. `AMD Instinct MI300X`.
    pub product: String,
    /// Vendor.
    pub vendor: Vendor,
    /// Dense peak matrix throughput.
    pub peak_tflops: PeakTflops,
    /// HBM capacity per GPU, GiB.
    pub memory_gib: f64,
    /// HBM bandwidth per GPU, GB/s.
    pub memory_bandwidth_gbps: f64,
    /// Memory the job cannot use.
    pub overheads: MemoryOverheads,
    /// GPUs in one node (one Kubernetes node, one benchmark).
    pub gpus_per_node: u32,
    /// GPUs sharing the fast interconnect (8 for an HGX/OAM board, 72 for NVL72).
    pub scale_up_domain: u32,
    /// Intra-domain link (NVLink, xGMI, Infinity Fabric).
    pub scale_up: Link,
    /// Inter-node network per GPU (NIC).
    pub scale_out: Link,
    /// The GPU's link to its host's memory (PCIe to an x86 host, NVLink-C2C to a Grace CPU),
    /// one direction: what activation offload (layer-level and fine-grained) and optimizer
    /// CPU offload copy over. Absent: the time model charges no copy time (the offload's
    /// memory saving is still counted); every built-in profile sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_link: Option<Link>,
    /// How Kubernetes names this GPU.
    pub kubernetes: KubernetesNames,
    /// Time-model efficiency parameters.
    pub efficiency: Efficiency,
    /// The flex MoE dispatch libraries this GPU's software stack runs (DeepEP and HybridEP on
    /// Hopper and B200, HybridEP only on GB200/GB300 NVL72 where Megatron-Bridge skips DeepEP,
    /// Primus-Turbo DeepEP on AMD Instinct); empty = none (alltoall and allgather only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flex_backends: Vec<FlexBackendProfile>,
    /// FP8 scaling recipes the tensor cores run; absent = every recipe but mxfp8 (MX block
    /// scaling needs Blackwell or CDNA 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fp8_recipes: Option<Vec<Fp8Recipe>>,
    /// Whether this GPU's software stack runs the experts' fused grouped MLP
    /// (`moe.fusedGroupedMlp`: cuDNN's CuTe-DSL grouped-GEMM GLU kernels, sm100 Blackwell);
    /// absent = no.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fused_grouped_mlp: bool,
}

/// How Kubernetes names the GPU, bounded.
impl Bounded for KubernetesNames {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("resource", limits::NAME, |k| (&k.resource).into()),
        Bound::text("productLabel", limits::NAME, |k| (&k.product_label).into()),
        Bound::items("productValues", limits::LIST, |k| {
            Seen::Items(k.product_values.len())
        }),
    ];

    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        bounds::check_rows(self, at, Self::BOUNDS)?;
        for (i, v) in self.product_values.iter().enumerate() {
            bounds::check_one(
                &format!("productValues[{i}]"),
                bounds::Limit::Text {
                    max: limits::NAME,
                    pattern: None,
                },
                v.into(),
                at,
            )?;
        }
        Ok(())
    }
}

/// The profile's counts and names, bounded (its rates are checked by
/// [`HardwareProfile::validate`]).
impl Bounded for HardwareProfile {
    const BOUNDS: &'static [Bound<Self>] = &[
        Bound::text("name", limits::NAME, |h| (&h.name).into()),
        Bound::text("product", limits::NAME, |h| (&h.product).into()),
        Bound::int("gpusPerNode", 1, limits::AXIS, |h| h.gpus_per_node.into()),
        Bound::int("scaleUpDomain", 1, limits::GPUS, |h| {
            h.scale_up_domain.into()
        }),
    ];

    fn check_bounds(&self, at: &str) -> Result<(), FieldError> {
        bounds::check_rows(self, at, Self::BOUNDS)?;
        bounds::check(&self.kubernetes, &bounds::path(at, "kubernetes"))
    }
}

impl HardwareProfile {
    /// HBM capacity in bytes.
    pub fn capacity_bytes(&self) -> f64 {
        self.memory_gib * GIB
    }

    /// Capacity minus the runtime reserve: what tensors (and fragmentation) can use, bytes.
    pub fn usable_bytes(&self) -> f64 {
        (self.memory_gib - self.overheads.runtime_reserve_gib).max(0.0) * GIB
    }

    /// HBM bandwidth in bytes per second.
    pub fn memory_bandwidth(&self) -> f64 {
        self.memory_bandwidth_gbps * GB
    }

    /// The profile of a flex backend, when the stack runs it.
    pub fn flex_backend(&self, b: FlexBackend) -> Option<&FlexBackendProfile> {
        self.flex_backends.iter().find(|p| p.backend == b)
    }

    /// Seconds to copy `bytes` between the GPU and pinned host memory in one direction over
    /// the host link at [`HOST_COPY_EFFICIENCY`]; 0 without a `hostLink` (not timed).
    pub fn host_copy_seconds(&self, bytes: f64) -> f64 {
        match &self.host_link {
            Some(link) if bytes > 0.0 => {
                bytes / (link.bytes_per_second() * HOST_COPY_EFFICIENCY) + link.latency_seconds()
            }
            _ => 0.0,
        }
    }

    /// Whether the tensor cores run an FP8 recipe.
    pub fn supports_fp8_recipe(&self, r: Fp8Recipe) -> bool {
        match &self.fp8_recipes {
            Some(list) => list.contains(&r),
            None => r != Fp8Recipe::Mxfp8,
        }
    }

    /// Dense peak FLOP/s at a precision.
    pub fn peak_flops(&self, precision: Precision) -> f64 {
        match precision {
            Precision::Bf16 => self.peak_tflops.bf16 * TERA,
            Precision::Fp8 => self.peak_tflops.fp8 * TERA,
        }
    }

    /// Check the profile: its bounds ([`Bounded`]), then its own consistency; `at` is its path
    /// in the input.
    pub fn validate(&self, at: &str) -> Result<(), FieldError> {
        bounds::check(self, at)?;
        let positive = |name: &str, v: f64| positive(at, name, v);
        positive("peakTflops.bf16", self.peak_tflops.bf16)?;
        positive("peakTflops.fp8", self.peak_tflops.fp8)?;
        positive("memoryGib", self.memory_gib)?;
        positive("memoryBandwidthGbps", self.memory_bandwidth_gbps)?;
        if !(self.overheads.runtime_reserve_gib >= 0.0
            && self.overheads.runtime_reserve_gib < self.memory_gib)
        {
            return Err(FieldError::new(
                format!("{at}.overheads.runtimeReserveGib"),
                format!(
                    "must be in [0, memoryGib={}), got {}",
                    self.memory_gib, self.overheads.runtime_reserve_gib
                ),
            ));
        }
        if !(0.0..1.0).contains(&self.overheads.allocator_fragmentation) {
            return Err(FieldError::new(
                format!("{at}.overheads.allocatorFragmentation"),
                "must be a fraction in [0, 1)",
            ));
        }
        if !self.scale_up_domain.is_multiple_of(self.gpus_per_node) {
            return Err(FieldError::new(
                format!("{at}.scaleUpDomain"),
                format!(
                    "must be a positive multiple of gpusPerNode {}, got {}",
                    self.gpus_per_node, self.scale_up_domain
                ),
            ));
        }
        positive("scaleUp.bandwidthGbps", self.scale_up.bandwidth_gbps)?;
        positive("scaleOut.bandwidthGbps", self.scale_out.bandwidth_gbps)?;
        microseconds(at, "scaleUp.latencyUs", self.scale_up.latency_us)?;
        microseconds(at, "scaleOut.latencyUs", self.scale_out.latency_us)?;
        if let Some(link) = &self.host_link {
            positive("hostLink.bandwidthGbps", link.bandwidth_gbps)?;
            microseconds(at, "hostLink.latencyUs", link.latency_us)?;
        }
        self.validate_efficiency(at)
    }

    /// The time model's efficiency parameters and the flex dispatch backends.
    fn validate_efficiency(&self, at: &str) -> Result<(), FieldError> {
        let positive = |name: &str, v: f64| positive(at, name, v);
        let fraction = |name: &str, v: f64| fraction(at, name, v);
        let e = &self.efficiency;
        fraction("efficiency.gemmBf16Max", e.gemm_bf16_max)?;
        fraction("efficiency.gemmFp8Max", e.gemm_fp8_max)?;
        positive("efficiency.gemmHalfSizeGflop", e.gemm_half_size_gflop)?;
        fraction("efficiency.attention", e.attention)?;
        fraction("efficiency.memoryBound", e.memory_bound)?;
        fraction("efficiency.collective", e.collective)?;
        fraction("efficiency.groupedGemm", e.grouped_gemm)?;
        fraction("efficiency.attentionBackward", e.attention_backward())?;
        fraction("efficiency.scaleOutCollective", e.scale_out_collective())?;
        for (name, v) in [
            ("efficiency.gemmHalfDim", e.gemm_half_dim),
            ("efficiency.moeHostSyncUs", e.moe_host_sync_us),
            ("efficiency.cpuLaunchUs", e.cpu_launch_us),
            ("efficiency.graphLaunchUs", e.graph_launch_us.unwrap_or(0.0)),
            ("efficiency.libraryLaunchUs", e.library_launch_us),
            ("efficiency.stepOverheadMs", e.step_overhead_ms),
            ("efficiency.kernelOverheadUs", e.kernel_overhead_us),
        ] {
            microseconds(at, name, v)?;
        }
        let gain = e.attention_unmasked_gain();
        if !(gain.is_finite() && (1.0..=MAX_ATTENTION_UNMASKED_GAIN).contains(&gain)) {
            return Err(FieldError::new(
                format!("{at}.efficiency.attentionUnmaskedGain"),
                format!("must be in [1, {MAX_ATTENTION_UNMASKED_GAIN}], got {gain}"),
            ));
        }
        if !(e.ep_overlap.is_finite() && (0.0..=1.0).contains(&e.ep_overlap)) {
            return Err(FieldError::new(
                format!("{at}.efficiency.epOverlap"),
                format!("must be a fraction in [0, 1], got {}", e.ep_overlap),
            ));
        }
        for (i, b) in self.flex_backends.iter().enumerate() {
            fraction(&format!("flexBackends[{i}].scaleUp"), b.scale_up)?;
            fraction(&format!("flexBackends[{i}].scaleOut"), b.scale_out)?;
            if self.flex_backends[..i]
                .iter()
                .any(|o| o.backend == b.backend)
            {
                return Err(FieldError::new(
                    format!("{at}.flexBackends[{i}].backend"),
                    format!("{} is listed twice", b.backend.as_str()),
                ));
            }
        }
        Ok(())
    }
}

/// `at.name` must be a positive number in [[`MIN_FIGURE`], [`MAX_FIGURE`]].
fn positive(at: &str, name: &str, v: f64) -> Result<(), FieldError> {
    if v.is_finite() && (MIN_FIGURE..=MAX_FIGURE).contains(&v) {
        Ok(())
    } else {
        Err(FieldError::new(
            format!("{at}.{name}"),
            format!(
                "must be a positive number in [{MIN_FIGURE}, {MAX_FIGURE:e}], got {}",
                shown(v)
            ),
        ))
    }
}

/// `at.name` must be a latency or host cost in [0, [`MAX_MICROSECONDS`]].
fn microseconds(at: &str, name: &str, v: f64) -> Result<(), FieldError> {
    if v.is_finite() && (0.0..=MAX_MICROSECONDS).contains(&v) {
        Ok(())
    } else {
        Err(FieldError::new(
            format!("{at}.{name}"),
            format!(
                "must be a number in [0, {MAX_MICROSECONDS:e}], got {}",
                shown(v)
            ),
        ))
    }
}

/// The range of a profile's positive figures (rates in TFLOP/s and GB/s, capacities in GiB,
/// GEMM sizes in GFLOP): any real GPU is far inside it, and the time model divides by them, so
/// a figure outside it (a subnormal bandwidth, say) would turn a step time infinite.
pub const MIN_FIGURE: f64 = 1e-3;
pub const MAX_FIGURE: f64 = 1e9;
/// The largest latency or host cost a profile may give: 1e6 microseconds is a second, 1e6
/// milliseconds (the step overhead's unit) a quarter of an hour; both far above any real
/// figure.
pub const MAX_MICROSECONDS: f64 = 1e6;

/// `at.name` must be a fraction in [[`MIN_FIGURE`], 1].
fn fraction(at: &str, name: &str, v: f64) -> Result<(), FieldError> {
    if v.is_finite() && (MIN_FIGURE..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(FieldError::new(
            format!("{at}.{name}"),
            format!("must be a fraction in [{MIN_FIGURE}, 1], got {}", shown(v)),
        ))
    }
}
