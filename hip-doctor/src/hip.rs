//! The HIP runtime and BLAS rows of the Environment section, and the Devices section, read
//! through `hip-sys` (which file was loaded, its version and flavour, where the search looked,
//! device count and properties).

use std::path::PathBuf;

use hip_sys::search::{Attempt, Outcome, SearchReport, Target};
use hip_sys::{hipError_t, Error, Hip};

use super::diagnose::{base_arch, DeviceFacts, DeviceState, KernelState, LibraryState};
use super::report::{Item, Section};
use crate::report::Json;

/// One line per attempt of a library search, with runs of absent files in one directory folded
/// into `dir/{a, b}: not present`, and runs of names the system loader does not know folded into
/// one line.
pub fn attempt_lines(attempts: &[Attempt]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut i = 0;
    while let Some(attempt) = attempts.get(i) {
        let run: Vec<&Attempt> = attempts[i..]
            .iter()
            .take_while(|a| fold_key(a).is_some() && fold_key(a) == fold_key(attempt))
            .collect();
        if run.len() > 1 {
            let names: Vec<String> = run.iter().map(|a| file_name(&a.target)).collect();
            lines.push(match fold_key(attempt) {
                Some(Some(dir)) => {
                    format!("{}/{{{}}}: not present", dir.display(), names.join(", "))
                }
                _ => format!(
                    "system loader (LD_LIBRARY_PATH, ld.so.cache): {}: not found",
                    names.join(", ")
                ),
            });
            i += run.len();
            continue;
        }
        lines.push(match &attempt.outcome {
            Outcome::Absent => format!("{}: not present", attempt.target),
            Outcome::NotAFile(why) => format!("{}: {why}", attempt.target),
            Outcome::OpenFailed(msg) => format!("{}: {msg}", attempt.target),
            Outcome::Opened => format!("{}: opened", attempt.target),
        });
        i += 1;
    }
    lines
}

/// Attempts with the same key fold into one line: `Some(Some(dir))` for an absent file in `dir`,
/// `Some(None)` for a name the system loader could not find; `None` never folds.
fn fold_key(a: &Attempt) -> Option<Option<PathBuf>> {
    match (&a.target, &a.outcome) {
        (Target::File(p), Outcome::Absent) => p.parent().map(|d| Some(d.to_path_buf())),
        (Target::SystemLoader(_), Outcome::OpenFailed(msg)) if msg.contains("No such file") => {
            Some(None)
        }
        _ => None,
    }
}

fn file_name(target: &Target) -> String {
    match target {
        Target::File(p) => p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        Target::SystemLoader(name) => (*name).to_string(),
    }
}

/// The path a search opened, as text.
fn opened_path(report: &SearchReport) -> Option<String> {
    report.opened().map(|t| match t {
        Target::File(p) => p.display().to_string(),
        Target::SystemLoader(name) => format!("{name} (via the system loader)"),
    })
}

/// Loads the HIP runtime (once per process) and describes the outcome.
pub fn library() -> (Result<&'static Hip, Error>, LibraryState, Item) {
    let loaded = hip_sys::hip();
    let report = hip_sys::hip_search_report();
    match &loaded {
        Ok(hip) => {
            let path = hip.path().display().to_string();
            let flavour = hip.flavour().to_string();
            let (version, item) = match hip.runtime_version() {
                Ok(v) => {
                    let v = v.to_string();
                    (
                        v.clone(),
                        Item::pass("HIP runtime", format!("{path} ({flavour} HIP {v})")),
                    )
                }
                Err(e) => (
                    "unknown".to_string(),
                    Item::fail(
                        "HIP runtime",
                        format!("{path} ({flavour}); version query failed: {e}"),
                    ),
                ),
            };
            let mut item = item
                .with_fact("path", Json::from(path.as_str()))
                .with_fact("version", Json::from(version.as_str()))
                .with_fact("flavour", Json::from(flavour.as_str()))
                .with_fact("props_layout", Json::from(hip.props_layout().to_string()));
            item = with_loaded_file(item, &path, hip.loaded_path());
            let evidence = hip.flavour_evidence();
            if let Some(file) = &evidence.dtk_version_file {
                item.detail
                    .push_str(&format!("\nDTK evidence: {}", file.display()));
            }
            let state = LibraryState::Loaded {
                path,
                version,
                flavour,
            };
            (loaded, state, item)
        }
        Err(Error::NotFound { report }) => {
            let tried = attempt_lines(&report.attempts);
            let detail = match tried.as_slice() {
                [only] => format!("not found: {only}"),
                _ => format!(
                    "not found in {} places (listed under Diagnosis)",
                    report.attempts.len()
                ),
            };
            let state = LibraryState::NotFound {
                tried,
                message: "no candidate file could be loaded".into(),
            };
            (loaded, state, Item::fail("HIP runtime", detail))
        }
        Err(e) => {
            let path = opened_path(&report).unwrap_or_else(|| "the HIP runtime".into());
            let state = LibraryState::Unusable {
                path,
                message: e.to_string(),
            };
            let item = Item::fail("HIP runtime", e.to_string());
            (loaded, state, item)
        }
    }
}

