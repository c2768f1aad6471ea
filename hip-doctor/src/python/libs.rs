//! The rows for the shared libraries the packages ship: the HIP/ROCm libraries each needs,
//! resolved as the loader would, and the archs of its GPU code against the archs needed.

use std::path::Path;

use super::dist::Dist;
use super::elf_scan::{self, LibraryFacts};
use super::resolve::{is_hip_family, soname_stem, Found};
use super::Context;
use crate::diagnose::base_arch;
use crate::report::Item;

/// The most libraries examined per package.
const MAX_LIBRARIES: usize = 500;

/// The rows for every library of `dist`.
pub fn rows(ctx: &Context, dist: &Dist, gpu_build: bool) -> Vec<Item> {
    let mut rows = Vec::new();
    let mut plain = 0usize;
    for rel in dist.libraries.iter().take(MAX_LIBRARIES) {
        let path = dist.site.join(rel);
        let file = rel.file_name().map_or_else(
            || rel.display().to_string(),
            |f| f.to_string_lossy().into_owned(),
        );
        let name = format!("{} {file}", dist.name);
        let facts = match elf_scan::scan(&path) {
            Ok(facts) => facts,
            Err(why) => {
                rows.push(
                    Item::fail(name, format!("{}: {why}", path.display())).with_hint(format!(
                        "the loader cannot load it either (import fails): reinstall {} (`pip install --force-reinstall --no-deps` with the same wheel)",
                        dist.name
                    )),
                );
                continue;
            }
        };
        let before = rows.len();
        rows.extend(needed_rows(ctx, &name, &path, &facts));
        if let Some(item) = arch_row(ctx, &name, &facts) {
            rows.push(item);
        }
        if rows.len() == before {
            plain += 1;
        }
    }
    if dist.libraries.len() > MAX_LIBRARIES {
        rows.push(Item::info(
            format!("{} libraries", dist.name),
            format!(
                "{} shared libraries; the first {MAX_LIBRARIES} were read",
                dist.libraries.len()
            ),
        ));
    }
    if plain > 0 {
        rows.push(Item::info(
            format!("{} libraries", dist.name),
            format!(
                "{plain} shared {} without GPU code or HIP/ROCm dependencies",
                if plain == 1 { "library" } else { "libraries" }
            ),
        ));
    }
    if dist.key == "bitsandbytes" {
        rows.extend(bitsandbytes_row(ctx, dist, gpu_build));
    }
    rows
}

/// One row per HIP/ROCm library that the loader cannot find.
fn needed_rows(ctx: &Context, name: &str, path: &Path, facts: &LibraryFacts) -> Vec<Item> {
    let mut rows = Vec::new();
    let mut found = Vec::new();
    for needed in facts.needed.iter().filter(|n| is_hip_family(n)) {
        match ctx.loader.resolve(needed, path, &facts.rpath, &facts.runpath) {
            Found::Loader(p) => found.push(format!("{needed} → {}", p.display())),
            Found::OnlyInRuntime(p) => rows.push(
                Item::fail(
                    format!("{name} needs {needed}"),
                    format!(
                        "{needed} is not on the loader's path (LD_LIBRARY_PATH, ld.so.conf, default directories); it is at {} , found only once DTK's environment is loaded: import fails with \"{needed}: cannot open shared object file\"",
                        p.display()
                    ),
                )
                .with_hint(format!(
                    "load DTK's environment first (`source {}` in the shell and in every batch script), or add {} to LD_LIBRARY_PATH",
                    crate::env::DTK_ENV_SCRIPT,
                    p.parent().map(|d| d.display().to_string()).unwrap_or_default()
                ))
                .with_fact("needed", needed.clone()),
            ),
            Found::Missing => {
                let has = ctx.loader.runtime_has(soname_stem(needed));
                let instead = if has.is_empty() {
                    "the installed runtime has no library of that name".to_string()
                } else {
                    format!("the installed runtime has {}", has.join(", "))
                };
                rows.push(
                    Item::fail(
                        format!("{name} needs {needed}"),
                        format!("{needed} is not found anywhere the loader looks nor in the runtime's directories; {instead}: it was built against another HIP"),
                    )
                    .with_hint(format!(
                        "load DTK's environment (`source {}`) if it is installed elsewhere; otherwise install the build of this package made for this DTK",
                        crate::env::DTK_ENV_SCRIPT
                    ))
                    .with_fact("needed", needed.clone()),
                );
            }
        }
    }
    if rows.is_empty() && !found.is_empty() && facts.fatbin.is_none() {
        rows.push(Item::pass(
            name.to_string(),
            format!("needs {}", found.join(", ")),
        ));
    }
    rows
}

