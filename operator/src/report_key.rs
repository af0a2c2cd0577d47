//! The operator's secret key for BenchmarkReport provenance ([`primus_crds::provenance`]): 32
//! random bytes in a Secret of the operator's own namespace, made by the first replica that
//! starts and read by every other one (and by the next process), so tokens derived from it
//! verify across restarts and failovers. Only the operator reads it.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams};
use primus_crds::annotations::MANAGED_BY;
use primus_crds::provenance::{KEY_BYTES, KEY_KEY, new_key};

use crate::error::{Error, is_conflict};
use crate::kubeapi::call;

/// The key (its bytes never printed).
#[derive(Clone, PartialEq, Eq)]
pub struct ReportKey(Vec<u8>);

impl std::fmt::Debug for ReportKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReportKey(..)")
    }
}

impl ReportKey {
    /// A fresh random key (tests, and the default of a configuration never started).
    pub fn random() -> ReportKey {
        ReportKey(new_key().unwrap_or_else(|_| vec![0; KEY_BYTES]))
    }

    pub fn from_bytes(bytes: Vec<u8>) -> ReportKey {
        ReportKey(bytes)
    }

    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

fn from_secret(s: &Secret, what: &str) -> Result<ReportKey, Error> {
    let bytes = s
        .data
        .as_ref()
        .and_then(|d| d.get(KEY_KEY))
        .map(|b| b.0.clone())
        .unwrap_or_default();
    if bytes.len() < KEY_BYTES {
        return Err(Error::Missing(
            format!("{what} (delete it: the operator makes a new one)"),
            "key of at least 32 bytes",
        ));
    }
    Ok(ReportKey(bytes))
}

/// Read the key from Secret `namespace/name`, or create it (a replica that creates it at the
/// same moment wins; the other reads it).
pub async fn load_or_create(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<ReportKey, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("secret {namespace}/{name}");
    if let Some(s) = call(format!("get {what}"), secrets.get_opt(name)).await? {
        return from_secret(&s, &what);
    }
    let key = ReportKey::random();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(BTreeMap::from([(
                MANAGED_BY.to_string(),
                crate::CONTROLLER.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(
            KEY_KEY.to_string(),
            ByteString(key.0.clone()),
        )])),
        type_: Some("Opaque".into()),
        ..Secret::default()
    };
    match call(
        format!("create {what}"),
        secrets.create(&PostParams::default(), &secret),
    )
    .await
    {
        Ok(_) => Ok(key),
        Err(Error::Kube { source, .. }) if is_conflict(&source) => {
            let s = call(format!("get {what}"), secrets.get(name)).await?;
            from_secret(&s, &what)
        }
        Err(e) => Err(e),
    }
}
