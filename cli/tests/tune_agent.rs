//! The agent searcher against a local HTTP server that speaks the OpenAI chat-completions API
//! (a few lines of std::net, no mocking crate): a good reply is parsed, checked and scored, a
//! malformed reply and a timeout are counted and skipped, and the run always completes.

mod common;

use common::primus;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use primus_cli::agent::ChatCompletions;
use primus_oracle::plan::{Plan, SearcherKind, parse_plan};
use primus_oracle::profiles::Catalog;
use primus_oracle::tune::agent::AgentSearcher;
use primus_oracle::tune::{TuneOptions, TuneResult, tune, tune_plan};
use serde_json::{Value, json};

/// What the server answers to one request.
#[derive(Clone)]
enum Answer {
    /// 200 with a chat completion whose message content is this text.
    Content(String),
    /// A status and a raw body.
    Raw(u16, String),
    /// Wait this long, then answer with the content.
    Slow(Duration, String),
}

/// A request the server received: path, headers (lower-case names), JSON body.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

/// Serve `answers` in order (the last one repeats) on 127.0.0.1; returns the base URL and the
/// requests seen.
fn serve(answers: Vec<Answer>) -> (String, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    thread::spawn(move || {
        for (i, stream) in listener.incoming().enumerate() {
            let Ok(mut stream) = stream else { return };
            let answer = answers[i.min(answers.len() - 1)].clone();
            let log = log.clone();
            thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                let path = line.split_whitespace().nth(1).unwrap_or("").to_string();
                let mut headers = Vec::new();
                let mut length = 0usize;
                loop {
                    let mut h = String::new();
                    reader.read_line(&mut h).unwrap();
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    let (k, v) = h.split_once(':').unwrap();
                    let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_string());
                    if k == "content-length" {
                        length = v.parse().unwrap();
                    }
                    headers.push((k, v));
                }
                let mut body = vec![0u8; length];
                reader.read_exact(&mut body).unwrap();
                log.lock().unwrap().push(Seen {
                    path,
                    headers,
                    body: serde_json::from_slice(&body).unwrap_or(Value::Null),
                });
                let completion = |content: &str| {
                    json!({
                        "id": "chatcmpl-test",
                        "object": "chat.completion",
                        "model": "test-model",
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": content}}]
                    })
                    .to_string()
                };
                let (status, text) = match answer {
                    Answer::Content(c) => (200, completion(&c)),
                    Answer::Raw(s, b) => (s, b),
                    Answer::Slow(d, c) => {
                        thread::sleep(d);
                        (200, completion(&c))
                    }
                };
                let reply = format!(
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
                let _ = stream.write_all(reply.as_bytes());
            });
        }
    });
    (url, seen)
}

fn mixtral() -> Plan {
    parse_plan(
        "spec:\n  model: {preset: mixtral-8x7b}\n  cluster: {gpu: h100-sxm, gpus: 16}\n  training: {seqLength: 4096, globalBatchSize: 64}\n  tuning: {fixed: {pp: 1}}\n",
        "agent.yaml",
        &Catalog::builtin().unwrap(),
    )
    .unwrap()
}

fn run_agent(p: &Plan, url: &str, rounds: u32, timeout: Duration) -> TuneResult {
    let proposer =
        ChatCompletions::new(url, "test-model", Some("sk-test".into()), timeout).unwrap();
    let mut agent = AgentSearcher::new(Box::new(proposer), rounds);
    tune(p, Some(&mut agent), &TuneOptions::default()).expect("the agent run completes")
}

fn layout_json(c: &primus_oracle::tune::Candidate) -> Value {
    serde_json::to_value(&c.layout).unwrap()
}

