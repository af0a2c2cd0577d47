//! `primus timeline -f PLAN -o FILE.svg`: the pipeline schedule of the plan's layout as an SVG
//! picture: one row per pipeline rank, forward / backward / recompute / weight-gradient
//! blocks per micro-batch (model chunks shaded), message waits and bubbles, the data-parallel
//! and optimizer tail, a legend and a time axis.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{CliError, Common, plan};
use primus_oracle::projection::{Timeline, timeline};
use primus_oracle::schedule::PassKind;

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub common: Common,
    /// The TrainingPlan (YAML or JSON); its `spec.parallelism` is the layout to draw.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Where to write the SVG.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Width of the drawing in pixels.
    #[arg(long, default_value_t = 1600)]
    pub width: u32,
}

pub fn run(args: &Args) -> Result<(), CliError> {
    let (_, p) = plan(&args.common, &args.file)?;
    let layout = p.layout()?;
    let s = &p.scenario;
    let t = timeline(s, layout).map_err(|e| CliError::Input(e.to_string()))?;
    let title = format!(
        "{} on {} x {} ({}): {}",
        if s.model.name.is_empty() {
            "model"
        } else {
            &s.model.name
        },
        s.cluster.gpus,
        s.hardware.name,
        s.training.precision.as_str(),
        layout.label()
    );
    let svg = render_svg(&t, &title, args.width.max(400));
    std::fs::write(&args.output, svg)
        .map_err(|e| CliError::Failed(format!("writing {}: {e}", args.output.display())))?;
    eprintln!(
        "wrote {} ({} passes on {} pipeline ranks, step {:.3} s, bubble {:.1}%)",
        args.output.display(),
        t.events.len(),
        t.pp,
        t.step.step_time_seconds,
        t.step.bubble_fraction * 100.0
    );
    Ok(())
}

/// Escape text for XML.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" tick step (1, 2 or 5 x 10^k) giving about `target` ticks over `span`.
fn tick_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(1e-12);
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm < 1.5 {
        1.0
    } else if norm < 3.5 {
        2.0
    } else if norm < 7.5 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

/// Format seconds with a unit suited to the tick step.
fn fmt_time(t: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{t:.0} s")
    } else if step >= 0.1 {
        format!("{t:.1} s")
    } else if step >= 1e-3 {
        format!("{:.0} ms", t * 1e3)
    } else {
        format!("{:.2} ms", t * 1e3)
    }
}

const FORWARD: [&str; 2] = ["#4e79a7", "#7aa6d6"];
const BACKWARD: [&str; 2] = ["#59a14f", "#8cd17d"];
const RECOMPUTE: &str = "#f28e2b";
const WEIGHT: &str = "#b07aa1";
const MESSAGE: &str = "#edc948";
const BUBBLE: &str = "#e6e6e6";
const TAIL: &str = "#9c755f";

