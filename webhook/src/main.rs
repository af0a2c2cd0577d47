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
use primus_webhook::metrics::Metrics;
use primus_webhook::server::{self, State};
use primus_webhook::tls::{self, CertFiles, CertStore};
use primus_webhook::validate::{Settings, Validator};

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

    /// Seconds between checks of the certificate files for changes.
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
    /// goes into --webhook-configuration's caBundle). One replica only: every replica makes
    /// its own CA.
    #[arg(long, env = "PRIMUS_WEBHOOK_SELF_SIGNED")]
    self_signed: bool,

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

    /// Self-signed mode: the ValidatingWebhookConfiguration whose webhooks get the CA as
    /// caBundle (server-side apply, field manager primus-webhook), re-checked periodically.
    /// The webhook is ready only once it has been patched.
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

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    logging::init(args.log_format, "info");
    primus_runtime::tls::install_ring_provider();

    if !(args.headroom > 0.0 && args.headroom <= 1.0) {
        bail!(
            "--headroom: must be a fraction in (0, 1], got {}",
            args.headroom
        );
    }
    let reload = args.cert_reload_interval_seconds;
    let resync = args.ca_bundle_resync_seconds;
    let grace = args.shutdown_grace_seconds;
    let delay = args.shutdown_delay_seconds;

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
    let metrics = Metrics::new().context("registering metrics")?;
    let state = Arc::new(State {
        validator: Validator::new(catalog, settings),
        metrics: metrics.clone(),
        ready: AtomicBool::new(false),
        max_body_bytes: args.max_body_bytes,
        budget: args.budget_seconds,
        slots: Arc::new(tokio::sync::Semaphore::new(args.max_in_flight as usize)),
    });

    let mut background = Vec::new();
    let store = if args.self_signed {
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
        let generated = tls::self_signed(&sans, 10).context("--self-signed")?;
        if let Some(dir) = &args.cert_dir {
            generated.write_to(dir).context("--cert-dir")?;
        }
        let store = CertStore::new(generated.certified_key()?);
        tracing::info!(sans = ?sans, "generated a self-signed CA and serving certificate");
        match &args.webhook_configuration {
            Some(name) => {
                let client = kube::Client::try_default()
                    .await
                    .context("a Kubernetes client for --webhook-configuration")?;
                let name = name.clone();
                let ca = generated.ca_pem.clone();
                let state = state.clone();
                background.push(tokio::spawn(async move {
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
                }));
            }
            None => state.set_ready(true),
        }
        store
    } else {
        let files = CertFiles {
            cert: args.tls_cert_file.clone(),
            key: args.tls_key_file.clone(),
        };
        let (bytes, key) = files
            .load()
            .context("loading the serving certificate (or run with --self-signed)")?;
        let store = CertStore::new(key);
        background.push(tokio::spawn(tls::watch_files(
            files,
            store.clone(),
            bytes,
            reload,
            metrics.clone(),
        )));
        state.set_ready(true);
        store
    };
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
    server::serve_tls(listener, tls_config, state, wait_stop(stop_rx), grace).await;
    for task in background {
        task.abort();
    }
    tracing::info!("stopped");
    Ok(())
}
