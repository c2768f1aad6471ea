//! Modules and launches on hip-emu through hip-rt: the real gfx906 code object of the test
//! kernels (hip-emu/tests/kernels/checks.hip, built with hipcc), its metadata, correct launches,
//! and every kind of bad launch reaching Rust as a typed error naming the kernel.
//!
//! Needs hipcc (to build the code object) and the kernels' host build (clang++ >= 15); without
//! either it prints why and checks nothing else (a fresh clone without ROCm still passes).

mod checks_image;
#[path = "../../tests/common/mod.rs"]
mod common;
mod overrun;

use hip_rt::{DeviceBuffer, DevicePtr, LaunchConfig, Module, Stream, StreamOptions};
use hip_sys::hipError_t;

/// The checks.hip code object built by hipcc, or why it cannot be.
fn code_object() -> Result<Vec<u8>, String> {
    static IMAGE: std::sync::OnceLock<Result<Vec<u8>, String>> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| checks_image::build("launch", true, common::repo_root()))
        .clone()
}

struct Setup {
    stream: Stream,
    module: Module,
    /// Held for the whole test: a fault (deliberate in some tests) is sticky for the device, as
    /// on a GPU, and the canary check after a launch looks at every allocation, so tests that
    /// share device 0 in this process must not overlap.
    _serial: std::sync::MutexGuard<'static, ()>,
}

fn setup() -> Option<Setup> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let serial = SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Two devices: device 1 only serves the peer-access test.
    common::setup(&[("HIPK_EMU_DEVICES", "2")]);
    let image = match code_object() {
        Ok(image) => image,
        Err(why) => {
            eprintln!("SKIPPED (nothing checked): {why}");
            return None;
        }
    };
    let dev = hip_rt::Device::get_direct(0).unwrap();
    let module = Module::load(&dev, &image).expect("hip-emu loads the hipcc bundle");
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    Some(Setup {
        stream,
        module,
        _serial: serial,
    })
}

fn cfg(grid: u32, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (grid, 1, 1),
        block: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[test]
fn metadata_attributes_and_a_correct_launch() {
    let Some(Setup {
        stream,
        module,
        _serial,
    }) = setup()
    else {
        return;
    };
    assert_eq!(module.target_ids(), &["gfx906".to_owned()]);
    assert!(module
        .kernel_names()
        .iter()
        .any(|k| k == "hipemu_test_reverse"));
    let reverse = module.function("hipemu_test_reverse").unwrap();
    // buf[1024] ints of static LDS: the 64 KiB minus 4096 is what a launch may add.
    assert_eq!(reverse.limits().shared_mem_per_block, 65536 - 4096);
    assert_eq!(reverse.limits().max_threads_per_block, 1024);
    let input: Vec<i32> = (0..512).collect();
    let d_in = DeviceBuffer::from_slice(&stream, &input).unwrap();
    let mut d_out = DeviceBuffer::<i32>::alloc(&stream, 512).unwrap();
    // SAFETY: (const int* in, int* out), 2 blocks of 256 over 512 ints.
    unsafe {
        stream
            .launch_builder(&reverse)
            .arg(&d_in)
            .arg_mut(&mut d_out)
            .launch(&cfg(2, 256))
    }
    .unwrap();
    let out = d_out.to_vec(&stream).unwrap();
    let want: Vec<i32> = (0..512).map(|i| (i / 256) * 256 + 255 - i % 256).collect();
    assert_eq!(out, want);
    let err = module.function("not_a_kernel").unwrap_err();
    assert!(matches!(err, hip_rt::Error::KernelNotFound { .. }), "{err}");
}

#[test]
fn wrong_argument_count_size_and_freed_pointers_name_the_kernel() {
    let Some(Setup {
        stream,
        module,
        _serial,
    }) = setup()
    else {
        return;
    };
    let reverse = module.function("hipemu_test_reverse").unwrap();
    let d_in = DeviceBuffer::<i32>::zeroed(&stream, 256).unwrap();
    // SAFETY: (all three) rejected by hip-emu before anything runs.
    let err = unsafe {
        stream
            .launch_builder(&reverse)
            .arg(&d_in)
            .launch(&cfg(1, 256))
    }
    .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, hip_rt::Error::LaunchFailed { kernel, .. } if kernel == "hipemu_test_reverse"),
        "{err:?}"
    );
    assert_eq!(err.hip_code(), Some(hipError_t::hipErrorInvalidValue));
    assert!(
        text.contains("takes 2 argument(s)") && text.contains("passes 1"),
        "{text}"
    );
    // SAFETY: as above.
    let err = unsafe {
        stream
            .launch_builder(&reverse)
            .arg(&d_in)
            .value(7i32)
            .launch(&cfg(1, 256))
    }
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("argument 1 (global_buffer) is 8 bytes but the launch passes 4"),
        "{text}"
    );
    let freed = DeviceBuffer::<i32>::zeroed(&stream, 256)
        .unwrap()
        .device_ptr();
    // SAFETY: as above.
    let err = unsafe {
        stream
            .launch_builder(&reverse)
            .arg(&d_in)
            .value(freed)
            .launch(&cfg(1, 256))
    }
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("hipemu_test_reverse") && text.contains("use after free"),
        "{text}"
    );
    // A null pointer is allowed (the kernel decides), an address in no allocation is not.
    // SAFETY: as above.
    let err = unsafe {
        stream
            .launch_builder(&reverse)
            .arg(&d_in)
            .value(DevicePtr(0x1000))
            .launch(&cfg(1, 256))
    }
    .unwrap_err();
    assert!(err.to_string().contains("not in any allocation"), "{err}");
}

