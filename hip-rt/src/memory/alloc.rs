//! The allocation trait every `DeviceBuffer` allocates through, and its direct
//! hipMalloc/hipFree implementation.
//!
//! # The contract
//! A [`DeviceAllocator`] serves one device. hip-rt calls it with that device current on the
//! calling thread, never for zero bytes, and passes the stream the memory will first be used on
//! ([`RawStream`]; the null stream is `RawStream::NULL`). `deallocate` gets back exactly the
//! [`RawAllocation`] that `allocate` returned, once, with the allocation stream: work already
//! queued on that stream may still be using the memory, so a stream-ordered allocator may reuse
//! the block at once for later work on the same stream, but must not hand it to another stream
//! before that work completes. If the memory was used on other streams, hip-rt reports each one
//! through `record_stream` before deallocating (PyTorch's `record_stream` rule).
//!
//! The caching allocator (`crate::caching`) implements this trait; [`DirectAllocator`] is the
//! plain hipMalloc/hipFree one. hipFree waits for the whole device, which makes it correct for
//! any stream pattern and slow.

use std::fmt;

use hip_sys::hipStream_t;

use crate::error::{Error, Result};
use crate::launch::DevicePtr;
use crate::result;

/// A stream's identity as allocators see it: the `hipStream_t` address (0 = the null stream).
/// Copy, hashable, and safe to keep after the stream is gone (it is never dereferenced here).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RawStream(pub usize);

impl RawStream {
    /// The null (default) stream.
    pub const NULL: RawStream = RawStream(0);

    /// The identity of a raw stream handle.
    pub fn from_handle(stream: hipStream_t) -> RawStream {
        RawStream(stream as usize)
    }

    /// The raw handle back (only meaningful while the stream is alive).
    pub fn handle(self) -> hipStream_t {
        self.0 as hipStream_t
    }
}

/// Device memory handed out by a [`DeviceAllocator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawAllocation {
    /// The first usable byte.
    pub ptr: DevicePtr,
    /// The usable size in bytes (at least what was asked for).
    pub bytes: usize,
}

/// Where device memory comes from. See the [module docs](self) for the full contract.
pub trait DeviceAllocator: Send + Sync + fmt::Debug {
    /// Allocate at least `bytes` (> 0) bytes for use on `stream`, aligned to at least 256 bytes.
    ///
    /// Running out of memory is [`Error::OutOfMemory`], whose detail should say what the
    /// allocator knows (free/total, cached bytes) and what to do.
    fn allocate(&self, bytes: usize, stream: RawStream) -> Result<RawAllocation>;

    /// Return `allocation`, which was last allocated on `stream`.
    ///
    /// # Safety
    /// `allocation` must have come from `allocate` on this allocator and not been deallocated
    /// since; after this call the caller never touches that memory again (work already queued on
    /// `stream` may, which the allocator must respect as described in the module docs).
    unsafe fn deallocate(&self, allocation: RawAllocation, stream: RawStream) -> Result<()>;

    /// Note that `allocation` is also used by work queued on `stream` (other than its
    /// allocation stream): the allocator must not reuse it before that work completes.
    /// The default does nothing, which is right for allocators that free synchronously.
    fn record_stream(&self, allocation: &RawAllocation, stream: RawStream) -> Result<()> {
        let _ = (allocation, stream);
        Ok(())
    }

    /// The caching allocator behind this one, if it is one: what [`crate::Device`]'s memory
    /// statistics, `empty_cache` and `set_memory_fraction` reach. The default is `None`.
    fn caching(&self) -> Option<&crate::caching::CachingAllocator<crate::caching::HipBackend>> {
        None
    }
}

/// hipMalloc / hipFree, one call each per buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectAllocator {
    ordinal: i32,
}

impl DirectAllocator {
    /// The direct allocator of device `ordinal`.
    pub fn new(ordinal: i32) -> Self {
        DirectAllocator { ordinal }
    }
}

impl DeviceAllocator for DirectAllocator {
    fn allocate(&self, bytes: usize, _stream: RawStream) -> Result<RawAllocation> {
        match result::memory::malloc(bytes) {
            Ok(ptr) => Ok(RawAllocation { ptr, bytes }),
            Err(e) if e.is_out_of_memory() => Err(out_of_memory(self.ordinal, bytes)),
            Err(e) => Err(e.into()),
        }
    }

    unsafe fn deallocate(&self, allocation: RawAllocation, _stream: RawStream) -> Result<()> {
        // SAFETY: the caller guarantees `allocation` came from `allocate` (hipMalloc) and is
        // never used again; hipFree waits for queued work on the device before freeing.
        Ok(unsafe { result::memory::free(allocation.ptr) }?)
    }
}

/// The OutOfMemory error of the direct allocator, with the device's free/total memory.
fn out_of_memory(ordinal: i32, requested: usize) -> Error {
    let detail = match result::device::mem_info() {
        Ok((free, total)) => format!(
            "hipMalloc failed with {} MiB free of {} MiB. Free or drop buffers, reduce the batch size, \
             or check other processes with `/opt/hyhal/bin/hy-smi` (DTK) / `rocm-smi`",
            free >> 20,
            total >> 20
        ),
        Err(e) => format!("hipMalloc failed and hipMemGetInfo too ({e})"),
    };
    Error::OutOfMemory {
        ordinal,
        requested,
        detail,
    }
}
