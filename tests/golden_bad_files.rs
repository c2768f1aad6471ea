//! Case files that are not regular files, or too large, are named errors; nothing blocks or reads
//! without bound (issue 12, found by the probe with HIPK_GOLDEN_DIR).

use hip_kernels::golden::{load_case, GoldenError, MAX_CASE_BYTES};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

/// A fresh directory for one test.
fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hipk-golden-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// `load_case(path)` on another thread; a result that does not come within 30 s is a failure
/// (the reader blocked or is reading without end).
fn load_within_deadline(path: &Path) -> Result<hip_kernels::golden::Case, GoldenError> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(load_case(&p));
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("load_case({}) did not return within 30 s", path.display()))
}

fn assert_not_a_file(
    result: Result<hip_kernels::golden::Case, GoldenError>,
    path: &Path,
    kind: &str,
) {
    let e = result.expect_err("must be rejected");
    let text = e.to_string();
    assert!(
        matches!(&e, GoldenError::NotAFile { path: p, .. } if p == path),
        "{text}"
    );
    assert!(
        text.contains(&path.display().to_string()) && text.contains(kind),
        "{text}"
    );
}

#[test]
fn a_fifo_named_like_a_case_is_rejected_without_blocking() {
    let dir = temp_dir("fifo");
    let fifo = dir.join("pipe.safetensors");
    let made = Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo failed");
    let result = load_within_deadline(&fifo);
    let _ = std::fs::remove_dir_all(&dir);
    assert_not_a_file(result, &fifo, "FIFO");
}

#[test]
fn a_link_to_a_device_is_rejected_without_reading_it() {
    let dir = temp_dir("dev");
    let link = dir.join("zero.safetensors");
    std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
    let result = load_within_deadline(&link);
    let _ = std::fs::remove_dir_all(&dir);
    assert_not_a_file(result, &link, "character device");
}

#[test]
fn a_directory_named_like_a_case_is_rejected() {
    let dir = temp_dir("dir");
    let sub = dir.join("cases.safetensors");
    std::fs::create_dir(&sub).expect("mkdir");
    let result = load_within_deadline(&sub);
    let _ = std::fs::remove_dir_all(&dir);
    assert_not_a_file(result, &sub, "directory");
}

#[test]
fn a_file_over_the_size_cap_is_rejected_by_name() {
    let dir = temp_dir("big");
    let big = dir.join("big.safetensors");
    // Sparse: takes no disk space.
    let f = std::fs::File::create(&big).expect("create");
    f.set_len(MAX_CASE_BYTES + 1).expect("set_len");
    drop(f);
    let result = load_within_deadline(&big);
    let _ = std::fs::remove_dir_all(&dir);
    let e = result.expect_err("must be rejected");
    assert!(
        matches!(&e, GoldenError::TooLarge { path, size, limit } if *path == big && *size == MAX_CASE_BYTES + 1 && *limit == MAX_CASE_BYTES),
        "{e}"
    );
    assert!(e.to_string().contains("big.safetensors"), "{e}");
}
