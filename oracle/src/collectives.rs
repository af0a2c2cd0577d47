//! Alpha-beta models of the collectives a Megatron-style job runs (all-reduce, reduce-scatter,
//! all-gather, all-to-all, point-to-point) on a two-tier topology: a fast scale-up domain
//! (NVLink / xGMI, `scaleUpDomain` GPUs) and a per-GPU scale-out NIC between domains.
//!
//! Ranks are placed in Megatron's default order (`tp-cp-ep-dp-pp`): TP innermost, then CP,
//! then DP, PP outermost; the expert grid of one pipeline stage is re-folded as ETP innermost,
//! then EP, then expert-DP. A group is an arithmetic progression of ranks (`size` members,
//! `stride` apart); from that and the domain size we know how many of its members share a
//! domain, hence which tier a collective pays.
//!
//! Conventions (NCCL's, see nccl-tests `doc/PERFORMANCE.md`): `bytes` is the buffer size per
//! rank (all-reduce: the buffer reduced; reduce-scatter: the input; all-gather: the output;
//! all-to-all: everything one rank sends, its own share included). Bandwidths are effective
//! unidirectional bytes/s per GPU (link bandwidth times the profile's collective efficiency).

use crate::hardware::HardwareProfile;
use crate::layout::Layout;
use crate::scenario::Scenario;

/// One tier of the topology.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tier {
    /// Effective bandwidth per GPU, one direction, bytes/s.
    pub bandwidth: f64,
    /// Per-message latency, seconds (the alpha of alpha-beta).
    pub latency: f64,
}

/// A two-tier topology.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Topology {
    /// GPUs in one scale-up domain (8 on an HGX/OAM board, 72 on NVL72).
    pub domain: u32,
    /// Inside a domain.
    pub up: Tier,
    /// Between domains, through each GPU's own NIC.
    pub out: Tier,
    /// Measured corrections of the scale-up tier per collective (benchmark calibration);
    /// empty for the analytic model.
    pub links: LinkCalibration,
}

impl Topology {
    /// The topology of a profile: link figures times the collective efficiencies. The domain is
    /// the profile's scale-up domain when it spans several nodes (NVL72); otherwise the node as
    /// the cluster declares it (`spec.cluster.gpusPerNode`).
    pub fn of(hw: &HardwareProfile, gpus_per_node: u32) -> Topology {
        let domain = if hw.scale_up_domain > hw.gpus_per_node {
            hw.scale_up_domain
        } else {
            gpus_per_node.max(1)
        };
        let e = &hw.efficiency;
        Topology {
            domain,
            up: Tier {
                bandwidth: hw.scale_up.bytes_per_second() * e.collective,
                latency: hw.scale_up.latency_seconds(),
            },
            out: Tier {
                bandwidth: hw.scale_out.bytes_per_second() * e.scale_out_collective(),
                latency: hw.scale_out.latency_seconds(),
            },
            links: LinkCalibration::default(),
        }
    }

    /// The topology of a scenario. A job larger than one multi-node scale-up domain (NVL72) is
    /// taken to occupy equal, node-aligned blocks of its domains: the largest multiple of
    /// `gpusPerNode` that divides the job and fits in a domain (256 GPUs on NVL72 racks: 4 x 64,
    /// as topology-aware schedulers place blocks), so power-of-two groups do not straddle racks.
    pub fn of_scenario(s: &Scenario) -> Topology {
        let mut t = Topology::of(&s.hardware, s.cluster.gpus_per_node);
        t.domain = job_domain(t.domain, s.cluster.gpus, s.cluster.gpus_per_node);
        t
    }

    /// Place a group of `size` ranks `stride` apart among `world` ranks.
    pub fn group(&self, world: u32, size: u32, stride: u32) -> Group {
        Group::place(world, size, stride, self.domain)
    }

    /// Bus bandwidth of a ring over `g`: a ring that leaves the domain is limited by the NICs
    /// of the members inside one domain, which carry the ring's crossing traffic between them
    /// (NCCL runs one ring per channel, each crossing at a different GPU's NIC).
    pub fn ring_bandwidth(&self, g: &Group) -> f64 {
        if g.domains <= 1 {
            self.up.bandwidth
        } else {
            self.up
                .bandwidth
                .min(g.per_domain as f64 * self.out.bandwidth)
        }
    }

