//! The pipeline schedule simulator against hand-derived makespans and bubbles.

use primus_oracle::layout::Schedule;
use primus_oracle::schedule::{PassKind, ScheduleError, Simulator, StageCosts, simulate};

fn costs<'a>(
    pp: usize,
    vpp: usize,
    f: &'a [f64],
    b: &'a [f64],
    w: &'a [f64],
    p2p: f64,
) -> StageCosts<'a> {
    StageCosts {
        pp,
        vpp,
        forward: f,
        backward: b,
        weight: w,
        p2p,
        alone: None,
    }
}

const EPS: f64 = 1e-9;

#[test]
fn one_f_one_b_equal_stages_bubble_is_p_minus_1_over_m_plus_p_minus_1() {
    // p = 4 stages, m = 8 micro-batches, forward 1, backward 2 (weight 0), no messages.
    // 1F1B (Narayanan et al. 2021, section 2.2): makespan (m + p - 1)(F + B) = 11 * 3 = 33;
    // the busiest rank works m(F + B) = 24, so the bubble is 9 and its fraction
    // (p - 1)/(m + p - 1) = 3/11.
    let (p, m) = (4, 8);
    let f = vec![1.0; p];
    let b = vec![2.0; p];
    let w = vec![0.0; p];
    let (s, ranks) = simulate(Schedule::OneFOneB, &costs(p, 1, &f, &b, &w, 0.0), m).unwrap();
    assert!((s.makespan - 33.0).abs() < EPS, "{s:?}");
    assert!((s.bubble - 9.0).abs() < EPS);
    assert!((s.bubble_fraction - 3.0 / 11.0).abs() < EPS);
    for r in &ranks {
        assert!((r.busy - 24.0).abs() < EPS);
        assert_eq!(r.p2p_wait, 0.0);
    }
}

#[test]
fn one_f_one_b_weight_counts_as_backward() {
    // Same as above with the backward split 1 + 1 (input + weight): 1F1B runs them together.
    let (p, m) = (4, 8);
    let f = vec![1.0; p];
    let b = vec![1.0; p];
    let w = vec![1.0; p];
    let (s, _) = simulate(Schedule::OneFOneB, &costs(p, 1, &f, &b, &w, 0.0), m).unwrap();
    assert!((s.makespan - 33.0).abs() < EPS, "{s:?}");
}

#[test]
fn interleaving_divides_the_bubble_by_vpp() {
    // p = 4, v = 2 chunks per rank, m = 8. A rank's whole forward is 1 and backward 2 as
    // above, so each chunk takes f = 0.5, b = 1. Interleaved 1F1B (Narayanan et al. 2021,
    // section 2.2.2): bubble (p - 1)(f + b) = (p - 1)(F + B)/v = 3 * 1.5 = 4.5, makespan
    // m(F + B) + 4.5 = 28.5, fraction 4.5/28.5.
    let (p, v, m) = (4, 2, 8);
    let f = vec![0.5; p * v];
    let b = vec![1.0; p * v];
    let w = vec![0.0; p * v];
    let (s, _) = simulate(Schedule::Interleaved, &costs(p, v, &f, &b, &w, 0.0), m).unwrap();
    assert!((s.makespan - 28.5).abs() < EPS, "{s:?}");
    assert!((s.bubble - 4.5).abs() < EPS);
    // And with v = 4 (chunks 0.25 / 0.5): bubble 3 * 0.75 = 2.25.
    let v = 4;
    let f = vec![0.25; p * v];
    let b = vec![0.5; p * v];
    let w = vec![0.0; p * v];
    let (s, _) = simulate(Schedule::Interleaved, &costs(p, v, &f, &b, &w, 0.0), m).unwrap();
    assert!((s.makespan - 26.25).abs() < EPS, "{s:?}");
}

