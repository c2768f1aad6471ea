//! The loader against the real system: Debian's libamdhip64 when installed (CI installs it),
//! and steered environments in child processes (the runtime is loaded once per process, so each
//! steered load runs this test binary again with one child test selected).

use std::path::Path;
use std::process::Command;

use hip_sys::{hipError_t, Error, Flavour};

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const CHILD_VAR: &str = "HIP_SYS_TEST_CHILD";

/// The process-wide runtime, or `None` (with the reason printed) when no HIP runtime is installed.
fn real_hip() -> Option<&'static hip_sys::Hip> {
    if std::env::var_os("HIPK_HIP_LIBRARY").is_some() {
        eprintln!("skipped: HIPK_HIP_LIBRARY is set, this test wants the default search");
        return None;
    }
    match hip_sys::hip() {
        Ok(hip) => Some(hip),
        Err(Error::NotFound { report }) => {
            eprintln!(
                "skipped: no HIP runtime installed (apt-get install libamdhip64-dev):\n{report}"
            );
            None
        }
        Err(e) => panic!("the HIP runtime was found but failed to load: {e}"),
    }
}

#[test]
fn real_runtime_loads_and_reports_its_version() {
    let Some(hip) = real_hip() else { return };
    assert!(hip.path().exists(), "{}", hip.path().display());
    let v = hip.runtime_version().unwrap();
    assert!(v.major >= 5, "{v}");
    let debian = hip.path().to_string_lossy().contains("x86_64-linux-gnu");
    if debian {
        // Debian bookworm's libamdhip64 is 5.2.21153.
        assert_eq!((v.major, v.minor), (5, 2), "{v}");
        assert_eq!(hip.flavour(), Flavour::Rocm);
    }
    // Loading again gives the same runtime.
    assert!(std::ptr::eq(hip, hip_sys::hip().unwrap()));
}

