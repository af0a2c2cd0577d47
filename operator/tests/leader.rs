//! Two operator replicas against the real test bed: only the Lease holder acts; when it dies
//! the other takes over. And shutdown: SIGTERM ends the process within a few seconds, also
//! when the API server has become unreachable.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::*;
use kube::api::{Api, ListParams};
use primus_tests::testbed;

fn plan_yaml(name: &str, gbs: u32) -> String {
    format!(
        "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata:\n  name: {name}\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 8}}\n  training: {{seqLength: 4096, globalBatchSize: {gbs}}}\n  tuning: {{searcher: exhaustive, allowed: {{tp: [1, 2, 4], pp: [1]}}}}\n"
    )
}

fn args(ns: &str) -> OperatorArgs<'_> {
    OperatorArgs {
        namespace: ns,
        lease: "primus-operator-ha",
        kubeconfig: None,
        extra: vec![],
    }
}

#[test]
fn only_the_leader_acts_and_the_other_replica_takes_over() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-leader");
    let k = tb.kubectl();
    let mut a = Operator::start(&tb, "replica-a", args(&ns.name));
    a.wait_leading(Duration::from_secs(60));
    let mut b = Operator::start(&tb, "replica-b", args(&ns.name));
    // B is up (its /readyz answers) but stands by.
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(b.port, "/readyz").map(|(c, _)| c) != Some(200) {
        assert!(
            b.running() && Instant::now() < deadline,
            "replica-b never became ready:\n{}",
            b.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!b.leading());
    let rt = runtime();
    let client = rt.block_on(tb.client());

    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &plan_yaml("ha", 64));
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    rt.block_on(poll(Duration::from_secs(60), "Ready", || {
        let client = client.clone();
        let ns = ns.name.clone();
        async move {
            get_plan(&client, &ns, "ha")
                .await
                .filter(|p| has(p, "Ready", "True"))
        }
    }));
    // The pass that wrote Ready is counted when it returns.
    rt.block_on(poll(
        Duration::from_secs(10),
        "the leader's pass to be counted",
        || {
            let n = a.reconciles();
            async move { (n >= 1.0).then_some(()) }
        },
    ));
    assert_eq!(b.reconciles(), 0.0, "the standby replica reconciled");
    assert!(!b.leading());
    assert_eq!(
        rt.block_on(jobs_api(&client, &ns.name).list(&ListParams::default()))
            .unwrap()
            .items
            .len(),
        1
    );

    // Kill the leader without clean-up: B takes over once the Lease expires (3 s).
    let killed = Instant::now();
    a.kill();
    b.wait_leading(Duration::from_secs(30));
    primus_tests::loud(&format!(
        "\n==== failover: replica-b leads {:.2} s after the leader was killed (lease 3 s)\n",
        killed.elapsed().as_secs_f64()
    ));
    let lease: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &ns.name);
    let l = rt.block_on(lease.get("primus-operator-ha")).unwrap();
    let spec = l.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-b"));
    assert!(spec.lease_transitions.unwrap_or(0) >= 1);

    // B acts: a spec change is reconciled.
    k.ok(&[
        "patch",
        "tplan",
        "ha",
        "-n",
        &ns.name,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"training":{"globalBatchSize":128}}}"#,
    ]);
    let plan = rt.block_on(poll(
        Duration::from_secs(60),
        "the new leader to reconcile the change",
        || {
            let client = client.clone();
            let ns = ns.name.clone();
            async move {
                get_plan(&client, &ns, "ha").await.filter(|p| {
                    p.metadata.generation == Some(2)
                        && p.status
                            .as_ref()
                            .is_some_and(|s| s.observed_generation == Some(2))
                        && has(p, "Ready", "True")
                })
            }
        },
    ));
    assert!(plan.status.unwrap().chosen.is_some());
    rt.block_on(poll(
        Duration::from_secs(10),
        "the new leader's passes",
        || {
            let n = b.reconciles();
            async move { (n >= 1.0).then_some(()) }
        },
    ));

    // A clean stop releases the Lease: a third replica leads at once, not after expiry.
    let (took, code) = b.terminate(Duration::from_secs(10));
    assert_eq!(code, Some(0), "replica-b log:\n{}", b.log_text());
    assert!(took < Duration::from_secs(5), "SIGTERM took {took:?}");
    let l = rt.block_on(lease.get("primus-operator-ha")).unwrap();
    assert!(
        l.spec.unwrap().holder_identity.is_none(),
        "the lease was released"
    );
    let t = Instant::now();
    let mut c = Operator::start(&tb, "replica-c", args(&ns.name));
    c.wait_leading(Duration::from_secs(30));
    assert!(
        t.elapsed() < Duration::from_secs(3) + Duration::from_secs(2),
        "took {:?}",
        t.elapsed()
    );
}

