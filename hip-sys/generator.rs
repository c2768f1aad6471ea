//! The one bindgen generator for hip-sys, shared by `cargo run -p xtask -- bindings` (which writes
//! the checked-in `hip-sys/src/generated/hip_runtime.rs`) and by `hip-sys/build.rs` under the
//! `bindgen` feature (which regenerates against `$ROCM_PATH/include`). Both `#[path]`-include this
//! file, so the allowlists below are the single source of truth.
//!
//! Output: a dynamic-loading table `HipApi` (bindgen's `dynamic_library_name`) whose pub fields are
//! `Result<unsafe extern "C" fn(..), libloading::Error>`; status and flag enums as newtypes over
//! the C integer; macro constants for stream/event/host-memory flags.

use std::path::Path;

/// File name of the generated runtime bindings, inside `hip-sys/src/generated/` or `OUT_DIR`.
pub const HIP_RUNTIME_FILE: &str = "hip_runtime.rs";

/// Name of the generated dynamic-loading struct.
pub const HIP_API_STRUCT: &str = "HipApi";

/// Runtime functions hip-sys binds. Grouped as in issue 2: init and versions; devices; memory;
/// copies and sets; streams; events; modules and launch; errors; peer access; stream capture
/// and graphs (issue 35).
pub const HIP_FUNCTIONS: &[&str] = &[
    // init, versions
    "hipInit",
    "hipDriverGetVersion",
    "hipRuntimeGetVersion",
    // devices
    "hipGetDeviceCount",
    "hipSetDevice",
    "hipGetDevice",
    "hipSetDeviceFlags",
    "hipGetDeviceProperties",
    "hipGetDevicePropertiesR0600",
    "hipDeviceGetAttribute",
    "hipDeviceGetName",
    "hipDeviceGetPCIBusId",
    "hipDeviceTotalMem",
    "hipDeviceGetStreamPriorityRange",
    "hipMemGetInfo",
    "hipDeviceSynchronize",
    "hipDeviceReset",
    // memory
    "hipMalloc",
    "hipFree",
    "hipHostMalloc",
    "hipHostFree",
    "hipHostRegister",
    "hipHostUnregister",
    "hipHostGetDevicePointer",
    "hipMallocAsync",
    "hipFreeAsync",
    "hipPointerGetAttributes",
    // copies and sets
    "hipMemcpy",
    "hipMemcpyAsync",
    "hipMemcpyHtoD",
    "hipMemcpyDtoH",
    "hipMemcpyDtoD",
    "hipMemcpyHtoDAsync",
    "hipMemcpyDtoHAsync",
    "hipMemcpyDtoDAsync",
    "hipMemset",
    "hipMemsetAsync",
    "hipMemsetD8",
    "hipMemsetD8Async",
    "hipMemsetD16",
    "hipMemsetD16Async",
    "hipMemsetD32",
    "hipMemsetD32Async",
    // streams
    "hipStreamCreate",
    "hipStreamCreateWithFlags",
    "hipStreamCreateWithPriority",
    "hipStreamDestroy",
    "hipStreamSynchronize",
    "hipStreamQuery",
    "hipStreamWaitEvent",
    "hipStreamGetFlags",
    "hipStreamGetPriority",
    // events
    "hipEventCreate",
    "hipEventCreateWithFlags",
    "hipEventRecord",
    "hipEventSynchronize",
    "hipEventQuery",
    "hipEventElapsedTime",
    "hipEventDestroy",
    // modules and launch
    "hipModuleLoadData",
    "hipModuleLoadDataEx",
    "hipModuleGetFunction",
    "hipModuleGetGlobal",
    "hipModuleUnload",
    "hipModuleLaunchKernel",
    "hipFuncGetAttribute",
    "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor",
    "hipModuleOccupancyMaxPotentialBlockSize",
    "hipOccupancyMaxPotentialBlockSize",
    "hipLaunchCooperativeKernel",
    // module variables by host symbol
    "hipMemcpyToSymbol",
    "hipMemcpyToSymbolAsync",
    "hipMemcpyFromSymbol",
    "hipMemcpyFromSymbolAsync",
    "hipGetSymbolAddress",
    "hipGetSymbolSize",
    // errors
    "hipGetLastError",
    "hipPeekAtLastError",
    "hipGetErrorName",
    "hipGetErrorString",
    // peer access
    "hipDeviceCanAccessPeer",
    "hipDeviceEnablePeerAccess",
    "hipDeviceDisablePeerAccess",
    "hipMemcpyPeer",
    "hipMemcpyPeerAsync",
    // stream capture and graphs (HIP >= 4.3; a runtime without them leaves the fields `Err`)
    "hipStreamBeginCapture",
    "hipStreamEndCapture",
    "hipStreamIsCapturing",
    "hipGraphDestroy",
    "hipGraphGetNodes",
    "hipGraphInstantiate",
    "hipGraphLaunch",
    "hipGraphExecDestroy",
    "hipGraphExecUpdate",
];

