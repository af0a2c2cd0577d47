//! Where a plan's benchmark stands and what to do about it, from what [`super::observe`] read
//! (pure: the clock is an argument). A matching report ends it (the plan's own, else a recent
//! one of the namespace); else the latest pod decides: still running, failed, or overdue; then
//! the next attempt starts, unless every attempt is spent.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use primus_crds::{BenchmarkReport, BenchmarkStatus};
use primus_oracle::plan::Plan;

use super::{
    CONTAINER, Observed, Outcome, Settings, age, attempt_of, backend_name, matches, pod_name,
};

/// What to do about a plan's benchmark.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The plan's own report (the pods' prefix).
    pub report: String,
    /// Where the benchmark stands once the actions are done.
    pub outcome: Outcome,
    /// At most one pod to delete and one to create, in this order.
    pub actions: Vec<Action>,
}

/// A change to the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Stop a pod that gave no report in time (another attempt follows).
    DeletePod(String),
    /// Start attempt n.
    CreatePod { attempt: u32 },
}

/// What the latest pod says.
enum Latest {
    /// It ended the benchmark or is still running: the outcome.
    Decided(Outcome),
    /// It failed (why), and may be deleted first.
    Failed(String, Option<Action>),
}

/// Decide one step of the plan's benchmark. `previous` is the plan's recorded benchmark
/// status: the attempts it counted for the same report survive pods that were deleted.
pub fn decide(
    seen: &Observed,
    plan: &Plan,
    settings: &Settings,
    grace: Duration,
    previous: Option<&BenchmarkStatus>,
    now: Timestamp,
) -> Decision {
    let attempts = attempts(seen, previous);
    let decided = |outcome| Decision {
        report: seen.report.clone(),
        outcome,
        actions: Vec::new(),
    };
    if let Some(done) = found(seen, plan, settings, attempts, now) {
        return decided(done);
    }
    let mut actions = Vec::new();
    let mut failure = None;
    if let Some(last) = seen.pods.last() {
        match latest(seen, last, plan, settings, grace, attempts, now) {
            Latest::Decided(o) => return decided(o),
            Latest::Failed(why, delete) => {
                failure = Some(why);
                actions.extend(delete);
            }
        }
    }
    let max = settings.max_attempts;
    if attempts >= max {
        let last = failure.unwrap_or_else(|| "no report".into());
        return decided(Outcome::Failed {
            report: seen.report.clone(),
            attempts,
            message: format!(
                "the benchmark failed {attempts} of {max} attempts; last: {last}. Fix the cause, then raise spec.benchmark.maxAttempts (or change the layer shapes) to retry"
            ),
        });
    }
    let next = attempts + 1;
    let pod = pod_name(&seen.report, next);
    let mut message = format!(
        "benchmark pod {pod} started (attempt {next} of {max}, backend {})",
        backend_name(settings.backend)
    );
    if let Some(f) = failure {
        message.push_str(&format!("; previous attempt: {f}"));
    }
    actions.push(Action::CreatePod { attempt: next });
    Decision {
        report: seen.report.clone(),
        outcome: Outcome::Waiting {
            report: seen.report.clone(),
            attempts: next,
            message,
            requeue: settings.timeout.min(Duration::from_secs(30)),
            created: Some(pod),
        },
        actions,
    }
}

/// Attempts so far: the highest pod number, or the recorded count for the same report.
fn attempts(seen: &Observed, previous: Option<&BenchmarkStatus>) -> u32 {
    let counted = seen
        .pods
        .iter()
        .filter_map(|p| attempt_of(&seen.report, p.metadata.name.as_deref().unwrap_or_default()))
        .max()
        .unwrap_or(0);
    let recorded = previous
        .filter(|b| !b.reused && b.report.as_deref() == Some(seen.report.as_str()))
        .map(|b| b.attempts)
        .unwrap_or(0);
    counted.max(recorded)
}

