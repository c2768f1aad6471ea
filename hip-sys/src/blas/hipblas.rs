//! hipBLAS declarations, written by hand from the published `hipblas.h`:
//! - handle, stream, pointer mode, Sgemm, Hgemm, status, operation, legacy `hipblasDatatype_t`,
//!   `hipblasGemmAlgo_t` and the legacy `hipblasGemmEx`/`hipblasGemmStridedBatchedEx`: hipBLAS
//!   1.x (ROCm 5.6/5.7, `hipblas.h` of rocm-5.7.0), unchanged since 0.5x; DTK 23.10/24.04 ship
//!   this ABI.
//! - `hipblasComputeType_t` and `hipblasGemmEx_v2`/`hipblasGemmStridedBatchedEx_v2`: hipBLAS 2.x
//!   (ROCm 6.0-6.4, `hipblas.h` of rocm-6.0.0); hipBLAS 3.x (ROCm 7) removed the `_v2` names and
//!   gave the unsuffixed `hipblasGemmEx` this signature.
//! - `hipDataType`: HIP's `library_types.h` of ROCm 6.x (the 5.2 header defines only the float
//!   types, with the same numbers; a test checks those against /usr/include).
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

use super::{dynamic_table, status_newtype};
use crate::generated::hipStream_t;
use crate::Error;

/// `hipblasHandle_t` (opaque).
pub type hipblasHandle_t = *mut c_void;
/// `hipblasHalf`: an IEEE half as its bits.
pub type hipblasHalf = u16;
/// `hipblasStride`.
pub type hipblasStride = i64;

status_newtype! {
    /// `hipblasStatus_t`.
    hipblasStatus_t => HipBlasError ("hipBLAS") {
        HIPBLAS_STATUS_SUCCESS = 0,
        HIPBLAS_STATUS_NOT_INITIALIZED = 1,
        HIPBLAS_STATUS_ALLOC_FAILED = 2,
        HIPBLAS_STATUS_INVALID_VALUE = 3,
        HIPBLAS_STATUS_MAPPING_ERROR = 4,
        HIPBLAS_STATUS_EXECUTION_FAILED = 5,
        HIPBLAS_STATUS_INTERNAL_ERROR = 6,
        HIPBLAS_STATUS_NOT_SUPPORTED = 7,
        HIPBLAS_STATUS_ARCH_MISMATCH = 8,
        HIPBLAS_STATUS_HANDLE_IS_NULLPTR = 9,
        HIPBLAS_STATUS_INVALID_ENUM = 10,
        HIPBLAS_STATUS_UNKNOWN = 11,
    }
    hints {
        HIPBLAS_STATUS_NOT_INITIALIZED => "the handle is not initialised: create it with hipblasCreate after the HIP runtime has a device",
        HIPBLAS_STATUS_ALLOC_FAILED => "hipBLAS could not allocate its workspace: device memory is exhausted",
        HIPBLAS_STATUS_NOT_SUPPORTED => "this hipBLAS build or its backend does not support the type/compute-type combination",
        HIPBLAS_STATUS_ARCH_MISMATCH => "this hipBLAS/rocBLAS build has no kernels for the device's arch: install the vendor build for it (DTK's on a DCU)",
        HIPBLAS_STATUS_INVALID_ENUM => "an enum value is unknown to this build: check GemmExAbi (legacy hipblasDatatype_t vs hipDataType numbering)",
    }
}

