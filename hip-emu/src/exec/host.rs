//! Host builds of kernels: shared objects that hip-build compiled from a kernel source against
//! its shim (hip-build's `host` module), loaded with `dlopen` and never unloaded.
//!
//! A program's code object is matched to its host build by content: `hipModuleLoadData` computes
//! [`hip_codeobj::emu::host_key`] of the image and [`find`] looks for `<key>.so` in, in order:
//! 1. the directories of `HIPK_EMU_KERNELS` (separated by `:`);
//! 2. directories added at run time ([`add_search_dir`], exported as `hipemuAddKernelDir`);
//! 3. the Cargo build directories next to the running program: for an executable in
//!    `<target>/<profile>/` (or its `deps/`, `examples/`), every `<target>/<profile>/build/*/out/hipemu/`
//!    (hip-build installs there). When several hold the key, the newest file wins.
//!
//! No list of kernels is compiled into hip-emu.

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

/// Calls the kernel with `args[i]` pointing at the bytes of parameter i.
pub(crate) type Trampoline = unsafe extern "C" fn(args: *const *const c_void);

/// The ABI version this hip-emu speaks (`HIPEMU_ABI` of hip-build's shim/hipemu_registry.h).
pub const HOST_ABI: u32 = 2;

/// The directory under a Cargo build script's `OUT_DIR` where hip-build installs host builds.
pub const OUT_DIR_SUBDIR: &str = "hipemu";

/// Pointers into the shared object a kernel lives in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ModuleRt {
    pub state: *mut super::ffi::State,
    pub race: *mut super::race::ffi::State,
    pub race_alloc: unsafe extern "C" fn(usize) -> i32,
    pub race_instrumented: bool,
    pub source_root: &'static str,
    /// `hipemu_asan` of shim/hipemu_asan.cpp (null in a build without the overrun check).
    pub asan: *mut super::overrun::ffi::State,
}

/// One kernel of a host build.
#[derive(Debug)]
pub struct KernelInfo {
    /// The kernel's `extern "C"` name (as in the code object).
    pub name: &'static str,
    /// Size in bytes of each parameter, in order, from the kernel's C++ signature.
    pub param_sizes: &'static [usize],
    pub(crate) trampoline: Trampoline,
    /// Bounds of the kernel file's static `__shared__` section (equal when it has none).
    pub(crate) lds: (usize, usize),
    pub(crate) rt: ModuleRt,
}

impl KernelInfo {
    /// True when its host build has the race check's instrumentation.
    pub fn race_checked(&self) -> bool {
        self.rt.race_instrumented
    }
}

// SAFETY: the pointers lead into a shared object that is never unloaded; the data they reach
// (shim state, race state) is only touched under the executor lock.
unsafe impl Send for KernelInfo {}
// SAFETY: as for Send: shared reads of an object that is never unloaded; mutation only under
// the executor lock.
unsafe impl Sync for KernelInfo {}

/// One `__device__` / `__constant__` variable of a host build.
#[derive(Debug, Clone, Copy)]
pub struct GlobalInfo {
    /// Its symbol (as in the code object).
    pub name: &'static str,
    /// Its address in the loaded shared object.
    pub addr: usize,
    /// Its size in bytes.
    pub size: usize,
}

/// A loaded host build.
#[derive(Debug)]
pub struct HostModule {
    /// The shared object.
    pub path: PathBuf,
    /// Its kernels.
    pub kernels: Vec<KernelInfo>,
    /// Its variables.
    pub globals: Vec<GlobalInfo>,
}

impl HostModule {
    /// The kernel called `name`.
    pub fn lookup(&self, name: &str) -> Option<&KernelInfo> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

mod ffi {
    use std::ffi::{c_char, c_void};

    /// `hipemu_entry` of shim/hipemu_registry.h.
    #[repr(C)]
    pub struct Entry {
        pub name: *const c_char,
        pub trampoline: unsafe extern "C" fn(args: *const *const c_void),
        pub param_count: usize,
        pub param_sizes: *const usize,
        pub lds_begin: *mut u8,
        pub lds_end: *mut u8,
    }

    /// `hipemu_global`.
    #[repr(C)]
    pub struct Global {
        pub name: *const c_char,
        pub addr: *mut c_void,
        pub size: usize,
    }

    /// `hipemu_host_api`.
    #[repr(C)]
    pub struct HostApi {
        pub abi: u32,
        pub barrier: extern "C" fn(*const c_char, u32),
        pub wave_op: extern "C" fn(u32, u64, i32, u64, *const c_char, u32) -> u64,
    }

    /// `hipemu_module`.
    #[repr(C)]
    pub struct Module {
        pub abi: u32,
        pub race_instrumented: u32,
        pub entries: *const *const Entry,
        pub entry_count: usize,
        pub state: *mut c_void,
        pub race: *mut c_void,
        pub race_alloc: unsafe extern "C" fn(usize) -> i32,
        pub source_root: *const c_char,
        pub globals: *const *const Global,
        pub global_count: usize,
    }

