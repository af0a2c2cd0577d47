//! Errors of one reconcile pass. Invalid input is not an error here: it becomes a `Stalled`
//! condition. What remains are transient failures (API calls, timeouts, Prometheus) that the
//! controller retries with backoff.

use std::time::Duration;

/// A transient failure of a reconcile pass.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a call.
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// A call got no answer in time.
    #[error("{what}: no answer within {after:?}")]
    Timeout { what: String, after: Duration },
    /// An object could not be (de)serialized.
    #[error("{what}: {source}")]
    Serde {
        what: String,
        #[source]
        source: serde_json::Error,
    },
    /// The tuning task panicked or was cancelled.
    #[error("tuning task: {0}")]
    Task(String),
    /// An object lacks a field the API server always sets.
    #[error("{0} has no {1}")]
    Missing(String, &'static str),
}

impl Error {
    /// A short label for the `reason` of the reconcile-error counter.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube {
                source: kube::Error::Api(s),
                ..
            } if s.code == 409 => "conflict",
            Error::Kube {
                source: kube::Error::Api(_),
                ..
            } => "api",
            Error::Kube { .. } => "connection",
            Error::Timeout { .. } => "timeout",
            Error::Serde { .. } => "serialization",
            Error::Task(_) => "tuning",
            Error::Missing(..) => "object",
        }
    }

    pub fn kube(what: impl Into<String>, source: kube::Error) -> Error {
        Error::Kube {
            what: what.into(),
            source,
        }
    }
}

/// Most characters of the API server's message a condition quotes.
pub const REFUSAL_MESSAGE_CHARS: usize = 400;

/// The API server's answer to a write it refused: its reason (`Forbidden`, `Invalid`,
/// `Conflict`, ...), the HTTP code and its message, as a condition quotes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// What was attempted (`create pod team/p-bench-1a2b-1`).
    pub what: String,
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let reason = if self.reason.is_empty() {
            "Failure"
        } else {
            &self.reason
        };
        write!(
            f,
            "the API server refused to {} ({reason}, {}): {}",
            self.what, self.code, self.message
        )
    }
}

impl Error {
    /// The refusal, when the API server answered the call with an error status (not for
    /// timeouts and broken connections: those are retried silently with backoff).
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Kube {
                what,
                source: kube::Error::Api(s),
            } => Some(Refusal {
                what: what.clone(),
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.chars().take(REFUSAL_MESSAGE_CHARS).collect(),
            }),
            _ => None,
        }
    }
}

/// Whether a Kubernetes error is a 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether a Kubernetes error is a 409 (already exists, or a resourceVersion conflict).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}
