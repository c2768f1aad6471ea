//! Code objects: offload-bundle and ELF parsing (pure, no GPU needed: [`bundle`], [`elf`],
//! re-exported from the `hip-codeobj` crate), and loading them on a device ([`Module`], [`Function`], [`LaunchBuilder`]).
//!
//! Loading and launching have only ever run without a GPU here (where every path stops at the
//! NoDevice error); the mapping of load errors is unit-tested on its own.

pub use hip_codeobj::{bundle, elf};

mod global;
pub mod lookup;

pub use global::DeviceGlobal;

use std::ffi::CString;
use std::sync::Arc;

use hip_sys::{hipError_t, hipFunction_attribute, hipFunction_t, hipModule_t};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{KernelArg, KernelArgs, LaunchConfig, LaunchLimits};
use crate::result;
use crate::stream::Stream;
use bundle::{BundleError, CodeObjects};

/// A code object (offload bundle or bare ELF) loaded on one device. Cheap to clone; its
/// [`Function`]s keep it loaded. Unloaded when the last handle drops (errors go to
/// [`Device::check_err`]).
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

struct ModuleInner {
    device: Device,
    raw: hipModule_t,
    /// Target ids the image holds (empty if it could not be parsed, e.g. compressed).
    target_ids: Vec<String>,
    /// Kernel names of the code object matching the device (empty if unknown).
    kernels: Vec<String>,
    /// The image, kept alive for as long as the module (the runtime may refer to it).
    _image: Vec<u8>,
}

// SAFETY: a hipModule_t is a runtime handle usable from any thread; the rest is owned data.
unsafe impl Send for ModuleInner {}
// SAFETY: as above; shared access only reads the owned data and passes the handle to HIP.
unsafe impl Sync for ModuleInner {}

impl Module {
    /// Load `image` (what `hipcc --genco` writes, or a raw `.hsaco`/`.co` code object) on `device`.
    ///
    /// If the image holds no code object for the device's arch, the error is
    /// [`Error::NoBinaryForGpu`] naming the device's arch and the archs the image holds.
    pub fn load(device: &Device, image: &[u8]) -> Result<Module> {
        let parsed = match CodeObjects::parse(image) {
            Ok(objects) => Some(objects),
            Err(BundleError::Compressed) => None, // newer runtimes read these; let HIP decide
            Err(e) => return Err(e.into()),
        };
        let target_ids: Vec<String> = parsed
            .as_ref()
            .map(|p| p.target_ids().into_iter().map(str::to_owned).collect())
            .unwrap_or_default();
        let arch = device.gcn_arch_name();
        let matching = parsed.as_ref().and_then(|p| {
            p.objects.iter().find(|(t, _)| {
                bundle::target_id_compatible(t, arch) || t.starts_with("unknown-mach")
            })
        });
        let kernels = matching
            .and_then(|(_, bytes)| elf::kernel_names(bytes).ok())
            .unwrap_or_default();
        let no_binary = || Error::NoBinaryForGpu {
            ordinal: device.ordinal(),
            device_arch: arch.to_owned(),
            bundle_archs: target_ids.clone(),
        };
        device.bind_to_thread()?;
        let image = image.to_vec();
        // SAFETY: `image` is a complete code object or bundle (parsed above, or a compressed
        // bundle whose own header bounds it), owned by the module for its whole life.
        let raw = match unsafe { result::module::load_data(&image) } {
            Ok(raw) => raw,
            Err(e) => {
                return Err(map_load_error(
                    e,
                    parsed.is_some() && matching.is_none(),
                    no_binary,
                ))
            }
        };
        Ok(Module {
            inner: Arc::new(ModuleInner {
                device: device.clone(),
                raw,
                target_ids,
                kernels,
                _image: image,
            }),
        })
    }

    /// The device the module is loaded on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The target ids in the image (e.g. `["gfx906", "gfx928"]`).
    pub fn target_ids(&self) -> &[String] {
        &self.inner.target_ids
    }

    /// The kernels of the code object the device runs (empty when they could not be read).
    pub fn kernel_names(&self) -> &[String] {
        &self.inner.kernels
    }