#[test]
fn device_count_without_a_device_is_no_device_with_the_fix() {
    let Some(hip) = real_hip() else { return };
    match hip.device_count() {
        Ok(n) => {
            // A machine with a real device: its properties must decode and pass the checks.
            eprintln!("{n} device(s) present; checking device 0's properties instead");
            let props = hip.device_props(0).unwrap();
            assert!(props.warp_size == 32 || props.warp_size == 64);
        }
        Err(Error::Hip(e)) => {
            assert_eq!(e.code, hipError_t::hipErrorNoDevice, "{e}");
            let text = e.to_string();
            for needle in [
                "100",
                "hipErrorNoDevice",
                "no HIP device found",
                "/dev/kfd",
                "HIP_VISIBLE_DEVICES",
                "render",
                "video",
            ] {
                assert!(text.contains(needle), "{needle:?} missing from: {text}");
            }
            // The same code through the generated table and `sym!`.
            let f = hip_sys::sym!(hipGetDeviceCount).unwrap();
            let mut count = -1;
            // SAFETY: hipGetDeviceCount writes one int through a valid pointer.
            let status = unsafe { f(&mut count) };
            assert_eq!(status, hipError_t::hipErrorNoDevice);
            // Device properties fail the same way instead of decoding garbage.
            let err = hip.device_props(0).unwrap_err();
            assert!(matches!(err, Error::Hip(_)), "{err}");
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn missing_symbol_is_a_typed_error_naming_it() {
    let Some(hip) = real_hip() else { return };
    // hipGetDevicePropertiesR0600 does not exist before ROCm 6.
    if hip.runtime_version().unwrap().major >= 6 {
        eprintln!("skipped: this runtime has hipGetDevicePropertiesR0600");
        return;
    }
    let err = hip_sys::sym!(hip, hipGetDevicePropertiesR0600).unwrap_err();
    match &err {
        Error::MissingSymbol { name, library } => {
            assert_eq!(*name, "hipGetDevicePropertiesR0600");
            assert_eq!(library, hip.path());
        }
        other => panic!("not MissingSymbol: {other}"),
    }
    assert!(err.to_string().contains("hipGetDevicePropertiesR0600"));
    assert_eq!(hip.props_layout(), hip_sys::PropsLayout::Legacy);
}

#[test]
fn load_from_a_missing_file_names_it() {
    let err = hip_sys::load_from(Path::new("/nonexistent/libamdhip64.so")).unwrap_err();
    assert!(matches!(err, Error::NotFound { .. }), "{err:?}");
    assert!(
        err.to_string().contains("/nonexistent/libamdhip64.so"),
        "{err}"
    );
}

#[test]
fn load_from_libc_says_it_is_not_a_hip_runtime() {
    if !Path::new(LIBC).is_file() {
        eprintln!("skipped: {LIBC} not present on this system");
        return;
    }
    match hip_sys::load_from(Path::new(LIBC)).unwrap_err() {
        Error::NotAHipRuntime { path, missing, .. } => {
            assert_eq!(path, Path::new(LIBC));
            assert_eq!(missing, ["hipGetDeviceCount", "hipRuntimeGetVersion"]);
        }
        other => panic!("not NotAHipRuntime: {other}"),
    }
}

#[test]
fn blas_absence_does_not_affect_the_runtime() {
    let hipblas = hip_sys::blas::hipblas();
    let rocblas = hip_sys::blas::rocblas();
    for result in [
        hipblas.map(|b| b.path().to_path_buf()),
        rocblas.map(|b| b.path().to_path_buf()),
    ] {
        match result {
            Ok(path) => eprintln!("BLAS present at {}", path.display()),
            Err(Error::NotFound { report }) => {
                let text = report.to_string();
                assert!(
                    text.contains("not found") && text.contains("/opt/rocm/lib/{"),
                    "{text}"
                );
            }
            Err(e) => panic!("BLAS load failed unexpectedly: {e}"),
        }
    }
    if let Ok(blas) = hip_sys::blas::hipblas() {
        eprintln!("hipBLAS GemmEx ABI: {:?}", blas.gemm_ex_abi());
        assert!(hip_sys::sym!(blas, hipblasCreate).is_ok());
    }
    if let Some(hip) = real_hip() {
        assert!(hip.runtime_version().is_ok());
    }
    let reports = hip_sys::search_report();
    assert_eq!(reports.hip.spec.label, "HIP runtime");
    assert_eq!(reports.hipblas.spec.label, "hipBLAS");
    assert_eq!(reports.rocblas.spec.label, "rocBLAS");
}

#[test]
fn rccl_absence_does_not_affect_the_runtime() {
    match hip_sys::rccl::rccl() {
        Ok(rccl) => {
            eprintln!("RCCL {} at {}", rccl.version(), rccl.path().display());
            assert!(rccl.version().major >= 2, "{:?}", rccl.version());
        }
        Err(Error::NotFound { report }) => {
            let text = report.to_string();
            for needle in [
                "RCCL library not found",
                "/opt/dtk/rccl/lib/{",
                "HIPK_RCCL_LIBRARY",
            ] {
                assert!(text.contains(needle), "{needle:?} missing from: {text}");
            }
        }
        Err(e) => panic!("RCCL load failed unexpectedly: {e}"),
    }
    // The same outcome again, and the runtime is unaffected.
    assert_eq!(
        hip_sys::rccl::rccl().is_ok(),
        hip_sys::rccl::rccl_search_report().opened().is_some()
    );
    if let Some(hip) = real_hip() {
        assert!(hip.runtime_version().is_ok());
    }
}

/// Run `child_load` in a fresh process with `HIPK_HIP_LIBRARY=value`; return its output.
fn steered_child(value: &str) -> String {
    steered_child_in(value, &std::env::current_dir().unwrap())
}

/// [`steered_child`] with the child's working directory `cwd`.
fn steered_child_in(value: &str, cwd: &Path) -> String {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["child_load", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, "1")
        .env("HIPK_HIP_LIBRARY", value)
        .current_dir(cwd)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    text
}

/// Child half of the steered tests: only acts when spawned by them.
#[test]
fn child_load() {
    if std::env::var_os(CHILD_VAR).is_none() {
        return;
    }
    // The first and the second call must report the same error.
    let first = hip_sys::hip().map(|h| h.path().display().to_string());
    let second = hip_sys::hip().map(|h| h.path().display().to_string());
    match (first, second) {
        (Err(a), Err(b)) => {
            assert_eq!(a.to_string(), b.to_string());
            println!("CHILD-ERROR-KIND: {}", kind(&a));
            println!("CHILD-ERROR: {a}");
        }
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b);
            println!("CHILD-LOADED: {a}");
            let loaded = hip_sys::hip().unwrap().loaded_path().display().to_string();
            println!("CHILD-LOADED-FILE: {loaded}");
        }
        (a, b) => panic!("first and second load disagree: {a:?} / {b:?}"),
    }
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::NotFound { .. } => "NotFound",
        Error::NotAHipRuntime { .. } => "NotAHipRuntime",
        Error::BareLibraryName { .. } => "BareLibraryName",
        _ => "other",
    }
}

#[test]
fn override_naming_a_missing_file_fails_naming_it() {
    let out = steered_child("/nonexistent/dir/libamdhip64.so");
    assert!(out.contains("CHILD-ERROR-KIND: NotFound"), "{out}");
    assert!(
        out.contains("HIPK_HIP_LIBRARY=/nonexistent/dir/libamdhip64.so: no such file"),
        "{out}"
    );
    assert!(out.contains("source /opt/dtk/env.sh"), "{out}");
}

#[test]
fn override_naming_libc_fails_cleanly() {
    if !Path::new(LIBC).is_file() {
        eprintln!("skipped: {LIBC} not present on this system");
        return;
    }
    let out = steered_child(LIBC);
    assert!(out.contains("CHILD-ERROR-KIND: NotAHipRuntime"), "{out}");
    assert!(out.contains("hipGetDeviceCount"), "{out}");
}

