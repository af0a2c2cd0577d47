//! The webhook's decision function against every run of every validation CSV (issue 15): no
//! run that ran is denied (the throughput CSVs' rows all ran; the memory set's `ran` rows), a
//! job over usable memory within the measured error band is admitted with a warning stating
//! the band, beyond it denied with the band in the message, and a job carrying a
//! memory-relevant flag the model does not model is admitted with a warning naming the flag.

mod common;

use std::time::{Duration, Instant};

use common::*;
use primus_oracle::layout::{Fraction, Layout};
use primus_oracle::memory::{self, Band};
use primus_oracle::precision::Precision;
use primus_oracle::profiles::Catalog;
use primus_oracle::scenario::Scenario;
use primus_oracle::validate::memory::{Framework, Outcome, row_jobs};
use primus_webhook::pytorchjob::{DerivedJob, LayoutSource};
use primus_webhook::validate::{Reason, Verdict};

const MEMORY: &str = include_str!("../../oracle/tests/data/memory.csv");
const PUBLISHED: &str = include_str!("../../oracle/tests/data/published.csv");
const EXTRA: &str = include_str!("../../oracle/tests/data/extra.csv");
const MOE: &str = include_str!("../../oracle/tests/data/moe.csv");
const MOE_NONGATED: &str = include_str!("../../oracle/tests/data/moe-nongated.csv");

fn job(s: Scenario, l: Layout) -> DerivedJob {
    DerivedJob {
        scenario: s,
        layout: l,
        layout_source: LayoutSource::Annotation,
        gpu_source: String::new(),
        notes: Vec::new(),
        unmodelled: Vec::new(),
        adds_memory: Vec::new(),
    }
}

fn judge(j: &DerivedJob) -> Verdict {
    validator().judge(j, Instant::now() + Duration::from_secs(5))
}

/// Rows of the validation CSVs that are not jobs the webhook could be asked to admit, each
/// with the reason its file records: the walk below fails on any other row it cannot derive
/// (a new legality rule that refused a run that ran would show here, not shrink the count).
const NOT_JOBS: &[(&str, &str, &str)] = &[
    (
        "memory.csv",
        "TT-13",
        "TorchTitan FSDP2 + PP on 405B: another framework; Megatron's torch-FSDP2 path refuses \
         pipeline parallelism, so the layout has no Megatron job",
    ),
    ("memory.csv", "TT-14", "as TT-13"),
    ("memory.csv", "TT-15", "as TT-13"),
    ("memory.csv", "TT-16", "as TT-13"),
    ("memory.csv", "TT-17", "as TT-13"),
    ("memory.csv", "TT-18", "as TT-13"),
    (
        "moe-nongated.csv",
        "MB2509-deepseek-v3-gb200-fp8cs",
        "25.09 table: its run script's hard-coded pipeline layout disagrees with the printed \
         PP x VPP (research quality C)",
    ),
    (
        "moe-nongated.csv",
        "MB2509-deepseek-v3-gb200-fp8mx",
        "as MB2509-deepseek-v3-gb200-fp8cs",
    ),
    (
        "moe-nongated.csv",
        "MB2509-deepseek-v3-b200-fp8cs",
        "as MB2509-deepseek-v3-gb200-fp8cs",
    ),
    (
        "moe-nongated.csv",
        "MLM-dsv3-gb200-deepep",
        "DeepEP over EP32 on GB200 ran with a community patch (deepseek-ai/DeepEP#218; stock \
         DeepEP supports NVLink groups of at most 8 ranks, Megatron-LM's GB200 history): not a \
         job the stack the profile describes runs",
    ),
    (
        "moe-nongated.csv",
        "MLM-dsv3-gb200-noupproj",
        "as MLM-dsv3-gb200-deepep",
    ),
    (
        "moe-nongated.csv",
        "MLM-dsv3-gb200-cg",
        "as MLM-dsv3-gb200-deepep",
    ),
    (
        "moe-nongated.csv",
        "MLM-dsv3-gb200-tunedeepep",
        "as MLM-dsv3-gb200-deepep",
    ),
    (
        "moe-nongated.csv",
        "MLM-dsv3-gb200-cpu",
        "as MLM-dsv3-gb200-deepep",
    ),
    (
        "moe-nongated.csv",
        "MLM-dsv3-gb200-pdl",
        "as MLM-dsv3-gb200-deepep",
    ),
    (
        "moe-nongated.csv",
        "MLM-dsv3-gb200-cgshared",
        "as MLM-dsv3-gb200-deepep",
    ),
    (
        "moe-nongated.csv",
        "XA7-mixtral8x22b-mi355x-8n",
        "global batch size not published (research quality C)",
    ),
];

