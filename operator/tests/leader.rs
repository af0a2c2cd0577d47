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

#[test]
fn sigterm_ends_the_operator_promptly_even_without_an_api_server() {
    let Some(tb) = testbed!() else { return };
    let ns = tb.namespace("op-shutdown");
    // The test bed's server address, and a kubeconfig that goes through the proxy.
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
