//! DeviceBuffer logic on a fake device whose allocator hands out made-up addresses: nothing
//! here may call HIP (the device does not exist), which is itself part of what is tested.

use std::sync::{Arc, Mutex};

use super::*;
use crate::memory::alloc::DeviceAllocator;
use crate::memory::pinned::PinnedHostBuffer;

/// Records every call; hands out addresses from 1 MiB upwards; can be told to fail frees.
#[derive(Debug, Default)]
struct FakeAllocator {
    log: Mutex<Vec<String>>,
    fail_free: bool,
}

impl FakeAllocator {
    fn calls(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }
}

impl DeviceAllocator for FakeAllocator {
    fn allocate(&self, bytes: usize, stream: RawStream) -> Result<RawAllocation> {
        let mut log = self.log.lock().unwrap();
        log.push(format!("alloc {bytes} on {}", stream.0));
        Ok(RawAllocation {
            ptr: DevicePtr(1 << 20),
            bytes,
        })
    }

    unsafe fn deallocate(&self, allocation: RawAllocation, stream: RawStream) -> Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("free {} on {}", allocation.bytes, stream.0));
        if self.fail_free {
            Err(Error::OutOfBounds {
                start: 1,
                end: 2,
                len: 3,
            })
        } else {
            Ok(())
        }
    }

    fn record_stream(&self, allocation: &RawAllocation, stream: RawStream) -> Result<()> {
        self.log
            .lock()
            .unwrap()
            .push(format!("record {} on {}", allocation.bytes, stream.0));
        Ok(())
    }
}

fn fake(fail_free: bool) -> (Arc<FakeAllocator>, Device, Stream) {
    let alloc = Arc::new(FakeAllocator {
        fail_free,
        ..Default::default()
    });
    let device = Device::fake(0, alloc.clone());
    let stream = Stream::null(&device);
    (alloc, device, stream)
}

#[test]
fn zero_length_buffers_make_no_calls() {
    let (alloc, device, stream) = fake(false);
    let mut buf = DeviceBuffer::<f32>::alloc(&stream, 0).unwrap();
    assert!(buf.is_empty());
    assert!(buf.device_ptr().is_null());
    stream.copy_htod(&[], &mut buf).unwrap();
    assert_eq!(buf.to_vec(&stream).unwrap(), Vec::<f32>::new());
    stream.memset_zero(&mut buf).unwrap();
    let other = DeviceBuffer::<f32>::zeroed(&stream, 0).unwrap();
    stream.copy_dtod(&other, &mut buf).unwrap();
    let pinned = PinnedHostBuffer::<f32>::new(&device, 0).unwrap();
    assert_eq!(pinned.as_slice().unwrap(), &[] as &[f32]);
    stream.copy_htod_async(&pinned, &mut buf).unwrap();
    drop((buf, other, pinned));
    assert!(alloc.calls().is_empty(), "{:?}", alloc.calls());
    device.check_err().unwrap();
}

#[test]
fn views_are_bounds_checked_and_offset() {
    let (_alloc, _device, stream) = fake(false);
    let mut buf = DeviceBuffer::<f32>::alloc(&stream, 10).unwrap();
    let base = buf.device_ptr();
    assert_eq!(base, DevicePtr(1 << 20));
    let view = buf.slice(2..5).unwrap();
    assert_eq!((view.device_ptr(), view.len()), (base.byte_add(8), 3));
    assert_eq!(view.slice(1..).unwrap().device_ptr(), base.byte_add(12));
    assert!(view.slice(..4).is_err());
    assert!(matches!(
        buf.slice(..11),
        Err(Error::OutOfBounds {
            start: 0,
            end: 11,
            len: 10
        })
    ));
    let (mut left, right) = buf.split_at_mut(4).unwrap();
    assert_eq!(
        (left.len(), right.len(), right.device_ptr()),
        (4, 6, base.byte_add(16))
    );
    assert_eq!(left.slice_mut(3..).unwrap().device_ptr(), base.byte_add(12));
    assert!(buf.split_at_mut(11).is_err());
    assert!(buf.slice_mut(..=10).is_err());
}

#[test]
fn mismatched_lengths_fail_before_any_hip_call() {
    let (alloc, _device, stream) = fake(false);
    let mut buf = DeviceBuffer::<u32>::alloc(&stream, 4).unwrap();
    let e = stream.copy_htod(&[1, 2, 3], &mut buf).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "copy_htod",
                dst: 4,
                src: 3
            }
        ),
        "{e}"
    );
    let mut out = [0u32; 5];
    assert!(matches!(
        stream.copy_dtoh(&buf, &mut out),
        Err(Error::LengthMismatch { dst: 5, src: 4, .. })
    ));
    let small = DeviceBuffer::<u32>::alloc(&stream, 2).unwrap();
    let e = stream.copy_dtod(&small, &mut buf).unwrap_err().to_string();
    assert!(
        e.contains("destination holds 4") && e.contains("source holds 2"),
        "{e}"
    );
    assert_eq!(alloc.calls(), vec!["alloc 16 on 0", "alloc 8 on 0"]);
}

