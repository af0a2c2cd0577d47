//! `helm template` renderings checked object by object: defaults, every non-default value,
//! secret mode, and the choices made from the cluster's capabilities (PodDisruptionBudget
//! version, webhook matchConditions, ServiceMonitor and PrometheusRule).

use super::fixtures::*;
use super::helm::{Helm, chart_dir};

#[test]
fn default_rendering_has_every_piece_and_is_deterministic() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let r = helm.render(RELEASE, NS, &["--kube-version", "1.30.0"]);
    let again = helm.render(RELEASE, NS, &["--kube-version", "1.30.0"]);
    assert_eq!(
        r.text, again.text,
        "two renderings differ: something random or time-based"
    );

    // Deployments: 2 replicas each, hardened, leader election on.
    let op = r.get("Deployment", &format!("{FULL}-operator"));
    let wh = r.get("Deployment", &format!("{FULL}-webhook"));
    assert_eq!(op["spec"]["replicas"], 2);
    assert_eq!(wh["spec"]["replicas"], 2);
    assert_hardened(op);
    assert_hardened(wh);
    let op_args = args(op);
    for a in [
        "--leader-elect=true",
        "--lease-name=primus-primus-projection-operator",
        "--lease-namespace=primus-system",
        "--metrics-addr=0.0.0.0:8080",
        "--bench-service-account=primus-primus-projection-benchmark",
        "--bench-image=ghcr.io/primus-projection/primus:0.1.0",
    ] {
        assert!(
            op_args.iter().any(|x| x == a),
            "operator args lack {a}: {op_args:?}"
        );
    }
    assert!(
        !op_args.iter().any(|a| a.starts_with("--namespace")),
        "{op_args:?}"
    );
    let env = serde_json::to_string(&containers(op)[0]["env"]).unwrap();
    assert!(
        env.contains("POD_NAME") && env.contains("POD_NAMESPACE"),
        "{env}"
    );
    let wh_args = args(wh);
    for a in [
        "--cert-secret=primus-primus-projection-webhook-certs",
        "--service-name=primus-primus-projection-webhook",
        "--webhook-configuration=primus-primus-projection",
        "--ca-validity-seconds=94608000",
        "--cert-validity-seconds=7776000",
        "--ca-overlap-seconds=3600",
        "--cert-reload-interval-seconds=10",
        "--metrics-listen=0.0.0.0:8081",
        "--headroom=0.92",
        "--budget-seconds=2",
    ] {
        assert!(
            wh_args.iter().any(|x| x == a),
            "webhook args lack {a}: {wh_args:?}"
        );
    }
    assert!(
        !wh_args
            .iter()
            .any(|a| a.starts_with("--tls-cert-file") || a == "--strict"),
        "{wh_args:?}"
    );
    // Self-signed mode (the default) talks to the API server: its Secret, its caBundle. It
    // mounts no certificate and replaces replicas one by one.
    assert_eq!(
        wh["spec"]["template"]["spec"]["automountServiceAccountToken"],
        true
    );
    assert!(wh["spec"].get("strategy").is_none(), "{}", wh["spec"]);
    let volumes = serde_json::to_string(&wh["spec"]["template"]["spec"]["volumes"]).unwrap();
    assert!(!volumes.contains("secretName"), "{volumes}");

    // PodDisruptionBudgets, policy/v1 on 1.30.
    let pdb = r.get("PodDisruptionBudget", &format!("{FULL}-webhook"));
    assert_eq!(pdb["apiVersion"], "policy/v1");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"],
        wh["spec"]["selector"]["matchLabels"]
    );

    // The webhook configuration.
    let vwc = r.get("ValidatingWebhookConfiguration", FULL);
    assert_eq!(
        vwc["metadata"]["annotations"]["primus.dev/ca-bundle-owner"],
        "primus-webhook"
    );
    let hooks = vwc["webhooks"].as_array().unwrap();
    let names: Vec<&str> = hooks.iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "pytorchjobs.primus.dev",
            "pytorchjobs-strict.primus.dev",
            "trainjobs.primus.dev",
            "trainjobs-strict.primus.dev",
            "trainingplans.primus.dev"
        ]
    );
    let svc = r.get("Service", &format!("{FULL}-webhook"));
    for h in hooks {
        assert_eq!(h["failurePolicy"], "Ignore");
        assert_eq!(h["timeoutSeconds"], 5);
        assert_eq!(h["sideEffects"], "None");
        assert_eq!(h["admissionReviewVersions"], serde_json::json!(["v1"]));
        assert!(
            h["clientConfig"]["caBundle"].is_null(),
            "the webhook patches it"
        );
        assert_eq!(
            h["clientConfig"]["service"]["name"],
            svc["metadata"]["name"]
        );
        assert_eq!(h["clientConfig"]["service"]["namespace"], NS);
        let exprs = h["namespaceSelector"]["matchExpressions"]
            .as_array()
            .unwrap();
        let excluded = exprs
            .iter()
            .find(|e| e["key"] == "kubernetes.io/metadata.name")
            .expect("namespace exclusion");
        assert_eq!(excluded["operator"], "NotIn");
        assert_eq!(excluded["values"], serde_json::json!(["kube-system", NS]));
        assert_eq!(
            h["objectSelector"]["matchExpressions"][0],
            serde_json::json!({"key": "primus.dev/skip-validation", "operator": "NotIn", "values": ["true"]})
        );
        // 1.30 supports matchConditions.
        assert_eq!(h["matchConditions"][0]["name"], "spec-changed");
    }
    let strictness = |i: usize| {
        let e = hooks[i]["namespaceSelector"]["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == "primus.dev/admission")
            .cloned()
            .unwrap();
        (
            hooks[i]["clientConfig"]["service"]["path"].clone(),
            e["operator"].clone(),
            e["values"].clone(),
        )
    };
    assert_eq!(
        strictness(0),
        (
            "/validate/pytorchjob".into(),
            "NotIn".into(),
            serde_json::json!(["strict", "disabled"])
        )
    );
    assert_eq!(
        strictness(1),
        (
            "/validate/pytorchjob/strict".into(),
            "In".into(),
            serde_json::json!(["strict"])
        )
    );
    assert_eq!(
        strictness(2),
        (
            "/validate/trainjob".into(),
            "NotIn".into(),
            serde_json::json!(["strict", "disabled"])
        )
    );
    assert_eq!(
        strictness(3),
        (
            "/validate/trainjob/strict".into(),
            "In".into(),
            serde_json::json!(["strict"])
        )
    );
    assert_eq!(
        hooks[2]["rules"][0]["apiGroups"],
        serde_json::json!(["trainer.kubeflow.org"])
    );
    assert_eq!(
        hooks[2]["rules"][0]["resources"],
        serde_json::json!(["trainjobs"])
    );

    // The shared Secret, created empty (the webhook fills it), and exactly the rights on it
    // and on the configuration the webhook needs, limited by name.
    let secret = r.get("Secret", &format!("{FULL}-webhook-certs"));
    assert_eq!(secret["type"], "Opaque");
    assert!(
        secret.get("data").is_none() && secret.get("stringData").is_none(),
        "{secret}"
    );
    assert!(r.kind("Certificate").is_empty() && r.kind("Issuer").is_empty());
    assert_eq!(
        r.get("Role", &format!("{FULL}-webhook"))["rules"],
        serde_json::json!([{
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": [format!("{FULL}-webhook-certs")],
            "verbs": ["get", "update"],
        }])
    );
    assert_eq!(
        r.get("ClusterRole", &format!("{FULL}-webhook"))["rules"][0]["resourceNames"],
        serde_json::json!([FULL])
    );
    let leader = r.get("Role", &format!("{FULL}-operator-leader"));
    assert_eq!(
        leader["rules"][1]["resourceNames"],
        serde_json::json!(["primus-primus-projection-operator"])
    );
    // Nothing optional by default.
    for absent in [
        "CustomResourceDefinition",
        "ServiceMonitor",
        "PrometheusRule",
        "ConfigMap",
    ] {
        assert!(r.kind(absent).is_empty(), "{absent} rendered by default");
    }
}

