//! The process-wide HIP runtime: found once ([`hip`]), never unloaded.

use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::dl;
use crate::generated::{hipError_t, HipApi};
use crate::props::{self, DeviceProps, PropsLayout};
use crate::search::{SearchReport, HIP_RUNTIME};
use crate::version::{Flavour, FlavourEvidence, RuntimeVersion};
use crate::Error;

/// A loaded HIP runtime: the file, its flavour and the table of its entry points.
pub struct Hip {
    /// Never dropped: dropping would `dlclose` the runtime, which DTK does not survive.
    api: ManuallyDrop<HipApi>,
    path: PathBuf,
    loaded: PathBuf,
    evidence: FlavourEvidence,
}

dl::library_accessors!(
    Hip,
    HipApi,
    "The generated table of entry points. Read its fields (or use [`crate::sym!`]); never call\nits methods, which panic when a symbol is missing."
);

impl std::fmt::Debug for Hip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hip")
            .field("path", &self.path)
            .field("flavour", &self.flavour())
            .finish_non_exhaustive()
    }
}

static HIP: dl::LoadCell<Hip> = OnceLock::new();

/// The HIP runtime, loaded on first use (search order in [`crate::search::targets`]). Every later
/// call returns the same runtime, or the same error.
pub fn hip() -> Result<&'static Hip, Error> {
    hip_cell().0.as_ref().map_err(Clone::clone)
}

/// The runtime if [`hip`] has already loaded it; never triggers a load.
pub(crate) fn loaded() -> Option<&'static Hip> {
    HIP.get().and_then(|(hip, _)| hip.as_ref().ok())
}

/// Where the HIP runtime search looked and what it found (runs the search if not done yet).
pub fn hip_search_report() -> SearchReport {
    hip_cell().1.clone()
}

fn hip_cell() -> &'static (Result<Hip, Error>, SearchReport) {
    dl::load_once(&HIP, &HIP_RUNTIME, Hip::from_opened)
}

/// Load the HIP runtime from exactly `path`, bypassing the search and the process-wide cache
/// (for tools and tests). The library is never unloaded, even when the returned value is dropped.
pub fn load_from(path: &Path) -> Result<Hip, Error> {
    dl::open_path(&HIP_RUNTIME, path).and_then(Hip::from_opened)
}

impl Hip {
    fn from_opened(opened: dl::Opened) -> Result<Hip, Error> {
        // SAFETY: `from_library` resolves each symbol by name and stores its address typed as
        // the generated prototype; the prototypes come from the HIP headers bindgen parsed, which
        // declare the C ABI of these exports. Symbols absent from this build become `Err` fields.
        let api = unsafe { HipApi::from_library(opened.library) };
        // With `dynamic_link_require_all(false)` no symbol is required, so this cannot fail today;
        // it is mapped rather than unwrapped in case a bindgen upgrade changes that.
        let api = api.map_err(|e| Error::LoadFailed {
            path: opened.path.clone(),
            message: e.to_string(),
        })?;
        let canonical = std::fs::canonicalize(&opened.path).unwrap_or_else(|_| opened.path.clone());
        let evidence = FlavourEvidence::gather(&canonical, &|p| p.is_file(), &|name| {
            crate::version::DTK_ONLY_SYMBOLS.contains(&name)
        });
        Ok(Hip {
            api: ManuallyDrop::new(api),
            path: opened.path,
            loaded: opened.loaded,
            evidence,
        })
    }

    /// DTK or upstream ROCm.
    pub fn flavour(&self) -> Flavour {
        self.evidence.flavour()
    }

    /// Why [`Hip::flavour`] decided what it did.
    pub fn flavour_evidence(&self) -> &FlavourEvidence {
        &self.evidence
    }

    /// `hipRuntimeGetVersion`, decoded.
    pub fn runtime_version(&self) -> Result<RuntimeVersion, Error> {
        let f = self.resolve("hipRuntimeGetVersion", &self.api.hipRuntimeGetVersion)?;
        let mut raw = 0;
        // SAFETY: hipRuntimeGetVersion writes one int through a valid pointer.
        unsafe { f(&mut raw) }.result()?;
        RuntimeVersion::decode(raw).ok_or(Error::Hip(crate::HipError {
            code: hipError_t::hipErrorUnknown,
            name: "hipRuntimeGetVersion".to_string(),
            description: format!("returned the impossible version {raw}"),
        }))
    }

