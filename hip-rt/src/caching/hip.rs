//! [`HipBackend`]: the caching policy over HIP (`hipMalloc`/`hipFree`, `hipMemGetInfo`,
//! `hipEvent*`), and [`DeviceAllocator`] for `CachingAllocator<HipBackend>` so a
//! [`Device`](crate::Device) can allocate through the cache:
//!
//! ```no_run
//! use std::sync::Arc;
//! use hip_rt::caching::{CachingAllocator, HipBackend};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let cache = CachingAllocator::new(HipBackend::new(0))?; // reads HIPK_ALLOC_CONF
//! let device = hip_rt::Device::with_allocator(0, Arc::new(cache))?;
//! # let _ = device; Ok(()) }
//! ```
//!
//! This file has only been compiled and run up to HIP's "no device" answer: no DCU was
//! available. The policy above it is tested on the host backend.

use std::sync::Arc;

use hip_sys::hipEvent_t;

use super::backend::{Backend, BackendError, DevicePtr, MemInfo};
use super::error::AllocError;
use super::CachingAllocator;
use crate::error::{Error, Result};
use crate::memory::alloc::{DeviceAllocator, RawAllocation, RawStream};
use crate::result;

/// Spare events kept for reuse; beyond this, completed events are destroyed.
const MAX_SPARE_EVENTS: usize = 256;

/// A `hipEvent_t` created with timing disabled, destroyed on drop.
#[derive(Debug)]
pub struct HipEvent(hipEvent_t);

// SAFETY: a hipEvent_t is an opaque runtime handle that HIP allows any host thread to record,
// query, synchronise and destroy; the policy only touches it under the allocator's lock.
unsafe impl Send for HipEvent {}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: the handle came from `result::event::create`, is owned only by this value,
        // and is destroyed exactly once, here. A failure leaks the event and is ignored:
        // Drop must not panic and has no one to report to.
        let _ = unsafe { result::event::destroy(self.0) };
    }
}

/// The raw HIP backend of one device.
#[derive(Debug)]
pub struct HipBackend {
    ordinal: i32,
    spare_events: Vec<HipEvent>,
}

impl HipBackend {
    /// The backend of device `ordinal`. Nothing is called on HIP until the first allocation.
    pub fn new(ordinal: i32) -> Self {
        HipBackend {
            ordinal,
            spare_events: Vec::new(),
        }
    }

    /// Runs `f` with this backend's device current on the calling thread, restoring the
    /// previous device afterwards (the allocator may be dropped or used from any thread).
    fn on_device<T>(&self, f: impl FnOnce() -> Result<T>) -> std::result::Result<T, BackendError> {
        // Errors reach the allocator as hip-rt's (Error::Sys), as from every other call here.
        let previous = result::device::current().map_err(Error::from)?;
        if previous == self.ordinal {
            return Ok(f()?);
        }
        result::device::set(self.ordinal).map_err(Error::from)?;
        let out = f();
        let restored = result::device::set(previous).map_err(Error::from);
        let value = out?;
        restored?;
        Ok(value)
    }
}

impl Backend for HipBackend {
    type Stream = RawStream;
    type Event = HipEvent;

    fn device(&self) -> i32 {
        self.ordinal
    }

    fn malloc(&mut self, size: usize) -> std::result::Result<Option<DevicePtr>, BackendError> {
        self.on_device(|| match result::memory::malloc(size) {
            Ok(ptr) => Ok(Some(ptr)),
            Err(e) if e.is_out_of_memory() => Ok(None),
            Err(e) => Err(e.into()),
        })
    }

    unsafe fn free(
        &mut self,
        ptr: DevicePtr,
        _size: usize,
    ) -> std::result::Result<(), BackendError> {
        // SAFETY: the caller guarantees `ptr` came from `malloc` here and is freed once;
        // hipFree waits for work queued on the device before releasing the memory.
        self.on_device(|| unsafe { result::memory::free(ptr) }.map_err(Into::into))
    }