#[test]
fn templates_use_nothing_random_or_cluster_dependent() {
    let dir = chart_dir().join("templates");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let source = std::fs::read_to_string(&path).unwrap();
        // Only template actions count, not comments (`{{/* ... */}}`) or literal text.
        let text: String = source
            .split("{{")
            .skip(1)
            .filter_map(|a| a.split_once("}}").map(|(action, _)| action))
            .filter(|a| !a.trim_start_matches('-').trim_start().starts_with("/*"))
            .collect::<Vec<_>>()
            .join("\n");
        for banned in [
            "lookup",
            "randAlpha",
            "randNumeric",
            "randAscii",
            "randBytes",
            "randInt",
            "uuidv4",
            "genCA",
            "genSelfSigned",
            "genSignedCert",
            "genPrivateKey",
            "now",
            "date ",
        ] {
            let used = text.match_indices(banned).any(|(i, _)| {
                let before = text[..i].chars().last().unwrap_or(' ');
                let after = text[i + banned.len()..].chars().next().unwrap_or(' ');
                !(before.is_alphanumeric() || after.is_alphanumeric())
            });
            assert!(!used, "{} uses `{banned}`", path.display());
        }
    }
}

#[test]
fn non_default_values_render_as_asked() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let values = write_values("non-default.yaml", NON_DEFAULT);
    let r = helm.render(
        "planner",
        "ml-system",
        &["-f", values.to_str().unwrap(), "--kube-version", "1.20.2"],
    );
    let op = r.get("Deployment", "gpu-planner-operator");
    let wh = r.get("Deployment", "gpu-planner-webhook");
    assert_eq!(op["spec"]["replicas"], 3);
    assert_eq!(wh["spec"]["replicas"], 3);
    assert_hardened(op);
    assert_hardened(wh);
    let image = format!(
        "registry.example.com/ml/primus@sha256:{}",
        "0123456789abcdef".repeat(4)
    );
    assert_eq!(containers(op)[0]["image"], image.as_str());
    let a = args(op);
    for want in [
        "--namespace=ml-jobs",
        "--bench-image=registry.example.com/ml/primus-rocm:0.1.0",
        "--bench-backend=rocm",
        "--concurrency=8",
        "--profiles-dir=/etc/primus/profiles",
        "--resync-seconds=300",
    ] {
        assert!(
            a.iter().any(|x| x == want),
            "operator args lack {want}: {a:?}"
        );
    }
    let a = args(wh);
    for want in [
        "--cert-secret=gpu-planner-webhook-certs",
        "--ca-validity-seconds=31536000",
        "--cert-validity-seconds=2592000",
        "--ca-overlap-seconds=600",
        "--cert-reload-interval-seconds=5",
        "--service-name=gpu-planner-webhook",
        "--webhook-configuration=gpu-planner",
        "--strict",
        "--headroom=0.9",
        "--profiles-dir=/etc/primus/profiles",
    ] {
        assert!(
            a.iter().any(|x| x == want),
            "webhook args lack {want}: {a:?}"
        );
    }
    assert!(!a.iter().any(|x| x.starts_with("--tls-cert-file")), "{a:?}");
    assert_eq!(
        wh["spec"]["template"]["spec"]["automountServiceAccountToken"],
        true
    );
    assert_eq!(op["metadata"]["labels"]["team"], "ml-platform");

    // Self-signed: no cert-manager objects, a ClusterRole to patch exactly this configuration.
    r.get("Secret", "gpu-planner-webhook-certs");
    assert!(r.kind("Certificate").is_empty() && r.kind("Issuer").is_empty());
    let role = r.get("ClusterRole", "gpu-planner-webhook");
    assert_eq!(
        role["rules"],
        serde_json::json!([{
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingwebhookconfigurations"],
            "resourceNames": ["gpu-planner"],
            "verbs": ["get", "patch"],
        }])
    );
    // PodDisruptionBudgets in policy/v1beta1 on 1.20.
    assert_eq!(
        r.get("PodDisruptionBudget", "gpu-planner-webhook")["apiVersion"],
        "policy/v1beta1"
    );
    assert_eq!(
        r.get("PodDisruptionBudget", "gpu-planner-operator")["apiVersion"],
        "policy/v1beta1"
    );

    // Watching one namespace: a Role there, no ClusterRole for the operator.
    assert_eq!(
        r.get("Role", "gpu-planner-operator")["metadata"]["namespace"],
        "ml-jobs"
    );
    assert!(
        r.kind("ClusterRole")
            .iter()
            .all(|c| c["metadata"]["name"] != "gpu-planner-operator")
    );
    // Benchmark service accounts and bindings per namespace.
    for ns in ["ml-jobs", "ml-research"] {
        let sa = r
            .kind("ServiceAccount")
            .into_iter()
            .filter(|s| {
                s["metadata"]["name"] == "gpu-planner-benchmark" && s["metadata"]["namespace"] == ns
            })
            .count();
        assert_eq!(sa, 1, "benchmark service account in {ns}");
        let rb = r
            .kind("RoleBinding")
            .into_iter()
            .find(|b| {
                b["metadata"]["name"] == "gpu-planner-benchmark" && b["metadata"]["namespace"] == ns
            })
            .unwrap_or_else(|| panic!("benchmark RoleBinding in {ns}"));
        assert_eq!(rb["roleRef"]["name"], "gpu-planner-benchmark");
    }
    // Webhook configuration: Fail, 10 s, no TrainingPlan webhook, extra exclusion, no
    // matchConditions on 1.20.
    let vwc = r.get("ValidatingWebhookConfiguration", "gpu-planner");
    let hooks = vwc["webhooks"].as_array().unwrap();
    // PyTorchJobs and TrainJobs, each plain and strict.
    assert_eq!(hooks.len(), 4);
    for h in hooks {
        assert_eq!(h["failurePolicy"], "Fail");
        assert_eq!(h["timeoutSeconds"], 10);
        assert!(
            h.get("matchConditions").is_none(),
            "matchConditions on 1.20"
        );
        assert_eq!(
            h["namespaceSelector"]["matchExpressions"][0]["values"],
            serde_json::json!(["kube-system", "ml-system", "monitoring"])
        );
    }
    assert_eq!(
        vwc["metadata"]["annotations"]["primus.dev/ca-bundle-owner"],
        "primus-webhook"
    );
    // Extra profiles: one ConfigMap mounted by both, keys mapped to hardware/ and models/.
    let cm = r.get("ConfigMap", "gpu-planner-profiles");
    assert_eq!(cm["data"]["hardware.mi300x-lab.yaml"], "name: mi300x-lab\n");
    let vols = serde_json::to_string(&op["spec"]["template"]["spec"]["volumes"]).unwrap();
    assert!(
        vols.contains(r#""path":"hardware/mi300x-lab.yaml""#),
        "{vols}"
    );
    assert!(vols.contains(r#""path":"models/tiny.yaml""#), "{vols}");
    // The kubeflow CRD, kept on uninstall.
    let crd = r.get("CustomResourceDefinition", "pytorchjobs.kubeflow.org");
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert!(
        r.kind("ClusterRole")
            .iter()
            .all(|c| !c["metadata"]["name"].as_str().unwrap().ends_with("-edit"))
    );
}

#[test]
fn cert_manager_mode_renders_a_ca_chain_and_its_injection() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let r = helm.render(RELEASE, NS, &["--set", "webhook.tls.mode=certManager"]);
    let wh = r.get("Deployment", &format!("{FULL}-webhook"));
    assert_eq!(wh["spec"]["replicas"], 2);
    let wh_args = args(wh);
    assert!(
        wh_args
            .iter()
            .any(|a| a == "--tls-cert-file=/etc/primus-webhook/tls/tls.crt"),
        "{wh_args:?}"
    );
    assert!(
        !wh_args.iter().any(|a| a.starts_with("--cert-secret")),
        "{wh_args:?}"
    );
    // No API server access outside self-signed mode, and no RBAC for it.
    assert_eq!(
        wh["spec"]["template"]["spec"]["automountServiceAccountToken"],
        false
    );
    for kind in ["ClusterRole", "Role"] {
        assert!(r.kind(kind).iter().all(|c| {
            !c["metadata"]["name"]
                .as_str()
                .unwrap()
                .ends_with("-webhook")
        }));
    }
    assert!(r.kind("Secret").is_empty());
    let vwc = r.get("ValidatingWebhookConfiguration", FULL);
    assert_eq!(
        vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        format!("{NS}/{FULL}-webhook-tls")
    );
    // A CA chain and a serving certificate for the service's DNS names, mounted.
    let cert = r.get("Certificate", &format!("{FULL}-webhook-tls"));
    let svc_name = format!("{FULL}-webhook");
    assert_eq!(
        cert["spec"]["dnsNames"],
        serde_json::json!([
            format!("{svc_name}.{NS}.svc"),
            format!("{svc_name}.{NS}.svc.cluster.local")
        ])
    );
    let secret = cert["spec"]["secretName"].as_str().unwrap();
    let volumes = serde_json::to_string(&wh["spec"]["template"]["spec"]["volumes"]).unwrap();
    assert!(
        volumes.contains(secret),
        "the webhook mounts {secret}: {volumes}"
    );
    assert_eq!(r.kind("Issuer").len(), 2, "self-signed root and CA issuer");
}

#[test]
fn secret_mode_puts_the_given_ca_into_the_configuration() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let ca = "TFMwdExTMUNSVWRKVGlCRFJWSlVTVVpKUTBGVVJTMHRMUzB0Q2c9PQ==";
    let r = helm.render(
        RELEASE,
        NS,
        &[
            "--set",
            "webhook.tls.mode=secret",
            "--set",
            "webhook.tls.secret.name=my-webhook-tls",
            "--set",
            &format!("webhook.tls.secret.caBundle={ca}"),
        ],
    );
    let vwc = r.get("ValidatingWebhookConfiguration", FULL);
    for h in vwc["webhooks"].as_array().unwrap() {
        assert_eq!(h["clientConfig"]["caBundle"], ca);
    }
    assert!(vwc["metadata"].get("annotations").is_none());
    let wh = r.get("Deployment", &format!("{FULL}-webhook"));
    assert_eq!(wh["spec"]["replicas"], 2);
    let vols = serde_json::to_string(&wh["spec"]["template"]["spec"]["volumes"]).unwrap();
    assert!(vols.contains("my-webhook-tls"), "{vols}");
    assert!(r.kind("Certificate").is_empty());
}

