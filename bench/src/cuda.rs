//! The `cuda` benchmark backend (feature `cuda`): NVIDIA GPUs through cudarc's dynamically
//! loaded bindings: the CUDA driver API (contexts, memory, streams, events), cuBLASLt for the
//! GEMMs (BF16, and FP8 E4M3 on GPUs that have it) and NCCL for the collectives. Nothing is
//! linked at build time; each library is checked with cudarc's `is_culib_present` before its
//! first use (cudarc panics on a missing library or symbol; [`run`] also turns any such panic
//! into one error line).
//!
//! GEMMs run in the "TN" layout Transformer Engine uses for FP8 (and PyTorch's `F.linear` for
//! its forward): D (n x m, column-major) = A^T . B with A the k x n weights and B the k x m
//! activations, FP32 accumulation and scaling, BF16 output, a 32 MiB workspace and the
//! heuristic's first algorithm.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::{result as lt, sys as ltsys};
use cudarc::driver::{result as drv, sys as dsys};
use cudarc::nccl::{result as nccl, sys as ncclsys};

use crate::gpu::{DevPtr, Engine, Event, GemmSpec, Gpu};
use primus_oracle::bench::measure::{self, BenchError, DeviceInfo, Protocol, Provenance};
use primus_oracle::collectives::Collective;
use primus_oracle::layout::Layout;
use primus_oracle::plan::Plan;
use primus_oracle::report::{Backend, BenchmarkResults};

/// cuBLASLt workspace (NVIDIA's recommendation for Hopper).
const WORKSPACE: u64 = 32 << 20;

