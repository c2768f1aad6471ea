//! The Environment section: variables, the DTK version file, `/dev/kfd`, and the user's groups.
//!
//! Probing ([`EnvFacts::probe`]) is separate from parsing (pure functions, unit-tested) and from
//! rendering ([`EnvFacts::section`]), so the diagnosis rules can be tested on made-up facts.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::report::{Item, Section};
use crate::report::Json;

/// Variables that steer a HIP / DTK install, shown in the report whether set or not.
pub const STACK_VARS: [&str; 5] = ["ROCM_PATH", "HIP_PATH", "DTK_HOME", "DTKROOT", "HSA_PATH"];

/// Variables that select devices.
pub const VISIBILITY_VARS: [&str; 3] = [
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
];

/// The DTK version file of the default install.
pub const DTK_VERSION_FILE: &str = "/opt/dtk/.dtk_version";

/// The DTK environment script users source.
pub const DTK_ENV_SCRIPT: &str = "/opt/dtk/env.sh";

/// The HSA kernel driver's device node; every HIP device needs it.
pub const KFD: &str = "/dev/kfd";

/// What opening `/dev/kfd` for read and write found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KfdAccess {
    /// The node exists and opened read/write.
    Ok,
    /// No such node: no driver loaded, or a container started without the device.
    Missing,
    /// The node exists but this process may not open it; `owner_gid` is the node's group.
    NotPermitted {
        /// Group that owns the node, when it could be read.
        owner_gid: Option<u32>,
    },
    /// Any other error, as text.
    Error(String),
}

/// One line of `/etc/group`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    /// Group name.
    pub name: String,
    /// Group id.
    pub gid: u32,
    /// Users listed as members.
    pub members: Vec<String>,
}

/// How a `*_VISIBLE_DEVICES` value selects devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    /// Not set: every device is visible.
    Unset,
    /// Selects these entries (parsing stops at the first invalid entry, as the runtimes do).
    Selects(Vec<String>),
    /// Hides every device; the text says why.
    HidesAll(String),
}

/// Everything the Environment section and the diagnosis need, probed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvFacts {
    /// `(name, value)` for [`STACK_VARS`] then [`VISIBILITY_VARS`].
    pub vars: Vec<(String, Option<String>)>,
    /// Every `HIPK_*` variable that is set (a value that is not UTF-8 shown lossily).
    pub hipk_vars: Vec<(String, String)>,
    /// Every variable whose name or value is not valid UTF-8, shown lossily (U+FFFD for each
    /// invalid byte).
    pub not_utf8: Vec<(String, String)>,
    /// The first DTK version file found and its trimmed contents; `None` if none was found.
    pub dtk_version: Option<(PathBuf, String)>,
    /// Version files looked for.
    pub dtk_version_paths: Vec<PathBuf>,
    /// Whether [`DTK_ENV_SCRIPT`] exists.
    pub dtk_env_script: bool,
    /// Result of opening `/dev/kfd`.
    pub kfd: KfdAccess,
    /// Real uid of this process.
    pub uid: Option<u32>,
    /// User name for `uid` from `/etc/passwd`.
    pub user: Option<String>,
    /// Groups this process has: primary (real and effective) and supplementary.
    pub process_gids: Vec<u32>,
    /// `/etc/group`, parsed.
    pub groups: Vec<GroupEntry>,
}

