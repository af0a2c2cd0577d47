//! The LLM proposer, after the paper's tuning agent: the seed planner's sweeps first, then
//! rounds in which a language model sees the best layouts so far, the rejection reasons and the
//! legal values of every axis, and proposes cross-axis layouts as JSON. Every proposal is
//! checked (inside the space, legal, fits in memory) before it is scored; replies that are not
//! the JSON asked for are counted and skipped, failed requests too: the agent never crashes
//! the run.
//!
//! The library defines the transport as a trait, [`Proposer`] (send a conversation, get the
//! reply text), so the prompts and the parsing are plain functions. The one implementation that
//! touches the network, `ChatCompletions` (OpenAI-compatible `POST {endpoint}/chat/completions`
//! over reqwest), lives in the `primus-cli` crate (`primus_cli::agent`): this library stays
//! free of network and async code.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use std::time::{Duration, Instant};

use super::seed::{Scorer, SeedPlanner};
use super::trials::{Source, Trial, Verdict};
use super::{Context, Outcome, Rejection, Scored, Searcher, Stats};
use crate::layout::Layout;
use crate::plan::SearcherKind;
use crate::units::GIB;

/// One message of a chat conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.to_string(),
            content: content.into(),
        }
    }
}

/// Why a request to the model failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProposeError {
    /// No reply within the timeout.
    #[error("no reply within {0} s")]
    Timeout(u64),
    /// The connection or the HTTP exchange failed.
    #[error("request failed: {0}")]
    Transport(String),
    /// The server answered, but not with a chat completion.
    #[error("unexpected response: {0}")]
    Protocol(String),
}

/// Sends a conversation to a language model and returns the reply text.
pub trait Proposer {
    fn complete(&mut self, messages: &[ChatMessage]) -> Result<String, ProposeError>;
}

/// The agent's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStats {
    /// Proposal rounds run.
    pub rounds: u32,
    /// Requests sent.
    pub requests: u32,
    /// Requests that failed (timeout, connection, HTTP error, not a chat completion).
    pub failed_requests: u32,
    /// Replies without the JSON asked for.
    pub malformed_replies: u32,
    /// Layouts proposed.
    pub proposals: u32,
    /// Proposed entries that were not layouts (unknown fields, wrong types).
    pub malformed_proposals: u32,
    /// Proposals outside the search space (a pinned or disallowed value).
    pub outside_space: u32,
    /// Proposals already scored.
    pub repeated: u32,
    /// Proposals a legality rule rejected.
    pub rejected_by_rules: u32,
    /// Proposals the memory pre-filter rejected.
    pub rejected_by_memory: u32,
    /// Proposals scored.
    pub scored: u32,
    /// Proposals that became the best so far.
    pub improvements: u32,
    /// Proposals scored with options beyond the exhaustive search's grid.
    pub beyond_grid: u32,
    /// Rounds not run because the time budget was spent.
    pub rounds_skipped_by_budget: u32,
    /// Set when no request got a reply (every one failed): the last error. The caller falls
    /// back to the best non-agent answer ([`super::agent_fallback`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

/// Parse a reply into proposals: the first JSON value in the text (code fences and prose
/// around it are ignored), either `{"layouts": [...]}`, a bare list, or one layout object.
/// Each entry is merged over `base` (fields it omits keep `base`'s values) and read as a
/// [`Layout`]; an entry that is not one gives `Err` with the reason. `Err` for the whole reply
/// when it holds no such JSON.
pub fn parse_reply(reply: &str, base: &Layout) -> Result<Vec<Result<Layout, String>>, String> {
    let answer = strip_reasoning(reply);
    let value = first_json(&answer).ok_or_else(|| {
        if answer.trim().is_empty() && !reply.trim().is_empty() {
            "the reply holds only reasoning (<think> ...), no answer".to_string()
        } else {
            "no JSON object or list in the reply".to_string()
        }
    })?;
    let entries: Vec<Value> = match value {
        Value::Array(a) => a,
        Value::Object(mut o) => {
            let key = ["layouts", "proposals", "candidates"]
                .into_iter()
                .find(|k| o.contains_key(*k));
            match key {
                Some(k) => match o.remove(k) {
                    Some(Value::Array(a)) => a,
                    _ => return Err(format!("`{k}` is not a list")),
                },
                None if o.contains_key("tp") || o.contains_key("pp") => vec![Value::Object(o)],
                None => return Err("expected {\"layouts\": [...]}".to_string()),
            }
        }
        _ => return Err("expected {\"layouts\": [...]}".to_string()),
    };
    let base_json = serde_json::to_value(base).map_err(|e| e.to_string())?;
    Ok(entries
        .into_iter()
        .map(|e| {
            let Value::Object(fields) = e else {
                return Err("a proposal is not an object".to_string());
            };
            let mut merged = base_json.clone();
            let obj = merged
                .as_object_mut()
                .expect("a layout serializes to an object");
            for (k, v) in fields {
                obj.insert(k, v);
            }
            // Explicit nulls for optional fields that the base does not serialize.
            obj.retain(|_, v| !v.is_null());
            serde_json::from_value::<Layout>(merged).map_err(|e| e.to_string())
        })
        .collect())
}

