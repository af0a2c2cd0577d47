//! An evolutionary baseline (the one the paper's reviewers asked for): a genetic algorithm over
//! the axes of the space with tournament selection, uniform crossover, per-gene mutation and
//! elitism. The random generator is seeded, so the same plan and seed give the same answer.
//! Fitness is the projected tokens/s per GPU; layouts that break a rule or do not fit score 0.
//! Every decoded layout is a member of the space (full recompute resolves to the fewest layers
//! that fit), so it never beats the exhaustive search.

use super::seed::Scorer;
use super::space::{RecomputeChoice, Structure};
use super::{Context, Outcome, Searcher};
use crate::layout::{Layout, Recompute};
use crate::plan::SearcherKind;

/// SplitMix64 (Steele, Lea and Flood 2014): a small, fast, well-mixed 64-bit generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0), by Lemire's multiply-shift.
    pub fn below(&mut self, n: u32) -> u32 {
        (((self.next_u64() >> 32) * n as u64) >> 32) as u32
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

const GENES: usize = 12;
type Genome = [u32; GENES];

/// The evolutionary searcher.
#[derive(Debug, Clone, Copy)]
pub struct Evolutionary {
    /// Seed of the random generator.
    pub seed: u64,
    /// Individuals per generation.
    pub population: usize,
    /// Generations at most.
    pub generations: usize,
    /// Distinct layouts scored at most.
    pub budget: usize,
    /// Stop after this many generations without a better best.
    pub patience: usize,
    /// Best individuals copied unchanged into the next generation.
    pub elites: usize,
}

impl Default for Evolutionary {
    fn default() -> Self {
        Evolutionary {
            seed: 0x5EED_2026,
            population: 48,
            generations: 80,
            budget: 4000,
            patience: 15,
            elites: 4,
        }
    }
}

fn pick<T: Copy>(list: &[T], gene: u32) -> Option<T> {
    if list.is_empty() {
        None
    } else {
        Some(list[gene as usize % list.len()])
    }
}

/// The layout a genome encodes (`None` when a dependent axis has no value).
fn decode(ctx: &Context<'_>, g: &Genome) -> Option<Layout> {
    let sp = ctx.space;
    let moe = ctx.scenario.model.moe.is_some();
    let tp = pick(&sp.tp, g[0])?;
    let pp = pick(&sp.pp, g[1])?;
    let cp = pick(&sp.cp, g[2])?;
    let vpp = pick(&sp.vpp_values(pp), g[3])?;
    let schedule = pick(&sp.schedule_values(pp, vpp), g[4])?;
    let split = pick(&sp.splits(pp, vpp), g[5])?;
    let ep = pick(&sp.ep, g[6])?;
    let etp = pick(&sp.etp_values(tp, moe), g[7])?;
    let mbs = pick(&sp.micro_batch_size, g[8])?;
    // Every recompute choice but the full layer counts (full is resolved to the fewest
    // layers that fit when scored): none, each selective module set, full.
    let recompute_options: Vec<RecomputeChoice> = sp
        .recompute
        .iter()
        .flat_map(|&r| match r {
            Recompute::None => vec![RecomputeChoice::NONE],
            Recompute::Selective => sp
                .recompute_modules
                .iter()
                .map(|m| RecomputeChoice::selective(*m))
                .collect(),
            Recompute::Full => vec![RecomputeChoice::full(sp.recompute_layers.unwrap_or(0))],
        })
        .collect();
    let rc = pick(&recompute_options, g[9])?;
    let sharding = pick(&sp.sharding, g[10])?;
    let moe_choice = pick(&sp.moe_values(moe, pp, vpp, ep), g[11])?;
    let st = Structure {
        tp,
        pp,
        vpp,
        cp,
        ep,
        etp,
        split,
        schedule,
        sharding,
        moe: moe_choice,
    };
    Some(sp.layout(&st, mbs, rc))
}

impl Evolutionary {
    fn tournament<'p>(
        rng: &mut SplitMix64,
        scored: &'p [(f64, Genome)],
        size: usize,
    ) -> &'p Genome {
        let mut best = &scored[rng.below(scored.len() as u32) as usize];
        for _ in 1..size {
            let c = &scored[rng.below(scored.len() as u32) as usize];
            if c.0 > best.0 {
                best = c;
            }
        }
        &best.1
    }
}

impl Searcher for Evolutionary {
    fn kind(&self) -> SearcherKind {
        SearcherKind::Evolutionary
    }

    fn search(&mut self, ctx: &Context<'_>) -> Outcome {
        let mut rng = SplitMix64::new(self.seed);
        let mut scorer = Scorer::new(ctx.top_k);
        scorer.source = super::trials::Source::Evolutionary;
        let population = self.population.max(4);
        ctx.progress.set_total(self.generations as u64);
        let mut pop: Vec<Genome> = (0..population)
            .map(|_| std::array::from_fn(|_| rng.next_u64() as u32))
            .collect();
        let mut best = 0.0f64;
        let mut stale = 0;
        let mutation = 1.5 / GENES as f64;
        for _ in 0..self.generations {
            if ctx.expired() {
                break;
            }
            // Decode the generation and score its new layouts together (in parallel).
            let decoded: Vec<Option<Layout>> = pop.iter().map(|g| decode(ctx, g)).collect();
            let layouts: Vec<Layout> = decoded.iter().flatten().cloned().collect();
            let mut scores = scorer.score_many(ctx, &layouts).into_iter();
            let mut scored: Vec<(f64, Genome)> = pop
                .iter()
                .zip(&decoded)
                .map(|(g, d)| {
                    let f = match d {
                        Some(_) => scores
                            .next()
                            .flatten()
                            .map_or(0.0, |c| c.tokens_per_second()),
                        None => 0.0,
                    };
                    (f, *g)
                })
                .collect();
            // Best first; equal fitness in genome order, so the order is reproducible.
            scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            ctx.progress.step(1);
            if scored[0].0 > best {
                best = scored[0].0;
                stale = 0;
            } else {
                stale += 1;
            }
            if stale >= self.patience || scorer.unique() >= self.budget {
                break;
            }
            let mut next: Vec<Genome> = scored
                .iter()
                .take(self.elites.min(population))
                .map(|x| x.1)
                .collect();
            while next.len() < population {
                let a = *Self::tournament(&mut rng, &scored, 3);
                let b = *Self::tournament(&mut rng, &scored, 3);
                let mut child: Genome =
                    std::array::from_fn(|i| if rng.chance(0.5) { a[i] } else { b[i] });
                for gene in child.iter_mut() {
                    if rng.chance(mutation) {
                        *gene = if rng.chance(0.5) {
                            // A neighbouring value of the axis.
                            if rng.chance(0.5) {
                                gene.wrapping_add(1)
                            } else {
                                gene.wrapping_sub(1)
                            }
                        } else {
                            rng.next_u64() as u32
                        };
                    }
                }
                next.push(child);
            }
            pop = next;
        }
        scorer.outcome(None)
    }
}
