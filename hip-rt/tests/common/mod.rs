//! Shared by the integration tests: a tiny kernel source and building it with hipcc.
#![allow(dead_code)] // each test crate uses a different part

use std::path::PathBuf;
use std::process::Command;

/// Two `extern "C"` kernels used by the bundle and launch tests (`hipk_test_add`,
/// `hipk_test_scale`). hip-emu's build compiles the same file for the host.
pub const TEST_KERNELS: &str = include_str!("../../kernels/test_kernels.hip");

/// The hipcc to use: `$HIPCC`, else `hipcc` on PATH.
pub fn hipcc() -> String {
    std::env::var("HIPCC").unwrap_or_else(|_| "hipcc".into())
}

/// Build [`TEST_KERNELS`] for `archs` with `hipcc --genco`.
/// `Err` says why (hipcc missing, or its full command and stderr on failure).
pub fn build_bundle(archs: &[&str]) -> Result<Vec<u8>, String> {
    let hipcc = hipcc();
    let dir = std::env::temp_dir().join(format!(
        "hip-rt-test-{}-{}",
        std::process::id(),
        archs.join("-").replace(':', "_")
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let (src, out): (PathBuf, PathBuf) = (dir.join("k.hip"), dir.join("k.hsaco"));
    std::fs::write(&src, TEST_KERNELS)
        .map_err(|e| format!("cannot write {}: {e}", src.display()))?;
    let mut cmd = Command::new(&hipcc);
    cmd.arg("--genco");
    for arch in archs {
        cmd.arg(format!("--offload-arch={arch}"));
    }
    cmd.arg(&src).arg("-o").arg(&out);
    let result = match cmd.output() {
        Ok(o) if o.status.success() => {
            std::fs::read(&out).map_err(|e| format!("cannot read {}: {e}", out.display()))
        }
        Ok(o) => Err(format!(
            "{cmd:?} failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        )),
        Err(e) => Err(format!(
            "`{hipcc}` is not runnable ({e}): install hipcc (apt-get install hipcc) or set HIPCC"
        )),
    };
    let _ = std::fs::remove_dir_all(&dir);
    if let Ok(image) = &result {
        host_build_for_emu(image)?;
    }
    result
}

/// The host build of the test kernels for hip-emu, installed under the key of `image` in a
/// directory hip-emu is told about (nothing happens on a real runtime, or without a clang++ >=
/// 15: then hip-emu's error names what is missing).
pub fn host_build_for_emu(image: &[u8]) -> Result<(), String> {
    use hip_build::host::{install, HostCompiler, HostOptions};
    let Ok(cxx) = HostCompiler::find() else {
        return Ok(());
    };
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let base = option_env!("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../target/tmp"));
    let mut opts = HostOptions::new(base.join("hipemu-host"));
    opts.source_root = Some(manifest.clone());
    let object = cxx
        .compile(&manifest.join("kernels/test_kernels.hip"), &opts)
        .map_err(|e| e.to_string())?;
    let dir = base.join("hipemu-keys");
    match install(&object.path, image, &dir) {
        Ok(_) => {}
        // No gfx906 code object: nothing hip-emu could load.
        Err(hip_build::host::HostError::Key(_)) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    }
    hip_rt::emu::add_kernel_dir(&dir);
    Ok(())
}