#[test]
fn a_good_reply_is_checked_and_scored() {
    let p = mixtral();
    let exhaustive = tune_plan(&p, SearcherKind::Exhaustive).unwrap();
    let optimum = exhaustive.best.clone().unwrap();
    let seed = tune_plan(&p, SearcherKind::Seed).unwrap();
    // The reply proposes the optimum (every field given), one layout with a pinned axis changed, one that breaks a rule,
    // and one entry that is not a layout; wrapped in prose and a code fence.
    let mut best = layout_json(&optimum);
    best.as_object_mut().unwrap().retain(|_, v| !v.is_null());
    let mut pinned = best.clone();
    pinned["pp"] = json!(2);
    let content = format!(
        "Here are my proposals:\n```json\n{}\n```\nThey trade bubble for memory.",
        json!({"layouts": [best, pinned, {"tp": 16, "cp": 1, "ep": 1, "etp": 1}, {"tensorParallel": 8}]})
    );
    let (url, seen) = serve(vec![Answer::Content(content)]);
    let r = run_agent(&p, &url, 2, Duration::from_secs(20));

    let stats = r.agent.clone().expect("agent counters");
    assert_eq!(stats.rounds, 2);
    assert_eq!(stats.requests, 2);
    assert_eq!(stats.failed_requests, 0);
    assert_eq!(stats.malformed_replies, 0);
    assert_eq!(stats.proposals, 8, "four per reply, two replies");
    assert_eq!(stats.malformed_proposals, 2, "the unknown field, twice");
    assert_eq!(stats.outside_space, 2, "pp is pinned to 1");
    assert_eq!(
        stats.rejected_by_rules, 2,
        "tp 16 does not divide the 8 key/value heads"
    );
    assert_eq!(stats.scored + stats.repeated, 2);
    assert_eq!(r.searcher, SearcherKind::Agent);
    let got = r.best.unwrap();
    assert_eq!(
        got.projection.tokens_per_second_per_gpu, optimum.projection.tokens_per_second_per_gpu,
        "the agent's proposal {} was scored",
        optimum.label
    );
    assert!(
        got.projection.tokens_per_second_per_gpu
            >= seed.best.unwrap().projection.tokens_per_second_per_gpu
    );

    // What was sent: the chat-completions shape, the model, the key, the context.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    let first = &seen[0];
    assert_eq!(first.path, "/v1/chat/completions");
    assert!(
        first
            .headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == "Bearer sk-test")
    );
    assert_eq!(first.body["model"], "test-model");
    let messages = first.body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[1]["role"], "user");
    let context = messages[1]["content"].as_str().unwrap();
    assert!(
        context.contains("mixtral-8x7b") && context.contains("Best layouts so far"),
        "{context}"
    );
    // The second request carries the conversation and the results of the first proposals.
    let second = seen[1].body["messages"].as_array().unwrap();
    assert_eq!(second.len(), 4);
    assert_eq!(second[2]["role"], "assistant");
    let feedback = second[3]["content"].as_str().unwrap();
    assert!(
        feedback.contains("outside the allowed values"),
        "{feedback}"
    );
    assert!(feedback.contains("tp-divides-kv-heads"), "{feedback}");
    assert!(feedback.contains("not a layout"), "{feedback}");
}

#[test]
fn malformed_replies_and_errors_are_counted_and_skipped() {
    let p = mixtral();
    let seed = tune_plan(&p, SearcherKind::Seed).unwrap();
    let (url, _) = serve(vec![
        Answer::Content("I would use tensor parallelism of 8 and a bigger batch.".into()),
        Answer::Raw(200, "{\"not\": \"a completion\"}".into()),
        Answer::Content("{\"layouts\": 42}".into()),
        Answer::Raw(500, "{\"error\": \"overloaded\"}".into()),
        Answer::Content("[{\"tp\": 2}]".into()),
    ]);
    let r = run_agent(&p, &url, 5, Duration::from_secs(20));
    let stats = r.agent.clone().unwrap();
    assert_eq!(stats.rounds, 5);
    assert_eq!(stats.malformed_replies, 2);
    assert_eq!(stats.failed_requests, 2);
    assert_eq!(stats.proposals, 1, "the last reply is a bare list");
    // The seed planner's answer survives whatever the model says.
    let best = r.best.unwrap().projection.tokens_per_second_per_gpu;
    assert!(best >= seed.best.unwrap().projection.tokens_per_second_per_gpu);
}

#[test]
fn a_timeout_is_counted_and_the_run_completes() {
    let p = mixtral();
    let (url, _) = serve(vec![Answer::Slow(
        Duration::from_secs(4),
        "{\"layouts\": []}".into(),
    )]);
    let start = Instant::now();
    let r = run_agent(&p, &url, 5, Duration::from_secs(1));
    let stats = r.agent.clone().unwrap();
    assert_eq!(
        stats.failed_requests, 2,
        "two failures in a row end the rounds"
    );
    assert_eq!(stats.proposals, 0);
    assert!(
        r.best.is_some(),
        "the seed planner's layouts are still reported"
    );
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "gave up on time: {:?}",
        start.elapsed()
    );
}