/// Adds the file the dynamic loader mapped for a library opened as `path` (asked of the loader,
/// see [`hip_sys::Hip::loaded_path`], and with links resolved) when it reads differently from
/// `path`: the report names the file that runs, never one a path check merely found.
fn with_loaded_file(mut item: Item, path: &str, loaded: &std::path::Path) -> Item {
    let real = std::fs::canonicalize(loaded).unwrap_or_else(|_| loaded.to_path_buf());
    let real = real.display().to_string();
    if real != path {
        item.detail.push_str(&format!("\nloaded file: {real}"));
    }
    item.with_fact("loaded_path", Json::from(real))
}

/// The hipBLAS and rocBLAS rows. A missing BLAS is a warning here: the runtime works without
/// it, and the GEMM check says it was skipped.
pub fn blas_items() -> Vec<Item> {
    let hipblas = hip_sys::blas::hipblas();
    let rocblas = hip_sys::blas::rocblas();
    let hipblas_item = match &hipblas {
        Ok(b) => {
            let abi = match b.gemm_ex_abi() {
                Some(abi) => format!("GemmEx ABI {abi:?}"),
                None => "no GemmEx entry point".to_string(),
            };
            let path = b.path().display().to_string();
            let item = Item::pass("hipBLAS", format!("{path} ({abi})"))
                .with_fact("path", Json::from(path.as_str()));
            with_loaded_file(item, &path, b.loaded_path())
        }
        Err(e) if rocblas.is_ok() => {
            Item::info("hipBLAS", format!("{}; rocBLAS is used instead", short(e)))
        }
        Err(e) => blas_missing("hipBLAS", &hip_sys::blas::hipblas_search_report(), e),
    };
    let rocblas_item = match &rocblas {
        Ok(b) => {
            let path = b.path().display().to_string();
            let item =
                Item::pass("rocBLAS", path.as_str()).with_fact("path", Json::from(path.as_str()));
            with_loaded_file(item, &path, b.loaded_path())
        }
        Err(e) if hipblas.is_ok() => Item::info(
            "rocBLAS",
            format!("{} (not needed: hipBLAS is used)", short(e)),
        ),
        Err(e) => blas_missing("rocBLAS", &hip_sys::blas::rocblas_search_report(), e),
    };
    vec![hipblas_item, rocblas_item]
}

/// One line for a BLAS load error when the other library stands in for it.
fn short(e: &Error) -> String {
    match e {
        Error::NotFound { .. } => "not found".to_string(),
        other => other.to_string(),
    }
}

/// Both BLAS libraries are missing: a warning listing where this one was looked for.
fn blas_missing(name: &str, report: &SearchReport, e: &Error) -> Item {
    let detail = match e {
        Error::NotFound { .. } => {
            let mut d = "not found; looked in:".to_string();
            for line in attempt_lines(&report.attempts) {
                d.push_str("\n  ");
                d.push_str(&line);
            }
            d
        }
        other => other.to_string(),
    };
    Item::warn(name, detail).with_hint(format!(
        "GEMM through BLAS (hip_rt::Blas, the GEMM check) needs hipBLAS or rocBLAS; DTK ships both \
         in /opt/dtk/lib (source /opt/dtk/env.sh), or set HIPK_{}_LIBRARY to the file",
        name.to_uppercase()
    ))
}

