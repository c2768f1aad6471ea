//! The raw backend the caching policy sits on: device malloc/free, memory info, and the
//! stream/event primitives that stream-ordered reuse needs.

use std::error::Error as StdError;
use std::fmt::Debug;
use std::hash::Hash;

/// A device address (hip-rt's [`DevicePtr`](crate::DevicePtr)): plain data, never
/// dereferenced by the allocator. Zero-byte allocations get [`DevicePtr::NULL`].
pub use crate::launch::DevicePtr;

/// Device memory as the backend reports it (`hipMemGetInfo` for HIP).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes the device can still hand out, to anyone.
    pub free: usize,
    /// Total bytes of device memory.
    pub total: usize,
}

/// The error type a backend reports; boxed so the policy's errors stay one concrete type.
pub type BackendError = Box<dyn StdError + Send + Sync + 'static>;

/// Raw allocation, memory info and stream/event primitives for one device.
///
/// The caching policy ([`super::CachingAllocator`]) calls these with its lock held, so an
/// implementation needs no locking of its own for the allocator's sake. Every method is
/// fallible; the policy propagates errors to the caller (or, from `Drop`, records them).
pub trait Backend: Send + 'static {
    /// An opaque stream handle. Allocations belong to the stream they were made on.
    type Stream: Copy + Eq + Hash + Debug + Send + Sync + 'static;
    /// A recorded event: completes once all work queued on its stream before it has finished.
    type Event: Send + 'static;

    /// The device ordinal, for messages and snapshots.
    fn device(&self) -> i32;

    /// Allocates `size` bytes (`size > 0`). `Ok(None)` means the device is out of memory (the
    /// policy then frees its cache and retries); `Err` is any other failure.
    fn malloc(&mut self, size: usize) -> Result<Option<DevicePtr>, BackendError>;

    /// Frees an address returned by [`Backend::malloc`] with the same `size`.
    ///
    /// The policy calls this only for a cached block: its owner has freed it and the events
    /// of every other stream that used it have completed. Work queued on the block's own
    /// stream may still be in flight, so the implementation must not release memory under
    /// running work (`hipFree` synchronises the device first).
    ///
    /// # Safety
    /// `ptr` came from `malloc(size)` on this backend and is not freed yet.
    unsafe fn free(&mut self, ptr: DevicePtr, size: usize) -> Result<(), BackendError>;

    /// Free and total device memory.
    fn mem_info(&mut self) -> Result<MemInfo, BackendError>;

    /// Records an event on `stream` (after all work queued on it so far).
    fn record_event(&mut self, stream: Self::Stream) -> Result<Self::Event, BackendError>;

    /// `true` once `event` has completed. Must not block.
    fn event_query(&mut self, event: &Self::Event) -> Result<bool, BackendError>;

    /// Blocks the host until `event` has completed.
    fn event_synchronize(&mut self, event: &Self::Event) -> Result<(), BackendError>;

    /// Blocks the host until all work on the device has completed.
    fn synchronize_device(&mut self) -> Result<(), BackendError>;

    /// Tells the device which bytes of a segment hold a live block (`live`) and which belong
    /// to none, for a memory checker (hip-emu: an access outside every live block is reported
    /// as an out-of-bounds access). `stream`: in the order of that stream's work (a block
    /// freed or handed out for it); `None`: at once (a fresh segment). The default does
    /// nothing; a failure is ignored (it only weakens the check).
    fn mark(&mut self, ptr: DevicePtr, size: usize, live: bool, stream: Option<Self::Stream>) {
        let _ = (ptr, size, live, stream);
    }

    /// Bytes the policy leaves unused after every block's requested size, so that a memory
    /// checker sees an access one past its end (hip-emu: else a request of a multiple of 512 B
    /// ends where the next block begins, and an overrun lands in that live block unnoticed).
    /// The default is none.
    fn guard_slack(&self) -> usize {
        0
    }

    /// Takes back an event the policy no longer needs (it has completed), e.g. into a pool
    /// for the next `record_event`. The default drops it.
    fn recycle_event(&mut self, event: Self::Event) {
        drop(event);
    }
}
