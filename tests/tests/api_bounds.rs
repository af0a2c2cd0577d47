//! The bounds of the shared validator, mirrored in the CRD schema, on the real API server
//! (Kubernetes 1.20: structural schemas, no CEL; issue 13): `kubectl apply` of an over-bound
//! plan is rejected by the server naming the field, before any of our code runs; a plan the
//! server accepts always decodes in Rust (what it cannot express, the shared validator names);
//! and a plan at the bounds is accepted and reads back.

use kube::Api;
use primus_crds::{Runner, TrainingPlan};
use primus_oracle::profiles::Catalog;
use primus_tests::{stderr, testbed};

/// A TrainingPlan named `name` with `extra` lines under `spec` (two-space indented).
fn plan(name: &str, model: &str, extra: &str) -> String {
    format!(
        "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata: {{name: {name}}}\nspec:\n  model: {model}\n  cluster: {{gpu: h100-sxm, gpus: 8}}\n{extra}"
    )
}

const LLAMA: &str = "{preset: llama3.1-8b}";
const TRAINING: &str = "  training: {seqLength: 4096, globalBatchSize: 64}\n";

#[test]
fn the_server_rejects_over_bound_plans_naming_the_field() {
    let Some(tb) = testbed!() else { return };
    let ns = tb.namespace("api-bounds");
    let card_2e9 = "{card: {layers: 2000000000, hiddenSize: 4096, ffnHiddenSize: 14336, attentionHeads: 32, vocabSize: 128256, activation: swiglu, norm: rmsnorm}}";
    let ep_3000 = format!(
        "{TRAINING}  tuning: {{allowed: {{ep: [{}]}}}}\n",
        vec!["1"; 3000].join(", ")
    );
    let cases: Vec<(String, &str, &str)> = vec![
        (
            plan(
                "tp",
                LLAMA,
                &format!("{TRAINING}  parallelism: {{tp: 4294967296}}\n"),
            ),
            "spec.parallelism.tp",
            "less than or equal to 65536",
        ),
        (
            plan(
                "topk",
                LLAMA,
                &format!("{TRAINING}  tuning: {{topK: 4294967295}}\n"),
            ),
            "spec.tuning.topK",
            "less than or equal to 64",
        ),
        (
            plan(
                "layout-x",
                LLAMA,
                &format!("{TRAINING}  parallelism: {{pipelineLayout: x}}\n"),
            ),
            "spec.parallelism.pipelineLayout",
            "should match",
        ),
        (
            plan(
                "layout-long",
                LLAMA,
                &format!(
                    "{TRAINING}  parallelism: {{pipelineLayout: '{}'}}\n",
                    "(".repeat(5000)
                ),
            ),
            "spec.parallelism.pipelineLayout",
            "4096",
        ),
        (
            plan("card", card_2e9, TRAINING),
            "spec.model.card.layers",
            "less than or equal to 4096",
        ),
        (
            plan("ep", "{preset: mixtral-8x7b}", &ep_3000),
            "spec.tuning.allowed.ep",
            "at most 64 items",
        ),
        (
            plan(
                "gbs",
                LLAMA,
                "  training: {seqLength: 4096, globalBatchSize: 2147483646}\n",
            ),
            "spec.training.globalBatchSize",
            "less than or equal to 16777216",
        ),
        (
            plan(
                "timeout",
                LLAMA,
                &format!("{TRAINING}  benchmark: {{enabled: true, timeoutSeconds: 0}}\n"),
            ),
            "spec.benchmark.timeoutSeconds",
            "greater than or equal to 1",
        ),
        (
            plan(
                "drift",
                LLAMA,
                &format!("{TRAINING}  drift: {{prometheus: {{url: 'prom:9090', query: up}}}}\n"),
            ),
            "spec.drift.prometheus.url",
            "should match",
        ),
        (
            plan(
                "job",
                LLAMA,
                &format!("{TRAINING}  job: {{name: Bad_Name}}\n"),
            ),
            "spec.job.name",
            "should match",
        ),
        (
            plan(
                "image",
                LLAMA,
                &format!("{TRAINING}  benchmark: {{image: '{}'}}\n", "a".repeat(5000)),
            ),
            "spec.benchmark.image",
            "4096",
        ),
    ];
    for (body, field, what) in &cases {
        let out = tb
            .kubectl()
            .run_stdin(&["apply", "-n", &ns.name, "-f", "-"], body);
        assert!(!out.status.success(), "{field}: the server accepted it");
        let err = stderr(&out);
        assert!(
            err.contains(field),
            "the error does not name {field}: {err}"
        );
        assert!(err.contains(what), "the error does not say {what:?}: {err}");
    }
    let list = tb
        .kubectl()
        .ok(&["get", "tplan", "-n", &ns.name, "-o", "name"]);
    assert!(list.trim().is_empty(), "nothing stored: {list}");
}

#[test]
fn what_the_server_accepts_decodes_and_the_validator_names() {
    let Some(tb) = testbed!() else { return };
    let ns = tb.namespace("api-decodes");
    // Within every bound the schema can express, wrong in ways it cannot: an unbalanced
    // layout (the grammar), a tp*pp grid of 2^32 GPUs (a product), an agent endpoint named by the
    // plan (the operator's configuration, issue 17).
    let cases = [
        (
            "parens",
            format!("{TRAINING}  parallelism: {{pp: 2, pipelineLayout: '((('}}\n"),
            "spec.parallelism.pipelineLayout: unclosed `(` at position 3 of the layout",
        ),
        (
            "grid",
            format!("{TRAINING}  parallelism: {{tp: 65536, pp: 65536}}\n"),
            "spec.cluster.gpus: 8 GPUs are not divisible by tp*pp*cp = 65536*65536*1 = 4294967296",
        ),
        (
            "agent",
            format!(
                "{TRAINING}  tuning: {{searcher: agent, agent: {{endpoint: 'http://llm.example:8000/v1'}}}}\n"
            ),
            "spec.tuning.agent.endpoint: set by the operator's configuration",
        ),
        // At the bounds: accepted, decoded and valid.
        (
            "at-bounds",
            "  training: {seqLength: 4096, globalBatchSize: 16777216}\n  parallelism: {tp: 8}\n  tuning: {searcher: none, topK: 64}\n  benchmark: {timeoutSeconds: 86400, maxAttempts: 100}\n".to_string(),
            "",
        ),
    ];
    for (name, extra, _) in &cases {
        let out = tb.kubectl().run_stdin(
            &["apply", "-n", &ns.name, "-f", "-"],
            &plan(name, LLAMA, extra),
        );
        assert!(out.status.success(), "{name}: {}", stderr(&out));
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let plans = rt.block_on(async {
        let api: Api<TrainingPlan> = Api::namespaced(tb.client().await, &ns.name);
        // The list decodes: no stored plan breaks the controller's list.
        api.list(&Default::default())
            .await
            .expect("the list decodes")
    });
    let catalog = Catalog::builtin().unwrap();
    for (name, _, message) in &cases {
        let p = plans
            .items
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .expect("stored");
        match p.spec.validate(name, &catalog, Runner::Cluster) {
            Ok(_) => assert!(message.is_empty(), "{name}: valid, expected {message}"),
            Err(e) => assert!(
                !message.is_empty() && e.to_string().starts_with(message),
                "{name}: {e}"
            ),
        }
    }
}
