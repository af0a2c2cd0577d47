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
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{self, Controller};
use kube::runtime::watcher;
use primus_crds::annotations::MANAGED_BY;
use primus_crds::{BenchmarkReport, TrainingPlan};
use primus_operator::benchmark::{COMPONENT, COMPONENT_LABEL};
use primus_operator::http::Health;
use primus_operator::kubeapi::pytorchjob_resource;
use primus_operator::leader::{self, Elector};
use primus_operator::metrics::Metrics;
use primus_operator::{Config, Context, job, reconcile};
use primus_oracle::profiles::Catalog;
use primus_oracle::report::Backend;
use primus_runtime::flags::seconds;
use primus_runtime::logging::{self, LogFormat};
use tokio::sync::watch;
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

/// Resolves when `rx` turns true.
async fn until_true(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            // The sender is gone: nobody can stop us any more, so wait forever.
            std::future::pending::<()>().await;
        }
    }
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

async fn run(args: Args) -> anyhow::Result<ExitCode> {
    primus_runtime::tls::install_ring_provider();
    let shutdown_timeout = args.shutdown_timeout_seconds;

    // SIGTERM / SIGINT -> stop.
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

    let mut catalog = Catalog::builtin().context("built-in profiles")?;
    if let Some(dir) = &args.profiles_dir {
        catalog.load_dir(dir).context("--profiles-dir")?;
    }
    let metrics = Metrics::new();
    let health = Arc::new(Health::default());
    let (bound, http_task) = primus_operator::http::serve(
        args.metrics_addr,
        metrics.clone(),
        health.clone(),
        until_true(stop_rx.clone()),
    )
    .await
    .with_context(|| format!("--metrics-addr {}", args.metrics_addr))?;
    info!(addr = %bound, "serving /metrics, /healthz and /readyz");

    let client = tokio::select! {
        c = kube::Client::try_default() => c.context("Kubernetes client configuration")?,
        _ = until_true(stop_rx.clone()) => return Ok(ExitCode::SUCCESS),
    };
    // Wait for the API server (bounded by the stop signal, not by a count).
    loop {
        let probe = tokio::time::timeout(Duration::from_secs(5), client.apiserver_version());
        tokio::select! {
            r = probe => match r {
                Ok(Ok(v)) => {
                    info!(server = %v.git_version, "connected to the API server");
                    break;
                }
                Ok(Err(e)) => warn!(error = %e, "API server not reachable yet"),
                Err(_) => warn!("API server did not answer within 5s"),
            },
            _ = until_true(stop_rx.clone()) => return Ok(ExitCode::SUCCESS),
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = until_true(stop_rx.clone()) => return Ok(ExitCode::SUCCESS),
        }
    }
    health.set_ready(true);

    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let config = Config {
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
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        config,
        metrics.clone(),
        catalog,
        Some(identity.clone()),
    ));

    // Leader election: only the leader runs the controller.
    let (halt_tx, halt_rx) = watch::channel(false);
    let mut holder = None;
    if args.leader_elect {
        let lease_namespace = args
            .lease_namespace
            .clone()
            .or_else(|| args.namespace.clone())
            .unwrap_or_else(|| "default".into());
        let settings = leader::Settings {
            lease_name: args.lease_name.clone(),
            namespace: lease_namespace,
            identity: identity.clone(),
            lease_duration: args.lease_duration_seconds,
            renew_deadline: args.renew_deadline_seconds,
            retry_period: args.retry_period_seconds,
        };
        let mut e = Elector::new(client.clone(), settings);
        let mut stop = stop_rx.clone();
        info!(identity = %identity, lease = %args.lease_name, "waiting to lead");
        if leader::acquire(&mut e, &mut stop).await.is_none() {
            let _ = tokio::time::timeout(Duration::from_secs(1), http_task).await;
            return Ok(ExitCode::SUCCESS);
        }
        metrics.leader.set(1);
        info!(identity = %identity, "leading");
        let halt = halt_tx.clone();
        let mut stop = stop_rx.clone();
        holder = Some(tokio::spawn(async move {
            let clean = leader::hold(&mut e, &mut stop).await;
            if !clean {
                let _ = halt.send(true);
            }
            (clean, e)
        }));
    } else {
        metrics.leader.set(1);
    }
    // Stop the controller on SIGTERM as well.
    {
        let halt = halt_tx.clone();
        let stop = stop_rx.clone();
        tokio::spawn(async move {
            until_true(stop).await;
            let _ = halt.send(true);
        });
    }

    let controller =
        build_controller(&client, args.namespace.as_deref(), &ctx, args.concurrency).await;
    let forget = ctx.clone();
    let run = controller
        .graceful_shutdown_on(until_true(halt_rx.clone()))
        .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
        .for_each(move |r| {
            let ctx = forget.clone();
            async move {
                match r {
                    Ok((o, _)) => tracing::debug!(plan = %o, "reconciled"),
                    Err(controller::Error::ObjectNotFound(o)) => {
                        ctx.metrics
                            .forget_plan(o.namespace.as_deref().unwrap_or_default(), &o.name);
                    }
                    Err(controller::Error::ReconcilerFailed(..)) => {}
                    Err(e) => warn!(error = %e, "controller"),
                }
            }
        });
    let mut run = tokio::spawn(run);
    tokio::select! {
        _ = &mut run => warn!("the controller stopped"),
        _ = until_true(halt_rx.clone()) => {
            // Let running passes finish (bounded); do not wait for watches that cannot end
            // (an unreachable API server keeps the controller's initial list pending).
            let deadline = tokio::time::Instant::now() + shutdown_timeout;
            loop {
                if run.is_finished() || ctx.in_flight() == 0 {
                    break;
                }
                if tokio::time::Instant::now() >= deadline {
                    warn!(timeout = ?shutdown_timeout, in_flight = ctx.in_flight(), "reconciles did not finish in time; exiting anyway");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), &mut run).await;
            run.abort();
        }
    }
    metrics.leader.set(0);
    health.set_ready(false);

    let mut code = ExitCode::SUCCESS;
    if let Some(h) = holder {
        match tokio::time::timeout(Duration::from_secs(1), h).await {
            Ok(Ok((true, mut e))) => {
                if let Err(err) = e.release().await {
                    warn!(error = %err, "could not release the lease (it expires by itself)");
                }
            }
            Ok(Ok((false, _))) => {
                error!("lost leadership; exiting so that a fresh process stands for election");
                code = ExitCode::FAILURE;
            }
            _ => warn!("the lease holder did not stop in time"),
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), http_task).await;
    info!("stopped");
    Ok(code)
}

