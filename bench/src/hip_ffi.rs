//! The few hipBLASLt and RCCL symbols the `rocm` backend calls, loaded at run time with
//! libloading from the ROCm install (`$ROCM_PATH/lib`, `/opt/rocm/lib`, then the library
//! path): neither library is a Debian package, so nothing links them at build time.
//!
//! The declarations follow the public headers: `hipblaslt/hipblaslt.h` with
//! `hipblas-common.h` and `hip/library_types.h` (ROCm 6.1 and newer, where hipBLASLt takes
//! `hipDataType` and `hipblasComputeType_t`), and `rccl/rccl.h` (the NCCL 2 API). C enums are
//! passed as `c_int`; opaque handles as pointers.

use std::ffi::{c_char, c_int, c_void};
use std::path::PathBuf;

use libloading::Library;

/// `hipStream_t`.
pub type HipStream = hip_sys::hiprt::hipStream_t;

/// `hipblasStatus_t`.
pub type HipblasStatus = c_int;
pub const HIPBLAS_STATUS_SUCCESS: HipblasStatus = 0;

/// `hipblasLtHandle_t` and the opaque descriptor pointers.
pub type LtHandle = *mut c_void;
pub type LtMatmulDesc = *mut c_void;
pub type LtLayout = *mut c_void;
pub type LtPreference = *mut c_void;

/// `hipblasOperation_t`.
pub const HIPBLAS_OP_T: i32 = 112;
/// `hipblasComputeType_t::HIPBLAS_COMPUTE_32F`.
pub const HIPBLAS_COMPUTE_32F: c_int = 2;
/// `hipDataType` values.
pub const HIP_R_32F: c_int = 0;
pub const HIP_R_16BF: c_int = 14;
/// OCP FP8 (gfx950, MI350 and later).
pub const HIP_R_8F_E4M3: c_int = 28;
/// FP8 with the "FNUZ" encoding of gfx942 (MI300X, MI325X).
pub const HIP_R_8F_E4M3_FNUZ: c_int = 1000;
/// `hipblasLtMatmulDescAttributes_t::HIPBLASLT_MATMUL_DESC_TRANSA` (int32 value).
pub const MATMUL_DESC_TRANSA: c_int = 0;
/// `hipblasLtMatrixLayoutAttribute_t` values (int32 count, int64 stride in elements).
pub const MATRIX_LAYOUT_BATCH_COUNT: c_int = 0;
pub const MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: c_int = 1;
/// `hipblasLtMatmulPreferenceAttributes_t::HIPBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES` (uint64).
pub const MATMUL_PREF_MAX_WORKSPACE_BYTES: c_int = 1;

/// `hipblasLtMatmulAlgo_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct LtAlgo {
    pub data: [u8; 16],
    pub max_workspace_bytes: usize,
}

/// `hipblasLtMatmulHeuristicResult_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct LtHeuristic {
    pub algo: LtAlgo,
    pub workspace_size: usize,
    pub state: HipblasStatus,
    pub waves_count: f32,
    pub reserved: [c_int; 4],
}

type Status = HipblasStatus;

