//! End to end against the real test bed (kube-apiserver 1.20 + etcd on loopback): the
//! `primus-webhook` binary registered with a ValidatingWebhookConfiguration whose
//! `clientConfig.url` is `https://127.0.0.1:PORT/...`, driven with real `kubectl`.
//!
//! Every test runs in its own namespace(s), labelled with a test id that its own
//! configuration's namespaceSelector matches, so tests run in parallel without seeing each
//! other's webhooks; configurations are deleted when a test ends.

mod common;

use std::process::Output;
use std::time::Duration;

use common::*;
use primus_tests::{Kubectl, TestBed, stderr, stdout, wait_for};
use serde_json::{Value, json};

/// Make sure a CRD from the repository is installed and Established.
fn ensure_crd(k: &Kubectl, name: &str, file: &str) {
    if k.run(&["get", "crd", name]).status.success() {
        return;
    }
    let path = primus_tests::repo_root().join(file);
    let out = k.run(&["apply", "-f", &path.display().to_string()]);
    // A parallel test may have created it in between: fine if it exists now.
    if !out.status.success() && !k.run(&["get", "crd", name]).status.success() {
        panic!("installing {file}: {}", stderr(&out));
    }
    k.ok(&[
        "wait",
        "--for",
        "condition=established",
        "--timeout=60s",
        &format!("crd/{name}"),
    ]);
}

fn setup(tb: &TestBed) -> Kubectl {
    let k = tb.kubectl();
    ensure_crd(
        &k,
        "pytorchjobs.kubeflow.org",
        "crds/thirdparty/kubeflow.org_pytorchjobs.yaml",
    );
    ensure_crd(
        &k,
        "trainjobs.trainer.kubeflow.org",
        "crds/thirdparty/trainer.kubeflow.org_trainjobs.yaml",
    );
    k
}

/// A ValidatingWebhookConfiguration owned by one test, deleted on drop.
struct Registration {
    name: String,
    kubectl: Kubectl,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let _ = self.kubectl.run(&[
            "delete",
            "validatingwebhookconfiguration",
            &self.name,
            "--ignore-not-found",
            "--wait=false",
        ]);
    }
}

fn base64(bytes: &[u8]) -> Value {
    serde_json::to_value(k8s_openapi::ByteString(bytes.to_vec())).expect("base64")
}

/// The configuration: PyTorchJobs of namespaces labelled `primus-test=ID` go to the webhook
/// (strict ones, labelled `primus.dev/admission=strict`, to the strict path), TrainingPlans
/// too; objects labelled `primus.dev/skip-validation=true` are not sent.
fn configuration(name: &str, id: &str, port: u16, ca: Option<&[u8]>, failure: &str) -> Value {
    let client = |path: &str| {
        let mut c = json!({"url": format!("https://127.0.0.1:{port}{path}")});
        if let Some(ca) = ca {
            c["caBundle"] = base64(ca);
        }
        c
    };
    let ns = |strict: &str| {
        json!({"matchExpressions": [
            {"key": "primus-test", "operator": "In", "values": [id]},
            {"key": "primus.dev/admission", "operator": strict, "values": ["strict"]},
        ]})
    };
    let skip = json!({"matchExpressions": [
        {"key": "primus.dev/skip-validation", "operator": "NotIn", "values": ["true"]}
    ]});
    let jobs = json!([{
        "apiGroups": ["kubeflow.org"], "apiVersions": ["v1"],
        "operations": ["CREATE", "UPDATE"], "resources": ["pytorchjobs"], "scope": "Namespaced",
    }]);
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "pytorchjobs.primus.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": failure,
                "timeoutSeconds": 5,
                "clientConfig": client("/validate/pytorchjob"),
                "rules": jobs,
                "namespaceSelector": ns("NotIn"),
                "objectSelector": skip,
            },
            {
                "name": "pytorchjobs-strict.primus.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": failure,
                "timeoutSeconds": 5,
                "clientConfig": client("/validate/pytorchjob/strict"),
                "rules": jobs,
                "namespaceSelector": ns("In"),
                "objectSelector": skip,
            },
            {
                "name": "trainjobs.primus.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": failure,
                "timeoutSeconds": 5,
                "clientConfig": client("/validate/trainjob"),
                "rules": [{
                    "apiGroups": ["trainer.kubeflow.org"], "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["trainjobs"], "scope": "Namespaced",
                }],
                "namespaceSelector": ns("NotIn"),
                "objectSelector": skip,
            },
            {
                "name": "trainingplans.primus.dev",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": failure,
                "timeoutSeconds": 5,
                "clientConfig": client("/validate/trainingplan"),
                "rules": [{
                    "apiGroups": ["primus.dev"], "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["trainingplans"], "scope": "Namespaced",
                }],
                "namespaceSelector": {"matchLabels": {"primus-test": id}},
            },
        ]
    })
}

