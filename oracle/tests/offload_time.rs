//! The time the offloads cost: the host-link copies of activation offloading (fine-grained
//! `offloadModules`, layer-level `activationOffloadLayers`) beyond what a layer's compute
//! hides, and the host's part of the optimizer step under optimizer CPU offload (Megatron-Core
//! `HybridDeviceOptimizer`: gradients to the host, `torch.optim.AdamW` on the CPU, parameters
//! back). Byte counts and rates by hand; the compute they overlap cancels out of differences.

use primus_oracle::hardware::{HOST_COPY_EFFICIENCY, HardwareProfile, Link};
use primus_oracle::layout::{Fraction, GroupedGemm, Layout, MoeOptions, OffloadModule, Recompute};
use primus_oracle::memory;
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::projection::{self, CPU_ADAM_PARAMS_PER_SECOND, Projection};
use primus_oracle::scenario::Scenario;

mod common;

fn scenario(model: &str, gpu: &str, gpus: u32, global_batch_size: u64) -> Scenario {
    common::scenario(
        model,
        gpu,
        gpus,
        None,
        4096,
        global_batch_size,
        Precision::Bf16,
    )
}

/// Qwen3-30B-A3B on 8 GPUs, EP8, MBS 1, no recompute, grouped GEMM, fused permutation,
/// forced balance: 8 micro-batches of 4,096 tokens per step, 48 MoE layers on the one stage.
fn qwen3_30b(offload: &[OffloadModule]) -> Layout {
    Layout {
        ep: 8,
        micro_batch_size: 1,
        recompute: Recompute::None,
        offload_modules: (!offload.is_empty()).then(|| offload.to_vec()),
        moe: MoeOptions {
            grouped_gemm: GroupedGemm::Grouped,
            permute_fusion: true,
            force_load_balancing: true,
            ..MoeOptions::default()
        },
        ..Layout::default()
    }
}

fn with_host_link(s: &Scenario, gbps: f64) -> Scenario {
    let mut s = s.clone();
    s.hardware.host_link = Some(Link {
        bandwidth_gbps: gbps,
        latency_us: 0.0,
    });
    s
}

fn project(s: &Scenario, l: &Layout) -> Projection {
    l.check(s).expect("legal layout");
    projection::project(s, l).expect("projects")
}

#[test]
fn fine_grained_copies_cost_what_the_host_link_cannot_hide_by_hand() {
    use OffloadModule::*;
    let base = scenario("qwen3-30b-a3b", "h100-sxm", 8, 64);
    let l = qwen3_30b(&[ExpertFc1, MoeAct]);
    // Bytes per layer and micro-batch, by hand: fc1's input 2 B x 2,048 and the activation's
    // input 2 B x 2 x 768 per routed copy, 8 copies per token, 4,096 tokens.
    let per_layer = 8.0 * (2.0 * 2048.0 + 2.0 * 2.0 * 768.0) * 4096.0;
    assert_eq!(memory::host_copy_bytes(&base, &l).moe_groups, per_layer);
    // On a link so slow that every copy outlasts its layer's pass, each layer of each
    // micro-batch pays its copy out once in the forward and once in the backward, less the
    // compute that hides it; the compute cancels out of the difference of two such links.
    let (slow, slower) = (0.05, 0.025);
    let a = project(&with_host_link(&base, slow), &l);
    let b = project(&with_host_link(&base, slower), &l);
    let copies = 2.0 * 48.0 * 8.0;
    let expected = copies * per_layer / HOST_COPY_EFFICIENCY * (1.0 / slower - 1.0 / slow) / 1e9;
    let got = b.breakdown.offload - a.breakdown.offload;
    assert!(
        (got / expected - 1.0).abs() < 1e-9,
        "offload difference {got} s, by hand {expected} s"
    );
    // The copies are the only thing that changed.
    assert_eq!(a.breakdown.compute, b.breakdown.compute);
    assert!((b.step_time_seconds - a.step_time_seconds - got).abs() < 1e-6);
}

