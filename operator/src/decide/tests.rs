//! Each outcome of a pass, from what the steps observed to the status the pass writes.

use super::*;
use crate::benchmark::Outcome as BenchOutcome;
use crate::job::{self, Action as JobAction};
use crate::reason::Severity;
use crate::testing::plan_with;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use primus_crds::job::Job;
use primus_crds::{SearchSummary, TrainingPlan};
use primus_oracle::layout::Layout;
use primus_oracle::plan::Plan;
use serde_json::json;

/// (state, reason, message) of a condition.
fn cond(v: &Verdicts, type_: &str) -> (State, Reason, String) {
    let c = v.get(type_).unwrap_or_else(|| panic!("no {type_}"));
    (c.state, c.reason, c.message.clone())
}

fn halted<T: std::fmt::Debug>(s: &Step<T>) -> &Halt {
    match &s.next {
        Next::Halt(h) => h,
        Next::Go(v) => panic!("the pass goes on with {v:?}"),
    }
}

fn summary(label: &str, layout: Layout) -> LayoutSummary {
    LayoutSummary {
        label: label.into(),
        layout,
        dp: 8,
        tokens_per_second_per_gpu: 9876.4,
        tflops_per_gpu: 400.0,
        mfu: 0.4,
        step_time_seconds: 3.5,
        peak_memory_bytes: 40.0 * GIB,
        usable_memory_bytes: 75.0 * GIB,
        dominant: "compute".into(),
        calibrated: false,
        measured_kernels: false,
    }
}

#[test]
fn benchmark_pending_progresses_and_looks_again_soon() {
    let s = benchmarked(Some(BenchOutcome::Waiting {
        report: "p-bench-1".into(),
        attempts: 1,
        message: "benchmark pod p-bench-1-1 started".into(),
        requeue: Duration::from_secs(30),
        created: Some("p-bench-1-1".into()),
    }));
    let h = halted(&s);
    assert_eq!(h.phase, Phase::Benchmarking);
    assert_eq!(h.requeue, Requeue::After(Duration::from_secs(30)));
    let m = "benchmark pod p-bench-1-1 started".to_string();
    assert_eq!(
        cond(&h.conditions, READY),
        (State::False, Reason::Benchmarking, m.clone())
    );
    assert_eq!(
        cond(&h.conditions, RECONCILING),
        (State::True, Reason::Benchmarking, m.clone())
    );
    assert_eq!(cond(&h.conditions, STALLED).1, Reason::Progressing);
    assert_eq!(
        cond(&s.conditions, BENCHMARKED),
        (State::False, Reason::Benchmarking, m)
    );
    for later in [PROJECTED, TUNED, JOB_CREATED, DRIFT_WITHIN_TOLERANCE] {
        let (state, reason, _) = cond(&s.conditions, later);
        assert_eq!(
            (state, reason),
            (State::Unknown, Reason::WaitingForBenchmark)
        );
    }
    let n = s.notice.as_ref().expect("the new pod is announced");
    assert_eq!(
        (n.reason, n.action.as_str()),
        (Reason::BenchmarkStarted, "Benchmark")
    );
    assert_eq!(n.reason.severity(), Severity::Normal);
    // A pod that was already running is not announced again.
    let s = benchmarked(Some(BenchOutcome::Waiting {
        report: "p-bench-1".into(),
        attempts: 1,
        message: "waiting".into(),
        requeue: Duration::from_secs(5),
        created: None,
    }));
    assert!(s.notice.is_none());
}

#[test]
fn benchmark_failed_stalls_until_the_spec_changes() {
    let s = benchmarked(Some(BenchOutcome::Failed {
        report: "p-bench-1".into(),
        attempts: 3,
        message: "the benchmark failed 3 of 3 attempts".into(),
    }));
    let h = halted(&s);
    assert_eq!((h.phase, h.requeue), (Phase::Failed, Requeue::OnChange));
    assert_eq!(cond(&h.conditions, STALLED).0, State::True);
    assert_eq!(cond(&h.conditions, STALLED).1, Reason::BenchmarkFailed);
    assert_eq!(
        cond(&h.conditions, RECONCILING),
        (
            State::False,
            Reason::BenchmarkFailed,
            "waiting for a spec change".into()
        )
    );
    assert_eq!(cond(&s.conditions, BENCHMARKED).1, Reason::BenchmarkFailed);
    assert_eq!(cond(&s.conditions, TUNED).1, Reason::BenchmarkFailed);
    assert_eq!(Reason::BenchmarkFailed.severity(), Severity::Warning);
}

