//! The Helm chart (`charts/primus-projection`) with real tools: `helm lint --strict`, `helm
//! template` with default and non-default values (checked object by object), the rendered
//! manifests applied with `kubectl apply --dry-run=server` to the real test bed, the values
//! schema rejecting bad values with a message naming them, the CRD copies, and (in the
//! submodules) the RBAC against the code's API calls, the Prometheus rules under `promtool test
//! rules`, the Grafana dashboard's queries against the exported metrics, the Argo CD health check under `lua5.1`, the webhook under the chart's arguments and
//! two replicas rotating their shared CA; and docs/install.md's first example on a bare cluster.

#[path = "chart/argocd.rs"]
mod argocd;
#[path = "chart/dashboard.rs"]
mod dashboard;
#[path = "chart/fixtures.rs"]
mod fixtures;
#[path = "chart/helm.rs"]
mod helm;
#[path = "chart/monitoring.rs"]
mod monitoring;
#[path = "chart/rbac.rs"]
mod rbac;
#[path = "chart/rbac_scan.rs"]
mod rbac_scan;
#[path = "chart/render.rs"]
mod render;
#[path = "chart/rotation.rs"]
mod rotation;
#[path = "chart/webhook.rs"]
mod webhook;

use fixtures::{FULL, NON_DEFAULT, NS, RELEASE, write_values};
use helm::{Helm, Rendered, chart_dir, repo_file};
use primus_tests::{stderr, stdout, testbed};
use serde_json::Value;

