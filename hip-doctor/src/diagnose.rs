//! The facts the report is built from, and the diagnosis rules that turn them into advice.
//!
//! The rules are pure functions of plain data so they are tested on made-up machines (a DTK
//! node with a wrong group, a container without `/dev/kfd`, ...), not only on this one.

use super::env::{EnvFacts, KfdAccess, Visibility, DTK_ENV_SCRIPT, KFD, VISIBILITY_VARS};
use super::report::{Item, Section};

/// What loading the HIP runtime library found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibraryState {
    /// This build has no loader to ask (the piece has not landed).
    NotInBuild,
    /// No candidate file could be loaded.
    NotFound {
        /// Every path or name tried, in order.
        tried: Vec<String>,
        /// The loader's message.
        message: String,
    },
    /// A file was found but is not a usable HIP runtime (wrong file, missing symbols, ...).
    Unusable {
        /// The file.
        path: String,
        /// What was wrong.
        message: String,
    },
    /// Loaded.
    Loaded {
        /// Full path of the file loaded.
        path: String,
        /// Decoded runtime version, e.g. `5.2.21153`.
        version: String,
        /// `DTK` or `ROCm`.
        flavour: String,
    },
}

/// One device as the runtime describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Ordinal as seen by this process (after `HIP_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// Marketing name.
    pub name: String,
    /// `gcnArchName`, possibly with feature flags (`gfx906:sramecc+:xnack-`).
    pub arch: String,
    /// Compute units.
    pub compute_units: u32,
    /// Wavefront size (64 on every DCU).
    pub wavefront: u32,
    /// Total memory in bytes.
    pub total_memory: u64,
}

impl DeviceFacts {
    /// Whether this is hip-emu's CPU emulation (its name says so), not a GPU.
    pub fn is_emulated(&self) -> bool {
        self.name.contains(hip_rt::EMULATED_NAME_MARK)
    }
}

impl DeviceState {
    /// Whether devices were found and every one is emulated: the runtime is hip-emu, which
    /// needs no GPU driver (`/dev/kfd`).
    pub fn all_emulated(&self) -> bool {
        matches!(self, DeviceState::Found(list) if !list.is_empty() && list.iter().all(DeviceFacts::is_emulated))
    }
}

/// What asking the runtime for devices found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceState {
    /// Not asked; the text says why (no library, piece not in this build).
    NotChecked(String),
    /// The runtime reports no device; its message.
    NoDevice(String),
    /// Another error from the runtime.
    Error(String),
    /// Devices found.
    Found(Vec<DeviceFacts>),
}

/// What the build embedded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelState {
    /// This build has no kernel manifest to read (the piece has not landed).
    NotInBuild,
    /// Built without hipcc: no kernels embedded; the text says why.
    NotBuilt(String),
    /// Code objects embedded for these archs.
    Built {
        /// Archs compiled (`gfx906`, ...).
        archs: Vec<String>,
    },
}

/// The arch without feature flags: `gfx906:sramecc+:xnack-` → `gfx906`.
pub fn base_arch(gcn_arch_name: &str) -> &str {
    gcn_arch_name
        .split(':')
        .next()
        .unwrap_or(gcn_arch_name)
        .trim()
}

/// Archs that upstream clang (e.g. Debian's hipcc) cannot compile; they need DTK's compiler.
pub fn needs_dtk_compiler(arch: &str) -> bool {
    !matches!(
        arch,
        "gfx900" | "gfx906" | "gfx908" | "gfx90a" | "gfx940" | "gfx941" | "gfx942"
    )
}

/// Everything the diagnosis looks at.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// Environment.
    pub env: &'a EnvFacts,
    /// HIP runtime library.
    pub library: &'a LibraryState,
    /// Devices.
    pub devices: &'a DeviceState,
    /// Embedded kernels.
    pub kernels: &'a KernelState,
}

