//! Shared by the device benches: the quick mode and the label of figures from an emulated device.
//!
//! `HIPK_BENCH_QUICK=1` (CI sets it, on hip-emu) runs each bench once on small shapes with
//! criterion's shortest settings: it proves the bench's device paths run, it measures nothing.
//! On an emulated device ([`hip_rt::Device::is_emulated`], hip-emu) every figure printed carries
//! [`hip_rt::EMULATED_FIGURE_LABEL`], and so does every criterion group name.
#![allow(dead_code)] // each bench uses a different part

use criterion::Criterion;
use hip_rt::Device;
use std::time::Duration;

/// Whether `HIPK_BENCH_QUICK=1`.
pub fn quick() -> bool {
    std::env::var("HIPK_BENCH_QUICK").is_ok_and(|v| v == "1")
}

/// criterion's configuration: the default, or in quick mode 10 samples in about a second.
pub fn config() -> Criterion {
    let c = Criterion::default();
    if quick() {
        c.sample_size(10)
            .warm_up_time(Duration::from_millis(100))
            .measurement_time(Duration::from_millis(500))
            .without_plots()
    } else {
        c
    }
}

/// `""` on a GPU; `" [emulated — not a performance figure]"` on an emulated device.
pub fn label(device: &Device) -> String {
    if device.is_emulated() {
        format!(" [{}]", hip_rt::EMULATED_FIGURE_LABEL)
    } else {
        String::new()
    }
}

/// Prints the device line, and on an emulated device a warning that no figure below is a
/// device figure. Returns [`label`].
pub fn announce(device: &Device) -> String {
    let label = label(device);
    if device.is_emulated() {
        println!(
            "device 0 is {} — every figure below is {}",
            device.name(),
            hip_rt::EMULATED_FIGURE_LABEL
        );
    }
    if quick() {
        println!("HIPK_BENCH_QUICK=1: small shapes, shortest criterion settings (a smoke run)");
    }
    label
}
