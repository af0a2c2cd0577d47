//! The `rocm` benchmark backend (feature `rocm`): AMD GPUs through the HIP runtime (hip-sys:
//! devices, memory, streams, events; `libamdhip64` is linked at build time), hipBLASLt for the
//! GEMMs and RCCL for the collectives, both loaded at run time from the ROCm install
//! (`bench/hip_ffi.rs`).
//!
//! GEMMs run like the `cuda` backend's: "TN" (D (n x m, column-major) = A^T . B, A the k x n
//! weights, B the k x m activations), FP32 accumulation, BF16 output, a 32 MiB workspace and the
//! heuristic's first algorithm; FP8 inputs use the FNUZ E4M3 encoding of MI300-class GPUs, or
//! the OCP one where hipBLASLt has no FNUZ algorithm (MI350 and later).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};

use hip_sys::hiprt::{self as hip, hipError_t};

use crate::gpu::{DevPtr, Engine, Event, GemmSpec, Gpu};
use crate::hip_ffi::{self as ffi, HipBlasLt, LtAlgo, LtHeuristic, NcclComm, Rccl};
use primus_oracle::bench::measure::{self, BenchError, DeviceInfo, Protocol, Provenance};
use primus_oracle::collectives::Collective;
use primus_oracle::layout::Layout;
use primus_oracle::plan::Plan;
use primus_oracle::report::{Backend, BenchmarkResults};

/// hipBLASLt workspace.
const WORKSPACE: u64 = 32 << 20;

/// Run the benchmark of `plan` on this node's AMD GPUs.
pub fn run(
    plan: &Plan,
    finalists: &[Layout],
    protocol: &Protocol,
    provenance: Provenance,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchmarkResults, BenchError> {
    measure::guarded("rocm backend", || {
        let mut engine = Engine::new(RocmGpu::open()?);
        measure::run(plan, finalists, &mut engine, protocol, provenance, progress)
    })
}

fn check(what: &str, e: hipError_t) -> Result<(), BenchError> {
    if e == hipError_t::hipSuccess {
        Ok(())
    } else {
        Err(BenchError(format!("{what} returned {e:?}")))
    }
}

fn lt_check(what: &str, s: ffi::HipblasStatus) -> Result<(), BenchError> {
    if s == ffi::HIPBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(BenchError(format!(
            "hipBLASLt {what} returned status {s} (the rocm backend needs ROCm 6.1 or newer)"
        )))
    }
}

