//! Where hip-sys looks for a shared library, and what it found. The list of places is a pure
//! function of the environment ([`targets`]); probing them is a pure function of that list, a
//! filesystem probe and an opener ([`search`]), so both are table-tested without touching disk.

use std::ffi::OsString;
use std::fmt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// One directory a search tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SearchDir {
    /// `$VAR/sub`, skipped when the variable is unset or empty.
    Under(&'static str, &'static str),
    /// A fixed directory.
    Fixed(&'static str),
}

/// The directories searched for the HIP runtime and the BLAS libraries, in order: the install
/// roots the variables name, then DTK's and ROCm's default locations.
pub const STANDARD_DIRS: &[SearchDir] = &[
    SearchDir::Under("HIP_PATH", "lib"),
    SearchDir::Under("ROCM_PATH", "lib"),
    SearchDir::Under("ROCM_PATH", "hip/lib"),
    SearchDir::Fixed("/opt/dtk/hip/lib"),
    SearchDir::Fixed("/opt/dtk/lib"),
    SearchDir::Fixed("/opt/rocm/lib"),
];

/// One library hip-sys loads, and how to find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibrarySpec {
    /// Human name, e.g. "HIP runtime".
    pub label: &'static str,
    /// Variable naming the exact file to load; when set, nothing else is tried.
    pub override_var: &'static str,
    /// File names tried in each directory and then through the system loader, in order.
    pub file_names: &'static [&'static str],
    /// Directories tried, in order, before the system loader.
    pub dirs: &'static [SearchDir],
    /// Entry points a file must export to count as this library.
    pub core_symbols: &'static [&'static str],
    /// What to install when nothing is found.
    pub install_hint: &'static str,
}

/// The HIP runtime: ROCm's libamdhip64 or DTK's libgalaxyhip.
pub const HIP_RUNTIME: LibrarySpec = LibrarySpec {
    label: "HIP runtime",
    override_var: "HIPK_HIP_LIBRARY",
    file_names: &[
        "libamdhip64.so",
        "libamdhip64.so.7",
        "libamdhip64.so.6",
        "libamdhip64.so.5",
        "libgalaxyhip.so.5",
    ],
    dirs: STANDARD_DIRS,
    core_symbols: &["hipGetDeviceCount", "hipRuntimeGetVersion"],
    install_hint:
        "on ROCm, set ROCM_PATH or install the runtime (Debian: apt-get install libamdhip64-dev)",
};

/// One place to try.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// A file path (from the override variable or a search directory).
    File(PathBuf),
    /// A bare file name handed to the system loader (LD_LIBRARY_PATH, ld.so.cache, ...).
    SystemLoader(&'static str),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::File(p) => write!(f, "{}", p.display()),
            Target::SystemLoader(name) => write!(f, "{name} (system loader)"),
        }
    }
}

/// What happened at one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The file does not exist (not opened).
    Absent,
    /// The path exists but is not a regular file (a directory, a device, a symbolic link loop);
    /// the text says what it is ([`path_problem`]). Not opened.
    NotAFile(String),
    /// The loader refused it; the loader's message.
    OpenFailed(String),
    /// Opened; the search stopped here.
    Opened,
}

/// One tried target and its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub target: Target,
    pub outcome: Outcome,
}

/// Everything one search did: for `hip-doctor` and for the not-found error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchReport {
    pub spec: LibrarySpec,
    /// Targets in the order tried, up to and including the one that opened.
    pub attempts: Vec<Attempt>,
    /// The variables that steer the search and their values at search time.
    pub env: Vec<(&'static str, Option<String>)>,
}

impl SearchReport {
    /// The target that opened, if any.
    pub fn opened(&self) -> Option<&Target> {
        self.attempts
            .iter()
            .find(|a| a.outcome == Outcome::Opened)
            .map(|a| &a.target)
    }
}

