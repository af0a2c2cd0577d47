//! What every reconcile pass shares: the client, the operator's configuration, the metrics,
//! the profile catalog, the Event recorder, and a little state (backoff per plan, whether the
//! PyTorchJob CRD is installed).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::runtime::events::{Recorder, Reporter};
use primus_crds::JobKind;
use primus_oracle::profiles::Catalog;
use primus_oracle::report::Backend;

use crate::metrics::Metrics;

/// The operator's configuration (its command-line flags, DESIGN.md section 5).
#[derive(Debug, Clone)]
pub struct Config {
    /// Image of benchmark pods when the plan gives none (must contain `primus`).
    pub bench_image: String,
    /// Service account of benchmark pods (it needs `get` on trainingplans and `create`/`patch`
    /// on benchmarkreports in the plan's namespace); the namespace default when `None`.
    pub bench_service_account: Option<String>,
    /// Backend when the plan gives none; `None` picks the GPU vendor's.
    pub bench_backend: Option<Backend>,
    /// How long a successful plan waits before it is looked at again (drift from
    /// `status.measured` arrives through the watch anyway).
    pub resync: Duration,
    /// How often a plan with a Prometheus drift source re-queries it.
    pub drift_interval: Duration,
    /// Extra grace after `timeoutSeconds` before a benchmark pod that never finished (no
    /// kubelet honoured `activeDeadlineSeconds`) counts as failed.
    pub bench_grace: Duration,
    /// Where `spec.drift.prometheus.url` may point (`--drift-url-allow`); empty: nowhere, the
    /// plans' Prometheus queries are refused.
    pub drift_urls: Vec<crate::drift::UrlRule>,
    /// Images a plan's `spec.benchmark.image` may name (`--bench-image-allow`), besides
    /// `bench_image`: exact, or a prefix ending in `*`.
    pub bench_images: Vec<String>,
    /// The key benchmark tokens derive from (loaded from its Secret at start-up).
    pub report_key: crate::report_key::ReportKey,
    /// The cluster's LLM endpoint for searcher `agent` (`--agent-endpoint`, model and key from
    /// the operator's Secret); `None`: agent plans fall back to the exhaustive search.
    pub agent: Option<crate::choose::AgentEndpoint>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            bench_image: format!(
                "ghcr.io/primus-projection/primus:{}",
                env!("CARGO_PKG_VERSION")
            ),
            bench_service_account: None,
            bench_backend: None,
            resync: Duration::from_secs(600),
            drift_interval: Duration::from_secs(60),
            bench_grace: Duration::from_secs(30),
            drift_urls: Vec::new(),
            bench_images: Vec::new(),
            report_key: crate::report_key::ReportKey::random(),
            agent: None,
        }
    }
}

/// Shared state of the controller.
pub struct Context {
    pub client: kube::Client,
    pub config: Config,
    pub metrics: Metrics,
    pub catalog: Catalog,
    pub recorder: Recorder,
    pub http: reqwest::Client,
    /// Consecutive failures per plan (`namespace/name`), for the error backoff.
    failures: Mutex<HashMap<String, u32>>,
    /// Whether the PyTorchJob CRD was found, and when that was checked.
    /// Per job kind (PyTorchJob, TrainJob): whether its CRD is served, and when asked.
    job_crd: Mutex<[Option<(bool, Instant)>; 2]>,
    /// Reconcile passes running now (shutdown waits for them, and only for them).
    in_flight: AtomicUsize,
}

/// Counts a pass as in flight while it lives.
pub struct InFlight<'a>(&'a AtomicUsize);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long a PyTorchJob CRD lookup is trusted.
pub const CRD_CHECK_TTL: Duration = Duration::from_secs(30);

