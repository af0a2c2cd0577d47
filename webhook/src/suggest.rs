//! The nearest legal layouts that fit: a bounded search around the job's own layout. Every
//! move changes one axis (recompute, TP, PP, CP, EP, VPP, micro-batch size, distributed
//! optimizer, sequence parallelism, FSDP); single moves are tried first, then pairs of moves
//! on different axes. Candidates are ranked by how many axes change, then by how large the
//! change is (a cost per move), then by predicted memory. The search stops at its deadline.
//!
//! Activation offloading (`--cpu-offloading-num-layers N`, the fewest layers that fit) is a
//! move too: NVIDIA's Llama 3 70B FSDP recipes on GB200/GB300 fit by offloading 20-40 layers'
//! activations to the host, which no other single move of theirs does as cheaply.
//!
//! Recompute moves include Megatron's selective-recompute modules (`--recompute-modules`): the
//! module lists the tuner tries for the model ([`default_module_sets`]), added to the job's
//! own, priced by how much forward work they rerun, so that e.g. `moe_act layernorm` for an
//! MoE model (element-wise work only) comes before full recompute.

use std::time::Instant;

use primus_oracle::layout::{Layout, ModuleSet, Recompute, RecomputeModule, Schedule};
use primus_oracle::megatron::flag;
use primus_oracle::memory;
use primus_oracle::scenario::Scenario;
use primus_oracle::tune::space::default_module_sets;

/// One change to one axis of a layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    Recompute(Recompute, u32),
    /// Selective recompute of these modules.
    RecomputeModules(ModuleSet),
    Tp(u32),
    Pp(u32),
    Vpp(u32),
    Cp(u32),
    Ep(u32),
    MicroBatch(u32),
    DistributedOptimizer,
    SequenceParallel,
    Fsdp,
    /// Offload the activations of this many layers to the host (`--cpu-offloading-num-layers`).
    ActivationOffload(u32),
}

impl Move {
    /// Which axis the move changes (two moves on one axis never combine).
    fn axis(&self) -> u8 {
        match self {
            Move::Recompute(..) | Move::RecomputeModules(_) => 0,
            Move::Tp(_) => 1,
            Move::Pp(_) => 2,
            Move::Vpp(_) => 3,
            Move::Cp(_) => 4,
            Move::Ep(_) => 5,
            Move::MicroBatch(_) => 6,
            Move::DistributedOptimizer | Move::Fsdp => 7,
            Move::SequenceParallel => 8,
            Move::ActivationOffload(_) => 9,
        }
    }

    fn apply(&self, l: &mut Layout) {
        match *self {
            Move::Recompute(r, n) => {
                l.recompute = r;
                l.recompute_layers = n;
                l.recompute_modules = None;
            }
            Move::RecomputeModules(m) => {
                l.recompute = Recompute::Selective;
                l.recompute_layers = 0;
                l.recompute_modules = Some(m.to_vec());
            }
            Move::Tp(v) => {
                l.tp = v;
                // Megatron's ETP defaults to TP when the flag is not given.
                if l.etp > v {
                    l.etp = v;
                }
            }
            Move::Pp(v) => {
                l.pp = v;
                if v == 1 {
                    l.vpp = 1;
                    l.schedule = Schedule::OneFOneB;
                }
            }
            Move::Vpp(v) => {
                l.vpp = v;
                l.schedule = if v > 1 {
                    Schedule::Interleaved
                } else if l.schedule == Schedule::Interleaved {
                    Schedule::OneFOneB
                } else {
                    l.schedule
                };
            }
            Move::Cp(v) => l.cp = v,
            Move::Ep(v) => l.ep = v,
            Move::MicroBatch(v) => l.micro_batch_size = v,
            Move::DistributedOptimizer => l.distributed_optimizer = true,
            Move::SequenceParallel => l.sequence_parallel = true,
            Move::Fsdp => {
                l.fsdp = true;
                l.distributed_optimizer = false;
            }
            Move::ActivationOffload(n) => l.activation_offload_layers = n,
        }
    }