/// `60241134` -> `6.2.41134` (HIP's major * 10^7 + minor * 10^5 + patch).
fn hip_version(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

/// One prepared hipBLASLt GEMM.
struct Prepared {
    desc: ffi::LtMatmulDesc,
    a: ffi::LtLayout,
    b: ffi::LtLayout,
    d: ffi::LtLayout,
    algo: LtAlgo,
}

/// The node's AMD GPUs: one stream each, a hipBLASLt handle and workspace on GPU 0, RCCL
/// communicators per group size.
pub struct RocmGpu {
    streams: Vec<hip::hipStream_t>,
    lt: HipBlasLt,
    handle: ffi::LtHandle,
    workspace: DevPtr,
    gemms: Vec<Option<Prepared>>,
    rccl: Option<Rccl>,
    comms: HashMap<usize, Vec<NcclComm>>,
    info: DeviceInfo,
}

impl RocmGpu {
    /// Open every visible GPU; fails with one line when there is none.
    pub fn open() -> Result<RocmGpu, BenchError> {
        let mut count: c_int = 0;
        // SAFETY: writes one int.
        let e = unsafe { hip::hipGetDeviceCount(&mut count) };
        if e != hipError_t::hipSuccess {
            return Err(BenchError(format!(
                "no AMD GPU visible: hipGetDeviceCount returned {e:?}"
            )));
        }
        if count <= 0 {
            return Err(BenchError::new(
                "no AMD GPU visible: hipGetDeviceCount returned 0 devices",
            ));
        }
        let lt = HipBlasLt::load().map_err(BenchError)?;
        let mut streams = Vec::new();
        for i in 0..count {
            let mut s: hip::hipStream_t = std::ptr::null_mut();
            // SAFETY: `i` is a valid ordinal; the stream is destroyed in Drop.
            unsafe {
                check("hipSetDevice", hip::hipSetDevice(i))?;
                check("hipStreamCreate", hip::hipStreamCreate(&mut s))?;
            }
            streams.push(s);
        }
        let mut name = [0 as std::ffi::c_char; 256];
        let (mut driver, mut runtime) = (0, 0);
        // SAFETY: the buffer holds 256 chars and the call writes at most that many (NUL
        // included); the version calls write one int each.
        unsafe {
            check(
                "hipDeviceGetName",
                hip::hipDeviceGetName(name.as_mut_ptr(), name.len() as c_int, 0),
            )?;
            check("hipDriverGetVersion", hip::hipDriverGetVersion(&mut driver))?;
            check(
                "hipRuntimeGetVersion",
                hip::hipRuntimeGetVersion(&mut runtime),
            )?;
            check("hipSetDevice", hip::hipSetDevice(0))?;
        }
        // SAFETY: NUL-terminated by hipDeviceGetName within the buffer.
        let product = unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut handle: ffi::LtHandle = std::ptr::null_mut();
        // SAFETY: GPU 0 is current; the handle is destroyed in Drop.
        lt_check("hipblasLtCreate", unsafe { (lt.create)(&mut handle) })?;
        let mut lt_version: c_int = 0;
        // SAFETY: `handle` is live; writes one int.
        let _ = unsafe { (lt.get_version)(handle, &mut lt_version) };
        let mut ws: *mut c_void = std::ptr::null_mut();
        // SAFETY: GPU 0 is current; freed in Drop.
        if let Err(e) = check("hipMalloc (hipBLASLt workspace)", unsafe {
            hip::hipMalloc(&mut ws, WORKSPACE as usize)
        }) {
            // SAFETY: the handle is live and not used again.
            unsafe { (lt.destroy)(handle) };
            return Err(e);
        }
        Ok(RocmGpu {
            streams,
            lt,
            handle,
            workspace: ws as DevPtr,
            gemms: Vec::new(),
            rccl: None,
            comms: HashMap::new(),
            info: DeviceInfo {
                product,
                driver_version: format!("HIP driver {}", hip_version(driver)),
                runtime_version: format!("HIP {} / hipBLASLt {lt_version}", hip_version(runtime)),
            },
        })
    }

    fn bind(&self, gpu: usize) -> Result<(), BenchError> {
        // SAFETY: `gpu` is below the device count found in `open`.
        check("hipSetDevice", unsafe { hip::hipSetDevice(gpu as c_int) })
    }

    fn layout(
        &self,
        ty: c_int,
        rows: u64,
        cols: u64,
        batch: u64,
    ) -> Result<ffi::LtLayout, BenchError> {
        let mut l: ffi::LtLayout = std::ptr::null_mut();
        // SAFETY: writes one descriptor pointer; destroyed by `release`.
        lt_check("hipblasLtMatrixLayoutCreate", unsafe {
            (self.lt.layout_create)(&mut l, ty, rows, cols, rows as i64)
        })?;
        if batch > 1 {
            let count = batch as i32;
            let stride = (rows * cols) as i64;
            // SAFETY: `l` is live; each value has its attribute's type and size.
            let r = unsafe {
                let a = (self.lt.layout_set)(
                    l,
                    ffi::MATRIX_LAYOUT_BATCH_COUNT,
                    &count as *const i32 as *const c_void,
                    size_of::<i32>(),
                );
                if a != ffi::HIPBLAS_STATUS_SUCCESS {
                    a
                } else {
                    (self.lt.layout_set)(
                        l,
                        ffi::MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        &stride as *const i64 as *const c_void,
                        size_of::<i64>(),
                    )
                }
            };
            if let Err(e) = lt_check("hipblasLtMatrixLayoutSetAttribute", r) {
                // SAFETY: `l` is live and not used again.
                unsafe { (self.lt.layout_destroy)(l) };
                return Err(e);
            }
        }
        Ok(l)
    }

    fn release(&self, p: &Prepared) {
        // SAFETY: the descriptors were created by hipBLASLt and are released once.
        unsafe {
            (self.lt.layout_destroy)(p.a);
            (self.lt.layout_destroy)(p.b);
            (self.lt.layout_destroy)(p.d);
            (self.lt.desc_destroy)(p.desc);
        }
    }

    /// Descriptors and the heuristic's first algorithm for one input type.
    fn try_prepare(&self, s: &GemmSpec, input: c_int) -> Result<Prepared, BenchError> {
        let mut desc: ffi::LtMatmulDesc = std::ptr::null_mut();
        // SAFETY: writes one descriptor pointer; destroyed by `release`.
        lt_check("hipblasLtMatmulDescCreate", unsafe {
            (self.lt.desc_create)(&mut desc, ffi::HIPBLAS_COMPUTE_32F, ffi::HIP_R_32F)
        })?;
        let trans: i32 = ffi::HIPBLAS_OP_T;
        let mut p = Prepared {
            desc,
            a: std::ptr::null_mut(),
            b: std::ptr::null_mut(),
            d: std::ptr::null_mut(),
            algo: LtAlgo::default(),
        };
        let r = (|| {
            // SAFETY: `desc` is live; TRANSA takes an int32 hipblasOperation_t.
            lt_check("hipblasLtMatmulDescSetAttribute", unsafe {
                (self.lt.desc_set)(
                    desc,
                    ffi::MATMUL_DESC_TRANSA,
                    &trans as *const i32 as *const c_void,
                    size_of::<i32>(),
                )
            })?;
            p.a = self.layout(input, s.k, s.n, s.batch)?;
            p.b = self.layout(input, s.k, s.m, s.batch)?;
            p.d = self.layout(ffi::HIP_R_16BF, s.n, s.m, s.batch)?;
            let mut pref: ffi::LtPreference = std::ptr::null_mut();
            // SAFETY: writes one descriptor pointer, destroyed below.
            lt_check("hipblasLtMatmulPreferenceCreate", unsafe {
                (self.lt.pref_create)(&mut pref)
            })?;
            let ws: u64 = WORKSPACE;
            // Room for more results than requested, in case a library version writes a larger
            // struct than the header this was written from.
            let mut results = [LtHeuristic::default(); 4];
            let mut found: c_int = 0;
            // SAFETY: `pref` and the descriptors are live; the attribute takes a uint64; the
            // result array has room for the one result requested.
            let status = unsafe {
                let a = (self.lt.pref_set)(
                    pref,
                    ffi::MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    &ws as *const u64 as *const c_void,
                    size_of::<u64>(),
                );
                let h = if a == ffi::HIPBLAS_STATUS_SUCCESS {
                    (self.lt.heuristic)(
                        self.handle,
                        desc,
                        p.a,
                        p.b,
                        p.d,
                        p.d,
                        pref,
                        1,
                        results.as_mut_ptr(),
                        &mut found,
                    )
                } else {
                    a
                };
                (self.lt.pref_destroy)(pref);
                h
            };
            lt_check("hipblasLtMatmulAlgoGetHeuristic", status)?;
            if found < 1 || results[0].state != ffi::HIPBLAS_STATUS_SUCCESS {
                return Err(BenchError::new("no algorithm"));
            }
            Ok(results[0].algo)
        })();
        match r {
            Ok(algo) => {
                p.algo = algo;
                Ok(p)
            }
            Err(e) => {
                // SAFETY: whatever was created is released once; null layouts are skipped.
                unsafe {
                    for l in [p.a, p.b, p.d] {
                        if !l.is_null() {
                            (self.lt.layout_destroy)(l);
                        }
                    }
                    (self.lt.desc_destroy)(p.desc);
                }
                Err(e)
            }
        }
    }

    fn rccl(&mut self) -> Result<&Rccl, BenchError> {
        if self.rccl.is_none() {
            let r = Rccl::load().map_err(BenchError)?;
            let mut v: c_int = 0;
            // SAFETY: writes one int.
            if unsafe { (r.get_version)(&mut v) } == ffi::NCCL_SUCCESS {
                self.info.runtime_version.push_str(&format!(
                    " / RCCL {}.{}.{}",
                    v / 10000,
                    (v % 10000) / 100,
                    v % 100
                ));
            }
            self.rccl = Some(r);
        }
        Ok(self.rccl.as_ref().expect("loaded above"))
    }

    fn comms(&mut self, n: usize) -> Result<Vec<NcclComm>, BenchError> {
        if let Some(c) = self.comms.get(&n) {
            return Ok(c.clone());
        }
        let rccl = self.rccl()?;
        let mut comms = vec![std::ptr::null_mut(); n];
        let devlist: Vec<c_int> = (0..n as c_int).collect();
        // SAFETY: `comms` holds n slots and `devlist` n ordinals, as ncclCommInitAll requires;
        // the communicators are destroyed in Drop.
        let r = unsafe { (rccl.comm_init_all)(comms.as_mut_ptr(), n as c_int, devlist.as_ptr()) };
        if r != ffi::NCCL_SUCCESS {
            return Err(BenchError(format!(
                "ncclCommInitAll over {n} GPUs: {}",
                rccl.error(r)
            )));
        }
        self.comms.insert(n, comms.clone());
        Ok(comms)
    }
}

impl Gpu for RocmGpu {
    fn backend(&self) -> Backend {
        Backend::Rocm
    }

    fn count(&self) -> usize {
        self.streams.len()
    }

    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn alloc(&mut self, gpu: usize, bytes: u64) -> Result<DevPtr, BenchError> {
        self.bind(gpu)?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; freed by `free`.
        let e = unsafe { hip::hipMalloc(&mut p, bytes as usize) };
        check(&format!("hipMalloc of {bytes} bytes on GPU {gpu}"), e)?;
        Ok(p as DevPtr)
    }

    fn free(&mut self, gpu: usize, ptr: DevPtr) {
        if self.bind(gpu).is_ok() {
            // SAFETY: `ptr` came from `alloc` and is freed once.
            let _ = unsafe { hip::hipFree(ptr as *mut c_void) };
        }
    }

    fn upload(&mut self, gpu: usize, dst: DevPtr, data: &[u8]) -> Result<(), BenchError> {
        self.bind(gpu)?;
        // SAFETY: `dst` points into an allocation of at least data.len() bytes; synchronous.
        check("hipMemcpy (host to device)", unsafe {
            hip::hipMemcpy(
                dst as *mut c_void,
                data.as_ptr() as *const c_void,
                data.len(),
                hip::hipMemcpyKind::hipMemcpyHostToDevice,
            )
        })
    }

    fn copy(&mut self, gpu: usize, dst: DevPtr, src: DevPtr, bytes: u64) -> Result<(), BenchError> {
        self.bind(gpu)?;
        // SAFETY: both ranges lie inside live allocations on this GPU; the stream is its own.
        check("hipMemcpyAsync (device to device)", unsafe {
            hip::hipMemcpyAsync(
                dst as *mut c_void,
                src as *const c_void,
                bytes as usize,
                hip::hipMemcpyKind::hipMemcpyDeviceToDevice,
                self.streams[gpu],
            )
        })
    }

    fn event(&mut self, gpu: usize) -> Result<Event, BenchError> {
        self.bind(gpu)?;
        let mut e: hip::hipEvent_t = std::ptr::null_mut();
        // SAFETY: writes one event handle; destroyed by `destroy_event`.
        check("hipEventCreate", unsafe { hip::hipEventCreate(&mut e) })?;
        Ok(e as Event)
    }

    fn record(&mut self, gpu: usize, ev: Event) -> Result<(), BenchError> {
        self.bind(gpu)?;
        // SAFETY: `ev` was created on this GPU and not destroyed; the stream is its own.
        check("hipEventRecord", unsafe {
            hip::hipEventRecord(ev as hip::hipEvent_t, self.streams[gpu])
        })
    }

    fn elapsed_ms(&mut self, gpu: usize, start: Event, end: Event) -> Result<f32, BenchError> {
        self.bind(gpu)?;
        let mut ms = 0f32;
        // SAFETY: both events were created and recorded on this GPU's stream.
        unsafe {
            check(
                "hipEventSynchronize",
                hip::hipEventSynchronize(end as hip::hipEvent_t),
            )?;
            check(
                "hipEventElapsedTime",
                hip::hipEventElapsedTime(&mut ms, start as hip::hipEvent_t, end as hip::hipEvent_t),
            )?;
        }
        Ok(ms)
    }

    fn destroy_event(&mut self, gpu: usize, ev: Event) {
        if self.bind(gpu).is_ok() {
            // SAFETY: `ev` came from `event` and is destroyed once.
            let _ = unsafe { hip::hipEventDestroy(ev as hip::hipEvent_t) };
        }
    }

    fn memory(&mut self, gpu: usize) -> Result<(u64, u64), BenchError> {
        self.bind(gpu)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes.
        check("hipMemGetInfo", unsafe {
            hip::hipMemGetInfo(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn gemm_prepare(&mut self, spec: &GemmSpec) -> Result<usize, BenchError> {
        self.bind(0)?;
        let inputs: &[c_int] = if spec.fp8 {
            &[ffi::HIP_R_8F_E4M3_FNUZ, ffi::HIP_R_8F_E4M3]
        } else {
            &[ffi::HIP_R_16BF]
        };
        let mut last = None;
        for ty in inputs {
            match self.try_prepare(spec, *ty) {
                Ok(p) => {
                    self.gemms.push(Some(p));
                    return Ok(self.gemms.len() - 1);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(BenchError(format!(
            "hipBLASLt has no {} algorithm for a {} x {} x {} GEMM (batch {}): {}",
            if spec.fp8 { "FP8" } else { "BF16" },
            spec.m,
            spec.n,
            spec.k,
            spec.batch,
            last.map(|e| e.0).unwrap_or_default()
        )))
    }

    fn gemm(&mut self, id: usize, a: DevPtr, b: DevPtr, d: DevPtr) -> Result<(), BenchError> {
        let Some(Some(p)) = self.gemms.get(id) else {
            return Err(BenchError(format!("GEMM {id} was not prepared")));
        };
        self.bind(0)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the descriptors are live; A, B and D are allocations of the sizes the layouts
        // describe (GemmSpec::operand_bytes) on GPU 0; alpha and beta are host FP32 scalars
        // (the FP32 scale type); C aliases D with beta 0; the workspace is WORKSPACE bytes on
        // GPU 0; the stream is GPU 0's.
        lt_check("hipblasLtMatmul", unsafe {
            (self.lt.matmul)(
                self.handle,
                p.desc,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                p.a,
                b as *const c_void,
                p.b,
                &beta as *const f32 as *const c_void,
                d as *const c_void,
                p.d,
                d as *mut c_void,
                p.d,
                &p.algo,
                self.workspace as *mut c_void,
                WORKSPACE as usize,
                self.streams[0],
            )
        })
    }

    fn gemm_release(&mut self, id: usize) {
        if let Some(p) = self.gemms.get_mut(id).and_then(Option::take) {
            self.release(&p);
        }
    }

    fn collective(
        &mut self,
        op: Collective,
        bufs: &[(DevPtr, DevPtr)],
        count: usize,
    ) -> Result<(), BenchError> {
        let n = bufs.len();
        let comms = self.comms(n)?;
        let streams = self.streams.clone();
        let rccl = self.rccl()?;
        let (bf16, sum) = (ffi::NCCL_BFLOAT16, ffi::NCCL_SUM);
        // SAFETY: group calls take no arguments.
        let r = unsafe { (rccl.group_start)() };
        if r != ffi::NCCL_SUCCESS {
            return Err(BenchError(format!("ncclGroupStart: {}", rccl.error(r))));
        }
        let mut failed = ffi::NCCL_SUCCESS;
        for (rank, (send, recv)) in bufs.iter().enumerate() {
            let (comm, stream) = (comms[rank], streams[rank]);
            let (sp, rp) = (*send as *const c_void, *recv as *mut c_void);
            // SAFETY: send and receive buffers were sized for this op and count by
            // gpu::collective_sizes on this rank's GPU; the communicator and stream belong to
            // this rank; every call sits between ncclGroupStart and ncclGroupEnd, as one thread
            // driving several GPUs requires.
            let r = unsafe {
                match op {
                    Collective::AllReduce => {
                        (rccl.all_reduce)(sp, rp, count, bf16, sum, comm, stream)
                    }
                    Collective::ReduceScatter => {
                        (rccl.reduce_scatter)(sp, rp, count, bf16, sum, comm, stream)
                    }
                    Collective::AllGather => (rccl.all_gather)(sp, rp, count, bf16, comm, stream),
                    Collective::AllToAll => {
                        let mut r = ffi::NCCL_SUCCESS;
                        for peer in 0..n {
                            let off = (peer * count * 2) as u64;
                            r = (rccl.send)(
                                (*send + off) as *const c_void,
                                count,
                                bf16,
                                peer as c_int,
                                comm,
                                stream,
                            );
                            if r == ffi::NCCL_SUCCESS {
                                r = (rccl.recv)(
                                    (*recv + off) as *mut c_void,
                                    count,
                                    bf16,
                                    peer as c_int,
                                    comm,
                                    stream,
                                );
                            }
                            if r != ffi::NCCL_SUCCESS {
                                break;
                            }
                        }
                        r
                    }
                    Collective::P2p => match rank {
                        0 => (rccl.send)(sp, count, bf16, 1, comm, stream),
                        1 => (rccl.recv)(rp, count, bf16, 0, comm, stream),
                        _ => ffi::NCCL_SUCCESS,
                    },
                }
            };
            if r != ffi::NCCL_SUCCESS {
                failed = r;
                break;
            }
        }
        // SAFETY: closes the group opened above.
        let end = unsafe { (rccl.group_end)() };
        for (what, r) in [(op.name(), failed), ("ncclGroupEnd", end)] {
            if r != ffi::NCCL_SUCCESS {
                return Err(BenchError(format!("{what}: {}", rccl.error(r))));
            }
        }
        Ok(())
    }
}

impl Drop for RocmGpu {
    fn drop(&mut self) {
        let gemms: Vec<Prepared> = self.gemms.drain(..).flatten().collect();
        for p in &gemms {
            self.release(p);
        }
        if let Some(rccl) = &self.rccl {
            for comms in self.comms.values() {
                for c in comms {
                    // SAFETY: each communicator came from ncclCommInitAll; destroyed once.
                    let _ = unsafe { (rccl.comm_destroy)(*c) };
                }
            }
        }
        // SAFETY: the handle, workspace and streams were created in `open` and are released
        // once, each on its own GPU.
        unsafe {
            let _ = hip::hipSetDevice(0);
            let _ = (self.lt.destroy)(self.handle);
            let _ = hip::hipFree(self.workspace as *mut c_void);
            for (i, s) in self.streams.iter().enumerate() {
                let _ = hip::hipSetDevice(i as c_int);
                let _ = hip::hipStreamDestroy(*s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode() {
        assert_eq!(hip_version(60241134), "6.2.41134");
    }
}
