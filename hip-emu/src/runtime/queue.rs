//! One executor thread per device: streams are FIFO queues of commands, run one at a time.
//!
//! Each command gets a device-wide sequence number and a list of dependencies `(stream, seq)`
//! that must have completed first: `hipStreamWaitEvent` adds the event's last record; the null
//! stream waits for all earlier work on blocking streams, and blocking streams wait for earlier
//! null-stream work (HIP's legacy default-stream semantics). Among the streams whose next command
//! is ready, the executor runs the higher priority first, then the oldest; with `HIPK_EMU_SEED`
//! it picks a ready stream at random instead, which exposes missing cross-stream
//! synchronisation. Dependencies only point at earlier commands, so the queue never deadlocks.
//!
//! With `HIPK_EMU_LAZY=1` (a grace period in [`Executor::start`]) the executor holds queued work
//! back and runs it only on demand: while a host thread is blocked in one of its waits (stream,
//! event or device synchronize, a synchronous copy or memset, hipFree, a stream destroy, an RCCL
//! communicator's drain), or once the oldest queued command has waited [`LAZY_GRACE`], which
//! keeps programs that only poll (hipStreamQuery, hipEventQuery) and the emulated RCCL's
//! cross-device waits going. While there is demand every ready command runs, in the usual order
//! or, with `HIPK_EMU_SEED`, in a random ready order: the work of several streams is then queued
//! together and run in an order a real device could choose, which exposes a missing
//! `hipStreamWaitEvent` or a missing host wait that the eager default hides.
//!
//! A command that fails (a kernel fault, a canary hit, a panic) becomes a pending fault of its
//! stream: the next synchronising call that covers it (stream or device synchronize/query,
//! event synchronize/query) returns it once. Unlike a real device, whose context is lost after
//! a fault, later work keeps running.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hip_sys::hipError_t;

use super::error::{panic_text, Fail, Res};

/// Stream id of the null (default) stream of every device.
pub const NULL_STREAM: u64 = 0;

/// Under `HIPK_EMU_LAZY=1`, how long the oldest queued command of a device waits for a host
/// wait before the executor runs work anyway. Short enough that polling programs and
/// collectives progress; long enough that work queued back to back on several streams is
/// queued together before it runs.
pub const LAZY_GRACE: Duration = Duration::from_millis(20);

/// The work of one command; `Err` becomes a fault of its stream.
pub type Work = Box<dyn FnOnce() -> Res + Send>;

enum Action {
    Run(Work),
    /// Marks an event record: the time is taken when it runs.
    Record(Arc<EventState>),
    /// Only waits for its dependencies.
    Marker,
}

struct Command {
    seq: u64,
    deps: Vec<(u64, u64)>,
    label: String,
    action: Action,
    /// When it was queued (for [`LAZY_GRACE`]).
    queued: Instant,
}

struct StreamQueue {
    queue: VecDeque<Command>,
    /// Seq of the last command enqueued / completed (0: none).
    enqueued: u64,
    completed: u64,
    blocking: bool,
    priority: i32,
}

impl StreamQueue {
    fn idle(&self) -> bool {
        self.completed >= self.enqueued
    }
}

/// A failure of a queued command, waiting to be reported.
#[derive(Debug, Clone)]
pub struct Fault {
    pub stream: u64,
    pub seq: u64,
    pub fail: Fail,
}

struct State {
    streams: BTreeMap<u64, StreamQueue>,
    next_seq: u64,
    faults: Vec<Fault>,
    rng: Option<u64>,
    /// Host threads blocked in a wait of this executor (lazy mode runs work while it is > 0).
    demand: usize,
}

/// `(stream, seq)` of an event's last record, and `(seq, time)` of the last record that ran.
type Records = (Option<(u64, u64)>, Option<(u64, Instant)>);

/// An event: where it was last recorded and when that record ran.
pub struct EventState {
    pub timing: bool,
    /// `(stream, seq)` of the last record, `(seq, time)` when that record ran.
    inner: Mutex<Records>,
}

