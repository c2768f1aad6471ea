//! hipBLAS and rocBLAS, each found and loaded on its own, once per process, never unloaded.
//! A missing BLAS never affects the HIP runtime: [`crate::hip`] does not touch these.
//!
//! No hipBLAS/rocBLAS headers exist in Debian bookworm, so the declarations in [`mod@hipblas`] and
//! [`mod@rocblas`] are written by hand; each says which published header it follows. The tables
//! mirror bindgen's dynamic-loading layout: one pub `Result<fn, libloading::Error>` field per
//! entry point, resolved with [`crate::sym!`]`(blas, name)` into a typed
//! [`crate::Error::MissingSymbol`].

pub mod hipblas;
pub mod rocblas;

pub use hipblas::{
    hipDataType, hipblasComputeType_t, hipblasDatatype_t, hipblasGemmAlgo_t, hipblasHandle_t,
    hipblasOperation_t, hipblasPointerMode_t, hipblasStatus_t, GemmExAbi, HipBlas, HipBlasApi,
    HipBlasError,
};
pub use rocblas::{
    rocblas_datatype, rocblas_gemm_algo, rocblas_handle, rocblas_operation, rocblas_pointer_mode,
    rocblas_status, RocBlas, RocBlasApi, RocBlasError,
};

use std::sync::OnceLock;

use crate::dl::{load_once, LoadCell};
use crate::search::{LibrarySpec, SearchReport};
use crate::Error;

/// hipBLAS: ROCm 7 ships `.so.3`, ROCm 6 `.so.2`, ROCm 5 `.so.0`/`.so.1`.
pub const HIPBLAS: LibrarySpec = LibrarySpec {
    label: "hipBLAS",
    override_var: "HIPK_HIPBLAS_LIBRARY",
    file_names: &[
        "libhipblas.so",
        "libhipblas.so.3",
        "libhipblas.so.2",
        "libhipblas.so.1",
        "libhipblas.so.0",
    ],
    dirs: crate::search::STANDARD_DIRS,
    core_symbols: &["hipblasCreate", "hipblasDestroy"],
    install_hint: "on ROCm, install hipblas (it is not packaged in Debian bookworm)",
};

/// rocBLAS: ROCm 7 ships `.so.5`, ROCm 6 `.so.4`, ROCm 5 `.so.3`/`.so.0`.
pub const ROCBLAS: LibrarySpec = LibrarySpec {
    label: "rocBLAS",
    override_var: "HIPK_ROCBLAS_LIBRARY",
    file_names: &[
        "librocblas.so",
        "librocblas.so.5",
        "librocblas.so.4",
        "librocblas.so.3",
        "librocblas.so.0",
    ],
    dirs: crate::search::STANDARD_DIRS,
    core_symbols: &["rocblas_create_handle", "rocblas_destroy_handle"],
    install_hint: "on ROCm, install rocblas (it is not packaged in Debian bookworm)",
};

static HIPBLAS_LIB: LoadCell<HipBlas> = OnceLock::new();
static ROCBLAS_LIB: LoadCell<RocBlas> = OnceLock::new();

/// hipBLAS, loaded on first use; the same value or error on every later call.
pub fn hipblas() -> Result<&'static HipBlas, Error> {
    hipblas_cell().0.as_ref().map_err(Clone::clone)
}

/// rocBLAS, loaded on first use; the same value or error on every later call.
pub fn rocblas() -> Result<&'static RocBlas, Error> {
    rocblas_cell().0.as_ref().map_err(Clone::clone)
}

/// Where the hipBLAS search looked (runs it if not done yet).
pub fn hipblas_search_report() -> SearchReport {
    hipblas_cell().1.clone()
}

/// Where the rocBLAS search looked (runs it if not done yet).
pub fn rocblas_search_report() -> SearchReport {
    rocblas_cell().1.clone()
}

fn hipblas_cell() -> &'static (Result<HipBlas, Error>, SearchReport) {
    load_once(&HIPBLAS_LIB, &HIPBLAS, |opened| {
        Ok(HipBlas::from_opened(opened))
    })
}

fn rocblas_cell() -> &'static (Result<RocBlas, Error>, SearchReport) {
    load_once(&ROCBLAS_LIB, &ROCBLAS, |opened| {
        Ok(RocBlas::from_opened(opened))
    })
}

/// Declare a hand-written dynamic-loading table in bindgen's shape: `pub struct $api` with one
/// `pub $name: Result<unsafe extern "C" fn(..) -> $ret, libloading::Error>` per entry, and a
/// `load` that resolves every entry by its own name.
macro_rules! dynamic_table {
    (
        $(#[$meta:meta])*
        pub struct $api:ident {
            $( $(#[$fmeta:meta])* $name:ident : fn($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty; )*
        }
    ) => {
        $(#[$meta])*
        #[allow(non_snake_case)]
        pub struct $api {
            $( $(#[$fmeta])* pub $name: Result<unsafe extern "C" fn($($arg: $ty),*) -> $ret, libloading::Error>, )*
        }

        impl $api {
            /// Resolve every entry point in `library`; absent ones become `Err` fields.
            ///
            /// # Safety
            /// `library` must be the library these prototypes were written for: each found
            /// symbol is typed as the declared prototype without any check.
            #[allow(non_snake_case)]
            pub(crate) unsafe fn load(library: &libloading::Library) -> Self {
                $(
                    // SAFETY: per this function's contract the symbol has this prototype; the
                    // pointer stays valid because the library is never unloaded.
                    let $name = unsafe {
                        library
                            .get::<unsafe extern "C" fn($($ty),*) -> $ret>(
                                concat!(stringify!($name), "\0").as_bytes(),
                            )
                            .map(|symbol| *symbol)
                    };
                )*
                $api { $( $name, )* }
            }
        }
    };
}
pub(crate) use dynamic_table;

/// Declare a status newtype over the C enum with named constants, `name()` and `result()`.
macro_rules! status_newtype {
    (
        $(#[$meta:meta])*
        $status:ident => $error:ident ($library:literal) {
            $( $name:ident = $value:literal, )*
        }
        hints { $( $hinted:ident => $hint:literal, )* }
    ) => {
        $(#[$meta])*
        #[repr(transparent)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $status(pub std::ffi::c_uint);

        #[allow(non_upper_case_globals)]
        impl $status {
            $( pub const $name: $status = $status($value); )*

            /// The header's name for this code, or "unrecognized" for one this crate does not know.
            pub fn name(self) -> &'static str {
                match self.0 {
                    $( $value => stringify!($name), )*
                    _ => "unrecognized",
                }
            }

            /// What to check for this code, when there is a known cause.
            pub fn hint(self) -> Option<&'static str> {
                match self {
                    $( $status::$hinted => Some($hint), )*
                    _ => None,
                }
            }

            /// `Ok(())` on success, else the typed error.
            pub fn result(self) -> Result<(), crate::Error> {
                if self.0 == 0 {
                    Ok(())
                } else {
                    Err($error { code: self }.into())
                }
            }
        }

        #[doc = concat!("A failed ", $library, " call.")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $error {
            pub code: $status,
        }

        impl std::fmt::Display for $error {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{} error {} {}", $library, self.code.0, self.code.name())?;
                if let Some(hint) = self.code.hint() {
                    write!(f, ". Hint: {hint}")?;
                }
                Ok(())
            }
        }

        impl std::error::Error for $error {}
    };
}
pub(crate) use status_newtype;

#[cfg(test)]
mod tests;
