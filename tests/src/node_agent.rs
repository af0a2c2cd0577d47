//! A test-side "node agent" that plays the kubelet for benchmark pods (DESIGN.md section 6):
//! the test bed has no kubelet, so pods stay Pending unless someone runs them. The agent polls
//! the pods of one namespace (label-selected), runs each new pod's container command as a local
//! process (`primus` mapped to the binary cargo built, with the container's environment plus
//! `KUBECONFIG` and `NODE_NAME`), and writes the pod's status through the status subresource:
//! Running with a running container status, then Succeeded or Failed with the exit code. It
//! honours `activeDeadlineSeconds` (reason `DeadlineExceeded`) and can be told to kill a pod's
//! process, to kill every new pod (to exercise retries), or to hold new pods until released.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use tokio::sync::Notify;

use crate::TestBed;

/// What the agent does with a new pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Run its command to the end.
    Run,
    /// Start its command and kill it at once (SIGKILL): the pod fails with exit code 137.
    Kill,
    /// Leave it Pending until the policy changes.
    Hold,
}

/// One process the agent ran for a pod.
#[derive(Debug, Clone)]
pub struct Run {
    pub pod: String,
    pub started: Instant,
    pub finished: Option<Instant>,
    pub exit_code: Option<i32>,
    /// Combined stdout and stderr of the process.
    pub log: PathBuf,
}

impl Run {
    /// How long the process ran (so far).
    pub fn duration(&self) -> Duration {
        self.finished
            .unwrap_or_else(Instant::now)
            .duration_since(self.started)
    }
}

struct Shared {
    policy: Mutex<Policy>,
    runs: Mutex<Vec<Run>>,
    kills: Mutex<HashMap<String, Arc<Notify>>>,
    stop: Notify,
    wake: Notify,
}

/// The agent; it stops (and kills its processes) when dropped.
pub struct NodeAgent {
    shared: Arc<Shared>,
    node: String,
    runtime: Option<tokio::runtime::Runtime>,
}

/// Where cargo put the binaries of this build (`target/<profile>`): the test executable lives
/// in `target/<profile>/deps`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PRIMUS_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("the test executable has a path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test executable is in target/<profile>/deps")
        .to_path_buf()
}

/// A binary of this workspace built by cargo (`primus`, `primus-operator`), next to the test
/// executable. `cargo test --workspace` builds them (the oracle's and the operator's
/// integration tests need them); a lone `cargo test -p ...` may not, hence the message.
pub fn binary(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it first (`cargo build -p {} --bin {name}`, or run `cargo test --workspace`)",
        path.display(),
        match name {
            "primus" => "primus-cli",
            other => other,
        }
    );
    path
}

fn now() -> serde_json::Value {
    serde_json::to_value(Time(Timestamp::now())).unwrap_or(serde_json::Value::Null)
}

impl NodeAgent {
    /// Start playing the kubelet for pods in `namespace` matching `selector` (a label selector,
    /// e.g. `app.kubernetes.io/component=benchmark`); the processes use the test bed's admin
    /// kubeconfig.
    pub fn start(tb: &TestBed, namespace: &str, selector: &str) -> NodeAgent {
        NodeAgent::start_with(tb, &tb.kubeconfig, namespace, selector)
    }

    /// [`NodeAgent::start`], the processes acting with `process_kubeconfig` (e.g. a service
    /// account's identity) while the agent itself, like a kubelet, reads pods and their
    /// Secrets and writes pod status with the test bed's admin identity.
    pub fn start_with(
        tb: &TestBed,
        process_kubeconfig: &Path,
        namespace: &str,
        selector: &str,
    ) -> NodeAgent {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("node agent runtime");
        let shared = Arc::new(Shared {
            policy: Mutex::new(Policy::Run),
            runs: Mutex::new(Vec::new()),
            kills: Mutex::new(HashMap::new()),
            stop: Notify::new(),
            wake: Notify::new(),
        });
        let node = format!("testbed-node-{namespace}");
        let client = runtime.block_on(tb.client());
        let cfg = Config {
            namespace: namespace.to_string(),
            selector: selector.to_string(),
            node: node.clone(),
            kubeconfig: process_kubeconfig.to_path_buf(),
            primus: binary("primus"),
            logs: std::env::temp_dir().join(format!("primus-node-agent-{namespace}")),
        };
        let _ = std::fs::create_dir_all(&cfg.logs);
        runtime.spawn(poll_loop(client, Arc::new(cfg), shared.clone()));
        NodeAgent {
            shared,
            node,
            runtime: Some(runtime),
        }
    }

    /// The node name the agent reports (`NODE_NAME` of the processes).
    pub fn node_name(&self) -> &str {
        &self.node
    }

