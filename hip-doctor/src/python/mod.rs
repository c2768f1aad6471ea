//! The "Python stack" section: will this node run a PyTorch fine-tune, and if not, why.
//!
//! It reads what pip installed (no import): which build torch is ([`stack`]), what the packages
//! require of each other ([`stack::pairing_rows`]), which HIP libraries and GPU archs their
//! shared libraries need ([`libs`]), and the environment PyTorch on ROCm/DTK depends on
//! ([`envrows`]). `--python-import` adds a live import in a child ([`interp::live_import`]).
//!
//! The rows are pure functions of a [`Context`] and the files on disk, so the tests run them on
//! fixture trees made to look like real installs (`tools/doctor_fixtures/`).

pub mod dist;
pub mod elf_scan;
pub mod envrows;
pub mod interp;
pub mod libs;
pub mod resolve;
pub mod stack;

use std::path::{Path, PathBuf};

use crate::diagnose::{base_arch, DeviceState, LibraryState};
use crate::env::EnvFacts;
use crate::report::{Item, Section, Status};

/// The section's title.
pub const TITLE: &str = "Python stack";

/// The command-line options of this section.
#[derive(Debug, Clone, PartialEq, Eq, Default, clap::Args)]
pub struct PythonArgs {
    /// The Python interpreter whose packages to check (a venv's or conda env's `bin/python`).
    /// Default: $VIRTUAL_ENV's, else $CONDA_PREFIX's, else `python3` on PATH.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
    /// Also read this site-packages directory directly (a copied environment, or one built for
    /// another node). Repeatable.
    #[arg(long = "site-packages", value_name = "DIR")]
    pub site_packages: Vec<PathBuf>,
    /// The GPU archs the Python stack must run on, comma-separated (e.g. gfx928,gfx936), in
    /// place of the devices found.
    #[arg(long, value_name = "ARCHS", value_delimiter = ',')]
    pub arch: Vec<String>,
    /// Also import torch in a child process (time-limited) and run a 4x4 matmul on the GPU.
    #[arg(long = "python-import")]
    pub python_import: bool,
}

/// The DTK / ROCm install and runtime the wheels are compared with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Installed {
    /// The installed DTK's `major.minor` (`25.04`).
    pub dtk: Option<String>,
    /// Where it was read.
    pub dtk_source: String,
    /// The installed ROCm's version (`6.2.4`), when there is no DTK.
    pub rocm: Option<String>,
    /// The HIP runtime version the doctor loaded (`5.2.21153`); not for an emulated runtime.
    pub hip_runtime: Option<String>,
    /// What was looked at, for a row that found nothing.
    pub looked: String,
}

/// Everything the rows compare against.
#[derive(Debug, Clone, Default)]
pub struct Context {
    /// The archs needed: `--arch`, else the real devices' (base archs, `gfx906`).
    pub targets: Vec<String>,
    /// Where they came from (`--arch`, `device 0: gfx906`).
    pub targets_from: String,
    /// The install.
    pub installed: Installed,
    /// The dynamic loader's search.
    pub loader: resolve::Loader,
}

impl Context {
    /// Why this node counts as AMD/Hygon (`--arch gfx928`, `device 0: gfx906`), if it does.
    pub fn amd_node(&self) -> Option<String> {
        (!self.targets.is_empty()).then(|| self.targets_from.clone())
    }
}

/// The first `NN.NN` in a text: the DTK version in `.dtk_version` (`25.04.1`, `DTK-25.04`) or in
/// an install's directory name (`/opt/dtk-25.04`).
pub fn dtk_version_in(text: &str) -> Option<String> {
    let b = text.as_bytes();
    (0..b.len().saturating_sub(4)).find_map(|i| {
        let w = &b[i..i + 5];
        let before_ok = i == 0 || !b[i - 1].is_ascii_digit();
        let after_ok = b.get(i + 5).map_or(true, |c| !c.is_ascii_digit());
        (before_ok
            && after_ok
            && w[0].is_ascii_digit()
            && w[1].is_ascii_digit()
            && w[2] == b'.'
            && w[3].is_ascii_digit()
            && w[4].is_ascii_digit())
        .then(|| text[i..i + 5].to_string())
    })
}

