//! The collective models against hand-derived alpha-beta values.

use primus_oracle::collectives::{
    self, Group, Placement, Tier, Topology, all_gather, all_reduce, all_reduce_hierarchical,
    all_reduce_ring, all_to_all, job_domain, p2p, reduce_scatter,
};
use primus_oracle::layout::Layout;

/// A round-number topology: 8-GPU domains, 100 GB/s and 1 us inside, 10 GB/s and 5 us out.
fn topo() -> Topology {
    Topology {
        domain: 8,
        up: Tier {
            bandwidth: 100e9,
            latency: 1e-6,
        },
        out: Tier {
            bandwidth: 10e9,
            latency: 5e-6,
        },
        links: Default::default(),
    }
}

const GB: f64 = 1e9;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 + 1e-9 * b.abs()
}

#[test]
fn ring_all_reduce_inside_a_domain() {
    // n = 8 in one domain, S = 1 GB: 2(n-1)/n * S/B + 2(n-1) alpha
    // = 2 * 7/8 * 1e9 / 100e9 + 14 * 1e-6 = 0.0175 + 0.000014 = 0.017514 s.
    let t = topo();
    let g = t.group(64, 8, 1);
    assert_eq!(
        g,
        Group {
            size: 8,
            stride: 1,
            domains: 1,
            per_domain: 8
        }
    );
    assert!(close(all_reduce_ring(&t, &g, GB), 0.017514));
    // Inside one domain the hierarchical algorithm is the ring.
    assert!(close(all_reduce(&t, &g, GB), 0.017514));
}

#[test]
fn reduce_scatter_and_all_gather_are_half_an_all_reduce() {
    // (n-1)/n * S/B + (n-1) alpha = 7/8 * 0.01 + 7e-6 = 0.008757 s.
    let t = topo();
    let g = t.group(64, 8, 1);
    assert!(close(reduce_scatter(&t, &g, GB), 0.008757));
    assert!(close(all_gather(&t, &g, GB), 0.008757));
}

#[test]
fn a_ring_across_domains_is_limited_by_the_nics_of_one_domain() {
    // 16 consecutive ranks on 8-GPU domains: 2 domains of 8. A flat ring's crossing traffic
    // shares the 8 NICs of a domain: bus bandwidth min(100, 8 * 10) = 80 GB/s, latency of the
    // slower tier: 2 * 15/16 * 1e9 / 80e9 + 30 * 5e-6 = 0.0234375 + 0.00015 = 0.0235875 s.
    let t = topo();
    let g = t.group(64, 16, 1);
    assert_eq!((g.domains, g.per_domain), (2, 8));
    assert!(close(all_reduce_ring(&t, &g, GB), 0.0235875));
    // Hierarchical: reduce-scatter + all-gather inside the domain 2 * 7/8 * 1e9 / 100e9 +
    // 14 * 1e-6 = 0.017514, ring all-reduce of the 1/8 shard across the 2 domains over each
    // GPU's NIC 2 * 1/2 * 0.125e9 / 10e9 + 2 * 5e-6 = 0.012510: 0.030024 s.
    assert!(close(all_reduce_hierarchical(&t, &g, GB), 0.030024));
    // NCCL picks the faster.
    assert!(close(all_reduce(&t, &g, GB), 0.0235875));
}

#[test]
fn all_reduce_picks_the_faster_of_ring_and_hierarchical() {
    // 64 ranks, stride 1: 8 domains of 8. Ring: 2 * 63/64 * 1e9 / 80e9 + 126 * 5e-6
    // = 0.024609375 + 0.00063 = 0.025239375. Hierarchical: 0.017514 + 2 * 7/8 * 0.125e9 /
    // 10e9 + 14 * 5e-6 = 0.017514 + 0.021875 + 0.00007 = 0.039459. Ring wins here too.
    let t = topo();
    let g = t.group(64, 64, 1);
    assert!(close(all_reduce_ring(&t, &g, GB), 0.025239375));
    assert!(close(all_reduce_hierarchical(&t, &g, GB), 0.039459));
    // With slow NICs (1 GB/s) the hierarchical shard exchange moves 8x less over them:
    // ring 2 * 63/64 * 1e9 / 8e9 + 0.00063 = 0.246724; hierarchical 0.017514 + 2 * 7/8 *
    // 0.125e9 / 1e9 + 0.00007 = 0.236334.
    let mut slow = topo();
    slow.out.bandwidth = 1e9;
    assert!(close(all_reduce_ring(&slow, &g, GB), 0.24672375));
    assert!(close(all_reduce_hierarchical(&slow, &g, GB), 0.236334));
    assert!(close(all_reduce(&slow, &g, GB), 0.236334));
}