    pub type Init = unsafe extern "C" fn(*const HostApi) -> *const Module;
}

static API: ffi::HostApi = ffi::HostApi {
    abi: HOST_ABI,
    barrier: super::sched::hipemu_barrier,
    wave_op: super::sched::hipemu_wave_op,
};

/// Loaded modules by canonical path (never unloaded).
static LOADED: Mutex<Option<HashMap<PathBuf, &'static HostModule>>> = Mutex::new(None);
/// Directories added with [`add_search_dir`].
static EXTRA_DIRS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Loads (once) the host build at `path`.
pub fn load(path: &Path) -> Result<&'static HostModule, String> {
    let canonical = path
        .canonicalize()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut guard = LOADED.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(m) = map.get(&canonical) {
        return Ok(m);
    }
    // SAFETY: loading a host build runs no code but its static initialisers (plain data in
    // generated code); the handle is kept for the life of the process.
    let module = unsafe { open(&canonical) }?;
    let module: &'static HostModule = Box::leak(Box::new(module));
    map.insert(canonical, module);
    Ok(module)
}

/// # Safety
/// `path` must be a host build made by hip-build (its initialisers and `hipemu_module_init`
/// are generated code).
unsafe fn open(path: &Path) -> Result<HostModule, String> {
    let shown = path.display();
    let c_path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("{shown}: the path contains a NUL byte"))?;
    // A truncated file would fault inside dlopen (SIGBUS), past any error handling.
    super::elf_check::check_shared_object(path)?;
    // SAFETY: dlopen/dlerror with a valid C string; the handle is never closed.
    let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!("cannot load {shown}: {}", dlerror()));
    }
    // SAFETY: dlsym on a live handle with a NUL-terminated name.
    let sym = unsafe { libc::dlsym(handle, c"hipemu_module_init".as_ptr()) };
    if sym.is_null() {
        return Err(format!(
            "{shown} is not a hip-emu host build (no hipemu_module_init)"
        ));
    }
    // SAFETY: hipemu_module_init has this prototype (hipemu_registry.h's HIPEMU_MODULE).
    let init: ffi::Init = unsafe { std::mem::transmute::<*mut c_void, ffi::Init>(sym) };
    // SAFETY: API is a valid hipemu_host_api with static lifetime.
    let m = unsafe { init(&API) };
    if m.is_null() {
        return Err(format!(
            "{shown} was built for another hip-emu ABI (this hip-emu speaks {HOST_ABI}): rebuild \
             it with the hip-build of this hip-emu"
        ));
    }
    // SAFETY: the module table and every entry are constant data of the loaded object, which
    // stays loaded; the layouts are those of hipemu_registry.h (ABI checked by init).
    unsafe {
        let m = &*m;
        if m.abi != HOST_ABI {
            return Err(format!(
                "{shown} speaks hip-emu ABI {}, this hip-emu {HOST_ABI}: rebuild it",
                m.abi
            ));
        }
        let source_root: &'static str = if m.source_root.is_null() {
            ""
        } else {
            CStr::from_ptr(m.source_root).to_str().unwrap_or("")
        };
        let asan = connect_overrun_check(handle).map_err(|e| format!("{shown}: {e}"))?;
        let rt = ModuleRt {
            asan,
            state: m.state.cast(),
            race: m.race.cast(),
            race_alloc: m.race_alloc,
            race_instrumented: m.race_instrumented != 0,
            source_root,
        };
        let mut kernels = Vec::with_capacity(m.entry_count);
        for i in 0..m.entry_count {
            let e = &**m.entries.add(i);
            let name = CStr::from_ptr(e.name)
                .to_str()
                .map_err(|_| format!("{shown}: a kernel name is not UTF-8"))?;
            let param_sizes = if e.param_count == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(e.param_sizes, e.param_count)
            };
            let lds = if e.lds_begin.is_null() || e.lds_end < e.lds_begin {
                (0, 0)
            } else {
                (e.lds_begin as usize, e.lds_end as usize)
            };
            kernels.push(KernelInfo {
                name,
                param_sizes,
                trampoline: e.trampoline,
                lds,
                rt,
            });
        }
        let mut globals = Vec::with_capacity(m.global_count);
        for i in 0..m.global_count {
            let g = &**m.globals.add(i);
            let name = CStr::from_ptr(g.name)
                .to_str()
                .map_err(|_| format!("{shown}: a variable name is not UTF-8"))?;
            globals.push(GlobalInfo {
                name,
                addr: g.addr as usize,
                size: g.size,
            });
        }
        Ok(HostModule {
            path: path.to_path_buf(),
            kernels,
            globals,
        })
    }
}

