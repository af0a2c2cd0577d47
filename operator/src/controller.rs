//! The controller around [`reconcile`]: its watches (plans decoded one by one, and the pods,
//! reports and jobs they own), the run until a halt with a bounded wait for passes in flight,
//! and the sweep that forgets the per-plan state (metric series, error backoff) of plans that
//! are gone, whether or not a pass saw them go.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{self, Controller};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use primus_crds::JobKind;
use primus_crds::annotations::MANAGED_BY;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::benchmark::{COMPONENT, COMPONENT_LABEL};
use crate::context::Context;
use crate::decoded::PlanObject;
use crate::kubeapi::{job_resource, report_resource};
use crate::{job, reconcile};

/// How often the sweep compares the per-plan state with the plans that exist.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(2);

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

/// The controller: plans (each decoded on its own, so one the types cannot read does not fail
/// the list), the benchmark pods, reports and PyTorchJobs they own.
pub async fn build(
    client: &kube::Client,
    namespace: Option<&str>,
    ctx: &Arc<Context>,
    concurrency: u16,
) -> Controller<PlanObject> {
    let plans: Api<PlanObject> = api(client, namespace);
    let pods: Api<Pod> = api(client, namespace);
    let pod_selector = format!(
        "{COMPONENT_LABEL}={COMPONENT},{MANAGED_BY}={}",
        crate::CONTROLLER
    );
    // Reports are watched untyped: only their owner references matter here, and a report the
    // types cannot read must not stop the watch.
    let report_ar = report_resource();
    let reports: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &report_ar),
        None => Api::all_with(client.clone(), &report_ar),
    };
    let mut c = Controller::new(plans, watcher::Config::default().any_semantic())
        .with_config(controller::Config::default().concurrency(concurrency))
        .owns(pods, watcher::Config::default().labels(&pod_selector))
        .owns_with(reports, report_ar, watcher::Config::default());
    // Watch PyTorchJobs even when the CRD is missing at start: the watch backs off and
    // recovers once it is installed (plans say it is missing meanwhile).
    match job::crd_present(ctx, JobKind::PyTorchJob).await {
        Ok(true) => {}
        Ok(false) => {
            warn!("the PyTorchJob CRD (kubeflow.org/v1) is not installed; plans will say so")
        }
        Err(e) => warn!(error = %e, "could not discover the PyTorchJob CRD"),
    }
    let mut kinds = vec![JobKind::PyTorchJob];
    // TrainJobs (Kubeflow Trainer v2, optional) are watched when Trainer is installed at start;
    // without it, plans that ask for one say so (and a later install is seen on their next
    // pass, without the watch's prompt wake-ups until the operator restarts).
    match job::crd_present(ctx, JobKind::TrainJob).await {
        Ok(true) => kinds.push(JobKind::TrainJob),
        Ok(false) => info!(
            "Kubeflow Trainer v2 (trainer.kubeflow.org/v1alpha1 TrainJob) is not installed: TrainJobs are not watched"
        ),
        Err(e) => {
            warn!(error = %e, "could not discover the TrainJob CRD: TrainJobs are not watched")
        }
    }
    for kind in kinds {
        let job_ar = job_resource(kind);
        let jobs: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &job_ar),
            None => Api::all_with(client.clone(), &job_ar),
        };
        c = c.owns_with(jobs, job_ar, watcher::Config::default());
    }
    c
}

/// Resolves when `rx` turns true (never, once its sender is gone: nobody can stop us then).
pub async fn until_true(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Run `controller` until `halt` turns true, then give passes in flight up to `grace` to end
/// (watches that cannot end, e.g. an initial list against an unreachable API server, are not
/// waited for).
pub async fn run(
    controller: Controller<PlanObject>,
    ctx: Arc<Context>,
    halt: watch::Receiver<bool>,
    grace: Duration,
) {
    let sweep = tokio::spawn(sweep(controller.store(), ctx.clone()));
    let run = controller
        .graceful_shutdown_on(until_true(halt.clone()))
        .run(reconcile::reconcile, reconcile::error_policy, ctx.clone())
        .for_each(|r| async move {
            match r {
                Ok((o, _)) => tracing::debug!(plan = %o, "reconciled"),
                // The sweep forgets deleted plans; this is the common case, seen at once.
                Err(controller::Error::ObjectNotFound(o)) => {
                    tracing::debug!(plan = %o, "plan gone")
                }
                Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(e) => warn!(error = %e, "controller"),
            }
        });
    let mut run = tokio::spawn(run);
    tokio::select! {
        _ = &mut run => warn!("the controller stopped"),
        _ = until_true(halt) => {
            let deadline = tokio::time::Instant::now() + grace;
            while !(run.is_finished() || ctx.in_flight() == 0) {
                if tokio::time::Instant::now() >= deadline {
                    warn!(timeout = ?grace, in_flight = ctx.in_flight(), "reconciles did not finish in time; exiting anyway");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), &mut run).await;
            run.abort();
        }
    }
    sweep.abort();
}

/// Every [`SWEEP_INTERVAL`], forget the metric series and backoff of plans the store no longer
/// holds. A deleted plan that owned nothing never gets a pass (nothing triggers one), and a plan
/// deleted while the watch was down leaves no delete event at all: only the store tells.
async fn sweep(store: Store<PlanObject>, ctx: Arc<Context>) {
    // Asked again each interval: the store wakes one waiter only (the controller's runner).
    loop {
        match tokio::time::timeout(SWEEP_INTERVAL, store.wait_until_ready()).await {
            Ok(Ok(())) => break,
            Ok(Err(_)) => return,
            Err(_) => {}
        }
    }
    tracing::debug!("the plan store is ready: sweeping");
    loop {
        let live: HashSet<String> = store
            .state()
            .iter()
            .map(|p| reconcile::key(&p.metadata))
            .collect();
        tracing::trace!(plans = live.len(), "sweep");
        for plan in ctx.forget_all_but(&live) {
            info!(plan = %plan, "plan deleted: its metrics and backoff are forgotten");
        }
        tokio::time::sleep(SWEEP_INTERVAL).await;
    }
}