    /// Latency of one step of a collective over `g`: the slower tier when it leaves a domain.
    pub fn latency(&self, g: &Group) -> f64 {
        if g.domains <= 1 {
            self.up.latency
        } else {
            self.out.latency
        }
    }
}

/// GPUs of a `gpus`-GPU job in one scale-up domain of `domain` GPUs: the whole job when it
/// fits, else the largest multiple of `node` that divides `gpus` and fits in `domain` (the
/// domain itself when nothing does).
pub fn job_domain(domain: u32, gpus: u32, node: u32) -> u32 {
    let node = node.max(1);
    if gpus <= domain {
        return domain;
    }
    let mut best = 0;
    let mut d = node;
    while d <= domain {
        if gpus.is_multiple_of(d) {
            best = d;
        }
        d += node;
    }
    if best == 0 { domain } else { best }
}

/// A communicator: `size` ranks, `stride` apart in the global rank order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub size: u32,
    pub stride: u32,
    /// Scale-up domains the worst group of this kind spans (1 = all inside one domain).
    pub domains: u32,
    /// Fewest members of the worst group that share one domain.
    pub per_domain: u32,
}

impl Group {
    /// A group of one rank (no communication).
    pub const SINGLE: Group = Group {
        size: 1,
        stride: 1,
        domains: 1,
        per_domain: 1,
    };

    /// Place the groups of `size` members `stride` apart among `world` ranks in domains of
    /// `domain` consecutive ranks, and describe the worst of them.
    pub fn place(world: u32, size: u32, stride: u32, domain: u32) -> Group {
        let size = size.max(1);
        let stride = stride.max(1);
        let domain = domain.max(1);
        if size == 1 {
            return Group::SINGLE;
        }
        // Span of one group in rank numbers: first to last member.
        let span = (size - 1) as u64 * stride as u64 + 1;
        let block = size as u64 * stride as u64;
        if stride >= domain {
            // Consecutive members are a domain or more apart: each lives in its own domain.
            return Group {
                size,
                stride,
                domains: size,
                per_domain: 1,
            };
        }
        if (domain as u64).is_multiple_of(block) {
            // Blocks of `size * stride` ranks tile each domain: every group is inside one.
            return Group {
                size,
                stride,
                domains: 1,
                per_domain: size,
            };
        }
        if block.is_multiple_of(domain as u64) {
            // Each group covers whole domains, `domain / stride` members in each.
            let per = (domain / stride).max(1);
            return Group {
                size,
                stride,
                domains: size.div_ceil(per),
                per_domain: per,
            };
        }
        // Irregular (e.g. 16-rank groups on 72-GPU NVL72 domains): look at every group.
        let _ = span;
        let mut worst = Group {
            size,
            stride,
            domains: 1,
            per_domain: size,
        };
        let world = world.max(size * stride) as u64;
        let blocks = world / block;
        for b in 0..blocks {
            for inner in 0..stride as u64 {
                let first = b * block + inner;
                let (domains, per) = members_per_domain(first, size as u64, stride as u64, domain);
                if domains > worst.domains || (domains == worst.domains && per < worst.per_domain) {
                    worst.domains = domains;
                    worst.per_domain = per;
                }
            }
        }
        worst
    }
}

/// Domains spanned by the group starting at `first`, and the fewest members in one of them.
fn members_per_domain(first: u64, size: u64, stride: u64, domain: u32) -> (u32, u32) {
    let d = domain as u64;
    let last = first + (size - 1) * stride;
    let (d0, d1) = (first / d, last / d);
    if d0 == d1 {
        return (1, size as u32);
    }
    // Members in the first domain: ranks first, first+stride, ... below (d0+1)*d.
    let in_first = ((d0 + 1) * d - first).div_ceil(stride);
    // Members in the last domain: ranks at or above d1*d.
    let in_last = (last - d1 * d) / stride + 1;
    let mut fewest = in_first.min(in_last);
    if d1 > d0 + 1 {
        fewest = fewest.min(d / stride);
    }
    ((d1 - d0 + 1) as u32, fewest.max(1) as u32)
}

/// Collective algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// One flat ring over all members (bus bandwidth of the slowest tier it crosses).
    Ring,
    /// Reduce-scatter inside each domain, ring across domains on the shard, all-gather inside.
    Hierarchical,
}

