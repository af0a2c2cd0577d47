//! Prometheus metrics of the webhook (text exposition on `/metrics`).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// The webhook's metrics, registered in their own registry.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    /// Admission decisions by kind, decision (`allow`, `warn`, `deny`, `error`) and reason.
    pub admissions: IntCounterVec,
    /// Time from the request's arrival to its answer, by kind.
    pub latency: HistogramVec,
    /// Serving certificate reloads (from the files or the shared Secret), by result (`ok`, `error`).
    pub cert_reloads: IntCounterVec,
    /// Writes of the shared certificate Secret by this replica, by step (self-signed mode).
    pub cert_rotations: IntCounterVec,
    /// Expiry (Unix seconds) of the certificate served (`serving`) and of the CA that signed
    /// it (`ca`, self-signed mode).
    pub cert_expiry: IntGaugeVec,
    /// TLS handshakes that failed or timed out.
    pub tls_errors: IntCounter,
    /// Connections being served.
    pub connections: IntGauge,
    /// 1 when the webhook is ready to serve admissions.
    pub ready: IntGauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Latency buckets from 50 us to 5 s (the API server's webhook timeout is at most 30 s, the
/// chart sets 5 s).
const LATENCY_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
];

impl Metrics {
    pub fn new() -> Result<Metrics, prometheus::Error> {
        let registry = Registry::new();
        let admissions = IntCounterVec::new(
            Opts::new(
                "primus_webhook_admissions_total",
                "Admission decisions by kind, decision (allow, warn, deny, error) and reason",
            ),
            &["kind", "decision", "reason"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "primus_webhook_admission_duration_seconds",
                "Time to answer one admission review, from the request to the response",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
            &["kind"],
        )?;
        let cert_reloads = IntCounterVec::new(
            Opts::new(
                "primus_webhook_certificate_reloads_total",
                "Serving certificate reloads (from the files or the shared Secret), by result",
            ),
            &["result"],
        )?;
        let cert_rotations = IntCounterVec::new(
            Opts::new(
                "primus_webhook_certificate_rotations_total",
                "Writes of the shared certificate Secret by this replica, by step (create, restore, renew-serving, stage-ca, promote-ca, retire-ca)",
            ),
            &["step"],
        )?;
        let cert_expiry = IntGaugeVec::new(
            Opts::new(
                "primus_webhook_certificate_expiry_timestamp_seconds",
                "Expiry of the serving certificate (certificate=serving) and of its CA (certificate=ca), Unix seconds",
            ),
            &["certificate"],
        )?;
        let tls_errors = IntCounter::new(
            "primus_webhook_tls_handshake_errors_total",
            "TLS handshakes that failed or timed out",
        )?;
        let connections = IntGauge::new("primus_webhook_connections", "Connections being served")?;
        let ready = IntGauge::new(
            "primus_webhook_ready",
            "1 when the webhook is ready to serve admission reviews",
        )?;
        registry.register(Box::new(admissions.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(cert_reloads.clone()))?;
        registry.register(Box::new(cert_rotations.clone()))?;
        registry.register(Box::new(cert_expiry.clone()))?;
        registry.register(Box::new(tls_errors.clone()))?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(ready.clone()))?;
        Ok(Metrics {
            registry,
            admissions,
            latency,
            cert_reloads,
            cert_rotations,
            cert_expiry,
            tls_errors,
            connections,
            ready,
        })
    }

    /// Count one answered review.
    pub fn observe(&self, kind: &str, decision: &str, reason: &str, seconds: f64) {
        self.admissions
            .with_label_values(&[kind, decision, reason])
            .inc();
        self.latency.with_label_values(&[kind]).observe(seconds);
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            out = format!("# error encoding metrics: {e}\n");
        }
        out
    }

    /// The content type of [`Metrics::render`].
    pub fn content_type() -> String {
        TextEncoder::new().format_type().to_string()
    }
}