#[test]
fn helm_lint_strict_passes_for_default_and_non_default_values() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let out = helm.run(&["lint", "--strict", chart]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let values = write_values("non-default.yaml", NON_DEFAULT);
    let out = helm.run(&["lint", "--strict", chart, "-f", values.to_str().unwrap()]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    // Lint must be able to fail: a values file the schema rejects.
    let bad = write_values("bad.yaml", "webhook: {failurePolicy: Sometimes}\n");
    let out = helm.run(&["lint", "--strict", chart, "-f", bad.to_str().unwrap()]);
    assert!(
        !out.status.success(),
        "lint accepted failurePolicy Sometimes"
    );
}

#[test]
fn the_values_schema_rejects_bad_values_naming_them() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let cases: &[(&[&str], &str)] = &[
        (
            &["--set", "webhook.failurePolicy=Sometimes"],
            "webhook.failurePolicy",
        ),
        (
            &["--set", "webhook.timeoutSeconds=31"],
            "webhook.timeoutSeconds",
        ),
        (
            &["--set", "webhook.timeoutSeconds=0"],
            "webhook.timeoutSeconds",
        ),
        (
            &["--set", "webhook.tls.mode=letsencrypt"],
            "webhook.tls.mode",
        ),
        (&["--set", "webhook.headroom=1.5"], "webhook.headroom"),
        (&["--set", "webhook.headroom=2"], "webhook.headroom"),
        (&["--set", "webhook.replicas=0"], "webhook.replicas"),
        (&["--set", "operator.replicas=two"], "operator.replicas"),
        (&["--set", "operator.logFormat=yaml"], "operator.logFormat"),
        (
            &["--set", "operator.watchNamespace=Not_A_Namespace"],
            "operator.watchNamespace",
        ),
        (&["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy"),
        (&["--set", "image.digest=latest"], "image.digest"),
        (&["--set", "benchmark.backend=opencl"], "benchmark.backend"),
        (
            &["--set", "metrics.serviceMonitor.enabled=maybe"],
            "metrics.serviceMonitor.enabled",
        ),
        (
            &["--set", "metrics.prometheusRule.driftTolerance=-0.1"],
            "metrics.prometheusRule.driftTolerance",
        ),
        (
            &["--set", "metrics.prometheusRule.driftFor=half-an-hour"],
            "metrics.prometheusRule.driftFor",
        ),
        (&["--set", "operater.replicas=3"], "operater"),
        (
            &["--set", "webhook.tls.certManager.issuerRef.kind=Vault"],
            "webhook.tls.certManager.issuerRef.kind",
        ),
        (
            &["--set", "webhook.tls.selfSigned.certValidityDays=0"],
            "webhook.tls.selfSigned.certValidityDays",
        ),
        // Rules the schema cannot express fail in the templates, naming the values too.
        (
            &["--set", "webhook.tls.selfSigned.caValidityDays=200"],
            "webhook.tls.selfSigned.caValidityDays=200",
        ),
        (
            &["--set", "webhook.tls.selfSigned.reloadSeconds=3000"],
            "webhook.tls.selfSigned.reloadSeconds=3000",
        ),
        (
            &["--set", "webhook.tls.mode=secret"],
            "webhook.tls.secret.name",
        ),
        (
            &[
                "--set",
                "webhook.tls.mode=secret",
                "--set",
                "webhook.tls.secret.name=x",
            ],
            "webhook.tls.secret.caBundle",
        ),
        (
            &["--set", "webhook.budgetSeconds=5"],
            "webhook.budgetSeconds",
        ),
        (
            &["--set", "operator.leaderElection.enabled=false"],
            "operator.leaderElection.enabled",
        ),
    ];
    for (args, names) in cases {
        match helm.template(RELEASE, NS, args) {
            Ok(_) => panic!("helm template {args:?} succeeded; the schema should reject it"),
            Err(e) => assert!(
                e.contains(names),
                "helm template {args:?} failed without naming {names}:\n{e}"
            ),
        }
    }
    // And good values in the forms `--set` produces pass (fractions arrive as strings).
    for ok in [
        &["--set", "webhook.headroom=0.85"][..],
        &["--set", "metrics.prometheusRule.driftTolerance=0.2"],
        &[
            "--set",
            "webhook.tls.mode=selfSigned",
            "--set",
            "webhook.replicas=3",
        ],
        &[
            "--set",
            "webhook.budgetSeconds=1.5",
            "--set",
            "webhook.suggestBudgetSeconds=0.5",
        ],
        &[
            "--set",
            "operator.replicas=1",
            "--set",
            "operator.leaderElection.enabled=false",
        ],
    ] {
        if let Err(e) = helm.template(RELEASE, NS, ok) {
            panic!("helm template {ok:?} failed:\n{e}");
        }
    }
}

#[test]
fn chart_crds_and_the_kubeflow_crd_are_byte_copies() {
    let chart = chart_dir();
    let mut names: Vec<String> = std::fs::read_dir(chart.join("crds"))
        .expect("charts/primus-projection/crds")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "benchmarkreports.primus.dev.yaml",
            "trainingplans.primus.dev.yaml"
        ],
        "the chart's crds/ holds exactly the generated CRDs"
    );
    for n in &names {
        assert!(
            repo_file(format!("crds/{n}"))
                == repo_file(format!("charts/primus-projection/crds/{n}")),
            "charts/primus-projection/crds/{n} differs from crds/{n}: cp crds/*.yaml charts/primus-projection/crds/"
        );
    }
    assert!(
        repo_file("crds/thirdparty/kubeflow.org_pytorchjobs.yaml")
            == repo_file("charts/primus-projection/files/kubeflow.org_pytorchjobs.yaml"),
        "charts/primus-projection/files/kubeflow.org_pytorchjobs.yaml differs from crds/thirdparty/"
    );
}

/// The server's version and API versions, as `helm template` flags (what Argo CD passes too).
fn cluster_capabilities(k: &primus_tests::Kubectl) -> Vec<String> {
    let version: Value =
        serde_json::from_str(&k.ok(&["version", "-o", "json"])).expect("version JSON");
    let git = version["serverVersion"]["gitVersion"]
        .as_str()
        .expect("gitVersion")
        .to_string();
    let mut flags = vec!["--kube-version".to_string(), git];
    for v in k.ok(&["api-versions"]).lines().filter(|l| !l.is_empty()) {
        flags.push("--api-versions".into());
        flags.push(v.to_string());
    }
    flags
}

