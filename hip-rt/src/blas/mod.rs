//! [`Blas`]: row-major GEMM through hipBLAS (rocBLAS as fallback), bound to a stream.
//!
//! f32, f16 and bf16 inputs, always with f32 accumulation (`GemmEx` with an f32 compute type)
//! and f32 `alpha`/`beta` on the host. Shapes and lengths are validated ([`plan()`]) before any
//! BLAS call. hipBLAS's two `GemmEx` ABIs (legacy `hipblasDatatype_t`, v2 `hipDataType` +
//! compute type) are chosen by hip-sys's probe.
//!
//! Only the no-library / no-device paths have run here: no hipBLAS or rocBLAS exists on this
//! machine. The device tests compare against a CPU GEMM but have never run on hardware.

mod plan;

use std::ffi::c_void;
use std::sync::Arc;

use half::{bf16, f16};
use hip_sys::blas::hipblas::{GemmEx, GemmStridedBatchedEx};
use hip_sys::blas::{
    hipDataType, hipblasComputeType_t, hipblasDatatype_t, hipblasGemmAlgo_t, hipblasHandle_t,
    hipblasOperation_t, hipblasPointerMode_t, rocblas_datatype, rocblas_gemm_algo, rocblas_handle,
    rocblas_operation, rocblas_pointer_mode, HipBlas, RocBlas,
};

use crate::error::{Error, Result};
use crate::memory::buffer::{DeviceView, DeviceViewMut, Element};
use crate::stream::Stream;
pub use plan::{plan, Batch, ColMajorCall, Gemm};

/// Which library a [`Blas`] handle uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlasBackend {
    /// hipBLAS.
    HipBlas,
    /// rocBLAS (used when hipBLAS cannot be loaded).
    RocBlas,
}

mod sealed {
    pub trait Sealed {}
}

/// Element types [`Blas`] multiplies: `f32`, `half::f16`, `half::bf16` (sealed).
pub trait GemmElement: Element + sealed::Sealed {
    /// Legacy hipBLAS type tag.
    const HIPBLAS_LEGACY: hipblasDatatype_t;
    /// hipBLAS v2 (`hipDataType`) tag.
    const HIPBLAS_V2: hipDataType;
    /// rocBLAS type tag.
    const ROCBLAS: rocblas_datatype;
}

macro_rules! gemm_element {
    ($t:ty, $legacy:ident, $v2:ident, $roc:ident) => {
        impl sealed::Sealed for $t {}
        impl GemmElement for $t {
            const HIPBLAS_LEGACY: hipblasDatatype_t = hipblasDatatype_t::$legacy;
            const HIPBLAS_V2: hipDataType = hipDataType::$v2;
            const ROCBLAS: rocblas_datatype = rocblas_datatype::$roc;
        }
    };
}
gemm_element!(f32, HIPBLAS_R_32F, HIP_R_32F, rocblas_datatype_f32_r);
gemm_element!(f16, HIPBLAS_R_16F, HIP_R_16F, rocblas_datatype_f16_r);
gemm_element!(bf16, HIPBLAS_R_16B, HIP_R_16BF, rocblas_datatype_bf16_r);