/// Types bound beyond those the functions pull in. `hipDeviceProp_t` is the header's own
/// unversioned struct (the legacy R0000 layout in 5.x headers): bindgen's layout assertions on it
/// are what the hand-written legacy offset table in `props` is checked against.
pub const HIP_TYPES: &[&str] = &["hipDeviceProp_t", "hipDeviceAttribute_t", "hipMemoryType"];

/// Macro constants bound: stream, event, host-memory and device flags, and the header version.
pub const HIP_VARS: &[&str] = &[
    "hipStream(Default|NonBlocking)",
    "hipEvent(Default|BlockingSync|DisableTiming|Interprocess)",
    "hipHostMalloc(Default|Portable|Mapped|WriteCombined|Coherent|NonCoherent)",
    "hipHostRegister(Default|Portable|Mapped|IoMemory)",
    "hipDeviceSchedule(Auto|Spin|Yield|BlockingSync|Mask)",
    "hipDeviceMapHost",
    "HIP_VERSION_(MAJOR|MINOR|PATCH)",
];

/// The header bindgen parses. ROCm >= 6 headers `#define hipGetDeviceProperties
/// hipGetDevicePropertiesR0600` (and `hipDeviceProp_t` to `hipDeviceProp_tR0600`), which would
/// hide the unversioned export (which still fills the legacy struct); 5.x headers do not declare
/// `hipGetDevicePropertiesR0600` at all. Declaring whichever is missing, with an untyped buffer,
/// makes both symbols fields of `HipApi` whatever headers are used; hip-sys passes a byte buffer
/// to either and decodes it per layout.
pub const HIP_WRAPPER_HEADER: &str = r#"#include <hip/hip_version.h>
#include <hip/hip_runtime_api.h>
#ifdef hipGetDeviceProperties
#undef hipGetDeviceProperties
hipError_t hipGetDeviceProperties(void* prop, int deviceId);
#endif
#if !defined(HIP_VERSION_MAJOR) || HIP_VERSION_MAJOR < 6
hipError_t hipGetDevicePropertiesR0600(void* prop, int deviceId);
#endif
"#;

/// First lines of every generated file.
const PREAMBLE: &str =
    "// @generated by hip-sys/generator.rs (`cargo run -p xtask -- bindings`).\n\
// Do not edit by hand: change the generator's allowlists and regenerate.\n";

/// The configured bindgen builder for the HIP runtime, reading headers from `include_dir`
/// (the directory that contains `hip/hip_runtime_api.h`).
pub fn hip_runtime_builder(include_dir: &Path) -> bindgen::Builder {
    let mut builder = bindgen::Builder::default()
        .header_contents("hipk_wrapper.h", HIP_WRAPPER_HEADER)
        .clang_args(["-x", "c", "-D__HIP_PLATFORM_AMD__"])
        .clang_arg(format!("-I{}", include_dir.display()))
        .dynamic_library_name(HIP_API_STRUCT)
        .dynamic_link_require_all(false)
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .derive_default(true)
        .derive_eq(true)
        .derive_hash(true)
        .generate_comments(false)
        .layout_tests(true)
        .formatter(bindgen::Formatter::Prettyplease)
        .raw_line(PREAMBLE.trim_end());
    for f in HIP_FUNCTIONS {
        builder = builder.allowlist_function(f);
    }
    for t in HIP_TYPES {
        builder = builder.allowlist_type(t);
    }
    for v in HIP_VARS {
        builder = builder.allowlist_var(v);
    }
    builder
}

/// Generate the runtime bindings as Rust source text.
pub fn generate_hip_runtime(include_dir: &Path) -> Result<String, String> {
    let header = include_dir.join("hip/hip_runtime_api.h");
    if !header.is_file() {
        return Err(format!(
            "HIP header {} not found: install the HIP headers (Debian: `apt-get install libamdhip64-dev`) or point ROCM_PATH at an install",
            header.display()
        ));
    }
    let bindings = hip_runtime_builder(include_dir)
        .generate()
        .map_err(|e| format!("bindgen failed on {}: {e}", header.display()))?;
    Ok(bindings.to_string())
}