#[test]
fn zero_bubble_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w() {
    // ZB-H1 (Qi et al. 2023, section 3.1): with the backward split into input (B) and weight
    // (W) passes, the bubble shrinks from 1F1B's (p - 1)(F + B + W) to (p - 1)(F + B - W).
    // F = B = W = 1, p = 4, m = 8: busy 3m = 24, bubble 3 * 1 = 3, makespan 27 (1F1B: 33).
    let (p, m) = (4, 8);
    let f = vec![1.0; p];
    let b = vec![1.0; p];
    let w = vec![1.0; p];
    let (s, ranks) = simulate(Schedule::ZeroBubble, &costs(p, 1, &f, &b, &w, 0.0), m).unwrap();
    assert!((s.makespan - 27.0).abs() < EPS, "{s:?} {ranks:?}");
    assert!((s.bubble - 3.0).abs() < EPS);
}

#[test]
fn messages_delay_the_chain_and_are_reported_as_p2p_wait() {
    // p = 2, m = 1, F = 1, B = 2, message 0.1: rank 0 forward [0, 1], rank 1 forward
    // [1.1, 2.1], backward [2.1, 4.1], rank 0 backward [4.2, 6.2]. Rank 0 waited 3.2, of which
    // 0.1 for the message in flight; rank 1 waited 1.1, 0.1 of it for the message.
    let f = vec![1.0; 2];
    let b = vec![2.0; 2];
    let w = vec![0.0; 2];
    let (s, ranks) = simulate(Schedule::OneFOneB, &costs(2, 1, &f, &b, &w, 0.1), 1).unwrap();
    assert!((s.makespan - 6.2).abs() < EPS, "{s:?}");
    assert!((ranks[0].p2p_wait - 0.1).abs() < EPS);
    assert!((ranks[1].p2p_wait - 0.1).abs() < EPS);
    assert!((ranks[0].bubble() - 3.1).abs() < EPS);
}

#[test]
fn slowest_stage_sets_the_steady_state() {
    // p = 2, m = 16; stage 1 is twice as slow (F 2, B 4). After warm-up the pipeline runs at
    // the slow stage's pace: its busy time 16 * 6 = 96 plus the head of the pipeline (stage 0's
    // first forward, 1) plus the tail (stage 0's last backward, 2): 99.
    let f = vec![1.0, 2.0];
    let b = vec![2.0, 4.0];
    let w = vec![0.0; 2];
    let (s, ranks) = simulate(Schedule::OneFOneB, &costs(2, 1, &f, &b, &w, 0.0), 16).unwrap();
    assert!((s.makespan - 99.0).abs() < EPS, "{s:?}");
    assert_eq!(s.busiest_rank, 1);
    assert!((ranks[1].busy - 96.0).abs() < EPS);
}

#[test]
fn trace_records_every_pass_once_and_respects_dependencies() {
    let (p, v, m) = (4, 2, 8);
    let f = vec![0.5; p * v];
    let b = vec![1.0; p * v];
    let w = vec![0.0; p * v];
    let mut sim = Simulator::tracing();
    sim.run(Schedule::Interleaved, &costs(p, v, &f, &b, &w, 0.05), m)
        .unwrap();
    let trace = sim.trace.as_ref().unwrap();
    assert_eq!(trace.len(), 2 * p * v * m);
    // No two passes of one rank overlap.
    for r in 0..p as u32 {
        let mut mine: Vec<_> = trace.iter().filter(|e| e.rank == r).collect();
        mine.sort_by(|a, b| a.start.partial_cmp(&b.start).unwrap());
        for pair in mine.windows(2) {
            assert!(pair[1].start >= pair[0].end - EPS);
        }
    }
    // Every forward of virtual stage vs > 0 starts after the previous stage's forward plus the
    // message.
    for e in trace.iter().filter(|e| e.kind == PassKind::Forward) {
        let vs = e.chunk as usize * p + e.rank as usize;
        if vs == 0 {
            continue;
        }
        let (pc, pr) = ((vs - 1) / p, (vs - 1) % p);
        let prev = trace
            .iter()
            .find(|x| {
                x.kind == PassKind::Forward
                    && x.microbatch == e.microbatch
                    && x.chunk as usize == pc
                    && x.rank as usize == pr
            })
            .unwrap();
        assert!(e.start >= prev.end + 0.05 - EPS);
    }
}

