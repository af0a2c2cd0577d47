//! Memory evaluations per second: `peak_bytes` for DeepSeek-V3 on 1024 H100 (TP2 PP8 VPP4
//! EP64, Megatron pipeline layout), the tuner's pre-filter hot path. Target: >= 1,000,000 per
//! second on one core. Run: `cargo bench -p primus-oracle --bench memory`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use primus_oracle::layout::{Layout, PipelineLayout, Schedule};
use primus_oracle::memory::{estimate, peak_bytes};
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};

fn deepseek() -> (Scenario, Layout) {
    let c = Catalog::builtin().expect("catalog");
    let s = Scenario {
        model: c.model("deepseek-v3").expect("preset").clone(),
        hardware: c.hardware("h100-sxm").expect("profile").clone(),
        cluster: Cluster {
            gpus: 1024,
            gpus_per_node: 8,
        },
        training: Training {
            seq_length: 4096,
            global_batch_size: 8192,
            precision: Precision::Fp8,
        },
    };
    let l = Layout {
        tp: 2,
        pp: 8,
        vpp: 4,
        ep: 64,
        schedule: Schedule::Interleaved,
        pipeline_layout: Some(PipelineLayout::parse("Et|(tt|)*30mL").expect("layout")),
        ..Layout::default()
    };
    l.check(&s).expect("legal layout");
    (s, l)
}

fn bench(c: &mut Criterion) {
    let (s, l) = deepseek();
    let mut g = c.benchmark_group("memory");
    g.throughput(Throughput::Elements(1));
    g.bench_function("peak_bytes deepseek-v3 1024xH100 TP2 PP8 VPP4 EP64", |b| {
        b.iter(|| peak_bytes(black_box(&s), black_box(&l)))
    });
    // Same layout without the explicit pipeline layout: PP8, 1F1B, first/last split 7 + 6*8 + 6.
    let plain = Layout {
        vpp: 1,
        schedule: Schedule::OneFOneB,
        pipeline_layout: None,
        first_stage_layers: Some(7),
        last_stage_layers: Some(6),
        ..l.clone()
    };
    plain.check(&s).expect("legal layout");
    g.bench_function("peak_bytes deepseek-v3 1024xH100 TP2 PP8 EP64 1f1b", |b| {
        b.iter(|| peak_bytes(black_box(&s), black_box(&plain)))
    });
    g.bench_function("estimate deepseek-v3 1024xH100 TP2 PP8 VPP4 EP64", |b| {
        b.iter(|| estimate(black_box(&s), black_box(&l)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
