//! [`Comm`]: creation, queries, the completion watchdog and teardown.

use std::collections::VecDeque;
use std::ffi::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use hip_sys::hipStream_t;
use hip_sys::rccl::{ncclComm_t, ncclResult_t, Rccl};

use super::error::CommError;
use super::id::UniqueId;
use super::{call, group, rccl};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::event::{Event, EventOptions};
use crate::stream::Stream;

/// The default completion timeout when `HIPK_COMM_TIMEOUT_S` is unset.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// The variable that sets the completion timeout, in seconds.
pub const TIMEOUT_VAR: &str = "HIPK_COMM_TIMEOUT_S";
/// The shortest timeout `HIPK_COMM_TIMEOUT_S` may set.
pub const MIN_TIMEOUT: Duration = Duration::from_millis(1);
/// The longest timeout `HIPK_COMM_TIMEOUT_S` may set: one week.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// The timeout from `HIPK_COMM_TIMEOUT_S` (seconds, fractions allowed, in
/// [`MIN_TIMEOUT`]`..=`[`MAX_TIMEOUT`]), else [`DEFAULT_TIMEOUT`]: it bounds collectives and
/// the data-parallel rendezvous ([`crate::ddp`]). A value that is not a number in that range is
/// [`CommError::BadTimeout`] naming it.
pub fn default_timeout() -> Result<Duration> {
    match std::env::var_os(TIMEOUT_VAR) {
        None => Ok(DEFAULT_TIMEOUT),
        Some(v) => parse_timeout(&v.to_string_lossy()).map_err(Error::from),
    }
}

/// Parse a `HIPK_COMM_TIMEOUT_S` value (see [`default_timeout`]); empty means the default.
pub fn parse_timeout(text: &str) -> std::result::Result<Duration, CommError> {
    let t = text.trim();
    if t.is_empty() {
        return Ok(DEFAULT_TIMEOUT);
    }
    let bad = || CommError::BadTimeout {
        value: text.to_string(),
        min: MIN_TIMEOUT,
        max: MAX_TIMEOUT,
    };
    let secs = t.parse::<f64>().map_err(|_| bad())?;
    // Compared as f64 before any conversion: NaN, infinities and huge values never reach
    // `Duration::from_secs_f64` (which panics) or `Instant + Duration` (which overflows).
    if !(secs >= MIN_TIMEOUT.as_secs_f64() && secs <= MAX_TIMEOUT.as_secs_f64()) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(secs))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The raw communicator handle; null once destroyed or aborted.
pub(crate) struct RawComm(pub(crate) ncclComm_t);

// SAFETY: an ncclComm_t may be used from any thread as long as calls on one communicator do not
// overlap; every use goes through the `Mutex<RawComm>` in `Inner`, which serialises them.
unsafe impl Send for RawComm {}

/// A queued collective whose completion is not yet known.
struct Pending {
    op: &'static str,
    /// Recorded after the collective on its stream.
    event: Event,
    since: Instant,
}

pub(crate) struct Inner {
    pub(crate) raw: Mutex<RawComm>,
    pending: Mutex<VecDeque<Pending>>,
    aborted: Mutex<Option<String>>,
    pub(crate) device: Device,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    timeout_ns: AtomicU64,
    pub(crate) rccl: &'static Rccl,
}

/// One rank of an RCCL communicator, bound to one device. See the [module docs](super).
///
/// `Send + Sync`: calls on one communicator are serialised internally.
pub struct Comm {
    pub(crate) inner: Arc<Inner>,
}

