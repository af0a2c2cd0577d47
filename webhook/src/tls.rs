//! TLS for the webhook: rustls with the ring provider (the project's one TLS stack). The
//! serving certificate comes from files that are re-read when they change on disk (a
//! cert-manager or Secret-volume rotation needs no restart), or from `--self-signed` mode,
//! which generates a CA and a serving certificate with rcgen and writes the CA into the
//! `caBundle` of the webhook's ValidatingWebhookConfiguration by server-side apply.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, Patch, PatchParams};
use primus_runtime::tls::ring_provider as provider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::metrics::Metrics;

/// Field manager of the webhook's server-side applies (the caBundle patch).
pub use primus_crds::annotations::WEBHOOK_MANAGER as FIELD_MANAGER;

/// What can go wrong with certificates.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate in it")]
    NoCertificate { path: String },
    #[error("{path}: no PEM private key in it (PKCS#8, PKCS#1 or SEC1)")]
    NoKey { path: String },
    #[error("{what}: {source}")]
    Rustls {
        what: String,
        #[source]
        source: rustls::Error,
    },
    #[error("generating the self-signed certificate: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("certificate: {0}")]
    BadCertificate(String),
    #[error("Secret {name}: {source}")]
    Secret {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("ValidatingWebhookConfiguration {name}: {source}")]
    Kube {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("ValidatingWebhookConfiguration {name} has no webhooks to give a caBundle")]
    NoWebhooks { name: String },
}

/// Parse PEM certificate chain and key into a key rustls can serve (and check they match).
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    cert_source: &str,
    key_source: &str,
) -> Result<CertifiedKey, TlsError> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &cert_pem[..])
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Io {
            path: cert_source.to_string(),
            source,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert_source.to_string(),
        });
    }
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut &key_pem[..])
        .map_err(|source| TlsError::Io {
            path: key_source.to_string(),
            source,
        })?
        .ok_or_else(|| TlsError::NoKey {
            path: key_source.to_string(),
        })?;
    CertifiedKey::from_der(certs, key, &provider()).map_err(|source| TlsError::Rustls {
        what: format!("{cert_source} with {key_source}"),
        source,
    })
}

/// The serving certificate in force; swapped when the files change.
#[derive(Debug)]
pub struct CertStore {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertStore {
    pub fn new(key: CertifiedKey) -> Arc<CertStore> {
        Arc::new(CertStore {
            current: RwLock::new(Arc::new(key)),
        })
    }

    pub fn set(&self, key: CertifiedKey) {
        let key = Arc::new(key);
        match self.current.write() {
            Ok(mut g) => *g = key,
            Err(poisoned) => *poisoned.into_inner() = key,
        }
    }

    pub fn get(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }
}

impl ResolvesServerCert for CertStore {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

/// The rustls server configuration: TLS 1.2 and 1.3, ALPN h2 and http/1.1, the certificate
/// from `store`.
pub fn server_config(store: Arc<CertStore>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions".into(),
            source,
        })?
        .with_no_client_auth()
        .with_cert_resolver(store);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Certificate and key files.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    primus_oracle::bounds::read_file(path, primus_oracle::bounds::limits::DOCUMENT_BYTES).map_err(
        |source| TlsError::Io {
            path: path.display().to_string(),
            source,
        },
    )
}

impl CertFiles {
    /// Read both files: their bytes (to notice changes) and the key they make.
    pub fn load(&self) -> Result<(Vec<u8>, CertifiedKey), TlsError> {
        let cert = read(&self.cert)?;
        let key = read(&self.key)?;
        let ck = certified_key(
            &cert,
            &key,
            &self.cert.display().to_string(),
            &self.key.display().to_string(),
        )?;
        let mut both = cert;
        both.extend_from_slice(&key);
        Ok((both, ck))
    }

    fn contents(&self) -> Option<Vec<u8>> {
        let mut both = read(&self.cert).ok()?;
        both.extend_from_slice(&read(&self.key).ok()?);
        Some(both)
    }
}

