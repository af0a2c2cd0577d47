//! The webhook binary started with the chart's own arguments and registered with the chart's
//! own ValidatingWebhookConfiguration on the real test bed. Two things are changed, because the
//! test bed has no service routing and is shared: each `clientConfig` points at
//! `https://127.0.0.1:PORT/PATH` instead of the Service, and each `namespaceSelector` also
//! requires this test's namespace label. Everything else (paths, rules, failurePolicy, the
//! strict routing, the opt-out labels) is the chart's.
//!
//! - secret mode: the OOM job is denied by `pytorchjobs.primus.dev`; an underivable job is
//!   denied in a namespace labelled `primus.dev/admission=strict` and admitted with a warning
//!   elsewhere; a job labelled `primus.dev/skip-validation=true` and a namespace labelled
//!   `primus.dev/admission=disabled` never reach the webhook (its metrics say so); an invalid
//!   TrainingPlan is denied.
//! - self-signed mode (the default), as the chart's webhook service account (impersonation) with
//!   the chart's RBAC alone: the webhook fills the chart's empty Secret, patches the caBundle of
//!   its configuration, turns ready, and the API server then trusts it (two replicas and a CA
//!   rotation: rotation.rs).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use primus_tests::node_agent::binary;
use primus_tests::{Kubectl, TestBed, repo_root, stderr, stdout, testbed, wait_for};
use serde_json::{Value, json};

use super::helm::{Helm, Rendered};

pub(super) const OOM_JOB: &str = "webhook/examples/oom-pytorchjob.yaml";
pub(super) const FITTING_JOB: &str = "webhook/examples/fitting-pytorchjob.yaml";
const MODEL_FLAGS: &str =
    "--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64";

pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// GET over plain HTTP/1.0: (status, body).
pub(super) fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, buf.split_once("\r\n\r\n")?.1.to_string()))
}