fn dry_run_apply(k: &primus_tests::Kubectl, ns: &str, manifests: &str, what: &str) -> String {
    let out = k.run_stdin(
        &["apply", "--dry-run=server", "-n", ns, "-f", "-"],
        manifests,
    );
    assert!(
        out.status.success(),
        "{what}: kubectl apply --dry-run=server failed:\n{}\n{}",
        stderr(&out),
        stdout(&out)
    );
    stdout(&out)
}

#[test]
fn rendered_manifests_apply_to_the_test_bed_with_server_dry_run() {
    let Some(tb) = testbed!() else { return };
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let k = tb.kubectl();
    let ns = tb.namespace("chart-apply");
    let caps = cluster_capabilities(&k);
    let with_caps = |extra: &[&str]| {
        let mut a: Vec<&str> = caps.iter().map(String::as_str).collect();
        a.push("--include-crds");
        a.extend_from_slice(extra);
        helm.render(RELEASE, &ns.name, &a)
    };

    // Default values: nothing the test bed (a bare cluster) does not serve.
    let r: Rendered = with_caps(&[]);
    assert_eq!(
        r.get("PodDisruptionBudget", &format!("{FULL}-webhook"))["apiVersion"],
        "policy/v1beta1"
    );
    let out = dry_run_apply(&k, &ns.name, &r.without(&[]), "default values");
    for want in [
        "customresourcedefinition.apiextensions.k8s.io/trainingplans.primus.dev",
        "clusterrole.rbac.authorization.k8s.io/primus-primus-projection-operator",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/primus-primus-projection",
        "deployment.apps/primus-primus-projection-webhook",
        "poddisruptionbudget.policy/primus-primus-projection-webhook",
        "secret/primus-primus-projection-webhook-certs",
        "role.rbac.authorization.k8s.io/primus-primus-projection-webhook",
    ] {
        assert!(out.contains(want), "dry run did not report {want}:\n{out}");
    }

    // cert-manager mode: its kinds are not served by the test bed (checked for shape in
    // render.rs), skipped here, and only they.
    let r = with_caps(&["--set", "webhook.tls.mode=certManager"]);
    let skipped = ["Certificate", "Issuer"];
    assert_eq!(
        r.objects
            .iter()
            .filter(|o| skipped.iter().any(|s| o["kind"] == *s))
            .count(),
        4
    );
    dry_run_apply(&k, &ns.name, &r.without(&skipped), "certManager mode");

    // Everything non-default (self-signed webhook, one watched namespace with benchmark
    // accounts, the kubeflow CRD, extra profiles), rendered for this namespace.
    let values = NON_DEFAULT
        .replace("[ml-jobs, ml-research]", &format!("[{}]", ns.name))
        .replace("ml-jobs", &ns.name);
    let file = write_values("non-default-testbed.yaml", &values);
    let r = with_caps(&["-f", file.to_str().unwrap()]);
    let out = dry_run_apply(&k, &ns.name, &r.without(&[]), "non-default values");
    assert!(
        out.contains("customresourcedefinition.apiextensions.k8s.io/pytorchjobs.kubeflow.org"),
        "{out}"
    );
    assert!(
        out.contains("role.rbac.authorization.k8s.io/gpu-planner-operator"),
        "{out}"
    );

    // Secret mode with Fail and matchConditions forced on: the 1.20 API server does not know
    // matchConditions, and kubectl's schema validation says so (the chart leaves them out
    // unless the cluster has them).
    let base = [
        "--set",
        "webhook.tls.mode=secret",
        "--set",
        "webhook.tls.secret.name=tls",
        "--set",
        "webhook.tls.secret.caBundle=Zm9v",
        "--set",
        "webhook.failurePolicy=Fail",
    ];
    let r = with_caps(&base);
    dry_run_apply(&k, &ns.name, &r.without(&[]), "secret mode");
    let mut forced = base.to_vec();
    forced.extend(["--set", "webhook.matchConditions.enabled=true"]);
    let r = with_caps(&forced);
    let out = k.run_stdin(
        &["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"],
        &r.without(&[]),
    );
    assert!(
        !out.status.success() && stderr(&out).contains("matchConditions"),
        "the test bed (Kubernetes 1.20) took matchConditions: {}{}",
        stdout(&out),
        stderr(&out)
    );
}

