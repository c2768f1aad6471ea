//! A command-line argument that is not UTF-8 is a usage error (exit 2 with clap's message), not
//! a panic (issue 19, defect 9: hip-doctor exited 101 and printed nothing).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

fn run_with(arg: &OsStr) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_hip-doctor"))
        .arg(arg)
        .output()
        .expect("run hip-doctor");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_non_utf8_argument_is_a_usage_error() {
    for bytes in [&b"\xff"[..], b"--js\xffon", b"--json=\xff"] {
        let (code, stdout, stderr) = run_with(OsStr::from_bytes(bytes));
        assert_eq!(
            code,
            Some(2),
            "{bytes:?}: stdout {stdout:?} stderr {stderr:?}"
        );
        assert!(stderr.starts_with("error:"), "{bytes:?}: {stderr:?}");
        assert!(
            stderr.contains("Usage: hip-doctor"),
            "{bytes:?}: {stderr:?}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(stdout.is_empty(), "{stdout}");
    }
}
