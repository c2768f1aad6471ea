//! Loading the embedded bundles on a device, once per (device, source), and looking up their
//! kernels (cached per device and name).
//!
//! Never run on a GPU here: without a device every path stops at hip-rt's NoDevice error.

use super::{bundle, KernelsNotBuilt};
use hip_rt::{Device, Function, Module};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock, PoisonError};

/// Why a kernel could not be made ready to launch.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// This build has no kernels (no hipcc at build time) or not this source.
    #[error(transparent)]
    NotBuilt(#[from] KernelsNotBuilt),
    /// HIP refused the bundle or the kernel (e.g. no code object for this device's arch).
    #[error("loading kernel `{kernel}` from kernels/{source_name}.hip: {error}")]
    Hip {
        /// Source file stem.
        source_name: &'static str,
        /// Kernel name.
        kernel: String,
        /// What hip-rt reported.
        #[source]
        error: Box<hip_rt::Error>,
    },
}

/// (device ordinal, kernel name) → function; modules stay loaded through their functions.
type Cache = HashMap<(i32, String), Function>;

fn cache() -> &'static Mutex<Cache> {
    static CACHE: OnceLock<Mutex<Cache>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The kernel `kernel` of `kernels/<source>.hip` on `device`, loading the bundle on first use.
///
/// # Host sync
/// The first call per (device, source) loads the code object (`hipModuleLoadData`, which
/// blocks the calling thread until the runtime has it); later calls are a map lookup.
pub fn function(
    device: &Device,
    source: &'static str,
    kernel: &str,
) -> Result<Function, LoadError> {
    let key = (device.ordinal(), kernel.to_string());
    // A panic while holding the lock cannot leave the map half-updated (one insert), so a
    // poisoned lock is still consistent.
    let mut map = cache().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(f) = map.get(&key) {
        return Ok(f.clone());
    }
    let hip = |error| LoadError::Hip {
        source_name: source,
        kernel: kernel.to_string(),
        error: Box::new(error),
    };
    let module = match map
        .values()
        .find(|f| f.module().device().ordinal() == key.0 && module_source(f) == Some(source))
    {
        Some(f) => f.module().clone(),
        None => Module::load(device, bundle(source)?.bytes).map_err(hip)?,
    };
    let f = module.function(kernel).map_err(hip)?;
    map.insert(key, f.clone());
    Ok(f)
}

/// The source a cached function came from, by its name's entry in the kernel name table.
fn module_source(f: &Function) -> Option<&'static str> {
    crate::ops::KERNEL_FILES
        .iter()
        .find(|file| file.kernels.contains(&f.name()))
        .map(|file| file.source)
}
