//! The safe layer's error type, and the log that `Drop` implementations write into.

use std::sync::Mutex;

use hip_sys::hipError_t;

use crate::launch::LaunchError;
use crate::module::bundle::BundleError;

/// Everything hip-rt can fail with. Each variant's text says what happened, the values
/// involved, and what to do.
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The loader, a missing symbol, or a HIP/BLAS status code (see [`Error::hip_code`]).
    #[error(transparent)]
    Sys(#[from] hip_sys::Error),
    /// A device ordinal past the visible devices.
    #[error("device {ordinal} does not exist: {count} HIP device(s) are visible (HIP_VISIBLE_DEVICES narrows the set)")]
    InvalidOrdinal {
        /// The requested ordinal.
        ordinal: i32,
        /// How many devices are visible.
        count: i32,
    },
    /// A launch configuration that the kernel or device cannot run.
    #[error("launch rejected before reaching HIP: {0}")]
    Launch(#[from] LaunchError),
    /// Code-object bytes that could not be parsed.
    #[error(transparent)]
    Bundle(#[from] BundleError),
    /// The code object holds no ISA for this device.
    #[error(
        "no code object for device {ordinal} ({device_arch}) in this module; it holds {bundle_archs:?}. \
         Rebuild the kernels for {device_arch} (hipcc --offload-arch={device_arch}, or HIPK_ARCH)"
    )]
    NoBinaryForGpu {
        /// The device ordinal.
        ordinal: i32,
        /// The device's `gcnArchName`, e.g. `gfx928:sramecc+:xnack-`.
        device_arch: String,
        /// The target ids the bundle holds.
        bundle_archs: Vec<String>,
    },
    /// A kernel name that the module does not define.
    #[error("kernel `{name}` is not in the module; it defines {available:?}. Check the name (extern \"C\" kernels keep their C name; a C++ kernel is found by its mangled symbol or its demangled name, e.g. `saxpy_kernel` or `matmul<16u>`, and a template only where the source instantiates it)")]
    KernelNotFound {
        /// The name asked for.
        name: String,
        /// The kernels the code object defines (empty if it could not be read).
        available: Vec<String>,
    },
    /// A demangled kernel name that several kernels share (overloads).
    #[error("kernel name `{name}` is ambiguous: {candidates:?} all have it; name one with its parameters (e.g. `{}`) or by its symbol", candidates.first().map_or("", String::as_str))]
    AmbiguousKernel {
        /// The name asked for.
        name: String,
        /// The demangled names (with parameters) of the kernels that have it.
        candidates: Vec<String>,
    },
    /// A module variable whose size is not a whole number of the type asked for.
    #[error("module variable `{name}` is {bytes} bytes, not a whole number of {ty} ({elem} bytes); ask for the variable's own element type")]
    GlobalSize {
        /// The variable.
        name: String,
        /// Its size in bytes.
        bytes: usize,
        /// The size of the type asked for.
        elem: usize,
        /// The type asked for.
        ty: &'static str,
    },
    /// A write to a module variable of another length.
    #[error("module variable `{name}` holds {len} values; {given} were given (write all of them)")]
    GlobalLength {
        /// The variable.
        name: String,
        /// Its length.
        len: usize,
        /// The length given.
        given: usize,
    },
    /// Two lengths that must be equal are not.
    #[error("{op}: length mismatch, destination holds {dst} elements but source holds {src}; copy between equal-length views (use .slice(..) to narrow one)")]
    LengthMismatch {
        /// The operation.
        op: &'static str,
        /// Destination length.
        dst: usize,
        /// Source length.
        src: usize,
    },
    /// A sub-range outside a buffer.
    #[error("range {start}..{end} is out of bounds for a buffer of {len} elements")]
    OutOfBounds {
        /// Range start.
        start: usize,
        /// Range end (exclusive).
        end: usize,
        /// The buffer length.
        len: usize,
    },
    /// `chunks_mut(0)`: a view cannot be cut into chunks of no elements.
    #[error("chunk size 0: chunks_mut needs at least 1 element per chunk")]
    ZeroChunk,
    /// An element count whose byte size overflows `usize`.
    #[error("{len} elements of {elem_bytes} bytes overflow the address space")]
    SizeOverflow {
        /// Element count.
        len: usize,
        /// Bytes per element.
        elem_bytes: usize,
    },
    /// A caching-allocator failure other than out-of-memory (see `caching::AllocError`).
    #[error(transparent)]
    Caching(std::sync::Arc<crate::caching::AllocError>),
    /// A memory-statistics or cache call on a device whose allocator is not the caching one.
    #[error("device {ordinal}: {what} needs the caching allocator, but this Device allocates through another one (Device::get_direct or Device::with_allocator); use Device::get, whose allocator is the device's shared cache")]
    NotCaching {
        /// The device ordinal.
        ordinal: i32,
        /// The call.
        what: &'static str,
    },
    /// The device could not provide the memory.
    #[error("out of memory on device {ordinal}: {requested} bytes requested. {detail}")]
    OutOfMemory {
        /// The device ordinal.
        ordinal: i32,
        /// Bytes requested.
        requested: usize,
        /// What the allocator knows: free/total memory, cached bytes, and a hint.
        detail: String,
    },
    /// Objects from two different devices used together.
    #[error("{what} belongs to device {found}, but this operation runs on device {expected}")]
    WrongDevice {
        /// What was passed.
        what: &'static str,
        /// The device the operation runs on.
        expected: i32,
        /// The device of the object passed.
        found: i32,
    },
    /// A GEMM whose shapes or buffer lengths do not agree.
    #[error("gemm: {0}")]
    BlasShape(String),
    /// Neither hipBLAS nor rocBLAS could be used.
    #[error("no BLAS library is usable. hipBLAS: {hipblas}. rocBLAS (the fallback): {rocblas}")]
    BlasUnavailable {
        /// Why hipBLAS failed.
        hipblas: Box<Error>,
        /// Why rocBLAS failed.
        rocblas: Box<Error>,
    },
    /// A kernel name containing a NUL byte.
    #[error("kernel name {0:?} contains a NUL byte")]
    NulInName(String),
    /// A communicator failure (RCCL; see [`crate::comm`]).
    #[error(transparent)]
    Comm(#[from] crate::comm::CommError),
    /// A launch or an earlier asynchronous failure reported by `hipGetLastError`.
    #[error("kernel `{kernel}` launch failed: {source}")]
    LaunchFailed {
        /// The kernel's name.
        kernel: String,
        /// The HIP error.
        source: hip_sys::Error,
    },
}

impl Error {
    /// The HIP status code behind this error, if it came from a HIP call.
    pub fn hip_code(&self) -> Option<hipError_t> {
        match self {
            Error::Sys(hip_sys::Error::Hip(e))
            | Error::LaunchFailed {
                source: hip_sys::Error::Hip(e),
                ..
            } => Some(e.code),
            _ => None,
        }
    }

    /// True when the runtime reported that no HIP device exists (hipErrorNoDevice).
    pub fn is_no_device(&self) -> bool {
        self.hip_code() == Some(hipError_t::hipErrorNoDevice)
    }

    /// True for [`Error::OutOfMemory`] and a raw hipErrorOutOfMemory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. })
            || self.hip_code() == Some(hipError_t::hipErrorOutOfMemory)
    }
}

