//! The memory model against measured peaks (issue 15): `oracle/tests/data/memory.csv` and the
//! throughput CSVs through `validate::memory`, the CI gate on the Megatron-family error, and
//! the error band of `memory::band` checked against every row of its kind (a model change that
//! moves a row outside its band, or leaves the band looser than the rows, fails here).

use primus_oracle::memory::{JobKind, MEGATRON_DENSE_OVER, MEGATRON_MOE_OVER};
use primus_oracle::profiles::Catalog;
use primus_oracle::validate::RowStatus;
use primus_oracle::validate::memory::{
    Framework, MemoryValidation, Outcome, PeakMetric, group, validate_memory_text,
};

const MEMORY: &str = include_str!("data/memory.csv");
const PUBLISHED: &str = include_str!("data/published.csv");
const EXTRA: &str = include_str!("data/extra.csv");
const MOE: &str = include_str!("data/moe.csv");
const MOE_NONGATED: &str = include_str!("data/moe-nongated.csv");

/// Rows of the throughput CSVs that issue 16 moved to `moe-nongated.csv` (their throughput is
/// not gated); they ran all the same, and their memory verdicts stay in this set.
const MOVED: [&str; 7] = ["N4", "N5", "N10", "N12", "XN3", "XN4", "XN6"];

/// The moved rows with the header of their file.
fn moved() -> String {
    MOE_NONGATED
        .lines()
        .enumerate()
        .filter(|(i, line)| *i == 0 || MOVED.iter().any(|id| line.starts_with(&format!("{id},"))))
        .map(|(_, line)| format!("{line}\n"))
        .collect()
}

fn validate(text: &str) -> MemoryValidation {
    validate_memory_text(text, &Catalog::builtin().unwrap()).expect("valid file")
}

/// Rounded up to the next whole percent, as the band constants are.
fn ceil_pct(x: f64) -> f64 {
    ((x * 100.0 - 1e-9).ceil().max(0.0)) / 100.0
}

#[test]
fn every_row_is_read_and_names_its_source_and_assumptions() {
    let v = validate(MEMORY);
    assert_eq!(v.rows.len(), 85);
    let ids: std::collections::BTreeSet<&str> = v.rows.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids.len(), 85, "ids are unique");
    for r in &v.rows {
        // Only TorchTitan's FSDP + PP rows cannot be projected (Megatron's FSDP has no PP, and
        // their 126 layers need TorchTitan's split): they are reported, not skipped.
        if r.status != RowStatus::Ok {
            assert_eq!(
                r.framework,
                Framework::TorchTitan,
                "{}: {:?}",
                r.id,
                r.status
            );
        }
    }
    assert_eq!(v.failed, 6);
    for line in MEMORY.lines().skip(1) {
        assert!(line.contains("github") || line.contains('/'), "{line}");
    }
    let c = Catalog::builtin().unwrap();
    let records = primus_oracle::validate::parse_csv(MEMORY).unwrap();
    let header = &records[0].1;
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    for (_, f) in records.iter().skip(1) {
        assert!(!f[col("source")].is_empty(), "{}: no source", f[0]);
        assert!(!f[col("notes")].is_empty(), "{}: no assumptions", f[0]);
        assert!(c.model(&f[col("model")]).is_some(), "{}", f[0]);
        assert!(
            ["high", "medium", "medium-low", "low"].contains(&f[col("trust")].as_str()),
            "{}",
            f[0]
        );
    }
    // Both vendors, dense and MoE, runs that ran out of memory.
    assert!(v.rows.iter().filter(|r| r.outcome == Outcome::Oom).count() >= 8);
}

