//! `primus memory -f PLAN [-o table|json]`: exit codes, JSON field names (DESIGN.md section 4),
//! and one clear error line naming the field for bad plans.

mod common;

use common::{example, plan_file, primus};

#[test]
fn table_marks_the_bottleneck() {
    let out = primus()
        .args(["memory", "-f", &example("llama3.1-70b-h100.yaml")])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(text.contains("STAGE"), "{text}");
    assert!(text.contains("WEIGHTS") && text.contains("ACTIV") && text.contains("OTHER"));
    // 8 stage rows, one of them marked.
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.trim_start()
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
        .collect();
    assert_eq!(rows.len(), 8, "{text}");
    assert_eq!(rows.iter().filter(|r| r.contains('*')).count(), 1, "{text}");
    assert!(text.contains("Capacity 80.00 GiB"), "{text}");
}

/// `primus memory -f PLAN -o FMT`'s standard output, which must succeed.
fn memory_output(plan: &std::path::Path, fmt: &str) -> String {
    let out = primus()
        .args(["memory", "-f", plan.to_str().unwrap(), "-o", fmt])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    String::from_utf8(out).unwrap()
}

#[test]
fn the_optimizer_steps_gradient_copy_is_named_not_added_to_the_peak() {
    // Llama 3.1 8B on 8 H100, TP1 PP1 DP8, BF16 gradients: the distributed optimizer's FP32
    // copy of its gradient shard, 4 bytes x 8,030,261,248 / 8 = 3.74 GiB, exists for the step
    // only; a 4096-token micro-batch's activations are larger, so the total leaves it out.
    let plan = plan_file(
        "spec:\n  model: {preset: llama3.1-8b}\n  cluster: {gpu: h100-sxm, gpus: 8}\n  training: {seqLength: 4096, globalBatchSize: 8}\n  parallelism: {tp: 1, pp: 1, microBatchSize: 1, gradReduceInFp32: false}\n",
    );
    let run = |fmt: &str| memory_output(plan.path(), fmt);
    let text = run("table");
    assert!(
        text.contains("The optimizer step adds 3.74 GiB (an FP32 copy of the BF16 gradient shard)"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
    let st = &v["memory"]["stages"][0];
    let copy = st["stepGradCopyBytes"].as_f64().unwrap();
    assert!((copy - 4.0 * 8_030_261_248.0 / 8.0).abs() < 1.0, "{copy}");
    let parts = [
        "weightsBytes",
        "gradientsBytes",
        "optimizerBytes",
        "activationsBytes",
        "otherBytes",
    ]
    .iter()
    .map(|k| st[*k].as_f64().unwrap())
    .sum::<f64>();
    let total = st["totalBytes"].as_f64().unwrap();
    assert!((parts - total).abs() < 1e-6 * total, "{parts} vs {total}");
    assert!(st["activationsBytes"].as_f64().unwrap() > copy);
}

#[test]
fn the_pipeline_inputs_kept_between_iterations_are_named() {
    // Megatron-LM's CI memory-test GPT (memory.csv MC-tp1-pp4-*) at TP1 PP4 VPP4, MBS 1,
    // sequence 8192 on 8 H100: each chunk fed by the previous stage keeps its last input and
    // that input's gradient, 2 x 8192 x 4096 x 2 B = 128 MiB; the first stage has 3 such
    // chunks (its first reads data), the last stage 4.
    let plan = plan_file(
        "spec:\n  model: {preset: mcore-ci-gpt-7b}\n  cluster: {gpu: h100-sxm, gpus: 8}\n  training: {seqLength: 8192, globalBatchSize: 8}\n  parallelism: {tp: 1, pp: 4, vpp: 4, schedule: interleaved, microBatchSize: 1, sequenceParallel: false}\n",
    );
    let run = |fmt: &str| memory_output(plan.path(), fmt);
    let v: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
    let stages = v["memory"]["stages"].as_array().unwrap();
    let kept = |i: usize| stages[i]["pipelineInputsBytes"].as_f64().unwrap();
    let pair = 2.0 * 8192.0 * 4096.0 * 2.0;
    assert_eq!(kept(0), 3.0 * pair);
    assert_eq!(kept(3), 4.0 * pair);
    let text = run("table");
    assert!(
        text.contains(
            "GiB of pipeline inputs (each model chunk's last received input and its gradient)"
        ),
        "{text}"
    );
}

#[test]
fn the_shared_expert_side_stream_pools_are_named_and_in_the_other_bytes() {
    // DeepSeek-V2-Lite on 8 MI355X, EP8, MBS 12, alltoall with shared-expert overlap on a
    // Megatron-Core that gives each MoE layer its own stream (memory.csv MP-V6): 26 pools of
    // 20,992 B x 49,152 tokens = 24.98 GiB, reserved, inside the other bytes.
    let plan = plan_file(
        "spec:\n  model: {preset: deepseek-v2-lite}\n  cluster: {gpu: mi355x, gpus: 8}\n  training: {seqLength: 4096, globalBatchSize: 768}\n  parallelism:\n    ep: 8\n    microBatchSize: 12\n    moe: {tokenDispatcher: alltoall, groupedGemm: legacy, sharedExpertOverlap: true, sharedExpertStreamPerLayer: true}\n",
    );
    let run = |fmt: &str| memory_output(plan.path(), fmt);
    let text = run("table");
    assert!(
        text.contains("Of the other bytes, 24.98 GiB stay reserved in the shared-expert overlap's side-stream pools"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
    let st = &v["memory"]["stages"][0];
    let pools = st["sideStreamPoolBytes"].as_f64().unwrap();
    assert!((pools - 26.0 * 20_992.0 * 49_152.0).abs() < 1.0, "{pools}");
    assert!(st["otherBytes"].as_f64().unwrap() > pools);
}

#[test]
fn json_has_the_design_field_names() {
    let out = primus()
        .args([
            "memory",
            "-f",
            &example("deepseek-v3-h100.yaml"),
            "-o",
            "json",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["layout"]["tp"], 2);
    assert_eq!(v["layout"]["pipelineLayout"], "Et|(tt|)*30mL");
    let m = &v["memory"];
    for key in [
        "peakBytes",
        "capacityBytes",
        "usableBytes",
        "headroomBytes",
        "bottleneckStage",
    ] {
        assert!(m[key].is_number(), "memory.{key} in {m}");
    }
    assert!(m["fits"].is_boolean());
    let stages = m["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 8);
    for key in [
        "weightsBytes",
        "gradientsBytes",
        "optimizerBytes",
        "activationsBytes",
        "otherBytes",
        "totalBytes",
        "inflightMicrobatches",
        "layers",
    ] {
        assert!(stages[0][key].is_number(), "stages[0].{key}");
    }
    assert_eq!(stages[7]["mtpLayers"], 1);
}

#[test]
fn missing_parallelism_is_an_input_error() {
    let f = plan_file(
        "spec:\n  model: {preset: llama3.1-8b}\n  cluster: {gpu: h100-sxm, gpus: 8}\n  training: {seqLength: 4096, globalBatchSize: 8}\n",
    );
    let out = primus()
        .args(["memory", "-f"])
        .arg(f.path())
        .assert()
        .code(2)
        .get_output()
        .clone();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("error: spec.parallelism: missing"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn illegal_layout_names_the_field() {
    let f = plan_file(
        "spec:\n  model: {preset: llama3.1-70b}\n  cluster: {gpu: h100-sxm, gpus: 64}\n  training: {seqLength: 8192, globalBatchSize: 128}\n  parallelism: {tp: 16, pp: 4}\n",
    );
    let out = primus()
        .args(["memory", "-o", "json", "-f"])
        .arg(f.path())
        .assert()
        .code(2)
        .get_output()
        .clone();
    let err = String::from_utf8(out.stderr).unwrap();
    assert_eq!(
        err,
        "error: spec.parallelism.tp: 16 does not divide the model's 8 key/value heads (GQA groups); Megatron splits whole groups over TP\n"
    );
}

#[test]
fn the_verdict_comes_with_the_measured_error_band() {
    // Table: the band of the kind of job (DeepSeek-V3 is MoE) beside the verdict; JSON: the
    // band's fractions and the verdict.
    let out = primus()
        .args(["memory", "-f", &example("deepseek-v3-h100.yaml")])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    let band = primus_oracle::memory::JobKind::MegatronMoe.band();
    assert!(
        text.contains(&format!("Error band {}", band.describe())),
        "{text}"
    );
    assert!(text.contains("verdict: "), "{text}");
    let out = primus()
        .args([
            "memory",
            "-f",
            &example("llama3.1-70b-h100.yaml"),
            "-o",
            "json",
        ])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let dense = primus_oracle::memory::JobKind::MegatronDense.band();
    assert_eq!(v["band"]["kind"], "megatron-dense");
    assert_eq!(v["band"]["over"].as_f64(), Some(dense.over));
    assert_eq!(v["band"]["under"].as_f64(), Some(dense.under));
    assert!(
        ["fits", "at-risk", "within-band", "exceeds"].contains(&v["verdict"].as_str().unwrap()),
        "{v}"
    );
}

#[test]
fn cuda_graph_samples_and_fixed_segment_fragmentation_are_named() {
    // Qwen3-30B-A3B on 8 B200, EP8, MBS 4, Transformer Engine graphs of attention: 48 layers'
    // static masks of 4 x 4096 x 4096 bools = 3 GiB, in the other bytes. Without expandable
    // segments its allocated peak times 1.44 is over the B200's usable memory: named with the
    // fix; with them, not.
    let spec = |expandable: bool| {
        format!(
            "spec:\n  model: {{preset: qwen3-30b-a3b}}\n  cluster: {{gpu: b200, gpus: 8}}\n  training: {{seqLength: 4096, globalBatchSize: 512, precision: fp8}}\n  parallelism:\n    ep: 8\n    microBatchSize: 4\n    gradReduceInFp32: false\n    expandableSegments: {expandable}\n    cudaGraph: {{impl: transformer_engine, modules: [attn, moe_router, moe_preprocess]}}\n    moe: {{tokenDispatcher: flex, flexBackend: hybridep, groupedGemm: grouped, permuteFusion: true, forceLoadBalancing: true}}\n"
        )
    };
    let fixed = plan_file(&spec(false));
    let text = memory_output(fixed.path(), "table");
    assert!(
        text.contains("Of the other bytes, 3.00 GiB are the CUDA graphs' static samples"),
        "{text}"
    );
    assert!(
        text.contains("fixed-size segments may fragment past usable memory")
            && text.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&memory_output(fixed.path(), "json")).unwrap();
    let st = &v["memory"]["stages"][0];
    assert_eq!(
        st["graphStaticBytes"].as_f64().unwrap(),
        48.0 * 4.0 * 4096.0 * 4096.0
    );
    let expandable = plan_file(&spec(true));
    let text = memory_output(expandable.path(), "table");
    assert!(!text.contains("fixed-size segments"), "{text}");
}
