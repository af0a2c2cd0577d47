//! The HTTPS server: warp routes (admission endpoints, `/healthz`, `/readyz`, `/metrics`)
//! served as a hyper service over tokio-rustls — warp 0.4 has no TLS of its own. Each
//! accepted TCP stream goes through the `TlsAcceptor`, then `hyper_util`'s auto (HTTP/1.1 and
//! HTTP/2) connection builder serves `warp::service(routes)` wrapped by
//! `TowerToHyperService`. Shutdown stops accepting, lets open requests finish, and closes
//! keep-alive connections, within a grace period.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hyper::body::{Buf, Bytes};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use warp::http::{Response, StatusCode};
use warp::{Filter, Rejection};

use crate::admission::{self, Endpoint};
use crate::metrics::Metrics;
use crate::validate::Validator;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct State {
    pub validator: Validator,
    pub metrics: Metrics,
    /// Set once the serving certificate is loaded (and the caBundle patched in self-signed mode).
    pub ready: AtomicBool,
    /// Largest request body accepted, bytes.
    pub max_body_bytes: u64,
    /// Time budget of one admission (well under the webhook's `timeoutSeconds`).
    pub budget: Duration,
    /// Admissions evaluated at once (`--max-in-flight`); a review beyond it is answered at
    /// once with HTTP 429, and the API server applies the webhook's failurePolicy.
    pub slots: Arc<tokio::sync::Semaphore>,
}

impl State {
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
        self.metrics.ready.set(i64::from(ready));
    }
}

/// How long a request body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Rejection: the body is larger than the limit.
#[derive(Debug)]
struct TooLarge(u64);
impl warp::reject::Reject for TooLarge {}

/// Rejection: the body could not be read.
#[derive(Debug)]
struct BodyError(String);
impl warp::reject::Reject for BodyError {}

/// The request body, up to `limit` bytes (checked against Content-Length first, then while
/// reading, so a body without Content-Length is bounded too).
fn body_limited(limit: u64) -> impl Filter<Extract = (Bytes,), Error = Rejection> + Clone {
    warp::header::optional::<u64>("content-length")
        .and(warp::body::stream())
        .and_then(move |len: Option<u64>, stream| collect_limited(len, stream, limit))
}

async fn collect_limited<S, B>(len: Option<u64>, stream: S, limit: u64) -> Result<Bytes, Rejection>
where
    S: futures::Stream<Item = Result<B, warp::Error>>,
    B: Buf,
{
    if len.is_some_and(|n| n > limit) {
        return Err(warp::reject::custom(TooLarge(limit)));
    }
    let mut stream = std::pin::pin!(stream);
    let mut out: Vec<u8> = Vec::with_capacity(len.unwrap_or(0).min(limit) as usize);
    // A client that stops sending mid-body does not hold a connection and its buffer forever.
    let deadline = tokio::time::Instant::now() + BODY_TIMEOUT;
    loop {
        let next = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(next) => next,
            Err(_) => {
                return Err(warp::reject::custom(BodyError(format!(
                    "not received within {} s",
                    BODY_TIMEOUT.as_secs()
                ))));
            }
        };
        let Some(chunk) = next else {
            break;
        };
        let mut chunk = chunk.map_err(|e| warp::reject::custom(BodyError(e.to_string())))?;
        if out.len() as u64 + chunk.remaining() as u64 > limit {
            return Err(warp::reject::custom(TooLarge(limit)));
        }
        while chunk.has_remaining() {
            let part = chunk.chunk();
            let n = part.len();
            out.extend_from_slice(part);
            chunk.advance(n);
        }
    }
    Ok(Bytes::from(out))
}

fn json_response(status: u16, body: Vec<u8>) -> Response<Vec<u8>> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        warp::http::header::CONTENT_TYPE,
        warp::http::HeaderValue::from_static("application/json"),
    );
    r
}