/// The sum of `primus_webhook_admissions_total` series whose labels contain `filter`.
pub(super) fn admissions(metrics_port: u16, filter: &str) -> f64 {
    let (_, text) = http_get(metrics_port, "/metrics").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("primus_webhook_admissions_total{") && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A webhook process, killed (and its log shown on failure) when dropped.
pub(super) struct Webhook {
    child: Child,
    log: PathBuf,
    pub(super) metrics_port: u16,
    pub(super) port: u16,
}

impl Webhook {
    /// Start `primus-webhook` with the chart's arguments of `rendered`, on loopback ports,
    /// with `replace` applied to the flags named in it (flags the chart does not pass are
    /// added), in namespace `chart-webhook` unless `env` says otherwise.
    pub(super) fn start(
        rendered: &Rendered,
        full: &str,
        replace: &[(&str, String)],
        env: &[(&str, String)],
        dir: &Path,
    ) -> Webhook {
        let deploy = rendered.get("Deployment", &format!("{full}-webhook"));
        let port = free_port();
        let metrics_port = free_port();
        let mut args = Vec::new();
        for a in deploy["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
        {
            let a = a.as_str().unwrap();
            let flag = a.split('=').next().unwrap();
            let value = match flag {
                "--listen" => Some(format!("127.0.0.1:{port}")),
                "--metrics-listen" => Some(format!("127.0.0.1:{metrics_port}")),
                _ => replace
                    .iter()
                    .find(|(f, _)| *f == flag)
                    .map(|(_, v)| v.clone()),
            };
            args.push(value.map_or_else(|| a.to_string(), |v| format!("{flag}={v}")));
        }
        for (flag, v) in replace {
            if !args.iter().any(|a| a.split('=').next() == Some(flag)) {
                args.push(format!("{flag}={v}"));
            }
        }
        let log = dir.join(format!("webhook-{port}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(binary("primus-webhook"));
        cmd.args(&args)
            .env("POD_NAMESPACE", "chart-webhook")
            .env("RUST_LOG", "info,primus_webhook=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start primus-webhook");
        Webhook {
            child,
            log,
            metrics_port,
            port,
        }
    }

    pub(super) fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if http_get(self.metrics_port, "/readyz").is_some_and(|(c, _)| c == 200) {
                return;
            }
            assert!(
                matches!(self.child.try_wait(), Ok(None)),
                "primus-webhook exited (a chart argument it does not take?):\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            assert!(
                Instant::now() < deadline,
                "primus-webhook not ready:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: String = text
                .chars()
                .rev()
                .take(4000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            primus_tests::loud(&format!("\n---- webhook log ----\n{tail}\n"));
        }
    }
}

/// Cluster-scoped objects of one test, deleted when it ends.
pub(super) struct Cleanup(pub(super) Kubectl, pub(super) Vec<String>);
impl Drop for Cleanup {
    fn drop(&mut self) {
        for o in &self.1 {
            let _ = self
                .0
                .run(&["delete", o, "--ignore-not-found", "--wait=false"]);
        }
    }
}

/// The chart's webhook configuration, pointed at `port` and narrowed to namespaces labelled
/// `primus-chart-test=ID`.
pub(super) fn registration(rendered: &Rendered, name: &str, port: u16, id: &str) -> Value {
    let mut vwc = rendered.kind("ValidatingWebhookConfiguration")[0].clone();
    vwc["metadata"]["name"] = json!(name);
    for h in vwc["webhooks"].as_array_mut().unwrap() {
        let path = h["clientConfig"]["service"]["path"]
            .as_str()
            .unwrap()
            .to_string();
        let mut cc = json!({"url": format!("https://127.0.0.1:{port}{path}")});
        if let Some(ca) = h["clientConfig"].get("caBundle") {
            cc["caBundle"] = ca.clone();
        }
        h["clientConfig"] = cc;
        h["namespaceSelector"]["matchExpressions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"key": "primus-chart-test", "operator": "In", "values": [id]}));
    }
    vwc
}

pub(super) fn labelled_namespace(
    tb: &TestBed,
    id: &str,
    admission: Option<&str>,
) -> primus_tests::TestNamespace {
    let ns = tb.namespace("chart-wh");
    let mut args = vec![
        "label".to_string(),
        "namespace".into(),
        ns.name.clone(),
        format!("primus-chart-test={id}"),
    ];
    if let Some(a) = admission {
        args.push(format!("primus.dev/admission={a}"));
    }
    tb.kubectl()
        .ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    ns
}

pub(super) fn apply(k: &Kubectl, ns: &str, manifest: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec!["apply", "-n", ns, "-f", "-"];
    args.extend_from_slice(extra);
    k.run_stdin(&args, manifest)
}

pub(super) fn job(file: &str, name: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join(file)).expect("example job");
    let first = text
        .lines()
        .find(|l| l.trim_start().starts_with("name: "))
        .expect("a name")
        .to_string();
    text.replacen(&first, &format!("  name: {name}"), 1)
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {}", stderr(&out));
}

/// A CA and a serving certificate for 127.0.0.1 (EC P-256): (ca.crt path, tls.crt, tls.key).
fn certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "ca.key",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=chart-test-ca",
            "-days",
            "2",
            "-out",
            "ca.crt",
        ],
    );
    openssl(
        dir,
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            "tls.key",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-new",
            "-key",
            "tls.key",
            "-subj",
            "/CN=primus-webhook",
            "-out",
            "tls.csr",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "tls.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "tls.crt",
        ],
    );
    (dir.join("ca.crt"), dir.join("tls.crt"), dir.join("tls.key"))
}

fn base64(bytes: &[u8]) -> String {
    match serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).unwrap() {
        Value::String(s) => s,
        other => panic!("{other}"),
    }
}

