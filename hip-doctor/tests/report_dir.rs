//! `hip-doctor --report DIR`: a DIR it cannot use is refused before anything runs (no device
//! needed for these): a name that is not UTF-8 is a usage error (exit 2), an output name taken
//! by a directory exits 1 naming it, and neither prints a "wrote" line.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

fn report(dir: &std::path::Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hip-doctor"))
        .arg("--report")
        .arg(dir)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_dir_it_cannot_use_is_refused_before_anything_runs() {
    let base = tempfile::tempdir().unwrap();
    let odd = base.path().join(OsStr::from_bytes(b"report-\xff"));
    let (code, out, err) = report(&odd);
    assert_eq!(code, Some(2), "{out}{err}");
    assert!(
        err.contains("UTF-8") && !out.contains("wrote"),
        "{out}{err}"
    );
    assert!(!odd.exists());

    let dir = base.path().join("r");
    std::fs::create_dir_all(dir.join("gemm-tuning.txt")).unwrap();
    let (code, out, err) = report(&dir);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(
        err.contains("gemm-tuning.txt") && err.contains("is a directory"),
        "{err}"
    );
    assert!(!out.contains("wrote"), "{out}");
    assert!(!dir.join("device-report.json").exists());
}
