//! A stream-aware caching allocator with PyTorch's `CUDACachingAllocator` semantics, generic
//! over a raw [`Backend`] (HIP for real, [`HostBackend`] for tests and benches).
//!
//! # Policy
//! - Requests round up to 512 B. Requests of at most 1 MiB use the small pool, carved from
//!   2 MiB segments; 1–10 MiB requests get 20 MiB segments; larger ones are rounded up to
//!   2 MiB. A cached block is chosen best-fit by (stream, size) and split when the remainder
//!   is at least 512 B (small pool) or more than 1 MiB (large pool); freed blocks merge with
//!   free neighbours.
//! - `max_split_size_mb`: blocks of at least that size are never split, are not handed to
//!   smaller requests, and serve larger requests only if they waste less than 20 MiB.
//! - Stream-ordered reuse: a freed block is reusable at once on the stream it was allocated
//!   on. If it was used on other streams ([`Allocation::record_stream`]), freeing records an
//!   event on each, and the block returns to the cache only once they have completed. Events
//!   are *queried* at the next allocation; nothing on the allocation path waits for the device.
//! - On a failed device allocation: release oversize cached segments (with `max_split_size`
//!   set), then (PyTorch's order) synchronise all outstanding events, release every cached
//!   segment that holds no live block, of every stream, and retry once (`num_alloc_retries`),
//!   both from the cache and from the device. Only then return [`OutOfMemory`] (`num_ooms`),
//!   whose message carries the numbers and a hint chosen from them: free memory stranded on
//!   other streams or inside segments with live blocks is named as such, and a setting
//!   already in force is never suggested.
//! - `garbage_collection_threshold`: before reserving more, old unsplit large cached segments
//!   are released (no synchronisation) while reserved memory exceeds that fraction of the
//!   allowed memory. Unlike PyTorch, it also works without a memory fraction set: the
//!   allowed memory is then the device capacity.
//!
//! Configuration comes from `HIPK_ALLOC_CONF` ([`AllocatorConfig`]), read when the allocator
//! is created; unknown keys and bad values are errors, not warnings.
//!
//! # Threads
//! One lock per allocator (one allocator per device). [`Allocation`] returns its block on
//! `Drop`, stream-ordered as above; an error there (only possible when a backend event call
//! fails) is recorded and reported by [`CachingAllocator::check_err`].
//!
//! # Backends
//! [`HipBackend`] runs the policy on a HIP device (`hipMalloc`/`hipFree`, `hipMemGetInfo`,
//! pooled `hipEvent`s), and `CachingAllocator<HipBackend>` implements hip-rt's
//! [`DeviceAllocator`](crate::DeviceAllocator). [`Device::get`](crate::Device::get) uses one
//! such cache per device (shared by every `Device::get` of it), so every `DeviceBuffer` comes
//! from the cache by default; `Device::with_allocator(ordinal,
//! Arc::new(CachingAllocator::new(HipBackend::new(ordinal))?))` makes a private one. The
//! device's cache answers through [`Device`](crate::Device) as `torch.cuda` does:
//! `memory_stats()`, `reset_peak_memory_stats()`, `empty_cache()`, `set_memory_fraction()`
//! and `memory_summary()` ([`DeviceAllocator::caching`](crate::DeviceAllocator::caching) is
//! the hook they use). [`HostBackend`] (host memory, simulated streams and
//! events) exercises the same policy in tests and benches.
//!
//! What has run where: the policy runs against [`HostBackend`] in the unit tests, and
//! [`HipBackend`] on hip-emu, the CPU-emulated HIP device, in the device tests
//! (`tests/caching_device.rs`, `tests/device_memory_stats.rs`, `--features device`). Neither has
//! run on a GPU.
//!
//! Graph capture: between [`CachingAllocator::begin_capture`] and
//! [`CachingAllocator::end_capture`] (hip-rt's `Stream::begin_capture` / `end_capture` call
//! them), the capturing stream's requests come from a private pool of the capture's own, in
//! which its frees are reused by its later requests (stream-ordered as in eager mode); every
//! other free is held for the graph. The pool and the held blocks come back when the graph's
//! [`GraphPool`] drops: see the `graph` module's docs in the source (`caching/graph.rs`) and
//! [`GraphPool`].
//!
//! Memory checking: the policy tells its backend which bytes of a segment hold a live block
//! ([`Backend::mark`]: a new segment is all free; a handed-out block's requested bytes are live,
//! its rounding slack is not; a freed block is not, in its stream's order). [`HipBackend`]
//! passes this to hip-emu (`hip_rt::emu::mark_block`; nothing on a real runtime), which then
//! reports an access past a cached block as it reports one past a `hipMalloc` allocation.

