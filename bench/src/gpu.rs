//! The measurement protocol the GPU backends share: buffers, warm-up, event-timed runs and
//! clean-up, written once against [`Gpu`], the few primitives a vendor runtime provides
//! (memory, copies, events, one GEMM library, one collective library). `cuda.rs` and `rocm.rs`
//! implement [`Gpu`]; [`Engine`] turns one into a [`Device`] for [`primus_oracle::bench::measure::run`].
//!
//! Per op case: the GEMM descriptors are prepared and their algorithm chosen once, operands are
//! allocated (one set per local expert, as many as fit in 60% of the free memory, cycled
//! beyond) and filled with random finite values (zeros would let the GPU save power and run
//! faster than on real data); then `warmup` untimed runs and `runs` timed runs, each between two
//! events on GPU 0's stream. Per collective: send and receive buffers on GPUs 0 .. n, the
//! library call on every rank inside one group, and per run the slowest rank's event time.

use primus_oracle::bench::measure::{
    BenchError, CollectiveCase, Device, DeviceInfo, Kernel, OpCase, Protocol,
};
use primus_oracle::collectives::Collective;
use primus_oracle::report::Backend;

/// A device address.
pub type DevPtr = u64;
/// An event handle (the runtime's pointer).
pub type Event = usize;

/// One GEMM shape as [`Kernel::Gemm`] describes it (without the launch count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmSpec {
    /// Tokens (columns of the column-major output).
    pub m: u64,
    /// Output features (rows of the column-major output).
    pub n: u64,
    /// Reduction depth.
    pub k: u64,
    pub batch: u64,
    pub fp8: bool,
}

impl GemmSpec {
    /// Bytes of the weight operand A (k x n per batch), the activation operand B (k x m) and
    /// the BF16 output D (n x m).
    pub fn operand_bytes(&self) -> (u64, u64, u64) {
        let e = if self.fp8 { 1 } else { 2 };
        (
            self.k * self.n * self.batch * e,
            self.k * self.m * self.batch * e,
            self.n * self.m * self.batch * 2,
        )
    }
}

/// What a vendor runtime provides. GPU indices are 0 .. count(); every queueing call goes to
/// that GPU's one stream.
pub trait Gpu {
    fn backend(&self) -> Backend;
    fn count(&self) -> usize;
    fn info(&self) -> DeviceInfo;
    fn alloc(&mut self, gpu: usize, bytes: u64) -> Result<DevPtr, BenchError>;
    fn free(&mut self, gpu: usize, ptr: DevPtr);
    /// Copy host bytes to device memory (synchronous).
    fn upload(&mut self, gpu: usize, dst: DevPtr, data: &[u8]) -> Result<(), BenchError>;
    /// Queue a device-to-device copy.
    fn copy(&mut self, gpu: usize, dst: DevPtr, src: DevPtr, bytes: u64) -> Result<(), BenchError>;
    fn event(&mut self, gpu: usize) -> Result<Event, BenchError>;
    /// Queue an event record.
    fn record(&mut self, gpu: usize, ev: Event) -> Result<(), BenchError>;
    /// Wait for `end`; milliseconds between the two records.
    fn elapsed_ms(&mut self, gpu: usize, start: Event, end: Event) -> Result<f32, BenchError>;
    fn destroy_event(&mut self, gpu: usize, ev: Event);
    /// (free, total) device memory, bytes.
    fn memory(&mut self, gpu: usize) -> Result<(u64, u64), BenchError>;
    /// Prepare a GEMM on GPU 0 (descriptors, algorithm); returns its handle.
    fn gemm_prepare(&mut self, spec: &GemmSpec) -> Result<usize, BenchError>;
    /// Queue a prepared GEMM: D = op(A) . B with A the k x n weights (transposed), B the
    /// k x m activations, column-major.
    fn gemm(&mut self, id: usize, a: DevPtr, b: DevPtr, d: DevPtr) -> Result<(), BenchError>;
    fn gemm_release(&mut self, id: usize);
    /// Queue one collective over GPUs 0 .. bufs.len() (one group call), BF16 elements:
    /// all-reduce `count` elements; reduce-scatter `count` received per rank; all-gather `count`
    /// sent per rank; all-to-all `count` to each peer; p2p `count` from rank 0 to rank 1.
    fn collective(
        &mut self,
        op: Collective,
        bufs: &[(DevPtr, DevPtr)],
        count: usize,
    ) -> Result<(), BenchError>;
}

