//! The default certificate mode (`webhook.tls.mode=selfSigned`) with two webhook replicas on
//! the test bed, from a bare install: the chart's service account, roles, bindings and empty
//! Secret are applied for real, both replicas run with the chart's arguments as that service
//! account (impersonation), behind a round-robin TCP proxy that stands in for the Service (the
//! test bed has no kube-proxy). Lifetimes are shortened by flags (CA 36 s, serving certificate
//! 12 s, overlap 4 s, one replica re-reading the Secret every 0.5 s, the other every 2 s), so a
//! whole CA rotation happens within the test.
//!
//! While it happens, dry-run creates of PyTorchJobs go through the API server without a pause
//! (a job that fits must be admitted, the OOM job denied with the numbers: `failurePolicy: Fail`
//! turns any TLS or connection failure into an error), and each replica is sent a review
//! directly with curl, trusting only the caBundle the configuration holds at that moment. Midway, the chart's
//! objects are synced the ways Argo CD does (client-side apply, server-side apply with force);
//! afterwards the Secret is emptied by a replace and must come back with the same CA. Not one
//! review or probe may fail.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use primus_tests::{Kubectl, stderr, testbed, wait_for};
use serde_json::Value;

use super::helm::{Helm, Rendered};
use super::webhook::{
    FITTING_JOB, OOM_JOB, Webhook, apply, ensure_crds, install_webhook_rbac, job,
    labelled_namespace, registration, scratch, service_account_kubeconfig, wait_enforced,
};