/// Asks the runtime for its devices. `hip` is the outcome of [`library`].
pub fn devices(hip: &Result<&'static Hip, Error>) -> DeviceState {
    let hip = match hip {
        Ok(hip) => *hip,
        Err(_) => return DeviceState::NotChecked("the HIP runtime did not load".into()),
    };
    let count = match hip.device_count() {
        Ok(n) => n,
        Err(Error::Hip(e)) if e.code == hipError_t::hipErrorNoDevice => {
            return DeviceState::NoDevice(format!(
                "HIP error {} {}: {}",
                e.code.0, e.name, e.description
            ))
        }
        Err(e) => return DeviceState::Error(e.to_string()),
    };
    if count <= 0 {
        return DeviceState::NoDevice(format!("hipGetDeviceCount returned {count}"));
    }
    let mut found = Vec::new();
    for ordinal in 0..count {
        match hip.device_props(ordinal) {
            Ok(p) => found.push(DeviceFacts {
                ordinal: ordinal as usize,
                name: p.name.clone(),
                arch: p.gcn_arch_name.clone(),
                compute_units: u32::try_from(p.multi_processor_count).unwrap_or(0),
                wavefront: u32::try_from(p.warp_size).unwrap_or(0),
                total_memory: p.total_global_mem as u64,
            }),
            Err(e) => return DeviceState::Error(device_error(ordinal, &e)),
        }
    }
    DeviceState::Found(found)
}

/// The error of reading device `ordinal`'s properties, naming the device once (some errors,
/// like `BadProps`, already start with it).
fn device_error(ordinal: i32, e: &Error) -> String {
    match e {
        Error::BadProps { .. } => e.to_string(),
        _ => format!("device {ordinal}: {e}"),
    }
}

/// The Devices section: one row per device plus whether the build has code for its arch.
pub fn device_section(devices: &DeviceState, kernels: &KernelState) -> Section {
    let mut section = Section::new("Devices");
    match devices {
        DeviceState::NotChecked(why) => section.push(Item::skipped("devices", why.clone())),
        DeviceState::NoDevice(message) => {
            section.push(Item::fail("devices", format!("no device: {message}")))
        }
        DeviceState::Error(message) => section.push(Item::fail("devices", message.clone())),
        DeviceState::Found(list) => {
            for d in list {
                let gib = d.total_memory as f64 / (1u64 << 30) as f64;
                let name = format!("device {}", d.ordinal);
                section.push(
                    Item::info(
                        name.as_str(),
                        format!(
                            "{}, {}, {} CUs, wave{}, {gib:.1} GiB",
                            d.name, d.arch, d.compute_units, d.wavefront
                        ),
                    )
                    .with_fact("name", Json::from(d.name.as_str()))
                    .with_fact("arch", Json::from(d.arch.as_str()))
                    .with_fact("compute_units", Json::from(d.compute_units))
                    .with_fact("wavefront", Json::from(d.wavefront))
                    .with_fact("total_memory", Json::from(d.total_memory)),
                );
                if d.wavefront != 64 {
                    section.push(Item::warn(
                        format!("device {} wavefront", d.ordinal),
                        format!(
                            "wave{}: every DCU runs wave64; this is not a DCU",
                            d.wavefront
                        ),
                    ));
                }
                if d.is_emulated() {
                    section.push(
                        Item::info(
                            format!("device {} EMULATED", d.ordinal),
                            format!(
                                "{}: hip-emu, not a GPU; its checks prove the host side \
                                 (arguments, launch configurations, results against the CPU \
                                 reference); any figure from it is {}",
                                d.name,
                                hip_rt::EMULATED_FIGURE_LABEL
                            ),
                        )
                        .with_fact("emulated", Json::from(true)),
                    );
                }
                section.push(arch_coverage(d, kernels));
            }
        }
    }
    section
}

