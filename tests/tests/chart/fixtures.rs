//! Shared fixtures of the chart tests: the release, the non-default values, and accessors of
//! rendered Deployments.

use serde_json::Value;

pub const RELEASE: &str = "primus";
pub const NS: &str = "primus-system";
pub const FULL: &str = "primus-primus-projection";

/// The values file of the "everything non-default" rendering.
pub const NON_DEFAULT: &str = r#"
fullnameOverride: gpu-planner
image: {repository: registry.example.com/ml/primus, digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
commonLabels: {team: ml-platform}
extraProfiles:
  hardware: {mi300x-lab.yaml: "name: mi300x-lab\n"}
  models: {tiny.yaml: "name: tiny\n"}
operator:
  replicas: 3
  watchNamespace: ml-jobs
  concurrency: 8
  extraArgs: ["--resync-seconds=300"]
benchmark:
  image: {repository: registry.example.com/ml/primus-rocm, tag: "0.1.0"}
  backend: rocm
  namespaces: [ml-jobs, ml-research]
webhook:
  replicas: 3
  failurePolicy: Fail
  timeoutSeconds: 10
  strict: true
  headroom: 0.9
  excludeNamespaces: [monitoring]
  validateTrainingPlans: false
  tls:
    mode: selfSigned
    selfSigned: {caValidityDays: 365, certValidityDays: 30, caOverlapSeconds: 600, reloadSeconds: 5}
kubeflow: {installPyTorchJobCRD: true}
rbac: {aggregateToDefaultRoles: false}
"#;

pub fn write_values(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("primus-chart-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // Tests run in parallel: every call gets its own file.
    static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = dir.join(format!("{seq}-{name}"));
    std::fs::write(&path, text).expect("values file");
    path
}

pub fn containers(deploy: &Value) -> &Vec<Value> {
    deploy["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
}

pub fn args(deploy: &Value) -> Vec<String> {
    containers(deploy)[0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

/// Security context, probes and resources of every container of a Deployment.
pub fn assert_hardened(deploy: &Value) {
    let name = deploy["metadata"]["name"].as_str().unwrap_or("?");
    let pod = &deploy["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{name}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{name}"
    );
    for c in containers(deploy) {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(sc["runAsNonRoot"], true, "{name}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{name}"
        );
        for probe in ["livenessProbe", "readinessProbe"] {
            assert!(c[probe]["httpGet"]["path"].is_string(), "{name}: {probe}");
        }
        for k in ["requests", "limits"] {
            assert!(
                c["resources"][k]["cpu"].is_string(),
                "{name}: resources.{k}.cpu"
            );
            assert!(
                c["resources"][k]["memory"].is_string(),
                "{name}: resources.{k}.memory"
            );
        }
    }
}
