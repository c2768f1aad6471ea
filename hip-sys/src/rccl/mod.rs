//! RCCL (ROCm's NCCL; DTK ships it), found and loaded at run time on its own, once per process,
//! never unloaded. A missing RCCL never affects the HIP runtime or the BLAS libraries.
//!
//! Search order ([`RCCL`]): `HIPK_RCCL_LIBRARY` (that file only), else `librccl.so`,
//! `librccl.so.1`, `librccl.so.2` in `$ROCM_PATH/lib`, `$ROCM_PATH/rccl/lib`, `/opt/dtk/lib`,
//! `/opt/dtk/rccl/lib` (older DTK layouts), `/opt/rocm/lib`, `/opt/rocm/rccl/lib`, then the system
//! loader. The not-found error lists every path tried.
//!
//! Only `ncclGetVersion` is required to load. Every other entry point is looked up the first
//! time it is asked for ([`RcclApi`]): one missing from an older or newer build is
//! [`Error::MissingSymbol`] for that call alone and never fails the load (NCCL has added and
//! renamed symbols across releases; RCCL spells `ncclAllToAll` where NCCL spells
//! `ncclAlltoAll`).
//!
//! The declarations are hand-written from RCCL's `nccl.h` (see [`abi`]); no RCCL header is
//! installed where this crate is built, so bindgen cannot generate them. `tests.rs` asserts the
//! header's values.

pub mod abi;

pub use abi::{
    ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId, RcclError, RcclVersion,
    NCCL_UNIQUE_ID_BYTES,
};

use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::dl::{load_once, LoadCell};
use crate::generated::hipStream_t;
use crate::search::{LibrarySpec, SearchDir, SearchReport};
use crate::Error;

/// RCCL: ROCm and DTK ship `librccl.so.1` (with a `librccl.so` link in development installs).
pub const RCCL: LibrarySpec = LibrarySpec {
    label: "RCCL",
    override_var: "HIPK_RCCL_LIBRARY",
    file_names: &["librccl.so", "librccl.so.1", "librccl.so.2"],
    dirs: &[
        SearchDir::Under("ROCM_PATH", "lib"),
        SearchDir::Under("ROCM_PATH", "rccl/lib"),
        SearchDir::Fixed("/opt/dtk/lib"),
        SearchDir::Fixed("/opt/dtk/rccl/lib"),
        SearchDir::Fixed("/opt/rocm/lib"),
        SearchDir::Fixed("/opt/rocm/rccl/lib"),
    ],
    core_symbols: &["ncclGetVersion"],
    install_hint: "on ROCm, install rccl (apt-get install rccl on AMD's repositories); DTK ships it in /opt/dtk/lib or /opt/dtk/rccl/lib",
};