/// Run the benchmark of `plan` on this node's NVIDIA GPUs.
pub fn run(
    plan: &Plan,
    finalists: &[Layout],
    protocol: &Protocol,
    provenance: Provenance,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchmarkResults, BenchError> {
    measure::guarded("cuda backend", || {
        let mut engine = Engine::new(CudaGpu::open()?);
        measure::run(plan, finalists, &mut engine, protocol, provenance, progress)
    })
}

/// One prepared cuBLASLt GEMM.
struct Prepared {
    desc: ltsys::cublasLtMatmulDesc_t,
    a: ltsys::cublasLtMatrixLayout_t,
    b: ltsys::cublasLtMatrixLayout_t,
    d: ltsys::cublasLtMatrixLayout_t,
    algo: ltsys::cublasLtMatmulAlgo_t,
}

/// The node's NVIDIA GPUs: one primary context and one stream each, a cuBLASLt handle and
/// workspace on GPU 0, NCCL communicators per group size.
pub struct CudaGpu {
    contexts: Vec<dsys::CUcontext>,
    streams: Vec<dsys::CUstream>,
    devices: Vec<dsys::CUdevice>,
    handle: ltsys::cublasLtHandle_t,
    workspace: DevPtr,
    gemms: Vec<Option<Prepared>>,
    comms: HashMap<usize, Vec<ncclsys::ncclComm_t>>,
    info: DeviceInfo,
}

fn driver(what: &str, e: drv::DriverError) -> BenchError {
    BenchError(format!("{what} returned {:?}", e.0))
}

fn cublas(what: &str, e: lt::CublasError) -> BenchError {
    BenchError(format!("cuBLASLt {what} returned {:?}", e.0))
}

fn nccl_err(what: &str, e: nccl::NcclError) -> BenchError {
    BenchError(format!("NCCL {what} returned {:?}", e.0))
}

/// `12080` -> `12.8`.
fn cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

impl CudaGpu {
    /// Open every visible GPU; fails with one line when there is none.
    pub fn open() -> Result<CudaGpu, BenchError> {
        // SAFETY: only tries to dlopen the driver library by its usual names; loads no symbol.
        if !unsafe { dsys::is_culib_present() } {
            return Err(BenchError::new(
                "no NVIDIA GPU visible: libcuda.so not found (no NVIDIA driver in the library path)",
            ));
        }
        drv::init()
            .map_err(|e| BenchError(format!("no NVIDIA GPU visible: cuInit returned {:?}", e.0)))?;
        let count = drv::device::get_count().map_err(|e| driver("cuDeviceGetCount", e))?;
        if count <= 0 {
            return Err(BenchError::new(
                "no NVIDIA GPU visible: cuDeviceGetCount returned 0",
            ));
        }
        // SAFETY: only tries to dlopen the library.
        if !unsafe { ltsys::is_culib_present() } {
            return Err(BenchError::new(
                "libcublasLt.so not found: install cuBLAS (the CUDA toolkit, or pip's nvidia-cublas-cu12) and add its directory to LD_LIBRARY_PATH",
            ));
        }
        let mut devices = Vec::new();
        let mut contexts = Vec::new();
        let mut streams = Vec::new();
        for i in 0..count {
            let dev = drv::device::get(i).map_err(|e| driver("cuDeviceGet", e))?;
            // SAFETY: `dev` came from cuDeviceGet; the primary context is released in Drop.
            let ctx = unsafe { drv::primary_ctx::retain(dev) }
                .map_err(|e| driver("cuDevicePrimaryCtxRetain", e))?;
            // SAFETY: `ctx` is the live primary context just retained.
            unsafe { drv::ctx::set_current(ctx) }.map_err(|e| driver("cuCtxSetCurrent", e))?;
            let stream = drv::stream::create(drv::stream::StreamKind::NonBlocking)
                .map_err(|e| driver("cuStreamCreate", e))?;
            devices.push(dev);
            contexts.push(ctx);
            streams.push(stream);
        }
        let product =
            drv::device::get_name(devices[0]).map_err(|e| driver("cuDeviceGetName", e))?;
        let mut version = 0;
        // SAFETY: writes one int.
        unsafe { dsys::cuDriverGetVersion(&mut version) }
            .result()
            .map_err(|e| driver("cuDriverGetVersion", e))?;
        // SAFETY: the library is present (checked above); the call takes no argument.
        let lt_version = unsafe { ltsys::cublasLtGetVersion() };
        // SAFETY: GPU 0's context is live.
        unsafe { drv::ctx::set_current(contexts[0]) }.map_err(|e| driver("cuCtxSetCurrent", e))?;
        let handle = lt::create_handle().map_err(|e| cublas("cublasLtCreate", e))?;
        // SAFETY: GPU 0's context is current; the workspace is freed in Drop.
        let workspace = unsafe { drv::malloc_sync(WORKSPACE as usize) }
            .map_err(|e| driver("cuMemAlloc (cuBLASLt workspace)", e))?;
        let info = DeviceInfo {
            product,
            driver_version: format!("CUDA driver {}", cuda_version(version)),
            runtime_version: format!("CUDA {} / cuBLASLt {lt_version}", cuda_version(version)),
        };
        Ok(CudaGpu {
            contexts,
            streams,
            devices,
            handle,
            workspace,
            gemms: Vec::new(),
            comms: HashMap::new(),
            info,
        })
    }

    fn bind(&self, gpu: usize) -> Result<(), BenchError> {
        // SAFETY: the contexts are retained primary contexts, live until Drop.
        unsafe { drv::ctx::set_current(self.contexts[gpu]) }
            .map_err(|e| driver("cuCtxSetCurrent", e))
    }

    /// Communicators over GPUs 0 .. n (created once per size).
    fn comms(&mut self, n: usize) -> Result<Vec<ncclsys::ncclComm_t>, BenchError> {
        if let Some(c) = self.comms.get(&n) {
            return Ok(c.clone());
        }
        // SAFETY: only tries to dlopen the library.
        if !unsafe { ncclsys::is_culib_present() } {
            return Err(BenchError::new(
                "libnccl.so not found: install NCCL (pip's nvidia-nccl-cu12 or the libnccl2 package) and add its directory to LD_LIBRARY_PATH",
            ));
        }
        if self.info.runtime_version.contains("NCCL") {
            // Version already noted.
        } else if let Ok(v) = nccl::get_nccl_version() {
            self.info.runtime_version.push_str(&format!(
                " / NCCL {}.{}.{}",
                v / 10000,
                (v % 10000) / 100,
                v % 100
            ));
        }
        let mut comms = vec![std::ptr::null_mut(); n];
        let devlist: Vec<i32> = (0..n as i32).collect();
        // SAFETY: `comms` holds n slots and `devlist` n device ordinals, as ncclCommInitAll
        // requires; the communicators are destroyed in Drop.
        unsafe { nccl::comm_init_all(comms.as_mut_ptr(), n as i32, devlist.as_ptr()) }
            .map_err(|e| nccl_err("ncclCommInitAll", e))?;
        self.comms.insert(n, comms.clone());
        Ok(comms)
    }

    fn layout(
        ty: ltsys::cudaDataType,
        rows: u64,
        cols: u64,
        batch: u64,
    ) -> Result<ltsys::cublasLtMatrixLayout_t, BenchError> {
        let l = lt::create_matrix_layout(ty, rows, cols, rows as i64)
            .map_err(|e| cublas("cublasLtMatrixLayoutCreate", e))?;
        if batch > 1 {
            let count = batch as i32;
            let stride = (rows * cols) as i64;
            // SAFETY: `l` was just created; each value has the attribute's type (int32 count,
            // int64 stride) and its size is passed.
            unsafe {
                lt::set_matrix_layout_attribute(
                    l,
                    ltsys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &count as *const i32 as *const c_void,
                    size_of::<i32>(),
                )
                .and_then(|_| {
                    lt::set_matrix_layout_attribute(
                        l,
                        ltsys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        &stride as *const i64 as *const c_void,
                        size_of::<i64>(),
                    )
                })
            }
            .map_err(|e| cublas("cublasLtMatrixLayoutSetAttribute", e))?;
        }
        Ok(l)
    }

    fn prepare(&mut self, s: &GemmSpec) -> Result<Prepared, BenchError> {
        self.bind(0)?;
        let input = if s.fp8 {
            ltsys::cudaDataType::CUDA_R_8F_E4M3
        } else {
            ltsys::cudaDataType::CUDA_R_16BF
        };
        let desc = lt::create_matmul_desc(
            ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ltsys::cudaDataType::CUDA_R_32F,
        )
        .map_err(|e| cublas("cublasLtMatmulDescCreate", e))?;
        // CUBLAS_OP_T on the weights, CUBLAS_OP_N (the default) on the activations.
        let trans: i32 = 1;
        // SAFETY: `desc` was just created; TRANSA takes an int32 cublasOperation_t.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                ltsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &trans as *const i32 as *const c_void,
                size_of::<i32>(),
            )
        }
        .map_err(|e| cublas("cublasLtMatmulDescSetAttribute", e))?;
        let a = Self::layout(input, s.k, s.n, s.batch)?;
        let b = Self::layout(input, s.k, s.m, s.batch)?;
        let d = Self::layout(ltsys::cudaDataType::CUDA_R_16BF, s.n, s.m, s.batch)?;
        let pref =
            lt::create_matmul_pref().map_err(|e| cublas("cublasLtMatmulPreferenceCreate", e))?;
        let ws: u64 = WORKSPACE;
        // SAFETY: `pref` was just created; MAX_WORKSPACE_BYTES takes a uint64. The heuristic
        // reads the live descriptors; `pref` is destroyed right after.
        let heuristic = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const u64 as *const c_void,
                size_of::<u64>(),
            )
            .and_then(|_| lt::get_matmul_algo_heuristic(self.handle, desc, a, b, d, d, pref))
        };
        // SAFETY: `pref` is not used again.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        match heuristic {
            Ok(h) => Ok(Prepared {
                desc,
                a,
                b,
                d,
                algo: h.algo,
            }),
            Err(e) => {
                release(&Prepared {
                    desc,
                    a,
                    b,
                    d,
                    // SAFETY: an all-zero algorithm struct is a valid (unused) value of this
                    // plain-data type; it is never passed to cuBLASLt.
                    algo: unsafe { std::mem::zeroed() },
                });
                Err(BenchError(format!(
                    "cuBLASLt has no {} algorithm for a {} x {} x {} GEMM (batch {}) on this GPU: {:?}",
                    if s.fp8 { "FP8" } else { "BF16" },
                    s.m,
                    s.n,
                    s.k,
                    s.batch,
                    e.0
                )))
            }
        }
    }
}

