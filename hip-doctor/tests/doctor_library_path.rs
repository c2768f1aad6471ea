//! The report names the library file that was loaded, never one that a path check merely found
//! (issue 19, defect 6: with `HIPK_HIP_LIBRARY=libamdhip64.so` and such a file in the current
//! directory, hip-doctor said "resolves to <cwd>/libamdhip64.so" while the loader had loaded
//! the system's runtime).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `hip-doctor` in `cwd` with `HIPK_HIP_LIBRARY=value`; returns its stdout.
fn doctor_in(cwd: &Path, args: &[&str], value: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hip-doctor"))
        .args(args)
        .current_dir(cwd)
        .env_remove("HIP_VISIBLE_DEVICES")
        .env_remove("HIPK_GOLDEN_DIR")
        .env("HIPK_HIP_LIBRARY", value)
        .output()
        .expect("run hip-doctor");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stdout}\n{stderr}");
    stdout
}

/// A fresh temporary directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hip-doctor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The HIP runtime row of the JSON report: (status, detail, loaded_path fact).
fn hip_row(report: &str) -> (String, String, Option<String>) {
    let json: serde_json::Value = serde_json::from_str(report).expect("--json parses");
    let item = json["sections"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["items"].as_array().unwrap().iter())
        .find(|i| i["name"] == "HIP runtime")
        .expect("a HIP runtime row")
        .clone();
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    (
        text(&item["status"]).unwrap(),
        text(&item["detail"])
            .or_else(|| text(&item["reason"]))
            .unwrap_or_default(),
        item["facts"]["loaded_path"].as_str().map(str::to_string),
    )
}

#[test]
fn a_bare_library_name_is_refused_not_reported_as_the_file_in_the_current_directory() {
    let dir = temp_dir("bare");
    std::fs::write(
        dir.join("libamdhip64.so"),
        b"not the library the loader would pick",
    )
    .unwrap();
    let text = doctor_in(&dir, &[], "libamdhip64.so");
    let cwd_file = dir.join("libamdhip64.so").display().to_string();
    assert!(
        !text.contains(&cwd_file),
        "the report names {cwd_file}:\n{text}"
    );
    assert!(
        text.contains("HIPK_HIP_LIBRARY=libamdhip64.so is a bare file name")
            && text.contains("give a full path"),
        "{text}"
    );
    let (status, detail, _) = hip_row(&doctor_in(&dir, &["--json"], "libamdhip64.so"));
    assert_eq!(status, "fail", "{detail}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_report_names_the_file_the_loader_mapped() {
    let real = Path::new("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5");
    let Ok(real) = std::fs::canonicalize(real) else {
        eprintln!("skipped: Debian's libamdhip64 is not installed");
        return;
    };
    let dir = temp_dir("link");
    let link = dir.join("my-hip.so");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let (status, detail, loaded) = hip_row(&doctor_in(&dir, &["--json"], link.to_str().unwrap()));
    assert_eq!(status, "pass", "{detail}");
    assert_eq!(loaded.as_deref(), Some(real.to_str().unwrap()), "{detail}");
    assert!(
        detail.contains(&format!("loaded file: {}", real.display())),
        "{detail}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