/// A TCP forwarder in front of the API server that the test can turn into a black hole:
/// connections stay open but nothing comes back (the hardest case for timeouts).
struct Proxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    runtime: tokio::runtime::Runtime,
}

impl Proxy {
    fn start(target: SocketAddr) -> Proxy {
        let runtime = runtime();
        let cut = Arc::new(AtomicBool::new(false));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let flag = cut.clone();
        runtime.spawn(async move {
            let mut graveyard = Vec::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if flag.load(Ordering::SeqCst) {
                    // Accept and never answer.
                    graveyard.push(inbound);
                    continue;
                }
                let flag = flag.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
                    tokio::select! {
                        _ = copy => {}
                        _ = async {
                            while !flag.load(Ordering::SeqCst) {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        } => {
                            // Stop forwarding, keep both ends open until the test ends.
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                        }
                    }
                });
            }
        });
        Proxy { addr, cut, runtime }
    }

    /// From now on nothing reaches the API server and nothing comes back.
    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

/// A proxy in front of the test bed's API server, and a kubeconfig that goes through it.
fn proxied(tb: &primus_tests::TestBed) -> (Proxy, tempfile::TempDir, std::path::PathBuf) {
    let text = std::fs::read_to_string(&tb.kubeconfig).unwrap();
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: https://"))
        .expect("kubeconfig server")
        .trim()
        .to_string();
    let target: SocketAddr = server.parse().expect("server is IP:port");
    let proxy = Proxy::start(target);
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, text.replace(&server, &proxy.addr.to_string())).unwrap();
    (proxy, dir, kubeconfig)
}

#[test]
fn sigterm_ends_the_operator_promptly_even_without_an_api_server() {
    let Some(tb) = testbed!() else { return };
    let ns = tb.namespace("op-shutdown");
    let (proxy, _dir, kubeconfig) = proxied(&tb);

    let mut op = Operator::start(
        &tb,
        "op-cut",
        OperatorArgs {
            namespace: &ns.name,
            lease: "primus-operator-cut",
            kubeconfig: Some(&kubeconfig),
            extra: vec![],
        },
    );
    op.wait_leading(Duration::from_secs(60));
    proxy.cut();
    // Let it notice (a renewal fails) before the signal.
    std::thread::sleep(Duration::from_secs(1));
    let (took, code) = op.terminate(Duration::from_secs(15));
    assert!(
        code.is_some(),
        "the operator did not exit within 15 s:\n{}",
        op.log_text()
    );
    assert!(
        took < Duration::from_secs(8),
        "SIGTERM took {took:?} without an API server:\n{}",
        op.log_text()
    );
    primus_tests::loud(&format!(
        "\n==== shutdown without an API server: {:.2} s (exit code {code:?})\n",
        took.as_secs_f64()
    ));
    proxy.runtime.shutdown_background();
}

