//! Which decoder layers each pipeline rank and each of its virtual chunks holds: Megatron's
//! even split, its uneven first/last-stage split, and its explicit
//! `--pipeline-model-parallel-layout` string.
//!
//! Source: Megatron-LM `megatron/core/transformer/transformer_layer.py`
//! (`get_transformer_layer_offset`, `get_num_layers_to_build`) and
//! `megatron/core/transformer/pipeline_parallel_layer_layout.py`. Virtual stage k (0-based, in
//! model order) runs on pipeline rank `k % pp` as its model chunk `k / pp`: with interleaving,
//! chunk c of rank r holds the (c*pp + r)-th slice of the model.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Layout;

/// Most symbols a layout string may expand to (guards against `(t|)*999999999`).
const MAX_EXPANDED_SYMBOLS: usize = 1 << 16;
/// Deepest nesting of `(...)` groups (Megatron's layouts use one level).
pub const MAX_NESTING: usize = 32;

/// What one virtual pipeline stage of an explicit layout holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct StageSpec {
    /// Decoder layers in this stage.
    pub layers: u32,
    /// Index of the stage's first decoder layer.
    pub first_layer: u32,
    /// The input embedding runs here (`E`).
    pub embedding: bool,
    /// MTP layers here (`m`).
    pub mtp: u32,
    /// The output layer and loss run here (`L`).
    pub loss: bool,
}

/// A `--pipeline-model-parallel-layout` string and its stages. Read from an input it keeps a
/// syntax error instead of failing ([`PipelineLayout::error`]): an object the API server
/// accepted always decodes, and the validator names the field
/// ([`crate::layout::Layout::check`]).
///
/// Shared, not copied: the tuner clones a layout for every candidate it builds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PipelineLayout(Arc<Parsed>);

/// A layout string as read.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Parsed {
    text: String,
    stages: Vec<StageSpec>,
    error: Option<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Sym {
    Embedding,
    Layer,
    Mtp,
    Loss,
    Sep,
}

/// The layout's grammar, parsed with an explicit stack of open groups (no recursion: a
/// layout of 200,000 `(` is an error, not a stack overflow).
struct Parser<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, msg: impl fmt::Display) -> String {
        format!("{msg} at position {} of the layout", self.pos)
    }

    fn skip_noise(&mut self) {
        while self.pos < self.bytes.len()
            && (self.bytes[self.pos] == b',' || self.bytes[self.pos].is_ascii_whitespace())
        {
            self.pos += 1;
        }
    }

    fn repeat(&mut self) -> Result<usize, String> {
        self.skip_noise();
        if self.bytes.get(self.pos) != Some(&b'*') {
            return Ok(1);
        }
        self.pos += 1;
        let start = self.pos;
        while self.pos < self.bytes.len() && self.bytes[self.pos].is_ascii_digit() {
            self.pos += 1;
        }
        std::str::from_utf8(&self.bytes[start..self.pos])
            .ok()
            .and_then(|d| d.parse::<usize>().ok())
            .ok_or_else(|| self.err("expected a repeat count after `*`"))
    }

    /// Append `item` repeated `n` times to `out`, within the expansion limit.
    fn append(&self, out: &mut Vec<Sym>, item: &[Sym], n: usize) -> Result<(), String> {
        if item.is_empty() || n == 0 {
            return Ok(());
        }
        if out.len() + item.len().saturating_mul(n) > MAX_EXPANDED_SYMBOLS {
            return Err(self.err("the layout expands to too many symbols"));
        }
        for _ in 0..n {
            out.extend_from_slice(item);
        }
        Ok(())
    }

    /// The whole text, expanded. `open` holds the symbols of each group still open, outermost
    /// first.
    fn expand(&mut self) -> Result<Vec<Sym>, String> {
        let mut open: Vec<Vec<Sym>> = vec![Vec::new()];
        loop {
            self.skip_noise();
            let Some(&b) = self.bytes.get(self.pos) else {
                return match open.pop() {
                    Some(all) if open.is_empty() => Ok(all),
                    _ => Err(self.err("unclosed `(`")),
                };
            };
            self.pos += 1;
            let sym = match b {
                b'(' => {
                    if open.len() > MAX_NESTING {
                        return Err(
                            self.err(format!("groups nested deeper than {MAX_NESTING} levels"))
                        );
                    }
                    open.push(Vec::new());
                    continue;
                }
                b')' if open.len() > 1 => {
                    let inner = open.pop().unwrap_or_default();
                    let n = self.repeat()?;
                    let out = open.last_mut().ok_or_else(|| self.err("unmatched `)`"))?;
                    self.append(out, &inner, n)?;
                    continue;
                }
                b'E' => Sym::Embedding,
                b't' => Sym::Layer,
                b'm' => Sym::Mtp,
                b'L' => Sym::Loss,
                b'|' => Sym::Sep,
                other => {
                    self.pos -= 1;
                    return Err(self.err(format!(
                        "unexpected {:?} (expected E, t, m, L, |, (, ) or *n)",
                        other as char
                    )));
                }
            };
            let n = self.repeat()?;
            let out = open.last_mut().ok_or_else(|| self.err("unmatched `)`"))?;
            self.append(out, &[sym], n)?;
        }
    }
}

