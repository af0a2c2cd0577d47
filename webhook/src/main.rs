//! `primus-webhook`: the validating admission webhook server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Parser;
use primus_oracle::profiles::Catalog;
use primus_runtime::flags::{positive_seconds, seconds};
use primus_runtime::logging::{self, LogFormat};
use primus_webhook::ca_secret::{self, Rotator};
use primus_webhook::metrics::Metrics;
use primus_webhook::rotation::Policy;
use primus_webhook::server::{self, State};
use primus_webhook::tls::{self, CertFiles, CertStore};
use primus_webhook::validate::{Settings, Validator};
use tokio::task::JoinHandle;

/// Validating admission webhook: denies PyTorchJobs whose parallel layout the memory model
/// predicts will run out of GPU memory, and checks TrainingPlans.
///
/// Endpoints (HTTPS): POST /validate/pytorchjob, /validate/pytorchjob/strict,
/// /validate/trainingplan; GET /healthz, /readyz, /metrics.
///
/// Every flag also reads an environment variable (`PRIMUS_WEBHOOK_*`, `POD_NAMESPACE`);
/// durations are `--*-seconds`, fractions allowed.
#[derive(Debug, Parser)]
#[command(name = "primus-webhook", version)]
struct Args {
    /// Address and port of the HTTPS server.
    #[arg(long, env = "PRIMUS_WEBHOOK_LISTEN", default_value = "0.0.0.0:8443")]
    listen: SocketAddr,

