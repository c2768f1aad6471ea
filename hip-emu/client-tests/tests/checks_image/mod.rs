//! The test kernels (hip-emu/tests/kernels/checks.hip) as hip-emu runs them: hipcc's gfx906 code
//! object, and its host build installed under the code object's key in a directory hip-emu is
//! told about. Shared by runtime_launch.rs (the race check's host build) and runtime_overrun.rs
//! (the overrun check's).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Build the code object and install its host build (with the race check's instrumentation when
/// `race`, else the overrun check's) under `<target tmp>/hipemu-keys-<tag>`; `Err` says why it
/// cannot be built here (no hipcc, no clang++ >= 15, not hip-emu). A hipcc failure panics with
/// its stderr: the test source itself is broken.
pub fn build(tag: &str, race: bool, repo_root: PathBuf) -> Result<Vec<u8>, String> {
    let cxx = hip_build::host::HostCompiler::find()
        .map_err(|e| format!("the kernels cannot be built for hip-emu: {e}"))?;
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/kernels/checks.hip");
    let out = std::env::temp_dir().join(format!(
        "hip-emu-runtime-{tag}-{}.hsaco",
        std::process::id()
    ));
    let hipcc = std::env::var("HIPCC").unwrap_or_else(|_| "hipcc".into());
    let status = Command::new(&hipcc)
        .args(["--genco", "--offload-arch=gfx906"])
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| format!("`{hipcc}` is not runnable ({e})"))?;
    if !status.status.success() {
        panic!(
            "hipcc failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&status.stderr)
        );
    }
    let bytes = std::fs::read(&out).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let mut opts = hip_build::host::HostOptions::new(base.join(format!("hipemu-host-{tag}")));
    opts.source_root = Some(repo_root);
    opts.race = race;
    let object = cxx.compile(&src, &opts).map_err(|e| e.to_string())?;
    let dir = base.join(format!("hipemu-keys-{tag}"));
    hip_build::host::install(&object.path, &bytes, &dir).map_err(|e| e.to_string())?;
    if !hip_rt::emu::add_kernel_dir(&dir) {
        return Err("the loaded HIP runtime is not hip-emu".into());
    }
    Ok(bytes)
}