/// The stages of an expanded layout.
fn stages_of(syms: &[Sym]) -> Result<Vec<StageSpec>, String> {
    let mut stages = vec![StageSpec::default()];
    let mut next_layer = 0u32;
    for &s in syms {
        if s == Sym::Sep {
            stages.push(StageSpec {
                first_layer: next_layer,
                ..StageSpec::default()
            });
            continue;
        }
        let Some(cur) = stages.last_mut() else {
            continue;
        };
        match s {
            Sym::Layer => {
                cur.layers += 1;
                next_layer += 1;
            }
            Sym::Embedding => cur.embedding = true,
            Sym::Mtp => cur.mtp += 1,
            Sym::Loss => cur.loss = true,
            Sym::Sep => {}
        }
    }
    let emb: Vec<usize> = (0..stages.len()).filter(|&i| stages[i].embedding).collect();
    let loss: Vec<usize> = (0..stages.len()).filter(|&i| stages[i].loss).collect();
    if emb != [0] {
        return Err("the embedding `E` must appear once, in the first stage".into());
    }
    if loss != [stages.len() - 1] {
        return Err("the loss `L` must appear once, in the last stage".into());
    }
    Ok(stages)
}

impl PipelineLayout {
    /// Parse Megatron's layout syntax; the error says what is wrong and where.
    pub fn parse(text: &str) -> Result<PipelineLayout, String> {
        let l = PipelineLayout::read(text.to_string());
        match &l.0.error {
            Some(e) => Err(e.clone()),
            None => Ok(l),
        }
    }

    /// Parse, keeping a syntax error in the value (what deserialization does).
    fn read(text: String) -> PipelineLayout {
        let parsed = if text.chars().nth(MAX_TEXT).is_some() {
            Err(format!("is longer than {MAX_TEXT} characters"))
        } else {
            let mut p = Parser {
                bytes: text.as_bytes(),
                pos: 0,
            };
            p.expand().and_then(|syms| stages_of(&syms))
        };
        let (stages, error) = match parsed {
            Ok(s) => (s, None),
            Err(e) => (Vec::new(), Some(e)),
        };
        PipelineLayout(Arc::new(Parsed {
            text,
            stages,
            error,
        }))
    }

    /// What is wrong with the text, when it is not a layout (the value then has no stages).
    pub fn error(&self) -> Option<&str> {
        self.0.error.as_deref()
    }

    /// The layout string as given.
    pub fn as_str(&self) -> &str {
        &self.0.text
    }

    /// Virtual stages, in model order.
    pub fn stages(&self) -> &[StageSpec] {
        &self.0.stages
    }

    /// Decoder layers over all stages.
    pub fn layers(&self) -> u32 {
        self.0.stages.iter().map(|s| s.layers).sum()
    }

    /// MTP layers over all stages.
    pub fn mtp_layers(&self) -> u32 {
        self.0.stages.iter().map(|s| s.mtp).sum()
    }
}

/// Longest layout text read (the bound of `spec.parallelism.pipelineLayout`).
const MAX_TEXT: usize = crate::bounds::limits::LAYOUT_TEXT as usize;

/// Which layout symbols take a slot of an even split: Megatron's
/// `--account-for-embedding-in-pipeline-split` and `--account-for-loss-in-pipeline-split`
/// make the embedding and the loss count as one layer each; MTP layers count as layers in the
/// tuner's and the validation's balanced split ([`even_split_layout`]), not in Megatron's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitSlots {
    pub embedding: bool,
    pub loss: bool,
    pub mtp: bool,
}