#[test]
fn data_parallel_groups_with_one_member_per_domain_run_at_nic_speed() {
    // DP of 4 with stride 8 (TP8 inner): one member per domain, bus bandwidth 10 GB/s:
    // reduce-scatter 3/4 * 1e9 / 10e9 + 3 * 5e-6 = 0.075015 s.
    let t = topo();
    let g = t.group(32, 4, 8);
    assert_eq!((g.domains, g.per_domain), (4, 1));
    assert!(close(reduce_scatter(&t, &g, GB), 0.075015));
}

#[test]
fn all_to_all_splits_traffic_between_the_tiers() {
    let t = topo();
    // Inside a domain, each rank sends 7/8 of S over the scale-up links:
    // 7/8 * 1e9 / 100e9 + 7 * 1e-6 = 0.008757 s.
    let g = t.group(64, 8, 1);
    assert!(close(all_to_all(&t, &g, GB), 0.008757));
    // 16 ranks over 2 domains: 7/16 of S stays inside (0.004375 s at 100 GB/s), 8/16 leaves
    // through the rank's NIC (0.05 s at 10 GB/s); both at once, plus 15 * 5e-6:
    // 0.05 + 0.000075 = 0.050075 s.
    let g = t.group(64, 16, 1);
    assert!(close(all_to_all(&t, &g, GB), 0.050075));
}

#[test]
fn point_to_point() {
    // alpha + S / B: inside 1e-6 + 1e9/100e9 = 0.010001; across 5e-6 + 0.1 = 0.100005.
    let t = topo();
    assert!(close(p2p(&t, false, GB), 0.010001));
    assert!(close(p2p(&t, true, GB), 0.100005));
    assert_eq!(p2p(&t, true, 0.0), 0.0);
}

#[test]
fn single_rank_groups_cost_nothing() {
    let t = topo();
    let g = t.group(8, 1, 1);
    assert_eq!(g, Group::SINGLE);
    assert_eq!(all_reduce(&t, &g, GB), 0.0);
    assert_eq!(all_to_all(&t, &g, GB), 0.0);
    assert_eq!(collectives::reduce_scatter_ring(&t, &g, GB), 0.0);
}

#[test]
fn irregular_domains_find_the_straddling_group() {
    // 72-GPU NVL72 domains, 16-rank EP groups over 256 ranks: the group 64..80 has 8 members
    // in domain 0 (64..71) and 8 in domain 1.
    let g = Group::place(256, 16, 1, 72);
    assert_eq!((g.domains, g.per_domain), (2, 8));
    // A 256-GPU job on NVL72 racks occupies 4 blocks of 64 GPUs (16 trays of 4), so the same
    // groups stay inside a block.
    assert_eq!(job_domain(72, 256, 4), 64);
    assert_eq!(job_domain(72, 64, 4), 72);
    assert_eq!(job_domain(8, 1024, 8), 8);
    let g = Group::place(256, 16, 1, 64);
    assert_eq!((g.domains, g.per_domain), (1, 16));
}

#[test]
fn megatron_rank_order_places_tp_inside_and_pp_outside() {
    // 1024 GPUs, TP8 CP2 PP8 -> DP8; 8-GPU domains. TP (stride 1) fills a domain; CP (stride
    // 8) and DP x CP (stride 8, 16 ranks) have one member per domain; PP hops leave it.
    let t = topo();
    let l = Layout {
        tp: 8,
        cp: 2,
        pp: 8,
        ..Layout::default()
    };
    let p = Placement::of(&t, 1024, &l, 8);
    assert_eq!((p.tp.domains, p.tp.per_domain), (1, 8));
    assert_eq!((p.cp.size, p.cp.stride, p.cp.per_domain), (2, 8, 1));
    assert_eq!(
        (p.dp_cp.size, p.dp_cp.stride, p.dp_cp.per_domain),
        (16, 8, 1)
    );
    assert_eq!((p.pp.size, p.pp.stride), (8, 128));
    assert!(p.pp_crosses_domain);
    // TP2 CP2 DP2 in a 8-GPU domain: everything but PP stays inside.
    let l = Layout {
        tp: 2,
        cp: 2,
        pp: 2,
        ..Layout::default()
    };
    let p = Placement::of(&t, 16, &l, 2);
    assert_eq!(p.dp_cp.domains, 1);
    assert!(p.pp_crosses_domain);
    // Experts: EP8 innermost (ETP1) fills a domain; expert-DP (stride 8) leaves it.
    let l = Layout {
        ep: 8,
        ..Layout::default()
    };
    let p = Placement::of(&t, 64, &l, 64);
    assert_eq!((p.ep.domains, p.ep.per_domain), (1, 8));
    assert_eq!((p.edp.size, p.edp.stride, p.edp.per_domain), (8, 8, 1));
}
