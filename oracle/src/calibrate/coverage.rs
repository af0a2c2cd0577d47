//! Which terms of a calibrated projection rest on measurements and which are analytic: per
//! breakdown term (compute, TP, CP, EP, PP, DP, bubble, ...) and per op kind. What
//! `primus project --calibration` shows.

use serde::Serialize;

use super::{Calibration, RatioSource};
use crate::bench::measure::{kind_name, pass_runs};
use crate::collectives::{Collective, Group, Placement, Topology};
use crate::compute::{
    ACT_BYTES, Dims, LayerShape, OpClass, OpList, Pass, embedding_ops, head_ops, layer_ops,
    mtp_extra_ops,
};
use crate::layout::Layout;
use crate::model::LayerKind;
use crate::scenario::Scenario;

/// Where a term's time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// Every part of it was measured at the target's shapes or group sizes.
    Measured,
    /// Measured at other shapes or group sizes, carried to the target's by the model.
    Interpolated,
    /// The in-node part is measured (or interpolated), the out-of-node part analytic.
    PartlyMeasured,
    /// The analytic model alone.
    Analytic,
    /// Derived analytically from measured pass times (the pipeline schedule's bubble).
    FromMeasured,
    /// The layout has no such term.
    None,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Measured => "measured",
            Source::Interpolated => "interpolated",
            Source::PartlyMeasured => "partly measured",
            Source::Analytic => "analytic",
            Source::FromMeasured => "analytic on measured",
            Source::None => "-",
        }
    }
}

/// The source of one breakdown term.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TermSource {
    /// The term's key in [`crate::projection::Breakdown::terms`].
    pub term: &'static str,
    pub source: Source,
    pub detail: String,
}

/// How the op passes of one kind in the target's op lists are timed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OpCoverage {
    /// `gemm`, `grouped-gemm`, `attention`, `memory-bound`.
    pub kind: &'static str,
    /// Measured op passes of this kind in the report.
    pub measured_points: usize,
    /// Target op passes at exactly a measured shape.
    pub exact: usize,
    /// Target op passes interpolated between measured shapes.
    pub interpolated: usize,
    /// Target op passes with no measurement of their kind (analytic).
    pub analytic: usize,
}

/// Sources of every term and op kind of a calibrated projection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Coverage {
    pub terms: Vec<TermSource>,
    pub op_kinds: Vec<OpCoverage>,
}

impl Coverage {
    /// The source of a term by key.
    pub fn term(&self, key: &str) -> Option<&TermSource> {
        self.terms.iter().find(|t| t.term == key)
    }
}

/// The op lists of the target layout (every layer shape the model has, embedding, head, MTP).
fn target_op_lists(s: &Scenario, d: &Dims) -> Vec<OpList> {
    let card = &s.model;
    let mut kinds = Vec::new();
    let has_dense = card.moe.as_ref().is_none_or(|m| m.dense_layers > 0);
    if has_dense {
        kinds.push(LayerKind::Dense);
    }
    if card.moe.is_some() {
        kinds.push(LayerKind::Moe);
    }
    let mut out = Vec::new();
    for kind in kinds {
        out.push(layer_ops(
            card,
            d,
            LayerShape {
                kind,
                sliding: false,
            },
        ));
        if card.sliding_window.is_some() {
            out.push(layer_ops(
                card,
                d,
                LayerShape {
                    kind,
                    sliding: true,
                },
            ));
        }
    }
    out.push(embedding_ops(card, d));
    out.push(head_ops(card, d));
    if card.mtp_layers > 0 {
        out.push(mtp_extra_ops(card, d));
    }
    out
}

/// How a communication term over group `g` is timed, given the collectives it runs.
fn link_source(
    cal: &Calibration,
    kinds: &[Collective],
    g: &Group,
    bytes: f64,
    term: &'static str,
) -> TermSource {
    let none = |detail: &str| TermSource {
        term,
        source: Source::None,
        detail: detail.into(),
    };
    if g.size <= 1 {
        return none("");
    }
    let members = g.in_domain();
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let what = format!("{} over {} GPUs", names.join(" + "), g.size);
    if members < 2 {
        return TermSource {
            term,
            source: Source::Analytic,
            detail: format!("{what}, one per node: out-of-node, analytic"),
        };
    }
    let found: Vec<_> = kinds
        .iter()
        .map(|k| (k, cal.links.lookup(*k, members, bytes)))
        .collect();
    let mut source = if found.iter().all(|(_, f)| f.is_none()) {
        Source::Analytic
    } else if found
        .iter()
        .all(|(k, f)| matches!(f, Some((_, src, at)) if src == *k && *at == members))
    {
        Source::Measured
    } else {
        Source::Interpolated
    };
    let mut detail = what;
    for (k, f) in &found {
        match f {
            Some((factor, src, at)) => detail.push_str(&format!(
                "; {} x{factor:.2} bandwidth (measured: {} over {at})",
                k.name(),
                src.name()
            )),
            None => detail.push_str(&format!("; {} not measured", k.name())),
        }
    }
    if g.domains > 1 && source != Source::Analytic {
        source = Source::PartlyMeasured;
        detail.push_str(&format!(
            "; {members} per node in-node, across nodes analytic"
        ));
    }
    TermSource {
        term,
        source,
        detail,
    }
}

