//! `primus project -f PLAN [-o table|json]`: project the plan's layout (`spec.parallelism`)
//! exactly as given: step time, tokens/s/GPU, model TFLOP/s/GPU, MFU, the breakdown of the step
//! and the memory summary.

use std::path::PathBuf;

use super::{CliError, Common, Output, plan, print_json};
use crate::projection::{Projection, project};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// The TrainingPlan (YAML or JSON); its `spec.parallelism` is the layout to project.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

/// The breakdown table: seconds and share of the step per term.
pub fn breakdown_table(p: &Projection) -> String {
    let step = p.step_time_seconds;
    let mut out = format!(
        "{:<26} {:>11} {:>7}\n",
        "STEP BREAKDOWN", "SECONDS", "SHARE"
    );
    let names = [
        ("compute", "compute"),
        ("tp", "TP/SP communication"),
        ("cp", "CP communication"),
        ("ep", "EP all-to-all"),
        ("pp", "PP point-to-point"),
        ("dp", "DP/FSDP communication"),
        ("bubble", "pipeline bubble"),
        ("host", "host-bound (MoE)"),
        ("optimizer", "optimizer step"),
        ("other", "other overheads"),
    ];
    for ((key, v), (_, label)) in p.breakdown.terms().iter().zip(names.iter()) {
        let _ = key;
        out.push_str(&format!(
            "{:<26} {:>11.4} {:>6.1}%\n",
            label,
            v,
            if step > 0.0 { v / step * 100.0 } else { 0.0 }
        ));
    }
    out.push_str(&format!("{:<26} {:>11.4} {:>6.1}%\n", "step", step, 100.0));
    out
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let (_, p) = plan(&args.common, &args.file)?;
    let layout = p.layout()?;
    let s = &p.scenario;
    let proj = project(s, layout).map_err(|e| CliError::Input(e.to_string()))?;
    match args.output {
        Output::Json => print_json(&proj),
        Output::Table => {
            println!(
                "{}: {} on {} x {} ({}), seq {}, global batch {}",
                p.name,
                if s.model.name.is_empty() {
                    "model"
                } else {
                    &s.model.name
                },
                s.cluster.gpus,
                s.hardware.name,
                s.training.precision.as_str(),
                s.training.seq_length,
                s.training.global_batch_size,
            );
            println!(
                "layout: {} (dp {}, {} micro-batches per step)",
                layout.label(),
                proj.dp,
                proj.num_microbatches
            );
            println!(
                "step {:.3} s | {:.0} tokens/s/GPU | {:.1} model TFLOP/s/GPU | MFU {:.1}% | bubble {:.1}% | dominated by {}",
                proj.step_time_seconds,
                proj.tokens_per_second_per_gpu,
                proj.tflops_per_gpu,
                proj.mfu * 100.0,
                proj.bubble_fraction * 100.0,
                proj.dominant.as_str(),
            );
            println!();
            print!("{}", breakdown_table(&proj));
            println!(
                "(exposed seconds on the critical pipeline stage {})",
                proj.critical_stage
            );
            println!();
            print!("{}", super::memory::table(&proj.memory));
            Ok(())
        }
    }
}
