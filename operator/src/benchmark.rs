//! Benchmark pods and reports. A plan with `spec.benchmark.enabled` gets one pod at a time on
//! a node of its GPU kind running `primus bench --plan NS/NAME --backend B --report-to
//! NS/REPORT`; the program posts a BenchmarkReport owned by the plan. A failed or timed-out pod
//! is retried up to `maxAttempts` times; a matching recent report (same GPU product, backend
//! and layer shapes; from any plan in the namespace) is reused instead of benchmarking again.
//!
//! Names are deterministic, so a restarted operator finds what it started: the report is
//! `<plan>-bench-<hash of the shapes key>` and attempt n's pod is `<report>-<n>`. Attempts
//! are counted from the pods (failed pods are kept, for their logs and the count).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, PostParams};
use primus_crds::{BenchmarkReport, BenchmarkSpec, BenchmarkStatus, TrainingPlan};
use primus_oracle::bench;
use primus_oracle::plan::Plan;
use primus_oracle::report::{Backend, BenchmarkResults};

use crate::choose::{
    DEFAULT_BENCH_MAX_ATTEMPTS, DEFAULT_BENCH_TIMEOUT_SECONDS, DEFAULT_REUSE_WITHIN_HOURS,
};
use crate::context::Config;
use crate::error::{Error, is_conflict};
use crate::kubeapi::{call, controlled_by, owner_reference, plan_label_value};

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

/// Lowercase name of a backend.
pub fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Rocm => "rocm",
        Backend::Cuda => "cuda",
        Backend::Simulate => "simulate",
    }
}

/// The benchmark pod of attempt `attempt` (pure; unit-tested).
pub fn pod(
    plan_obj: &TrainingPlan,
    plan: &Plan,
    settings: &Settings,
    report: &str,
    attempt: u32,
    config: &Config,
) -> Result<Pod, Error> {
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let name = plan_obj.metadata.name.clone().unwrap_or_default();
    let hw = &plan.scenario.hardware;
    let gpus = bench::measured(plan).gpus;
    let key_hash = report.rsplit('-').next().unwrap_or_default().to_string();
    let labels = BTreeMap::from([
        (PLAN_LABEL.to_string(), plan_label_value(&name)),
        (COMPONENT_LABEL.to_string(), COMPONENT.to_string()),
        ("app.kubernetes.io/name".to_string(), "primus".to_string()),
        (
            primus_crds::annotations::MANAGED_BY.to_string(),
            crate::CONTROLLER.to_string(),
        ),
        (KEY_LABEL.to_string(), key_hash),
    ]);
    let gpu = Quantity(gpus.to_string());
    let resources = BTreeMap::from([(hw.kubernetes.resource.clone(), gpu)]);
    let node_selector = hw
        .kubernetes
        .product_values
        .first()
        .map(|v| BTreeMap::from([(hw.kubernetes.product_label.clone(), v.clone())]));
    let command = vec![
        "primus".to_string(),
        "bench".to_string(),
        "--plan".to_string(),
        format!("{ns}/{name}"),
        "--backend".to_string(),
        backend_name(settings.backend).to_string(),
        "--report-to".to_string(),
        format!("{ns}/{report}"),
    ];
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(report, attempt)),
            namespace: Some(ns),
            labels: Some(labels),
            owner_references: Some(vec![owner_reference(plan_obj)?]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            active_deadline_seconds: Some(settings.timeout.as_secs() as i64),
            node_selector,
            tolerations: (!settings.tolerations.is_empty()).then(|| settings.tolerations.clone()),
            service_account_name: config.bench_service_account.clone(),
            security_context: settings.security_context.clone(),
            containers: vec![Container {
                name: CONTAINER.into(),
                image: Some(settings.image.clone()),
                command: Some(command),
                env: Some(vec![EnvVar {
                    name: "NODE_NAME".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "spec.nodeName".into(),
                            ..ObjectFieldSelector::default()
                        }),
                        ..EnvVarSource::default()
                    }),
                    ..EnvVar::default()
                }]),
                resources: Some(ResourceRequirements {
                    limits: Some(resources.clone()),
                    requests: Some(resources),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    })
}

