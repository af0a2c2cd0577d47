//! Prometheus metrics at `/metrics` (text exposition):
//!
//! - `primus_plan_projected_tokens_per_second{namespace,plan}`: projected tokens/s/GPU of the
//!   chosen layout;
//! - `primus_plan_measured_tokens_per_second{namespace,plan}`: measured tokens/s/GPU
//!   (`status.measured` or the plan's Prometheus query);
//! - `primus_plan_drift_ratio{namespace,plan}`: measured / projected - 1;
//! - `primus_plan_drift_tolerance{namespace,plan}`: the plan's `spec.drift.tolerance` (the
//!   drift alert compares |drift| with it);
//! - `primus_plan_stalled{namespace,plan}`: 1 while the plan is `Stalled` (alert on it;
//!   `sum(primus_plan_stalled)` counts stalled plans);
//! - `primus_plan_ready{namespace,plan}`: 1 while the plan is `Ready`;
//! - `primus_reconcile_duration_seconds{result}`: histogram of reconcile passes;
//! - `primus_reconcile_errors_total{reason}`: failed passes by reason;
//! - `primus_benchmark_pods_created_total`, `primus_jobs_created_total`: actions taken;
//! - `primus_operator_leader`: 1 on the replica holding the lease.

use std::collections::BTreeSet;
use std::time::Duration;

use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// The operator's metrics and their registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub projected: GaugeVec,
    pub measured: GaugeVec,
    pub drift: GaugeVec,
    pub drift_tolerance: GaugeVec,
    pub stalled: GaugeVec,
    pub ready: GaugeVec,
    pub reconcile_duration: HistogramVec,
    pub reconcile_errors: IntCounterVec,
    pub benchmark_pods_created: IntCounter,
    pub jobs_created: IntCounter,
    pub leader: IntGauge,
}

const PLAN_LABELS: &[&str] = &["namespace", "plan"];

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let gauge = |name: &str, help: &str| {
            let g = GaugeVec::new(Opts::new(name, help), PLAN_LABELS).expect("valid metric");
            registry
                .register(Box::new(g.clone()))
                .expect("unique metric");
            g
        };
        let projected = gauge(
            "primus_plan_projected_tokens_per_second",
            "Projected training throughput of the plan's chosen layout, tokens per second per GPU.",
        );
        let measured = gauge(
            "primus_plan_measured_tokens_per_second",
            "Measured training throughput of the plan's job, tokens per second per GPU.",
        );
        let drift = gauge(
            "primus_plan_drift_ratio",
            "Measured over projected throughput minus one.",
        );
        let drift_tolerance = gauge(
            "primus_plan_drift_tolerance",
            "Allowed absolute drift ratio of the plan (spec.drift.tolerance, default 0.10).",
        );
        let stalled = gauge(
            "primus_plan_stalled",
            "1 while the plan is Stalled (invalid spec, no feasible layout, failed benchmark, missing PyTorchJob CRD).",
        );
        let ready = gauge("primus_plan_ready", "1 while the plan is Ready.");
        let reconcile_duration = HistogramVec::new(
            HistogramOpts::new(
                "primus_reconcile_duration_seconds",
                "Duration of reconcile passes.",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]),
            &["result"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(reconcile_duration.clone()))
            .expect("unique metric");
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "primus_reconcile_errors_total",
                "Reconcile passes that failed, by reason.",
            ),
            &["reason"],
        )
        .expect("valid metric");
        registry
            .register(Box::new(reconcile_errors.clone()))
            .expect("unique metric");
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let benchmark_pods_created = counter(
            "primus_benchmark_pods_created_total",
            "Benchmark pods created.",
        );
        let jobs_created = counter("primus_jobs_created_total", "PyTorchJobs created.");
        let leader = IntGauge::new(
            "primus_operator_leader",
            "1 on the replica that holds the leader lease.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(leader.clone()))
            .expect("unique metric");
        Metrics {
            registry,
            projected,
            measured,
            drift,
            drift_tolerance,
            stalled,
            ready,
            reconcile_duration,
            reconcile_errors,
            benchmark_pods_created,
            jobs_created,
            leader,
        }
    }

    /// Record one reconcile pass.
    pub fn observe(&self, elapsed: Duration, error_reason: Option<&str>) {
        let result = if error_reason.is_some() {
            "error"
        } else {
            "ok"
        };
        self.reconcile_duration
            .with_label_values(&[result])
            .observe(elapsed.as_secs_f64());
        if let Some(reason) = error_reason {
            self.reconcile_errors.with_label_values(&[reason]).inc();
        }
    }

    /// Set or clear a per-plan gauge.
    pub fn set_plan(g: &GaugeVec, namespace: &str, plan: &str, value: Option<f64>) {
        match value {
            Some(v) => g.with_label_values(&[namespace, plan]).set(v),
            None => {
                let _ = g.remove_label_values(&[namespace, plan]);
            }
        }
    }

    fn plan_gauges(&self) -> [&GaugeVec; 6] {
        [
            &self.projected,
            &self.measured,
            &self.drift,
            &self.drift_tolerance,
            &self.stalled,
            &self.ready,
        ]
    }

    /// Drop every series of a deleted plan.
    pub fn forget_plan(&self, namespace: &str, plan: &str) {
        for g in self.plan_gauges() {
            let _ = g.remove_label_values(&[namespace, plan]);
        }
    }

    /// The (namespace, plan) of every per-plan series.
    pub fn plans(&self) -> BTreeSet<(String, String)> {
        let mut out = BTreeSet::new();
        for family in self.plan_gauges().iter().flat_map(|g| g.collect()) {
            for m in family.get_metric() {
                let label = |k: &str| {
                    m.get_label()
                        .iter()
                        .find(|l| l.name() == k)
                        .map(|l| l.value().to_string())
                        .unwrap_or_default()
                };
                out.insert((label("namespace"), label("plan")));
            }
        }
        out
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            return format!("# encoding failed: {e}\n");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_series_appear_and_disappear() {
        let m = Metrics::new();
        Metrics::set_plan(&m.drift, "ns", "p", Some(-0.05));
        Metrics::set_plan(&m.drift_tolerance, "ns", "p", Some(0.1));
        Metrics::set_plan(&m.projected, "ns", "p", Some(4000.0));
        m.observe(Duration::from_millis(20), None);
        m.observe(Duration::from_millis(20), Some("timeout"));
        let text = m.render();
        assert!(
            text.contains(r#"primus_plan_drift_ratio{namespace="ns",plan="p"} -0.05"#),
            "{text}"
        );
        assert!(
            text.contains(r#"primus_plan_drift_tolerance{namespace="ns",plan="p"} 0.1"#),
            "{text}"
        );
        assert!(text.contains(r#"primus_reconcile_errors_total{reason="timeout"} 1"#));
        assert!(text.contains("primus_reconcile_duration_seconds_bucket"));
        Metrics::set_plan(&m.stalled, "ns", "q", Some(1.0));
        let both: Vec<_> = m.plans().into_iter().collect();
        assert_eq!(
            both,
            [
                ("ns".to_string(), "p".to_string()),
                ("ns".into(), "q".into())
            ]
        );
        m.forget_plan("ns", "p");
        assert!(!m.render().contains(r#"plan="p""#));
        assert_eq!(m.plans().len(), 1);
    }
}
