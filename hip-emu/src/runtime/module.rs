//! Modules and functions: `hipModuleLoadData`, `hipModuleGetFunction`, `hipModuleUnload`,
//! `hipFuncGetAttribute`. A function exists only if its name is both in the module's gfx906
//! code object (its metadata) and in the code object's host build (`crate::exec::host`, found
//! by the code object's content key).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::{Arc, Mutex};

use hip_sys::generated::hipJitOption;
use hip_sys::{hipError_t, hipFunction_attribute, hipFunction_t, hipModule_t};

use super::device::GCN_ARCH_NAME;
use super::error::{Fail, Res};
use super::metadata::{self, KernelMeta};
use super::{hip_exports, new_handle, out, runtime};
use crate::exec::{self, KernelInfo};

/// A loaded module.
pub struct Module {
    pub device: i32,
    pub target: String,
    pub kernels: Vec<KernelMeta>,
    /// The host-build key of the image (or why it has none).
    pub host_key: Result<String, String>,
    /// Device mirrors of its variables (`super::globals`).
    pub mirrors: Mutex<Vec<super::globals::Mirror>>,
}

/// A function of a loaded module.
pub struct Function {
    pub module: usize,
    pub device: i32,
    pub meta: KernelMeta,
    pub kernel: &'static KernelInfo,
}

#[derive(Default)]
struct Tables {
    modules: HashMap<usize, Arc<Module>>,
    functions: HashMap<usize, Arc<Function>>,
}

static TABLES: Mutex<Option<Tables>> = Mutex::new(None);

fn with_tables<R>(f: impl FnOnce(&mut Tables) -> R) -> R {
    let mut guard = TABLES.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(Tables::default))
}

/// The live function behind `f`.
pub fn function(f: hipFunction_t) -> Res<Arc<Function>> {
    with_tables(|t| t.functions.get(&(f as usize)).cloned()).ok_or_else(|| {
        Fail::handle(format!(
            "function {f:p} is not a live function of hip-emu (was its module unloaded?)"
        ))
    })
}

/// The live module behind `m`.
pub fn module(m: hipModule_t) -> Res<Arc<Module>> {
    with_tables(|t| t.modules.get(&(m as usize)).cloned())
        .ok_or_else(|| Fail::handle(format!("module {m:p} is not a live module of hip-emu")))
}

/// The live modules loaded on `device`, oldest first.
pub fn modules_on(device: i32) -> Vec<Arc<Module>> {
    let mut live: Vec<(usize, Arc<Module>)> = with_tables(|t| {
        t.modules
            .iter()
            .filter(|(_, m)| m.device == device)
            .map(|(h, m)| (*h, Arc::clone(m)))
            .collect()
    });
    live.sort_by_key(|(h, _)| *h);
    live.into_iter().map(|(_, m)| m).collect()
}

/// Load the image at `image` on the current device.
///
/// # Safety
/// `image` must point at a complete offload bundle or code object.
unsafe fn load(out_module: *mut hipModule_t, image: *const c_void) -> Res {
    let dev = runtime()?.current()?.ordinal;
    // SAFETY: forwarded from the caller.
    let len = unsafe { metadata::image_len(image.cast()) }?;
    // SAFETY: image_len derived `len` from the image's own headers; the caller guarantees
    // those bytes are readable.
    let bytes = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), len) };
    let code = metadata::parse_image(bytes, GCN_ARCH_NAME)?;
    let host_key = hip_codeobj::emu::host_key(bytes).map_err(|e| e.to_string());
    let handle = new_handle();
    let m = Module {
        device: dev,
        target: code.target,
        kernels: code.kernels,
        host_key,
        mirrors: Mutex::new(Vec::new()),
    };
    with_tables(|t| t.modules.insert(handle, Arc::new(m)));
    // SAFETY: out-parameter per the C API contract.
    unsafe { out(out_module, handle as hipModule_t, "module") }
}