/// The variables that steer a search for `spec`, in the order they matter: the override, the
/// install roots its directories name, and `LD_LIBRARY_PATH`.
pub fn steering_vars(spec: &LibrarySpec) -> Vec<&'static str> {
    let mut vars = vec![spec.override_var];
    for dir in spec.dirs {
        if let SearchDir::Under(var, _) = dir {
            if !vars.contains(var) {
                vars.push(var);
            }
        }
    }
    vars.push("LD_LIBRARY_PATH");
    vars
}

/// Non-empty value of a variable.
fn non_empty(env: &dyn Fn(&str) -> Option<OsString>, var: &str) -> Option<OsString> {
    env(var).filter(|v| !v.is_empty())
}

/// The places to try for `spec`, in order, given the environment `env`.
///
/// If the override variable is set (non-empty) its file is the only target: a user who names a
/// file wants that file or an error, not a silent fallback. Otherwise: each file name in each of
/// the spec's directories ([`STANDARD_DIRS`] for HIP: `$HIP_PATH/lib`, `$ROCM_PATH/lib`,
/// `$ROCM_PATH/hip/lib`, `/opt/dtk/hip/lib`, `/opt/dtk/lib`, `/opt/rocm/lib`; a directory listed
/// twice is tried once), then each name through the system loader.
pub fn targets(spec: &LibrarySpec, env: &dyn Fn(&str) -> Option<OsString>) -> Vec<Target> {
    if let Some(file) = non_empty(env, spec.override_var) {
        return vec![Target::File(PathBuf::from(file))];
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    let candidates = spec.dirs.iter().filter_map(|dir| match dir {
        SearchDir::Under(var, sub) => non_empty(env, var).map(|root| PathBuf::from(root).join(sub)),
        SearchDir::Fixed(dir) => Some(PathBuf::from(dir)),
    });
    for dir in candidates {
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    let files = dirs.iter().flat_map(|dir| {
        spec.file_names
            .iter()
            .map(move |name| Target::File(dir.join(name)))
    });
    let system = spec
        .file_names
        .iter()
        .map(|name| Target::SystemLoader(name));
    files.chain(system).collect()
}

/// What is wrong with `path` as a library file, read from the filesystem: `None` for a regular
/// file (after following links); otherwise a phrase such as `does not exist`, `is a directory,
/// not a library file` or `is a symbolic link loop (...)`.
pub fn path_problem(path: &Path) -> Option<String> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) => {
            return Some(match std::fs::symlink_metadata(path) {
                Ok(link) if link.file_type().is_symlink() => match std::fs::read_link(path) {
                    Ok(to) if e.kind() == std::io::ErrorKind::NotFound => format!(
                        "is a symbolic link to {}, which does not exist",
                        to.display()
                    ),
                    // ELOOP: the only other way a link that exists fails to resolve here.
                    _ if e.raw_os_error() == Some(ELOOP) => {
                        format!("is a symbolic link loop ({e})")
                    }
                    _ => format!("is a symbolic link that cannot be followed ({e})"),
                },
                _ if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_string(),
                _ => format!("cannot be read ({e})"),
            });
        }
    };
    let t = meta.file_type();
    let kind = if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    };
    Some(format!("is {kind}, not a library file"))
}

/// Why a file target given as a bare name (no `/`: only the override variable can give one)
/// is not tried: `dlopen` would look such a name up in the loader's search path, not at the
/// path a file check sees (the current directory).
pub const BARE_NAME: &str = "is a bare file name, which the system loader looks up in its own \
                             search path, not in the current directory; give a full path";

/// Whether `path` is a bare file name, which `dlopen` resolves through its search path.
pub fn is_bare_name(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    !path.as_os_str().as_bytes().contains(&b'/')
}

/// `ELOOP` on Linux (every architecture but alpha, mips, parisc and sparc, which hip-sys does
/// not run on).
const ELOOP: i32 = 40;

