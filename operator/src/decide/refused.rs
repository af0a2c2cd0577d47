//! A write the API server refused (a benchmark pod Pod Security or a missing service account
//! rejects, a PyTorchJob an admission webhook denies, a status write it refuses): the step's
//! condition says so with the server's own reason and message, the plan is `Stalled`, and the
//! pass is tried again with the plan's error backoff (the cause is outside the plan: a policy,
//! a webhook, a service account someone may create).

use primus_oracle::calibrate::{Clamped, LINK_FACTOR_LIMIT, OP_RATIO_LIMIT};

use super::{Halt, Requeue, Step, downstream};
use crate::conditions::{BENCHMARKED, READY, RECONCILING, STALLED, State, Verdicts};
use crate::error::Refusal;
use crate::reason::Reason;

/// The step whose write was refused: its condition `False` with `reason` and the server's
/// answer, the later steps unknown, Stalled until the backoff runs out.
pub fn refused<T>(step: &'static str, reason: Reason, r: &Refusal) -> Step<T> {
    let message = r.to_string();
    let mut v = downstream(step, reason);
    v.set(step, State::False, reason, &message);
    let halt = Halt::stalled(reason, &message, Requeue::Backoff);
    Step::halt(v, halt)
}

/// The status write itself was refused: Ready, Reconciling and Stalled say so (written by the
/// narrower patch that may still pass), with the server's answer.
pub fn status_refused(r: &Refusal) -> Verdicts {
    let message = r.to_string();
    let reason = Reason::StatusWriteRefused;
    Verdicts::default()
        .with(READY, State::False, reason, &message)
        .with(RECONCILING, State::False, reason, reason.waiting_for())
        .with(STALLED, State::True, reason, &message)
}

/// The plan asks for a benchmark image the operator's allow-list does not name: Stalled until
/// the plan (or the operator's configuration, which restarts it) changes.
pub fn image_not_allowed<T>(image: &str, allowed: &[String]) -> Step<T> {
    let reason = Reason::ImageNotAllowed;
    let message = format!(
        "spec.benchmark.image {image:?} is not allowed by the operator (allowed: {}); use one of these or ask the operator's administrators to add it (--bench-image-allow)",
        allowed.join(", ")
    );
    let mut v = downstream(BENCHMARKED, reason);
    v.set(BENCHMARKED, State::False, reason, &message);
    Step::halt(v, Halt::stalled(reason, &message, Requeue::OnChange))
}

/// A report used with measurements beyond their band, clamped: Benchmarked stays True, with
/// reason `RatiosClamped` saying how many and that the report is suspect.
pub fn clamped(report: &str, n: Clamped) -> Option<Verdicts> {
    if !n.any() {
        return None;
    }
    let message = format!(
        "BenchmarkReport {report}: {} of {} op ratios (measured / analytic) outside [1/{OP_RATIO_LIMIT}, {OP_RATIO_LIMIT}] and {} of {} collective factors outside [1/{LINK_FACTOR_LIMIT}, {LINK_FACTOR_LIMIT}] were clamped; the measurement is suspect (a throttled or shared GPU, a broken clock, an edited report): delete the report to benchmark again",
        n.ops, n.of_ops, n.collectives, n.of_collectives
    );
    Some(Verdicts::default().with(BENCHMARKED, State::True, Reason::RatiosClamped, message))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::{BENCHMARKED, JOB_CREATED, TUNED};
    use crate::decide::Next;

    fn refusal() -> Refusal {
        Refusal {
            what: "create pod team/p-bench-1".into(),
            code: 403,
            reason: "Forbidden".into(),
            message: "pods \"p-bench-1\" is forbidden: error looking up service account team/bench: serviceaccount \"bench\" not found".into(),
        }
    }

    #[test]
    fn a_refused_pod_stalls_the_plan_with_the_servers_reason() {
        let s: Step<()> = refused(BENCHMARKED, Reason::BenchmarkPodRefused, &refusal());
        let b = s.conditions.get(BENCHMARKED).unwrap();
        assert_eq!(
            (b.state, b.reason),
            (State::False, Reason::BenchmarkPodRefused)
        );
        assert!(b.message.contains("(Forbidden, 403)"), "{}", b.message);
        assert!(b.message.contains("serviceaccount \"bench\" not found"));
        assert_eq!(s.conditions.get(TUNED).unwrap().state, State::Unknown);
        let Next::Halt(h) = s.next else {
            panic!("a refusal ends the pass")
        };
        assert_eq!(h.requeue, Requeue::Backoff);
        assert!(h.conditions.is_true(STALLED));
        assert_eq!(h.phase, primus_crds::Phase::Stalled);
    }

    #[test]
    fn an_image_off_the_list_stalls_and_clamps_are_reported() {
        let s: Step<()> = image_not_allowed("evil/miner:1", &["primus:test".into()]);
        let b = s.conditions.get(BENCHMARKED).unwrap();
        assert_eq!(b.reason, Reason::ImageNotAllowed);
        assert!(b.message.contains("\"evil/miner:1\"") && b.message.contains("primus:test"));
        let Next::Halt(h) = s.next else { panic!() };
        assert_eq!(h.requeue, Requeue::OnChange);
        assert!(clamped("r", Clamped::default()).is_none());
        let n = Clamped {
            ops: 3,
            of_ops: 40,
            collectives: 0,
            of_collectives: 4,
        };
        let v = clamped("r", n).unwrap();
        let b = v.get(BENCHMARKED).unwrap();
        assert_eq!((b.state, b.reason), (State::True, Reason::RatiosClamped));
        assert!(b.message.contains("3 of 40 op ratios"), "{}", b.message);
    }

    #[test]
    fn a_refused_job_names_the_job_condition() {
        let mut r = refusal();
        r.what = "create pytorchjob team/p".into();
        r.reason = String::new();
        r.code = 400;
        r.message = "admission webhook \"deny.test\" denied the request: no".into();
        let s: Step<()> = refused(JOB_CREATED, Reason::JobRefused, &r);
        let j = s.conditions.get(JOB_CREATED).unwrap();
        assert_eq!(j.reason, Reason::JobRefused);
        assert!(j.message.contains("(Failure, 400)"), "{}", j.message);
        let v = status_refused(&r);
        assert!(v.is_true(STALLED));
        assert_eq!(v.get(READY).unwrap().reason, Reason::StatusWriteRefused);
    }
}
