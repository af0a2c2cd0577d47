//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several replicas exactly one
//! runs the controller. Acquire and renew are read-modify-write with the Lease's
//! `resourceVersion` (optimistic concurrency: of two candidates writing the same version, one
//! gets a 409 and stays a follower). Expiry is judged on this process's own clock, from when
//! the holder's record was last seen to change (client-go's approach), so clock skew between
//! replicas does not matter. A leader that cannot renew within the renew deadline steps down,
//! and its [`Fence`] closes at that deadline whatever its calls are doing; on shutdown it
//! releases the Lease so another replica takes over at once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use tracing::{debug, info};

use crate::error::{Error, is_conflict, is_not_found};
use crate::fence::Fence;
use crate::kubeapi::call;

/// How long releasing the Lease on shutdown may take (it expires by itself anyway).
pub const RELEASE_TIMEOUT: Duration = Duration::from_secs(1);

/// Leader-election settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub lease_name: String,
    pub namespace: String,
    /// This replica's identity (the pod name in a cluster).
    pub identity: String,
    /// How long a Lease is valid without renewal.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// Pause between attempts (acquire, renew).
    pub retry_period: Duration,
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the Lease (acquired or renewed).
    Leading,
    /// Someone else holds a valid Lease.
    Following { holder: String },
}