#[test]
fn a_fast_host_link_hides_the_copies_a_pcie_link_does_not() {
    use OffloadModule::*;
    // 235 MB per layer and micro-batch (above): 4.4 ms over H100's PCIe Gen5 x16 (63 GB/s at
    // 85%), longer than the layer's forward; 0.6 ms over GB200's NVLink-C2C (450 GB/s), shorter
    // than either pass.
    let l = qwen3_30b(&[ExpertFc1, MoeAct]);
    let plain = qwen3_30b(&[]);
    let h100 = scenario("qwen3-30b-a3b", "h100-sxm", 8, 64);
    let gb200 = scenario("qwen3-30b-a3b", "gb200", 8, 64);
    let h = project(&h100, &l);
    assert!(h.breakdown.offload > 0.1, "{:?}", h.breakdown);
    assert!(h.step_time_seconds > project(&h100, &plain).step_time_seconds);
    let g = project(&gb200, &l);
    assert_eq!(g.breakdown.offload, 0.0, "{:?}", g.breakdown);
    assert_eq!(
        g.step_time_seconds,
        project(&gb200, &plain).step_time_seconds
    );
    // Without the offload there is nothing to copy.
    assert_eq!(project(&h100, &plain).breakdown.offload, 0.0);
}

#[test]
fn layer_level_offload_copies_whole_layers() {
    // Llama 3.1 8B on 8 GPUs, TP1 PP1 DP8, MBS 1, no recompute, 4 of 32 layers offloaded
    // (`--cpu-offloading-num-layers 4`): those layers copy everything they keep.
    let base = scenario("llama3.1-8b", "h100-sxm", 8, 64);
    let l = Layout {
        micro_batch_size: 1,
        recompute: Recompute::None,
        activation_offload_layers: 4,
        ..Layout::default()
    };
    let bytes = memory::host_copy_bytes(&base, &l);
    assert!(bytes.dense_layer > 0.0 && bytes.dense_groups == 0.0);
    let (slow, slower) = (0.05, 0.025);
    let a = project(&with_host_link(&base, slow), &l);
    let b = project(&with_host_link(&base, slower), &l);
    // 4 layers x 8 micro-batches, both directions.
    let expected = 2.0 * 4.0 * 8.0 * bytes.dense_layer / HOST_COPY_EFFICIENCY
        * (1.0 / slower - 1.0 / slow)
        / 1e9;
    let got = b.breakdown.offload - a.breakdown.offload;
    assert!((got / expected - 1.0).abs() < 1e-9, "{got} vs {expected}");
}

#[test]
fn optimizer_cpu_offload_runs_the_offloaded_shard_on_the_host_by_hand() {
    // Llama 3.1 8B on 8 H100, DP8 with the distributed optimizer: each rank's shard is an
    // eighth of the parameters. Offloading all of it replaces the GPU's Adam over the shard
    // (34 B per parameter of HBM traffic) by: the FP32 gradients to the host (4 B), AdamW on
    // the CPU, the FP32 master weights back (4 B).
    let s = scenario("llama3.1-8b", "h100-sxm", 8, 64);
    let gpu = Layout {
        micro_batch_size: 1,
        recompute: Recompute::Full,
        ..Layout::default()
    };
    let host = Layout {
        optimizer_cpu_offload: true,
        optimizer_offload_fraction: Fraction::ONE,
        ..gpu.clone()
    };
    let shard = s.model.total_params() as f64 / 8.0;
    let hw: &HardwareProfile = &s.hardware;
    let link = hw.host_link.as_ref().unwrap();
    let copy_rate = link.bandwidth_gbps * 1e9 * HOST_COPY_EFFICIENCY;
    let hbm = hw.memory_bandwidth_gbps * 1e9 * hw.efficiency.memory_bound;
    let expected = shard * (4.0 + 4.0) / copy_rate
        + 2.0 * link.latency_us * 1e-6
        + shard / CPU_ADAM_PARAMS_PER_SECOND
        - shard * 34.0 / hbm;
    let a = project(&s, &gpu).breakdown.optimizer;
    let b = project(&s, &host).breakdown.optimizer;
    assert!(
        ((b - a) / expected - 1.0).abs() < 1e-9,
        "optimizer {a} -> {b} s, by hand +{expected} s"
    );
    // About 1.4 s of host Adam for ~1e9 parameters: the offload is not free.
    assert!(b - a > 1.0);
    // Half the shard on the host: half the host's work.
    let half = Layout {
        optimizer_offload_fraction: Fraction::new(0.5),
        ..host.clone()
    };
    let c = project(&s, &half).breakdown.optimizer;
    let expected_half = shard / 2.0 * (4.0 + 4.0) / copy_rate
        + 2.0 * link.latency_us * 1e-6
        + shard / 2.0 / CPU_ADAM_PARAMS_PER_SECOND
        - shard / 2.0 * 34.0 / hbm;
    assert!(((c - a) / expected_half - 1.0).abs() < 1e-9);
}