#[test]
fn an_unreachable_endpoint_does_not_crash_the_run() {
    // Bind then drop a listener: nothing listens on that port any more.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = mixtral();
    let r = run_agent(
        &p,
        &format!("http://127.0.0.1:{port}/v1"),
        3,
        Duration::from_secs(2),
    );
    assert_eq!(r.agent.unwrap().failed_requests, 2);
    assert!(r.best.is_some());
}

#[test]
fn the_cli_runs_the_agent_from_flags_and_the_plan() {
    let (url, seen) = serve(vec![Answer::Content("{\"layouts\": [{\"tp\": 2}]}".into())]);
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.yaml");
    std::fs::write(
        &plan,
        "spec:\n  model: {preset: mixtral-8x7b}\n  cluster: {gpu: h100-sxm, gpus: 16}\n  training: {seqLength: 4096, globalBatchSize: 64}\n  tuning:\n    searcher: agent\n    agent: {model: from-plan, apiKeyEnv: PRIMUS_TEST_LLM_KEY, rounds: 2}\n",
    )
    .unwrap();
    let out = primus()
        .env("PRIMUS_TEST_LLM_KEY", "secret-from-env")
        .args(["tune", "-q", "-o", "json", "--agent-endpoint", &url, "-f"])
        .arg(&plan)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["searcher"], "agent");
    assert_eq!(v["agent"]["rounds"], 2);
    assert_eq!(v["agent"]["proposals"], 2);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].body["model"], "from-plan");
    assert!(
        seen[0]
            .headers
            .iter()
            .any(|(k, v)| k == "authorization" && v == "Bearer secret-from-env")
    );
    // A key variable that is not set is a bad plan, naming the field.
    let err = primus()
        .env_remove("PRIMUS_TEST_LLM_KEY")
        .args(["tune", "--agent-endpoint", &url, "-f"])
        .arg(&plan)
        .assert()
        .code(2)
        .get_output()
        .stderr
        .clone();
    assert!(
        String::from_utf8(err)
            .unwrap()
            .contains("spec.tuning.agent.apiKeyEnv")
    );
}

// ---- The scripted server that reads the prompt (primus_tests::chat), issue 17. ----

use primus_oracle::tune::trials::{Source, Verdict};
use primus_tests::chat::{self, ChatServer};

/// Llama 3.1 8B on 16 H100s whose reference turns the data-parallel overlaps off: the grid
/// keeps them off for every candidate, an agent may turn them on.
const OVERLAPS_OFF: &str = "spec:\n  model: {preset: llama3.1-8b}\n  cluster: {gpu: h100-sxm, gpus: 16}\n  training: {seqLength: 4096, globalBatchSize: 64}\n  parallelism: {tp: 2, overlapGradReduce: false, overlapParamGather: false}\n  tuning: {fixed: {fsdp: false}}\n";

fn overlaps_off() -> Plan {
    parse_plan(OVERLAPS_OFF, "agent.yaml", &Catalog::builtin().unwrap()).unwrap()
}

