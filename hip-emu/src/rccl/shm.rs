//! The shared region the ranks of one communicator meet in: a file named by the unique id,
//! mapped `MAP_SHARED` by every rank (threads of one process map it once per communicator,
//! other processes map the same file), and a futex word to sleep on.
//!
//! ```text
//! | header (4 KiB) | control block of rank 0..n (2 KiB each) | collective slots (n x SLOT) | p2p slots (n x SLOT) |
//! ```
//! Every field that ranks share is an atomic at a fixed offset; data slots are plain bytes whose
//! hand-over is ordered by a Release store / Acquire load of a counter (see `transfer`). The file is
//! created with `O_EXCL` by the first rank to arrive and unlinked as soon as every rank has
//! joined (the mappings stay valid), so a finished or crashed run leaves nothing behind once all
//! ranks joined; files of runs that died before that are removed by the next `ncclGetUniqueId`
//! when none of the processes they name is alive.
//!
//! A file in the region directory is never trusted by its name alone: it is opened without
//! following a symlink and without blocking on a FIFO, and used only when it is a regular file
//! of this user whose size and header (magic, rank count) are a region's. The creator reserves
//! the whole file (`posix_fallocate`) before mapping it, so a region directory too small for it
//! (Docker's 64 MiB `/dev/shm`) is an error naming the directory and the bytes needed, never a
//! SIGBUS on the first touch of an unbacked page.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{NcclResult, RcclFail};

/// At most this many ranks per communicator.
pub const MAX_RANKS: usize = 64;
/// Bytes of each rank's collective slot and of its p2p slot: collectives and transfers larger
/// than this move in several rounds.
pub const SLOT: usize = 1 << 20;
/// Prefix of every region file name.
pub const PREFIX: &str = "hipemu-rccl-";

const MAGIC: u64 = 0x4849_5045_4D55_5243; // "HIPEMURC"
const HEADER: usize = 4096;
const CTRL: usize = 2048;
/// Bytes of the abort message kept in the header.
const ABORT_MSG: usize = 2048;

// Header fields.
const H_MAGIC: usize = 0;
const H_NRANKS: usize = 8;
const H_BELL: usize = 12;
const H_JOINED: usize = 16;
const H_ABORT: usize = 20;
const H_ABORT_CODE: usize = 24;
const H_CREATOR: usize = 28;
const H_ABORT_TEXT: usize = 1024;

// Control block fields (offsets inside a rank's block).
pub const C_STATE: usize = 0;
pub const C_PID: usize = 4;
pub const C_DEVICE: usize = 8;
/// Collectives this rank's host has enqueued (for watchdog messages).
pub const C_HOST_CALLS: usize = 16;
/// Last collective step whose data this rank posted / finished reading.
pub const C_POSTED: usize = 24;
pub const C_CONSUMED: usize = 32;
/// The descriptor of the posted step: call, kind, dtype, op, root, count, round.
pub const C_DESC: usize = 40;
/// `sent[peer]`: p2p chunks this rank wrote for `peer`; `acked[peer]`: chunks it consumed from
/// `peer`.
pub const C_SENT: usize = 128;
pub const C_ACKED: usize = C_SENT + 8 * MAX_RANKS;

/// Rank states.
pub const STATE_FREE: u32 = 0;
pub const STATE_JOINED: u32 = 1;

/// Total file size for `nranks`.
pub fn region_size(nranks: usize) -> usize {
    HEADER + nranks * CTRL + 2 * nranks * SLOT
}

/// Directory holding region files: `/dev/shm` when present, else the temporary directory.
pub fn region_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

/// One rank's mapping of a communicator's region.
pub struct Region {
    base: *mut u8,
    len: usize,
    pub nranks: usize,
    pub path: PathBuf,
}

// SAFETY: the mapping is shared memory accessed only through atomics and through byte copies
// whose hand-over between ranks is ordered by those atomics; the pointer itself is never
// freed while a `Region` exists (munmap in Drop).
unsafe impl Send for Region {}
// SAFETY: as above: `&Region` only exposes atomics and explicitly synchronised byte ranges.
unsafe impl Sync for Region {}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping created in `map`, used by nobody else
        // in this process once the last reference to this Region is gone.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