    /// The Megatron flags that make this change.
    pub fn flags(&self) -> String {
        match *self {
            Move::Recompute(Recompute::Selective, _) => {
                format!("{} selective", flag::RECOMPUTE_GRANULARITY)
            }
            Move::Recompute(Recompute::Full, 0) => format!(
                "{} full {} uniform {} 1",
                flag::RECOMPUTE_GRANULARITY,
                flag::RECOMPUTE_METHOD,
                flag::RECOMPUTE_NUM_LAYERS
            ),
            Move::Recompute(Recompute::Full, n) => format!(
                "{} full {} block {} {n}",
                flag::RECOMPUTE_GRANULARITY,
                flag::RECOMPUTE_METHOD,
                flag::RECOMPUTE_NUM_LAYERS
            ),
            Move::Recompute(Recompute::None, _) => {
                format!("no {}", flag::RECOMPUTE_GRANULARITY)
            }
            Move::RecomputeModules(m) => format!(
                "{} selective {} {}",
                flag::RECOMPUTE_GRANULARITY,
                flag::RECOMPUTE_MODULES,
                m.iter().map(|x| x.as_str()).collect::<Vec<_>>().join(" ")
            ),
            Move::Tp(v) => format!("{} {v}", flag::TP),
            Move::Pp(v) => format!("{} {v}", flag::PP),
            Move::Vpp(1) => format!("no {}", flag::VPP_SIZE),
            Move::Vpp(v) => format!("{} {v}", flag::VPP_SIZE),
            Move::Cp(v) => format!("{} {v}", flag::CP),
            Move::Ep(v) => format!("{} {v}", flag::EP),
            Move::MicroBatch(v) => format!("{} {v}", flag::MBS),
            Move::DistributedOptimizer => flag::DIST_OPT.to_string(),
            Move::SequenceParallel => flag::SP.to_string(),
            Move::Fsdp => flag::FSDP.to_string(),
            Move::ActivationOffload(n) => format!("{} {n}", flag::CPU_OFFLOADING_NUM_LAYERS),
        }
    }
}

/// A layout that fits, and how it differs from the job's.
#[derive(Debug, Clone, PartialEq)]
pub struct Suggestion {
    pub moves: Vec<Move>,
    pub layout: Layout,
    /// Predicted peak bytes of its bottleneck stage.
    pub peak_bytes: f64,
    /// How large the change is (sum of the moves' costs).
    pub cost: f64,
}

