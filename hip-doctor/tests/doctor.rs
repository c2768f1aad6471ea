//! Runs the built `hip-doctor` binary on this machine (no device) and checks what it reports.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value as Json;

/// Runs hip-doctor with `args` and extra environment variables; returns (exit code, stdout, stderr).
fn doctor(args: &[&str], vars: &[(&str, &str)]) -> (i32, String, String) {
    doctor_at(Path::new(env!("CARGO_BIN_EXE_hip-doctor")), args, vars)
}

/// [`doctor`] for the binary at `exe`, run in its own directory.
fn doctor_at(exe: &Path, args: &[&str], vars: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(exe);
    cmd.args(args);
    if let Some(dir) = exe.parent() {
        cmd.current_dir(dir);
    }
    // A stray setting in the caller's environment must not change what these tests see.
    for var in ["HIPK_HIP_LIBRARY", "HIP_VISIBLE_DEVICES", "HIPK_GOLDEN_DIR"] {
        cmd.env_remove(var);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = match cmd.output() {
        Ok(out) => out,
        Err(e) => panic!("could not run hip-doctor: {e}"),
    };
    let (stdout, stderr) = (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    );
    for stream in [&stdout, &stderr] {
        assert!(
            !stream.contains("panicked"),
            "hip-doctor printed a panic:\n{stdout}\n{stderr}"
        );
    }
    (status.code().unwrap_or(-1), stdout, stderr)
}

/// The row of `section` whose name is `name`, as (status, detail or reason).
fn row<'a>(report: &'a Json, section: &str, name: &str) -> Option<(&'a str, &'a str)> {
    let sections = report.get("sections")?.as_array()?;
    let sec = sections
        .iter()
        .find(|s| s.get("title").and_then(Json::as_str) == Some(section))?;
    let item = sec
        .get("items")?
        .as_array()?
        .iter()
        .find(|i| i.get("name").and_then(Json::as_str) == Some(name))?;
    let status = item.get("status")?.as_str()?;
    let detail = item
        .get("detail")
        .or_else(|| item.get("reason"))?
        .as_str()?;
    Some((status, detail))
}

fn json_report(vars: &[(&str, &str)]) -> (i32, Json) {
    let (code, stdout, stderr) = doctor(&["--json"], vars);
    // Progress goes to stderr only, as plain `hip-doctor: ...` lines (stderr is not a terminal).
    assert!(
        stderr.lines().all(|l| l.starts_with("hip-doctor: ")) && !stderr.contains('\x1b'),
        "{stderr}"
    );
    match serde_json::from_str::<Json>(&stdout) {
        Ok(report) => (code, report),
        Err(e) => panic!("--json output does not parse: {e}\n{stdout}\n{stderr}"),
    }
}

#[test]
fn without_a_device_it_reports_and_exits_non_zero() {
    let (code, stdout, _) = doctor(&[], &[]);
    assert_eq!(code, 1, "{stdout}");
    for heading in [
        "Environment",
        "Embedded kernels",
        "Devices",
        "CPU reference self-check",
        "Diagnosis",
    ] {
        assert!(
            stdout.lines().any(|l| l == heading),
            "missing section {heading}:\n{stdout}"
        );
    }
    assert!(stdout.contains("FAIL"), "{stdout}");
    assert!(
        stdout.ends_with(")\n") && stdout.contains("Result: NOT OK"),
        "{stdout}"
    );
    // Not a terminal: plain ASCII marks only.
    assert!(!stdout.contains('✓') && !stdout.contains('✗'), "{stdout}");
}

#[test]
fn json_output_parses_and_agrees_with_exit_code() {
    let (code, report) = json_report(&[]);
    assert_eq!(code, 1);
    assert_eq!(
        report.get("tool").and_then(Json::as_str),
        Some("hip-doctor")
    );
    assert_eq!(report.get("ok"), Some(&Json::Bool(false)));
    assert_eq!(report.get("exit_code").and_then(Json::as_f64), Some(1.0));
    let sections = report
        .get("sections")
        .and_then(Json::as_array)
        .map_or(0, Vec::len);
    assert!(sections >= 5, "{report:?}");
    assert!(row(&report, "Environment", "/dev/kfd").is_some());
}

