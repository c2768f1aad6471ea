//! Shared by hip-emu's tests (each test crate uses a part):
//! - runtime tests (`runtime_*.rs`, `rccl_dlopen.rs`, through hip-sys / hip-rt; they live in the
//!   `hip-emu-client-tests` package, hip-emu/client-tests/, which includes this file by path):
//!   [`setup`] points the loader at the freshly built libhip_emu.so, [`last_message`] reads its
//!   detailed error;
//! - executor tests (`exec_*.rs`, kernels compiled for the host here with hip-build's host
//!   build, on host buffers): [`kernel`] / [`host_module`], [`launch`] /
//!   [`launch1`] with arguments from [`arg`] / [`ptr`], [`available`], [`Guarded`] buffers and
//!   [`within_a_minute`].
#![allow(dead_code)]

use hip_emu::exec::{self, ExecError, LaunchSpec};
use std::path::PathBuf;
use std::sync::Once;

// ---------------------------------------------------------------------------------------------
// Runtime tests
// ---------------------------------------------------------------------------------------------

/// libhip_emu.so, found from the test binary (target/<profile>/deps/<test>): first next to it in
/// deps/ (where cargo builds hip-emu as a dependency, e.g. for hip-emu-client-tests), then in
/// target/<profile>/ (`cargo build -p hip-emu`, `cargo test -p hip-emu`).
pub fn emu_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's own path");
    let candidates: Vec<PathBuf> = exe
        .ancestors()
        .skip(1)
        .take(3)
        .map(|dir| dir.join("libhip_emu.so"))
        .collect();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .unwrap_or_else(|| {
            panic!(
                "libhip_emu.so is missing (looked at {candidates:?}): build it with `cargo build -p hip-emu` \
                 (cargo test -p hip-emu builds it too)"
            )
        })
}

/// Set the loader variables (and `extra` emulator variables) once, before anything loads HIP.
/// Every test of a crate must call this first, with the same `extra`.
pub fn setup(extra: &[(&str, &str)]) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let lib = emu_library();
        for var in [
            "HIPK_HIP_LIBRARY",
            "HIPK_HIPBLAS_LIBRARY",
            "HIPK_ROCBLAS_LIBRARY",
        ] {
            std::env::set_var(var, &lib);
        }
        for (k, v) in extra {
            std::env::set_var(k, v);
        }
    });
}

/// The detailed message of this thread's last hip-emu failure.
pub fn last_message() -> String {
    let hip = hip_sys::hip().expect("hip-emu loaded");
    // SAFETY: re-opening the already loaded library only adds a reference; it is leaked.
    let lib = unsafe { hip_sys::libloading::Library::new(hip.path()) }.expect("reopen");
    // SAFETY: hip-emu exports this symbol with this prototype.
    let f = unsafe {
        lib.get::<unsafe extern "C" fn() -> *const std::ffi::c_char>(b"hipemuLastErrorMessage\0")
    }
    .map(|s| *s)
    .expect("hipemuLastErrorMessage exported");
    std::mem::forget(lib);
    // SAFETY: the export returns a NUL-terminated string that lives for the process.
    unsafe { std::ffi::CStr::from_ptr(f()) }
        .to_string_lossy()
        .into_owned()
}

// ---------------------------------------------------------------------------------------------
// Executor tests
// ---------------------------------------------------------------------------------------------

/// One kernel argument as bytes.
pub fn arg<T: Copy>(v: T) -> Vec<u8> {
    let mut b = vec![0u8; std::mem::size_of::<T>()];
    // SAFETY: b has exactly size_of::<T>() bytes; T is Copy plain data.
    unsafe {
        std::ptr::copy_nonoverlapping((&v as *const T).cast::<u8>(), b.as_mut_ptr(), b.len())
    };
    b
}

/// A pointer argument the kernel writes through.
pub fn ptr_mut<T>(p: *mut T) -> Vec<u8> {
    arg(p as usize)
}

/// A pointer argument.
pub fn ptr<T>(p: *const T) -> Vec<u8> {
    arg(p as usize)
}

/// Launch options beyond grid, block and arguments.
#[derive(Clone, Copy, Default)]
pub struct Opts {
    pub dynamic_lds: usize,
    pub static_lds: usize,
    pub max_flat: u32,
    pub seed: Option<u64>,
}

/// The repository's root (the first ancestor of the test's package holding Cargo.lock): sources
/// are named relative to it.
pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or_else(|| panic!("no Cargo.lock above {}", manifest.display()))
        .to_path_buf()
}