#[test]
fn benchmark_done_hands_the_report_on() {
    let (_, plan) = crate::testing::bench_plan();
    let mut results = primus_oracle::bench::simulate::simulate(&plan, Default::default());
    results.node = "gpu-1".into();
    let s = benchmarked(Some(BenchOutcome::Done {
        report: "other-bench-1".into(),
        results: Box::new(results.clone()),
        reused: true,
        attempts: 0,
    }));
    let Next::Go(Some(r)) = &s.next else {
        panic!("{:?}", s.next)
    };
    assert_eq!((r.name.as_str(), &r.results), ("other-bench-1", &results));
    let (state, reason, m) = cond(&s.conditions, BENCHMARKED);
    assert_eq!((state, reason), (State::True, Reason::ReportReused));
    assert!(
        m.starts_with("BenchmarkReport other-bench-1 reused: "),
        "{m}"
    );
    assert!(m.contains("on node gpu-1 (simulate, "), "{m}");
    // Disabled: the analytic model alone, no report.
    let s = benchmarked(None);
    assert!(matches!(s.next, Next::Go(None)));
    assert_eq!(cond(&s.conditions, BENCHMARKED).1, Reason::Disabled);
}

#[test]
fn tune_infeasible_stalls_with_the_tuners_words() {
    let s = chosen(Err(ChooseError::NoFeasibleLayout("no layout fits".into())));
    let h = halted(&s);
    assert_eq!((h.phase, h.requeue), (Phase::Stalled, Requeue::OnChange));
    assert_eq!(
        cond(&h.conditions, READY),
        (
            State::False,
            Reason::NoFeasibleLayout,
            "no layout fits".into()
        )
    );
    for t in [PROJECTED, TUNED] {
        assert_eq!(cond(&s.conditions, t).1, Reason::NoFeasibleLayout);
    }
    assert_eq!(cond(&s.conditions, JOB_CREATED).0, State::Unknown);
    assert!(s.conditions.get(BENCHMARKED).is_none());
}

#[test]
fn a_choice_is_projected_and_tuned() {
    let c = Choice {
        chosen: summary("TP2 PP1", Layout::default()),
        reference: None,
        gain_over_reference: Some(0.125),
        candidates: Vec::new(),
        search: SearchSummary {
            searcher: "exhaustive".into(),
            evaluated: 10,
            rejected_by_memory: 2,
            rejected_by_rules: 3,
            seconds: 0.5,
            trials: None,
            explanation: Vec::new(),
            agent_unavailable: None,
            finalists: None,
        },
    };
    let s = chosen(Ok(c.clone()));
    assert!(matches!(&s.next, Next::Go(x) if *x == c));
    assert_eq!(
        cond(&s.conditions, TUNED).2,
        "exhaustive searcher chose TP2 PP1 (10 layouts evaluated, 2 rejected by memory, 3 by rules, 0.50s); +12.5% over spec.parallelism"
    );
    assert!(
        cond(&s.conditions, PROJECTED)
            .2
            .starts_with("TP2 PP1: 9876 tokens/s/GPU")
    );
}