/// Declare a C-enum newtype with its constants.
macro_rules! enum_newtype {
    ($(#[$meta:meta])* $ty:ident { $($name:ident = $value:literal,)* }) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $ty(pub c_uint);
        impl $ty {
            $(pub const $name: $ty = $ty($value);)*
        }
    };
}
pub(crate) use enum_newtype;

enum_newtype! {
    /// `hipblasOperation_t` (column-major: N = as stored, T = transposed).
    hipblasOperation_t { HIPBLAS_OP_N = 111, HIPBLAS_OP_T = 112, HIPBLAS_OP_C = 113, }
}
enum_newtype! {
    /// `hipblasPointerMode_t`: where alpha/beta live.
    hipblasPointerMode_t { HIPBLAS_POINTER_MODE_HOST = 0, HIPBLAS_POINTER_MODE_DEVICE = 1, }
}
enum_newtype! {
    /// Legacy `hipblasDatatype_t` (hipBLAS < 3; deprecated in 2.0).
    hipblasDatatype_t {
        HIPBLAS_R_16F = 150, HIPBLAS_R_32F = 151, HIPBLAS_R_64F = 152,
        HIPBLAS_R_8I = 160, HIPBLAS_R_32I = 162, HIPBLAS_R_16B = 168,
    }
}
enum_newtype! {
    /// `hipDataType` (HIP `library_types.h`), used by the v2 GEMM ABI.
    hipDataType {
        HIP_R_32F = 0, HIP_R_64F = 1, HIP_R_16F = 2, HIP_R_8I = 3, HIP_R_32I = 10,
        HIP_R_16BF = 14,
    }
}
enum_newtype! {
    /// `hipblasComputeType_t` (hipBLAS >= 2.0).
    hipblasComputeType_t {
        HIPBLAS_COMPUTE_16F = 0, HIPBLAS_COMPUTE_16F_PEDANTIC = 1, HIPBLAS_COMPUTE_32F = 2,
        HIPBLAS_COMPUTE_32F_PEDANTIC = 3, HIPBLAS_COMPUTE_32F_FAST_16F = 4,
        HIPBLAS_COMPUTE_32F_FAST_16BF = 5, HIPBLAS_COMPUTE_32F_FAST_TF32 = 6,
        HIPBLAS_COMPUTE_64F = 7, HIPBLAS_COMPUTE_32I = 9,
    }
}
enum_newtype! {
    /// `hipblasGemmAlgo_t`.
    hipblasGemmAlgo_t { HIPBLAS_GEMM_DEFAULT = 160, }
}

dynamic_table! {
    /// hipBLAS entry points hip-sys binds (see the module docs for the header versions).
    pub struct HipBlasApi {
        hipblasCreate: fn(handle: *mut hipblasHandle_t) -> hipblasStatus_t;
        hipblasDestroy: fn(handle: hipblasHandle_t) -> hipblasStatus_t;
        hipblasSetStream: fn(handle: hipblasHandle_t, stream: hipStream_t) -> hipblasStatus_t;
        hipblasSetPointerMode: fn(handle: hipblasHandle_t, mode: hipblasPointerMode_t) -> hipblasStatus_t;
        hipblasSgemm: fn(
            handle: hipblasHandle_t, trans_a: hipblasOperation_t, trans_b: hipblasOperation_t,
            m: c_int, n: c_int, k: c_int, alpha: *const f32, a: *const f32, lda: c_int,
            b: *const f32, ldb: c_int, beta: *const f32, c: *mut f32, ldc: c_int,
        ) -> hipblasStatus_t;
        hipblasHgemm: fn(
            handle: hipblasHandle_t, trans_a: hipblasOperation_t, trans_b: hipblasOperation_t,
            m: c_int, n: c_int, k: c_int, alpha: *const hipblasHalf, a: *const hipblasHalf,
            lda: c_int, b: *const hipblasHalf, ldb: c_int, beta: *const hipblasHalf,
            c: *mut hipblasHalf, ldc: c_int,
        ) -> hipblasStatus_t;
        /// Legacy ABI on hipBLAS < 3; the v2 ABI ([`GemmExV2Fn`]) on hipBLAS >= 3.
        hipblasGemmEx: fn(
            handle: hipblasHandle_t, trans_a: hipblasOperation_t, trans_b: hipblasOperation_t,
            m: c_int, n: c_int, k: c_int, alpha: *const c_void,
            a: *const c_void, a_type: hipblasDatatype_t, lda: c_int,
            b: *const c_void, b_type: hipblasDatatype_t, ldb: c_int, beta: *const c_void,
            c: *mut c_void, c_type: hipblasDatatype_t, ldc: c_int,
            compute_type: hipblasDatatype_t, algo: hipblasGemmAlgo_t,
        ) -> hipblasStatus_t;
        hipblasGemmEx_v2: fn(
            handle: hipblasHandle_t, trans_a: hipblasOperation_t, trans_b: hipblasOperation_t,
            m: c_int, n: c_int, k: c_int, alpha: *const c_void,
            a: *const c_void, a_type: hipDataType, lda: c_int,
            b: *const c_void, b_type: hipDataType, ldb: c_int, beta: *const c_void,
            c: *mut c_void, c_type: hipDataType, ldc: c_int,
            compute_type: hipblasComputeType_t, algo: hipblasGemmAlgo_t,
        ) -> hipblasStatus_t;
        /// Legacy ABI on hipBLAS < 3; the v2 ABI on hipBLAS >= 3.
        hipblasGemmStridedBatchedEx: fn(
            handle: hipblasHandle_t, trans_a: hipblasOperation_t, trans_b: hipblasOperation_t,
            m: c_int, n: c_int, k: c_int, alpha: *const c_void,
            a: *const c_void, a_type: hipblasDatatype_t, lda: c_int, stride_a: hipblasStride,
            b: *const c_void, b_type: hipblasDatatype_t, ldb: c_int, stride_b: hipblasStride,
            beta: *const c_void,
            c: *mut c_void, c_type: hipblasDatatype_t, ldc: c_int, stride_c: hipblasStride,
            batch_count: c_int, compute_type: hipblasDatatype_t, algo: hipblasGemmAlgo_t,
        ) -> hipblasStatus_t;
        hipblasGemmStridedBatchedEx_v2: fn(
            handle: hipblasHandle_t, trans_a: hipblasOperation_t, trans_b: hipblasOperation_t,
            m: c_int, n: c_int, k: c_int, alpha: *const c_void,
            a: *const c_void, a_type: hipDataType, lda: c_int, stride_a: hipblasStride,
            b: *const c_void, b_type: hipDataType, ldb: c_int, stride_b: hipblasStride,
            beta: *const c_void,
            c: *mut c_void, c_type: hipDataType, ldc: c_int, stride_c: hipblasStride,
            batch_count: c_int, compute_type: hipblasComputeType_t, algo: hipblasGemmAlgo_t,
        ) -> hipblasStatus_t;
    }
}

/// The v2 `GemmEx` prototype (hipDataType operands, hipblasComputeType_t compute type).
pub type GemmExV2Fn = unsafe extern "C" fn(
    hipblasHandle_t,
    hipblasOperation_t,
    hipblasOperation_t,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    hipDataType,
    c_int,
    *const c_void,
    hipDataType,
    c_int,
    *const c_void,
    *mut c_void,
    hipDataType,
    c_int,
    hipblasComputeType_t,
    hipblasGemmAlgo_t,
) -> hipblasStatus_t;
/// The legacy `GemmEx` prototype (hipblasDatatype_t everywhere).
pub type GemmExLegacyFn = unsafe extern "C" fn(
    hipblasHandle_t,
    hipblasOperation_t,
    hipblasOperation_t,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    hipblasDatatype_t,
    c_int,
    *const c_void,
    hipblasDatatype_t,
    c_int,
    *const c_void,
    *mut c_void,
    hipblasDatatype_t,
    c_int,
    hipblasDatatype_t,
    hipblasGemmAlgo_t,
) -> hipblasStatus_t;
/// The v2 `GemmStridedBatchedEx` prototype.
pub type GemmStridedBatchedExV2Fn = unsafe extern "C" fn(
    hipblasHandle_t,
    hipblasOperation_t,
    hipblasOperation_t,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    hipDataType,
    c_int,
    hipblasStride,
    *const c_void,
    hipDataType,
    c_int,
    hipblasStride,
    *const c_void,
    *mut c_void,
    hipDataType,
    c_int,
    hipblasStride,
    c_int,
    hipblasComputeType_t,
    hipblasGemmAlgo_t,
) -> hipblasStatus_t;
/// The legacy `GemmStridedBatchedEx` prototype.
pub type GemmStridedBatchedExLegacyFn = unsafe extern "C" fn(
    hipblasHandle_t,
    hipblasOperation_t,
    hipblasOperation_t,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    hipblasDatatype_t,
    c_int,
    hipblasStride,
    *const c_void,
    hipblasDatatype_t,
    c_int,
    hipblasStride,
    *const c_void,
    *mut c_void,
    hipblasDatatype_t,
    c_int,
    hipblasStride,
    c_int,
    hipblasDatatype_t,
    hipblasGemmAlgo_t,
) -> hipblasStatus_t;

/// Which `GemmEx` ABI a hipBLAS build exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmExAbi {
    /// `hipblasGemmEx` with `hipblasDatatype_t` (hipBLAS < 2, and 2.x's deprecated entry).
    Legacy,
    /// `hipblasGemmEx_v2` with `hipDataType` + `hipblasComputeType_t` (hipBLAS 2.x).
    V2Suffixed,
    /// Unsuffixed `hipblasGemmEx` with the v2 signature (hipBLAS >= 3, ROCm 7).
    V2Unsuffixed,
}