/// Ring all-reduce: 2(n-1)/n * S / B + 2(n-1) * alpha (Patarasuk & Yuan 2009; NCCL busbw).
pub fn all_reduce_ring(topo: &Topology, g: &Group, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::AllReduce, g.in_domain(), bytes);
    let n = g.size as f64;
    if g.size <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    2.0 * (n - 1.0) / n * bytes / topo.ring_bandwidth(g) + 2.0 * (n - 1.0) * topo.latency(g)
}

/// Hierarchical all-reduce over k members per domain and m domains: intra-domain
/// reduce-scatter (k-1)/k * S / B_up, inter-domain ring all-reduce of the S/k shard over each
/// GPU's NIC 2(m-1)/m * (S/k) / B_out, intra-domain all-gather (k-1)/k * S / B_up; latencies
/// 2(k-1) alpha_up + 2(m-1) alpha_out. Falls back to the ring inside one domain.
pub fn all_reduce_hierarchical(topo: &Topology, g: &Group, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::AllReduce, g.in_domain(), bytes);
    if g.size <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    if g.domains <= 1 {
        return all_reduce_ring(topo, g, bytes);
    }
    let k = g.per_domain as f64;
    let m = (g.size as f64 / k).ceil();
    let intra = 2.0 * (k - 1.0) / k * bytes / topo.up.bandwidth + 2.0 * (k - 1.0) * topo.up.latency;
    let inter =
        2.0 * (m - 1.0) / m * (bytes / k) / topo.out.bandwidth + 2.0 * (m - 1.0) * topo.out.latency;
    intra + inter
}

/// All-reduce with a given algorithm.
pub fn all_reduce_with(topo: &Topology, g: &Group, bytes: f64, alg: Algorithm) -> f64 {
    match alg {
        Algorithm::Ring => all_reduce_ring(topo, g, bytes),
        Algorithm::Hierarchical => all_reduce_hierarchical(topo, g, bytes),
    }
}

/// All-reduce: the faster of ring and hierarchical (NCCL/RCCL tune the algorithm per size).
pub fn all_reduce(topo: &Topology, g: &Group, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::AllReduce, g.in_domain(), bytes);
    all_reduce_ring(topo, g, bytes).min(all_reduce_hierarchical(topo, g, bytes))
}

/// Ring reduce-scatter of an S-byte input: (n-1)/n * S / B + (n-1) * alpha.
pub fn reduce_scatter_ring(topo: &Topology, g: &Group, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::ReduceScatter, g.in_domain(), bytes);
    let n = g.size as f64;
    if g.size <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    (n - 1.0) / n * bytes / topo.ring_bandwidth(g) + (n - 1.0) * topo.latency(g)
}

/// Hierarchical reduce-scatter: intra-domain (k-1)/k * S / B_up, then across domains
/// (m-1)/m * (S/k) / B_out; latencies (k-1) alpha_up + (m-1) alpha_out.
pub fn reduce_scatter_hierarchical(topo: &Topology, g: &Group, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::ReduceScatter, g.in_domain(), bytes);
    if g.size <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    if g.domains <= 1 {
        return reduce_scatter_ring(topo, g, bytes);
    }
    let k = g.per_domain as f64;
    let m = (g.size as f64 / k).ceil();
    (k - 1.0) / k * bytes / topo.up.bandwidth
        + (k - 1.0) * topo.up.latency
        + (m - 1.0) / m * (bytes / k) / topo.out.bandwidth
        + (m - 1.0) * topo.out.latency
}

/// Reduce-scatter: the faster algorithm.
pub fn reduce_scatter(topo: &Topology, g: &Group, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::ReduceScatter, g.in_domain(), bytes);
    reduce_scatter_ring(topo, g, bytes).min(reduce_scatter_hierarchical(topo, g, bytes))
}

/// All-gather into an S-byte output: the mirror image of reduce-scatter, same cost
/// ((n-1)/n * S / B + (n-1) * alpha for the ring).
pub fn all_gather(topo: &Topology, g: &Group, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::AllGather, g.in_domain(), bytes);
    reduce_scatter(topo, g, bytes)
}

/// All-to-all where each rank sends S bytes in total, S/n to every member: the (k-1)/n * S
/// bound for peers in its domain goes over the scale-up links, the (n-k)/n * S for the other
/// domains over its own NIC, both at once; plus (n-1) alpha of the slower tier (pairwise
/// exchange).
pub fn all_to_all(topo: &Topology, g: &Group, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::AllToAll, g.in_domain(), bytes);
    let n = g.size as f64;
    if g.size <= 1 || bytes <= 0.0 {
        return 0.0;
    }
    let k = if g.domains <= 1 {
        n
    } else {
        g.per_domain as f64
    };
    let intra = (k - 1.0) / n * bytes / topo.up.bandwidth;
    let inter = (n - k) / n * bytes / topo.out.bandwidth;
    intra.max(inter) + (n - 1.0) * topo.latency(g)
}

