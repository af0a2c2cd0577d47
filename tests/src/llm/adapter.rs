//! The launcher's adapter: a loopback proxy in front of `llama-server` that gives every chat
//! completion without a `response_format` of its own the default JSON schema
//! (`response_format: {type: json_schema, json_schema: {name, strict, schema}}`), so a client
//! that does not ask for structured output (today's agent) still gets schema-constrained
//! replies. Everything else is passed through byte for byte.

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;

use serde_json::{Value, json};

use super::http::{Request, read_request};

/// A running adapter; stops when dropped.
#[derive(Debug)]
pub struct Adapter {
    port: u16,
    stop: Arc<AtomicBool>,
    chat_requests: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl Adapter {
    /// Listen on a free loopback port and forward to `127.0.0.1:upstream`.
    pub fn start(upstream: u16, schema: Value) -> Result<Adapter, String> {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("adapter listener: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("adapter listener: {e}"))?
            .port();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let chat_requests = Arc::new(AtomicU32::new(0));
        let counter = chat_requests.clone();
        let response_format = Arc::new(json!({
            "type": "json_schema",
            "json_schema": {"name": "reply", "strict": true, "schema": schema},
        }));
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let rf = response_format.clone();
                let counter = counter.clone();
                std::thread::spawn(move || forward(client, upstream, &rf, &counter));
            }
        });
        Ok(Adapter {
            port,
            stop,
            chat_requests,
            thread: Some(thread),
        })
    }

    /// Chat completions forwarded so far.
    pub fn chat_requests(&self) -> u32 {
        self.chat_requests.load(Ordering::SeqCst)
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Adapter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The body with the default `response_format` when it is a chat completion without one.
pub fn with_default_format(req: &Request, response_format: &Value) -> Vec<u8> {
    if !req.path().ends_with("/chat/completions") {
        return req.body.clone();
    }
    match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(mut o)) if !o.contains_key("response_format") => {
            o.insert("response_format".into(), response_format.clone());
            Value::Object(o).to_string().into_bytes()
        }
        _ => req.body.clone(),
    }
}

/// Relay one exchange: the (amended) request up, the response back until the server closes.
fn forward(mut client: TcpStream, upstream: u16, response_format: &Value, chat: &AtomicU32) {
    let req = match read_request(&client) {
        Ok(r) => r,
        Err(why) => {
            let body = json!({"error": {"message": format!("adapter: {why}")}}).to_string();
            let _ = write!(
                client,
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            return;
        }
    };
    if req.path().ends_with("/chat/completions") {
        chat.fetch_add(1, Ordering::SeqCst);
    }
    let body = with_default_format(&req, response_format);
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
        let _ = client.write_all(
            b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        return;
    };
    if server.write_all(&req.to_bytes(&body)).is_err() {
        return;
    }
    let _ = std::io::copy(&mut server, &mut client);
    let _ = client.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(path: &str, body: &str) -> Request {
        Request {
            line: format!("POST {path} HTTP/1.1"),
            headers: vec![("Content-Length".into(), body.len().to_string())],
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn only_chat_completions_without_a_format_get_the_default() {
        let rf = json!({"type": "json_schema", "json_schema": {"name": "reply", "schema": {}}});
        let amended =
            with_default_format(&request("/v1/chat/completions", r#"{"messages": []}"#), &rf);
        let v: Value = serde_json::from_slice(&amended).unwrap();
        assert_eq!(v["response_format"], rf);
        assert_eq!(v["messages"], json!([]));
        for (path, body) in [
            (
                "/v1/chat/completions",
                r#"{"messages": [], "response_format": {"type": "text"}}"#,
            ),
            ("/v1/completions", r#"{"prompt": "x"}"#),
            ("/v1/chat/completions", "not json"),
            ("/v1/chat/completions", "[1, 2]"),
        ] {
            assert_eq!(
                with_default_format(&request(path, body), &rf),
                body.as_bytes(),
                "{path} {body}"
            );
        }
    }

    #[test]
    fn the_forwarded_request_has_one_length_and_closes() {
        let mut r = request("/v1/chat/completions", "{}");
        r.headers.push(("Connection".into(), "keep-alive".into()));
        r.headers.push(("Authorization".into(), "Bearer k".into()));
        let text = String::from_utf8(r.to_bytes(b"{\"a\": 1}")).unwrap();
        assert_eq!(
            text,
            "POST /v1/chat/completions HTTP/1.1\r\nAuthorization: Bearer k\r\nContent-Length: 8\r\nConnection: close\r\n\r\n{\"a\": 1}"
        );
    }
}
