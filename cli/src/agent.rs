//! The tuning agent's transport, [`ChatCompletions`]: shared with the operator, so it lives in
//! `primus-runtime` ([`primus_runtime::agent`]); re-exported here for the CLI's users.

pub use primus_runtime::agent::*;
