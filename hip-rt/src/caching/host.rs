//! A host-memory [`Backend`] with simulated streams and events, so the caching policy can be
//! exercised (tests, fuzzing, benches) without a device.
//!
//! Memory is real: each `malloc` is a 512-byte-aligned allocation from the global allocator,
//! so tests can write patterns into blocks through the returned addresses. A configurable capacity makes `malloc` report out-of-memory. Streams are ids; an event
//! completes only when the test says so ([`HostBackend::complete_stream`]) or when the policy
//! synchronises on it, which models the host waiting for the device.

use std::alloc::{alloc, dealloc, Layout};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::backend::{Backend, BackendError, DevicePtr, MemInfo};

/// Alignment of every host "device" allocation (matches the policy's 512-byte rounding).
const HOST_ALIGN: usize = 512;

/// A simulated stream of a [`HostBackend`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostStream(pub u32);

impl HostStream {
    /// The default stream, which always exists.
    pub const DEFAULT: HostStream = HostStream(0);
}

/// A simulated event: position `seq` in its stream's sequence of recorded events.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostEvent {
    stream: HostStream,
    seq: u64,
}

/// Counters of the raw operations the policy performed on a [`HostBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Successful `malloc` calls.
    pub mallocs: u64,
    /// `malloc` calls refused for lack of capacity.
    pub failed_mallocs: u64,
    /// `free` calls.
    pub frees: u64,
    /// Events recorded.
    pub events_recorded: u64,
    /// Event queries.
    pub event_queries: u64,
    /// Event synchronisations.
    pub event_syncs: u64,
    /// Device synchronisations.
    pub device_syncs: u64,
}

/// Errors of the host backend (they indicate misuse by the policy, so tests surface them).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HostBackendError {
    /// `free` got an address that is not live.
    #[error("host backend: free of {addr:#x} ({size} B), which is not a live allocation; this is a double free or a foreign pointer")]
    UnknownFree {
        /// The address.
        addr: u64,
        /// The size passed to `free`.
        size: usize,
    },
    /// `free` got the wrong size for a live address.
    #[error("host backend: free of {addr:#x} with size {size} B, but it was allocated with {allocated} B")]
    SizeMismatch {
        /// The address.
        addr: u64,
        /// The size passed to `free`.
        size: usize,
        /// The size it was allocated with.
        allocated: usize,
    },
    /// An event or record on a stream that was never created.
    #[error(
        "host backend: stream {0:?} does not exist; create streams with HostBackend::new_stream"
    )]
    UnknownStream(HostStream),
}

#[derive(Default)]
struct StreamClock {
    recorded: u64,
    completed: u64,
}

struct HostState {
    capacity: usize,
    used: usize,
    live: HashMap<u64, usize>,
    streams: Vec<StreamClock>,
    counters: HostCounters,
}

impl HostState {
    fn clock(&mut self, stream: HostStream) -> Result<&mut StreamClock, HostBackendError> {
        self.streams
            .get_mut(stream.0 as usize)
            .ok_or(HostBackendError::UnknownStream(stream))
    }
}

impl Drop for HostState {
    fn drop(&mut self) {
        for (&addr, &size) in &self.live {
            if let Ok(layout) = Layout::from_size_align(size, HOST_ALIGN) {
                // SAFETY: `live` holds exactly the addresses returned by `alloc` with this
                // layout and not yet deallocated; the state is dropped once, so each is freed once.
                unsafe { dealloc(addr as *mut u8, layout) };
            }
        }
    }
}

/// Host memory with a capacity, simulated streams and events. Clones share one state, so a
/// test keeps a clone to drive event completion and read counters while the allocator owns
/// another.
#[derive(Clone)]
pub struct HostBackend {
    state: Arc<Mutex<HostState>>,
    device: i32,
}

impl fmt::Debug for HostBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.lock();
        f.debug_struct("HostBackend")
            .field("device", &self.device)
            .field("capacity", &s.capacity)
            .field("used", &s.used)
            .field("streams", &s.streams.len())
            .finish()
    }
}

