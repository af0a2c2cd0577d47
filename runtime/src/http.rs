//! The plain-HTTP listener of the operations endpoints (`/metrics`, `/healthz`, `/readyz`) the
//! operator and the webhook serve for scrapers and probes: HTTP/1.1 only (no protocol sniffing
//! that waits for bytes without a clock), and a connection that does not deliver a request's
//! headers within `header_timeout` is closed, so a client that opens connections and sends
//! nothing, or a header one byte at a time (slowloris), holds nothing for long.

use std::future::Future;
use std::time::Duration;

use hyper::body::{Body, Incoming};
use hyper::service::Service;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

/// How long a client has to send a request's headers on the operations listeners.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serve `service` over plain HTTP/1.1 on `listener` until `shutdown` resolves; each request's
/// headers must arrive within `header_timeout`.
pub async fn serve_plain<S, B>(
    listener: TcpListener,
    service: S,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let conn = builder.serve_connection(TokioIo::new(stream), service.clone());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn server(header_timeout: Duration) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = hyper::service::service_fn(|_req: Request<Incoming>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                hyper::body::Bytes::from_static(b"ok\n"),
            )))
        });
        tokio::spawn(serve_plain(
            listener,
            service,
            header_timeout,
            std::future::pending(),
        ));
        addr
    }

    /// Read until the peer closes; how long that took (or `None` past `limit`).
    async fn closed_within(s: &mut tokio::net::TcpStream, limit: Duration) -> Option<Duration> {
        let t = Instant::now();
        let mut buf = [0u8; 1024];
        loop {
            match tokio::time::timeout(limit.saturating_sub(t.elapsed()), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return Some(t.elapsed()),
                Ok(Ok(_)) => {}
                Err(_) => return None,
            }
        }
    }

    #[tokio::test]
    async fn a_client_that_never_finishes_its_headers_is_cut_off() {
        let addr = server(Duration::from_millis(300)).await;
        // A normal request is served.
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 256];
        let n = s.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        // Nothing at all, half a header, or a header trickling one byte at a time: closed
        // after the timeout, not held.
        let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /metrics HTTP/1.1\r\nHo")
            .await
            .unwrap();
        let mut trickle = tokio::net::TcpStream::connect(addr).await.unwrap();
        let drip = tokio::spawn(async move {
            for b in
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
            {
                if trickle.write_all(&[*b]).await.is_err() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        });
        for s in [&mut silent, &mut half] {
            let took = closed_within(s, Duration::from_secs(5)).await;
            assert!(
                took.is_some_and(|t| t < Duration::from_secs(2)),
                "held for {took:?}"
            );
        }
        assert!(drip.await.unwrap(), "the trickling client was cut off");
    }
}