impl EventState {
    pub fn new(timing: bool) -> EventState {
        EventState {
            timing,
            inner: Mutex::new((None, None)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Records> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last record, if any.
    pub fn recorded(&self) -> Option<(u64, u64)> {
        self.lock().0
    }

    /// When the last record ran, if it has.
    pub fn time(&self) -> Option<Instant> {
        let g = self.lock();
        match (g.0, g.1) {
            (Some((_, seq)), Some((ran, t))) if seq == ran => Some(t),
            _ => None,
        }
    }
}

/// Demand on an executor while alive (see [`Executor::demand`]).
pub struct Demand<'a>(Option<&'a Executor>);

impl Drop for Demand<'_> {
    fn drop(&mut self) {
        if let Some(ex) = self.0 {
            ex.lock().demand -= 1;
            ex.cv.notify_all();
        }
    }
}

/// The executor of one device.
pub struct Executor {
    state: Mutex<State>,
    cv: Condvar,
    /// Lazy mode's grace period; `None`: run work as soon as it is ready.
    lazy: Option<Duration>,
}

impl Executor {
    /// Start the executor thread of device `ordinal`. `seed`: pick among ready streams at random
    /// (`HIPK_EMU_SEED`). `lazy`: hold queued work back until a host thread waits or the oldest
    /// command has waited this long (`HIPK_EMU_LAZY=1` passes [`LAZY_GRACE`]); `None` runs
    /// work as soon as it is ready.
    pub fn start(ordinal: i32, seed: Option<u64>, lazy: Option<Duration>) -> Res<Arc<Executor>> {
        let mut streams = BTreeMap::new();
        streams.insert(
            NULL_STREAM,
            StreamQueue {
                queue: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                blocking: true,
                priority: 0,
            },
        );
        let exec = Arc::new(Executor {
            state: Mutex::new(State {
                streams,
                next_seq: 1,
                faults: Vec::new(),
                rng: seed.map(|s| s ^ 0x5DEE_CE66_D1CE_4E5B),
                demand: 0,
            }),
            cv: Condvar::new(),
            lazy,
        });
        let worker = exec.clone();
        std::thread::Builder::new()
            .name(format!("hip-emu-dev{ordinal}"))
            .spawn(move || worker.run())
            .map_err(|e| {
                Fail::new(
                    hipError_t::hipErrorNotInitialized,
                    format!("could not start the executor thread of device {ordinal}: {e}"),
                )
            })?;
        Ok(exec)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add a stream (its id is chosen by the caller, unique per process).
    pub fn add_stream(&self, id: u64, blocking: bool, priority: i32) {
        self.lock().streams.insert(
            id,
            StreamQueue {
                queue: VecDeque::new(),
                enqueued: 0,
                completed: 0,
                blocking,
                priority,
            },
        );
    }

    /// Wait for the stream's work, then remove it. Its unreported faults stay for the device.
    pub fn remove_stream(&self, id: u64) {
        let mut st = self.wait_for(|st| st.streams.get(&id).map_or(true, |q| q.idle()));
        st.streams.remove(&id);
    }

    pub fn has_stream(&self, id: u64) -> bool {
        self.lock().streams.contains_key(&id)
    }

    /// Queue `work` on `stream`; returns its seq.
    pub fn enqueue(&self, stream: u64, label: String, work: Work) -> Res<u64> {
        self.push(stream, label, Action::Run(work), Vec::new())
    }

    /// Queue `work` on `stream` after the commands `deps` (`(stream, seq)` pairs of this device)
    /// have completed; returns its seq. The emulated RCCL chains a communicator's operations
    /// this way, whatever streams they were issued on.
    pub fn enqueue_after(
        &self,
        stream: u64,
        label: String,
        work: Work,
        deps: Vec<(u64, u64)>,
    ) -> Res<u64> {
        self.push(stream, label, Action::Run(work), deps)
    }

    /// Queue a command on `stream` that only waits for `deps`: later work on `stream` is
    /// ordered after them.
    pub fn enqueue_marker(&self, stream: u64, label: String, deps: Vec<(u64, u64)>) -> Res<u64> {
        self.push(stream, label, Action::Marker, deps)
    }

    /// Seq of the last command queued on `stream` that has not completed, if any.
    pub fn pending_tail(&self, stream: u64) -> Option<u64> {
        let st = self.lock();
        st.streams
            .get(&stream)
            .filter(|q| !q.idle())
            .map(|q| q.enqueued)
    }

    /// Block until `(stream, seq)` completed, without taking its faults.
    pub fn wait_done(&self, stream: u64, seq: u64) {
        drop(self.wait_for(|st| Self::done(st, stream, seq)));
    }

    /// Demand for as long as the guard lives: in lazy mode the executor runs every ready command
    /// meanwhile, as if a host thread waited. The emulated RCCL holds one on the other devices of
    /// the process while an operation runs, since it cannot finish before their parts have run.
    /// Does nothing when lazy mode is off.
    pub fn demand(&self) -> Demand<'_> {
        let held = self.lazy.map(|_| {
            self.lock().demand += 1;
            self.cv.notify_all();
            self
        });
        Demand(held)
    }