fn release(p: &Prepared) {
    // SAFETY: the descriptors were created by cuBLASLt and are released once.
    unsafe {
        let _ = lt::destroy_matrix_layout(p.a);
        let _ = lt::destroy_matrix_layout(p.b);
        let _ = lt::destroy_matrix_layout(p.d);
        let _ = lt::destroy_matmul_desc(p.desc);
    }
}

impl Gpu for CudaGpu {
    fn backend(&self) -> Backend {
        Backend::Cuda
    }

    fn count(&self) -> usize {
        self.contexts.len()
    }

    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn alloc(&mut self, gpu: usize, bytes: u64) -> Result<DevPtr, BenchError> {
        self.bind(gpu)?;
        // SAFETY: the GPU's context is current; the memory is freed by `free`.
        unsafe { drv::malloc_sync(bytes as usize) }
            .map_err(|e| driver(&format!("cuMemAlloc of {bytes} bytes on GPU {gpu}"), e))
    }

    fn free(&mut self, gpu: usize, ptr: DevPtr) {
        if self.bind(gpu).is_ok() {
            // SAFETY: `ptr` came from `alloc` on this GPU and is freed once.
            let _ = unsafe { drv::free_sync(ptr) };
        }
    }

    fn upload(&mut self, gpu: usize, dst: DevPtr, data: &[u8]) -> Result<(), BenchError> {
        self.bind(gpu)?;
        // SAFETY: `dst` points into an allocation of at least data.len() bytes (the engine
        // never uploads past a buffer's end); the copy is synchronous.
        unsafe { drv::memcpy_htod_sync(dst, data) }.map_err(|e| driver("cuMemcpyHtoD", e))
    }

