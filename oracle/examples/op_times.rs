//! Per-op kernel times of one decoder layer of each shape, and of the embedding and the output
//! layer, for a plan's layout, per micro-batch on one GPU (the analytic timer): what a
//! projection's compute term is made of. `cargo run --release -p primus-oracle --example
//! op_times -- examples/deepseek-v3-h100.yaml`.

use std::path::Path;

use primus_oracle::compute::{
    AnalyticTimer, Dims, LayerShape, OpTimer, Pass, TimerContext, embedding_ops, head_ops,
    layer_ops,
};
use primus_oracle::model::LayerKind;
use primus_oracle::plan::load_plan;
use primus_oracle::profiles::Catalog;

fn main() {
    let catalog = Catalog::builtin().expect("built-in catalog");
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: op_times PLAN.yaml");
        std::process::exit(2);
    };
    let plan = load_plan(Path::new(&path), &catalog).unwrap_or_else(|e| {
        eprintln!("{path}: {e}");
        std::process::exit(1);
    });
    let Ok(l) = plan.layout() else {
        eprintln!("{path}: the plan has no spec.parallelism");
        std::process::exit(1);
    };
    let s = &plan.scenario;
    let ctx = TimerContext {
        hardware: &s.hardware,
        precision: s.training.precision,
        fp8_recipe: l.fp8_recipe(),
    };
    let d = Dims::of(s, l);
    let ms = |op: &primus_oracle::compute::Op, pass: Pass| {
        AnalyticTimer.op_seconds(&ctx, op, pass) * 1e3
    };
    let kinds: &[LayerKind] = match (s.model.moe.is_some(), s.model.dense_layer_count() > 0) {
        (false, _) => &[LayerKind::Dense],
        (true, false) => &[LayerKind::Moe],
        (true, true) => &[LayerKind::Dense, LayerKind::Moe],
    };
    for &kind in kinds {
        for sliding in [false, true] {
            let ops = layer_ops(&s.model, &d, LayerShape { kind, sliding });
            println!("{kind:?} layer, sliding window {sliding}: ms per micro-batch");
            let (mut fwd, mut bwd) = (0.0, 0.0);
            for op in ops.iter() {
                let f = ms(op, Pass::Forward);
                let b = ms(op, Pass::Dgrad) + ms(op, Pass::Wgrad);
                fwd += f;
                bwd += b;
                println!(
                    "  {:<24} {:<12} m {:>8.0} n {:>7.0} k {:>7.0} x{:<4.0} fwd {:>7.3} bwd {:>7.3} kernels {:>4.0} host calls {:>4.0} {:?}",
                    op.name,
                    format!("{:?}", op.class),
                    op.m,
                    op.n,
                    op.k,
                    op.groups,
                    f,
                    b,
                    op.kernels,
                    op.host_ops,
                    op.part
                );
            }
            println!("  total fwd {fwd:.3} bwd {bwd:.3}");
        }
    }
    for (name, ops) in [
        ("embedding", embedding_ops(&s.model, &d)),
        ("output layer and loss", head_ops(&s.model, &d)),
    ] {
        let t: f64 = ops
            .iter()
            .map(|op| ms(op, Pass::Forward) + ms(op, Pass::Dgrad) + ms(op, Pass::Wgrad))
            .sum();
        println!("{name}: fwd+bwd {t:.3} ms per micro-batch");
    }
}
