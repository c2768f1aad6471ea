//! Shared by hip-emu's runtime tests: point hip-sys at the freshly built libhip_emu.so.
#![allow(dead_code)] // each test crate uses a different part

use std::path::PathBuf;
use std::sync::Once;

/// target/<profile>/libhip_emu.so, found from the test binary (target/<profile>/deps/<test>).
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
