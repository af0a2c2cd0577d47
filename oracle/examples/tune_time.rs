//! Wall time and counts of an exhaustive tune of example plans (the speed targets are
//! read here and in `benches/tune.rs`): `cargo run --release -p primus-oracle --example
//! tune_time -- examples/deepseek-v3-h100.yaml [more plans]`; `RAYON_NUM_THREADS=1` for one core.

use std::path::Path;
use std::time::Instant;

use primus_oracle::plan::{SearcherKind, load_plan};
use primus_oracle::profiles::Catalog;
use primus_oracle::tune::tune_plan;

fn main() {
    let catalog = Catalog::builtin().expect("catalog");
    for path in std::env::args().skip(1) {
        let plan = load_plan(Path::new(&path), &catalog).expect("plan");
        if std::env::var("COUNT").is_ok() {
            let t0 = Instant::now();
            let space = primus_oracle::tune::space::Space::new(
                &plan.scenario,
                &plan.tuning,
                plan.layout.as_ref(),
            )
            .unwrap();
            let st = space.structures(&plan.scenario);
            let n = st.len();
            let t1 = t0.elapsed().as_secs_f64();
            let mut bad = 0;
            for x in &st {
                for &m in &space.micro_batch_size {
                    let l = space.layout(x, m, primus_oracle::tune::space::RecomputeChoice::NONE);
                    if l.check(&plan.scenario).is_err() {
                        bad += 1;
                    }
                }
            }
            println!(
                "structures {n} ({t1:.3} s), mbs {}, rule checks {:.3} s, failing {bad}",
                space.micro_batch_size.len(),
                t0.elapsed().as_secs_f64() - t1
            );
        }
        let start = Instant::now();
        let r = tune_plan(&plan, SearcherKind::Exhaustive).expect("tunes");
        let wall = start.elapsed().as_secs_f64();
        let best = r.best.as_ref().map(|b| b.label.clone()).unwrap_or_default();
        println!(
            "{path}: {wall:.3} s, evaluated {}, pruned {}, rules {}, memory {}, gain {:+.1}%, best {best}",
            r.evaluated,
            r.pruned,
            r.rejected_by_rules,
            r.rejected_by_memory,
            100.0 * r.gain_over_reference.unwrap_or(0.0)
        );
    }
}
