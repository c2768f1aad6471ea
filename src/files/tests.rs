use super::*;
use std::time::{Duration, Instant};

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

#[test]
fn a_fifo_a_device_or_a_huge_file_is_refused_quickly_and_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let t = Instant::now();
    let e = read_bounded(&fifo, 1 << 20).unwrap_err();
    assert!(e.to_string().contains("FIFO"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));
    let e = read_bounded(Path::new("/dev/zero"), 1 << 20).unwrap_err();
    assert!(e.to_string().contains("character device"), "{e}");
    // 256 MiB of NULs (sparse): its size and the limit, not its content.
    let big = dir.path().join("nuls");
    File::create(&big).unwrap().set_len(256 << 20).unwrap();
    let e = read_bounded(&big, 1 << 20).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("268435456") && text.contains("1048576"),
        "{text}"
    );
    assert!(text.len() < 200, "{text}");
    std::fs::write(dir.path().join("ok"), b"abc").unwrap();
    assert_eq!(read_bounded(&dir.path().join("ok"), 3).unwrap(), b"abc");
}

#[test]
fn an_atomic_write_replaces_a_planted_symlink_and_keeps_the_mode() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, b"precious").unwrap();
    let link = dir.path().join("report.json");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    write_atomic(&link, b"new").unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
    assert_eq!(std::fs::read(&link).unwrap(), b"new");

    let shared = dir.path().join("shared.txt");
    std::fs::write(&shared, b"old").unwrap();
    for mode in [0o644, 0o640, 0o600] {
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(mode)).unwrap();
        write_atomic(&shared, b"new").unwrap();
        let got = std::fs::metadata(&shared).unwrap().permissions().mode() & 0o7777;
        assert_eq!(got, mode, "{mode:o} became {got:o}");
    }
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
}

/// A tmpfs of `kib` KiB mounted on a new directory (root only), unmounted when dropped.
pub(crate) struct TinyTmpfs(pub tempfile::TempDir);

impl TinyTmpfs {
    pub(crate) fn mount(kib: u32) -> Option<TinyTmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        Some(TinyTmpfs(dir))
    }
}

impl Drop for TinyTmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[test]
fn a_full_disk_leaves_the_previous_file_whole() {
    let Some(fs) = TinyTmpfs::mount(64) else {
        return;
    };
    let path = fs.0.path().join("report.json");
    std::fs::write(&path, b"previous report").unwrap();
    let e = write_atomic(&path, &vec![b'x'; 256 << 10]).unwrap_err();
    assert!(e.to_string().contains("os error 28"), "{e}");
    assert_eq!(std::fs::read(&path).unwrap(), b"previous report");
    let left: Vec<_> = std::fs::read_dir(fs.0.path()).unwrap().collect();
    assert_eq!(left.len(), 1, "a temporary was left");
}

#[test]
fn an_owner_is_alive_while_its_lock_is_held_whatever_its_pid() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".owner");
    let lock = Owner::claim(&path).unwrap();
    assert_eq!(
        Owner::parse(&std::fs::read_to_string(&path).unwrap()),
        Some(Owner::this())
    );
    assert_eq!(Owner::liveness(&path), Liveness::AliveOrUnknown);
    // A record naming a pid that does not run here (another PID namespace): the held lock
    // still says alive.
    std::fs::write(&path, "host elsewhere\nboot_id b\npid 4194304\n").unwrap();
    assert_eq!(Owner::liveness(&path), Liveness::AliveOrUnknown);
    drop(lock);
    assert_eq!(Owner::liveness(&path), Liveness::Dead);
    // No record (killed between create and write), no file, a symlink: never provably dead.
    std::fs::write(&path, "").unwrap();
    assert_eq!(Owner::liveness(&path), Liveness::AliveOrUnknown);
    let missing = dir.path().join("missing");
    assert_eq!(Owner::liveness(&missing), Liveness::AliveOrUnknown);
    let link = dir.path().join("link");
    std::fs::write(&missing, Owner::this().record()).unwrap();
    std::os::unix::fs::symlink(&missing, &link).unwrap();
    assert_eq!(Owner::liveness(&link), Liveness::AliveOrUnknown);
    assert!(Owner::claim(&missing).is_err(), "claimed an existing file");
}