#[test]
fn megatron_family_error_gate() {
    // The CI gate on the rows that ran, with a peak, needing no option the model lacks.
    // The median target (<= 5%) is met since Megatron-LM's six CI memory-test rows joined
    // (26 rows 5.2% -> 32 rows 1.8%; they are within 2.3%, the AMD rows alone stay at 11.7%);
    // the max target (<= 12%) is not: the Primus MoE runs
    // on MI355X with 32+ GPUs are under-predicted by 12-22% (MP-Q, MP-D1, MP-D2, MP-D4) and
    // the single-node alltoall runs at small micro-batches by 11-23% (MP-V1..V4, a roughly
    // constant 16-19 GiB of device-used memory), which no term of the model explains yet
    // (their MBS, dispatcher and routing balance are partly assumed, see their notes), while
    // the Primus-Turbo DeepEP rows MP-V7..V10, MP-V5/V6 and the NVIDIA rows are within 6% and
    // MP-Q30a is at +4.6% (its Transformer Engine loss counted at the unfused FP32 softmax).
    // The median was 9.3% until the shared-expert overlap's per-layer side-stream pools were
    // modelled (stop 34: MP-V1..V6 -25.8..-8.2% -> -23.2..+1.2%), 4.7% over 24 rows before
    // Primus' recompute layer IDs put MP-D2 and MP-D4 in the gate. The max was 27.4% (MP-D1)
    // until their legacy grouped GEMM's experts ran in BF16 (stop 34: MP-D1/D2/D4
    // -27.4/-24.8/-24.7% -> -21.5/-17.5/-15.7%). This gate holds the model where it is;
    // tighten it as rows are explained.
    let v = validate(MEMORY);
    let table: Vec<String> = v
        .rows
        .iter()
        .filter(|r| r.gated())
        .map(|r| format!("{} {:+.1}%", r.id, 100.0 * r.error().unwrap()))
        .collect();
    let m = v.aggregate(group::MEGATRON).unwrap();
    assert!(m.rows >= 32, "{table:?}");
    assert!(m.median_abs_error.unwrap() <= 0.025, "{table:?}");
    assert!(m.max_abs_error.unwrap() <= 0.24, "{table:?}");
    // The NVIDIA rows it gates: Megatron-Bridge's optimizer-offload sweep (model state after
    // the step) within 1%, the offload fractions' 8 bytes per sharded parameter; Megatron-LM's
    // CI memory tests (a 7B GPT at TP1 PP4 VPP8 and TP4 PP1 on H100, A100 and GB200, allocated
    // peaks, joined after the model was built: out of sample) within 2.3%.
    let nvidia = v.aggregate(group::MEGATRON_NVIDIA).unwrap();
    assert_eq!(nvidia.rows, 12);
    assert!(nvidia.max_abs_error.unwrap() <= 0.025, "{table:?}");
    for r in v.rows.iter().filter(|r| r.id.starts_with("MC-")) {
        assert!(r.gated(), "{}", r.id);
        assert_eq!(r.measurements[0].metric, PeakMetric::Allocated, "{}", r.id);
    }
    for r in v
        .rows
        .iter()
        .filter(|r| r.id.starts_with("MB-O") && r.gated())
    {
        assert_eq!(r.measurements[0].metric, PeakMetric::AfterStep);
    }
}

#[test]
fn every_gated_rows_error_lies_inside_its_kinds_band_and_the_band_is_no_looser() {
    let v = validate(MEMORY);
    for kind in JobKind::ALL {
        let band = kind.band();
        let errors: Vec<(String, f64)> = v
            .rows
            .iter()
            .filter(|r| r.gated() && r.kind() == kind)
            .flat_map(|r| r.measurements.iter().map(|m| (r.id.clone(), m.error)))
            .collect();
        assert!(!errors.is_empty(), "{kind:?}");
        for (id, e) in &errors {
            assert!(
                band.contains(*e),
                "{id}: error {:+.1}% outside the {} band {}",
                e * 100.0,
                kind.as_str(),
                band.describe()
            );
        }
        // A run that ran out of memory needed more than usable: a prediction below usable is
        // an under-prediction of at least (usable / predicted - 1), which the band must cover,
        // unless the fixed-segment warning covers it (MB-L1, MB-L8: fragmentation OOMs of
        // the default allocator, which its 1.44 ratio comes from).
        let oom_bounds: Vec<(String, f64)> = v
            .rows
            .iter()
            .filter(|r| {
                r.outcome == Outcome::Oom
                    && r.status == RowStatus::Ok
                    && r.needs_option.is_none()
                    && !r.fixed_segments_at_risk
                    && r.framework.megatron_family()
                    && r.kind() == kind
            })
            .filter_map(|r| Some((r.id.clone(), r.usable_gib? / r.predicted_total_gib? - 1.0)))
            .collect();
        let under = errors
            .iter()
            .map(|(_, e)| -e)
            .chain(oom_bounds.iter().map(|(_, b)| *b))
            .fold(0.0, f64::max);
        assert_eq!(
            band.under,
            ceil_pct(under),
            "{kind:?}: the under band is the largest under-prediction, rounded up \
             (OOM runs' lower bounds: {oom_bounds:?})"
        );
    }
}

