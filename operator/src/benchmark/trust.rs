//! Which BenchmarkReports the operator believes: one controlled by a TrainingPlan (an owner
//! reference with `controller: true`) and signed by the benchmark pod the operator started for
//! that plan's attempt ([`primus_crds::provenance`]). The plan's own report must also be
//! controlled by the plan itself. Anything else (written with `kubectl`, by another pod with
//! the namespace's benchmark service account, another plan's pod, or changed since) is left
//! out, and the plan's status says why.

use primus_crds::BenchmarkReport;
use primus_crds::annotations::REPORT_SIGNATURE;
use primus_crds::provenance;

use crate::report_key::ReportKey;

/// Why `r` is not believed (`None`: it is). `own` is the uid of the plan when `r` carries that
/// plan's own report name.
pub fn distrust(r: &BenchmarkReport, key: &ReportKey, own: Option<&str>) -> Option<String> {
    let ns = r.metadata.namespace.as_deref().unwrap_or_default();
    let name = r.metadata.name.as_deref().unwrap_or_default();
    let owner = r
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "TrainingPlan");
    let Some(owner) = owner else {
        return Some(
            "it is not controlled by a TrainingPlan (no owner reference with controller: true)"
                .into(),
        );
    };
    if let Some(uid) = own
        && owner.uid != uid
    {
        return Some(format!(
            "it is controlled by another TrainingPlan ({}), not by this one",
            owner.name
        ));
    }
    let annotation = r
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REPORT_SIGNATURE))
        .map(String::as_str);
    provenance::verify(key.bytes(), ns, name, &owner.uid, annotation, &r.spec)
        .err()
        .map(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::bench_plan;
    use kube::Resource;
    use primus_crds::BenchmarkReportSpec;
    use primus_crds::provenance::Subject;

    fn report(owner: Option<&primus_crds::TrainingPlan>) -> BenchmarkReport {
        let (_, plan) = bench_plan();
        let mut r = BenchmarkReport::new(
            "p-bench-1",
            BenchmarkReportSpec {
                plan: "p".into(),
                results: primus_oracle::bench::simulate::simulate(&plan, Default::default()),
            },
        );
        r.metadata.namespace = Some("team".into());
        r.metadata.owner_references = owner.map(|o| vec![o.controller_owner_ref(&()).unwrap()]);
        r
    }

    fn sign(r: &mut BenchmarkReport, key: &ReportKey, uid: &str, attempt: u32) {
        let t = provenance::token(key.bytes(), "team", uid, "p-bench-1", attempt);
        let subject = Subject {
            namespace: "team",
            report: "p-bench-1",
            plan_uid: uid,
            attempt,
        };
        let sig = provenance::sign(&t, &subject, &r.spec);
        r.metadata.annotations = Some([(REPORT_SIGNATURE.to_string(), sig)].into());
    }

    #[test]
    fn only_a_report_signed_for_its_controlling_plan_is_believed() {
        let key = ReportKey::random();
        let (plan, _) = bench_plan();
        let mut good = report(Some(&plan));
        sign(&mut good, &key, "uid-1", 1);
        assert_eq!(distrust(&good, &key, Some("uid-1")), None);
        assert_eq!(distrust(&good, &key, None), None);

        let unowned = report(None);
        assert!(
            distrust(&unowned, &key, None)
                .unwrap()
                .contains("not controlled")
        );
        let unsigned = report(Some(&plan));
        assert!(
            distrust(&unsigned, &key, None)
                .unwrap()
                .contains("not signed")
        );
        // Signed, but for another plan's uid (its token), or owned by another plan.
        let mut other = report(Some(&plan));
        sign(&mut other, &key, "uid-2", 1);
        assert!(
            distrust(&other, &key, None)
                .unwrap()
                .contains("does not match")
        );
        assert!(
            distrust(&good, &key, Some("uid-2"))
                .unwrap()
                .contains("another TrainingPlan")
        );
        // Changed after signing (absurd ratios written over a genuine report).
        let mut skewed = good.clone();
        skewed.spec.results.ops[0].median_seconds = 1e9;
        assert!(distrust(&skewed, &key, None).is_some());
    }
}
