//! The shapes of a benchmark: how an op pass of the projection's op lists is named, what shape
//! a report records for it, and which kernels a GPU backend launches for it.

use crate::compute::{
    ACT_BYTES, Dims, FP8_CAST_BYTES, LayerShape, MEMORY_BWD_BYTES, Op, OpClass, OpList, Pass,
    attention_pairs, embedding_ops, head_ops, layer_ops,
};
use crate::layout::Layout;
use crate::model::{LayerKind, ModelCard};
use crate::precision::Precision;

/// One kernel a GPU backend launches for a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// `count` back-to-back launches, each on its own operands, of `batch` strided GEMMs
    /// D (m x n) = A (m x k) . B (k x n); inputs FP8 (E4M3) when `fp8`, else BF16; output BF16;
    /// FP32 accumulation.
    Gemm {
        m: u64,
        n: u64,
        k: u64,
        batch: u64,
        count: u64,
        fp8: bool,
    },
    /// `count` device-to-device copies moving `bytes` in total (each reads and writes
    /// `bytes / (2 count)`).
    Copy { bytes: u64, count: u64 },
}

impl Kernel {
    /// FLOPs of the kernel (2 per multiply-accumulate).
    pub fn flops(&self) -> f64 {
        match *self {
            Kernel::Gemm {
                m,
                n,
                k,
                batch,
                count,
                ..
            } => 2.0 * m as f64 * n as f64 * k as f64 * batch as f64 * count as f64,
            Kernel::Copy { .. } => 0.0,
        }
    }
}

/// `gemm`, `grouped-gemm`, `attention`, `memory-bound`.
pub fn kind_name(c: OpClass) -> &'static str {
    match c {
        OpClass::Gemm => "gemm",
        OpClass::GroupedGemm => "grouped-gemm",
        OpClass::Attention => "attention",
        OpClass::Memory => "memory-bound",
    }
}

/// The op class of a kind name.
pub fn kind_class(kind: &str) -> Option<OpClass> {
    match kind {
        "gemm" => Some(OpClass::Gemm),
        "grouped-gemm" => Some(OpClass::GroupedGemm),
        "attention" => Some(OpClass::Attention),
        "memory-bound" => Some(OpClass::Memory),
        _ => None,
    }
}

/// `fwd`, `dgrad`, `wgrad`.
pub fn pass_name(p: Pass) -> &'static str {
    match p {
        Pass::Forward => "fwd",
        Pass::Dgrad => "dgrad",
        Pass::Wgrad => "wgrad",
    }
}

/// The pass of a pass name.
pub fn pass_of(name: &str) -> Option<Pass> {
    match name {
        "fwd" => Some(Pass::Forward),
        "dgrad" => Some(Pass::Dgrad),
        "wgrad" => Some(Pass::Wgrad),
        _ => None,
    }
}

/// Whether a pass of an op does any work (GEMMs: all three; attention and memory-bound ops:
/// forward and backward, the latter counted as dgrad).
pub fn pass_runs(op: &Op, pass: Pass) -> bool {
    match op.class {
        OpClass::Gemm | OpClass::GroupedGemm => op.flops > 0.0,
        OpClass::Attention => pass != Pass::Wgrad && op.flops > 0.0,
        OpClass::Memory => pass != Pass::Wgrad && op.bytes > 0.0,
    }
}

/// The GEMM one pass of a (grouped) GEMM op launches, M x N x K of one instance:
/// forward (m, n, k); dgrad dX = dY . W^T (m, k, n); wgrad dW = X^T . dY (k, n, m).
pub fn gemm_pass_dims(op: &Op, pass: Pass) -> (f64, f64, f64) {
    match pass {
        Pass::Forward => (op.m, op.n, op.k),
        Pass::Dgrad => (op.m, op.k, op.n),
        Pass::Wgrad => (op.k, op.n, op.m),
    }
}

/// The attention core's geometry on one GPU: sequences x local heads, query length (tokens of
/// one CP rank per sequence), causal effective key length (scored pairs per query), and the
/// query/key and value head dimensions.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionDims {
    pub batch_heads: u64,
    pub sq: u64,
    pub sk: u64,
    pub dqk: u64,
    pub dv: u64,
}

/// The attention geometry of a card under `d` (full attention, or a sliding window).
pub fn attention_dims(card: &ModelCard, d: &Dims, sliding: bool) -> AttentionDims {
    let (dqk, dv) = match &card.mla {
        Some(m) => (m.qk_nope_head_dim + m.qk_rope_head_dim, m.v_head_dim),
        None => (card.head_dim(), card.head_dim()),
    };
    let window = if sliding {
        card.sliding_window.map(|w| w as f64)
    } else {
        None
    };
    let sq = (d.s / d.cp).max(1.0);
    let pairs = attention_pairs(d.s, window, d.cp);
    AttentionDims {
        batch_heads: (d.b * card.attention_heads as f64 / d.tp).round().max(1.0) as u64,
        sq: sq.round() as u64,
        sk: (pairs / sq).round().max(1.0) as u64,
        dqk,
        dv,
    }
}

/// The shape a report records for one pass of an op: the GEMM launched (M x N x K of one
/// instance); for the attention core [sequences x local heads, query length, q/k head dim];
/// for memory-bound ops [bytes moved, 0, 0].
pub fn pass_shape(op: &Op, pass: Pass, att: Option<&AttentionDims>) -> Vec<u64> {
    match op.class {
        OpClass::Gemm | OpClass::GroupedGemm => {
            let (m, n, k) = gemm_pass_dims(op, pass);
            vec![m.round() as u64, n.round() as u64, k.round() as u64]
        }
        OpClass::Attention => match att {
            Some(a) => vec![a.batch_heads, a.sq, a.dqk],
            None => vec![op.m.round() as u64, 0, 0],
        },
        OpClass::Memory => vec![pass_bytes(op, pass, false).round() as u64, 0, 0],
    }
}

