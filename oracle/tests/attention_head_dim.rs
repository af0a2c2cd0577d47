//! Flash attention at head dimension 64 runs well below its head-dim-128 rate: per scored
//! pair the softmax work stays while the matrix FLOPs halve. The hardware profiles state
//! their attention efficiencies at head dim 128; `compute::attention_head_dim_factor` scales
//! them for smaller heads by the law d / (d + c), with c taken from cuDNN's measured BF16
//! attention on H100 (FlashAttention-3 paper, Shah et al. 2024, arXiv 2407.08608: forward 408
//! against 609 TFLOP/s, backward 417 against 499, sequence 4K). gpt-oss (head dim 64) is the
//! card it moves.

mod common;

use primus_oracle::compute::{Op, Pass, attention_head_dim_factor};
use primus_oracle::layout::Layout;
use primus_oracle::model::LayerKind;
use primus_oracle::precision::Precision;
use primus_oracle::scenario::Scenario;

#[test]
fn head_dim_64_runs_at_the_measured_ratio_and_128_at_the_profiles_rate() {
    // At the measured head dimension the law returns the measurement itself.
    let f64_fwd = attention_head_dim_factor(64.0, Pass::Forward);
    let f64_bwd = attention_head_dim_factor(64.0, Pass::Dgrad);
    assert!((f64_fwd - 408.0 / 609.0).abs() < 1e-12, "{f64_fwd}");
    assert!((f64_bwd - 417.0 / 499.0).abs() < 1e-12, "{f64_bwd}");
    // At and above the profile's head dim, and for an unknown one (0): the profile's rate.
    for d in [0.0, 128.0, 160.0, 192.0, 256.0] {
        assert_eq!(attention_head_dim_factor(d, Pass::Forward), 1.0, "{d}");
        assert_eq!(attention_head_dim_factor(d, Pass::Dgrad), 1.0, "{d}");
    }
    // Between, by hand: forward r = 408/609 = 0.669951, c = 8192 (1 - r) / (128 r - 64)
    // = 2703.76 / 21.7537 = 124.29; at d = 96: 96 x 252.29 / (128 x 220.29) = 0.8589.
    // Backward r = 417/499 = 0.835671, c = 1346.18 / 42.966 = 31.331; at 96:
    // 96 x 159.331 / (128 x 127.331) = 0.93848.
    let f96 = attention_head_dim_factor(96.0, Pass::Forward);
    let b96 = attention_head_dim_factor(96.0, Pass::Dgrad);
    assert!((f96 - 0.8589).abs() < 2e-4, "{f96}");
    assert!((b96 - 0.93848).abs() < 2e-4, "{b96}");
    // Monotone in d, below 1, above the measured point's value beyond it.
    let mut last = 0.0;
    for d in (16..128).step_by(8) {
        let f = attention_head_dim_factor(d as f64, Pass::Forward);
        assert!(f > last && f < 1.0, "{d}: {f}");
        last = f;
    }
}

/// The attention core of one full-attention layer of `kind` of built-in `model` on 8 H100,
/// sequence 4096, TP1, and the layer's op times: the op and (forward, backward) seconds.
fn attention_core(model: &str, kind: LayerKind) -> (Scenario, Op, (f64, f64)) {
    let s = common::scenario(model, "h100-sxm", 8, Some(8), 4096, 64, Precision::Bf16);
    let (att, times) = common::attention_core(&s, &Layout::default(), kind);
    (s, att, times)
}

#[test]
fn gpt_oss_attention_core_is_timed_at_the_head_dim_64_rate() {
    // gpt-oss-120b (64 query heads of dimension 64) on 8 H100, sequence 4096, TP1: the
    // full-attention layer's core, forward at 0.55 x 408/609 of 989.4 TFLOP/s, backward at
    // 0.40 x 417/499 with 2.5x the FLOPs, each plus one kernel's launch overhead.
    let (s, att, (forward, backward)) = attention_core("gpt-oss-120b", LayerKind::Moe);
    assert_eq!(att.k, 64.0, "the op carries the head dimension");
    // 4096 x 4097 / 2 causal pairs, 64 heads, 4 x 64 FLOPs per pair and head.
    let flops = 4096.0 * 4097.0 / 2.0 * 64.0 * 4.0 * 64.0;
    assert!((att.flops - flops).abs() < 1e-6 * flops);
    let hw = &s.hardware;
    let peak = hw.peak_flops(Precision::Bf16);
    let launch = hw.efficiency.kernel_overhead_us * 1e-6;
    let fwd = flops / (peak * hw.efficiency.attention * 408.0 / 609.0) + launch;
    let bwd = 2.5 * flops / (peak * hw.efficiency.attention_backward() * 417.0 / 499.0) + launch;
    assert!((forward - fwd).abs() < 1e-9, "{forward} vs {fwd}");
    assert!((backward - bwd).abs() < 1e-9, "{backward} vs {bwd}");
    // Llama 3.1 8B (head dim 128) keeps the profile's rate.
    let (_, att8, (forward8, _)) = attention_core("llama3.1-8b", LayerKind::Dense);
    assert_eq!(att8.k, 128.0);
    let want8 = att8.flops / (peak * hw.efficiency.attention) + launch;
    assert!((forward8 - want8).abs() < 1e-9);
}