fn sys_fail(what: &str, path: &std::path::Path) -> RcclFail {
    RcclFail::new(
        NcclResult::SYSTEM_ERROR,
        format!(
            "{what} {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        ),
    )
}

fn cpath(path: &std::path::Path) -> Result<CString, RcclFail> {
    CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
        RcclFail::new(
            NcclResult::INTERNAL_ERROR,
            format!("{} contains a NUL byte", path.display()),
        )
    })
}

/// True when process `pid` exists (or we may not signal it) and is not a zombie (an exited
/// child its parent has not reaped yet, e.g. a rank spawned by another rank).
pub fn pid_alive(pid: u32) -> bool {
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // "pid (comm) S ...": the state follows the last ')'.
        if let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.trim_start()) {
            if rest.starts_with('Z') || rest.starts_with('X') {
                return false;
            }
        }
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; nothing is delivered.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

fn my_pid() -> u32 {
    std::process::id()
}

impl Region {
    fn map(fd: &OwnedFd, len: usize, nranks: usize, path: PathBuf) -> Result<Region, RcclFail> {
        // SAFETY: a new shared mapping of `len` bytes of an open file, at an address the
        // kernel chooses; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(sys_fail("mmap of", &path));
        }
        Ok(Region {
            base: base.cast(),
            len,
            nranks,
            path,
        })
    }

    /// Create (first rank) or open the region `name` for `nranks` ranks. Waits at most until
    /// `deadline` for the creator to finish; a stale file (its creator and every rank it
    /// names dead) is removed and created afresh.
    pub fn open(name: &str, nranks: usize, deadline: Instant) -> Result<Region, RcclFail> {
        Region::open_in(&region_dir(), name, nranks, deadline)
    }

    /// [`Region::open`] in the directory `dir`.
    pub(crate) fn open_in(
        dir: &std::path::Path,
        name: &str,
        nranks: usize,
        deadline: Instant,
    ) -> Result<Region, RcclFail> {
        let path = dir.join(name);
        let c = cpath(&path)?;
        loop {
            // SAFETY: open(2) with a NUL-terminated path; the returned fd is owned below.
            let fd = unsafe {
                libc::open(
                    c.as_ptr(),
                    libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd >= 0 {
                // SAFETY: a freshly opened descriptor nobody else owns.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                let len = region_size(nranks);
                // SAFETY: resizing the file we just created.
                if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
                    let err = sys_fail("ftruncate of", &path);
                    // SAFETY: removing the file we created.
                    unsafe { libc::unlink(c.as_ptr()) };
                    return Err(err);
                }
                if let Err(err) = reserve(&fd, len, dir, &path) {
                    // SAFETY: removing the file we created.
                    unsafe { libc::unlink(c.as_ptr()) };
                    return Err(err);
                }
                let r = Region::map(&fd, len, nranks, path.clone())?;
                r.u32(H_NRANKS).store(nranks as u32, Ordering::Relaxed);
                r.u32(H_CREATOR).store(my_pid(), Ordering::Relaxed);
                r.u64(H_MAGIC).store(MAGIC, Ordering::Release);
                return Ok(r);
            }
            let errno = std::io::Error::last_os_error().raw_os_error();
            if errno != Some(libc::EEXIST) {
                return Err(sys_fail("cannot create", &path));
            }
            let fd = match open_existing(&c, &path) {
                Ok(fd) => fd,
                // Unlinked between our two opens (all ranks of a previous use joined): retry.
                Err(None) if Instant::now() <= deadline => continue,
                Err(None) => return Err(sys_fail("cannot open", &path)),
                Err(Some(planted)) => return Err(planted),
            };
            let size = file_size(&fd);
            if size > region_size(MAX_RANKS) as u64 {
                return Err(not_a_region(
                    &path,
                    format!(
                        "it has {size} bytes, more than a region of {MAX_RANKS} ranks ({})",
                        region_size(MAX_RANKS)
                    ),
                ));
            }
            if size < HEADER as u64 {
                if Instant::now() > deadline {
                    return Err(RcclFail::new(
                        NcclResult::SYSTEM_ERROR,
                        format!("{} was never initialised by its creator", path.display()),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let r = Region::map(&fd, size as usize, 0, path.clone())?;
            while r.u64(H_MAGIC).load(Ordering::Acquire) != MAGIC {
                if Instant::now() > deadline {
                    return Err(not_a_region(
                        &path,
                        "its header never got the region magic (a creator that died at once, \
                         or a file that is not a region)"
                            .into(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            let theirs = r.u32(H_NRANKS).load(Ordering::Relaxed) as usize;
            if !(1..=MAX_RANKS).contains(&theirs) || size != region_size(theirs) as u64 {
                return Err(not_a_region(
                    &path,
                    format!(
                        "its header says {theirs} ranks (1 to {MAX_RANKS}) in a file of {size} \
                         bytes"
                    ),
                ));
            }
            if r.is_stale(theirs) {
                drop(r);
                // SAFETY: removing a file whose every user is dead.
                unsafe { libc::unlink(c.as_ptr()) };
                continue;
            }
            if theirs != nranks {
                return Err(RcclFail::new(
                    NcclResult::INVALID_USAGE,
                    format!(
                        "this rank was initialised with nranks={nranks} but the communicator of \
                         this unique id was created with nranks={theirs}: every rank must pass \
                         the same nranks"
                    ),
                ));
            }
            if (size as usize) < region_size(nranks) {
                return Err(RcclFail::new(
                    NcclResult::SYSTEM_ERROR,
                    format!(
                        "{} has {size} bytes, {} expected",
                        path.display(),
                        region_size(nranks)
                    ),
                ));
            }
            let mut r = r;
            r.nranks = nranks;
            return Ok(r);
        }
    }

    /// A region none of whose recorded processes is alive (only checked on files that are not
    /// ours).
    fn is_stale(&self, nranks: usize) -> bool {
        let creator = self.u32(H_CREATOR).load(Ordering::Relaxed);
        if creator == my_pid() || pid_alive(creator) {
            return false;
        }
        let max = nranks.min(MAX_RANKS);
        let ctrl_end = HEADER + max * CTRL;
        if ctrl_end > self.len {
            return true;
        }
        (0..max).all(|r| {
            let pid = self.ctrl_u32(r, C_PID).load(Ordering::Relaxed);
            self.ctrl_u32(r, C_STATE).load(Ordering::Relaxed) == STATE_FREE
                || (pid != my_pid() && !pid_alive(pid))
        })
    }

    /// Remove region files in the region directory whose processes are all gone (left by runs
    /// that died before every rank joined).
    pub fn remove_stale_files() {
        let dir = region_dir();
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if !name.starts_with(PREFIX) {
                continue;
            }
            let path = dir.join(name);
            let Ok(c) = cpath(&path) else { continue };
            // Only a regular file of ours, never through a symlink or a FIFO.
            let Ok(fd) = open_existing(&c, &path) else {
                continue;
            };
            let size = file_size(&fd) as usize;
            if !(HEADER..=region_size(MAX_RANKS)).contains(&size) {
                continue;
            }
            let Ok(r) = Region::map(&fd, size, 0, path.clone()) else {
                continue;
            };
            if r.u64(H_MAGIC).load(Ordering::Acquire) != MAGIC {
                continue;
            }
            let n = r.u32(H_NRANKS).load(Ordering::Relaxed) as usize;
            if !(1..=MAX_RANKS).contains(&n) || size != region_size(n) {
                continue;
            }
            if r.is_stale(n) {
                // SAFETY: removing a file whose every user is dead.
                unsafe { libc::unlink(c.as_ptr()) };
            }
        }
    }

    /// Remove the file (the mappings stay valid); a missing file is fine.
    pub fn unlink(&self) {
        if let Ok(c) = cpath(&self.path) {
            // SAFETY: unlink(2) with a NUL-terminated path.
            unsafe { libc::unlink(c.as_ptr()) };
        }
    }

    fn at<T>(&self, offset: usize) -> &T {
        assert!(
            offset + std::mem::size_of::<T>() <= self.len
                && offset % std::mem::align_of::<T>() == 0,
            "region field {offset} out of bounds or misaligned"
        );
        // SAFETY: in bounds (asserted) of a live mapping, naturally aligned (mapping is page
        // aligned, offsets are multiples of the size), and only accessed atomically.
        unsafe { &*self.base.add(offset).cast::<T>() }
    }

    pub fn u32(&self, offset: usize) -> &AtomicU32 {
        self.at(offset)
    }

    pub fn u64(&self, offset: usize) -> &AtomicU64 {
        self.at(offset)
    }

    fn ctrl(&self, rank: usize, field: usize) -> usize {
        assert!(rank < MAX_RANKS, "rank {rank} >= {MAX_RANKS}");
        HEADER + rank * CTRL + field
    }

    pub fn ctrl_u32(&self, rank: usize, field: usize) -> &AtomicU32 {
        self.u32(self.ctrl(rank, field))
    }

    pub fn ctrl_i32(&self, rank: usize, field: usize) -> &AtomicI32 {
        self.at(self.ctrl(rank, field))
    }

    pub fn ctrl_u64(&self, rank: usize, field: usize) -> &AtomicU64 {
        self.u64(self.ctrl(rank, field))
    }

    /// Start of `rank`'s collective slot.
    pub fn coll_slot(&self, rank: usize) -> *mut u8 {
        assert!(rank < self.nranks);
        // SAFETY: inside the mapping (region_size covers n collective slots).
        unsafe { self.base.add(HEADER + self.nranks * CTRL + rank * SLOT) }
    }

    /// Start of `rank`'s p2p slot.
    pub fn p2p_slot(&self, rank: usize) -> *mut u8 {
        assert!(rank < self.nranks);
        // SAFETY: inside the mapping (region_size covers n p2p slots after the collective ones).
        unsafe {
            self.base
                .add(HEADER + self.nranks * CTRL + (self.nranks + rank) * SLOT)
        }
    }

    pub fn joined(&self) -> &AtomicU32 {
        self.u32(H_JOINED)
    }

    /// Wake every rank sleeping in [`Region::sleep`].
    pub fn ring(&self) {
        let bell = self.u32(H_BELL);
        bell.fetch_add(1, Ordering::Release);
        // SAFETY: FUTEX_WAKE on an aligned u32 of a live shared mapping (not the private
        // flag: waiters may be other processes).
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                bell.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0,
            )
        };
    }

    /// The bell's value, to pass to [`Region::sleep`] after checking a condition.
    pub fn bell(&self) -> u32 {
        self.u32(H_BELL).load(Ordering::Acquire)
    }

    /// Sleep until the bell rings after `seen` was read, or `timeout` passes.
    pub fn sleep(&self, seen: u32, timeout: Duration) {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: FUTEX_WAIT on an aligned u32 of a live shared mapping, with a valid relative
        // timeout; it returns at once if the value already differs from `seen`.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                self.u32(H_BELL).as_ptr(),
                libc::FUTEX_WAIT,
                seen,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0,
            )
        };
    }

    /// Mark the communicator aborted with `code` and `message` (the first abort wins).
    pub fn abort(&self, code: NcclResult, message: &str) {
        if self
            .u32(H_ABORT)
            .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            let bytes = message.as_bytes();
            let n = bytes.len().min(ABORT_MSG - 1);
            // SAFETY: the abort text area lies inside the header; only the rank that won the
            // CAS above writes it, and readers read it only after seeing state 2 (Release below).
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.add(H_ABORT_TEXT), n);
                *self.base.add(H_ABORT_TEXT + n) = 0;
            }
            self.u32(H_ABORT_CODE).store(code.0, Ordering::Relaxed);
            self.u32(H_ABORT).store(2, Ordering::Release);
        }
        self.ring();
    }

    /// The abort, once fully written.
    pub fn aborted(&self) -> Option<(NcclResult, String)> {
        if self.u32(H_ABORT).load(Ordering::Acquire) != 2 {
            return None;
        }
        // SAFETY: state 2 means the text was written and NUL-terminated within ABORT_MSG bytes.
        let text = unsafe {
            let p = self.base.add(H_ABORT_TEXT);
            let bytes = std::slice::from_raw_parts(p, ABORT_MSG);
            let end = bytes.iter().position(|&b| b == 0).unwrap_or(ABORT_MSG);
            String::from_utf8_lossy(&bytes[..end]).into_owned()
        };
        Some((
            NcclResult(self.u32(H_ABORT_CODE).load(Ordering::Relaxed)),
            text,
        ))
    }
}

/// An error about a file in the region directory that is not a region of this user.
fn not_a_region(path: &std::path::Path, why: String) -> RcclFail {
    RcclFail::new(
        NcclResult::SYSTEM_ERROR,
        format!(
            "{} is not an emulated RCCL region: {why}; it is not used. Remove it if no run of \
             yours made it",
            path.display()
        ),
    )
}

/// Open an existing region file: `Err(None)` when it vanished (retry), `Err(Some(_))` when the
/// entry is not a regular file of this user (a symlink, a FIFO, another user's file).
fn open_existing(c: &CString, path: &std::path::Path) -> Result<OwnedFd, Option<RcclFail>> {
    // SAFETY: open(2) with a NUL-terminated path; the returned fd is owned below. O_NOFOLLOW:
    // a symlink fails (ELOOP); O_NONBLOCK: a FIFO does not wait for a peer.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENOENT) => None,
            Some(libc::ELOOP) => Some(not_a_region(path, "it is a symbolic link".into())),
            _ => Some(not_a_region(path, format!("it cannot be opened ({e})"))),
        });
    }
    // SAFETY: a freshly opened descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fstat on an open descriptor into a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(Some(sys_fail("fstat of", path)));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Some(not_a_region(path, "it is not a regular file".into())));
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if st.st_uid != me {
        return Err(Some(not_a_region(
            path,
            format!("it belongs to user {}, not to this user ({me})", st.st_uid),
        )));
    }
    Ok(fd)
}

