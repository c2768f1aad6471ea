//! Load a code object and launch a kernel.
//!
//! `cargo run -p hip-rt --example 03_launch [file.hsaco]`: without a file, the example builds a
//! small kernel with hipcc for the device's arch. Exits 2 with a diagnosis when there is no
//! device.

mod common;
#[path = "../tests/common/mod.rs"]
mod kernels;

use common::check;
use hip_rt::{DeviceBuffer, LaunchConfig, Module, Stream, StreamOptions};

fn main() {
    let device = common::device_or_exit();
    let image = match std::env::args_os().nth(1) {
        Some(path) => check("reading the code object", std::fs::read(&path)),
        None => check(
            "building the test kernel with hipcc",
            kernels::build_bundle(&[device.arch()]),
        ),
    };
    let module = check("loading the module", Module::load(&device, &image));
    println!(
        "module for {:?}, kernels {:?}",
        module.target_ids(),
        module.kernel_names()
    );
    let add = check("finding the kernel", module.function("hipk_test_add"));
    let stream = check(
        "creating a stream",
        Stream::new(&device, StreamOptions::default()),
    );

    let n = 1 << 20;
    let mut x = check(
        "uploading",
        DeviceBuffer::from_slice(&stream, &vec![1.0f32; n]),
    );
    let cfg = check(
        "planning the launch",
        LaunchConfig::for_num_elems(n as u64, add.limits()),
    );
    println!("launching {} blocks of {} threads", cfg.grid.0, cfg.block.0);
    // SAFETY: hipk_test_add(float* x, float v, int n) gets a buffer of n floats, a float and n.
    check("launching", unsafe {
        stream
            .launch_builder(&add)
            .arg_mut(&mut x)
            .value(41.0f32)
            .value(n as i32)
            .launch(&cfg)
    });
    let out = check("downloading", x.to_vec(&stream));
    let wrong = out.iter().filter(|v| **v != 42.0).count();
    println!("{} of {n} elements are 42.0", n - wrong);
    if wrong != 0 {
        std::process::exit(1);
    }
}