/// Finds the installed DTK (its version file, else the directory `/opt/dtk` points to) and
/// ROCm (`.info/version`).
pub fn probe_installed(env: &EnvFacts, library: &LibraryState, devices: &DeviceState) -> Installed {
    let mut installed = Installed {
        looked: env
            .dtk_version_paths
            .iter()
            .map(|p| p.display().to_string())
            .chain([
                "/opt/dtk -> dtk-NN.NN".to_string(),
                "/opt/rocm/.info/version".to_string(),
            ])
            .collect::<Vec<_>>()
            .join(", "),
        ..Installed::default()
    };
    if let Some((path, text)) = &env.dtk_version {
        if let Some(v) = dtk_version_in(text) {
            installed.dtk = Some(v);
            installed.dtk_source =
                format!("{}: {}", path.display(), text.lines().next().unwrap_or(""));
        }
    }
    if installed.dtk.is_none() {
        for link in ["/opt/dtk"]
            .iter()
            .map(PathBuf::from)
            .chain(env.var("ROCM_PATH").map(PathBuf::from))
        {
            if let Ok(target) = std::fs::canonicalize(&link) {
                if let Some(v) = dtk_version_in(&target.to_string_lossy())
                    .filter(|_| target.to_string_lossy().contains("dtk"))
                {
                    installed.dtk_source = format!("{} -> {}", link.display(), target.display());
                    installed.dtk = Some(v);
                    break;
                }
            }
        }
    }
    for root in env.var("ROCM_PATH").into_iter().chain(["/opt/rocm"]) {
        let file = Path::new(root).join(".info/version");
        if let Ok(text) = dist::read_capped(&file, 4096) {
            installed.rocm = Some(text.trim().to_string());
            break;
        }
    }
    if !devices.all_emulated() {
        if let LibraryState::Loaded { version, .. } = library {
            installed.hip_runtime = Some(version.clone());
        }
    }
    installed
}

/// The archs needed: `--arch`, else the archs of the real (not emulated) devices.
pub fn targets(args: &PythonArgs, devices: &DeviceState) -> (Vec<String>, String) {
    let given: Vec<String> = args
        .arch
        .iter()
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    if !given.is_empty() {
        return (given.clone(), format!("--arch {}", given.join(",")));
    }
    let DeviceState::Found(list) = devices else {
        return (Vec::new(), String::new());
    };
    let real: Vec<_> = list.iter().filter(|d| !d.is_emulated()).collect();
    let mut archs: Vec<String> = real
        .iter()
        .map(|d| base_arch(&d.arch).to_string())
        .collect();
    archs.sort();
    archs.dedup();
    let from = real
        .iter()
        .map(|d| format!("device {}: {}", d.ordinal, base_arch(&d.arch)))
        .collect::<Vec<_>>()
        .join(", ");
    (archs, from)
}

/// The loader with the install's library directories as runtime directories.
pub fn probe_loader(env: &EnvFacts) -> resolve::Loader {
    let mut roots: Vec<PathBuf> = ["ROCM_PATH", "DTK_HOME", "DTKROOT"]
        .iter()
        .filter_map(|v| env.var(v).map(PathBuf::from))
        .collect();
    roots.extend(
        ["/opt/dtk", "/opt/dtk/.hyhal", "/opt/hyhal", "/opt/rocm"]
            .iter()
            .map(PathBuf::from),
    );
    if let Ok(entries) = std::fs::read_dir("/opt") {
        let mut more: Vec<PathBuf> = entries
            .take(1000)
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("dtk-") || n.starts_with("rocm-"))
            })
            .collect();
        more.sort();
        roots.extend(more);
    }
    let ld = std::env::var_os("LD_LIBRARY_PATH").map(|v| v.to_string_lossy().into_owned());
    resolve::Loader::probe(ld.as_deref(), &roots)
}

/// The rows read from site-packages directories, with no interpreter: the packages, torch's
/// build, the pairings and the libraries.
pub fn stack_rows(ctx: &Context, sites: &[PathBuf], python_version: Option<&str>) -> Vec<Item> {
    stack_rows_and_build(ctx, sites, python_version).0
}