pub(super) fn scratch(tag: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("primus-chart-webhook-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Wait until the API server calls the webhook for `ns` (its configuration cache lags).
pub(super) fn wait_enforced(k: &Kubectl, ns: &str) {
    let probe = job(OOM_JOB, "probe");
    wait_for(
        Duration::from_secs(60),
        "the chart's webhook configuration to be enforced",
        || {
            let out = apply(k, ns, &probe, &["--dry-run=server"]);
            (!out.status.success() && stderr(&out).contains("denied the request")).then_some(())
        },
    );
}

pub(super) fn ensure_crds(k: &Kubectl) {
    for (name, file) in [
        (
            "pytorchjobs.kubeflow.org",
            "crds/thirdparty/kubeflow.org_pytorchjobs.yaml",
        ),
        (
            "trainingplans.primus.dev",
            "crds/trainingplans.primus.dev.yaml",
        ),
    ] {
        if k.run(&["get", "crd", name]).status.success() {
            continue;
        }
        let out = k.run(&["apply", "-f", repo_root().join(file).to_str().unwrap()]);
        if !out.status.success() && !k.run(&["get", "crd", name]).status.success() {
            panic!("installing {name}: {}", stderr(&out));
        }
        k.ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            &format!("crd/{name}"),
        ]);
    }
}