mod backend;
mod config;
mod error;
mod graph;
pub(crate) mod hip;
mod host;
mod policy;
mod stats;
mod summary;

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub use backend::{Backend, BackendError, DevicePtr, MemInfo};
pub use config::{AllocatorConfig, ConfigError, CONFIG_ENV};
pub use error::{AllocError, OomHint, OutOfMemory};
pub use graph::GraphPool;
pub use hip::{HipBackend, HipEvent};
pub use host::{HostBackend, HostBackendError, HostCounters, HostEvent, HostStream};
pub use policy::{allocation_size, round_size};
pub use stats::{
    BlockInfo, BlockState, SegmentInfo, Snapshot, Stat, StatArray, StatKeyError, StatType, Stats,
};
pub use summary::memory_summary;

use policy::{Policy, NONE};

/// One MiB.
pub const MIB: usize = 1 << 20;
/// Smallest block and the rounding unit (PyTorch `kMinBlockSize`).
pub const KMIN_BLOCK_SIZE: usize = 512;
/// Largest request served by the small pool (`kSmallSize`).
pub const KSMALL_SIZE: usize = MIB;
/// Segment size of the small pool (`kSmallBuffer`).
pub const KSMALL_BUFFER: usize = 2 * MIB;
/// Segment size for 1–10 MiB requests (`kLargeBuffer`).
pub const KLARGE_BUFFER: usize = 20 * MIB;
/// Requests from this size get a segment of their own size (`kMinLargeAlloc`).
pub const KMIN_LARGE_ALLOC: usize = 10 * MIB;
/// Rounding of segments for large requests (`kRoundLarge`).
pub const KROUND_LARGE: usize = 2 * MIB;
/// Requests above 1 EiB are rejected as size bugs ([`AllocError::TooLarge`]).
pub const MAX_REQUEST: usize = 1 << 60;

struct Shared<B: Backend> {
    policy: Mutex<Policy<B>>,
    device: i32,
    /// Graph capture: frees held for the graph (see [`GraphPool`]). Locked before `policy`.
    graphs: Mutex<graph::Holds<B::Stream>>,
    /// True while a capture is under way (spares the allocation path the `graphs` lock).
    capturing: AtomicBool,
}

/// A caching allocator for one device. Cheap to clone (clones share the cache).
pub struct CachingAllocator<B: Backend> {
    shared: Arc<Shared<B>>,
}

impl<B: Backend> Clone for CachingAllocator<B> {
    fn clone(&self) -> Self {
        CachingAllocator {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<B: Backend> fmt::Debug for CachingAllocator<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("device", &self.shared.device)
            .finish_non_exhaustive()
    }
}

/// An allocation not tied to a handle: the address and the block it came from. Not `Clone`,
/// so it can be freed only once; dropping it without [`CachingAllocator::free_raw`] leaks
/// the block (like a forgotten pointer).
#[derive(Debug, PartialEq, Eq)]
pub struct RawBlock {
    id: u32,
    ptr: DevicePtr,
    size: usize,
}

impl RawBlock {
    const EMPTY: RawBlock = RawBlock {
        id: NONE,
        ptr: DevicePtr::NULL,
        size: 0,
    };

    /// The device address (null for zero bytes).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The requested size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }
}

impl<B: Backend> CachingAllocator<B> {
    /// An allocator over `backend`, configured from `HIPK_ALLOC_CONF` (unset = defaults).
    pub fn new(backend: B) -> Result<Self, AllocError> {
        Self::with_config(backend, AllocatorConfig::from_env()?)
    }

