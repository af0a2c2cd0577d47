//! The agent searcher's guarantees, whatever the model says: over random plans and random
//! replies (layouts with random values on every axis and on the options beyond the grid,
//! garbage text, reasoning blocks, failed requests), the agent never returns a layout that
//! breaks a legality rule or fails the memory pre-filter, never returns less than the seed
//! planner it starts from, and records a trial with a verdict for every proposal it read. A
//! proposer that reads the prompt (the best layout shown, one overlap switch turned on) shows
//! the agent reaching what the grid cannot.

use primus_oracle::layout::Layout;
use primus_oracle::plan::{Plan, SearcherKind, parse_plan};
use primus_oracle::profiles::Catalog;
use primus_oracle::tune::agent::{AgentSearcher, ChatMessage, ProposeError, Proposer};
use primus_oracle::tune::prefilter::Prefilter;
use primus_oracle::tune::trials::{Source, Verdict};
use primus_oracle::tune::{TuneOptions, TuneResult, tune, tune_plan};
use proptest::prelude::*;
use serde_json::{Value, json};

fn plan_of(model: &str, gpu: &str, gpus: u32, seq: u64, gbs: u64, extra: &str) -> Plan {
    parse_plan(
        &format!(
            "spec:\n  model: {{preset: {model}}}\n  cluster: {{gpu: {gpu}, gpus: {gpus}}}\n  training: {{seqLength: {seq}, globalBatchSize: {gbs}}}\n{extra}"
        ),
        "agent.yaml",
        &Catalog::builtin().unwrap(),
    )
    .expect("test plan parses")
}

/// SplitMix64: the proposer's own randomness, seeded by proptest.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[(self.next() % v.len() as u64) as usize].clone()
    }
}

/// A model that answers at random: layouts with random values (legal or not), garbage,
/// reasoning blocks, errors.
struct RandomModel(Rng);

impl RandomModel {
    fn layout(&mut self) -> Value {
        let r = &mut self.0;
        let mut l = json!({
            "tp": r.pick(&[1, 2, 3, 4, 8, 16, 64]),
            "pp": r.pick(&[1, 2, 4, 5, 8]),
            "microBatchSize": r.pick(&[1, 2, 4, 7, 64]),
            "recompute": r.pick(&["none", "selective", "full"]),
            "sequenceParallel": r.pick(&[true, false]),
            "tpCommOverlap": r.pick(&[true, false]),
            "overlapGradReduce": r.pick(&[true, false]),
            "overlapParamGather": r.pick(&[true, false]),
        });
        if r.next().is_multiple_of(3) {
            l["firstStageLayers"] = json!(r.pick(&[0, 1, 3, 15, 200]));
        }
        if r.next().is_multiple_of(3) {
            l["recomputeModules"] = json!(r.pick(&[
                json!(["mlp"]),
                json!(["moe_act", "layernorm"]),
                json!(["core_attn", "mlp", "shared_experts"]),
                json!(["mla_up_proj"]),
            ]));
        }
        if r.next().is_multiple_of(4) {
            l["vpp"] = json!(r.pick(&[2, 3, 4]));
            l["schedule"] = json!("interleaved");
        }
        l
    }
}

impl Proposer for RandomModel {
    fn complete(&mut self, _: &[ChatMessage]) -> Result<String, ProposeError> {
        Ok(match self.0.next() % 8 {
            0 => "I am not sure; try more tensor parallelism.".into(),
            1 => return Err(ProposeError::Transport("HTTP 500".into())),
            2 => format!(
                "<think>{}</think>\n```json\n{}\n```",
                json!({"layouts": [{"tp": 4096}]}),
                json!({"layouts": [self.layout()]})
            ),
            3 => "{\"layouts\": [{\"tensorParallel\": 2}, 7, null]}".into(),
            _ => json!({"layouts": (0..3).map(|_| self.layout()).collect::<Vec<_>>()}).to_string(),
        })
    }
}

fn agent(p: &Plan, model: Box<dyn Proposer>, rounds: u32) -> TuneResult {
    let mut a = AgentSearcher::new(model, rounds);
    a.max_consecutive_failures = rounds;
    tune(p, Some(&mut a), &TuneOptions::default()).expect("the agent run completes")
}