fn text_response(status: StatusCode, body: String) -> Response<Vec<u8>> {
    let mut r = Response::new(body.into_bytes());
    *r.status_mut() = status;
    r.headers_mut().insert(
        warp::http::header::CONTENT_TYPE,
        warp::http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Answer one admission review and account for it.
pub fn admit(state: &State, ep: Endpoint, body: &[u8], started: Instant) -> Response<Vec<u8>> {
    let deadline = started + state.budget;
    let reply = admission::handle(&state.validator, ep, body, deadline);
    let elapsed = started.elapsed();
    state.metrics.observe(
        reply.kind,
        reply.decision,
        reply.reason.as_str(),
        elapsed.as_secs_f64(),
    );
    let micros = elapsed.as_micros() as u64;
    match reply.decision {
        "allow" => tracing::debug!(
            kind = reply.kind, uid = %reply.uid, namespace = %reply.namespace, name = %reply.name,
            operation = reply.operation, dry_run = reply.dry_run, decision = reply.decision,
            reason = reply.reason.as_str(), micros, "admission"
        ),
        "error" => tracing::warn!(
            kind = reply.kind, uid = %reply.uid, decision = reply.decision,
            reason = reply.reason.as_str(), micros, message = %reply.message, "malformed admission request"
        ),
        _ => tracing::info!(
            kind = reply.kind, uid = %reply.uid, namespace = %reply.namespace, name = %reply.name,
            operation = reply.operation, dry_run = reply.dry_run, decision = reply.decision,
            reason = reply.reason.as_str(), micros, message = %reply.message, "admission"
        ),
    }
    if elapsed > state.budget {
        tracing::warn!(
            micros,
            budget_ms = state.budget.as_millis() as u64,
            "admission overran its time budget"
        );
    }
    json_response(reply.status, reply.body)
}

/// Answer one review within the concurrency limit: on a blocking thread (the evaluation is
/// CPU work; the async workers stay free for probes and other connections) when a slot is
/// free, else at once with HTTP 429 (`overloaded`), so the API server applies failurePolicy
/// instead of waiting while reviews pile up.
pub async fn admit_bounded(
    state: Arc<State>,
    ep: Endpoint,
    body: Bytes,
    started: Instant,
) -> Response<Vec<u8>> {
    let Ok(permit) = state.slots.clone().try_acquire_owned() else {
        state
            .metrics
            .admissions
            .with_label_values(&["unknown", "error", "overloaded"])
            .inc();
        tracing::warn!("too many admission reviews in flight; answering 429");
        let mut r = text_response(
            StatusCode::TOO_MANY_REQUESTS,
            "too many admission reviews in flight; the API server applies the failure policy\n"
                .into(),
        );
        r.headers_mut().insert(
            warp::http::header::RETRY_AFTER,
            warp::http::HeaderValue::from_static("1"),
        );
        return r;
    };
    let s = state.clone();
    let work = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        admit(&s, ep, &body, started)
    });
    match work.await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "an admission review panicked");
            text_response(StatusCode::INTERNAL_SERVER_ERROR, "internal error\n".into())
        }
    }
}

/// `/healthz`, `/readyz` and `/metrics`.
fn ops(
    state: Arc<State>,
) -> impl Filter<Extract = (Response<Vec<u8>>,), Error = Rejection> + Clone + Send + Sync + 'static
{
    let with_state = warp::any().map(move || state.clone());
    let healthz = warp::path!("healthz")
        .and(warp::get())
        .map(|| text_response(StatusCode::OK, "ok\n".into()));
    let readyz = warp::path!("readyz")
        .and(warp::get())
        .and(with_state.clone())
        .map(|state: Arc<State>| {
            if state.ready.load(Ordering::SeqCst) {
                text_response(StatusCode::OK, "ok\n".into())
            } else {
                text_response(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into())
            }
        });
    let metrics =
        warp::path!("metrics")
            .and(warp::get())
            .and(with_state)
            .map(|state: Arc<State>| {
                let mut r = text_response(StatusCode::OK, state.metrics.render());
                if let Ok(v) = warp::http::HeaderValue::from_str(&Metrics::content_type()) {
                    r.headers_mut().insert(warp::http::header::CONTENT_TYPE, v);
                }
                r
            });
    healthz.or(readyz).unify().or(metrics).unify()
}