/// Shorthand for results in hip-rt.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// At most this many Drop errors are kept per device; later ones are only counted.
const MAX_LOGGED: usize = 64;

/// Errors raised in `Drop` implementations (which cannot return them), kept per device.
#[derive(Debug, Default)]
pub(crate) struct ErrorLog {
    inner: Mutex<(Vec<Error>, usize)>,
}

impl ErrorLog {
    /// Record an error from a destructor. Never panics (a poisoned lock is recovered).
    pub(crate) fn record(&self, err: Error) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if guard.0.len() < MAX_LOGGED {
            guard.0.push(err);
        } else {
            guard.1 += 1;
        }
    }

    /// Record the error of `result`, if any.
    pub(crate) fn record_result(&self, result: Result<()>) {
        if let Err(e) = result {
            self.record(e);
        }
    }

    /// Take every recorded error and the count of errors dropped for lack of room.
    pub(crate) fn take(&self) -> (Vec<Error>, usize) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (std::mem::take(&mut guard.0), std::mem::take(&mut guard.1))
    }
}

/// The Debug form is the Display text (what happened, the values, and the hint), so that
/// `fn main() -> Result<(), Box<dyn std::error::Error>>` and `.unwrap()` print the whole
/// message rather than the bare fields.
impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oob(start: usize) -> Error {
        Error::OutOfBounds {
            start,
            end: start + 1,
            len: 0,
        }
    }

    #[test]
    fn the_debug_form_keeps_the_hint_even_through_box_dyn_error() {
        // What `fn main() -> Result<(), Box<dyn std::error::Error>>` prints on failure.
        let e = Error::from(hip_sys::Error::Hip(hip_sys::HipError::new(
            hipError_t::hipErrorNoDevice,
        )));
        let boxed: Box<dyn std::error::Error> = Box::new(e.clone());
        let debug = format!("{boxed:?}");
        assert!(debug.contains("Hint: no HIP device found"), "{debug}");
        assert_eq!(debug, e.to_string());
    }

    #[test]
    fn log_keeps_64_counts_the_rest_and_clears_on_take() {
        let log = ErrorLog::default();
        log.record_result(Ok(()));
        for i in 0..100 {
            log.record(oob(i));
        }
        let (kept, dropped) = log.take();
        assert_eq!((kept.len(), dropped), (64, 36));
        assert!(matches!(kept[0], Error::OutOfBounds { start: 0, .. }));
        assert_eq!(log.take().0.len(), 0);
    }

    #[test]
    fn log_survives_a_poisoned_lock() {
        let log = std::sync::Arc::new(ErrorLog::default());
        let l2 = log.clone();
        let _ = std::thread::spawn(move || {
            let _guard = l2.inner.lock().unwrap();
            panic!("poison the lock");
        })
        .join();
        log.record(oob(7));
        assert_eq!(log.take().0.len(), 1);
    }

    #[test]
    fn classification_helpers() {
        let oom = Error::OutOfMemory {
            ordinal: 0,
            requested: 1 << 30,
            detail: "x".into(),
        };
        assert!(oom.is_out_of_memory() && !oom.is_no_device());
        let no_dev = Error::Sys(hip_sys::Error::Hip(hip_sys::HipError::new(
            hipError_t::hipErrorNoDevice,
        )));
        assert!(no_dev.is_no_device() && !no_dev.is_out_of_memory());
        let raw_oom = Error::Sys(hip_sys::Error::Hip(hip_sys::HipError::new(
            hipError_t::hipErrorOutOfMemory,
        )));
        assert!(raw_oom.is_out_of_memory());
        assert_eq!(oob(1).hip_code(), None);
        let msg = oom.to_string();
        assert!(
            msg.contains("1073741824") && msg.contains("device 0"),
            "{msg}"
        );
    }
}
