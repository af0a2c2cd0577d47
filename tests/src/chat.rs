//! A scripted OpenAI-compatible chat-completions server for the tuning agent's tests (std::net,
//! one thread per connection). Each request gets the next [`Answer`] of its script (the last
//! repeats); [`Answer::Read`] reads the prompt like a model would: it takes the best layout the
//! agent showed (`1. ... json {...}` in the last user message) and changes one option the
//! exhaustive search does not search (an overlap switch, sequence parallelism, an uneven
//! split), so the loop is exercised end to end on what the agent actually sent.
//!
//! ```no_run
//! use primus_tests::chat::{Answer, ChatServer};
//! let server = ChatServer::start(vec![Answer::Read]);
//! // server.base_url() is `http://127.0.0.1:PORT/v1`; server.requests() what it received.
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use serde_json::{Value, json};

/// What the server answers to one request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Read the prompt: the best layout shown with one non-grid option changed, as
    /// `{"layouts": [...]}`.
    Read,
    /// [`Answer::Read`]'s JSON after a `<think>` block holding a decoy layout, in a ```json
    /// fence with prose around it (a reasoning model's reply).
    Reasoning,
    /// 200 with a chat completion whose content is this text.
    Content(String),
    /// A status and a raw body.
    Raw(u16, String),
    /// Wait, then answer [`Answer::Read`].
    Slow(Duration),
    /// Read the request, then never answer (the connection stays open until the server
    /// stops).
    Never,
}

/// A request the server received: path, headers (lower-case names), JSON body.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Seen {
    /// The content of the last user message.
    pub fn last_user(&self) -> String {
        self.body["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|x| x["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_string()
    }
}

/// The running server; stops (and drops the connections it holds) when dropped.
pub struct ChatServer {
    url: String,
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<TcpStream>>>,
}

impl ChatServer {
    /// Serve `script` on a free loopback port.
    pub fn start(script: Vec<Answer>) -> ChatServer {
        Self::start_on("127.0.0.1:0", script)
    }

    /// Serve `script` on `addr` (e.g. `0.0.0.0:0` for a pod to reach).
    pub fn start_on(addr: &str, script: Vec<Answer>) -> ChatServer {
        assert!(!script.is_empty(), "a script needs at least one answer");
        let listener = TcpListener::bind(addr).expect("bind the chat server");
        let port = listener.local_addr().unwrap().port();
        let url = format!("http://127.0.0.1:{port}/v1");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (log, flag, hold) = (seen.clone(), stop.clone(), held.clone());
        thread::spawn(move || {
            for (i, stream) in listener.incoming().enumerate() {
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let answer = script[i.min(script.len() - 1)].clone();
                let (log, hold) = (log.clone(), hold.clone());
                thread::spawn(move || serve_one(stream, answer, &log, &hold));
            }
        });
        ChatServer {
            url,
            port,
            seen,
            stop,
            held,
        }
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> &str {
        &self.url
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The requests received so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for ChatServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        for s in self.held.lock().unwrap().drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

fn serve_one(
    mut stream: TcpStream,
    answer: Answer,
    log: &Mutex<Vec<Seen>>,
    held: &Mutex<Vec<TcpStream>>,
) {
    let Some(seen) = read_request(&stream) else {
        return;
    };
    log.lock().unwrap().push(seen.clone());
    let (status, text) = match answer {
        Answer::Read => (200, completion(&read_prompt(&seen))),
        Answer::Reasoning => (200, completion(&reasoning(&read_prompt(&seen)))),
        Answer::Content(c) => (200, completion(&c)),
        Answer::Raw(s, b) => (s, b),
        Answer::Slow(d) => {
            thread::sleep(d);
            (200, completion(&read_prompt(&seen)))
        }
        Answer::Never => {
            if let Ok(s) = stream.try_clone() {
                held.lock().unwrap().push(s);
            }
            return;
        }
    };
    let reply = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
        text.len()
    );
    let _ = stream.write_all(reply.as_bytes());
}

fn read_request(stream: &TcpStream) -> Option<Seen> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
        if k == "content-length" {
            length = v.parse().ok()?;
        }
        headers.push((k, v));
    }
    let mut body = vec![0u8; length.min(16 << 20)];
    reader.read_exact(&mut body).ok()?;
    Some(Seen {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

/// A chat completion with `content`.
pub fn completion(content: &str) -> String {
    json!({
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": "scripted",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": content}}]
    })
    .to_string()
}

/// The best layout the prompt shows (`1. LABEL -> ... json {...}`), if any.
pub fn best_shown(prompt: &str) -> Option<Value> {
    prompt
        .lines()
        .find(|l| l.starts_with("1. ") && l.contains(" json {"))
        .and_then(|l| l.split_once(" json ").map(|(_, j)| j))
        .and_then(|j| serde_json::from_str(j).ok())
}

/// [`Answer::Read`]: the best layout shown with one option outside the grid changed. The
/// first that applies: turn on the gradient-reduce overlap, the parameter-gather overlap, the
/// TP communication overlap (with TP > 1), sequence parallelism (with TP > 1); else a
/// lighter first stage (with PP > 1); else the layout as shown. Nothing shown: a request for
/// TP 1.
pub fn read_prompt(seen: &Seen) -> String {
    let Some(mut best) = best_shown(&seen.last_user()) else {
        return json!({"layouts": [{"tp": 1}]}).to_string();
    };
    let tp = best["tp"].as_u64().unwrap_or(1);
    let pp = best["pp"].as_u64().unwrap_or(1);
    let off = |b: &Value, k: &str| b[k] == json!(false);
    let toggle = [
        ("overlapGradReduce", true),
        ("overlapParamGather", true),
        ("tpCommOverlap", tp > 1),
        ("sequenceParallel", tp > 1),
    ]
    .into_iter()
    .find(|(k, ok)| *ok && off(&best, k));
    match toggle {
        Some((k, _)) => best[k] = json!(true),
        None if pp > 1 && best.get("firstStageLayers").is_none() => {
            best["firstStageLayers"] = json!(1);
        }
        None => {}
    }
    json!({"layouts": [best]}).to_string()
}

/// A reasoning model's reply around `answer`: a `<think>` block with a decoy layout (which
/// must not be read), then prose and the answer in a ```json fence.
pub fn reasoning(answer: &str) -> String {
    format!(
        "<think>\nMaybe {{\"layouts\": [{{\"tp\": 4096}}]}}? No, that breaks the heads rule.\n</think>\nHere is my proposal:\n```json\n{answer}\n```\nIt overlaps more communication."
    )
}
