//! Benchmark calibration (benchmark mode): measured single-node layer and collective times
//! replace the analytic ones through [`crate::compute::OpTimer`] ("downscale, measure,
//! upscale"). This module holds the interface; the measurement-driven timer is a later issue.

use crate::compute::{AnalyticTimer, LayerShape, Op, OpTimer, Pass, TimerContext};

/// A measured time for one whole decoder-layer pass at the target TP/EP.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerMeasurement {
    pub shape: LayerShape,
    pub pass: Pass,
    /// Seconds per micro-batch.
    pub seconds: f64,
}

/// An op timer that answers whole-layer passes from measurements and falls back to the
/// analytic roofline for everything else (embedding, output layer, unmeasured kinds).
#[derive(Debug, Clone, Default)]
pub struct MeasuredTimer {
    pub layers: Vec<LayerMeasurement>,
    pub fallback: AnalyticTimer,
}

impl OpTimer for MeasuredTimer {
    fn op_seconds(&self, ctx: &TimerContext, op: &Op, pass: Pass) -> f64 {
        self.fallback.op_seconds(ctx, op, pass)
    }

    fn layer_seconds(&self, _ctx: &TimerContext, layer: LayerShape, pass: Pass) -> Option<f64> {
        self.layers
            .iter()
            .find(|m| m.shape == layer && m.pass == pass)
            .map(|m| m.seconds)
    }
}
