//! The GPU backends of `primus bench`: `rocm` (feature `rocm`: HIP, hipBLASLt, RCCL) and `cuda`
//! (feature `cuda`: CUDA, cuBLASLt, NCCL) measure the oracle's benchmark plan
//! ([`primus_oracle::bench::measure`]) on this node's GPUs. They are the project's only FFI,
//! kept out of the oracle (which forbids unsafe code).
//!
//! [`run`] is what the CLI calls: it dispatches to the backend, or says in one line that the
//! backend was not built in. The `simulate` backend is pure and lives in the oracle
//! ([`primus_oracle::bench::simulate`]).

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod gpu;
#[cfg(feature = "rocm")]
mod hip_ffi;
#[cfg(feature = "rocm")]
pub mod rocm;

use primus_oracle::bench::measure::{BenchError, Protocol, Provenance};
use primus_oracle::layout::Layout;
use primus_oracle::plan::Plan;
use primus_oracle::report::{Backend, BenchmarkResults};

/// Run the benchmark of `plan` on this node's GPUs with a GPU `backend` (`rocm` or `cuda`);
/// `progress` gets one line per measured case. A backend that is not built in, a missing GPU
/// or library, and `simulate` (not a GPU backend) are errors of one line.
pub fn run(
    backend: Backend,
    plan: &Plan,
    finalists: &[Layout],
    protocol: &Protocol,
    provenance: Provenance,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchmarkResults, BenchError> {
    match backend {
        Backend::Rocm => run_rocm(plan, finalists, protocol, provenance, progress),
        Backend::Cuda => run_cuda(plan, finalists, protocol, provenance, progress),
        Backend::Simulate => Err(BenchError::new(
            "simulate is not a GPU backend: use primus_oracle::bench::simulate",
        )),
    }
}

#[cfg(feature = "rocm")]
fn run_rocm(
    plan: &Plan,
    finalists: &[Layout],
    protocol: &Protocol,
    provenance: Provenance,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchmarkResults, BenchError> {
    rocm::run(plan, finalists, protocol, provenance, progress)
}

#[cfg(not(feature = "rocm"))]
fn run_rocm(
    _plan: &Plan,
    _finalists: &[Layout],
    _protocol: &Protocol,
    _provenance: Provenance,
    _progress: &mut dyn FnMut(&str),
) -> Result<BenchmarkResults, BenchError> {
    Err(BenchError::new(
        "the rocm backend is not built into this primus (build it with `--features rocm`); use --backend simulate",
    ))
}

#[cfg(feature = "cuda")]
fn run_cuda(
    plan: &Plan,
    finalists: &[Layout],
    protocol: &Protocol,
    provenance: Provenance,
    progress: &mut dyn FnMut(&str),
) -> Result<BenchmarkResults, BenchError> {
    cuda::run(plan, finalists, protocol, provenance, progress)
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(
    _plan: &Plan,
    _finalists: &[Layout],
    _protocol: &Protocol,
    _provenance: Provenance,
    _progress: &mut dyn FnMut(&str),
) -> Result<BenchmarkResults, BenchError> {
    Err(BenchError::new(
        "the cuda backend is not built into this primus (build it with `--features cuda`); use --backend simulate",
    ))
}