impl Comm {
    /// One communicator per device, ranks in the order given (`ncclCommInitAll`; single
    /// process). The devices must be distinct.
    pub fn init_all(devices: &[Device]) -> Result<Vec<Comm>> {
        const OP: &str = "ncclCommInitAll";
        if devices.is_empty() {
            return Err(CommError::Devices(format!("{OP}: no devices given")).into());
        }
        for (i, d) in devices.iter().enumerate() {
            if let Some(j) = devices[..i].iter().position(|e| e.ordinal() == d.ordinal()) {
                return Err(CommError::Devices(format!(
                    "{OP}: device {} is listed twice (positions {j} and {i}); RCCL allows one rank per device in a communicator",
                    d.ordinal()
                ))
                .into());
            }
        }
        let timeout = default_timeout()?;
        let lib = rccl(OP, 0)?;
        let f = call(OP, 0, lib.api().ncclCommInitAll())?;
        let ordinals: Vec<c_int> = devices.iter().map(Device::ordinal).collect();
        let n = c_int::try_from(devices.len())
            .map_err(|_| CommError::Devices(format!("{OP}: {} devices", devices.len())))?;
        let mut raws: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `raws` has room for `n` handles and `ordinals` holds `n` device ordinals, both
        // live for the call; RCCL writes one handle per device.
        let status = unsafe { f(raws.as_mut_ptr(), n, ordinals.as_ptr()) };
        call(OP, 0, status.result())?;
        Ok(raws
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (raw, device))| {
                Comm::from_raw(raw, device, rank, devices.len(), lib, timeout)
            })
            .collect())
    }

    /// This process's rank `rank` of `world`, on `device`, joining the communicator `id` names
    /// (`ncclCommInitRank`). Every rank must call it with the same `id` and `world`.
    ///
    /// # Host wait
    /// Blocks until every rank has joined (RCCL's rule); the timeout does not apply to it.
    pub fn init_rank(device: &Device, world: usize, rank: usize, id: &UniqueId) -> Result<Comm> {
        const OP: &str = "ncclCommInitRank";
        if rank >= world {
            return Err(CommError::Rank {
                op: OP,
                what: "rank",
                value: rank,
                world,
            }
            .into());
        }
        let as_int = |v: usize| {
            c_int::try_from(v).map_err(|_| CommError::Devices(format!("{OP}: world {v}")))
        };
        let (n, r) = (as_int(world)?, as_int(rank)?);
        let timeout = default_timeout()?;
        let lib = rccl(OP, rank)?;
        let f = call(OP, rank, lib.api().ncclCommInitRank())?;
        device.bind_to_thread()?;
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the id is passed by value as RCCL declares.
        let status = unsafe { f(&mut raw, n, id.0, r) };
        call(OP, rank, status.result())?;
        Ok(Comm::from_raw(raw, device, rank, world, lib, timeout))
    }

    fn from_raw(
        raw: ncclComm_t,
        device: &Device,
        rank: usize,
        world: usize,
        rccl: &'static Rccl,
        timeout: Duration,
    ) -> Comm {
        Comm {
            inner: Arc::new(Inner {
                raw: Mutex::new(RawComm(raw)),
                pending: Mutex::new(VecDeque::new()),
                aborted: Mutex::new(None),
                device: device.clone(),
                rank,
                world,
                timeout_ns: AtomicU64::new(timeout.as_nanos().min(u64::MAX as u128) as u64),
                rccl,
            }),
        }
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.inner.world
    }

    /// The device this rank runs on.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// How long [`Comm::wait`] (and `Drop`) wait for a collective before aborting.
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.inner.timeout_ns.load(Ordering::Relaxed))
    }

    /// Set the completion timeout (see [`Comm::timeout`]).
    pub fn set_timeout(&self, timeout: Duration) {
        let ns = timeout.as_nanos().min(u64::MAX as u128) as u64;
        self.inner.timeout_ns.store(ns, Ordering::Relaxed);
    }

    /// `ncclCommUserRank`: the rank as RCCL reports it.
    pub fn user_rank(&self) -> Result<usize> {
        self.query("ncclCommUserRank", |api| api.ncclCommUserRank())
            .map(|v| v as usize)
    }

    /// `ncclCommCount`: the number of ranks as RCCL reports it.
    pub fn count(&self) -> Result<usize> {
        self.query("ncclCommCount", |api| api.ncclCommCount())
            .map(|v| v as usize)
    }

    /// `ncclCommCuDevice`: the device ordinal as RCCL reports it.
    pub fn rccl_device(&self) -> Result<i32> {
        self.query("ncclCommCuDevice", |api| api.ncclCommCuDevice())
    }

    fn query(
        &self,
        op: &'static str,
        entry: impl FnOnce(
            &hip_sys::rccl::RcclApi,
        ) -> std::result::Result<
            unsafe extern "C" fn(ncclComm_t, *mut c_int) -> ncclResult_t,
            hip_sys::Error,
        >,
    ) -> Result<i32> {
        let f = call(op, self.rank(), entry(self.inner.rccl.api()))?;
        let raw = self.inner.enter(op)?;
        let mut value: c_int = -1;
        // SAFETY: `raw` is the live communicator (enter refuses an aborted one); the function
        // writes one int through a valid pointer.
        let status = unsafe { f(raw.0, &mut value) };
        call(op, self.rank(), status.result())?;
        Ok(value)
    }

    /// Wait for every collective queued on this communicator, for at most [`Comm::timeout`].
    ///
    /// # Host wait
    /// Polls the collectives' completion events and `ncclCommGetAsyncError` (sleeping between
    /// polls) until all are done; past the timeout, aborts the communicator and returns
    /// [`CommError::Timeout`] naming the oldest collective still running.
    pub fn wait(&self) -> Result<()> {
        self.inner.wait_all()
    }

    /// Abort the communicator now (`ncclCommAbort`): queued collectives are cancelled and every
    /// later call returns [`CommError::Aborted`].
    pub fn abort(&self) -> Result<()> {
        self.inner.abort("aborted by the caller".to_string())
    }

    /// A handle that aborts this communicator from another thread (a watcher of the other
    /// ranks, or the thread of a failing rank), with a reason every later call reports. It does
    /// not keep the communicator alive.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(Arc::downgrade(&self.inner))
    }
}