#[test]
fn the_charts_webhook_configuration_routes_and_filters_as_documented() {
    let Some(tb) = testbed!() else { return };
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let k = tb.kubectl();
    ensure_crds(&k);
    let dir = scratch("secret");
    let (ca, cert, key) = certificates(&dir);
    let ca_b64 = base64(&std::fs::read(&ca).unwrap());
    let r = helm.render(
        "chartwh",
        "chart-webhook",
        &[
            "--kube-version",
            "1.20.2",
            "--set",
            "webhook.tls.mode=secret",
            "--set",
            "webhook.tls.secret.name=chart-webhook-tls",
            "--set",
            &format!("webhook.tls.secret.caBundle={ca_b64}"),
            "--set",
            "webhook.failurePolicy=Fail",
        ],
    );
    let full = "chartwh-primus-projection";
    let mut w = Webhook::start(
        &r,
        full,
        &[
            ("--tls-cert-file", cert.display().to_string()),
            ("--tls-key-file", key.display().to_string()),
        ],
        &[],
        &dir,
    );
    w.wait_ready();

    let id = format!("{}-{}", std::process::id(), w.port);
    let name = format!("chart-webhook-test-{id}");
    let _cleanup = Cleanup(
        k.clone(),
        vec![format!("validatingwebhookconfiguration/{name}")],
    );
    let vwc = registration(&r, &name, w.port, &id);
    let out = apply(&k, "default", &vwc.to_string(), &[]);
    assert!(
        out.status.success(),
        "registering the chart's configuration: {}",
        stderr(&out)
    );

    let plain = labelled_namespace(&tb, &id, None);
    let strict = labelled_namespace(&tb, &id, Some("strict"));
    let disabled = labelled_namespace(&tb, &id, Some("disabled"));
    wait_enforced(&k, &plain.name);

    // The OOM job: denied with the numbers.
    let out = apply(&k, &plain.name, &job(OOM_JOB, "oom"), &[]);
    assert!(
        !out.status.success(),
        "the OOM job was admitted: {}",
        stdout(&out)
    );
    assert!(
        stderr(&out)
            .contains("admission webhook \"pytorchjobs.primus.dev\" denied the request: predicted"),
        "{}",
        stderr(&out)
    );

    // An underivable job: a warning in a plain namespace, denied by the strict path.
    let underivable = job(FITTING_JOB, "no-model").replace(MODEL_FLAGS, "");
    let out = apply(&k, &plain.name, &underivable, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Warning: primus: cannot check GPU memory"),
        "{}",
        stderr(&out)
    );
    let out = wait_for(Duration::from_secs(30), "the strict path", || {
        let out = apply(&k, &strict.name, &underivable, &[]);
        (!out.status.success()).then_some(out)
    });
    assert!(
        stderr(&out).contains("admission webhook \"pytorchjobs-strict.primus.dev\" denied the request: strict admission"),
        "{}",
        stderr(&out)
    );

    // Opt-outs never reach the webhook: the job's label (objectSelector) and the namespace's.
    let before = admissions(w.metrics_port, "");
    let skipped = job(OOM_JOB, "oom-skipped").replacen(
        "metadata:\n",
        "metadata:\n  labels:\n    primus.dev/skip-validation: \"true\"\n",
        1,
    );
    let out = apply(&k, &plain.name, &skipped, &[]);
    assert!(
        out.status.success(),
        "the skip label did not opt the job out: {}",
        stderr(&out)
    );
    let out = apply(&k, &disabled.name, &job(OOM_JOB, "oom-disabled"), &[]);
    assert!(
        out.status.success(),
        "the disabled namespace still validates: {}",
        stderr(&out)
    );
    assert_eq!(
        admissions(w.metrics_port, ""),
        before,
        "opted-out requests reached the webhook"
    );

    // TrainingPlans go to their own path.
    let plan = |tp: u32| {
        json!({
            "apiVersion": "primus.dev/v1alpha1", "kind": "TrainingPlan",
            "metadata": {"name": format!("llama-tp{tp}")},
            "spec": {
                "model": {"preset": "llama3.1-70b"},
                "cluster": {"gpu": "mi300x", "gpus": 64},
                "training": {"seqLength": 8192, "globalBatchSize": 128},
                "parallelism": {"tp": tp, "pp": 4},
                "job": {"autoSubmit": false},
            }
        })
        .to_string()
    };
    let out = apply(&k, &plain.name, &plan(16), &[]);
    assert!(
        !out.status.success()
            && stderr(&out)
                .contains("admission webhook \"trainingplans.primus.dev\" denied the request"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(admissions(w.metrics_port, "kind=\"TrainingPlan\"") >= 1.0);
}

/// Apply the chart's webhook service account, roles, bindings and (self-signed mode) its empty
/// Secret in `ns`; the cluster-scoped ones and the configuration `full` are deleted on drop.
pub(super) fn install_webhook_rbac(k: &Kubectl, r: &Rendered, full: &str, ns: &str) -> Cleanup {
    let named = format!("{full}-webhook");
    let secret = format!("{full}-webhook-certs");
    let objects: Vec<&Value> = r
        .objects
        .iter()
        .filter(|o| {
            let n = o["metadata"]["name"].as_str().unwrap_or_default();
            let kind = o["kind"].as_str().unwrap_or_default();
            (n == named
                && [
                    "ServiceAccount",
                    "ClusterRole",
                    "ClusterRoleBinding",
                    "Role",
                    "RoleBinding",
                ]
                .contains(&kind))
                || (n == secret && kind == "Secret")
        })
        .collect();
    assert_eq!(
        objects.len(),
        6,
        "the webhook's service account, roles, bindings and Secret"
    );
    let cleanup = Cleanup(
        k.clone(),
        vec![
            format!("clusterrole/{named}"),
            format!("clusterrolebinding/{named}"),
            format!("validatingwebhookconfiguration/{full}"),
        ],
    );
    let manifests: String = objects.iter().map(|o| format!("---\n{o}\n")).collect();
    let out = apply(k, ns, &manifests, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    cleanup
}

/// A kubeconfig of the test bed that impersonates service account `ns/name`.
pub(super) fn service_account_kubeconfig(
    tb: &TestBed,
    dir: &Path,
    ns: &str,
    name: &str,
) -> PathBuf {
    let text = std::fs::read_to_string(&tb.kubeconfig).unwrap();
    let mut cfg: Value = serde_saphyr::from_str(&text).unwrap();
    for u in cfg["users"].as_array_mut().unwrap() {
        u["user"]["as"] = json!(format!("system:serviceaccount:{ns}:{name}"));
    }
    let kubeconfig = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&kubeconfig, cfg.to_string()).unwrap();
    kubeconfig
}

#[test]
fn self_signed_mode_keeps_its_secret_and_configuration_under_the_chart_rbac() {
    let Some(tb) = testbed!() else { return };
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let k = tb.kubectl();
    ensure_crds(&k);
    let dir = scratch("self-signed");
    let ns = tb.namespace("chart-wh-ss");
    let full = format!("wh-{}", &ns.name[ns.name.len() - 4..]);
    let r = helm.render(
        "whss",
        &ns.name,
        &[
            "--kube-version",
            "1.20.2",
            "--set",
            &format!("fullnameOverride={full}"),
            "--set",
            "webhook.tls.mode=selfSigned",
            "--set",
            "webhook.failurePolicy=Fail",
            "--set",
            "rbac.aggregateToDefaultRoles=false",
        ],
    );
    // The webhook's service account, roles, bindings and Secret, for real.
    let _cleanup = install_webhook_rbac(&k, &r, &full, &ns.name);

    // The configuration first, without a caBundle, as the chart renders it.
    let port_hint = free_port();
    let id = format!("{}-{port_hint}", std::process::id());
    let mut vwc = registration(&r, &full, 0, &id);
    assert!(vwc["webhooks"][0]["clientConfig"].get("caBundle").is_none());

    // As the webhook's service account: its configuration and its Secret, nothing else.
    let kubeconfig = service_account_kubeconfig(&tb, &dir, &ns.name, &format!("{full}-webhook"));
    let can = |verb: &str, what: &str| {
        let out = Kubectl::new(&kubeconfig).run(&["auth", "can-i", "-n", &ns.name, verb, what]);
        stdout(&out).trim() == "yes"
    };
    let hook = |name: &str| format!("validatingwebhookconfigurations/{name}");
    assert!(can("patch", &hook(&full)) && can("get", &hook(&full)));
    assert!(
        !can("patch", &hook("someone-elses"))
            && !can("delete", &hook(&full))
            && !can("create", &hook(&full))
    );
    let secret = |name: &str| format!("secrets/{name}");
    let own = format!("{full}-webhook-certs");
    assert!(can("get", &secret(&own)) && can("update", &secret(&own)));
    assert!(
        !can("get", &secret("someone-elses"))
            && !can("list", "secrets")
            && !can("create", "secrets")
            && !can("delete", &secret(&own))
    );

    let env = [
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("POD_NAMESPACE", ns.name.clone()),
    ];
    let mut w = Webhook::start(&r, &full, &[], &env, &dir);
    // Point the configuration at the port it got, then wait for the patch.
    for h in vwc["webhooks"].as_array_mut().unwrap() {
        let url = h["clientConfig"]["url"]
            .as_str()
            .unwrap()
            .replace("127.0.0.1:0", &format!("127.0.0.1:{}", w.port));
        h["clientConfig"]["url"] = json!(url);
    }
    let out = apply(&k, &ns.name, &vwc.to_string(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    w.wait_ready();
    let live: Value = serde_json::from_str(&k.ok(&[
        "get",
        "validatingwebhookconfiguration",
        &full,
        "-o",
        "json",
    ]))
    .unwrap();
    // The Secret holds the CA, and the caBundle is its `ca.crt`.
    let secret: Value =
        serde_json::from_str(&k.ok(&["get", "secret", "-n", &ns.name, &own, "-o", "json"]))
            .unwrap();
    for key in ["ca.crt", "signer.crt", "signer.key", "tls.crt", "tls.key"] {
        assert!(secret["data"][key].is_string(), "the Secret has no {key}");
    }
    for h in live["webhooks"].as_array().unwrap() {
        assert_eq!(
            h["clientConfig"]["caBundle"], secret["data"]["ca.crt"],
            "webhook {}'s caBundle is not the Secret's ca.crt",
            h["name"]
        );
    }
    let target = labelled_namespace(&tb, &id, None);
    wait_enforced(&k, &target.name);
    let out = apply(&k, &target.name, &job(OOM_JOB, "oom"), &[]);
    assert!(
        !out.status.success() && stderr(&out).contains("denied the request: predicted"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}