/// One candidate's view of the Lease.
pub struct Elector {
    api: Api<Lease>,
    settings: Settings,
    /// The record last seen (resourceVersion) and when it was first seen.
    observed: Option<(String, Instant)>,
    /// The Lease as we last wrote or read it.
    last: Option<Lease>,
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl Elector {
    pub fn new(client: kube::Client, settings: Settings) -> Elector {
        Elector {
            api: Api::namespaced(client, &settings.namespace),
            settings,
            observed: None,
            last: None,
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    fn spec(&self, transitions: i32, acquire: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.settings.identity.clone()),
            lease_duration_seconds: Some(self.settings.lease_duration.as_secs().max(1) as i32),
            acquire_time: Some(acquire.unwrap_or_else(now)),
            renew_time: Some(now()),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// Create the lease, holding it; a replica that created it meanwhile leads instead.
    async fn create(&mut self, name: &str, what: &str) -> Result<Attempt, Error> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(self.settings.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(self.spec(0, None)),
        };
        match tokio::time::timeout(
            crate::kubeapi::CALL_TIMEOUT,
            self.api.create(&PostParams::default(), &lease),
        )
        .await
        {
            Ok(Ok(l)) => {
                info!(lease = %what, identity = %self.settings.identity, "created the lease: leading");
                self.last = Some(l);
                Ok(Attempt::Leading)
            }
            Ok(Err(e)) if is_conflict(&e) => Ok(Attempt::Following {
                holder: "another replica (created concurrently)".into(),
            }),
            Ok(Err(e)) => Err(Error::kube(format!("create {what}"), e)),
            Err(_) => Err(Error::Timeout {
                what: format!("create {what}"),
                after: crate::kubeapi::CALL_TIMEOUT,
            }),
        }
    }

    /// One acquire-or-renew attempt.
    pub async fn try_acquire_or_renew(&mut self) -> Result<Attempt, Error> {
        let name = self.settings.lease_name.clone();
        let what = format!("lease {}/{name}", self.settings.namespace);
        let current = call(format!("get {what}"), self.api.get_opt(&name)).await?;
        let Some(current) = current else {
            return self.create(&name, &what).await;
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let rv = current
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        // Track when this record was first seen.
        match &self.observed {
            Some((seen, _)) if *seen == rv => {}
            _ => self.observed = Some((rv.clone(), Instant::now())),
        }
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(self.settings.lease_duration);
        let seen_for = self
            .observed
            .as_ref()
            .map(|(_, at)| at.elapsed())
            .unwrap_or_default();
        let mine = holder.as_deref() == Some(self.settings.identity.as_str());
        if !mine && holder.is_some() && seen_for < duration {
            return Ok(Attempt::Following {
                holder: holder.unwrap_or_default(),
            });
        }
        // Ours to renew, or free / expired to take.
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquire = if mine {
            spec.acquire_time.clone()
        } else {
            None
        };
        let mut next = current.clone();
        next.spec = Some(self.spec(transitions, acquire));
        match tokio::time::timeout(
            crate::kubeapi::CALL_TIMEOUT,
            self.api.replace(&name, &PostParams::default(), &next),
        )
        .await
        {
            Ok(Ok(l)) => {
                if !mine {
                    info!(lease = %what, identity = %self.settings.identity, previous = ?holder, "acquired the lease: leading");
                } else {
                    debug!(lease = %what, "renewed the lease");
                }
                self.observed = l
                    .metadata
                    .resource_version
                    .clone()
                    .map(|rv| (rv, Instant::now()));
                self.last = Some(l);
                Ok(Attempt::Leading)
            }
            // Someone wrote first: they lead (or we lost a renew race to a taker).
            Ok(Err(e)) if is_conflict(&e) => Ok(Attempt::Following {
                holder: "another replica (lost the update race)".into(),
            }),
            Ok(Err(e)) => Err(Error::kube(format!("update {what}"), e)),
            Err(_) => Err(Error::Timeout {
                what: format!("update {what}"),
                after: crate::kubeapi::CALL_TIMEOUT,
            }),
        }
    }

    /// Give the Lease up (on shutdown): clear the holder so another replica takes it at once.
    pub async fn release(&mut self) -> Result<(), Error> {
        let Some(mut lease) = self.last.take() else {
            return Ok(());
        };
        let name = self.settings.lease_name.clone();
        let what = format!("release lease {}/{name}", self.settings.namespace);
        let mine = lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(self.settings.identity.as_str());
        if !mine {
            return Ok(());
        }
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.lease_duration_seconds = Some(1);
            spec.renew_time = Some(now());
        }
        match tokio::time::timeout(
            RELEASE_TIMEOUT,
            self.api.replace(&name, &PostParams::default(), &lease),
        )
        .await
        {
            Ok(Ok(_)) => {
                info!(lease = %name, "released the lease");
                Ok(())
            }
            // Changed since our last write: it is not ours any more.
            Ok(Err(e)) if is_conflict(&e) || is_not_found(&e) => Ok(()),
            Ok(Err(e)) => Err(Error::kube(what, e)),
            Err(_) => Err(Error::Timeout {
                what,
                after: RELEASE_TIMEOUT,
            }),
        }
    }
}

/// Keep trying until this replica leads (then `fence` opens until the renew deadline after the
/// winning attempt started); `None` if `stop` fires first. Each attempt is bounded by the renew
/// deadline.
pub async fn acquire(
    elector: &mut Elector,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    fence: &Fence,
) -> Option<()> {
    let mut last_holder = String::new();
    let deadline = elector.settings().renew_deadline;
    loop {
        if *stop.borrow() {
            return None;
        }
        let started = Instant::now();
        match tokio::time::timeout(deadline, elector.try_acquire_or_renew()).await {
            Ok(Ok(Attempt::Leading)) => {
                fence.open_until(started + deadline);
                return Some(());
            }
            Ok(Ok(Attempt::Following { holder })) => {
                if holder != last_holder {
                    info!(holder = %holder, "another replica leads; standing by");
                    last_holder = holder;
                }
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "leader election attempt failed"),
            Err(_) => tracing::warn!(after = ?deadline, "leader election attempt timed out"),
        }
        let wait = elector.settings().retry_period;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Renew until `stop` fires (returns `true`) or leadership is lost (returns `false`, with the
/// fence closed): another replica took the Lease, or no renewal succeeded by the fence's
/// deadline (the renew deadline after the last successful renewal started). A renewal that
/// hangs is cut off at that deadline, not after the API call timeout: the leader stops acting
/// before the Lease can expire for the other replicas.
pub async fn hold(
    elector: &mut Elector,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    fence: &Fence,
) -> bool {
    let renew_deadline = elector.settings().renew_deadline;
    loop {
        let deadline = fence
            .deadline()
            .unwrap_or_else(|| Instant::now() + renew_deadline);
        let wait = elector.settings().retry_period;
        let wake = (Instant::now() + wait).min(deadline);
        tokio::select! {
            _ = tokio::time::sleep_until(wake.into()) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return true;
        }
        let started = Instant::now();
        let attempt = tokio::select! {
            a = tokio::time::timeout_at(deadline.into(), elector.try_acquire_or_renew()) => a,
            _ = stop.changed() => return true,
        };
        match attempt {
            Ok(Ok(Attempt::Leading)) => fence.open_until(started + renew_deadline),
            Ok(Ok(Attempt::Following { holder })) => {
                fence.close();
                tracing::error!(holder = %holder, "another replica took the lease: stopped acting");
                return false;
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "renewing the lease failed");
                if Instant::now() >= deadline {
                    fence.close();
                    tracing::error!(deadline = ?renew_deadline, "could not renew the lease within the renew deadline: stopped acting");
                    return false;
                }
            }
            Err(_) => {
                fence.close();
                tracing::error!(deadline = ?renew_deadline, "the lease renewal did not finish within the renew deadline: stopped acting");
                return false;
            }
        }
    }
}
