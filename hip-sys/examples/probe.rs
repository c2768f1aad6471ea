//! Load the HIP runtime the way every hip-kernels program does and print what happened:
//! `cargo run -p hip-sys --example probe`. Exit status 0 when the runtime loaded (even with no
//! device), 2 when it did not; the integration tests run this with a steered environment.

use std::process::ExitCode;

fn main() -> ExitCode {
    let hip = match hip_sys::hip() {
        Ok(hip) => hip,
        Err(e) => {
            println!("load error: {e}");
            return ExitCode::from(2);
        }
    };
    println!("loaded: {}", hip.path().display());
    println!("flavour: {}", hip.flavour());
    match hip.runtime_version() {
        Ok(v) => println!("runtime version: {v}"),
        Err(e) => println!("runtime version error: {e}"),
    }
    match hip.device_count() {
        Ok(n) => {
            println!("devices: {n}");
            for ordinal in 0..n {
                match hip.device_props(ordinal) {
                    Ok(p) => println!(
                        "device {ordinal}: {} {} ({})",
                        p.name, p.gcn_arch_name, p.layout
                    ),
                    Err(e) => println!("device {ordinal}: {e}"),
                }
            }
        }
        Err(e) => println!("device count error: {e}"),
    }
    ExitCode::SUCCESS
}
