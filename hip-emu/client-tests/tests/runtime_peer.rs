//! Several emulated devices through hip-rt: peer queries, enabling and disabling peer access,
//! copies between devices (hip-rt's `Stream::copy_peer` and the synchronous `hipMemcpyPeer`),
//! each device's own streams and memory. Everything here ran on the CPU emulation.

#[path = "../../tests/common/mod.rs"]
mod common;

use hip_rt::{DeviceBuffer, Stream, StreamOptions};
use hip_sys::hipError_t;

fn devices() -> Vec<hip_rt::Device> {
    common::setup(&[("HIPK_EMU_DEVICES", "3")]);
    (0..3)
        .map(|d| hip_rt::Device::get(d).expect("hip-emu device"))
        .collect()
}

#[test]
fn peer_queries_and_access_follow_hip() {
    let devs = devices();
    assert_eq!(hip_rt::Device::count().unwrap(), 3);
    assert!(devs[0].can_access_peer(&devs[1]).unwrap());
    assert!(devs[2].can_access_peer(&devs[0]).unwrap());
    assert!(
        !devs[1].can_access_peer(&devs[1]).unwrap(),
        "not its own peer"
    );
    // Each device has its own memory accounting and bus id.
    assert_eq!(devs[2].pci_bus_id().unwrap(), "0000:e2:00.0");
    devs[1].enable_peer_access(&devs[2]).unwrap();
    devs[1].enable_peer_access(&devs[2]).unwrap(); // idempotent in hip-rt
    devs[1].disable_peer_access(&devs[2]).unwrap();
    let err = devs[1].disable_peer_access(&devs[2]).unwrap_err();
    assert_eq!(
        err.hip_code(),
        Some(hipError_t::hipErrorPeerAccessNotEnabled),
        "{err}"
    );
    let err = devs[0].enable_peer_access(&devs[0]).unwrap_err();
    assert_eq!(
        err.hip_code(),
        Some(hipError_t::hipErrorInvalidDevice),
        "{err}"
    );
}

#[test]
fn copies_between_devices() {
    let devs = devices();
    let s0 = Stream::new(&devs[0], StreamOptions::default()).unwrap();
    let s1 = Stream::new(&devs[1], StreamOptions::default()).unwrap();
    let s2 = Stream::new(&devs[2], StreamOptions::default()).unwrap();
    let data: Vec<f32> = (0..1000).map(|i| i as f32 * 0.25).collect();
    let a = DeviceBuffer::from_slice(&s0, &data).unwrap();
    let mut b = DeviceBuffer::<f32>::zeroed(&s1, 1000).unwrap();
    // The zeroing is queued on device 1's stream: a copy on another device's stream is not
    // ordered after it (as on real devices), so wait for it.
    s1.synchronize().unwrap();
    // On the source's stream and on the destination's: both work without peer access.
    s0.copy_peer(&a, &mut b).unwrap();
    assert_eq!(b.to_vec(&s1).unwrap(), data);
    let mut c = DeviceBuffer::<f32>::zeroed(&s0, 1000).unwrap();
    s0.synchronize().unwrap();
    s1.copy_peer(&b.slice(..500).unwrap(), &mut c.slice_mut(500..).unwrap())
        .unwrap();
    let got = c.to_vec(&s0).unwrap();
    assert!(got[..500].iter().all(|&x| x == 0.0));
    assert_eq!(&got[500..], &data[..500]);
    // A stream of a third device is refused before anything is queued.
    let err = s2.copy_peer(&a, &mut b).unwrap_err();
    assert!(matches!(err, hip_rt::Error::WrongDevice { .. }), "{err}");
    let err = s0.copy_peer(&a.slice(..10).unwrap(), &mut b).unwrap_err();
    assert!(matches!(err, hip_rt::Error::LengthMismatch { .. }), "{err}");
}

#[test]
fn memcpy_peer_checks_which_device_owns_each_side() {
    let devs = devices();
    let s0 = Stream::new(&devs[0], StreamOptions::default()).unwrap();
    let s2 = Stream::new(&devs[2], StreamOptions::default()).unwrap();
    let a = DeviceBuffer::from_slice(&s0, &[7u32; 64]).unwrap();
    let b = DeviceBuffer::<u32>::zeroed(&s2, 64).unwrap();
    let f = hip_sys::sym!(hipMemcpyPeer).unwrap();
    // SAFETY: 256 bytes of live device memory on each side.
    let ok = unsafe { f(b.device_ptr().as_raw(), 2, a.device_ptr().as_raw(), 0, 256) };
    assert_eq!(ok, hipError_t::hipSuccess);
    assert_eq!(b.to_vec(&s2).unwrap(), vec![7u32; 64]);
    // The source named as device 1's memory: refused, naming the allocation's real device.
    // SAFETY: rejected before any memory is touched.
    let bad = unsafe { f(b.device_ptr().as_raw(), 2, a.device_ptr().as_raw(), 1, 256) };
    assert_eq!(bad, hipError_t::hipErrorInvalidValue);
    let msg = common::last_message();
    assert!(
        msg.contains("hipMemcpyPeer source")
            && msg.contains("device 0")
            && msg.contains("not on device 1"),
        "{msg}"
    );
}
