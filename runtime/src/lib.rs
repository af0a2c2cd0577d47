//! What every `primus*` binary does the same way at start-up, written once: log set-up
//! ([`logging`]: JSON in a cluster, human-readable on a terminal), the process's one TLS
//! crypto provider ([`tls`]: rustls with ring, DESIGN.md section 7) and the parsing of
//! duration flags ([`flags`]: `--*-seconds`, a number of seconds).
//!
//! It also holds the tuning agent's one network client ([`agent`]: OpenAI-compatible chat
//! completions), which the CLI and the operator share.
//!
//! The operator, the webhook and the `primus` CLI depend on this crate; the oracle does not
//! (it never logs, never talks TLS and has no flags).

pub mod agent;
pub mod flags;
pub mod http;
pub mod logging;
pub mod tls;