    /// The kernel called `name`: its `extern "C"` name, its mangled C++ symbol, or its demangled
    /// C++ name with or without parameters (`saxpy_kernel`, `matrix_multiplication_kernel<16u>`,
    /// `scale(float*)`; [`lookup::resolve`]). A demangled name that several kernels share
    /// (overloads) is [`Error::AmbiguousKernel`].
    pub fn function(&self, name: &str) -> Result<Function> {
        let symbol = match lookup::resolve(name, &self.inner.kernels) {
            lookup::Resolved::One(symbol) => symbol,
            lookup::Resolved::None => name.to_owned(),
            lookup::Resolved::Ambiguous(candidates) => {
                return Err(Error::AmbiguousKernel {
                    name: name.to_owned(),
                    candidates: candidates.into_iter().map(|(_, full)| full).collect(),
                })
            }
        };
        let cname = CString::new(symbol.as_str()).map_err(|_| Error::NulInName(name.to_owned()))?;
        // SAFETY: the module is live while `self` is; `cname` is NUL-terminated.
        let raw = unsafe { result::module::get_function(self.inner.raw, &cname) }
            .map_err(|e| map_function_error(e, &symbol, &self.inner.kernels))?;
        let device_limits = *self.inner.device.limits();
        // SAFETY: `raw` is a live function of the live module (this call and the next).
        let max_threads = unsafe {
            result::module::func_attribute(
                raw,
                hipFunction_attribute::HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            )
        };
        // SAFETY: as above.
        let static_lds = unsafe {
            result::module::func_attribute(
                raw,
                hipFunction_attribute::HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            )
        };
        let limits = function_limits(device_limits, max_threads.ok(), static_lds.ok());
        Ok(Function {
            module: self.clone(),
            raw,
            name: name.to_owned(),
            limits,
        })
    }
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("device", &self.inner.device.ordinal())
            .field("target_ids", &self.inner.target_ids)
            .field("kernels", &self.inner.kernels)
            .finish()
    }
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // SAFETY: `raw` is the module this value loaded; no Function outlives it (each holds an
        // Arc to this value), and it is unloaded exactly once, here.
        let r = unsafe { result::module::unload(self.raw) };
        self.device.record_drop_error(r.map_err(Into::into));
    }
}

/// Map a hipModuleLoadData failure: NoBinaryForGpu (or any failure when the parsed image has no
/// code object for the device) becomes [`Error::NoBinaryForGpu`].
fn map_load_error(
    e: hip_sys::Error,
    known_mismatch: bool,
    no_binary: impl FnOnce() -> Error,
) -> Error {
    if e.hip_code() == Some(hipError_t::hipErrorNoBinaryForGpu)
        || (known_mismatch && e.hip_code().is_some())
    {
        no_binary()
    } else {
        e.into()
    }
}

/// Map a hipModuleGetFunction failure: a name the code object does not define (or, when its
/// kernels could not be listed, the runtime's not-found codes) becomes [`Error::KernelNotFound`].
fn map_function_error(e: hip_sys::Error, name: &str, kernels: &[String]) -> Error {
    let listed = !kernels.is_empty();
    let not_found_code = matches!(
        e.hip_code(),
        Some(hipError_t::hipErrorNotFound | hipError_t::hipErrorInvalidDeviceFunction)
    );
    let absent = listed && e.hip_code().is_some() && !kernels.iter().any(|k| k == name);
    if absent || (!listed && not_found_code) {
        Error::KernelNotFound {
            name: name.to_owned(),
            available: kernels.to_vec(),
        }
    } else {
        e.into()
    }
}

/// A device's limits narrowed by a kernel's attributes (`__launch_bounds__`, static LDS).
pub fn function_limits(
    device: LaunchLimits,
    max_threads: Option<i32>,
    static_lds: Option<i32>,
) -> LaunchLimits {
    let mut limits = device;
    if let Some(t) = max_threads.filter(|t| *t > 0) {
        limits.max_threads_per_block = limits.max_threads_per_block.min(t as u32);
    }
    if let Some(s) = static_lds.filter(|s| *s > 0) {
        limits.shared_mem_per_block = limits.shared_mem_per_block.saturating_sub(s as usize);
    }
    limits
}

