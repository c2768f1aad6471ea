//! Files the workspace's tools read and write (the GEMM tuning file, hip-doctor's report,
//! train_gpt2's checkpoints), in one place so that each rule holds everywhere:
//!
//! - [`read_bounded`]: only a regular file, checked on the opened descriptor (opened without
//!   blocking, so a FIFO planted at the path never hangs), read up to a size limit (so
//!   `/dev/zero` or a huge file never exhausts memory).
//! - [`write_atomic`]: a temporary file beside the target, synced, then renamed over it. A reader
//!   never sees half a file, a failed write (a full disk) leaves the previous file whole, and a
//!   symlink planted at the target is replaced itself, never followed. An existing file keeps its
//!   permission bits (a shared 0644 file stays 0644).
//! - [`FileLock`]: an advisory `flock` held while it lives (released by the kernel when the
//!   process dies, also across PID namespaces and, on NFS, across nodes).
//! - [`Owner`]: who made a temporary (host name, boot id, pid) and whether it provably still
//!   runs, for cleanups that must never remove what a live run owns.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What kind of file `t` is, in words, for errors.
pub fn kind_name(t: std::fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a file"
    }
}

/// Open `path` for reading only if it is a regular file (following symlinks). The open does
/// not block (`O_NONBLOCK`: a FIFO without writer would), and the type is checked on the
/// opened descriptor, so a path swapped between a check and the open cannot slip through.
/// Returns the file and its size.
pub fn open_regular(path: &Path) -> std::io::Result<(File, u64)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is {}, not a regular file", kind_name(meta.file_type())),
        ));
    }
    Ok((file, meta.len()))
}

/// The bytes of the regular file `path`, at most `cap` of them: a larger file is an error
/// saying its size and the limit (its content is never echoed).
pub fn read_bounded(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let too_big = |len: u64| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("is {len} bytes, more than the {cap} allowed"),
        )
    };
    let (file, len) = open_regular(path)?;
    if len > cap {
        return Err(too_big(len));
    }
    let mut buf = Vec::with_capacity(len as usize);
    file.take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Err(too_big(buf.len() as u64));
    }
    Ok(buf)
}

/// The directory `path` lives in (`.` for a bare name).
fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The permission bits the file written to `path` gets: those of the regular file there now
/// (not through a symlink: a planted link's target says nothing about ours), else `0o666`
/// less the umask, as a plain create would.
fn mode_for(path: &Path) -> Option<u32> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(std::fs::Metadata::is_file)
        .map(|m| m.permissions().mode() & 0o7777)
}

/// Write `bytes` to `path` atomically: a temporary file beside it (a fresh random name,
/// created exclusively), synced, then renamed over `path` and the directory synced. On any
/// failure the temporary is removed and `path` is as it was. The rename replaces a symlink at
/// `path` itself; an existing regular file's permission bits are kept.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = parent_dir(path);
    let prefix = format!(
        ".{}.",
        path.file_name()
            .map_or("tmp".into(), |n| n.to_string_lossy())
    );
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o666))
        .tempfile_in(&dir)?;
    if let Some(mode) = mode_for(path) {
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// An exclusive advisory lock (`flock`) on a file, released when dropped or when the process
/// ends however it ends.
#[derive(Debug)]
pub struct FileLock {
    file: File,
}

impl FileLock {
    /// Lock `path` (created if missing, mode 0o666 less the umask; a symlink is not followed),
    /// waiting for another holder to release it.
    pub fn acquire(path: &Path) -> std::io::Result<FileLock> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o666)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(path)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        Ok(FileLock { file })
    }

    /// Lock the already open `file` without waiting: `Ok(None)` when another open file (in
    /// this or any process) holds a lock on it.
    pub fn try_lock(file: File) -> std::io::Result<Option<FileLock>> {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(FileLock { file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The locked file.
    pub fn file(&self) -> &File {
        &self.file
    }
}

/// Who made a temporary: the host name, the kernel's boot id and the process id. A pid alone
/// names no process outside its own PID namespace (another container, another node on a shared
/// file system); the three together, with the owner's lock, do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// `/proc/sys/kernel/hostname`.
    pub host: String,
    /// `/proc/sys/kernel/random/boot_id`.
    pub boot_id: String,
    /// The process id, in the owner's PID namespace.
    pub pid: u32,
}

/// Whether the owner of a temporary still runs, as far as can be proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// Its lock is free: the process that held it has ended.
    Dead,
    /// Its lock is held, or nothing proves it ended: keep what it owns.
    AliveOrUnknown,
}

fn proc_line(path: &str) -> String {
    read_bounded(Path::new(path), 4096)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

impl Owner {
    /// This process.
    pub fn this() -> Owner {
        Owner {
            host: proc_line("/proc/sys/kernel/hostname"),
            boot_id: proc_line("/proc/sys/kernel/random/boot_id"),
            pid: std::process::id(),
        }
    }

    /// The record written into an owner file: `host <name>\nboot_id <id>\npid <pid>\n`.
    pub fn record(&self) -> String {
        format!(
            "host {}\nboot_id {}\npid {}\n",
            self.host, self.boot_id, self.pid
        )
    }

    /// Parse [`Owner::record`]'s text (`None` when malformed).
    pub fn parse(text: &str) -> Option<Owner> {
        let mut lines = text.lines();
        let mut field = |name: &str| -> Option<String> {
            let (k, v) = lines.next()?.split_once(' ')?;
            (k == name).then(|| v.to_string())
        };
        Some(Owner {
            host: field("host")?,
            boot_id: field("boot_id")?,
            pid: field("pid")?.parse().ok()?,
        })
    }

    /// Create the owner file `path` (exclusively: never an existing file or through a symlink),
    /// write this process's record into it and lock it. Keep the returned lock for as long as
    /// the temporary it marks is in use.
    pub fn claim(path: &Path) -> std::io::Result<FileLock> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(path)?;
        // Locked before the record is written: a cleaner that takes the lock first finds no
        // record and keeps the file (see `liveness`); waiting here outlasts its look.
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)?;
        let mut lock = FileLock { file };
        lock.file.write_all(Owner::this().record().as_bytes())?;
        Ok(lock)
    }

    /// Whether the owner recorded in the owner file `path` still runs. The lock decides: held
    /// means alive (whatever its pid means here). Where locks are not supported (some network
    /// file systems), only a record of this host and boot whose pid no longer runs is dead.
    /// A missing, unreadable or malformed owner file is [`Liveness::AliveOrUnknown`].
    pub fn liveness(path: &Path) -> Liveness {
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return Liveness::AliveOrUnknown;
        };
        if !meta.is_file() {
            return Liveness::AliveOrUnknown;
        }
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(
                (rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK).bits() as i32,
            )
            .open(path)
        else {
            return Liveness::AliveOrUnknown;
        };
        let record = || {
            read_bounded(path, 4096)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|t| Owner::parse(&t))
        };
        match FileLock::try_lock(file) {
            // Free, and a record written: its owner has ended. Free without a record: an owner
            // between creating and locking it, or one killed right then; either way kept.
            Ok(Some(_)) if record().is_some() => Liveness::Dead,
            Ok(_) => Liveness::AliveOrUnknown,
            Err(_) => {
                let here = Owner::this();
                match record() {
                    Some(o)
                        if o.host == here.host
                            && !here.boot_id.is_empty()
                            && o.boot_id == here.boot_id
                            && !Path::new("/proc").join(o.pid.to_string()).exists() =>
                    {
                        Liveness::Dead
                    }
                    _ => Liveness::AliveOrUnknown,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