/// One point-to-point message of S bytes: alpha + S / B of the tier it crosses.
pub fn p2p(topo: &Topology, crosses_domain: bool, bytes: f64) -> f64 {
    let topo = &*topo.seen_by(Collective::P2p, 2, bytes);
    if bytes <= 0.0 {
        return 0.0;
    }
    let tier = if crosses_domain { topo.out } else { topo.up };
    tier.latency + bytes / tier.bandwidth
}

/// The collectives whose in-domain bandwidth a single-node benchmark measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    AllToAll,
    /// One point-to-point message (pipeline and context-parallel exchanges).
    P2p,
}

impl Collective {
    pub const ALL: [Collective; 5] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::AllToAll,
        Collective::P2p,
    ];

    /// The name benchmark reports use (`CollectiveMeasurement::op`).
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all-reduce",
            Collective::ReduceScatter => "reduce-scatter",
            Collective::AllGather => "all-gather",
            Collective::AllToAll => "all-to-all",
            Collective::P2p => "p2p",
        }
    }

    pub fn from_name(name: &str) -> Option<Collective> {
        Collective::ALL.into_iter().find(|c| c.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }

    /// Kinds whose measurement stands in when this one was not measured: a ring all-reduce is
    /// a reduce-scatter and an all-gather over the same links, and those two mirror each other.
    fn stand_ins(self) -> &'static [Collective] {
        match self {
            Collective::AllReduce => &[Collective::ReduceScatter, Collective::AllGather],
            Collective::ReduceScatter => &[Collective::AllGather, Collective::AllReduce],
            Collective::AllGather => &[Collective::ReduceScatter, Collective::AllReduce],
            Collective::AllToAll | Collective::P2p => &[],
        }
    }
}

/// One measured correction: collective `kind` over `members` GPUs of one domain with a
/// `bytes` buffer ran at `factor` times the analytic scale-up bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkPoint {
    pub members: u32,
    pub bytes: f64,
    pub factor: f64,
}

/// Measured corrections of the scale-up tier (benchmark calibration, `calibrate.rs`): per
/// collective kind, up to [`LinkCalibration::POINTS`] measured (members, bytes, factor) points.
/// A collective over `n` members of one domain uses the points of the nearest measured member
/// count (in log2), interpolated linearly in log(bytes) and clamped at the ends; a kind with no
/// points borrows its stand-ins' ([`Collective`]); with none at all the analytic bandwidth
/// stays. Fixed size, so [`Topology`] stays `Copy`; empty (the default) costs one branch.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkCalibration {
    points: [[LinkPoint; LinkCalibration::POINTS]; 5],
    len: [u8; 5],
}

impl LinkCalibration {
    /// Points kept per collective kind.
    pub const POINTS: usize = 8;

    /// No corrections.
    pub fn is_empty(&self) -> bool {
        self.len == [0; 5]
    }

    /// Add a measured point; a point with the same members and bytes is replaced. Returns
    /// false (and keeps what it has) when the kind already holds [`Self::POINTS`] points or
    /// the point is not finite and positive.
    pub fn add(&mut self, kind: Collective, point: LinkPoint) -> bool {
        if !(point.factor.is_finite() && point.factor > 0.0 && point.bytes > 0.0)
            || point.members < 2
        {
            return false;
        }
        let i = kind.index();
        let n = self.len[i] as usize;
        if let Some(p) = self.points[i][..n]
            .iter_mut()
            .find(|p| p.members == point.members && p.bytes == point.bytes)
        {
            *p = point;
            return true;
        }
        if n == Self::POINTS {
            return false;
        }
        self.points[i][n] = point;
        self.len[i] += 1;
        true
    }

    /// The measured points of one kind.
    pub fn points(&self, kind: Collective) -> &[LinkPoint] {
        let i = kind.index();
        &self.points[i][..self.len[i] as usize]
    }