/// Applies every rule; a section with one PASS row when nothing is wrong.
pub fn diagnose(facts: Facts<'_>) -> Section {
    let mut section = Section::new("Diagnosis");
    let rules: [fn(Facts<'_>) -> Vec<Item>; 6] = [
        library_rule,
        kfd_rule,
        visibility_rule,
        no_device_rule,
        arch_rule,
        kernels_rule,
    ];
    for rule in rules {
        for item in rule(facts) {
            section.push(item);
        }
    }
    if section.items.is_empty() {
        section.push(Item::pass("no problems found", "every rule passed"));
    }
    section
}

fn env_script_hint(env: &EnvFacts) -> String {
    if env.dtk_env_script {
        format!("source {DTK_ENV_SCRIPT} (it sets ROCM_PATH and LD_LIBRARY_PATH), then run again")
    } else {
        "on DTK: source /opt/dtk/env.sh; on ROCm: set ROCM_PATH (e.g. /opt/rocm)".to_string()
    }
}

fn library_rule(facts: Facts<'_>) -> Vec<Item> {
    let hint_tail =
        "or point HIPK_HIP_LIBRARY at the file (libgalaxyhip.so.5 on DTK, libamdhip64.so on ROCm)";
    match facts.library {
        LibraryState::NotFound { tried, message } => {
            // What is wrong with the file HIPK_HIP_LIBRARY names, if it is not a regular file
            // (missing, a directory, a device, a symbolic link loop).
            let override_missing = facts
                .env
                .hipk_vars
                .iter()
                .find(|(k, _)| k == "HIPK_HIP_LIBRARY")
                .and_then(|(_, v)| {
                    hip_sys::search::path_problem(std::path::Path::new(v)).map(|why| (v, why))
                });
            let mut detail = match &override_missing {
                Some((file, why)) => format!("HIPK_HIP_LIBRARY names {file}, which {why}"),
                None => format!("no HIP runtime could be loaded: {message}"),
            };
            if !tried.is_empty() {
                detail.push_str("\nlooked in:");
                for path in tried {
                    detail.push_str("\n  ");
                    detail.push_str(path);
                }
            }
            let hint = match override_missing {
                Some(_) => {
                    "fix the HIPK_HIP_LIBRARY path, or unset it to use the search".to_string()
                }
                None => format!("{}, {hint_tail}", env_script_hint(facts.env)),
            };
            vec![Item::fail("HIP runtime not found", detail).with_hint(hint)]
        }
        LibraryState::Unusable { path, message } => {
            let detail = if message.contains(path.as_str()) {
                message.clone()
            } else {
                format!("{path}: {message}")
            };
            let item = Item::fail("HIP runtime unusable", detail.clone());
            // hip-sys's message names the fix when the override variable caused it.
            if detail.contains("HIPK_HIP_LIBRARY") {
                vec![item]
            } else {
                vec![item.with_hint(
                    "point HIPK_HIP_LIBRARY at the HIP runtime (libgalaxyhip.so.5 on DTK, \
                     libamdhip64.so on ROCm), or unset it to search the usual places",
                )]
            }
        }
        LibraryState::NotInBuild | LibraryState::Loaded { .. } => Vec::new(),
    }
}

/// How to run without a GPU, for the hints of the no-device rules.
const NO_GPU: &str = "run on hip-emu, the CPU emulator of a HIP device in this workspace \
     (`cargo build -p hip-emu`, then HIPK_HIP_LIBRARY=<full path of target/debug/libhip_emu.so>)";

fn kfd_rule(facts: Facts<'_>) -> Vec<Item> {
    let env = facts.env;
    if facts.devices.all_emulated() {
        return Vec::new(); // hip-emu runs on the CPU: no driver is needed
    }
    match &env.kfd {
        KfdAccess::Ok => Vec::new(),
        KfdAccess::Missing => vec![Item::fail(
            format!("{KFD} missing"),
            "no GPU kernel driver is loaded, or this container was started without the device nodes",
        )
        .with_hint(format!(
            "on the host: check the driver (/opt/hyhal/bin/hy-smi on DTK, rocm-smi or `lsmod | grep amdgpu` on ROCm);\n\
             in a container: pass --device=/dev/kfd --device=/dev/dri (and --device=/dev/mkfd on DTK);\n\
             no GPU here: {NO_GPU}",
        ))],
        KfdAccess::NotPermitted { owner_gid } => {
            let user = env.user.clone().unwrap_or_else(|| "$USER".into());
            let group = owner_gid.and_then(|g| env.group_name(g)).unwrap_or("render").to_string();
            let listed = env.groups.iter().find(|g| g.name == group).is_some_and(|g| env.listed_but_not_active(g));
            let hint = if listed {
                format!("{user} is listed in group {group} but this session predates it: log out and in (or `newgrp {group}`)")
            } else {
                format!("sudo usermod -aG render,video {user}, then log out and in")
            };
            vec![Item::fail(format!("{KFD} not permitted"), format!("{KFD} is owned by group {group}; {user} may not open it"))
                .with_hint(hint)]
        }
        KfdAccess::Error(e) => vec![Item::fail(format!("{KFD} unusable"), e.clone())
            .with_hint("check the driver's state (dmesg, /opt/hyhal/bin/hy-smi on DTK, rocm-smi on ROCm)")],
    }
}

fn visibility_rule(facts: Facts<'_>) -> Vec<Item> {
    VISIBILITY_VARS
        .iter()
        .filter_map(|name| {
            let value = facts.env.var(name)?;
            match super::env::parse_visible_devices(value) {
                Visibility::HidesAll(why) => Some(
                    Item::fail(
                        format!("{name} hides every device"),
                        format!("{name}={value:?}: {why}"),
                    )
                    .with_hint(format!(
                        "unset {name}, or set it to device indices such as 0 or 0,1"
                    )),
                ),
                _ => None,
            }
        })
        .collect()
}

fn no_device_rule(facts: Facts<'_>) -> Vec<Item> {
    let DeviceState::NoDevice(message) = facts.devices else {
        return Vec::new();
    };
    // When a more specific rule already explains it, do not repeat generic advice.
    let explained = !matches!(facts.env.kfd, KfdAccess::Ok) || !visibility_rule(facts).is_empty();
    if explained {
        return Vec::new();
    }
    vec![
        Item::fail("no device visible", message.clone()).with_hint(format!(
        "check `/opt/hyhal/bin/hy-smi` (DTK; not on PATH unless env.sh was sourced) or `rocm-smi` \
         lists the card, that the driver matches the DTK version, and that no *_VISIBLE_DEVICES \
         variable excludes it; no GPU here: {NO_GPU}"
    )),
    ]
}

fn arch_rule(facts: Facts<'_>) -> Vec<Item> {
    let (DeviceState::Found(devices), KernelState::Built { archs }) =
        (facts.devices, facts.kernels)
    else {
        return Vec::new();
    };
    devices
        .iter()
        .filter(|d| !archs.iter().any(|a| a == base_arch(&d.arch)))
        .map(|d| {
            let arch = base_arch(&d.arch);
            let compiler = if needs_dtk_compiler(arch) {
                format!(
                    " ({arch} needs DTK's hipcc: {})",
                    env_script_hint(facts.env)
                )
            } else {
                String::new()
            };
            Item::fail(
                format!("no code object for {arch}"),
                format!(
                    "device {} ({}) is {arch}; this build embeds {}",
                    d.ordinal,
                    d.name,
                    archs.join(", ")
                ),
            )
            .with_hint(format!(
                "rebuild with HIPK_ARCH={arch} cargo build --release{compiler}"
            ))
        })
        .collect()
}

fn kernels_rule(facts: Facts<'_>) -> Vec<Item> {
    match facts.kernels {
        KernelState::NotBuilt(why) => vec![Item::warn("kernels not built", why.clone()).with_hint(
            "install hipcc (DTK: source /opt/dtk/env.sh; Debian: apt-get install hipcc) or set HIPK_HIPCC, then rebuild",
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::parse_group_file;
    use crate::report::Status;

    fn env() -> EnvFacts {
        EnvFacts {
            vars: vec![("HIP_VISIBLE_DEVICES".into(), None)],
            hipk_vars: Vec::new(),
            not_utf8: Vec::new(),
            dtk_version: None,
            dtk_version_paths: Vec::new(),
            dtk_env_script: true,
            kfd: KfdAccess::Ok,
            uid: Some(1000),
            user: Some("alice".into()),
            process_gids: vec![1000],
            groups: parse_group_file("video:x:44:\nrender:x:109:alice\n"),
        }
    }

    fn loaded() -> LibraryState {
        LibraryState::Loaded {
            path: "/opt/dtk/hip/lib/libgalaxyhip.so.5".into(),
            version: "6.3.0".into(),
            flavour: "DTK".into(),
        }
    }

    fn device(arch: &str) -> DeviceFacts {
        DeviceFacts {
            ordinal: 0,
            name: "K100_AI".into(),
            arch: arch.into(),
            compute_units: 120,
            wavefront: 64,
            total_memory: 64 << 30,
        }
    }

    fn run(
        env: &EnvFacts,
        library: &LibraryState,
        devices: &DeviceState,
        kernels: &KernelState,
    ) -> Section {
        diagnose(Facts {
            env,
            library,
            devices,
            kernels,
        })
    }

    fn names(section: &Section) -> Vec<&str> {
        section.items.iter().map(|i| i.name.as_str()).collect()
    }

    #[test]
    fn healthy_machine_has_no_problems() {
        let kernels = KernelState::Built {
            archs: vec!["gfx928".into()],
        };
        let s = run(
            &env(),
            &loaded(),
            &DeviceState::Found(vec![device("gfx928:sramecc+:xnack-")]),
            &kernels,
        );
        assert_eq!(names(&s), vec!["no problems found"]);
        assert_eq!(s.items[0].status, Status::Pass);
    }

    #[test]
    fn library_not_found_lists_paths_and_env_script() {
        let lib = LibraryState::NotFound {
            tried: vec![
                "/opt/dtk/hip/lib/libgalaxyhip.so.5".into(),
                "libamdhip64.so".into(),
            ],
            message: "none loaded".into(),
        };
        let s = run(
            &env(),
            &lib,
            &DeviceState::NotChecked("no library".into()),
            &KernelState::NotInBuild,
        );
        assert_eq!(names(&s), vec!["HIP runtime not found"]);
        let item = &s.items[0];
        assert!(
            item.detail
                .contains("\n  /opt/dtk/hip/lib/libgalaxyhip.so.5\n  libamdhip64.so"),
            "{}",
            item.detail
        );
        assert!(item
            .hint
            .as_deref()
            .unwrap_or("")
            .contains("source /opt/dtk/env.sh"));
    }

    #[test]
    fn missing_override_file_is_named() {
        let mut e = env();
        e.hipk_vars
            .push(("HIPK_HIP_LIBRARY".into(), "/nope/libamdhip64.so".into()));
        let lib = LibraryState::NotFound {
            tried: vec!["/nope/libamdhip64.so".into()],
            message: "x".into(),
        };
        let s = run(
            &e,
            &lib,
            &DeviceState::NotChecked(String::new()),
            &KernelState::NotInBuild,
        );
        assert!(s.items[0]
            .detail
            .starts_with("HIPK_HIP_LIBRARY names /nope/libamdhip64.so, which does not exist"));
    }

    #[test]
    fn an_override_that_is_not_a_file_says_what_it_is() {
        for (file, why) in [
            (
                "/dev/null",
                "which is a character device, not a library file",
            ),
            ("/", "which is a directory, not a library file"),
        ] {
            let mut e = env();
            e.hipk_vars.push(("HIPK_HIP_LIBRARY".into(), file.into()));
            let lib = LibraryState::NotFound {
                tried: vec![file.into()],
                message: "x".into(),
            };
            let s = run(
                &e,
                &lib,
                &DeviceState::NotChecked(String::new()),
                &KernelState::NotInBuild,
            );
            let detail = &s.items[0].detail;
            assert!(
                detail.starts_with(&format!("HIPK_HIP_LIBRARY names {file}, {why}")),
                "{detail}"
            );
        }
    }

    #[test]
    fn kfd_missing_and_not_permitted() {
        let mut e = env();
        e.kfd = KfdAccess::Missing;
        let s = run(
            &e,
            &loaded(),
            &DeviceState::NoDevice("no device".into()),
            &KernelState::NotInBuild,
        );
        // The specific rule explains it; the generic no-device rule stays quiet.
        assert_eq!(names(&s), vec!["/dev/kfd missing"]);
        assert!(s.items[0]
            .hint
            .as_deref()
            .unwrap_or("")
            .contains("--device=/dev/kfd"));
        assert!(s.items[0].hint.as_deref().unwrap_or("").contains("hip-emu"));

        e.kfd = KfdAccess::NotPermitted {
            owner_gid: Some(109),
        };
        let s = run(
            &e,
            &loaded(),
            &DeviceState::NoDevice("no device".into()),
            &KernelState::NotInBuild,
        );
        assert_eq!(names(&s), vec!["/dev/kfd not permitted"]);
        let hint = s.items[0].hint.clone().unwrap_or_default();
        assert!(
            hint.contains("newgrp render"),
            "listed in /etc/group but not active: {hint}"
        );

        e.groups = parse_group_file("render:x:109:\n");
        let s = run(
            &e,
            &loaded(),
            &DeviceState::NoDevice("no device".into()),
            &KernelState::NotInBuild,
        );
        assert!(s.items[0]
            .hint
            .as_deref()
            .unwrap_or("")
            .contains("usermod -aG render,video alice"));
    }

    #[test]
    fn visibility_hiding_everything() {
        let mut e = env();
        e.vars = vec![("HIP_VISIBLE_DEVICES".into(), Some("-1".into()))];
        let s = run(
            &e,
            &loaded(),
            &DeviceState::NoDevice("no device".into()),
            &KernelState::NotInBuild,
        );
        assert_eq!(names(&s), vec!["HIP_VISIBLE_DEVICES hides every device"]);
        e.vars = vec![("HIP_VISIBLE_DEVICES".into(), Some("1".into()))];
        let s = run(
            &e,
            &loaded(),
            &DeviceState::NoDevice("no device".into()),
            &KernelState::NotInBuild,
        );
        assert_eq!(names(&s), vec!["no device visible"]);
        // Without a GPU, the hint names hip-emu and how to use it.
        let hint = s.items[0].hint.clone().unwrap_or_default();
        assert!(
            hint.contains("hip-emu") && hint.contains("HIPK_HIP_LIBRARY"),
            "{hint}"
        );
    }

    #[test]
    fn missing_arch_names_the_build_variable() {
        let kernels = KernelState::Built {
            archs: vec!["gfx906".into()],
        };
        let s = run(
            &env(),
            &loaded(),
            &DeviceState::Found(vec![device("gfx928:sramecc+:xnack-")]),
            &kernels,
        );
        assert_eq!(names(&s), vec!["no code object for gfx928"]);
        let hint = s.items[0].hint.clone().unwrap_or_default();
        assert!(
            hint.starts_with("rebuild with HIPK_ARCH=gfx928 cargo build --release"),
            "{hint}"
        );
        assert!(hint.contains("DTK's hipcc"), "{hint}");
        let s = run(
            &env(),
            &loaded(),
            &DeviceState::Found(vec![device("gfx906")]),
            &KernelState::Built {
                archs: vec!["gfx928".into()],
            },
        );
        assert!(!s.items[0]
            .hint
            .clone()
            .unwrap_or_default()
            .contains("DTK's hipcc"));
    }

    #[test]
    fn base_arch_strips_features() {
        assert_eq!(base_arch("gfx906:sramecc+:xnack-"), "gfx906");
        assert_eq!(base_arch("gfx936"), "gfx936");
        assert!(needs_dtk_compiler("gfx936"));
        assert!(!needs_dtk_compiler("gfx906"));
    }
}
