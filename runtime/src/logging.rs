//! Logs of the long-running binaries (operator, webhook): `tracing` events on stderr, one JSON
//! object per line where a log collector reads them (a pod's stderr is not a terminal), human
//! lines with colours on a terminal; `--log-format` overrides the choice and `RUST_LOG` the
//! level filter.

use std::io::IsTerminal;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// JSON when stderr is not a terminal, human-readable otherwise.
    #[default]
    Auto,
    /// One JSON object per line (fields flattened into the object).
    Json,
    /// Human-readable lines.
    Text,
}

impl LogFormat {
    /// Whether lines are JSON when stderr is (or is not) a terminal.
    pub fn is_json(self, stderr_is_terminal: bool) -> bool {
        match self {
            LogFormat::Json => true,
            LogFormat::Text => false,
            LogFormat::Auto => !stderr_is_terminal,
        }
    }
}

/// Install the global subscriber: the level filter from `RUST_LOG`, else `default_filter`
/// (an `EnvFilter` directive such as `info,kube_runtime=warn`); colours only on a terminal.
pub fn init(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let terminal = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(terminal)
        .with_writer(std::io::stderr);
    if format.is_json(terminal) {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_is_json_off_a_terminal_and_text_on_one() {
        assert!(LogFormat::Auto.is_json(false));
        assert!(!LogFormat::Auto.is_json(true));
        for terminal in [false, true] {
            assert!(LogFormat::Json.is_json(terminal));
            assert!(!LogFormat::Text.is_json(terminal));
        }
    }
}
