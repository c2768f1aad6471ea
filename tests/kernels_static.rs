//! Static checks of the kernels embedded in this build, no GPU needed (CI has hipcc):
//!
//! - the gate: on gfx906 every kernel has 0 scratch, 0 spills, and occupancy ≥ 4 waves/SIMD
//!   (matmul_* and attention_*: ≥ 2), from the compiler's resource remarks; the table is printed
//!   (`cargo test --test kernels_static -- --nocapture`);
//! - the manifest: each embedded bundle holds a code object for every selected arch, each code
//!   object exports exactly the kernels its op family lists (`KERNELS` in
//!   `src/ops/<family>/mod.rs`, collected in `hip_kernels::ops::KERNEL_FILES`), and every source
//!   is listed by a family.
//!
//! Without hipcc the kernels are not built and these tests only check that the crate says so,
//! unless `HIPK_REQUIRE_KERNELS` is set (CI sets it): then a build without kernels fails them.

use hip_kernels::embedded::{self as kernels, KernelResources};
use hip_kernels::ops::{kernel_names, KERNEL_FILES};
use hip_rt::module::bundle::Bundle;

/// The arch whose figures gate the build (the one Debian's hipcc, and so CI, can compile).
const GATE_ARCH: &str = "gfx906";

/// Minimum waves per SIMD a kernel must allow on the gate arch.
fn min_occupancy(kernel: &str) -> u32 {
    if kernel.starts_with("matmul_") || kernel.starts_with("attention_") {
        2
    } else {
        4
    }
}

/// True when this build has kernels; otherwise prints why and the test passes vacuously.
fn built() -> bool {
    match kernels::not_built_reason() {
        None => true,
        Some(reason) => {
            assert!(
                std::env::var_os("HIPK_REQUIRE_KERNELS").is_none(),
                "HIPK_REQUIRE_KERNELS is set but this build has no kernels: {reason}"
            );
            eprintln!("kernels not built ({reason}); static checks skipped");
            assert!(kernels::bundles().is_empty() && kernels::resources().is_empty());
            let err = kernels::bundle("layernorm").unwrap_err();
            assert!(err.to_string().contains("hipcc"), "{err}");
            false
        }
    }
}

#[test]
fn gate_no_scratch_no_spills_enough_occupancy_on_gfx906() {
    if !built()
        || !kernels::archs()
            .iter()
            .any(|a| hip_build::detect::arch_processor(a) == GATE_ARCH)
    {
        return;
    }
    let rows: Vec<KernelResources> = kernels::resources()
        .iter()
        .filter(|r| hip_build::detect::arch_processor(r.arch) == GATE_ARCH)
        .copied()
        .collect();
    println!("{}", kernels::format_resource_table(&rows));
    let mut failures = Vec::new();
    for file in KERNEL_FILES
        .iter()
        .filter(|f| kernels::bundle(f.source).is_ok())
    {
        for &name in file.kernels {
            let Some(r) = rows.iter().find(|r| r.kernel == name) else {
                failures.push(format!("{name}: no resource figures for {GATE_ARCH}"));
                continue;
            };
            let u = r.usage;
            if u.scratch_bytes != 0 || u.vgpr_spills != 0 || u.sgpr_spills != 0 {
                failures.push(format!(
                    "{name}: scratch {} B, {} VGPR / {} SGPR spills (must all be 0)",
                    u.scratch_bytes, u.vgpr_spills, u.sgpr_spills
                ));
            }
            if u.occupancy < min_occupancy(name) {
                failures.push(format!(
                    "{name}: occupancy {} waves/SIMD < {} ({} VGPRs, {} B LDS)",
                    u.occupancy,
                    min_occupancy(name),
                    u.vgprs,
                    u.lds_bytes
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "static gate failed on {GATE_ARCH}:\n{}",
        failures.join("\n")
    );
}

#[test]
fn manifest_every_bundle_has_every_arch_and_the_listed_kernels() {
    if !built() {
        return;
    }
    assert!(!kernels::archs().is_empty());
    for b in kernels::bundles() {
        let expected = kernel_names(b.source).unwrap_or_else(|| {
            panic!(
                "kernels/{}.hip has no entry in KERNEL_FILES (its family's KERNELS in src/ops/<family>/mod.rs)",
                b.source
            )
        });
        let bundle = Bundle::parse(b.bytes)
            .unwrap_or_else(|e| panic!("{}: embedded bundle does not parse: {e}", b.source));
        for arch in kernels::archs() {
            let entries: Vec<_> = bundle
                .gpu_entries()
                .filter(|e| e.target_id() == Some(*arch))
                .collect();
            assert_eq!(
                entries.len(),
                1,
                "{}: {} code objects for {arch}: {:?}",
                b.source,
                entries.len(),
                bundle.target_ids()
            );
            let mut names = entries[0]
                .kernel_names()
                .unwrap_or_else(|e| panic!("{} ({arch}): ELF symbols unreadable: {e}", b.source));
            names.sort();
            let mut want: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
            want.sort();
            assert_eq!(
                names, want,
                "{} ({arch}): exported kernels differ from KERNEL_FILES",
                b.source
            );
        }
        assert_eq!(
            bundle.gpu_entries().count(),
            kernels::archs().len(),
            "{}: code objects for archs that were not selected: {:?}",
            b.source,
            bundle.target_ids()
        );
    }
    for file in KERNEL_FILES {
        if kernels::bundle(file.source).is_ok() {
            continue;
        }
        // A source listed ahead of its merge (the table is shared by every kernel file).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("kernels")
            .join(format!("{}.hip", file.source));
        assert!(
            !path.exists(),
            "{} exists but was not built into this crate",
            path.display()
        );
        eprintln!(
            "KERNEL_FILES lists {}, not in this checkout: skipped",
            file.source
        );
    }
}

#[test]
fn every_kernel_has_figures_for_every_arch() {
    if !built() {
        return;
    }
    for file in KERNEL_FILES
        .iter()
        .filter(|f| kernels::bundle(f.source).is_ok())
    {
        for &name in file.kernels {
            for arch in kernels::archs() {
                let r = kernels::resource(name, arch)
                    .unwrap_or_else(|| panic!("{name} has no resource figures for {arch}"));
                assert_eq!(r.source, file.source);
                assert!(r.usage.vgprs > 0 && r.usage.occupancy > 0, "{r:?}");
            }
        }
    }
}