/// Try `targets` in order: skip files `is_file` says are absent, `open` the rest, stop at the
/// first that opens. Returns what opened (with its target) and the report of every attempt.
pub fn search<T>(
    spec: &LibrarySpec,
    env: &dyn Fn(&str) -> Option<OsString>,
    is_file: &dyn Fn(&Path) -> bool,
    open: &mut dyn FnMut(&Target) -> Result<T, String>,
) -> (Option<(Target, T)>, SearchReport) {
    let mut attempts = Vec::new();
    let mut found = None;
    for target in targets(spec, env) {
        let outcome = match &target {
            Target::File(path) if is_bare_name(path) => Outcome::NotAFile(BARE_NAME.into()),
            Target::File(path) if !is_file(path) => Outcome::Absent,
            _ => match open(&target) {
                Ok(value) => {
                    found = Some((target.clone(), value));
                    Outcome::Opened
                }
                Err(msg) => Outcome::OpenFailed(msg),
            },
        };
        attempts.push(Attempt { target, outcome });
        if found.is_some() {
            break;
        }
    }
    let env = steering_vars(spec)
        .into_iter()
        .map(|var| (var, env(var).map(|v| v.to_string_lossy().into_owned())))
        .collect();
    (
        found,
        SearchReport {
            spec: *spec,
            attempts,
            env,
        },
    )
}

impl fmt::Display for SearchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let spec = &self.spec;
        match self.opened() {
            Some(target) => writeln!(f, "{} found: {target}. Tried, in order:", spec.label)?,
            None => writeln!(f, "{} library not found. Tried, in order:", spec.label)?,
        }
        let mut i = 0;
        while let Some(attempt) = self.attempts.get(i) {
            // Group a run of absent files in one directory on one line.
            let run = absent_run(self.attempts.get(i..).unwrap_or(&[]));
            if run.len() > 1 {
                let dir = run
                    .first()
                    .and_then(|p| p.parent())
                    .unwrap_or(Path::new(""));
                let names: Vec<String> = run
                    .iter()
                    .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                    .collect();
                writeln!(
                    f,
                    "  {}/{{{}}}: not present",
                    dir.display(),
                    names.join(", ")
                )?;
                i += run.len();
                continue;
            }
            match (&attempt.target, &attempt.outcome) {
                (Target::File(p), Outcome::Absent) if i == 0 && self.overridden() => {
                    writeln!(f, "  {}={}: no such file", spec.override_var, p.display())?
                }
                (Target::File(p), Outcome::NotAFile(why)) if i == 0 && self.overridden() => {
                    writeln!(f, "  {}={}: {why}", spec.override_var, p.display())?
                }
                (t, Outcome::Absent) => writeln!(f, "  {t}: not present")?,
                (t, Outcome::NotAFile(why)) => writeln!(f, "  {t}: {why}")?,
                (t, Outcome::OpenFailed(msg)) => writeln!(f, "  {t}: {msg}")?,
                (t, Outcome::Opened) => writeln!(f, "  {t}: opened")?,
            }
            i += 1;
        }
        write!(f, "The search is steered by")?;
        for (var, value) in &self.env {
            let role = match *var {
                v if v == spec.override_var => "the exact file to load, skipping the search",
                "LD_LIBRARY_PATH" => "the system loader's directories",
                _ => "an install root whose lib/ is searched",
            };
            match value {
                Some(v) => write!(f, "\n  {var}={v} ({role})")?,
                None => write!(f, "\n  {var} unset ({role})")?,
            }
        }
        if self.opened().is_none() {
            write!(
                f,
                "\nOn DTK, run `source /opt/dtk/env.sh` first (it sets ROCM_PATH and LD_LIBRARY_PATH); {}.",
                spec.install_hint
            )?;
        }
        Ok(())
    }
}

impl SearchReport {
    fn overridden(&self) -> bool {
        self.env.iter().any(|(var, value)| {
            *var == self.spec.override_var && value.as_deref().is_some_and(|v| !v.is_empty())
        })
    }
}

/// The leading run of absent files sharing one parent directory.
fn absent_run(attempts: &[Attempt]) -> Vec<&Path> {
    let mut run: Vec<&Path> = Vec::new();
    for attempt in attempts {
        match (&attempt.target, &attempt.outcome) {
            (Target::File(p), Outcome::Absent)
                if run
                    .first()
                    .map_or(true, |first| first.parent() == p.parent()) =>
            {
                run.push(p)
            }
            _ => break,
        }
    }
    run
}

#[cfg(test)]
mod tests;