/// Declare a lazily resolved entry-point table: one `OnceLock` per symbol and one method per
/// symbol that looks it up on first use and returns the typed function pointer or
/// [`Error::MissingSymbol`].
macro_rules! lazy_table {
    (
        $(#[$meta:meta])*
        pub struct $api:ident {
            $( $(#[$fmeta:meta])* $name:ident : fn($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty; )*
        }
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub struct $api {
            /// Never dropped: dropping would unload the library (see the crate docs).
            library: ManuallyDrop<libloading::Library>,
            path: PathBuf,
            $( $name: OnceLock<Option<unsafe extern "C" fn($($ty),*) -> $ret>>, )*
        }

        #[allow(non_snake_case)]
        impl $api {
            /// # Safety
            /// `library` must be RCCL (or a library exporting these symbols with RCCL's
            /// prototypes): each symbol found later is typed as its declared prototype unchecked.
            unsafe fn new(library: libloading::Library, path: PathBuf) -> $api {
                $api {
                    library: ManuallyDrop::new(library),
                    path,
                    $( $name: OnceLock::new(), )*
                }
            }

            $(
                $(#[$fmeta])*
                #[doc = concat!("`", stringify!($name), "`, resolved on first use.")]
                pub fn $name(&self) -> Result<unsafe extern "C" fn($($arg: $ty),*) -> $ret, Error> {
                    let found = self.$name.get_or_init(|| {
                        // SAFETY: per `new`'s contract the symbol, if exported, has this
                        // prototype; the library is never unloaded, so the pointer stays valid.
                        unsafe {
                            self.library
                                .get::<unsafe extern "C" fn($($ty),*) -> $ret>(
                                    concat!(stringify!($name), "\0").as_bytes(),
                                )
                                .ok()
                                .map(|symbol| *symbol)
                        }
                    });
                    found.ok_or_else(|| Error::MissingSymbol {
                        name: stringify!($name),
                        library: self.path.clone(),
                    })
                }
            )*
        }
    };
}

lazy_table! {
    /// RCCL's entry points that hip-sys binds, with the prototypes of `nccl.h`.
    pub struct RcclApi {
        ncclGetVersion: fn(version: *mut c_int) -> ncclResult_t;
        ncclGetUniqueId: fn(unique_id: *mut ncclUniqueId) -> ncclResult_t;
        ncclGetErrorString: fn(result: ncclResult_t) -> *const c_char;
        /// The id is passed by value (a 128-byte struct, in memory on x86-64).
        ncclCommInitRank: fn(comm: *mut ncclComm_t, nranks: c_int, comm_id: ncclUniqueId, rank: c_int) -> ncclResult_t;
        /// `devlist` null means devices 0..ndev.
        ncclCommInitAll: fn(comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t;
        ncclCommDestroy: fn(comm: ncclComm_t) -> ncclResult_t;
        ncclCommAbort: fn(comm: ncclComm_t) -> ncclResult_t;
        ncclCommGetAsyncError: fn(comm: ncclComm_t, async_error: *mut ncclResult_t) -> ncclResult_t;
        ncclCommCount: fn(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t;
        ncclCommCuDevice: fn(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t;
        ncclCommUserRank: fn(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t;
        ncclAllReduce: fn(
            sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
            op: ncclRedOp_t, comm: ncclComm_t, stream: hipStream_t,
        ) -> ncclResult_t;
        /// `recvcount` is the count each rank receives; the send buffer holds nranks times it.
        ncclReduceScatter: fn(
            sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize,
            datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: hipStream_t,
        ) -> ncclResult_t;
        /// `sendcount` is the count each rank sends; the receive buffer holds nranks times it.
        ncclAllGather: fn(
            sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize,
            datatype: ncclDataType_t, comm: ncclComm_t, stream: hipStream_t,
        ) -> ncclResult_t;
        ncclBroadcast: fn(
            sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
            root: c_int, comm: ncclComm_t, stream: hipStream_t,
        ) -> ncclResult_t;
        ncclReduce: fn(
            sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t,
            op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: hipStream_t,
        ) -> ncclResult_t;
        ncclSend: fn(
            sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int,
            comm: ncclComm_t, stream: hipStream_t,
        ) -> ncclResult_t;
        ncclRecv: fn(
            recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int,
            comm: ncclComm_t, stream: hipStream_t,
        ) -> ncclResult_t;
        ncclGroupStart: fn() -> ncclResult_t;
        ncclGroupEnd: fn() -> ncclResult_t;
    }
}

/// A loaded RCCL and its version.
pub struct Rccl {
    api: RcclApi,
    version: RcclVersion,
}

// SAFETY (of the auto traits): RcclApi holds a Library (Send + Sync), a PathBuf and OnceLocks of
// plain function pointers, so Rccl is Send + Sync without an unsafe impl.

impl Rccl {
    fn from_opened(opened: crate::dl::Opened) -> Result<Rccl, Error> {
        // SAFETY: `opened` exports ncclGetVersion (the core-symbol check), so it is RCCL or a
        // library with RCCL's C ABI (hip-emu's emulation); the prototypes follow `nccl.h`.
        let api = unsafe { RcclApi::new(opened.library, opened.path) };
        let get_version = api.ncclGetVersion()?;
        let mut code: c_int = 0;
        // SAFETY: ncclGetVersion writes one int through a valid pointer.
        unsafe { get_version(&mut code) }.result()?;
        let version = RcclVersion::decode(code).ok_or_else(|| Error::LoadFailed {
            path: api.path.clone(),
            message: format!("ncclGetVersion returned the impossible version code {code}"),
        })?;
        Ok(Rccl { api, version })
    }

    /// The file actually loaded.
    pub fn path(&self) -> &Path {
        &self.api.path
    }

    /// `ncclGetVersion`, decoded (read once, at load).
    pub fn version(&self) -> RcclVersion {
        self.version
    }

    /// The entry points, each resolved on first use.
    pub fn api(&self) -> &RcclApi {
        &self.api
    }

    /// [`Error::RcclUnsupported`] when `op` does not exist in this release (`ncclAvg` before
    /// NCCL 2.10): passing it would be undefined there, not an error.
    pub fn check_op(&self, op: ncclRedOp_t) -> Result<(), Error> {
        if self.version.supports_op(op) {
            Ok(())
        } else {
            Err(Error::RcclUnsupported {
                what: op.name(),
                version: self.version,
                needs: "a release based on NCCL 2.10 or later",
            })
        }
    }

    /// `ncclGetErrorString(code)`, or `None` when the library lacks it or returns null.
    pub fn error_string(&self, code: ncclResult_t) -> Option<String> {
        let f = self.api.ncclGetErrorString().ok()?;
        // SAFETY: ncclGetErrorString takes any code by value and returns a static C string
        // (or null), owned by the library, which is never unloaded.
        let p = unsafe { f(code) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null: a NUL-terminated static string (see above), copied out at once.
        Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

impl std::fmt::Debug for Rccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rccl")
            .field("path", &self.api.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

static RCCL_LIB: LoadCell<Rccl> = OnceLock::new();

/// RCCL, loaded on first use (search order in the [module docs](self)); the same value or error
/// on every later call.
pub fn rccl() -> Result<&'static Rccl, Error> {
    rccl_cell().0.as_ref().map_err(Clone::clone)
}

/// Where the RCCL search looked (runs it if not done yet).
pub fn rccl_search_report() -> SearchReport {
    rccl_cell().1.clone()
}

/// Load RCCL from exactly `path`, bypassing the search and the process-wide cache (for tools and
/// tests). The library is never unloaded.
pub fn load_rccl_from(path: &Path) -> Result<Rccl, Error> {
    crate::dl::open_path(&RCCL, path).and_then(Rccl::from_opened)
}

fn rccl_cell() -> &'static (Result<Rccl, Error>, SearchReport) {
    load_once(&RCCL_LIB, &RCCL, Rccl::from_opened)
}

#[cfg(test)]
mod tests;