#[test]
fn zero_bubble_h1_matches_the_formula_over_a_range_of_shapes() {
    // F = B = W = 1: ZB-H1 makespan 3m + (p - 1) (bubble (p - 1)(F + B - W)), 1F1B
    // 3(m + p - 1), for every p in 2..=8 and m in p..=3p.
    for p in 2..=8usize {
        for m in p..=3 * p {
            let f = vec![1.0; p];
            let (zb, _) = simulate(Schedule::ZeroBubble, &costs(p, 1, &f, &f, &f, 0.0), m).unwrap();
            let (ofob, _) = simulate(Schedule::OneFOneB, &costs(p, 1, &f, &f, &f, 0.0), m).unwrap();
            let expect = (3 * m + p - 1) as f64;
            assert!((zb.makespan - expect).abs() < EPS, "p={p} m={m}: {zb:?}");
            assert!((ofob.makespan - (3 * (m + p - 1)) as f64).abs() < EPS);
        }
    }
}

mod steady_state_shortcut {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Filling in a repeating steady state gives the same times as simulating every pass.
        #[test]
        fn matches_the_exhaustive_simulation(
            p in 2usize..9,
            v in 1usize..5,
            groups in 1usize..12,
            f in proptest::collection::vec(0.1f64..3.0, 32),
            b in proptest::collection::vec(0.1f64..6.0, 32),
            p2p in 0.0f64..0.5,
        ) {
            let m = p * groups;
            let nvs = p * v;
            let f = &f[..nvs];
            let b = &b[..nvs];
            let w = vec![0.0; nvs];
            let schedule = if v > 1 { Schedule::Interleaved } else { Schedule::OneFOneB };
            let c = costs(p, v, f, b, &w, p2p);
            let mut fast = Simulator::new();
            let mut slow = Simulator::exhaustive();
            let a = fast.run(schedule, &c, m).unwrap();
            let e = slow.run(schedule, &c, m).unwrap();
            let tol = 1e-9 * e.makespan;
            prop_assert!((a.makespan - e.makespan).abs() <= tol, "{a:?} vs {e:?}");
            for (x, y) in fast.ranks().iter().zip(slow.ranks()) {
                prop_assert!((x.end - y.end).abs() <= tol);
                prop_assert!((x.p2p_wait - y.p2p_wait).abs() <= tol);
                prop_assert!((x.first_forward_end - y.first_forward_end).abs() <= tol);
            }
            for (x, y) in fast.last_backward().iter().zip(slow.last_backward()) {
                prop_assert!((x.start - y.start).abs() <= tol && (x.end - y.end).abs() <= tol);
            }
        }
    }
}

#[test]
fn the_steady_state_shortcut_is_taken_and_exact() {
    // 8 stages x 8 chunks x 64 micro-batches with uneven chunks and messages: the steady state
    // repeats every two micro-batch groups here; most of the 8192 passes are filled in, and
    // every time agrees with the pass-by-pass simulation.
    let (p, v, m) = (8, 8, 64);
    let f: Vec<f64> = (0..p * v).map(|i| 1.0 + 0.1 * (i % 3) as f64).collect();
    let b: Vec<f64> = f.iter().map(|x| 2.0 * x).collect();
    let w = vec![0.0; p * v];
    let c = costs(p, v, &f, &b, &w, 0.05);
    let mut fast = Simulator::new();
    let mut slow = Simulator::exhaustive();
    let a = fast.run(Schedule::Interleaved, &c, m).unwrap();
    let e = slow.run(Schedule::Interleaved, &c, m).unwrap();
    assert!(fast.filled_passes() > 2000, "{}", fast.filled_passes());
    assert_eq!(slow.filled_passes(), 0);
    assert!((a.makespan - e.makespan).abs() < 1e-9 * e.makespan);
    for (x, y) in fast.ranks().iter().zip(slow.ranks()) {
        assert!((x.p2p_wait - y.p2p_wait).abs() < 1e-9 * e.makespan);
    }
}