#[test]
fn capabilities_pick_the_pdb_version_match_conditions_and_monitoring() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let pdb = |args: &[&str]| {
        let r = helm.render(RELEASE, NS, args);
        r.get("PodDisruptionBudget", &format!("{FULL}-webhook"))["apiVersion"].clone()
    };
    assert_eq!(pdb(&["--kube-version", "1.20.2"]), "policy/v1beta1");
    assert_eq!(pdb(&["--kube-version", "1.25.0"]), "policy/v1");
    assert_eq!(
        pdb(&[
            "--kube-version",
            "1.20.2",
            "--api-versions",
            "policy/v1/PodDisruptionBudget"
        ]),
        "policy/v1"
    );

    let has_conditions = |args: &[&str]| {
        let r = helm.render(RELEASE, NS, args);
        r.get("ValidatingWebhookConfiguration", FULL)["webhooks"][0]
            .get("matchConditions")
            .is_some()
    };
    assert!(!has_conditions(&["--kube-version", "1.27.9"]));
    assert!(has_conditions(&["--kube-version", "1.28.0"]));
    assert!(has_conditions(&[
        "--kube-version",
        "1.20.2",
        "--set",
        "webhook.matchConditions.enabled=true"
    ]));
    assert!(!has_conditions(&[
        "--kube-version",
        "1.31.0",
        "--set",
        "webhook.matchConditions.enabled=false"
    ]));

    let monitoring = |args: &[&str]| {
        let r = helm.render(RELEASE, NS, args);
        (
            r.kind("ServiceMonitor").len(),
            r.kind("PrometheusRule").len(),
        )
    };
    assert_eq!(
        monitoring(&[]),
        (0, 0),
        "no monitoring.coreos.com API, nothing rendered"
    );
    assert_eq!(
        monitoring(&["--api-versions", "monitoring.coreos.com/v1"]),
        (1, 1)
    );
    assert_eq!(
        monitoring(&[
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.prometheusRule.enabled=true"
        ]),
        (1, 1)
    );
    assert_eq!(
        monitoring(&[
            "--api-versions",
            "monitoring.coreos.com/v1",
            "--set",
            "metrics.prometheusRule.enabled=false"
        ]),
        (1, 0)
    );
    let r = helm.render(RELEASE, NS, &["--api-versions", "monitoring.coreos.com/v1"]);
    let sm = r.get("ServiceMonitor", FULL);
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true);
    assert_eq!(sm["spec"]["endpoints"][0]["port"], "http-metrics");
    // Both services carry the selected label and the scraped port.
    for svc in r.kind("Service") {
        assert_eq!(svc["metadata"]["labels"]["primus.dev/metrics"], "true");
        let ports = serde_json::to_string(&svc["spec"]["ports"]).unwrap();
        assert!(ports.contains("http-metrics"), "{ports}");
    }
}