#[test]
fn a_server_that_reads_the_prompt_moves_the_best_beyond_the_grid() {
    let p = overlaps_off();
    let server = ChatServer::start(vec![chat::Answer::Read]);
    let r = run_agent(&p, server.base_url(), 3, Duration::from_secs(20));
    let a = r.agent.clone().unwrap();
    assert_eq!(
        (a.requests, a.failed_requests, a.malformed_replies),
        (3, 0, 0)
    );
    assert!(a.beyond_grid >= 1, "{a:?}");
    let exhaustive = tune_plan(&p, SearcherKind::Exhaustive).unwrap();
    let (got, grid) = (
        r.best.as_ref().unwrap().tokens_per_second(),
        exhaustive.best.as_ref().unwrap().tokens_per_second(),
    );
    assert!(got > grid, "agent {got} <= exhaustive {grid}");
    // The server answered from what it was shown: its first answer is the best layout of the
    // first prompt with the gradient-reduce overlap on, and the agent scored exactly that.
    let seen = server.requests();
    let shown = chat::best_shown(&seen[0].last_user()).expect("the prompt shows the best layout");
    assert_eq!(shown["overlapGradReduce"], false);
    let first = r
        .trials
        .iter()
        .find(|t| t.source == Source::Agent)
        .expect("an agent trial");
    assert_eq!((first.round, first.verdict), (Some(1), Verdict::Scored));
    assert_eq!(first.beyond_grid, vec!["overlapGradReduce".to_string()]);
    let l = first.layout.as_ref().unwrap();
    assert!(l.overlap_grad_reduce && !l.overlap_param_gather);
    assert_eq!(
        (l.tp, l.pp, l.micro_batch_size),
        (
            shown["tp"].as_u64().unwrap() as u32,
            shown["pp"].as_u64().unwrap() as u32,
            shown["microBatchSize"].as_u64().unwrap() as u32,
        )
    );
    // Round 2 was shown round 1's result as the best, and turned on the next switch.
    let second = chat::best_shown(&seen[1].last_user()).unwrap();
    assert_eq!(
        (
            second["overlapGradReduce"].clone(),
            second["overlapParamGather"].clone()
        ),
        (json!(true), json!(false))
    );
    // Structured output was asked for, with the reply schema.
    let rf = &seen[0].body["response_format"];
    assert_eq!(rf["type"], "json_schema");
    assert!(rf["json_schema"]["schema"]["properties"]["layouts"]["items"]["properties"]["overlapGradReduce"].is_object());
}

#[test]
fn reasoning_replies_are_read_after_their_think_block() {
    let p = overlaps_off();
    let server = ChatServer::start(vec![chat::Answer::Reasoning]);
    let r = run_agent(&p, server.base_url(), 2, Duration::from_secs(20));
    let a = r.agent.unwrap();
    assert_eq!((a.malformed_replies, a.proposals), (0, 2), "{a:?}");
    // The decoy (TP 4096) in the <think> block was never proposed.
    assert_eq!(a.rejected_by_rules + a.outside_space, 0, "{a:?}");
    assert!(a.beyond_grid >= 1);
}

#[test]
fn a_server_that_refuses_response_format_is_asked_again_without_it() {
    let p = overlaps_off();
    let server = ChatServer::start(vec![
        chat::Answer::Raw(
            400,
            "{\"error\": {\"message\": \"response_format is not supported\"}}".into(),
        ),
        chat::Answer::Read,
    ]);
    let r = run_agent(&p, server.base_url(), 2, Duration::from_secs(20));
    let a = r.agent.unwrap();
    assert_eq!((a.requests, a.failed_requests), (2, 0), "{a:?}");
    let seen = server.requests();
    assert_eq!(seen.len(), 3, "one retry, then plain requests");
    assert!(seen[0].body.get("response_format").is_some());
    assert!(seen[1].body.get("response_format").is_none());
    assert!(seen[2].body.get("response_format").is_none());
}

#[test]
fn an_endpoint_that_never_answers_is_unavailable_and_the_fallback_is_exhaustive() {
    let p = overlaps_off();
    let server = ChatServer::start(vec![chat::Answer::Never]);
    let start = Instant::now();
    let r = run_agent(&p, server.base_url(), 3, Duration::from_secs(1));
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    let why = r.agent_unavailable.clone().expect("unavailable");
    assert!(why.contains("no reply within 1 s"), "{why}");
    let f = primus_oracle::tune::agent_fallback(&p, r, &TuneOptions::default()).unwrap();
    let e = tune_plan(&p, SearcherKind::Exhaustive).unwrap();
    assert_eq!(f.searcher, SearcherKind::Exhaustive);
    assert_eq!(f.best.unwrap().layout, e.best.unwrap().layout);
    assert_eq!(f.agent.unwrap().failed_requests, 2);
    assert!(f.agent_unavailable.is_some());
    // The trials keep the seed planner's sweeps, then the exhaustive search's projections.
    assert_eq!(f.trials[0].source, Source::Reference);
    assert!(f.trials.iter().any(|t| t.source == Source::Seed));
    assert!(f.trials.iter().any(|t| t.source == Source::Exhaustive));
    assert_eq!(
        f.trials
            .iter()
            .filter(|t| t.source == Source::Reference)
            .count(),
        1
    );
}

