//! Self-signed mode for any number of replicas: the CA and the serving certificate live in one
//! Secret that every replica reads (`--cert-secret`). Each replica, every
//! `--cert-reload-interval-seconds`:
//!
//! 1. reads the Secret (`get`);
//! 2. keeps the webhook configuration's caBundle equal to the Secret's CAs (`get`, and a
//!    server-side apply of `caBundle` when it differs; re-checked every
//!    `--ca-bundle-resync-seconds` even when nothing changed, so a GitOps sync that blanked it
//!    is repaired);
//! 3. when [`rotation::next_step`] says the Secret needs a write (empty, renewal due, a CA
//!    rotation step), makes it and replaces the Secret under optimistic concurrency: the write
//!    carries the `resourceVersion` it read, so of two replicas deciding at once one wins and
//!    the other gets a conflict, drops its own certificates and reads the winner's;
//! 4. serves the Secret's certificate (new TLS handshakes get it at once; open connections
//!    keep theirs) and turns ready once the caBundle trusts it.
//!
//! The Secret is the chart's, created empty: the webhook needs only `get` and `update` on that
//! one name. A Secret emptied behind its back is written back from what the replica last read
//! (same CA, nothing for the API server to re-learn).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

use crate::pki;
use crate::rotation::{self, Material, Policy, Step, Want};
use crate::server::State;
use crate::tls::{self, CertStore, FIELD_MANAGER, TlsError};

/// What the shared-Secret mode needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// Name of the Secret (in `namespace`).
    pub secret: String,
    pub namespace: String,
    /// The ValidatingWebhookConfiguration whose caBundle follows the Secret.
    pub configuration: Option<String>,
    pub policy: Policy,
    /// Names of the serving certificate.
    pub sans: Vec<String>,
    /// Time between reads of the Secret.
    pub reload: Duration,
    /// Time between re-checks of an unchanged caBundle.
    pub resync: Duration,
}

/// The shared Secret: read, and replaced only over the version that was read.
struct SharedSecret {
    secrets: Api<Secret>,
    name: String,
}

/// How a write ended.
enum Written {
    Done,
    /// Another replica wrote first.
    Conflict,
}

impl SharedSecret {
    fn error(&self, source: kube::Error) -> TlsError {
        TlsError::Secret {
            name: self.name.clone(),
            source,
        }
    }

    async fn read(&self) -> Result<Secret, TlsError> {
        self.secrets
            .get(&self.name)
            .await
            .map_err(|e| self.error(e))
    }

    /// Replace the data of `base` (as read) with `m`. The request carries `base`'s
    /// resourceVersion: a Secret changed since is a [`Written::Conflict`], not overwritten.
    async fn write(&self, mut base: Secret, m: &Material) -> Result<Written, TlsError> {
        base.data = Some(
            m.to_data()
                .into_iter()
                .map(|(k, v)| (k, ByteString(v)))
                .collect(),
        );
        base.string_data = None;
        base.metadata.managed_fields = None;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match self.secrets.replace(&self.name, &params, &base).await {
            Ok(_) => Ok(Written::Done),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(Written::Conflict),
            Err(e) => Err(self.error(e)),
        }
    }
}

