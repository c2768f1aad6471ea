//! [`Event`]: a marker in a stream, for ordering and timing.

use hip_sys::generated::hipEvent_t;

use crate::device::Device;
use crate::error::Result;
use crate::result;
use crate::stream::Stream;

/// How an [`Event`] behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventOptions {
    /// Record timestamps (needed for [`Event::elapsed_ms`]). Events without timing are cheaper.
    pub timing: bool,
    /// Make [`Event::synchronize`] block the thread instead of spinning.
    pub blocking_sync: bool,
}

impl EventOptions {
    /// Timing enabled, spinning wait.
    pub const TIMING: EventOptions = EventOptions {
        timing: true,
        blocking_sync: false,
    };
    /// No timing (cheapest; for ordering only), spinning wait.
    pub const NO_TIMING: EventOptions = EventOptions {
        timing: false,
        blocking_sync: false,
    };
    /// No timing, blocking wait (frees the CPU while waiting).
    pub const BLOCKING: EventOptions = EventOptions {
        timing: false,
        blocking_sync: true,
    };

    fn flags(self) -> u32 {
        let mut flags = hip_sys::generated::hipEventDefault;
        if !self.timing {
            flags |= hip_sys::generated::hipEventDisableTiming;
        }
        if self.blocking_sync {
            flags |= hip_sys::generated::hipEventBlockingSync;
        }
        flags
    }
}

/// A HIP event on one device. Dropping it destroys the event (errors go to
/// [`Device::check_err`]).
pub struct Event {
    device: Device,
    raw: hipEvent_t,
    timing: bool,
}

// SAFETY: a hipEvent_t is a handle the HIP runtime allows to be used from any thread; the value
// holds only that handle, a flag and an Arc'd Device.
unsafe impl Send for Event {}
// SAFETY: as above; methods take `&self` and only pass the handle to thread-safe HIP calls.
unsafe impl Sync for Event {}

impl Event {
    /// A new event on `device`.
    pub fn new(device: &Device, options: EventOptions) -> Result<Event> {
        device.bind_to_thread()?;
        let raw = result::event::create(options.flags())?;
        Ok(Event {
            device: device.clone(),
            raw,
            timing: options.timing,
        })
    }

    /// The device this event belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle.
    pub fn raw(&self) -> hipEvent_t {
        self.raw
    }

    /// True when created with timing.
    pub fn has_timing(&self) -> bool {
        self.timing
    }

    /// Record this event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        stream.check_same_device("event", &self.device)?;
        // SAFETY: the event is live (owned here) and the stream live while borrowed, same device.
        Ok(unsafe { result::event::record(self.raw, stream.raw()) }?)
    }

    /// Wait on the host until the recorded work completes.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is live (owned here).
        Ok(unsafe { result::event::synchronize(self.raw) }?)
    }

    /// `true` once the recorded work has completed (never blocks).
    pub fn query(&self) -> Result<bool> {
        // SAFETY: the event is live (owned here).
        Ok(unsafe { result::event::query(self.raw) }?)
    }

    /// Milliseconds from this event to `end`; both must be recorded, complete and timing-enabled.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        // SAFETY: both events are live while borrowed.
        Ok(unsafe { result::event::elapsed_ms(self.raw, end.raw) }?)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: `raw` is the live event this value created, destroyed exactly once, here.
        let r = unsafe { result::event::destroy(self.raw) };
        self.device.record_drop_error(r.map_err(Into::into));
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Event({:?} on device {})",
            self.raw,
            self.device.ordinal()
        )
    }
}