#[test]
fn hidden_devices_are_diagnosed() {
    let (code, report) = json_report(&[("HIP_VISIBLE_DEVICES", "-1")]);
    assert_eq!(code, 1);
    let (status, detail) = row(
        &report,
        "Diagnosis",
        "HIP_VISIBLE_DEVICES hides every device",
    )
    .expect("diagnosis row");
    assert_eq!(status, "fail");
    assert!(detail.contains("\"-1\""), "{detail}");
}

#[test]
fn missing_golden_dir_is_named() {
    let (_, report) = json_report(&[("HIPK_GOLDEN_DIR", "/nonexistent/golden-copy")]);
    let sections = report
        .get("sections")
        .and_then(Json::as_array)
        .expect("sections");
    let selfcheck = sections
        .iter()
        .find(|s| s.get("title").and_then(Json::as_str) == Some("CPU reference self-check"))
        .expect("self-check section");
    let text = format!("{selfcheck:?}");
    assert!(
        text.contains("/nonexistent/golden-copy does not exist"),
        "{text}"
    );
}

#[test]
fn usage_errors_exit_2_and_help_exits_0() {
    let (code, stdout, stderr) = doctor(&["--frobnicate"], &[]);
    assert_eq!(code, 2);
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains("unexpected argument '--frobnicate'") && stderr.contains("--help"),
        "{stderr}"
    );
    let (code, stdout, _) = doctor(&["--help"], &[]);
    assert_eq!(code, 0);
    assert!(
        stdout.contains("--json") && stdout.contains("--bench"),
        "{stdout}"
    );
}

#[test]
fn bench_without_a_device_is_skipped_with_a_reason() {
    let (code, report) = json_report(&[]);
    assert_eq!(code, 1);
    assert!(
        row(&report, "Benchmarks", "benchmarks").is_none(),
        "no Benchmarks section without --bench"
    );
    let (code, stdout, _) = doctor(&["--json", "--bench"], &[]);
    assert_eq!(code, 1);
    let report: Json = serde_json::from_str(&stdout).expect("--json --bench parses");
    let (status, reason) = row(&report, "Benchmarks", "benchmarks").expect("bench row");
    assert_eq!(status, "skipped");
    assert!(reason.contains("device"), "{reason}");
}

/// Debian's ROCm 5.2 runtime, installed here and in CI.
const DEBIAN_HIP: &str = "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5";

#[test]
fn names_the_loaded_library_and_reports_no_device() {
    let (code, report) = json_report(&[]);
    assert_eq!(code, 1);
    let (status, detail) = row(&report, "Environment", "HIP runtime").expect("HIP runtime row");
    if std::path::Path::new(DEBIAN_HIP).exists() {
        assert_eq!(status, "pass", "{detail}");
        assert!(detail.contains("libamdhip64.so"), "{detail}");
        assert!(detail.contains("ROCm HIP 5.2."), "{detail}");
        let (status, detail) = row(&report, "Devices", "devices").expect("devices row");
        assert_eq!(status, "fail");
        assert!(
            detail.contains("no device") && detail.contains("hipErrorNoDevice"),
            "{detail}"
        );
    } else {
        println!("{DEBIAN_HIP} not installed: checking the not-found diagnosis instead");
        assert_eq!(status, "fail", "{detail}");
        assert!(row(&report, "Diagnosis", "HIP runtime not found").is_some());
    }
}

#[test]
fn a_missing_override_file_is_named() {
    let missing = "/nonexistent/dir/libamdhip64.so";
    let (code, stdout, _) = doctor(&[], &[("HIPK_HIP_LIBRARY", missing)]);
    assert_eq!(code, 1);
    assert!(
        stdout.contains(&format!(
            "HIPK_HIP_LIBRARY names {missing}, which does not exist"
        )),
        "{stdout}"
    );
    let (_, report) = json_report(&[("HIPK_HIP_LIBRARY", missing)]);
    let (status, detail) = row(&report, "Environment", "HIP runtime").expect("HIP runtime row");
    assert_eq!(status, "fail");
    assert!(detail.contains(missing), "{detail}");
    let (status, _) = row(&report, "Devices", "devices").expect("devices row");
    assert_eq!(status, "skipped");
}