fn tps(r: &TuneResult) -> Option<f64> {
    r.best
        .as_ref()
        .map(|b| b.projection.tokens_per_second_per_gpu)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn the_agent_returns_only_legal_fitting_layouts_no_worse_than_the_seed(
        model in prop::sample::select(vec!["llama3.1-8b", "llama3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b"]),
        gpu in prop::sample::select(vec!["h100-sxm", "mi300x", "mi355x"]),
        gpus in prop::sample::select(vec![8u32, 16, 32]),
        seq in prop::sample::select(vec![2048u64, 4096]),
        gbs in prop::sample::select(vec![32u64, 128]),
        seed in any::<u64>(),
    ) {
        let p = plan_of(model, gpu, gpus, seq, gbs, "  tuning: {memoryHeadroom: 0.92}\n");
        let r = agent(&p, Box::new(RandomModel(Rng(seed))), 4);
        let seeded = tps(&tune_plan(&p, SearcherKind::Seed).unwrap());
        prop_assert_eq!(r.best.is_some(), seeded.is_some());
        let filter = Prefilter::new(&p.scenario, p.tuning.memory_headroom);
        for c in &r.top {
            prop_assert!(filter.check(&p.scenario, &c.layout).is_ok(),
                "{} fails the rules or memory", c.label);
        }
        if let (Some(got), Some(s)) = (tps(&r), seeded) {
            prop_assert!(got >= s, "agent {} < seed {}", got, s);
        }
        // Every proposal read has exactly one trial with a verdict.
        let a = r.agent.clone().unwrap();
        let agent_trials: Vec<_> = r.trials.iter().filter(|t| t.source == Source::Agent).collect();
        prop_assert_eq!(
            agent_trials.len() as u32,
            a.proposals + a.malformed_replies,
            "{:?}", a
        );
        let count = |v: Verdict| agent_trials.iter().filter(|t| t.verdict == v).count() as u32;
        prop_assert_eq!(count(Verdict::Scored), a.scored);
        prop_assert_eq!(count(Verdict::RejectedByRule), a.rejected_by_rules);
        prop_assert_eq!(count(Verdict::RejectedByMemory), a.rejected_by_memory);
        prop_assert_eq!(count(Verdict::OutsideSpace), a.outside_space);
        prop_assert_eq!(count(Verdict::Repeated), a.repeated);
        prop_assert_eq!(count(Verdict::Malformed), a.malformed_proposals + a.malformed_replies);
        // The decoy inside <think> is never read: no proposal asks for TP 4096.
        prop_assert!(agent_trials.iter().all(|t| t.proposed.as_ref().or(t.layout.as_ref()).is_none_or(|l| l.tp != 4096)));
        // Best so far never falls and ends at the best reported.
        let mut last = 0.0f64;
        for t in &r.trials {
            if let Some(b) = t.best_so_far {
                prop_assert!(b >= last);
                last = b;
            }
        }
        if let Some(got) = tps(&r) {
            prop_assert!((last - got).abs() <= 1e-9 * got.max(1.0) || last >= got);
        }
    }
}

/// A model that reads the prompt: the best layout shown, with the gradient-reduce and
/// parameter-gather overlaps turned on.
struct Reader;

impl Proposer for Reader {
    fn complete(&mut self, messages: &[ChatMessage]) -> Result<String, ProposeError> {
        let prompt = &messages.last().unwrap().content;
        let best: Value = prompt
            .lines()
            .find(|l| l.starts_with("1. "))
            .and_then(|l| l.split_once(" json "))
            .and_then(|(_, j)| serde_json::from_str(j).ok())
            .ok_or_else(|| ProposeError::Protocol("no layout in the prompt".into()))?;
        let mut l = best;
        l["overlapGradReduce"] = json!(true);
        l["overlapParamGather"] = json!(true);
        Ok(json!({"layouts": [l]}).to_string())
    }
}

#[test]
fn an_agent_that_sets_an_option_the_grid_holds_fixed_beats_the_exhaustive_search() {
    // The reference turns both data-parallel overlaps off; the grid keeps that for every
    // candidate, the agent may turn them on (with the distributed optimizer: FSDP's gathers do
    // not depend on them).
    let p = plan_of(
        "llama3.1-8b",
        "h100-sxm",
        16,
        4096,
        64,
        "  parallelism: {tp: 2, overlapGradReduce: false, overlapParamGather: false}\n  tuning: {fixed: {fsdp: false}}\n",
    );
    let exhaustive = tune_plan(&p, SearcherKind::Exhaustive).unwrap();
    let e = exhaustive.best.as_ref().unwrap();
    assert!(
        !e.layout.overlap_grad_reduce,
        "the grid keeps the reference's switches"
    );
    let r = agent(&p, Box::new(Reader), 2);
    let a = r.agent.clone().unwrap();
    assert!(a.beyond_grid >= 1, "{a:?}");
    let best: &Layout = &r.best.as_ref().unwrap().layout;
    assert!(
        best.overlap_grad_reduce && best.overlap_param_gather,
        "{best:?}"
    );
    assert!(
        tps(&r).unwrap() > tps(&exhaustive).unwrap(),
        "agent {} vs exhaustive {}",
        tps(&r).unwrap(),
        tps(&exhaustive).unwrap()
    );
    // The trial says what was set beyond the grid.
    let t = r
        .trials
        .iter()
        .find(|t| t.source == Source::Agent && t.verdict == Verdict::Scored)
        .expect("an agent trial scored");
    assert_eq!(t.round, Some(1));
    assert!(
        t.beyond_grid.contains(&"overlapGradReduce".to_string()),
        "{t:?}"
    );
    // Pinned sequence parallelism stays pinned: a proposal changing it keeps the plan's value.
    let pinned = plan_of(
        "llama3.1-8b",
        "h100-sxm",
        16,
        4096,
        64,
        "  parallelism: {tp: 2}\n  tuning: {fixed: {sequenceParallel: true}}\n",
    );
    struct SpOff;
    impl Proposer for SpOff {
        fn complete(&mut self, _: &[ChatMessage]) -> Result<String, ProposeError> {
            Ok(json!({"layouts": [{"sequenceParallel": false, "microBatchSize": 2}]}).to_string())
        }
    }
    let r = agent(&pinned, Box::new(SpOff), 1);
    assert!(r.top.iter().all(|c| c.layout.sequence_parallel));
}
