//! Status conditions: kstatus `Ready`, `Reconciling`, `Stalled` and the domain conditions of
//! DESIGN.md section 3. Each carries a reason, a message and the generation it describes; its
//! `lastTransitionTime` changes only when its status flips (True / False / Unknown), so a
//! re-run that reaches the same verdict writes byte-identical conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use crate::reason::Reason;

pub const READY: &str = "Ready";
pub const RECONCILING: &str = "Reconciling";
pub const STALLED: &str = "Stalled";
pub const BENCHMARKED: &str = "Benchmarked";
pub const PROJECTED: &str = "Projected";
pub const TUNED: &str = "Tuned";
pub const JOB_CREATED: &str = "JobCreated";
pub const DRIFT_WITHIN_TOLERANCE: &str = "DriftWithinTolerance";

/// Every condition type, in the order the status lists them.
pub const ORDER: [&str; 8] = [
    READY,
    RECONCILING,
    STALLED,
    BENCHMARKED,
    PROJECTED,
    TUNED,
    JOB_CREATED,
    DRIFT_WITHIN_TOLERANCE,
];

/// Status of a condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    True,
    False,
    Unknown,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::True => "True",
            State::False => "False",
            State::Unknown => "Unknown",
        }
    }

    pub fn from_bool(b: bool) -> State {
        if b { State::True } else { State::False }
    }
}

/// A condition as one pass decides it (no time, no generation yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub type_: &'static str,
    pub state: State,
    pub reason: Reason,
    /// What happened, in words.
    pub message: String,
}

/// The conditions of one pass, by type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdicts {
    items: Vec<Verdict>,
}

impl Verdicts {
    /// Set (or replace) a condition.
    pub fn set(
        &mut self,
        type_: &'static str,
        state: State,
        reason: Reason,
        message: impl Into<String>,
    ) {
        self.put(Verdict {
            type_,
            state,
            reason,
            message: message.into(),
        });
    }

    /// [`Verdicts::set`], by value.
    pub fn with(
        mut self,
        type_: &'static str,
        state: State,
        reason: Reason,
        message: impl Into<String>,
    ) -> Verdicts {
        self.set(type_, state, reason, message);
        self
    }

    fn put(&mut self, v: Verdict) {
        match self.items.iter_mut().find(|c| c.type_ == v.type_) {
            Some(c) => *c = v,
            None => self.items.push(v),
        }
    }

    /// Set every condition of `other` (replacing those of the same type).
    pub fn extend(&mut self, other: Verdicts) {
        for v in other.items {
            self.put(v);
        }
    }

    pub fn get(&self, type_: &str) -> Option<&Verdict> {
        self.items.iter().find(|c| c.type_ == type_)
    }

    pub fn is_true(&self, type_: &str) -> bool {
        self.get(type_).is_some_and(|c| c.state == State::True)
    }

    /// The conditions as stored: known types in [`ORDER`], each keeping the previous
    /// `lastTransitionTime` unless its status flipped.
    pub fn merge(
        &self,
        previous: &[Condition],
        generation: Option<i64>,
        now: Timestamp,
    ) -> Vec<Condition> {
        let mut out = Vec::new();
        for type_ in ORDER {
            let Some(v) = self.get(type_) else { continue };
            let prev = previous.iter().find(|c| c.type_ == type_);
            let last_transition_time = match prev {
                Some(p) if p.status == v.state.as_str() => p.last_transition_time.clone(),
                _ => Time(now),
            };
            out.push(Condition {
                type_: type_.to_string(),
                status: v.state.as_str().to_string(),
                reason: v.reason.as_str().to_string(),
                // Never empty: an empty string reaches some API servers' validation as null.
                message: if v.message.is_empty() {
                    format!("{type_} is {}: {}", v.state.as_str(), v.reason)
                } else {
                    truncate(&v.message, 32 * 1024)
                },
                observed_generation: generation,
                last_transition_time,
            });
        }
        out
    }
}

/// The conditions whose status differs between `before` and `after` (including new ones).
pub fn flipped<'a>(before: &[Condition], after: &'a [Condition]) -> Vec<&'a Condition> {
    after
        .iter()
        .filter(|c| {
            before
                .iter()
                .find(|p| p.type_ == c.type_)
                .is_none_or(|p| p.status != c.status || p.reason != c.reason)
        })
        .collect()
}

/// Find a condition by type.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reason::Reason as R;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    #[test]
    fn transition_time_changes_only_on_a_flip() {
        let mut v = Verdicts::default();
        v.set(READY, State::False, R::Benchmarking, "waiting");
        let first = v.merge(&[], Some(1), t(100));
        assert_eq!(first[0].last_transition_time, Time(t(100)));

        // Same status, new reason and message: the time stays.
        v.set(READY, State::False, R::Tuning, "searching");
        let second = v.merge(&first, Some(2), t(200));
        assert_eq!(second[0].last_transition_time, Time(t(100)));
        assert_eq!(second[0].reason, "Tuning");
        assert_eq!(second[0].observed_generation, Some(2));

        // A flip moves it.
        v.set(READY, State::True, R::Ready, "done");
        let third = v.merge(&second, Some(2), t(300));
        assert_eq!(third[0].last_transition_time, Time(t(300)));

        // Re-running with the same verdicts is byte-identical.
        assert_eq!(v.merge(&third, Some(2), t(400)), third);

        // Empty messages are filled in.
        let mut e = Verdicts::default();
        e.set(STALLED, State::False, R::Ready, "");
        assert_eq!(
            e.merge(&[], None, t(1))[0].message,
            "Stalled is False: Ready"
        );
    }

    #[test]
    fn conditions_are_listed_in_a_fixed_order() {
        let mut v = Verdicts::default();
        v.set(TUNED, State::True, R::Tuned, "");
        v.set(READY, State::True, R::Ready, "");
        v.set(STALLED, State::False, R::Progressing, "");
        let types: Vec<_> = v
            .merge(&[], None, t(1))
            .into_iter()
            .map(|c| c.type_)
            .collect();
        assert_eq!(types, vec![READY, STALLED, TUNED]);
    }

    #[test]
    fn flips_are_reported_once() {
        let mut v = Verdicts::default();
        v.set(READY, State::False, R::Benchmarking, "");
        let a = v.merge(&[], None, t(1));
        assert_eq!(flipped(&[], &a).len(), 1);
        assert!(flipped(&a, &a).is_empty());
        v.set(READY, State::True, R::Ready, "");
        let b = v.merge(&a, None, t(2));
        assert_eq!(flipped(&a, &b).len(), 1);
    }
}
