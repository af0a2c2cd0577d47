//! Upper bounds on the sizes a job or plan may give, checked before the oracle computes with
//! them: beyond these nothing is a real training job, and below them the memory model's
//! integer arithmetic stays far from overflow (a request must never panic the webhook).

use primus_oracle::FieldError;
use primus_oracle::layout::Layout;
use primus_oracle::megatron::{MegatronArgs, flag};
use primus_oracle::model::ModelCard;

/// Upper bounds that keep the memory model's integer arithmetic far from overflow. Anything
/// beyond them is not a real training job.
pub mod limits {
    pub const LAYERS: u32 = 4096;
    pub const HIDDEN: u64 = 1 << 17;
    pub const FFN: u64 = 1 << 20;
    pub const HEADS: u32 = 4096;
    pub const VOCAB: u64 = 1 << 23;
    pub const EXPERTS: u32 = 1 << 12;
    pub const SEQ: u64 = 1 << 24;
    pub const GBS: u64 = 1 << 32;
    pub const AXIS: u32 = 1 << 16;
    pub const WORLD: u64 = 1 << 24;
}

pub fn check_card(m: &ModelCard, at: &str) -> Result<(), FieldError> {
    let big = |name: &str, v: u64, max: u64| -> Result<(), FieldError> {
        if v > max {
            Err(FieldError::new(
                format!("{at}{name}"),
                format!("{v} is beyond any real model (at most {max})"),
            ))
        } else {
            Ok(())
        }
    };
    big("layers", m.layers as u64, limits::LAYERS as u64)?;
    big("hiddenSize", m.hidden_size, limits::HIDDEN)?;
    big("ffnHiddenSize", m.ffn_hidden_size, limits::FFN)?;
    big(
        "attentionHeads",
        m.attention_heads as u64,
        limits::HEADS as u64,
    )?;
    big("kvHeads", m.kv_heads() as u64, limits::HEADS as u64)?;
    big("headDim", m.head_dim(), limits::HIDDEN)?;
    big("vocabSize", m.vocab_size, limits::VOCAB)?;
    big("mtpLayers", m.mtp_layers as u64, limits::LAYERS as u64)?;
    big("positionEmbeddings", m.position_embeddings, limits::SEQ)?;
    if let Some(e) = &m.moe {
        big(
            "moe.numExperts",
            e.num_experts as u64,
            limits::EXPERTS as u64,
        )?;
        big("moe.topK", e.top_k as u64, limits::EXPERTS as u64)?;
        big("moe.moeFfnHiddenSize", e.moe_ffn_hidden_size, limits::FFN)?;
        big(
            "moe.sharedExpertFfnHiddenSize",
            e.shared_expert_ffn_hidden_size.unwrap_or(0),
            limits::FFN,
        )?;
        big(
            "moe.sharedExperts",
            e.shared_experts as u64,
            limits::EXPERTS as u64,
        )?;
    }
    if let Some(a) = &m.mla {
        big("mla.qLoraRank", a.q_lora_rank.unwrap_or(0), limits::HIDDEN)?;
        big("mla.kvLoraRank", a.kv_lora_rank, limits::HIDDEN)?;
        big("mla.qkNopeHeadDim", a.qk_nope_head_dim, limits::HIDDEN)?;
        big("mla.qkRopeHeadDim", a.qk_rope_head_dim, limits::HIDDEN)?;
        big("mla.vHeadDim", a.v_head_dim, limits::HIDDEN)?;
    }
    if let Some(w) = m.sliding_window {
        big("slidingWindow", w, limits::SEQ)?;
    }
    Ok(())
}