    fn copy(&mut self, gpu: usize, dst: DevPtr, src: DevPtr, bytes: u64) -> Result<(), BenchError> {
        self.bind(gpu)?;
        // SAFETY: both ranges lie inside live allocations on this GPU; the stream is its own.
        unsafe { drv::memcpy_dtod_async(dst, src, bytes as usize, self.streams[gpu]) }
            .map_err(|e| driver("cuMemcpyDtoDAsync", e))
    }

    fn event(&mut self, gpu: usize) -> Result<Event, BenchError> {
        self.bind(gpu)?;
        drv::event::create(dsys::CUevent_flags::CU_EVENT_DEFAULT)
            .map(|e| e as Event)
            .map_err(|e| driver("cuEventCreate", e))
    }

    fn record(&mut self, gpu: usize, ev: Event) -> Result<(), BenchError> {
        self.bind(gpu)?;
        // SAFETY: `ev` was created on this GPU's context and not destroyed; the stream is live.
        unsafe { drv::event::record(ev as dsys::CUevent, self.streams[gpu]) }
            .map_err(|e| driver("cuEventRecord", e))
    }

    fn elapsed_ms(&mut self, gpu: usize, start: Event, end: Event) -> Result<f32, BenchError> {
        self.bind(gpu)?;
        // SAFETY: both events were created and recorded on this GPU's stream.
        unsafe {
            drv::event::synchronize(end as dsys::CUevent)
                .and_then(|_| drv::event::elapsed(start as dsys::CUevent, end as dsys::CUevent))
        }
        .map_err(|e| driver("cuEventElapsedTime", e))
    }

    fn destroy_event(&mut self, gpu: usize, ev: Event) {
        if self.bind(gpu).is_ok() {
            // SAFETY: `ev` came from `event` and is destroyed once.
            let _ = unsafe { drv::event::destroy(ev as dsys::CUevent) };
        }
    }

    fn memory(&mut self, gpu: usize) -> Result<(u64, u64), BenchError> {
        self.bind(gpu)?;
        drv::mem_get_info()
            .map(|(f, t)| (f as u64, t as u64))
            .map_err(|e| driver("cuMemGetInfo", e))
    }

    fn gemm_prepare(&mut self, spec: &GemmSpec) -> Result<usize, BenchError> {
        let p = self.prepare(spec)?;
        self.gemms.push(Some(p));
        Ok(self.gemms.len() - 1)
    }

