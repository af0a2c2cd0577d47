//! Buffers of the fused token dispatchers (`tokenDispatcher: flex`), which the libraries
//! allocate once, outside PyTorch's caching allocator, and keep for the whole run: they count
//! in a device-level number (and in the verdict's total), never in `max_memory_reserved`.
//!
//! - DeepEP (normal, high-throughput kernels) and Primus-Turbo's DeepEP for ROCm: Megatron-LM's
//!   `fused_a2a.get_buffer` sizes one `deep_ep.Buffer` per process group as the larger of the
//!   dispatch and the combine config's hints, `Config::get_nvl_buffer_size_hint` (the
//!   NVLink/xGMI buffer, `cudaMalloc`'d and shared by IPC) and `get_rdma_buffer_size_hint`
//!   (NVSHMEM/rocSHMEM, only past 8 ranks), with `hidden_bytes = hidden * max(elem_size, 2)`
//!   (deepseek-ai/DeepEP `csrc/legacy/config.hpp`, AMD-AGI/Primus-Turbo
//!   `csrc/include/primus_turbo/deep_ep/config.hpp`, the same formulas). The SMs (CUs) the
//!   kernels use set the channels (`num_sms / 2`): Megatron sets DeepEP's to 20
//!   (`moe_flex_dispatcher_num_sms` unset, `token_dispatcher.py`), Primus-Turbo's
//!   `EPBufferConfig` defaults to 32 (`primus_turbo/pytorch/kernels/moe/moe_dispatch_combine_impl.py`).
//!   The receive-chunk sizes come from each library's `get_dispatch_config` /
//!   `get_combine_config` tables per EP size ([`DEEPEP_CONFIGS`], [`PRIMUS_TURBO_CONFIGS`]).
//! - HybridEP (DeepEP's `hybrid-ep` branch, `csrc/hybrid_ep/buffer/intranode.cu`,
//!   `internode_doca.cu`): buffers for the worst case of every token of the group landing on
//!   one rank. Inside the NVLink domain (dispatch and combine share them, `use_shared_buffer`):
//!   `T * R * N` tokens (`T` tokens per rank as Megatron's first dispatch sees them, `R` ranks
//!   per domain, `N` domains) of `hidden` BF16 values, their routing probabilities over the
//!   domain's experts (FP32) and FP8 scaling factors (`hidden / 128` FP32, allocated always).
//!   Across domains (`N > 1`), the RDMA staging buffers of the dispatch (the rank's own tokens
//!   with probabilities over all experts and scales, plus `T * (N - 1)` tokens from the other
//!   domains) and of the combine (two `T * (N - 1)` token and probability buffers).
//!
//! A layout with another dispatcher has none of these buffers (NCCL's all-to-all and
//! all-gather buffers are the communicators' of [`super::allocator`]).

use crate::collectives::Topology;
use crate::layout::{FlexBackend, Layout};
use crate::scenario::Scenario;

use super::activations::{ACT_BYTES, FP32_BYTES};

/// Ranks DeepEP's normal kernels reach over NVLink/xGMI from one rank (`NUM_MAX_NVL_PEERS`,
/// `LEGACY_NUM_MAX_NVL_PEERS`: 8 in both libraries); larger groups add RDMA ranks.
pub const DEEPEP_NVL_PEERS: u32 = 8;
/// The most top-k slots a DeepEP receive slot holds (`kNumMaxTopK` in the size hints).
pub const DEEPEP_MAX_TOPK: f64 = 128.0;
/// The most FP8 scale columns a DeepEP receive slot holds (`kNumMaxScales`).
pub const DEEPEP_MAX_SCALES: f64 = 128.0;
/// `sizeof(SourceMeta)`: the source RDMA rank and the NVLink-rank bit mask, two `int`s.
pub const DEEPEP_SOURCE_META_BYTES: f64 = 8.0;
/// `sizeof(topk_idx_t)` (int64) and of an `int4` control word.
const TOPK_IDX_BYTES: f64 = 8.0;
const INT_BYTES: f64 = 4.0;
const INT4_BYTES: f64 = 16.0;
/// SMs Megatron-LM gives DeepEP's kernels when `--moe-flex-dispatcher-num-sms` is unset.
pub const MEGATRON_DEEPEP_SMS: u32 = 20;
/// CUs Primus-Turbo's DeepEP uses by default (`EPBufferConfig.num_sms`).
pub const PRIMUS_TURBO_DEEPEP_CUS: u32 = 32;
/// HybridEP aligns the token count per rank up to a multiple of this (`update_template_config`).
pub const HYBRIDEP_TOKEN_ALIGN: u64 = 16;
/// FP8 scaling-factor block: one FP32 scale per 128 hidden values.
const SCALE_BLOCK: f64 = 128.0;