#[test]
fn out_of_bounds_writes_and_reads_fault_at_the_next_synchronize() {
    let Some(Setup {
        stream,
        module,
        _serial,
    }) = setup()
    else {
        return;
    };
    let ids = module.function("hipemu_test_ids").unwrap();
    // 60 u32 = 240 bytes: threads 60..63 write into the 16 bytes of slack (the overrun
    // check), thread 64 and up past the rounded end into the guard page.
    for (threads, what) in [
        (64, "out-of-bounds write of 4 bytes"),
        (128, "past the end of allocation"),
    ] {
        let mut out = DeviceBuffer::<u32>::alloc(&stream, 60).unwrap();
        // SAFETY: deliberately out of bounds; hip-emu catches it (canary / guard page).
        unsafe {
            stream
                .launch_builder(&ids)
                .arg_mut(&mut out)
                .launch(&cfg(1, threads))
        }
        .unwrap();
        let err = stream.synchronize().unwrap_err();
        assert_eq!(
            err.hip_code(),
            Some(hipError_t::hipErrorIllegalAddress),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.contains("hipemu_test_ids") && text.contains(what),
            "{threads} threads: {text}"
        );
        stream.synchronize().expect("a fault is reported once");
    }
    let read = module.function("hipemu_test_read").unwrap();
    let p = DeviceBuffer::<f32>::zeroed(&stream, 64).unwrap();
    let mut sum = DeviceBuffer::<f32>::zeroed(&stream, 1).unwrap();
    // SAFETY: reads 100000 floats from a 64-float buffer: the guard page stops it.
    unsafe {
        stream
            .launch_builder(&read)
            .arg(&p)
            .value(100_000i64)
            .arg_mut(&mut sum)
            .launch(&cfg(1, 64))
    }
    .unwrap();
    let err = stream.synchronize().unwrap_err();
    assert!(err.to_string().contains("hipemu_test_read"), "{err}");
    // The emulator (unlike a real device) carries on: a correct launch still works.
    // SAFETY: reads the 64 floats it has.
    unsafe {
        stream
            .launch_builder(&read)
            .arg(&p)
            .value(64i64)
            .arg_mut(&mut sum)
            .launch(&cfg(1, 64))
    }
    .unwrap();
    assert_eq!(sum.to_vec(&stream).unwrap(), vec![0.0]);
}

/// The race check's build checks the overrun shadow too: the same one-element overruns are
/// reported, with the direct and with the caching allocator.
#[test]
fn one_element_overruns_are_reported_in_race_check_builds() {
    let Some(Setup {
        stream,
        module,
        _serial,
    }) = setup()
    else {
        return;
    };
    overrun::read_modify_write_overruns(&stream, &module, "race-check build, direct");
    overrun::read_overruns(&stream, &module, "race-check build, direct");
    let dev = hip_rt::Device::get(0).unwrap();
    let module = Module::load(&dev, &code_object().unwrap()).unwrap();
    let stream = Stream::new(&dev, StreamOptions::default()).unwrap();
    overrun::read_modify_write_overruns(&stream, &module, "race-check build, caching");
    overrun::read_overruns(&stream, &module, "race-check build, caching");
}

