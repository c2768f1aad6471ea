//! Allocation, copies and memsets. Every device range is checked against the live allocations
//! when the call is made (a freed or out-of-range pointer is hipErrorInvalidValue naming it);
//! asynchronous work is queued on its stream and runs on the device's executor thread.

use std::ffi::{c_int, c_uchar, c_uint, c_ushort, c_void};

use hip_sys::{hipDeviceptr_t, hipError_t, hipMemcpyKind, hipStream_t};

use std::sync::Arc;

use super::device::Device;
use super::error::{Fail, Res};
use super::graph::{self, Kind, Node};
use super::memory::{self, Owner};
use super::stats::{self, Counter};
use super::{hip_exports, out, runtime};

/// Where a copy's operand lives.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Side {
    Host,
    Device,
}

/// Check one operand of a copy of `bytes`: device ranges must lie in a live allocation; host
/// pointers must be non-null.
fn check_side(ptr: usize, bytes: usize, side: Side, what: &str) -> Res {
    if bytes == 0 {
        return Ok(());
    }
    match side {
        Side::Device => memory::check_range(ptr, bytes, what).map(|_| ()),
        Side::Host if ptr == 0 => Err(Fail::invalid(format!("{what} is a null pointer"))),
        Side::Host => Ok(()),
    }
}

/// The sides of `hipMemcpyKind`; `hipMemcpyDefault` infers them from the pointers.
pub(super) fn sides(kind: hipMemcpyKind, dst: usize, src: usize) -> Res<(Side, Side)> {
    let infer = |p: usize| {
        if memory::is_live(p) {
            Side::Device
        } else {
            Side::Host
        }
    };
    Ok(match kind {
        hipMemcpyKind::hipMemcpyHostToHost => (Side::Host, Side::Host),
        hipMemcpyKind::hipMemcpyHostToDevice => (Side::Device, Side::Host),
        hipMemcpyKind::hipMemcpyDeviceToHost => (Side::Host, Side::Device),
        hipMemcpyKind::hipMemcpyDeviceToDevice => (Side::Device, Side::Device),
        hipMemcpyKind::hipMemcpyDefault => (infer(dst), infer(src)),
        other => {
            return Err(Fail::new(
                hipError_t::hipErrorInvalidMemcpyDirection,
                format!("hipMemcpyKind {} is not a copy direction", other.0),
            ))
        }
    })
}

