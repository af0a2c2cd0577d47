//! `primus-operator`: the TrainingPlan controller. Flags are listed by `--help`; every flag
//! also reads an environment variable (`PRIMUS_*`, `POD_NAME`, `POD_NAMESPACE`); durations are
//! `--*-seconds`, fractions allowed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, ValueEnum};
use primus_operator::controller::{self, until_true};
use primus_operator::drift::UrlRule;
use primus_operator::fence::{Fence, fenced_client};
use primus_operator::http::Health;
use primus_operator::leader::{self, Elector};
use primus_operator::metrics::Metrics;
use primus_operator::report_key::{self, ReportKey};
use primus_operator::{Config, Context};
use primus_oracle::profiles::Catalog;
use primus_oracle::report::Backend;
use primus_runtime::flags::seconds;
use primus_runtime::logging::{self, LogFormat};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Rocm,
    Cuda,
    Simulate,
}

/// The Primus Projection operator: TrainingPlan -> benchmark pods -> projection -> tuning ->
/// PyTorchJob -> drift.
#[derive(Debug, Parser)]
#[command(name = "primus-operator", version)]
struct Args {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "PRIMUS_NAMESPACE")]
    namespace: Option<String>,
    /// Address of the /metrics, /healthz and /readyz server.
    #[arg(long, env = "PRIMUS_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Image of benchmark pods when a plan gives none (it must contain `primus`).
    #[arg(long, env = "PRIMUS_BENCH_IMAGE")]
    bench_image: Option<String>,
    /// Service account of benchmark pods (needs get on trainingplans, create/patch on
    /// benchmarkreports); the namespace's default when unset.
    #[arg(long, env = "PRIMUS_BENCH_SERVICE_ACCOUNT")]
    bench_service_account: Option<String>,
    /// Benchmark backend when a plan gives none (default: the GPU vendor's).
    #[arg(long, env = "PRIMUS_BENCH_BACKEND", value_enum)]
    bench_backend: Option<BackendArg>,
    /// Elect a leader among replicas with a Lease (disable only for a single replica).
    #[arg(long, env = "PRIMUS_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(long, env = "PRIMUS_LEASE_NAME", default_value = "primus-operator")]
    lease_name: String,
    /// Namespace of the Lease (default: POD_NAMESPACE, else --namespace, else `default`).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Seconds a Lease is valid without renewal.
    #[arg(long, env = "PRIMUS_LEASE_DURATION_SECONDS", value_name = "SECONDS", default_value = "15", value_parser = seconds)]
    lease_duration_seconds: Duration,
    /// Seconds a leader keeps trying to renew before it steps down (less than the duration).
    #[arg(long, env = "PRIMUS_RENEW_DEADLINE_SECONDS", value_name = "SECONDS", default_value = "10", value_parser = seconds)]
    renew_deadline_seconds: Duration,
    /// Seconds between leader-election attempts.
    #[arg(long, env = "PRIMUS_RETRY_PERIOD_SECONDS", value_name = "SECONDS", default_value = "2", value_parser = seconds)]
    retry_period_seconds: Duration,
    /// This replica's identity in the Lease (default: POD_NAME, else host name and pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Plans reconciled at the same time.
    #[arg(long, env = "PRIMUS_CONCURRENCY", default_value_t = 4)]
    concurrency: u16,
    /// Seconds between passes over a Ready plan (watches trigger the rest; at least 1).
    #[arg(long, env = "PRIMUS_RESYNC_SECONDS", value_name = "SECONDS", default_value = "600", value_parser = seconds)]
    resync_seconds: Duration,
    /// Seconds between Prometheus drift queries of a plan (at least 1).
    #[arg(long, env = "PRIMUS_DRIFT_INTERVAL_SECONDS", value_name = "SECONDS", default_value = "60", value_parser = seconds)]
    drift_interval_seconds: Duration,
    /// Seconds past a benchmark's `timeoutSeconds` before a pod that never finished (e.g. no
    /// node took it) counts as a failed attempt.
    #[arg(long, env = "PRIMUS_BENCH_GRACE_SECONDS", value_name = "SECONDS", default_value = "30", value_parser = seconds)]
    bench_grace_seconds: Duration,
    /// Images a plan's `spec.benchmark.image` may name besides --bench-image: exact names, or
    /// prefixes ending in `*` (`registry.example.com/ml/primus:*`); repeat the flag or separate
    /// them with commas. A plan asking for another image is Stalled (ImageNotAllowed).
    #[arg(
        long = "bench-image-allow",
        env = "PRIMUS_BENCH_IMAGE_ALLOW",
        value_name = "IMAGE",
        value_delimiter = ','
    )]
    bench_image_allow: Vec<String>,
    /// Secret (in the lease namespace) holding the key benchmark-report tokens derive from;
    /// created with a random key when missing.
    #[arg(
        long,
        env = "PRIMUS_REPORT_KEY_SECRET",
        default_value = "primus-operator-report-key"
    )]
    report_key_secret: String,
    /// Where plans' `spec.drift.prometheus.url` may point: `scheme://host[:port]`, the host
    /// exact or `*.domain`; without a port only the scheme's default port (repeat the flag, or
    /// separate entries with commas in the variable). None by default: Prometheus drift
    /// queries are refused until the operator's administrators list their Prometheus.
    #[arg(
        long = "drift-url-allow",
        env = "PRIMUS_DRIFT_URL_ALLOW",
        value_name = "URL",
        value_delimiter = ','
    )]
    drift_url_allow: Vec<UrlRule>,
    /// The LLM endpoint of searcher `agent`: an OpenAI-compatible API base
    /// (`http://llm.internal:8000/v1`). Unset: agent plans get the exhaustive search's answer
    /// with reason AgentUnavailable.
    #[arg(long, env = "PRIMUS_AGENT_ENDPOINT")]
    agent_endpoint: Option<String>,
    /// Model sent to the endpoint when a plan names none.
    #[arg(long, env = "PRIMUS_AGENT_MODEL", default_value = "default")]
    agent_model: String,
    /// Bearer token for the endpoint (from the operator's Secret; environment only).
    #[arg(
        long,
        env = "PRIMUS_AGENT_API_KEY",
        hide_env_values = true,
        hide = true
    )]
    agent_api_key: Option<String>,
    /// Seconds to wait for one reply (a plan's timeoutSeconds may only lower it).
    #[arg(long, env = "PRIMUS_AGENT_TIMEOUT_SECONDS", value_name = "SECONDS", default_value = "60", value_parser = seconds)]
    agent_timeout_seconds: Duration,
    /// Most seconds one plan's agent search may take (a plan's budgetSeconds may only lower it).
    #[arg(long, env = "PRIMUS_AGENT_MAX_BUDGET_SECONDS", value_name = "SECONDS", default_value = "600", value_parser = seconds)]
    agent_max_budget_seconds: Duration,
    /// Extra profiles directory (models/ and hardware/ YAML files).
    #[arg(long, env = "PRIMUS_PROFILES_DIR")]
    profiles_dir: Option<PathBuf>,
    /// Seconds to finish in-flight work on SIGTERM before exiting anyway.
    #[arg(long, env = "PRIMUS_SHUTDOWN_TIMEOUT_SECONDS", value_name = "SECONDS", default_value = "5", value_parser = seconds)]
    shutdown_timeout_seconds: Duration,
    /// Log format.
    #[arg(long, env = "PRIMUS_LOG_FORMAT", value_enum, default_value = "auto")]
    log_format: LogFormat,
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "primus-operator".into());
    format!("{host}-{}", std::process::id())
}

