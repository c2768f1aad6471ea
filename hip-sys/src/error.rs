//! The crate's error type, the HIP status newtype's `.result()`, and the built-in table of
//! error names used when the runtime cannot be asked (`hipGetErrorName` missing or not loaded).

use std::ffi::CStr;
use std::fmt;
use std::path::PathBuf;

use crate::generated::hipError_t;
use crate::search::SearchReport;

/// Everything hip-sys can fail with. Cloneable: the loader caches its outcome and hands the same
/// error to every caller.
#[derive(Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No candidate file could be opened. `report` lists every path tried and why it failed.
    #[error("{report}")]
    NotFound { report: Box<SearchReport> },
    /// A file opened but lacks the HIP runtime's core entry points (e.g. it is libc).
    #[error(
        "{} opened but is not a HIP runtime: it lacks {}. Point {override_var} at libamdhip64.so / libgalaxyhip.so.5, or unset it to search the usual places",
        path.display(), missing.join(", ")
    )]
    NotAHipRuntime {
        path: PathBuf,
        missing: Vec<&'static str>,
        override_var: &'static str,
    },
    /// The library opened but its entry-point table could not be built.
    #[error("{} opened but its entry points could not be read: {message}", path.display())]
    LoadFailed { path: PathBuf, message: String },
    /// A file opened but lacks a BLAS library's core entry points.
    #[error(
        "{} opened but is not {library}: it lacks {}. Point {override_var} at the real library",
        path.display(), missing.join(", ")
    )]
    NotABlasLibrary {
        library: &'static str,
        path: PathBuf,
        missing: Vec<&'static str>,
        override_var: &'static str,
    },
    /// A library override variable names a bare file name (no `/`). The system loader looks such
    /// a name up in its own search path, never in the current directory, so the file a check
    /// of that path would see need not be the file that loads.
    #[error(
        "{var}={name} is a bare file name: the system loader would look it up in its own search \
         path (LD_LIBRARY_PATH, /etc/ld.so.cache, the system directories), not in the current \
         directory; give a full path, e.g. {var}=/opt/rocm/lib/{name} or {var}=./{name}"
    )]
    BareLibraryName { var: &'static str, name: String },
    /// The library is loaded but does not export this function (an older or vendor build).
    #[error(
        "{name} is not exported by {}: this HIP/BLAS build predates it or the vendor (DTK) renamed it; upgrade the library or avoid the feature that needs it",
        library.display()
    )]
    MissingSymbol {
        name: &'static str,
        library: PathBuf,
    },
    /// A HIP runtime call failed.
    #[error(transparent)]
    Hip(#[from] HipError),
    /// A hipBLAS call failed.
    #[error(transparent)]
    HipBlas(#[from] crate::blas::HipBlasError),
    /// A rocBLAS call failed.
    #[error(transparent)]
    RocBlas(#[from] crate::blas::RocBlasError),
    /// An RCCL call failed.
    #[error(transparent)]
    Rccl(#[from] crate::rccl::RcclError),
    /// A file opened but lacks RCCL's core entry point.
    #[error(
        "{} opened but is not RCCL: it lacks {}. Point {override_var} at librccl.so (DTK: /opt/dtk/lib/librccl.so.1 or /opt/dtk/rccl/lib/librccl.so), or unset it to search the usual places",
        path.display(), missing.join(", ")
    )]
    NotRccl {
        path: PathBuf,
        missing: Vec<&'static str>,
        override_var: &'static str,
    },
    /// The loaded RCCL release predates a feature (e.g. `ncclAvg`, NCCL 2.10).
    #[error("{what} is not available in RCCL {version}: it needs {needs}. Upgrade RCCL (DTK/ROCm) or use another operation (e.g. ncclSum and divide)")]
    RcclUnsupported {
        what: &'static str,
        version: crate::rccl::RcclVersion,
        needs: &'static str,
    },
    /// `hipGetDeviceProperties*` returned values no device has: the struct layout is not the one
    /// hip-sys assumed for this runtime.
    #[error(
        "device {ordinal}: properties read as {layout} look wrong: {reason}. The runtime's hipDeviceProp_t layout differs from what hip-sys expects for {library}; please report it with `hip-doctor` output"
    )]
    BadProps {
        ordinal: i32,
        layout: crate::PropsLayout,
        library: PathBuf,
        reason: String,
    },
}