#[test]
fn a_budget_ends_the_rounds() {
    let p = overlaps_off();
    let server = ChatServer::start(vec![chat::Answer::Slow(Duration::from_millis(700))]);
    let proposer =
        ChatCompletions::new(server.base_url(), "m", None, Duration::from_secs(20)).unwrap();
    let mut agent = AgentSearcher::new(Box::new(proposer), 10);
    agent.budget = Some(Duration::from_secs(1));
    let r = tune(&p, Some(&mut agent), &TuneOptions::default()).unwrap();
    let a = r.agent.unwrap();
    assert!(a.rounds < 10 && a.rounds_skipped_by_budget > 0, "{a:?}");
    assert_eq!(a.rounds + a.rounds_skipped_by_budget, 10);
}

#[test]
fn the_cli_fails_on_an_unreachable_endpoint_unless_told_to_fall_back() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.yaml");
    std::fs::write(&plan, OVERLAPS_OFF).unwrap();
    let args = [
        "tune",
        "-q",
        "-o",
        "json",
        "--searcher",
        "agent",
        "--agent-model",
        "m",
        "--agent-timeout-seconds",
        "2",
        "--agent-endpoint",
    ];
    let err = primus()
        .args(args)
        .arg(&url)
        .arg("-f")
        .arg(&plan)
        .assert()
        .code(1)
        .get_output()
        .stderr
        .clone();
    let err = String::from_utf8(err).unwrap();
    assert!(
        err.contains("never answered") && err.contains("--agent-fallback"),
        "{err}"
    );
    let out = primus()
        .args(args)
        .arg(&url)
        .args(["--agent-fallback", "-f"])
        .arg(&plan)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["searcher"], "exhaustive");
    assert!(
        v["agentUnavailable"]
            .as_str()
            .unwrap()
            .contains("request failed"),
        "{v}"
    );
    assert_eq!(v["agent"]["failedRequests"], 2);
    let e = tune_plan(&overlaps_off(), SearcherKind::Exhaustive).unwrap();
    assert_eq!(v["best"]["label"], e.best.unwrap().label);
}

#[test]
fn the_cli_writes_trials_and_the_best_so_far_plot() {
    let server = ChatServer::start(vec![chat::Answer::Read]);
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.yaml");
    std::fs::write(&plan, OVERLAPS_OFF).unwrap();
    let (trials, plot) = (dir.path().join("trials.jsonl"), dir.path().join("best.svg"));
    let out = primus()
        .args([
            "tune",
            "--searcher",
            "agent",
            "--agent-model",
            "m",
            "--agent-rounds",
            "3",
            "--agent-endpoint",
            server.base_url(),
        ])
        .arg("--trials")
        .arg(&trials)
        .arg("--plot")
        .arg(&plot)
        .arg("-f")
        .arg(&plan)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let table = String::from_utf8(out).unwrap();
    // The winner against the reference, term by term, and the trials in brief.
    assert!(table.contains("best vs reference, per step:"), "{table}");
    assert!(table.contains("exposed dp comm:"), "{table}");
    assert!(table.contains("memory headroom GiB:"), "{table}");
    assert!(
        table.contains("trials: ") && table.contains("; agent 3 ("),
        "{table}"
    );
    let lines: Vec<Value> = std::fs::read_to_string(&trials)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["source"], "reference");
    assert_eq!(lines[0]["n"], 1);
    let agent: Vec<&Value> = lines.iter().filter(|t| t["source"] == "agent").collect();
    assert_eq!(agent.len(), 3);
    assert_eq!(agent[0]["round"], 1);
    assert_eq!(agent[0]["verdict"], "scored");
    assert_eq!(agent[0]["beyondGrid"], json!(["overlapGradReduce"]));
    // Best so far never falls; the last is the best reported.
    let best: Vec<f64> = lines
        .iter()
        .filter_map(|t| t["bestSoFar"].as_f64())
        .collect();
    assert!(best.windows(2).all(|w| w[1] >= w[0]));
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("<polyline"),
        "{svg}"
    );
    let scored = lines
        .iter()
        .filter(|t| t["tokensPerSecond"].is_number())
        .count();
    assert!(svg.matches("<circle").count() >= scored, "{svg}");
}