/// Find `name` in module `m` and in the registry.
fn get_function(m: hipModule_t, name: &str) -> Res<usize> {
    let module = module(m)?;
    let Some(meta) = module.kernels.iter().find(|k| k.name == name) else {
        let names: Vec<&str> = module.kernels.iter().map(|k| k.name.as_str()).collect();
        return Err(Fail::new(
            hipError_t::hipErrorNotFound,
            format!(
                "kernel `{name}` is not in the module's {} code object; it defines {names:?}",
                module.target
            ),
        ));
    };
    let not_found = |why: String| {
        Fail::new(
            hipError_t::hipErrorNotFound,
            format!("kernel `{name}` cannot run on hip-emu: {why}"),
        )
    };
    let key = module.host_key.clone().map_err(not_found)?;
    let host = exec::host::load_for_key(&key).map_err(not_found)?;
    // The host build was made from the same source as this code object (it is found by the
    // image's content): a kernel missing there is not a stale build but one the host build could
    // not register, e.g. of internal linkage.
    let kernel = host.lookup(name).ok_or_else(|| {
        let names: Vec<&str> = host.kernels.iter().map(|k| k.name).collect();
        not_found(format!(
            "its host build {} (made from the same source) does not define it; it defines \
             {names:?}. A `static` kernel or one in an anonymous namespace is not registered: \
             give it external linkage",
            host.path.display()
        ))
    })?;
    let handle = new_handle();
    let f = Function {
        module: m as usize,
        device: module.device,
        meta: meta.clone(),
        kernel,
    };
    with_tables(|t| t.functions.insert(handle, Arc::new(f)));
    Ok(handle)
}

/// `hipFuncGetAttribute` from the metadata.
fn attribute(f: &Function, attr: hipFunction_attribute) -> Res<c_int> {
    use hipFunction_attribute as A;
    let m = &f.meta;
    let clamp = |v: u64| c_int::try_from(v).unwrap_or(c_int::MAX);
    Ok(match attr {
        A::HIP_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK => clamp(if m.max_flat_workgroup_size == 0 {
            1024
        } else {
            m.max_flat_workgroup_size
        }),
        A::HIP_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES => clamp(m.group_segment_fixed_size),
        A::HIP_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES => clamp(m.private_segment_fixed_size),
        A::HIP_FUNC_ATTRIBUTE_NUM_REGS => clamp(m.vgpr_count),
        A::HIP_FUNC_ATTRIBUTE_CONST_SIZE_BYTES => 0,
        A::HIP_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES => {
            clamp((super::device::LDS_PER_BLOCK as u64).saturating_sub(m.group_segment_fixed_size))
        }
        A::HIP_FUNC_ATTRIBUTE_PTX_VERSION | A::HIP_FUNC_ATTRIBUTE_BINARY_VERSION => 90,
        other => {
            return Err(Fail::invalid(format!(
                "hipFuncGetAttribute: attribute {} is not emulated for kernel `{}`",
                other.0, m.name
            )))
        }
    })
}

hip_exports! {
    /// Reads the gfx906 code object of a clang offload bundle (or a raw code object) and its
    /// AMDGPU metadata.
    fn hipModuleLoadData(module: *mut hipModule_t, image: *const c_void) {
        // SAFETY: the C API contract: `image` is a complete bundle or code object.
        unsafe { load(module, image) }
    }

    fn hipModuleLoadDataEx(module: *mut hipModule_t, image: *const c_void, _num_options: c_uint, _options: *mut hipJitOption, _values: *mut *mut c_void) {
        // JIT options do not apply: the code object is not compiled, only read.
        // SAFETY: as hipModuleLoadData.
        unsafe { load(module, image) }
    }

    fn hipModuleUnload(m: hipModule_t) {
        runtime()?;
        let removed = with_tables(|t| {
            let module = t.modules.remove(&(m as usize));
            t.functions.retain(|_, f| f.module != m as usize);
            module
        });
        let removed = removed.ok_or_else(|| Fail::handle(format!("module {m:p} is not a live module of hip-emu")))?;
        super::globals::free_all(&removed);
        Ok(())
    }

    fn hipModuleGetFunction(function: *mut hipFunction_t, m: hipModule_t, name: *const c_char) {
        runtime()?;
        if name.is_null() {
            return Err(Fail::invalid("hipModuleGetFunction: kname is a null pointer"));
        }
        // SAFETY: a non-null, NUL-terminated C string per the C API contract.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned();
        let handle = get_function(m, &name)?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(function, handle as hipFunction_t, "function") }
    }

    fn hipFuncGetAttribute(value: *mut c_int, attr: hipFunction_attribute, f: hipFunction_t) {
        let func = function(f)?;
        let v = attribute(&func, attr)?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(value, v, "value") }
    }
}