    fn gemm(&mut self, id: usize, a: DevPtr, b: DevPtr, d: DevPtr) -> Result<(), BenchError> {
        let Some(Some(p)) = self.gemms.get(id) else {
            return Err(BenchError(format!("GEMM {id} was not prepared")));
        };
        self.bind(0)?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the descriptors are live; A, B and D are allocations of the sizes the
        // layouts describe (GemmSpec::operand_bytes); alpha and beta are host FP32 scalars (the
        // FP32 scale type); C aliases D with beta 0; the workspace is WORKSPACE bytes on GPU 0
        // and the stream is GPU 0's.
        unsafe {
            lt::matmul(
                self.handle,
                p.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                a as *const c_void,
                p.a,
                b as *const c_void,
                p.b,
                d as *const c_void,
                p.d,
                d as *mut c_void,
                p.d,
                &p.algo,
                self.workspace as *mut c_void,
                WORKSPACE as usize,
                self.streams[0] as ltsys::cudaStream_t,
            )
        }
        .map_err(|e| cublas("cublasLtMatmul", e))
    }

    fn gemm_release(&mut self, id: usize) {
        if let Some(slot) = self.gemms.get_mut(id)
            && let Some(p) = slot.take()
        {
            release(&p);
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
        let bf16 = ncclsys::ncclDataType_t::ncclBfloat16;
        let sum = ncclsys::ncclRedOp_t::ncclSum;
        nccl::group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let mut result = Ok(());
        for (rank, (send, recv)) in bufs.iter().enumerate() {
            let (comm, stream) = (comms[rank], self.streams[rank] as ncclsys::cudaStream_t);
            let (sp, rp) = (*send as *const c_void, *recv as *mut c_void);
            // SAFETY: send and receive buffers were sized for this op and count by
            // gpu::collective_sizes on this rank's GPU; the communicator and stream belong to
            // this rank; all calls sit between ncclGroupStart and ncclGroupEnd, as one thread
            // driving several GPUs requires.
            let outcome = unsafe {
                match op {
                    Collective::AllReduce => {
                        nccl::all_reduce(sp, rp, count, bf16, sum, comm, stream).map(|_| ())
                    }
                    Collective::ReduceScatter => {
                        nccl::reduce_scatter(sp, rp, count, bf16, sum, comm, stream).map(|_| ())
                    }
                    Collective::AllGather => {
                        nccl::all_gather(sp, rp, count, bf16, comm, stream).map(|_| ())
                    }
                    Collective::AllToAll => (0..n).try_for_each(|peer| {
                        let off = (peer * count * 2) as u64;
                        nccl::send(
                            (*send + off) as *const c_void,
                            count,
                            bf16,
                            peer as i32,
                            comm,
                            stream,
                        )?;
                        nccl::recv(
                            (*recv + off) as *mut c_void,
                            count,
                            bf16,
                            peer as i32,
                            comm,
                            stream,
                        )
                        .map(|_| ())
                    }),
                    Collective::P2p => match rank {
                        0 => nccl::send(sp, count, bf16, 1, comm, stream).map(|_| ()),
                        1 => nccl::recv(rp, count, bf16, 0, comm, stream).map(|_| ()),
                        _ => Ok(()),
                    },
                }
            };
            if let Err(e) = outcome {
                result = Err(nccl_err(op.name(), e));
                break;
            }
        }
        let end = nccl::group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        result.and(end.map(|_| ()))
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        for p in self.gemms.drain(..).flatten() {
            release(&p);
        }
        for comms in self.comms.values() {
            for c in comms {
                // SAFETY: each communicator came from ncclCommInitAll and is destroyed once.
                let _ = unsafe { nccl::comm_destroy(*c) };
            }
        }
        if self.bind(0).is_ok() {
            // SAFETY: the handle and workspace were created on GPU 0 and are released once.
            unsafe {
                let _ = lt::destroy_handle(self.handle);
                let _ = drv::free_sync(self.workspace);
            }
        }
        for (i, stream) in self.streams.iter().enumerate() {
            if self.bind(i).is_ok() {
                // SAFETY: the stream was created on this context and is destroyed once.
                let _ = unsafe { drv::stream::destroy(*stream) };
            }
        }
        for dev in &self.devices {
            // SAFETY: each device's primary context was retained once in `open`.
            let _ = unsafe { drv::primary_ctx::release(*dev) };
        }
    }
}
