//! The leader's fence: writes are allowed only while this replica's Lease is surely its own.
//! Another replica takes the Lease once it has seen no renewal for the lease duration, measured
//! from when it saw our last renewal, which was written after we started that renewal. So a
//! renewal started at `t` keeps the Lease ours until at least `t + lease duration`; the fence
//! opens until `t + renew deadline` (shorter), and the leader stops acting when it closes,
//! whether or not the next renewal has come back (a renewal that hangs is cut off there too).
//!
//! The controller's client carries the fence as a layer: every write (POST, PUT, PATCH, DELETE)
//! is refused once it is closed, and a write in flight is abandoned when it closes. Reads go on
//! (watches, lists: they change nothing). One place, so no write path can forget it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Method, Request};

/// Until when this replica may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// No leader election: always.
    Always,
    /// Until this instant (in the past: closed).
    At(Instant),
}

/// Shared by the Lease holder (which moves it) and the controller's client (which obeys it).
#[derive(Debug, Clone)]
pub struct Fence(Arc<Mutex<Until>>);

/// A write the fence refused or cut off.
#[derive(Debug, Clone, thiserror::Error)]
#[error("not leading: this replica's lease may have expired, the write is not sent")]
pub struct NotLeading;

impl Fence {
    /// Always open (a single replica without leader election).
    pub fn always() -> Fence {
        Fence(Arc::new(Mutex::new(Until::Always)))
    }

    /// Closed until a renewal opens it.
    pub fn closed() -> Fence {
        Fence(Arc::new(Mutex::new(Until::At(Instant::now()))))
    }

    fn get(&self) -> Until {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Open until `at` (a successful renewal that started at `at - renew deadline`).
    pub fn open_until(&self, at: Instant) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Until::At(at);
    }

    /// Close now (leadership lost or given up).
    pub fn close(&self) {
        self.open_until(Instant::now());
    }

    /// How long writes remain allowed (`None`: closed; `Duration::MAX`: always).
    pub fn remaining(&self) -> Option<Duration> {
        match self.get() {
            Until::Always => Some(Duration::MAX),
            Until::At(t) => t
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero()),
        }
    }

    /// When the fence closes (`None`: never).
    pub fn deadline(&self) -> Option<Instant> {
        match self.get() {
            Until::Always => None,
            Until::At(t) => Some(t),
        }
    }

    pub fn is_open(&self) -> bool {
        self.remaining().is_some()
    }
}

/// Whether a request changes something.
pub fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// The layer that puts a [`Fence`] in front of a client's service.
#[derive(Debug, Clone)]
pub struct FenceLayer(pub Fence);

impl<S> tower_layer::Layer<S> for FenceLayer {
    type Service = Fenced<S>;

    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// A service whose writes wait for nothing once the fence is closed.
#[derive(Debug, Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: Fence,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl<S, B> tower_service::Service<Request<B>> for Fenced<S>
where
    S: tower_service::Service<Request<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        if !is_write(req.method()) {
            let fut = self.inner.call(req);
            return Box::pin(async move { fut.await.map_err(Into::into) });
        }
        let Some(left) = self.fence.remaining() else {
            return Box::pin(async { Err(NotLeading.into()) });
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            if left == Duration::MAX {
                return fut.await.map_err(Into::into);
            }
            match tokio::time::timeout(left, fut).await {
                Ok(r) => r.map_err(Into::into),
                Err(_) => Err(NotLeading.into()),
            }
        })
    }
}

/// A client whose writes obey `fence`.
pub fn fenced_client(config: kube::Config, fence: Fence) -> Result<kube::Client, kube::Error> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&FenceLayer(fence))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fence_opens_until_a_deadline_and_closes() {
        let f = Fence::closed();
        assert!(!f.is_open());
        f.open_until(Instant::now() + Duration::from_secs(60));
        assert!(f.remaining().unwrap() > Duration::from_secs(59));
        f.close();
        assert!(f.remaining().is_none());
        assert_eq!(Fence::always().remaining(), Some(Duration::MAX));
        assert!(is_write(&Method::PATCH) && !is_write(&Method::GET));
    }
}
