//! The `simulate` benchmark backend: what a single-node benchmark would report, produced by the
//! analytic model instead of a GPU. Marked `backend: simulate` everywhere, so nothing mistakes
//! it for a measurement. It exercises the whole benchmark -> report -> calibration path on
//! machines without GPUs (test beds, CI, laptops), and a report it writes calibrates the
//! oracle to exactly the analytic projection.
//!
//! The cases are those every backend measures ([`crate::bench::measure`]); each op pass is timed
//! by the [`AnalyticTimer`], each collective by the alpha-beta model of the node.

use crate::bench::measure::{self, BenchError, CollectiveCase, Device, DeviceInfo, OpCase};
use crate::collectives::{self, Collective, Topology};
use crate::compute::{AnalyticTimer, OpTimer, TimerContext};
use crate::layout::Layout;
use crate::plan::Plan;
use crate::report::{Backend, BenchmarkResults};
use crate::scenario::Scenario;

pub use crate::bench::measure::Provenance;

/// A device that answers with the analytic model.
#[derive(Debug, Clone)]
pub struct SimulatedDevice<'a> {
    scenario: &'a Scenario,
    gpus: u32,
}

impl<'a> SimulatedDevice<'a> {
    /// The node of a scenario (its `gpusPerNode`, or the whole job when smaller).
    pub fn new(scenario: &'a Scenario) -> SimulatedDevice<'a> {
        let gpus = scenario
            .cluster
            .gpus_per_node
            .min(scenario.cluster.gpus)
            .max(1);
        SimulatedDevice { scenario, gpus }
    }
}

/// The analytic time of a collective case inside one scale-up domain.
pub fn analytic_collective(topo: &Topology, op: Collective, group_size: u32, bytes: f64) -> f64 {
    // The group lives in one node: place it in a domain at least that large.
    let g = collectives::Group::place(group_size, group_size, 1, topo.domain.max(group_size));
    match op {
        Collective::AllReduce => collectives::all_reduce(topo, &g, bytes),
        Collective::ReduceScatter => collectives::reduce_scatter(topo, &g, bytes),
        Collective::AllGather => collectives::all_gather(topo, &g, bytes),
        Collective::AllToAll => collectives::all_to_all(topo, &g, bytes),
        Collective::P2p => collectives::p2p(topo, false, bytes),
    }
}

impl Device for SimulatedDevice<'_> {
    fn backend(&self) -> Backend {
        Backend::Simulate
    }

    fn gpus(&self) -> u32 {
        self.gpus
    }

    fn info(&self) -> DeviceInfo {
        DeviceInfo {
            product: self.scenario.hardware.product.clone(),
            driver_version: "none (simulated)".into(),
            runtime_version: format!(
                "primus-oracle {} analytic model (simulated)",
                env!("CARGO_PKG_VERSION")
            ),
        }
    }

    fn time_op(
        &mut self,
        case: &OpCase,
        _protocol: &measure::Protocol,
    ) -> Result<Vec<f64>, BenchError> {
        let ctx = TimerContext {
            hardware: &self.scenario.hardware,
            precision: self.scenario.training.precision,
            fp8_recipe: crate::backend::Fp8Recipe::Delayed,
        };
        Ok(vec![AnalyticTimer.op_seconds(&ctx, &case.op, case.pass)])
    }

    fn time_collective(
        &mut self,
        case: &CollectiveCase,
        _protocol: &measure::Protocol,
    ) -> Result<Vec<f64>, BenchError> {
        let s = self.scenario;
        let topo = Topology::of(&s.hardware, s.cluster.gpus_per_node);
        Ok(vec![analytic_collective(
            &topo,
            case.op,
            case.group_size,
            case.bytes,
        )])
    }

    fn peak_memory_bytes(&self) -> f64 {
        0.0
    }
}

/// A simulated benchmark of `plan` on one node.
pub fn simulate(plan: &Plan, provenance: Provenance) -> BenchmarkResults {
    simulate_with_finalists(plan, &[], provenance)
}