/// Sizes of a layout against the world size, in u64 so nothing overflows; the oracle's
/// legality rules (`Layout::check`) run after this.
pub fn check_layout(
    l: &Layout,
    world: u64,
    name: &dyn Fn(&str) -> String,
) -> Result<(), FieldError> {
    for (f, v) in [
        ("tp", l.tp),
        ("pp", l.pp),
        ("vpp", l.vpp),
        ("cp", l.cp),
        ("ep", l.ep),
        ("etp", l.etp),
        ("microBatchSize", l.micro_batch_size),
    ] {
        if v == 0 {
            return Err(FieldError::new(name(f), "must be at least 1"));
        }
        if v > limits::AXIS {
            return Err(FieldError::new(
                name(f),
                format!("{v} is beyond any real layout (at most {})", limits::AXIS),
            ));
        }
    }
    let mp = l.tp as u64 * l.pp as u64 * l.cp as u64;
    if mp > world {
        return Err(FieldError::new(
            name("tp"),
            format!(
                "tp*pp*cp = {}*{}*{} = {mp} exceeds the job's {world} GPUs",
                l.tp, l.pp, l.cp
            ),
        ));
    }
    let grid = l.ep as u64 * l.etp as u64;
    if grid > world {
        return Err(FieldError::new(
            name("ep"),
            format!(
                "ep*etp = {}*{} = {grid} exceeds the job's {world} GPUs",
                l.ep, l.etp
            ),
        ));
    }
    for (f, v) in [
        ("firstStageLayers", l.first_stage_layers),
        ("lastStageLayers", l.last_stage_layers),
        ("recomputeLayers", Some(l.recompute_layers)),
    ] {
        if let Some(v) = v
            && v > limits::LAYERS
        {
            return Err(FieldError::new(
                name(f),
                format!("{v} is beyond any real model (at most {})", limits::LAYERS),
            ));
        }
    }
    Ok(())
}

/// Numeric Megatron flags, bounded before the oracle turns them into a model and a layout.
pub const NUMERIC_FLAGS: &[(&str, u64)] = &[
    (flag::NUM_LAYERS, limits::LAYERS as u64),
    (flag::HIDDEN, limits::HIDDEN),
    (flag::FFN_HIDDEN, limits::FFN),
    (flag::HEADS, limits::HEADS as u64),
    (flag::QUERY_GROUPS, limits::HEADS as u64),
    (flag::KV_CHANNELS, limits::HIDDEN),
    (flag::VOCAB, limits::VOCAB),
    (flag::VOCAB_ALT, limits::VOCAB),
    (flag::NUM_EXPERTS, limits::EXPERTS as u64),
    (flag::MOE_TOPK, limits::EXPERTS as u64),
    (flag::MOE_FFN_HIDDEN, limits::FFN),
    (flag::MOE_SHARED_FFN, limits::FFN),
    (flag::MOE_FIRST_DENSE, limits::LAYERS as u64),
    (flag::Q_LORA, limits::HIDDEN),
    (flag::KV_LORA, limits::HIDDEN),
    (flag::QK_HEAD_DIM, limits::HIDDEN),
    (flag::QK_POS_HEAD_DIM, limits::HIDDEN),
    (flag::V_HEAD_DIM, limits::HIDDEN),
    (flag::MTP_LAYERS, limits::LAYERS as u64),
    (flag::SEQ, limits::SEQ),
    (flag::GBS, limits::GBS),
    (flag::MBS, limits::AXIS as u64),
    (flag::TP, limits::AXIS as u64),
    (flag::PP, limits::AXIS as u64),
    (flag::CP, limits::AXIS as u64),
    (flag::EP, limits::AXIS as u64),
    (flag::ETP, limits::AXIS as u64),
    (flag::VPP_SIZE, limits::AXIS as u64),
    (flag::VPP_LAYERS, limits::LAYERS as u64),
    (flag::RECOMPUTE_NUM_LAYERS, limits::LAYERS as u64),
    (flag::FIRST_STAGE_LAYERS, limits::LAYERS as u64),
    (flag::LAST_STAGE_LAYERS, limits::LAYERS as u64),
];

pub fn check_flags(args: &MegatronArgs) -> Result<(), FieldError> {
    for &(f, max) in NUMERIC_FLAGS {
        if let Some(v) = args.get(f)
            && let Ok(n) = v.trim().parse::<u128>()
            && n > max as u128
        {
            return Err(FieldError::new(
                f,
                format!("{n} is beyond any real job (at most {max})"),
            ));
        }
    }
    Ok(())
}