/// Runs that ran which the model once predicted over usable memory, admitted only by the error
/// band: NVIDIA's Llama 3.1 8B CP2 FP8 recipe on 8 H100 (the example of a recipe a
/// webhook would refuse), Llama 3.1 405B on 128 B200, and Qwen3-30B-A3B FP8 on 16 H100. All five
/// run with BF16 gradients; they fit since the optimizer's FP32 copy of its gradient shard is
/// counted at the optimizer step, where Megatron makes it, not beside the activations.
const ONCE_OVER_USABLE: &[(&str, &str)] = &[
    ("extra.csv", "XH13"),
    ("extra.csv", "XN10"),
    ("published.csv", "N9"),
    ("moe-nongated.csv", "N5"),
    ("moe-nongated.csv", "MB2509-qwen3-30b-a3b-h100-fp8cs"),
];

#[test]
fn no_run_that_ran_is_denied() {
    let c = Catalog::builtin().unwrap();
    let mut judged = 0;
    let mut warned = Vec::new();
    let mut not_jobs = Vec::new();
    let mut once_over = Vec::new();
    for (file, text) in [
        ("memory.csv", MEMORY),
        ("published.csv", PUBLISHED),
        ("extra.csv", EXTRA),
        ("moe.csv", MOE),
        ("moe-nongated.csv", MOE_NONGATED),
    ] {
        let rows = row_jobs(text, &c).unwrap();
        for s in &rows.skipped {
            assert!(
                NOT_JOBS.iter().any(|(f, id, _)| *f == file && *id == s.id),
                "{file} {} (line {}) is no job: {}",
                s.id,
                s.line,
                s.reason
            );
            not_jobs.push((file, s.id.clone()));
        }
        for r in rows.jobs {
            if r.outcome != Outcome::Ran || r.framework == Framework::TorchTitan {
                continue;
            }
            judged += 1;
            let v = judge(&job(r.scenario, r.layout));
            assert!(
                v.allowed,
                "{file} {} ran but is denied: {}",
                r.id, v.message
            );
            if ONCE_OVER_USABLE.contains(&(file, r.id.as_str())) {
                assert_ne!(
                    v.reason,
                    Reason::WithinBand,
                    "{file} {} ran but is predicted over usable again: {:?}",
                    r.id,
                    v.warnings
                );
                once_over.push(r.id.clone());
            }
            if !v.warnings.is_empty() {
                warned.push(format!("{file} {}", r.id));
            }
        }
    }
    for (file, id, why) in NOT_JOBS {
        assert!(
            not_jobs.iter().any(|(f, i)| f == file && i == id),
            "{file} {id} is a job now: drop it from NOT_JOBS ({why})"
        );
    }
    // memory.csv: 57 Megatron-family rows that ran (47 + the 10 without a peak); the
    // throughput CSVs: 19 + 26 + 54 + the 123 of moe-nongated.csv the model projects (the three
    // Megatron-Bridge 25.11 DeepSeek-V3 rows without MTP, whose 61 layers split evenly over no
    // stage count, with the most even split since `validate::most_even_split`).
    assert!(judged >= 270, "{judged} rows judged");
    assert_eq!(once_over.len(), ONCE_OVER_USABLE.len(), "{once_over:?}");
    println!("{judged} runs judged, admitted with a warning: {warned:?}");
}

#[test]
fn oom_runs_the_model_covers_are_never_admitted_silently() {
    // Every run that ran out of memory, of the configurations the model covers (no option it
    // lacks), is denied or admitted with a warning: none passes as plainly fitting.
    let c = Catalog::builtin().unwrap();
    let mut checked = 0;
    for r in row_jobs(MEMORY, &c).unwrap().jobs {
        if r.outcome != Outcome::Oom || r.needs_option.is_some() {
            continue;
        }
        checked += 1;
        let v = judge(&job(r.scenario, r.layout));
        assert!(
            !v.allowed || !v.warnings.is_empty(),
            "{} ran out of memory but is admitted without a warning",
            r.id
        );
    }
    assert!(checked >= 2, "{checked}");
}