/// Which terms of the projection of `l` on `s` the calibration measured.
pub fn coverage(cal: &Calibration, s: &Scenario, l: &Layout) -> Coverage {
    let d = Dims::of(s, l);
    let ops = op_coverage(cal, s, &d);
    let comm = comm_coverage(cal, s, l, &d);
    let analytic = |term: &'static str, detail: &str| TermSource {
        term,
        source: Source::Analytic,
        detail: detail.into(),
    };
    let none = |term: &'static str| TermSource {
        term,
        source: Source::None,
        detail: String::new(),
    };
    let bubble = if l.pp > 1 {
        TermSource {
            term: "bubble",
            source: Source::FromMeasured,
            detail: format!(
                "pipeline schedule at PP {} simulated on the calibrated pass times",
                l.pp
            ),
        }
    } else {
        none("bubble")
    };
    Coverage {
        terms: vec![
            ops.compute,
            comm.tp,
            comm.cp,
            comm.ep,
            comm.pp,
            comm.dp,
            bubble,
            if s.model.moe.is_some() {
                analytic(
                    "host",
                    "MoE dispatcher sync and host-bound expert section (analytic)",
                )
            } else {
                none("host")
            },
            analytic("optimizer", "Adam over the local shard (analytic)"),
            analytic("other", "per-step overheads (analytic)"),
        ],
        op_kinds: ops.op_kinds,
    }
}

/// How the target's op passes are timed: per op kind, and the compute term over all.
struct OpsCoverage {
    op_kinds: Vec<OpCoverage>,
    compute: TermSource,
}

/// Count the target's op passes by kind and by where their ratio comes from.
fn op_coverage(cal: &Calibration, s: &Scenario, d: &Dims) -> OpsCoverage {
    let classes = [
        OpClass::Gemm,
        OpClass::GroupedGemm,
        OpClass::Attention,
        OpClass::Memory,
    ];
    let mut op_kinds: Vec<OpCoverage> = classes
        .iter()
        .map(|c| OpCoverage {
            kind: kind_name(*c),
            measured_points: cal.measured_points(*c),
            exact: 0,
            interpolated: 0,
            analytic: 0,
        })
        .collect();
    for ops in target_op_lists(s, d) {
        for op in ops.iter() {
            for pass in [Pass::Forward, Pass::Dgrad, Pass::Wgrad] {
                if !pass_runs(op, pass) {
                    continue;
                }
                let i = classes.iter().position(|c| *c == op.class).unwrap_or(0);
                match cal.ratio(op, pass).1 {
                    RatioSource::Exact => op_kinds[i].exact += 1,
                    RatioSource::Interpolated => op_kinds[i].interpolated += 1,
                    RatioSource::Analytic => op_kinds[i].analytic += 1,
                }
            }
        }
    }
    let (exact, interp, analytic) = op_kinds.iter().fold((0, 0, 0), |a, k| {
        (a.0 + k.exact, a.1 + k.interpolated, a.2 + k.analytic)
    });
    let compute = TermSource {
        term: "compute",
        source: if exact + interp == 0 {
            Source::Analytic
        } else if interp + analytic == 0 {
            Source::Measured
        } else if analytic == 0 {
            Source::Interpolated
        } else {
            Source::PartlyMeasured
        },
        detail: format!(
            "{} op passes: {exact} at measured shapes, {interp} interpolated, {analytic} analytic{}",
            exact + interp + analytic,
            if cal.reduced_axes.is_empty() {
                String::new()
            } else {
                format!(" (measured with {})", cal.reduced_axes.join(", "))
            }
        ),
    };
    OpsCoverage { op_kinds, compute }
}

/// The communication terms.
struct CommCoverage {
    tp: TermSource,
    cp: TermSource,
    ep: TermSource,
    pp: TermSource,
    dp: TermSource,
}

/// The TP, CP, EP, PP and DP communication terms: the collectives of each group at the
/// layout's message sizes.
fn comm_coverage(cal: &Calibration, s: &Scenario, l: &Layout, d: &Dims) -> CommCoverage {
    let topo = Topology::of_scenario(s);
    let dp = l.dp(s.cluster.gpus).unwrap_or(1).max(1);
    let place = Placement::of(&topo, s.cluster.gpus, l, dp);
    let h = s.model.hidden_size as f64;
    let act = d.tokens() * h * ACT_BYTES;
    let tp_kinds: &[Collective] = if d.sp {
        &[Collective::AllGather, Collective::ReduceScatter]
    } else {
        &[Collective::AllReduce]
    };
    let tp = link_source(cal, tp_kinds, &place.tp, act, "tp");
    let cp = link_source(cal, &[Collective::P2p], &place.cp, act, "cp");
    let ep = match &s.model.moe {
        Some(m) => link_source(
            cal,
            &[Collective::AllToAll],
            &place.ep,
            d.tokens_dispatched() * m.top_k as f64 * h * ACT_BYTES,
            "ep",
        ),
        None => link_source(cal, &[], &Group::SINGLE, 0.0, "ep"),
    };
    let pp = link_source(
        cal,
        &[Collective::P2p],
        &place.pp,
        if d.sp { act / d.tp } else { act },
        "pp",
    );
    let dp_kinds: &[Collective] = if l.distributed_optimizer || l.fsdp {
        &[Collective::ReduceScatter, Collective::AllGather]
    } else {
        &[Collective::AllReduce]
    };
    let bucket = crate::projection::BUCKET_PARAMS * crate::projection::grad_bytes(l);
    CommCoverage {
        tp,
        cp,
        ep,
        pp,
        dp: link_source(cal, dp_kinds, &place.dp_cp, bucket, "dp"),
    }
}