#[test]
fn an_invalid_spec_stalls_naming_the_field() {
    let h = invalid(&FieldError::new("spec.model.preset", "unknown preset"));
    assert_eq!((h.phase, h.requeue), (Phase::Stalled, Requeue::OnChange));
    let m = "spec.model.preset: unknown preset";
    assert_eq!(
        cond(&h.conditions, STALLED),
        (State::True, Reason::InvalidSpec, m.into())
    );
    assert_eq!(
        cond(&h.conditions, READY).2,
        format!("the spec is invalid: {m}")
    );
    assert_eq!(
        cond(&h.conditions, RECONCILING).2,
        "waiting for a spec change"
    );
    // Through the tuner's field errors too.
    let s = chosen(Err(ChooseError::Field(FieldError::new(
        "spec.tuning.searcher",
        "x",
    ))));
    assert_eq!(cond(&halted(&s).conditions, STALLED).1, Reason::InvalidSpec);
}

/// The job step from what it observed: (the decided action, the status step).
fn job_step(
    plan: &(TrainingPlan, Plan),
    seen: &job::Observed,
    layout: &Layout,
) -> (Option<JobAction>, Step<Halt>) {
    let (obj, p) = plan;
    let desired = job::desired(obj, p, layout, 9876.5).unwrap();
    let d = job::decide(obj, seen, desired, layout);
    (
        d.action,
        job(
            &d.outcome,
            &summary(&layout.label(), layout.clone()),
            job::job_kind(obj),
        ),
    )
}