/// Render a timeline as SVG.
pub fn render_svg(t: &Timeline, title: &str, width: u32) -> String {
    let left = 110.0;
    let right = 30.0;
    let top = 78.0;
    let row_h = 26.0;
    let gap = 8.0;
    let axis_h = 40.0;
    let legend_h = 34.0;
    let pp = t.pp.max(1);
    let width = width as f64;
    let plot_w = width - left - right;
    let rows_h = pp as f64 * (row_h + gap);
    let height = top + rows_h + axis_h + legend_h;
    let makespan = t.step.pipeline_seconds.max(1e-12);
    let total = t.step.step_time_seconds.max(makespan);
    let x = |time: f64| left + time / total * plot_w;
    let row_y = |r: usize| top + r as f64 * (row_h + gap);

    let mut svg = String::with_capacity(256 + t.events.len() * 160);
    let _ = write!(
        svg,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
    );
    let _ = writeln!(
        svg,
        "<rect x=\"0\" y=\"0\" width=\"{width:.0}\" height=\"{height:.0}\" fill=\"#ffffff\"/>"
    );
    let _ = writeln!(
        svg,
        "<text x=\"{left:.0}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>",
        esc(title)
    );
    let b = &t.step.breakdown;
    let _ = writeln!(
        svg,
        "<text x=\"{left:.0}\" y=\"44\" font-size=\"12\">step {:.3} s, pipeline {:.3} s, bubble {:.1}%, {} micro-batches x {} chunks, {:.0} tokens/s/GPU, MFU {:.1}%, exposed comm {:.3} s</text>",
        t.step.step_time_seconds,
        t.step.pipeline_seconds,
        t.step.bubble_fraction * 100.0,
        t.step.num_microbatches,
        t.vpp,
        t.step.tokens_per_second_per_gpu,
        t.step.mfu * 100.0,
        b.exposed_comm()
    );

    // Row backgrounds (the bubble: everything not covered by a pass) and labels.
    for r in 0..pp {
        let y = row_y(r);
        let _ = writeln!(
            svg,
            "<rect x=\"{:.2}\" y=\"{y:.2}\" width=\"{:.2}\" height=\"{row_h}\" fill=\"{BUBBLE}\"/>",
            x(0.0),
            x(makespan) - x(0.0)
        );
        let _ = writeln!(
            svg,
            "<text x=\"{:.0}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\">stage {r}</text>",
            left - 10.0,
            y + row_h / 2.0 + 4.0
        );
        // Data-parallel sync and optimizer after the pipeline.
        if total > makespan {
            let _ = writeln!(
                svg,
                "<rect x=\"{:.2}\" y=\"{y:.2}\" width=\"{:.2}\" height=\"{row_h}\" fill=\"{TAIL}\" opacity=\"0.8\"><title>DP gradient sync, optimizer and step overheads: {:.4} s</title></rect>",
                x(makespan),
                x(total) - x(makespan),
                total - makespan
            );
        }
    }

    // Passes, in each rank's time order, with message waits before them.
    let mut order: Vec<usize> = (0..t.events.len()).collect();
    order.sort_by(|&a, &b| {
        let (ea, eb) = (&t.events[a], &t.events[b]);
        ea.rank.cmp(&eb.rank).then(ea.start.total_cmp(&eb.start))
    });
    let mut prev_end = vec![0.0f64; pp];
    for &i in &order {
        let e = &t.events[i];
        let r = e.rank as usize;
        if r >= pp {
            continue;
        }
        let y = row_y(r);
        let vs = e.chunk as usize * pp + r;
        let first_stage = vs == 0;
        let last_stage = vs + 1 == pp * t.vpp;
        // A wait for a message: the part of the idle gap just before the pass, at most one
        // message time, when the pass's input comes from another rank.
        let waits_for_message = match e.kind {
            PassKind::Forward => !first_stage,
            PassKind::Backward => !last_stage,
            PassKind::Weight => false,
        };
        let gap = e.start - prev_end[r];
        if waits_for_message && gap > 0.0 && t.p2p > 0.0 {
            let w = gap.min(t.p2p);
            let _ = writeln!(
                svg,
                "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"{MESSAGE}\"><title>waiting for a message: {:.3} ms</title></rect>",
                x(e.start - w),
                y + row_h * 0.25,
                (x(e.start) - x(e.start - w)).max(0.5),
                row_h * 0.5,
                w * 1e3
            );
        }
        prev_end[r] = prev_end[r].max(e.end);
        let shade = e.chunk as usize % 2;
        let (label, color) = match e.kind {
            PassKind::Forward => ("F", FORWARD[shade]),
            PassKind::Backward => ("B", BACKWARD[shade]),
            PassKind::Weight => ("W", WEIGHT),
        };
        let x0 = x(e.start);
        let x1 = x(e.end);
        let w = (x1 - x0).max(0.5);
        let _ = writeln!(
            svg,
            "<rect x=\"{x0:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{row_h}\" fill=\"{color}\" stroke=\"#ffffff\" stroke-width=\"0.4\"><title>{label} micro-batch {} chunk {} stage {r}: {:.3}-{:.3} ms</title></rect>",
            e.microbatch,
            e.chunk,
            e.start * 1e3,
            e.end * 1e3
        );
        // Recomputation at the start of a backward pass.
        if e.kind == PassKind::Backward {
            let rc = t.recompute.get(vs).copied().unwrap_or(0.0);
            if rc > 0.0 {
                let rw = (x(e.start + rc) - x0).min(w);
                let _ = writeln!(
                    svg,
                    "<rect x=\"{x0:.2}\" y=\"{y:.2}\" width=\"{rw:.2}\" height=\"{row_h}\" fill=\"{RECOMPUTE}\" stroke=\"#ffffff\" stroke-width=\"0.4\"><title>recompute micro-batch {}: {:.3} ms</title></rect>",
                    e.microbatch,
                    rc * 1e3
                );
            }
        }
        if w >= 16.0 {
            let _ = writeln!(
                svg,
                "<text x=\"{:.2}\" y=\"{:.1}\" font-size=\"9\" fill=\"#ffffff\" text-anchor=\"middle\">{}</text>",
                x0 + w / 2.0,
                y + row_h / 2.0 + 3.0,
                e.microbatch
            );
        }
    }

    // Time axis.
    let axis_y = top + rows_h + 4.0;
    let _ = writeln!(
        svg,
        "<line x1=\"{left:.0}\" y1=\"{axis_y:.1}\" x2=\"{:.1}\" y2=\"{axis_y:.1}\" stroke=\"#333333\" stroke-width=\"1\"/>",
        x(total)
    );
    let step = tick_step(total, 10.0);
    let mut tick = 0.0;
    while tick <= total * 1.0001 {
        let tx = x(tick);
        let _ = writeln!(
            svg,
            "<line x1=\"{tx:.2}\" y1=\"{axis_y:.1}\" x2=\"{tx:.2}\" y2=\"{:.1}\" stroke=\"#333333\" stroke-width=\"1\"/>",
            axis_y + 5.0
        );
        let _ = writeln!(
            svg,
            "<text x=\"{tx:.2}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">{}</text>",
            axis_y + 18.0,
            fmt_time(tick, step)
        );
        tick += step;
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.0}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">time</text>",
        left - 30.0,
        axis_y + 18.0
    );

    // Legend.
    let ly = axis_y + axis_h - 4.0;
    let items: [(&str, &str); 9] = [
        (FORWARD[0], "forward"),
        (FORWARD[1], "forward (odd chunk)"),
        (BACKWARD[0], "backward"),
        (BACKWARD[1], "backward (odd chunk)"),
        (RECOMPUTE, "recompute"),
        (WEIGHT, "weight grad (ZB)"),
        (MESSAGE, "p2p wait"),
        (BUBBLE, "bubble / idle"),
        (TAIL, "DP sync + optimizer"),
    ];
    let mut lx = left;
    for (color, name) in items {
        let _ = writeln!(
            svg,
            "<rect x=\"{lx:.1}\" y=\"{ly:.1}\" width=\"14\" height=\"14\" fill=\"{color}\" stroke=\"#999999\" stroke-width=\"0.5\"/>"
        );
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\">{}</text>",
            lx + 19.0,
            ly + 11.5,
            esc(name)
        );
        lx += 26.0 + 6.5 * name.len() as f64;
    }
    svg.push_str("</svg>\n");
    svg
}
