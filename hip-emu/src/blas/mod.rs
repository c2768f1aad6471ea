//! hipBLAS (legacy and `_v2`) and rocBLAS entry points, computed on the CPU ([`gemm`]) and
//! queued on the handle's stream like any other device work. `HIPK_HIPBLAS_LIBRARY` and
//! `HIPK_ROCBLAS_LIBRARY` may name libhip_emu.so itself: it exports both libraries' core
//! symbols. Failures carry a message readable through `hipemuLastErrorMessage`.

pub mod gemm;
pub mod hipblas;
pub mod rocblas;

use std::collections::HashMap;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use hip_sys::hipStream_t;

use crate::runtime::error::{panic_text, set_detail};
use crate::runtime::{memory, new_handle, runtime};
use gemm::{load, Compute, GemmCall, Operand, Ty};

/// Why a BLAS call failed; each library maps it to its status enum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlasFail {
    NullHandle,
    BadHandle(String),
    /// A dimension or leading dimension.
    Size(String),
    /// A pointer outside live device memory, or null.
    Pointer(String),
    /// An enum value this library does not define.
    Enum(String),
    /// A valid combination hip-emu does not compute.
    NotSupported(String),
    /// The runtime under the handle failed (bad environment, dead stream).
    Runtime(String),
    Panic(String),
}

impl BlasFail {
    fn message(&self) -> String {
        match self {
            BlasFail::NullHandle => "the handle is null".to_owned(),
            BlasFail::BadHandle(m)
            | BlasFail::Size(m)
            | BlasFail::Pointer(m)
            | BlasFail::Enum(m)
            | BlasFail::NotSupported(m)
            | BlasFail::Runtime(m)
            | BlasFail::Panic(m) => m.clone(),
        }
    }
}