/// Send and receive bytes per rank of a collective with an S-byte buffer over n ranks, and the
/// element count of the library call (see [`Gpu::collective`]).
pub fn collective_sizes(op: Collective, n: u64, bytes: u64) -> (u64, u64, usize) {
    let elems = (bytes / 2).max(n);
    let share = (elems / n).max(1);
    match op {
        Collective::AllReduce => (elems * 2, elems * 2, elems as usize),
        Collective::ReduceScatter => (share * n * 2, share * 2, share as usize),
        Collective::AllGather => (share * 2, share * n * 2, share as usize),
        Collective::AllToAll => (share * n * 2, share * n * 2, share as usize),
        Collective::P2p => (elems * 2, elems * 2, elems as usize),
    }
}

/// Deterministic random finite values: BF16 (sign, exponent 2^-7 .. 2^3, random mantissa) or
/// FP8 E4M3 bytes (exponent 2^-3 .. 2^3; never a NaN or infinity encoding, OCP or FNUZ).
pub fn random_bytes(len: usize, fp8: bool, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut next = move || {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let mut out = Vec::with_capacity(len);
    if fp8 {
        while out.len() < len {
            let r = next();
            let sign = ((r >> 63) as u8) << 7;
            let exp = 4 + (r % 7) as u8; // 4 ..= 10 with bias 7 (8 for FNUZ)
            let mant = ((r >> 8) & 0x7) as u8;
            out.push(sign | exp << 3 | mant);
        }
    } else {
        while out.len() < len {
            let r = next();
            let sign = ((r >> 63) as u16) << 15;
            let exp = 120 + (r % 11) as u16; // 2^-7 ..= 2^3
            let mant = ((r >> 8) & 0x7f) as u16;
            let v = sign | exp << 7 | mant;
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.truncate(len);
    }
    out
}

/// Bytes of host pattern uploaded per copy when filling a buffer.
const STAGING: usize = 16 << 20;

/// Fraction of a GPU's free memory one case may take.
const MEMORY_BUDGET: f64 = 0.6;

/// What one case allocated, released whatever happens.
#[derive(Default)]
struct Scratch {
    buffers: Vec<(usize, DevPtr)>,
    events: Vec<(usize, Event)>,
    gemms: Vec<usize>,
}

/// One queued piece of work of an op case.
#[derive(Debug, Clone, Copy)]
enum Launch {
    Gemm {
        id: usize,
        a: DevPtr,
        b: DevPtr,
        d: DevPtr,
    },
    Copy {
        dst: DevPtr,
        src: DevPtr,
        bytes: u64,
    },
}

/// The protocol over a [`Gpu`].
pub struct Engine<G: Gpu> {
    pub gpu: G,
    staging: [Vec<u8>; 2],
    peak: f64,
}

impl<G: Gpu> Engine<G> {
    pub fn new(gpu: G) -> Engine<G> {
        Engine {
            gpu,
            staging: [
                random_bytes(STAGING, false, 0x5eed),
                random_bytes(STAGING, true, 0xf8),
            ],
            peak: 0.0,
        }
    }

    fn alloc(&mut self, s: &mut Scratch, gpu: usize, bytes: u64) -> Result<DevPtr, BenchError> {
        // 256-byte aligned sizes keep every copy chunk aligned.
        let p = self.gpu.alloc(gpu, bytes.max(256).div_ceil(256) * 256)?;
        s.buffers.push((gpu, p));
        Ok(p)
    }

    fn fill(&mut self, gpu: usize, dst: DevPtr, bytes: u64, fp8: bool) -> Result<(), BenchError> {
        let pattern = std::mem::take(&mut self.staging[usize::from(fp8)]);
        let mut done = 0u64;
        let mut r = Ok(());
        while done < bytes && r.is_ok() {
            let n = (bytes - done).min(pattern.len() as u64) as usize;
            r = self.gpu.upload(gpu, dst + done, &pattern[..n]);
            done += n as u64;
        }
        self.staging[usize::from(fp8)] = pattern;
        r
    }

    fn note_memory(&mut self, gpu: usize) {
        if let Ok((free, total)) = self.gpu.memory(gpu) {
            self.peak = self.peak.max(total.saturating_sub(free) as f64);
        }
    }

    fn release(&mut self, s: Scratch) {
        for (gpu, ev) in s.events {
            self.gpu.destroy_event(gpu, ev);
        }
        for id in s.gemms {
            self.gpu.gemm_release(id);
        }
        for (gpu, p) in s.buffers {
            self.gpu.free(gpu, p);
        }
    }

    /// Allocate, fill and list the launches of one op case on GPU 0.
    fn stage_op(&mut self, case: &OpCase, s: &mut Scratch) -> Result<Vec<Launch>, BenchError> {
        let mut launches = Vec::new();
        for kernel in &case.kernels {
            match *kernel {
                Kernel::Gemm {
                    m,
                    n,
                    k,
                    batch,
                    count,
                    fp8,
                } => {
                    let spec = GemmSpec {
                        m,
                        n,
                        k,
                        batch,
                        fp8,
                    };
                    let id = self.gpu.gemm_prepare(&spec)?;
                    s.gemms.push(id);
                    let (a, b, d) = spec.operand_bytes();
                    let per_set = a + b + d;
                    let (free, _) = self.gpu.memory(0)?;
                    let fit = ((free as f64 * MEMORY_BUDGET) / per_set as f64).floor() as u64;
                    if fit == 0 {
                        return Err(BenchError(format!(
                            "{}: a {m} x {n} x {k} GEMM (batch {batch}) needs {:.1} GiB, {:.1} GiB free",
                            case.name,
                            per_set as f64 / (1u64 << 30) as f64,
                            free as f64 / (1u64 << 30) as f64
                        )));
                    }
                    let sets = count.min(fit).max(1);
                    let mut operands = Vec::new();
                    for _ in 0..sets {
                        let pa = self.alloc(s, 0, a)?;
                        let pb = self.alloc(s, 0, b)?;
                        let pd = self.alloc(s, 0, d)?;
                        self.fill(0, pa, a, fp8)?;
                        self.fill(0, pb, b, fp8)?;
                        operands.push((pa, pb, pd));
                    }
                    for j in 0..count {
                        let (a, b, d) = operands[(j % sets) as usize];
                        launches.push(Launch::Gemm { id, a, b, d });
                    }
                }
                Kernel::Copy { bytes, count } => {
                    let count = count.max(1);
                    // Each copy reads and writes a chunk: bytes / (2 count), 256-byte aligned.
                    let chunk = (bytes / (2 * count)).max(256).div_ceil(256) * 256;
                    let src = self.alloc(s, 0, chunk * count)?;
                    let dst = self.alloc(s, 0, chunk * count)?;
                    self.fill(0, src, chunk * count, false)?;
                    for j in 0..count {
                        launches.push(Launch::Copy {
                            dst: dst + j * chunk,
                            src: src + j * chunk,
                            bytes: chunk,
                        });
                    }
                }
            }
        }
        self.note_memory(0);
        Ok(launches)
    }

    fn enqueue(&mut self, launches: &[Launch]) -> Result<(), BenchError> {
        for l in launches {
            match *l {
                Launch::Gemm { id, a, b, d } => self.gpu.gemm(id, a, b, d)?,
                Launch::Copy { dst, src, bytes } => self.gpu.copy(0, dst, src, bytes)?,
            }
        }
        Ok(())
    }

    fn time_op_in(
        &mut self,
        case: &OpCase,
        protocol: &Protocol,
        s: &mut Scratch,
    ) -> Result<Vec<f64>, BenchError> {
        let launches = self.stage_op(case, s)?;
        if launches.is_empty() {
            return Ok(Vec::new());
        }
        for _ in 0..protocol.warmup {
            self.enqueue(&launches)?;
        }
        let mut marks = Vec::with_capacity(protocol.runs as usize);
        for _ in 0..protocol.runs {
            let (a, b) = (self.gpu.event(0)?, self.gpu.event(0)?);
            s.events.push((0, a));
            s.events.push((0, b));
            self.gpu.record(0, a)?;
            self.enqueue(&launches)?;
            self.gpu.record(0, b)?;
            marks.push((a, b));
        }
        marks
            .into_iter()
            .map(|(a, b)| Ok(self.gpu.elapsed_ms(0, a, b)? as f64 * 1e-3))
            .collect()
    }

    fn time_collective_in(
        &mut self,
        case: &CollectiveCase,
        protocol: &Protocol,
        s: &mut Scratch,
    ) -> Result<Vec<f64>, BenchError> {
        let n = case.group_size as usize;
        if n > self.gpu.count() {
            return Err(BenchError(format!(
                "{} over {n} GPUs: only {} visible",
                case.op.name(),
                self.gpu.count()
            )));
        }
        let (send, recv, count) = collective_sizes(case.op, n as u64, case.bytes as u64);
        let mut bufs = Vec::with_capacity(n);
        for g in 0..n {
            let sp = self.alloc(s, g, send)?;
            let rp = self.alloc(s, g, recv)?;
            self.fill(g, sp, send, false)?;
            bufs.push((sp, rp));
            self.note_memory(g);
        }
        for _ in 0..protocol.warmup.max(1) {
            self.gpu.collective(case.op, &bufs, count)?;
        }
        let mut marks = Vec::with_capacity(protocol.runs as usize);
        for _ in 0..protocol.runs {
            let mut run = Vec::with_capacity(n);
            for g in 0..n {
                let (a, b) = (self.gpu.event(g)?, self.gpu.event(g)?);
                s.events.push((g, a));
                s.events.push((g, b));
                run.push((a, b));
                self.gpu.record(g, a)?;
            }
            self.gpu.collective(case.op, &bufs, count)?;
            for (g, (_, b)) in run.iter().enumerate() {
                self.gpu.record(g, *b)?;
            }
            marks.push(run);
        }
        let mut samples = Vec::with_capacity(marks.len());
        for run in marks {
            let mut slowest: f64 = 0.0;
            for (g, (a, b)) in run.into_iter().enumerate() {
                slowest = slowest.max(self.gpu.elapsed_ms(g, a, b)? as f64 * 1e-3);
            }
            samples.push(slowest);
        }
        Ok(samples)
    }
}

impl<G: Gpu> Device for Engine<G> {
    fn backend(&self) -> Backend {
        self.gpu.backend()
    }

    fn gpus(&self) -> u32 {
        self.gpu.count() as u32
    }

    fn info(&self) -> DeviceInfo {
        self.gpu.info()
    }

    fn time_op(&mut self, case: &OpCase, protocol: &Protocol) -> Result<Vec<f64>, BenchError> {
        let mut s = Scratch::default();
        let r = self
            .time_op_in(case, protocol, &mut s)
            .map_err(|e| BenchError(format!("{}: {e}", case.name)));
        self.release(s);
        r
    }

    fn time_collective(
        &mut self,
        case: &CollectiveCase,
        protocol: &Protocol,
    ) -> Result<Vec<f64>, BenchError> {
        let mut s = Scratch::default();
        let r = self
            .time_collective_in(case, protocol, &mut s)
            .map_err(|e| {
                BenchError(format!(
                    "{} over {} GPUs: {e}",
                    case.op.name(),
                    case.group_size
                ))
            });
        self.release(s);
        r
    }

    fn peak_memory_bytes(&self) -> f64 {
        self.peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_buffers_follow_nccl_counts() {
        // 8 MB over 4 ranks: 4 Mi elements... 4,000,000 BF16 elements, 1,000,000 per rank.
        let s = 8_000_000;
        assert_eq!(
            collective_sizes(Collective::AllReduce, 4, s),
            (8_000_000, 8_000_000, 4_000_000)
        );
        assert_eq!(
            collective_sizes(Collective::ReduceScatter, 4, s),
            (8_000_000, 2_000_000, 1_000_000)
        );
        assert_eq!(
            collective_sizes(Collective::AllGather, 4, s),
            (2_000_000, 8_000_000, 1_000_000)
        );
        assert_eq!(
            collective_sizes(Collective::AllToAll, 4, s),
            (8_000_000, 8_000_000, 1_000_000)
        );
    }

    #[test]
    fn random_values_are_finite() {
        let b = random_bytes(1 << 16, false, 7);
        for c in b.chunks(2) {
            let v = u16::from_le_bytes([c[0], c[1]]);
            let f = f32::from_bits((v as u32) << 16);
            assert!(f.is_finite() && f != 0.0 && f.abs() < 16.0, "{v:#x}");
        }
        let f8 = random_bytes(1 << 16, true, 7);
        // E4M3: exponent field 15 is NaN (OCP, with mantissa 7); 0x80 is NaN in FNUZ.
        assert!(f8.iter().all(|b| (b >> 3) & 0xf != 15 && *b != 0x80));
        assert_ne!(random_bytes(64, false, 1), random_bytes(64, false, 2));
    }
}