    /// Serving certificate (PEM chain); re-read when it changes on disk.
    #[arg(
        long,
        env = "PRIMUS_WEBHOOK_TLS_CERT_FILE",
        default_value = "/etc/primus-webhook/tls/tls.crt"
    )]
    tls_cert_file: PathBuf,

    /// Private key of the serving certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long,
        env = "PRIMUS_WEBHOOK_TLS_KEY_FILE",
        default_value = "/etc/primus-webhook/tls/tls.key"
    )]
    tls_key_file: PathBuf,

    /// Seconds between checks of the certificate files (or the --cert-secret Secret) for changes.
    #[arg(
        long,
        visible_alias = "cert-reload-interval",
        env = "PRIMUS_WEBHOOK_CERT_RELOAD_INTERVAL_SECONDS",
        value_name = "SECONDS",
        default_value = "10",
        value_parser = positive_seconds
    )]
    cert_reload_interval_seconds: Duration,

    /// Generate a CA and a serving certificate at start-up instead of reading files (the CA
    /// goes into --webhook-configuration's caBundle). Without --cert-secret one replica only:
    /// every replica makes its own CA.
    #[arg(long, env = "PRIMUS_WEBHOOK_SELF_SIGNED")]
    self_signed: bool,

    /// Self-signed mode for any number of replicas (implies --self-signed): the CA and the
    /// serving certificate live in this Secret of the service's namespace, created and rotated
    /// by whichever replica finds it due (optimistic concurrency), read and hot-reloaded by all
    /// every --cert-reload-interval-seconds. RBAC: get and update on that Secret.
    #[arg(long, env = "PRIMUS_WEBHOOK_CERT_SECRET", value_name = "NAME")]
    cert_secret: Option<String>,

    /// Lifetime of a CA made with --cert-secret; a new CA is staged when a third is left.
    #[arg(
        long,
        env = "PRIMUS_WEBHOOK_CA_VALIDITY_SECONDS",
        value_name = "SECONDS",
        default_value = "94608000",
        value_parser = positive_seconds
    )]
    ca_validity_seconds: Duration,

    /// Lifetime of a serving certificate made with --cert-secret; renewed when a third is left.
    #[arg(
        long,
        env = "PRIMUS_WEBHOOK_CERT_VALIDITY_SECONDS",
        value_name = "SECONDS",
        default_value = "7776000",
        value_parser = positive_seconds
    )]
    cert_validity_seconds: Duration,

    /// With --cert-secret: time between the steps of a CA rotation (the new CA joins the
    /// caBundle; signs; the old one leaves), so every replica and the API server catch up.
    #[arg(
        long,
        env = "PRIMUS_WEBHOOK_CA_OVERLAP_SECONDS",
        value_name = "SECONDS",
        default_value = "3600",
        value_parser = positive_seconds
    )]
    ca_overlap_seconds: Duration,

    /// Extra subject alternative names (DNS names or IP addresses) of the self-signed
    /// certificate; localhost, 127.0.0.1 and the service's DNS names are always in it
    /// (repeat the flag, or separate them with commas in the variable).
    #[arg(
        long = "self-signed-san",
        env = "PRIMUS_WEBHOOK_SELF_SIGNED_SANS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    self_signed_sans: Vec<String>,

    /// Name of the Service in front of the webhook (its DNS names go into the self-signed
    /// certificate).
    #[arg(long, env = "PRIMUS_WEBHOOK_SERVICE_NAME")]
    service_name: Option<String>,

    /// Namespace of that Service.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    service_namespace: String,

    /// Self-signed mode: also write ca.crt, tls.crt and tls.key into this directory.
    #[arg(long, env = "PRIMUS_WEBHOOK_CERT_DIR")]
    cert_dir: Option<PathBuf>,

    /// Self-signed mode: the ValidatingWebhookConfiguration whose webhooks get the CA (with
    /// --cert-secret: every CA of the Secret) as caBundle (server-side apply, field manager
    /// primus-webhook), re-checked periodically. The webhook is ready only once it is patched.
    #[arg(long, env = "PRIMUS_WEBHOOK_CONFIGURATION")]
    webhook_configuration: Option<String>,

    /// Seconds between re-checks of the caBundle in self-signed mode.
    #[arg(
        long,
        visible_alias = "ca-bundle-resync",
        env = "PRIMUS_WEBHOOK_CA_BUNDLE_RESYNC_SECONDS",
        value_name = "SECONDS",
        default_value = "60",
        value_parser = positive_seconds
    )]
    ca_bundle_resync_seconds: Duration,

    /// Deny PyTorchJobs whose model, GPU, training settings or world size cannot be derived
    /// (default: allow them with a warning). Per namespace, route to /validate/pytorchjob/strict.
    #[arg(long, env = "PRIMUS_WEBHOOK_STRICT")]
    strict: bool,

    /// Fraction of usable GPU memory above which an admitted job gets a warning.
    #[arg(long, env = "PRIMUS_WEBHOOK_HEADROOM", default_value_t = 0.92)]
    headroom: f64,

    /// Directory with extra profiles (models/*.yaml, hardware/*.yaml) added to the built-in ones.
    #[arg(long, env = "PRIMUS_WEBHOOK_PROFILES_DIR")]
    profiles_dir: Option<PathBuf>,

    /// Largest request body accepted, bytes (HTTP 413 above).
    #[arg(long, env = "PRIMUS_WEBHOOK_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    max_body_bytes: u64,

    /// Time budget of one admission review, seconds (keep it well under the configuration's
    /// timeoutSeconds).
    #[arg(
        long,
        env = "PRIMUS_WEBHOOK_BUDGET_SECONDS",
        value_name = "SECONDS",
        default_value = "2",
        value_parser = positive_seconds
    )]
    budget_seconds: Duration,

    /// Admission reviews evaluated at once; beyond it a review is answered at once with HTTP
    /// 429 and the API server applies the webhook's failurePolicy.
    #[arg(long, env = "PRIMUS_WEBHOOK_MAX_IN_FLIGHT", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    max_in_flight: u32,

    /// Time the nearest-layout search of a denial may take, seconds.
    #[arg(
        long,
        env = "PRIMUS_WEBHOOK_SUGGEST_BUDGET_SECONDS",
        value_name = "SECONDS",
        default_value = "0.25",
        value_parser = seconds
    )]
    suggest_budget_seconds: Duration,

    /// Layouts suggested in a denial.
    #[arg(long, env = "PRIMUS_WEBHOOK_MAX_SUGGESTIONS", default_value_t = 3)]
    max_suggestions: usize,

    /// Also serve /metrics, /healthz and /readyz over plain HTTP on this address.
    #[arg(long, env = "PRIMUS_WEBHOOK_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,

    /// Seconds open connections get to finish after SIGTERM.
    #[arg(
        long,
        visible_alias = "shutdown-grace",
        env = "PRIMUS_WEBHOOK_SHUTDOWN_GRACE_SECONDS",
        value_name = "SECONDS",
        default_value = "10",
        value_parser = positive_seconds
    )]
    shutdown_grace_seconds: Duration,

    /// Seconds to keep serving after SIGTERM with /readyz failing, so endpoints stop routing
    /// here before the listener closes (a few seconds in a cluster).
    #[arg(
        long,
        visible_alias = "shutdown-delay",
        env = "PRIMUS_WEBHOOK_SHUTDOWN_DELAY_SECONDS",
        value_name = "SECONDS",
        default_value = "0",
        value_parser = seconds
    )]
    shutdown_delay_seconds: Duration,

    /// Log format (level from RUST_LOG, default info).
    #[arg(
        long,
        env = "PRIMUS_WEBHOOK_LOG_FORMAT",
        value_enum,
        default_value = "auto"
    )]
    log_format: LogFormat,
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
    }
}