/// Run a BLAS export's body; a panic or failure keeps its message for hipemuLastErrorMessage.
pub fn guard<S>(
    name: &str,
    map: impl Fn(&BlasFail) -> S,
    ok: S,
    body: impl FnOnce() -> Result<(), BlasFail>,
) -> S {
    let result = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(p) => Err(BlasFail::Panic(format!(
            "{name} panicked inside hip-emu: {}",
            panic_text(&*p)
        ))),
    };
    match result {
        Ok(()) => ok,
        Err(fail) => {
            set_detail(&format!("{name}: {}", fail.message()));
            map(&fail)
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Handle {
    stream: usize,
    device_pointers: bool,
}

static HANDLES: Mutex<Option<HashMap<usize, Handle>>> = Mutex::new(None);

fn with_handles<R>(f: impl FnOnce(&mut HashMap<usize, Handle>) -> R) -> R {
    let mut guard = HANDLES.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// Create a handle bound to the null stream; returns its opaque value.
pub fn create() -> Result<usize, BlasFail> {
    runtime()
        .map_err(|f| BlasFail::Runtime(f.message))?
        .current()
        .map_err(|f| BlasFail::Runtime(f.message))?;
    let h = new_handle();
    with_handles(|t| {
        t.insert(
            h,
            Handle {
                stream: 0,
                device_pointers: false,
            },
        )
    });
    Ok(h)
}

fn check_handle(h: *mut c_void) -> Result<Handle, BlasFail> {
    if h.is_null() {
        return Err(BlasFail::NullHandle);
    }
    with_handles(|t| t.get(&(h as usize)).copied()).ok_or_else(|| {
        BlasFail::BadHandle(format!("handle {h:p} is not a live BLAS handle of hip-emu"))
    })
}

pub fn destroy(h: *mut c_void) -> Result<(), BlasFail> {
    check_handle(h)?;
    with_handles(|t| t.remove(&(h as usize)));
    Ok(())
}

pub fn set_stream(h: *mut c_void, stream: hipStream_t) -> Result<(), BlasFail> {
    check_handle(h)?;
    let rt = runtime().map_err(|f| BlasFail::Runtime(f.message))?;
    rt.stream(stream)
        .map_err(|f| BlasFail::BadHandle(f.message))?;
    with_handles(|t| {
        if let Some(e) = t.get_mut(&(h as usize)) {
            e.stream = stream as usize;
        }
    });
    Ok(())
}

pub fn set_pointer_mode(h: *mut c_void, mode: u32) -> Result<(), BlasFail> {
    check_handle(h)?;
    let device = match mode {
        0 => false,
        1 => true,
        other => {
            return Err(BlasFail::Enum(format!(
                "pointer mode {other} is neither host (0) nor device (1)"
            )))
        }
    };
    with_handles(|t| {
        if let Some(e) = t.get_mut(&(h as usize)) {
            e.device_pointers = device;
        }
    });
    Ok(())
}

/// `111`/`112`/`113` → transposed?; conjugate transpose equals transpose for real types.
pub fn trans(op: u32, which: &str) -> Result<bool, BlasFail> {
    match op {
        111 => Ok(false),
        112 | 113 => Ok(true),
        other => Err(BlasFail::Enum(format!(
            "{which} = {other} is not an operation (111 N, 112 T, 113 C)"
        ))),
    }
}

/// Non-negative int → usize.
pub fn dim(v: i64, what: &str) -> Result<usize, BlasFail> {
    usize::try_from(v).map_err(|_| BlasFail::Size(format!("{what} = {v} is negative")))
}

/// One matrix operand as the C APIs pass it: pointer, leading dimension, batch stride.
pub type Mat = (*const c_void, i32, i64);

/// What a C API calls its transpose and batch-count arguments, for error messages.
pub struct ArgNames {
    pub trans_a: &'static str,
    pub trans_b: &'static str,
    pub batch: &'static str,
}

/// Build the call every GEMM entry point of either library queues: operations, sizes and
/// operands checked to be in range; alpha and beta are filled in by [`submit`].
pub fn gemm_call(
    names: &ArgNames,
    (ta, tb): (u32, u32),
    (m, n, k): (i32, i32, i32),
    [a, b, c, d]: [Mat; 4],
    batch: i32,
    ty: Ty,
    compute: Compute,
) -> Result<GemmCall, BlasFail> {
    let op = |(p, ld, stride): Mat, what: &str| -> Result<Operand, BlasFail> {
        Ok(Operand {
            ptr: p as usize,
            ty,
            ld: dim(ld.into(), what)?,
            stride,
        })
    };
    Ok(GemmCall {
        trans_a: trans(ta, names.trans_a)?,
        trans_b: trans(tb, names.trans_b)?,
        m: dim(m.into(), "m")?,
        n: dim(n.into(), "n")?,
        k: dim(k.into(), "k")?,
        a: op(a, "lda")?,
        b: op(b, "ldb")?,
        c: op(c, "ldc")?,
        d: op(d, "ldd")?,
        batch: dim(batch.into(), names.batch)?,
        compute,
        alpha: 0.0,
        beta: 0.0,
    })
}

/// An element type in the legacy numbering hipBLAS (`hipblasDatatype_t`) and rocBLAS
/// (`rocblas_datatype`) share.
pub fn legacy_ty(code: u32) -> Option<Ty> {
    match code {
        150 => Some(Ty::F16),
        151 => Some(Ty::F32),
        152 => Some(Ty::F64),
        168 => Some(Ty::Bf16),
        _ => None,
    }
}

/// A compute type in the legacy numbering (f32 or f64 only; see [`legacy_ty`]).
pub fn legacy_compute(code: u32) -> Option<Compute> {
    match code {
        151 => Some(Compute::F32),
        152 => Some(Compute::F64),
        _ => None,
    }
}

/// The scalar type of alpha/beta for a compute type.
pub fn scalar(c: Compute) -> Ty {
    match c {
        Compute::F32 => Ty::F32,
        Compute::F64 => Ty::F64,
    }
}

/// Read alpha and beta from the host now, or (device pointer mode) check they are device
/// memory and read them when the GEMM runs. Then queue the GEMM on the handle's stream.
///
/// # Safety
/// In host pointer mode `alpha`/`beta` point at readable values of `scalar`'s type.
pub unsafe fn submit(
    name: &'static str,
    h: *mut c_void,
    mut call: GemmCall,
    alpha: *const c_void,
    beta: *const c_void,
    scalar: Ty,
) -> Result<(), BlasFail> {
    let handle = check_handle(h)?;
    if alpha.is_null() || beta.is_null() {
        return Err(BlasFail::Pointer(format!(
            "{name}: alpha or beta is a null pointer"
        )));
    }
    let device_scalars = handle.device_pointers;
    if device_scalars {
        for (what, p) in [("alpha", alpha), ("beta", beta)] {
            memory::check_range(
                p as usize,
                scalar.bytes(),
                &format!("{name}: {what} (device pointer mode)"),
            )
            .map_err(|f| BlasFail::Pointer(f.message))?;
        }
        // Probe the operands with nonzero scalars; the real ones are read when the GEMM runs.
        call.alpha = 1.0;
        call.beta = 1.0;
    } else {
        // SAFETY: host pointer mode: readable host scalars per the contract.
        unsafe {
            call.alpha = load(scalar, alpha as usize, 0);
            call.beta = load(scalar, beta as usize, 0);
        }
    }
    call.check(name).map_err(|(size, msg)| {
        if size {
            BlasFail::Size(msg)
        } else {
            BlasFail::Pointer(msg)
        }
    })?;
    let rt = runtime().map_err(|f| BlasFail::Runtime(f.message))?;
    let (dev, info) = rt
        .stream(handle.stream as hipStream_t)
        .map_err(|f| BlasFail::Runtime(f.message))?;
    let (alpha, beta) = (alpha as usize, beta as usize);
    let work = move || {
        let mut call = call;
        if device_scalars {
            // SAFETY: both were checked to lie in live device memory at enqueue.
            unsafe {
                call.alpha = load(scalar, alpha, 0);
                call.beta = load(scalar, beta, 0);
            }
        }
        // SAFETY: `check` passed at enqueue; hipFree waits for queued work, so the operands
        // are still live.
        unsafe { call.run() };
        Ok(())
    };
    use crate::runtime::graph::{self, Kind, Node};
    let node = Node::run(name, Kind::Blas, std::sync::Arc::new(work));
    let captured =
        graph::submit(dev.ordinal, info.id, node).map_err(|f| BlasFail::Runtime(f.message))?;
    if !captured {
        crate::runtime::stats::bump(crate::runtime::stats::Counter::Launches);
    }
    Ok(())
}

/// Element type and the compute type to use for a (type, compute type) pair, or why not.
pub fn types(
    name: &str,
    a: Option<Ty>,
    b: Option<Ty>,
    c: Option<Ty>,
    (compute, raw): (Option<Compute>, u32),
) -> Result<(Ty, Compute), BlasFail> {
    let (Some(a), Some(b), Some(c)) = (a, b, c) else {
        return Err(BlasFail::Enum(format!(
            "{name}: an operand data type is not f16, bf16, f32 or f64 in this ABI's numbering"
        )));
    };
    let Some(compute) = compute else {
        return Err(BlasFail::NotSupported(format!(
            "{name}: compute type {raw} is not emulated: hip-emu computes in f32 or f64"
        )));
    };
    if a != b || a != c {
        return Err(BlasFail::NotSupported(format!(
            "{name}: mixed operand types {a:?}/{b:?}/{c:?} are not emulated"
        )));
    }
    match (a, compute) {
        (Ty::F16 | Ty::Bf16 | Ty::F32, Compute::F32) | (Ty::F64, Compute::F64) => Ok((a, compute)),
        _ => Err(BlasFail::NotSupported(format!("{name}: {a:?} operands with {compute:?} compute are not emulated (use f32 compute for f16/bf16/f32, f64 for f64)"))),
    }
}
