//! Opening a library found by [`crate::search`]: the one place that calls the system loader.
//! Nothing opened here is ever unloaded (DTK's runtime crashes in its exit handlers after a
//! `dlclose`), so libraries are leaked on purpose.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::search::{self, LibrarySpec, SearchReport, Target};
use crate::Error;

/// A process-wide library slot: the loaded library (or why it failed) and where the search looked.
pub(crate) type LoadCell<T> = OnceLock<(Result<T, Error>, SearchReport)>;

/// The library in `cell`, searching for `spec` and wrapping what opened with `wrap` on first
/// use; every later call returns the same value or error.
pub(crate) fn load_once<T>(
    cell: &'static LoadCell<T>,
    spec: &LibrarySpec,
    wrap: impl FnOnce(Opened) -> Result<T, Error>,
) -> &'static (Result<T, Error>, SearchReport) {
    cell.get_or_init(|| {
        let (opened, report) = find(spec);
        (opened.and_then(wrap), report)
    })
}

/// Turn a field of a dynamic table into its function pointer, or [`Error::MissingSymbol`] naming
/// `name` and the `library` file it is missing from.
pub(crate) fn resolve<F: Copy>(
    library: &Path,
    name: &'static str,
    field: &Result<F, libloading::Error>,
) -> Result<F, Error> {
    field.as_ref().copied().map_err(|_| Error::MissingSymbol {
        name,
        library: library.to_path_buf(),
    })
}

/// A library that opened and exports the spec's core symbols.
pub(crate) struct Opened {
    pub library: libloading::Library,
    /// The file actually loaded (resolved through the system loader when it found it).
    pub path: PathBuf,
    /// The file the loader mapped, asked of the loader itself (`dladdr` on a core symbol);
    /// `path` when the loader cannot say.
    pub loaded: PathBuf,
}

/// The accessors every loaded library type shares (`path`, `api`, `resolve`), for a struct with
/// `path: PathBuf` and `api` (or something that derefs to it) fields; `api`'s doc is given.
macro_rules! library_accessors {
    ($lib:ident, $api:ty, $api_doc:literal) => {
        impl $lib {
            /// The file actually loaded.
            pub fn path(&self) -> &std::path::Path {
                &self.path
            }

            /// The file the dynamic loader mapped, as the loader itself reports it (`dladdr`
            /// on one of the library's core symbols): what to show a user as "the file
            /// loaded". It names the same file as [`Self::path`] (possibly through another
            /// link); it is `path` where the loader cannot say.
            pub fn loaded_path(&self) -> &std::path::Path {
                &self.loaded
            }

            #[doc = $api_doc]
            pub fn api(&self) -> &$api {
                &self.api
            }

            #[doc = concat!("Turn a field of [`", stringify!($lib), "::api`] into the function pointer, or [`Error::MissingSymbol`](crate::Error::MissingSymbol).")]
            pub fn resolve<F: Copy>(
                &self,
                name: &'static str,
                field: &Result<F, libloading::Error>,
            ) -> Result<F, crate::Error> {
                crate::dl::resolve(&self.path, name, field)
            }
        }
    };
}
pub(crate) use library_accessors;

/// Search for `spec` with the process environment and filesystem, open the first hit and check
/// it is the library it claims to be.
pub(crate) fn find(spec: &LibrarySpec) -> (Result<Opened, Error>, SearchReport) {
    let env = |var: &str| std::env::var_os(var);
    let is_file = |path: &Path| path.is_file();
    let (found, mut report) = search::search(spec, &env, &is_file, &mut open_target);
    // Say what an existing path that is not a regular file is (the search only skipped it).
    for attempt in &mut report.attempts {
        if let (Target::File(path), search::Outcome::Absent) = (&attempt.target, &attempt.outcome) {
            if let Some(why) = search::path_problem(path).filter(|w| w != "does not exist") {
                attempt.outcome = search::Outcome::NotAFile(why);
            }
        }
    }
    let bare = report
        .attempts
        .iter()
        .find_map(|a| match (&a.target, &a.outcome) {
            (Target::File(path), search::Outcome::NotAFile(why)) if why == search::BARE_NAME => {
                Some(path.to_string_lossy().into_owned())
            }
            _ => None,
        });
    let result = match (found, bare) {
        (_, Some(name)) => Err(Error::BareLibraryName {
            var: spec.override_var,
            name,
        }),
        (None, None) => Err(Error::NotFound {
            report: Box::new(report.clone()),
        }),
        (Some((target, library)), None) => validate(spec, target, library),
    };
    (result, report)
}