fn main() -> ExitCode {
    let args = Args::parse();
    logging::init(args.log_format, "info,kube_runtime=warn,kube_client=warn");
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = match rt.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            error!(error = format!("{e:#}"), "operator failed");
            ExitCode::FAILURE
        }
    };
    // A tuning task still running on a blocking thread must not hold the exit.
    rt.shutdown_timeout(Duration::from_millis(500));
    code
}

/// Start up, lead (when elected), run the controller until a signal or lost leadership, step
/// down.
async fn run(args: Args) -> anyhow::Result<ExitCode> {
    primus_runtime::tls::install_ring_provider();
    let stop = signals();
    let catalog = catalog(&args)?;
    let metrics = Metrics::new();
    let health = Arc::new(Health::default());
    let (bound, http_task) = primus_operator::http::serve(
        args.metrics_addr,
        metrics.clone(),
        health.clone(),
        until_true(stop.clone()),
    )
    .await
    .with_context(|| format!("--metrics-addr {}", args.metrics_addr))?;
    info!(addr = %bound, "serving /metrics, /healthz and /readyz");
    let Some((client, kube_config)) = connect(&stop).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    health.set_ready(true);

    // The controller writes through the fence: only while this replica surely holds the
    // Lease (always, without leader election). The elector writes the Lease with its own client.
    let fence = if args.leader_elect {
        Fence::closed()
    } else {
        Fence::always()
    };
    let acting = fenced_client(kube_config, fence.clone()).context("the controller's client")?;
    let Some(report_key) = report_key(&args, &client, &stop).await else {
        return Ok(ExitCode::SUCCESS);
    };
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let ctx = Arc::new(Context::new(
        acting.clone(),
        config(&args, report_key),
        metrics.clone(),
        catalog,
        Some(identity.clone()),
    ));
    let (halt_tx, halt_rx) = watch::channel(false);
    let elected = Elected {
        client: &client,
        identity: &identity,
        stop: &stop,
        halt: &halt_tx,
        metrics: &metrics,
        fence: &fence,
    };
    let holder = match lead(&args, elected).await {
        Lead::Leading(holder) => holder,
        Lead::Stopped => {
            let _ = tokio::time::timeout(Duration::from_secs(1), http_task).await;
            return Ok(ExitCode::SUCCESS);
        }
    };
    // Stop the controller on SIGTERM as well.
    tokio::spawn(async move {
        until_true(stop).await;
        let _ = halt_tx.send(true);
    });
    // Building the controller asks the API server (discovery); a signal or a lost lease must
    // not wait for an answer that may never come.
    let build = controller::build(&acting, args.namespace.as_deref(), &ctx, args.concurrency);
    tokio::select! {
        c = build => {
            controller::run(c, ctx.clone(), halt_rx, args.shutdown_timeout_seconds).await;
        }
        _ = until_true(halt_rx.clone()) => info!("stopped before the controller started"),
    }
    metrics.leader.set(0);
    health.set_ready(false);
    let code = step_down(holder).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), http_task).await;
    info!("stopped");
    Ok(code)
}