fn register(k: &Kubectl, id: &str, port: u16, ca: Option<&[u8]>, failure: &str) -> Registration {
    let name = format!("primus-webhook-test-{id}");
    let cfg = configuration(&name, id, port, ca, failure);
    let out = k.run_stdin(&["apply", "-f", "-"], &cfg.to_string());
    assert!(out.status.success(), "registering: {}", stderr(&out));
    Registration {
        name,
        kubectl: k.clone(),
    }
}

/// A test namespace labelled for this test's configuration.
fn namespace(tb: &TestBed, id: &str, strict: bool) -> primus_tests::TestNamespace {
    let ns = tb.namespace("wh");
    let k = tb.kubectl();
    let mut args = vec![
        "label".to_string(),
        "namespace".to_string(),
        ns.name.clone(),
        format!("primus-test={id}"),
    ];
    if strict {
        args.push("primus.dev/admission=strict".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    k.ok(&args);
    ns
}

/// A label value unique to one test (process id, sequence, time).
fn test_id() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        nanos
    )
}

fn apply(k: &Kubectl, ns: &str, obj: &Value, extra: &[&str]) -> Output {
    let mut args = vec!["apply", "-n", ns, "-f", "-"];
    args.extend_from_slice(extra);
    k.run_stdin(&args, &obj.to_string())
}

fn job_named(example_name: &str, name: &str) -> Value {
    let mut j = example(example_name);
    set_name(&mut j, name);
    j
}

/// Wait until the API server calls the webhook (its configuration informer lags a little):
/// a server-side dry run of the OOM job is denied.
fn wait_until_enforced(k: &Kubectl, ns: &str) {
    let probe = job_named("oom-pytorchjob", "probe");
    wait_for(
        Duration::from_secs(30),
        "the webhook to be enforced",
        || {
            let out = apply(k, ns, &probe, &["--dry-run=server"]);
            (!out.status.success() && stderr(&out).contains("denied the request")).then_some(())
        },
    );
}

/// Start a self-signed webhook, register it for a fresh namespace, wait until it is enforced.
fn deployed(
    tb: &TestBed,
    failure: &str,
) -> (WebhookProcess, Registration, primus_tests::TestNamespace) {
    let k = setup(tb);
    let mut w = WebhookProcess::self_signed(&[], &[]);
    let ca = w.ca();
    w.wait_ready(&ca);
    let id = test_id();
    let ns = namespace(tb, &id, false);
    let reg = register(&k, &id, w.port, Some(&ca), failure);
    wait_until_enforced(&k, &ns.name);
    (w, reg, ns)
}

fn exists(k: &Kubectl, ns: &str, name: &str) -> bool {
    k.run(&["get", "pytorchjob", name, "-n", ns])
        .status
        .success()
}

#[test]
fn oom_job_is_refused_with_numbers_and_a_suggestion() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let (_w, _reg, ns) = deployed(&tb, "Fail");
    let k = tb.kubectl();
    let out = apply(&k, &ns.name, &example("oom-pytorchjob"), &[]);
    assert!(!out.status.success(), "created: {}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("admission webhook \"pytorchjobs.primus.dev\" denied the request: predicted "),
        "{err}"
    );
    assert!(
        err.contains(" GiB on pipeline stage 0 > 190.6 GiB usable on MI300X (weights "),
        "{err}"
    );
    assert!(err.contains("; fits with --"), "{err}");
    assert!(!exists(&k, &ns.name, "llama3-70b-oom"));
}

#[test]
fn an_oom_trainjob_is_refused_and_the_same_trainer_that_fits_is_created() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let (_w, _reg, ns) = deployed(&tb, "Fail");
    let k = tb.kubectl();
    let oom = example("oom-trainjob");
    let out = apply(&k, &ns.name, &oom, &[]);
    assert!(!out.status.success(), "created: {}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("admission webhook \"trainjobs.primus.dev\" denied the request: predicted "),
        "{err}"
    );
    assert!(err.contains(" GiB usable on MI300X (weights "), "{err}");
    // TP 8, PP 4: fits; created, and the API server stores it.
    let mut fits = oom.clone();
    set_name(&mut fits, "llama3-70b-fits");
    for a in fits["spec"]["trainer"]["args"].as_array_mut().unwrap() {
        if a == "--tensor-model-parallel-size=1" {
            *a = json!("--tensor-model-parallel-size=8");
        } else if a == "--pipeline-model-parallel-size=1" {
            *a = json!("--pipeline-model-parallel-size=4");
        }
    }
    let out = apply(&k, &ns.name, &fits, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    k.ok(&["get", "trainjob", "llama3-70b-fits", "-n", &ns.name]);
    // Suspending it (what Kueue does) is an update the webhook admits without a projection.
    k.ok(&[
        "patch",
        "trainjob",
        "llama3-70b-fits",
        "-n",
        &ns.name,
        "--type=merge",
        "-p",
        r#"{"spec":{"suspend":true}}"#,
    ]);
}

