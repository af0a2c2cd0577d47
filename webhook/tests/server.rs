//! The `primus-webhook` binary over real TLS on loopback: endpoints, metrics, limits,
//! certificate reload, graceful shutdown, bad flags.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use primus_webhook::tls;

fn oom_review() -> Vec<u8> {
    review(&example("oom-pytorchjob"), None, false)
}

#[test]
fn serves_admissions_health_readiness_and_metrics_over_tls() {
    let mut w = WebhookProcess::self_signed(&[], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let addr = w.addr();

    let h = https(addr, &ca, "GET", "/healthz", None).unwrap();
    assert_eq!((h.status, &h.body[..]), (200, &b"ok\n"[..]));

    let a = https(
        addr,
        &ca,
        "POST",
        "/validate/pytorchjob",
        Some(oom_review()),
    )
    .unwrap();
    assert_eq!(a.status, 200);
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["response"]["allowed"], false);
    assert!(message(&v).contains("GiB usable on MI300X"), "{v}");

    let fit = review(&example("fitting-pytorchjob"), None, false);
    let a = https(addr, &ca, "POST", "/validate/pytorchjob/strict", Some(fit)).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(v["response"]["allowed"], true, "{v}");

    let bad = https(
        addr,
        &ca,
        "POST",
        "/validate/pytorchjob",
        Some(b"{]".to_vec()),
    )
    .unwrap();
    assert_eq!(bad.status, 400);
    let v: serde_json::Value = serde_json::from_slice(&bad.body).unwrap();
    assert_eq!(v["response"]["allowed"], false);

    let nf = https(addr, &ca, "GET", "/nope", None).unwrap();
    assert_eq!(nf.status, 404);
    let get = https(addr, &ca, "GET", "/validate/pytorchjob", None).unwrap();
    assert_eq!(get.status, 405);

    let m = https(addr, &ca, "GET", "/metrics", None).unwrap();
    let text = String::from_utf8_lossy(&m.body);
    assert_eq!(m.status, 200);
    assert!(
        text.contains(
            r#"primus_webhook_admissions_total{decision="deny",kind="PyTorchJob",reason="oom"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(
            r#"primus_webhook_admissions_total{decision="allow",kind="PyTorchJob",reason="fits"} 1"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"primus_webhook_admissions_total{decision="error",kind="PyTorchJob",reason="malformed"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"primus_webhook_admission_duration_seconds_count{kind="PyTorchJob"} 3"#),
        "{text}"
    );
    assert!(text.contains("primus_webhook_ready 1"), "{text}");
    // Logs are JSON when stderr is not a terminal.
    let logs = w.logs();
    let deny_line = logs
        .lines()
        .find(|l| l.contains("\"decision\":\"deny\""))
        .unwrap_or_else(|| panic!("no deny log line in:\n{logs}"));
    let line: serde_json::Value = serde_json::from_str(deny_line).expect("a JSON log line");
    assert_eq!(line["reason"], "oom");
}

#[test]
fn keep_alive_connections_serve_many_requests() {
    let mut w = WebhookProcess::self_signed(&[], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let body = oom_review();
    let config = primus_webhook::client::client_config(&ca).unwrap();
    let addr = w.addr();
    block_on(async move {
        let mut c = primus_webhook::client::Connection::open(addr, "127.0.0.1", config)
            .await
            .unwrap();
        for _ in 0..50 {
            let a = c
                .post("/validate/pytorchjob", body.clone().into())
                .await
                .unwrap();
            assert_eq!(a.status, 200);
        }
    });
}

#[test]
fn bodies_over_the_limit_get_413() {
    let mut w = WebhookProcess::self_signed(&["--max-body-bytes", "2000"], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let big = oom_review();
    assert!(big.len() > 2000);
    let a = https(w.addr(), &ca, "POST", "/validate/pytorchjob", Some(big)).unwrap();
    assert_eq!(a.status, 413);
    let v: serde_json::Value = serde_json::from_slice(&a.body).unwrap();
    assert!(
        message(&v).contains("exceeds the webhook's limit of 2000 bytes"),
        "{v}"
    );
}

/// Send raw HTTP/1.1 bytes over TLS and read the answer until the server closes.
fn raw_tls(w: &WebhookProcess, ca: &[u8], request: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = primus_webhook::client::client_config(ca).unwrap();
    let addr = w.addr();
    block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .unwrap();
        tls.write_all(&request).await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    })
}

#[test]
fn chunked_bodies_without_content_length_are_limited_too() {
    let mut w = WebhookProcess::self_signed(&["--max-body-bytes", "2000"], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let mut req = b"POST /validate/pytorchjob HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    for _ in 0..3 {
        req.extend_from_slice(format!("{:x}\r\n", 1000).as_bytes());
        req.extend_from_slice(&[b' '; 1000]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    let answer = raw_tls(&w, &ca, req);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A small chunked body is read whole (and is not an AdmissionReview).
    let mut req = b"POST /validate/pytorchjob HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    req.extend_from_slice(b"2\r\n{}\r\n0\r\n\r\n");
    let answer = raw_tls(&w, &ca, req);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(
        answer.contains("the request body is not an AdmissionReview"),
        "{answer}"
    );
}

#[test]
fn certificate_files_are_reloaded_when_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let first = tls::self_signed(&["127.0.0.1".into()], 1).unwrap();
    let second = tls::self_signed(&["127.0.0.1".into()], 1).unwrap();
    write(&cert, &first.cert_pem);
    write(&key, &first.key_pem);
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    let mut w = WebhookProcess::start(
        &[
            "--tls-cert-file",
            &c,
            "--tls-key-file",
            &k,
            "--cert-reload-interval",
            "0.2",
        ],
        &[],
    );
    w.wait_ready(first.ca_pem.as_bytes());
    assert!(https(w.addr(), second.ca_pem.as_bytes(), "GET", "/healthz", None).is_err());

    // Rotate: a half-written pair (new cert, old key) must not be served...
    write(&cert, &second.cert_pem);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(
        https(w.addr(), first.ca_pem.as_bytes(), "GET", "/healthz", None)
            .map(|a| a.status)
            .ok(),
        Some(200),
        "the old certificate is still served while the pair does not match"
    );
    // ...and the complete pair is.
    write(&key, &second.key_pem);
    let deadline = Instant::now() + Duration::from_secs(10);
    while https(w.addr(), second.ca_pem.as_bytes(), "GET", "/healthz", None).is_err() {
        assert!(Instant::now() < deadline, "not reloaded:\n{}", w.logs());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(https(w.addr(), first.ca_pem.as_bytes(), "GET", "/healthz", None).is_err());
    let m = https(w.addr(), second.ca_pem.as_bytes(), "GET", "/metrics", None).unwrap();
    let text = String::from_utf8_lossy(&m.body);
    assert!(
        text.contains(r#"primus_webhook_certificate_reloads_total{result="ok"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"primus_webhook_certificate_reloads_total{result="error"} 1"#),
        "{text}"
    );
}

#[test]
fn sigterm_stops_it_gracefully() {
    let mut w = WebhookProcess::self_signed(&["--shutdown-grace", "3"], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let status = w
        .stop(Duration::from_secs(10))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status}:\n{}", w.logs());
    assert!(w.logs().contains("stopped"), "{}", w.logs());
}

#[test]
fn during_the_shutdown_delay_it_serves_but_is_not_ready() {
    let mut w = WebhookProcess::self_signed(&["--shutdown-delay", "2"], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let pid = w.child.as_ref().unwrap().id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let not_ready = primus_tests::wait_for(Duration::from_secs(2), "/readyz to fail", || {
        https(w.addr(), &ca, "GET", "/readyz", None)
            .ok()
            .filter(|a| a.status == 503)
    });
    assert_eq!(&not_ready.body[..], b"not ready\n");
    let a = https(
        w.addr(),
        &ca,
        "POST",
        "/validate/pytorchjob",
        Some(oom_review()),
    )
    .unwrap();
    assert_eq!(a.status, 200, "admissions are still answered");
    let status = w
        .stop(Duration::from_secs(10))
        .expect("exits after the delay");
    assert!(status.success(), "{status}");
}

#[test]
fn plain_metrics_port_serves_only_operations_endpoints() {
    let mport = free_port();
    let listen = format!("127.0.0.1:{mport}");
    let mut w = WebhookProcess::self_signed(&["--metrics-listen", &listen], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let get = |path: &str| -> (u16, String) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", mport)).unwrap();
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let status = out[9..12].parse().unwrap();
        (status, out)
    };
    let (status, text) = get("/metrics");
    assert_eq!(status, 200);
    assert!(text.contains("primus_webhook_ready 1"), "{text}");
    assert_eq!(get("/readyz").0, 200);
    assert_eq!(get("/validate/pytorchjob").0, 404);
}

#[test]
fn bad_settings_exit_with_one_clear_line() {
    let bin = env!("CARGO_BIN_EXE_primus-webhook");
    let out = Command::new(bin)
        .args(["--headroom", "1.5", "--self-signed"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--headroom: must be a fraction in (0, 1], got 1.5"),
        "{err}"
    );

    let out = Command::new(bin)
        .args([
            "--tls-cert-file",
            "/nonexistent/tls.crt",
            "--tls-key-file",
            "/nonexistent/tls.key",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/tls.crt"), "{err}");

    let out = Command::new(bin)
        .args(["--max-in-flight", "0", "--self-signed"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-in-flight"), "{err}");
}