/// Name of attempt `attempt`'s pod.
pub fn pod_name(report: &str, attempt: u32) -> String {
    format!("{report}-{attempt}")
}

/// The attempt number of a benchmark pod of `report`.
fn attempt_of(report: &str, pod_name: &str) -> Option<u32> {
    pod_name
        .strip_prefix(report)?
        .strip_prefix('-')?
        .parse()
        .ok()
}

fn age(meta: &ObjectMeta, now: Timestamp) -> Duration {
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

/// How a pod ended (or why it is considered failed), in words.
fn pod_failure(p: &Pod) -> String {
    let name = p.metadata.name.clone().unwrap_or_default();
    let status = p.status.as_ref();
    let terminated = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == CONTAINER))
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    let mut m = format!("pod {name}");
    if let Some(t) = terminated {
        m.push_str(&format!(" exited with code {}", t.exit_code));
        if let Some(r) = &t.reason {
            m.push_str(&format!(" ({r})"));
        }
        if let Some(msg) = t.message.as_ref().filter(|s| !s.is_empty()) {
            m.push_str(&format!(": {}", msg.lines().last().unwrap_or_default()));
        }
    } else if let Some(r) = status.and_then(|s| s.reason.as_ref()) {
        m.push_str(&format!(" failed ({r})"));
    } else {
        m.push_str(" failed");
    }
    m
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