impl Context {
    pub fn new(
        client: kube::Client,
        config: Config,
        metrics: Metrics,
        catalog: Catalog,
        instance: Option<String>,
    ) -> Context {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: crate::CONTROLLER.into(),
                instance,
            },
        );
        let http = crate::drift::client();
        Context {
            client,
            config,
            metrics,
            catalog,
            recorder,
            http,
            failures: Mutex::new(HashMap::new()),
            job_crd: Mutex::new([None, None]),
            in_flight: AtomicUsize::new(0),
        }
    }

    /// Mark a pass as running until the guard drops.
    pub fn enter(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(&self.in_flight)
    }

    /// Passes running now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Count a failure of `key`; the backoff to wait before the next attempt (1 s doubling
    /// to 5 min).
    pub fn failed(&self, key: &str) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        let secs = 1u64 << (*n - 1).min(9);
        Duration::from_secs(secs.min(300))
    }

    /// Forget the failures of `key` after a successful pass.
    pub fn succeeded(&self, key: &str) {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.remove(key);
    }

    /// Drop the per-plan state (metric series, backoff) of every plan not in `live`
    /// (`namespace/name` keys): plans deleted, whether or not a pass saw them go. Returns the
    /// plans forgotten.
    pub fn forget_all_but(&self, live: &std::collections::HashSet<String>) -> Vec<String> {
        let mut gone = Vec::new();
        for (ns, plan) in self.metrics.plans() {
            let key = format!("{ns}/{plan}");
            if !live.contains(&key) {
                self.metrics.forget_plan(&ns, &plan);
                gone.push(key);
            }
        }
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.retain(|k, _| {
            let keep = live.contains(k);
            if !keep && !gone.contains(k) {
                gone.push(k.clone());
            }
            keep
        });
        gone
    }

    /// Plans with a failure count (for tests and the sweep's log).
    pub fn backoff_keys(&self) -> Vec<String> {
        let f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        f.keys().cloned().collect()
    }

    /// The cached answer to "is the job kind's CRD installed", when fresh. Only a positive
    /// answer is trusted for a while; a missing CRD is looked up again on every pass.
    pub fn job_crd_cached(&self, kind: JobKind) -> Option<bool> {
        let c = self.job_crd.lock().unwrap_or_else(|p| p.into_inner());
        c[kind_slot(kind)]
            .filter(|(present, at)| *present && at.elapsed() < CRD_CHECK_TTL)
            .map(|(present, _)| present)
    }

    /// Drop the cached answer (the next lookup asks discovery).
    pub fn forget_job_crd(&self, kind: JobKind) {
        let mut c = self.job_crd.lock().unwrap_or_else(|p| p.into_inner());
        c[kind_slot(kind)] = None;
    }

    pub fn set_job_crd(&self, kind: JobKind, present: bool) {
        let mut c = self.job_crd.lock().unwrap_or_else(|p| p.into_inner());
        c[kind_slot(kind)] = Some((present, Instant::now()));
    }
}

fn kind_slot(kind: JobKind) -> usize {
    match kind {
        JobKind::PyTorchJob => 0,
        JobKind::TrainJob => 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_state_of_plans_that_are_gone_is_forgotten() {
        crate::install_crypto_provider();
        let config = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
        let client = kube::Client::try_from(config).unwrap();
        let ctx = Context::new(
            client,
            Config::default(),
            Metrics::new(),
            Catalog::builtin().unwrap(),
            None,
        );
        ctx.failed("ns/stalled");
        ctx.failed("ns/kept");
        Metrics::set_plan(&ctx.metrics.stalled, "ns", "stalled", Some(1.0));
        Metrics::set_plan(&ctx.metrics.ready, "ns", "kept", Some(1.0));
        Metrics::set_plan(&ctx.metrics.ready, "ns", "metrics-only", Some(0.0));
        let live = std::collections::HashSet::from(["ns/kept".to_string()]);
        let mut gone = ctx.forget_all_but(&live);
        gone.sort();
        assert_eq!(gone, ["ns/metrics-only", "ns/stalled"]);
        assert_eq!(ctx.backoff_keys(), ["ns/kept"]);
        let text = ctx.metrics.render();
        assert!(!text.contains(r#"plan="stalled""#), "{text}");
        assert!(text.contains(r#"plan="kept""#), "{text}");
        // Nothing left to forget the second time.
        assert!(ctx.forget_all_but(&live).is_empty());
    }
}
