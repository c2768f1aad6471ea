//! hip-emu's profiler counters (`hip_rt::emu::stats`) and its `HIPK_EMU_STATS=1` exit print:
//! `cargo test -p hip-rt --features device --test device_emu_stats` with hip-emu as the runtime.
//!
//! On a real HIP runtime `emu::stats` is `None` (asserted), and nothing else here runs.
#![cfg(feature = "device")]

mod common;

use hip_rt::emu::{self, EmuStats, StatsScope};
use hip_rt::{Device, DeviceBuffer, LaunchConfig, Module, Stream, StreamOptions};

/// Set in the child process that `exit_print_lists_every_key` starts.
const CHILD_VAR: &str = "HIPK_TEST_EMU_STATS_CHILD";

fn device() -> Device {
    // Direct allocation: every buffer is one hipMalloc and one hipFree, so the figures below are
    // exact (a caching allocator would reuse blocks across the tests of this binary).
    Device::get_direct(0).unwrap_or_else(|e| panic!("the `device` tests need a HIP device: {e}"))
}

/// One buffer of `n` floats: allocate, copy in, one kernel, copy out, free.
fn one_round_trip(d: &Device, n: usize) {
    let s = Stream::new(d, StreamOptions::default()).unwrap();
    let bytes = common::build_bundle(&[d.arch()]).unwrap();
    let m = Module::load(d, &bytes).unwrap();
    let add = m.function("hipk_test_add").unwrap();
    let cfg = LaunchConfig::for_num_elems(n as u64, add.limits()).unwrap();
    let mut x = DeviceBuffer::<f32>::alloc(&s, n).unwrap();
    s.copy_htod(&vec![1.0f32; n], &mut x).unwrap();
    // SAFETY: hipk_test_add(float*, float, int) gets a buffer of n floats, a float and n.
    unsafe {
        s.launch_builder(&add)
            .arg_mut(&mut x)
            .value(2.0f32)
            .value(n as i32)
            .launch(&cfg)
    }
    .unwrap();
    assert_eq!(x.to_vec(&s).unwrap(), vec![3.0f32; n]);
}

#[test]
fn counters_match_a_known_sequence_of_calls() {
    let d = device();
    let Some(before) = emu::stats(StatsScope::Thread) else {
        assert!(
            !d.is_emulated(),
            "hip-emu is the runtime but exports no hipemuGetStats"
        );
        return;
    };
    one_round_trip(&d, 1000);
    let after = emu::stats(StatsScope::Thread).unwrap();
    let delta = after.since(&before);
    assert_eq!(
        delta,
        EmuStats {
            launches: 1,
            // copy_htod and to_vec each wait for the stream once.
            host_waits: 2,
            mallocs: 1,
            frees: 1,
            bytes_htod: 4000,
            bytes_dtoh: 4000,
            bytes_dtod: 0,
            memsets: 0,
            graph_launches: 0,
            graph_nodes: 0,
        }
    );
    // The process figures include this thread's.
    let process = emu::stats(StatsScope::Process).unwrap();
    assert!(process.launches >= after.launches && process.mallocs >= after.mallocs);
}

#[test]
fn exit_print_lists_every_key() {
    if std::env::var_os(CHILD_VAR).is_some() {
        // The child: some work, then exit normally (the print runs at exit).
        one_round_trip(&device(), 64);
        return;
    }
    if !device().is_emulated() {
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "exit_print_lists_every_key",
            "--test-threads",
            "1",
        ])
        .env(CHILD_VAR, "1")
        .env("HIPK_EMU_STATS", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed: {stderr}");
    let value = |key: &str| -> u64 {
        let prefix = format!("hip-emu stats: {key}=");
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in the child's stderr:\n{stderr}"));
        line[prefix.len()..].trim().parse().unwrap()
    };
    // The child process did exactly one round trip (and nothing else on the device).
    assert_eq!(value("launches"), 1, "{stderr}");
    assert_eq!(value("host_waits"), 2, "{stderr}");
    assert_eq!(value("mallocs"), 1, "{stderr}");
    assert_eq!(value("frees"), 1, "{stderr}");
    assert_eq!(value("bytes_htod"), 256, "{stderr}");
    assert_eq!(value("bytes_dtoh"), 256, "{stderr}");
}
