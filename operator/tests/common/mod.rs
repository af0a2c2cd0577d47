//! Shared harness of the operator's end-to-end tests against the real test bed: the operator
//! binary as a child process (one per test, scoped to the test's namespace, with its own
//! Lease), its /metrics over plain HTTP, and polling helpers with timeouts.

#![allow(dead_code)]

use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use primus_crds::TrainingPlan;
use primus_tests::{TestBed, repo_root};

/// A tokio runtime for a test's async checks.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Poll `f` every 50 ms until it returns `Some`, or panic after `timeout` naming `what`.
pub async fn poll<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The PyTorchJob resource.
pub fn pytorchjobs() -> ApiResource {
    ApiResource {
        group: "kubeflow.org".into(),
        version: "v1".into(),
        api_version: "kubeflow.org/v1".into(),
        kind: "PyTorchJob".into(),
        plural: "pytorchjobs".into(),
    }
}

pub fn jobs_api(client: &kube::Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &pytorchjobs())
}

/// Make sure the PyTorchJob CRD is installed (the test bed applies crds/thirdparty/ at start;
/// applying it again is a no-op).
pub fn ensure_pytorchjob_crd(tb: &TestBed) {
    ensure_crd(
        tb,
        "pytorchjobs.kubeflow.org",
        "crds/thirdparty/kubeflow.org_pytorchjobs.yaml",
    );
}

/// Make sure Kubeflow Trainer v2's TrainJob CRD is installed.
pub fn ensure_trainjob_crd(tb: &TestBed) {
    ensure_crd(
        tb,
        "trainjobs.trainer.kubeflow.org",
        "crds/thirdparty/trainer.kubeflow.org_trainjobs.yaml",
    );
}

fn ensure_crd(tb: &TestBed, name: &str, file: &str) {
    let k = tb.kubectl();
    // Only when it is missing: an update makes the API server rebuild the resource's storage,
    // and requests in flight meanwhile may see 404s.
    if k.run(&["get", "crd", name]).status.success() {
        return;
    }
    let file = repo_root().join(file);
    k.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=primus-operator-tests",
        "-f",
        file.to_str().unwrap(),
    ]);
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        &format!("crd/{name}"),
    ]);
}

/// A condition of a plan.
pub fn condition<'a>(plan: &'a TrainingPlan, type_: &str) -> Option<&'a Condition> {
    plan.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

/// Whether a plan's condition has the given status.
pub fn has(plan: &TrainingPlan, type_: &str, status: &str) -> bool {
    condition(plan, type_).is_some_and(|c| c.status == status)
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One GET over HTTP/1.0: (status code, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// The value of one series in a metrics text (`name{labels}` exactly as exposed).
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// The operator binary as a child process.
pub struct Operator {
    child: Option<Child>,
    pub name: String,
    pub port: u16,
    pub log: PathBuf,
}

/// Settings of one operator process.
pub struct OperatorArgs<'a> {
    pub namespace: &'a str,
    pub lease: &'a str,
    pub kubeconfig: Option<&'a Path>,
    pub extra: Vec<String>,
}

impl Operator {
    /// [`Operator::start`] for `namespace` with the tests' lease, this process's kubeconfig and
    /// `extra` flags, once it leads (within 60 s).
    pub fn start_leading(
        tb: &TestBed,
        name: &str,
        namespace: &str,
        extra: Vec<String>,
    ) -> Operator {
        let mut op = Operator::start(
            tb,
            name,
            OperatorArgs {
                namespace,
                lease: "primus-operator-test",
                kubeconfig: None,
                extra,
            },
        );
        op.wait_leading(Duration::from_secs(60));
        op
    }

    /// Start `primus-operator` for `namespace` with a short lease (fast failover in tests).
    pub fn start(tb: &TestBed, name: &str, args: OperatorArgs<'_>) -> Operator {
        let port = free_port();
        let log =
            std::env::temp_dir().join(format!("primus-operator-{}-{name}.log", args.namespace));
        let out = std::fs::File::create(&log).expect("operator log file");
        let err = out.try_clone().expect("operator log file");
        let child = Command::new(env!("CARGO_BIN_EXE_primus-operator"))
            .args([
                "--namespace",
                args.namespace,
                "--lease-namespace",
                args.namespace,
                "--lease-name",
                args.lease,
                "--identity",
                name,
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--bench-image",
                "primus:test",
                "--lease-duration-seconds",
                "3",
                "--renew-deadline-seconds",
                "2",
                "--retry-period-seconds",
                "0.5",
                "--log-format",
                "json",
            ])
            .args(&args.extra)
            .env("KUBECONFIG", args.kubeconfig.unwrap_or(&tb.kubeconfig))
            .env("RUST_LOG", "info,primus_operator=debug")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("start primus-operator");
        Operator {
            child: Some(child),
            name: name.to_string(),
            port,
            log,
        }
    }

    /// The operator's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its /metrics text, when it answers.
    pub fn metrics(&self) -> Option<String> {
        http_get(self.port, "/metrics")
            .filter(|(c, _)| *c == 200)
            .map(|(_, b)| b)
    }

    /// Whether it currently leads (`primus_operator_leader 1`).
    pub fn leading(&self) -> bool {
        self.metrics()
            .and_then(|m| metric(&m, "primus_operator_leader"))
            == Some(1.0)
    }

    /// Reconcile passes it finished successfully.
    pub fn reconciles(&self) -> f64 {
        self.metrics()
            .and_then(|m| metric(&m, "primus_reconcile_duration_seconds_count{result=\"ok\"}"))
            .unwrap_or(0.0)
    }

    /// Wait until it leads.
    pub fn wait_leading(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.leading() {
            assert!(
                self.running(),
                "operator {} exited:\n{}",
                self.name,
                self.log_text()
            );
            assert!(
                Instant::now() < deadline,
                "operator {} did not lead within {timeout:?}:\n{}",
                self.name,
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL (no clean-up: the lease stays until it expires).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for the exit (at most `timeout`); how long it took and the exit code.
    pub fn terminate(&mut self, timeout: Duration) -> (Duration, Option<i32>) {
        let Some(mut c) = self.child.take() else {
            return (Duration::ZERO, None);
        };
        let start = Instant::now();
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        loop {
            if let Ok(Some(s)) = c.try_wait() {
                return (start.elapsed(), s.code());
            }
            if start.elapsed() > timeout {
                let _ = c.kill();
                let _ = c.wait();
                return (start.elapsed(), None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let text = self.log_text();
            let start = text.len().saturating_sub(6000);
            let mut s = start;
            while !text.is_char_boundary(s) {
                s += 1;
            }
            primus_tests::loud(&format!(
                "\n---- operator {} log (last 6000 bytes of {}) ----\n{}\n",
                self.name,
                self.log.display(),
                &text[s..]
            ));
        }
    }
}

/// Read a plan.
pub async fn get_plan(client: &kube::Client, ns: &str, name: &str) -> Option<TrainingPlan> {
    let api: Api<TrainingPlan> = Api::namespaced(client.clone(), ns);
    api.get_opt(name).await.ok().flatten()
}

/// The example plan's text.
pub fn example(file: &str) -> String {
    std::fs::read_to_string(repo_root().join("examples").join(file)).expect("example exists")
}
