//! The chart's RBAC against the code.
//!
//! Statically: the permissions the Rust sources call for (rbac_scan.rs) must equal the rules
//! of each role the chart renders, exactly: a new API call without a rule fails, and so does a
//! rule nothing calls.
//!
//! For real: the chart's service accounts and roles are applied to the test bed, and the
//! operator binary runs with the chart's own arguments as the operator's service account
//! (impersonation), the benchmark process as the benchmark service account, and `primus report`
//! as a service account bound to the reporter role. The example plan must go all the way to a
//! Ready plan with a PyTorchJob, a BenchmarkReport, events and drift, with no "forbidden" in the
//! operator's log.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use primus_tests::node_agent::{NodeAgent, binary};
use primus_tests::{Kubectl, TestBed, repo_root, stderr, stdout, testbed};
use serde_json::Value;

use super::helm::{Helm, Rendered};
use super::rbac_scan::{Component, Perm, sources};

/// The (group, resource, verb) triples of a Role/ClusterRole's rules.
fn rule_perms(role: &Value) -> BTreeSet<Perm> {
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().expect("rules") {
        let list = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_str().unwrap().to_string()).collect())
                .unwrap_or_default()
        };
        for g in list("apiGroups") {
            for r in list("resources") {
                for v in list("verbs") {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

fn show(perms: &BTreeSet<Perm>) -> String {
    perms
        .iter()
        .map(|(g, r, v)| format!("  {}/{r}: {v}", if g.is_empty() { "core" } else { g }))
        .collect::<Vec<_>>()
        .join("\n")
}

fn assert_same(component: &str, code: &BTreeSet<Perm>, chart: &BTreeSet<Perm>) {
    let missing: BTreeSet<Perm> = code.difference(chart).cloned().collect();
    let extra: BTreeSet<Perm> = chart.difference(code).cloned().collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{component}: the chart's RBAC and the code's API calls differ.\n\
         called by the code but not granted by the chart:\n{}\n\
         granted by the chart but called nowhere in the code:\n{}\n\
         (edit charts/primus-projection/templates/rbac.yaml, or teach tests/tests/chart/rbac_scan.rs a new pattern)",
        show(&missing),
        show(&extra)
    );
}

fn components(root: &Path) -> Vec<(&'static str, Component<'_>)> {
    let cli = root.join("cli/src");
    vec![
        (
            "operator",
            Component {
                own: sources(&root.join("operator/src"), &[]),
                shared: vec![],
                root,
            },
        ),
        // The load generator (src/bin) is a client for benchmarks, not part of the server.
        (
            "webhook",
            Component {
                own: sources(&root.join("webhook/src"), &["bin"]),
                shared: vec![],
                root,
            },
        ),
        (
            "benchmark",
            Component {
                own: vec![cli.join("bench.rs")],
                shared: vec![cli.join("kube.rs")],
                root,
            },
        ),
        (
            "reporter",
            Component {
                own: vec![cli.join("report.rs")],
                shared: vec![cli.join("kube.rs")],
                root,
            },
        ),
    ]
}

#[test]
fn chart_rbac_matches_the_api_calls_in_the_code() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let root = repo_root();
    let full = "primus-primus-projection";
    let cluster = helm.render(
        "primus",
        "primus-system",
        &["--set", "webhook.tls.mode=selfSigned"],
    );
    let namespaced = helm.render(
        "primus",
        "primus-system",
        &[
            "--set",
            "operator.watchNamespace=team-a",
            "--set",
            "webhook.tls.mode=selfSigned",
        ],
    );
    let leader = rule_perms(cluster.get("Role", &format!("{full}-operator-leader")));
    for (name, component) in components(&root) {
        let code = component.perms().unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            !code.is_empty(),
            "{name}: the scanner found no API calls at all"
        );
        let chart: BTreeSet<Perm> = match name {
            "operator" => {
                let cr = rule_perms(cluster.get("ClusterRole", &format!("{full}-operator")));
                let role = rule_perms(namespaced.get("Role", &format!("{full}-operator")));
                assert_eq!(
                    cr, role,
                    "the operator's ClusterRole and its one-namespace Role differ"
                );
                cr.union(&leader).cloned().collect()
            }
            // The webhook: its configuration (cluster-wide) and its Secret (a Role).
            "webhook" => {
                let cr = rule_perms(cluster.get("ClusterRole", &format!("{full}-webhook")));
                let role = rule_perms(cluster.get("Role", &format!("{full}-webhook")));
                cr.union(&role).cloned().collect()
            }
            other => rule_perms(cluster.get("ClusterRole", &format!("{full}-{other}"))),
        };
        assert_same(name, &code, &chart);
    }
    // Names: the lease rights are limited to the lease the operator is told to use, the
    // webhook's to the configuration it is told to patch.
    let op_args = serde_json::to_string(
        &cluster.get("Deployment", &format!("{full}-operator"))["spec"]["template"]["spec"]["containers"][0]["args"],
    )
    .unwrap();
    let lease_rule = &cluster.get("Role", &format!("{full}-operator-leader"))["rules"][1];
    let lease = lease_rule["resourceNames"][0].as_str().unwrap();
    assert!(
        op_args.contains(&format!("--lease-name={lease}")),
        "{op_args}"
    );
    let wh_args = serde_json::to_string(
        &cluster.get("Deployment", &format!("{full}-webhook"))["spec"]["template"]["spec"]["containers"][0]["args"],
    )
    .unwrap();
    let hook = cluster.get("ClusterRole", &format!("{full}-webhook"))["rules"][0]["resourceNames"]
        [0]
    .as_str()
    .unwrap()
    .to_string();
    assert!(
        wh_args.contains(&format!("--webhook-configuration={hook}")),
        "{wh_args}"
    );
    cluster.get("ValidatingWebhookConfiguration", &hook);
    let secret = cluster.get("Role", &format!("{full}-webhook"))["rules"][0]["resourceNames"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        wh_args.contains(&format!("--cert-secret={secret}")),
        "{wh_args}"
    );
    cluster.get("Secret", &secret);

    // The operator README documents the same table; say so loudly when it drifts (the README
    // belongs to the operator's owners).
    readme_note(&root, &components(&root)[0].1);
}