/// The plan's job as the cluster has it: owned by `owner`, running `layout`.
fn existing(
    plan: &(TrainingPlan, Plan),
    owner: &str,
    layout: &Layout,
    status: serde_json::Value,
) -> job::Observed {
    let mut j: Job = job::desired(&plan.0, &plan.1, layout, 1.0).unwrap();
    let m = j.metadata_mut();
    m.uid = Some("job-uid".into());
    m.resource_version = Some("7".into());
    m.owner_references = Some(vec![OwnerReference {
        api_version: "primus.dev/v1alpha1".into(),
        kind: "TrainingPlan".into(),
        name: "p".into(),
        uid: owner.into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    match &mut j {
        Job::PyTorch(j) => j.status = serde_json::from_value(status).unwrap(),
        Job::Train(j) => j.status = serde_json::from_value(status).unwrap(),
    }
    job::Observed {
        crd_present: true,
        existing: Some(j),
    }
}

fn tp(tp: u32) -> Layout {
    Layout {
        tp,
        ..Layout::default()
    }
}

fn ends_ready(s: &Step<Halt>) {
    match &s.next {
        Next::Go(end) => {
            assert_eq!((end.phase, end.requeue), (Phase::Ready, Requeue::Resync));
            assert_eq!(cond(&end.conditions, READY).0, State::True);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn job_created_when_there_is_none() {
    let plan = plan_with(json!({"job": {"suspend": true}}));
    let seen = job::Observed {
        crd_present: true,
        existing: None,
    };
    let (action, s) = job_step(&plan, &seen, &tp(2));
    let Some(JobAction::Create(j)) = action else {
        panic!("{action:?}")
    };
    assert_eq!(j.metadata().name.as_deref(), Some("p"));
    assert!(j.suspended());
    let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
    assert_eq!((state, reason), (State::True, Reason::Suspended));
    assert!(m.starts_with("PyTorchJob p with TP2"), "{m}");
    let n = s.notice.as_ref().unwrap();
    assert_eq!(
        (n.reason, n.action.as_str()),
        (Reason::JobCreated, "CreateJob")
    );
    ends_ready(&s);
}

#[test]
fn job_replaced_when_it_has_not_started_with_another_layout() {
    let plan = plan_with(json!({}));
    let seen = existing(
        &plan,
        "uid-1",
        &tp(4),
        json!({"conditions": [{"type": "Created", "status": "True"}]}),
    );
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(
        action,
        Some(JobAction::Delete {
            uid: Some("job-uid".into()),
            resource_version: Some("7".into())
        })
    );
    let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
    assert_eq!((state, reason), (State::False, Reason::Replacing));
    assert!(
        m.contains("had not started and the plan now chooses TP2"),
        "{m}"
    );
    let Next::Go(end) = &s.next else { panic!() };
    assert_eq!(
        (end.phase, end.requeue),
        (Phase::Pending, Requeue::After(REPLACE_RECHECK))
    );
    assert_eq!(cond(&end.conditions, READY).1, Reason::Reconciling);
    assert_eq!(
        cond(&end.conditions, RECONCILING),
        (
            State::True,
            Reason::ReplacingJob,
            "replacing the PyTorchJob".into()
        )
    );
    assert_eq!(s.notice.as_ref().unwrap().reason, Reason::JobReplaced);
}

#[test]
fn job_left_alone_when_it_started_with_another_layout() {
    let plan = plan_with(json!({}));
    let running = json!({"conditions": [{"type": "Running", "status": "True"}]});
    let seen = existing(&plan, "uid-1", &tp(4), running.clone());
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(action, None);
    let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
    assert_eq!((state, reason), (State::True, Reason::LayoutDiffers));
    assert!(m.contains("has started with TP4"), "{m}");
    ends_ready(&s);
    // With the chosen layout it is up to date; a started job is never suspended.
    let plan = plan_with(json!({"job": {"suspend": true}}));
    let seen = existing(&plan, "uid-1", &tp(2), running);
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(action, None);
    assert_eq!(cond(&s.conditions, JOB_CREATED).1, Reason::Started);
    // Not started: spec.job.suspend is passed on.
    let seen = existing(&plan_with(json!({})), "uid-1", &tp(2), json!({}));
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(
        action,
        Some(JobAction::Suspend {
            suspend: Some(true),
            applied: true
        })
    );
    assert_eq!(cond(&s.conditions, JOB_CREATED).1, Reason::Suspended);
}

#[test]
fn a_queue_controllers_suspend_and_resume_are_left_alone() {
    // Created unsuspended into a Kueue queue (the template's label passes to the job).
    let plan = plan_with(json!({"job": {"template": {"metadata": {
        "labels": {"kueue.x-k8s.io/queue-name": "team-a"}}, "spec": {}}}}));
    let mut seen = existing(&plan, "uid-1", &tp(2), json!({}));
    let job = seen.existing.as_mut().unwrap();
    assert_eq!(job.applied_suspend(), Some(false));
    assert_eq!(job.queue().as_deref(), Some("team-a"));
    // Kueue suspends it until the queue admits it: no action, the status says Queued.
    job.set_suspended(true);
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(action, None);
    let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
    assert_eq!((state, reason), (State::True, Reason::Queued));
    assert!(m.contains("waits in queue team-a"), "{m}");
    // Kueue resumes it: still nothing to do.
    let job = seen.existing.as_mut().unwrap();
    job.set_suspended(false);
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(action, None);
    assert_eq!(cond(&s.conditions, JOB_CREATED).1, Reason::Created);

    // A plan that suspends: a resume by someone else is not reverted either.
    let plan = plan_with(json!({"job": {"suspend": true}}));
    let mut seen = existing(&plan, "uid-1", &tp(2), json!({}));
    let job = seen.existing.as_mut().unwrap();
    assert!(job.suspended());
    job.set_suspended(false);
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(action, None);
    assert_eq!(cond(&s.conditions, JOB_CREATED).1, Reason::Created);
    // Suspended without a queue and not by the plan: Queued, naming no queue.
    let plan = plan_with(json!({}));
    let mut seen = existing(&plan, "uid-1", &tp(2), json!({}));
    let job = seen.existing.as_mut().unwrap();
    job.set_suspended(true);
    let (_, s) = job_step(&plan, &seen, &tp(2));
    let (_, reason, m) = cond(&s.conditions, JOB_CREATED);
    assert_eq!(reason, Reason::Queued);
    assert!(m.contains("suspended by another controller"), "{m}");
}

#[test]
fn queue_and_scheduling_fields_pass_from_the_template_to_the_job() {
    let plan = plan_with(json!({"job": {"template": {
        "metadata": {"labels": {"kueue.x-k8s.io/queue-name": "team-a"},
                     "annotations": {"scheduling.volcano.sh/queue-name": "vq"}},
        "spec": {
            "runPolicy": {"schedulingPolicy": {"queue": "vq", "priorityClass": "high"}},
            "pytorchReplicaSpecs": {"Worker": {"template": {
                "metadata": {"annotations": {"scheduling.k8s.io/group-name": "g"}},
                "spec": {"priorityClassName": "high", "schedulerName": "volcano",
                    "containers": [{"name": "pytorch", "image": "example/megatron:1"}]}}}}}}}}));
    let seen = job::Observed {
        crd_present: true,
        existing: None,
    };
    let (action, s) = job_step(&plan, &seen, &tp(2));
    let Some(JobAction::Create(j)) = action else {
        panic!("{action:?}")
    };
    let v = serde_json::to_value(&j).unwrap();
    assert_eq!(
        v["metadata"]["labels"]["kueue.x-k8s.io/queue-name"],
        "team-a"
    );
    assert_eq!(
        v["metadata"]["annotations"]["scheduling.volcano.sh/queue-name"],
        "vq"
    );
    assert_eq!(
        v["metadata"]["annotations"]["primus.dev/suspend-applied"],
        "false"
    );
    let rp = &v["spec"]["runPolicy"];
    assert_eq!(
        rp["schedulingPolicy"],
        json!({"queue": "vq", "priorityClass": "high"})
    );
    assert!(rp.get("suspend").is_none(), "{rp}");
    let pod = &v["spec"]["pytorchReplicaSpecs"]["Master"]["template"];
    assert_eq!(pod["spec"]["priorityClassName"], "high");
    assert_eq!(pod["spec"]["schedulerName"], "volcano");
    assert_eq!(
        pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"],
        "g"
    );
    assert_eq!(cond(&s.conditions, JOB_CREATED).1, Reason::Created);
}

#[test]
fn job_name_taken_stalls() {
    let plan = plan_with(json!({}));
    let seen = existing(&plan, "someone-else", &tp(2), json!({}));
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(action, None);
    let (state, reason, m) = cond(&s.conditions, JOB_CREATED);
    assert_eq!((state, reason), (State::False, Reason::JobNameTaken));
    assert!(m.starts_with("a PyTorchJob named p exists and is not owned by this plan"));
    let Next::Go(end) = &s.next else { panic!() };
    assert_eq!((end.phase, end.requeue), (Phase::Stalled, Requeue::Resync));
    assert_eq!(
        cond(&end.conditions, RECONCILING).2,
        "waiting for an outside change"
    );
    assert!(s.notice.is_none());
}

#[test]
fn crd_missing_stalls_and_looks_again() {
    let plan = plan_with(json!({}));
    let (action, s) = job_step(&plan, &job::Observed::default(), &tp(2));
    assert_eq!(action, None);
    assert_eq!(
        cond(&s.conditions, JOB_CREATED).1,
        Reason::PyTorchJobCrdMissing
    );
    assert_eq!(
        Reason::PyTorchJobCrdMissing.as_str(),
        "PyTorchJobCRDMissing"
    );
    let Next::Go(end) = &s.next else { panic!() };
    assert_eq!(
        (end.phase, end.requeue),
        (Phase::Stalled, Requeue::After(CRD_RECHECK))
    );
    assert_eq!(cond(&end.conditions, STALLED).0, State::True);
}

#[test]
fn auto_submit_disabled_reports_the_layout_only() {
    let plan = plan_with(json!({"job": {"autoSubmit": false}}));
    // Whatever exists: the decision does not look.
    let seen = existing(&plan, "someone-else", &tp(4), json!({}));
    let (action, s) = job_step(&plan, &seen, &tp(2));
    assert_eq!(action, None);
    assert_eq!(
        cond(&s.conditions, JOB_CREATED),
        (
            State::False,
            Reason::AutoSubmitDisabled,
            "spec.job.autoSubmit is false: the chosen layout is reported only, no PyTorchJob is created".into()
        )
    );
    ends_ready(&s);
    assert_eq!(Reason::AutoSubmitDisabled.severity(), Severity::Normal);
}

#[test]
fn the_cached_choice_needs_the_same_generation_and_report() {
    let c = chosen(Ok(Choice {
        chosen: summary("TP2", tp(2)),
        reference: None,
        gain_over_reference: None,
        candidates: Vec::new(),
        search: SearchSummary {
            searcher: "none".into(),
            evaluated: 1,
            rejected_by_memory: 0,
            rejected_by_rules: 0,
            seconds: 0.0,
            trials: None,
            explanation: Vec::new(),
            agent_unavailable: None,
            finalists: None,
        },
    }));
    let Next::Go(choice) = &c.next else { panic!() };
    let previous = TrainingPlanStatus {
        conditions: c
            .conditions
            .merge(&[], Some(3), k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        chosen: Some(choice.chosen.clone()),
        search: Some(choice.search.clone()),
        benchmark: Some(primus_crds::BenchmarkStatus {
            report: Some("r".into()),
            ..Default::default()
        }),
        ..TrainingPlanStatus::default()
    };
    assert_eq!(
        cached_choice(&previous, Some(3), Some("r")).as_ref(),
        Some(choice)
    );
    assert!(cached_choice(&previous, Some(4), Some("r")).is_none());
    assert!(cached_choice(&previous, Some(3), None).is_none());
}

#[test]
fn flips_are_announced_with_the_reasons_severity() {
    let before = Verdicts::default()
        .with(READY, State::True, Reason::Ready, "ok")
        .with(STALLED, State::False, Reason::Ready, "ok")
        .merge(&[], None, k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let after_v = searching().conditions;
    let after = after_v.merge(&before, None, k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let n = flip_notices(&before, &after, &after_v);
    // Ready -> False (Tuning): announced; Reconciling, Stalled False, Tuned Unknown: not.
    assert_eq!(n.len(), 1, "{n:?}");
    assert_eq!(
        (n[0].reason, n[0].action.as_str()),
        (Reason::Tuning, "Ready")
    );
    assert_eq!(n[0].reason.severity(), Severity::Warning);
    let stalled = Halt::stalled(Reason::JobNameTaken, "taken", Requeue::Resync).conditions;
    let after = stalled.merge(&before, None, k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let n = flip_notices(&before, &after, &stalled);
    let types: Vec<&str> = n.iter().map(|n| n.action.as_str()).collect();
    assert_eq!(types, [READY, STALLED]);
    assert!(n.iter().all(|n| n.reason.severity() == Severity::Warning));
}

#[test]
fn drift_compares_a_measurement_and_says_when_there_is_none() {
    let m = Measurement {
        tokens_per_second_per_gpu: 500.0,
        source: "status.measured".into(),
    };
    let (v, compared) = drift(1000.0, 0.1, Some(m), ("team", "p"));
    let (state, reason, msg) = cond(&v, DRIFT_WITHIN_TOLERANCE);
    assert_eq!((state, reason), (State::False, Reason::OutsideTolerance));
    assert!(msg.contains("drift -50.0%"), "{msg}");
    assert_eq!(compared.map(|c| c.0), Some(500.0));
    let (v, compared) = drift(1000.0, 0.1, None, ("team", "p"));
    assert!(
        cond(&v, DRIFT_WITHIN_TOLERANCE)
            .2
            .contains("primus report --plan team/p")
    );
    assert!(compared.is_none());
    // A recorded figure no run can have (anyone with the status verb may write it) is named
    // as such, not taken for a missing measurement nor compared.
    let bad = Measurement {
        tokens_per_second_per_gpu: 1e308,
        source: "status.measured".into(),
    };
    let (v, compared) = drift(1000.0, 0.1, Some(bad), ("team", "p"));
    let (state, reason, msg) = cond(&v, DRIFT_WITHIN_TOLERANCE);
    assert_eq!((state, reason), (State::Unknown, Reason::NoMeasurement));
    assert!(
        msg.contains("1e308 tokens/s/GPU) is no figure a run can have"),
        "{msg}"
    );
    assert!(compared.is_none());
    assert_eq!(
        cond(
            &drift_unknown(&crate::drift::QueryError::Status {
                url: "u".into(),
                status: 503
            }),
            DRIFT_WITHIN_TOLERANCE
        )
        .1,
        Reason::QueryFailed
    );
}
