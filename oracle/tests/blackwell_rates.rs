//! GB200 runs its tensor cores at B200's rate (profiles/hardware/gb200.yaml): the data sheets
//! give GB200 an 11% higher dense peak (5.0 vs 4.5 PFLOP/s FP8), but the same configuration
//! measured on both GPUs in NVIDIA's Megatron-Bridge performance tables runs no faster on
//! GB200. The profile keeps the data sheet's peak (MFU is reported against it) and scales the
//! Blackwell calibration's GEMM and attention efficiencies by 4.5/5.0.

use primus_oracle::layout::{GroupedGemm, Layout, TokenDispatcher};
use primus_oracle::precision::Precision;
use primus_oracle::projection::project;
use primus_oracle::validate::parse_csv;

mod common;

const MOE: &str = include_str!("data/moe.csv");
const NONGATED: &str = include_str!("data/moe-nongated.csv");
const PUBLISHED: &str = include_str!("data/published.csv");
const EXTRA: &str = include_str!("data/extra.csv");

/// The kernels of a layout, timed on `gpu` (8 GPUs, four per node as on both NVL72 trays).
fn compute_seconds(model: &str, gpu: &str, precision: Precision, l: &Layout) -> f64 {
    let s = common::scenario(model, gpu, 8, Some(4), 4096, 512, precision);
    project(&s, l).expect("projects").breakdown.compute
}

#[test]
fn gb200_kernels_take_as_long_as_b200_kernels() {
    // Dense: Llama 3.1 8B, TP1 (GEMMs, attention and element-wise kernels only).
    let dense = Layout {
        micro_batch_size: 1,
        ..Layout::default()
    };
    // MoE: Qwen3-30B-A3B EP8 with grouped experts (many small GEMMs on the size ramp).
    let mut moe = Layout {
        ep: 8,
        micro_batch_size: 4,
        ..Layout::default()
    };
    moe.moe.token_dispatcher = TokenDispatcher::Alltoall;
    moe.moe.grouped_gemm = GroupedGemm::Grouped;
    moe.moe.force_load_balancing = true;
    for (model, l) in [("llama3.1-8b", &dense), ("qwen3-30b-a3b", &moe)] {
        for p in [Precision::Bf16, Precision::Fp8] {
            let b200 = compute_seconds(model, "b200", p, l);
            let gb200 = compute_seconds(model, "gb200", p, l);
            assert!(
                ((gb200 - b200) / b200).abs() < 1e-9,
                "{model} {p:?}: GB200 {gb200} s vs B200 {b200} s"
            );
            // The data sheet's 11% higher peak would have made GB200's kernels faster.
            let gb300 = compute_seconds(model, "gb300", p, l);
            assert!(gb300 <= b200, "{model} {p:?}: GB300 {gb300} s slower");
        }
    }
}

#[test]
fn the_measured_gb200_and_b200_pairs_run_at_the_same_speed() {
    // The evidence the profile cites: Qwen3-30B-A3B, 8 GPUs, EP8, MBS 4, GBS 512, MXFP8,
    // HybridEP, in three Megatron-Bridge releases, measured on both GPUs. GB200 ran at
    // 0.96-0.99x the B200's tokens/s (not the 1.11x of the data sheets' peaks). The B200
    // recipes also capture attention in CUDA graphs (a few percent of host time at most).
    let mut measured = std::collections::HashMap::new();
    for text in [MOE, NONGATED, PUBLISHED, EXTRA] {
        let records = parse_csv(text).expect("csv");
        let header = &records[0].1;
        let col = |n: &str| header.iter().position(|h| h == n).expect(n);
        let (id, tps) = (col("id"), col("measuredTokensPerSecondPerGpu"));
        for (_, f) in &records[1..] {
            if let Ok(v) = f[tps].parse::<f64>() {
                measured.insert(f[id].clone(), v);
            }
        }
    }
    for release in ["MB260201", "MB2604", "MB260401"] {
        let gb200 = measured[&format!("{release}-qwen3-30b-a3b-gb200-fp8mx")];
        let b200 = measured[&format!("{release}-qwen3-30b-a3b-b200-fp8mx")];
        let ratio = gb200 / b200;
        assert!(
            (0.95..=1.0).contains(&ratio),
            "{release}: GB200/B200 {ratio:.3}"
        );
    }
    // Dense, the same table's 25.11 Llama 3 8B FP8-CS run (8 GPUs, MBS 2, seq 8192): GB200
    // (extra.csv XN13) at 1.03x B200 (published.csv N8).
    let dense = measured["XN13"] / measured["N8"];
    assert!(
        (1.0..=1.05).contains(&dense),
        "Llama 3 8B GB200/B200 {dense:.3}"
    );
}