/// A reply without the reasoning blocks of reasoning models (`<think> ... </think>`; an
/// unterminated block runs to the end): JSON drafted while thinking is not the answer.
pub fn strip_reasoning(reply: &str) -> String {
    let mut out = String::with_capacity(reply.len());
    let mut rest = reply;
    while let Some(i) = rest.find("<think>") {
        out.push_str(&rest[..i]);
        match rest[i..].find("</think>") {
            Some(j) => rest = &rest[i + j + "</think>".len()..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

/// The JSON schema of a reply (`{"layouts": [...]}`, at most `per_round` entries), sent as
/// `response_format` so servers with structured output constrain the model to it. Every
/// field is optional (omitted fields keep the best layout's values); the legality rules, not
/// the schema, judge the values.
pub fn reply_schema(per_round: usize) -> Value {
    use serde_json::json;
    let int = |min: u32| json!({"type": "integer", "minimum": min, "maximum": 1_000_000});
    let flag = json!({"type": "boolean"});
    let modules: Vec<&str> = crate::layout::RecomputeModule::ALL
        .iter()
        .map(|m| m.as_str())
        .collect();
    json!({
        "type": "object",
        "properties": {"layouts": {
            "type": "array", "minItems": 1, "maxItems": per_round.max(1),
            "items": {
                "type": "object",
                "properties": {
                    "tp": int(1), "pp": int(1), "vpp": int(1), "cp": int(1), "ep": int(1),
                    "etp": int(1), "microBatchSize": int(1),
                    "recompute": {"enum": ["none", "selective", "full"]},
                    "recomputeLayers": int(0),
                    "recomputeModules": {"type": "array", "items": {"enum": modules}, "maxItems": modules.len()},
                    "distributedOptimizer": flag, "fsdp": flag,
                    "schedule": {"enum": ["1f1b", "interleaved", "zero-bubble"]},
                    "firstStageLayers": int(1), "lastStageLayers": int(1),
                    "sequenceParallel": flag, "tpCommOverlap": flag,
                    "overlapGradReduce": flag, "overlapParamGather": flag
                },
                "additionalProperties": false
            }
        }},
        "required": ["layouts"],
        "additionalProperties": false
    })
}

/// The first complete JSON object or array in a text.
fn first_json(text: &str) -> Option<Value> {
    for (i, c) in text.char_indices() {
        if c != '{' && c != '[' {
            continue;
        }
        let mut stream = serde_json::Deserializer::from_str(&text[i..]).into_iter::<Value>();
        if let Some(Ok(v)) = stream.next()
            && (v.is_object() || v.is_array())
        {
            return Some(v);
        }
    }
    None
}

/// The instructions of the conversation.
pub fn system_prompt(per_round: usize) -> String {
    format!(
        "You are an expert in distributed LLM training with Megatron-LM. You tune the parallel \
layout of one training job. A projection oracle scores every layout you propose (tokens per \
second per GPU) after checking Megatron's rules and per-GPU memory.\n\
Propose up to {per_round} NEW layouts per turn that change SEVERAL axes at once (single-axis \
changes were already swept). Reply with JSON only, no prose:\n\
{{\"layouts\": [{{\"tp\": 8, \"pp\": 4, \"vpp\": 2, \"cp\": 1, \"ep\": 8, \"etp\": 1, \
\"microBatchSize\": 1, \"recompute\": \"none\", \"recomputeLayers\": 0, \
\"distributedOptimizer\": true, \"fsdp\": false, \"schedule\": \"interleaved\"}}]}}\n\
Fields: tp, pp, vpp (model chunks per pipeline rank), cp, ep, etp, microBatchSize, recompute \
(none | selective | full), recomputeLayers (with full: layers recomputed per chunk, 0 = all), \
recomputeModules (with selective: Megatron's --recompute-modules list, e.g. [\"moe_act\", \
\"layernorm\"]; omitted = [\"core_attn\"]), \
distributedOptimizer, fsdp, schedule (1f1b | interleaved | zero-bubble), firstStageLayers, \
lastStageLayers (uneven pipeline splits). Omitted fields keep the best layout's value.\n\
Beyond the grid the exhaustive search covers you may also set: sequenceParallel, \
tpCommOverlap, overlapGradReduce, overlapParamGather (booleans), any recomputeModules list, \
and uneven splits (firstStageLayers, lastStageLayers) for the proposed pp. These are where \
you can beat an exhaustive search; each one is checked by the rules and the memory model.\n\
Rules: dp = gpus / (tp*pp*cp) must be whole; globalBatchSize divisible by microBatchSize*dp; \
tp divides the attention and key/value heads; interleaved needs vpp > 1 and a number of \
micro-batches that is a multiple of pp; 1f1b and zero-bubble need vpp = 1; ep divides the \
experts and ep*etp divides gpus/pp; use only the allowed values listed."
    )
}

fn gib(b: f64) -> f64 {
    b / GIB
}

fn list<T: std::fmt::Debug>(v: &[T]) -> String {
    format!("{v:?}")
}

/// The first user message: the job, the allowed values, the best layouts so far and why
/// candidates were rejected.
pub fn context_prompt(
    ctx: &Context<'_>,
    top: &[Scored],
    rejections: &BTreeMap<String, u64>,
) -> String {
    let s = ctx.scenario;
    let m = &s.model;
    let sp = ctx.space;
    let mut p = String::new();
    let _ = writeln!(
        p,
        "Job: model {} ({} layers, hidden {}, {} attention heads, {} key/value heads{}), \
{} x {} GPUs ({} per node, {:.0} GiB each, {:.1} GiB usable per GPU after headroom), \
sequence {}, global batch {}, {}.",
        if m.name.is_empty() {
            "(inline card)"
        } else {
            &m.name
        },
        m.layers,
        m.hidden_size,
        m.attention_heads,
        m.kv_heads(),
        match &m.moe {
            Some(e) => format!(", {} experts top-{}", e.num_experts, e.top_k),
            None => String::new(),
        },
        s.cluster.gpus,
        s.hardware.name,
        s.cluster.gpus_per_node,
        s.hardware.memory_gib,
        gib(ctx.filter.limit_bytes),
        s.training.seq_length,
        s.training.global_batch_size,
        s.training.precision.as_str(),
    );
    let _ = writeln!(
        p,
        "Allowed values: tp {}, pp {}, vpp {}, cp {}, ep {}, etp {}, microBatchSize {}, \
recompute {}, recomputeModules {}, schedule {}, optimizer sharding {}.",
        list(&sp.tp),
        list(&sp.pp),
        sp.vpp
            .as_ref()
            .map_or("any that splits the layers".to_string(), |v| list(v)),
        list(&sp.cp),
        list(&sp.ep),
        sp.etp
            .as_ref()
            .map_or("divisors of tp".to_string(), |v| list(v)),
        list(&sp.micro_batch_size),
        list(&sp.recompute.iter().map(|r| r.as_str()).collect::<Vec<_>>()),
        list(
            &sp.recompute_modules
                .iter()
                .map(|m| m.iter().map(|x| x.as_str()).collect::<Vec<_>>())
                .collect::<Vec<_>>()
        ),
        list(&sp.schedule.iter().map(|x| x.as_str()).collect::<Vec<_>>()),
        list(&sp.sharding),
    );
    p.push_str(&results_table(top));
    if !rejections.is_empty() {
        p.push_str("Candidates rejected so far, by reason:\n");
        for (k, v) in rejections {
            let _ = writeln!(p, "- {k}: {v}");
        }
    }
    p
}

/// The best layouts as lines of text.
fn results_table(top: &[Scored]) -> String {
    let mut p = String::from("Best layouts so far (tokens/s/GPU, MFU, step breakdown):\n");
    for (i, c) in top.iter().enumerate() {
        let b = &c.time.breakdown;
        let _ = writeln!(
            p,
            "{}. {} -> {:.0} tok/s/GPU, MFU {:.1}%, compute {:.2} s, bubble {:.2} s, exposed comm {:.2} s (largest {}), json {}",
            i + 1,
            c.layout.label(),
            c.tokens_per_second(),
            c.time.mfu * 100.0,
            b.compute,
            b.bubble,
            b.exposed_comm(),
            b.largest_comm().0,
            serde_json::to_string(&compact(&c.layout)).unwrap_or_default(),
        );
    }
    p
}

/// The searched fields of a layout, for the prompt.
fn compact(l: &Layout) -> Value {
    let mut v = serde_json::json!({
        "tp": l.tp, "pp": l.pp, "vpp": l.vpp, "cp": l.cp, "ep": l.ep, "etp": l.etp,
        "microBatchSize": l.micro_batch_size, "recompute": l.recompute.as_str(),
        "recomputeLayers": l.recompute_layers, "distributedOptimizer": l.distributed_optimizer,
        "fsdp": l.fsdp, "schedule": l.schedule.as_str(),
    });
    if let Some(m) = &l.recompute_modules {
        v["recomputeModules"] = serde_json::json!(m);
    }
    if let Some(f) = l.first_stage_layers {
        v["firstStageLayers"] = f.into();
    }
    if let Some(f) = l.last_stage_layers {
        v["lastStageLayers"] = f.into();
    }
    v["sequenceParallel"] = l.sequence_parallel.into();
    v["tpCommOverlap"] = l.tp_comm_overlap.into();
    v["overlapGradReduce"] = l.overlap_grad_reduce.into();
    v["overlapParamGather"] = l.overlap_param_gather.into();
    v
}

/// The agent searcher: seed sweeps, then `rounds` of proposals.
pub struct AgentSearcher {
    proposer: Box<dyn Proposer>,
    /// Proposal rounds.
    pub rounds: u32,
    /// Proposals read per reply at most.
    pub per_round: usize,
    /// Stop after this many failed requests in a row.
    pub max_consecutive_failures: u32,
    /// Wall time for the whole search: no round starts after it (the proposer's own timeout
    /// bounds the round in flight).
    pub budget: Option<Duration>,
}

impl AgentSearcher {
    pub fn new(proposer: Box<dyn Proposer>, rounds: u32) -> AgentSearcher {
        AgentSearcher {
            proposer,
            rounds,
            per_round: 8,
            max_consecutive_failures: 2,
            budget: None,
        }
    }
}

impl Searcher for AgentSearcher {
    fn kind(&self) -> SearcherKind {
        SearcherKind::Agent
    }

    fn search(&mut self, ctx: &Context<'_>) -> Outcome {
        let start = Instant::now();
        let mut scorer = Scorer::new(ctx.top_k.max(5));
        let mut stats = AgentStats::default();
        if let Some(first) = SeedPlanner::baseline(ctx, &mut scorer) {
            SeedPlanner::default().sweep(ctx, &mut scorer, first);
        }
        scorer.source = Source::Agent;
        let mut rejections = Stats::owned(&scorer.stats.rules);
        for (k, v) in &scorer.stats.memory {
            rejections.insert(format!("memory: {k}"), *v);
        }
        let mut messages = vec![
            ChatMessage::new("system", system_prompt(self.per_round)),
            ChatMessage::new(
                "user",
                context_prompt(ctx, scorer.top.as_slice(), &rejections),
            ),
        ];
        let mut failures = 0;
        let mut last_error = None;
        for round in 1..=self.rounds {
            if self.budget.is_some_and(|b| start.elapsed() >= b) {
                stats.rounds_skipped_by_budget = self.rounds - round + 1;
                break;
            }
            stats.rounds += 1;
            stats.requests += 1;
            scorer.round = Some(round);
            let reply = match self.proposer.complete(&messages) {
                Ok(r) => {
                    failures = 0;
                    r
                }
                Err(e) => {
                    stats.failed_requests += 1;
                    last_error = Some(e.to_string());
                    failures += 1;
                    if failures >= self.max_consecutive_failures {
                        break;
                    }
                    continue;
                }
            };
            let Some(base) = scorer
                .top
                .best()
                .map(|c| c.layout.clone())
                .or_else(|| ctx.reference.cloned())
            else {
                break;
            };
            messages.push(ChatMessage::new("assistant", reply.clone()));
            let feedback = self.round(ctx, &mut scorer, &mut stats, &reply, &base, round);
            messages.push(ChatMessage::new("user", feedback));
        }
        if stats.requests > 0 && stats.failed_requests == stats.requests {
            stats.unavailable = last_error;
        }
        scorer.outcome(Some(stats))
    }
}

impl AgentSearcher {
    /// Read one reply, check and score its proposals; the feedback for the next turn.
    fn round(
        &self,
        ctx: &Context<'_>,
        scorer: &mut Scorer,
        stats: &mut AgentStats,
        reply: &str,
        base: &Layout,
        round: u32,
    ) -> String {
        let proposals = match parse_reply(reply, base) {
            Ok(p) => p,
            Err(why) => {
                stats.malformed_replies += 1;
                scorer.trials.push(Trial::malformed(round, &why));
                return format!(
                    "Your reply could not be used ({why}). Reply with JSON only: {{\"layouts\": [...]}}."
                );
            }
        };
        let mut feedback = String::from("Results of your proposals:\n");
        for p in proposals.into_iter().take(self.per_round) {
            stats.proposals += 1;
            let l = match p {
                Ok(l) => l,
                Err(why) => {
                    stats.malformed_proposals += 1;
                    scorer.trials.push(Trial::malformed(round, &why));
                    let _ = writeln!(feedback, "- not a layout: {why}");
                    continue;
                }
            };
            let line = self.try_proposal(ctx, scorer, stats, &l, round);
            let _ = writeln!(feedback, "- {}: {line}", l.label());
        }
        feedback.push_str(&results_table(scorer.top.as_slice()));
        feedback.push_str("Propose new layouts that may beat the best one.");
        feedback
    }

    /// Check and score one proposal (its trial recorded); the line of feedback for the model.
    fn try_proposal(
        &self,
        ctx: &Context<'_>,
        scorer: &mut Scorer,
        stats: &mut AgentStats,
        l: &Layout,
        round: u32,
    ) -> String {
        let s = ctx.scenario;
        let Some((n, beyond)) = ctx.space.normalize_open(s, l) else {
            stats.outside_space += 1;
            let mut t = Trial::new(Source::Agent, l, Verdict::OutsideSpace);
            t.round = Some(round);
            t.reason = Some("a pinned or disallowed value".into());
            scorer.trials.push(t);
            return "outside the allowed values (pinned or not allowed)".into();
        };
        let p = Proposal {
            proposed: l,
            normalized: &n,
            beyond: &beyond,
            round,
        };
        let scored_as = if n != *l {
            format!(" (scored as {})", n.label())
        } else {
            String::new()
        };
        if let Err(r) = ctx.filter.check(s, &n) {
            match &r {
                Rejection::Rule(_) => stats.rejected_by_rules += 1,
                Rejection::Memory { .. } => stats.rejected_by_memory += 1,
            }
            // Count it as the pre-filter would.
            scorer.stats.reject(s, &n, &r, 1);
            scorer
                .trials
                .push(p.annotate(Trial::rejected(Source::Agent, &n, &r)));
            return format!("rejected, {r}{scored_as}");
        }
        let before = scorer.top.best().map(|c| c.tokens_per_second());
        let (unique, logged) = (scorer.unique(), scorer.trials.trials.len());
        match scorer.score_exact(ctx, n.clone()) {
            Some(c) => {
                if scorer.unique() == unique {
                    stats.repeated += 1;
                    let mut t = p.annotate(Trial::new(Source::Agent, &n, Verdict::Repeated));
                    t.reason = Some(format!(
                        "scored before: {:.0} tok/s/GPU",
                        c.tokens_per_second()
                    ));
                    scorer.trials.push(t);
                } else {
                    record_scored(scorer, stats, &p, &c, logged);
                }
                if before.is_none_or(|b| c.tokens_per_second() > b) {
                    stats.improvements += 1;
                }
                let extra = if beyond.is_empty() {
                    String::new()
                } else {
                    format!(", beyond the grid: {}", beyond.join(", "))
                };
                format!(
                    "{:.0} tok/s/GPU, MFU {:.1}%{scored_as}{extra}",
                    c.tokens_per_second(),
                    c.time.mfu * 100.0
                )
            }
            None => {
                let why = record_unscored(scorer, stats, &p, logged);
                format!("rejected, {why}{scored_as}")
            }
        }
    }
}

/// One agent proposal on its way to a trial: as proposed, as normalized and scored, what of it
/// lies beyond the grid, and its round.
struct Proposal<'a> {
    proposed: &'a Layout,
    normalized: &'a Layout,
    beyond: &'a [String],
    round: u32,
}

impl Proposal<'_> {
    /// A trial of this proposal: its round, what was proposed when something else was scored,
    /// what lies beyond the grid.
    fn annotate(&self, mut t: Trial) -> Trial {
        t.round = Some(self.round);
        if self.normalized != self.proposed {
            t.proposed = Some(self.proposed.clone());
        }
        t.beyond_grid = self.beyond.to_vec();
        t
    }
}

/// A new layout scored for a proposal: counted, and its trial (logged by the scorer, or
/// once more when it resolved to a layout scored before under another name) annotated.
fn record_scored(
    scorer: &mut Scorer,
    stats: &mut AgentStats,
    p: &Proposal<'_>,
    c: &Scored,
    logged: usize,
) {
    stats.scored += 1;
    if !p.beyond.is_empty() {
        stats.beyond_grid += 1;
    }
    if scorer.trials.trials.len() > logged
        && let Some(t) = scorer.trials.trials.last_mut()
    {
        *t = p.annotate(t.clone());
    } else {
        // Resolved (full recompute) to a layout scored before under another name: its
        // trial, once more under this proposal.
        let t = Trial::scored(Source::Agent, &c.layout, c.tokens_per_second());
        scorer.trials.push(p.annotate(t));
    }
}

/// A proposal the scorer could not score: a projection-time rule (its trial logged by the
/// scorer), or no full-recompute count that fits. Counted, its trial annotated; the reason.
fn record_unscored(
    scorer: &mut Scorer,
    stats: &mut AgentStats,
    p: &Proposal<'_>,
    logged: usize,
) -> String {
    if scorer.trials.trials.len() > logged
        && let Some(t) = scorer.trials.trials.last_mut()
    {
        *t = p.annotate(t.clone());
        if t.verdict == Verdict::RejectedByRule {
            stats.rejected_by_rules += 1;
        } else {
            stats.rejected_by_memory += 1;
        }
        return t.reason.clone().unwrap_or_default();
    }
    stats.rejected_by_memory += 1;
    let mut t = p.annotate(Trial::new(
        Source::Agent,
        p.normalized,
        Verdict::RejectedByMemory,
    ));
    t.reason = Some("no full-recompute layer count fits".into());
    scorer.trials.push(t);
    "no full-recompute layer count fits".into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{Recompute, Schedule};

    fn base() -> Layout {
        Layout {
            tp: 4,
            pp: 2,
            ..Layout::default()
        }
    }

    #[test]
    fn replies_in_fences_and_prose_parse() {
        let reply = "Sure!\n```json\n{\"layouts\": [{\"tp\": 8, \"recompute\": \"full\", \"recomputeLayers\": 2}, {\"pp\": 4, \"vpp\": 2, \"schedule\": \"interleaved\"}]}\n```\nGood luck.";
        let p = parse_reply(reply, &base()).unwrap();
        assert_eq!(p.len(), 2);
        let a = p[0].as_ref().unwrap();
        assert_eq!(
            (a.tp, a.pp, a.recompute, a.recompute_layers),
            (8, 2, Recompute::Full, 2)
        );
        let b = p[1].as_ref().unwrap();
        assert_eq!(
            (b.tp, b.pp, b.vpp, b.schedule),
            (4, 4, 2, Schedule::Interleaved)
        );
    }

    #[test]
    fn bare_lists_and_single_layouts_parse() {
        assert_eq!(parse_reply("[{\"tp\": 1}]", &base()).unwrap().len(), 1);
        let one = parse_reply("{\"tp\": 2, \"microBatchSize\": 4}", &base()).unwrap();
        assert_eq!(one[0].as_ref().unwrap().micro_batch_size, 4);
        let alt = parse_reply("{\"proposals\": [{\"cp\": 2}]}", &base()).unwrap();
        assert_eq!(alt[0].as_ref().unwrap().cp, 2);
    }

    #[test]
    fn bad_entries_and_replies_are_errors_not_panics() {
        let p = parse_reply(
            "{\"layouts\": [{\"tensorParallel\": 2}, 7, {\"tp\": \"eight\"}, {\"tp\": 2}]}",
            &base(),
        )
        .unwrap();
        assert!(p[0].as_ref().unwrap_err().contains("tensorParallel"));
        assert!(p[1].is_err());
        assert!(p[2].is_err());
        assert_eq!(p[3].as_ref().unwrap().tp, 2);
        for bad in [
            "",
            "use TP 8",
            "{\"layouts\": 3}",
            "{\"answer\": \"tp8\"}",
            "\"just a string\"",
            "{unclosed",
        ] {
            assert!(parse_reply(bad, &base()).is_err(), "{bad:?}");
        }
        // A brace in prose before the JSON is skipped.
        let p = parse_reply("Note {this}: [{\"tp\": 8}]", &base()).unwrap();
        assert_eq!(p[0].as_ref().unwrap().tp, 8);
    }
}
