//! `primus tune --searcher agent` against a real language model: SmolLM2-135M-Instruct served by
//! llama.cpp's `llama-server` on loopback (`tests/llm/install.sh`; the launcher is
//! `primus_tests::llm`), its replies constrained to the agent's reply shape by a JSON schema.
//! A 135M model proposes poorly, which is the point: every reply must be read, every proposal
//! validated and scored or rejected with a reason, and the search must still end on a legal
//! layout no worse than the seed planner's.

mod common;

use common::primus;
use std::time::Instant;

use primus_oracle::plan::{SearcherKind, parse_plan};
use primus_oracle::profiles::Catalog;
use primus_oracle::tune::agent::reply_schema;
use primus_oracle::tune::prefilter::Prefilter;
use primus_oracle::tune::tune_plan;
use primus_tests::llm::Options;
use primus_tests::llm_server;
use serde_json::Value;

/// Llama 3.1 8B on 16 H100s with a small search space (tp 1-8, pp 1-2, no cp).
const PLAN: &str = "spec:
  model: {preset: llama3.1-8b}
  cluster: {gpu: h100-sxm, gpus: 16, gpusPerNode: 8}
  training: {seqLength: 8192, globalBatchSize: 128, precision: bf16}
  parallelism: {tp: 2, pp: 1, microBatchSize: 1}
  tuning:
    searcher: agent
    allowed: {tp: [1, 2, 4, 8], pp: [1, 2], cp: [1]}
";

/// Layouts per reply at most (`--agent-proposals`, the reply schema's `maxItems`), to keep a
/// round short on 2 cores.
const MAX_LAYOUTS: u64 = 2;

fn count(agent: &Value, name: &str) -> u64 {
    agent[name]
        .as_u64()
        .unwrap_or_else(|| panic!("agent.{name} missing in {agent}"))
}

#[test]
fn a_real_model_s_replies_are_all_read_and_checked_and_the_search_ends_legal() {
    // The agent sends its own `response_format` (the oracle's reply schema), which the server
    // enforces with a grammar; the launcher's adapter passes it through and counts requests.
    let opts = Options {
        json_schema: Some(reply_schema(MAX_LAYOUTS as usize)),
        max_tokens: 1024,
        ..Options::default()
    };
    let Some(llm) = llm_server!(opts) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let plan_file = dir.path().join("plan.yaml");
    std::fs::write(&plan_file, PLAN).unwrap();
    let rounds = 2u64;
    let trials = dir.path().join("trials.jsonl");

    let start = Instant::now();
    let out = primus()
        .args(["tune", "-q", "-o", "json", "--searcher", "agent"])
        .args([
            "--agent-endpoint",
            &llm.base_url(),
            "--agent-model",
            llm.model(),
        ])
        .args(["--agent-rounds", &rounds.to_string()])
        .args(["--agent-proposals", &MAX_LAYOUTS.to_string()])
        .arg("--trials")
        .arg(&trials)
        .args(["--agent-timeout-seconds", "900", "-f"])
        .arg(&plan_file)
        .output()
        .unwrap();
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "primus tune failed: {stderr}\nserver log:\n{}",
        llm.log_tail()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let agent = &v["agent"];
    primus_tests::loud(&format!(
        "\n---- agent against SmolLM2-135M: {rounds} rounds in {:.1} s ({:.1} s a round, search included): {agent}\n",
        elapsed.as_secs_f64(),
        elapsed.as_secs_f64() / rounds as f64
    ));

    // Every request was answered by the real server, and it saw exactly those requests, each
    // asking for the reply schema.
    assert_eq!(v["searcher"], "agent");
    assert_eq!(count(agent, "rounds"), rounds);
    assert_eq!(count(agent, "requests"), rounds);
    assert_eq!(
        count(agent, "failedRequests"),
        0,
        "server log:\n{}",
        llm.log_tail()
    );
    assert_eq!(llm.chat_requests(), Some(rounds as u32));

    // Every reply was read: the schema makes each one the JSON asked for, holding 1 to
    // MAX_LAYOUTS layouts.
    assert_eq!(count(agent, "malformedReplies"), 0, "{agent}");
    let proposals = count(agent, "proposals");
    assert!(
        (rounds..=rounds * MAX_LAYOUTS).contains(&proposals),
        "{proposals} proposals from {rounds} replies: {agent}"
    );
    // Every proposal got exactly one verdict: scored (new or repeated) or rejected, by reason.
    let verdicts: u64 = [
        "scored",
        "repeated",
        "malformedProposals",
        "outsideSpace",
        "rejectedByRules",
        "rejectedByMemory",
    ]
    .iter()
    .map(|k| count(agent, k))
    .sum();
    assert_eq!(verdicts, proposals, "a proposal without a verdict: {agent}");

    // The answer is a legal layout that fits, inside the allowed values, and no worse than
    // the seed planner the agent starts from.
    let plan = parse_plan(PLAN, "plan.yaml", &Catalog::builtin().unwrap()).unwrap();
    let best: primus_oracle::layout::Layout =
        serde_json::from_value(v["best"]["layout"].clone()).unwrap();
    let s = &plan.scenario;
    Prefilter::new(s, plan.tuning.memory_headroom)
        .check(s, &best)
        .unwrap_or_else(|r| panic!("the best layout {best:?} is not legal: {r}"));
    assert!([1, 2, 4, 8].contains(&best.tp) && [1, 2].contains(&best.pp) && best.cp == 1);
    let seed = tune_plan(&plan, SearcherKind::Seed).unwrap().best.unwrap();
    let got = v["best"]["projection"]["tokensPerSecondPerGpu"]
        .as_f64()
        .unwrap();
    assert!(
        got >= seed.projection.tokens_per_second_per_gpu,
        "agent {got} < seed {}",
        seed.projection.tokens_per_second_per_gpu
    );

    // Each reply's proposals are in the trials, with a verdict and, when rejected, a reason.
    let lines: Vec<Value> = std::fs::read_to_string(&trials)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let agent_trials: Vec<&Value> = lines.iter().filter(|t| t["source"] == "agent").collect();
    assert_eq!(agent_trials.len() as u64, proposals, "{agent_trials:?}");
    for t in &agent_trials {
        let verdict = t["verdict"].as_str().unwrap();
        assert!(
            t["round"]
                .as_u64()
                .is_some_and(|r| (1..=rounds).contains(&r))
        );
        if verdict.starts_with("rejected") || verdict == "outsideSpace" || verdict == "malformed" {
            assert!(t["reason"].is_string(), "a rejection without a reason: {t}");
        }
    }
    primus_tests::loud(&format!(
        "---- SmolLM2's proposals: {}\n",
        agent_trials
            .iter()
            .map(|t| format!(
                "round {} {} {}",
                t["round"],
                t["label"].as_str().unwrap_or("-"),
                t["verdict"]
            ))
            .collect::<Vec<_>>()
            .join("; ")
    ));
}