#[test]
fn fine_grained_offload_is_read_and_admits_the_recipe_that_needs_it() {
    // Megatron-MoE-ModelZoo's Qwen3-235B MXFP8 recipe on 256 GB200 offloads expert_fc1 and
    // moe_act (moe-nongated.csv MZ-q235-gb200-mxfp8): admitted with them, denied without.
    let c = Catalog::builtin().unwrap();
    let r = row_jobs(MOE_NONGATED, &c)
        .unwrap()
        .jobs
        .into_iter()
        .find(|r| r.id == "MZ-q235-gb200-mxfp8")
        .expect("row");
    assert!(r.layout.offload_modules.is_some());
    let with = judge(&job(r.scenario.clone(), r.layout.clone()));
    assert!(with.allowed && with.warnings.is_empty(), "{}", with.message);
    let mut without = r.layout.clone();
    without.offload_modules = None;
    let v = judge(&job(r.scenario, without));
    assert!(!v.allowed, "{}", v.message);
}

fn gpt_oss_on_b200(micro_batch_size: u32) -> (Scenario, Layout) {
    let s = common::scenario("gpt-oss-120b", "b200", 64, 8, 4096, 512, Precision::Bf16);
    let l = Layout {
        ep: 8,
        micro_batch_size,
        grad_reduce_in_fp32: true,
        attention_dropout: Fraction::ZERO,
        hidden_dropout: Fraction::ZERO,
        ..Layout::default()
    };
    (s, l)
}

/// Qwen3-30B-A3B FP8 on 16 H100, TP1 PP2 VPP24 EP8, no dropout: the published row N5
/// (Megatron-Bridge 25.11, which ran with BF16 gradients) at MBS 2, here with Megatron's
/// default FP32 gradient accumulation (no `--grad-reduce-in-bf16`).
fn qwen3_30b_on_h100(micro_batch_size: u32) -> (Scenario, Layout) {
    let s = common::scenario(
        "qwen3-30b-a3b",
        "h100-sxm",
        16,
        8,
        4096,
        512,
        Precision::Fp8,
    );
    let l = Layout {
        pp: 2,
        vpp: 24,
        ep: 8,
        schedule: primus_oracle::layout::Schedule::Interleaved,
        micro_batch_size,
        grad_reduce_in_fp32: true,
        attention_dropout: Fraction::ZERO,
        hidden_dropout: Fraction::ZERO,
        ..Layout::default()
    };
    (s, l)
}

#[test]
fn over_usable_within_the_band_is_admitted_with_a_warning_beyond_it_denied() {
    // Qwen3-30B-A3B FP8 on 16 H100 (row N5, which ran with BF16 gradients and is predicted
    // 2.1% under usable) with FP32 gradients is predicted 4.3% over usable at MBS 2 (82.1 of
    // 78.75 GiB), within the MoE band (the largest over-prediction of a measured MoE peak,
    // +5%); MBS 4 beyond it.
    let (s, l) = qwen3_30b_on_h100(2);
    let band = Band::of(&s);
    let usable = s.hardware.usable_bytes();
    let (peak, _) = memory::peak_bytes(&s, &l);
    assert!(
        peak > usable && peak <= band.deny_above(usable),
        "{} GiB",
        peak / 1024f64.powi(3)
    );
    let v = judge(&job(s.clone(), l.clone()));
    assert!(v.allowed);
    assert_eq!(v.reason, Reason::WithinBand);
    assert_eq!(v.warnings.len(), 1, "{:?}", v.warnings);
    assert!(
        v.warnings[0]
            .contains("within the memory model's measured error band -24%/+5% (Megatron MoE jobs)"),
        "{:?}",
        v.warnings
    );
    let big = Layout {
        micro_batch_size: 4,
        ..l
    };
    assert!(memory::peak_bytes(&s, &big).0 > band.deny_above(usable));
    let v = judge(&job(s.clone(), big.clone()));
    assert!(!v.allowed);
    assert_eq!(v.reason, Reason::Oom);
    assert!(
        v.message
            .contains("beyond the memory model's measured error band -24%/+5% (Megatron MoE jobs)"),
        "{}",
        v.message
    );
    // The same job with a memory-relevant flag the model does not model is admitted, with a
    // warning naming the flag.
    let mut unmodelled = job(s, big);
    unmodelled
        .unmodelled
        .push(("--enable-cuda-graph".into(), "CUDA-graph memory pools"));
    let v = judge(&unmodelled);
    assert!(v.allowed, "{}", v.message);
    assert_eq!(v.reason, Reason::Unmodelled);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("--enable-cuda-graph") && w.contains("does not model")),
        "{:?}",
        v.warnings
    );
}

