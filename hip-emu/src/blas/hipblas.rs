//! hipBLAS exports: handle, stream, pointer mode, `hipblasSgemm`, `hipblasHgemm`, and `GemmEx` /
//! `GemmStridedBatchedEx` in both ABIs (legacy `hipblasDatatype_t` unsuffixed, hipBLAS 2
//! `hipDataType` + `hipblasComputeType_t` as `_v2`). Exporting `_v2` makes hip-sys pick the v2
//! ABI for `hip_rt::Blas`; the legacy symbols take the legacy numbering.

use std::ffi::{c_int, c_void};

use hip_sys::blas::{
    hipDataType, hipblasComputeType_t, hipblasDatatype_t, hipblasGemmAlgo_t, hipblasHandle_t,
    hipblasOperation_t, hipblasPointerMode_t, hipblasStatus_t,
};
use hip_sys::hipStream_t;

use super::gemm::{Compute, GemmCall, Ty};
use super::{
    dim, gemm_call, guard, legacy_compute, legacy_ty, scalar, submit, types, ArgNames, BlasFail,
    Mat,
};

fn status(f: &BlasFail) -> hipblasStatus_t {
    match f {
        BlasFail::NullHandle => hipblasStatus_t::HIPBLAS_STATUS_HANDLE_IS_NULLPTR,
        BlasFail::BadHandle(_) | BlasFail::Runtime(_) => {
            hipblasStatus_t::HIPBLAS_STATUS_NOT_INITIALIZED
        }
        BlasFail::Size(_) | BlasFail::Pointer(_) => hipblasStatus_t::HIPBLAS_STATUS_INVALID_VALUE,
        BlasFail::Enum(_) => hipblasStatus_t::HIPBLAS_STATUS_INVALID_ENUM,
        BlasFail::NotSupported(_) => hipblasStatus_t::HIPBLAS_STATUS_NOT_SUPPORTED,
        BlasFail::Panic(_) => hipblasStatus_t::HIPBLAS_STATUS_INTERNAL_ERROR,
    }
}

fn run(name: &str, body: impl FnOnce() -> Result<(), BlasFail>) -> hipblasStatus_t {
    guard(name, status, hipblasStatus_t::HIPBLAS_STATUS_SUCCESS, body)
}

fn v2_ty(t: hipDataType) -> Option<Ty> {
    match t.0 {
        0 => Some(Ty::F32),
        1 => Some(Ty::F64),
        2 => Some(Ty::F16),
        14 => Some(Ty::Bf16),
        _ => None,
    }
}

fn v2_compute(t: hipblasComputeType_t) -> Option<Compute> {
    match t.0 {
        2..=6 => Some(Compute::F32),
        7 => Some(Compute::F64),
        _ => None,
    }
}

const NAMES: ArgNames = ArgNames {
    trans_a: "transA",
    trans_b: "transB",
    batch: "batchCount",
};

/// Build the call shared by every GEMM entry point (C and D are the same matrix in hipBLAS).
fn call(
    (ta, tb): (hipblasOperation_t, hipblasOperation_t),
    mnk: (c_int, c_int, c_int),
    [a, b]: [Mat; 2],
    c: Mat,
    batch: c_int,
    (ty, compute): (Ty, Compute),
) -> Result<GemmCall, BlasFail> {
    // hipBLAS names a negative ldc before any other bad argument.
    dim(c.1.into(), "ldc")?;
    gemm_call(&NAMES, (ta.0, tb.0), mnk, [a, b, c, c], batch, ty, compute)
}

/// Export an entry point returning hipblasStatus_t.
macro_rules! blas_exports {
    ($( $(#[doc = $doc:literal])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// The hipBLAS C API contract: pointers valid as hipBLAS documents; device operands in
        /// device memory for the lifetime of the queued work.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> hipblasStatus_t {
            run(stringify!($name), || $body)
        }
    )*};
}