    /// An allocator with an explicit configuration (the environment is not read).
    pub fn with_config(backend: B, config: AllocatorConfig) -> Result<Self, AllocError> {
        let device = backend.device();
        let policy = Policy::new(backend, config)?;
        Ok(CachingAllocator {
            shared: Arc::new(Shared {
                policy: Mutex::new(policy),
                device,
                graphs: Mutex::new(graph::Holds::default()),
                capturing: AtomicBool::new(false),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Policy<B>> {
        // The policy never panics while holding the lock; if a backend did, its state is
        // still a consistent snapshot between operations, so carry on.
        self.shared
            .policy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.shared.device
    }

    /// Allocates `size` bytes for use on `stream`; the block returns to the cache when the
    /// handle drops. Zero bytes gives a null pointer without touching the device.
    pub fn allocate(&self, size: usize, stream: B::Stream) -> Result<Allocation<B>, AllocError> {
        let raw = self.allocate_raw(size, stream)?;
        Ok(Allocation {
            allocator: self.clone(),
            raw,
            stream,
        })
    }

    /// Allocates without a handle; give it back with [`CachingAllocator::free_raw`].
    pub fn allocate_raw(&self, size: usize, stream: B::Stream) -> Result<RawBlock, AllocError> {
        if size == 0 {
            return Ok(RawBlock::EMPTY);
        }
        let grant = self.malloc(size, stream, false)?;
        Ok(RawBlock {
            id: grant.id,
            ptr: grant.ptr,
            size,
        })
    }

    /// Returns a raw allocation to the cache (stream-ordered, as for [`Allocation`]).
    pub fn free_raw(&self, raw: RawBlock) -> Result<(), AllocError> {
        if raw.id == NONE {
            return Ok(());
        }
        if self.hold(raw.id, raw.ptr)? {
            return Ok(());
        }
        let mut policy = self.lock();
        if !policy.is_allocated(raw.id, raw.ptr.0) {
            return Err(self.foreign(raw.ptr));
        }
        policy.free(raw.id)
    }

    /// Records that a raw allocation is used on `stream` (see [`Allocation::record_stream`]).
    pub fn record_stream_raw(&self, raw: &RawBlock, stream: B::Stream) -> Result<(), AllocError> {
        if raw.id == NONE {
            return Ok(());
        }
        let mut policy = self.lock();
        if !policy.is_allocated(raw.id, raw.ptr.0) {
            return Err(self.foreign(raw.ptr));
        }
        policy.record_stream(raw.id, stream)
    }

    /// Allocates for callers that keep only the address (allocator interfaces without a
    /// token): free it with [`CachingAllocator::free_ptr`]. Costs an address-index update
    /// that [`CachingAllocator::allocate`] avoids. Zero bytes gives null.
    pub fn allocate_ptr(&self, size: usize, stream: B::Stream) -> Result<DevicePtr, AllocError> {
        if size == 0 {
            return Ok(DevicePtr::NULL);
        }
        Ok(self.malloc(size, stream, true)?.ptr)
    }

    /// Returns an allocation from [`CachingAllocator::allocate_ptr`], stream-ordered as for
    /// [`Allocation`]. Null is a no-op.
    ///
    /// # Safety
    /// `ptr` came from `allocate_ptr` on this allocator, has not been freed since, and the
    /// caller never uses it again. Anything else may free a block that another owner still
    /// uses (an unknown address is refused, but a stale one may have been reallocated).
    pub unsafe fn free_ptr(&self, ptr: DevicePtr) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let found = self.lock().allocated_at(ptr.0);
        let Some(id) = found else {
            return Err(self.foreign(ptr));
        };
        if self.hold(id, ptr)? {
            return Ok(());
        }
        self.lock().free(id)
    }

    /// Records that the allocation at `ptr` (from [`CachingAllocator::allocate_ptr`]) is used
    /// on `stream` too (see [`Allocation::record_stream`]). Null is a no-op.
    pub fn record_stream_ptr(&self, ptr: DevicePtr, stream: B::Stream) -> Result<(), AllocError> {
        if ptr.is_null() {
            return Ok(());
        }
        let mut policy = self.lock();
        match policy.allocated_at(ptr.0) {
            Some(id) => policy.record_stream(id, stream),
            None => Err(self.foreign(ptr)),
        }
    }

    fn foreign(&self, ptr: DevicePtr) -> AllocError {
        AllocError::ForeignAllocation {
            device: self.shared.device,
            addr: ptr.0,
        }
    }

    /// Waits for outstanding events, then returns every cached segment that is entirely free
    /// to the device (PyTorch's `empty_cache`).
    pub fn empty_cache(&self) -> Result<(), AllocError> {
        self.lock().release_cached_blocks()
    }

    /// Caps reserved memory at `fraction` of the device's capacity (`0 < fraction <= 1`; other
    /// values are [`ConfigError::InvalidFraction`]). A request that would reserve more fails
    /// as out-of-memory, and the message names the fraction.
    pub fn set_memory_fraction(&self, fraction: f64) -> Result<(), AllocError> {
        self.lock().set_memory_fraction(fraction)
    }

    /// The current statistics.
    pub fn stats(&self) -> Stats {
        self.lock().stats()
    }

    /// The statistics as a text table (see [`memory_summary`]).
    pub fn memory_summary(&self) -> String {
        memory_summary(self.shared.device, &self.stats())
    }

    /// Sets every peak to its current value.
    pub fn reset_peak_stats(&self) {
        self.lock().stats.reset_peak();
    }

    /// Zeroes the `allocated`/`freed` totals and the event counters.
    pub fn reset_accumulated_stats(&self) {
        self.lock().stats.reset_accumulated();
    }

    /// All segments and blocks.
    pub fn snapshot(&self) -> Snapshot<B::Stream> {
        self.lock().snapshot()
    }

    /// The configuration in effect (including a fraction set at run time).
    pub fn config(&self) -> AllocatorConfig {
        self.lock().config.clone()
    }

    /// Runs `f` on the backend, under the allocator's lock.
    pub fn with_backend<R>(&self, f: impl FnOnce(&mut B) -> R) -> R {
        f(&mut self.lock().backend)
    }

    /// Returns (and clears) the first error hit while freeing from `Drop`, if any.
    pub fn check_err(&self) -> Result<(), AllocError> {
        let mut policy = self.lock();
        policy.drop_error_count = 0;
        match policy.drop_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn free_from_drop(&self, raw: RawBlock) {
        if let Err(e) = self.free_raw(raw) {
            let mut policy = self.lock();
            policy.drop_error_count += 1;
            policy.drop_error.get_or_insert(e);
        }
    }
}

/// Device memory from a [`CachingAllocator`]; returns to the cache on `Drop`, ordered after
/// the work queued on its stream (and on recorded streams).
pub struct Allocation<B: Backend> {
    allocator: CachingAllocator<B>,
    raw: RawBlock,
    stream: B::Stream,
}

impl<B: Backend> fmt::Debug for Allocation<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Allocation")
            .field("ptr", &self.raw.ptr)
            .field("size", &self.raw.size)
            .field("stream", &self.stream)
            .finish()
    }
}

impl<B: Backend> Allocation<B> {
    /// The device address (null for zero bytes).
    pub fn ptr(&self) -> DevicePtr {
        self.raw.ptr
    }

    /// The requested size in bytes (the block may be larger).
    pub fn size(&self) -> usize {
        self.raw.size
    }

    /// The stream it was allocated on.
    pub fn stream(&self) -> B::Stream {
        self.stream
    }

    /// Records that the memory is used on `stream` too: after this handle drops, the block
    /// is not reused until the work queued on `stream` by then has completed. Fails only
    /// when the allocator already tracks its maximum number of streams.
    pub fn record_stream(&self, stream: B::Stream) -> Result<(), AllocError> {
        self.allocator.record_stream_raw(&self.raw, stream)
    }

    /// The allocator it came from.
    pub fn allocator(&self) -> &CachingAllocator<B> {
        &self.allocator
    }

    /// Detaches the block from the handle; free it with [`CachingAllocator::free_raw`].
    pub fn into_raw(mut self) -> RawBlock {
        self.take_raw()
    }

    fn take_raw(&mut self) -> RawBlock {
        std::mem::replace(&mut self.raw, RawBlock::EMPTY)
    }
}

impl<B: Backend> Drop for Allocation<B> {
    fn drop(&mut self) {
        let raw = self.take_raw();
        self.allocator.free_from_drop(raw);
    }
}