/// A DeepEP size-hint row: EP ranks, the NVLink receive chunk (tokens, the same in the dispatch
/// and the combine config of every row), and the larger RDMA receive chunk of the two configs
/// after `Config`'s rounding up to a multiple of the RDMA send chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeepepConfig {
    pub ranks: u32,
    pub nvl_recv_tokens: u32,
    pub rdma_recv_tokens: u32,
}

const fn row(ranks: u32, nvl_recv_tokens: u32, rdma_recv_tokens: u32) -> DeepepConfig {
    DeepepConfig {
        ranks,
        nvl_recv_tokens,
        rdma_recv_tokens,
    }
}

/// deepseek-ai/DeepEP `deep_ep/buffers/legacy.py` `get_dispatch_config` / `get_combine_config`
/// (RDMA: `align_up(128, send)`: 16 ranks dispatch send 20 -> 140; 96 and 128 dispatch send
/// 12 -> 132; every other send chunk divides 128).
pub const DEEPEP_CONFIGS: [DeepepConfig; 12] = [
    row(2, 256, 128),
    row(4, 256, 128),
    row(8, 256, 128),
    row(16, 288, 140),
    row(24, 288, 128),
    row(32, 288, 128),
    row(48, 288, 128),
    row(64, 288, 128),
    row(96, 480, 132),
    row(128, 560, 132),
    row(144, 720, 132),
    row(160, 720, 132),
];

/// AMD-AGI/Primus-Turbo `primus_turbo/pytorch/deep_ep/buffer.py` (RDMA: 64 ranks dispatch send
/// 28 and combine send 20 -> 140; 128 ranks combine send 12 -> 132; 144 and 160 dispatch send
/// 12 -> 132).
pub const PRIMUS_TURBO_CONFIGS: [DeepepConfig; 10] = [
    row(2, 256, 128),
    row(4, 256, 128),
    row(8, 256, 128),
    row(16, 288, 140),
    row(24, 288, 128),
    row(32, 288, 128),
    row(64, 288, 140),
    row(128, 560, 132),
    row(144, 720, 132),
    row(160, 720, 132),
];

/// The config row a group of `ranks` uses: its own, or (a size the library's table lacks,
/// which the library refuses at start-up) the next larger row, the largest past the end.
pub fn deepep_config(table: &[DeepepConfig], ranks: u32) -> DeepepConfig {
    table
        .iter()
        .copied()
        .find(|c| c.ranks >= ranks)
        .or_else(|| table.last().copied())
        .unwrap_or(row(ranks, 256, 128))
}

/// Bytes of one receive slot of both size hints: the token, its source meta, the top-k indices
/// and weights and the FP8 scales at their most.
fn deepep_slot_bytes(hidden_bytes: f64) -> f64 {
    hidden_bytes
        + DEEPEP_SOURCE_META_BYTES
        + DEEPEP_MAX_TOPK * (TOPK_IDX_BYTES + FP32_BYTES)
        + DEEPEP_MAX_SCALES * FP32_BYTES
}

/// `Config::get_nvl_buffer_size_hint`: bytes of the NVLink/xGMI buffer of a DeepEP group of
/// `ranks` with `sms` SMs and `hidden_bytes` per token.
pub fn deepep_nvl_bytes(c: DeepepConfig, sms: u32, hidden_bytes: f64, ranks: u32) -> f64 {
    let channels = (sms / 2) as f64;
    let nvl = ranks.min(DEEPEP_NVL_PEERS) as f64;
    let rdma = (ranks / DEEPEP_NVL_PEERS).max(1) as f64;
    let slots = channels * nvl * c.nvl_recv_tokens as f64;
    let bytes =
        channels * nvl * (2.0 * rdma + 3.0) * INT_BYTES + slots * deepep_slot_bytes(hidden_bytes);
    align128(bytes)
}

