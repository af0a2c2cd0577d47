//! What every `primus*` binary does the same way at start-up, written once: log set-up
//! ([`logging`]: JSON in a cluster, human-readable on a terminal), the process's one TLS
//! crypto provider ([`tls`]: rustls with ring, DESIGN.md section 7) and the parsing of
//! duration flags ([`flags`]: `--*-seconds`, a number of seconds).
//!
//! The operator, the webhook and the `primus` CLI depend on this crate; the oracle does not
//! (it never logs, never talks TLS and has no flags).

pub mod flags;
pub mod http;
pub mod logging;
pub mod tls;
