//! `/metrics` (Prometheus text), `/healthz` (the process serves) and `/readyz` (the API server
//! answered at start-up and the leader election runs: a standby replica is ready too, it only
//! does not act).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hyper_util::service::TowerToHyperService;
use primus_runtime::http::{HEADER_READ_TIMEOUT, serve_plain};
use warp::Filter;
use warp::http::StatusCode;

use crate::metrics::Metrics;

/// Readiness shared with the HTTP server.
#[derive(Debug, Default)]
pub struct Health {
    ready: AtomicBool,
}

impl Health {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }
}

/// The routes.
pub fn routes(
    metrics: Metrics,
    health: Arc<Health>,
) -> impl Filter<Extract = (impl warp::Reply,), Error = warp::Rejection> + Clone {
    let metrics_route = warp::path!("metrics").and(warp::get()).map(move || {
        warp::reply::with_header(
            metrics.render(),
            "content-type",
            "text/plain; version=0.0.4; charset=utf-8",
        )
    });
    let healthz = warp::path!("healthz")
        .and(warp::get())
        .map(|| warp::reply::with_status("ok", StatusCode::OK));
    let readyz = warp::path!("readyz").and(warp::get()).map(move || {
        if health.is_ready() {
            warp::reply::with_status("ok", StatusCode::OK)
        } else {
            warp::reply::with_status("not ready", StatusCode::SERVICE_UNAVAILABLE)
        }
    });
    metrics_route.or(healthz).or(readyz)
}

/// Bind `addr` and serve until `shutdown` resolves; returns the bound address and the task.
/// A request's headers must arrive within [`HEADER_READ_TIMEOUT`] (slowloris).
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_with(addr, metrics, health, HEADER_READ_TIMEOUT, shutdown).await
}

/// [`serve`] with another header timeout (tests).
pub async fn serve_with(
    addr: SocketAddr,
    metrics: Metrics,
    health: Arc<Health>,
    header_timeout: std::time::Duration,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let service = TowerToHyperService::new(warp::service(routes(metrics, health)));
    let server = serve_plain(listener, service, header_timeout, shutdown);
    Ok((bound, tokio::spawn(server)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn health_readiness_and_metrics_answer_over_http() {
        crate::install_crypto_provider();
        let m = Metrics::new();
        Metrics::set_plan(&m.projected, "ns", "p", Some(12.5));
        let h = Arc::new(Health::default());
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let timeout = std::time::Duration::from_millis(300);
        let (addr, task) = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            m,
            h.clone(),
            timeout,
            async {
                let _ = stop_rx.await;
            },
        )
        .await
        .unwrap();
        // A client that opens a connection and sends half a request is cut off.
        {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHo").await.unwrap();
            let mut buf = [0u8; 64];
            let read = tokio::time::timeout(std::time::Duration::from_secs(3), s.read(&mut buf));
            assert!(
                matches!(read.await, Ok(Ok(_)) | Ok(Err(_))),
                "the slow client was not cut off within 3 s"
            );
        }
        let http = reqwest::Client::new();
        let get = |path: &str| http.get(format!("http://{addr}{path}")).send();
        assert_eq!(get("/readyz").await.unwrap().status(), 503);
        h.set_ready(true);
        assert_eq!(get("/readyz").await.unwrap().status(), 200);
        assert_eq!(get("/healthz").await.unwrap().status(), 200);
        let res = get("/metrics").await.unwrap();
        assert_eq!(res.status(), 200);
        let body = res.text().await.unwrap();
        assert!(
            body.contains(
                r#"primus_plan_projected_tokens_per_second{namespace="ns",plan="p"} 12.5"#
            ),
            "{body}"
        );
        assert_eq!(get("/nope").await.unwrap().status(), 404);
        let _ = stop_tx.send(());
        tokio::time::timeout(std::time::Duration::from_secs(5), task)
            .await
            .expect("the server stops on the signal")
            .unwrap();
    }
}
