//! What the cluster holds for a plan's benchmark: the reports of the namespace and the plan's
//! pods for its report (read only; [`super::decide`] makes sense of them).

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject, ListParams};
use primus_crds::{BenchmarkReport, TrainingPlan};
use primus_oracle::bench;
use primus_oracle::plan::Plan;

use super::distrust;
use super::{COMPONENT, COMPONENT_LABEL, PLAN_LABEL, Settings, attempt_of, matches};
use crate::decoded::Decoded;
use crate::error::Error;
use crate::kubeapi::{call, controlled_by, plan_label_value, report_resource};
use crate::report_key::ReportKey;

/// A plan's benchmark as the API server has it.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The shapes key the plan needs measured.
    pub key: String,
    /// The name of the plan's own report (and the prefix of its pods).
    pub report: String,
    /// Every BenchmarkReport in the plan's namespace that decodes and is believed (controlled
    /// by its plan, signed by that plan's benchmark pod).
    pub reports: Vec<BenchmarkReport>,
    /// Reports left out, by name, and why (not believed, or the types cannot read it).
    pub ignored: Vec<(String, String)>,
    /// The plan's pods for its report (controlled by the plan), by attempt.
    pub pods: Vec<Pod>,
    /// The plan's report read again by name after its latest pod succeeded while the list held
    /// no matching one (the list may be older than the pod's status).
    pub reread: Option<BenchmarkReport>,
}

/// Read the plan's benchmark: two lists, and one get after a pod succeeded.
pub async fn observe(
    client: &kube::Client,
    plan_obj: &TrainingPlan,
    plan: &Plan,
    settings: &Settings,
    report_key: &ReportKey,
) -> Result<Observed, Error> {
    let ns = plan_obj.metadata.namespace.clone().unwrap_or_default();
    let name = plan_obj.metadata.name.clone().unwrap_or_default();
    let uid = plan_obj.metadata.uid.clone().unwrap_or_default();
    let key = bench::shapes_key(plan);
    let report = bench::report_name(&name, &key);

    // Listed untyped and decoded one by one: a report the types cannot read is left out
    // (and named), it does not fail the list for every plan of the namespace.
    let reports_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &report_resource());
    let listed = call(
        format!("list benchmarkreports in {ns}"),
        reports_api.list(&ListParams::default()),
    )
    .await?
    .items;
    let (decoded, mut ignored) = decode_reports(listed);
    let (reports, distrusted) = believed(decoded, report_key, &report, &uid);
    ignored.extend(distrusted);
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let selector = format!(
        "{PLAN_LABEL}={},{COMPONENT_LABEL}={COMPONENT}",
        plan_label_value(&name)
    );
    let attempt = |p: &Pod| attempt_of(&report, p.metadata.name.as_deref().unwrap_or_default());
    let mut pods: Vec<Pod> = call(
        format!("list benchmark pods of {ns}/{name}"),
        pods_api.list(&ListParams::default().labels(&selector)),
    )
    .await?
    .items
    .into_iter()
    .filter(|p| controlled_by(p.metadata.owner_references.as_ref(), &uid))
    .filter(|p| attempt(p).is_some())
    .collect();
    pods.sort_by_key(|p| attempt(p));

    let succeeded = pods
        .last()
        .and_then(|p| p.status.as_ref())
        .is_some_and(|s| s.phase.as_deref() == Some("Succeeded"));
    let has_own = reports.iter().any(|r| {
        r.metadata.name.as_deref() == Some(report.as_str())
            && matches(&r.spec.results, plan, &key, settings.backend)
    });
    let reread = if succeeded && !has_own {
        call(
            format!("get benchmarkreport {ns}/{report}"),
            reports_api.get_opt(&report),
        )
        .await?
        .and_then(|r| decode_reports(vec![r]).0.pop())
        .and_then(|r| {
            let (mut good, bad) = believed(vec![r], report_key, &report, &uid);
            ignored.extend(bad);
            good.pop()
        })
    } else {
        None
    };
    ignored.sort();
    ignored.dedup();
    Ok(Observed {
        key,
        report,
        reports,
        ignored,
        pods,
        reread,
    })
}

/// The reports believed, and the names of the others with why not.
fn believed(
    reports: Vec<BenchmarkReport>,
    key: &ReportKey,
    own: &str,
    uid: &str,
) -> (Vec<BenchmarkReport>, Vec<(String, String)>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for r in reports {
        let name = r.metadata.name.clone().unwrap_or_default();
        let own_uid = (name == own).then_some(uid);
        match distrust(&r, key, own_uid) {
            None => good.push(r),
            Some(why) => bad.push((name, why)),
        }
    }
    (good, bad)
}

/// The reports that decode, and the names of those that do not with the field and the error.
pub fn decode_reports(items: Vec<DynamicObject>) -> (Vec<BenchmarkReport>, Vec<(String, String)>) {
    let mut good = Vec::new();
    let mut bad = Vec::new();
    for item in items {
        let name = item.metadata.name.clone().unwrap_or_default();
        let decoded = serde_json::to_value(item)
            .map_err(|e| e.to_string())
            .and_then(|v| Decoded::<BenchmarkReport>::from_value(v).map_err(|e| e.to_string()))
            .and_then(|d| d.object.map_err(|u| u.error.to_string()))
            .and_then(|r: BenchmarkReport| {
                // Within the bounds the CRD states (an object stored before they existed).
                primus_oracle::bounds::check(&r.spec.results, "spec.results")
                    .map(|()| r)
                    .map_err(|e| e.to_string())
            });
        match decoded {
            Ok(r) => good.push(r),
            Err(why) => bad.push((name, why)),
        }
    }
    (good, bad)
}