#[test]
fn image_recipes_build_what_the_chart_runs() {
    // No container engine here: check the recipes against the workspace and the chart instead.
    let dockerfile = repo_file("Dockerfile");
    let rocm = repo_file("Dockerfile.rocm");
    let ignore = repo_file(".dockerignore");
    let manifests: String = ["cli", "operator", "webhook"]
        .iter()
        .map(|c| repo_file(format!("{c}/Cargo.toml")))
        .collect();
    for bin in ["primus", "primus-operator", "primus-webhook"] {
        assert!(
            manifests.contains(&format!("name = \"{bin}\"")),
            "no [[bin]] {bin} in the workspace"
        );
        assert!(
            dockerfile.contains(&format!("--bin {bin}")),
            "Dockerfile does not build {bin}"
        );
        assert!(
            dockerfile.contains(&format!("target/release/{bin}")),
            "Dockerfile does not copy {bin}"
        );
    }
    assert!(dockerfile.contains("--locked") && rocm.contains("--locked"));
    // The chart's commands are binaries of the image, run as the chart's user.
    let values: Value = serde_saphyr::from_str(&repo_file("charts/primus-projection/values.yaml"))
        .expect("values.yaml");
    let uid = values["podSecurityContext"]["runAsUser"]
        .as_u64()
        .expect("runAsUser");
    let last_user = |text: &str| {
        text.lines()
            .filter_map(|l| l.strip_prefix("USER "))
            .next_back()
            .map(str::to_string)
            .expect("a USER line")
    };
    assert_eq!(last_user(&dockerfile), format!("{uid}:{uid}"));
    assert!(rocm.contains(&format!("ARG RUN_AS={uid}")) && last_user(&rocm) == "${RUN_AS}");
    for command in ["primus-operator", "primus-webhook"] {
        let t = std::fs::read_to_string(chart_dir().join(format!(
            "templates/{}-deployment.yaml",
            command.trim_start_matches("primus-")
        )))
        .unwrap();
        assert!(
            t.contains(&format!("command: [\"{command}\"]")),
            "{command}"
        );
    }
    // The toolchain is at least the workspace's rust-version.
    let rust_version = |text: &str, key: &str| -> (u32, u32) {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(key))
            .unwrap_or_else(|| panic!("no {key}"));
        let v = line
            .split(['=', '"'])
            .map(str::trim)
            .find(|s| s.contains('.'))
            .unwrap();
        let mut it = v.split('.').map(|n| n.parse::<u32>().unwrap());
        (it.next().unwrap(), it.next().unwrap())
    };
    let workspace = rust_version(&repo_file("Cargo.toml"), "rust-version");
    assert!(rust_version(&dockerfile, "ARG RUST_VERSION") >= workspace);
    assert!(rust_version(&rocm, "ARG RUST_VERSION") >= workspace);
    // The ROCm variant: the CLI's rocm feature, hip-sys' HIP_PATH.
    assert!(
        repo_file("cli/Cargo.toml").contains("\nrocm = ["),
        "primus-cli has no rocm feature"
    );
    assert!(rocm.contains("--features rocm") && rocm.contains("HIP_PATH=/opt/rocm"));
    // The build context keeps what cargo and oracle/build.rs read.
    for kept in [
        "profiles",
        "Cargo.lock",
        "Cargo.toml",
        "oracle",
        "runtime",
        "bench",
        "cli",
        "crds",
        "operator",
        "webhook",
        "tests",
        "examples",
    ] {
        assert!(
            !ignore
                .lines()
                .any(|l| l.trim() == kept || l.trim() == format!("{kept}/")),
            ".dockerignore drops {kept}"
        );
    }
}

