//! Finding a `DT_NEEDED` library the way the dynamic loader (glibc's `ld.so`) does, and where a
//! HIP/ROCm library would be found once DTK's or ROCm's environment is loaded.
//!
//! `ld.so`'s order for a library that needs `name` (no slash in it): the needing object's
//! `DT_RPATH` (only when it has no `DT_RUNPATH`), `LD_LIBRARY_PATH`, its `DT_RUNPATH`, the
//! `ld.so.cache` (built by `ldconfig` from `/etc/ld.so.conf` and its includes: read here from
//! those files), then the default directories. `$ORIGIN` is the needing object's directory.

use std::path::{Path, PathBuf};

/// The HIP/ROCm/DTK libraries whose absence this check reports (by soname prefix).
pub const HIP_FAMILY: [&str; 24] = [
    "libamdhip64.so",
    "libgalaxyhip.so",
    "libhiprtc.so",
    "libhsa-runtime64.so",
    "libhsakmt.so",
    "libamd_comgr.so",
    "librocblas.so",
    "libhipblas.so",
    "libhipblaslt.so",
    "libMIOpen.so",
    "librccl.so",
    "librocrand.so",
    "libhiprand.so",
    "libhipfft.so",
    "librocfft.so",
    "libhipsparse.so",
    "librocsparse.so",
    "libhipsolver.so",
    "librocsolver.so",
    "libroctx64.so",
    "libroctracer64.so",
    "libhipsparselt.so",
    "librocm_smi64.so",
    "libhydra.so",
];

/// Whether `name` is a HIP/ROCm/DTK runtime library.
pub fn is_hip_family(name: &str) -> bool {
    HIP_FAMILY.iter().any(|p| name.starts_with(p))
}

/// Where the loader looks, besides the needing object's own paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Loader {
    /// `LD_LIBRARY_PATH`, split.
    pub ld_library_path: Vec<PathBuf>,
    /// Directories of `/etc/ld.so.conf` and its includes.
    pub conf_dirs: Vec<PathBuf>,
    /// The default directories.
    pub default_dirs: Vec<PathBuf>,
    /// Directories of the installed runtime that the loader does not search now (DTK's and
    /// ROCm's library directories): where a library would be found once its environment is
    /// loaded.
    pub runtime_dirs: Vec<PathBuf>,
}

/// The outcome of resolving one needed library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Found by the loader's search, at this path.
    Loader(PathBuf),
    /// Not found by the search, but present in the installed runtime's directory (the loader
    /// finds it only after that environment is loaded).
    OnlyInRuntime(PathBuf),
    /// Nowhere.
    Missing,
}

impl Loader {
    /// This machine's loader: `LD_LIBRARY_PATH`, `/etc/ld.so.conf`, the default directories, and
    /// the runtime directories under the given install roots (`/opt/dtk`, `$ROCM_PATH`, ...).
    pub fn probe(ld_library_path: Option<&str>, runtime_roots: &[PathBuf]) -> Loader {
        let mut conf_dirs = Vec::new();
        read_ld_conf(Path::new("/etc/ld.so.conf"), &mut conf_dirs, 0);
        let mut runtime_dirs = Vec::new();
        for root in runtime_roots {
            for sub in ["lib", "lib64", "hip/lib", "rccl/lib", "miopen/lib"] {
                let dir = root.join(sub);
                if dir.is_dir() && !runtime_dirs.contains(&dir) {
                    runtime_dirs.push(dir);
                }
            }
        }
        Loader {
            ld_library_path: split(ld_library_path.unwrap_or("")),
            conf_dirs,
            default_dirs: [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/lib64",
                "/usr/lib64",
                "/lib",
                "/usr/lib",
            ]
            .iter()
            .map(PathBuf::from)
            .collect(),
            runtime_dirs,
        }
    }

