//! Communicators: unique ids, joining a region, the process's table of live communicators,
//! asynchronous errors, and the waits every rank does (with the watchdog).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::shm::{self, Region, MAX_RANKS, STATE_FREE, STATE_JOINED};
use super::{NcclResult, RcclFail};

/// A rank that has queued the collective others wait in is waited for this many times the
/// watchdog time: its stream is still running earlier (emulated, slow) work.
pub const SLOW_FACTOR: u32 = 10;

/// Bytes of `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;
/// First bytes of every unique id the emulator hands out.
const ID_MAGIC: &[u8; 8] = b"HIPEMUID";

/// `ncclUniqueId`: `struct { char internal[128]; }`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    pub internal: [std::ffi::c_char; UNIQUE_ID_BYTES],
}

impl UniqueId {
    /// A fresh id: the magic and a region name unique to this process and moment.
    pub fn generate() -> UniqueId {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(nanos ^ n);
        let name = format!(
            "{}{}-{nanos:x}-{n}-{:016x}",
            shm::PREFIX,
            std::process::id(),
            h.finish()
        );
        let mut id = UniqueId {
            internal: [0; UNIQUE_ID_BYTES],
        };
        let bytes = ID_MAGIC.iter().chain(name.as_bytes());
        for (d, s) in id.internal.iter_mut().zip(bytes) {
            *d = *s as std::ffi::c_char;
        }
        id
    }

    /// The region name inside, or why this is not an id of the emulator.
    pub fn region_name(&self) -> Result<String, RcclFail> {
        let bytes: Vec<u8> = self.internal.iter().map(|&c| c as u8).collect();
        let bad = || {
            RcclFail::invalid(
                "the ncclUniqueId was not made by the emulated RCCL's ncclGetUniqueId (wrong \
                 magic or name): pass every rank the id rank 0 obtained, byte for byte",
            )
        };
        if &bytes[..8] != ID_MAGIC {
            return Err(bad());
        }
        let end = bytes[8..].iter().position(|&b| b == 0).ok_or_else(bad)? + 8;
        let name = std::str::from_utf8(&bytes[8..end]).map_err(|_| bad())?;
        let ok = name.starts_with(shm::PREFIX)
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(bad());
        }
        Ok(name.to_owned())
    }
}

/// Host-side state of a communicator, behind a mutex.
#[derive(Default)]
pub struct HostState {
    /// The last operation queued on this communicator: `(stream id, seq)` on its device.
    pub last_op: Option<(u64, u64)>,
    /// Collectives queued so far (numbers them in messages: `ncclAllReduce #3`).
    pub calls: u64,
    /// The first asynchronous error.
    pub async_error: Option<RcclFail>,
}

/// One rank of a communicator, in this process.
pub struct Comm {
    pub region: Region,
    pub rank: usize,
    pub nranks: usize,
    pub device: i32,
    pub timeout: Duration,
    host: Mutex<HostState>,
    /// Collective steps this rank has taken (only the device executor touches it, in order).
    pub step: Mutex<u64>,
}

impl Comm {
    pub fn host(&self) -> MutexGuard<'_, HostState> {
        self.host.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// "rank 1 of 4 (device 1)".
    pub fn describe(&self) -> String {
        format!(
            "rank {} of {} (device {})",
            self.rank, self.nranks, self.device
        )
    }

    /// Record an asynchronous error (the first one is kept), print it once, and abort the
    /// communicator for every rank.
    pub fn fail(&self, fail: &RcclFail) {
        let mut h = self.host();
        if h.async_error.is_none() {
            eprintln!(
                "hip-emu rccl: {}: {} ({})",
                self.describe(),
                fail.message,
                fail.code.describe()
            );
            h.async_error = Some(fail.clone());
        }
        drop(h);
        self.region.abort(
            fail.code,
            &format!("rank {} failed: {}", self.rank, fail.message),
        );
    }

    /// The asynchronous error, if any.
    pub fn async_error(&self) -> Option<RcclFail> {
        self.host().async_error.clone()
    }