#[test]
fn override_naming_the_real_library_loads_it() {
    let Some(hip) = real_hip() else { return };
    let path = hip.path().display().to_string();
    let out = steered_child(&path);
    assert!(out.contains(&format!("CHILD-LOADED: {path}")), "{out}");
}

/// A fresh temporary directory for one test.
fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hip-sys-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The child's error text for `HIPK_HIP_LIBRARY=value`, checked to be a NotFound that names
/// `why` after the variable and says nothing misleading.
fn assert_override_problem(value: &str, why: &str) {
    let out = steered_child(value);
    assert!(out.contains("CHILD-ERROR-KIND: NotFound"), "{out}");
    assert!(
        out.contains(&format!("HIPK_HIP_LIBRARY={value}: {why}")),
        "expected `{why}`:\n{out}"
    );
    for wrong in ["no such file", "not present", "does not exist"] {
        assert!(!out.contains(&format!("{value}: {wrong}")), "{out}");
    }
}

#[test]
fn override_naming_a_directory_says_so() {
    let dir = temp_dir("dir");
    assert_override_problem(dir.to_str().unwrap(), "is a directory, not a library file");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn override_naming_dev_null_says_it_is_not_a_regular_file() {
    assert_override_problem("/dev/null", "is a character device, not a library file");
}

#[test]
fn override_naming_a_symlink_loop_says_so() {
    let dir = temp_dir("loop");
    let (a, b) = (dir.join("a.so"), dir.join("b.so"));
    std::os::unix::fs::symlink(&b, &a).unwrap();
    std::os::unix::fs::symlink(&a, &b).unwrap();
    assert_override_problem(a.to_str().unwrap(), "is a symbolic link loop");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn override_naming_a_library_for_another_architecture_names_its_machine() {
    // An ELF64 shared-object header for AArch64 (e_machine 183), or x86-64 (62) on AArch64.
    let machine: u16 = if cfg!(target_arch = "aarch64") {
        62
    } else {
        183
    };
    let mut header = vec![0u8; 1088];
    header[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
    header[16..18].copy_from_slice(&3u16.to_le_bytes()); // ET_DYN
    header[18..20].copy_from_slice(&machine.to_le_bytes());
    header[20..24].copy_from_slice(&1u32.to_le_bytes());
    header[52..54].copy_from_slice(&64u16.to_le_bytes());
    header[54..56].copy_from_slice(&56u16.to_le_bytes());
    header[58..60].copy_from_slice(&64u16.to_le_bytes());
    let dir = temp_dir("arch");
    let lib = dir.join("libamdhip64.so");
    std::fs::write(&lib, &header).unwrap();
    let out = steered_child(lib.to_str().unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.contains("CHILD-ERROR-KIND: NotFound"), "{out}");
    assert!(
        out.contains(&format!(
            "is an ELF file for another architecture (e_machine = {machine}"
        )),
        "{out}"
    );
}

/// A bare file name is looked up by the system loader in its own search path, never in the
/// current directory: with such a file in the current directory, what a check of that path
/// sees is not what would load (issue 19, defect 6). It is refused, naming the fix.
#[test]
fn override_naming_a_bare_file_name_is_refused() {
    let dir = temp_dir("bare");
    std::fs::write(
        dir.join("libamdhip64.so"),
        b"not the library the loader would pick",
    )
    .unwrap();
    let out = steered_child_in("libamdhip64.so", &dir);
    assert!(out.contains("CHILD-ERROR-KIND: BareLibraryName"), "{out}");
    assert!(
        out.contains("HIPK_HIP_LIBRARY=libamdhip64.so is a bare file name")
            && out.contains("give a full path"),
        "{out}"
    );
    // A path with a directory part is opened as that file (glibc: "file too short").
    let out = steered_child_in("./libamdhip64.so", &dir);
    assert!(out.contains("CHILD-ERROR-KIND: NotFound"), "{out}");
    assert!(out.contains("./libamdhip64.so: file too short"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The file the loader mapped, asked of the loader (dladdr on a resolved symbol): for an
/// override through a symbolic link it is that file, whatever the link is called.
#[test]
fn loaded_path_is_the_file_the_loader_mapped() {
    let Some(hip) = real_hip() else { return };
    let real = std::fs::canonicalize(hip.path()).unwrap();
    assert!(
        hip.loaded_path().is_absolute(),
        "{}",
        hip.loaded_path().display()
    );
    assert_eq!(std::fs::canonicalize(hip.loaded_path()).unwrap(), real);
    let dir = temp_dir("link");
    let link = dir.join("hip-runtime-link.so");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = steered_child(link.to_str().unwrap());
    let file = out
        .lines()
        .find_map(|l| l.strip_prefix("CHILD-LOADED-FILE: "))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(std::fs::canonicalize(file).unwrap(), real, "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
