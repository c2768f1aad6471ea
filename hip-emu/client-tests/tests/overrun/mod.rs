//! One-element overruns that hip-emu must report on every launch, whatever the buffers hold
//! and however they were allocated (shared by runtime_overrun.rs, whose host build has the
//! overrun check's instrumentation, and runtime_launch.rs, whose host build has the race
//! check's, which checks the same shadow).

use hip_rt::{DeviceBuffer, LaunchConfig, Module, Stream};
use hip_sys::hipError_t;

/// Lengths in floats: blocks of exactly 512·k bytes (128, 256, 1024 floats: a caching
/// allocator's block then ends where the next one begins), lengths whose allocation ends at a
/// guard page (64, 2048) and lengths with slack after them.
const LENGTHS: [usize; 10] = [128, 256, 1024, 100, 37, 1000, 64, 2048, 129, 511];

fn cfg(threads: usize) -> LaunchConfig {
    let block = 256u32;
    LaunchConfig {
        grid: ((threads as u32).div_ceil(block), 1, 1),
        block: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Floats a kernel cannot change without the change showing in the bytes... or so one would
/// think: huge values, NaNs and infinities, which `a * x + y` leaves bit for bit as they were.
fn values(trial: usize, n: usize) -> Vec<f32> {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        3.0e38,
        -1.0e30,
        f32::from_bits(0xFFFF_FFFF),
    ];
    let mut s = (trial as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let r = (s >> 33) as usize;
            if r % 3 == 0 {
                specials[r % specials.len()]
            } else {
                (r % 1000) as f32 * 0.25
            }
        })
        .collect()
}

/// Synchronises and checks the error names the kernel, the kind of access and the buffer.
fn expect_overrun(stream: &Stream, kernel: &str, bytes: usize, context: &str) {
    let err = stream
        .synchronize()
        .expect_err(&format!("{context}: the overrun went unreported"));
    assert_eq!(
        err.hip_code(),
        Some(hipError_t::hipErrorIllegalAddress),
        "{context}: {err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(kernel)
            && text.contains("0 bytes past the end of allocation")
            && text.contains(&format!("{bytes} bytes")),
        "{context}: {text}"
    );
    stream
        .synchronize()
        .unwrap_or_else(|e| panic!("{context}: the fault is reported once: {e}"));
}

/// `y[i] = a * x[i] + y[i]` for i <= n over y of n floats, 20 times with other lengths and
/// values: reported every time.
pub fn read_modify_write_overruns(stream: &Stream, module: &Module, context: &str) {
    let axpy = module.function("hipemu_test_axpy_overrun").unwrap();
    for trial in 0..20 {
        let n = LENGTHS[trial % LENGTHS.len()];
        let x = DeviceBuffer::from_slice(stream, &values(trial + 100, n + 1)).unwrap();
        let mut y = DeviceBuffer::from_slice(stream, &values(trial, n)).unwrap();
        let a = [0.0f32, 1.0, -2.5, 1.0e-30][trial % 4];
        // SAFETY: deliberately one element past y; hip-emu reports it.
        unsafe {
            stream
                .launch_builder(&axpy)
                .value(a)
                .arg(&x)
                .arg_mut(&mut y)
                .value(n as i32)
                .launch(&cfg(n + 1))
        }
        .unwrap();
        let context = format!("{context}, trial {trial}, n {n}");
        expect_overrun(stream, "hipemu_test_axpy_overrun", 4 * n, &context);
    }
}

/// A read of one float past a buffer of n floats (nothing written out of bounds).
pub fn read_overruns(stream: &Stream, module: &Module, context: &str) {
    let read = module.function("hipemu_test_read").unwrap();
    for &n in &LENGTHS {
        let p = DeviceBuffer::from_slice(stream, &values(n, n)).unwrap();
        let mut sum = DeviceBuffer::<f32>::zeroed(stream, 1).unwrap();
        // SAFETY: deliberately reads n + 1 floats of n; hip-emu reports it.
        unsafe {
            stream
                .launch_builder(&read)
                .arg(&p)
                .value(n as i64 + 1)
                .arg_mut(&mut sum)
                .launch(&cfg(1))
        }
        .unwrap();
        expect_overrun(
            stream,
            "hipemu_test_read",
            4 * n,
            &format!("{context}, n {n}"),
        );
    }
}