/// A report that ends the benchmark: the plan's own, else the newest matching one of the
/// namespace within the reuse window (ties by name, so the choice is stable).
fn found(
    seen: &Observed,
    plan: &Plan,
    settings: &Settings,
    attempts: u32,
    now: Timestamp,
) -> Option<Outcome> {
    let fits = |r: &&BenchmarkReport| matches(&r.spec.results, plan, &seen.key, settings.backend);
    let done = |r: &BenchmarkReport, reused: bool| Outcome::Done {
        report: r.metadata.name.clone().unwrap_or_default(),
        results: Box::new(r.spec.results.clone()),
        reused,
        attempts,
    };
    let own = seen
        .reports
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some(seen.report.as_str()))
        .filter(fits);
    if let Some(r) = own {
        return Some(done(r, false));
    }
    let window = settings.reuse_within?;
    let young = |r: &&BenchmarkReport| {
        let results = &r.spec.results;
        let when = results
            .finished_at
            .parse::<Timestamp>()
            .ok()
            .or_else(|| r.metadata.creation_timestamp.as_ref().map(|t| t.0));
        when.and_then(|t| Duration::try_from(now.duration_since(t)).ok())
            .is_some_and(|a| a <= window)
    };
    let mut candidates: Vec<&BenchmarkReport> =
        seen.reports.iter().filter(fits).filter(young).collect();
    candidates.sort_by(|a, b| {
        b.spec
            .results
            .finished_at
            .cmp(&a.spec.results.finished_at)
            .then_with(|| a.metadata.name.cmp(&b.metadata.name))
    });
    candidates.first().map(|r| done(r, true))
}

/// What the latest pod says: succeeded (with its report, read again), failed, still running,
/// or overdue.
fn latest(
    seen: &Observed,
    last: &Pod,
    plan: &Plan,
    settings: &Settings,
    grace: Duration,
    attempts: u32,
    now: Timestamp,
) -> Latest {
    let pod = last.metadata.name.clone().unwrap_or_default();
    let phase = last
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_else(|| "Pending".into());
    match phase.as_str() {
        "Succeeded" => {
            let report = seen
                .reread
                .as_ref()
                .filter(|r| matches(&r.spec.results, plan, &seen.key, settings.backend));
            match report {
                Some(r) => Latest::Decided(Outcome::Done {
                    report: seen.report.clone(),
                    results: Box::new(r.spec.results.clone()),
                    reused: false,
                    attempts,
                }),
                None => Latest::Failed(
                    match ignored_own(seen) {
                        Some(why) => format!("pod {pod} succeeded but {why}"),
                        None => format!(
                            "pod {pod} succeeded but posted no matching BenchmarkReport {}",
                            seen.report
                        ),
                    },
                    None,
                ),
            }
        }
        "Failed" => Latest::Failed(pod_failure(last), None),
        _ => {
            let a = age(&last.metadata, now);
            let limit = settings.timeout + grace;
            if a < limit {
                let mut message = format!(
                    "benchmark pod {pod} (attempt {attempts} of {}) is {}; waiting up to {}s for its report",
                    settings.max_attempts,
                    phase.to_lowercase(),
                    settings.timeout.as_secs()
                );
                if let Some(why) = ignored_own(seen) {
                    message.push_str(&format!("; {why}"));
                }
                return Latest::Decided(Outcome::Waiting {
                    report: seen.report.clone(),
                    attempts,
                    message,
                    requeue: (limit - a).min(Duration::from_secs(30)),
                    created: None,
                });
            }
            // Nobody enforced activeDeadlineSeconds (a pod no node took stays Pending
            // forever). When another attempt follows, stop it (the status keeps the count and
            // the next pod gets the next number); the last one stays, so the verdict keeps
            // naming it, and a node that takes it late still delivers the report.
            let delete = (attempts < settings.max_attempts).then(|| Action::DeletePod(pod.clone()));
            let why = format!(
                "pod {pod} gave no report within {}s",
                settings.timeout.as_secs()
            );
            Latest::Failed(why, delete)
        }
    }
}

