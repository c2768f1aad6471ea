//! hip-doctor with an environment variable whose value is not UTF-8: the Environment section
//! names that variable and every other section still runs (issue 12, found by the probe).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::Command;

#[test]
fn a_non_utf8_environment_value_is_reported_and_the_report_goes_on() {
    let out = Command::new(env!("CARGO_BIN_EXE_hip-doctor"))
        .env_remove("HIPK_HIP_LIBRARY")
        .env_remove("HIP_VISIBLE_DEVICES")
        .env_remove("HIPK_GOLDEN_DIR")
        .env("HIPK_PROBE_BYTES", OsStr::from_bytes(b"ab\xff\xfecd"))
        .env("PROBE_OTHER_BYTES", OsStr::from_bytes(b"\x80"))
        .output()
        .expect("run hip-doctor");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains("internal error") && !stderr.contains("panicked"),
        "{stdout}\n{stderr}"
    );
    for name in ["HIPK_PROBE_BYTES", "PROBE_OTHER_BYTES"] {
        assert!(
            stdout
                .lines()
                .any(|l| l.contains(name) && l.contains("not valid UTF-8")),
            "no row names {name} as not UTF-8:\n{stdout}"
        );
    }
    assert!(stdout.contains("ab\u{fffd}\u{fffd}cd"), "{stdout}");
    for heading in [
        "Environment",
        "Devices",
        "CPU reference self-check",
        "Diagnosis",
    ] {
        assert!(
            stdout.lines().any(|l| l == heading),
            "missing section {heading}:\n{stdout}"
        );
    }
}