impl EnvFacts {
    /// Reads the environment, files and device node of this machine.
    pub fn probe() -> EnvFacts {
        // `std::env::var(s)` fail (or panic) on a value that is not UTF-8: read raw values and
        // show them lossily, recording which ones were not text.
        let var = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        let vars = STACK_VARS
            .iter()
            .chain(VISIBILITY_VARS.iter())
            .map(|n| (n.to_string(), var(n)))
            .collect();
        let mut hipk_vars = Vec::new();
        let mut not_utf8 = Vec::new();
        for (name, value) in std::env::vars_os() {
            let text = (name.to_str().is_some(), value.to_str().is_some());
            let (name, value) = (
                name.to_string_lossy().into_owned(),
                value.to_string_lossy().into_owned(),
            );
            if text != (true, true) {
                not_utf8.push((name.clone(), value.clone()));
            }
            if name.starts_with("HIPK_") {
                hipk_vars.push((name, value));
            }
        }
        hipk_vars.sort();
        not_utf8.sort();

        let mut dtk_version_paths = vec![PathBuf::from(DTK_VERSION_FILE)];
        for root in ["DTK_HOME", "ROCM_PATH", "DTKROOT"]
            .iter()
            .filter_map(std::env::var_os)
        {
            let p = Path::new(&root).join(".dtk_version");
            if !dtk_version_paths.contains(&p) {
                dtk_version_paths.push(p);
            }
        }
        let dtk_version = dtk_version_paths
            .iter()
            .find_map(|p| read_small_text(p).map(|text| (p.clone(), text.trim().to_string())));

        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let uid = parse_status_ids(&status, "Uid:").first().copied();
        let mut process_gids = parse_status_ids(&status, "Gid:");
        process_gids.truncate(2); // real, effective
        process_gids.extend(parse_status_ids(&status, "Groups:"));
        process_gids.sort_unstable();
        process_gids.dedup();
        let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
        let user = uid
            .and_then(|u| user_name(&passwd, u))
            .or_else(|| var("USER"));

        EnvFacts {
            vars,
            hipk_vars,
            not_utf8,
            dtk_version,
            dtk_version_paths,
            dtk_env_script: Path::new(DTK_ENV_SCRIPT).exists(),
            kfd: probe_kfd(Path::new(KFD)),
            uid,
            user,
            process_gids,
            groups: parse_group_file(&std::fs::read_to_string("/etc/group").unwrap_or_default()),
        }
    }