/// Reserve `len` bytes of the new region file `fd` in `dir` (mapped pages of a file without
/// backing kill the process with SIGBUS on first touch).
fn reserve(
    fd: &OwnedFd,
    len: usize,
    dir: &std::path::Path,
    path: &std::path::Path,
) -> Result<(), RcclFail> {
    // SAFETY: posix_fallocate on an open descriptor of a file we created; it returns the error
    // number instead of setting errno.
    let rc = unsafe { libc::posix_fallocate(fd.as_raw_fd(), 0, len as libc::off_t) };
    if rc == 0 {
        return Ok(());
    }
    let why = std::io::Error::from_raw_os_error(rc);
    let free = statvfs_free(dir).map_or(String::new(), |f| format!(" ({f} bytes free)"));
    Err(RcclFail::new(
        NcclResult::SYSTEM_ERROR,
        format!(
            "{}{free} cannot hold the emulated RCCL region {}: it needs {len} bytes ({why}); \
             give it more room (Docker: --shm-size) or use fewer ranks",
            dir.display(),
            path.display()
        ),
    ))
}

/// Bytes available to this user in the file system of `dir`.
fn statvfs_free(dir: &std::path::Path) -> Option<u64> {
    let c = cpath(dir).ok()?;
    // SAFETY: statvfs into a zeroed buffer with a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some(st.f_bavail as u64 * st.f_frsize as u64)
}

