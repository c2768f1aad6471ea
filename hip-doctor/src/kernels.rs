//! The Embedded kernels section: which archs this build compiled, how many kernels each
//! bundle holds, and the worst figures of the compiler's resource table.
//!
//! Also a manifest check that runs without a device: every embedded bundle parses as a clang
//! offload bundle, holds a code object for every compiled arch, and exports every kernel the
//! name table lists.

use super::diagnose::KernelState;
use super::report::{Item, Section};
use crate::report::Json;
use hip_kernels::embedded::{self as kernels, KernelResources};
use hip_kernels::ops::KERNEL_FILES;
use hip_rt::module::bundle::Bundle;

/// What this build embeds, for the diagnosis.
pub fn state() -> KernelState {
    match kernels::not_built_reason() {
        Some(reason) => KernelState::NotBuilt(reason.to_string()),
        None => KernelState::Built {
            archs: kernels::archs().iter().map(|a| a.to_string()).collect(),
        },
    }
}

/// Builds the section.
pub fn section() -> Section {
    let mut section = Section::new("Embedded kernels");
    if let Some(reason) = kernels::not_built_reason() {
        section.push(
            Item::fail("kernels", format!("not built: {reason}"))
                .with_hint("install hipcc (DTK: source /opt/dtk/env.sh; Debian: apt-get install hipcc) or set HIPK_HIPCC, then rebuild"),
        );
        return section;
    }
    let hipcc = kernels::hipcc().unwrap_or("unknown");
    section.push(Item::info(
        "hipcc",
        format!("{hipcc} ({})", kernels::hipcc_version()),
    ));
    let archs = kernels::archs();
    section.push(Item::info("archs", archs.join(", ")).with_fact(
        "archs",
        Json::Array(archs.iter().map(|a| Json::from(*a)).collect()),
    ));
    let bundles = kernels::bundles();
    let total: usize = bundles
        .iter()
        .filter_map(|b| KERNEL_FILES.iter().find(|f| f.source == b.source))
        .map(|f| f.kernels.len())
        .sum();
    section.push(
        Item::info("kernels", format!("{total} in {} bundles", bundles.len()))
            .with_fact("count", Json::from(total)),
    );
    for bundle in bundles {
        section.push(bundle_item(bundle.source, bundle.bytes, archs));
    }
    section.items.extend(worst_items(kernels::resources()));
    section
}

fn bundle_item(source: &str, bytes: &[u8], archs: &[&str]) -> Item {
    let name = format!("{source} bundle");
    let expected: &[&str] = KERNEL_FILES
        .iter()
        .find(|f| f.source == source)
        .map_or(&[], |f| f.kernels);
    let parsed = match Bundle::parse(bytes) {
        Ok(b) => b,
        Err(e) => return Item::fail(name, format!("not a readable offload bundle: {e}")),
    };
    for arch in archs {
        let Some(entry) = parsed.entry_for_arch(arch) else {
            return Item::fail(
                name,
                format!(
                    "no code object for {arch} (holds {})",
                    parsed.target_ids().join(", ")
                ),
            );
        };
        let names = match entry.kernel_names() {
            Ok(n) => n,
            Err(e) => return Item::fail(name, format!("{arch} code object unreadable: {e}")),
        };
        if let Some(missing) = expected.iter().find(|k| !names.iter().any(|n| n == *k)) {
            return Item::fail(name, format!("{arch} code object lacks kernel {missing}"));
        }
    }
    Item::pass(
        name,
        format!(
            "{} kernel{} for {} ({} KiB)",
            expected.len(),
            if expected.len() == 1 { "" } else { "s" },
            archs.join(", "),
            bytes.len() / 1024
        ),
    )
    .with_fact("kernels", Json::from(expected.len()))
}

/// The worst figure of one resource over all kernels and archs: `(value, "kernel@arch")`.
fn worst(
    rows: &[KernelResources],
    key: impl Fn(&KernelResources) -> u32,
    highest: bool,
) -> Option<(u32, String)> {
    let pick = rows.iter().max_by_key(|r| {
        if highest {
            key(r) as i64
        } else {
            -(key(r) as i64)
        }
    })?;
    Some((key(pick), format!("{}@{}", pick.kernel, pick.arch)))
}