/// Re-read the files every `interval`; when their contents change and they make a valid
/// key, serve it (new handshakes get it; open connections keep theirs). A bad pair (e.g.
/// caught between the writes of the certificate and the key) keeps the old key and is retried
/// at the next tick. Runs until the task is dropped.
pub async fn watch_files(
    files: CertFiles,
    store: Arc<CertStore>,
    initial: Vec<u8>,
    interval: Duration,
    metrics: Metrics,
) {
    let mut loaded = initial;
    let mut failed: Option<Vec<u8>> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let files2 = files.clone();
        let Ok(Some(now)) = tokio::task::spawn_blocking(move || files2.contents()).await else {
            continue;
        };
        if now == loaded || failed.as_ref() == Some(&now) {
            continue;
        }
        match files.load() {
            Ok((bytes, key)) => {
                store.set(key);
                loaded = bytes;
                failed = None;
                metrics.cert_reloads.with_label_values(&["ok"]).inc();
                tracing::info!(cert = %files.cert.display(), "serving certificate reloaded from disk");
            }
            Err(e) => {
                failed = Some(now);
                metrics.cert_reloads.with_label_values(&["error"]).inc();
                tracing::warn!(error = %e, "the changed certificate files do not load; still serving the previous certificate");
            }
        }
    }
}

/// A CA and a serving certificate signed by it (PEM).
#[derive(Debug, Clone)]
pub struct SelfSigned {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// Generate a CA and a serving certificate for `sans` (DNS names or IP addresses), valid from
/// an hour ago ([`crate::pki::BACKDATE_SECONDS`]) for `years` years (ECDSA P-256): the CA and
/// the certificate the self-signed mode's [`crate::pki`] makes, from the same functions.
pub fn self_signed(sans: &[String], years: i32) -> Result<SelfSigned, TlsError> {
    const YEAR: u64 = 31_556_952;
    let validity = std::time::Duration::from_secs(years.max(1) as u64 * YEAR);
    let now = crate::pki::unix_now();
    let ca = crate::pki::new_authority(now, validity)?;
    let leaf = crate::pki::issue(&ca, sans, now, validity)?;
    Ok(SelfSigned {
        ca_pem: ca.cert_pem,
        cert_pem: leaf.cert_pem,
        key_pem: leaf.key_pem,
    })
}

impl SelfSigned {
    /// The serving key.
    pub fn certified_key(&self) -> Result<CertifiedKey, TlsError> {
        certified_key(
            self.cert_pem.as_bytes(),
            self.key_pem.as_bytes(),
            "self-signed certificate",
            "self-signed key",
        )
    }

    /// Write `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `dir`.
    pub fn write_to(&self, dir: &Path) -> Result<(), TlsError> {
        let io = |path: &Path, source| TlsError::Io {
            path: path.display().to_string(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        for (name, text) in [
            ("ca.crt", &self.ca_pem),
            ("tls.crt", &self.cert_pem),
            ("tls.key", &self.key_pem),
        ] {
            let path = dir.join(name);
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, text).map_err(|e| io(&tmp, e))?;
            #[cfg(unix)]
            if name == "tls.key" {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
                    .map_err(|e| io(&tmp, e))?;
            }
            std::fs::rename(&tmp, &path).map_err(|e| io(&path, e))?;
        }
        Ok(())
    }
}

/// Make every webhook of the ValidatingWebhookConfiguration `name` trust `ca_pem`, by a
/// server-side apply of just their `clientConfig.caBundle` under [`FIELD_MANAGER`]. Returns
/// how many webhooks needed the change (0: all had it already, nothing written).
pub async fn patch_ca_bundle(
    client: kube::Client,
    name: &str,
    ca_pem: &str,
) -> Result<usize, TlsError> {
    let kube_err = |source| TlsError::Kube {
        name: name.to_string(),
        source,
    };
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
    let current = api.get(name).await.map_err(kube_err)?;
    let webhooks = current.webhooks.unwrap_or_default();
    if webhooks.is_empty() {
        return Err(TlsError::NoWebhooks {
            name: name.to_string(),
        });
    }
    let want = ByteString(ca_pem.as_bytes().to_vec());
    let stale = webhooks
        .iter()
        .filter(|w| w.client_config.ca_bundle.as_ref() != Some(&want))
        .count();
    if stale == 0 {
        return Ok(0);
    }
    let entries: Vec<serde_json::Value> = webhooks
        .iter()
        .map(|w| {
            serde_json::json!({
                "name": w.name,
                "clientConfig": {"caBundle": want},
            })
        })
        .collect();
    let patch = serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": entries,
    });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(kube_err)?;
    Ok(stale)
}