#[test]
fn helm_install_dry_run_on_the_test_bed_uses_its_capabilities_and_the_schema() {
    let Some(tb) = testbed!() else { return };
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let ns = tb.namespace("chart-install");
    let chart = chart_dir();
    let kubeconfig = tb.kubeconfig.to_str().unwrap().to_string();
    let install = |extra: &[&str]| {
        let mut args = vec![
            "install",
            "dry",
            chart.to_str().unwrap(),
            "--namespace",
            &ns.name,
            "--kubeconfig",
            &kubeconfig,
            "--dry-run=server",
        ];
        args.extend_from_slice(extra);
        helm.run(&args)
    };
    // Self-signed mode needs no cert-manager; Helm asks the API server for its capabilities.
    let out = install(&["--set", "webhook.tls.mode=selfSigned"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("apiVersion: policy/v1beta1"),
        "Kubernetes 1.20 has no policy/v1:\n{text}"
    );
    assert!(
        !text.contains("matchConditions"),
        "Kubernetes 1.20 has no matchConditions"
    );
    assert!(
        text.contains("NOTES:") && text.contains("failurePolicy Ignore"),
        "{text}"
    );
    // Bad values stop `helm install` before anything is sent, naming the value.
    let out = install(&["--set", "webhook.failurePolicy=Sometimes"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("webhook.failurePolicy"),
        "{}",
        stderr(&out)
    );
}

/// The `helm install` command of the first `sh` block of docs/install.md, as arguments.
fn first_install_example() -> Vec<String> {
    let doc = repo_file("docs/install.md");
    let block = doc
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```sh block in docs/install.md");
    let command = block
        .replace("\\\n", " ")
        .lines()
        .find(|l| l.trim_start().starts_with("helm install"))
        .expect("a `helm install` line in the first sh block of docs/install.md")
        .to_string();
    command
        .split_whitespace()
        .skip(1)
        .map(|w| w.trim_matches('\'').trim_matches('"').to_string())
        .collect()
}

#[test]
fn the_first_install_example_of_the_docs_works_on_a_bare_cluster() {
    // The test bed serves nothing but Kubernetes itself (and the CRDs of this project): no
    // cert-manager, no Prometheus Operator. The documented command must install there as
    // written; Helm's server dry run maps every rendered kind against the API server.
    let Some(tb) = testbed!() else { return };
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let chart = chart_dir();
    let kubeconfig = tb.kubeconfig.to_str().unwrap().to_string();
    let example = first_install_example();
    assert!(
        example.iter().any(|a| a == "charts/primus-projection"),
        "{example:?}"
    );
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = example
            .iter()
            .map(|a| match a.as_str() {
                "charts/primus-projection" => chart.to_str().unwrap(),
                other => other,
            })
            .collect();
        args.extend(["--kubeconfig", &kubeconfig, "--dry-run=server"]);
        args.extend_from_slice(extra);
        helm.run(&args)
    };
    let out = run(&[]);
    assert!(
        out.status.success(),
        "docs/install.md's first example fails on a bare cluster:\n{}",
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(text.contains("certificates: selfSigned"), "{text}");
    assert!(
        !text.contains("cert-manager.io"),
        "the default renders cert-manager objects"
    );
    // The test can fail: the cert-manager mode (the default before) cannot install here.
    let out = run(&["--set", "webhook.tls.mode=certManager"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("no matches for kind \"Certificate\""),
        "{}",
        stderr(&out)
    );
}
