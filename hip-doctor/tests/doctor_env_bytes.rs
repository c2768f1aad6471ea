//! hip-doctor with an environment variable whose value is not UTF-8: the Environment section
//! names that variable and every other section still runs (issue 12, found by the probe). And a
//! DTK version file from the environment that is a FIFO does not block the report.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

#[test]
fn a_fifo_as_the_dtk_version_file_does_not_block_the_report() {
    let dir = std::env::temp_dir().join(format!("hipk-doctor-dtk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let made = Command::new("mkfifo")
        .arg(dir.join(".dtk_version"))
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    // Output to a file, not a pipe: a pipe nobody reads while waiting could fill and block.
    let out_path = dir.join("report.txt");
    let out_file = std::fs::File::create(&out_path).expect("report file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_hip-doctor"))
        .env("DTK_HOME", &dir)
        .stdout(Stdio::from(out_file))
        .stderr(Stdio::null())
        .spawn()
        .expect("run hip-doctor");
    let start = Instant::now();
    let finished = loop {
        if child.try_wait().expect("wait").is_some() {
            break true;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        finished,
        "hip-doctor blocked on a FIFO named .dtk_version for 60 s"
    );
    assert!(stdout.contains("no version file at"), "{stdout}");
}