/// The row for the archs of `.hip_fatbin` against the archs needed.
fn arch_row(ctx: &Context, name: &str, facts: &LibraryFacts) -> Option<Item> {
    let fatbin = facts.fatbin.as_ref()?;
    let archs: Vec<&str> = fatbin.archs.iter().map(String::as_str).collect();
    let mut detail = format!(
        "GPU code for {} in {} offload bundle(s)",
        if archs.is_empty() {
            "no arch".to_string()
        } else {
            archs.join(", ")
        },
        fatbin.bundles
    );
    if fatbin.compressed > 0 {
        let methods: Vec<&str> = fatbin.methods.iter().copied().collect();
        detail.push_str(&format!(
            ", {} compressed ({})",
            fatbin.compressed,
            methods.join(", ")
        ));
    }
    if let Some(why) = &fatbin.stopped {
        detail.push_str(&format!(" [{why}]"));
    }
    let item = if ctx.targets.is_empty() {
        Item::info(
            name.to_string(),
            format!("{detail}; no device found and no --arch: not compared"),
        )
    } else {
        let missing: Vec<(String, usize)> = ctx
            .targets
            .iter()
            .map(|t| base_arch(t).to_string())
            .map(|t| {
                let n = fatbin.bundles_without(&t);
                (t, n)
            })
            .filter(|(_, n)| *n > 0)
            .collect();
        if missing.is_empty() {
            Item::pass(
                name.to_string(),
                format!(
                    "{detail}; has {} ({})",
                    ctx.targets.join(", "),
                    ctx.targets_from
                ),
            )
        } else {
            let needs: Vec<String> = missing
                .iter()
                .map(|(t, n)| {
                    if *n == fatbin.bundles {
                        t.clone()
                    } else {
                        format!("{t} (missing in {n} of {} bundles)", fatbin.bundles)
                    }
                })
                .collect();
            Item::fail(
                name.to_string(),
                format!(
                    "{detail}; this node needs {} ({}): its kernels fail with hipErrorNoBinaryForGpu",
                    needs.join(", "),
                    ctx.targets_from
                ),
            )
            .with_hint(format!(
                "install a build of it compiled for {} (e.g. built here with --offload-arch={}); HSA_OVERRIDE_GFX_VERSION does not fix this, it only hides it",
                missing.iter().map(|(t, _)| t.as_str()).collect::<Vec<_>>().join(", "),
                missing[0].0
            ))
        }
    };
    Some(item.with_fact(
        "archs",
        archs.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    ))
}

/// bitsandbytes picks a backend library at import; without a ROCm one it has no GPU path.
fn bitsandbytes_row(ctx: &Context, dist: &Dist, gpu_build: bool) -> Option<Item> {
    let backends: Vec<String> = dist
        .libraries
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .filter(|f| f.starts_with("libbitsandbytes"))
        .collect();
    let rocm = backends
        .iter()
        .any(|b| b.contains("rocm") || b.contains("hip"));
    let name = "bitsandbytes backend";
    if rocm {
        return Some(Item::pass(
            name,
            format!("backends: {}", backends.join(", ")),
        ));
    }
    let list = if backends.is_empty() {
        "none".to_string()
    } else {
        backends.join(", ")
    };
    if ctx.amd_node().is_some() || gpu_build {
        Some(
            Item::fail(
                name,
                format!("bitsandbytes {} has no ROCm/HIP library (backends: {list}): 8-bit and 4-bit optimizers and quantization have no GPU path on this node", dist.version),
            )
            .with_hint("install the ROCm/DTK build of bitsandbytes (with libbitsandbytes_rocm*.so) made for this DTK"),
        )
    } else {
        Some(Item::info(name, format!("backends: {list}")))
    }
}
