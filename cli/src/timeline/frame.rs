//! Where a timeline goes on the page: the windows of the step that are drawn (all of it, or
//! warm-up, a steady-state window and cool-down on one time scale) and the rows of the stages.

use primus_oracle::projection::Timeline;
use primus_oracle::schedule::PassKind;

/// The narrowest a forward pass should be drawn, pixels; below it the step is windowed.
pub const MIN_PASS_PX: f64 = 8.0;
/// Width of a gap between windows, pixels.
const GAP_PX: f64 = 28.0;
/// The least width of the steady-state window, pixels.
const STEADY_PX: f64 = 260.0;
/// Most pixels given to the data-parallel and optimizer tail in a windowed picture.
const TAIL_PX: f64 = 70.0;

/// A span of the step drawn at `x0`, `scale` pixels per second.
#[derive(Debug, Clone, Copy)]
pub(super) struct Window {
    pub(super) t0: f64,
    pub(super) t1: f64,
    pub(super) x0: f64,
    pub(super) scale: f64,
    /// What the window shows, for the caption.
    pub(super) name: &'static str,
}

impl Window {
    pub(super) fn x(&self, t: f64) -> f64 {
        self.x0 + (t - self.t0) * self.scale
    }
    pub(super) fn x1(&self) -> f64 {
        self.x(self.t1)
    }
}

/// Where things go on the page.
pub(super) struct Frame {
    pub(super) left: f64,
    pub(super) top: f64,
    pub(super) row_h: f64,
    pub(super) gap: f64,
    pub(super) width: f64,
    pub(super) height: f64,
    pub(super) pp: usize,
    pub(super) makespan: f64,
    pub(super) total: f64,
    /// The pipeline's windows, in time order, then the tail's (when there is one).
    pub(super) windows: Vec<Window>,
    pub(super) tail: Option<Window>,
}

impl Frame {
    pub(super) fn row_y(&self, r: usize) -> f64 {
        self.top + r as f64 * (self.row_h + self.gap)
    }
    pub(super) fn rows_h(&self) -> f64 {
        self.pp as f64 * (self.row_h + self.gap)
    }
    /// The window that holds all of `[t0, t1]`, if one does.
    pub(super) fn window(&self, t0: f64, t1: f64) -> Option<&Window> {
        const EPS: f64 = 1e-12;
        self.windows
            .iter()
            .find(|w| t0 >= w.t0 - EPS && t1 <= w.t1 + EPS)
    }
    pub(super) fn windowed(&self) -> bool {
        self.windows.len() > 1
    }
}

/// The spans of the pipeline to draw: all of it, or warm-up, a steady-state window and
/// cool-down when passes would otherwise be narrower than [`MIN_PASS_PX`] in `px`.
fn phases(t: &Timeline, px: f64) -> Vec<(f64, f64, &'static str)> {
    let makespan = t.step.pipeline_seconds.max(1e-12);
    let whole = vec![(0.0, makespan, "all")];
    let forward = t
        .events
        .iter()
        .filter(|e| e.kind == PassKind::Forward)
        .map(|e| e.end - e.start)
        .filter(|d| *d > 0.0)
        .fold(f64::INFINITY, f64::min);
    if !forward.is_finite() || forward / makespan * px >= MIN_PASS_PX {
        return whole;
    }
    // Warm-up ends when the last stage to get there starts its first backward pass; the
    // cool-down starts when the first stage to get there ends its last forward pass.
    let mut first_backward = vec![f64::INFINITY; t.pp];
    let mut last_forward = vec![0.0f64; t.pp];
    for e in &t.events {
        let r = (e.rank as usize).min(t.pp - 1);
        match e.kind {
            PassKind::Forward => last_forward[r] = last_forward[r].max(e.end),
            _ => first_backward[r] = first_backward[r].min(e.start),
        }
    }
    let warm = first_backward.iter().copied().fold(0.0f64, f64::max);
    let cool = last_forward.iter().copied().fold(f64::INFINITY, f64::min);
    if !(warm.is_finite() && cool.is_finite() && warm < cool) {
        return whole;
    }
    // The steady window gets what the pixel budget leaves, but at least STEADY_PX on the
    // common scale (a few rounds of forward and backward passes on every stage).
    let avail = px - 2.0 * GAP_PX - TAIL_PX;
    let budget = avail * forward / MIN_PASS_PX;
    let ends = warm + (makespan - cool);
    let min_steady = STEADY_PX * ends / (avail - STEADY_PX).max(1.0);
    let steady = (budget - ends).max(min_steady).min(cool - warm);
    if steady >= cool - warm {
        return whole;
    }
    let mid = (warm + cool) / 2.0;
    vec![
        (0.0, warm, "warm-up"),
        (mid - steady / 2.0, mid + steady / 2.0, "steady state"),
        (cool, makespan, "cool-down"),
    ]
}

impl Frame {
    pub(super) fn new(t: &Timeline, width: u32) -> Frame {
        let (left, right) = (110.0, 30.0);
        let width = width as f64;
        let plot_w = width - left - right;
        let pp = t.pp.max(1);
        let makespan = t.step.pipeline_seconds.max(1e-12);
        let total = t.step.step_time_seconds.max(makespan);
        let phases = phases(t, plot_w);
        let (mut windows, mut tail) = (Vec::new(), None);
        if phases.len() == 1 {
            // One scale for the pipeline and the tail, as before.
            let scale = plot_w / total;
            windows.push(Window {
                t0: 0.0,
                t1: makespan,
                x0: left,
                scale,
                name: "all",
            });
            if total > makespan {
                let x0 = left + makespan * scale;
                tail = Some(Window {
                    t0: makespan,
                    t1: total,
                    x0,
                    scale,
                    name: "tail",
                });
            }
        } else {
            let shown: f64 = phases.iter().map(|(a, b, _)| b - a).sum();
            let tail_span = total - makespan;
            let gaps = GAP_PX * (phases.len() - 1) as f64;
            // The tail at the pipeline's scale when it fits in TAIL_PX, else squeezed into it.
            let guess = (plot_w - gaps) / (shown + tail_span);
            let tail_px = if tail_span > 0.0 {
                (tail_span * guess).min(TAIL_PX)
            } else {
                0.0
            };
            let scale = (plot_w - gaps - tail_px) / shown;
            let mut x0 = left;
            for (t0, t1, name) in phases {
                windows.push(Window {
                    t0,
                    t1,
                    x0,
                    scale,
                    name,
                });
                x0 += (t1 - t0) * scale + GAP_PX;
            }
            x0 -= GAP_PX;
            if tail_span > 0.0 {
                tail = Some(Window {
                    t0: makespan,
                    t1: total,
                    x0,
                    scale: tail_px / tail_span,
                    name: "tail",
                });
            }
        }
        let (top, row_h, gap, axis_h, legend_h) = (100.0, 26.0, 8.0, 40.0, 34.0);
        let height = top + pp as f64 * (row_h + gap) + axis_h + legend_h;
        Frame {
            left,
            top,
            row_h,
            gap,
            width,
            height,
            pp,
            makespan,
            total,
            windows,
            tail,
        }
    }
}