/// A kernel of a loaded [`Module`].
#[derive(Clone)]
pub struct Function {
    module: Module,
    raw: hipFunction_t,
    name: String,
    limits: LaunchLimits,
}

// SAFETY: a hipFunction_t is an immutable runtime handle usable from any thread while its
// module is loaded (the Module handle inside keeps it loaded).
unsafe impl Send for Function {}
// SAFETY: as above; nothing is mutated through `&self`.
unsafe impl Sync for Function {}

impl Function {
    /// The runtime's handle (for a call hip-rt does not wrap; valid while `self` lives).
    pub fn raw(&self) -> hipFunction_t {
        self.raw
    }

    /// The kernel's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The module it belongs to.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The limits a launch of this kernel is checked against: the device's, narrowed by the
    /// kernel's max threads per block and static shared memory.
    pub fn limits(&self) -> &LaunchLimits {
        &self.limits
    }

    /// Launch on `stream` with `args` (in the kernel's parameter order).
    ///
    /// `cfg` is validated against [`Function::limits`] first; a launch failure, or an earlier
    /// asynchronous failure reported by `hipGetLastError`, is [`Error::LaunchFailed`].
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type; every device pointer
    /// passed must be valid for all accesses the kernel makes, and the memory must stay alive
    /// until the kernel completes (buffers used on a stream other than their allocation stream
    /// need [`DeviceBuffer::record_stream`](crate::DeviceBuffer::record_stream)).
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        cfg: &LaunchConfig,
        args: &mut KernelArgs<'_>,
    ) -> Result<()> {
        stream.check_same_device("kernel", self.module.device())?;
        cfg.validate(&self.limits)?;
        let failed = |source: hip_sys::Error| Error::LaunchFailed {
            kernel: self.name.clone(),
            source,
        };
        // Clear this thread's last-error state: every earlier failure was already returned by
        // the call that caused it, and must not be blamed on this launch.
        let _ = result::error::get_last();
        result::module::announce_arg_sizes(args.arg_sizes());
        // SAFETY: the function and stream are live while borrowed; the caller guarantees the
        // argument array matches the kernel and the memory it points to stays valid.
        unsafe {
            result::module::launch_kernel(self.raw, cfg, stream.raw(), args.as_param_array())
        }
        .map_err(failed)?;
        result::error::get_last().map_err(failed)
    }
}

impl std::fmt::Debug for Function {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Function({} on device {})",
            self.name,
            self.module.device().ordinal()
        )
    }
}

/// Arguments collected for one launch: `stream.launch_builder(&f).arg(&x).value(n).launch(cfg)`.
pub struct LaunchBuilder<'a> {
    stream: &'a Stream,
    function: &'a Function,
    args: KernelArgs<'a>,
}

impl<'a> LaunchBuilder<'a> {
    /// Push the next argument by reference: a buffer or view (passes its device pointer), or a
    /// scalar.
    pub fn arg<A: KernelArg + ?Sized>(&mut self, arg: &'a A) -> &mut Self {
        self.args.arg(arg);
        self
    }

    /// Push the next argument by exclusive reference (a buffer or view the kernel writes).
    pub fn arg_mut<A: KernelArg + ?Sized>(&mut self, arg: &'a mut A) -> &mut Self {
        self.args.arg_mut(arg);
        self
    }

    /// Push the next argument by value (kept alive by the builder).
    pub fn value<T: crate::DeviceRepr>(&mut self, value: T) -> &mut Self {
        self.args.value(value);
        self
    }

    /// Launch. See [`Function::launch`].
    ///
    /// # Safety
    /// As for [`Function::launch`].
    pub unsafe fn launch(&mut self, cfg: &LaunchConfig) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { self.function.launch(self.stream, cfg, &mut self.args) }
    }
}