    /// Wait until `ready()` holds, sleeping on the region's bell. Fails when the communicator
    /// is aborted, when a rank named by `waiting_for()` belongs to a process that exited, or
    /// after the watchdog time, with `what` and the ranks `waiting_for()` names. For
    /// collective number `call`, ranks that have queued it (their stream is still busy with
    /// earlier work) are waited for up to [`SLOW_FACTOR`] times the watchdog time.
    pub fn wait(
        &self,
        call: Option<u64>,
        what: &dyn Fn() -> String,
        ready: &dyn Fn() -> bool,
        waiting_for: &dyn Fn() -> Vec<usize>,
    ) -> Result<(), RcclFail> {
        let start = Instant::now();
        let mut next_liveness = start + Duration::from_millis(100);
        loop {
            let seen = self.region.bell();
            // An abort wins over readiness: a rank that gave up must not leave the others
            // completing with its data as if nothing happened.
            if let Some((code, text)) = self.region.aborted() {
                return Err(RcclFail::new(
                    code,
                    format!("{}: the communicator was aborted ({text})", what()),
                ));
            }
            if ready() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= next_liveness {
                next_liveness = now + Duration::from_millis(100);
                for r in waiting_for() {
                    let pid = self.region.ctrl_u32(r, shm::C_PID).load(Ordering::Relaxed);
                    let joined = self
                        .region
                        .ctrl_u32(r, shm::C_STATE)
                        .load(Ordering::Acquire)
                        == STATE_JOINED;
                    if joined && !shm::pid_alive(pid) {
                        return Err(RcclFail::new(
                            NcclResult::REMOTE_ERROR,
                            format!("{}: rank {r} (process {pid}) exited", what()),
                        ));
                    }
                }
            }
            let elapsed = now.duration_since(start);
            if elapsed >= self.timeout {
                let missing = waiting_for();
                let queued = |r: usize| {
                    self.region
                        .ctrl_u64(r, shm::C_HOST_CALLS)
                        .load(Ordering::Acquire)
                };
                let coming = call.is_some_and(|c| missing.iter().all(|&r| queued(r) >= c));
                let limit = self.timeout * SLOW_FACTOR;
                if !(coming && elapsed < limit) {
                    let names: Vec<String> = missing.iter().map(|r| self.rank_status(*r)).collect();
                    let waited = if coming { limit } else { self.timeout };
                    return Err(RcclFail::new(
                        NcclResult::REMOTE_ERROR,
                        format!(
                            "{}: rank(s) {missing:?} did not arrive within {} ms \
                             ({}); raise {} if they are only slow",
                            what(),
                            waited.as_millis(),
                            names.join("; "),
                            super::TIMEOUT_VAR
                        ),
                    ));
                }
            }
            let left = if elapsed < self.timeout {
                self.timeout - elapsed
            } else {
                Duration::from_millis(50)
            }
            .min(Duration::from_millis(50));
            self.region.sleep(seen, left);
        }
    }

    /// What is known about rank `r`, for watchdog messages.
    fn rank_status(&self, r: usize) -> String {
        let reg = &self.region;
        if reg.ctrl_u32(r, shm::C_STATE).load(Ordering::Acquire) == STATE_FREE {
            return format!("rank {r} never joined the communicator");
        }
        let calls = reg.ctrl_u64(r, shm::C_HOST_CALLS).load(Ordering::Acquire);
        let pid = reg.ctrl_u32(r, shm::C_PID).load(Ordering::Relaxed);
        let dev = reg.ctrl_i32(r, shm::C_DEVICE).load(Ordering::Relaxed);
        format!("rank {r} (process {pid}, device {dev}) has queued {calls} collective(s)")
    }

    /// Wait until every rank joined; then check that no two share a device of one process.
    pub fn wait_joined(&self) -> Result<(), RcclFail> {
        let n = self.nranks;
        let reg = &self.region;
        let state = |r: usize| reg.ctrl_u32(r, shm::C_STATE).load(Ordering::Acquire);
        let result = self.wait(
            None,
            &|| format!("ncclCommInitRank ({})", self.describe()),
            &|| reg.joined().load(Ordering::Acquire) as usize >= n,
            &|| (0..n).filter(|&r| state(r) == STATE_FREE).collect(),
        );
        // Every rank has mapped the region (or the wait failed): the name is no longer needed.
        reg.unlink();
        result?;
        let me = self.rank;
        let key = |r: usize| {
            (
                reg.ctrl_u32(r, shm::C_PID).load(Ordering::Relaxed),
                reg.ctrl_i32(r, shm::C_DEVICE).load(Ordering::Relaxed),
            )
        };
        for r in 0..n {
            if r != me && key(r) == key(me) {
                return Err(RcclFail::usage(format!(
                    "ranks {} and {} of one communicator both use device {} of process {}: \
                     like NCCL, the emulated RCCL needs one device per rank (duplicate GPU)",
                    r.min(me),
                    r.max(me),
                    self.device,
                    key(me).0
                )));
            }
        }
        Ok(())
    }
}

