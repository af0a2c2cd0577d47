//! A tiny validating admission webhook for tests: HTTPS on 127.0.0.1 with its own CA (the
//! API server reaches webhooks of the test bed by URL), registered for one namespace only (a
//! namespace selector on a label the test sets), answering each AdmissionReview with the
//! test's own rule: `deny(request)` returns the message of a denial, or `None` to allow.
//! Dropping it unregisters it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::TestBed;

/// The rule: the message of a denial for this `request` (the review's `request` object).
pub type Rule = dyn Fn(&Value) -> Option<String> + Send + Sync;

/// The running webhook; unregistered and stopped when dropped.
pub struct DenyWebhook {
    pub addr: SocketAddr,
    name: String,
    calls: Arc<AtomicUsize>,
    client: kube::Client,
    runtime: Option<tokio::runtime::Runtime>,
}

/// A CA and a serving certificate for 127.0.0.1 signed by it: (CA PEM, certificate, key).
fn certificates() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca_pem = ca.self_signed(&ca_key).expect("CA certificate").pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("serving key");
    let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let cert = params
        .signed_by(&key, &issuer)
        .expect("serving certificate");
    (ca_pem, cert.pem(), key.serialize_pem())
}

fn tls_config(cert: &str, key: &str) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate PEM");
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key PEM");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("serving certificate");
    Arc::new(config)
}

/// The answer to one review.
fn answer(body: &[u8], rule: &Rule) -> Value {
    let review: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let request = &review["request"];
    let uid = request["uid"].clone();
    let response = match rule(request) {
        None => json!({"uid": uid, "allowed": true}),
        Some(message) => json!({"uid": uid, "allowed": false,
            "status": {"code": 403, "reason": "Forbidden", "message": message}}),
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

async fn serve(
    listener: tokio::net::TcpListener,
    tls: Arc<rustls::ServerConfig>,
    rule: Arc<Rule>,
    calls: Arc<AtomicUsize>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let (acceptor, rule, calls) = (acceptor.clone(), rule.clone(), calls.clone());
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                let (rule, calls) = (rule.clone(), calls.clone());
                async move {
                    let body = req.into_body().collect().await?.to_bytes();
                    calls.fetch_add(1, Ordering::SeqCst);
                    let out = serde_json::to_vec(&answer(&body, rule.as_ref())).unwrap_or_default();
                    let mut resp = Response::new(Full::new(Bytes::from(out)));
                    resp.headers_mut().insert(
                        hyper::header::CONTENT_TYPE,
                        hyper::header::HeaderValue::from_static("application/json"),
                    );
                    Ok::<_, hyper::Error>(resp)
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await;
        });
    }
}

impl DenyWebhook {
    /// Serve `rule` for requests matching `rules` in `namespace` (labelled for the selector),
    /// with `failurePolicy: Fail`.
    pub fn start(
        tb: &TestBed,
        namespace: &str,
        rules: Vec<RuleWithOperations>,
        rule: impl Fn(&Value) -> Option<String> + Send + Sync + 'static,
    ) -> DenyWebhook {
        crate::install_crypto_provider();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("webhook runtime");
        let (ca, cert, key) = certificates();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let calls = Arc::new(AtomicUsize::new(0));
        runtime.spawn(serve(
            listener,
            tls_config(&cert, &key),
            Arc::new(rule),
            calls.clone(),
        ));
        let label = "primus.test/deny-webhook";
        tb.kubectl().ok(&[
            "label",
            "namespace",
            namespace,
            &format!("{label}={namespace}"),
            "--overwrite",
        ]);
        let name = format!("primus-test-deny-{namespace}");
        let config = ValidatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            webhooks: Some(vec![ValidatingWebhook {
                name: "deny.primus.test".into(),
                admission_review_versions: vec!["v1".into()],
                client_config: WebhookClientConfig {
                    url: Some(format!("https://{addr}/validate")),
                    ca_bundle: Some(ByteString(ca.into_bytes())),
                    service: None,
                },
                failure_policy: Some("Fail".into()),
                side_effects: "None".into(),
                timeout_seconds: Some(5),
                namespace_selector: Some(LabelSelector {
                    match_labels: Some([(label.to_string(), namespace.to_string())].into()),
                    ..LabelSelector::default()
                }),
                rules: Some(rules),
                ..ValidatingWebhook::default()
            }]),
        };
        let client = runtime.block_on(tb.client());
        let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        runtime
            .block_on(api.create(&PostParams::default(), &config))
            .expect("register the test webhook");
        // The API server picks up new configurations from an informer: give it a moment.
        std::thread::sleep(std::time::Duration::from_secs(2));
        DenyWebhook {
            addr,
            name,
            calls,
            client,
            runtime: Some(runtime),
        }
    }

    /// Reviews answered so far.
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

/// A rule for `operations` on `resources` of `group`/`version`.
pub fn rule(
    group: &str,
    version: &str,
    resources: &[&str],
    operations: &[&str],
) -> RuleWithOperations {
    RuleWithOperations {
        api_groups: Some(vec![group.into()]),
        api_versions: Some(vec![version.into()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        operations: Some(operations.iter().map(|o| o.to_string()).collect()),
        scope: Some("Namespaced".into()),
    }
}

impl Drop for DenyWebhook {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
            let _ = rt.block_on(api.delete(&self.name, &DeleteParams::default()));
            rt.shutdown_background();
        }
    }
}