    /// Change what happens to new pods (and, from `Hold`, release the held ones).
    pub fn set_policy(&self, p: Policy) {
        *self.shared.policy.lock().unwrap_or_else(|e| e.into_inner()) = p;
        self.shared.wake.notify_one();
    }

    /// Kill the process of a running pod; false when there is none.
    pub fn kill(&self, pod: &str) -> bool {
        let kills = self.shared.kills.lock().unwrap_or_else(|e| e.into_inner());
        match kills.get(pod) {
            Some(n) => {
                n.notify_one();
                true
            }
            None => false,
        }
    }

    /// The processes run so far.
    pub fn runs(&self) -> Vec<Run> {
        self.shared
            .runs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for NodeAgent {
    fn drop(&mut self) {
        self.shared.stop.notify_waiters();
        {
            let kills = self.shared.kills.lock().unwrap_or_else(|e| e.into_inner());
            for n in kills.values() {
                n.notify_one();
            }
        }
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

struct Config {
    namespace: String,
    selector: String,
    node: String,
    kubeconfig: PathBuf,
    primus: PathBuf,
    logs: PathBuf,
}

async fn poll_loop(client: kube::Client, cfg: Arc<Config>, shared: Arc<Shared>) {
    let pods: Api<Pod> = Api::namespaced(client, &cfg.namespace);
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        let policy = *shared.policy.lock().unwrap_or_else(|e| e.into_inner());
        if policy != Policy::Hold {
            let lp = ListParams::default().labels(&cfg.selector);
            if let Ok(Ok(list)) =
                tokio::time::timeout(Duration::from_secs(10), pods.list(&lp)).await
            {
                for pod in list.items {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    let pending = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .is_none_or(|p| p == "Pending");
                    if pod.metadata.deletion_timestamp.is_some() || !pending || !seen.insert(uid) {
                        continue;
                    }
                    tokio::spawn(run_pod(
                        pods.clone(),
                        cfg.clone(),
                        shared.clone(),
                        pod,
                        policy,
                    ));
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = shared.wake.notified() => {}
            _ = shared.stop.notified() => return,
        }
    }
}

/// The container's command with `primus` mapped to the built binary.
fn command_of(pod: &Pod, primus: &Path) -> Option<(String, Vec<String>, String)> {
    let c = pod.spec.as_ref()?.containers.first()?;
    let mut argv: Vec<String> = c.command.clone().unwrap_or_default();
    argv.extend(c.args.clone().unwrap_or_default());
    let first = argv.first()?.clone();
    let program = if first == "primus" || first.ends_with("/primus") {
        primus.display().to_string()
    } else {
        first
    };
    Some((program, argv[1..].to_vec(), c.name.clone()))
}

/// The container's environment, with downward-API field references and Secret keys resolved
/// (a Secret is read with the agent's client, as a kubelet would; a missing one fails the pod
/// like a kubelet's CreateContainerConfigError).
async fn env_of(
    pod: &Pod,
    node: &str,
    secrets: &Api<Secret>,
) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let Some(c) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
        return Ok(out);
    };
    for e in c.env.clone().unwrap_or_default() {
        if let Some(v) = e.value {
            out.push((e.name, v));
            continue;
        }
        let Some(from) = e.value_from else { continue };
        if let Some(f) = from.field_ref {
            let v = match f.field_path.as_str() {
                "spec.nodeName" => node.to_string(),
                "metadata.name" => pod.metadata.name.clone().unwrap_or_default(),
                "metadata.namespace" => pod.metadata.namespace.clone().unwrap_or_default(),
                _ => continue,
            };
            out.push((e.name, v));
        } else if let Some(k) = from.secret_key_ref {
            let secret = secrets
                .get_opt(&k.name)
                .await
                .map_err(|err| format!("secret {}: {err}", k.name))?;
            let value = secret
                .and_then(|s| s.data)
                .and_then(|d| d.get(&k.key).map(|b| b.0.clone()));
            match value {
                Some(v) => out.push((e.name, String::from_utf8_lossy(&v).into_owned())),
                None if k.optional == Some(true) => {}
                None => return Err(format!("secret {} has no key {}", k.name, k.key)),
            }
        }
    }
    Ok(out)
}

async fn patch_status(pods: &Api<Pod>, name: &str, status: serde_json::Value) {
    let body = json!({ "status": status });
    let _ = tokio::time::timeout(
        Duration::from_secs(10),
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&body)),
    )
    .await;
}

fn tail(path: &Path, max: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let start = text.len().saturating_sub(max);
    let mut s = start;
    while !text.is_char_boundary(s) {
        s += 1;
    }
    text[s..].trim().to_string()
}

/// What the agent runs for a pod: the program, its arguments and environment, the container's
/// name and image, and the deadline.
struct Launch {
    program: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    container: String,
    image: String,
    deadline: Duration,
}

/// The pod's launch, or the reason the pod fails before it starts.
async fn launch_of(pod: &Pod, cfg: &Config, secrets: &Api<Secret>) -> Result<Launch, &'static str> {
    let (program, args, container) = command_of(pod, &cfg.primus).ok_or("NoCommand")?;
    let env = env_of(pod, &cfg.node, secrets)
        .await
        .map_err(|_| "CreateContainerConfigError")?;
    let spec = pod.spec.as_ref();
    Ok(Launch {
        program,
        args,
        env,
        container,
        image: spec
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default(),
        deadline: spec
            .and_then(|s| s.active_deadline_seconds)
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(Duration::from_secs(600)),
    })
}