#[test]
fn a_profile_without_a_host_link_times_no_copies_and_a_bad_one_is_refused() {
    use OffloadModule::*;
    let mut s = scenario("qwen3-30b-a3b", "h100-sxm", 8, 64);
    s.hardware.host_link = None;
    let p = project(&s, &qwen3_30b(&[ExpertFc1, MoeAct]));
    assert_eq!(p.breakdown.offload, 0.0);
    let mut hw = Catalog::builtin()
        .unwrap()
        .hardware("h100-sxm")
        .unwrap()
        .clone();
    hw.host_link = Some(Link {
        bandwidth_gbps: 0.0,
        latency_us: 2.0,
    });
    let err = hw.validate("hardware").unwrap_err().to_string();
    assert!(err.contains("hostLink.bandwidthGbps"), "{err}");
    hw.host_link = Some(Link {
        bandwidth_gbps: 63.0,
        latency_us: -1.0,
    });
    let err = hw.validate("hardware").unwrap_err().to_string();
    assert!(err.contains("hostLink.latencyUs"), "{err}");
    // A subnormal bandwidth would make the copies (and the step) infinite: refused, named.
    hw.host_link = Some(Link {
        bandwidth_gbps: 1e-310,
        latency_us: 2.0,
    });
    let err = hw.validate("hardware").unwrap_err().to_string();
    assert!(
        err.contains("hostLink.bandwidthGbps") && err.contains("got 1e-310"),
        "{err}"
    );
    // The slowest link a profile may name still gives a finite step.
    let mut s = scenario("qwen3-30b-a3b", "h100-sxm", 8, 64);
    s.hardware.host_link = Some(Link {
        bandwidth_gbps: primus_oracle::hardware::MIN_FIGURE,
        latency_us: primus_oracle::hardware::MAX_MICROSECONDS,
    });
    s.hardware.validate("hardware").unwrap();
    let l = Layout {
        optimizer_cpu_offload: true,
        ..qwen3_30b(&[ExpertFc1, MoeAct])
    };
    assert!(project(&s, &l).step_time_seconds.is_finite());
}

#[test]
fn every_built_in_profile_names_its_host_link() {
    let c = Catalog::builtin().unwrap();
    for name in [
        "a100-80gb",
        "b200",
        "b300",
        "gb200",
        "gb300",
        "h100-96gb",
        "h100-sxm",
        "h200",
        "mi300x",
        "mi325x",
        "mi355x",
    ] {
        let hw = c.hardware(name).unwrap();
        let link = hw.host_link.as_ref().unwrap_or_else(|| panic!("{name}"));
        // PCIe Gen4/Gen5 x16 (31.5 / 63 GB/s) or NVLink-C2C (450 GB/s) per direction.
        assert!(
            [31.5, 63.0, 450.0].contains(&link.bandwidth_gbps),
            "{name}: {}",
            link.bandwidth_gbps
        );
    }
}