blas_exports! {
    fn hipblasCreate(handle: *mut hipblasHandle_t) {
        if handle.is_null() {
            return Err(BlasFail::Pointer("the handle out-pointer is null".into()));
        }
        let h = super::create()?;
        // SAFETY: a non-null out-pointer per the C API contract.
        unsafe { handle.write(h as hipblasHandle_t) };
        Ok(())
    }

    fn hipblasDestroy(handle: hipblasHandle_t) {
        super::destroy(handle)
    }

    fn hipblasSetStream(handle: hipblasHandle_t, stream: hipStream_t) {
        super::set_stream(handle, stream)
    }

    fn hipblasSetPointerMode(handle: hipblasHandle_t, mode: hipblasPointerMode_t) {
        super::set_pointer_mode(handle, mode.0)
    }

    fn hipblasSgemm(handle: hipblasHandle_t, ta: hipblasOperation_t, tb: hipblasOperation_t, m: c_int, n: c_int, k: c_int, alpha: *const f32, a: *const f32, lda: c_int, b: *const f32, ldb: c_int, beta: *const f32, c: *mut f32, ldc: c_int) {
        let g = call((ta, tb), (m, n, k), [(a.cast(), lda, 0), (b.cast(), ldb, 0)], (c.cast_const().cast(), ldc, 0), 1, (Ty::F32, Compute::F32))?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("hipblasSgemm", handle, g, alpha.cast(), beta.cast(), Ty::F32) }
    }

    /// f16 operands and scalars; hip-emu accumulates in f32 and rounds once.
    fn hipblasHgemm(handle: hipblasHandle_t, ta: hipblasOperation_t, tb: hipblasOperation_t, m: c_int, n: c_int, k: c_int, alpha: *const u16, a: *const u16, lda: c_int, b: *const u16, ldb: c_int, beta: *const u16, c: *mut u16, ldc: c_int) {
        let g = call((ta, tb), (m, n, k), [(a.cast(), lda, 0), (b.cast(), ldb, 0)], (c.cast_const().cast(), ldc, 0), 1, (Ty::F16, Compute::F32))?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("hipblasHgemm", handle, g, alpha.cast(), beta.cast(), Ty::F16) }
    }

    fn hipblasGemmEx(handle: hipblasHandle_t, ta: hipblasOperation_t, tb: hipblasOperation_t, m: c_int, n: c_int, k: c_int, alpha: *const c_void, a: *const c_void, a_type: hipblasDatatype_t, lda: c_int, b: *const c_void, b_type: hipblasDatatype_t, ldb: c_int, beta: *const c_void, c: *mut c_void, c_type: hipblasDatatype_t, ldc: c_int, compute: hipblasDatatype_t, _algo: hipblasGemmAlgo_t) {
        let (ty, comp) = types("hipblasGemmEx", legacy_ty(a_type.0), legacy_ty(b_type.0), legacy_ty(c_type.0), (legacy_compute(compute.0), compute.0))?;
        let g = call((ta, tb), (m, n, k), [(a, lda, 0), (b, ldb, 0)], (c.cast_const(), ldc, 0), 1, (ty, comp))?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("hipblasGemmEx", handle, g, alpha, beta, scalar(comp)) }
    }

    fn hipblasGemmEx_v2(handle: hipblasHandle_t, ta: hipblasOperation_t, tb: hipblasOperation_t, m: c_int, n: c_int, k: c_int, alpha: *const c_void, a: *const c_void, a_type: hipDataType, lda: c_int, b: *const c_void, b_type: hipDataType, ldb: c_int, beta: *const c_void, c: *mut c_void, c_type: hipDataType, ldc: c_int, compute: hipblasComputeType_t, _algo: hipblasGemmAlgo_t) {
        let (ty, comp) = types("hipblasGemmEx_v2", v2_ty(a_type), v2_ty(b_type), v2_ty(c_type), (v2_compute(compute), compute.0))?;
        let g = call((ta, tb), (m, n, k), [(a, lda, 0), (b, ldb, 0)], (c.cast_const(), ldc, 0), 1, (ty, comp))?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("hipblasGemmEx_v2", handle, g, alpha, beta, scalar(comp)) }
    }

    fn hipblasGemmStridedBatchedEx(handle: hipblasHandle_t, ta: hipblasOperation_t, tb: hipblasOperation_t, m: c_int, n: c_int, k: c_int, alpha: *const c_void, a: *const c_void, a_type: hipblasDatatype_t, lda: c_int, stride_a: i64, b: *const c_void, b_type: hipblasDatatype_t, ldb: c_int, stride_b: i64, beta: *const c_void, c: *mut c_void, c_type: hipblasDatatype_t, ldc: c_int, stride_c: i64, batch: c_int, compute: hipblasDatatype_t, _algo: hipblasGemmAlgo_t) {
        let (ty, comp) = types("hipblasGemmStridedBatchedEx", legacy_ty(a_type.0), legacy_ty(b_type.0), legacy_ty(c_type.0), (legacy_compute(compute.0), compute.0))?;
        let g = call((ta, tb), (m, n, k), [(a, lda, stride_a), (b, ldb, stride_b)], (c.cast_const(), ldc, stride_c), batch, (ty, comp))?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("hipblasGemmStridedBatchedEx", handle, g, alpha, beta, scalar(comp)) }
    }

    fn hipblasGemmStridedBatchedEx_v2(handle: hipblasHandle_t, ta: hipblasOperation_t, tb: hipblasOperation_t, m: c_int, n: c_int, k: c_int, alpha: *const c_void, a: *const c_void, a_type: hipDataType, lda: c_int, stride_a: i64, b: *const c_void, b_type: hipDataType, ldb: c_int, stride_b: i64, beta: *const c_void, c: *mut c_void, c_type: hipDataType, ldc: c_int, stride_c: i64, batch: c_int, compute: hipblasComputeType_t, _algo: hipblasGemmAlgo_t) {
        let (ty, comp) = types("hipblasGemmStridedBatchedEx_v2", v2_ty(a_type), v2_ty(b_type), v2_ty(c_type), (v2_compute(compute), compute.0))?;
        let g = call((ta, tb), (m, n, k), [(a, lda, stride_a), (b, ldb, stride_b)], (c.cast_const(), ldc, stride_c), batch, (ty, comp))?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("hipblasGemmStridedBatchedEx_v2", handle, g, alpha, beta, scalar(comp)) }
    }
}
