//! `/metrics` (Prometheus text), `/healthz` (the process serves) and `/readyz` (the API server
//! answered at start-up and the leader election runs: a standby replica is ready too, it only
//! does not act).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let server = warp::serve(routes(metrics, health))
        .incoming(listener)
        .graceful(shutdown)
        .run();
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
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), m, h.clone(), async {
            let _ = stop_rx.await;
        })
        .await
        .unwrap();
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