impl GemmExAbi {
    /// Decide from what the library exports and its major version (from the file name
    /// `libhipblas.so.N...`, when known). `_v2` wins when present; an unsuffixed entry is v2
    /// only on hipBLAS >= 3; with neither, there is no GemmEx.
    pub fn detect(has_v2: bool, has_unsuffixed: bool, major: Option<u32>) -> Option<GemmExAbi> {
        match (has_v2, has_unsuffixed, major) {
            (true, _, _) => Some(GemmExAbi::V2Suffixed),
            (false, true, Some(m)) if m >= 3 => Some(GemmExAbi::V2Unsuffixed),
            (false, true, _) => Some(GemmExAbi::Legacy),
            (false, false, _) => None,
        }
    }

    /// Whether this ABI takes `hipDataType` + `hipblasComputeType_t`.
    pub fn is_v2(self) -> bool {
        !matches!(self, GemmExAbi::Legacy)
    }
}

/// The soname major version in a file name like `libhipblas.so.2.0.60300` (-> 2).
pub fn soname_major(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let (_, versions) = name.split_once(".so.")?;
    versions.split('.').next()?.parse().ok()
}

/// `GemmEx` resolved for the ABI this library has.
#[derive(Debug, Clone, Copy)]
pub enum GemmEx {
    Legacy(GemmExLegacyFn),
    V2(GemmExV2Fn),
}