/// The layout string of an even split of `layers` decoder layers and `mtp` MTP layers (last)
/// over `stages` virtual stages in model order, where the embedding, the loss and the MTP
/// layers take a slot each as `slots` says; a symbol that takes no slot rides on the first
/// (embedding) or the last stage (MTP, loss), as in Megatron's `get_num_layers_to_build`.
/// `None` with fewer than two stages or when the slots do not split evenly.
pub fn even_split_layout(layers: u32, mtp: u32, stages: u32, slots: SplitSlots) -> Option<String> {
    let symbols = slot_symbols(layers, mtp, slots);
    let count = symbols.len() as u32;
    if stages < 2 || count < stages || !count.is_multiple_of(stages) {
        return None;
    }
    let per = (count / stages) as usize;
    let mut text = String::with_capacity(symbols.len() + stages as usize + mtp as usize + 2);
    if !slots.embedding {
        text.push('E');
    }
    let last = stages as usize - 1;
    for (i, chunk) in symbols.chunks(per).enumerate() {
        if i > 0 {
            text.push('|');
        }
        if i < last {
            text.extend(chunk.iter());
            continue;
        }
        // The last stage: its layers, the MTP layers, then the loss.
        text.extend(chunk.iter().filter(|c| **c != 'L'));
        if !slots.mtp {
            text.extend(std::iter::repeat_n('m', mtp as usize));
        }
        text.push('L');
    }
    Some(text)
}

/// The symbols that take a slot each in a split, in model order: the embedding, the decoder
/// layers, the MTP layers and the loss, as `slots` says.
fn slot_symbols(layers: u32, mtp: u32, slots: SplitSlots) -> Vec<char> {
    let mut symbols = Vec::with_capacity(layers as usize + mtp as usize + 2);
    if slots.embedding {
        symbols.push('E');
    }
    symbols.extend(std::iter::repeat_n('t', layers as usize));
    if slots.mtp {
        symbols.extend(std::iter::repeat_n('m', mtp as usize));
    }
    if slots.loss {
        symbols.push('L');
    }
    symbols
}

/// The layout string of the most even split of `layers` decoder layers and `mtp` MTP layers
/// over `stages` virtual stages, the embedding, every MTP layer and the loss taking a slot
/// each, in model order, the first `slots % stages` stages one slot more than the others (so
/// the loss's stage is the lighter). `None` with fewer than two stages, fewer slots than
/// stages, or MTP layers that would leave the last stage (Megatron builds them there).
pub fn most_even_split_layout(layers: u32, mtp: u32, stages: usize) -> Option<String> {
    let all = SplitSlots {
        embedding: true,
        loss: true,
        mtp: true,
    };
    let symbols = slot_symbols(layers, mtp, all);
    let count = symbols.len();
    if stages < 2 || count < stages {
        return None;
    }
    let (base, extra) = (count / stages, count % stages);
    // The last stage holds `base` slots: the MTP layers and the loss must fit in it.
    if mtp as usize + 1 > base {
        return None;
    }
    let mut text = String::with_capacity(count + stages);
    let mut rest = symbols.as_slice();
    for stage in 0..stages {
        if stage > 0 {
            text.push('|');
        }
        let (chunk, tail) = rest.split_at(base + usize::from(stage < extra));
        text.extend(chunk.iter());
        rest = tail;
    }
    Some(text)
}

impl fmt::Display for PipelineLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.text)
    }
}

impl Serialize for PipelineLayout {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.text)
    }
}

impl<'de> Deserialize<'de> for PipelineLayout {
    /// Never fails on a string: a syntax error is kept for the validator to report.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(PipelineLayout::read(String::deserialize(d)?))
    }
}

/// What one virtual pipeline stage (one model chunk of one rank) holds, for any way of
/// splitting the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VirtualStage {
    /// Global decoder-layer indices of the chunk.
    pub first_layer: u32,
    pub layers: u32,
    /// The input embedding runs in this chunk.
    pub embedding: bool,
    /// The final norm, output layer and loss run in this chunk.
    pub loss: bool,
    /// MTP layers in this chunk.
    pub mtp: u32,
    /// The MTP depth of the chunk's first MTP layer (the depths before it run in earlier
    /// chunks).
    pub first_mtp: u32,
}

impl VirtualStage {
    pub fn range(&self) -> Range<u32> {
        self.first_layer..self.first_layer + self.layers
    }

    /// The chunk's MTP layers that `l` fully recomputes (Primus' layer IDs `layers + depth`).
    pub fn recomputed_mtp(&self, l: &Layout, layers: u32) -> u32 {
        (self.first_mtp..self.first_mtp + self.mtp)
            .filter(|&d| l.recomputes_mtp_depth(layers, d))
            .count() as u32
    }
}