fn arch_coverage(d: &DeviceFacts, kernels: &KernelState) -> Item {
    let arch = base_arch(&d.arch);
    let name = format!("device {} code object", d.ordinal);
    match kernels {
        KernelState::Built { archs } if archs.iter().any(|a| a == arch) => {
            Item::pass(name, format!("the build embeds {arch}"))
        }
        KernelState::Built { archs } => Item::fail(
            name,
            format!("no {arch} in this build (has {})", archs.join(", ")),
        )
        .with_hint(format!(
            "rebuild with HIPK_ARCH={arch} cargo build --release"
        )),
        KernelState::NotBuilt(why) => Item::fail(name, format!("no kernels embedded: {why}")),
        KernelState::NotInBuild => Item::not_available(name, "the kernel manifest has not landed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_error_names_the_device_once() {
        let bad = Error::BadProps {
            ordinal: 0,
            layout: hip_sys::PropsLayout::Legacy,
            library: PathBuf::from("/opt/dtk/lib/libgalaxyhip.so.5"),
            reason: "warpSize = 0".into(),
        };
        let text = device_error(0, &bad);
        assert!(text.starts_with("device 0: properties read as"), "{text}");
        assert_eq!(text.matches("device 0").count(), 1, "{text}");
        let other = Error::MissingSymbol {
            name: "hipGetDevicePropertiesR0600",
            library: PathBuf::from("/x.so"),
        };
        let text = device_error(1, &other);
        assert!(text.starts_with("device 1: "), "{text}");
    }

    fn absent(p: &str) -> Attempt {
        Attempt {
            target: Target::File(PathBuf::from(p)),
            outcome: Outcome::Absent,
        }
    }

    #[test]
    fn attempts_fold_per_directory() {
        let attempts = vec![
            absent("/opt/dtk/hip/lib/libamdhip64.so"),
            absent("/opt/dtk/hip/lib/libgalaxyhip.so.5"),
            absent("/opt/rocm/lib/libamdhip64.so"),
            Attempt {
                target: Target::SystemLoader("libamdhip64.so"),
                outcome: Outcome::OpenFailed("x: No such file".into()),
            },
            Attempt {
                target: Target::SystemLoader("libamdhip64.so.7"),
                outcome: Outcome::OpenFailed("x: No such file".into()),
            },
            Attempt {
                target: Target::SystemLoader("libamdhip64.so.6"),
                outcome: Outcome::OpenFailed("wrong ELF class".into()),
            },
            Attempt {
                target: Target::SystemLoader("libamdhip64.so.5"),
                outcome: Outcome::Opened,
            },
        ];
        assert_eq!(
            attempt_lines(&attempts),
            vec![
                "/opt/dtk/hip/lib/{libamdhip64.so, libgalaxyhip.so.5}: not present".to_string(),
                "/opt/rocm/lib/libamdhip64.so: not present".to_string(),
                "system loader (LD_LIBRARY_PATH, ld.so.cache): libamdhip64.so, libamdhip64.so.7: not found".to_string(),
                "libamdhip64.so.6 (system loader): wrong ELF class".to_string(),
                "libamdhip64.so.5 (system loader): opened".to_string(),
            ]
        );
    }

    #[test]
    fn arch_coverage_rows() {
        let d = DeviceFacts {
            ordinal: 1,
            name: "Z100".into(),
            arch: "gfx906:sramecc+:xnack-".into(),
            compute_units: 64,
            wavefront: 64,
            total_memory: 32 << 30,
        };
        let built = |a: &[&str]| KernelState::Built {
            archs: a.iter().map(|s| s.to_string()).collect(),
        };
        assert_eq!(
            arch_coverage(&d, &built(&["gfx906"])).status,
            super::super::report::Status::Pass
        );
        let miss = arch_coverage(&d, &built(&["gfx928"]));
        assert_eq!(miss.status, super::super::report::Status::Fail);
        assert_eq!(
            miss.hint.as_deref(),
            Some("rebuild with HIPK_ARCH=gfx906 cargo build --release")
        );
        let section = device_section(&DeviceState::Found(vec![d]), &built(&["gfx906"]));
        assert!(section.items[0]
            .detail
            .starts_with("Z100, gfx906:sramecc+:xnack-, 64 CUs, wave64, 32.0 GiB"));
    }
}