impl Stream {
    /// Start collecting arguments for a launch of `function` on this stream.
    pub fn launch_builder<'a>(&'a self, function: &'a Function) -> LaunchBuilder<'a> {
        LaunchBuilder {
            stream: self,
            function,
            args: KernelArgs::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hip_err(code: hipError_t) -> hip_sys::Error {
        hip_sys::Error::Hip(hip_sys::HipError::new(code))
    }

    #[test]
    fn no_binary_for_gpu_is_mapped_to_a_typed_error() {
        let typed = || Error::NoBinaryForGpu {
            ordinal: 0,
            device_arch: "gfx928:sramecc+:xnack-".into(),
            bundle_archs: vec!["gfx906".into()],
        };
        let e = map_load_error(hip_err(hipError_t::hipErrorNoBinaryForGpu), false, typed);
        let msg = e.to_string();
        assert!(
            msg.contains("gfx928:sramecc+:xnack-") && msg.contains("[\"gfx906\"]"),
            "{msg}"
        );
        assert!(msg.contains("--offload-arch"), "{msg}");
        // Another code with a known mismatch also names the archs; without one it passes through.
        assert!(matches!(
            map_load_error(hip_err(hipError_t::hipErrorInvalidImage), true, typed),
            Error::NoBinaryForGpu { .. }
        ));
        let passed = map_load_error(hip_err(hipError_t::hipErrorInvalidImage), false, typed);
        assert_eq!(passed.hip_code(), Some(hipError_t::hipErrorInvalidImage));
        // Non-HIP errors (e.g. a missing symbol) are never rewritten.
        let missing = hip_sys::Error::MissingSymbol {
            name: "hipModuleLoadData",
            library: "x".into(),
        };
        assert!(matches!(
            map_load_error(missing, true, typed),
            Error::Sys(hip_sys::Error::MissingSymbol { .. })
        ));
    }

    #[test]
    fn kernel_attributes_narrow_device_limits() {
        let d = LaunchLimits::GFX906;
        let l = function_limits(d, Some(256), Some(4096));
        assert_eq!(l.max_threads_per_block, 256);
        assert_eq!(l.shared_mem_per_block, 65536 - 4096);
        assert_eq!(function_limits(d, None, None), d);
        assert_eq!(function_limits(d, Some(0), Some(-1)), d);
        assert_eq!(
            function_limits(d, Some(4096), None).max_threads_per_block,
            1024
        );
        let cfg = LaunchConfig {
            grid: (1, 1, 1),
            block: (512, 1, 1),
            shared_mem_bytes: 0,
        };
        assert!(cfg.validate(&l).is_err());
    }

    #[test]
    fn missing_kernels_are_mapped_to_a_typed_error() {
        let kernels = vec!["gelu_bf16".to_string()];
        let e = map_function_error(hip_err(hipError_t::hipErrorNotFound), "gelu_f32", &kernels);
        assert!(
            matches!(&e, Error::KernelNotFound { name, available } if name == "gelu_f32" && available == &kernels)
        );
        // A listed kernel that fails for another reason keeps its error.
        let e = map_function_error(
            hip_err(hipError_t::hipErrorInvalidHandle),
            "gelu_bf16",
            &kernels,
        );
        assert_eq!(e.hip_code(), Some(hipError_t::hipErrorInvalidHandle));
        // Unknown kernel list: only the runtime's not-found codes say "not found".
        let e = map_function_error(hip_err(hipError_t::hipErrorInvalidDeviceFunction), "x", &[]);
        assert!(matches!(e, Error::KernelNotFound { .. }));
        let e = map_function_error(hip_err(hipError_t::hipErrorInvalidHandle), "x", &[]);
        assert_eq!(e.hip_code(), Some(hipError_t::hipErrorInvalidHandle));
    }

    #[test]
    fn kernel_not_found_names_it() {
        let e = Error::KernelNotFound {
            name: "gelu_f32".into(),
            available: vec!["gelu_bf16".into()],
        };
        let msg = e.to_string();
        assert!(
            msg.contains("`gelu_f32`") && msg.contains("gelu_bf16"),
            "{msg}"
        );
    }
}
