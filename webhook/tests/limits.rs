//! Admission under load and slow clients: reviews beyond `--max-in-flight` are answered at
//! once with HTTP 429 (the API server then applies failurePolicy) instead of queueing on the
//! async workers, and the plain operations listener closes a connection whose request headers
//! do not arrive in time (slowloris). The routes are served over a real loopback listener.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use common::*;
use hyper_util::service::TowerToHyperService;
use primus_webhook::metrics::Metrics;
use primus_webhook::server::{self, State};

fn state(slots: usize) -> Arc<State> {
    Arc::new(State {
        validator: validator(),
        metrics: Metrics::new().unwrap(),
        ready: AtomicBool::new(true),
        max_body_bytes: 8 << 20,
        budget: Duration::from_secs(2),
        slots: Arc::new(tokio::sync::Semaphore::new(slots)),
    })
}

/// One POST over HTTP/1.0: (status, body).
fn post(addr: SocketAddr, path: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    s.write_all(body).unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    let code = out
        .split_whitespace()
        .nth(1)
        .unwrap_or("0")
        .parse()
        .unwrap();
    (
        code,
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    )
}

#[test]
fn reviews_beyond_the_limit_are_answered_at_once_with_429() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let st = state(1);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let service = TowerToHyperService::new(warp::service(server::routes(st.clone())));
    rt.spawn(primus_runtime::http::serve_plain(
        listener,
        service,
        Duration::from_secs(10),
        std::future::pending(),
    ));
    let body = review(&example("oom-pytorchjob"), None, false);
    let (code, answer) = post(addr, "/validate/pytorchjob", &body);
    assert_eq!(code, 200, "{answer}");

    // Every slot busy (a review being evaluated): the next one is not queued.
    let busy = rt.block_on(st.slots.clone().acquire_owned()).unwrap();
    let t = Instant::now();
    let (code, answer) = post(addr, "/validate/pytorchjob", &body);
    let took = t.elapsed();
    assert_eq!(code, 429, "{answer}");
    assert!(
        answer.contains("too many admission reviews in flight"),
        "{answer}"
    );
    assert!(took < Duration::from_millis(500), "answered after {took:?}");
    let m = st.metrics.render();
    assert!(
        m.contains(r#"primus_webhook_admissions_total{decision="error",kind="unknown",reason="overloaded"} 1"#),
        "{m}"
    );
    // A slot frees up: served again.
    drop(busy);
    assert_eq!(post(addr, "/validate/pytorchjob", &body).0, 200);
    // Probes are never limited.
    let _busy = rt.block_on(st.slots.clone().acquire_owned()).unwrap();
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(
        out.starts_with("HTTP/1.0 200") || out.starts_with("HTTP/1.1 200"),
        "{out}"
    );
}

#[test]
fn the_plain_metrics_listener_cuts_off_slow_headers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(server::serve_plain(
        listener,
        state(1),
        Duration::from_millis(300),
        std::future::pending(),
    ));
    let mut ok = TcpStream::connect(addr).unwrap();
    ok.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    ok.read_to_string(&mut out).unwrap();
    assert!(out.contains("primus_webhook"), "{out}");

    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHo").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t = Instant::now();
    let mut buf = [0u8; 256];
    // Closed by the server (EOF or reset), long before the client's 5 s read timeout.
    let _ = slow.read(&mut buf);
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "held for {:?}",
        t.elapsed()
    );
}
