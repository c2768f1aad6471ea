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
    result
}
