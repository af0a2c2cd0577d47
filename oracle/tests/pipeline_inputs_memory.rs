//! The inputs a pipeline rank keeps between iterations (issue 15, `StageMemory::
//! pipeline_inputs_bytes`), derived by hand: every model chunk fed by the previous stage keeps
//! its last micro-batch's input (Megatron-Core `TransformerBlock.set_input_tensor` stores it,
//! cleared only by the next call) and that input's gradient (`schedules.backward_step` calls
//! `retain_grad`): two `[s / (cp * tp_sp), mbs, h]` BF16 tensors per such chunk. Megatron-LM's
//! CI memory test `gpt3_7b_tp1_pp4_memory_speed` measures them on its last stage (memory.csv
//! MC-tp1-pp4-*: 1,071,501,312 B over the model state on A100 and GB200 beyond the TP4 PP1
//! sibling's workspaces, against the 1 GiB below).

mod common;

use primus_oracle::layout::{CudaGraph, CudaGraphImpl, Layout, Schedule};
use primus_oracle::memory;
use primus_oracle::precision::Precision;
use primus_oracle::scenario::Scenario;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// The CI test's 7B GPT on 8 H100: sequence 8192, global batch 8, MBS 1, DP 2, the
/// distributed optimizer, no recompute.
fn ci_gpt(tp: u32, pp: u32, vpp: u32, sp: bool) -> (Scenario, Layout) {
    let s = common::scenario(
        "mcore-ci-gpt-7b",
        "h100-sxm",
        8,
        Some(8),
        8192,
        8,
        Precision::Bf16,
    );
    let l = Layout {
        tp,
        pp,
        vpp,
        sequence_parallel: sp,
        micro_batch_size: 1,
        distributed_optimizer: true,
        schedule: if vpp > 1 {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        },
        ..Layout::default()
    };
    l.check(&s).expect("legal layout");
    (s, l)
}

#[test]
fn each_fed_chunk_keeps_its_last_input_and_its_gradient() {
    // Last stage of TP1 PP4 VPP8: 8 chunks, each fed: 8 x 2 x 8192 x 4096 x 2 B = 1 GiB.
    let (s, l) = ci_gpt(1, 4, 8, false);
    let r = memory::estimate(&s, &l);
    assert_eq!(r.stages.len(), 4);
    assert_eq!(r.stages[3].pipeline_inputs_bytes, GIB);
    // The first stage's first chunk reads data, not a received input: 7 x 128 MiB.
    assert_eq!(r.stages[0].pipeline_inputs_bytes, 7.0 * 128.0 * MIB);
    // A middle stage: all 8 chunks.
    assert_eq!(r.stages[1].pipeline_inputs_bytes, GIB);
    // They are allocated between iterations beside the model state, and the peak, which the
    // activations set here (FP32 gradients: no optimizer copy), does not move.
    let st = &r.stages[3];
    assert!(st.pipeline_inputs_bytes < st.activations_bytes);
}

#[test]
fn plain_1f1b_keeps_one_pair_per_fed_stage_and_sequence_parallel_splits_it() {
    // TP1 PP4 without interleaving: one chunk, so one pair on stages 1-3, none on stage 0.
    let (s, l) = ci_gpt(1, 4, 1, false);
    let r = memory::estimate(&s, &l);
    assert_eq!(r.stages[0].pipeline_inputs_bytes, 0.0);
    assert_eq!(r.stages[2].pipeline_inputs_bytes, 128.0 * MIB);
    // TP2 PP4 with sequence parallelism: the P2P tensor is [s / tp, mbs, h]: half.
    let (s, l) = ci_gpt(2, 4, 1, true);
    let r = memory::estimate(&s, &l);
    assert_eq!(r.stages[3].pipeline_inputs_bytes, 64.0 * MIB);
}

#[test]
fn no_pipeline_no_inputs_and_a_full_iteration_graph_holds_them_in_its_pool() {
    let (s, l) = ci_gpt(4, 1, 1, false);
    assert_eq!(
        memory::estimate(&s, &l).stages[0].pipeline_inputs_bytes,
        0.0
    );
    let (s, mut l) = ci_gpt(1, 4, 1, false);
    l.cuda_graph = CudaGraph {
        implementation: CudaGraphImpl::FullIteration,
        modules: Vec::new(),
    };
    l.check(&s).expect("legal layout");
    assert_eq!(
        memory::estimate(&s, &l).stages[3].pipeline_inputs_bytes,
        0.0
    );
    // Without the graph the same stage keeps its pair.
    l.cuda_graph = CudaGraph::default();
    assert_eq!(
        memory::estimate(&s, &l).stages[3].pipeline_inputs_bytes,
        128.0 * MIB
    );
}