/// SIGTERM / SIGINT -> true.
fn signals() -> watch::Receiver<bool> {
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = term => info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => info!("SIGINT: shutting down"),
        }
        let _ = stop_tx.send(true);
    });
    stop_rx
}

fn catalog(args: &Args) -> anyhow::Result<Catalog> {
    let mut catalog = Catalog::builtin().context("built-in profiles")?;
    if let Some(dir) = &args.profiles_dir {
        catalog.load_dir(dir).context("--profiles-dir")?;
    }
    Ok(catalog)
}

/// A client and its configuration, once the API server answers (`None`: stopped first; waits
/// are bounded by the stop signal, not by a count).
async fn connect(
    stop: &watch::Receiver<bool>,
) -> anyhow::Result<Option<(kube::Client, kube::Config)>> {
    let config = tokio::select! {
        c = kube::Config::infer() => c.context("Kubernetes client configuration")?,
        _ = until_true(stop.clone()) => return Ok(None),
    };
    let client = kube::Client::try_from(config.clone()).context("Kubernetes client")?;
    loop {
        let probe = tokio::time::timeout(Duration::from_secs(5), client.apiserver_version());
        tokio::select! {
            r = probe => match r {
                Ok(Ok(v)) => {
                    info!(server = %v.git_version, "connected to the API server");
                    return Ok(Some((client, config)));
                }
                Ok(Err(e)) => warn!(error = %e, "API server not reachable yet"),
                Err(_) => warn!("API server did not answer within 5s"),
            },
            _ = until_true(stop.clone()) => return Ok(None),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = until_true(stop.clone()) => return Ok(None),
        }
    }
}

/// The operator's configuration from its flags and its report key.
fn config(args: &Args, report_key: ReportKey) -> Config {
    Config {
        bench_image: args
            .bench_image
            .clone()
            .unwrap_or_else(|| Config::default().bench_image),
        bench_service_account: args.bench_service_account.clone(),
        bench_backend: args.bench_backend.map(|b| match b {
            BackendArg::Rocm => Backend::Rocm,
            BackendArg::Cuda => Backend::Cuda,
            BackendArg::Simulate => Backend::Simulate,
        }),
        resync: args.resync_seconds.max(Duration::from_secs(1)),
        drift_interval: args.drift_interval_seconds.max(Duration::from_secs(1)),
        bench_grace: args.bench_grace_seconds,
        drift_urls: args.drift_url_allow.clone(),
        bench_images: args.bench_image_allow.clone(),
        report_key,
        agent: args
            .agent_endpoint
            .as_ref()
            .filter(|e| !e.trim().is_empty())
            .map(|endpoint| primus_operator::choose::AgentEndpoint {
                endpoint: endpoint.trim().to_string(),
                model: args.agent_model.clone(),
                api_key: args.agent_api_key.clone().filter(|k| !k.is_empty()),
                timeout: args.agent_timeout_seconds.max(Duration::from_secs(1)),
                max_budget: args.agent_max_budget_seconds.max(Duration::from_secs(1)),
            }),
    }
}