#[test]
fn a_fitting_job_with_an_unmodelled_flag_gets_a_warning_naming_it() {
    let (s, l) = gpt_oss_on_b200(1);
    let mut j = job(s, l);
    j.unmodelled
        .push(("--moe-enable-deepep".into(), "DeepEP dispatcher buffers"));
    let v = judge(&j);
    assert!(v.allowed);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("--moe-enable-deepep (DeepEP dispatcher buffers)")),
        "{:?}",
        v.warnings
    );
}

#[test]
fn memory_options_and_the_allocator_environment_are_read_from_the_job() {
    use primus_webhook::pytorchjob::derive;
    let mut job = example("fitting-pytorchjob");
    edit_script(
        &mut job,
        "--use-flash-attn",
        "--use-flash-attn --hidden-dropout 0.0 --attention-dropout 0.0 \
         --use-precision-aware-optimizer --main-grads-dtype bf16 --exp-avg-dtype bf16 \
         --exp-avg-sq-dtype bf16 --cuda-graph-impl transformer_engine --enable-cuda-graph",
    );
    set_env(
        &mut job,
        serde_json::json!([
            {"name": "PYTORCH_HIP_ALLOC_CONF", "value": "expandable_segments:True"}
        ]),
    );
    let c = Catalog::builtin().unwrap();
    let d = derive(&job, &Default::default(), &c).expect("derivable");
    assert_eq!(d.layout.hidden_dropout, Fraction::ZERO);
    assert!(d.layout.precision_aware_optimizer && d.layout.expandable_segments);
    assert_eq!(
        d.layout.exp_avg_dtype,
        primus_oracle::layout::OptimizerDtype::Bf16
    );
    // Transformer Engine graphs are read and modelled (`memory::graphs`); the legacy switch
    // beside them is not.
    assert_eq!(
        d.layout.cuda_graph.implementation,
        primus_oracle::layout::CudaGraphImpl::TransformerEngine
    );
    assert_eq!(
        d.unmodelled,
        vec![("--enable-cuda-graph".to_string(), "CUDA-graph memory pools")]
    );
    let v = judge(&d);
    assert!(v.allowed);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("--enable-cuda-graph (CUDA-graph memory pools)")),
        "{:?}",
        v.warnings
    );
    // A dtype the precision-aware optimizer does not take names its flag.
    edit_script(&mut job, "--exp-avg-dtype bf16", "--exp-avg-dtype int4");
    let e = derive(&job, &Default::default(), &c).unwrap_err();
    assert!(e.to_string().contains("--exp-avg-dtype"), "{e}");
}

#[test]
fn rocm_scratch_retention_in_the_environment_is_named_and_does_not_stop_a_denial() {
    // HSA_NO_SCRATCH_RECLAIM=1 (set by AMD's Primus MoE scripts) keeps every scratch request
    // assigned to its hardware queue for the process's life: device memory outside PyTorch's
    // allocator that the model does not count. The job is derived from the example with the
    // variable in its container's environment; the warning names it, and it is gone at 0.
    use primus_webhook::pytorchjob::derive;
    let c = Catalog::builtin().unwrap();
    let with_env = |value: &str| {
        let mut job = example("fitting-pytorchjob");
        set_env(
            &mut job,
            serde_json::json!([{"name": "HSA_NO_SCRATCH_RECLAIM", "value": value}]),
        );
        derive(&job, &Default::default(), &c).expect("derivable")
    };
    let d = with_env("1");
    assert!(d.unmodelled.is_empty(), "{:?}", d.unmodelled);
    assert_eq!(d.adds_memory.len(), 1, "{:?}", d.adds_memory);
    assert_eq!(d.adds_memory[0].0, "HSA_NO_SCRATCH_RECLAIM=1");
    let scratch_warning = |v: &Verdict| {
        v.warnings.iter().any(|w| {
            w.contains("HSA_NO_SCRATCH_RECLAIM=1")
                && w.contains("scratch")
                && w.contains("does not count")
        })
    };
    let v = judge(&d);
    assert!(v.allowed, "{}", v.message);
    assert!(scratch_warning(&v), "{:?}", v.warnings);
    assert!(with_env("0").adds_memory.is_empty());
    // Memory it can only add does not turn a denial into an admission, unlike an unmodelled
    // flag: the same job at a micro-batch size far over usable is still denied, and warned.
    let (s, l) = gpt_oss_on_b200(1);
    let big = Layout {
        micro_batch_size: 4,
        ..l
    };
    let mut over = job(s, big);
    over.adds_memory = d.adds_memory.clone();
    let v = judge(&over);
    assert!(!v.allowed, "{}", v.message);
    assert_eq!(v.reason, Reason::Oom);
    assert!(scratch_warning(&v), "{:?}", v.warnings);
}