#[test]
fn bad_configurations_and_barrier_misuse_are_errors() {
    let Some(Setup {
        stream,
        module,
        _serial,
    }) = setup()
    else {
        return;
    };
    let d = DeviceBuffer::<i32>::zeroed(&stream, 4096).unwrap();
    let mut o = DeviceBuffer::<i32>::zeroed(&stream, 4096).unwrap();
    // hip-rt checks limits before calling HIP; call the runtime directly to see hip-emu's checks.
    let mut args = hip_rt::KernelArgs::new();
    args.arg(&d).arg_mut(&mut o);
    let raw = hip_sys::sym!(hipModuleLaunchKernel).unwrap();
    // hip-rt keeps its function handle private: load the image again through the C API.
    let (load, get) = (
        hip_sys::sym!(hipModuleLoadData).unwrap(),
        hip_sys::sym!(hipModuleGetFunction).unwrap(),
    );
    let (mut m, mut func) = (std::ptr::null_mut(), std::ptr::null_mut());
    let image = code_object().unwrap();
    // SAFETY: a complete bundle; valid out-pointers; a NUL-terminated name.
    unsafe {
        load(&mut m, image.as_ptr().cast()).result().unwrap();
        get(&mut func, m, c"hipemu_test_reverse".as_ptr())
            .result()
            .unwrap();
    }
    for (block, lds, needle) in [
        (2048u32, 0u32, "2048 threads exceeds the limit of 1024"),
        (256, 65536, "4096 bytes of static LDS + 65536 dynamic"),
    ] {
        // SAFETY: the argument array matches the kernel; hip-emu rejects the configuration.
        let status = unsafe {
            raw(
                func,
                1,
                1,
                1,
                block,
                1,
                1,
                lds,
                stream.raw(),
                args.as_param_array(),
                std::ptr::null_mut(),
            )
        };
        let err = status.result().unwrap_err().to_string();
        assert!(
            err.contains("hipErrorInvalidValue")
                && err.contains("hipemu_test_reverse")
                && err.contains(needle),
            "{err}"
        );
    }
    let divergent = module.function("hipemu_test_barrier_divergence").unwrap();
    // SAFETY: writes 64 ints of a 4096-int buffer.
    unsafe {
        stream
            .launch_builder(&divergent)
            .arg_mut(&mut o)
            .launch(&cfg(1, 64))
    }
    .unwrap();
    let err = stream.synchronize().unwrap_err();
    assert_eq!(
        err.hip_code(),
        Some(hipError_t::hipErrorLaunchFailure),
        "{err}"
    );
    assert!(
        err.to_string().contains("hipemu_test_barrier_divergence"),
        "{err}"
    );
}

/// A kernel on device 0 given device 1's memory: refused until device 0 enables peer access to
/// device 1 (a real device would fault or read garbage), then it runs.
#[test]
fn a_pointer_into_another_device_needs_peer_access() {
    let Some(Setup {
        stream,
        module,
        _serial,
    }) = setup()
    else {
        return;
    };
    let reverse = module.function("hipemu_test_reverse").unwrap();
    let dev0 = hip_rt::Device::get_direct(0).unwrap();
    let dev1 = hip_rt::Device::get_direct(1).unwrap();
    let s1 = Stream::new(&dev1, StreamOptions::default()).unwrap();
    let input: Vec<i32> = (0..256).collect();
    let d_in = DeviceBuffer::from_slice(&s1, &input).unwrap();
    let mut d_out = DeviceBuffer::<i32>::zeroed(&stream, 256).unwrap();
    // SAFETY: (const int* in, int* out), one block of 256; the input lives on device 1.
    let launch = |d_out: &mut DeviceBuffer<i32>| unsafe {
        stream
            .launch_builder(&reverse)
            .arg(&d_in)
            .arg_mut(d_out)
            .launch(&cfg(1, 256))
    };
    let err = launch(&mut d_out).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("argument 0")
            && text.contains("device 1")
            && text.contains("hipDeviceEnablePeerAccess(1, 0) on device 0"),
        "{text}"
    );
    dev0.enable_peer_access(&dev1).unwrap();
    launch(&mut d_out).unwrap();
    let want: Vec<i32> = (0..256).rev().collect();
    assert_eq!(d_out.to_vec(&stream).unwrap(), want);
    dev0.disable_peer_access(&dev1).unwrap();
    assert!(launch(&mut d_out).is_err(), "disabled again");
}
