//! `primus timeline -f PLAN -o FILE.svg`: the pipeline schedule of the plan's layout as an SVG
//! picture: one row per pipeline rank, forward / backward / recompute / weight-gradient
//! blocks per micro-batch (model chunks shaded), message waits and bubbles, the data-parallel
//! and optimizer tail, a legend and a time axis.
//!
//! A real job runs thousands of passes per step (Llama 3.1 70B at TP4 PP8 VPP5 with 64
//! micro-batches: 5,120); drawn to scale in 1,600 pixels a forward pass would be under a pixel.
//! When passes would be narrower than [`MIN_PASS_PX`], the picture keeps three windows of the
//! step on one time scale, with marked gaps between them: the warm-up (until every stage has
//! started its backward passes), a window of the steady state from the middle, and the
//! cool-down (from the first stage's last forward pass). The caption gives the full counts.

use std::fmt::Write as _;
use std::path::PathBuf;

use super::{CliError, Common, plan};
use frame::{Frame, Window};
use primus_oracle::projection::{Timeline, timeline};
use primus_oracle::schedule::{Event, PassKind};

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

mod frame;

pub use frame::MIN_PASS_PX;

const FORWARD: [&str; 2] = ["#4e79a7", "#7aa6d6"];
const BACKWARD: [&str; 2] = ["#59a14f", "#8cd17d"];
const RECOMPUTE: &str = "#f28e2b";
const WEIGHT: &str = "#b07aa1";
const MESSAGE: &str = "#edc948";
const BUBBLE: &str = "#e6e6e6";
const TAIL: &str = "#9c755f";

/// Render a timeline as SVG.
pub fn render_svg(t: &Timeline, title: &str, width: u32) -> String {
    let frame = Frame::new(t, width);
    let mut svg = String::with_capacity(256 + t.events.len() * 160);
    header(&mut svg, &frame, t, title);
    rows(&mut svg, &frame);
    passes(&mut svg, &frame, t);
    gaps(&mut svg, &frame, t);
    axis(&mut svg, &frame);
    legend(&mut svg, &frame);
    svg.push_str("</svg>\n");
    svg
}

/// `1234567` as `1,234,567`.
fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Passes of each kind: (forward, backward, weight-gradient).
fn pass_counts(t: &Timeline) -> (usize, usize, usize) {
    let n = |k: PassKind| t.events.iter().filter(|e| e.kind == k).count();
    (
        n(PassKind::Forward),
        n(PassKind::Backward),
        n(PassKind::Weight),
    )
}

/// The document, the title and the caption: step figures, full pass counts, what is drawn.
fn header(svg: &mut String, f: &Frame, t: &Timeline, title: &str) {
    let (w, h, left) = (f.width, f.height, f.left);
    let _ = write!(
        svg,
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w:.0}\" height=\"{h:.0}\" viewBox=\"0 0 {w:.0} {h:.0}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
    );
    let _ = writeln!(
        svg,
        "<rect x=\"0\" y=\"0\" width=\"{w:.0}\" height=\"{h:.0}\" fill=\"#ffffff\"/>"
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
    let (fw, bw, wg) = pass_counts(t);
    let weight = if wg > 0 {
        format!(", {} weight-gradient", count(wg))
    } else {
        String::new()
    };
    let drawn = t
        .events
        .iter()
        .filter(|e| f.window(e.start, e.end).is_some())
        .count();
    let shown = if f.windowed() {
        let spans: Vec<String> = f
            .windows
            .iter()
            .map(|w| format!("{} {:.3}-{:.3} s", w.name, w.t0, w.t1))
            .collect();
        format!(
            "drawn: {} ({} passes; one time scale, gaps marked)",
            spans.join(", "),
            count(drawn)
        )
    } else {
        "all drawn to scale".to_string()
    };
    let _ = writeln!(
        svg,
        "<text x=\"{left:.0}\" y=\"62\" font-size=\"12\">{} passes on {} stages: {} forward, {} backward{weight}; {}</text>",
        count(t.events.len()),
        f.pp,
        count(fw),
        count(bw),
        esc(&shown)
    );
}

