//! Benchmark pods and reports. A plan with `spec.benchmark.enabled` gets one pod at a time on
//! a node of its GPU kind running `primus bench --plan NS/NAME --backend B --report-to
//! NS/REPORT`; the program posts a BenchmarkReport owned by the plan. A failed or timed-out pod
//! is retried up to `maxAttempts` times; a matching recent report (same GPU product, backend
//! and layer shapes; from any plan in the namespace) is reused instead of benchmarking again.
//!
//! Names are deterministic, so a restarted operator finds what it started: the report is
//! `<plan>-bench-<hash of the shapes key>` and attempt n's pod is `<report>-<n>`. Attempts
//! are counted from the pods (failed pods are kept, for their logs and the count).
//!
//! One step is [`observe`] (list the reports and the plan's pods) -> [`decide`] (pure: the
//! outcome, and at most one pod to delete and one to create) -> [`apply`].

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use primus_crds::{BenchmarkSpec, BenchmarkStatus};
use primus_oracle::plan::Plan;
use primus_oracle::report::{Backend, BenchmarkResults};

use crate::choose::{
    DEFAULT_BENCH_MAX_ATTEMPTS, DEFAULT_BENCH_TIMEOUT_SECONDS, DEFAULT_REUSE_WITHIN_HOURS,
};
use crate::context::Config;

mod apply;
mod decide;
mod observe;
mod pod;
mod trust;

pub use apply::apply;
pub use decide::{Action, Decision, decide};
pub use observe::{Observed, decode_reports, observe};
pub use pod::{pod, token_secret};
pub use trust::distrust;

/// Label on benchmark pods (and the PyTorchJob's kind of objects): the plan.
pub use primus_crds::annotations::PLAN_LABEL;
/// Label selecting benchmark pods.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
pub const COMPONENT: &str = "benchmark";
/// Label on benchmark pods: which shapes key (hash) they measure.
pub const KEY_LABEL: &str = "primus.dev/benchmark-key";
/// Name of the benchmark container.
pub const CONTAINER: &str = "bench";

/// `spec.benchmark` with defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub image: String,
    pub backend: Backend,
    pub timeout: Duration,
    pub max_attempts: u32,
    pub reuse_within: Option<Duration>,
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    pub security_context: Option<k8s_openapi::api::core::v1::PodSecurityContext>,
}

impl Settings {
    pub fn of(b: &BenchmarkSpec, backend: Backend, config: &Config) -> Settings {
        let hours = b.reuse_within_hours.unwrap_or(DEFAULT_REUSE_WITHIN_HOURS);
        Settings {
            image: b
                .image
                .clone()
                .unwrap_or_else(|| config.bench_image.clone()),
            backend,
            timeout: Duration::from_secs(
                b.timeout_seconds
                    .unwrap_or(DEFAULT_BENCH_TIMEOUT_SECONDS)
                    .into(),
            ),
            max_attempts: b.max_attempts.unwrap_or(DEFAULT_BENCH_MAX_ATTEMPTS),
            reuse_within: (hours > 0).then(|| Duration::from_secs(u64::from(hours) * 3600)),
            tolerations: b.tolerations.clone().unwrap_or_default(),
            security_context: b.security_context.clone(),
        }
    }
}

/// Where a plan's benchmark stands.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A report is there (this plan's, or a reused one).
    Done {
        report: String,
        results: Box<BenchmarkResults>,
        reused: bool,
        attempts: u32,
    },
    /// A pod is running (or was just created); look again after `requeue`.
    Waiting {
        /// The report the pod writes.
        report: String,
        attempts: u32,
        message: String,
        requeue: Duration,
        created: Option<String>,
    },
    /// Every attempt failed.
    Failed {
        report: String,
        attempts: u32,
        message: String,
    },
}

/// The images plans may name: the operator's default and its allow-list.
pub fn allowed_images(config: &Config) -> Vec<String> {
    std::iter::once(config.bench_image.clone())
        .chain(config.bench_images.iter().cloned())
        .collect()
}