    /// The factor for `kind` over `members` in-domain GPUs and a `bytes` buffer, and the kind
    /// and member count it was measured at; `None` when neither the kind nor its stand-ins
    /// were measured.
    pub fn lookup(
        &self,
        kind: Collective,
        members: u32,
        bytes: f64,
    ) -> Option<(f64, Collective, u32)> {
        let source = std::iter::once(kind)
            .chain(kind.stand_ins().iter().copied())
            .find(|k| self.len[k.index()] > 0)?;
        let pts = self.points(source);
        let want = (members.max(1) as f64).log2();
        // Nearest measured member count; ties go to the larger group.
        let nearest = pts.iter().map(|p| p.members).min_by(|a, b| {
            let da = ((*a as f64).log2() - want).abs();
            let db = ((*b as f64).log2() - want).abs();
            da.total_cmp(&db).then(b.cmp(a))
        })?;
        let x = bytes.max(1.0).ln();
        let (mut below, mut above): (Option<&LinkPoint>, Option<&LinkPoint>) = (None, None);
        for p in pts.iter().filter(|p| p.members == nearest) {
            let px = p.bytes.ln();
            if px <= x && below.is_none_or(|b| px > b.bytes.ln()) {
                below = Some(p);
            }
            if px >= x && above.is_none_or(|a| px < a.bytes.ln()) {
                above = Some(p);
            }
        }
        let factor = match (below, above) {
            (Some(b), Some(a)) if a.bytes > b.bytes => {
                let t = (x - b.bytes.ln()) / (a.bytes.ln() - b.bytes.ln());
                b.factor + t * (a.factor - b.factor)
            }
            (Some(p), _) | (None, Some(p)) => p.factor,
            (None, None) => return None,
        };
        Some((factor, source, nearest))
    }
}

impl Group {
    /// Members of the worst group that share one scale-up domain: the GPUs whose exchange runs
    /// over the scale-up links.
    pub fn in_domain(&self) -> u32 {
        if self.domains <= 1 {
            self.size
        } else {
            self.per_domain
        }
    }
}

impl Topology {
    /// The topology collective `kind` over `members` in-domain GPUs with a `bytes` buffer sees:
    /// the scale-up bandwidth times its measured factor (unchanged without one), and no
    /// further corrections (so nested calls do not apply them twice). Borrowed, without a
    /// copy, when there are no corrections.
    pub fn seen_by(
        &self,
        kind: Collective,
        members: u32,
        bytes: f64,
    ) -> std::borrow::Cow<'_, Topology> {
        if self.links.is_empty() {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut t = *self;
        if let Some((f, _, _)) = self.links.lookup(kind, members, bytes) {
            t.up.bandwidth *= f;
        }
        t.links = LinkCalibration::default();
        std::borrow::Cow::Owned(t)
    }
}

/// The communicators of one layout, placed in Megatron's default rank order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    /// Tensor parallel: stride 1.
    pub tp: Group,
    /// Context parallel: stride tp.
    pub cp: Group,
    /// Data parallel with context parallel (dense gradients, distributed optimizer): stride tp,
    /// size cp * dp.
    pub dp_cp: Group,
    /// Expert tensor parallel: stride 1.
    pub etp: Group,
    /// Expert parallel: stride etp.
    pub ep: Group,
    /// Expert data parallel (expert gradients): stride etp * ep.
    pub edp: Group,
    /// Tensor x expert parallel (the allgather MoE dispatcher's group): stride 1.
    pub tp_ep: Group,
    /// Pipeline: stride tp * cp * dp.
    pub pp: Group,
    /// Whether a pipeline hop leaves the scale-up domain.
    pub pp_crosses_domain: bool,
}

impl Placement {
    /// Place a layout with data-parallel size `dp` on `world` GPUs.
    pub fn of(topo: &Topology, world: u32, l: &Layout, dp: u32) -> Placement {
        let stage = l.tp * l.cp * dp;
        let expert_grid = (l.ep * l.etp).max(1);
        let edp = (stage / expert_grid).max(1);
        let pp = topo.group(world, l.pp, stage);
        Placement {
            tp: topo.group(world, l.tp, 1),
            cp: topo.group(world, l.cp, l.tp),
            dp_cp: topo.group(world, l.cp * dp, l.tp),
            etp: topo.group(world, l.etp, 1),
            ep: topo.group(world, l.ep, l.etp),
            edp: topo.group(world, edp, expert_grid),
            tp_ep: topo.group(world, (l.tp * l.ep).min(stage.max(1)), 1),
            pp,
            pp_crosses_domain: pp.domains > 1,
        }
    }
}
