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

/// Devices whose kernels are found without a lock (ordinals beyond take the locked path).
const FAST_DEVICES: usize = 64;

/// Per device ordinal: one slot per kernel of the generated name table, in table order, set
/// once when the kernel is first resolved. Reading a set slot is two atomic loads: no lock,
/// no allocation, no string formatting.
static RESOLVED: [OnceLock<Box<[OnceLock<Function>]>>; FAST_DEVICES] =
    [const { OnceLock::new() }; FAST_DEVICES];

/// The slow path's state: the modules loaded per (device, source), and kernels that have no
/// fast slot (a name outside the generated table, or a device ordinal beyond [`FAST_DEVICES`]).
#[derive(Default)]
struct Loaded {
    modules: HashMap<(i32, &'static str), Module>,
    other: HashMap<(i32, String), Function>,
}

fn loaded() -> &'static Mutex<Loaded> {
    static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
    LOADED.get_or_init(|| Mutex::new(Loaded::default()))
}

/// The position of `kernel` of `source` in the generated name table (sources sorted, names
/// sorted within each), or `None` when the table does not list it.
fn kernel_index(source: &str, kernel: &str) -> Option<usize> {
    let table = super::kernel_names::KERNEL_NAMES;
    let at = table.binary_search_by(|(s, _)| (*s).cmp(source)).ok()?;
    let before: usize = table[..at].iter().map(|(_, names)| names.len()).sum();
    let within = table[at].1.binary_search(&kernel).ok()?;
    Some(before + within)
}

fn kernel_count() -> usize {
    super::kernel_names::KERNEL_NAMES
        .iter()
        .map(|(_, names)| names.len())
        .sum()
}

/// The kernel `kernel` of `kernels/<source>.hip` on `device`, loading the bundle on first use.
///
/// After the first call for a (device, kernel), this is a lookup in a table resolved once:
/// no lock, no allocation.
///
/// # Host sync
/// The first call per (device, source) loads the code object (`hipModuleLoadData`, which
/// blocks the calling thread until the runtime has it).
pub fn function(
    device: &Device,
    source: &'static str,
    kernel: &str,
) -> Result<Function, LoadError> {
    let ordinal = device.ordinal();
    let slot = usize::try_from(ordinal)
        .ok()
        .filter(|&d| d < FAST_DEVICES)
        .zip(kernel_index(source, kernel))
        .map(|(d, i)| {
            let slots = RESOLVED[d].get_or_init(|| {
                (0..kernel_count())
                    .map(|_| OnceLock::new())
                    .collect::<Vec<_>>()
                    .into_boxed_slice()
            });
            &slots[i]
        });
    if let Some(f) = slot.and_then(OnceLock::get) {
        return Ok(f.clone());
    }
    resolve(device, source, kernel, slot)
}

/// The locked path: load the module of `source` on `device` if needed, look the kernel up and
/// remember it (in `slot` when it has one).
#[cold]
fn resolve(
    device: &Device,
    source: &'static str,
    kernel: &str,
    slot: Option<&OnceLock<Function>>,
) -> Result<Function, LoadError> {
    let ordinal = device.ordinal();
    // A panic while holding the lock cannot leave a map half-updated (single inserts), so a
    // poisoned lock is still consistent.
    let mut loaded = loaded().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(f) = slot.and_then(OnceLock::get) {
        return Ok(f.clone()); // another thread resolved it while this one waited
    }
    if let Some(f) = loaded.other.get(&(ordinal, kernel.to_string())) {
        return Ok(f.clone());
    }
    let hip = |error| LoadError::Hip {
        source_name: source,
        kernel: kernel.to_string(),
        error: Box::new(error),
    };
    let module = match loaded.modules.get(&(ordinal, source)) {
        Some(m) => m.clone(),
        None => {
            let m = Module::load(device, bundle(source)?.bytes).map_err(hip)?;
            loaded.modules.insert((ordinal, source), m.clone());
            m
        }
    };
    let f = module.function(kernel).map_err(hip)?;
    match slot {
        // Set under the lock, so no other thread can have set it since the check above.
        Some(slot) => {
            let _ = slot.set(f.clone());
        }
        None => {
            loaded
                .other
                .insert((ordinal, kernel.to_string()), f.clone());
        }
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_generated_kernel_has_its_own_slot() {
        let mut seen = vec![false; kernel_count()];
        for (source, names) in super::super::kernel_names::KERNEL_NAMES {
            for name in *names {
                let i = kernel_index(source, name).expect("listed kernels have a slot");
                assert!(!seen[i], "{source}/{name} shares slot {i}");
                seen[i] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
        assert_eq!(kernel_index("gelu", "no_such_kernel"), None);
        assert_eq!(kernel_index("no_such_source", "gelu_fwd_f32"), None);
    }
}