/// `Config::get_rdma_buffer_size_hint`: bytes of the RDMA buffer (0 up to 8 ranks).
pub fn deepep_rdma_bytes(c: DeepepConfig, sms: u32, hidden_bytes: f64, ranks: u32) -> f64 {
    if ranks <= DEEPEP_NVL_PEERS {
        return 0.0;
    }
    let channels = (sms / 2) as f64;
    let rdma = (ranks / DEEPEP_NVL_PEERS) as f64;
    let slots = channels * rdma * c.rdma_recv_tokens as f64;
    let bytes = channels * rdma * (DEEPEP_NVL_PEERS as f64 * 2.0 + 2.0) * 2.0 * INT_BYTES
        + 2.0 * slots * (deepep_slot_bytes(hidden_bytes) + INT4_BYTES);
    align128(bytes)
}

fn align128(bytes: f64) -> f64 {
    (bytes / 128.0).ceil() * 128.0
}

/// HybridEP's buffers, bytes: `tokens` per rank (before the alignment), `per_domain` ranks of
/// the group in one NVLink domain, `domains` domains, `local_experts` experts per rank.
pub fn hybridep_bytes(
    tokens: u64,
    hidden: f64,
    per_domain: u32,
    domains: u32,
    local_experts: f64,
) -> f64 {
    let t = tokens.div_ceil(HYBRIDEP_TOKEN_ALIGN) as f64 * HYBRIDEP_TOKEN_ALIGN as f64;
    let r = per_domain.max(1) as f64;
    let n = domains.max(1) as f64;
    let scales = hidden / SCALE_BLOCK * FP32_BYTES;
    // A token in a domain's buffers: BF16 values, probabilities over the domain's experts.
    let domain_token = hidden * ACT_BYTES + local_experts * r * FP32_BYTES;
    // NVLink domain: the worst case, every token of the group.
    let nvl = t * r * n * (domain_token + scales);
    if n <= 1.0 {
        return nvl;
    }
    // RDMA: the dispatch's own tokens (probabilities over every expert) and the other
    // domains' tokens, the combine's reduction and gather buffers.
    let dispatch = t * (hidden * ACT_BYTES + local_experts * r * n * FP32_BYTES + scales)
        + t * (n - 1.0) * (domain_token + scales);
    let combine = 2.0 * t * (n - 1.0) * domain_token;
    nvl + dispatch + combine
}

/// The fused dispatcher's buffers on one GPU of layout `l`, bytes (0 for allgather and
/// alltoall, and for a model without experts).
pub fn dispatcher_bytes(s: &Scenario, l: &Layout) -> f64 {
    let (Some(moe), Some(backend)) = (&s.model.moe, l.moe.backend()) else {
        return 0.0;
    };
    // Megatron's flex dispatcher runs over the expert-tensor x expert-parallel group.
    let ranks = l.ep.max(1) * l.etp.max(1);
    if ranks <= 1 {
        return 0.0;
    }
    let h = s.model.hidden_size as f64;
    let hidden_bytes = h * ACT_BYTES;
    match backend {
        FlexBackend::Deepep | FlexBackend::PrimusTurboDeepep => {
            let (table, default_sms): (&[DeepepConfig], u32) = match backend {
                FlexBackend::Deepep => (&DEEPEP_CONFIGS, MEGATRON_DEEPEP_SMS),
                _ => (&PRIMUS_TURBO_CONFIGS, PRIMUS_TURBO_DEEPEP_CUS),
            };
            let sms = l.moe.flex_num_sms.unwrap_or(default_sms);
            let c = deepep_config(table, ranks);
            deepep_nvl_bytes(c, sms, hidden_bytes, ranks)
                + deepep_rdma_bytes(c, sms, hidden_bytes, ranks)
        }
        FlexBackend::Hybridep => {
            let tp_sp = if l.sp() { l.tp.max(1) } else { 1 };
            let tokens = s.training.seq_length / l.cp.max(1) as u64 * l.micro_batch_size as u64
                / tp_sp as u64;
            let group = Topology::of_scenario(s).group(s.cluster.gpus, ranks, 1);
            let per_domain = group.in_domain();
            let domains = ranks.div_ceil(per_domain.max(1));
            let local_experts = moe.num_experts as f64 / l.ep.max(1) as f64;
            hybridep_bytes(tokens, h, per_domain, domains, local_experts)
        }
    }
}