impl Suggestion {
    /// The Megatron flags to change, e.g. `--pipeline-model-parallel-size 8`.
    pub fn flags(&self) -> String {
        self.moves
            .iter()
            .map(Move::flags)
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What the search did.
#[derive(Debug, Clone, Default)]
pub struct SearchOutcome {
    /// The best layouts found, best first.
    pub suggestions: Vec<Suggestion>,
    /// Layouts whose memory was predicted.
    pub evaluated: u32,
    /// Whether the deadline stopped the search.
    pub timed_out: bool,
}

fn log2_ratio(a: u32, b: u32) -> f64 {
    ((a.max(1) as f64) / (b.max(1) as f64)).log2().abs()
}

/// Powers of two above `cur` up to `max`, plus `max`'s divisors in between are not needed:
/// parallel sizes in practice are powers of two or divisors of the model's counts.
fn larger_sizes(cur: u32, max: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut v = 1u32;
    while v <= max {
        if v > cur {
            out.push(v);
        }
        match v.checked_mul(2) {
            Some(n) => v = n,
            None => break,
        }
    }
    out
}

/// The cost of recomputing a module, by how much forward work it reruns: element-wise work
/// (`moe_act`, `layernorm`) least, the whole MoE block most.
fn module_cost(m: RecomputeModule) -> f64 {
    match m {
        RecomputeModule::MoeAct | RecomputeModule::Layernorm => 0.25,
        RecomputeModule::CoreAttn | RecomputeModule::MlaUpProj | RecomputeModule::SharedExperts => {
            0.5
        }
        RecomputeModule::Mlp => 1.0,
        RecomputeModule::Moe => 2.0,
    }
}

/// Selective-recompute module moves from `l`: each of the tuner's module lists for the model
/// joined to the job's own modules, when that adds one; cost 0.5 plus the added modules' costs
/// (Megatron's default `[core_attn]` is the plain selective move).
fn module_moves(s: &Scenario, l: &Layout) -> Vec<(Move, f64)> {
    let current = l.recompute_set();
    let mut out: Vec<(Move, f64)> = Vec::new();
    for set in default_module_sets(s) {
        if l.recompute == Recompute::None && set == ModuleSet::DEFAULT {
            continue;
        }
        let next = current.union(set);
        if next == current || out.iter().any(|(m, _)| *m == Move::RecomputeModules(next)) {
            continue;
        }
        let added: f64 = next
            .iter()
            .filter(|m| !current.contains(*m))
            .map(module_cost)
            .sum();
        out.push((Move::RecomputeModules(next), 0.5 + added));
    }
    out
}

/// Single moves from `l`, each with its cost.
fn moves(s: &Scenario, l: &Layout) -> Vec<(Move, f64)> {
    let mut out = Vec::new();
    let layers = s.model.layers;
    let gpus = s.cluster.gpus;
    // Recompute: selective (Megatron's default modules, and the module lists that save more),
    // full for all layers, and full for the fewest layers that fit (added by the caller, which
    // knows the limit).
    match l.recompute {
        Recompute::None => {
            out.push((Move::Recompute(Recompute::Selective, 0), 1.0));
            out.extend(module_moves(s, l));
            out.push((Move::Recompute(Recompute::Full, 0), 3.0));
        }
        Recompute::Selective => {
            out.extend(module_moves(s, l));
            out.push((Move::Recompute(Recompute::Full, 0), 2.5));
        }
        Recompute::Full if l.recompute_layers > 0 => {
            out.push((Move::Recompute(Recompute::Full, 0), 1.5))
        }
        Recompute::Full => {}
    }
    // Tensor parallelism within the scale-up domain.
    let tp_max = s
        .hardware
        .scale_up_domain
        .max(s.cluster.gpus_per_node)
        .min(gpus);
    for v in larger_sizes(l.tp, tp_max) {
        out.push((Move::Tp(v), 0.5 + log2_ratio(v, l.tp)));
    }
    // Pipeline parallelism: any size dividing the GPUs, up to the layer count.
    let mut v = l.pp + 1;
    let pp_max = layers.min(gpus).min(256);
    while v <= pp_max {
        if gpus.is_multiple_of(v) {
            out.push((Move::Pp(v), 0.5 + log2_ratio(v, l.pp)));
        }
        v += 1;
    }
    // Fewer virtual stages keep fewer micro-batches in flight.
    if l.vpp > 1 {
        for v in 1..l.vpp {
            if l.vpp.is_multiple_of(v) || v == 1 {
                out.push((Move::Vpp(v), 0.5 + 0.5 * log2_ratio(v, l.vpp)));
            }
        }
    }
    for v in larger_sizes(l.cp, 16.min(gpus)) {
        out.push((Move::Cp(v), 1.0 + log2_ratio(v, l.cp)));
    }
    if let Some(moe) = &s.model.moe {
        for v in larger_sizes(l.ep, moe.num_experts.min(gpus)) {
            out.push((Move::Ep(v), 0.5 + log2_ratio(v, l.ep)));
        }
    }
    if l.micro_batch_size > 1 {
        let mut v = l.micro_batch_size / 2;
        loop {
            out.push((
                Move::MicroBatch(v),
                0.25 + 0.5 * log2_ratio(v, l.micro_batch_size),
            ));
            if v <= 1 {
                break;
            }
            v /= 2;
        }
    }
    if !l.distributed_optimizer && !l.fsdp {
        out.push((Move::DistributedOptimizer, 0.25));
    }
    if l.tp > 1 && !l.sequence_parallel {
        out.push((Move::SequenceParallel, 0.25));
    }
    if !l.fsdp {
        out.push((Move::Fsdp, 3.0));
    }
    out
}

/// Search layouts near `current` whose predicted peak is at most `limit_bytes`; stop at
/// `deadline`. At most `max` suggestions, best first.
pub fn search(
    s: &Scenario,
    current: &Layout,
    limit_bytes: f64,
    deadline: Instant,
    max: usize,
) -> SearchOutcome {
    let mut search = Search {
        s,
        current,
        limit_bytes,
        deadline,
        out: SearchOutcome::default(),
        found: Vec::new(),
    };
    let mut singles = moves(s, current);
    search.partial_full_recompute();
    search.partial_activation_offload();
    let mut fitting_single: Vec<Move> = search.found.iter().map(|f| f.moves[0]).collect();
    for &m in &singles {
        if search.late() {
            break;
        }
        if let Some(peak) = search.evaluate(&[m])
            && peak <= limit_bytes
        {
            fitting_single.push(m.0);
        }
    }
    // Pairs: only of moves that do not fit alone (a pair containing a fitting move is a
    // larger change than that move).
    singles.retain(|(m, _)| !fitting_single.contains(m));
    if search.found.len() < max {
        search.pairs(&singles);
    }
    let Search {
        mut out, mut found, ..
    } = search;
    found.sort_by(|a, b| {
        a.moves
            .len()
            .cmp(&b.moves.len())
            .then(a.cost.total_cmp(&b.cost))
            .then(a.peak_bytes.total_cmp(&b.peak_bytes))
    });
    // One suggestion per axis combination: the smallest change of its kind.
    let mut kinds: Vec<Vec<u8>> = Vec::new();
    for f in found {
        let mut k: Vec<u8> = f.moves.iter().map(Move::axis).collect();
        k.sort_unstable();
        if kinds.contains(&k) {
            continue;
        }
        kinds.push(k);
        out.suggestions.push(f);
        if out.suggestions.len() >= max {
            break;
        }
    }
    out
}

/// One search: what it evaluated and what fits so far.
struct Search<'a> {
    s: &'a Scenario,
    current: &'a Layout,
    limit_bytes: f64,
    deadline: Instant,
    out: SearchOutcome,
    found: Vec<Suggestion>,
}

impl Search<'_> {
    /// Whether the deadline passed (then the outcome says so).
    fn late(&mut self) -> bool {
        let late = Instant::now() > self.deadline;
        if late {
            self.out.timed_out = true;
        }
        late
    }