/// A failed HIP call: the status code with the runtime's own name and description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipError {
    pub code: hipError_t,
    /// `hipGetErrorName`, or the built-in table's name.
    pub name: String,
    /// `hipGetErrorString`, or the built-in table's description.
    pub description: String,
}

impl HipError {
    /// Describe `code`, asking the loaded runtime for its name and text when it is already loaded
    /// (this never triggers a load), else using the built-in table.
    pub fn new(code: hipError_t) -> Self {
        let from_runtime = crate::loader::loaded().and_then(|hip| runtime_strings(hip, code));
        let (name, description) = from_runtime.unwrap_or_else(|| {
            let (name, description) = builtin_strings(code);
            (name.to_string(), description.to_string())
        });
        HipError {
            code,
            name,
            description,
        }
    }

    /// What to check for the common failures, if there is a known one.
    pub fn hint(&self) -> Option<&'static str> {
        hint(self.code)
    }
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HIP error {} {}: {}",
            self.code.0, self.name, self.description
        )?;
        if let Some(hint) = self.hint() {
            write!(f, ". Hint: {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for HipError {}

impl hipError_t {
    /// `Ok(())` for `hipSuccess`, else [`Error::Hip`] with the runtime's name and description.
    pub fn result(self) -> Result<(), Error> {
        if self == hipError_t::hipSuccess {
            Ok(())
        } else {
            Err(Error::Hip(HipError::new(self)))
        }
    }

    /// The built-in name of this code ("hipErrorNoDevice"), or "hipErrorUnrecognized".
    pub fn builtin_name(self) -> &'static str {
        builtin_strings(self).0
    }
}

/// Ask the runtime for the name and description of `code`.
fn runtime_strings(hip: &crate::Hip, code: hipError_t) -> Option<(String, String)> {
    let name_fn = *hip.api().hipGetErrorName.as_ref().ok()?;
    let text_fn = *hip.api().hipGetErrorString.as_ref().ok()?;
    // SAFETY: both functions take any hipError_t by value and return a pointer to a static,
    // NUL-terminated string owned by the runtime (or null), which is never unloaded.
    let (name, text) = unsafe { (name_fn(code), text_fn(code)) };
    let read = |p: *const std::ffi::c_char| -> Option<String> {
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null pointers from hipGetErrorName/String point to static C strings.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let (name, text) = (read(name)?, read(text)?);
    // Some runtimes (ROCm 5.2) answer hipGetErrorString with the name; the table says more.
    let text = if text == name {
        builtin_strings(code).1.to_string()
    } else {
        text
    };
    Some((name, text))
}

/// What to check, for the failures users hit most.
pub fn hint(code: hipError_t) -> Option<&'static str> {
    Some(match code {
        hipError_t::hipErrorNoDevice => {
            "no HIP device found: check that /dev/kfd exists and is readable and writable by you (containers need --device /dev/kfd --device /dev/dri, and /dev/mkfd on DCU), that HIP_VISIBLE_DEVICES does not hide every device, and that your user is in the render and video groups (`groups`); to run without a GPU, use hip-emu, the emulated device (HIPK_HIP_LIBRARY=<path>/libhip_emu.so, or `hip-emu run -- <command>`; see hip-emu/README.md)"
        }
        hipError_t::hipErrorNoBinaryForGpu => {
            "the code object has no ISA for this device: rebuild the kernels for the device's arch (set HIPK_ARCH to its gcnArchName, e.g. gfx906 or gfx928)"
        }
        hipError_t::hipErrorOutOfMemory => {
            "device memory is exhausted: free buffers or reduce the batch size; check other processes with `/opt/hyhal/bin/hy-smi` (DTK) or `rocm-smi`"
        }
        hipError_t::hipErrorInvalidDevice => {
            "the device ordinal is out of range: see hipGetDeviceCount and HIP_VISIBLE_DEVICES"
        }
        hipError_t::hipErrorNotInitialized | hipError_t::hipErrorInsufficientDriver => {
            "the runtime could not initialise the driver: check that the kernel driver is loaded (/dev/kfd) and that the HIP library matches it (on DTK: `source /opt/dtk/env.sh`)"
        }
        hipError_t::hipErrorInvalidDeviceFunction | hipError_t::hipErrorInvalidImage => {
            "the kernel is not in the loaded code object for this device: check the arch it was built for (HIPK_ARCH) and the kernel name"
        }
        hipError_t::hipErrorLaunchOutOfResources => {
            "the launch needs more registers or shared memory than a CU has: reduce the block size or the kernel's LDS use"
        }
        hipError_t::hipErrorIllegalAddress => {
            "a kernel accessed memory out of bounds: check the launch's shapes. On a GPU the context is now unusable (every later call fails): restart the process. On hip-emu the process goes on (the fault is reported once, by the stream's next synchronising call; later work runs)"
        }
        _ => return None,
    })
}

/// Built-in `(name, description)` for `code`: the HIP 5.2 header's names; descriptions for the
/// common ones. Used when the runtime cannot be asked.
pub fn builtin_strings(code: hipError_t) -> (&'static str, &'static str) {
    macro_rules! table {
        ($($name:ident => $text:expr,)*) => {
            match code {
                $(hipError_t::$name => (stringify!($name), $text),)*
                _ => ("hipErrorUnrecognized", "an error code this version of hip-sys does not know"),
            }
        };
    }
    table! {
        hipSuccess => "no error",
        hipErrorInvalidValue => "invalid argument",
        hipErrorOutOfMemory => "out of memory",
        hipErrorNotInitialized => "initialization error",
        hipErrorDeinitialized => "driver shutting down",
        hipErrorInvalidConfiguration => "invalid configuration argument",
        hipErrorInvalidPitchValue => "invalid pitch argument",
        hipErrorInvalidSymbol => "invalid device symbol",
        hipErrorInvalidDevicePointer => "invalid device pointer",
        hipErrorInvalidMemcpyDirection => "invalid copy direction for memcpy",
        hipErrorInsufficientDriver => "driver version is insufficient for runtime version",
        hipErrorMissingConfiguration => "__global__ function call is not configured",
        hipErrorPriorLaunchFailure => "unspecified launch failure in prior launch",
        hipErrorInvalidDeviceFunction => "invalid device function",
        hipErrorNoDevice => "no ROCm-capable device is detected",
        hipErrorInvalidDevice => "invalid device ordinal",
        hipErrorInvalidImage => "device kernel image is invalid",
        hipErrorInvalidContext => "invalid device context",
        hipErrorNoBinaryForGpu => "no kernel image is available for execution on the device",
        hipErrorInvalidKernelFile => "invalid kernel file",
        hipErrorPeerAccessUnsupported => "peer access is not supported between these two devices",
        hipErrorFileNotFound => "file not found",
        hipErrorSharedObjectSymbolNotFound => "shared object symbol not found",
        hipErrorSharedObjectInitFailed => "shared object initialization failed",
        hipErrorOperatingSystem => "OS call failed or operation not supported on this OS",
        hipErrorInvalidHandle => "invalid resource handle",
        hipErrorNotFound => "named symbol not found",
        hipErrorNotReady => "device not ready",
        hipErrorIllegalAddress => "an illegal memory access was encountered",
        hipErrorLaunchOutOfResources => "too many resources requested for launch",
        hipErrorLaunchTimeOut => "the launch timed out and was terminated",
        hipErrorPeerAccessAlreadyEnabled => "peer access is already enabled",
        hipErrorPeerAccessNotEnabled => "peer access has not been enabled",
        hipErrorHostMemoryAlreadyRegistered => "part or all of the requested memory range is already mapped",
        hipErrorHostMemoryNotRegistered => "pointer does not correspond to a registered memory region",
        hipErrorLaunchFailure => "unspecified launch failure",
        hipErrorCooperativeLaunchTooLarge => "too many blocks in cooperative launch",
        hipErrorNotSupported => "operation not supported",
        hipErrorUnknown => "unknown error",
        hipErrorRuntimeMemory => "HSA runtime memory call returned an error",
        hipErrorRuntimeOther => "HSA runtime call returned an error",
    }
}

impl Error {
    /// The HIP status code, when this is one (`None` for loader errors).
    pub fn hip_code(&self) -> Option<crate::hipError_t> {
        match self {
            Error::Hip(e) => Some(e.code),
            _ => None,
        }
    }

    /// `hipErrorOutOfMemory`.
    pub fn is_out_of_memory(&self) -> bool {
        self.hip_code() == Some(crate::hipError_t::hipErrorOutOfMemory)
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

    #[test]
    fn builtin_names_follow_the_header_numbers() {
        let cases = [
            (0, "hipSuccess"),
            (1, "hipErrorInvalidValue"),
            (2, "hipErrorOutOfMemory"),
            (3, "hipErrorNotInitialized"),
            (98, "hipErrorInvalidDeviceFunction"),
            (100, "hipErrorNoDevice"),
            (101, "hipErrorInvalidDevice"),
            (200, "hipErrorInvalidImage"),
            (209, "hipErrorNoBinaryForGpu"),
            (218, "hipErrorInvalidKernelFile"),
            (400, "hipErrorInvalidHandle"),
            (500, "hipErrorNotFound"),
            (600, "hipErrorNotReady"),
            (700, "hipErrorIllegalAddress"),
            (701, "hipErrorLaunchOutOfResources"),
            (719, "hipErrorLaunchFailure"),
            (801, "hipErrorNotSupported"),
            (999, "hipErrorUnknown"),
            (12345, "hipErrorUnrecognized"),
        ];
        for (code, name) in cases {
            assert_eq!(hipError_t(code).builtin_name(), name, "code {code}");
        }
    }

    #[test]
    fn success_is_ok_and_failures_carry_code_name_and_text() {
        assert!(hipError_t::hipSuccess.result().is_ok());
        let err = hipError_t::hipErrorInvalidValue.result().unwrap_err();
        let Error::Hip(hip) = &err else {
            panic!("not a HIP error: {err:?}")
        };
        assert_eq!(hip.code, hipError_t::hipErrorInvalidValue);
        let text = err.to_string();
        assert!(text.contains("HIP error 1 hipErrorInvalidValue"), "{text}");
        assert!(!hip.description.is_empty());
    }

    #[test]
    fn hints_for_common_failures() {
        let no_device = HipError::new(hipError_t::hipErrorNoDevice).to_string();
        for needle in [
            "no HIP device found",
            "/dev/kfd",
            "HIP_VISIBLE_DEVICES",
            "render",
            "video",
        ] {
            assert!(
                no_device.contains(needle),
                "{needle:?} missing: {no_device}"
            );
        }
        // Without a GPU, hip-emu is the way to run: the hint says how.
        assert!(
            no_device.contains("hip-emu") && no_device.contains("HIPK_HIP_LIBRARY"),
            "{no_device}"
        );
        // An out-of-bounds access: a GPU's context is lost, hip-emu goes on; the hint says which.
        let illegal = HipError::new(hipError_t::hipErrorIllegalAddress).to_string();
        assert!(
            illegal.contains("On a GPU") && illegal.contains("On hip-emu"),
            "{illegal}"
        );
        let no_binary = HipError::new(hipError_t::hipErrorNoBinaryForGpu).to_string();
        assert!(no_binary.contains("HIPK_ARCH"), "{no_binary}");
        assert!(HipError::new(hipError_t::hipErrorOutOfMemory)
            .to_string()
            .contains("memory"));
        assert!(HipError::new(hipError_t::hipErrorNotReady).hint().is_none());
    }
}
