//! What the CLI's integration tests share: the `primus` binary, a run that must succeed, the
//! example plans and plan files in a temporary directory.
// Each test file uses its own subset.
#![allow(dead_code)]

use assert_cmd::Command;

/// The `primus` binary of this build.
pub fn primus() -> Command {
    Command::cargo_bin("primus").expect("primus binary")
}

/// Run `primus ARGS`, fail the test with its stderr unless it succeeds, return its stdout.
pub fn primus_ok(args: &[&str]) -> String {
    let out = primus().args(args).output().expect("runs");
    assert!(
        out.status.success(),
        "primus {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The path of `examples/NAME`.
pub fn example(name: &str) -> String {
    format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// A temporary `.yaml` file holding `text`.
pub fn plan_file(text: &str) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::Builder::new().suffix(".yaml").tempfile().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}