/// The routes of the HTTPS port: admission endpoints and [`ops`].
pub fn routes(
    state: Arc<State>,
) -> impl Filter<Extract = (Response<Vec<u8>>,), Error = Infallible> + Clone + Send + Sync + 'static
{
    let with_state = {
        let state = state.clone();
        warp::any().map(move || state.clone())
    };
    let started = warp::any().map(Instant::now);
    let endpoint = warp::path!("validate" / "pytorchjob")
        .map(|| Endpoint::PyTorchJob { strict: false })
        .or(warp::path!("validate" / "pytorchjob" / "strict")
            .map(|| Endpoint::PyTorchJob { strict: true }))
        .unify()
        .or(warp::path!("validate" / "trainjob").map(|| Endpoint::TrainJob { strict: false }))
        .unify()
        .or(warp::path!("validate" / "trainjob" / "strict")
            .map(|| Endpoint::TrainJob { strict: true }))
        .unify()
        .or(warp::path!("validate" / "trainingplan").map(|| Endpoint::TrainingPlan))
        .unify();
    let admit_route = started
        .and(endpoint)
        .and(warp::post())
        .and(body_limited(state.max_body_bytes))
        .and(with_state)
        .then(
            |started: Instant, ep: Endpoint, body: Bytes, state: Arc<State>| {
                admit_bounded(state, ep, body, started)
            },
        );
    let recover_state = state.clone();
    admit_route
        .or(ops(state))
        .unify()
        .recover(move |rej: Rejection| {
            let state = recover_state.clone();
            async move { Ok::<_, Infallible>(rejection_response(&state, rej)) }
        })
        .unify()
}

/// The routes of the plain-HTTP operations port: [`ops`] only.
pub fn ops_routes(
    state: Arc<State>,
) -> impl Filter<Extract = (Response<Vec<u8>>,), Error = Infallible> + Clone + Send + Sync + 'static
{
    let recover_state = state.clone();
    ops(state)
        .recover(move |rej: Rejection| {
            let state = recover_state.clone();
            async move { Ok::<_, Infallible>(rejection_response(&state, rej)) }
        })
        .unify()
}

fn rejection_response(state: &State, rej: Rejection) -> Response<Vec<u8>> {
    let review_error = |status: u16, message: String| {
        state
            .metrics
            .admissions
            .with_label_values(&["unknown", "error", "malformed"])
            .inc();
        let body = serde_json::json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {
                "uid": "",
                "allowed": false,
                "status": {"status": "Failure", "message": message, "reason": "BadRequest", "code": status},
            }
        });
        json_response(status, serde_json::to_vec(&body).unwrap_or_default())
    };
    if let Some(TooLarge(limit)) = rej.find::<TooLarge>() {
        return review_error(
            413,
            format!("the request body exceeds the webhook's limit of {limit} bytes"),
        );
    }
    if let Some(BodyError(e)) = rej.find::<BodyError>() {
        return review_error(400, format!("the request body could not be read: {e}"));
    }
    if rej.is_not_found() {
        return text_response(
            StatusCode::NOT_FOUND,
            format!(
                "not found; endpoints: POST {} {} {}, GET {} {} {}\n",
                crate::paths::PYTORCHJOB,
                crate::paths::PYTORCHJOB_STRICT,
                crate::paths::TRAININGPLAN,
                crate::paths::HEALTHZ,
                crate::paths::READYZ,
                crate::paths::METRICS
            ),
        );
    }
    if rej.find::<warp::reject::MethodNotAllowed>().is_some() {
        return text_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        );
    }
    text_response(StatusCode::BAD_REQUEST, format!("bad request: {rej:?}\n"))
}

/// Serve `routes` over TLS on `listener` until `shutdown` completes; then stop accepting and
/// give open connections `grace` to finish.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let acceptor = TlsAcceptor::from(tls);
    let filter = routes(state.clone());
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(30))
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(warp::service(filter.clone()));
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let metrics = state.metrics.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream))
                .await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    metrics.tls_errors.inc();
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    metrics.tls_errors.inc();
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            metrics.connections.inc();
            let conn = builder.serve_connection(TokioIo::new(tls), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            metrics.connections.dec();
        });
    }
    drop(listener);
    tracing::info!(
        connections = graceful.count(),
        "shutting down: no new connections, finishing open ones"
    );
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            grace_seconds = grace.as_secs(),
            "connections still open after the grace period; closing"
        );
    }
}

/// Serve `/healthz`, `/readyz` and `/metrics` over plain HTTP/1.1 (for scrapers without the
/// CA) until `shutdown`; a request's headers must arrive within `header_timeout`
/// ([`primus_runtime::http::HEADER_READ_TIMEOUT`] in the binary).
pub async fn serve_plain(
    listener: TcpListener,
    state: Arc<State>,
    header_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    let service = TowerToHyperService::new(warp::service(ops_routes(state)));
    primus_runtime::http::serve_plain(listener, service, header_timeout, shutdown).await;
}

/// Bind a TCP listener.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}