#[test]
fn plans_put_aside_come_back_with_the_same_results() {
    // One simulator switching between shapes (as the tuner does between candidates) keeps the
    // plans it built; every result equals a fresh simulator's, pass waits included, and the
    // 1F1B and interleaved plans of one (pp, m) stay apart.
    let shapes = [
        (Schedule::Interleaved, 4, 2, 8),
        (Schedule::OneFOneB, 4, 1, 8),
        (Schedule::Interleaved, 2, 3, 6),
        (Schedule::OneFOneB, 8, 1, 24),
        (Schedule::Interleaved, 4, 2, 8),
        (Schedule::OneFOneB, 4, 1, 8),
        (Schedule::OneFOneB, 8, 1, 24),
        (Schedule::Interleaved, 2, 3, 6),
    ];
    let mut kept = Simulator::new();
    for (round, &(schedule, p, v, m)) in shapes.iter().enumerate() {
        let f: Vec<f64> = (0..p * v)
            .map(|i| 1.0 + 0.1 * ((i + round) % 4) as f64)
            .collect();
        let b: Vec<f64> = f.iter().map(|x| 2.1 * x).collect();
        let w = vec![0.0; p * v];
        let c = costs(p, v, &f, &b, &w, 0.03);
        let a = kept.run(schedule, &c, m).unwrap();
        let mut fresh = Simulator::new();
        let e = fresh.run(schedule, &c, m).unwrap();
        assert_eq!(a, e, "shape {round}: {schedule:?} pp {p} vpp {v} m {m}");
        for (x, y) in kept.ranks().iter().zip(fresh.ranks()) {
            assert_eq!(x, y, "shape {round}");
        }
    }
}

mod extrapolation {
    use super::*;
    use proptest::prelude::*;