/// `GemmStridedBatchedEx` resolved for the ABI this library has.
#[derive(Debug, Clone, Copy)]
pub enum GemmStridedBatchedEx {
    Legacy(GemmStridedBatchedExLegacyFn),
    V2(GemmStridedBatchedExV2Fn),
}

/// A loaded hipBLAS.
pub struct HipBlas {
    api: HipBlasApi,
    path: PathBuf,
    loaded: PathBuf,
    gemm_ex_abi: Option<GemmExAbi>,
}

impl HipBlas {
    pub(crate) fn from_opened(opened: crate::dl::Opened) -> HipBlas {
        // SAFETY: `opened` passed the hipBLAS core-symbol check; the prototypes follow the
        // headers named in the module docs. The library is leaked below, so symbols stay valid.
        let api = unsafe { HipBlasApi::load(&opened.library) };
        std::mem::forget(opened.library);
        let canonical =
            std::fs::canonicalize(&opened.loaded).unwrap_or_else(|_| opened.loaded.clone());
        let gemm_ex_abi = GemmExAbi::detect(
            api.hipblasGemmEx_v2.is_ok(),
            api.hipblasGemmEx.is_ok(),
            soname_major(&canonical),
        );
        HipBlas {
            api,
            path: opened.path,
            loaded: opened.loaded,
            gemm_ex_abi,
        }
    }

    /// Which `GemmEx` ABI this build has, if any.
    pub fn gemm_ex_abi(&self) -> Option<GemmExAbi> {
        self.gemm_ex_abi
    }

    /// `GemmEx` for this build's ABI.
    pub fn gemm_ex(&self) -> Result<GemmEx, Error> {
        let api = &self.api;
        match self.gemm_ex_abi {
            Some(GemmExAbi::V2Suffixed) => self
                .resolve("hipblasGemmEx_v2", &api.hipblasGemmEx_v2)
                .map(GemmEx::V2),
            Some(GemmExAbi::V2Unsuffixed) => {
                let f = self.resolve("hipblasGemmEx", &api.hipblasGemmEx)?;
                // SAFETY: on hipBLAS >= 3 the unsuffixed symbol has the v2 prototype. The two
                // prototypes differ only in which C enum types the 32-bit enum arguments have,
                // so the call ABI is identical; only the values passed must be hipDataType /
                // hipblasComputeType_t, which GemmExV2Fn's types now enforce.
                Ok(GemmEx::V2(unsafe {
                    std::mem::transmute::<GemmExLegacyFn, GemmExV2Fn>(f)
                }))
            }
            Some(GemmExAbi::Legacy) => self
                .resolve("hipblasGemmEx", &api.hipblasGemmEx)
                .map(GemmEx::Legacy),
            None => Err(Error::MissingSymbol {
                name: "hipblasGemmEx",
                library: self.path.clone(),
            }),
        }
    }

    /// `GemmStridedBatchedEx` for this build's ABI (same ABI rule as [`HipBlas::gemm_ex`]).
    pub fn gemm_strided_batched_ex(&self) -> Result<GemmStridedBatchedEx, Error> {
        let api = &self.api;
        let legacy = || {
            self.resolve(
                "hipblasGemmStridedBatchedEx",
                &api.hipblasGemmStridedBatchedEx,
            )
        };
        match self.gemm_ex_abi {
            Some(GemmExAbi::V2Suffixed) => self
                .resolve(
                    "hipblasGemmStridedBatchedEx_v2",
                    &api.hipblasGemmStridedBatchedEx_v2,
                )
                .map(GemmStridedBatchedEx::V2),
            Some(GemmExAbi::V2Unsuffixed) => {
                let f = legacy()?;
                // SAFETY: as in `gemm_ex`: same call ABI, v2 value types on hipBLAS >= 3.
                Ok(GemmStridedBatchedEx::V2(unsafe {
                    std::mem::transmute::<GemmStridedBatchedExLegacyFn, GemmStridedBatchedExV2Fn>(f)
                }))
            }
            Some(GemmExAbi::Legacy) | None => legacy().map(GemmStridedBatchedEx::Legacy),
        }
    }
}

crate::dl::library_accessors!(
    HipBlas,
    HipBlasApi,
    "The entry-point table (read fields, or use `sym!(blas, name)`)."
);

impl std::fmt::Debug for HipBlas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipBlas")
            .field("path", &self.path)
            .field("gemm_ex_abi", &self.gemm_ex_abi)
            .finish_non_exhaustive()
    }
}
