//! Host synchronisations per MoE layer by execution path (issue 16): the dispatcher's own
//! (the token counts' copy, DeepEP's busy-wait on its receive counter), two `masked_select`
//! calls in Megatron-Core's unfused dropless permutation (`moe_utils.py:permute`), four in the
//! DeepEP managers' unfused index-to-multihot conversion (`token_dispatcher.py`
//! `_indices_to_multihot`: `indices[mask]`, `repeat_interleave`'s output size and its check,
//! `probs[mask]`) and one in its backward; none with static shapes; and one per forward of a
//! card with the clamped quick-GeGLU (gpt-oss: `weighted_bias_quick_geglu_impl` copies its
//! linear offset to the device with a blocking copy per call). Each beyond the first costs
//! `moeHostSyncUs` and leaves the GPU idle for at least one `cpuLaunchUs` launch.

mod common;

use primus_oracle::backend::FlexBackend;
use primus_oracle::layout::{
    CrossEntropyFusion, Factor, GroupedGemm, Layout, MoeOptions, RouterDtype, TokenDispatcher,
};
use primus_oracle::precision::Precision;
use primus_oracle::projection::project;

fn moe(dispatcher: TokenDispatcher, backend: Option<FlexBackend>, pf: bool) -> MoeOptions {
    MoeOptions {
        token_dispatcher: dispatcher,
        flex_backend: backend,
        permute_fusion: pf,
        ..MoeOptions::default()
    }
}

#[test]
fn syncs_per_path() {
    use TokenDispatcher::*;
    let deepep = Some(FlexBackend::Deepep);
    let turbo = Some(FlexBackend::PrimusTurboDeepep);
    let hybrid = Some(FlexBackend::Hybridep);
    // Fused permutation: the dispatcher's one.
    for (d, b) in [
        (Alltoall, None),
        (Allgather, None),
        (Flex, deepep),
        (Flex, turbo),
        (Flex, hybrid),
    ] {
        assert_eq!(moe(d, b, true).host_syncs(), (1, 0), "{d:?} {b:?}");
    }
    // Unfused: + 2 masked_select; DeepEP's multihot + 4 forward, + 1 backward.
    assert_eq!(moe(Alltoall, None, false).host_syncs(), (3, 0));
    assert_eq!(moe(Allgather, None, false).host_syncs(), (3, 0));
    assert_eq!(moe(Flex, deepep, false).host_syncs(), (7, 1));
    assert_eq!(moe(Flex, turbo, false).host_syncs(), (7, 1));
    // HybridEP permutes inside its kernels.
    assert_eq!(moe(Flex, hybrid, false).host_syncs(), (1, 0));
    // Static shapes: no sync at all.
    let padded = MoeOptions {
        capacity_factor: Some(Factor(1.0)),
        pad_to_capacity: true,
        ..moe(Alltoall, None, false)
    };
    assert_eq!(padded.host_syncs(), (0, 0));
    let capped = MoeOptions {
        rank_capacity_factor: Some(Factor(1.5)),
        ..moe(Flex, hybrid, false)
    };
    assert_eq!(capped.host_syncs(), (0, 0));
}

/// DeepSeek-V2-Lite on 8 MI355X, EP8, MBS 12, global batch 768 (8 micro-batches per rank):
/// the Primus MoE-package blog's DeepEP step (`moe-nongated.csv` XV7, XV8).
fn dsv2_lite(pf: bool) -> (primus_oracle::scenario::Scenario, Layout) {
    let s = common::scenario(
        "deepseek-v2-lite",
        "mi355x",
        8,
        Some(8),
        4096,
        768,
        Precision::Bf16,
    );
    let l = Layout {
        ep: 8,
        micro_batch_size: 12,
        cross_entropy_fusion: CrossEntropyFusion::Te,
        moe: MoeOptions {
            grouped_gemm: GroupedGemm::Legacy,
            force_load_balancing: true,
            router_fusion: pf,
            router_dtype: Some(RouterDtype::Fp32),
            ..moe(
                TokenDispatcher::Flex,
                Some(FlexBackend::PrimusTurboDeepep),
                pf,
            )
        },
        ..Layout::default()
    };
    (s, l)
}

#[test]
fn a_gpu_bound_layer_pays_each_sync_and_one_launch_per_extra_sync() {
    // At MBS 12 every section of the layer is GPU-bound, so the host term is the syncs alone:
    // 26 MoE layers x 8 micro-batches per step. Fused (sync-free stage 1): one 20 us sync per
    // forward. Unfused: 7 forward syncs (20 us each) with 6 extra launches (100 us each, the
    // MI355X cpuLaunchUs since stop 40), one backward sync with its launch:
    // 140 + 600 + 20 + 100 = 860 us per layer and micro-batch.
    let (s, fused) = dsv2_lite(true);
    let e = &s.hardware.efficiency;
    assert_eq!((e.moe_host_sync_us, e.cpu_launch_us), (20.0, 100.0));
    let per = 26.0 * 8.0 * 1e-6;
    let p = project(&s, &fused).unwrap();
    assert!(
        (p.breakdown.host - per * 20.0).abs() < 1e-9,
        "{}",
        p.breakdown.host
    );
    let (s, unfused) = dsv2_lite(false);
    let p = project(&s, &unfused).unwrap();
    assert!(
        (p.breakdown.host - per * 860.0).abs() < 1e-9,
        "{} vs {}",
        p.breakdown.host,
        per * 860.0
    );
}

#[test]
fn the_clamped_quick_geglu_syncs_once_per_moe_layer_forward() {
    // gpt-oss-120b (clamped quick-GeGLU: Megatron-Core's weighted_bias_quick_geglu_impl makes
    // its linear offset a device tensor per call, a blocking copy) on 8 H100, EP8, MBS 4,
    // global batch 64 (2 micro-batches per rank), fused permutation: every section is
    // GPU-bound, so the host term is the dispatcher's sync and the activation's, with one
    // launch for the second: 36 MoE layers x 2 micro-batches x (2 x 20 + 100) us.
    let s = common::scenario(
        "gpt-oss-120b",
        "h100-sxm",
        8,
        Some(8),
        4096,
        64,
        Precision::Bf16,
    );
    let e = &s.hardware.efficiency;
    assert_eq!((e.moe_host_sync_us, e.cpu_launch_us), (20.0, 100.0));
    let l = Layout {
        ep: 8,
        micro_batch_size: 4,
        moe: MoeOptions {
            grouped_gemm: GroupedGemm::Grouped,
            force_load_balancing: true,
            ..moe(TokenDispatcher::Alltoall, None, true)
        },
        ..Layout::default()
    };
    assert_eq!(l.moe.host_syncs(), (1, 0), "the path alone");
    let p = project(&s, &l).unwrap();
    let want = 36.0 * 2.0 * (2.0 * 20.0 + 100.0) * 1e-6;
    assert!(
        (p.breakdown.host - want).abs() < 1e-9,
        "{} vs {want}",
        p.breakdown.host
    );
}