    fn close(a: f64, b: f64, scale: f64) -> bool {
        (a - b).abs() <= 1e-9 * scale.abs().max(1e-12)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(60))]
        /// Beyond its budget the simulator extrapolates from three runs a whole number of
        /// steady-state periods apart: every result agrees with the full simulation.
        #[test]
        fn agrees_with_the_full_simulation(
            p in 1usize..6,
            v in 1usize..4,
            schedule in 0usize..3,
            extra in 0usize..400,
            f in proptest::collection::vec(0.1f64..3.0, 24),
            b in proptest::collection::vec(0.1f64..6.0, 24),
            w in proptest::collection::vec(0.0f64..2.0, 24),
            p2p in 0.0f64..0.5,
        ) {
            let (schedule, v) = match schedule {
                0 => (Schedule::OneFOneB, 1),
                1 if p > 1 && v > 1 => (Schedule::Interleaved, v),
                1 => (Schedule::OneFOneB, 1),
                _ if p > 1 => (Schedule::ZeroBubble, 1),
                _ => (Schedule::OneFOneB, 1),
            };
            let nvs = p * v;
            // Interleaving needs whole groups of p micro-batches.
            let m = (150 * p + extra) / p * p;
            let c = costs(p, v, &f[..nvs], &b[..nvs], &w[..nvs], p2p);
            let mut full = Simulator::new();
            let e = full.run(schedule, &c, m).unwrap();
            // A budget of half the passes: room for three runs 12 groups apart, so the run
            // extrapolates.
            let budget = (nvs * m) as u64;
            let mut short = Simulator::new().with_budget(budget);
            match short.run(schedule, &c, m) {
                Ok(a) => {
                    let scale = e.makespan;
                    prop_assert!(close(a.makespan, e.makespan, scale), "{a:?} vs {e:?}");
                    prop_assert!(short.filled_passes() > 0);
                    for (r, (x, y)) in short.ranks().iter().zip(full.ranks()).enumerate() {
                        prop_assert!(close(x.end, y.end, scale));
                        prop_assert!(close(x.busy, y.busy, scale));
                        prop_assert!(close(x.first_forward_end, y.first_forward_end, scale));
                        prop_assert!(close(x.p2p_wait, y.p2p_wait, scale));
                        prop_assert!(close(short.p2p_wait(r), full.p2p_wait(r), scale));
                    }
                    for (x, y) in short.last_backward().iter().zip(full.last_backward()) {
                        prop_assert!(close(x.start, y.start, scale) && close(x.end, y.end, scale));
                    }
                }
                // Not periodic yet within the budget (a rank whose slack still grows, as when
                // two stages cost almost the same): refused, never extrapolated wrong.
                Err(ScheduleError::TooLarge { .. }) => prop_assume!(false),
                Err(e) => prop_assert!(false, "{schedule:?} p={p} v={v} m={m}: {e}"),
            }
        }
    }

    #[test]
    fn huge_micro_batch_counts_cost_constant_memory() {
        // 2^40 micro-batches on 4 stages: 2^43 passes, far beyond any memory; extrapolated
        // from three runs within the budget (bounded memory), with the busy time exact.
        let (p, m) = (4, 1usize << 40);
        let f = vec![1.0; p];
        let b = vec![2.0; p];
        let w = vec![0.0; p];
        let mut sim = Simulator::new();
        let s = sim
            .run(Schedule::OneFOneB, &costs(p, 1, &f, &b, &w, 0.0), m)
            .unwrap();
        // 1F1B: makespan (m + p - 1)(F + B).
        let expect = (m as f64 + 3.0) * 3.0;
        assert!((s.makespan - expect).abs() <= 1e-9 * expect, "{s:?}");
        assert!((sim.ranks()[0].busy - 3.0 * m as f64).abs() <= 1e-9 * expect);
        // Too many stages for three runs within the budget: an error, not a panic.
        let n = 20_000;
        let f = vec![1.0; n];
        let r = Simulator::new().run(Schedule::OneFOneB, &costs(n, 1, &f, &f, &f, 0.0), m);
        assert!(matches!(r, Err(ScheduleError::TooLarge { .. })), "{r:?}");
        // And a timeline (every pass recorded) is never extrapolated.
        let mut tracing = Simulator::tracing();
        let f = vec![1.0; p];
        let r = tracing.run(Schedule::OneFOneB, &costs(p, 1, &f, &f, &f, 0.0), m);
        assert!(matches!(r, Err(ScheduleError::TooLarge { .. })), "{r:?}");
    }
}