/// Open exactly `path` as `spec`, bypassing the search. A bare file name is refused, as for
/// the override variable (see [`search::is_bare_name`]).
pub(crate) fn open_path(spec: &LibrarySpec, path: &Path) -> Result<Opened, Error> {
    if search::is_bare_name(path) {
        return Err(Error::BareLibraryName {
            var: "the path given to load_from",
            name: path.to_string_lossy().into_owned(),
        });
    }
    let target = Target::File(path.to_path_buf());
    match open_target(&target) {
        Ok(library) => validate(spec, target, library),
        Err(msg) => {
            let report = SearchReport {
                spec: *spec,
                attempts: vec![search::Attempt {
                    target,
                    outcome: match search::path_problem(path) {
                        None => search::Outcome::OpenFailed(msg),
                        Some(why) if why == "does not exist" => search::Outcome::Absent,
                        Some(why) => search::Outcome::NotAFile(why),
                    },
                }],
                env: Vec::new(),
            };
            Err(Error::NotFound {
                report: Box::new(report),
            })
        }
    }
}

fn open_target(target: &Target) -> Result<libloading::Library, String> {
    // SAFETY: loading runs the library's initialisers. The targets are the HIP/BLAS libraries
    // the user's environment names (or a file the user named explicitly); their initialisers
    // are sound to run once, and libraries are never unloaded afterwards (see module docs).
    let opened = unsafe {
        match target {
            Target::File(path) => libloading::Library::new(path),
            Target::SystemLoader(name) => libloading::Library::new(name),
        }
    };
    opened.map_err(|e| {
        let msg = e.to_string();
        // glibc reports an ELF for another machine as "No such file or directory".
        match target {
            Target::File(path) => match elf_mismatch(path) {
                Some(why) => format!("{why} (the loader said: {msg})"),
                None => msg,
            },
            Target::SystemLoader(_) => msg,
        }
    })
}

/// `e_machine` of the ELF files this process can load, and its name.
const HOST_MACHINE: Option<(u16, &str)> = if cfg!(target_arch = "x86_64") {
    Some((62, "x86-64"))
} else if cfg!(target_arch = "aarch64") {
    Some((183, "AArch64"))
} else if cfg!(target_arch = "powerpc64") {
    Some((21, "PowerPC64"))
} else if cfg!(target_arch = "riscv64") {
    Some((243, "RISC-V"))
} else if cfg!(target_arch = "loongarch64") {
    Some((258, "LoongArch"))
} else {
    None
};

/// Names of common `e_machine` values.
fn machine_name(machine: u16) -> &'static str {
    match machine {
        3 => "i386",
        8 => "MIPS",
        20 => "PowerPC",
        21 => "PowerPC64",
        22 => "S/390",
        40 => "ARM",
        62 => "x86-64",
        183 => "AArch64",
        224 => "AMDGPU (a GPU code object, not a host library)",
        243 => "RISC-V",
        258 => "LoongArch",
        _ => "unknown",
    }
}