    /// Project the layout `ms` make of the current one; keep it when it fits. The predicted
    /// peak, or `None` for no change or an illegal layout.
    fn evaluate(&mut self, ms: &[(Move, f64)]) -> Option<f64> {
        let mut l = self.current.clone();
        for (m, _) in ms {
            m.apply(&mut l);
        }
        if l == *self.current || l.check(self.s).is_err() {
            return None;
        }
        self.out.evaluated += 1;
        let (peak, _) = memory::peak_bytes(self.s, &l);
        if peak.is_finite() && peak <= self.limit_bytes {
            self.found.push(Suggestion {
                moves: ms.iter().map(|(m, _)| *m).collect(),
                layout: l,
                peak_bytes: peak,
                cost: ms.iter().map(|(_, c)| c).sum(),
            });
        }
        Some(peak)
    }

    /// Partial full recompute: the fewest layers per chunk that fit (a smaller change than
    /// recomputing every layer).
    fn partial_full_recompute(&mut self) {
        let current = self.current;
        if current.recompute == Recompute::Full && current.recompute_layers == 0 {
            return;
        }
        let chunk_layers = self.s.model.layers / (current.pp.max(1) * current.vpp.max(1)).max(1);
        let start = if current.recompute == Recompute::Full {
            current.recompute_layers + 1
        } else {
            1
        };
        self.fewest_that_fit(start..chunk_layers, |n| {
            (
                Move::Recompute(Recompute::Full, n),
                1.0 + 1.5 * n as f64 / chunk_layers as f64,
            )
        });
    }

    /// Evaluate `step(n)` for each `n` in order, stopping at the first layout that fits (or at
    /// the deadline): the fewest layers of a per-layer move.
    fn fewest_that_fit(&mut self, ns: std::ops::Range<u32>, step: impl Fn(u32) -> (Move, f64)) {
        for n in ns {
            if self.late() {
                break;
            }
            if let Some(peak) = self.evaluate(&[step(n)])
                && peak <= self.limit_bytes
            {
                break;
            }
        }
    }

    /// Activation offloading: the fewest layers that fit (Megatron offloads the first N layers'
    /// activations; it runs without pipeline parallelism and without recompute, so it is tried
    /// only from such a layout). Cheaper than recomputing as many layers: the copies overlap
    /// the next layers' compute.
    fn partial_activation_offload(&mut self) {
        let current = self.current;
        let layers = self.s.model.layers;
        if current.pp > 1 || current.recompute != Recompute::None {
            return;
        }
        self.fewest_that_fit(current.activation_offload_layers + 1..layers, |n| {
            (Move::ActivationOffload(n), 1.0 + n as f64 / layers as f64)
        });
    }

    /// Every pair of moves on different axes.
    fn pairs(&mut self, singles: &[(Move, f64)]) {
        for (i, a) in singles.iter().enumerate() {
            for b in &singles[i + 1..] {
                if a.0.axis() == b.0.axis() {
                    continue;
                }
                if self.late() {
                    return;
                }
                self.evaluate(&[*a, *b]);
            }
        }
    }
}