/// Whether `image` is allowed: the operator's default, an entry of its allow-list, or under a
/// prefix entry ending in `*`.
pub fn image_allowed(image: &str, config: &Config) -> bool {
    allowed_images(config)
        .iter()
        .any(|a| match a.strip_suffix('*') {
            Some(prefix) => image.starts_with(prefix),
            None => image == a,
        })
}

/// Lowercase name of a backend.
pub fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Rocm => "rocm",
        Backend::Cuda => "cuda",
        Backend::Simulate => "simulate",
    }
}

/// Name of attempt `attempt`'s pod.
pub fn pod_name(report: &str, attempt: u32) -> String {
    format!("{report}-{attempt}")
}

/// The attempt number of a benchmark pod of `report`.
pub(crate) fn attempt_of(report: &str, pod_name: &str) -> Option<u32> {
    pod_name
        .strip_prefix(report)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

pub(crate) fn age(meta: &ObjectMeta, now: Timestamp) -> Duration {
    meta.creation_timestamp
        .as_ref()
        .and_then(|t| now.duration_since(t.0).try_into().ok())
        .unwrap_or_default()
}

/// Whether a report matches what the plan needs: same shapes key, GPU and backend. The GPU
/// matches by hardware profile (`gpu`, which the benchmark took from the plan) or by product:
/// a GPU backend records the driver's device name (`NVIDIA H200`), which need not spell the
/// profile's product (`NVIDIA H200 (SXM)`).
pub fn matches(results: &BenchmarkResults, plan: &Plan, key: &str, backend: Backend) -> bool {
    let hw = &plan.scenario.hardware;
    results.shapes_key == key
        && (results.gpu == hw.name || results.gpu_product == hw.product)
        && results.backend == backend
}

/// The BenchmarkStatus the plan's status records for an outcome.
pub fn status_of(o: &Outcome) -> BenchmarkStatus {
    match o {
        Outcome::Done {
            report,
            results,
            reused,
            attempts,
        } => BenchmarkStatus {
            report: Some(report.clone()),
            node: Some(results.node.clone()),
            gpu_product: Some(results.gpu_product.clone()),
            driver_version: Some(results.driver_version.clone()),
            finished_at: Some(results.finished_at.clone()),
            simulated: results.backend == Backend::Simulate,
            reused: *reused,
            attempts: *attempts,
        },
        Outcome::Waiting {
            report, attempts, ..
        }
        | Outcome::Failed {
            report, attempts, ..
        } => BenchmarkStatus {
            report: Some(report.clone()),
            attempts: *attempts,
            ..BenchmarkStatus::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::bench_plan as plan_obj;
    use primus_oracle::bench;

    #[test]
    fn images_are_allowed_by_name_or_prefix() {
        let config = Config {
            bench_image: "ghcr.io/p/primus:1".into(),
            bench_images: vec![
                "registry.example.com/ml/primus:*".into(),
                "lab/primus:2".into(),
            ],
            ..Config::default()
        };
        assert!(image_allowed("ghcr.io/p/primus:1", &config));
        assert!(image_allowed(
            "registry.example.com/ml/primus:rocm-6.2",
            &config
        ));
        assert!(image_allowed("lab/primus:2", &config));
        assert!(!image_allowed("lab/primus:3", &config));
        assert!(!image_allowed("registry.example.com/ml/other:1", &config));
        assert!(!image_allowed("ghcr.io/p/primus:1-evil", &config));
    }

    #[test]
    fn reports_match_on_shapes_product_and_backend() {
        let (_, plan) = plan_obj();
        let r = primus_oracle::bench::simulate::simulate(&plan, Default::default());
        let key = bench::shapes_key(&plan);
        assert!(matches(&r, &plan, &key, Backend::Simulate));
        assert!(!matches(&r, &plan, &key, Backend::Cuda));
        assert!(!matches(&r, &plan, "other", Backend::Simulate));
        let mut other = r.clone();
        other.gpu = "mi300x".into();
        other.gpu_product = "AMD Instinct MI300X".into();
        assert!(!matches(&other, &plan, &key, Backend::Simulate));
        // A GPU backend names the product as the driver does.
        let mut measured = r.clone();
        measured.gpu_product = "driver's own name".into();
        assert!(matches(&measured, &plan, &key, Backend::Simulate));
    }
}
