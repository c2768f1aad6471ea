//! rocBLAS declarations, written by hand from the published `rocblas-types.h` and
//! `rocblas-functions.h` of rocBLAS 3.x (ROCm 5.7) / 4.x (ROCm 6.x); these prototypes are the
//! same in both (rocblas_int = int32 in the default LP64 build). `rocblas_gemm_ex` and
//! `rocblas_gemm_strided_batched_ex` take separate C and D matrices, a solution index and flags.
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_uint, c_void};
use std::path::PathBuf;

use super::hipblas::enum_newtype;
use super::{dynamic_table, status_newtype};
use crate::generated::hipStream_t;

/// `rocblas_handle` (opaque).
pub type rocblas_handle = *mut c_void;
/// `rocblas_int` (LP64 build).
pub type rocblas_int = i32;
/// `rocblas_stride`.
pub type rocblas_stride = i64;
/// `rocblas_half`: an IEEE half as its bits.
pub type rocblas_half = u16;

status_newtype! {
    /// `rocblas_status`.
    rocblas_status => RocBlasError ("rocBLAS") {
        rocblas_status_success = 0,
        rocblas_status_invalid_handle = 1,
        rocblas_status_not_implemented = 2,
        rocblas_status_invalid_pointer = 3,
        rocblas_status_invalid_size = 4,
        rocblas_status_memory_error = 5,
        rocblas_status_internal_error = 6,
        rocblas_status_perf_degraded = 7,
        rocblas_status_size_query_mismatch = 8,
        rocblas_status_size_increased = 9,
        rocblas_status_size_unchanged = 10,
        rocblas_status_invalid_value = 11,
        rocblas_status_continue = 12,
        rocblas_status_check_numerics_fail = 13,
        rocblas_status_excluded_from_build = 14,
        rocblas_status_arch_mismatch = 15,
    }
    hints {
        rocblas_status_memory_error => "rocBLAS could not allocate its workspace: device memory is exhausted",
        rocblas_status_invalid_size => "a dimension or leading dimension is invalid (column-major: lda >= rows of op(A))",
        rocblas_status_excluded_from_build => "this rocBLAS was built without the kernels (Tensile) for this function",
        rocblas_status_arch_mismatch => "this rocBLAS build has no kernels for the device's arch: install the vendor build for it (DTK's on a DCU)",
    }
}

enum_newtype! {
    /// `rocblas_operation`.
    rocblas_operation {
        rocblas_operation_none = 111, rocblas_operation_transpose = 112,
        rocblas_operation_conjugate_transpose = 113,
    }
}
enum_newtype! {
    /// `rocblas_pointer_mode`.
    rocblas_pointer_mode { rocblas_pointer_mode_host = 0, rocblas_pointer_mode_device = 1, }
}
enum_newtype! {
    /// `rocblas_datatype`.
    rocblas_datatype {
        rocblas_datatype_f16_r = 150, rocblas_datatype_f32_r = 151, rocblas_datatype_f64_r = 152,
        rocblas_datatype_i8_r = 160, rocblas_datatype_i32_r = 162, rocblas_datatype_bf16_r = 168,
    }
}
enum_newtype! {
    /// `rocblas_gemm_algo`.
    rocblas_gemm_algo { rocblas_gemm_algo_standard = 0, }
}

dynamic_table! {
    /// rocBLAS entry points hip-sys binds (see the module docs for the header versions).
    pub struct RocBlasApi {
        rocblas_create_handle: fn(handle: *mut rocblas_handle) -> rocblas_status;
        rocblas_destroy_handle: fn(handle: rocblas_handle) -> rocblas_status;
        rocblas_set_stream: fn(handle: rocblas_handle, stream: hipStream_t) -> rocblas_status;
        rocblas_set_pointer_mode: fn(handle: rocblas_handle, mode: rocblas_pointer_mode) -> rocblas_status;
        rocblas_sgemm: fn(
            handle: rocblas_handle, trans_a: rocblas_operation, trans_b: rocblas_operation,
            m: rocblas_int, n: rocblas_int, k: rocblas_int, alpha: *const f32, a: *const f32,
            lda: rocblas_int, b: *const f32, ldb: rocblas_int, beta: *const f32, c: *mut f32,
            ldc: rocblas_int,
        ) -> rocblas_status;
        rocblas_hgemm: fn(
            handle: rocblas_handle, trans_a: rocblas_operation, trans_b: rocblas_operation,
            m: rocblas_int, n: rocblas_int, k: rocblas_int, alpha: *const rocblas_half,
            a: *const rocblas_half, lda: rocblas_int, b: *const rocblas_half, ldb: rocblas_int,
            beta: *const rocblas_half, c: *mut rocblas_half, ldc: rocblas_int,
        ) -> rocblas_status;
        rocblas_gemm_ex: fn(
            handle: rocblas_handle, trans_a: rocblas_operation, trans_b: rocblas_operation,
            m: rocblas_int, n: rocblas_int, k: rocblas_int, alpha: *const c_void,
            a: *const c_void, a_type: rocblas_datatype, lda: rocblas_int,
            b: *const c_void, b_type: rocblas_datatype, ldb: rocblas_int, beta: *const c_void,
            c: *const c_void, c_type: rocblas_datatype, ldc: rocblas_int,
            d: *mut c_void, d_type: rocblas_datatype, ldd: rocblas_int,
            compute_type: rocblas_datatype, algo: rocblas_gemm_algo, solution_index: i32,
            flags: u32,
        ) -> rocblas_status;
        rocblas_gemm_strided_batched_ex: fn(
            handle: rocblas_handle, trans_a: rocblas_operation, trans_b: rocblas_operation,
            m: rocblas_int, n: rocblas_int, k: rocblas_int, alpha: *const c_void,
            a: *const c_void, a_type: rocblas_datatype, lda: rocblas_int, stride_a: rocblas_stride,
            b: *const c_void, b_type: rocblas_datatype, ldb: rocblas_int, stride_b: rocblas_stride,
            beta: *const c_void,
            c: *const c_void, c_type: rocblas_datatype, ldc: rocblas_int, stride_c: rocblas_stride,
            d: *mut c_void, d_type: rocblas_datatype, ldd: rocblas_int, stride_d: rocblas_stride,
            batch_count: rocblas_int, compute_type: rocblas_datatype, algo: rocblas_gemm_algo,
            solution_index: i32, flags: u32,
        ) -> rocblas_status;
    }
}

/// A loaded rocBLAS.
pub struct RocBlas {
    api: RocBlasApi,
    path: PathBuf,
    loaded: PathBuf,
}

impl RocBlas {
    pub(crate) fn from_opened(opened: crate::dl::Opened) -> RocBlas {
        // SAFETY: `opened` passed the rocBLAS core-symbol check; the prototypes follow the
        // headers named in the module docs. The library is leaked below, so symbols stay valid.
        let api = unsafe { RocBlasApi::load(&opened.library) };
        std::mem::forget(opened.library);
        RocBlas {
            api,
            path: opened.path,
            loaded: opened.loaded,
        }
    }
}

crate::dl::library_accessors!(
    RocBlas,
    RocBlasApi,
    "The entry-point table (read fields, or use `sym!(blas, name)`)."
);

impl std::fmt::Debug for RocBlas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocBlas")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// Keep `c_uint` in scope for the newtype macro's expansion.
const _: c_uint = 0;