/// Row backgrounds (the bubble: everything not covered by a pass), labels and the tail.
fn rows(svg: &mut String, f: &Frame) {
    for r in 0..f.pp {
        let y = f.row_y(r);
        let row_h = f.row_h;
        for w in &f.windows {
            let _ = writeln!(
                svg,
                "<rect x=\"{:.2}\" y=\"{y:.2}\" width=\"{:.2}\" height=\"{row_h}\" fill=\"{BUBBLE}\"/>",
                w.x0,
                w.x1() - w.x0
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.0}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\">stage {r}</text>",
            f.left - 10.0,
            y + row_h / 2.0 + 4.0
        );
        // Data-parallel sync and optimizer after the pipeline.
        if let Some(tail) = &f.tail {
            let _ = writeln!(
                svg,
                "<rect x=\"{:.2}\" y=\"{y:.2}\" width=\"{:.2}\" height=\"{row_h}\" fill=\"{TAIL}\" opacity=\"0.8\"><title>DP gradient sync, optimizer and step overheads: {:.4} s</title></rect>",
                tail.x0,
                tail.x1() - tail.x0,
                f.total - f.makespan
            );
        }
    }
}

/// The message wait before a pass whose input comes from another stage: the part of the idle
/// gap just before it, at most one message time.
fn message_wait(svg: &mut String, f: &Frame, t: &Timeline, e: &Event, idle_from: f64) {
    let r = e.rank as usize;
    let vs = e.chunk as usize * f.pp + r;
    let waits = match e.kind {
        PassKind::Forward => vs != 0,
        PassKind::Backward => vs + 1 != f.pp * t.vpp,
        PassKind::Weight => false,
    };
    let gap = e.start - idle_from;
    if !waits || gap <= 0.0 || t.p2p <= 0.0 {
        return;
    }
    let w = gap.min(t.p2p);
    let Some(win) = f.window(e.start - w, e.start) else {
        return;
    };
    let y = f.row_y(r);
    let _ = writeln!(
        svg,
        "<rect x=\"{:.2}\" y=\"{:.2}\" width=\"{:.2}\" height=\"{:.1}\" fill=\"{MESSAGE}\"><title>waiting for a message: {:.3} ms</title></rect>",
        win.x(e.start - w),
        y + f.row_h * 0.25,
        (win.x(e.start) - win.x(e.start - w)).max(0.5),
        f.row_h * 0.5,
        w * 1e3
    );
}

