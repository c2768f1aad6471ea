//! Every program of the corpus (kernels/*.hip: plain C++ `__global__` kernels, not `extern "C"`)
//! run on hip-emu through hip-rt, each checked against a CPU result computed here. The kernels
//! are looked up by their demangled names (`saxpy_kernel`, `matrix_multiplication_kernel<16u>`,
//! `scale(double*)`) and by the constants hip-build generated.
//!
//! Needs the kernels (hipcc and a clang++ >= 15 at build time); without them each test says
//! why and checks nothing, unless HIPK_REQUIRE_KERNELS=1 (as CI sets), which makes that a
//! failure.

use hip_emu_corpus::{bundle, kernel_names};
use hip_rt::{DeviceBuffer, Function, LaunchConfig, Module, Stream, StreamOptions};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, Once};

mod cases;

/// libhip_emu.so, built by Cargo next to this test binary (hip-emu is a dev-dependency).
fn emu_library() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("libhip_emu.so"))
        .find(|p| p.is_file())
        .expect("libhip_emu.so next to the test binary (cargo builds it for this crate)")
}

/// A stream on hip-emu's device 0; tests run one at a time (hip-emu checks every buffer's
/// guard after each launch, so one test's deliberate fault must not meet another's launch).
pub struct Emu {
    pub stream: Stream,
    _serial: MutexGuard<'static, ()>,
}

pub fn emu() -> Option<Emu> {
    static SERIAL: Mutex<()> = Mutex::new(());
    static ONCE: Once = Once::new();
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    ONCE.call_once(|| {
        let lib = emu_library();
        for var in [
            "HIPK_HIP_LIBRARY",
            "HIPK_HIPBLAS_LIBRARY",
            "HIPK_ROCBLAS_LIBRARY",
        ] {
            std::env::set_var(var, &lib);
        }
    });
    if let Err(why) = bundle("vector_add") {
        let required = std::env::var("HIPK_REQUIRE_KERNELS").is_ok_and(|v| v == "1");
        assert!(!required, "HIPK_REQUIRE_KERNELS=1 but: {why}");
        eprintln!("SKIPPED (nothing checked): {why}");
        return None;
    }
    let device = hip_rt::Device::get_direct(0).expect("hip-emu's device 0");
    let stream = Stream::new(&device, StreamOptions::default()).expect("a stream");
    Some(Emu {
        stream,
        _serial: serial,
    })
}

impl Emu {
    /// kernels/`source`.hip, loaded.
    pub fn module(&self, source: &str) -> Module {
        let image = bundle(source).expect("the corpus is built");
        Module::load(self.stream.device(), image).expect("hip-emu loads the bundle")
    }

    /// The kernel `name` of kernels/`source`.hip.
    pub fn kernel(&self, source: &str, name: &str) -> Function {
        self.module(source)
            .function(name)
            .unwrap_or_else(|e| panic!("{source}: {name}: {e}"))
    }

    /// The error of looking `name` up in kernels/`source`.hip.
    pub fn kernel_err(&self, source: &str, name: &str) -> String {
        let image = bundle(source).expect("the corpus is built");
        let module = Module::load(self.stream.device(), image).expect("hip-emu loads the bundle");
        match module.function(name) {
            Ok(_) => panic!("{source}: `{name}` was found"),
            Err(e) => e.to_string(),
        }
    }

    pub fn upload<T: hip_rt::Element>(&self, data: &[T]) -> DeviceBuffer<T> {
        DeviceBuffer::from_slice(&self.stream, data).expect("upload")
    }

    pub fn download<T: hip_rt::Element>(&self, buf: &DeviceBuffer<T>) -> Vec<T> {
        buf.to_vec(&self.stream).expect("download")
    }
}

/// A 1-D launch of `blocks` × `threads` with `lds` bytes of dynamic LDS.
pub fn cfg(blocks: u32, threads: u32, lds: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
        shared_mem_bytes: lds,
    }
}

/// Deterministic inputs in [-1, 1).
pub fn inputs(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 23) as f32 - 1.0
        })
        .collect()
}

pub fn assert_close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(*g) - w).abs() <= tol * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

#[test]
fn generated_constants_name_cpp_kernels_readably() {
    assert_eq!(
        kernel_names::matmul_tiled::MATRIX_MULTIPLICATION_KERNEL_16U,
        "_Z28matrix_multiplication_kernelILj16EEvPKfS1_Pfiii"
    );
    assert_eq!(kernel_names::overloads::SCALE_FLOAT_INT, "_Z5scalePfi");
    assert_eq!(kernel_names::overloads::SCALE_DOUBLE_INT, "_Z5scalePdi");
    assert_eq!(
        kernel_names::namespaced::PHYSICS_INTEGRATE,
        "_ZN7physics9integrateENS_6ParamsEPfS1_"
    );
    assert_eq!(
        kernel_names::moving_average::MOVING_AVERAGE_5,
        "_Z14moving_averageILi5EEvPKfPfi"
    );
}