/// A simulated benchmark of `plan` and of the kernels of `finalists` on one node.
pub fn simulate_with_finalists(
    plan: &Plan,
    finalists: &[Layout],
    provenance: Provenance,
) -> BenchmarkResults {
    let mut device = SimulatedDevice::new(&plan.scenario);
    let protocol = measure::Protocol { warmup: 0, runs: 1 };
    measure::run(
        plan,
        finalists,
        &mut device,
        &protocol,
        provenance,
        &mut |_| {},
    )
    .expect("the analytic device does not fail")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::shapes_key;
    use crate::plan::parse_plan;
    use crate::profiles::Catalog;

    fn plan(model: &str, layout: &str) -> Plan {
        let c = Catalog::builtin().unwrap();
        let text = format!(
            "metadata: {{name: p}}\nspec:\n  model: {{preset: {model}}}\n  cluster: {{gpu: mi300x, gpus: 64}}\n  training: {{seqLength: 4096, globalBatchSize: 256}}\n  parallelism: {layout}\n"
        );
        parse_plan(&text, "p.yaml", &c).unwrap()
    }

    #[test]
    fn a_dense_plan_reports_one_dense_layer_marked_simulated() {
        let p = plan("llama3.1-70b", "{tp: 4, pp: 8}");
        let r = simulate(
            &p,
            Provenance {
                node: "n1".into(),
                started_at: "2026-01-01T00:00:00Z".into(),
                finished_at: "2026-01-01T00:00:01Z".into(),
            },
        );
        assert_eq!(r.backend, Backend::Simulate);
        assert_eq!(r.node, "n1");
        assert_eq!(r.gpu, "mi300x");
        assert_eq!(r.measured_layout.pp, 1);
        assert_eq!(r.reduced_axes, vec!["pp 8->1"]);
        assert!(r.ops.iter().all(|o| {
            ["dense.", "embedding.", "head."]
                .iter()
                .any(|p| o.name.starts_with(p))
        }));
        assert!(r.ops.iter().all(|o| o.median_seconds > 0.0));
        let qkv = r
            .ops
            .iter()
            .find(|o| o.name == "dense.qkv.fwd")
            .expect("the QKV projection is there");
        // M = 4096 tokens, N = (64 + 2 x 8) heads x 128 / TP 4, K = 8192.
        assert_eq!(qkv.shape, vec![4096, 2560, 8192]);
        assert_eq!(qkv.kind, "gemm");
        assert!(
            r.collectives
                .iter()
                .any(|c| c.op == "all-gather" && c.group_size == 4)
        );
        assert_eq!(r.shapes_key, shapes_key(&p));
        // The whole node took part (the gradient bucket collectives).
        assert_eq!(r.gpu_count, 8);
    }

    #[test]
    fn a_moe_plan_adds_the_moe_layer_and_the_all_to_all() {
        let p = plan("mixtral-8x7b", "{tp: 2, ep: 8, pp: 4}");
        let r = simulate(&p, Provenance::default());
        assert!(r.ops.iter().any(|o| o.name.starts_with("moe.")));
        // One local expert per GPU (8 experts, EP 8): a plain GEMM each.
        assert!(r.ops.iter().any(|o| o.name == "moe.experts_fc1.fwd"));
        assert!(r.collectives.iter().any(|c| c.op == "all-to-all"));
        // The expert grid (EP 8) fits one node once PP is dropped.
        assert_eq!(r.measured_layout.ep, 8);
        assert_eq!(r.reduced_axes, vec!["pp 4->1"]);
    }

    #[test]
    fn collective_times_are_the_alpha_beta_model_inside_the_node() {
        let p = plan("llama3.1-8b", "{tp: 8}");
        let r = simulate(&p, Provenance::default());
        let hw = &p.scenario.hardware;
        let b = hw.scale_up.bytes_per_second() * hw.efficiency.collective;
        let a = hw.scale_up.latency_seconds();
        let ag = r
            .collectives
            .iter()
            .find(|c| c.op == "all-gather" && c.group_size == 8)
            .unwrap();
        // Ring all-gather: 7/8 S / B + 7 alpha.
        let want = 7.0 / 8.0 * ag.bytes / b + 7.0 * a;
        assert!((ag.median_seconds - want).abs() <= 1e-12 * want, "{ag:?}");
        // Bus bandwidth of a latency-free ring is the link bandwidth.
        assert!(ag.bus_bandwidth_gbps * 1e9 < b);
    }
}