impl Layout {
    /// Virtual stages per pipeline rank: `vpp`, or what an explicit layout implies.
    pub fn chunks(&self) -> u32 {
        match &self.pipeline_layout {
            Some(pl) => (pl.0.stages.len() as u32 / self.pp.max(1)).max(1),
            None => self.vpp.max(1),
        }
    }

    /// Decoder layers in each chunk of pipeline rank `rank` (Megatron gives every chunk of a
    /// rank the same count with the first/last split), for a model of `layers` layers. For an
    /// explicit layout, the count of its chunk 0.
    pub fn chunk_layers(&self, layers: u32, rank: u32) -> u32 {
        self.virtual_stage(layers, 0, rank, 0).layers
    }

    /// Contents of model chunk `chunk` of pipeline rank `rank`, for a model of `layers`
    /// decoder layers and `mtp_layers` MTP layers (which Megatron places with the loss, on the
    /// last stage, unless the layout says otherwise). O(1), no allocation. The layout is
    /// assumed legal ([`Layout::check`]).
    pub fn virtual_stage(
        &self,
        layers: u32,
        mtp_layers: u32,
        rank: u32,
        chunk: u32,
    ) -> VirtualStage {
        let pp = self.pp.max(1);
        let k = (chunk * pp + rank) as usize;
        if let Some(pl) = &self.pipeline_layout {
            let s = pl.0.stages.get(k).copied().unwrap_or_default();
            let first_mtp = match s.mtp {
                0 => 0,
                _ => pl.0.stages.iter().take(k).map(|e| e.mtp).sum(),
            };
            return VirtualStage {
                first_layer: s.first_layer,
                layers: s.layers,
                embedding: s.embedding,
                loss: s.loss,
                mtp: s.mtp,
                first_mtp,
            };
        }
        let vpp = self.vpp.max(1);
        let last_k = (pp * vpp - 1) as usize;
        let (first_layer, n) = match (self.first_stage_layers, self.last_stage_layers) {
            (None, None) => {
                let per_chunk = layers / (pp * vpp);
                (k as u32 * per_chunk, per_chunk)
            }
            (first, last) => {
                // Megatron's uneven split: the first and last stages get the given counts, the
                // middle stages split the rest evenly; every count is divided evenly over the
                // rank's vpp chunks (get_transformer_layer_offset).
                let f = first.unwrap_or(0);
                let l = last.unwrap_or(0);
                let middle_stages = pp - first.is_some() as u32 - last.is_some() as u32;
                let middle_per_chunk = layers
                    .saturating_sub(f + l)
                    .checked_div(middle_stages)
                    .unwrap_or(0)
                    / vpp;
                let first_chunk = if first.is_some() {
                    f / vpp
                } else {
                    middle_per_chunk
                };
                let last_chunk = if last.is_some() {
                    l / vpp
                } else {
                    middle_per_chunk
                };
                let per_round = layers / vpp;
                let n = if rank == 0 {
                    first_chunk
                } else if rank == pp - 1 {
                    last_chunk
                } else {
                    middle_per_chunk
                };
                let before = if rank == 0 {
                    0
                } else {
                    first_chunk + (rank - 1) * middle_per_chunk
                };
                (chunk * per_round + before, n)
            }
        };
        let loss = k == last_k;
        VirtualStage {
            first_layer,
            layers: n,
            embedding: k == 0,
            loss,
            mtp: if loss { mtp_layers } else { 0 },
            first_mtp: 0,
        }
    }

    /// Global decoder-layer index ranges held by each pipeline rank and each of its virtual
    /// chunks: `result[rank][chunk]` (pp ranks x chunks), Megatron's assignment (with
    /// interleaving, chunk c of rank r holds the (c*pp + r)-th slice), honouring
    /// first_stage_layers / last_stage_layers (the first and last stage get the given counts,
    /// the rest is split evenly over the middle stages) or an explicit pipeline layout.
    pub fn layer_ranges(&self, layers: u32) -> Vec<Vec<Range<u32>>> {
        (0..self.pp.max(1))
            .map(|r| {
                (0..self.chunks())
                    .map(|c| self.virtual_stage(layers, 0, r, c).range())
                    .collect()
            })
            .collect()
    }

    /// Decoder layers held by pipeline rank `rank` over all its chunks.
    pub fn stage_layers(&self, layers: u32, rank: u32) -> u32 {
        (0..self.chunks())
            .map(|c| self.virtual_stage(layers, 0, rank, c).layers)
            .sum()
    }
}
