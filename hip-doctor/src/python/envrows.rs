//! The environment rows of the Python stack: `HSA_OVERRIDE_GFX_VERSION`, DTK's variables set
//! only in `/etc/profile.d`, and MIOpen's user database and kernel cache (writable, local).
//!
//! MIOpen's locations, from its documentation: the user database (tuning results) in
//! `$HOME/.config/miopen`, moved with `MIOPEN_USER_DB_PATH`; the kernel cache (compiled kernels)
//! in `$HOME/.cache/miopen`, moved with `MIOPEN_CUSTOM_CACHE_DIR`, turned off with
//! `MIOPEN_DISABLE_CACHE`. PyTorch on ROCm/DTK writes both through MIOpen.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::report::{Item, Status};

/// The name of the override row.
pub const OVERRIDE_ROW: &str = "HSA_OVERRIDE_GFX_VERSION";

/// Filesystems whose locking and latency make a cache on them slow or unsafe to share.
const NETWORK_FS: [&str; 14] = [
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "glusterfs",
    "fuse.sshfs",
    "fuse.glusterfs",
    "fuse.juicefs",
    "9p",
];

/// What these rows read: variables, the process's identity, the mount table, profile scripts.
#[derive(Debug, Clone, Default)]
pub struct EnvInput {
    /// Variables (name, value) of this process that the rows read.
    pub vars: Vec<(String, String)>,
    /// Real uid (0 is root).
    pub uid: Option<u32>,
    /// The process's groups.
    pub gids: Vec<u32>,
    /// `/proc/self/mounts` (or a test's).
    pub mounts: String,
    /// `(file, text)` of each `/etc/profile.d/*.sh`.
    pub profile_scripts: Vec<(PathBuf, String)>,
    /// Whether MIOpen will run here: the node's GPU is AMD/Hygon, or torch is a ROCm/DTK build.
    /// When not, a MIOpen problem is INFO (it would not slow anything down here).
    pub miopen_used: bool,
}

impl EnvInput {
    fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }
}

/// Every row.
pub fn rows(input: &EnvInput) -> Vec<Item> {
    let mut rows = Vec::new();
    rows.extend(override_row(input));
    rows.extend(profile_row(input));
    let miopen = miopen_rows(input);
    if input.miopen_used {
        rows.extend(miopen);
    } else {
        rows.extend(miopen.into_iter().map(|mut item| {
            if matches!(item.status, Status::Fail | Status::Warn) {
                item.detail = format!(
                    "{} [not needed here: no AMD/Hygon GPU and no ROCm/DTK torch]",
                    item.detail
                );
                item.status = Status::Info;
            }
            item
        }));
    }
    rows
}

fn override_row(input: &EnvInput) -> Option<Item> {
    let value = input.var(OVERRIDE_ROW)?;
    Some(
        Item::warn(
            OVERRIDE_ROW,
            format!(
                "HSA_OVERRIDE_GFX_VERSION={value}: the HSA runtime reports every GPU as gfx{} to the programs it runs, so code built for that arch is loaded on a GPU that may not be it; this hides hipErrorNoBinaryForGpu instead of fixing it, and can give wrong results or hangs",
                value.split('.').map(|p| p.trim()).collect::<Vec<_>>().join("")
            ),
        )
        .with_hint("unset it and install libraries built for this GPU's arch (the library rows name what is missing)"),
    )
}

/// DTK's variables: set by its env.sh.
const DTK_VARS: [&str; 4] = ["ROCM_PATH", "DTK_HOME", "HIP_PATH", "DTKROOT"];

fn profile_row(input: &EnvInput) -> Option<Item> {
    if DTK_VARS.iter().any(|v| input.var(v).is_some()) {
        return None;
    }
    let (file, _) = input.profile_scripts.iter().find(|(_, text)| {
        text.lines().any(|l| {
            let l = l.trim_start();
            !l.starts_with('#')
                && (DTK_VARS.iter().any(|v| l.contains(v)) || l.contains("dtk/env.sh"))
        })
    })?;
    Some(
        Item::warn(
            "DTK environment",
            format!(
                "DTK's variables (ROCM_PATH, DTK_HOME, ...) are not set here, but {} sets them: only login shells read /etc/profile.d, so batch jobs and some schedulers run without them",
                file.display()
            ),
        )
        .with_hint("source /opt/dtk/env.sh in the job script itself (or in the container's entry point)"),
    )
}