#[test]
fn buffers_of_another_device_are_rejected() {
    let (_alloc, _device0, stream0) = fake(false);
    let (_alloc1, _device1, stream1) = {
        let alloc = Arc::new(FakeAllocator::default());
        let device = Device::fake(1, alloc.clone());
        let stream = Stream::null(&device);
        (alloc, device, stream)
    };
    let mut buf = DeviceBuffer::<f32>::alloc(&stream0, 2).unwrap();
    let e = stream1.copy_htod(&[1.0, 2.0], &mut buf).unwrap_err();
    assert!(
        matches!(
            e,
            Error::WrongDevice {
                expected: 1,
                found: 0,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn drop_returns_memory_on_its_stream_and_records_errors() {
    let (alloc, device, stream) = fake(true);
    drop(DeviceBuffer::<half::f16>::alloc(&stream, 3).unwrap());
    assert_eq!(alloc.calls(), vec!["alloc 6 on 0", "free 6 on 0"]);
    let e = device.check_err().unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { start: 1, .. }), "{e}");
    device.check_err().unwrap(); // cleared
    for _ in 0..70 {
        drop(DeviceBuffer::<u8>::alloc(&stream, 1).unwrap());
    }
    let (errors, dropped) = device.take_drop_errors();
    assert_eq!((errors.len(), dropped), (64, 6));
}

#[test]
fn record_stream_reaches_the_allocator_only_for_other_streams() {
    let (alloc, device, stream) = fake(false);
    let buf = DeviceBuffer::<f32>::alloc(&stream, 2).unwrap();
    buf.record_stream(&stream).unwrap();
    // A stream value with a made-up handle, never destroyed (forgotten below).
    let other = Stream::from_raw_for_tests(&device, 0x40 as _);
    buf.record_stream(&other).unwrap();
    std::mem::forget(other);
    assert_eq!(alloc.calls(), vec!["alloc 8 on 0", "record 8 on 64"]);
}

#[test]
fn kernel_args_pass_buffer_addresses() {
    let (_alloc, _device, stream) = fake(false);
    let buf = DeviceBuffer::<f32>::alloc(&stream, 8).unwrap();
    let view = buf.slice(4..).unwrap();
    let mut args = crate::KernelArgs::new();
    args.arg(&buf).arg(&view).value(8i32);
    let raw = args.as_param_array();
    // SAFETY: the first two entries point at the DevicePtr fields of `buf` and `view`.
    unsafe {
        assert_eq!(*(*raw).cast::<u64>(), 1 << 20);
        assert_eq!(*(*raw.add(1)).cast::<u64>(), (1 << 20) + 16);
    }
}

#[test]
fn views_split_and_chunk_like_slices_with_typed_errors() {
    let (alloc, _device, stream) = fake(false);
    let mut buf = DeviceBuffer::<f32>::alloc(&stream, 10).unwrap();
    let base = buf.device_ptr();
    {
        let mut view = buf.slice_mut(1..).unwrap(); // 9 elements at base + 4
        let (mut a, b) = view.split_at_mut(4).unwrap();
        assert_eq!((a.device_ptr(), a.len()), (base.byte_add(4), 4));
        assert_eq!((b.device_ptr(), b.len()), (base.byte_add(20), 5));
        // A split view splits again; the ends are legal mids.
        let (l, r) = a.split_at_mut(0).unwrap();
        assert_eq!((l.len(), r.len(), r.device_ptr()), (0, 4, base.byte_add(4)));
        let (l, r) = view.split_at_mut(9).unwrap();
        assert_eq!((l.len(), r.len()), (9, 0));
        let e = view.split_at_mut(10).err().expect("mid 10 > len 9");
        assert!(
            matches!(
                e,
                Error::OutOfBounds {
                    start: 0,
                    end: 10,
                    len: 9
                }
            ),
            "{e}"
        );
        let got: Vec<(DevicePtr, usize)> = view
            .chunks_mut(4)
            .unwrap()
            .map(|c| (c.device_ptr(), c.len()))
            .collect();
        assert_eq!(
            got,
            vec![
                (base.byte_add(4), 4),
                (base.byte_add(20), 4),
                (base.byte_add(36), 1)
            ]
        );
        assert_eq!(view.chunks_mut(3).unwrap().len(), 3);
        let e = view.chunks_mut(0).err().expect("chunk 0 is an error");
        assert!(matches!(e, Error::ZeroChunk), "{e}");
        assert!(e.to_string().contains("chunk size 0"), "{e}");
    }
    // The buffer's own chunks: every element once, in order; an empty buffer has none.
    let lens: Vec<usize> = buf.chunks_mut(5).unwrap().map(|c| c.len()).collect();
    assert_eq!(lens, vec![5, 5]);
    let mut empty = DeviceBuffer::<f32>::alloc(&stream, 0).unwrap();
    assert_eq!(empty.chunks_mut(3).unwrap().count(), 0);
    assert!(matches!(empty.chunks_mut(0), Err(Error::ZeroChunk)));
    // No HIP or allocator call beyond the two allocations.
    assert_eq!(alloc.calls(), vec!["alloc 40 on 0"]);
}