    /// Block until `ready` holds, and return the state lock. While this thread is blocked it
    /// counts as demand (lazy mode runs work for it). `ready` must not panic (the callers' are
    /// map lookups and comparisons), so the demand it adds is always taken back.
    fn wait_for(&self, ready: impl Fn(&State) -> bool) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        if ready(&st) {
            return st;
        }
        st.demand += 1;
        if self.lazy.is_some() {
            self.cv.notify_all();
        }
        while !ready(&st) {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.demand -= 1;
        if self.lazy.is_some() {
            self.cv.notify_all();
        }
        st
    }

    /// Queue a record of `event` on `stream`.
    pub fn record(&self, stream: u64, event: &Arc<EventState>) -> Res<()> {
        let mut st = self.lock();
        let action = Action::Record(event.clone());
        let seq = Self::push_locked(&mut st, stream, "event record".into(), action, Vec::new())?;
        // Set while the state lock is held, so the record cannot have run yet.
        event.lock().0 = Some((stream, seq));
        drop(st);
        self.cv.notify_all();
        Ok(())
    }

    /// Later work on `stream` waits for `event`'s last record (no-op if never recorded).
    pub fn wait_event(&self, stream: u64, event: &EventState) -> Res<()> {
        match event.recorded() {
            None => Ok(()),
            Some(dep) => self
                .push(
                    stream,
                    "stream wait event".into(),
                    Action::Marker,
                    vec![dep],
                )
                .map(|_| ()),
        }
    }

    fn push(&self, stream: u64, label: String, action: Action, deps: Vec<(u64, u64)>) -> Res<u64> {
        let seq = Self::push_locked(&mut self.lock(), stream, label, action, deps)?;
        self.cv.notify_all();
        Ok(seq)
    }

    fn push_locked(
        st: &mut State,
        stream: u64,
        label: String,
        action: Action,
        mut deps: Vec<(u64, u64)>,
    ) -> Res<u64> {
        let seq = st.next_seq;
        let blocking = st
            .streams
            .get(&stream)
            .ok_or_else(|| Fail::handle(format!("stream {stream:#x} is not live on this device")))?
            .blocking;
        if stream == NULL_STREAM {
            for (&id, q) in &st.streams {
                if id != NULL_STREAM && q.blocking && !q.idle() {
                    deps.push((id, q.enqueued));
                }
            }
        } else if blocking {
            let null = &st.streams[&NULL_STREAM];
            if !null.idle() {
                deps.push((NULL_STREAM, null.enqueued));
            }
        }
        st.next_seq += 1;
        let q = st.streams.get_mut(&stream).expect("checked above");
        q.enqueued = seq;
        q.queue.push_back(Command {
            seq,
            deps,
            label,
            action,
            queued: Instant::now(),
        });
        Ok(seq)
    }