    /// Resolves `name`, needed by the object at `needer` with these `DT_RPATH` / `DT_RUNPATH`.
    pub fn resolve(
        &self,
        name: &str,
        needer: &Path,
        rpath: &[String],
        runpath: &[String],
    ) -> Found {
        if name.contains('/') {
            let p = PathBuf::from(name);
            return if p.is_file() {
                Found::Loader(p)
            } else {
                Found::Missing
            };
        }
        let origin = needer.parent().unwrap_or(Path::new("."));
        let expand = |list: &[String]| -> Vec<PathBuf> {
            list.iter()
                .map(|d| {
                    PathBuf::from(
                        d.replace("$ORIGIN", &origin.to_string_lossy())
                            .replace("${ORIGIN}", &origin.to_string_lossy()),
                    )
                })
                .collect()
        };
        let mut order: Vec<PathBuf> = Vec::new();
        if runpath.is_empty() {
            order.extend(expand(rpath));
        }
        order.extend(self.ld_library_path.iter().cloned());
        order.extend(expand(runpath));
        order.extend(self.conf_dirs.iter().cloned());
        order.extend(self.default_dirs.iter().cloned());
        if let Some(p) = order.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
            return Found::Loader(p);
        }
        match self
            .runtime_dirs
            .iter()
            .map(|d| d.join(name))
            .find(|p| p.is_file())
        {
            Some(p) => Found::OnlyInRuntime(p),
            None => Found::Missing,
        }
    }

    /// Files in the runtime directories whose name starts with `stem` (`libamdhip64.so`), to
    /// say what the installed runtime has instead.
    pub fn runtime_has(&self, stem: &str) -> Vec<String> {
        let mut out = Vec::new();
        for dir in self
            .ld_library_path
            .iter()
            .chain(&self.runtime_dirs)
            .chain(&self.conf_dirs)
            .chain(&self.default_dirs)
        {
            let Ok(entries) = std::fs::read_dir(dir) else {
                continue;
            };
            for entry in entries.take(10_000).filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(stem) && !out.contains(&name) {
                    out.push(name);
                }
            }
        }
        out.sort();
        out
    }
}

/// The soname's stem: `libamdhip64.so.6` → `libamdhip64.so`.
pub fn soname_stem(name: &str) -> &str {
    match name.find(".so") {
        Some(i) => &name[..i + 3],
        None => name,
    }
}

fn split(list: &str) -> Vec<PathBuf> {
    list.split([':', ';'])
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect()
}

/// Reads an `ld.so.conf`: one directory a line, `include GLOB` lines (a `*` in the last
/// component), `#` comments. Bounded in depth and size.
fn read_ld_conf(path: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    if depth > 4 {
        return;
    }
    let Ok(text) = super::dist::read_capped(path, 1 << 20) else {
        return;
    };
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(pattern) = line.strip_prefix("include") {
            let pattern = pattern.trim();
            let pattern = if pattern.starts_with('/') {
                PathBuf::from(pattern)
            } else {
                path.parent().unwrap_or(Path::new("/")).join(pattern)
            };
            for file in glob_last(&pattern) {
                read_ld_conf(&file, out, depth + 1);
            }
        } else if line.starts_with('/') {
            let dir = PathBuf::from(line);
            if !out.contains(&dir) {
                out.push(dir);
            }
        }
    }
}

/// The files matching a pattern whose last component may hold one `*`.
fn glob_last(pattern: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (
        pattern.parent(),
        pattern.file_name().and_then(|n| n.to_str()),
    ) else {
        return Vec::new();
    };
    let Some((head, tail)) = name.split_once('*') else {
        return vec![pattern.to_path_buf()];
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .take(10_000)
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(head) && n.ends_with(tail))
        })
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_order_is_the_loaders() {
        let tmp = std::env::temp_dir().join(format!("hipdoc-resolve-{}", std::process::id()));
        let (a, b, rt) = (tmp.join("a"), tmp.join("b"), tmp.join("rt"));
        for d in [&a, &b, &rt] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(a.join("libx.so.1"), b"").unwrap();
        std::fs::write(b.join("libx.so.1"), b"").unwrap();
        std::fs::write(rt.join("libgalaxyhip.so.5"), b"").unwrap();
        let loader = Loader {
            ld_library_path: vec![b.clone()],
            runtime_dirs: vec![rt.clone()],
            ..Loader::default()
        };
        let needer = a.join("libneeds.so");
        // DT_RPATH (no RUNPATH) comes before LD_LIBRARY_PATH ...
        assert_eq!(
            loader.resolve("libx.so.1", &needer, &["$ORIGIN".into()], &[]),
            Found::Loader(a.join("libx.so.1"))
        );
        // ... DT_RUNPATH after it, and RPATH is ignored when RUNPATH is present.
        assert_eq!(
            loader.resolve(
                "libx.so.1",
                &needer,
                &["$ORIGIN".into()],
                &["$ORIGIN".into()]
            ),
            Found::Loader(b.join("libx.so.1"))
        );
        assert_eq!(
            loader.resolve("libgalaxyhip.so.5", &needer, &[], &[]),
            Found::OnlyInRuntime(rt.join("libgalaxyhip.so.5"))
        );
        assert_eq!(
            loader.resolve("libamdhip64.so.6", &needer, &[], &[]),
            Found::Missing
        );
        assert_eq!(soname_stem("libamdhip64.so.6"), "libamdhip64.so");
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
