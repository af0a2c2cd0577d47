//! Full projections per second: Llama 3.1 405B on 1024 H100s, TP8 PP8 CP2 with 8 virtual
//! stages (interleaved 1F1B), 64 micro-batches (the NeMo recipe's layout scaled out; the 126
//! layers split with the embedding and loss counted as one layer each, `Et|tt|...|tL`): 8192
//! forward and backward passes to schedule. Also with 2 virtual stages (2048 passes).
//! `project` includes the memory report; `step_time` is the time model alone (what the tuner
//! ranks by after its memory pre-filter). Target: >= 100,000 full projections per second on
//! one core. Run: `cargo bench -p primus-oracle --bench projection`.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use primus_oracle::layout::{Layout, PipelineLayout, Schedule};
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::projection::{project, step_time};
use primus_oracle::scenario::{Cluster, Scenario, Training};
use primus_oracle::validate::embedding_and_loss_split;

fn llama405b(vpp: u32) -> (Scenario, Layout) {
    let c = Catalog::builtin().expect("catalog");
    let s = Scenario {
        model: c.model("llama3.1-405b").expect("preset").clone(),
        hardware: c.hardware("h100-sxm").expect("profile").clone(),
        cluster: Cluster {
            gpus: 1024,
            gpus_per_node: 8,
        },
        training: Training {
            seq_length: 8192,
            // dp = 1024 / (8 * 8 * 2) = 8; 64 micro-batches of one sequence per replica.
            global_batch_size: 512,
            precision: Precision::Bf16,
        },
    };
    let split = embedding_and_loss_split(126, 0, 8, vpp).expect("126 + 2 slots split evenly");
    let l = Layout {
        tp: 8,
        pp: 8,
        vpp,
        cp: 2,
        schedule: Schedule::Interleaved,
        pipeline_layout: Some(PipelineLayout::parse(&split).expect("layout")),
        ..Layout::default()
    };
    l.check(&s).expect("legal layout");
    assert_eq!(l.num_microbatches(&s), 64);
    (s, l)
}

fn bench(c: &mut Criterion) {
    let (s, l) = llama405b(8);
    let mut g = c.benchmark_group("projection");
    g.throughput(Throughput::Elements(1));
    g.bench_function("project_llama405b_1024gpu_interleaved_m64", |b| {
        b.iter(|| project(black_box(&s), black_box(&l)).expect("projects"))
    });
    g.bench_function("step_time_llama405b_1024gpu_interleaved_m64", |b| {
        b.iter(|| step_time(black_box(&s), black_box(&l)).expect("projects"))
    });
    // The same job with 2 virtual stages (4x fewer passes to simulate).
    let (s2, l2) = llama405b(2);
    g.bench_function("project_llama405b_1024gpu_interleaved_vpp2_m64", |b| {
        b.iter(|| project(black_box(&s2), black_box(&l2)).expect("projects"))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
