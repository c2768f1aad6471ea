//! The CPU reference self-check: runs the committed golden cases through `hip_kernels::cpu`.
//!
//! The cases live in the source tree (`tests/golden/`); the binary finds them through the path
//! embedded at build time, plus any directories listed in `HIPK_GOLDEN_DIR` (colon-separated,
//! as `tests/golden.rs` reads it). A binary copied to another machine says the directory is
//! missing and how to point at a copy.

use std::path::{Path, PathBuf};

use super::json::Json;
use super::report::{Item, Section};

/// The golden directory of the source tree this binary was built from.
pub const EMBEDDED_GOLDEN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");

/// The variable that adds golden directories.
pub const GOLDEN_DIR_VAR: &str = "HIPK_GOLDEN_DIR";

/// Where to look for golden cases, and which of those places exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoldenDirs {
    /// Existing directories to run, in order.
    pub found: Vec<PathBuf>,
    /// Directories that were expected but do not exist.
    pub missing: Vec<PathBuf>,
}

/// Resolves the directories from the embedded path and the value of `HIPK_GOLDEN_DIR`.
pub fn golden_dirs(embedded: &Path, extra: Option<&str>) -> GoldenDirs {
    let mut dirs = vec![embedded.to_path_buf()];
    for entry in extra
        .unwrap_or("")
        .split(':')
        .filter(|e| !e.trim().is_empty())
    {
        let p = PathBuf::from(entry.trim());
        if !dirs.contains(&p) {
            dirs.push(p);
        }
    }
    let (found, missing) = dirs.into_iter().partition(|d| d.is_dir());
    GoldenDirs { found, missing }
}

/// The `.safetensors` files directly inside `dir`, sorted.
pub fn case_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

/// Builds the self-check section.
pub fn section() -> Section {
    let mut section = Section::new("CPU reference self-check");
    let extra = std::env::var(GOLDEN_DIR_VAR).ok();
    let dirs = golden_dirs(Path::new(EMBEDDED_GOLDEN_DIR), extra.as_deref());
    for dir in &dirs.missing {
        section.push(
            Item::fail("golden directory", format!("{} does not exist", dir.display())).with_hint(format!(
                "run hip-doctor from the source tree it was built in, or set {GOLDEN_DIR_VAR} to a copy of tests/golden"
            )),
        );
    }
    let mut files = Vec::new();
    for dir in &dirs.found {
        match case_files(dir) {
            Ok(found) => {
                section.push(
                    Item::info(
                        "golden directory",
                        format!("{} ({} cases)", dir.display(), found.len()),
                    )
                    .with_fact("path", Json::str(dir.display().to_string()))
                    .with_fact("cases", Json::Num(found.len() as f64)),
                );
                files.extend(found);
            }
            Err(e) => section.push(Item::fail(
                "golden directory",
                format!("{}: {e}", dir.display()),
            )),
        }
    }
    if !files.is_empty() {
        section.push(Item::not_available(
            "golden cases",
            "the CPU reference's run-case API (hip_kernels::golden) has not landed",
        ));
    } else if dirs.missing.is_empty() {
        section.push(Item::fail(
            "golden cases",
            "no .safetensors case files found",
        ));
    }
    section
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dirs_split_into_found_and_missing() {
        let tmp = std::env::temp_dir();
        let dirs = golden_dirs(
            Path::new("/nonexistent/golden"),
            Some(&format!("{}::/nonexistent/b", tmp.display())),
        );
        assert_eq!(dirs.found, vec![tmp.clone()]);
        assert_eq!(
            dirs.missing,
            vec![
                PathBuf::from("/nonexistent/golden"),
                PathBuf::from("/nonexistent/b")
            ]
        );
        let dirs = golden_dirs(&tmp, None);
        assert_eq!(dirs.found, vec![tmp]);
        assert!(dirs.missing.is_empty());
    }

    #[test]
    fn missing_dir_is_a_clear_failure() {
        assert!(case_files(Path::new("/nonexistent/golden")).is_err());
    }
}