fn miopen_rows(input: &EnvInput) -> Vec<Item> {
    let home = input.var("HOME").map(PathBuf::from);
    let mut rows = Vec::new();
    let disabled = input
        .var("MIOPEN_DISABLE_CACHE")
        .is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "on" | "yes"));
    for (what, var, default) in [
        (
            "MIOpen user database",
            "MIOPEN_USER_DB_PATH",
            ".config/miopen",
        ),
        (
            "MIOpen kernel cache",
            "MIOPEN_CUSTOM_CACHE_DIR",
            ".cache/miopen",
        ),
    ] {
        let (dir, from) = match (input.var(var), &home) {
            (Some(v), _) => (PathBuf::from(v), var.to_string()),
            (None, Some(h)) => (h.join(default), format!("default $HOME/{default}")),
            (None, None) => {
                rows.push(
                    Item::fail(
                        what,
                        format!("{var} and HOME are both unset: MIOpen has nowhere to write"),
                    )
                    .with_hint(format!("set {var} to a writable local directory")),
                );
                continue;
            }
        };
        if disabled && var == "MIOPEN_CUSTOM_CACHE_DIR" {
            rows.push(
                Item::warn(
                    what,
                    "MIOPEN_DISABLE_CACHE is set: every run compiles its kernels again",
                )
                .with_hint("unset MIOPEN_DISABLE_CACHE"),
            );
            continue;
        }
        rows.push(location_row(input, what, var, &dir, &from));
    }
    rows
}

/// Whether `dir` (or, when it does not exist yet, the nearest directory above it, where it
/// would be created) is writable and local.
fn location_row(input: &EnvInput, what: &str, var: &str, dir: &Path, from: &str) -> Item {
    let existing = dir
        .ancestors()
        .find(|a| a.exists())
        .unwrap_or(Path::new("/"));
    let shown = if existing == dir {
        format!("{} ({from})", dir.display())
    } else {
        format!(
            "{} ({from}; does not exist yet, would be created in {})",
            dir.display(),
            existing.display()
        )
    };
    let mount = mount_of(&input.mounts, existing);
    let read_only = mount.as_ref().is_some_and(|m| m.read_only);
    let writable = !read_only && writable_by(existing, input.uid, &input.gids);
    let item = if !writable {
        Item::fail(
            what,
            format!("{shown} is not writable by this user{}: every run compiles its kernels again (the first iterations are very slow)", if read_only { " (read-only filesystem)" } else { "" }),
        )
        .with_hint(format!("set {var} to a writable local directory (e.g. under /tmp or a local scratch disk)"))
    } else if let Some(m) = mount
        .as_ref()
        .filter(|m| NETWORK_FS.contains(&m.fstype.as_str()))
    {
        Item::warn(
            what,
            format!("{shown} is on a network filesystem ({} at {}): its database locks are slow there and break when several nodes share it", m.fstype, m.point),
        )
        .with_hint(format!("set {var} to a node-local directory"))
    } else {
        Item::pass(
            what,
            format!(
                "{shown} is writable{}",
                mount
                    .map(|m| format!(" ({})", m.fstype))
                    .unwrap_or_default()
            ),
        )
    };
    item.with_fact("path", dir.display().to_string())
}

/// One line of the mount table.
struct Mount {
    point: String,
    fstype: String,
    read_only: bool,
}

/// The mount holding `path`: the longest mount point that is a prefix of it.
fn mount_of(table: &str, path: &Path) -> Option<Mount> {
    table
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_dev, point, fstype, opts) = (f.next()?, f.next()?, f.next()?, f.next()?);
            let point = point.replace("\\040", " ");
            path.starts_with(&point).then(|| Mount {
                read_only: opts.split(',').any(|o| o == "ro"),
                point,
                fstype: fstype.to_string(),
            })
        })
        .max_by_key(|m| m.point.len())
}

/// Whether the mode bits let `uid` (with `gids`) write `path`; root always may.
fn writable_by(path: &Path, uid: Option<u32>, gids: &[u32]) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    let mode = meta.mode();
    match uid {
        Some(0) => true,
        Some(u) if u == meta.uid() => mode & 0o200 != 0,
        _ if gids.contains(&meta.gid()) => mode & 0o020 != 0,
        _ => mode & 0o002 != 0,
    }
}

/// This process's input.
pub fn probe(env: &crate::env::EnvFacts) -> EnvInput {
    let names = [
        OVERRIDE_ROW,
        "HOME",
        "MIOPEN_USER_DB_PATH",
        "MIOPEN_CUSTOM_CACHE_DIR",
        "MIOPEN_DISABLE_CACHE",
    ];
    let mut vars: Vec<(String, String)> = names
        .iter()
        .chain(DTK_VARS.iter())
        .filter_map(|n| {
            Some((
                n.to_string(),
                std::env::var_os(n)?.to_string_lossy().into_owned(),
            ))
        })
        .collect();
    vars.dedup();
    let mut profile_scripts = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/etc/profile.d") {
        for p in entries.take(1000).filter_map(Result::ok).map(|e| e.path()) {
            if p.extension().is_some_and(|x| x == "sh") {
                if let Ok(text) = super::dist::read_capped(&p, 256 * 1024) {
                    profile_scripts.push((p, text));
                }
            }
        }
    }
    profile_scripts.sort();
    EnvInput {
        vars,
        uid: env.uid,
        gids: env.process_gids.clone(),
        mounts: super::dist::read_capped(Path::new("/proc/self/mounts"), 4 << 20)
            .unwrap_or_default(),
        profile_scripts,
        miopen_used: false,
    }
}
