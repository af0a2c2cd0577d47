//! External tools the chart tests drive (helm, promtool, lua5.1): found on `PATH` or in the test
//! bed's binary cache (`tests/testbed/testbed.sh install` puts them in
//! `~/.cache/primus-testbed/bin`). Under the README's test command a missing tool is a failure;
//! a plain `cargo test` skips with a loud message.

use std::path::{Path, PathBuf};

fn cache_bin() -> PathBuf {
    let cache = std::env::var_os("PRIMUS_TESTBED_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/primus-testbed")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache/primus-testbed"));
    cache.join("bin")
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where `name` is: `PATH` first, then the test bed's cache.
pub fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(std::iter::once(cache_bin()))
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
}

/// `name`, or `None` after a loud skip message; panics when the tools are required
/// (`PRIMUS_REQUIRE_TESTBED=1`, set by `tests/run.sh`).
pub fn require(name: &str, test: &str) -> Option<PathBuf> {
    if let Some(p) = find(name) {
        return Some(p);
    }
    let why = format!(
        "{name} is not on PATH nor in {} (run `tests/testbed/testbed.sh install`)",
        cache_bin().display()
    );
    if crate::TestBed::required() {
        panic!("{test}: {why}");
    }
    crate::loud(&format!("\n!!!! SKIPPING {test} — {why}\n"));
    None
}
