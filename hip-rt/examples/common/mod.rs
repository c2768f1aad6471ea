//! Shared by the numbered examples: open device 0 or explain why not and exit non-zero.
#![allow(dead_code)]

use hip_rt::Device;

/// Exit status when no usable device exists.
pub const NO_DEVICE_EXIT: i32 = 2;

/// Device 0, or a diagnosis on stderr and `exit(2)`.
pub fn device_or_exit() -> Device {
    match hip_sys::hip() {
        Ok(hip) => {
            let version = hip
                .runtime_version()
                .map(|v| v.to_string())
                .unwrap_or_else(|e| format!("unknown ({e})"));
            eprintln!(
                "HIP runtime: {} (version {version}, {:?})",
                hip.path().display(),
                hip.flavour()
            );
        }
        Err(e) => fail("no HIP runtime library could be loaded", &e),
    }
    match Device::get(0) {
        Ok(d) => d,
        Err(e) if e.is_no_device() => fail("the HIP runtime loaded, but it sees no device", &e),
        Err(e) => fail("device 0 could not be opened", &e),
    }
}

/// Print `what` and the error, then exit with [`NO_DEVICE_EXIT`].
pub fn fail(what: &str, err: &dyn std::fmt::Display) -> ! {
    eprintln!("error: {what}:\n  {err}");
    std::process::exit(NO_DEVICE_EXIT)
}

/// Unwrap or print the error and exit 1 (failures after the device opened).
pub fn check<T, E: std::fmt::Display>(what: &str, r: Result<T, E>) -> T {
    r.unwrap_or_else(|e| {
        eprintln!("error: {what}: {e}");
        std::process::exit(1)
    })
}
