//! The test-bed script's own contract: bad invocations give one clear line and the right exit
//! code, `down` with nothing running and `up` twice are harmless, and nothing hangs. Uses a
//! private state directory, so it never touches the test bed the other tests run against.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use primus_tests::{TestBed, loud, repo_root};

fn script(state: &Path, args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new("timeout")
        .arg("120")
        .arg(repo_root().join("tests/testbed/testbed.sh"))
        .args(args)
        .env("PRIMUS_TESTBED_DIR", state)
        // An empty CRD directory: this test is about the script, not the CRDs.
        .env("PRIMUS_TESTBED_CRDS", state.join("no-crds"))
        .output()
        .expect("run testbed.sh");
    (out, started.elapsed())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn bad_invocations_give_one_line_and_exit_2() {
    let state = tempdir("bad");
    for args in [&[][..], &["frobnicate"][..], &["up", "--now"][..]] {
        let (out, took) = script(&state, args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: one line, got {err:?}"
        );
        assert!(err.contains("usage"), "{args:?}: {err}");
        assert!(took < Duration::from_secs(5), "{args:?} took {took:?}");
    }
}

#[test]
fn down_status_and_env_with_nothing_running() {
    let state = tempdir("idle");
    let (out, _) = script(&state, &["down"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not running"),
        "{}",
        text(&out.stderr)
    );
    for cmd in ["status", "env"] {
        let (out, _) = script(&state, &[cmd]);
        assert_eq!(out.status.code(), Some(3), "{cmd}: {}", text(&out.stderr));
    }
}

#[test]
fn up_twice_then_down_twice() {
    // Starting a second control plane needs the installed binaries: only under the README's
    // test command (which installs them) or where they are already cached.
    if TestBed::find().is_err() && !TestBed::required() {
        loud(
            "\n!!!! SKIPPING testbed_script::up_twice_then_down_twice — no test bed installed here\n",
        );
        return;
    }
    let state = tempdir("updown");
    let (first, took) = script(&state, &["up"]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first.stderr));
    assert!(took < Duration::from_secs(90), "up took {took:?}");
    assert!(state.join("kubeconfig").exists());
    let (second, took) = script(&state, &["up"]);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second.stderr));
    assert!(
        text(&second.stderr).contains("already running"),
        "{}",
        text(&second.stderr)
    );
    assert!(took < Duration::from_secs(5), "second up took {took:?}");
    let (status, _) = script(&state, &["status"]);
    assert_eq!(status.status.code(), Some(0));
    let (down, _) = script(&state, &["down"]);
    assert_eq!(down.status.code(), Some(0), "{}", text(&down.stderr));
    let (again, _) = script(&state, &["down"]);
    assert_eq!(again.status.code(), Some(0));
    assert!(
        text(&again.stderr).contains("not running"),
        "{}",
        text(&again.stderr)
    );
    let (status, _) = script(&state, &["status"]);
    assert_eq!(status.status.code(), Some(3));
}

fn tempdir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("primus-tb-script-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("no-crds")).expect("temp dir");
    dir
}