    /// The value of a variable recorded in [`EnvFacts::vars`].
    pub fn var(&self, name: &str) -> Option<&str> {
        self.vars
            .iter()
            .find(|(k, _)| k == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// The name of group `gid`, if `/etc/group` has it.
    pub fn group_name(&self, gid: u32) -> Option<&str> {
        self.groups
            .iter()
            .find(|g| g.gid == gid)
            .map(|g| g.name.as_str())
    }

    /// Whether `/etc/group` lists the user in `group` but this process lacks it (added to the
    /// group without logging in again).
    pub fn listed_but_not_active(&self, group: &GroupEntry) -> bool {
        let listed = self
            .user
            .as_ref()
            .is_some_and(|u| group.members.iter().any(|m| m == u));
        listed && !self.process_gids.contains(&group.gid)
    }

    /// Renders the Environment rows (the HIP library rows are added by the caller).
    pub fn section(&self) -> Section {
        let mut section = Section::new("Environment");
        let not_text = |name: &str| self.not_utf8.iter().any(|(n, _)| n == name);
        for (name, value) in &self.vars {
            if !not_text(name) {
                section.push(var_item(name, value.as_deref()));
            }
        }
        for (name, value) in &self.hipk_vars {
            if !not_text(name) {
                section.push(Item::info(name.as_str(), value.as_str()));
            }
        }
        for (name, value) in &self.not_utf8 {
            section.push(Item::warn(
                name.as_str(),
                format!("{value:?} is not valid UTF-8 (shown with U+FFFD for each invalid byte)"),
            ));
        }
        section.push(match &self.dtk_version {
            Some((path, text)) => {
                Item::info("DTK version", format!("{text} (from {})", path.display()))
                    .with_fact("dtk_version", Json::from(text.as_str()))
                    .with_fact("path", Json::from(path.display().to_string()))
            }
            None => Item::info(
                "DTK version",
                format!(
                    "no version file at {} (upstream ROCm, or no DTK install)",
                    join_paths(&self.dtk_version_paths)
                ),
            ),
        });
        section.push(if self.dtk_env_script {
            Item::info("DTK env script", format!("{DTK_ENV_SCRIPT} present"))
        } else {
            Item::info("DTK env script", format!("{DTK_ENV_SCRIPT} not present"))
        });
        section.push(self.kfd_item());
        section.push(self.groups_item());
        section
    }

    fn kfd_item(&self) -> Item {
        match &self.kfd {
            KfdAccess::Ok => Item::pass(KFD, "present, opens read/write"),
            KfdAccess::Missing => Item::fail(
                KFD,
                "missing (no GPU kernel driver, or not passed into this container)",
            ),
            KfdAccess::NotPermitted { owner_gid } => {
                let owner = owner_gid
                    .map(|g| self.group_label(g))
                    .unwrap_or_else(|| "unknown group".into());
                Item::fail(
                    KFD,
                    format!("present but this user may not open it (owned by group {owner})"),
                )
            }
            KfdAccess::Error(e) => Item::fail(KFD, format!("cannot open: {e}")),
        }
    }

    fn group_label(&self, gid: u32) -> String {
        match self.group_name(gid) {
            Some(name) => format!("{name} (gid {gid})"),
            None => format!("gid {gid}"),
        }
    }

    fn groups_item(&self) -> Item {
        let user = self.user.clone().unwrap_or_else(|| "this user".into());
        let mut parts = Vec::new();
        for name in ["render", "video"] {
            let Some(group) = self.groups.iter().find(|g| g.name == name) else {
                parts.push(format!("{name}: no such group"));
                continue;
            };
            let state = if self.process_gids.contains(&group.gid) {
                "member".to_string()
            } else if self.listed_but_not_active(group) {
                "listed in /etc/group but not active in this session (log in again)".to_string()
            } else {
                "not a member".to_string()
            };
            parts.push(format!("{name}: {state}"));
        }
        let root = if self.uid == Some(0) {
            " (root needs neither)"
        } else {
            ""
        };
        Item::info("groups", format!("user {user}: {}{root}", parts.join("; ")))
    }
}

fn var_item(name: &str, value: Option<&str>) -> Item {
    let Some(value) = value else {
        return Item::info(name, "not set");
    };
    if VISIBILITY_VARS.contains(&name) {
        return match parse_visible_devices(value) {
            Visibility::HidesAll(why) => {
                Item::fail(name, format!("{value:?} hides every device ({why})"))
            }
            Visibility::Selects(list) => {
                Item::info(name, format!("{value} (selects {})", list.join(", ")))
            }
            Visibility::Unset => Item::info(name, "not set"),
        };
    }
    // The stack variables name directories; one that does not exist is a likely mistake.
    if Path::new(value).is_dir() {
        Item::info(name, value)
    } else {
        Item::warn(name, format!("{value} (no such directory)"))
    }
}

fn join_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The text (lossy UTF-8) of the first 4 KiB of a regular file. The DTK version paths come
/// from the environment: a FIFO there would block the report, a device flood it.
fn read_small_text(path: &Path) -> Option<String> {
    if !std::fs::metadata(path).ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(4096)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Opens `path` for read and write and classifies the outcome.
pub fn probe_kfd(path: &Path) -> KfdAccess {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(_) => KfdAccess::Ok,
        Err(e) if e.kind() == ErrorKind::NotFound => KfdAccess::Missing,
        Err(e) if e.kind() == ErrorKind::PermissionDenied => KfdAccess::NotPermitted {
            owner_gid: std::fs::metadata(path).ok().map(|m| m.gid()),
        },
        Err(e) => KfdAccess::Error(e.to_string()),
    }
}

/// The numeric fields after `key` on its line of `/proc/self/status` (`Uid:`, `Gid:`, `Groups:`).
pub fn parse_status_ids(status: &str, key: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|t| t.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Parses `/etc/group` (`name:password:gid:member,member`); malformed lines are skipped.
pub fn parse_group_file(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?.trim();
            let _password = fields.next()?;
            let gid = fields.next()?.trim().parse().ok()?;
            let members = fields
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect();
            (!name.is_empty() && !name.starts_with('#')).then(|| GroupEntry {
                name: name.to_string(),
                gid,
                members,
            })
        })
        .collect()
}

/// The user name of `uid` in `/etc/passwd` text.
pub fn user_name(passwd: &str, uid: u32) -> Option<String> {
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        let name = fields.next()?;
        let _password = fields.next()?;
        (fields.next()?.trim().parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}

/// Interprets a `HIP_VISIBLE_DEVICES`-style value.
///
/// Entries are comma-separated device indices (or `GPU-...` UUIDs); as in the CUDA and ROCm
/// runtimes, parsing stops at the first invalid entry (e.g. `-1`), so a value whose first entry
/// is invalid, or an empty value, hides every device.
pub fn parse_visible_devices(value: &str) -> Visibility {
    let mut selected = Vec::new();
    for entry in value.split(',').map(str::trim) {
        let valid = entry.parse::<u32>().is_ok() || (entry.starts_with("GPU-") && entry.len() > 4);
        if !valid {
            if selected.is_empty() {
                let why = if value.trim().is_empty() {
                    "it is set but empty".to_string()
                } else {
                    format!("its first entry {entry:?} is not a device index")
                };
                return Visibility::HidesAll(why);
            }
            break;
        }
        selected.push(entry.to_string());
    }
    Visibility::Selects(selected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_ids_parse() {
        let status = "Name:\tx\nUid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1001\t1000\t1000\nGroups:\t4 24 44 109 \n";
        assert_eq!(
            parse_status_ids(status, "Uid:"),
            vec![1000, 1000, 1000, 1000]
        );
        assert_eq!(parse_status_ids(status, "Groups:"), vec![4, 24, 44, 109]);
        assert_eq!(
            parse_status_ids("Groups:\t \n", "Groups:"),
            Vec::<u32>::new()
        );
        assert_eq!(parse_status_ids("", "Gid:"), Vec::<u32>::new());
    }

    #[test]
    fn group_file_parses_and_skips_garbage() {
        let text =
            "root:x:0:\nvideo:x:44:alice, bob\nrender:x:109:\nbroken line\nbad:x:notanumber:\n";
        let groups = parse_group_file(text);
        assert_eq!(groups.len(), 3);
        assert_eq!(
            groups[1],
            GroupEntry {
                name: "video".into(),
                gid: 44,
                members: vec!["alice".into(), "bob".into()]
            }
        );
        assert_eq!(groups[2].members, Vec::<String>::new());
    }

    #[test]
    fn passwd_lookup() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/sh\n";
        assert_eq!(user_name(passwd, 1000).as_deref(), Some("alice"));
        assert_eq!(user_name(passwd, 7), None);
    }

    #[test]
    fn visible_devices_rules() {
        assert_eq!(
            parse_visible_devices("0,2"),
            Visibility::Selects(vec!["0".into(), "2".into()])
        );
        assert_eq!(
            parse_visible_devices(" 1 "),
            Visibility::Selects(vec!["1".into()])
        );
        assert_eq!(
            parse_visible_devices("1,-1,2"),
            Visibility::Selects(vec!["1".into()])
        );
        assert!(
            matches!(parse_visible_devices("-1"), Visibility::HidesAll(w) if w.contains("\"-1\""))
        );
        assert!(
            matches!(parse_visible_devices(""), Visibility::HidesAll(w) if w.contains("empty"))
        );
        assert!(matches!(
            parse_visible_devices("gpu0"),
            Visibility::HidesAll(_)
        ));
        assert_eq!(
            parse_visible_devices("GPU-abc"),
            Visibility::Selects(vec!["GPU-abc".into()])
        );
    }

    #[test]
    fn kfd_probe_classifies() {
        assert_eq!(probe_kfd(Path::new("/nonexistent/kfd")), KfdAccess::Missing);
        // /dev/null opens read/write for everyone: stands in for an accessible node.
        assert_eq!(probe_kfd(Path::new("/dev/null")), KfdAccess::Ok);
    }

    fn facts() -> EnvFacts {
        EnvFacts {
            vars: vec![
                ("HIP_VISIBLE_DEVICES".into(), Some("-1".into())),
                ("ROCM_PATH".into(), None),
            ],
            hipk_vars: vec![("HIPK_ARCH".into(), "gfx928".into())],
            not_utf8: vec![("LC_BAD".into(), "a\u{fffd}b".into())],
            dtk_version: Some((PathBuf::from("/opt/dtk/.dtk_version"), "25.04".into())),
            dtk_version_paths: vec![PathBuf::from("/opt/dtk/.dtk_version")],
            dtk_env_script: true,
            kfd: KfdAccess::NotPermitted {
                owner_gid: Some(109),
            },
            uid: Some(1000),
            user: Some("alice".into()),
            process_gids: vec![1000, 44],
            groups: parse_group_file("video:x:44:alice\nrender:x:109:alice\n"),
        }
    }

    #[test]
    fn section_reports_each_fact() {
        let section = facts().section();
        let text = |name: &str| {
            section
                .items
                .iter()
                .find(|i| i.name == name)
                .map(|i| (i.status, i.detail.clone()))
                .expect(name)
        };
        use crate::report::Status;
        assert_eq!(text("HIP_VISIBLE_DEVICES").0, Status::Fail);
        assert_eq!(text("ROCM_PATH"), (Status::Info, "not set".into()));
        assert_eq!(text("HIPK_ARCH"), (Status::Info, "gfx928".into()));
        let bad = text("LC_BAD");
        assert_eq!(bad.0, Status::Warn);
        assert!(bad.1.contains("not valid UTF-8"), "{}", bad.1);
        assert!(text("DTK version").1.starts_with("25.04"));
        let kfd = text(KFD);
        assert_eq!(kfd.0, Status::Fail);
        assert!(kfd.1.contains("render (gid 109)"), "{}", kfd.1);
        let groups = text("groups").1;
        assert!(
            groups.contains("render: listed in /etc/group but not active"),
            "{groups}"
        );
        assert!(groups.contains("video: member"), "{groups}");
    }
}
