//! A command-line argument that is not UTF-8 is a usage error (exit 2 with clap's message), not
//! a panic (issue 19, defect 9).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

#[test]
fn a_non_utf8_argument_is_a_usage_error() {
    let cases: [&[&[u8]]; 4] = [
        &[b"\xff"],
        &[b"isa-report", b"--only", b"gel\xffu"],
        &[b"isa-report", b"--arch", b"\xff"],
        &[b"bindings", b"--\xff"],
    ];
    for args in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(args.iter().map(|a| OsStr::from_bytes(a)))
            .output()
            .expect("run xtask");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error:"), "{args:?}: {stderr}");
        assert!(stderr.contains("Usage: xtask"), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