/// [`stack_rows`], and whether torch is a ROCm or DTK build.
fn stack_rows_and_build(
    ctx: &Context,
    sites: &[PathBuf],
    python_version: Option<&str>,
) -> (Vec<Item>, bool) {
    let mut rows = Vec::new();
    let (dists, problems) = dist::scan(sites);
    for problem in problems {
        rows.push(Item::warn(
            "site-packages",
            format!("cannot read {problem}"),
        ));
    }
    if dists.is_empty() {
        rows.push(Item::info(
            "packages",
            format!(
                "none of {} is installed in {}",
                dist::WATCHED.join(", "),
                sites
                    .iter()
                    .map(|s| s.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        ));
        return (rows, false);
    }
    rows.push(
        Item::info(
            "packages",
            dists
                .iter()
                .map(|d| format!("{} {}", d.name, d.version))
                .collect::<Vec<_>>()
                .join(", "),
        )
        .with_fact(
            "packages",
            dists
                .iter()
                .map(|d| serde_json::json!({"name": d.name, "version": d.version, "site": d.site.display().to_string()}))
                .collect::<Vec<_>>(),
        ),
    );
    let mut gpu_build = false;
    match dists.iter().find(|d| d.key == "torch") {
        None => rows.push(Item::info(stack::BUILD_ROW, "torch is not installed")),
        Some(torch) => match dist::torch_version_py(torch) {
            Ok(v) => {
                let (build, build_rows) = stack::build_rows(ctx, torch, &v);
                gpu_build = matches!(build, stack::Build::Rocm(_) | stack::Build::Dtk(_));
                rows.extend(build_rows);
            }
            Err(why) => rows.push(
                Item::fail(
                    stack::BUILD_ROW,
                    format!(
                        "torch {} is installed but its version.py cannot be read: {why}",
                        torch.version
                    ),
                )
                .with_hint("reinstall torch"),
            ),
        },
    }
    rows.extend(stack::dtk_tag_rows(ctx, &dists));
    rows.extend(stack::pairing_rows(&dists, python_version));
    for d in &dists {
        rows.extend(libs::rows(ctx, d, gpu_build));
    }
    (rows, gpu_build)
}

/// The name of the interpreter row.
pub const INTERPRETER_ROW: &str = "Python interpreter";

/// The whole section for this machine.
pub fn section(args: &PythonArgs, ctx: &Context, env_input: &envrows::EnvInput) -> Section {
    let mut section = Section::new(TITLE);
    let var = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
    let choice = if args.site_packages.is_empty() || args.python.is_some() {
        interp::choose(args.python.as_deref(), &var)
    } else {
        None
    };
    let mut sites = Vec::new();
    let mut version = None;
    let mut python_ok = None;
    match &choice {
        None if args.site_packages.is_empty() => section.push(Item::info(
            INTERPRETER_ROW,
            "no Python interpreter found (no --python, VIRTUAL_ENV, CONDA_PREFIX, nor python3 on PATH): nothing to check",
        )),
        None => {}
        Some(c) => match interp::query(&c.path, interp::QUERY_TIMEOUT) {
            Ok(facts) => {
                sites = dist::site_dirs(&facts.sys_path);
                section.push(
                    Item::info(
                        INTERPRETER_ROW,
                        format!(
                            "{} (from {}): Python {}; site-packages {}",
                            c.path.display(),
                            c.source,
                            facts.version,
                            if sites.is_empty() { "none".to_string() } else { sites.iter().map(|s| s.display().to_string()).collect::<Vec<_>>().join(", ") }
                        ),
                    )
                    .with_fact("path", c.path.display().to_string())
                    .with_fact("version", facts.version.clone()),
                );
                version = Some(facts.version);
                python_ok = Some(c.path.clone());
            }
            Err(why) => {
                let status = if c.source == "--python" { Status::Fail } else { Status::Warn };
                section.push(
                    Item::new(INTERPRETER_ROW, status, format!("{} (from {}) did not answer: {why}", c.path.display(), c.source))
                        .with_hint("pass the environment's interpreter with --python, or its site-packages with --site-packages"),
                );
            }
        },
    }
    for dir in &args.site_packages {
        if !sites.contains(dir) {
            sites.push(dir.clone());
        }
    }
    let mut gpu_build = false;
    if !sites.is_empty() {
        let (rows, gpu) = stack_rows_and_build(ctx, &sites, version.as_deref());
        section.items.extend(rows);
        gpu_build = gpu;
    }
    let env_input = envrows::EnvInput {
        miopen_used: gpu_build || ctx.amd_node().is_some(),
        ..env_input.clone()
    };
    section.items.extend(envrows::rows(&env_input));
    if args.python_import {
        section.push(match &python_ok {
            Some(python) => {
                interp::live_import(python, interp::IMPORT_TIMEOUT, ctx.amd_node().is_some())
            }
            None => Item::skipped(
                interp::IMPORT_ROW,
                "no interpreter answered: nothing to import torch with",
            ),
        });
    }
    section
}

/// The diagnosis row for a torch that cannot use this node's GPU.
pub fn diagnosis(section: &Section) -> Vec<Item> {
    section
        .items
        .iter()
        .filter(|i| i.name == stack::BUILD_ROW && i.status == Status::Fail)
        .map(|i| {
            let mut item = Item::fail(
                "PyTorch cannot use this GPU",
                format!("Python stack: torch build: {}", i.detail),
            );
            item.hint = i.hint.clone();
            item
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtk_versions_are_found_in_text() {
        assert_eq!(dtk_version_in("25.04.1\n").as_deref(), Some("25.04"));
        assert_eq!(dtk_version_in("DTK-24.04").as_deref(), Some("24.04"));
        assert_eq!(dtk_version_in("/opt/dtk-26.04").as_deref(), Some("26.04"));
        assert_eq!(dtk_version_in("5.2.21153"), None);
        assert_eq!(dtk_version_in("123.456"), None);
    }
}
