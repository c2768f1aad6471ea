//! Region files: a directory too small for a region is an error (never a SIGBUS), and entries
//! planted under a region's name are never followed or trusted.

use super::*;
use std::os::unix::fs::symlink;

fn soon() -> Instant {
    Instant::now() + Duration::from_millis(300)
}

fn name(tag: &str) -> String {
    format!("{PREFIX}unit-{}-{tag}", std::process::id())
}

/// A tmpfs of `kib` KiB (root only; `None` elsewhere), unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(kib: usize) -> Option<Tmpfs> {
        let dir = std::env::temp_dir().join(name(&format!("mnt{kib}")));
        std::fs::create_dir_all(&dir).ok()?;
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = std::fs::remove_dir(&dir);
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        Some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_region_directory_too_small_is_an_error_naming_it_and_the_size() {
    // 1 MiB: room for the header, not for two ranks' slots (4 MiB and a bit).
    let Some(fs) = Tmpfs::mount(1024) else {
        return;
    };
    let n = name("small");
    let r = Region::open_in(&fs.0, &n, 2, soon());
    let Err(e) = r else {
        // Before the reservation, the first touch of an unbacked page killed the process.
        let r = r.unwrap();
        // SAFETY: the last byte of rank 1's p2p slot, inside the mapping.
        unsafe { *r.p2p_slot(1).add(SLOT - 1) = 1 };
        panic!("a region larger than its directory was mapped");
    };
    let need = region_size(2).to_string();
    assert!(
        e.message.contains(&fs.0.display().to_string()) && e.message.contains(&need),
        "{e:?}"
    );
    assert!(!fs.0.join(&n).exists(), "the failed region file was left");
}

#[test]
fn planted_entries_are_never_followed_or_trusted() {
    let dir = std::env::temp_dir().join(name("planted"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, vec![7u8; region_size(2)]).unwrap();
    // A symlink to a file of a region's size.
    let link = name("link");
    symlink(&victim, dir.join(&link)).unwrap();
    let e = Region::open_in(&dir, &link, 2, soon()).err().unwrap();
    assert!(e.message.contains("symbolic link"), "{e:?}");
    assert!(std::fs::read(&victim).unwrap().iter().all(|&b| b == 7));
    // A FIFO: no wait for a peer, an error at once.
    let fifo = name("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(dir.join(&fifo))
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    let e = Region::open_in(&dir, &fifo, 2, Instant::now() + Duration::from_secs(20))
        .err()
        .unwrap();
    assert!(e.message.contains("not a regular file"), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // Wrong magic: refused (after the creator's grace time), not used.
    let bad = name("magic");
    std::fs::write(dir.join(&bad), vec![0xAB; region_size(2)]).unwrap();
    let e = Region::open_in(&dir, &bad, 2, soon()).err().unwrap();
    assert!(e.message.contains("magic"), "{e:?}");
    // The right magic, a huge rank count in the header.
    let huge = name("huge");
    let mut bytes = vec![0u8; region_size(2)];
    bytes[..8].copy_from_slice(&MAGIC.to_le_bytes());
    bytes[H_NRANKS..H_NRANKS + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(dir.join(&huge), &bytes).unwrap();
    let e = Region::open_in(&dir, &huge, 2, soon()).err().unwrap();
    assert!(e.message.contains("4294967295 ranks"), "{e:?}");
    // The right header in a file far larger than any region.
    let big = name("big");
    bytes[H_NRANKS..H_NRANKS + 4].copy_from_slice(&2u32.to_le_bytes());
    std::fs::write(dir.join(&big), &bytes).unwrap();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(&big))
        .unwrap();
    f.set_len(region_size(MAX_RANKS) as u64 + 4096).unwrap();
    let e = Region::open_in(&dir, &big, 2, soon()).err().unwrap();
    assert!(e.message.contains("more than a region"), "{e:?}");
    // Nothing was removed or changed.
    for n in [&link, &fifo, &bad, &huge, &big] {
        assert!(dir.join(n).symlink_metadata().is_ok(), "{n} removed");
    }
    assert!(std::fs::read(&victim).unwrap().iter().all(|&b| b == 7));
    std::fs::remove_dir_all(&dir).unwrap();
}