/// Find or run the plan's benchmark (one step: creates at most one pod). `previous` is the
/// plan's recorded benchmark status: the attempts it counted for the same report survive pods
/// that were deleted (timed out, or removed by hand).
pub async fn ensure(
    client: &kube::Client,
    config: &Config,
    plan_obj: &TrainingPlan,
    plan: &Plan,
    settings: &Settings,
    previous: Option<&BenchmarkStatus>,
) -> Result<Outcome, Error> {
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let name = plan_obj.metadata.name.clone().unwrap_or_default();
    let uid = plan_obj.metadata.uid.clone().unwrap_or_default();
    let key = bench::shapes_key(plan);
    let report_name = bench::report_name(&name, &key);
    let now = Timestamp::now();

    // 1. A report: this plan's own first, else a recent matching one.
    let reports: Api<BenchmarkReport> = Api::namespaced(client.clone(), &ns);
    let list = call(
        format!("list benchmarkreports in {ns}"),
        reports.list(&ListParams::default()),
    )
    .await?;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let selector = format!(
        "{PLAN_LABEL}={},{COMPONENT_LABEL}={COMPONENT}",
        plan_label_value(&name)
    );
    let mut pods: Vec<Pod> = call(
        format!("list benchmark pods of {ns}/{name}"),
        pods_api.list(&ListParams::default().labels(&selector)),
    )
    .await?
    .items
    .into_iter()
    .filter(|p| controlled_by(p.metadata.owner_references.as_ref(), &uid))
    .filter(|p| attempt_of(&report_name, p.metadata.name.as_deref().unwrap_or_default()).is_some())
    .collect();
    pods.sort_by_key(|p| attempt_of(&report_name, p.metadata.name.as_deref().unwrap_or_default()));
    let attempts = pods
        .iter()
        .filter_map(|p| attempt_of(&report_name, p.metadata.name.as_deref().unwrap_or_default()))
        .max()
        .unwrap_or(0)
        .max(
            previous
                .filter(|b| !b.reused && b.report.as_deref() == Some(report_name.as_str()))
                .map(|b| b.attempts)
                .unwrap_or(0),
        );

    let own = list
        .items
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(report_name.as_str()))
        .filter(|r| matches(&r.spec.results, plan, &key, settings.backend));
    if let Some(r) = own {
        return Ok(Outcome::Done {
            report: report_name,
            results: Box::new(r.spec.results.clone()),
            reused: false,
            attempts,
        });
    }
    if let Some(window) = settings.reuse_within {
        let mut candidates: Vec<&BenchmarkReport> = list
            .items
            .iter()
            .filter(|r| matches(&r.spec.results, plan, &key, settings.backend))
            .filter(|r| {
                let when = r
                    .spec
                    .results
                    .finished_at
                    .parse::<Timestamp>()
                    .ok()
                    .or_else(|| r.metadata.creation_timestamp.as_ref().map(|t| t.0));
                when.and_then(|t| Duration::try_from(now.duration_since(t)).ok())
                    .is_some_and(|a| a <= window)
            })
            .collect();
        // The newest first; ties by name, so the choice is stable.
        candidates.sort_by(|a, b| {
            b.spec
                .results
                .finished_at
                .cmp(&a.spec.results.finished_at)
                .then_with(|| a.metadata.name.cmp(&b.metadata.name))
        });
        if let Some(r) = candidates.first() {
            return Ok(Outcome::Done {
                report: r.metadata.name.clone().unwrap_or_default(),
                results: Box::new(r.spec.results.clone()),
                reused: true,
                attempts,
            });
        }
    }

    // 2. The latest pod.
    let mut failures = Vec::new();
    if let Some(last) = pods.last() {
        let pod_name = last.metadata.name.clone().unwrap_or_default();
        let phase = last
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into());
        match phase.as_str() {
            "Succeeded" => {
                // The report is written before the program exits; look once more by name in
                // case the list above was older than the pod's status.
                let again = call(
                    format!("get benchmarkreport {ns}/{report_name}"),
                    reports.get_opt(&report_name),
                )
                .await?;
                if let Some(r) =
                    again.filter(|r| matches(&r.spec.results, plan, &key, settings.backend))
                {
                    return Ok(Outcome::Done {
                        report: report_name,
                        results: Box::new(r.spec.results.clone()),
                        reused: false,
                        attempts,
                    });
                }
                failures.push(format!(
                    "pod {pod_name} succeeded but posted no matching BenchmarkReport {report_name}"
                ));
            }
            "Failed" => failures.push(pod_failure(last)),
            _ => {
                let a = age(&last.metadata, now);
                let limit = settings.timeout + config.bench_grace;
                if a < limit {
                    return Ok(Outcome::Waiting {
                        report: report_name,
                        attempts,
                        message: format!(
                            "benchmark pod {pod_name} (attempt {attempts} of {}) is {}; waiting up to {}s for its report",
                            settings.max_attempts,
                            phase.to_lowercase(),
                            settings.timeout.as_secs()
                        ),
                        requeue: (limit - a).min(Duration::from_secs(30)),
                        created: None,
                    });
                }
                // Nobody enforced activeDeadlineSeconds (a pod no node took stays Pending
                // forever). When another attempt follows, stop it (the status keeps the count
                // and the next pod gets the next number); the last one stays, so the verdict
                // keeps naming it, and a node that takes it late still delivers the report.
                if attempts < settings.max_attempts {
                    let _ = call(
                        format!("delete timed-out pod {ns}/{pod_name}"),
                        pods_api.delete(&pod_name, &Default::default()),
                    )
                    .await;
                }
                failures.push(format!(
                    "pod {pod_name} gave no report within {}s",
                    settings.timeout.as_secs()
                ));
            }
        }
    }

    // 3. Retry or give up.
    if attempts >= settings.max_attempts {
        let last = failures.pop().unwrap_or_else(|| "no report".into());
        return Ok(Outcome::Failed {
            report: report_name,
            attempts,
            message: format!(
                "the benchmark failed {attempts} of {} attempts; last: {last}. Fix the cause, then raise spec.benchmark.maxAttempts (or change the layer shapes) to retry",
                settings.max_attempts
            ),
        });
    }
    let next = attempts + 1;
    let p = pod(plan_obj, plan, settings, &report_name, next, config)?;
    let pod_name = p.metadata.name.clone().unwrap_or_default();
    match tokio::time::timeout(
        crate::kubeapi::CALL_TIMEOUT,
        pods_api.create(
            &PostParams {
                field_manager: Some(crate::CONTROLLER.into()),
                ..PostParams::default()
            },
            &p,
        ),
    )
    .await
    {
        Ok(Ok(_)) => {}
        // Created by an earlier pass (or another replica before a failover): same pod.
        Ok(Err(e)) if is_conflict(&e) => {}
        Ok(Err(e)) => return Err(Error::kube(format!("create pod {ns}/{pod_name}"), e)),
        Err(_) => {
            return Err(Error::Timeout {
                what: format!("create pod {ns}/{pod_name}"),
                after: crate::kubeapi::CALL_TIMEOUT,
            });
        }
    }
    let mut message = format!(
        "benchmark pod {pod_name} started (attempt {next} of {}, backend {})",
        settings.max_attempts,
        backend_name(settings.backend)
    );
    if let Some(f) = failures.pop() {
        message.push_str(&format!("; previous attempt: {f}"));
    }
    Ok(Outcome::Waiting {
        report: report_name,
        attempts: next,
        message,
        requeue: settings.timeout.min(Duration::from_secs(30)),
        created: Some(pod_name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use primus_crds::TrainingPlanSpec;
    use primus_oracle::profiles::Catalog;

    fn plan_obj() -> (TrainingPlan, Plan) {
        let spec: TrainingPlanSpec = serde_json::from_value(serde_json::json!({
            "model": {"preset": "llama3.1-8b"},
            "cluster": {"gpu": "h100-sxm", "gpus": 16},
            "training": {"seqLength": 4096, "globalBatchSize": 64},
            "benchmark": {"enabled": true, "backend": "simulate", "timeoutSeconds": 120,
                          "securityContext": {"supplementalGroups": [44, 109]}},
        }))
        .unwrap();
        let mut obj = TrainingPlan::new("p", spec);
        obj.metadata.namespace = Some("team".into());
        obj.metadata.uid = Some("uid-1".into());
        let plan = crate::choose::validate(&obj.spec, "p", &Catalog::builtin().unwrap()).unwrap();
        (obj, plan)
    }

    #[test]
    fn the_pod_asks_for_one_node_of_the_gpu_kind() {
        let (obj, plan) = plan_obj();
        let config = Config::default();
        let settings = Settings::of(
            obj.spec.benchmark.as_ref().unwrap(),
            Backend::Simulate,
            &config,
        );
        let key = bench::shapes_key(&plan);
        let report = bench::report_name("p", &key);
        let p = pod(&obj, &plan, &settings, &report, 2, &config).unwrap();
        assert_eq!(
            p.metadata.name.as_deref(),
            Some(format!("{report}-2").as_str())
        );
        let owner = &p.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            ("uid-1", Some(true))
        );
        let spec = p.spec.unwrap();
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(
            spec.security_context.and_then(|c| c.supplemental_groups),
            Some(vec![44, 109]),
            "the plan's security context reaches the pod (GPU device groups on AMD nodes)"
        );
        assert_eq!(spec.active_deadline_seconds, Some(120));
        assert_eq!(
            spec.node_selector
                .unwrap()
                .get("nvidia.com/gpu.product")
                .map(String::as_str),
            Some("NVIDIA-H100-80GB-HBM3")
        );
        let c = &spec.containers[0];
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits.get("nvidia.com/gpu"), Some(&Quantity("8".into())));
        assert_eq!(
            c.command.as_ref().unwrap().join(" "),
            format!("primus bench --plan team/p --backend simulate --report-to team/{report}")
        );
        let env = &c.env.as_ref().unwrap()[0];
        assert_eq!(env.name, "NODE_NAME");
        assert_eq!(
            env.value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path,
            "spec.nodeName"
        );
        assert_eq!(attempt_of(&report, &pod_name(&report, 2)), Some(2));
        assert_eq!(attempt_of(&report, "other-1"), None);
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
