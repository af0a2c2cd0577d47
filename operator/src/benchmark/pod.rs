//! The benchmark pod of one attempt: one node of the plan's GPU kind (resource and product
//! node selector from the hardware profile), `primus bench --plan NS/NAME --backend B
//! --report-to NS/REPORT`, owned by the plan.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec, ResourceRequirements,
    Secret, SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use primus_crds::TrainingPlan;
use primus_crds::provenance::{self, ATTEMPT_ENV, TOKEN_ENV, TOKEN_KEY};
use primus_oracle::bench;
use primus_oracle::plan::{Plan, SearcherKind};
use primus_oracle::report::MAX_FINALISTS;

use super::{COMPONENT, COMPONENT_LABEL, CONTAINER, KEY_LABEL, PLAN_LABEL, Settings};
use super::{backend_name, pod_name};
use crate::context::Config;
use crate::error::Error;
use crate::kubeapi::{owner_reference, plan_label_value};

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
    let mut command = vec![
        "primus".to_string(),
        "bench".to_string(),
        "--plan".to_string(),
        format!("{ns}/{name}"),
        "--backend".to_string(),
        backend_name(settings.backend).to_string(),
        "--report-to".to_string(),
        format!("{ns}/{report}"),
    ];
    // The tuner's finalists are ranked by kernels timed at their own shapes: the pod times
    // those of the best layouts of an analytic search too (none for searcher `none`).
    let finalists = finalists_for(plan);
    if finalists > 0 {
        command.extend(["--finalists".to_string(), finalists.to_string()]);
    }
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
                env: Some(env(&pod_name(report, attempt), attempt)),
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

/// How many finalists a plan's benchmark times: its `spec.tuning.topK`, at most
/// [`MAX_FINALISTS`]; none for searcher `none` (nothing is ranked).
pub fn finalists_for(plan: &Plan) -> u64 {
    if plan.tuning.searcher == SearcherKind::None {
        return 0;
    }
    (plan.tuning.top_k as u64).min(MAX_FINALISTS)
}

/// The benchmark container's environment: its node, and its attempt's token (from the
/// attempt's Secret, named like the pod) with the attempt number.
fn env(pod: &str, attempt: u32) -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: "NODE_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "spec.nodeName".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        EnvVar {
            name: TOKEN_ENV.into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: pod.to_string(),
                    key: TOKEN_KEY.into(),
                    optional: Some(false),
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        EnvVar {
            name: ATTEMPT_ENV.into(),
            value: Some(attempt.to_string()),
            ..EnvVar::default()
        },
    ]
}

/// The Secret holding attempt `attempt`'s token (named like its pod, owned by the plan): only
/// that pod reads it, through its environment; the benchmark service account cannot read
/// Secrets.
pub fn token_secret(
    plan_obj: &TrainingPlan,
    report: &str,
    attempt: u32,
    key: &crate::report_key::ReportKey,
) -> Result<Secret, Error> {
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let name = plan_obj.metadata.name.clone().unwrap_or_default();
    let uid = plan_obj.metadata.uid.clone().unwrap_or_default();
    let token = provenance::token(key.bytes(), &ns, &uid, report, attempt);
    Ok(Secret {
        metadata: ObjectMeta {
            name: Some(pod_name(report, attempt)),
            namespace: Some(ns),
            labels: Some(BTreeMap::from([
                (PLAN_LABEL.to_string(), plan_label_value(&name)),
                (COMPONENT_LABEL.to_string(), COMPONENT.to_string()),
                (
                    primus_crds::annotations::MANAGED_BY.to_string(),
                    crate::CONTROLLER.to_string(),
                ),
            ])),
            owner_references: Some(vec![owner_reference(plan_obj)?]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            TOKEN_KEY.to_string(),
            ByteString(token.into_bytes()),
        )])),
        type_: Some("Opaque".into()),
        ..Secret::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::benchmark::attempt_of;
    use crate::testing::bench_plan as plan_obj;
    use primus_oracle::report::Backend;

    #[test]
    fn finalists_follow_top_k_up_to_the_bound_and_none_without_a_search() {
        let (_, mut plan) = plan_obj();
        plan.tuning.top_k = 20;
        assert_eq!(finalists_for(&plan), MAX_FINALISTS);
        plan.tuning.top_k = 3;
        assert_eq!(finalists_for(&plan), 3);
        plan.tuning.searcher = SearcherKind::None;
        assert_eq!(finalists_for(&plan), 0);
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
            format!(
                "primus bench --plan team/p --backend simulate --report-to team/{report} --finalists 5"
            ),
            "the plan's topK (default 5) finalists are timed too"
        );
        let all = c.env.as_ref().unwrap();
        let token = all.iter().find(|e| e.name == TOKEN_ENV).unwrap();
        let secret = token.value_from.as_ref().unwrap().secret_key_ref.as_ref();
        assert_eq!(
            secret.map(|s| s.name.as_str()),
            Some(p.metadata.name.as_deref().unwrap())
        );
        let attempt = all.iter().find(|e| e.name == ATTEMPT_ENV).unwrap();
        assert_eq!(attempt.value.as_deref(), Some("2"));
        let s = token_secret(&obj, &report, 2, &config.report_key).unwrap();
        assert_eq!(s.metadata.name, p.metadata.name);
        let t = String::from_utf8(s.data.unwrap()[TOKEN_KEY].0.clone()).unwrap();
        assert_eq!(
            t,
            provenance::token(config.report_key.bytes(), "team", "uid-1", &report, 2)
        );
        let env = &all[0];
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
}
