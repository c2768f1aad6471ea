//! rocBLAS exports: handle, stream, pointer mode, `rocblas_sgemm`, `rocblas_hgemm`,
//! `rocblas_gemm_ex` and `rocblas_gemm_strided_batched_ex` (C read, D written).

use std::ffi::c_void;

use hip_sys::blas::{
    rocblas_datatype, rocblas_gemm_algo, rocblas_handle, rocblas_operation, rocblas_pointer_mode,
    rocblas_status,
};
use hip_sys::hipStream_t;

use super::gemm::{Compute, Ty};
use super::{
    gemm_call, guard, legacy_compute, legacy_ty, scalar, submit, types, ArgNames, BlasFail, Mat,
};

fn status(f: &BlasFail) -> rocblas_status {
    match f {
        BlasFail::NullHandle | BlasFail::BadHandle(_) => {
            rocblas_status::rocblas_status_invalid_handle
        }
        BlasFail::Size(_) => rocblas_status::rocblas_status_invalid_size,
        BlasFail::Pointer(_) => rocblas_status::rocblas_status_invalid_pointer,
        BlasFail::Enum(_) => rocblas_status::rocblas_status_invalid_value,
        BlasFail::NotSupported(_) => rocblas_status::rocblas_status_not_implemented,
        BlasFail::Runtime(_) | BlasFail::Panic(_) => rocblas_status::rocblas_status_internal_error,
    }
}

fn run(name: &str, body: impl FnOnce() -> Result<(), BlasFail>) -> rocblas_status {
    guard(name, status, rocblas_status::rocblas_status_success, body)
}

const NAMES: ArgNames = ArgNames {
    trans_a: "trans_a",
    trans_b: "trans_b",
    batch: "batch_count",
};

macro_rules! roc_exports {
    ($( $(#[doc = $doc:literal])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// The rocBLAS C API contract: pointers valid as rocBLAS documents; device operands in
        /// device memory for the lifetime of the queued work.
        #[no_mangle]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> rocblas_status {
            run(stringify!($name), || $body)
        }
    )*};
}

roc_exports! {
    fn rocblas_create_handle(handle: *mut rocblas_handle) {
        if handle.is_null() {
            return Err(BlasFail::Pointer("the handle out-pointer is null".into()));
        }
        let h = super::create()?;
        // SAFETY: a non-null out-pointer per the C API contract.
        unsafe { handle.write(h as rocblas_handle) };
        Ok(())
    }

    fn rocblas_destroy_handle(handle: rocblas_handle) {
        super::destroy(handle)
    }

    fn rocblas_set_stream(handle: rocblas_handle, stream: hipStream_t) {
        super::set_stream(handle, stream)
    }

    fn rocblas_set_pointer_mode(handle: rocblas_handle, mode: rocblas_pointer_mode) {
        super::set_pointer_mode(handle, mode.0)
    }

    fn rocblas_sgemm(handle: rocblas_handle, ta: rocblas_operation, tb: rocblas_operation, m: i32, n: i32, k: i32, alpha: *const f32, a: *const f32, lda: i32, b: *const f32, ldb: i32, beta: *const f32, c: *mut f32, ldc: i32) {
        let cm: Mat = (c.cast_const().cast(), ldc, 0);
        let g = gemm_call(&NAMES, (ta.0, tb.0), (m, n, k), [(a.cast(), lda, 0), (b.cast(), ldb, 0), cm, cm], 1, Ty::F32, Compute::F32)?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("rocblas_sgemm", handle, g, alpha.cast(), beta.cast(), Ty::F32) }
    }

    /// f16 operands and scalars; hip-emu accumulates in f32 and rounds once.
    fn rocblas_hgemm(handle: rocblas_handle, ta: rocblas_operation, tb: rocblas_operation, m: i32, n: i32, k: i32, alpha: *const u16, a: *const u16, lda: i32, b: *const u16, ldb: i32, beta: *const u16, c: *mut u16, ldc: i32) {
        let cm: Mat = (c.cast_const().cast(), ldc, 0);
        let g = gemm_call(&NAMES, (ta.0, tb.0), (m, n, k), [(a.cast(), lda, 0), (b.cast(), ldb, 0), cm, cm], 1, Ty::F16, Compute::F32)?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("rocblas_hgemm", handle, g, alpha.cast(), beta.cast(), Ty::F16) }
    }

    fn rocblas_gemm_ex(handle: rocblas_handle, ta: rocblas_operation, tb: rocblas_operation, m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void, a_type: rocblas_datatype, lda: i32, b: *const c_void, b_type: rocblas_datatype, ldb: i32, beta: *const c_void, c: *const c_void, c_type: rocblas_datatype, ldc: i32, d: *mut c_void, d_type: rocblas_datatype, ldd: i32, compute_type: rocblas_datatype, _algo: rocblas_gemm_algo, _solution: i32, _flags: u32) {
        let (t, comp) = types("rocblas_gemm_ex", legacy_ty(a_type.0), legacy_ty(b_type.0), legacy_ty(c_type.0), (legacy_compute(compute_type.0), compute_type.0))?;
        if legacy_ty(d_type.0) != Some(t) {
            return Err(BlasFail::NotSupported(format!("rocblas_gemm_ex: D type {} differs from C's", d_type.0)));
        }
        let g = gemm_call(&NAMES, (ta.0, tb.0), (m, n, k), [(a, lda, 0), (b, ldb, 0), (c, ldc, 0), (d.cast_const(), ldd, 0)], 1, t, comp)?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("rocblas_gemm_ex", handle, g, alpha, beta, scalar(comp)) }
    }

    fn rocblas_gemm_strided_batched_ex(handle: rocblas_handle, ta: rocblas_operation, tb: rocblas_operation, m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void, a_type: rocblas_datatype, lda: i32, stride_a: i64, b: *const c_void, b_type: rocblas_datatype, ldb: i32, stride_b: i64, beta: *const c_void, c: *const c_void, c_type: rocblas_datatype, ldc: i32, stride_c: i64, d: *mut c_void, d_type: rocblas_datatype, ldd: i32, stride_d: i64, batch: i32, compute_type: rocblas_datatype, _algo: rocblas_gemm_algo, _solution: i32, _flags: u32) {
        let (t, comp) = types("rocblas_gemm_strided_batched_ex", legacy_ty(a_type.0), legacy_ty(b_type.0), legacy_ty(c_type.0), (legacy_compute(compute_type.0), compute_type.0))?;
        if legacy_ty(d_type.0) != Some(t) {
            return Err(BlasFail::NotSupported(format!("rocblas_gemm_strided_batched_ex: D type {} differs from C's", d_type.0)));
        }
        let g = gemm_call(&NAMES, (ta.0, tb.0), (m, n, k), [(a, lda, stride_a), (b, ldb, stride_b), (c, ldc, stride_c), (d.cast_const(), ldd, stride_d)], batch, t, comp)?;
        // SAFETY: forwarded C API contract.
        unsafe { submit("rocblas_gemm_strided_batched_ex", handle, g, alpha, beta, scalar(comp)) }
    }
}