/// Gives the module the overrun check's shadow; returns its report state (null when the build
/// has no overrun check).
///
/// # Safety
/// `handle` is a live handle of a host build, none of whose kernels runs yet.
unsafe fn connect_overrun_check(
    handle: *mut c_void,
) -> Result<*mut super::overrun::ffi::State, String> {
    // SAFETY: dlsym on a live handle with NUL-terminated names.
    let (offset, state) = unsafe {
        (
            libc::dlsym(handle, c"__asan_shadow_memory_dynamic_address".as_ptr()),
            libc::dlsym(handle, c"hipemu_asan".as_ptr()),
        )
    };
    if !offset.is_null() {
        let shadow = super::overrun::shadow_offset()?;
        // SAFETY: the shim's `uintptr_t __asan_shadow_memory_dynamic_address`, read by the
        // kernels only once they run.
        unsafe { *offset.cast::<usize>() = shadow };
    }
    Ok(state.cast())
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated message owned by libc.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated (above).
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// Adds a directory to the search path of [`find`] (after `HIPK_EMU_KERNELS`).
pub fn add_search_dir(dir: &Path) {
    let mut dirs = EXTRA_DIRS.lock().unwrap_or_else(|p| p.into_inner());
    if !dirs.iter().any(|d| d == dir) {
        dirs.push(dir.to_path_buf());
    }
}

/// Where [`find`] looks, in order (see the module docs).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("HIPK_EMU_KERNELS")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    dirs.extend(
        EXTRA_DIRS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned(),
    );
    dirs.extend(cargo_out_dirs());
    dirs
}

/// `<profile dir>/build/*/out/hipemu` next to the running executable.
fn cargo_out_dirs() -> Vec<PathBuf> {
    let Ok(exe) = std::env::current_exe() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for dir in exe.ancestors().skip(1).take(3) {
        let Ok(entries) = std::fs::read_dir(dir.join("build")) else {
            continue;
        };
        for e in entries.flatten() {
            let d = e.path().join("out").join(OUT_DIR_SUBDIR);
            if d.is_dir() {
                out.push(d);
            }
        }
        break;
    }
    out
}

/// The host build for `key`: Ok(path), or Err(why not) naming where it looked, and the reason
/// a build recorded for not making it (`<key>.missing`).
pub fn find(key: &str) -> Result<PathBuf, String> {
    let dirs = search_dirs();
    let file = format!("{key}.so");
    let newest = |cands: Vec<PathBuf>| {
        cands
            .into_iter()
            .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
    };
    let explicit = std::env::var_os("HIPK_EMU_KERNELS")
        .map(|v| std::env::split_paths(&v).count())
        .unwrap_or(0)
        + EXTRA_DIRS.lock().map(|d| d.len()).unwrap_or(0);
    if let Some(p) = dirs[..explicit.min(dirs.len())]
        .iter()
        .map(|d| d.join(&file))
        .find(|p| p.is_file())
    {
        return Ok(p);
    }
    let cargo = &dirs[explicit.min(dirs.len())..];
    if let Some(p) = newest(
        cargo
            .iter()
            .map(|d| d.join(&file))
            .filter(|p| p.is_file())
            .collect(),
    ) {
        return Ok(p);
    }
    let missing = format!("{key}.missing");
    let recorded = dirs
        .iter()
        .map(|d| d.join(&missing))
        .find_map(|p| std::fs::read_to_string(p).ok());
    let mut msg = format!("no host build `{file}` for this code object");
    match recorded {
        Some(reason) => {
            msg.push_str(": ");
            msg.push_str(reason.trim());
        }
        None => msg.push_str(&format!(
            " in {} searched directories (HIPK_EMU_KERNELS, hipemuAddKernelDir, the Cargo \
             build directories next to the program: build/*/out/{OUT_DIR_SUBDIR}); compile \
             the kernels with hip-build (it builds them for hip-emu when a clang++ >= 15 is \
             installed) or point HIPK_EMU_KERNELS at the directory holding `{file}`",
            dirs.len()
        )),
    }
    Err(msg)
}

/// Loads the host build of the code object whose key is `key`.
pub fn load_for_key(key: &str) -> Result<&'static HostModule, String> {
    static MEMO: OnceLock<Mutex<HashMap<String, &'static HostModule>>> = OnceLock::new();
    let memo = MEMO.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(m) = memo.lock().ok().and_then(|m| m.get(key).copied()) {
        return Ok(m);
    }
    let m = load(&find(key)?)?;
    if let Ok(mut memo) = memo.lock() {
        memo.insert(key.to_string(), m);
    }
    Ok(m)
}

/// `hipemuAddKernelDir(dir)`: adds a directory of host builds (`<key>.so`) to the search path.
/// Returns 0, or 1 when `dir` is null or not UTF-8.
///
/// # Safety
/// `dir` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn hipemuAddKernelDir(dir: *const c_char) -> i32 {
    if dir.is_null() {
        return 1;
    }
    // SAFETY: NUL-terminated per the contract.
    match unsafe { CStr::from_ptr(dir) }.to_str() {
        Ok(d) => {
            add_search_dir(Path::new(d));
            0
        }
        Err(_) => 1,
    }
}