/// The report key from its Secret (made when missing), retried until it is there or the
/// process stops (`None`).
async fn report_key(
    args: &Args,
    client: &kube::Client,
    stop: &watch::Receiver<bool>,
) -> Option<ReportKey> {
    let ns = lease_namespace(args);
    loop {
        match report_key::load_or_create(client, &ns, &args.report_key_secret).await {
            Ok(k) => return Some(k),
            Err(e) => warn!(error = %e, "cannot read or create the report key yet; retrying"),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
            _ = until_true(stop.clone()) => return None,
        }
    }
}

/// How leader election ended.
enum Lead {
    /// This replica acts; the task holding the Lease, when elected (its result: whether it
    /// stopped cleanly, and the elector to release the Lease with).
    Leading(Option<JoinHandle<(bool, Elector)>>),
    /// Stopped before leading.
    Stopped,
}

/// What leader election works with.
struct Elected<'a> {
    /// The elector's own client (its Lease writes are not fenced).
    client: &'a kube::Client,
    identity: &'a str,
    stop: &'a watch::Receiver<bool>,
    halt: &'a watch::Sender<bool>,
    metrics: &'a Metrics,
    fence: &'a Fence,
}

/// Wait to lead (or lead at once without leader election); the holder closes the fence, sets
/// the leader gauge to 0 and sends `halt` when the Lease is lost.
async fn lead(args: &Args, x: Elected<'_>) -> Lead {
    let Elected {
        client,
        identity,
        stop,
        halt,
        metrics,
        fence,
    } = x;
    if !args.leader_elect {
        metrics.leader.set(1);
        return Lead::Leading(None);
    }
    let settings = leader::Settings {
        lease_name: args.lease_name.clone(),
        namespace: lease_namespace(args),
        identity: identity.to_string(),
        lease_duration: args.lease_duration_seconds,
        renew_deadline: args.renew_deadline_seconds,
        retry_period: args.retry_period_seconds,
    };
    let mut e = Elector::new(client.clone(), settings);
    let mut s = stop.clone();
    info!(identity = %identity, lease = %args.lease_name, "waiting to lead");
    if leader::acquire(&mut e, &mut s, fence).await.is_none() {
        return Lead::Stopped;
    }
    metrics.leader.set(1);
    info!(identity = %identity, "leading");
    let halt = halt.clone();
    let mut s = stop.clone();
    let (fence, metrics) = (fence.clone(), metrics.clone());
    Lead::Leading(Some(tokio::spawn(async move {
        let clean = leader::hold(&mut e, &mut s, &fence).await;
        if !clean {
            metrics.leader.set(0);
            let _ = halt.send(true);
        }
        (clean, e)
    })))
}

/// The Lease's namespace: --lease-namespace (POD_NAMESPACE), else --namespace, else `default`.
fn lease_namespace(args: &Args) -> String {
    args.lease_namespace
        .clone()
        .or_else(|| args.namespace.clone())
        .unwrap_or_else(|| "default".into())
}

/// Release the Lease after a clean stop; exit non-zero after losing it (a fresh process then
/// stands for election).
async fn step_down(holder: Option<JoinHandle<(bool, Elector)>>) -> ExitCode {
    let Some(h) = holder else {
        return ExitCode::SUCCESS;
    };
    match tokio::time::timeout(Duration::from_secs(1), h).await {
        Ok(Ok((true, mut e))) => {
            if let Err(err) = e.release().await {
                warn!(error = %err, "could not release the lease (it expires by itself)");
            }
            ExitCode::SUCCESS
        }
        Ok(Ok((false, _))) => {
            error!("lost leadership; exiting so that a fresh process stands for election");
            ExitCode::FAILURE
        }
        _ => {
            warn!("the lease holder did not stop in time");
            ExitCode::SUCCESS
        }
    }
}