/// Rows for the worst figures of the resource table; warnings for scratch use and spills.
fn worst_items(rows: &[KernelResources]) -> Vec<Item> {
    if rows.is_empty() {
        return vec![Item::warn(
            "resources",
            "the build recorded no resource figures",
        )];
    }
    type Key = fn(&KernelResources) -> u32;
    let figures: [(&str, Key, bool); 5] = [
        ("max VGPRs", |r| r.usage.vgprs, true),
        ("max SGPRs", |r| r.usage.sgprs, true),
        ("max LDS bytes", |r| r.usage.lds_bytes, true),
        ("max scratch bytes", |r| r.usage.scratch_bytes, true),
        ("min occupancy", |r| r.usage.occupancy, false),
    ];
    let mut items = Vec::new();
    for (label, key, highest) in figures {
        if let Some((value, at)) = worst(rows, key, highest) {
            let item = match label {
                "max scratch bytes" if value > 0 => Item::warn(
                    label,
                    format!("{value} ({at}): a kernel uses scratch memory"),
                ),
                "min occupancy" => Item::info(label, format!("{value} waves/SIMD ({at})")),
                _ if value == 0 => Item::info(label, "0 in every kernel"),
                _ => Item::info(label, format!("{value} ({at})")),
            };
            items.push(item.with_fact("value", Json::from(f64::from(value))));
        }
    }
    let spills: u32 = rows
        .iter()
        .map(|r| r.usage.vgpr_spills + r.usage.sgpr_spills)
        .sum();
    items.push(if spills == 0 {
        Item::info("spills", "none")
    } else {
        Item::warn("spills", format!("{spills} registers spilled in total"))
    });
    items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;
    use hip_kernels::embedded::ResourceUsage;

    fn row(kernel: &'static str, vgprs: u32, scratch: u32, occupancy: u32) -> KernelResources {
        KernelResources {
            source: "x",
            kernel,
            arch: "gfx906",
            usage: ResourceUsage {
                vgprs,
                sgprs: 20,
                scratch_bytes: scratch,
                vgpr_spills: 0,
                sgpr_spills: 0,
                lds_bytes: 256,
                occupancy,
            },
        }
    }

    #[test]
    fn worst_figures_name_the_kernel() {
        let rows = [row("a", 40, 0, 8), row("b", 96, 0, 4), row("c", 12, 0, 10)];
        let items = worst_items(&rows);
        let find = |n: &str| {
            items
                .iter()
                .find(|i| i.name == n)
                .map(|i| (i.status, i.detail.clone()))
        };
        assert_eq!(
            find("max VGPRs"),
            Some((Status::Info, "96 (b@gfx906)".into()))
        );
        assert_eq!(
            find("min occupancy"),
            Some((Status::Info, "4 waves/SIMD (b@gfx906)".into()))
        );
        assert_eq!(find("spills"), Some((Status::Info, "none".into())));
        let items = worst_items(&[row("s", 10, 64, 10)]);
        assert!(items
            .iter()
            .any(|i| i.name == "max scratch bytes" && i.status == Status::Warn));
        assert_eq!(worst_items(&[])[0].status, Status::Warn);
    }

    #[test]
    fn a_garbage_bundle_is_a_failure() {
        let item = bundle_item("layernorm", b"not a bundle", &["gfx906"]);
        assert_eq!(item.status, Status::Fail);
    }

    #[test]
    fn this_builds_bundles_check_out() {
        // With hipcc at build time (CI), every embedded bundle must pass the manifest check;
        // without it, the section says why the kernels are missing.
        let section = section();
        match kernels::not_built_reason() {
            Some(_) => assert_eq!(section.items[0].status, Status::Fail),
            None => {
                let bundles: Vec<_> = section
                    .items
                    .iter()
                    .filter(|i| i.name.ends_with(" bundle"))
                    .collect();
                assert_eq!(bundles.len(), kernels::bundles().len());
                assert!(
                    bundles.iter().all(|i| i.status == Status::Pass),
                    "{bundles:?}"
                );
            }
        }
    }
}