    /// On hip-emu, the emulator's poisoning (`hip_rt::emu::mark_block`); elsewhere nothing.
    fn mark(&mut self, ptr: DevicePtr, size: usize, live: bool, stream: Option<RawStream>) {
        let _ = self.on_device(|| {
            let stream = stream.map(|s| s.0 as hip_sys::hipStream_t);
            crate::emu::mark_block(ptr, size, live, stream);
            Ok(())
        });
    }

    /// On hip-emu, one byte: every block then has poisoned bytes after it.
    fn guard_slack(&self) -> usize {
        usize::from(crate::emu::is_hip_emu())
    }

    fn mem_info(&mut self) -> std::result::Result<MemInfo, BackendError> {
        let (free, total) = self.on_device(|| Ok(result::device::mem_info()?))?;
        Ok(MemInfo { free, total })
    }

    fn record_event(&mut self, stream: RawStream) -> std::result::Result<HipEvent, BackendError> {
        let event = match self.spare_events.pop() {
            Some(e) => e,
            None => HipEvent(self.on_device(|| {
                Ok(result::event::create(
                    hip_sys::generated::hipEventDisableTiming,
                )?)
            })?),
        };
        // SAFETY: `event` is live (owned here) and was created on this device; `stream` is
        // the identity of a stream the caller allocated on or recorded, which the
        // DeviceAllocator contract requires to be live and on this device.
        match unsafe { result::event::record(event.0, stream.handle()) } {
            Ok(()) => Ok(event),
            Err(e) => {
                self.recycle_event(event);
                Err(e.into())
            }
        }
    }

    fn event_query(&mut self, event: &HipEvent) -> std::result::Result<bool, BackendError> {
        // SAFETY: `event` is live until dropped, which needs `&mut` ownership.
        Ok(unsafe { result::event::query(event.0) }?)
    }

    fn event_synchronize(&mut self, event: &HipEvent) -> std::result::Result<(), BackendError> {
        // SAFETY: as in `event_query`.
        Ok(unsafe { result::event::synchronize(event.0) }?)
    }

    fn synchronize_device(&mut self) -> std::result::Result<(), BackendError> {
        self.on_device(|| Ok(result::device::synchronize()?))
    }

    fn recycle_event(&mut self, event: HipEvent) {
        if self.spare_events.len() < MAX_SPARE_EVENTS {
            self.spare_events.push(event);
        }
    }
}

/// Maps the allocator's errors onto hip-rt's: out-of-memory keeps its full report, backend
/// failures are the HIP errors they wrapped.
pub(crate) fn to_rt_error(e: AllocError, ordinal: i32) -> Error {
    match e {
        AllocError::OutOfMemory(oom) => Error::OutOfMemory {
            ordinal: oom.device,
            requested: oom.requested,
            detail: oom.detail(),
        },
        AllocError::TooLarge { requested } => Error::OutOfMemory {
            ordinal,
            requested,
            detail: "more than 1 EiB requested; check the size computation".into(),
        },
        AllocError::Backend { op, device, source } => match source.downcast::<Error>() {
            Ok(e) => *e,
            Err(source) => Error::Caching(Arc::new(AllocError::Backend { op, device, source })),
        },
        other => Error::Caching(Arc::new(other)),
    }
}

impl DeviceAllocator for CachingAllocator<HipBackend> {
    fn allocate(&self, bytes: usize, stream: RawStream) -> Result<RawAllocation> {
        let ptr = self
            .allocate_ptr(bytes, stream)
            .map_err(|e| to_rt_error(e, self.device()))?;
        Ok(RawAllocation { ptr, bytes })
    }

    unsafe fn deallocate(&self, allocation: RawAllocation, _stream: RawStream) -> Result<()> {
        // SAFETY: the DeviceAllocator contract: `allocation` came from `allocate` above (so
        // from `allocate_ptr`), has not been deallocated since, and is never used again.
        unsafe { self.free_ptr(allocation.ptr) }.map_err(|e| to_rt_error(e, self.device()))
    }

    fn record_stream(&self, allocation: &RawAllocation, stream: RawStream) -> Result<()> {
        self.record_stream_ptr(allocation.ptr, stream)
            .map_err(|e| to_rt_error(e, self.device()))
    }

    fn caching(&self) -> Option<&CachingAllocator<HipBackend>> {
        Some(self)
    }
}
