//! On a machine with a HIP runtime but no device (Debian's ROCm 5.2 libamdhip64 here), every
//! constructor returns the NoDevice error, whose text says what to check. Skipped, saying why,
//! when no runtime is installed, or when a device exists (run the `device` tests there).

use std::sync::Arc;

use hip_rt::{Device, DirectAllocator, Error};

/// `true` when this machine has a runtime and no device: the situation these tests are about.
fn no_device_machine() -> bool {
    if let Err(e) = hip_sys::hip() {
        eprintln!("skipped: no HIP runtime installed ({e})");
        return false;
    }
    match Device::count() {
        Ok(n) => {
            eprintln!(
                "skipped: {n} HIP device(s) present; these tests are for machines without one"
            );
            false
        }
        Err(_) => true,
    }
}

fn assert_no_device<T: std::fmt::Debug>(what: &str, result: Result<T, Error>) {
    let e = result.expect_err(what);
    assert!(
        e.is_no_device(),
        "{what}: expected hipErrorNoDevice, got {e}"
    );
    let msg = e.to_string();
    for needle in ["100", "hipErrorNoDevice", "/dev/kfd", "HIP_VISIBLE_DEVICES"] {
        assert!(
            msg.contains(needle),
            "{what}: message lacks {needle:?}: {msg}"
        );
    }
}

#[test]
fn every_device_constructor_reports_no_device() {
    if !no_device_machine() {
        return;
    }
    assert_no_device("Device::count", Device::count());
    assert_no_device("Device::get(0)", Device::get(0));
    assert_no_device("Device::get(3)", Device::get(3));
    assert_no_device(
        "Device::with_allocator",
        Device::with_allocator(0, Arc::new(DirectAllocator::new(0))),
    );
}

#[test]
fn result_layer_reports_no_device_without_crashing() {
    if !no_device_machine() {
        return;
    }
    use hip_rt::result;
    assert_no_device(
        "result::device::count",
        result::device::count().map_err(hip_rt::Error::from),
    );
    // Calls that need a device fail cleanly instead of crashing; their exact code is the
    // runtime's choice, so only "an error" is asserted.
    assert!(result::device::set(0).is_err());
    assert!(result::device::synchronize().is_err());
    assert!(result::memory::malloc(256).is_err());
    assert!(result::stream::create(0, 0).is_err());
    assert!(result::event::create(0).is_err());
}

#[test]
fn the_no_device_error_is_not_out_of_memory() {
    if !no_device_machine() {
        return;
    }
    let e = Device::count().unwrap_err();
    assert!(!e.is_out_of_memory());
    assert_eq!(e.hip_code(), Some(hip_sys::hipError_t::hipErrorNoDevice));
}