/// Aborts a [`Comm`] from any thread ([`Comm::abort_handle`]).
#[derive(Clone)]
pub struct AbortHandle(std::sync::Weak<Inner>);

impl AbortHandle {
    /// `ncclCommAbort` with `reason` (what every later call on the communicator, and a
    /// [`Comm::wait`] in progress, reports). Nothing when it is gone or already aborted.
    pub fn abort(&self, reason: impl Into<String>) {
        if let Some(inner) = self.0.upgrade() {
            if lock(&inner.aborted).is_none() {
                let _ = inner.abort(reason.into());
            }
        }
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AbortHandle")
    }
}

impl Inner {
    fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    /// Check the communicator before a call: refuse an aborted one, surface an asynchronous
    /// error or a collective past its deadline (aborting), and return the locked handle.
    pub(crate) fn enter(&self, op: &'static str) -> Result<MutexGuard<'_, RawComm>> {
        if let Some(reason) = lock(&self.aborted).clone() {
            return Err(self.aborted_error(op, reason));
        }
        self.poll(op)?;
        let raw = lock(&self.raw);
        if raw.0.is_null() {
            let reason = lock(&self.aborted)
                .clone()
                .unwrap_or_else(|| "destroyed".to_string());
            return Err(self.aborted_error(op, reason));
        }
        Ok(raw)
    }

    fn aborted_error(&self, op: &'static str, reason: String) -> Error {
        CommError::Aborted {
            op,
            rank: self.rank,
            reason,
        }
        .into()
    }

    /// One look at the queued work: drop completed collectives; `Ok(true)` when none is left.
    /// An asynchronous error, or the oldest collective past the timeout, aborts and errs.
    fn poll(&self, op: &'static str) -> Result<bool> {
        let oldest = {
            let mut pending = lock(&self.pending);
            while let Some(first) = pending.front() {
                match first.event.query() {
                    Ok(true) => {
                        pending.pop_front();
                    }
                    Ok(false) => break,
                    Err(e) => {
                        let failed = first.op;
                        drop(pending);
                        // RCCL's own account of the failure first, if it has one.
                        self.check_async(failed)?;
                        let err = CommError::Failed {
                            op: failed,
                            rank: self.rank,
                            world: self.world,
                            source: Box::new(e),
                        };
                        let _ = self.abort(err.to_string());
                        return Err(err.into());
                    }
                }
            }
            pending.front().map(|p| (p.op, p.since))
        };
        self.check_async(oldest.map_or(op, |(o, _)| o))?;
        match oldest {
            None => Ok(true),
            Some((pending_op, since)) if since.elapsed() > self.timeout() => {
                let err = CommError::Timeout {
                    op: pending_op,
                    rank: self.rank,
                    world: self.world,
                    timeout: self.timeout(),
                };
                let _ = self.abort(err.to_string());
                Err(err.into())
            }
            Some(_) => Ok(false),
        }
    }

    /// `ncclCommGetAsyncError`: an error status aborts the communicator and becomes
    /// [`CommError::Async`] naming `op`.
    fn check_async(&self, op: &'static str) -> Result<()> {
        let f = call(
            "ncclCommGetAsyncError",
            self.rank,
            self.rccl.api().ncclCommGetAsyncError(),
        )?;
        let status = {
            let raw = lock(&self.raw);
            if raw.0.is_null() {
                return Ok(());
            }
            let mut status = ncclResult_t::ncclSuccess;
            // SAFETY: `raw` is the live communicator (non-null under the lock); RCCL writes one
            // ncclResult_t through a valid pointer.
            let r = unsafe { f(raw.0, &mut status) };
            call("ncclCommGetAsyncError", self.rank, r.result())?;
            status
        };
        if status == ncclResult_t::ncclSuccess || status == ncclResult_t::ncclInProgress {
            return Ok(());
        }
        let source = match status.result() {
            Err(e) => e,
            Ok(()) => return Ok(()),
        };
        let err = CommError::Async {
            op,
            rank: self.rank,
            world: self.world,
            source,
        };
        let _ = self.abort(err.to_string());
        Err(err.into())
    }

    /// Wait for all queued collectives (see [`Comm::wait`]).
    pub(crate) fn wait_all(&self) -> Result<()> {
        let mut nap = Duration::from_micros(50);
        loop {
            // Checked on every round: another thread (a liveness watcher, a failing rank's
            // thread) may abort the communicator while this one waits.
            if let Some(reason) = lock(&self.aborted).clone() {
                return Err(self.aborted_error("wait", reason));
            }
            if self.poll("wait")? {
                return Ok(());
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }

    /// Note a collective queued on `stream`: record an event after it, or, inside a group, once
    /// the group has ended (RCCL queues grouped work at `ncclGroupEnd`).
    pub(crate) fn track(self: &Arc<Self>, op: &'static str, stream: &Stream) -> Result<()> {
        if group::defer(self, op, stream) {
            return Ok(());
        }
        self.record(op, stream)
    }

    /// Record the completion event of `op` on `stream` now.
    pub(crate) fn record(&self, op: &'static str, stream: &Stream) -> Result<()> {
        // SAFETY: `stream` is borrowed, hence live; the caller checked it is on this device.
        unsafe { self.record_raw(op, stream.raw()) }
    }

    /// Record the completion event of `op` on the raw `stream` now.
    ///
    /// # Safety
    /// `stream` must be null or a live stream of this communicator's device.
    pub(crate) unsafe fn record_raw(&self, op: &'static str, stream: hipStream_t) -> Result<()> {
        let event = Event::new(&self.device, EventOptions::NO_TIMING)?;
        // SAFETY: the event was just created on this device; the caller vouches for `stream`.
        unsafe { crate::result::event::record(event.raw(), stream) }?;
        lock(&self.pending).push_back(Pending {
            op,
            event,
            since: Instant::now(),
        });
        Ok(())
    }

    /// `ncclCommAbort` once; later calls report `reason`.
    fn abort(&self, reason: String) -> Result<()> {
        {
            let mut aborted = lock(&self.aborted);
            if aborted.is_none() {
                *aborted = Some(reason);
            }
        }
        let raw = std::mem::replace(&mut lock(&self.raw).0, std::ptr::null_mut());
        lock(&self.pending).clear();
        if raw.is_null() {
            return Ok(());
        }
        let f = call("ncclCommAbort", self.rank, self.rccl.api().ncclCommAbort())?;
        // SAFETY: `raw` was the live communicator, taken out of the lock so that it is aborted
        // exactly once and never used again.
        let status = unsafe { f(raw) };
        call("ncclCommAbort", self.rank, status.result())
    }

    /// `ncclCommDestroy` once (after the queued work completed).
    fn destroy(&self) -> Result<()> {
        let raw = std::mem::replace(&mut lock(&self.raw).0, std::ptr::null_mut());
        if raw.is_null() {
            return Ok(());
        }
        let f = call(
            "ncclCommDestroy",
            self.rank,
            self.rccl.api().ncclCommDestroy(),
        )?;
        // SAFETY: as in `abort`: taken out of the lock, destroyed exactly once.
        let status = unsafe { f(raw) };
        call("ncclCommDestroy", self.rank, status.result())
    }
}

impl Drop for Comm {
    /// Waits (at most the timeout) for queued collectives, then `ncclCommDestroy`; on a timeout
    /// or an asynchronous error, `ncclCommAbort` instead. Errors go to the device's log.
    fn drop(&mut self) {
        let inner = &self.inner;
        if lock(&inner.aborted).is_some() || lock(&inner.raw).0.is_null() {
            return;
        }
        let result = inner.wait_all().and_then(|()| inner.destroy());
        if let Err(e) = &result {
            if !lock(&inner.raw).0.is_null() {
                let _ = inner.abort(format!("dropped after: {e}"));
            }
        }
        inner.device.record_drop_error(result);
    }
}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Comm")
            .field("rank", &self.inner.rank)
            .field("world", &self.inner.world)
            .field("device", &self.inner.device.ordinal())
            .field("timeout", &self.timeout())
            .finish_non_exhaustive()
    }
}