/// Compare operator/README.md's RBAC table with the code, and print the differences.
fn readme_note(root: &Path, operator: &Component<'_>) {
    let Ok(readme) = std::fs::read_to_string(root.join("operator/README.md")) else {
        return;
    };
    let mut documented = BTreeSet::new();
    for line in readme.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() < 4 || cells[1] == "API group" || cells[1].starts_with("---") {
            continue;
        }
        let group = if cells[1].contains("core") {
            ""
        } else {
            cells[1]
        };
        let verbs = cells[3].split('(').next().unwrap_or_default();
        for verb in verbs.split(',') {
            let verb = verb.split_whitespace().next().unwrap_or_default();
            documented.insert((group.to_string(), cells[2].to_string(), verb.to_string()));
        }
    }
    let code = operator.perms().unwrap_or_default();
    if documented != code {
        primus_tests::loud(&format!(
            "\n==== note: operator/README.md's RBAC table differs from the code's API calls\n\
             documented, not called:\n{}\ncalled, not documented:\n{}\n",
            show(&documented.difference(&code).cloned().collect()),
            show(&code.difference(&documented).cloned().collect())
        ));
    }
}

/// Cluster-scoped objects a test created, deleted when it ends.
struct ClusterObjects {
    kubectl: Kubectl,
    names: Vec<String>,
}

impl Drop for ClusterObjects {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = self
                .kubectl
                .run(&["delete", n, "--ignore-not-found", "--wait=false"]);
        }
    }
}

/// A copy of the admin kubeconfig that acts as `user` (the admin may impersonate; the API
/// server adds the service account's groups and system:authenticated).
fn impersonating(tb: &TestBed, dir: &Path, name: &str, user: &str) -> PathBuf {
    let text = std::fs::read_to_string(&tb.kubeconfig).expect("kubeconfig");
    let mut cfg: Value = serde_saphyr::from_str(&text).expect("kubeconfig YAML");
    for u in cfg["users"].as_array_mut().expect("users") {
        u["user"]["as"] = Value::String(user.to_string());
    }
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, serde_json::to_string(&cfg).unwrap()).expect("write kubeconfig");
    path
}

fn apply(k: &Kubectl, ns: &str, manifests: &str) {
    let out = k.run_stdin(&["apply", "-n", ns, "-f", "-"], manifests);
    assert!(
        out.status.success(),
        "kubectl apply: {}\n{}",
        stderr(&out),
        stdout(&out)
    );
}

