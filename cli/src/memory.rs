//! `primus memory -f PLAN [-o table|json]`: per-stage, per-GPU memory of the plan's layout,
//! the verdict, and the memory model's measured error band for the kind of job beside it.

use std::path::PathBuf;

use super::{CliError, Common, Output, plan, print_json};
use primus_oracle::memory::{Band, MemoryReport, Verdict, estimate};
use primus_oracle::units::gib;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// The TrainingPlan (YAML or JSON); its `spec.parallelism` is the layout to check.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let (_, p) = plan(&args.common, &args.file)?;
    let layout = p.layout()?;
    layout
        .check(&p.scenario)
        .map_err(|e| CliError::Input(e.to_string()))?;
    let report = estimate(&p.scenario, layout);
    let band = Band::of(&p.scenario);
    let verdict = Verdict::of(
        report.peak_bytes,
        report.usable_bytes,
        p.tuning.memory_headroom,
        &band,
    );
    match args.output {
        Output::Json => print_json(&serde_json::json!({
            "layout": layout,
            "memory": report,
            "band": band,
            "verdict": verdict,
        })),
        Output::Table => {
            let s = &p.scenario;
            println!(
                "{}: {}, {} micro-batches per step",
                p.name,
                crate::scenario_headline(s),
                layout.num_microbatches(s),
            );
            println!(
                "layout: {} (dp {})",
                layout.label(),
                layout.dp(s.cluster.gpus).unwrap_or(0)
            );
            print!("{}", table(&report));
            print!("{}", verdict_line(&report, &band, verdict));
            if report.fixed_segments_at_risk(layout) {
                println!(
                    "Without expandable segments the allocator's fixed-size segments may fragment past usable memory: the allocated peak {:.2} GiB x {} (the worst reserved-over-allocated measured) > {:.2} GiB; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                    gib(report.allocated_peak_bytes()),
                    primus_oracle::memory::allocator::FIXED_SEGMENTS_WORST_RESERVED_RATIO,
                    gib(report.usable_bytes),
                );
            }
            Ok(())
        }
    }
}

/// The verdict with the error band: `Error band -24%/+5% (Megatron MoE jobs): the real peak of
/// this prediction lies in 64.91..89.73 GiB; verdict: fits (...)`.
pub fn verdict_line(r: &MemoryReport, band: &Band, verdict: Verdict) -> String {
    format!(
        "Error band {}: the real peak of this prediction lies in {:.2}..{:.2} GiB; verdict: {} (the admission webhook denies above {:.2} GiB)\n",
        band.describe(),
        gib(r.peak_bytes / (1.0 + band.over)),
        gib(r.peak_bytes * (1.0 + band.under)),
        verdict.as_str(),
        gib(band.deny_above(r.usable_bytes)),
    )
}

/// The human table: one row per stage in GiB, the bottleneck marked, then the verdict.
pub fn table(r: &MemoryReport) -> String {
    let mut out = format!(
        "{:>6} {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9}\n",
        "STAGE", "LAYERS", "WEIGHTS", "GRADS", "OPTIM", "ACTIV", "OTHER", "TOTAL", "IN-FLIGHT"
    );
    for st in &r.stages {
        let mark = if st.stage == r.bottleneck_stage {
            "*"
        } else {
            " "
        };
        let mut layers = st.layers.to_string();
        if st.mtp_layers > 0 {
            layers.push_str(&format!("+{}m", st.mtp_layers));
        }
        out.push_str(&format!(
            "{:>5}{} {:>6} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>9}\n",
            st.stage,
            mark,
            layers,
            gib(st.weights_bytes),
            gib(st.gradients_bytes),
            gib(st.optimizer_bytes),
            gib(st.activations_bytes),
            gib(st.other_bytes),
            gib(st.total_bytes),
            st.inflight_microbatches,
        ));
    }
    out.push_str(&format!(
        "GiB per GPU; * bottleneck stage {}. Capacity {:.2} GiB, usable {:.2} GiB (after the runtime reserve): peak {:.2} GiB {}, headroom {:.2} GiB\n",
        r.bottleneck_stage,
        gib(r.capacity_bytes),
        gib(r.usable_bytes),
        gib(r.peak_bytes),
        if r.fits { "fits" } else { "DOES NOT FIT" },
        gib(r.headroom_bytes),
    ));
    // What the bottleneck stage's parts leave unsaid: the step's gradient copy and the
    // side-stream pools, each named where it is there.
    if let Some(st) = r.stages.iter().find(|st| st.stage == r.bottleneck_stage) {
        if st.step_grad_copy_bytes > 0.0 {
            out.push_str(&format!(
                "The optimizer step adds {:.2} GiB (an FP32 copy of the BF16 gradient shard) after the backward: in the peak only by what exceeds the memory it reuses (the activations and pass buffers no CUDA-graph pool keeps).\n",
                gib(st.step_grad_copy_bytes),
            ));
        }
        if st.pipeline_inputs_bytes > 0.0 {
            out.push_str(&format!(
                "Between iterations the stage keeps {:.2} GiB of pipeline inputs (each model chunk's last received input and its gradient), beside the optimizer step too.\n",
                gib(st.pipeline_inputs_bytes),
            ));
        }
        if st.graph_static_bytes > 0.0 {
            out.push_str(&format!(
                "Of the other bytes, {:.2} GiB are the CUDA graphs' static samples (attention masks, batch copies); the graphs' pools keep their activations from the optimizer step.\n",
                gib(st.graph_static_bytes),
            ));
        }
        if st.side_stream_pool_bytes > 0.0 {
            out.push_str(&format!(
                "Of the other bytes, {:.2} GiB stay reserved in the shared-expert overlap's side-stream pools (their backward buffers, which no other stream reuses).\n",
                gib(st.side_stream_pool_bytes),
            ));
        }
    }
    out
}