impl HostBackend {
    /// A backend with `capacity` bytes of "device" memory and the default stream.
    pub fn new(capacity: usize) -> Self {
        let state = HostState {
            capacity,
            used: 0,
            live: HashMap::new(),
            streams: vec![StreamClock::default()],
            counters: HostCounters::default(),
        };
        HostBackend {
            state: Arc::new(Mutex::new(state)),
            device: 0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HostState> {
        // The state stays consistent across a panic in a test thread; keep going.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates a new stream.
    pub fn new_stream(&self) -> HostStream {
        let mut s = self.lock();
        s.streams.push(StreamClock::default());
        HostStream((s.streams.len() - 1) as u32)
    }

    /// Marks every event recorded on `stream` so far as complete ("the device caught up").
    pub fn complete_stream(&self, stream: HostStream) {
        if let Ok(clock) = self.lock().clock(stream) {
            clock.completed = clock.recorded;
        }
    }

    /// Completes every event on every stream.
    pub fn complete_all(&self) {
        for clock in &mut self.lock().streams {
            clock.completed = clock.recorded;
        }
    }

    /// Events recorded on `stream` and not yet complete.
    pub fn pending_events(&self, stream: HostStream) -> u64 {
        self.lock()
            .clock(stream)
            .map_or(0, |c| c.recorded - c.completed)
    }

    /// Bytes currently allocated from the backend.
    pub fn used(&self) -> usize {
        self.lock().used
    }

    /// The configured capacity.
    pub fn capacity(&self) -> usize {
        self.lock().capacity
    }

    /// Changes the capacity (existing allocations stay).
    pub fn set_capacity(&self, capacity: usize) {
        self.lock().capacity = capacity;
    }

    /// Counters of the operations performed so far.
    pub fn counters(&self) -> HostCounters {
        self.lock().counters
    }

    /// Number of live raw allocations.
    pub fn live_allocations(&self) -> usize {
        self.lock().live.len()
    }
}

impl Backend for HostBackend {
    type Stream = HostStream;
    type Event = HostEvent;

    fn device(&self) -> i32 {
        self.device
    }

    fn malloc(&mut self, size: usize) -> Result<Option<DevicePtr>, BackendError> {
        let mut s = self.lock();
        let fits = s.used.checked_add(size).is_some_and(|u| u <= s.capacity);
        let layout = Layout::from_size_align(size, HOST_ALIGN).ok();
        let (true, Some(layout)) = (fits && size > 0, layout) else {
            s.counters.failed_mallocs += 1;
            return Ok(None);
        };
        // SAFETY: `layout` has a non-zero size (checked above) and a valid power-of-two alignment.
        let ptr = unsafe { alloc(layout) };
        if ptr.is_null() {
            s.counters.failed_mallocs += 1;
            return Ok(None);
        }
        s.used += size;
        s.live.insert(ptr as u64, size);
        s.counters.mallocs += 1;
        Ok(Some(DevicePtr(ptr as u64)))
    }

    unsafe fn free(&mut self, ptr: DevicePtr, size: usize) -> Result<(), BackendError> {
        let mut s = self.lock();
        let addr = ptr.0;
        let allocated = *s
            .live
            .get(&addr)
            .ok_or(HostBackendError::UnknownFree { addr, size })?;
        if allocated != size {
            return Err(HostBackendError::SizeMismatch {
                addr,
                size,
                allocated,
            }
            .into());
        }
        s.live.remove(&addr);
        s.used -= size;
        s.counters.frees += 1;
        if let Ok(layout) = Layout::from_size_align(size, HOST_ALIGN) {
            // SAFETY: `addr` was live in `live`, so it came from `alloc` with exactly this
            // layout and has not been deallocated; it is removed from `live` above.
            unsafe { dealloc(addr as *mut u8, layout) };
        }
        Ok(())
    }

    fn mem_info(&mut self) -> Result<MemInfo, BackendError> {
        let s = self.lock();
        Ok(MemInfo {
            free: s.capacity.saturating_sub(s.used),
            total: s.capacity,
        })
    }

    fn record_event(&mut self, stream: HostStream) -> Result<HostEvent, BackendError> {
        let mut s = self.lock();
        s.counters.events_recorded += 1;
        let clock = s.clock(stream)?;
        clock.recorded += 1;
        Ok(HostEvent {
            stream,
            seq: clock.recorded,
        })
    }

    fn event_query(&mut self, event: &HostEvent) -> Result<bool, BackendError> {
        let mut s = self.lock();
        s.counters.event_queries += 1;
        Ok(s.clock(event.stream)?.completed >= event.seq)
    }

    fn event_synchronize(&mut self, event: &HostEvent) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.counters.event_syncs += 1;
        let clock = s.clock(event.stream)?;
        clock.completed = clock.completed.max(event.seq);
        Ok(())
    }

    fn synchronize_device(&mut self) -> Result<(), BackendError> {
        let mut s = self.lock();
        s.counters.device_syncs += 1;
        for clock in &mut s.streams {
            clock.completed = clock.recorded;
        }
        Ok(())
    }
}