/// Join the region named by `id` as `rank` of `nranks` on `device`; does not wait for the
/// other ranks (see [`Comm::wait_joined`]).
pub fn join(id: &UniqueId, nranks: i32, rank: i32, device: i32) -> Result<Arc<Comm>, RcclFail> {
    let name = id.region_name()?;
    let n = usize::try_from(nranks)
        .ok()
        .filter(|n| (1..=MAX_RANKS).contains(n))
        .ok_or_else(|| {
            RcclFail::invalid(format!(
                "nranks {nranks} is not a rank count from 1 to {MAX_RANKS} (the emulated \
                 RCCL's limit)"
            ))
        })?;
    let me = usize::try_from(rank)
        .ok()
        .filter(|r| *r < n)
        .ok_or_else(|| RcclFail::invalid(format!("rank {rank} is not in 0..{nranks}")))?;
    let timeout = super::timeout_from_env()?;
    let region = Region::open(&name, n, Instant::now() + timeout)?;
    if region
        .ctrl_u32(me, shm::C_STATE)
        .compare_exchange(
            STATE_FREE,
            STATE_JOINED,
            Ordering::AcqRel,
            Ordering::Acquire,
        )
        .is_err()
    {
        let pid = region.ctrl_u32(me, shm::C_PID).load(Ordering::Relaxed);
        return Err(RcclFail::usage(format!(
            "rank {me} of this unique id has already joined (process {pid}): each rank joins \
             once, and a unique id serves one communicator"
        )));
    }
    region
        .ctrl_u32(me, shm::C_PID)
        .store(std::process::id(), Ordering::Relaxed);
    region
        .ctrl_i32(me, shm::C_DEVICE)
        .store(device, Ordering::Relaxed);
    region.joined().fetch_add(1, Ordering::AcqRel);
    region.ring();
    Ok(Arc::new(Comm {
        region,
        rank: me,
        nranks: n,
        device,
        timeout,
        host: Mutex::new(HostState::default()),
        step: Mutex::new(0),
    }))
}

static COMMS: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);

fn comms() -> MutexGuard<'static, Option<HashMap<usize, Arc<Comm>>>> {
    COMMS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Register `comm`; its opaque handle.
pub fn register(comm: Arc<Comm>) -> usize {
    let handle = crate::runtime::new_handle();
    comms()
        .get_or_insert_with(HashMap::new)
        .insert(handle, comm);
    handle
}

/// The communicator behind `handle`.
pub fn lookup(handle: usize) -> Result<Arc<Comm>, RcclFail> {
    comms()
        .as_ref()
        .and_then(|m| m.get(&handle))
        .cloned()
        .ok_or_else(|| {
            RcclFail::invalid(format!(
                "communicator {handle:#x} is not a live communicator of the emulated RCCL \
                 (null, destroyed or made up)"
            ))
        })
}

/// Forget `handle`; the communicator itself lives until its queued work drops it.
pub fn unregister(handle: usize) -> Result<Arc<Comm>, RcclFail> {
    let comm = lookup(handle)?;
    if let Some(m) = comms().as_mut() {
        m.remove(&handle);
    }
    Ok(comm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_round_trip() {
        let (a, b) = (UniqueId::generate(), UniqueId::generate());
        let (na, nb) = (a.region_name().unwrap(), b.region_name().unwrap());
        assert_ne!(na, nb);
        assert!(na.starts_with(shm::PREFIX));
        let mut bad = a;
        bad.internal[0] = b'X' as std::ffi::c_char;
        assert_eq!(
            bad.region_name().unwrap_err().code,
            NcclResult::INVALID_ARGUMENT
        );
        let mut slash = a;
        slash.internal[20] = b'/' as std::ffi::c_char;
        assert!(slash.region_name().is_err(), "no path separators in names");
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
    }
}