#[test]
fn every_run_that_ran_lies_within_the_over_band() {
    // A run that ran used at most usable memory: a prediction above usable is an
    // over-prediction of at least (predicted / usable - 1), which the band must cover. With
    // the gated rows' measured over-predictions, that makes the band: checked exactly.
    let mut over = [0.0f64; 2];
    let moved = moved();
    for text in [MEMORY, PUBLISHED, EXTRA, MOE, moved.as_str()] {
        let v = validate(text);
        for r in &v.rows {
            if r.outcome != Outcome::Ran || !r.framework.megatron_family() {
                continue;
            }
            let Some(band) = r.band else { continue };
            let k = (r.kind() == JobKind::MegatronMoe) as usize;
            let (Some(total), Some(usable)) = (r.predicted_total_gib, r.usable_gib) else {
                continue;
            };
            let bound = total / usable - 1.0;
            assert!(
                bound <= band.over,
                "{} ran but is predicted {:+.1}% over usable, beyond its band {}",
                r.id,
                bound * 100.0,
                band.describe()
            );
            over[k] = over[k].max(bound);
            if r.gated() {
                for m in &r.measurements {
                    over[k] = over[k].max(m.error);
                }
            }
        }
    }
    assert_eq!(MEGATRON_DENSE_OVER, ceil_pct(over[0]), "dense: {}", over[0]);
    assert_eq!(MEGATRON_MOE_OVER, ceil_pct(over[1]), "MoE: {}", over[1]);
}

#[test]
fn verdicts_agree_with_what_happened() {
    // No run that ran would be denied. The runs that ran out of memory the model does not
    // predict over usable are Primus MoE runs on MI355X, where it under-predicts every
    // measured peak of 32+ GPUs by 12-22%: MP-Q6 (Qwen3-235B, VPP2 on 32 GPUs: 253 of 287 GiB,
    // at risk), MP-D5 (DeepSeek-V3 on 256 GPUs with 8 recomputed layer IDs: 257 GiB, at risk)
    // and MP-D6 (the same on 512 GPUs: 248 GiB, at risk). MP-D5 and MP-D6 were judged on a
    // block-method stand-in (171-180 GiB) until the layer IDs were modelled, and at 231 and
    // 223 GiB until stop 34 ran their legacy grouped GEMM's experts in BF16. Counted since the
    // CUDA graphs are modelled (`memory::graphs`; they were reported, not counted, as rows
    // needing that option): MB-L1 and MB-L8 (Megatron-Bridge's Llama 3.1 70B SFT on 32 H100
    // with fixed-size allocator segments, 66 of 79 GiB: "caused by memory fragmentation, not
    // insufficient capacity"; the webhook warns of it, `fixed_segments_at_risk`) and MB-G1
    // (gpt-oss-120b on 32 H100, 78.5 of 78.8 GiB, at risk).
    for (name, text) in [
        ("memory", MEMORY),
        ("published", PUBLISHED),
        ("extra", EXTRA),
        ("moe", MOE),
        ("moe-nongated", MOE_NONGATED),
    ] {
        let v = validate(text);
        assert!(
            v.false_denials.is_empty(),
            "{name}: false denials {:?}",
            v.false_denials
        );
        assert!(
            v.missed_ooms
                .iter()
                .all(|id| ["MP-Q6", "MP-D5", "MP-D6", "MB-L1", "MB-L8", "MB-G1"]
                    .contains(&id.as_str())),
            "{name}: missed OOMs {:?}",
            v.missed_ooms
        );
    }
}

#[test]
fn a_measured_peak_must_be_memory_the_gpu_has() {
    // memory.csv's first row (MP-L1, Llama 2 7B on MI300X, 16.26 GiB reserved) with its peak
    // replaced: not a finite number, not above 0, or more than the MI300X's 192 GiB is a bad
    // row with its reason, not a -100% error in the gate.
    let mut lines = MEMORY.lines();
    let header = lines.next().expect("header");
    let row = lines.next().expect("MP-L1");
    assert!(
        row.starts_with("MP-L1,") && row.contains(",16.26,"),
        "{row}"
    );
    for (peak, why) in [
        ("NaN", "\"NaN\" is not a finite number"),
        ("inf", "\"inf\" is not a finite number"),
        ("0", "must be greater than 0"),
        (
            "192.5",
            "192.5 GiB is more than the AMD Instinct MI300X's 192 GiB",
        ),
        (
            "1e308",
            "1e308 GiB is more than the AMD Instinct MI300X's 192 GiB",
        ),
    ] {
        let text = format!(
            "{header}\n{}\n",
            row.replacen(",16.26,", &format!(",{peak},"), 1)
        );
        let v = validate(&text);
        match &v.rows[0].status {
            RowStatus::BadRow(m) => assert!(
                m.contains("measuredPeakReservedGiB") && m.contains(why),
                "{peak}: {m}"
            ),
            s => panic!("{peak}: {s:?}"),
        }
    }
    // At capacity is a measurement (MP-Q7 measured 287.1 of the MI355X's 288 GiB).
    let text = format!("{header}\n{}\n", row.replacen(",16.26,", ",192,", 1));
    assert_eq!(validate(&text).rows[0].status, RowStatus::Ok);
}