/// The lifetimes of --cert-secret mode, checked against each other.
fn rotation_policy(args: &Args) -> Result<Policy> {
    let policy = Policy {
        ca_validity: args.ca_validity_seconds,
        cert_validity: args.cert_validity_seconds,
        overlap: args.ca_overlap_seconds,
    };
    if args.cert_secret.is_some() {
        policy
            .check(args.cert_reload_interval_seconds)
            .map_err(anyhow::Error::msg)?;
    }
    Ok(policy)
}

/// Flags that clap cannot check alone.
fn check_args(args: &Args) -> Result<()> {
    if !(args.headroom > 0.0 && args.headroom <= 1.0) {
        bail!(
            "--headroom: must be a fraction in (0, 1], got {}",
            args.headroom
        );
    }
    rotation_policy(args)?;
    Ok(())
}

/// The validator and the request handlers' state (not ready yet).
fn build_state(args: &Args) -> Result<Arc<State>> {
    let mut catalog = Catalog::builtin().context("loading the built-in profiles")?;
    if let Some(dir) = &args.profiles_dir {
        catalog
            .load_dir(dir)
            .with_context(|| format!("loading profiles from {}", dir.display()))?;
    }
    let settings = Settings {
        headroom: args.headroom,
        strict: args.strict,
        suggest_budget: args.suggest_budget_seconds,
        max_suggestions: args.max_suggestions,
    };
    Ok(Arc::new(State {
        validator: Validator::new(catalog, settings),
        metrics: Metrics::new().context("registering metrics")?,
        ready: AtomicBool::new(false),
        max_body_bytes: args.max_body_bytes,
        budget: args.budget_seconds,
        slots: Arc::new(tokio::sync::Semaphore::new(args.max_in_flight as usize)),
    }))
}

/// Names of a self-signed serving certificate: loopback, the service's DNS names, the extras.
fn self_signed_sans(args: &Args) -> Vec<String> {
    let mut sans = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    if let Some(svc) = &args.service_name {
        let ns = &args.service_namespace;
        sans.extend([
            svc.clone(),
            format!("{svc}.{ns}"),
            format!("{svc}.{ns}.svc"),
            format!("{svc}.{ns}.svc.cluster.local"),
        ]);
    }
    for s in &args.self_signed_sans {
        if !sans.contains(s) {
            sans.push(s.clone());
        }
    }
    sans
}

/// The serving certificate and the tasks that keep it current (and ready set once it is).
async fn certificates(
    args: &Args,
    state: &Arc<State>,
) -> Result<(Arc<CertStore>, Vec<JoinHandle<()>>)> {
    if let Some(secret) = &args.cert_secret {
        return shared_secret_certificates(args, secret, state).await;
    }
    if args.self_signed {
        return self_signed_certificates(args, state).await;
    }
    let files = CertFiles {
        cert: args.tls_cert_file.clone(),
        key: args.tls_key_file.clone(),
    };
    let (bytes, key) = files
        .load()
        .context("loading the serving certificate (or run with --self-signed)")?;
    let store = CertStore::new(key);
    let watcher = tokio::spawn(tls::watch_files(
        files,
        store.clone(),
        bytes,
        args.cert_reload_interval_seconds,
        state.metrics.clone(),
    ));
    state.set_ready(true);
    Ok((store, vec![watcher]))
}