#[test]
fn a_file_that_is_not_a_hip_runtime_is_a_clear_failure() {
    let libc = "/lib/x86_64-linux-gnu/libc.so.6";
    if !std::path::Path::new(libc).exists() {
        println!("{libc} not present: skipped");
        return;
    }
    let (code, report) = json_report(&[("HIPK_HIP_LIBRARY", libc)]);
    assert_eq!(code, 1);
    let (status, detail) =
        row(&report, "Diagnosis", "HIP runtime unusable").expect("diagnosis row");
    assert_eq!(status, "fail");
    assert!(detail.contains("not a HIP runtime"), "{detail}");
}

#[test]
fn the_cpu_self_check_passes_on_the_committed_cases() {
    let (_, report) = json_report(&[]);
    for op in [
        "matmul",
        "layernorm_forward",
        "layernorm_backward",
        "attention_forward",
        "attention_backward",
        "adamw",
    ] {
        let (status, detail) = row(&report, "CPU reference self-check", op)
            .unwrap_or_else(|| panic!("no row for {op}"));
        assert_eq!(status, "pass", "{op}: {detail}");
        assert!(detail.contains("cases passed"), "{detail}");
    }
    let (_, stdout, _) = doctor(&[], &[]);
    assert!(stdout.contains("PASS  matmul"), "{stdout}");
}

#[test]
fn embedded_kernels_are_listed_or_their_absence_explained() {
    let (_, report) = json_report(&[]);
    match hip_kernels::embedded::not_built_reason() {
        Some(reason) => {
            let (status, detail) =
                row(&report, "Embedded kernels", "kernels").expect("kernels row");
            assert_eq!(status, "fail");
            assert!(detail.contains(reason), "{detail}");
        }
        None => {
            let (_, archs) = row(&report, "Embedded kernels", "archs").expect("archs row");
            assert_eq!(archs, hip_kernels::embedded::archs().join(", "));
            for bundle in hip_kernels::embedded::bundles() {
                let name = format!("{} bundle", bundle.source);
                let (status, detail) = row(&report, "Embedded kernels", &name).expect("bundle row");
                assert_eq!(status, "pass", "{name}: {detail}");
            }
        }
    }
}

#[test]
fn a_copied_binary_runs_its_self_check_from_the_embedded_cases() {
    let dir = std::env::temp_dir().join(format!("hipk-doctor-copy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = dir.join("hip-doctor");
    std::fs::copy(env!("CARGO_BIN_EXE_hip-doctor"), &exe).expect("copy the binary");
    let (_, stdout, stderr) = doctor_at(&exe, &["--json"], &[]);
    let _ = std::fs::remove_dir_all(&dir);
    let report: Json = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("--json output does not parse: {e}\n{stdout}\n{stderr}"));
    let (status, detail) = row(&report, "CPU reference self-check", "embedded golden cases")
        .expect("embedded cases row");
    assert_eq!(status, "info");
    let committed = std::fs::read_dir(hip_kernels::golden::committed_dir())
        .map_or(0, |d| d.filter_map(Result::ok).count());
    assert_eq!(detail, format!("{committed} cases built into this binary"));
    let section = report
        .get("sections")
        .and_then(Json::as_array)
        .and_then(|s| {
            s.iter()
                .find(|s| s.get("title").and_then(Json::as_str) == Some("CPU reference self-check"))
        })
        .expect("self-check section");
    let text = section.to_string();
    assert!(!text.contains("\"fail\""), "{text}");
    assert!(
        !text.contains("tests/golden"),
        "no source-tree path: {text}"
    );
}

#[test]
fn a_failure_outside_the_rules_is_named_in_the_diagnosis() {
    let (code, report) = json_report(&[("HIPK_GOLDEN_DIR", "/nonexistent/golden-copy")]);
    assert_eq!(code, 1);
    let sections = report
        .get("sections")
        .and_then(Json::as_array)
        .expect("sections");
    let diagnosis = sections
        .iter()
        .find(|s| s.get("title").and_then(Json::as_str) == Some("Diagnosis"))
        .expect("Diagnosis section")
        .to_string();
    assert!(
        diagnosis.contains("CPU reference self-check: golden directory"),
        "{diagnosis}"
    );
    assert!(!diagnosis.contains("no problems found"), "{diagnosis}");
}
