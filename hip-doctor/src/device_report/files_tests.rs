//! The report's files: written whole or not at all, never through a planted symlink, a failed
//! write named, the previous tuning results kept when no new ones were made.

use super::*;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, PermissionsExt};

fn tuned_file(scratch: &Path, text: &str) -> PathBuf {
    let p = scratch.join(TUNING_FILE);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn a_symlink_planted_at_an_output_is_replaced_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    for name in [JSON_FILE, MD_FILE, TUNING_FILE] {
        symlink(&victim, dir.path().join(name)).unwrap();
    }
    let scratch = tempfile::tempdir_in(dir.path()).unwrap();
    let tuned = tuned_file(scratch.path(), "new results");
    let (written, errors) = write_outputs(dir.path(), "{}\n", "# r\n", Some(&tuned));
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(written.len(), 3);
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    for name in [JSON_FILE, MD_FILE, TUNING_FILE] {
        let m = dir.path().join(name).symlink_metadata().unwrap();
        assert!(m.is_file(), "{name} is still a link");
    }
}

#[test]
fn without_new_tuning_results_the_previous_file_stays_and_the_failure_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join(TUNING_FILE);
    std::fs::write(&old, "previous results").unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (written, errors) = write_outputs(dir.path(), "{}\n", "# r\n", None);
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "previous results");
    assert!(!written.contains(&old), "{written:?}");
    assert!(
        errors.len() == 1 && errors[0].contains(TUNING_FILE),
        "{errors:?}"
    );
    // New results replace it, keeping its mode.
    let scratch = tempfile::tempdir_in(dir.path()).unwrap();
    let tuned = tuned_file(scratch.path(), "new results");
    std::fs::set_permissions(&tuned, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (written, errors) = write_outputs(dir.path(), "{}\n", "# r\n", Some(&tuned));
    assert!(errors.is_empty() && written.contains(&old), "{errors:?}");
    assert_eq!(std::fs::read_to_string(&old).unwrap(), "new results");
    let mode = std::fs::metadata(&old).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o644);
}

#[test]
fn an_unwritable_output_is_named_and_not_reported_written() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where gemm-tuning.txt goes: refused before anything runs, and at the end.
    std::fs::create_dir(dir.path().join(TUNING_FILE)).unwrap();
    std::fs::write(dir.path().join(TUNING_FILE).join("x"), b"x").unwrap();
    let e = check_dir(dir.path()).unwrap_err();
    assert!(e.contains(TUNING_FILE), "{e}");
    let scratch = tempfile::tempdir_in(dir.path()).unwrap();
    let tuned = tuned_file(scratch.path(), "new results");
    let (written, errors) = write_outputs(dir.path(), "{}\n", "# r\n", Some(&tuned));
    assert!(
        !written.iter().any(|p| p.ends_with(TUNING_FILE)),
        "{written:?}"
    );
    assert!(
        errors.len() == 1 && errors[0].contains(TUNING_FILE),
        "{errors:?}"
    );
}

#[test]
fn a_non_utf8_dir_is_refused_up_front() {
    let base = tempfile::tempdir().unwrap();
    let dir = base
        .path()
        .join(std::ffi::OsStr::from_bytes(b"report-\xff"));
    let e = check_dir(&dir).unwrap_err();
    assert!(e.contains("UTF-8"), "{e}");
    assert!(!dir.exists(), "made before the check");
}

#[test]
fn a_full_disk_keeps_the_previous_report_whole() {
    let mnt = tempfile::tempdir().unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64k", "tmpfs"])
        .arg(mnt.path())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let json = mnt.path().join(JSON_FILE);
        std::fs::write(&json, "{\"previous\": true}\n").unwrap();
        let big = format!("{{\"pad\": \"{}\"}}\n", "x".repeat(256 << 10));
        let (written, errors) = write_outputs(mnt.path(), &big, "# r\n", None);
        assert!(!written.contains(&json), "{written:?}");
        assert!(
            errors
                .iter()
                .any(|e| e.contains(JSON_FILE) && e.contains("space")),
            "{errors:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&json).unwrap(),
            "{\"previous\": true}\n"
        );
    });
    let _ = std::process::Command::new("umount")
        .arg(mnt.path())
        .status();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}