fn ensure_pytorchjob_crd(k: &Kubectl) {
    if k.run(&["get", "crd", "pytorchjobs.kubeflow.org"])
        .status
        .success()
    {
        return;
    }
    let file = repo_root().join("crds/thirdparty/kubeflow.org_pytorchjobs.yaml");
    let out = k.run(&["apply", "-f", file.to_str().unwrap()]);
    if !out.status.success()
        && !k
            .run(&["get", "crd", "pytorchjobs.kubeflow.org"])
            .status
            .success()
    {
        panic!("installing the PyTorchJob CRD: {}", stderr(&out));
    }
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/pytorchjobs.kubeflow.org",
    ]);
}

fn plan_json(k: &Kubectl, ns: &str, name: &str) -> Option<Value> {
    let out = k.run(&["get", "trainingplan", "-n", ns, name, "-o", "json"]);
    out.status
        .success()
        .then(|| serde_json::from_str(&stdout(&out)).ok())
        .flatten()
}

fn condition(plan: &Value, kind: &str) -> Option<Value> {
    plan["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
        .cloned()
}

#[test]
fn the_operator_and_benchmark_pods_work_under_the_chart_rbac_alone() {
    let Some(tb) = testbed!() else { return };
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let k = tb.kubectl();
    ensure_pytorchjob_crd(&k);
    let ns = tb.namespace("chart-rbac");
    let full = format!("rbac-{}", &ns.name[ns.name.len() - 4..]);
    let dir = std::env::temp_dir().join(format!("primus-chart-rbac-{}", ns.name));
    std::fs::create_dir_all(&dir).unwrap();

    // The chart's service accounts and RBAC, for one watched namespace (the release's).
    let r: Rendered = helm.render(
        "rbac",
        &ns.name,
        &[
            "--set",
            &format!("fullnameOverride={full}"),
            "--set",
            &format!("operator.watchNamespace={}", ns.name),
            "--set",
            &format!("benchmark.namespaces={{{}}}", ns.name),
            "--set",
            "rbac.aggregateToDefaultRoles=false",
            "--set",
            "webhook.enabled=false",
        ],
    );
    let _cleanup = ClusterObjects {
        kubectl: k.clone(),
        names: r
            .objects
            .iter()
            .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "ClusterRoleBinding")
            .map(|o| {
                format!(
                    "{}/{}",
                    o["kind"].as_str().unwrap().to_lowercase(),
                    o["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect(),
    };
    let rbac: String = r
        .objects
        .iter()
        .filter(|o| {
            [
                "ServiceAccount",
                "Role",
                "RoleBinding",
                "ClusterRole",
                "ClusterRoleBinding",
            ]
            .iter()
            .any(|k| o["kind"] == *k)
        })
        .map(|o| format!("---\n{o}\n"))
        .collect();
    apply(&k, &ns.name, &rbac);
    // What a user adds: a service account for training jobs bound to the reporter role; and,
    // for the test's stand-in kubelet that runs benchmark pods as the benchmark account, the
    // rights a kubelet has on pods (not part of the chart).
    apply(
        &k,
        &ns.name,
        &format!(
            "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: trainer}}\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: trainer-reports}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {full}-reporter}}\n\
             subjects: [{{kind: ServiceAccount, name: trainer, namespace: {ns}}}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: test-kubelet}}\n\
             rules: [{{apiGroups: [\"\"], resources: [pods], verbs: [get, list, watch]}}, {{apiGroups: [\"\"], resources: [pods/status], verbs: [get, patch, update]}}]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: test-kubelet}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: test-kubelet}}\n\
             subjects: [{{kind: ServiceAccount, name: {full}-benchmark, namespace: {ns}}}]\n",
            ns = ns.name
        ),
    );

    let sa = |name: &str| format!("system:serviceaccount:{}:{name}", ns.name);
    let op_cfg = impersonating(&tb, &dir, "operator", &sa(&format!("{full}-operator")));
    let bench_cfg = impersonating(&tb, &dir, "benchmark", &sa(&format!("{full}-benchmark")));
    let trainer_cfg = impersonating(&tb, &dir, "trainer", &sa("trainer"));

    // Impersonation is in force, for kubectl and for the kube-rs client alike.
    let denied = Kubectl::new(&op_cfg).run(&["get", "secrets", "-n", &ns.name]);
    assert!(
        !denied.status.success() && stderr(&denied).contains("forbidden"),
        "{}",
        stderr(&denied)
    );

    // The operator, with the chart's own arguments (metrics on a free loopback port).
    let deploy = r.get("Deployment", &format!("{full}-operator"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let chart_args: Vec<String> = deploy["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .map(|a| {
            if a.starts_with("--metrics-addr=") {
                format!("--metrics-addr=127.0.0.1:{port}")
            } else {
                a
            }
        })
        .collect();
    assert!(
        chart_args.contains(&format!("--namespace={}", ns.name)),
        "{chart_args:?}"
    );
    let log = dir.join("operator.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut op = Command::new(binary("primus-operator"))
        .args(&chart_args)
        .env("KUBECONFIG", &op_cfg)
        .env("POD_NAME", "operator-under-chart-rbac")
        .env("POD_NAMESPACE", &ns.name)
        .env("RUST_LOG", "info,primus_operator=debug")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .expect("start primus-operator");
    struct Kill<'a>(&'a mut std::process::Child, &'a Path);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            if std::thread::panicking() {
                let text = std::fs::read_to_string(self.1).unwrap_or_default();
                let tail: String = text
                    .chars()
                    .rev()
                    .take(6000)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                primus_tests::loud(&format!(
                    "\n---- operator log ({}) ----\n{tail}\n",
                    self.1.display()
                ));
            }
        }
    }
    let _op = Kill(&mut op, &log);
    // The agent plays the kubelet (admin: it reads the pods' Secrets); the benchmark process
    // acts as the benchmark service account.
    let _agent = NodeAgent::start_with(
        &tb,
        &bench_cfg,
        &ns.name,
        "app.kubernetes.io/component=benchmark",
    );

    let plan = "llama3-8b-bench";
    let example =
        std::fs::read_to_string(repo_root().join("examples/llama3.1-8b-h100-benchmark.yaml"))
            .unwrap();
    apply(&k, &ns.name, &example);
    let deadline = Instant::now() + Duration::from_secs(240);
    let ready = loop {
        let p = plan_json(&k, &ns.name, plan);
        if let Some(p) = &p
            && condition(p, "Ready").is_some_and(|c| c["status"] == "True")
        {
            break p.clone();
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(
            !text.to_lowercase().contains("forbidden"),
            "the operator was refused something under the chart's RBAC:\n{}",
            text.lines()
                .filter(|l| l.to_lowercase().contains("forbidden"))
                .take(5)
                .collect::<Vec<_>>()
                .join("\n")
        );
        assert!(
            Instant::now() < deadline,
            "the plan did not become Ready: {p:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(
        condition(&ready, "Benchmarked").unwrap()["status"],
        "True",
        "{ready}"
    );
    assert_eq!(
        condition(&ready, "JobCreated").unwrap()["status"],
        "True",
        "{ready}"
    );
    k.ok(&["get", "pytorchjob", "-n", &ns.name, plan]);
    let reports = k.ok(&["get", "benchmarkreports", "-n", &ns.name, "-o", "name"]);
    assert!(!reports.trim().is_empty(), "no BenchmarkReport");
    let lease: Value = serde_json::from_str(&k.ok(&[
        "get",
        "lease",
        "-n",
        &ns.name,
        &format!("{full}-operator"),
        "-o",
        "json",
    ]))
    .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "operator-under-chart-rbac");
    let events = k.ok(&["get", "events.events.k8s.io", "-n", &ns.name, "-o", "json"]);
    assert!(
        events.contains("primus-operator"),
        "no events from the operator"
    );

    // primus report as the trainer account (reporter role) -> drift in the status.
    let primus = binary("primus");
    let report = |cfg: &Path| {
        Command::new(&primus)
            .args([
                "report",
                "--plan",
                &format!("{}/{plan}", ns.name),
                "--tokens-per-second",
                "100",
            ])
            .env("KUBECONFIG", cfg)
            .output()
            .expect("primus report")
    };
    let out = report(&trainer_cfg);
    assert!(
        out.status.success(),
        "primus report as the trainer: {}{}",
        stdout(&out),
        stderr(&out)
    );
    // ... and the benchmark account may not (the kube-rs client impersonates too).
    let out = report(&bench_cfg);
    assert!(
        !out.status.success() && stderr(&out).contains("forbidden"),
        "primus report as the benchmark account should be forbidden: {}{}",
        stdout(&out),
        stderr(&out)
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = plan_json(&k, &ns.name, plan).unwrap_or_default();
        if condition(&p, "DriftWithinTolerance").is_some_and(|c| c["status"] == "False") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no drift condition after primus report: {p}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.to_lowercase().contains("forbidden"),
        "forbidden in the operator's log:\n{text}"
    );
}