/// Every pass that lies within a window, in each stage's time order, with its message wait,
/// its recomputation and (when wide enough) its micro-batch number.
fn passes(svg: &mut String, f: &Frame, t: &Timeline) {
    let mut order: Vec<usize> = (0..t.events.len()).collect();
    order.sort_by(|&a, &b| {
        let (ea, eb) = (&t.events[a], &t.events[b]);
        ea.rank.cmp(&eb.rank).then(ea.start.total_cmp(&eb.start))
    });
    let mut prev_end = vec![0.0f64; f.pp];
    for &i in &order {
        let e = &t.events[i];
        let r = e.rank as usize;
        if r >= f.pp {
            continue;
        }
        let idle_from = prev_end[r];
        prev_end[r] = prev_end[r].max(e.end);
        let Some(win) = f.window(e.start, e.end) else {
            continue;
        };
        message_wait(svg, f, t, e, idle_from);
        let y = f.row_y(r);
        let row_h = f.row_h;
        let shade = e.chunk as usize % 2;
        let (label, color) = match e.kind {
            PassKind::Forward => ("F", FORWARD[shade]),
            PassKind::Backward => ("B", BACKWARD[shade]),
            PassKind::Weight => ("W", WEIGHT),
        };
        let x0 = win.x(e.start);
        let w = (win.x(e.end) - x0).max(0.5);
        let _ = writeln!(
            svg,
            "<rect x=\"{x0:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{row_h}\" fill=\"{color}\" stroke=\"#ffffff\" stroke-width=\"0.4\"><title>{label} micro-batch {} chunk {} stage {r}: {:.3}-{:.3} ms</title></rect>",
            e.microbatch,
            e.chunk,
            e.start * 1e3,
            e.end * 1e3
        );
        // Recomputation at the start of a backward pass.
        let vs = e.chunk as usize * f.pp + r;
        let rc = t.recompute.get(vs).copied().unwrap_or(0.0);
        if e.kind == PassKind::Backward && rc > 0.0 {
            let rw = (win.x(e.start + rc) - x0).min(w);
            let _ = writeln!(
                svg,
                "<rect x=\"{x0:.2}\" y=\"{y:.2}\" width=\"{rw:.2}\" height=\"{row_h}\" fill=\"{RECOMPUTE}\" stroke=\"#ffffff\" stroke-width=\"0.4\"><title>recompute micro-batch {}: {:.3} ms</title></rect>",
                e.microbatch,
                rc * 1e3
            );
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
}

/// Between windows: a break mark across the stages and, above it, the time and the passes
/// left out (each pass not drawn counts for the gap nearest its middle).
fn gaps(svg: &mut String, f: &Frame, t: &Timeline) {
    let centers: Vec<f64> = f.windows.iter().map(|w| (w.t0 + w.t1) / 2.0).collect();
    for (i, pair) in f.windows.windows(2).enumerate() {
        let (a, b) = (&pair[0], &pair[1]);
        let left_out = t
            .events
            .iter()
            .filter(|e| f.window(e.start, e.end).is_none())
            .filter(|e| {
                let mid = (e.start + e.end) / 2.0;
                mid >= centers[i] && mid < centers[i + 1]
            })
            .count();
        let (x0, x1) = (a.x1(), b.x0);
        let (y0, y1) = (f.top - 4.0, f.top + f.rows_h());
        for dx in [0.3, 0.6] {
            let x = x0 + (x1 - x0) * dx;
            let _ = writeln!(
                svg,
                "<line x1=\"{:.2}\" y1=\"{y0:.1}\" x2=\"{:.2}\" y2=\"{y1:.1}\" stroke=\"#777777\" stroke-width=\"1.2\" stroke-dasharray=\"4 3\"/>",
                x - 3.0,
                x + 3.0
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.2}\" y=\"{:.1}\" font-size=\"10\" fill=\"#555555\" text-anchor=\"middle\"><title>{:.3}-{:.3} s not drawn</title>{:.2} s, {} passes left out</text>",
            (x0 + x1) / 2.0,
            f.top - 10.0,
            a.t1,
            b.t0,
            b.t0 - a.t1,
            count(left_out)
        );
    }
}

/// A time axis under each window (under the whole step when nothing is left out).
fn axis(svg: &mut String, f: &Frame) {
    let axis_y = f.top + f.rows_h() + 4.0;
    let spans: Vec<Window> = if f.windowed() {
        f.windows.iter().chain(f.tail.iter()).copied().collect()
    } else {
        let w = f.windows[0];
        vec![Window { t1: f.total, ..w }]
    };
    for w in &spans {
        let _ = writeln!(
            svg,
            "<line x1=\"{:.2}\" y1=\"{axis_y:.1}\" x2=\"{:.2}\" y2=\"{axis_y:.1}\" stroke=\"#333333\" stroke-width=\"1\"/>",
            w.x0,
            w.x1()
        );
        let px = w.x1() - w.x0;
        if w.name == "tail" {
            let _ = writeln!(
                svg,
                "<text x=\"{:.2}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\">+{}</text>",
                w.x0 + px / 2.0,
                axis_y + 18.0,
                fmt_time(w.t1 - w.t0, (w.t1 - w.t0) / 2.0)
            );
            continue;
        }
        let step = tick_step(w.t1 - w.t0, (px / 140.0).clamp(1.0, 10.0));
        let mut tick = (w.t0 / step).ceil() * step;
        while tick <= w.t1 * 1.0001 {
            let tx = w.x(tick);
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
    }
    let _ = writeln!(
        svg,
        "<text x=\"{:.0}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\">time</text>",
        f.left - 30.0,
        axis_y + 18.0
    );
}

/// The colour key.
fn legend(svg: &mut String, f: &Frame) {
    let ly = f.top + f.rows_h() + 4.0 + 40.0 - 4.0;
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
    let mut lx = f.left;
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
}
