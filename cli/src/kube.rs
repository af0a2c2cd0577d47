//! The Kubernetes side of the CLI (`primus bench --plan/--report-to`, `primus report`): a client
//! from `KUBECONFIG` (or `~/.kube/config`, or the pod's service account in a cluster) and the
//! typed TrainingPlan and BenchmarkReport of `primus-crds`, whose API group, labels and field
//! managers are defined there once.

use std::future::Future;
use std::time::Duration;

use kube::api::Api;
use primus_crds::TrainingPlan;

use super::CliError;

/// How long one API call may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A single-threaded async runtime for one command.
pub fn runtime() -> Result<tokio::runtime::Runtime, CliError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::Failed(format!("cannot start the async runtime: {e}")))
}

/// A client from `KUBECONFIG`, `~/.kube/config` or the in-cluster service account.
pub async fn client() -> Result<kube::Client, CliError> {
    primus_runtime::tls::install_ring_provider();
    timed(
        "connecting to the Kubernetes API",
        kube::Client::try_default(),
    )
    .await?
    .map_err(|e| CliError::Failed(format!("no usable Kubernetes configuration: {e}")))
}

/// Run one API call with [`CALL_TIMEOUT`].
pub async fn timed<T>(what: &str, f: impl Future<Output = T>) -> Result<T, CliError> {
    tokio::time::timeout(CALL_TIMEOUT, f)
        .await
        .map_err(|_| CliError::Failed(format!("{what}: no answer within {CALL_TIMEOUT:?}")))
}

/// Split `NAMESPACE/NAME` (or a bare `NAME`, in `default_ns`). `flag` names the argument in
/// errors.
pub fn split_ref(s: &str, default_ns: &str, flag: &str) -> Result<(String, String), CliError> {
    let (ns, name) = match s.split_once('/') {
        Some((ns, name)) => (ns, name),
        None => (default_ns, s),
    };
    let valid = |p: &str| {
        !p.is_empty()
            && p.len() <= 253
            && p.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
    };
    if !valid(ns) || !valid(name) || name.contains('/') {
        return Err(CliError::Input(format!(
            "{flag}: {s:?} is not NAMESPACE/NAME or NAME (lower-case letters, digits, '-' and '.')"
        )));
    }
    Ok((ns.to_string(), name.to_string()))
}

/// Describe an API error in one line.
pub fn api_error(what: &str, e: &kube::Error) -> CliError {
    match e {
        kube::Error::Api(s) if s.code == 404 => {
            CliError::Failed(format!("{what}: not found ({})", s.message))
        }
        kube::Error::Api(s) if s.code == 403 => {
            CliError::Failed(format!("{what}: forbidden ({})", s.message))
        }
        kube::Error::Api(s) => CliError::Failed(format!("{what}: {} ({})", s.message, s.code)),
        other => CliError::Failed(format!("{what}: {other}")),
    }
}

/// Read a TrainingPlan.
pub async fn get_plan(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<TrainingPlan, CliError> {
    let api: Api<TrainingPlan> = Api::namespaced(client.clone(), namespace);
    let what = format!("trainingplan {namespace}/{name}");
    timed(&what, api.get(name))
        .await?
        .map_err(|e| api_error(&what, &e))
}

/// Remove null-valued keys at every depth (absent and null mean the same for optional fields,
/// and a CRD schema without `nullable` rejects null).
pub fn strip_nulls(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_with_a_default_namespace() {
        assert_eq!(
            split_ref("ns/p", "default", "--plan").unwrap(),
            ("ns".to_string(), "p".to_string())
        );
        assert_eq!(
            split_ref("p", "team", "--plan").unwrap(),
            ("team".to_string(), "p".to_string())
        );
        for bad in ["", "/p", "ns/", "a/b/c", "Plan", "ns/p q"] {
            assert!(split_ref(bad, "default", "--plan").is_err(), "{bad:?}");
        }
    }
}