/// Why the plan's own report, when there is one under its name, is not believed.
fn ignored_own(seen: &Observed) -> Option<String> {
    seen.ignored
        .iter()
        .find(|(name, _)| *name == seen.report)
        .map(|(name, why)| format!("BenchmarkReport {name} is ignored: {why}"))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::benchmark::{Settings, status_of};
    use crate::context::Config;
    use crate::testing::bench_plan;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use primus_crds::BenchmarkReportSpec;
    use primus_oracle::bench::{self, measure::Provenance};
    use primus_oracle::report::Backend;

    const NOW: i64 = 1_767_225_600; // 2026-01-01T00:00:00Z
    const GRACE: Duration = Duration::from_secs(30);

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    struct Fixture {
        plan: Plan,
        settings: Settings,
        seen: Observed,
    }

    /// The test plan (timeout 120 s, 3 attempts, reuse within 168 h) with nothing observed.
    fn fixture() -> Fixture {
        let (obj, plan) = bench_plan();
        let b = obj.spec.benchmark.clone().unwrap();
        let settings = Settings::of(&b, Backend::Simulate, &Config::default());
        let key = bench::shapes_key(&plan);
        let report = bench::report_name("p", &key);
        Fixture {
            plan,
            settings,
            seen: Observed {
                key,
                report,
                ..Observed::default()
            },
        }
    }

    impl Fixture {
        fn decide(&self, previous: Option<&BenchmarkStatus>) -> Decision {
            decide(
                &self.seen,
                &self.plan,
                &self.settings,
                GRACE,
                previous,
                now(),
            )
        }

        /// A report named `name` measuring the plan, finished `age` seconds ago.
        fn report(&self, name: &str, age: i64) -> BenchmarkReport {
            let finished = Timestamp::from_second(NOW - age).unwrap().to_string();
            let results = bench::simulate::simulate(
                &self.plan,
                Provenance {
                    node: "gpu-node-1".into(),
                    started_at: finished.clone(),
                    finished_at: finished,
                },
            );
            let mut r = BenchmarkReport::new(
                name,
                BenchmarkReportSpec {
                    plan: "p".into(),
                    results,
                },
            );
            r.metadata.namespace = Some("team".into());
            r
        }

        /// Attempt `n`'s pod, created `age` seconds ago, in `phase`.
        fn pod(&self, n: u32, phase: &str, age: i64) -> Pod {
            Pod {
                metadata: ObjectMeta {
                    name: Some(pod_name(&self.seen.report, n)),
                    creation_timestamp: Some(Time(Timestamp::from_second(NOW - age).unwrap())),
                    ..ObjectMeta::default()
                },
                spec: None,
                status: Some(PodStatus {
                    phase: Some(phase.into()),
                    ..PodStatus::default()
                }),
            }
        }

        /// Attempt `n`'s pod, killed for memory.
        fn killed(&self, n: u32) -> Pod {
            let mut p = self.pod(n, "Failed", 60);
            p.status.as_mut().unwrap().container_statuses = Some(vec![ContainerStatus {
                name: CONTAINER.into(),
                state: Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 137,
                        reason: Some("OOMKilled".into()),
                        ..ContainerStateTerminated::default()
                    }),
                    ..ContainerState::default()
                }),
                ..ContainerStatus::default()
            }]);
            p
        }
    }

    fn waiting(d: &Decision) -> (u32, &str, Duration, Option<&str>) {
        match &d.outcome {
            Outcome::Waiting {
                attempts,
                message,
                requeue,
                created,
                ..
            } => (*attempts, message, *requeue, created.as_deref()),
            other => panic!("not waiting: {other:?}"),
        }
    }

    #[test]
    fn an_ignored_report_under_the_plans_name_is_named_while_waiting_and_after() {
        let mut f = fixture();
        let own = f.seen.report.clone();
        f.seen.ignored = vec![(own.clone(), "it is not signed by a benchmark pod".into())];
        f.seen.pods = vec![f.pod(1, "Running", 10)];
        let d = f.decide(None);
        let (_, message, _, _) = waiting(&d);
        assert!(
            message.ends_with(&format!(
                "; BenchmarkReport {own} is ignored: it is not signed by a benchmark pod"
            )),
            "{message}"
        );
        // The pod succeeded, its report is not believed: the next attempt, saying why.
        f.seen.pods = vec![f.pod(1, "Succeeded", 10)];
        let d = f.decide(None);
        assert_eq!(d.actions, vec![Action::CreatePod { attempt: 2 }]);
        let (_, message, _, _) = waiting(&d);
        assert!(
            message.contains("succeeded but BenchmarkReport"),
            "{message}"
        );
        assert!(message.contains("is ignored"), "{message}");
    }

    #[test]
    fn the_first_pass_starts_attempt_one() {
        let f = fixture();
        let d = f.decide(None);
        assert_eq!(d.actions, vec![Action::CreatePod { attempt: 1 }]);
        let first = pod_name(&f.seen.report, 1);
        let (attempts, message, requeue, created) = waiting(&d);
        assert_eq!((attempts, created), (1, Some(first.as_str())));
        assert_eq!(requeue, Duration::from_secs(30));
        assert_eq!(
            message,
            format!("benchmark pod {first} started (attempt 1 of 3, backend simulate)")
        );
    }

    #[test]
    fn a_running_pod_is_waited_for() {
        let mut f = fixture();
        f.seen.pods = vec![f.pod(1, "Running", 140)];
        let d = f.decide(None);
        assert!(d.actions.is_empty());
        let (attempts, message, requeue, created) = waiting(&d);
        assert_eq!((attempts, created), (1, None));
        // 120 s timeout + 30 s grace - 140 s of age.
        assert_eq!(requeue, Duration::from_secs(10));
        assert!(message.contains("(attempt 1 of 3) is running"), "{message}");
    }

    #[test]
    fn a_failed_pod_is_retried_with_its_cause() {
        let mut f = fixture();
        f.seen.pods = vec![f.killed(1)];
        let d = f.decide(None);
        assert_eq!(d.actions, vec![Action::CreatePod { attempt: 2 }]);
        let (attempts, message, ..) = waiting(&d);
        assert_eq!(attempts, 2);
        assert!(
            message.ends_with(&format!(
                "; previous attempt: pod {} exited with code 137 (OOMKilled)",
                pod_name(&f.seen.report, 1)
            )),
            "{message}"
        );
    }

    #[test]
    fn an_overdue_pod_is_deleted_and_replaced_but_the_last_one_stays() {
        let mut f = fixture();
        f.seen.pods = vec![f.pod(1, "Pending", 151)];
        let d = f.decide(None);
        assert_eq!(
            d.actions,
            vec![
                Action::DeletePod(pod_name(&f.seen.report, 1)),
                Action::CreatePod { attempt: 2 }
            ]
        );
        assert!(waiting(&d).1.contains("gave no report within 120s"));
        f.seen.pods = vec![f.killed(1), f.killed(2), f.pod(3, "Pending", 151)];
        let d = f.decide(None);
        assert!(d.actions.is_empty());
        match &d.outcome {
            Outcome::Failed {
                attempts, message, ..
            } => {
                assert_eq!(*attempts, 3);
                assert!(message.starts_with("the benchmark failed 3 of 3 attempts; last: pod "));
                assert!(message.contains("gave no report within 120s"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn every_attempt_failed_is_failed() {
        let mut f = fixture();
        f.seen.pods = vec![f.killed(1), f.killed(2), f.killed(3)];
        let d = f.decide(None);
        assert!(d.actions.is_empty());
        let Outcome::Failed { message, .. } = &d.outcome else {
            panic!("{:?}", d.outcome)
        };
        assert!(message.contains("exited with code 137"), "{message}");
        // Attempts recorded in the status count even when their pods are gone.
        let mut f = fixture();
        let recorded = BenchmarkStatus {
            report: Some(f.seen.report.clone()),
            attempts: 3,
            ..BenchmarkStatus::default()
        };
        assert!(matches!(
            f.decide(Some(&recorded)).outcome,
            Outcome::Failed { attempts: 3, .. }
        ));
        f.seen.report = "other".into();
        assert!(matches!(
            f.decide(Some(&recorded)).outcome,
            Outcome::Waiting { .. }
        ));
    }

    #[test]
    fn the_plans_own_report_ends_it() {
        let mut f = fixture();
        f.seen.pods = vec![f.pod(1, "Succeeded", 60)];
        f.seen.reports = vec![f.report(&f.seen.report.clone(), 60)];
        let d = f.decide(None);
        assert!(d.actions.is_empty());
        match &d.outcome {
            Outcome::Done {
                report,
                reused,
                attempts,
                ..
            } => assert_eq!((report, *reused, *attempts), (&f.seen.report, false, 1)),
            other => panic!("{other:?}"),
        }
        assert_eq!(status_of(&d.outcome).node.as_deref(), Some("gpu-node-1"));
    }

    #[test]
    fn a_succeeded_pod_is_read_again_and_else_failed() {
        let mut f = fixture();
        f.seen.pods = vec![f.pod(1, "Succeeded", 60)];
        f.seen.reread = Some(f.report(&f.seen.report.clone(), 1));
        assert!(matches!(
            f.decide(None).outcome,
            Outcome::Done { reused: false, .. }
        ));
        f.seen.reread = None;
        let d = f.decide(None);
        assert_eq!(d.actions, vec![Action::CreatePod { attempt: 2 }]);
        assert!(
            waiting(&d)
                .1
                .contains("succeeded but posted no matching BenchmarkReport")
        );
    }

    #[test]
    fn a_recent_matching_report_is_reused_and_an_old_one_is_not() {
        let mut f = fixture();
        f.seen.reports = vec![
            f.report("other-bench-a", 3600),
            f.report("other-bench-b", 60),
        ];
        match f.decide(None).outcome {
            Outcome::Done { report, reused, .. } => {
                assert_eq!((report.as_str(), reused), ("other-bench-b", true))
            }
            other => panic!("{other:?}"),
        }
        f.seen.reports = vec![f.report("other-bench-a", 169 * 3600)];
        assert!(matches!(f.decide(None).outcome, Outcome::Waiting { .. }));
        f.seen.reports = vec![f.report("other-bench-a", 60)];
        f.settings.reuse_within = None;
        assert!(matches!(f.decide(None).outcome, Outcome::Waiting { .. }));
    }
}