    /// True when every command of `stream` up to `seq` has completed (or the stream is gone).
    fn done(st: &State, stream: u64, seq: u64) -> bool {
        st.streams.get(&stream).map_or(true, |q| q.completed >= seq)
    }

    /// Block until `(stream, seq)` completed; then take the faults `select` matches.
    fn wait_until(&self, stream: u64, seq: u64, select: impl Fn(&Fault) -> bool) -> Res<()> {
        let mut st = self.wait_for(|st| Self::done(st, stream, seq));
        Self::take_fault(&mut st, select)
    }

    fn take_fault(st: &mut State, select: impl Fn(&Fault) -> bool) -> Res<()> {
        let Some(pos) = st.faults.iter().position(&select) else {
            return Ok(());
        };
        let first = st.faults.remove(pos);
        // Report every matching fault once: the first as the error, the others in its message.
        let mut rest = Vec::new();
        st.faults.retain(|f| {
            let m = select(f);
            if m {
                rest.push(f.fail.message.clone());
            }
            !m
        });
        let mut fail = first.fail;
        if !rest.is_empty() {
            fail.message = format!(
                "{} (and {} later fault(s): {})",
                fail.message,
                rest.len(),
                rest.join("; ")
            );
        }
        Err(fail)
    }

    /// `hipStreamSynchronize`. The null stream also waits for the blocking streams (legacy
    /// default-stream semantics: as if a null-stream command had been queued).
    pub fn sync_stream(&self, stream: u64) -> Res<()> {
        let targets: Vec<(u64, u64)> = {
            let st = self.lock();
            st.streams
                .iter()
                .filter(|(&id, q)| id == stream || (stream == NULL_STREAM && q.blocking))
                .map(|(&id, q)| (id, q.enqueued))
                .collect()
        };
        let ids: Vec<u64> = targets.iter().map(|t| t.0).collect();
        let mut st = self.wait_for(|st| targets.iter().all(|&(s, seq)| Self::done(st, s, seq)));
        Self::take_fault(&mut st, |f| ids.contains(&f.stream))
    }

    /// `hipStreamQuery`: Ok(true) when idle; a pending fault is returned once.
    pub fn query_stream(&self, stream: u64) -> Res<bool> {
        let mut st = self.lock();
        let idle = st.streams.get(&stream).map_or(true, |q| q.idle());
        if !idle {
            return Ok(false);
        }
        Self::take_fault(&mut st, |f| f.stream == stream).map(|_| true)
    }

    /// `hipDeviceSynchronize`: wait for every stream; report any fault.
    pub fn sync_all(&self) -> Res<()> {
        self.wait_idle();
        Self::take_fault(&mut self.lock(), |_| true)
    }

    /// Wait for every stream without reporting faults (hipFree's implicit wait).
    pub fn wait_idle(&self) {
        drop(self.wait_for(|st| st.streams.values().all(|q| q.idle())));
    }

    /// `hipEventSynchronize`.
    pub fn sync_event(&self, event: &EventState) -> Res<()> {
        match event.recorded() {
            None => Ok(()),
            Some((stream, seq)) => {
                self.wait_until(stream, seq, |f| f.stream == stream && f.seq <= seq)
            }
        }
    }

    /// `hipEventQuery`: Ok(true) once the last record ran.
    pub fn query_event(&self, event: &EventState) -> Res<bool> {
        let Some((stream, seq)) = event.recorded() else {
            return Ok(true);
        };
        let mut st = self.lock();
        if !Self::done(&st, stream, seq) {
            return Ok(false);
        }
        Self::take_fault(&mut st, |f| f.stream == stream && f.seq <= seq).map(|_| true)
    }