/// --self-signed without a Secret: one CA per process, its caBundle patched and re-checked.
async fn self_signed_certificates(
    args: &Args,
    state: &Arc<State>,
) -> Result<(Arc<CertStore>, Vec<JoinHandle<()>>)> {
    let sans = self_signed_sans(args);
    let generated = tls::self_signed(&sans, 10).context("--self-signed")?;
    if let Some(dir) = &args.cert_dir {
        generated.write_to(dir).context("--cert-dir")?;
    }
    let store = CertStore::new(generated.certified_key()?);
    tracing::info!(sans = ?sans, "generated a self-signed CA and serving certificate");
    let Some(name) = args.webhook_configuration.clone() else {
        state.set_ready(true);
        return Ok((store, Vec::new()));
    };
    let client = kube::Client::try_default()
        .await
        .context("a Kubernetes client for --webhook-configuration")?;
    let ca = generated.ca_pem.clone();
    let state = state.clone();
    let resync = args.ca_bundle_resync_seconds;
    let task = tokio::spawn(async move {
        let mut patched_once = false;
        loop {
            let wait = match tls::patch_ca_bundle(client.clone(), &name, &ca).await {
                Ok(n) => {
                    if n > 0 {
                        tracing::info!(configuration = %name, webhooks = n, "caBundle patched");
                    }
                    if !patched_once {
                        patched_once = true;
                        state.set_ready(true);
                    }
                    resync
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot patch the caBundle yet; retrying");
                    Duration::from_secs(2).min(resync)
                }
            };
            tokio::time::sleep(wait).await;
        }
    });
    Ok((store, vec![task]))
}

/// --cert-secret: serve a throw-away certificate (not ready) until the shared Secret's is loaded.
async fn shared_secret_certificates(
    args: &Args,
    secret: &str,
    state: &Arc<State>,
) -> Result<(Arc<CertStore>, Vec<JoinHandle<()>>)> {
    let sans = self_signed_sans(args);
    let placeholder = tls::self_signed(&sans, 1).context("--cert-secret")?;
    let store = CertStore::new(placeholder.certified_key()?);
    let client = kube::Client::try_default()
        .await
        .context("a Kubernetes client for --cert-secret")?;
    let config = ca_secret::Config {
        secret: secret.to_string(),
        namespace: args.service_namespace.clone(),
        configuration: args.webhook_configuration.clone(),
        policy: rotation_policy(args)?,
        sans,
        reload: args.cert_reload_interval_seconds,
        resync: args.ca_bundle_resync_seconds,
    };
    tracing::info!(secret = %config.secret, namespace = %config.namespace, "certificates from the shared Secret");
    let rotator = Rotator::new(config, client, store.clone(), state.clone());
    Ok((store, vec![tokio::spawn(rotator.run())]))
}

/// Serve HTTPS (and the plain operations port) until SIGTERM, then drain.
async fn serve(
    args: &Args,
    state: Arc<State>,
    store: Arc<CertStore>,
    mut background: Vec<JoinHandle<()>>,
) -> Result<()> {
    let tls_config = tls::server_config(store)?;
    let listener = server::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}", args.listen))?;
    tracing::info!(
        listen = %listener.local_addr().unwrap_or(args.listen),
        strict = args.strict,
        headroom = args.headroom,
        "primus-webhook serving"
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wait_stop = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    if let Some(addr) = args.metrics_listen {
        let plain = server::bind(addr)
            .await
            .with_context(|| format!("--metrics-listen {addr}"))?;
        background.push(tokio::spawn(server::serve_plain(
            plain,
            state.clone(),
            primus_runtime::http::HEADER_READ_TIMEOUT,
            wait_stop(stop_rx.clone()),
        )));
    }
    let signal_state = state.clone();
    let delay = args.shutdown_delay_seconds;
    tokio::spawn(async move {
        shutdown_signal().await;
        signal_state.set_ready(false);
        if !delay.is_zero() {
            tracing::info!(
                seconds = delay.as_secs_f64(),
                "not ready; serving on until endpoints drop this pod"
            );
            tokio::time::sleep(delay).await;
        }
        let _ = stop_tx.send(true);
    });
    let grace = args.shutdown_grace_seconds;
    server::serve_tls(listener, tls_config, state, wait_stop(stop_rx), grace).await;
    for task in background {
        task.abort();
    }
    tracing::info!("stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    logging::init(args.log_format, "info");
    primus_runtime::tls::install_ring_provider();
    check_args(&args)?;
    let state = build_state(&args)?;
    let (store, background) = certificates(&args, &state).await?;
    serve(&args, state, store, background).await
}