/// Queue (and, if `sync`, wait for) a copy of `bytes` from `src` to `dst`.
pub(super) fn copy(
    name: &str,
    dst: usize,
    src: usize,
    bytes: usize,
    (dst_side, src_side): (Side, Side),
    stream: hipStream_t,
    sync: bool,
) -> Res {
    check_side(dst, bytes, dst_side, &format!("{name} destination"))?;
    check_side(src, bytes, src_side, &format!("{name} source"))?;
    let direction = match (dst_side, src_side) {
        (Side::Device, Side::Host) => Some(Counter::BytesHtoD),
        (Side::Host, Side::Device) => Some(Counter::BytesDtoH),
        (Side::Device, Side::Device) => Some(Counter::BytesDtoD),
        (Side::Host, Side::Host) => None,
    };
    let name_owned = name.to_owned();
    let check_name = name.to_owned();
    let check = move || {
        check_side(dst, bytes, dst_side, &format!("{check_name} destination"))?;
        check_side(src, bytes, src_side, &format!("{check_name} source"))
    };
    let work = move || {
        memory::check_unpoisoned(dst, bytes, &format!("{name_owned} destination"))?;
        memory::check_unpoisoned(src, bytes, &format!("{name_owned} source"))?;
        if bytes > 0 {
            // SAFETY: device ranges were checked to lie in live allocations (which hipFree
            // cannot unmap while work is queued: it waits for the device first); host ranges
            // are valid until completion per the C API contract. `copy` handles overlap.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        }
        Ok(())
    };
    let mut node = Node::run(name, Kind::Copy, Arc::new(work)).checked(Arc::new(check));
    if let Some(counter) = direction {
        node = node.counting(counter, bytes as u64);
    }
    if !submit(name, stream, sync, node)? {
        if let Some(counter) = direction {
            stats::add(counter, bytes as u64);
        }
    }
    Ok(())
}

/// Queue `node` on `stream` (or add it to the stream's capture: `Ok(true)`); with `sync`, wait
/// for it (and report a fault of that stream), which a capturing stream refuses.
fn submit(name: &str, stream: hipStream_t, sync: bool, node: Node) -> Res<bool> {
    let (dev, info) = runtime()?.stream(stream)?;
    if sync {
        graph::refuse_wait(Some(dev.ordinal), Some(info.id), name)?;
    }
    let captured = graph::submit(dev.ordinal, info.id, node)?;
    if sync {
        stats::bump(Counter::HostWaits);
        dev.executor.sync_stream(info.id)?;
    }
    Ok(captured)
}

/// Queue a memset of `count` elements of `width` bytes, each `value`'s low bytes.
fn memset(
    name: &str,
    dst: usize,
    value: u32,
    width: usize,
    count: usize,
    stream: hipStream_t,
    sync: bool,
) -> Res {
    let bytes = count.checked_mul(width).ok_or_else(|| {
        Fail::invalid(format!(
            "{name}: {count} elements of {width} bytes overflow"
        ))
    })?;
    check_side(dst, bytes, Side::Device, &format!("{name} destination"))?;
    let what = format!("{name} destination");
    let check_what = what.clone();
    let check = move || check_side(dst, bytes, Side::Device, &check_what);
    let work = move || {
        memory::check_unpoisoned(dst, bytes, &what)?;
        if width == 1 {
            // SAFETY: as below; byte fills need no alignment.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value as u8, count) };
            return Ok(());
        }
        for i in 0..count {
            let at = (dst + i * width) as *mut u8;
            // SAFETY: [dst, dst + bytes) was checked to lie in a live allocation, which stays
            // mapped while work is queued; the writes are unaligned-safe.
            unsafe {
                match width {
                    1 => at.write(value as u8),
                    2 => at.cast::<u16>().write_unaligned(value as u16),
                    _ => at.cast::<u32>().write_unaligned(value),
                }
            }
        }
        Ok(())
    };
    let node = Node::run(name, Kind::Memset, Arc::new(work))
        .checked(Arc::new(check))
        .counting(Counter::Memsets, 1);
    if !submit(name, stream, sync, node)? {
        stats::bump(Counter::Memsets);
    }
    Ok(())
}

/// Allocate on `dev` (charged against its capacity) and return the pointer.
fn device_malloc(dev: &Device, size: usize) -> Res<usize> {
    dev.charge(
        size.next_multiple_of(memory::ALIGN),
        &format!("hipMalloc({size})"),
    )?;
    match memory::allocate(size, Owner::Device(dev.ordinal)) {
        Ok(a) => Ok(a.start),
        Err(e) => {
            dev.release(size.next_multiple_of(memory::ALIGN));
            Err(e)
        }
    }
}

/// Check that `[ptr, ptr + bytes)` is memory of device `device` (a peer copy's operand).
fn check_on_device(ptr: usize, bytes: usize, device: i32, what: &str) -> Res {
    runtime()?.device(device)?;
    if bytes == 0 {
        return Ok(());
    }
    let a = memory::check_range(ptr, bytes, what)?;
    match a.owner {
        Owner::Device(d) if d == device => Ok(()),
        _ => Err(Fail::invalid(format!(
            "{what}: {ptr:#x} is in {}, not on device {device}",
            a.describe()
        ))),
    }
}

/// A copy between devices: both ranges checked against their devices; peer access need not be
/// enabled (HIP stages such copies itself).
#[allow(clippy::too_many_arguments)]
fn copy_peer(
    name: &str,
    dst: usize,
    dst_device: i32,
    src: usize,
    src_device: i32,
    bytes: usize,
    stream: hipStream_t,
    sync: bool,
) -> Res {
    check_on_device(dst, bytes, dst_device, &format!("{name} destination"))?;
    check_on_device(src, bytes, src_device, &format!("{name} source"))?;
    copy(
        name,
        dst,
        src,
        bytes,
        (Side::Device, Side::Device),
        stream,
        sync,
    )
}

hip_exports! {
    /// Queued on the current device's null stream and waited for, like hipMemcpy.
    fn hipMemcpyPeer(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, bytes: usize) {
        copy_peer("hipMemcpyPeer", dst as usize, dst_device, src as usize, src_device, bytes, std::ptr::null_mut(), true)
    }

    fn hipMemcpyPeerAsync(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, bytes: usize, stream: hipStream_t) {
        copy_peer("hipMemcpyPeerAsync", dst as usize, dst_device, src as usize, src_device, bytes, stream, false)
    }

    /// hip-emu only: marks `[ptr, ptr + bytes)`, inside one device allocation, as belonging to
    /// no live block (`live` 0) or to a live block again (`live` 1), at once. Sub-allocators
    /// (hip-rt's caching allocator) call it so that an access outside every live block faults as
    /// it would past a `hipMalloc` allocation (see [`memory`]).
    fn hipemuPoison(ptr: *mut c_void, bytes: usize, live: c_int) {
        runtime()?;
        memory::set_poison(ptr as usize, bytes, live != 0)
    }

    /// hip-emu only: `hipemuPoison` queued on `stream` (a block freed or handed out in stream
    /// order: work queued before it still sees the old state).
    fn hipemuPoisonAsync(ptr: *mut c_void, bytes: usize, live: c_int, stream: hipStream_t) {
        let (p, live) = (ptr as usize, live != 0);
        let (_, info) = runtime()?.stream(stream)?;
        if graph::is_capturing(info.id) {
            // A checker annotation, not device work: a capturing stream runs nothing until its
            // graph is launched, and a block handed out during a capture is live from now on.
            return memory::set_poison(p, bytes, live);
        }
        let work = move || memory::set_poison(p, bytes, live);
        submit("hipemuPoisonAsync", stream, false, Node::run("hipemuPoisonAsync", Kind::Memset, Arc::new(work))).map(|_| ())
    }

    /// Device memory: a guarded host mapping filled with NaN bytes (see [`memory`]).
    fn hipMalloc(ptr: *mut *mut c_void, size: usize) {
        let rt = runtime()?;
        let p = if size == 0 { 0 } else { device_malloc(rt.current()?, size)? };
        if p != 0 {
            stats::bump(Counter::Mallocs);
        }
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(ptr, p as *mut c_void, "ptr") }
    }

    /// Waits for the work of every device (as hipFree does), then quarantines the mapping.
    fn hipFree(ptr: *mut c_void) {
        let rt = runtime()?;
        if ptr.is_null() {
            return Ok(());
        }
        graph::refuse_wait(None, None, "hipFree")?;
        for dev in &rt.devices {
            dev.executor.wait_idle();
        }
        let alloc = memory::free(ptr as usize, false).map_err(|f| Fail::invalid(format!("hipFree: {}", f.message)))?;
        if let Owner::Device(d) = alloc.owner {
            stats::bump(Counter::Frees);
            rt.device(d)?.release(alloc.rounded);
        }
        Ok(())
    }

    /// Pinned host memory: an ordinary guarded mapping, not charged to any device.
    fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) {
        runtime()?;
        if flags & !(0xF | 0xC000_0000) != 0 {
            return Err(Fail::invalid(format!("hipHostMalloc: unknown flags {flags:#x}")));
        }
        let p = if size == 0 { 0 } else { memory::allocate(size, Owner::PinnedHost)?.start };
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(ptr, p as *mut c_void, "ptr") }
    }

    fn hipHostFree(ptr: *mut c_void) {
        let rt = runtime()?;
        if ptr.is_null() {
            return Ok(());
        }
        for dev in &rt.devices {
            dev.executor.wait_idle();
        }
        memory::free(ptr as usize, true).map_err(|f| Fail::invalid(format!("hipHostFree: {}", f.message)))?;
        Ok(())
    }

    fn hipMemGetInfo(free: *mut usize, total: *mut usize) {
        let (f, t) = runtime()?.current()?.mem_info();
        // SAFETY: out-parameters per the C API contract.
        unsafe {
            out(free, f, "free")?;
            out(total, t, "total")
        }
    }

    fn hipMemcpy(dst: *mut c_void, src: *const c_void, bytes: usize, kind: hipMemcpyKind) {
        let s = sides(kind, dst as usize, src as usize)?;
        copy("hipMemcpy", dst as usize, src as usize, bytes, s, std::ptr::null_mut(), true)
    }

    fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, bytes: usize, kind: hipMemcpyKind, stream: hipStream_t) {
        let s = sides(kind, dst as usize, src as usize)?;
        copy("hipMemcpyAsync", dst as usize, src as usize, bytes, s, stream, false)
    }

    fn hipMemcpyHtoD(dst: hipDeviceptr_t, src: *mut c_void, bytes: usize) {
        copy("hipMemcpyHtoD", dst as usize, src as usize, bytes, (Side::Device, Side::Host), std::ptr::null_mut(), true)
    }

    fn hipMemcpyDtoH(dst: *mut c_void, src: hipDeviceptr_t, bytes: usize) {
        copy("hipMemcpyDtoH", dst as usize, src as usize, bytes, (Side::Host, Side::Device), std::ptr::null_mut(), true)
    }

    fn hipMemcpyDtoD(dst: hipDeviceptr_t, src: hipDeviceptr_t, bytes: usize) {
        copy("hipMemcpyDtoD", dst as usize, src as usize, bytes, (Side::Device, Side::Device), std::ptr::null_mut(), true)
    }

    fn hipMemcpyHtoDAsync(dst: hipDeviceptr_t, src: *mut c_void, bytes: usize, stream: hipStream_t) {
        copy("hipMemcpyHtoDAsync", dst as usize, src as usize, bytes, (Side::Device, Side::Host), stream, false)
    }

    fn hipMemcpyDtoHAsync(dst: *mut c_void, src: hipDeviceptr_t, bytes: usize, stream: hipStream_t) {
        copy("hipMemcpyDtoHAsync", dst as usize, src as usize, bytes, (Side::Host, Side::Device), stream, false)
    }

    fn hipMemcpyDtoDAsync(dst: hipDeviceptr_t, src: hipDeviceptr_t, bytes: usize, stream: hipStream_t) {
        copy("hipMemcpyDtoDAsync", dst as usize, src as usize, bytes, (Side::Device, Side::Device), stream, false)
    }

    fn hipMemset(dst: *mut c_void, value: c_int, bytes: usize) {
        memset("hipMemset", dst as usize, value as u32, 1, bytes, std::ptr::null_mut(), true)
    }

    fn hipMemsetAsync(dst: *mut c_void, value: c_int, bytes: usize, stream: hipStream_t) {
        memset("hipMemsetAsync", dst as usize, value as u32, 1, bytes, stream, false)
    }

    fn hipMemsetD8(dst: hipDeviceptr_t, value: c_uchar, count: usize) {
        memset("hipMemsetD8", dst as usize, value.into(), 1, count, std::ptr::null_mut(), true)
    }

    fn hipMemsetD8Async(dst: hipDeviceptr_t, value: c_uchar, count: usize, stream: hipStream_t) {
        memset("hipMemsetD8Async", dst as usize, value.into(), 1, count, stream, false)
    }

    fn hipMemsetD16(dst: hipDeviceptr_t, value: c_ushort, count: usize) {
        memset("hipMemsetD16", dst as usize, value.into(), 2, count, std::ptr::null_mut(), true)
    }

    fn hipMemsetD16Async(dst: hipDeviceptr_t, value: c_ushort, count: usize, stream: hipStream_t) {
        memset("hipMemsetD16Async", dst as usize, value.into(), 2, count, stream, false)
    }

    fn hipMemsetD32(dst: hipDeviceptr_t, value: c_int, count: usize) {
        memset("hipMemsetD32", dst as usize, value as u32, 4, count, std::ptr::null_mut(), true)
    }

    fn hipMemsetD32Async(dst: hipDeviceptr_t, value: c_int, count: usize, stream: hipStream_t) {
        memset("hipMemsetD32Async", dst as usize, value as u32, 4, count, stream, false)
    }
}
