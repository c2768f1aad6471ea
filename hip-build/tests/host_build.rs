//! The host build for hip-emu on HIP code as people write it: C++ kernels registered under
//! their symbols (templates as instantiated, overloads apart), and what it cannot run (a
//! builtin the shim lacks, inline GCN assembly, `__constant__`) failing the build with its name.
//!
//! Needs a clang++ >= 15; without one each test says so and checks nothing (HIPK_REQUIRE_KERNELS=1,
//! as CI sets, makes that a failure).

use hip_build::host::{HostCompiler, HostError, HostOptions};
use std::path::PathBuf;

fn compiler() -> Option<HostCompiler> {
    match HostCompiler::find() {
        Ok(c) => Some(c),
        Err(e) => {
            let required = std::env::var("HIPK_REQUIRE_KERNELS").is_ok_and(|v| v == "1");
            assert!(!required, "HIPK_REQUIRE_KERNELS=1 but {e}");
            eprintln!("SKIPPED (nothing checked): {e}");
            None
        }
    }
}

/// Compiles `text` as `<name>.hip` in a directory of its own.
fn build(name: &str, text: &str) -> Option<Result<Vec<String>, HostError>> {
    let cxx = compiler()?;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("host-build-{name}"));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let src = dir.join(format!("{name}.hip"));
    std::fs::write(&src, text).expect("writing the source");
    let opts = HostOptions::new(dir.join("cache"));
    Some(cxx.compile(&src, &opts).map(|o| o.kernels))
}

fn failure(name: &str, text: &str) -> Option<String> {
    match build(name, text)? {
        Ok(k) => panic!("{name} built (kernels {k:?})"),
        Err(e) => Some(e.to_string()),
    }
}

#[test]
fn cpp_kernels_are_registered_under_their_symbols() {
    let src = r#"
#include <hip/hip_runtime.h>
template <unsigned TILE> __global__ void mm(const float* a, float* b) { b[0] = a[0] * TILE; }
template __global__ void mm<16>(const float*, float*);
template <typename T> __global__ void fill(T* x) { x[threadIdx.x] = T(1); }
void launch(int* x, hipStream_t s) { hipLaunchKernelGGL(fill<int>, dim3(1), dim3(64), 0, s, x); }
__global__ void scale(float* x) { x[0] *= 2; }
__global__ void scale(double* x) { x[0] *= 2; }
namespace ns { __global__ void k(float4* v) { v[0] = v[0] + v[0]; } }
extern "C" __global__ void c_kernel(int* x) { x[0] = 1; }
static __global__ void hidden(int* x) { x[0] = 2; }
__global__ void unused_template_is_not_a_kernel_until_instantiated(int*);
"#;
    let Some(kernels) = build("cpp_kernels", src) else {
        return;
    };
    let mut kernels = kernels.expect("the host build");
    kernels.sort();
    assert_eq!(
        kernels,
        [
            "_Z2mmILj16EEvPKfPf",
            "_Z4fillIiEvPT_",
            "_Z5scalePd",
            "_Z5scalePf",
            "_ZN2ns1kEP15HIP_vector_typeIfLj4EE",
            "c_kernel",
        ]
    );
}

#[test]
fn a_builtin_the_shim_lacks_fails_the_build_naming_it() {
    let src = r#"
#include <hip/hip_runtime.h>
__global__ void sleepy(int* x) { __builtin_amdgcn_s_sleep(2); x[0] = __ockl_activelane_u32(); }
"#;
    let Some(e) = failure("missing_builtin", src) else {
        return;
    };
    assert!(e.contains("__builtin_amdgcn_s_sleep"), "{e}");
}

#[test]
fn inline_gcn_assembly_fails_the_build_saying_so() {
    let src = r#"
#include <hip/hip_runtime.h>
__global__ void nop(int* x) { asm volatile("s_nop 0"); x[0] = 1; }
"#;
    let Some(e) = failure("inline_asm", src) else {
        return;
    };
    assert!(e.contains("inline GCN assembly"), "{e}");
}

#[test]
fn the_hipcc_platform_macros_are_defined_before_any_include() {
    let src = r#"
#if !defined(__HIP_PLATFORM_AMD__) || !defined(__HIP__) || !defined(__gfx906__) || __AMDGCN_WAVEFRONT_SIZE != 64
#error "not the AMD gfx906 path"
#endif
#include <hip/hip_runtime.h>
__global__ void k(int* x) { x[0] = warpSize; }
"#;
    let Some(kernels) = build("platform", src) else {
        return;
    };
    assert_eq!(kernels.expect("the AMD path builds"), ["_Z1kPi"]);
}
