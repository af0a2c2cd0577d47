//! Just enough HTTP/1.1 for the model server's tests: one request per connection
//! (`Connection: close`), bodies framed by `Content-Length`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A request read from a client: the request line, the headers (as sent), the body.
pub struct Request {
    pub line: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The path of the request line.
    pub fn path(&self) -> &str {
        self.line.split_whitespace().nth(1).unwrap_or("")
    }

    /// The request as bytes, with `body` and `Connection: close` (hop-by-hop and length
    /// headers replaced).
    pub fn to_bytes(&self, body: &[u8]) -> Vec<u8> {
        let mut out = format!("{}\r\n", self.line);
        for (k, v) in &self.headers {
            let k_lower = k.to_ascii_lowercase();
            if !matches!(
                k_lower.as_str(),
                "content-length" | "connection" | "keep-alive" | "transfer-encoding"
            ) {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str(&format!(
            "Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        ));
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(body);
        bytes
    }
}

/// Largest request body read (the agent's conversations are a few tens of KiB).
const MAX_BODY: usize = 16 << 20;

/// Read one request (head and `Content-Length` body) from a client.
pub fn read_request(stream: &TcpStream) -> Result<Request, String> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| e.to_string())?;
    let line = line.trim_end().to_string();
    if line.is_empty() {
        return Err("empty request".into());
    }
    let mut headers = Vec::new();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).map_err(|e| e.to_string())?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let Some((k, v)) = h.split_once(':') else {
            return Err(format!("bad header line `{h}`"));
        };
        let (k, v) = (k.trim().to_string(), v.trim().to_string());
        if k.eq_ignore_ascii_case("content-length") {
            length = v.parse().map_err(|_| format!("bad Content-Length `{v}`"))?;
        }
        if k.eq_ignore_ascii_case("transfer-encoding") {
            return Err("chunked request bodies are not read".into());
        }
        headers.push((k, v));
    }
    if length > MAX_BODY {
        return Err(format!("request body of {length} bytes"));
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok(Request {
        line,
        headers,
        body,
    })
}

/// One exchange with `127.0.0.1:port` on a fresh connection: status and body.
pub fn exchange(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let addr = format!("127.0.0.1:{port}");
    let what = format!("{method} http://{addr}{path}");
    let mut s = TcpStream::connect(&addr).map_err(|e| format!("{what}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| format!("{what}: {e}"))?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())
        .and_then(|()| s.write_all(body.as_bytes()))
        .map_err(|e| format!("{what}: {e}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)
        .map_err(|e| format!("{what}: {e}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{what}: no HTTP header in the response"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("{what}: no status in `{head}`"))?;
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return Err(format!("{what}: chunked responses are not read"));
    }
    Ok((status, body.to_string()))
}