    /// The executor thread.
    fn run(&self) {
        loop {
            let (stream, cmd) = {
                let mut st = self.lock();
                loop {
                    if let Some(left) = self.hold(&st) {
                        st = self
                            .cv
                            .wait_timeout(st, left)
                            .unwrap_or_else(|p| p.into_inner())
                            .0;
                        continue;
                    }
                    if let Some(next) = Self::pick(&mut st) {
                        break next;
                    }
                    st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
                }
            };
            let seq = cmd.seq;
            let label = cmd.label;
            let result = match cmd.action {
                Action::Run(work) => match catch_unwind(AssertUnwindSafe(work)) {
                    Ok(r) => r,
                    Err(p) => Err(Fail::new(
                        hipError_t::hipErrorLaunchFailure,
                        format!("{label} panicked inside hip-emu: {}", panic_text(&*p)),
                    )),
                },
                Action::Record(event) => {
                    event.lock().1 = Some((seq, Instant::now()));
                    Ok(())
                }
                Action::Marker => Ok(()),
            };
            let mut st = self.lock();
            if let Err(fail) = result {
                st.faults.push(Fault { stream, seq, fail });
            }
            if let Some(q) = st.streams.get_mut(&stream) {
                q.completed = seq;
            }
            drop(st);
            self.cv.notify_all();
        }
    }

    /// In lazy mode with no host thread waiting: how much longer the queued work is held back
    /// (what is left of the oldest command's grace period). `None`: it may run now (lazy mode
    /// off, demand, the grace is over, or nothing is queued).
    fn hold(&self, st: &State) -> Option<Duration> {
        let grace = self.lazy?;
        if st.demand > 0 {
            return None;
        }
        let oldest = st
            .streams
            .values()
            .filter_map(|q| q.queue.front())
            .map(|c| c.queued)
            .min()?;
        grace
            .checked_sub(oldest.elapsed())
            .filter(|left| !left.is_zero())
    }