/// hipBLASLt's entry points.
pub struct HipBlasLt {
    pub create: unsafe extern "C" fn(*mut LtHandle) -> Status,
    pub destroy: unsafe extern "C" fn(LtHandle) -> Status,
    pub get_version: unsafe extern "C" fn(LtHandle, *mut c_int) -> Status,
    pub layout_create: unsafe extern "C" fn(*mut LtLayout, c_int, u64, u64, i64) -> Status,
    pub layout_destroy: unsafe extern "C" fn(LtLayout) -> Status,
    pub layout_set: unsafe extern "C" fn(LtLayout, c_int, *const c_void, usize) -> Status,
    pub desc_create: unsafe extern "C" fn(*mut LtMatmulDesc, c_int, c_int) -> Status,
    pub desc_destroy: unsafe extern "C" fn(LtMatmulDesc) -> Status,
    pub desc_set: unsafe extern "C" fn(LtMatmulDesc, c_int, *const c_void, usize) -> Status,
    pub pref_create: unsafe extern "C" fn(*mut LtPreference) -> Status,
    pub pref_destroy: unsafe extern "C" fn(LtPreference) -> Status,
    pub pref_set: unsafe extern "C" fn(LtPreference, c_int, *const c_void, usize) -> Status,
    #[allow(clippy::type_complexity)]
    pub heuristic: unsafe extern "C" fn(
        LtHandle,
        LtMatmulDesc,
        LtLayout,
        LtLayout,
        LtLayout,
        LtLayout,
        LtPreference,
        c_int,
        *mut LtHeuristic,
        *mut c_int,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    pub matmul: unsafe extern "C" fn(
        LtHandle,
        LtMatmulDesc,
        *const c_void,
        *const c_void,
        LtLayout,
        *const c_void,
        LtLayout,
        *const c_void,
        *const c_void,
        LtLayout,
        *mut c_void,
        LtLayout,
        *const LtAlgo,
        *mut c_void,
        usize,
        HipStream,
    ) -> Status,
    /// Keeps the entry points valid.
    _lib: Library,
}

/// `ncclComm_t`, `ncclResult_t` and the enum values used.
pub type NcclComm = *mut c_void;
pub type NcclResult = c_int;
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclDataType_t::ncclBfloat16`.
pub const NCCL_BFLOAT16: c_int = 9;
/// `ncclRedOp_t::ncclSum`.
pub const NCCL_SUM: c_int = 0;

/// RCCL's entry points (the NCCL API).
pub struct Rccl {
    pub comm_init_all: unsafe extern "C" fn(*mut NcclComm, c_int, *const c_int) -> NcclResult,
    pub comm_destroy: unsafe extern "C" fn(NcclComm) -> NcclResult,
    #[allow(clippy::type_complexity)]
    pub all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclComm,
        HipStream,
    ) -> NcclResult,
    #[allow(clippy::type_complexity)]
    pub reduce_scatter: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        NcclComm,
        HipStream,
    ) -> NcclResult,
    pub all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        NcclComm,
        HipStream,
    ) -> NcclResult,
    pub send:
        unsafe extern "C" fn(*const c_void, usize, c_int, c_int, NcclComm, HipStream) -> NcclResult,
    pub recv:
        unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, NcclComm, HipStream) -> NcclResult,
    pub group_start: unsafe extern "C" fn() -> NcclResult,
    pub group_end: unsafe extern "C" fn() -> NcclResult,
    pub get_version: unsafe extern "C" fn(*mut c_int) -> NcclResult,
    pub get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
    _lib: Library,
}

/// Where a ROCm library may live: `$ROCM_PATH/lib`, `$HIP_PATH/lib`, `/opt/rocm/lib`, then
/// the dynamic loader's own search (bare name).
pub fn candidates(file: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Ok(root) = std::env::var(var)
            && !root.is_empty()
        {
            out.push(PathBuf::from(root).join("lib").join(file));
        }
    }
    out.push(PathBuf::from("/opt/rocm/lib").join(file));
    out.push(PathBuf::from(file));
    out
}

/// Open the first candidate that loads.
fn open(file: &str, what: &str) -> Result<Library, String> {
    let tried = candidates(file);
    for path in &tried {
        // SAFETY: loading a ROCm library runs its initialisers, which only set up the library
        // itself (no code of ours runs; nothing else is replaced).
        if let Ok(lib) = unsafe { Library::new(path) } {
            return Ok(lib);
        }
    }
    Err(format!(
        "{file} not found (tried {}): install {what} from ROCm or set ROCM_PATH",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Copy one entry point out of a library.
///
/// # Safety
/// `T` must be the function pointer type of the symbol as the header declares it.
unsafe fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    let mut z = name.as_bytes().to_vec();
    z.push(0);
    // SAFETY: the caller guarantees the type; the copy stays valid while `lib` is loaded,
    // and the structs keep `lib` alongside the pointers.
    unsafe { lib.get::<T>(&z) }
        .map(|s| *s)
        .map_err(|e| format!("symbol {name}: {e}"))
}

impl HipBlasLt {
    /// Load hipBLASLt.
    pub fn load() -> Result<HipBlasLt, String> {
        let lib = open("libhipblaslt.so", "hipBLASLt (ROCm 6.1 or newer)")?;
        // SAFETY: every type below is the signature hipblaslt.h declares for the symbol.
        unsafe {
            Ok(HipBlasLt {
                create: symbol(&lib, "hipblasLtCreate")?,
                destroy: symbol(&lib, "hipblasLtDestroy")?,
                get_version: symbol(&lib, "hipblasLtGetVersion")?,
                layout_create: symbol(&lib, "hipblasLtMatrixLayoutCreate")?,
                layout_destroy: symbol(&lib, "hipblasLtMatrixLayoutDestroy")?,
                layout_set: symbol(&lib, "hipblasLtMatrixLayoutSetAttribute")?,
                desc_create: symbol(&lib, "hipblasLtMatmulDescCreate")?,
                desc_destroy: symbol(&lib, "hipblasLtMatmulDescDestroy")?,
                desc_set: symbol(&lib, "hipblasLtMatmulDescSetAttribute")?,
                pref_create: symbol(&lib, "hipblasLtMatmulPreferenceCreate")?,
                pref_destroy: symbol(&lib, "hipblasLtMatmulPreferenceDestroy")?,
                pref_set: symbol(&lib, "hipblasLtMatmulPreferenceSetAttribute")?,
                heuristic: symbol(&lib, "hipblasLtMatmulAlgoGetHeuristic")?,
                matmul: symbol(&lib, "hipblasLtMatmul")?,
                _lib: lib,
            })
        }
    }
}

impl Rccl {
    /// Load RCCL.
    pub fn load() -> Result<Rccl, String> {
        let lib = open("librccl.so", "RCCL")?;
        // SAFETY: every type below is the signature rccl.h declares for the symbol.
        unsafe {
            Ok(Rccl {
                comm_init_all: symbol(&lib, "ncclCommInitAll")?,
                comm_destroy: symbol(&lib, "ncclCommDestroy")?,
                all_reduce: symbol(&lib, "ncclAllReduce")?,
                reduce_scatter: symbol(&lib, "ncclReduceScatter")?,
                all_gather: symbol(&lib, "ncclAllGather")?,
                send: symbol(&lib, "ncclSend")?,
                recv: symbol(&lib, "ncclRecv")?,
                group_start: symbol(&lib, "ncclGroupStart")?,
                group_end: symbol(&lib, "ncclGroupEnd")?,
                get_version: symbol(&lib, "ncclGetVersion")?,
                get_error_string: symbol(&lib, "ncclGetErrorString")?,
                _lib: lib,
            })
        }
    }

    /// `ncclGetErrorString` of a result, as text.
    pub fn error(&self, r: NcclResult) -> String {
        // SAFETY: RCCL returns a static NUL-terminated string for any result value.
        let p = unsafe { (self.get_error_string)(r) };
        if p.is_null() {
            return format!("error {r}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heuristic_result_has_the_header_layout() {
        // algo: 16 bytes + size_t; workspaceSize; state (int); wavesCount (float); int[4].
        assert_eq!(size_of::<LtAlgo>(), 24);
        assert_eq!(size_of::<LtHeuristic>(), 24 + 8 + 4 + 4 + 16);
    }

    #[test]
    fn libraries_are_looked_up_in_the_rocm_install_first() {
        let c = candidates("librccl.so");
        assert!(
            c.iter()
                .any(|p| p == &PathBuf::from("/opt/rocm/lib/librccl.so"))
        );
        assert_eq!(c.last().unwrap(), &PathBuf::from("librccl.so"));
    }

    #[test]
    fn a_missing_library_is_one_line_naming_it() {
        // Debian has no hipBLASLt; a machine with ROCm would load it.
        if let Err(e) = open("libprimus-does-not-exist.so", "nothing") {
            assert!(e.contains("libprimus-does-not-exist.so not found"), "{e}");
            assert!(!e.contains('\n'));
        } else {
            panic!("a library that does not exist loaded");
        }
    }
}