/// HBM bytes one pass of an op moves (GEMMs: operands A and B in the input precision, C in
/// BF16; others: the op's bytes forward, twice backward).
pub fn pass_bytes(op: &Op, pass: Pass, fp8: bool) -> f64 {
    match op.class {
        OpClass::Gemm | OpClass::GroupedGemm => {
            let (m, n, k) = gemm_pass_dims(op, pass);
            let elem = if fp8 { 1.0 } else { ACT_BYTES };
            ((m * k + k * n) * elem + m * n * ACT_BYTES) * op.groups
        }
        _ => match pass {
            Pass::Forward => op.bytes,
            _ => MEMORY_BWD_BYTES * op.bytes,
        },
    }
}

/// Whether an op runs in FP8 in this job.
pub fn runs_fp8(op: &Op, precision: Precision) -> bool {
    op.fp8 && precision == Precision::Fp8
}

/// FP8 GEMM dimensions are rounded up to a multiple of this.
pub const FP8_ALIGN: u64 = 16;

/// The kernels a GPU backend launches for one pass of an op.
pub fn pass_kernels(op: &Op, pass: Pass, fp8: bool, att: Option<&AttentionDims>) -> Vec<Kernel> {
    let round = |x: f64| x.round().max(1.0) as u64;
    match op.class {
        OpClass::Gemm | OpClass::GroupedGemm => {
            let (m, n, k) = gemm_pass_dims(op, pass);
            // FP8 GEMMs need every dimension a multiple of 16 (cuBLASLt and hipBLASLt leading
            // dimensions; Transformer Engine pads routed tokens the same way).
            let dim = |x: f64| {
                if fp8 {
                    round(x).div_ceil(FP8_ALIGN) * FP8_ALIGN
                } else {
                    round(x)
                }
            };
            let mut out = vec![Kernel::Gemm {
                m: dim(m),
                n: dim(n),
                k: dim(k),
                batch: 1,
                count: round(op.groups),
                fp8,
            }];
            if fp8 && pass != Pass::Wgrad {
                // The quantization of the activation (forward) or incoming gradient (dgrad).
                let elems = match pass {
                    Pass::Forward => op.m * op.k,
                    _ => op.m * op.n,
                } * op.groups;
                out.push(Kernel::Copy {
                    bytes: round(elems * FP8_CAST_BYTES),
                    count: 1,
                });
            }
            out
        }
        OpClass::Attention => {
            let Some(a) = att else { return Vec::new() };
            let g = |m, n, k| Kernel::Gemm {
                m,
                n,
                k,
                batch: a.batch_heads,
                count: 1,
                fp8: false,
            };
            match pass {
                // S = Q K^T, O = P V.
                Pass::Forward => vec![g(a.sq, a.sk, a.dqk), g(a.sq, a.dv, a.sk)],
                // Recompute S; dV = P^T dO; dP = dO V^T; dQ = dS K; dK = dS^T Q.
                Pass::Dgrad => vec![
                    g(a.sq, a.sk, a.dqk),
                    g(a.sk, a.dv, a.sq),
                    g(a.sq, a.sk, a.dv),
                    g(a.sq, a.dqk, a.sk),
                    g(a.sk, a.dqk, a.sq),
                ],
                Pass::Wgrad => Vec::new(),
            }
        }
        OpClass::Memory => {
            let bytes = pass_bytes(op, pass, false);
            if bytes <= 0.0 || pass == Pass::Wgrad {
                return Vec::new();
            }
            vec![Kernel::Copy {
                bytes: round(bytes),
                count: round(op.kernels),
            }]
        }
    }
}

/// The card the measured MoE layer uses: the card's experts divided like EP was
/// ([`crate::bench::Downscaled::experts`]).
pub fn measured_card(card: &ModelCard, experts: Option<u32>) -> ModelCard {
    let mut card = card.clone();
    if let (Some(m), Some(e)) = (card.moe.as_mut(), experts) {
        m.num_experts = e;
    }
    card
}

/// The routed experts of the layer a report measured: the card's, divided like the EP
/// reduction from `target` to `measured` divided them (the downscale rule keeps experts per
/// rank).
pub fn measured_experts(card: &ModelCard, target: &Layout, measured: &Layout) -> Option<u32> {
    let m = card.moe.as_ref()?;
    if measured.ep < target.ep && m.num_experts.is_multiple_of(target.ep.max(1)) {
        Some(m.num_experts / target.ep.max(1) * measured.ep.max(1))
    } else {
        Some(m.num_experts)
    }
}

/// The op lists a benchmark measures, with their report prefix: one dense layer (models that
/// have dense layers), one MoE layer (MoE models), the embedding and the output layer with its
/// loss.
pub fn measured_op_lists(card: &ModelCard, d: &Dims) -> Vec<(&'static str, LayerShape, OpList)> {
    let full = |kind| LayerShape {
        kind,
        sliding: false,
    };
    let mut out = Vec::new();
    if card.moe.as_ref().is_none_or(|m| m.dense_layers > 0) {
        out.push((
            "dense",
            full(LayerKind::Dense),
            layer_ops(card, d, full(LayerKind::Dense)),
        ));
    }
    if card.moe.is_some() {
        out.push((
            "moe",
            full(LayerKind::Moe),
            layer_ops(card, d, full(LayerKind::Moe)),
        ));
    }
    out.push(("embedding", full(LayerKind::Dense), embedding_ops(card, d)));
    out.push(("head", full(LayerKind::Dense), head_ops(card, d)));
    out
}
