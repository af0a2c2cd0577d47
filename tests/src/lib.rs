//! Support for integration tests against the project's real test bed (kube-apiserver + etcd +
//! kube-controller-manager on loopback, started by `tests/testbed/testbed.sh up`).
//!
//! A test asks for the test bed with [`testbed!`]. Under the README's test command
//! (`tests/run.sh`, which sets `PRIMUS_REQUIRE_TESTBED=1`) a missing test bed is a failure;
//! a plain `cargo test` outside it skips those tests with a loud message instead.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub mod chat;
pub mod deny_webhook;
pub mod hostile;
pub mod kubectl;
pub mod llm;
pub mod node_agent;
pub mod tools;
pub use kubectl::Kubectl;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The running test bed: where its kubeconfig is.
#[derive(Debug, Clone)]
pub struct TestBed {
    /// Path of the admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// Path of the test bed's CA certificate (the API server's serving CA).
    pub ca: Option<PathBuf>,
}

fn state_dir() -> PathBuf {
    std::env::var_os("PRIMUS_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/primus-testbed"))
}

impl TestBed {
    /// Find the running test bed, or explain why there is none.
    pub fn find() -> Result<TestBed, String> {
        let kubeconfig = std::env::var_os("PRIMUS_TESTBED_KUBECONFIG")
            .map(PathBuf::from)
            .unwrap_or_else(|| state_dir().join("kubeconfig"));
        if !kubeconfig.exists() {
            return Err(format!(
                "no test bed kubeconfig at {} (start one with `tests/testbed/testbed.sh up`, or run `tests/run.sh`)",
                kubeconfig.display()
            ));
        }
        let ca = std::env::var_os("PRIMUS_TESTBED_CA")
            .map(PathBuf::from)
            .or_else(|| Some(state_dir().join("certs/ca.crt")))
            .filter(|p| p.exists());
        Ok(TestBed { kubeconfig, ca })
    }

    /// Whether the README's test command requires the test bed (then a missing one fails).
    pub fn required() -> bool {
        std::env::var("PRIMUS_REQUIRE_TESTBED").is_ok_and(|v| v == "1")
    }

    /// A kube client for the admin kubeconfig.
    pub async fn client(&self) -> kube::Client {
        install_crypto_provider();
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig parses");
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .expect("kubeconfig is usable");
        kube::Client::try_from(config).expect("client builds")
    }

    /// `kubectl` against the test bed.
    pub fn kubectl(&self) -> Kubectl {
        Kubectl::new(&self.kubeconfig)
    }

    /// A fresh namespace for one test, deleted (without waiting) when the guard drops.
    pub fn namespace(&self, prefix: &str) -> TestNamespace {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "{}-{}-{seq}-{:x}",
            prefix.to_lowercase().replace('_', "-"),
            std::process::id(),
            nanos & 0xffff
        );
        let out = self.kubectl().run(&["create", "namespace", &name]);
        assert!(
            out.status.success(),
            "create namespace {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Pods are admitted only once the namespace's default service account exists.
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let sa = self
                .kubectl()
                .run(&["get", "serviceaccount", "default", "-n", &name]);
            if sa.status.success() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        TestNamespace {
            name,
            kubeconfig: self.kubeconfig.clone(),
        }
    }
}

/// A namespace owned by one test.
#[derive(Debug)]
pub struct TestNamespace {
    pub name: String,
    kubeconfig: PathBuf,
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("PRIMUS_KEEP_NAMESPACES").is_some() {
            eprintln!("keeping namespace {} (PRIMUS_KEEP_NAMESPACES)", self.name);
            return;
        }
        let _ = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["delete", "namespace", &self.name, "--wait=false"])
            .output();
    }
}

/// Install rustls' ring provider once (the project's single TLS stack).
pub use primus_runtime::tls::install_ring_provider as install_crypto_provider;

/// Get the test bed or skip the test: `let Some(tb) = primus_tests::testbed!() else { return };`
/// Skipping is loud, and only allowed outside the README's test command.
#[macro_export]
macro_rules! testbed {
    () => {
        match $crate::TestBed::find() {
            Ok(tb) => Some(tb),
            Err(why) if !$crate::TestBed::required() => {
                $crate::loud(&format!(
                    "\n!!!! SKIPPING {} — {why}\n!!!! (tests/run.sh runs it against a real API server)\n",
                    module_path!()
                ));
                None
            }
            Err(why) => panic!("the test bed is required (PRIMUS_REQUIRE_TESTBED=1): {why}"),
        }
    };
}

/// Write straight to the process's stderr, past libtest's output capture, so a skip is seen.
pub fn loud(message: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(message.as_bytes());
}

/// Poll `f` every 100 ms until it returns `Some`, or fail after `timeout` with `what`.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Stdout of a command as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Stderr of a command as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