async fn run_pod(pods: Api<Pod>, cfg: Arc<Config>, shared: Arc<Shared>, pod: Pod, policy: Policy) {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(pods.clone().into_client(), &cfg.namespace);
    let l = match launch_of(&pod, &cfg, &secrets).await {
        Ok(l) => l,
        Err(reason) => {
            let status = json!({"phase": "Failed", "reason": reason});
            return patch_status(&pods, &name, status).await;
        }
    };
    let started_at = now();
    patch_status(
        &pods,
        &name,
        json!({
            "phase": "Running",
            "startTime": started_at,
            "containerStatuses": [{
                "name": l.container, "image": l.image, "imageID": "", "ready": true,
                "restartCount": 0, "started": true,
                "state": {"running": {"startedAt": started_at}},
            }],
        }),
    )
    .await;
    let log = cfg.logs.join(format!("{name}.log"));
    let (code, reason) = execute(&l, &cfg, &shared, &name, &log, policy).await;
    let phase = if code == 0 { "Succeeded" } else { "Failed" };
    let mut status = json!({
        "phase": phase,
        "containerStatuses": [{
            "name": l.container, "image": l.image, "imageID": "", "ready": false,
            "restartCount": 0, "started": false,
            "state": {"terminated": {
                "exitCode": code, "reason": reason, "message": tail(&log, 1024),
                "startedAt": started_at, "finishedAt": now(),
            }},
        }],
    });
    if reason == "DeadlineExceeded" {
        status["reason"] = json!("DeadlineExceeded");
        status["message"] = json!("Pod was active on the node longer than the specified deadline");
    }
    patch_status(&pods, &name, status).await;
}

/// Run the pod's process (recorded in the agent's runs) until it exits, is killed or passes its
/// deadline: its exit code and the container's terminated reason.
async fn execute(
    l: &Launch,
    cfg: &Config,
    shared: &Shared,
    name: &str,
    log: &Path,
    policy: Policy,
) -> (i32, &'static str) {
    let out = std::fs::File::create(log).ok();
    let mut cmd = tokio::process::Command::new(&l.program);
    cmd.args(&l.args)
        .env("KUBECONFIG", &cfg.kubeconfig)
        .env("NODE_NAME", &cfg.node)
        .envs(l.env.iter().cloned())
        .stdin(Stdio::null())
        .kill_on_drop(true);
    match out.and_then(|f| f.try_clone().ok().map(|g| (f, g))) {
        Some((f, g)) => {
            cmd.stdout(f).stderr(g);
        }
        None => {
            cmd.stdout(Stdio::null()).stderr(Stdio::null());
        }
    }
    let started = Instant::now();
    let index = {
        let mut runs = shared.runs.lock().unwrap_or_else(|e| e.into_inner());
        runs.push(Run {
            pod: name.to_string(),
            started,
            finished: None,
            exit_code: None,
            log: log.to_path_buf(),
        });
        runs.len() - 1
    };
    let kill = Arc::new(Notify::new());
    shared
        .kills
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_string(), kill.clone());
    if policy == Policy::Kill {
        kill.notify_one();
    }
    let (code, reason) = match cmd.spawn() {
        Err(e) => {
            let _ = std::fs::write(log, format!("cannot start {}: {e}\n", l.program));
            (127, "StartError")
        }
        Ok(mut child) => {
            let remaining = l.deadline.saturating_sub(started.elapsed());
            tokio::select! {
                status = child.wait() => match status {
                    Ok(s) => match s.code() {
                        Some(0) => (0, "Completed"),
                        Some(c) => (c, "Error"),
                        None => (137, "Error"),
                    },
                    Err(_) => (1, "Error"),
                },
                _ = kill.notified() => {
                    let _ = child.kill().await;
                    (137, "Error")
                }
                _ = tokio::time::sleep(remaining) => {
                    let _ = child.kill().await;
                    (137, "DeadlineExceeded")
                }
            }
        }
    };
    shared
        .kills
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name);
    let mut runs = shared.runs.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(r) = runs.get_mut(index) {
        r.finished = Some(Instant::now());
        r.exit_code = Some(code);
    }
    (code, reason)
}