/// Searcher agent's endpoint (issue 17): the values become a Secret in the release namespace
/// and the operator reads it through its environment; an existing Secret replaces the values;
/// nothing of it without an endpoint.
#[test]
fn agent_values_become_a_secret_read_through_the_operator_environment() {
    let Some(helm) = Helm::find(module_path!()) else {
        return;
    };
    let op = format!("{FULL}-operator");
    let secret_name = format!("{FULL}-operator-agent");
    let env = |r: &super::helm::Rendered| -> Vec<serde_json::Value> {
        containers(r.get("Deployment", &op))[0]["env"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| {
                e["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("PRIMUS_AGENT_"))
            })
            .collect()
    };
    let has_secret = |r: &super::helm::Rendered| {
        r.kind("Secret")
            .iter()
            .any(|o| o["metadata"]["name"] == secret_name.as_str())
    };
    let plain = helm.render(RELEASE, NS, &[]);
    assert!(env(&plain).is_empty());
    assert!(!has_secret(&plain));
    let a = args(plain.get("Deployment", &op));
    assert!(a.iter().any(|x| x == "--agent-timeout-seconds=60"), "{a:?}");
    assert!(
        a.iter().any(|x| x == "--agent-max-budget-seconds=600"),
        "{a:?}"
    );

    let r = helm.render(
        RELEASE,
        NS,
        &[
            "--set",
            "operator.agent.endpoint=http://vllm.llm.svc:8000/v1,operator.agent.model=qwen3,operator.agent.apiKey=sk-test",
        ],
    );
    let secret = r.get("Secret", &secret_name);
    assert_eq!(secret["metadata"]["namespace"], NS);
    assert_eq!(
        secret["stringData"]["endpoint"],
        "http://vllm.llm.svc:8000/v1"
    );
    assert_eq!(secret["stringData"]["model"], "qwen3");
    assert_eq!(secret["stringData"]["apiKey"], "sk-test");
    let e = env(&r);
    let names: Vec<&str> = e.iter().map(|x| x["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "PRIMUS_AGENT_ENDPOINT",
            "PRIMUS_AGENT_MODEL",
            "PRIMUS_AGENT_API_KEY"
        ]
    );
    for x in &e {
        assert_eq!(x["valueFrom"]["secretKeyRef"]["name"], secret_name.as_str());
    }
    // The key is never in the Deployment itself.
    let deploy = serde_json::to_string(r.get("Deployment", &op)).unwrap();
    assert!(!deploy.contains("sk-test"));

    let r = helm.render(
        RELEASE,
        NS,
        &["--set", "operator.agent.existingSecret=llm-credentials"],
    );
    assert!(!has_secret(&r));
    let e = env(&r);
    assert_eq!(e.len(), 3);
    assert!(
        e.iter()
            .all(|x| x["valueFrom"]["secretKeyRef"]["name"] == "llm-credentials")
    );

    // The schema refuses an endpoint that is not an http(s) URL.
    let out = helm.run(&[
        "template",
        "x",
        chart_dir().to_str().unwrap(),
        "--set",
        "operator.agent.endpoint=vllm:8000",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("endpoint"), "{err}");
}
