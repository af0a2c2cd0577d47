//! The tuner's speed: exhaustive tunes of the example plans (Llama 3.1 405B and DeepSeek-V3 on
//! 1,024 H100, Mixtral 8x22B on 32 MI355X; every axis free), the seed planner on the same, and
//! the per-candidate costs the exhaustive search is made of (rules, memory pre-filter, time
//! projection). Run: `cargo bench -p primus-oracle --bench tune`.

use std::hint::black_box;
use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use primus_oracle::layout::Layout;
use primus_oracle::memory;
use primus_oracle::plan::{Plan, SearcherKind, load_plan};
use primus_oracle::profiles::Catalog;
use primus_oracle::projection::step_time;
use primus_oracle::tune::tune_plan;

fn example(name: &str) -> Plan {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("examples")
        .join(format!("{name}.yaml"));
    load_plan(&path, &Catalog::builtin().expect("catalog")).expect("example plan")
}

const PLANS: [&str; 3] = [
    "llama3.1-405b-h100",
    "deepseek-v3-h100",
    "mixtral-8x22b-mi355x",
];

fn tunes(c: &mut Criterion) {
    let mut g = c.benchmark_group("tune");
    g.sample_size(10);
    for name in PLANS {
        let plan = example(name);
        for kind in [SearcherKind::Exhaustive, SearcherKind::Seed] {
            g.bench_function(format!("{}_{name}", kind.as_str()), |b| {
                b.iter(|| tune_plan(black_box(&plan), kind).expect("tunes"))
            });
        }
    }
    g.finish();
}

fn candidate_costs(c: &mut Criterion) {
    let mut g = c.benchmark_group("candidate");
    for name in PLANS {
        let plan = example(name);
        let s = &plan.scenario;
        // The tuned layout: what the time model costs on a layout that fits.
        let best: Layout = tune_plan(&plan, SearcherKind::Seed)
            .expect("tunes")
            .best
            .expect("a layout fits")
            .layout;
        g.bench_function(format!("rules_{name}"), |b| {
            b.iter(|| black_box(&best).check(black_box(s)))
        });
        g.bench_function(format!("peak_bytes_{name}"), |b| {
            b.iter(|| memory::peak_bytes(black_box(s), black_box(&best)))
        });
        g.bench_function(format!("step_time_{name}"), |b| {
            b.iter(|| step_time(black_box(s), black_box(&best)).expect("projects"))
        });
    }
    g.finish();
}

criterion_group!(benches, candidate_costs, tunes);
criterion_main!(benches);
