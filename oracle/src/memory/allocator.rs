//! What a GPU holds besides the tensors the model allocates: the caching allocator's overhead
//! (reserved but not allocated), the collective library's communicator buffers (allocated by
//! NCCL/RCCL outside PyTorch's allocator), and — in the hardware profile's
//! `overheads.runtimeReserveGib`, not here — the CUDA/HIP context, library workspaces and the
//! HBM the driver hides.
//!
//! Three numbers a run can report, and what the model compares each with:
//! - allocated (`torch.cuda.max_memory_allocated`): the tensors (weights, gradients, optimizer
//!   states, activations, PyTorch-allocated buffers);
//! - reserved (`torch.cuda.max_memory_reserved`): allocated plus the allocator's overhead;
//! - device used (`torch.cuda.mem_get_info`, `rocm-smi`, `nvidia-smi`): reserved plus the
//!   communicator buffers plus the runtime reserve.

use crate::hardware::HardwareProfile;
use crate::layout::Layout;
use crate::scenario::Scenario;

/// Reserved-over-allocated overhead of PyTorch's caching allocator with expandable segments
/// (`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`): segments grow in place in 2 MiB pages
/// (c10 `CUDACachingAllocator`, `ExpandableSegment`), so a freed block's memory is reused by any
/// later request and the gap left is the rounding of each block to 512 B / 2 MiB pages. One
/// constant for both vendors (the allocator is the same code on HIP). Checked, not fitted,
/// against the measured reserved peaks of TorchTitan (which sets it) in
/// `oracle/tests/data/memory.csv`.
pub const EXPANDABLE_SEGMENTS_OVERHEAD: f64 = 0.01;

/// Reserved over allocated that PyTorch's default allocator (fixed-size segments, no
/// expandable segments) has been measured to reach in a Megatron job: Megatron-Bridge's Llama
/// 3.1 70B SFT recipe on 32 H100 (TP4 PP4 VPP5, FP8) ran out of memory at 58.8 GB (54.8 GiB)
/// allocated of the 78.8 GiB usable, "caused by memory fragmentation, not insufficient
/// capacity", and ran with expandable segments (skills/nemo-mbridge-perf-memory-tuning,
/// Megatron-Bridge v0.6.0; memory.csv MB-L1, MB-L2): 78.8 / 54.8 = 1.44. Not the typical
/// overhead (the profile's `allocatorFragmentation`), the worst one seen: above it a job is
/// warned, never denied.
pub const FIXED_SEGMENTS_WORST_RESERVED_RATIO: f64 = 1.44;

/// Whether a layout's allocated peak (`allocated` bytes, the largest of its stages) could
/// fragment past `usable` bytes with fixed-size segments
/// ([`FIXED_SEGMENTS_WORST_RESERVED_RATIO`]); never with expandable segments.
pub fn fixed_segments_at_risk(l: &Layout, allocated: f64, usable: f64) -> bool {
    !l.expandable_segments && allocated * FIXED_SEGMENTS_WORST_RESERVED_RATIO > usable
}

/// The allocator overhead of a layout on a GPU, as a fraction of the allocated tensors: the
/// profile's `overheads.allocatorFragmentation` (PyTorch's default allocator, fixed-size
/// segments) or [`EXPANDABLE_SEGMENTS_OVERHEAD`].
pub fn overhead_fraction(hw: &HardwareProfile, l: &Layout) -> f64 {
    if l.expandable_segments {
        EXPANDABLE_SEGMENTS_OVERHEAD
    } else {
        hw.overheads.allocator_fragmentation
    }
}