    /// `hipGetDeviceCount`: `Err` with hipErrorNoDevice (and its hint) when there is none.
    pub fn device_count(&self) -> Result<i32, Error> {
        let f = self.resolve("hipGetDeviceCount", &self.api.hipGetDeviceCount)?;
        let mut count = 0;
        // SAFETY: hipGetDeviceCount writes one int through a valid pointer.
        unsafe { f(&mut count) }.result()?;
        Ok(count)
    }

    /// Which properties call and layout to try first: see [`props::preferred_layout`].
    pub fn props_layout(&self) -> PropsLayout {
        props::preferred_layout(self.flavour(), self.api.hipGetDevicePropertiesR0600.is_ok())
    }

    /// Properties of device `ordinal`, sanity-checked. Reads the layout from
    /// [`Hip::props_layout`] first; if what comes back fails the checks and the other entry point
    /// exists, reads that one instead (and reports the first failure if both fail).
    pub fn device_props(&self, ordinal: i32) -> Result<DeviceProps, Error> {
        let first = self.props_in(ordinal, self.props_layout());
        let other = match self.props_layout() {
            PropsLayout::R0600 => PropsLayout::Legacy,
            PropsLayout::Legacy => PropsLayout::R0600,
        };
        match first {
            Err(Error::BadProps { .. }) if self.has_props_entry(other) => {
                self.props_in(ordinal, other).or(first)
            }
            result => result,
        }
    }

    fn has_props_entry(&self, layout: PropsLayout) -> bool {
        match layout {
            PropsLayout::R0600 => self.api.hipGetDevicePropertiesR0600.is_ok(),
            PropsLayout::Legacy => self.api.hipGetDeviceProperties.is_ok(),
        }
    }

    /// One properties call in `layout`, checked and decoded.
    fn props_in(&self, ordinal: i32, layout: PropsLayout) -> Result<DeviceProps, Error> {
        let mut buf = props::new_buffer(layout);
        let status = match layout {
            PropsLayout::R0600 => {
                let f = self.resolve(layout.symbol(), &self.api.hipGetDevicePropertiesR0600)?;
                // SAFETY: the buffer holds BUFFER_SIZE bytes, more than hipDeviceProp_tR0600;
                // the runtime writes at most its struct there.
                unsafe { f(buf.as_mut_ptr().cast(), ordinal) }
            }
            PropsLayout::Legacy => {
                let f = self.resolve(layout.symbol(), &self.api.hipGetDeviceProperties)?;
                // SAFETY: as above, the buffer is larger than any legacy hipDeviceProp_t.
                unsafe { f(buf.as_mut_ptr().cast(), ordinal) }
            }
        };
        status.result()?;
        let bad = |reason: String| Error::BadProps {
            ordinal,
            layout,
            library: self.path.clone(),
            reason,
        };
        props::check_canary(&buf, layout).map_err(bad)?;
        let decoded = props::decode(&buf, layout).map_err(bad)?;
        decoded.sanity_check().map_err(bad)?;
        Ok(decoded)
    }
}

/// Resolve a field of a dynamic table to its function pointer:
/// `let f = hip_sys::sym!(hipMalloc)?;` loads the runtime (`hip()?`) and maps a missing export
/// to [`Error::MissingSymbol`] naming it. `sym!(lib, name)` uses a given `&Hip`, `&HipBlas` or
/// `&RocBlas` (anything with `api()` and `resolve()`), e.g. `sym!(blas, hipblasSgemm)`.
#[macro_export]
macro_rules! sym {
    ($name:ident) => {
        $crate::hip().and_then(|hip| hip.resolve(stringify!($name), &hip.api().$name))
    };
    ($lib:expr, $name:ident) => {{
        let lib = $lib;
        lib.resolve(stringify!($name), &lib.api().$name)
    }};
}