#[test]
fn fitting_job_is_created_and_near_limit_job_is_created_with_a_warning() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let (_w, _reg, ns) = deployed(&tb, "Fail");
    let k = tb.kubectl();
    let out = apply(&k, &ns.name, &example("fitting-pytorchjob"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("Warning"), "{}", stderr(&out));
    assert!(exists(&k, &ns.name, "llama3-70b-fits"));

    let out = apply(&k, &ns.name, &example("near-limit-pytorchjob"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("Warning: primus: predicted "), "{err}");
    assert!(err.contains("GiB usable on MI300X"), "{err}");
    assert!(exists(&k, &ns.name, "llama3-70b-near-limit"));
}

#[test]
fn server_side_dry_run_gets_the_same_decisions_and_creates_nothing() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let (_w, _reg, ns) = deployed(&tb, "Fail");
    let k = tb.kubectl();
    let oom = example("oom-pytorchjob");
    let dry = apply(&k, &ns.name, &oom, &["--dry-run=server"]);
    let wet = apply(&k, &ns.name, &oom, &[]);
    assert!(!dry.status.success() && !wet.status.success());
    assert_eq!(stderr(&dry), stderr(&wet), "the same denial");

    let near = example("near-limit-pytorchjob");
    let dry = apply(&k, &ns.name, &near, &["--dry-run=server"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(
        stdout(&dry).contains("(server dry run)"),
        "{}",
        stdout(&dry)
    );
    assert!(
        stderr(&dry).contains("Warning: primus: predicted "),
        "{}",
        stderr(&dry)
    );
    assert!(
        !exists(&k, &ns.name, "llama3-70b-near-limit"),
        "a dry run creates nothing"
    );
    let wet = apply(&k, &ns.name, &near, &[]);
    assert!(wet.status.success());
    assert_eq!(
        stderr(&dry)
            .lines()
            .filter(|l| l.starts_with("Warning"))
            .collect::<Vec<_>>(),
        stderr(&wet)
            .lines()
            .filter(|l| l.starts_with("Warning"))
            .collect::<Vec<_>>()
    );
}

#[test]
fn suspend_flips_and_label_changes_are_allowed_real_changes_are_checked() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let (_w, _reg, ns) = deployed(&tb, "Fail");
    let k = tb.kubectl();
    // An OOM job that opted out of validation.
    let mut job = example("oom-pytorchjob");
    job["metadata"]["labels"] = json!({"primus.dev/skip-validation": "true"});
    let out = apply(&k, &ns.name, &job, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let name = "llama3-70b-oom";
    // Opting back in is a metadata-only update: allowed.
    k.ok(&[
        "label",
        "pytorchjob",
        name,
        "-n",
        &ns.name,
        "primus.dev/skip-validation-",
    ]);
    // Queue managers flip suspend: allowed without projection.
    for suspend in ["true", "false", "true"] {
        let patch = format!(r#"{{"spec":{{"runPolicy":{{"suspend":{suspend}}}}}}}"#);
        k.ok(&[
            "patch",
            "pytorchjob",
            name,
            "-n",
            &ns.name,
            "--type",
            "merge",
            "-p",
            &patch,
        ]);
    }
    k.ok(&["annotate", "pytorchjob", name, "-n", &ns.name, "team=llm"]);
    // A change to the job itself is projected (and still OOMs).
    let out = k.run(&[
        "patch",
        "pytorchjob",
        name,
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"pytorchReplicaSpecs":{"Worker":{"replicas":3}}}}"#,
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("denied the request: predicted "),
        "{}",
        stderr(&out)
    );
}

#[test]
fn with_the_webhook_down_ignore_admits_and_fail_refuses() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let (mut w, reg, ns) = deployed(&tb, "Ignore");
    let k = tb.kubectl();
    let status = w.stop(Duration::from_secs(10)).expect("the webhook stops");
    assert!(status.success());
    // failurePolicy Ignore: admitted although the webhook cannot be called.
    let out = apply(&k, &ns.name, &example("oom-pytorchjob"), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(exists(&k, &ns.name, "llama3-70b-oom"));
    // failurePolicy Fail: refused with the API server's error.
    let id = reg
        .name
        .trim_start_matches("primus-webhook-test-")
        .to_string();
    let cfg = configuration(&reg.name, &id, w.port, None, "Fail");
    let out = k.run_stdin(&["apply", "-f", "-"], &cfg.to_string());
    assert!(out.status.success(), "{}", stderr(&out));
    let job = job_named("oom-pytorchjob", "second");
    let err = wait_for(
        Duration::from_secs(30),
        "failurePolicy Fail in force",
        || {
            let out = apply(&k, &ns.name, &job, &[]);
            (!out.status.success()).then(|| stderr(&out))
        },
    );
    assert!(
        err.contains("failed calling webhook \"pytorchjobs.primus.dev\""),
        "{err}"
    );
    assert!(!exists(&k, &ns.name, "second"));
}

#[test]
fn strict_namespaces_deny_jobs_that_cannot_be_checked() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let (_w, reg, ns) = deployed(&tb, "Fail");
    let k = tb.kubectl();
    let id = reg
        .name
        .trim_start_matches("primus-webhook-test-")
        .to_string();
    let strict = namespace(&tb, &id, true);
    // No architecture flags and no model annotation: the model is unknown.
    let mut job = example("fitting-pytorchjob");
    edit_script(
        &mut job,
        "--num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64",
        "",
    );
    let out = apply(&k, &ns.name, &job, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Warning: primus: cannot check GPU memory: model"),
        "{}",
        stderr(&out)
    );
    let out = wait_for(Duration::from_secs(30), "the strict webhook", || {
        let out = apply(&k, &strict.name, &job, &[]);
        (!out.status.success()).then_some(out)
    });
    let err = stderr(&out);
    assert!(
        err.contains("admission webhook \"pytorchjobs-strict.primus.dev\" denied the request: strict admission"),
        "{err}"
    );
    assert!(
        err.contains("model: no annotation primus.dev/model"),
        "{err}"
    );
}

#[test]
fn trainingplans_with_illegal_layouts_are_refused_naming_the_field() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let k = setup(&tb);
    ensure_crd(
        &k,
        "trainingplans.primus.dev",
        "crds/trainingplans.primus.dev.yaml",
    );
    let (_w, _reg, ns) = deployed(&tb, "Fail");
    let plan = |tp: u32| {
        json!({
            "apiVersion": "primus.dev/v1alpha1",
            "kind": "TrainingPlan",
            "metadata": {"name": format!("llama-tp{tp}")},
            "spec": {
                "model": {"preset": "llama3.1-70b"},
                "cluster": {"gpu": "mi300x", "gpus": 64},
                "training": {"seqLength": 8192, "globalBatchSize": 128},
                "parallelism": {"tp": tp, "pp": 4},
            }
        })
    };
    let out = apply(&k, &ns.name, &plan(16), &[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("denied the request: spec.parallelism.tp: 16 does not divide"),
        "{err}"
    );
    let out = apply(&k, &ns.name, &plan(8), &[]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn self_signed_mode_patches_the_ca_bundle_and_keeps_it_patched() {
    let Some(tb) = primus_tests::testbed!() else {
        return;
    };
    let k = setup(&tb);
    let id = test_id();
    let ns = namespace(&tb, &id, false);
    // Registered before the webhook exists, without a caBundle.
    let port = free_port();
    let reg = register(&k, &id, port, None, "Fail");
    let kubeconfig = tb.kubeconfig.display().to_string();
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs").display().to_string();
    let mut w = WebhookProcess::start_on(
        port,
        &[
            "--self-signed",
            "--cert-dir",
            &certs,
            "--webhook-configuration",
            &reg.name,
            "--ca-bundle-resync",
            "1",
        ],
        &[("KUBECONFIG", &kubeconfig)],
    );
    let ca = primus_tests::wait_for(Duration::from_secs(20), "ca.crt", || {
        std::fs::read(dir.path().join("certs/ca.crt")).ok()
    });
    w.wait_ready(&ca);
    let bundles = || {
        k.ok(&[
            "get",
            "validatingwebhookconfiguration",
            &reg.name,
            "-o",
            "jsonpath={.webhooks[*].clientConfig.caBundle}",
        ])
    };
    let want = base64(&ca).as_str().unwrap().to_string();
    assert_eq!(bundles(), [want.as_str(); 4].join(" "), "{}", w.logs());
    let managers = k.ok(&[
        "get",
        "validatingwebhookconfiguration",
        &reg.name,
        "-o",
        "jsonpath={.metadata.managedFields[*].manager}",
    ]);
    assert!(managers.contains("primus-webhook"), "{managers}");
    wait_until_enforced(&k, &ns.name);
    // Someone overwrites it: the webhook puts it back.
    k.ok(&[
        "patch",
        "validatingwebhookconfiguration",
        &reg.name,
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/webhooks/0/clientConfig/caBundle","value":"Zm9v"}]"#,
    ]);
    wait_for(
        Duration::from_secs(20),
        "the caBundle to be restored",
        || (bundles() == [want.as_str(); 4].join(" ")).then_some(()),
    );
}