/// Why the ELF file at `path` cannot be loaded into this process, read from its first 20 bytes:
/// another ELF class (32/64-bit) or another machine. `None` when it matches, is not ELF, or
/// cannot be read.
fn elf_mismatch(path: &Path) -> Option<String> {
    use std::io::Read;
    let (host, host_name) = HOST_MACHINE?;
    let mut head = [0u8; 20];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if &head[..4] != b"\x7fELF" {
        return None;
    }
    let host_class = if cfg!(target_pointer_width = "64") {
        2
    } else {
        1
    };
    if head[4] != host_class {
        let bits = |class: u8| if class == 2 { "64-bit" } else { "32-bit" };
        return Some(format!(
            "is a {} ELF file; this process is {}",
            bits(head[4]),
            bits(host_class)
        ));
    }
    let machine = match head[5] {
        1 => u16::from_le_bytes([head[18], head[19]]),
        2 => u16::from_be_bytes([head[18], head[19]]),
        _ => return None,
    };
    (machine != host).then(|| {
        format!(
            "is an ELF file for another architecture (e_machine = {machine}, {}); this process \
             is {host_name} (e_machine = {host})",
            machine_name(machine)
        )
    })
}

fn validate(
    spec: &LibrarySpec,
    target: Target,
    library: libloading::Library,
) -> Result<Opened, Error> {
    let missing: Vec<&'static str> = spec
        .core_symbols
        .iter()
        .copied()
        .filter(|name| symbol_address(&library, name).is_none())
        .collect();
    let mapped = spec
        .core_symbols
        .iter()
        .find_map(|sym| symbol_address(&library, sym).and_then(file_of_address));
    let path = match &target {
        Target::File(path) => path.clone(),
        Target::SystemLoader(name) => mapped.clone().unwrap_or_else(|| PathBuf::from(name)),
    };
    if missing.is_empty() {
        let loaded = mapped.unwrap_or_else(|| path.clone());
        return Ok(Opened {
            library,
            path,
            loaded,
        });
    }
    // Never dlclose what we opened, even a wrong file (see module docs).
    std::mem::forget(library);
    Err(if *spec == search::HIP_RUNTIME {
        Error::NotAHipRuntime {
            path,
            missing,
            override_var: spec.override_var,
        }
    } else if *spec == crate::rccl::RCCL {
        Error::NotRccl {
            path,
            missing,
            override_var: spec.override_var,
        }
    } else {
        Error::NotABlasLibrary {
            library: spec.label,
            path,
            missing,
            override_var: spec.override_var,
        }
    })
}

/// Address of an exported symbol, if the library has it.
fn symbol_address(library: &libloading::Library, name: &str) -> Option<*const std::ffi::c_void> {
    // SAFETY: the symbol is only read as an address (never called or dereferenced here), so its
    // real type does not matter.
    let symbol = unsafe { library.get::<*const std::ffi::c_void>(name.as_bytes()) }.ok()?;
    Some(*symbol)
}

/// The file that contains `addr`, per the dynamic loader (`dladdr`).
#[cfg(target_os = "linux")]
fn file_of_address(addr: *const std::ffi::c_void) -> Option<PathBuf> {
    use std::ffi::{c_char, c_int, c_void, CStr, OsStr};
    use std::os::unix::ffi::OsStrExt;

    /// glibc's `Dl_info`.
    #[repr(C)]
    struct DlInfo {
        dli_fname: *const c_char,
        dli_fbase: *mut c_void,
        dli_sname: *const c_char,
        dli_saddr: *mut c_void,
    }
    extern "C" {
        fn dladdr(addr: *const c_void, info: *mut DlInfo) -> c_int;
    }
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only reads `addr` as a number and writes the four fields of `info`, which
    // is a valid, exclusively borrowed Dl_info.
    let found = unsafe { dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: on success dli_fname is a NUL-terminated path owned by the loader, valid while the
    // library stays loaded (forever here); it is copied out immediately.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(OsStr::from_bytes(name.to_bytes())))
}

#[cfg(not(target_os = "linux"))]
fn file_of_address(_addr: *const std::ffi::c_void) -> Option<PathBuf> {
    None
}
