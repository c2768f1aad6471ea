//! List the HIP devices and their properties.
//!
//! `cargo run -p hip-rt --example 01_devices`. Exits 2 with a diagnosis when there is no device.

mod common;

use hip_rt::Device;

fn main() {
    let first = common::device_or_exit();
    let count = common::check("counting devices", Device::count());
    println!("{count} HIP device(s)");
    for ordinal in 0..count {
        let d = if ordinal == 0 {
            first.clone()
        } else {
            common::check("opening device", Device::get(ordinal))
        };
        let mem = common::check("reading memory info", d.memory_info());
        let pci = d.pci_bus_id().unwrap_or_else(|e| format!("unknown ({e})"));
        println!("device {ordinal}: {}", d.name());
        println!(
            "  arch            {} (wavefront {})",
            d.gcn_arch_name(),
            d.wavefront_size()
        );
        println!("  compute units   {}", d.compute_units());
        println!("  clock           {} MHz", d.clock_rate_khz() / 1000);
        println!("  threads/block   {}", d.max_threads_per_block());
        println!("  LDS/block       {} KiB", d.shared_mem_per_block() / 1024);
        println!(
            "  memory          {} MiB free of {} MiB",
            mem.free >> 20,
            mem.total >> 20
        );
        println!("  PCI bus id      {pci}");
        println!("  props layout    {}", d.props().layout);
    }
}
