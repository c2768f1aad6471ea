//! Streams and events.

use std::ffi::{c_int, c_uint};
use std::sync::Arc;

use hip_sys::generated::{
    hipEventBlockingSync, hipEventDisableTiming, hipEventInterprocess, hipStreamNonBlocking,
};
use hip_sys::{hipError_t, hipEvent_t, hipStream_t};

use super::device::PRIORITY_RANGE;
use super::error::{Fail, Res};
use super::queue::EventState;
use super::stats::{self, Counter};
use super::{hip_exports, out, runtime, EventInfo, StreamInfo};

/// Create a stream on the current device.
fn create_stream(stream: *mut hipStream_t, flags: c_uint, priority: c_int) -> Res {
    if flags & !hipStreamNonBlocking != 0 {
        return Err(Fail::invalid(format!(
            "stream flags {flags:#x} are not hipStreamDefault/NonBlocking"
        )));
    }
    let rt = runtime()?;
    let dev = rt.current()?;
    // Clamp like HIP: out-of-range priorities take the nearest bound.
    let priority = priority.clamp(PRIORITY_RANGE.1, PRIORITY_RANGE.0);
    let id = super::new_handle() as u64;
    let info = StreamInfo {
        device: dev.ordinal,
        id,
        flags,
        priority,
    };
    if stream.is_null() {
        return Err(Fail::invalid("stream out-pointer is null"));
    }
    dev.executor
        .add_stream(id, flags & hipStreamNonBlocking == 0, priority);
    let handle = rt.add_stream(info);
    // SAFETY: out-parameter per the C API contract (checked non-null above).
    unsafe { out(stream, handle as hipStream_t, "stream") }
}

/// Map a query result: idle → success, busy → hipErrorNotReady.
fn ready(done: Res<bool>, what: &str) -> Res {
    match done? {
        true => Ok(()),
        false => Err(Fail::new(
            hipError_t::hipErrorNotReady,
            format!("{what} has work pending"),
        )),
    }
}

fn create_event(event: *mut hipEvent_t, flags: c_uint) -> Res {
    let known = hipEventBlockingSync | hipEventDisableTiming | hipEventInterprocess;
    if flags & !known != 0 {
        return Err(Fail::invalid(format!("event flags {flags:#x} are unknown")));
    }
    let rt = runtime()?;
    let device = rt.current()?.ordinal;
    if event.is_null() {
        return Err(Fail::invalid("event out-pointer is null"));
    }
    let state = Arc::new(EventState::new(flags & hipEventDisableTiming == 0));
    let handle = rt.add_event(EventInfo {
        device,
        flags,
        state,
    });
    // SAFETY: out-parameter per the C API contract (checked non-null above).
    unsafe { out(event, handle as hipEvent_t, "event") }
}

hip_exports! {
    fn hipStreamCreate(stream: *mut hipStream_t) {
        create_stream(stream, 0, 0)
    }

    fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) {
        create_stream(stream, flags, 0)
    }

    fn hipStreamCreateWithPriority(stream: *mut hipStream_t, flags: c_uint, priority: c_int) {
        create_stream(stream, flags, priority)
    }

    /// Waits for the stream's queued work, then removes it.
    fn hipStreamDestroy(stream: hipStream_t) {
        let rt = runtime()?;
        let info = rt.remove_stream(stream)?;
        rt.device(info.device)?.executor.remove_stream(info.id);
        Ok(())
    }

    fn hipStreamSynchronize(stream: hipStream_t) {
        let (dev, info) = runtime()?.stream(stream)?;
        super::graph::refuse_wait(Some(dev.ordinal), Some(info.id), "hipStreamSynchronize")?;
        stats::bump(Counter::HostWaits);
        dev.executor.sync_stream(info.id)
    }

    fn hipStreamQuery(stream: hipStream_t) {
        let (dev, info) = runtime()?.stream(stream)?;
        super::graph::refuse_wait(Some(dev.ordinal), Some(info.id), "hipStreamQuery")?;
        ready(dev.executor.query_stream(info.id), "the stream")
    }

    fn hipStreamWaitEvent(stream: hipStream_t, event: hipEvent_t, flags: c_uint) {
        if flags != 0 {
            return Err(Fail::invalid(format!("hipStreamWaitEvent flags must be 0, got {flags}")));
        }
        let rt = runtime()?;
        let (dev, info) = rt.stream(stream)?;
        let ev = rt.event(event)?;
        if ev.device != dev.ordinal {
            return Err(Fail::invalid(format!(
                "hipStreamWaitEvent: the event belongs to device {} and the stream to device {}; \
                 cross-device waits are not emulated",
                ev.device, dev.ordinal
            )));
        }
        if super::graph::capture_wait(info.id, event)? {
            return Ok(());
        }
        dev.executor.wait_event(info.id, &ev.state)
    }

    fn hipStreamGetFlags(stream: hipStream_t, flags: *mut c_uint) {
        let (_, info) = runtime()?.stream(stream)?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(flags, info.flags, "flags") }
    }

    fn hipStreamGetPriority(stream: hipStream_t, priority: *mut c_int) {
        let (_, info) = runtime()?.stream(stream)?;
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(priority, info.priority, "priority") }
    }

    fn hipEventCreate(event: *mut hipEvent_t) {
        create_event(event, 0)
    }

    fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) {
        create_event(event, flags)
    }

    fn hipEventDestroy(event: hipEvent_t) {
        runtime()?.remove_event(event)
    }

    fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) {
        let rt = runtime()?;
        let ev = rt.event(event)?;
        let (dev, info) = rt.stream(stream)?;
        if ev.device != dev.ordinal {
            return Err(Fail::invalid(format!(
                "hipEventRecord: the event belongs to device {} and the stream to device {}",
                ev.device, dev.ordinal
            )));
        }
        if super::graph::capture_record(info.id, event, &ev.state)? {
            return Ok(());
        }
        dev.executor.record(info.id, &ev.state)
    }

    fn hipEventSynchronize(event: hipEvent_t) {
        let rt = runtime()?;
        let ev = rt.event(event)?;
        stats::bump(Counter::HostWaits);
        rt.device(ev.device)?.executor.sync_event(&ev.state)
    }

    fn hipEventQuery(event: hipEvent_t) {
        let rt = runtime()?;
        let ev = rt.event(event)?;
        ready(rt.device(ev.device)?.executor.query_event(&ev.state), "the event")
    }

    /// Milliseconds of host time between the moments the two records ran on the executor.
    fn hipEventElapsedTime(ms: *mut f32, start: hipEvent_t, stop: hipEvent_t) {
        let rt = runtime()?;
        let (a, b) = (rt.event(start)?, rt.event(stop)?);
        if !a.state.timing || !b.state.timing {
            return Err(Fail::handle("hipEventElapsedTime: an event was created with hipEventDisableTiming"));
        }
        let not_ready = |which: &str| Fail::new(hipError_t::hipErrorNotReady, format!("the {which} event has not completed (or was never recorded)"));
        let t0 = a.state.time().ok_or_else(|| not_ready("start"))?;
        let t1 = b.state.time().ok_or_else(|| not_ready("stop"))?;
        let elapsed = if t1 >= t0 {
            t1.duration_since(t0).as_secs_f64() * 1e3
        } else {
            -(t0.duration_since(t1).as_secs_f64() * 1e3)
        };
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(ms, elapsed as f32, "ms") }
    }
}
