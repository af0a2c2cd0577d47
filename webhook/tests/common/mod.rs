//! Shared helpers of the webhook's tests: example jobs, AdmissionReview bodies, answers.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::{Cluster, Scenario, Training};
use primus_webhook::admission::{self, Endpoint};
use primus_webhook::validate::{Settings, Validator};
use serde_json::Value;

/// A scenario of built-in `model` and `gpu` on `gpus` GPUs, `gpus_per_node` of them per node,
/// sequence `seq`, global batch `gbs`.
pub fn scenario(
    model: &str,
    gpu: &str,
    gpus: u32,
    gpus_per_node: u32,
    seq: u64,
    gbs: u64,
    precision: Precision,
) -> Scenario {
    let c = Catalog::builtin().unwrap();
    Scenario {
        model: c.model(model).unwrap().clone(),
        hardware: c.hardware(gpu).unwrap().clone(),
        cluster: Cluster {
            gpus,
            gpus_per_node,
        },
        training: Training {
            seq_length: seq,
            global_batch_size: gbs,
            precision,
        },
    }
}

pub fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// An example manifest (webhook/examples/NAME.yaml) as JSON.
pub fn example(name: &str) -> Value {
    let path = examples_dir().join(format!("{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub fn validator() -> Validator {
    Validator::new(
        Catalog::builtin().expect("built-in profiles"),
        Settings::default(),
    )
}

pub fn strict_validator() -> Validator {
    Validator::new(
        Catalog::builtin().expect("built-in profiles"),
        Settings {
            strict: true,
            ..Settings::default()
        },
    )
}

/// The Megatron script of every replica's `pytorch` container.
pub fn script(job: &Value) -> String {
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"][0]
        .as_str()
        .expect("the example's script")
        .to_string()
}

/// Replace `from` by `to` in the Megatron script of every replica.
pub fn edit_script(job: &mut Value, from: &str, to: &str) {
    let specs = job["spec"]["pytorchReplicaSpecs"]
        .as_object_mut()
        .expect("replica specs");
    for (_, r) in specs.iter_mut() {
        let arg = &mut r["template"]["spec"]["containers"][0]["args"][0];
        let s = arg.as_str().expect("script").to_string();
        assert!(s.contains(from), "the script has no {from:?}: {s}");
        *arg = Value::String(s.replace(from, to));
    }
}

/// Set the environment of every replica's `pytorch` container to `env` (a JSON list of
/// `{name, value}`).
pub fn set_env(job: &mut Value, env: Value) {
    let specs = job["spec"]["pytorchReplicaSpecs"]
        .as_object_mut()
        .expect("replica specs");
    for (_, r) in specs.iter_mut() {
        r["template"]["spec"]["containers"][0]["env"] = env.clone();
    }
}

/// Set the parallelism flags of an example job (replacing the example's own).
pub fn set_layout_flags(job: &mut Value, flags: &str) {
    let specs = job["spec"]["pytorchReplicaSpecs"]
        .as_object_mut()
        .expect("replica specs");
    for (_, r) in specs.iter_mut() {
        let arg = &mut r["template"]["spec"]["containers"][0]["args"][0];
        let s = arg.as_str().expect("script").to_string();
        let start = s.find("--tensor-model-parallel-size").expect("TP flag");
        let end = s.find("--train-iters").expect("end of the parallel flags");
        *arg = Value::String(format!("{}{} {}", &s[..start], flags, &s[end..]));
    }
}

pub fn set_name(job: &mut Value, name: &str) {
    job["metadata"]["name"] = Value::String(name.to_string());
}

/// An AdmissionReview body for a CREATE (or UPDATE with `old`).
pub fn review(job: &Value, old: Option<&Value>, dry_run: bool) -> Vec<u8> {
    let op = if old.is_some() { "UPDATE" } else { "CREATE" };
    let r = admission::review_for(job, op, old, dry_run, "3f1c-test-uid");
    serde_json::to_vec(&r).expect("serializes")
}

/// Answer a body: (HTTP status, the AdmissionReview answer).
pub fn answer(v: &Validator, ep: Endpoint, body: &[u8]) -> (u16, Value) {
    let reply = admission::handle(v, ep, body, Instant::now() + Duration::from_secs(2));
    let json: Value = serde_json::from_slice(&reply.body).expect("the answer is JSON");
    (reply.status, json)
}

pub const PYTORCHJOB: Endpoint = Endpoint::PyTorchJob { strict: false };
pub const PYTORCHJOB_STRICT: Endpoint = Endpoint::PyTorchJob { strict: true };

pub fn allowed(a: &Value) -> bool {
    a["response"]["allowed"]
        .as_bool()
        .expect("response.allowed")
}

pub fn message(a: &Value) -> String {
    a["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

pub fn warnings(a: &Value) -> Vec<String> {
    a["response"]["warnings"]
        .as_array()
        .map(|w| {
            w.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

// ------------------------------------------------------------------ the webhook process

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};

use primus_webhook::client::{Answer, Connection, client_config};

/// Run a future to completion on a fresh current-thread runtime.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(f)
}

/// A free loopback port (bound and released; the webhook binds it right after).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A `primus-webhook` process started by a test, stopped (SIGTERM, then SIGKILL) on drop.
pub struct WebhookProcess {
    pub child: Option<Child>,
    pub port: u16,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
}

impl WebhookProcess {
    /// Start the binary on 127.0.0.1:PORT with `args` (plus `--listen`); logs go to a file in
    /// the process's temp dir. `env` is added to the environment.
    pub fn start(args: &[&str], env: &[(&str, &str)]) -> WebhookProcess {
        WebhookProcess::start_in(tempfile::tempdir().expect("temp dir"), args, env)
    }

    /// Start on a given port.
    pub fn start_on(port: u16, args: &[&str], env: &[(&str, &str)]) -> WebhookProcess {
        WebhookProcess::start_at(tempfile::tempdir().expect("temp dir"), port, args, env)
    }

    fn start_in(dir: tempfile::TempDir, args: &[&str], env: &[(&str, &str)]) -> WebhookProcess {
        WebhookProcess::start_at(dir, free_port(), args, env)
    }

    fn start_at(
        dir: tempfile::TempDir,
        port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> WebhookProcess {
        let log = dir.path().join("webhook.log");
        let log_file = std::fs::File::create(&log).expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_primus-webhook"));
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(args)
            .env("RUST_LOG", "info,primus_webhook=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("primus-webhook starts");
        WebhookProcess {
            child: Some(child),
            port,
            dir,
            log,
        }
    }

    /// Start in self-signed mode, writing the certificates to its temp dir (`ca.crt` etc.).
    pub fn self_signed(extra: &[&str], env: &[(&str, &str)]) -> WebhookProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let certs = dir.path().join("certs");
        let certs_s = certs.display().to_string();
        let mut args = vec!["--self-signed", "--cert-dir", certs_s.as_str()];
        args.extend_from_slice(extra);
        WebhookProcess::start_in(dir, &args, env)
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// The CA (self-signed mode), waiting for the file.
    pub fn ca(&self) -> Vec<u8> {
        let path = self.dir.path().join("certs/ca.crt");
        primus_tests::wait_for(Duration::from_secs(20), "the webhook's ca.crt", || {
            std::fs::read(&path).ok().filter(|b| !b.is_empty())
        })
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait until `GET /readyz` answers 200 over TLS trusting `ca`.
    pub fn wait_ready(&mut self, ca: &[u8]) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("primus-webhook exited with {status}:\n{}", self.logs());
            }
            if let Ok(a) = https(self.addr(), ca, "GET", "/readyz", None)
                && a.status == 200
            {
                return;
            }
            if Instant::now() > deadline {
                panic!("primus-webhook not ready after 30 s:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGTERM and wait (up to `timeout`) for the exit status.
    pub fn stop(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for WebhookProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One HTTPS request on a fresh connection trusting `ca`.
pub fn https(
    addr: SocketAddr,
    ca: &[u8],
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<Answer, String> {
    let config = client_config(ca).map_err(|e| e.to_string())?;
    block_on(async move {
        let mut c = Connection::open(addr, "127.0.0.1", config)
            .await
            .map_err(|e| e.to_string())?;
        c.request(method, path, body.map(Into::into))
            .await
            .map_err(|e| e.to_string())
    })
}

/// Write PEM files.
pub fn write(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}