/// A round-robin TCP proxy on loopback: each accepted connection goes to the next backend.
struct Proxy {
    port: u16,
    backends: Arc<Mutex<Vec<u16>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    fn start() -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("proxy port");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let backends: Arc<Mutex<Vec<u16>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (backends.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut next = 0usize;
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let ports = b.lock().unwrap().clone();
                        if ports.is_empty() {
                            continue;
                        }
                        let port = ports[next % ports.len()];
                        next += 1;
                        std::thread::spawn(move || pipe(client, port));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Proxy {
            port,
            backends,
            stop,
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Copy bytes both ways between `client` and the backend on `port` until either side closes.
fn pipe(client: TcpStream, port: u16) {
    let _ = client.set_nonblocking(false);
    let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let (Ok(mut c_read), Ok(mut s_write)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_read, &mut s_write);
        let _ = s_write.shutdown(std::net::Shutdown::Write);
    });
    let (mut s_read, mut c_write) = (server, client);
    let _ = std::io::copy(&mut s_read, &mut c_write);
    let _ = c_write.shutdown(std::net::Shutdown::Write);
    let _ = up.join();
}

/// The sum of the samples of `name` whose labels contain `filter`, from one replica.
fn metric(metrics_port: u16, name: &str, filter: &str) -> f64 {
    let (_, text) = super::webhook::http_get(metrics_port, "/metrics").unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Certificate Secret writes of one step, summed over the replicas.
fn rotations(replicas: &[&Webhook], step: &str) -> f64 {
    replicas
        .iter()
        .map(|w| {
            metric(
                w.metrics_port,
                "primus_webhook_certificate_rotations_total",
                &format!("step=\"{step}\""),
            )
        })
        .sum()
}

/// What the load saw.
#[derive(Default)]
struct Tally {
    reviews: AtomicUsize,
    admitted: AtomicUsize,
    denied_as_expected: AtomicUsize,
    probes: AtomicUsize,
    failures: Mutex<Vec<String>>,
    /// (seconds since the start, CAs in the caBundle) at every change.
    bundle_sizes: Mutex<Vec<(f64, usize)>>,
}

impl Tally {
    fn fail(&self, start: Instant, what: String) {
        let t = start.elapsed().as_secs_f64();
        self.failures
            .lock()
            .unwrap()
            .push(format!("{t:.1} s: {what}"));
    }
}

/// Dry-run creates through the API server until `stop`: the fitting job must be admitted, the
/// OOM job denied by the webhook's memory check.
fn send_reviews(k: Kubectl, ns: String, stop: Arc<AtomicBool>, tally: Arc<Tally>, start: Instant) {
    let fitting = job(FITTING_JOB, "fits");
    let oom = job(OOM_JOB, "oom");
    while !stop.load(Ordering::Relaxed) {
        let out = k.run_stdin(
            &["create", "--dry-run=server", "-n", &ns, "-f", "-"],
            &fitting,
        );
        tally.reviews.fetch_add(1, Ordering::Relaxed);
        if out.status.success() {
            tally.admitted.fetch_add(1, Ordering::Relaxed);
        } else {
            tally.fail(
                start,
                format!("the fitting job was refused: {}", stderr(&out)),
            );
        }
        let out = k.run_stdin(&["create", "--dry-run=server", "-n", &ns, "-f", "-"], &oom);
        tally.reviews.fetch_add(1, Ordering::Relaxed);
        let err = stderr(&out);
        if !out.status.success() && err.contains("denied the request: predicted") {
            tally.denied_as_expected.fetch_add(1, Ordering::Relaxed);
        } else {
            tally.fail(
                start,
                format!("the OOM job was not denied by the memory check: {err}"),
            );
        }
    }
}

/// The configuration's caBundle, decoded.
fn live_bundle(k: &Kubectl, name: &str) -> String {
    let b64 = k.ok(&[
        "get",
        "validatingwebhookconfiguration",
        name,
        "-o",
        "jsonpath={.webhooks[0].clientConfig.caBundle}",
    ]);
    let bytes: k8s_openapi::ByteString =
        serde_json::from_value(Value::String(b64.trim().to_string())).unwrap_or_default();
    String::from_utf8(bytes.0).unwrap_or_default()
}

/// Until `stop`: fetch the caBundle, then handshake with each replica directly, trusting only it.
fn probe_replicas(
    k: Kubectl,
    configuration: String,
    ports: Vec<u16>,
    dir: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    tally: Arc<Tally>,
    start: Instant,
) {
    let file = dir.join("live-bundle.pem");
    let body = dir.join("probe-review.json");
    std::fs::write(&body, probe_review().to_string()).unwrap();
    let mut last_size = 0;
    while !stop.load(Ordering::Relaxed) {
        let bundle = live_bundle(&k, &configuration);
        let size = bundle.matches("BEGIN CERTIFICATE").count();
        if size != last_size {
            last_size = size;
            let t = start.elapsed().as_secs_f64();
            tally.bundle_sizes.lock().unwrap().push((t, size));
        }
        std::fs::write(&file, &bundle).unwrap();
        for port in &ports {
            // A review posted straight to the replica over TLS verified against the live
            // caBundle (curl checks the chain and the IP address): every replica answers these,
            // whichever replica the API server's connections happen to reach through the proxy.
            let out = std::process::Command::new("curl")
                .args(["--silent", "--show-error", "--max-time", "10"])
                .args(["--cacert", file.to_str().unwrap()])
                .args(["-H", "Content-Type: application/json"])
                .args(["--data-binary", &format!("@{}", body.display())])
                .arg(format!("https://127.0.0.1:{port}/validate/pytorchjob"))
                .stdin(std::process::Stdio::null())
                .output()
                .expect("curl");
            tally.probes.fetch_add(1, Ordering::Relaxed);
            let answer: Option<Value> = serde_json::from_slice(&out.stdout).ok();
            let allowed = answer
                .as_ref()
                .and_then(|a| a["response"]["allowed"].as_bool());
            if !out.status.success() || allowed != Some(true) {
                tally.fail(
                    start,
                    format!(
                        "replica on {port} did not admit the fitting job over TLS the caBundle ({size} CAs) trusts: {} {}",
                        stderr(&out),
                        String::from_utf8_lossy(&out.stdout)
                    ),
                );
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// An AdmissionReview of a CREATE of the fitting job, as the API server would send it.
fn probe_review() -> Value {
    let object: Value =
        serde_saphyr::from_str(&job(FITTING_JOB, "probe")).expect("the example job is YAML");
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0d1c-rotation-probe",
            "kind": {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"},
            "resource": {"group": "kubeflow.org", "version": "v1", "resource": "pytorchjobs"},
            "requestKind": {"group": "kubeflow.org", "version": "v1", "kind": "PyTorchJob"},
            "requestResource": {"group": "kubeflow.org", "version": "v1", "resource": "pytorchjobs"},
            "name": "probe",
            "namespace": "default",
            "operation": "CREATE",
            "userInfo": {"username": "rotation-probe"},
            "object": object,
            "oldObject": null,
            "dryRun": true,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// Apply `manifests` the two ways Argo CD syncs: client-side apply, then server-side apply
/// with its own field manager and forced conflicts.
fn sync_like_argo_cd(k: &Kubectl, ns: &str, manifests: &str) {
    let out = apply(k, ns, manifests, &[]);
    assert!(out.status.success(), "client-side sync: {}", stderr(&out));
    let out = apply(
        k,
        ns,
        manifests,
        &[
            "--server-side",
            "--force-conflicts",
            "--field-manager=argocd-controller",
        ],
    );
    assert!(out.status.success(), "server-side sync: {}", stderr(&out));
}

fn secret_key(k: &Kubectl, ns: &str, name: &str, key: &str) -> Option<String> {
    let s: Value =
        serde_json::from_str(&k.ok(&["get", "secret", "-n", ns, name, "-o", "json"])).ok()?;
    s["data"][key].as_str().map(str::to_string)
}

fn render(helm: &Helm, ns: &str, full: &str) -> Rendered {
    helm.render(
        "whrot",
        ns,
        &[
            "--kube-version",
            "1.20.2",
            "--set",
            &format!("fullnameOverride={full}"),
            "--set",
            "webhook.failurePolicy=Fail",
            "--set",
            "rbac.aggregateToDefaultRoles=false",
        ],
    )
}

#[test]
fn two_replicas_rotate_their_shared_ca_without_a_failed_review() {
    let Some(tb) = testbed!() else { return };
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let k = tb.kubectl();
    ensure_crds(&k);
    let dir = scratch("rotation");
    let ns = tb.namespace("chart-wh-rot");
    let full = format!("rot-{}", &ns.name[ns.name.len() - 4..]);
    let r = render(&helm, &ns.name, &full);
    let _cleanup = install_webhook_rbac(&k, &r, &full, &ns.name);
    let secret_name = format!("{full}-webhook-certs");

    // The Service: a proxy; the chart's configuration pointed at it, without a caBundle.
    let proxy = Proxy::start();
    let id = format!("{}-{}", std::process::id(), proxy.port);
    let vwc = registration(&r, &full, proxy.port, &id);
    let out = apply(&k, &ns.name, &vwc.to_string(), &[]);
    assert!(out.status.success(), "{}", stderr(&out));

    let kubeconfig = service_account_kubeconfig(&tb, &dir, &ns.name, &format!("{full}-webhook"));
    let env = [
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("POD_NAMESPACE", ns.name.clone()),
    ];
    let short = [
        ("--ca-validity-seconds", "36".to_string()),
        ("--cert-validity-seconds", "12".to_string()),
        ("--ca-overlap-seconds", "4".to_string()),
        ("--cert-reload-interval-seconds", "0.5".to_string()),
        ("--ca-bundle-resync-seconds", "1".to_string()),
    ];
    // The second replica re-reads the Secret only every 2 s (the most the 4 s overlap allows):
    // it lags behind every write, as a replica under load or far from the API server would.
    let mut slow = short.to_vec();
    slow[3].1 = "2".to_string();
    let mut a = Webhook::start(&r, &full, &short, &env, &dir);
    let mut b = Webhook::start(&r, &full, &slow, &env, &dir);
    *proxy.backends.lock().unwrap() = vec![a.port, b.port];
    a.wait_ready();
    b.wait_ready();
    let first_signer = secret_key(&k, &ns.name, &secret_name, "signer.crt").expect("signer.crt");
    let target = labelled_namespace(&tb, &id, None);
    wait_enforced(&k, &target.name);

    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut load = Vec::new();
    for _ in 0..2 {
        let (k, ns, stop, tally) = (k.clone(), target.name.clone(), stop.clone(), tally.clone());
        load.push(std::thread::spawn(move || {
            send_reviews(k, ns, stop, tally, start)
        }));
    }
    {
        let (k, name, ports) = (k.clone(), full.clone(), vec![a.port, b.port]);
        let (dir, stop, tally) = (dir.clone(), stop.clone(), tally.clone());
        load.push(std::thread::spawn(move || {
            probe_replicas(k, name, ports, dir, stop, tally, start)
        }));
    }

    // Midway through the rotation (a CA staged), sync the chart's objects as Argo CD would.
    let replicas = [&a, &b];
    wait_for(Duration::from_secs(90), "a CA to be staged", || {
        (rotations(&replicas, "stage-ca") >= 1.0).then_some(())
    });
    let chart_secret = r.get("Secret", &secret_name);
    sync_like_argo_cd(&k, &ns.name, &format!("---\n{chart_secret}\n---\n{vwc}\n"));
    assert!(
        secret_key(&k, &ns.name, &secret_name, "signer.crt").is_some(),
        "a sync emptied the Secret"
    );
    assert!(
        live_bundle(&k, &full).contains("BEGIN CERTIFICATE"),
        "a sync blanked the caBundle"
    );
    wait_for(Duration::from_secs(60), "the old CA to be retired", || {
        (rotations(&replicas, "retire-ca") >= 1.0).then_some(())
    });
    let rotated_signer = secret_key(&k, &ns.name, &secret_name, "signer.crt").unwrap();
    assert_ne!(rotated_signer, first_signer, "the CA did not change");

    // A sync that replaces the Secret (emptied): written back with the same CA.
    let out = k.run_stdin(
        &["replace", "-n", &ns.name, "-f", "-"],
        &chart_secret.to_string(),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let restored = wait_for(Duration::from_secs(20), "the Secret to be restored", || {
        secret_key(&k, &ns.name, &secret_name, "signer.crt")
    });
    assert_eq!(restored, rotated_signer, "the restore changed the CA");
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().expect("load thread");
    }

    let failures = tally.failures.lock().unwrap().clone();
    let steps: BTreeMap<&str, f64> = [
        "create",
        "renew-serving",
        "stage-ca",
        "promote-ca",
        "retire-ca",
        "restore",
    ]
    .into_iter()
    .map(|s| (s, rotations(&replicas, s)))
    .collect();
    let answered: Vec<f64> = replicas
        .iter()
        .map(|w| metric(w.metrics_port, "primus_webhook_admissions_total", ""))
        .collect();
    let reloads: Vec<f64> = replicas
        .iter()
        .map(|w| {
            metric(
                w.metrics_port,
                "primus_webhook_certificate_reloads_total",
                "result=\"ok\"",
            )
        })
        .collect();
    let sizes = tally.bundle_sizes.lock().unwrap().clone();
    let two = sizes.iter().find(|(_, n)| *n == 2).map(|(t, _)| *t);
    let back = sizes.iter().rev().find(|(_, n)| *n == 1).map(|(t, _)| *t);
    primus_tests::loud(&format!(
        "\n==== CA rotation with two replicas: {} reviews through the API server ({} admitted, {} denied as expected), {} direct TLS probes, {} failures; \
         Secret writes {steps:?}; reviews answered per replica {answered:?}; certificate reloads per replica {reloads:?}; \
         caBundle size over time {sizes:?} (two CAs trusted for {:.1} s); {:.0} s in all\n",
        tally.reviews.load(Ordering::Relaxed),
        tally.admitted.load(Ordering::Relaxed),
        tally.denied_as_expected.load(Ordering::Relaxed),
        tally.probes.load(Ordering::Relaxed),
        failures.len(),
        match (two, back) {
            (Some(t2), Some(t1)) if t1 > t2 => t1 - t2,
            _ => f64::NAN,
        },
        start.elapsed().as_secs_f64()
    ));
    assert!(
        failures.is_empty(),
        "{} failed reviews or probes:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        tally.reviews.load(Ordering::Relaxed) >= 20,
        "too few reviews"
    );
    assert!(tally.probes.load(Ordering::Relaxed) >= 20, "too few probes");
    for (step, want) in [
        ("create", 1.0),
        ("stage-ca", 1.0),
        ("promote-ca", 1.0),
        ("retire-ca", 1.0),
        ("restore", 1.0),
    ] {
        assert_eq!(steps[step], want, "{step}: {steps:?}");
    }
    assert!(steps["renew-serving"] >= 2.0, "{steps:?}");
    // Both replicas served: each reloaded every certificate, and each answered at least its
    // direct probes (the API server's reviews reach a replica only through the connections it
    // opens, one per caBundle it trusts, so which replica they reach is up to the proxy's
    // turn: CI once saw every one of them land on the first replica).
    let per_replica = tally.probes.load(Ordering::Relaxed) as f64 / replicas.len() as f64;
    assert!(reloads.iter().all(|n| *n >= 4.0), "{reloads:?}");
    assert!(
        answered.iter().all(|n| *n >= per_replica),
        "{answered:?} < {per_replica} probes each"
    );
    // The bundle went to two CAs and back to one, trusting both for the two overlaps (4 s each,
    // sampled every few hundred ms; on a loaded 2-core machine a sample can come seconds late,
    // 6.6 s was seen once). A retire without its overlap gives 3.4 s: 5.5 s tells them apart.
    assert!(two.is_some() && back > two, "{sizes:?}");
    let both = back.unwrap_or(0.0) - two.unwrap_or(0.0);
    assert!(
        both >= 5.5,
        "two CAs trusted for {both:.1} s only: {sizes:?}"
    );
}