/// The leader's API traffic goes through a proxy that the test freezes (connections stay
/// open, nothing comes back: a renewal that hangs). With lease 3 s and renew deadline 2 s, the
/// leader must stop acting (its fence closes, its leader gauge drops, it stops reconciling)
/// within the renew deadline of its last renewal, before the Lease can expire for the other
/// replica, which then takes over. Before the fence, the hung renewal held on for the API call
/// timeout (20 s) and the controller kept writing meanwhile.
#[test]
fn a_leader_whose_renewal_hangs_stops_acting_within_the_renew_deadline() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-hang");
    let (proxy, _dir, kubeconfig) = proxied(&tb);
    let mut a = Operator::start(
        &tb,
        "replica-hung",
        OperatorArgs {
            namespace: &ns.name,
            lease: "primus-operator-hang",
            kubeconfig: Some(&kubeconfig),
            extra: vec![],
        },
    );
    a.wait_leading(Duration::from_secs(60));
    let b = Operator::start(
        &tb,
        "replica-direct",
        OperatorArgs {
            namespace: &ns.name,
            lease: "primus-operator-hang",
            kubeconfig: None,
            extra: vec![],
        },
    );
    let rt = runtime();
    let client = rt.block_on(tb.client());
    let lease: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &ns.name);
    // Let b stand by, and a renew a few times.
    std::thread::sleep(Duration::from_secs(2));
    assert!(a.leading() && !b.leading());

    proxy.cut();
    let cut = Instant::now();
    // The last renewal the API server has from a (its record no longer changes).
    let last_renew = |l: &k8s_openapi::api::coordination::v1::Lease| {
        l.spec.as_ref().and_then(|s| s.renew_time.clone())
    };
    let before = last_renew(&rt.block_on(lease.get("primus-operator-hang")).unwrap());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut stopped = None;
    let mut b_leads = None;
    while (stopped.is_none() || b_leads.is_none()) && Instant::now() < deadline {
        if stopped.is_none() && !a.leading() {
            stopped = Some(cut.elapsed());
        }
        if b_leads.is_none() && b.leading() {
            b_leads = Some(cut.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = stopped.unwrap_or_else(|| {
        panic!(
            "the hung leader still acts 10 s after the cut:\n{}",
            a.log_text()
        )
    });
    let b_leads =
        b_leads.unwrap_or_else(|| panic!("the other replica never took over:\n{}", b.log_text()));
    let l = rt.block_on(lease.get("primus-operator-hang")).unwrap();
    assert_eq!(
        l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()),
        Some("replica-direct")
    );
    assert!(before.is_some());
    primus_tests::loud(&format!(
        "\n==== renewal hung: the leader stopped acting {:.2} s after the cut (renew deadline 2 s), the other replica led {:.2} s after it (lease 3 s)\n",
        stopped.as_secs_f64(),
        b_leads.as_secs_f64()
    ));
    // Within the renew deadline of its last renewal (which came before the cut), with slack
    // for the 20 ms polls of its /metrics; and before the Lease could expire elsewhere.
    assert!(
        stopped <= Duration::from_millis(2300),
        "stopped acting {stopped:?} after the cut:\n{}",
        a.log_text()
    );
    assert!(
        stopped < b_leads,
        "a acted until {stopped:?}, b led at {b_leads:?}"
    );
    assert!(a.log_text().contains("stopped acting"), "{}", a.log_text());
    proxy.runtime.shutdown_background();
}

/// The fence on the controller's client, against the test bed: writes pass while it is open
/// and are refused locally once it closes, reads go on; a write hung in flight (the proxy
/// frozen) is abandoned when the fence closes, not after the API call timeout.
#[test]
fn a_closed_fence_refuses_writes_and_cuts_off_a_hung_one() {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::PostParams;
    use primus_operator::fence::{Fence, fenced_client};
    let Some(tb) = testbed!() else { return };
    let ns = tb.namespace("op-fence");
    let (proxy, _dir, kubeconfig) = proxied(&tb);
    let rt = runtime();
    let config = |path: &std::path::Path| {
        let kc = kube::config::Kubeconfig::read_from(path).unwrap();
        rt.block_on(kube::Config::from_custom_kubeconfig(
            kc,
            &kube::config::KubeConfigOptions::default(),
        ))
        .unwrap()
    };
    primus_tests::install_crypto_provider();
    let _in_runtime = rt.enter();
    let fence = Fence::closed();
    let client = fenced_client(config(&tb.kubeconfig), fence.clone()).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns.name);
    let cm = |name: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let err = rt
        .block_on(cms.create(&PostParams::default(), &cm("closed")))
        .unwrap_err();
    assert!(err.to_string().contains("not leading"), "{err}");
    fence.open_until(Instant::now() + Duration::from_secs(30));
    rt.block_on(cms.create(&PostParams::default(), &cm("open")))
        .expect("an open fence lets writes through");
    fence.close();
    assert!(rt.block_on(cms.get("open")).is_ok(), "reads go on");
    assert!(
        rt.block_on(cms.delete("open", &Default::default()))
            .is_err()
    );

    // Through the frozen proxy: the write hangs until the fence closes 1 s later.
    let hung = fenced_client(config(&kubeconfig), fence.clone()).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(hung, &ns.name);
    rt.block_on(cms.list(&Default::default()))
        .expect("the proxy forwards");
    proxy.cut();
    // The forwarders notice the cut within 20 ms.
    std::thread::sleep(Duration::from_millis(200));
    fence.open_until(Instant::now() + Duration::from_secs(1));
    let t = Instant::now();
    let err = rt
        .block_on(cms.create(&PostParams::default(), &cm("hung")))
        .unwrap_err();
    let took = t.elapsed();
    assert!(err.to_string().contains("not leading"), "{err}");
    assert!(took < Duration::from_millis(1500), "cut off after {took:?}");
    proxy.runtime.shutdown_background();
}