fn data_of(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// One replica's side of the shared Secret.
pub struct Rotator {
    cfg: Config,
    secret: SharedSecret,
    client: kube::Client,
    certs: Arc<CertStore>,
    state: Arc<State>,
    /// What this replica last read (or wrote).
    remembered: Option<Material>,
    /// The certificate served now (PEM).
    serving: Option<String>,
    /// The caBundle last found in the configuration, and when.
    bundle_seen: Option<(String, Instant)>,
    became_ready: bool,
}

impl Rotator {
    pub fn new(
        cfg: Config,
        client: kube::Client,
        certs: Arc<CertStore>,
        state: Arc<State>,
    ) -> Rotator {
        let secret = SharedSecret {
            secrets: Api::namespaced(client.clone(), &cfg.namespace),
            name: cfg.secret.clone(),
        };
        Rotator {
            cfg,
            secret,
            client,
            certs,
            state,
            remembered: None,
            serving: None,
            bundle_seen: None,
            became_ready: false,
        }
    }

    /// Run until the task is dropped.
    pub async fn run(mut self) {
        loop {
            let wait = self.tick().await;
            tokio::time::sleep(wait).await;
        }
    }

    /// One pass: read, keep the caBundle, write what is due, serve. Returns the time to the
    /// next pass.
    async fn tick(&mut self) -> Duration {
        let retry = Duration::from_secs(2).min(self.cfg.reload);
        let base = match self.secret.read().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, namespace = %self.cfg.namespace, "cannot read the certificate Secret; serving what was loaded before");
                return retry;
            }
        };
        let mut current = match Material::from_data(&data_of(&base)) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, secret = %self.cfg.secret, "the certificate Secret holds no usable set; replacing it");
                None
            }
        };
        let mut in_step = match &current {
            Some(m) => self.keep_bundle(m).await,
            None => false,
        };
        let want = Want {
            policy: self.cfg.policy,
            sans: &self.cfg.sans,
            now: pki::unix_now(),
        };
        if let Some(step) =
            rotation::next_step(current.as_ref(), self.remembered.as_ref(), &want, in_step)
        {
            let written = self.write(step, base, current.as_ref(), &want).await;
            let Some(m) = written else {
                // Lost a race, or failed: read again soon.
                return Duration::from_millis(200).min(self.cfg.reload);
            };
            in_step = self.keep_bundle(&m).await;
            current = Some(m);
        }
        if let Some(m) = current {
            self.serve(&m, in_step);
            self.remembered = Some(m);
        }
        self.cfg.reload
    }

    /// Make and write the Secret's next contents; the new contents when this replica's write won.
    async fn write(
        &self,
        step: Step,
        base: Secret,
        current: Option<&Material>,
        want: &Want<'_>,
    ) -> Option<Material> {
        let next = match rotation::apply(step, current, self.remembered.as_ref(), want) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %e, step = step.as_str(), "cannot make certificates");
                return None;
            }
        };
        match self.secret.write(base, &next).await {
            Ok(Written::Done) => {
                self.state
                    .metrics
                    .cert_rotations
                    .with_label_values(&[step.as_str()])
                    .inc();
                tracing::info!(
                    step = step.as_str(),
                    secret = %self.cfg.secret,
                    ca_expires = next.signer.not_after,
                    serving_expires = next.serving.not_after,
                    trusted_cas = next.trusted().len(),
                    "certificate Secret written"
                );
                Some(next)
            }
            Ok(Written::Conflict) => {
                tracing::debug!(
                    step = step.as_str(),
                    "another replica wrote the certificate Secret first"
                );
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, step = step.as_str(), "cannot write the certificate Secret (RBAC: get and update on it)");
                None
            }
        }
    }

    /// Keep the configuration's caBundle equal to `m`'s CAs. True when it is.
    async fn keep_bundle(&mut self, m: &Material) -> bool {
        let Some(name) = self.cfg.configuration.clone() else {
            return true;
        };
        let bundle = m.bundle();
        if let Some((seen, at)) = &self.bundle_seen
            && *seen == bundle
            && at.elapsed() < self.cfg.resync
        {
            return true;
        }
        match tls::patch_ca_bundle(self.client.clone(), &name, &bundle).await {
            Ok(n) => {
                if n > 0 {
                    tracing::info!(configuration = %name, webhooks = n, trusted_cas = m.trusted().len(), "caBundle patched");
                }
                self.bundle_seen = Some((bundle, Instant::now()));
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot patch the caBundle yet; retrying");
                self.bundle_seen = None;
                false
            }
        }
    }

    /// Serve `m`'s certificate if it is not served yet; turn ready once the caBundle trusts it.
    fn serve(&mut self, m: &Material, in_step: bool) {
        if self.serving.as_deref() != Some(m.serving.cert_pem.as_str()) {
            match tls::certified_key(
                m.serving.cert_pem.as_bytes(),
                m.serving.key_pem.as_bytes(),
                rotation::keys::TLS_CERT,
                rotation::keys::TLS_KEY,
            ) {
                Ok(key) => {
                    self.certs.set(key);
                    self.serving = Some(m.serving.cert_pem.clone());
                    let metrics = &self.state.metrics;
                    metrics.cert_reloads.with_label_values(&["ok"]).inc();
                    metrics
                        .cert_expiry
                        .with_label_values(&["serving"])
                        .set(m.serving.not_after);
                    metrics
                        .cert_expiry
                        .with_label_values(&["ca"])
                        .set(m.signer.not_after);
                    tracing::info!(
                        expires = m.serving.not_after,
                        "serving the certificate of the Secret"
                    );
                }
                Err(e) => {
                    self.state
                        .metrics
                        .cert_reloads
                        .with_label_values(&["error"])
                        .inc();
                    tracing::warn!(error = %e, "the Secret's serving certificate does not load");
                    return;
                }
            }
        }
        if in_step && !self.became_ready {
            self.became_ready = true;
            self.state.set_ready(true);
        }
    }
}