/// Buffers one NCCL/RCCL connection keeps per channel: the Simple protocol's
/// `NCCL_BUFFSIZE` 4 MiB + LL 8 lines x 512 threads x 8 steps x 16 B = 512 KiB + LL128 120 x 640
/// x 8 x 8 B = 4.69 MiB (NVIDIA/nccl `src/include/device.h`; RCCL keeps NCCL's defaults).
pub const BUFFERS_PER_CONNECTION_BYTES: f64 = 4.0 * MIB + 0.5 * MIB + 4_915_200.0;
/// Channels a communicator's rings use between 8 NVLink/xGMI-connected GPUs (NCCL's topology
/// search typically settles on 16 on HGX H100 and 8-GPU MI300X/MI355X platforms).
pub const CHANNELS_PER_COMMUNICATOR: f64 = 16.0;
/// Connections per channel: the ring's previous and next rank.
pub const CONNECTIONS_PER_CHANNEL: f64 = 2.0;
/// Communicator buffers per process group, bytes: 9.19 MiB x 16 channels x 2 connections =
/// 294 MiB. Four such groups (TP, PP, DP, EP) make the ~1.1 GiB the hardware profiles' runtime
/// reserve held for NCCL buffers before this term existed.
pub const COMMUNICATOR_BYTES: f64 =
    BUFFERS_PER_CONNECTION_BYTES * CHANNELS_PER_COMMUNICATOR * CONNECTIONS_PER_CHANNEL;

const MIB: f64 = 1024.0 * 1024.0;

/// Side streams whose caching-allocator pools Megatron's shared-expert overlap
/// (`--moe-shared-expert-overlap`) keeps on a stage with `moe_layers` MoE layers: one per MoE
/// layer where the image's Megatron-Core creates a stream per layer
/// (`moe.sharedExpertStreamPerLayer`: `shared_experts.py` before PR #3752), else the one
/// stream every layer shares; none without the overlap or shared experts.
pub fn shared_expert_streams(s: &Scenario, l: &Layout, moe_layers: u32) -> u32 {
    if !l.moe.shared_expert_overlap || s.model.shared_expert_ffn() == 0 || moe_layers == 0 {
        0
    } else if l.moe.shared_expert_stream_per_layer {
        moe_layers
    } else {
        1
    }
}

/// Bytes one shared-expert side stream's pool keeps reserved beyond the activations it holds:
/// the shared experts' backward buffers of one micro-batch (the gradients of fc1's output, of
/// the activation's output and of the input, `(w1 + f + h)` values per token at 2 bytes, with
/// w1 = 2f for a gated activation), held by that stream's pool after its backward. PyTorch
/// runs each backward op on its forward op's stream (CUDA semantics notes, "Stream semantics
/// of backward passes") and its caching allocator reuses a freed block only for the stream it
/// was allocated on (c10 `CUDACachingAllocator` `get_free_block`), so no other stream's
/// tensors fill it. The shared experts see the whole (sequence-gathered) micro-batch, `tokens`
/// per CP rank; their widths are split over TP. Memory.csv MP-V1..V6 (DeepSeek-V2-Lite, 26 MoE layers with
/// their own streams, alltoall with the overlap): 26 x 20,992 B x 4,096 tokens = 2.08 GiB per
/// unit of MBS, 25.0 GiB at MBS 12, where dropping the overlap (MP-V6 -> V7, with Primus-Turbo
/// DeepEP) measured 24.6 GiB less.
pub fn shared_expert_stream_pool_bytes(s: &Scenario, l: &Layout, tokens: f64) -> f64 {
    let card = &s.model;
    let f = card.shared_expert_ffn();
    if f == 0 {
        return 0.0;
    }
    let tp = l.tp.max(1) as f64;
    let per_token = card.mlp_fc1_width(f) as f64 / tp + f as f64 / tp + card.hidden_size as f64;
    tokens * per_token * crate::units::ACT_BYTES
}

/// Process groups of more than one rank that a training step of `l` communicates in, each
/// with its own communicator: tensor, context, data x context (gradients, parameter
/// all-gather), pipeline, and for MoE models expert and expert-data parallel.
pub fn communicators(s: &Scenario, l: &Layout) -> u32 {
    let gpus = s.cluster.gpus;
    let dp = l.dp(gpus).unwrap_or(1);
    let moe = s.model.moe.is_some();
    let edp = l.expert_dp(gpus).unwrap_or(1);
    [
        l.tp > 1,
        l.cp > 1,
        dp * l.cp > 1,
        l.pp > 1,
        moe && l.ep > 1,
        moe && edp > 1 && edp != dp * l.cp,
    ]
    .iter()
    .filter(|b| **b)
    .count() as u32
}

/// Communicator buffer bytes on one GPU of layout `l`.
pub fn communicator_bytes(s: &Scenario, l: &Layout) -> f64 {
    communicators(s, l) as f64 * COMMUNICATOR_BYTES
}