enum Handle {
    Hip(&'static HipBlas, hipblasHandle_t),
    Roc(&'static RocBlas, rocblas_handle),
}

/// A BLAS handle bound to one stream. `Send` but not `Sync`: BLAS handles must not be used
/// from two threads at once. Dropping destroys the handle (errors go to `Device::check_err`).
pub struct Blas {
    stream: Arc<Stream>,
    handle: Handle,
}

// SAFETY: the handle may move between threads (BLAS only forbids concurrent use, which the
// missing `Sync` prevents); the stream is an Arc of a Send + Sync type.
unsafe impl Send for Blas {}

impl Blas {
    /// A handle on `stream`: hipBLAS if it loads, else rocBLAS. If neither loads, the error is
    /// hipBLAS's (naming every path searched), with rocBLAS's failure appended.
    pub fn new(stream: Arc<Stream>) -> Result<Blas> {
        match Self::with_backend(stream.clone(), BlasBackend::HipBlas) {
            Ok(blas) => Ok(blas),
            Err(hip_err) => Self::with_backend(stream, BlasBackend::RocBlas).map_err(|roc_err| {
                Error::BlasUnavailable {
                    hipblas: Box::new(hip_err),
                    rocblas: Box::new(roc_err),
                }
            }),
        }
    }

    /// A handle of one specific backend on `stream`.
    pub fn with_backend(stream: Arc<Stream>, backend: BlasBackend) -> Result<Blas> {
        stream.device().bind_to_thread()?;
        let handle = match backend {
            BlasBackend::HipBlas => {
                let lib = hip_sys::blas::hipblas()?;
                let create = hip_sys::sym!(lib, hipblasCreate)?;
                let mut h: hipblasHandle_t = std::ptr::null_mut();
                // SAFETY: `h` is a valid out-pointer; the device is current on this thread.
                unsafe { create(&mut h) }.result()?;
                Handle::Hip(lib, h)
            }
            BlasBackend::RocBlas => {
                let lib = hip_sys::blas::rocblas()?;
                let create = hip_sys::sym!(lib, rocblas_create_handle)?;
                let mut h: rocblas_handle = std::ptr::null_mut();
                // SAFETY: `h` is a valid out-pointer; the device is current on this thread.
                unsafe { create(&mut h) }.result()?;
                Handle::Roc(lib, h)
            }
        };
        let blas = Blas { stream, handle };
        blas.configure()?;
        Ok(blas)
    }

    /// Bind the handle to its own stream and select host pointers for alpha/beta.
    fn configure(&self) -> Result<()> {
        self.bind(&self.stream)?;
        match self.handle {
            Handle::Hip(lib, h) => {
                let set_mode = hip_sys::sym!(lib, hipblasSetPointerMode)?;
                // SAFETY: `h` is the live handle owned by self; the mode is a valid enum value.
                unsafe { set_mode(h, hipblasPointerMode_t::HIPBLAS_POINTER_MODE_HOST) }.result()?;
            }
            Handle::Roc(lib, h) => {
                let set_mode = hip_sys::sym!(lib, rocblas_set_pointer_mode)?;
                // SAFETY: `h` is the live handle owned by self; the mode is a valid enum value.
                unsafe { set_mode(h, rocblas_pointer_mode::rocblas_pointer_mode_host) }.result()?;
            }
        }
        Ok(())
    }

    /// Queue the handle's next calls on `stream` (a live stream the caller keeps alive until
    /// the handle is bound elsewhere or the queued work is done).
    fn bind(&self, stream: &Stream) -> Result<()> {
        let stream = stream.raw();
        match self.handle {
            Handle::Hip(lib, h) => {
                let set_stream = hip_sys::sym!(lib, hipblasSetStream)?;
                // SAFETY: `h` is the live handle owned by self; the caller keeps the stream alive.
                unsafe { set_stream(h, stream) }.result()?;
            }
            Handle::Roc(lib, h) => {
                let set_stream = hip_sys::sym!(lib, rocblas_set_stream)?;
                // SAFETY: `h` is the live handle owned by self; the caller keeps the stream alive.
                unsafe { set_stream(h, stream) }.result()?;
            }
        }
        Ok(())
    }

    /// Which library this handle uses.
    pub fn backend(&self) -> BlasBackend {
        match self.handle {
            Handle::Hip(..) => BlasBackend::HipBlas,
            Handle::Roc(..) => BlasBackend::RocBlas,
        }
    }

    /// The stream the GEMMs are queued on.
    pub fn stream(&self) -> &Arc<Stream> {
        &self.stream
    }

    /// Queue the row-major `C = alpha · op(A) · op(B) + beta · C` (see [`Gemm`]).
    pub fn gemm<T: GemmElement>(
        &self,
        gemm: &Gemm,
        a: &(impl DeviceView<T> + ?Sized),
        b: &(impl DeviceView<T> + ?Sized),
        c: &mut (impl DeviceViewMut<T> + ?Sized),
    ) -> Result<()> {
        self.run(&self.stream, gemm, None, a, b, c)
    }

    /// Queue `batch.count` row-major GEMMs over strided A, B, C (see [`Batch`]).
    pub fn gemm_strided_batched<T: GemmElement>(
        &self,
        gemm: &Gemm,
        batch: &Batch,
        a: &(impl DeviceView<T> + ?Sized),
        b: &(impl DeviceView<T> + ?Sized),
        c: &mut (impl DeviceViewMut<T> + ?Sized),
    ) -> Result<()> {
        self.run(&self.stream, gemm, Some(batch), a, b, c)
    }

    /// [`gemm_strided_batched`](Self::gemm_strided_batched) queued on `stream` (a stream of
    /// the handle's device) instead of the handle's own stream: the handle is bound to `stream`
    /// for this call and bound back to its own stream afterwards (also when the call fails).
    /// For callers that hold a stream by reference only.
    pub fn gemm_strided_batched_on<T: GemmElement>(
        &self,
        stream: &Stream,
        gemm: &Gemm,
        batch: &Batch,
        a: &(impl DeviceView<T> + ?Sized),
        b: &(impl DeviceView<T> + ?Sized),
        c: &mut (impl DeviceViewMut<T> + ?Sized),
    ) -> Result<()> {
        self.stream.check_same_device("stream", stream.device())?;
        self.bind(stream)?;
        let result = self.run(stream, gemm, Some(batch), a, b, c);
        let rebound = self.bind(&self.stream);
        result.and(rebound)
    }

    fn run<T: GemmElement>(
        &self,
        stream: &Stream,
        gemm: &Gemm,
        batch: Option<&Batch>,
        a: &(impl DeviceView<T> + ?Sized),
        b: &(impl DeviceView<T> + ?Sized),
        c: &mut (impl DeviceViewMut<T> + ?Sized),
    ) -> Result<()> {
        let Some(call) = plan(gemm, batch, a.len(), b.len(), c.len())? else {
            return Ok(());
        };
        for buf in [a.buffer(), b.buffer(), c.buffer()] {
            stream.check_same_device("GEMM operand", buf.device())?;
            buf.record_stream(stream)?;
        }
        let ptrs = Operands {
            first: b.device_ptr().as_raw(),
            second: a.device_ptr().as_raw(),
            c: c.device_ptr().as_raw(),
            alpha: (&gemm.alpha as *const f32).cast(),
            beta: (&gemm.beta as *const f32).cast(),
        };
        // SAFETY: `plan` checked every operand's length against the shapes, strides and batch
        // count, so BLAS reads and writes only inside the three views, which live on this
        // stream's device; alpha/beta are f32 host values (pointer mode host) that live across
        // the call; the handle is live and bound to the live stream.
        unsafe { self.call::<T>(&call, batch.is_some(), &ptrs) }
    }

    /// # Safety
    /// `ptrs` must satisfy `call` as described in `run`.
    unsafe fn call<T: GemmElement>(
        &self,
        c: &ColMajorCall,
        batched: bool,
        p: &Operands,
    ) -> Result<()> {
        let (m, n, k) = (c.m, c.n, c.k);
        match self.handle {
            Handle::Hip(lib, h) => {
                let (opf, ops) = (hip_op(c.trans_first), hip_op(c.trans_second));
                let algo = hipblasGemmAlgo_t::HIPBLAS_GEMM_DEFAULT;
                let (lt, v2) = (T::HIPBLAS_LEGACY, T::HIPBLAS_V2);
                let (lc, vc) = (
                    hipblasDatatype_t::HIPBLAS_R_32F,
                    hipblasComputeType_t::HIPBLAS_COMPUTE_32F,
                );
                // The legacy and v2 ABIs differ only in the types of the type tags and compute
                // type, and the strided-batched call only adds the strides and batch count, so
                // the argument list is written once and filled with the ABI's tags.
                macro_rules! ex_call {
                    (
                        $f:expr, $t:expr, $ct:expr
                        $(, strided: $sa:expr, $sb:expr, $sc:expr, $count:expr)?
                    ) => {
                        $f(
                            h, opf, ops, m, n, k, p.alpha, p.first, $t, c.ld_first, $($sa,)?
                            p.second, $t, c.ld_second, $($sb,)? p.beta, p.c, $t, c.ldc,
                            $($sc, $count,)? $ct, algo,
                        )
                    };
                }
                macro_rules! strided_batched_args {
                    ($f:expr, $t:expr, $ct:expr) => {
                        ex_call!(
                            $f, $t, $ct,
                            strided: c.stride_first, c.stride_second, c.stride_c, c.batch
                        )
                    };
                }
                let status = if batched {
                    match lib.gemm_strided_batched_ex()? {
                        // SAFETY: operands satisfy `c` (caller); v2 type tags of T, f32 compute type match the
                        // f32 alpha/beta and the ABI hip-sys probed for this function.
                        GemmStridedBatchedEx::V2(f) => unsafe { strided_batched_args!(f, v2, vc) },
                        // SAFETY: operands satisfy `c` (caller); legacy type tags of T, f32 compute type match the
                        // f32 alpha/beta and the ABI hip-sys probed for this function.
                        GemmStridedBatchedEx::Legacy(f) => unsafe {
                            strided_batched_args!(f, lt, lc)
                        },
                    }
                } else {
                    match lib.gemm_ex()? {
                        // SAFETY: operands satisfy `c` (caller); v2 type tags of T, f32 compute type match the
                        // f32 alpha/beta and the ABI hip-sys probed for this function.
                        GemmEx::V2(f) => unsafe { ex_call!(f, v2, vc) },
                        // SAFETY: operands satisfy `c` (caller); legacy type tags of T, f32 compute type match the
                        // f32 alpha/beta and the ABI hip-sys probed for this function.
                        GemmEx::Legacy(f) => unsafe { ex_call!(f, lt, lc) },
                    }
                };
                Ok(status.result()?)
            }
            Handle::Roc(lib, h) => {
                let (opf, ops) = (roc_op(c.trans_first), roc_op(c.trans_second));
                let (t, ct, algo) = (
                    T::ROCBLAS,
                    rocblas_datatype::rocblas_datatype_f32_r,
                    rocblas_gemm_algo::rocblas_gemm_algo_standard,
                );
                let status = if batched {
                    let f = hip_sys::sym!(lib, rocblas_gemm_strided_batched_ex)?;
                    // SAFETY: forwarded from the caller; C is also D (in place), same ld/stride.
                    unsafe {
                        f(
                            h,
                            opf,
                            ops,
                            m,
                            n,
                            k,
                            p.alpha,
                            p.first,
                            t,
                            c.ld_first,
                            c.stride_first,
                            p.second,
                            t,
                            c.ld_second,
                            c.stride_second,
                            p.beta,
                            p.c,
                            t,
                            c.ldc,
                            c.stride_c,
                            p.c,
                            t,
                            c.ldc,
                            c.stride_c,
                            c.batch,
                            ct,
                            algo,
                            0,
                            0,
                        )
                    }
                } else {
                    let f = hip_sys::sym!(lib, rocblas_gemm_ex)?;
                    // SAFETY: forwarded from the caller; C is also D (in place), same ld.
                    unsafe {
                        f(
                            h,
                            opf,
                            ops,
                            m,
                            n,
                            k,
                            p.alpha,
                            p.first,
                            t,
                            c.ld_first,
                            p.second,
                            t,
                            c.ld_second,
                            p.beta,
                            p.c,
                            t,
                            c.ldc,
                            p.c,
                            t,
                            c.ldc,
                            ct,
                            algo,
                            0,
                            0,
                        )
                    }
                };
                Ok(status.result()?)
            }
        }
    }
}

/// Raw operand pointers of one call (first = row-major B, second = row-major A).
struct Operands {
    first: *const c_void,
    second: *const c_void,
    c: *mut c_void,
    alpha: *const c_void,
    beta: *const c_void,
}

fn hip_op(trans: bool) -> hipblasOperation_t {
    if trans {
        hipblasOperation_t::HIPBLAS_OP_T
    } else {
        hipblasOperation_t::HIPBLAS_OP_N
    }
}

fn roc_op(trans: bool) -> rocblas_operation {
    if trans {
        rocblas_operation::rocblas_operation_transpose
    } else {
        rocblas_operation::rocblas_operation_none
    }
}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Blas({:?} on {:?})", self.backend(), self.stream)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let r: Result<()> = match self.handle {
            Handle::Hip(lib, h) => hip_sys::sym!(lib, hipblasDestroy)
                .map_err(Error::from)
                .and_then(|f| {
                    // SAFETY: `h` is the live handle created in `with_backend`, destroyed once, here.
                    Ok(unsafe { f(h) }.result()?)
                }),
            Handle::Roc(lib, h) => hip_sys::sym!(lib, rocblas_destroy_handle)
                .map_err(Error::from)
                .and_then(|f| {
                    // SAFETY: `h` is the live handle created in `with_backend`, destroyed once, here.
                    Ok(unsafe { f(h) }.result()?)
                }),
        };
        self.stream.device().record_drop_error(r);
    }
}
