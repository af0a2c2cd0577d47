//! Searcher `agent` in the operator, on the real test bed (issue 17): the operator's LLM
//! endpoint is its configuration (`--agent-endpoint`; the chart feeds it from a Secret), here a
//! scripted OpenAI-compatible server that reads each prompt and turns on an option the grid
//! holds fixed. A plan with `searcher: agent` gets a PyTorchJob with the agent's layout and the
//! trial summary in its status; with the endpoint down the next plan falls back to the
//! exhaustive search's layout with reason `AgentUnavailable` and a Warning Event; a plan that
//! names an endpoint of its own is refused.

mod common;

use std::time::Duration;

use common::*;
use primus_crds::TrainingPlan;
use primus_oracle::layout::Layout;
use primus_tests::chat::{Answer, ChatServer};
use primus_tests::testbed;

/// Llama 3.1 8B on 16 H100s, the reference with both data-parallel overlaps off (the grid keeps
/// them off; the scripted model turns them on).
fn plan_yaml(name: &str, agent: &str) -> String {
    format!(
        "apiVersion: primus.dev/v1alpha1\nkind: TrainingPlan\nmetadata:\n  name: {name}\nspec:\n  model: {{preset: llama3.1-8b}}\n  cluster: {{gpu: h100-sxm, gpus: 16}}\n  training: {{seqLength: 4096, globalBatchSize: 64}}\n  parallelism: {{tp: 2, overlapGradReduce: false, overlapParamGather: false}}\n  tuning: {{searcher: agent, fixed: {{fsdp: false}}, agent: {agent}}}\n"
    )
}

fn wait_tuned(
    rt: &tokio::runtime::Runtime,
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> TrainingPlan {
    rt.block_on(poll(Duration::from_secs(90), "Tuned", || {
        let (client, ns, name) = (client.clone(), ns.to_string(), name.to_string());
        async move {
            get_plan(&client, &ns, &name)
                .await
                .filter(|p| has(p, "Tuned", "True") && has(p, "JobCreated", "True"))
        }
    }))
}

fn job_layout(rt: &tokio::runtime::Runtime, client: &kube::Client, ns: &str, name: &str) -> Layout {
    let job = rt
        .block_on(jobs_api(client, ns).get(name))
        .expect("the PyTorchJob");
    let ann = &job.metadata.annotations.expect("annotations")["primus.dev/layout"];
    serde_json::from_str(ann).expect("the layout annotation")
}

#[test]
fn an_agent_plan_gets_the_agent_s_layout_and_falls_back_when_the_endpoint_is_down() {
    let Some(tb) = testbed!() else { return };
    ensure_pytorchjob_crd(&tb);
    let ns = tb.namespace("op-agent");
    let k = tb.kubectl();
    let server = ChatServer::start(vec![Answer::Read]);
    let mut op = Operator::start(
        &tb,
        "op-agent",
        OperatorArgs {
            namespace: &ns.name,
            lease: "primus-operator-agent",
            kubeconfig: None,
            extra: vec![
                "--agent-endpoint".into(),
                server.base_url().into(),
                "--agent-model".into(),
                "scripted".into(),
                "--agent-timeout-seconds".into(),
                "3".into(),
            ],
        },
    );
    op.wait_leading(Duration::from_secs(60));
    let rt = runtime();
    let client = rt.block_on(tb.client());

    // 1. The agent plan: the job runs the agent's layout, the status has the trials.
    let out = k.run_stdin(
        &["apply", "-n", &ns.name, "-f", "-"],
        &plan_yaml(
            "with-agent",
            "{model: from-plan, rounds: 2, budgetSeconds: 60}",
        ),
    );
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = wait_tuned(&rt, &client, &ns.name, "with-agent");
    let status = plan.status.clone().unwrap();
    let search = status.search.clone().unwrap();
    assert_eq!(search.searcher, "agent");
    assert!(search.agent_unavailable.is_none());
    let t = search.trials.clone().expect("the trial summary");
    assert_eq!(t.agent_rounds, 2, "{t:?}");
    assert!(t.proposals_accepted >= 1, "{t:?}");
    assert_eq!(t.failures, 0);
    let sources: Vec<&str> = t.by_source.iter().map(|s| s.source.as_str()).collect();
    assert_eq!(sources, ["reference", "seed", "agent"], "{t:?}");
    assert!(!search.explanation.is_empty());
    assert!(
        search.explanation[0].starts_with("step "),
        "{:?}",
        search.explanation
    );
    let chosen = status.chosen.clone().unwrap();
    assert!(
        chosen.layout.overlap_grad_reduce,
        "the agent's layout: {}",
        chosen.label
    );
    assert_eq!(
        job_layout(&rt, &client, &ns.name, "with-agent"),
        chosen.layout
    );
    let tuned = condition(&plan, "Tuned").unwrap();
    assert_eq!(tuned.reason, "Tuned");
    assert!(
        tuned.message.contains("agent: 2 rounds"),
        "{}",
        tuned.message
    );
    // The model the plan chose was sent; the requests were the operator's.
    let seen = server.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body["model"], "from-plan");

    // 2. The endpoint goes down: the next plan gets the exhaustive search's layout, with
    // AgentUnavailable and a Warning Event.
    drop(server);
    let out = k.run_stdin(
        &["apply", "-n", &ns.name, "-f", "-"],
        &plan_yaml("endpoint-down", "{rounds: 2}"),
    );
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = wait_tuned(&rt, &client, &ns.name, "endpoint-down");
    let status = plan.status.clone().unwrap();
    let tuned = condition(&plan, "Tuned").unwrap();
    assert_eq!(tuned.reason, "AgentUnavailable", "{}", tuned.message);
    assert!(
        tuned.message.contains("agent unavailable"),
        "{}",
        tuned.message
    );
    let search = status.search.unwrap();
    assert_eq!(search.searcher, "exhaustive");
    assert!(search.agent_unavailable.is_some());
    assert_eq!(search.trials.unwrap().failures, 2);
    let chosen = status.chosen.unwrap();
    assert!(
        !chosen.layout.overlap_grad_reduce,
        "the grid's layout: {}",
        chosen.label
    );
    assert_eq!(
        job_layout(&rt, &client, &ns.name, "endpoint-down"),
        chosen.layout
    );
    let events = k.ok(&[
        "get",
        "events.events.k8s.io",
        "-n",
        &ns.name,
        "--field-selector",
        "reason=AgentUnavailable",
        "-o",
        "jsonpath={.items[*].type}",
    ]);
    assert!(
        events.contains("Warning"),
        "no AgentUnavailable event: {events:?}"
    );

    // 3. A plan naming an endpoint of its own is refused, naming the field.
    let bad = plan_yaml("own-endpoint", "{endpoint: 'http://elsewhere:8000/v1'}");
    let out = k.run_stdin(&["apply", "-n", &ns.name, "-f", "-"], &bad);
    assert!(out.status.success(), "{}", primus_tests::stderr(&out));
    let plan = rt.block_on(poll(Duration::from_secs(30), "Stalled", || {
        let (client, ns) = (client.clone(), ns.name.clone());
        async move {
            get_plan(&client, &ns, "own-endpoint")
                .await
                .filter(|p| has(p, "Stalled", "True"))
        }
    }));
    let c = condition(&plan, "Stalled").unwrap();
    assert!(
        c.message.contains("spec.tuning.agent.endpoint"),
        "{}",
        c.message
    );
    op.terminate(Duration::from_secs(10));
}