/// Megatron's interleaved schedule with the EP overlap (`schedules.py`,
/// `get_pp_rank_microbatches`): rank r runs `(pp - r - 1) * 2 + (vpp - 1) * pp + 1` warm-up
/// forwards (one more than without the overlap) and as many cool-down backwards outside the
/// steady state's forward-backward pairs; those passes take the `alone` durations. PP4 VPP2,
/// 8 micro-batches (16 forwards per rank): 11, 9, 7 and 5 unpaired forwards and backwards.
#[test]
fn the_overlap_schedule_runs_its_warm_up_and_cool_down_alone() {
    use primus_oracle::schedule::AlonePasses;
    let (pp, vpp, m) = (4usize, 2usize, 8usize);
    let nvs = pp * vpp;
    let (f, b) = (vec![1.0; nvs], vec![2.0; nvs]);
    let (fa, ba) = (vec![1.5; nvs], vec![2.75; nvs]);
    let w = vec![0.0; nvs];
    let mut c = costs(pp, vpp, &f, &b, &w, 0.0);
    c.alone = Some(AlonePasses {
        forward: &fa,
        backward: &ba,
    });
    let mut sim = Simulator::tracing();
    sim.run(Schedule::Interleaved, &c, m).expect("runs");
    let events = sim.trace.clone().expect("trace");
    for r in 0..pp {
        let warmup = (pp - r - 1) * 2 + (vpp - 1) * pp + 1;
        let mut mine: Vec<_> = events.iter().filter(|e| e.rank as usize == r).collect();
        mine.sort_by(|x, y| x.start.total_cmp(&y.start));
        let first_backward = mine
            .iter()
            .position(|e| e.kind == PassKind::Backward)
            .expect("a backward");
        // The steady state starts with a forward, then its paired backward.
        assert_eq!(first_backward, warmup + 1, "rank {r}: warm-up forwards");
        let durations: Vec<f64> = mine.iter().map(|e| e.end - e.start).collect();
        let n = durations.len();
        for (j, d) in durations.iter().enumerate() {
            let backward = mine[j].kind == PassKind::Backward;
            let alone = j < warmup || j >= n - warmup;
            let expect = match (backward, alone) {
                (false, false) => 1.0,
                (true, false) => 2.0,
                (false, true) => 1.5,
                (true, true) => 2.75,
            };
            assert!(
                (d - expect).abs() < 1e-12,
                "rank {r} pass {j}: {d} vs {expect}"
            );
        }
        let busy = (m * vpp) as f64 * 3.0 + warmup as f64 * (0.5 + 0.75);
        assert!((sim.ranks()[r].busy - busy).abs() < 1e-9, "rank {r} busy");
        let unpaired = sim.unpaired_passes().filter(|p| p.0 == r).count();
        assert_eq!(unpaired, 2 * warmup, "rank {r}");
    }
    // Without the overlap: Megatron's warm-up, every pass at the paired durations.
    c.alone = None;
    let mut sim = Simulator::tracing();
    sim.run(Schedule::Interleaved, &c, m).expect("runs");
    let events = sim.trace.clone().expect("trace");
    let mut first: Vec<_> = events.iter().filter(|e| e.rank == 0).collect();
    first.sort_by(|x, y| x.start.total_cmp(&y.start));
    let first_backward = first
        .iter()
        .position(|e| e.kind == PassKind::Backward)
        .expect("a backward");
    assert_eq!(first_backward, (pp - 1) * 2 + (vpp - 1) * pp + 1);
    assert_eq!(sim.unpaired_passes().count(), 0);
}

/// Without a pipeline the EP overlap's schedule (`combined_1f1b_schedule_for_no_pipelining`)
/// runs the first forward alone, then each forward with the previous micro-batch's backward,
/// and the last backward alone: two unpaired passes whatever the micro-batch count.
#[test]
fn without_a_pipeline_the_overlap_leaves_the_first_forward_and_last_backward_alone() {
    use primus_oracle::schedule::AlonePasses;
    let (f, b, w) = ([1.0], [2.0], [0.5]);
    let (fa, ba) = ([1.25], [3.0]);
    for m in [1usize, 2, 5] {
        let mut c = costs(1, 1, &f, &b, &w, 0.0);
        c.alone = Some(AlonePasses {
            forward: &fa,
            backward: &ba,
        });
        let mut sim = Simulator::new();
        let s = sim.run(Schedule::OneFOneB, &c, m).expect("runs");
        // One rank, no idle time: the makespan is the sum of the passes.
        let expect = m as f64 * 3.5 + 0.25 + 1.0;
        assert!(
            (s.makespan - expect).abs() < 1e-12,
            "m = {m}: {}",
            s.makespan
        );
        let unpaired: Vec<_> = sim.unpaired_passes().collect();
        assert_eq!(unpaired, vec![(0, false, 0), (0, true, 0)], "m = {m}");
    }
}
