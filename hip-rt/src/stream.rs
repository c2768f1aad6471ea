//! [`Stream`]: an ordered queue of device work.

use hip_sys::generated::hipStream_t;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::memory::alloc::RawStream;
use crate::result;

/// How to create a [`Stream`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamOptions {
    /// `hipStreamNonBlocking`: do not synchronise with the null stream.
    pub non_blocking: bool,
    /// Priority; lower numbers run first. `0` is the default priority; see
    /// [`Stream::priority_range`] for the device's range.
    pub priority: i32,
}

/// A HIP stream on one device. Dropping it destroys the stream (errors go to
/// [`Device::check_err`]); work already queued still completes.
pub struct Stream {
    device: Device,
    raw: hipStream_t,
}

// SAFETY: a hipStream_t is a handle the HIP runtime allows to be used from any thread
// concurrently; the Rust value only holds that handle and an Arc'd Device.
unsafe impl Send for Stream {}
// SAFETY: as above; every method takes `&self` and only passes the handle to thread-safe calls.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new stream on `device`.
    pub fn new(device: &Device, options: StreamOptions) -> Result<Stream> {
        device.bind_to_thread()?;
        let flags = if options.non_blocking {
            hip_sys::generated::hipStreamNonBlocking
        } else {
            hip_sys::generated::hipStreamDefault
        };
        let raw = result::stream::create(flags, options.priority)?;
        Ok(Stream {
            device: device.clone(),
            raw,
        })
    }

    /// The device's null (default) stream. Makes no HIP call.
    pub fn null(device: &Device) -> Stream {
        Stream {
            device: device.clone(),
            raw: std::ptr::null_mut(),
        }
    }

    /// A stream value around a made-up handle, for unit tests that must never reach HIP.
    /// The caller must `mem::forget` it (dropping would destroy the bogus handle).
    #[cfg(test)]
    pub(crate) fn from_raw_for_tests(device: &Device, raw: hipStream_t) -> Stream {
        Stream {
            device: device.clone(),
            raw,
        }
    }

    /// `(least, greatest)` priority on `device`; greater priority = lower number.
    pub fn priority_range(device: &Device) -> Result<(i32, i32)> {
        device.bind_to_thread()?;
        Ok(result::device::stream_priority_range()?)
    }

    /// The device this stream runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle (null for the null stream).
    pub fn raw(&self) -> hipStream_t {
        self.raw
    }

    /// The stream's identity for allocators.
    pub fn id(&self) -> RawStream {
        RawStream::from_handle(self.raw)
    }

    /// True for the null stream.
    pub fn is_null(&self) -> bool {
        self.raw.is_null()
    }

    /// Wait until all queued work has completed.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: `raw` is null or the live stream this value owns.
        Ok(unsafe { result::stream::synchronize(self.raw) }?)
    }

    /// `true` when all queued work has completed (never blocks).
    pub fn query(&self) -> Result<bool> {
        // SAFETY: `raw` is null or the live stream this value owns.
        Ok(unsafe { result::stream::query(self.raw) }?)
    }

    /// Make later work on this stream wait for `event`'s last record (no host wait).
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.check_same_device("event", event.device())?;
        // SAFETY: `raw` is null or live (owned here); the event is live while borrowed.
        Ok(unsafe { result::stream::wait_event(self.raw, event.raw()) }?)
    }

    /// Record `event` on this stream (shorthand for [`Event::record`]).
    pub fn record(&self, event: &Event) -> Result<()> {
        event.record(self)
    }

    /// An error if `other` is not this stream's device.
    pub(crate) fn check_same_device(&self, what: &'static str, other: &Device) -> Result<()> {
        if other.ordinal() == self.device.ordinal() {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                what,
                expected: self.device.ordinal(),
                found: other.ordinal(),
            })
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: `raw` is the live stream this value created; it is destroyed exactly once,
            // here, and never used again.
            let r = unsafe { result::stream::destroy(self.raw) };
            self.device.record_drop_error(r.map_err(Into::into));
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Stream({:?} on device {})",
            self.raw,
            self.device.ordinal()
        )
    }
}
