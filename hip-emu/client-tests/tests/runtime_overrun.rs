//! hip-emu's overrun check through hip-rt: a kernel that reads or read-modify-writes one
//! element past a buffer is reported by the launch, every time, for buffers of the direct
//! allocator and of the caching allocator (blocks of exactly 512·k bytes included). The test
//! kernels' host build is the ordinary one (the overrun check's instrumentation); the race
//! check's build is covered by runtime_launch.rs.
//!
//! Needs hipcc (to build the code object) and clang++ >= 15; without either it prints why and
//! checks nothing else.

mod checks_image;
#[path = "../../tests/common/mod.rs"]
mod common;
mod overrun;

use hip_rt::{Device, Module, Stream, StreamOptions};

/// The checks.hip code object built by hipcc (its host build installed), or why it cannot be.
fn code_object() -> Result<Vec<u8>, String> {
    static IMAGE: std::sync::OnceLock<Result<Vec<u8>, String>> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| checks_image::build("overrun", false, common::repo_root()))
        .clone()
}

/// A stream and the test kernels on device 0 with the direct allocator (`caching` false) or
/// the process's caching allocator; the guard serialises the tests (a fault is sticky for the
/// device until reported).
fn setup(caching: bool) -> Option<(Stream, Module, std::sync::MutexGuard<'static, ()>)> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    common::setup(&[]);
    let image = match code_object() {
        Ok(image) => image,
        Err(why) => {
            eprintln!("SKIPPED (nothing checked): {why}");
            return None;
        }
    };
    let dev = if caching {
        Device::get(0)
    } else {
        Device::get_direct(0)
    }
    .unwrap();
    let module = Module::load(&dev, &image).expect("hip-emu loads the hipcc bundle");
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    Some((stream, module, serial))
}

#[test]
fn read_modify_write_overruns_are_reported_every_time_direct() {
    let Some((stream, module, _serial)) = setup(false) else {
        return;
    };
    overrun::read_modify_write_overruns(&stream, &module, "direct allocator");
}

#[test]
fn read_modify_write_overruns_are_reported_every_time_in_cached_blocks() {
    let Some((stream, module, _serial)) = setup(true) else {
        return;
    };
    overrun::read_modify_write_overruns(&stream, &module, "caching allocator");
}

#[test]
fn one_element_read_overruns_are_reported() {
    for caching in [false, true] {
        let Some((stream, module, _serial)) = setup(caching) else {
            return;
        };
        let context = if caching {
            "caching allocator"
        } else {
            "direct allocator"
        };
        overrun::read_overruns(&stream, &module, context);
    }
}
