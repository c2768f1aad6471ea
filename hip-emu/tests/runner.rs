//! The `hip-emu run` runner: the library variables reach the command, its exit status comes
//! back, bad usage is an error.

use std::process::Command;

fn runner() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hip-emu"))
}

#[test]
fn run_points_every_library_variable_at_hip_emu_and_returns_the_status() {
    let out = runner()
        .args(["run", "--devices", "3", "--lazy", "--", "sh", "-c"])
        .arg("echo $HIPK_HIP_LIBRARY $HIPK_HIPBLAS_LIBRARY $HIPK_ROCBLAS_LIBRARY $HIPK_RCCL_LIBRARY $HIPK_EMU_DEVICES $HIPK_EMU_LAZY; exit 7")
        .env_remove("HIPK_EMU_LIBRARY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let words: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(words.len(), 6, "{text}");
    assert!(words[0].ends_with("libhip_emu.so") && std::path::Path::new(words[0]).is_file());
    assert!(words[1..4].iter().all(|w| *w == words[0]), "{text}");
    assert_eq!(words[4..], ["3", "1"]);
}

#[test]
fn bad_usage_says_how_to_use_it() {
    for args in [
        &["run"][..],
        &["run", "--devices"],
        &["run", "--bogus", "--", "true"],
        &[],
    ] {
        let out = runner().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("usage: hip-emu run"), "{args:?}: {err}");
    }
    let lib = runner()
        .arg("lib")
        .env_remove("HIPK_EMU_LIBRARY")
        .output()
        .unwrap();
    assert!(lib.status.success());
    assert!(String::from_utf8_lossy(&lib.stdout)
        .trim()
        .ends_with("libhip_emu.so"));
}

#[test]
fn non_utf8_arguments_pass_through_or_are_usage_errors_never_a_panic() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let odd = OsStr::from_bytes(b"caf\xe9");
    // The command's own arguments are passed on byte for byte.
    let out = runner()
        .args(["run", "--", "printf", "%s"])
        .arg(odd)
        .env_remove("HIPK_EMU_LIBRARY")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(out.stdout, b"caf\xe9");
    // In the runner's own places: a usage error (exit 2), no panic (101).
    for args in [
        vec![OsStr::new("run"), OsStr::new("--devices"), odd],
        vec![
            OsStr::new("run"),
            OsStr::from_bytes(b"--\xff"),
            OsStr::new("true"),
        ],
        vec![odd],
    ] {
        let out = runner().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("usage: hip-emu run"), "{args:?}: {err}");
    }
}
