//! [`PinnedHostBuffer`]: page-locked host memory, the source and destination of truly
//! asynchronous copies.

use std::ptr::NonNull;
use std::sync::Mutex;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::event::{Event, EventOptions};
use crate::memory::buffer::{byte_len, Element};
use crate::result;
use crate::stream::Stream;

/// Page-locked host memory holding `len` values of `T` (zero-initialised).
///
/// Asynchronous copies to or from it record an event on their stream; every host access
/// ([`as_slice`](Self::as_slice), [`as_mut_slice`](Self::as_mut_slice)) and Drop first waits for
/// that event, so the host never races a pending copy. One event is created lazily per buffer
/// and re-recorded, so async copies cost one `hipEventRecord` each.
pub struct PinnedHostBuffer<T: Element> {
    ptr: NonNull<T>,
    len: usize,
    device: Device,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    event: Option<Event>,
    in_flight: bool,
    /// Set when a queued copy could be neither tracked nor waited for.
    poisoned: Option<crate::Error>,
}

// SAFETY: the buffer owns its allocation (like a Box<[T]>, T: Pod is Send); the pending-copy
// state is behind a Mutex.
unsafe impl<T: Element> Send for PinnedHostBuffer<T> {}
// SAFETY: shared access only reads the memory after waiting for pending copies (under the
// Mutex); writes need `&mut self`.
unsafe impl<T: Element> Sync for PinnedHostBuffer<T> {}

impl<T: Element> PinnedHostBuffer<T> {
    /// `len` zeroed elements of pinned memory, usable with any stream of `device`.
    /// Zero-length buffers make no HIP call.
    pub fn new(device: &Device, len: usize) -> Result<Self> {
        let bytes = byte_len::<T>(len)?;
        let ptr = if bytes == 0 {
            NonNull::dangling()
        } else {
            device.bind_to_thread()?;
            let raw = result::memory::host_malloc(bytes, hip_sys::generated::hipHostMallocDefault)?;
            let Some(ptr) = NonNull::new(raw.cast::<T>()) else {
                let detail =
                    "hipHostMalloc reported success but returned a null pointer".to_owned();
                return Err(Error::OutOfMemory {
                    ordinal: device.ordinal(),
                    requested: bytes,
                    detail,
                });
            };
            // SAFETY: `ptr` is a fresh allocation of `bytes` bytes; zeroing makes every element
            // a valid `T` (T: Pod) before any slice of it exists.
            unsafe { ptr.as_ptr().cast::<u8>().write_bytes(0, bytes) };
            ptr
        };
        Ok(PinnedHostBuffer {
            ptr,
            len,
            device: device.clone(),
            pending: Mutex::new(Pending::default()),
        })
    }

    /// A pinned copy of `data`.
    pub fn from_slice(device: &Device, data: &[T]) -> Result<Self> {
        let mut buf = Self::new(device, data.len())?;
        buf.as_mut_slice()?.copy_from_slice(data);
        Ok(buf)
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The contents, after waiting for pending copies.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.wait()?;
        // SAFETY: `ptr` is valid for `len` initialised elements (zeroed at creation, written
        // only by completed copies: `wait` returned), owned by `self`.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The contents for writing, after waiting for pending copies.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.wait()?;
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// Wait until no asynchronous copy touches this buffer.
    ///
    /// # Host sync
    /// Blocks only while a copy is still running: a copy already complete (the usual case
    /// once the stream has been waited for) is seen with a non-blocking event query.
    pub fn wait(&self) -> Result<()> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &pending.poisoned {
            return Err(e.clone());
        }
        if let (true, Some(event)) = (pending.in_flight, &pending.event) {
            if !event.query()? {
                event.synchronize()?;
            }
        }
        pending.in_flight = false;
        Ok(())
    }

    /// The raw host pointer, for the copy functions.
    pub(crate) fn host_ptr(&self) -> *mut T {
        self.ptr.as_ptr()
    }

    /// Queue an asynchronous copy that touches this buffer (`queue`) and track its completion
    /// with this buffer's event. If the completion cannot be tracked, the stream is
    /// synchronised instead; if even that fails, the buffer is poisoned: host access returns
    /// that error and Drop leaks the memory rather than free it under a running copy.
    pub(crate) fn track_copy(
        &self,
        stream: &Stream,
        queue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = &pending.poisoned {
            return Err(e.clone());
        }
        let ordinal = stream.device().ordinal();
        if !pending
            .event
            .as_ref()
            .is_some_and(|e| e.device().ordinal() == ordinal)
        {
            if let (true, Some(old)) = (pending.in_flight, &pending.event) {
                old.synchronize()?;
                pending.in_flight = false;
            }
            pending.event = Some(Event::new(stream.device(), EventOptions::NO_TIMING)?);
        }
        queue()?;
        let recorded = match &pending.event {
            Some(event) => event.record(stream),
            None => Ok(()), // unreachable: created above
        };
        match recorded {
            Ok(()) => {
                pending.in_flight = true;
                Ok(())
            }
            Err(e) => {
                if let Err(sync_err) = stream.synchronize() {
                    pending.poisoned = Some(sync_err);
                }
                Err(e)
            }
        }
    }
}

impl<T: Element> Drop for PinnedHostBuffer<T> {
    fn drop(&mut self) {
        if self.len == 0 || std::mem::size_of::<T>() == 0 {
            return;
        }
        let waited = self.wait();
        let freed = waited.and_then(|()| {
            // SAFETY: `ptr` came from hipHostMalloc in `new` (non-zero size), no copy is pending
            // (`wait` succeeded), and the buffer is never used again.
            Ok(unsafe { result::memory::host_free(self.ptr.as_ptr().cast()) }?)
        });
        // If waiting failed the memory is leaked rather than freed under a running copy.
        self.device.record_drop_error(freed);
    }
}

impl<T: Element> std::fmt::Debug for PinnedHostBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PinnedHostBuffer<{}>({} elems)",
            std::any::type_name::<T>(),
            self.len
        )
    }
}