async fn build_controller(
    client: &kube::Client,
    namespace: Option<&str>,
    ctx: &Arc<Context>,
    concurrency: u16,
) -> Controller<TrainingPlan> {
    fn api<K>(client: &kube::Client, ns: Option<&str>) -> Api<K>
    where
        K: kube::Resource<Scope = kube::core::NamespaceResourceScope>,
        <K as kube::Resource>::DynamicType: Default,
    {
        match ns {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        }
    }
    let plans: Api<TrainingPlan> = api(client, namespace);
    let pods: Api<Pod> = api(client, namespace);
    let reports: Api<BenchmarkReport> = api(client, namespace);
    let pod_selector = format!(
        "{COMPONENT_LABEL}={COMPONENT},{MANAGED_BY}={}",
        primus_operator::CONTROLLER
    );
    let mut c = Controller::new(plans, watcher::Config::default().any_semantic())
        .with_config(controller::Config::default().concurrency(concurrency))
        .owns(pods, watcher::Config::default().labels(&pod_selector))
        .owns(reports, watcher::Config::default());
    // Watch PyTorchJobs even when the CRD is missing at start: the watch backs off and
    // recovers once it is installed (plans say it is missing meanwhile).
    match job::crd_present(ctx).await {
        Ok(true) => {}
        Ok(false) => {
            warn!("the PyTorchJob CRD (kubeflow.org/v1) is not installed; plans will say so")
        }
        Err(e) => warn!(error = %e, "could not discover the PyTorchJob CRD"),
    }
    let ar = pytorchjob_resource();
    let jobs: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    c = c.owns_with(jobs, ar, watcher::Config::default());
    c
}