fn file_size(fd: &OwnedFd) -> u64 {
    // SAFETY: fstat on an open descriptor into a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return 0;
    }
    st.st_size as u64
}

#[cfg(test)]
mod planted_tests;

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid that no longer exists (a reaped child).
    fn dead_pid() -> u32 {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    }

    fn make_stale(r: &Region) {
        let dead = dead_pid();
        r.u32(H_CREATOR).store(dead, Ordering::Relaxed);
        r.ctrl_u32(0, C_STATE)
            .store(STATE_JOINED, Ordering::Relaxed);
        r.ctrl_u32(0, C_PID).store(dead, Ordering::Relaxed);
    }

    #[test]
    fn stale_files_are_replaced_or_removed_and_live_ones_checked() {
        let name = format!("{PREFIX}unit-{}-stale", std::process::id());
        let path = region_dir().join(&name);
        let soon = || Instant::now() + Duration::from_secs(2);
        let first = Region::open(&name, 2, soon()).unwrap();
        // A live region with another rank count: invalid usage, not a silent mix-up.
        let Err(err) = Region::open(&name, 3, soon()) else {
            panic!("a second rank count was accepted")
        };
        assert_eq!(err.code, NcclResult::INVALID_USAGE, "{err:?}");
        assert!(err.message.contains("nranks=3") && err.message.contains("nranks=2"));
        // Left behind by a dead run: a new rank replaces it instead of waiting on it.
        make_stale(&first);
        drop(first);
        let fresh = Region::open(&name, 3, soon()).unwrap();
        assert_eq!(fresh.nranks, 3);
        assert_eq!(fresh.joined().load(Ordering::Relaxed), 0);
        make_stale(&fresh);
        drop(fresh);
        assert!(path.exists());
        Region::remove_stale_files();
        assert!(
            !path.exists(),
            "a stale file is removed by the next ncclGetUniqueId"
        );
    }

    #[test]
    fn zombies_and_missing_pids_are_dead() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(dead_pid()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        std::thread::sleep(Duration::from_millis(100));
        assert!(!pid_alive(pid), "an exited, unreaped child is not alive");
        child.wait().unwrap();
    }
}