    /// Pop the next command to run, if any stream's head is ready.
    fn pick(st: &mut State) -> Option<(u64, Command)> {
        let ready: Vec<(u64, i32, u64)> = st
            .streams
            .iter()
            .filter_map(|(&id, q)| {
                let head = q.queue.front()?;
                head.deps
                    .iter()
                    .all(|&(s, seq)| Self::done(st, s, seq))
                    .then_some((id, q.priority, head.seq))
            })
            .collect();
        let chosen = match st.rng.as_mut() {
            Some(rng) if !ready.is_empty() => {
                *rng ^= *rng << 13;
                *rng ^= *rng >> 7;
                *rng ^= *rng << 17;
                ready[(*rng % ready.len() as u64) as usize].0
            }
            _ => ready.iter().min_by_key(|(_, prio, seq)| (*prio, *seq))?.0,
        };
        let cmd = st.streams.get_mut(&chosen)?.queue.pop_front()?;
        Some((chosen, cmd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn log_work(log: &Arc<Mutex<Vec<u32>>>, v: u32, sleep_ms: u64) -> Work {
        let log = log.clone();
        Box::new(move || {
            std::thread::sleep(std::time::Duration::from_millis(sleep_ms));
            log.lock().unwrap().push(v);
            Ok(())
        })
    }

    #[test]
    fn fifo_per_stream_wait_event_and_faults_reported_once() {
        let ex = Executor::start(0, None, None).unwrap();
        ex.add_stream(1, false, 0);
        ex.add_stream(2, false, 0);
        let log = Arc::new(Mutex::new(Vec::new()));
        let ev = Arc::new(EventState::new(true));
        ex.enqueue(1, "a".into(), log_work(&log, 1, 30)).unwrap();
        ex.enqueue(1, "b".into(), log_work(&log, 2, 0)).unwrap();
        ex.record(1, &ev).unwrap();
        ex.wait_event(2, &ev).unwrap();
        ex.enqueue(2, "c".into(), log_work(&log, 3, 0)).unwrap();
        ex.sync_stream(2).unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1, 2, 3]);
        assert!(ev.time().is_some());
        let ran = Arc::new(AtomicU64::new(0));
        let r2 = ran.clone();
        ex.enqueue(
            1,
            "bad".into(),
            Box::new(|| {
                Err(Fail::new(
                    hipError_t::hipErrorIllegalAddress,
                    "kernel k faulted",
                ))
            }),
        )
        .unwrap();
        ex.enqueue(
            1,
            "after".into(),
            Box::new(move || {
                r2.store(1, Ordering::SeqCst);
                Ok(())
            }),
        )
        .unwrap();
        let err = ex.sync_stream(1).unwrap_err();
        assert_eq!(err.code, hipError_t::hipErrorIllegalAddress);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert!(ex.sync_stream(1).is_ok(), "reported once");
        ex.enqueue(2, "panics".into(), Box::new(|| panic!("oops")))
            .unwrap();
        let err = ex.sync_all().unwrap_err();
        assert!(err.message.contains("oops"), "{err}");
    }

    #[test]
    fn null_stream_waits_for_blocking_streams() {
        let ex = Executor::start(0, Some(3), None).unwrap();
        ex.add_stream(5, true, 0);
        let log = Arc::new(Mutex::new(Vec::new()));
        ex.enqueue(5, "slow".into(), log_work(&log, 1, 40)).unwrap();
        ex.enqueue(NULL_STREAM, "null".into(), log_work(&log, 2, 0))
            .unwrap();
        ex.enqueue(5, "after null".into(), log_work(&log, 3, 0))
            .unwrap();
        ex.sync_all().unwrap();
        assert_eq!(*log.lock().unwrap(), vec![1, 2, 3]);
        assert!(ex.query_stream(5).unwrap());
        assert!(ex.enqueue(77, "x".into(), Box::new(|| Ok(()))).is_err());
        // Synchronizing the null stream waits for blocking streams, not for non-blocking ones.
        ex.add_stream(6, false, 0);
        ex.enqueue(5, "blocking".into(), log_work(&log, 4, 30))
            .unwrap();
        ex.enqueue(
            6,
            "non-blocking".into(),
            Box::new(|| Err(Fail::invalid("not mine"))),
        )
        .unwrap();
        ex.sync_stream(NULL_STREAM).unwrap();
        assert_eq!(log.lock().unwrap().last(), Some(&4));
        assert!(
            ex.sync_stream(6).is_err(),
            "the non-blocking stream's fault stays its own"
        );
    }

    /// A grace period no test waits out: whatever runs did so because a host thread waited.
    const NEVER: Duration = Duration::from_secs(60);

    #[test]
    fn lazy_work_waits_for_a_host_wait() {
        let ex = Executor::start(0, None, Some(LAZY_GRACE)).unwrap();
        ex.add_stream(1, false, 0);
        ex.add_stream(2, false, 0);
        let log = Arc::new(Mutex::new(Vec::new()));
        let t0 = Instant::now();
        ex.enqueue(1, "a".into(), log_work(&log, 1, 0)).unwrap();
        // B does not wait for A.
        ex.enqueue(2, "b".into(), log_work(&log, 2, 0)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let early = log.lock().unwrap().clone();
        // Measured after the read: only a machine that stalled this thread past the grace
        // period may have run the work (then the check says nothing).
        if t0.elapsed() < LAZY_GRACE {
            assert!(early.is_empty(), "ran without a host wait: {early:?}");
        }
        ex.sync_stream(2).unwrap();
        // With demand every ready command runs, oldest first without a seed.
        assert_eq!(*log.lock().unwrap(), vec![1, 2]);
    }

    #[test]
    fn lazy_every_blocking_wait_is_demand_and_gives_it_back() {
        let ex = Executor::start(0, None, Some(NEVER)).unwrap();
        ex.add_stream(1, false, 0);
        ex.add_stream(2, true, 0);
        let log = Arc::new(Mutex::new(Vec::new()));
        let ev = Arc::new(EventState::new(false));
        let t0 = Instant::now();
        ex.enqueue(1, "a".into(), log_work(&log, 1, 0)).unwrap();
        ex.record(1, &ev).unwrap();
        ex.sync_event(&ev).unwrap();
        let seq = ex.enqueue(2, "b".into(), log_work(&log, 2, 0)).unwrap();
        ex.wait_done(2, seq);
        ex.enqueue(NULL_STREAM, "c".into(), log_work(&log, 3, 0))
            .unwrap();
        ex.sync_all().unwrap();
        ex.enqueue(1, "d".into(), log_work(&log, 4, 0)).unwrap();
        ex.wait_idle();
        ex.enqueue(2, "e".into(), log_work(&log, 5, 0)).unwrap();
        ex.remove_stream(2);
        assert_eq!(*log.lock().unwrap(), vec![1, 2, 3, 4, 5]);
        assert!(t0.elapsed() < NEVER / 2, "a wait did not count as demand");
        // Every wait gave its demand back: new work stays queued.
        ex.enqueue(1, "f".into(), log_work(&log, 6, 0)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert!(!ex.query_stream(1).unwrap());
        assert_eq!(log.lock().unwrap().len(), 5);
        ex.sync_stream(1).unwrap();
        assert_eq!(log.lock().unwrap().last(), Some(&6));
        // A demand guard (the emulated RCCL's, for the other devices) runs work while it lives.
        let guard = ex.demand();
        ex.enqueue(1, "g".into(), log_work(&log, 7, 0)).unwrap();
        while !ex.query_stream(1).unwrap() {
            assert!(t0.elapsed() < NEVER / 2, "a demand guard did not run work");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(guard);
        ex.enqueue(1, "h".into(), log_work(&log, 8, 0)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert!(
            !ex.query_stream(1).unwrap(),
            "the guard gave its demand back"
        );
        assert_eq!(log.lock().unwrap().last(), Some(&7));
    }

    /// Lazy and seeded: A's command, then B's (after A's event when `wait`), then a device
    /// synchronize; the order they ran in.
    fn lazy_order(seed: u64, wait: bool) -> Vec<u32> {
        let ex = Executor::start(0, Some(seed), Some(NEVER)).unwrap();
        ex.add_stream(1, false, 0);
        ex.add_stream(2, false, 0);
        let log = Arc::new(Mutex::new(Vec::new()));
        ex.enqueue(1, "a".into(), log_work(&log, 1, 0)).unwrap();
        if wait {
            let ev = Arc::new(EventState::new(false));
            ex.record(1, &ev).unwrap();
            ex.wait_event(2, &ev).unwrap();
        }
        ex.enqueue(2, "b".into(), log_work(&log, 2, 0)).unwrap();
        ex.sync_all().unwrap();
        let order = log.lock().unwrap().clone();
        order
    }

    #[test]
    fn lazy_and_seeded_runs_a_missing_wait_out_of_order() {
        // Seed 2's first pick among the two ready streams is B's: the newer command runs first;
        // seed 1's is A's. Both are queued before anything runs, so the order is the seed's.
        assert_eq!(lazy_order(2, false), vec![2, 1]);
        assert_eq!(lazy_order(1, false), vec![1, 2]);
        for seed in 0..8 {
            assert_eq!(lazy_order(seed, true), vec![1, 2], "seed {seed}");
        }
    }

    #[test]
    fn lazy_work_nobody_waits_for_runs_after_the_grace_period() {
        let ex = Executor::start(0, None, Some(LAZY_GRACE)).unwrap();
        ex.add_stream(1, false, 0);
        let log = Arc::new(Mutex::new(Vec::new()));
        let t0 = Instant::now();
        ex.enqueue(1, "polled".into(), log_work(&log, 1, 0))
            .unwrap();
        while !ex.query_stream(1).unwrap() {
            assert!(t0.elapsed() < Duration::from_secs(2), "no progress");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(t0.elapsed() >= LAZY_GRACE, "ran before the grace period");
        assert_eq!(*log.lock().unwrap(), vec![1]);
    }
}