/// The host build of the kernel source `rel` (relative to the repository root), compiled once
/// per content (cached under Cargo's target tmp dir) and loaded. `race`: with the race check's
/// instrumentation.
pub fn host_module(rel: &str, race: bool) -> &'static exec::HostModule {
    use std::collections::HashMap;
    use std::sync::Mutex;
    static BUILT: Mutex<Option<HashMap<(String, bool), &'static exec::HostModule>>> =
        Mutex::new(None);
    let mut guard = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    let map = guard.get_or_insert_with(HashMap::new);
    if let Some(m) = map.get(&(rel.to_string(), race)) {
        return m;
    }
    let cxx = hip_build::host::HostCompiler::find().expect("a clang++ >= 15 (see available())");
    let root = repo_root();
    let mut opts = hip_build::host::HostOptions::new(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hipemu-host"),
    );
    opts.source_root = Some(root.clone());
    opts.race = race;
    let object = cxx
        .compile(&root.join(rel), &opts)
        .unwrap_or_else(|e| panic!("host build of {rel}: {e}"));
    let m = exec::host::load(&object.path).unwrap_or_else(|e| panic!("loading {rel}: {e}"));
    map.insert((rel.to_string(), race), m);
    m
}

/// The kernel `name`: `hipemu_test_mc_*` from tests/kernels/mc_tile.hip and the other
/// `hipemu_test_*` and the C++ kernels (mangled symbols, `_Z...`) from tests/kernels/checks.hip
/// (always race-checked),
/// `hipk_test_*` from hip-rt's test kernels, else `<first word>_...` from kernels/<first
/// word>.hip (race-checked with HIPK_EMU_RACE_CHECK=1).
pub fn kernel(name: &str) -> &'static exec::KernelInfo {
    let race_env = std::env::var("HIPK_EMU_RACE_CHECK").is_ok_and(|v| v == "1");
    let (rel, race) = if name.starts_with("hipemu_test_mc_") {
        ("hip-emu/tests/kernels/mc_tile.hip".to_string(), true)
    } else if name.starts_with("hipemu_test_") || name.starts_with("_Z") {
        ("hip-emu/tests/kernels/checks.hip".to_string(), true)
    } else if name.starts_with("hipk_test_") {
        ("hip-rt/kernels/test_kernels.hip".to_string(), race_env)
    } else {
        let family = name.split('_').next().unwrap_or(name);
        (format!("kernels/{family}.hip"), race_env)
    };
    host_module(&rel, race)
        .lookup(name)
        .unwrap_or_else(|| panic!("{name} is not in the host build of {rel}"))
}

/// Runs `name` ([`kernel`]).
pub fn launch(
    name: &str,
    grid: [u32; 3],
    block: [u32; 3],
    args: &[Vec<u8>],
    o: Opts,
) -> Result<(), ExecError> {
    let kernel = kernel(name);
    let params: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    exec::execute(&LaunchSpec {
        kernel,
        grid,
        block,
        dynamic_lds: o.dynamic_lds,
        static_lds: o.static_lds,
        max_flat_workgroup_size: if o.max_flat == 0 { 1024 } else { o.max_flat },
        params: &params,
        block_order_seed: o.seed,
        cooperative: false,
    })
}

/// A one-dimensional launch of `name` (grid × block threads) with the default options.
pub fn launch1(name: &str, grid: u32, block: u32, args: &[Vec<u8>]) -> Result<(), ExecError> {
    launch(name, [grid, 1, 1], [block, 1, 1], args, Opts::default())
}

/// Runs `f` (a launch) on a helper thread and fails if it takes over 60 s: a hang is a failure,
/// not a stuck test run.
pub fn within_a_minute<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(60))
        .expect("the launch hung")
}

/// True when kernels can be compiled for the host (a clang++ >= 15); else prints why the test
/// is skipped.
pub fn available() -> bool {
    match hip_build::host::HostCompiler::find() {
        Ok(_) => true,
        Err(why) => {
            if std::env::var("HIPK_REQUIRE_KERNELS").is_ok_and(|v| v == "1") {
                panic!("HIPK_REQUIRE_KERNELS=1 but hip-emu has no host kernels: {why}");
            }
            eprintln!("skipped: hip-emu has no host kernels ({why})");
            false
        }
    }
}

/// A host buffer of `n` T followed by a PROT_NONE guard page (n * size_of T rounded up to pages
/// is not required: the data ends exactly at the guard).
pub struct Guarded<T> {
    base: *mut u8,
    len: usize,
    pub data: *mut T,
    pub n: usize,
}

impl<T: Copy> Guarded<T> {
    pub fn new(n: usize, fill: T) -> Self {
        let page = 4096;
        let bytes = n * std::mem::size_of::<T>();
        let data_pages = bytes.div_ceil(page).max(1);
        let len = (data_pages + 1) * page;
        // SAFETY: a fresh anonymous mapping; the last page is made inaccessible and the data
        // placed so that it ends at that page.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED);
            let base = base.cast::<u8>();
            assert_eq!(
                libc::mprotect(base.add(data_pages * page).cast(), page, libc::PROT_NONE),
                0
            );
            let data = base.add(data_pages * page - bytes).cast::<T>();
            for i in 0..n {
                data.add(i).write_unaligned(fill);
            }
            Guarded { base, len, data, n }
        }
    }
}

impl<T> Drop for Guarded<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made by new.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
