//! The CPU reference self-check: runs the committed golden cases through `hip_kernels::cpu`
//! (via [`hip_kernels::golden::run_case`]).
//!
//! The cases live in the source tree (`tests/golden/`); the binary finds them through the path
//! embedded at build time ([`hip_kernels::golden::committed_dir`]) plus any directories listed in
//! `HIPK_GOLDEN_DIR` (colon-separated, as `tests/golden.rs` reads it). A binary copied to another
//! machine says the directory is missing and how to point at a copy.

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use super::guard::payload_text;
use super::report::{Item, Section};
use crate::report::Json;
use hip_kernels::golden::{self, CaseReport, GoldenError};

/// The variable that adds golden directories.
pub const GOLDEN_DIR_VAR: &str = "HIPK_GOLDEN_DIR";

/// Worker threads for running cases (the reference is single-threaded per case).
const WORKERS: usize = 4;

/// Where to look for golden cases, and which of those places exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoldenDirs {
    /// Existing directories to run, in order.
    pub found: Vec<PathBuf>,
    /// Directories that were expected but do not exist.
    pub missing: Vec<PathBuf>,
}

/// Splits `dirs` (duplicates dropped) into those that exist and those that do not.
pub fn golden_dirs(dirs: impl IntoIterator<Item = PathBuf>) -> GoldenDirs {
    let mut unique: Vec<PathBuf> = Vec::new();
    for d in dirs {
        if !unique.contains(&d) {
            unique.push(d);
        }
    }
    let (found, missing) = unique.into_iter().partition(|d| d.is_dir());
    GoldenDirs { found, missing }
}

/// Runs the CPU reference on every case in `files`, on a few threads; results in file order.
pub fn run_cases(files: &[PathBuf]) -> Vec<(PathBuf, Result<CaseReport, GoldenError>)> {
    run_cases_with(files, golden::run_case)
}

/// [`run_cases`] with any runner. A case whose run panics gives [`GoldenError::Panicked`]
/// naming its file; the worker goes on with its other cases.
fn run_cases_with(
    files: &[PathBuf],
    run: impl Fn(&Path) -> Result<CaseReport, GoldenError> + Sync,
) -> Vec<(PathBuf, Result<CaseReport, GoldenError>)> {
    if files.is_empty() {
        return Vec::new();
    }
    let chunk = files.len().div_ceil(WORKERS);
    let run = &run;
    let guarded = move |p: &PathBuf| {
        panic::catch_unwind(AssertUnwindSafe(|| run(p))).unwrap_or_else(|payload| {
            Err(GoldenError::Panicked {
                path: p.clone(),
                message: payload_text(payload.as_ref()),
            })
        })
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    part.iter()
                        .map(|p| (p.clone(), guarded(p)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        // A worker that still unwound loses its cases; the caller compares counts and reports it.
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    })
}

/// Builds the self-check section.
pub fn section() -> Section {
    let mut dirs = vec![golden::committed_dir()];
    dirs.extend(golden::env_dirs());
    section_for(golden_dirs(dirs))
}

fn section_for(dirs: GoldenDirs) -> Section {
    let mut section = Section::new("CPU reference self-check");
    for dir in &dirs.missing {
        section.push(
            Item::fail("golden directory", format!("{} does not exist", dir.display())).with_hint(format!(
                "run hip-doctor from the source tree it was built in, or set {GOLDEN_DIR_VAR} to a copy of tests/golden"
            )),
        );
    }
    let mut files = Vec::new();
    for dir in &dirs.found {
        match golden::case_files(dir) {
            Ok(found) if found.is_empty() => section.push(Item::fail(
                "golden directory",
                format!("{}: no .safetensors case files", dir.display()),
            )),
            Ok(found) => {
                section.push(
                    Item::info(
                        "golden directory",
                        format!("{} ({} cases)", dir.display(), found.len()),
                    )
                    .with_fact("path", Json::from(dir.display().to_string()))
                    .with_fact("cases", Json::from(found.len())),
                );
                files.extend(found);
            }
            Err(e) => section.push(Item::fail("golden directory", e.to_string())),
        }
    }
    if files.is_empty() {
        return section;
    }
    let results = run_cases(&files);
    if results.len() != files.len() {
        section.push(Item::fail(
            "golden cases",
            format!(
                "only {} of {} cases reported a result (a worker stopped)",
                results.len(),
                files.len()
            ),
        ));
    }
    for op in hip_kernels::ops::golden_op_names() {
        let of_op: Vec<&CaseReport> = results
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok())
            .filter(|r| r.op == op)
            .collect();
        if of_op.is_empty() {
            continue;
        }
        section.push(op_item(op, &of_op));
    }
    for (path, result) in &results {
        if let Err(e) = result {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            section.push(Item::fail(name, e.to_string()));
        }
    }
    section
}

/// One PASS row per op: how many cases, which dtypes, and the largest absolute error seen.
fn op_item(op: &str, reports: &[&CaseReport]) -> Item {
    let mut dtypes: Vec<String> = Vec::new();
    for r in reports {
        let d = r.dtype.to_string();
        if !dtypes.contains(&d) {
            dtypes.push(d);
        }
    }
    let worst = reports
        .iter()
        .flat_map(|r| r.tensors.iter())
        .map(|t| t.max_abs_err)
        .fold(0.0_f64, f64::max);
    Item::pass(
        op.to_string(),
        format!(
            "{} cases passed ({}); largest |got - expected| {worst:.1e}",
            reports.len(),
            dtypes.join(", ")
        ),
    )
    .with_fact("cases", Json::from(reports.len()))
    .with_fact("max_abs_err", Json::from(worst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Status;

    #[test]
    fn dirs_split_into_found_and_missing() {
        let tmp = std::env::temp_dir();
        let dirs = golden_dirs([
            PathBuf::from("/nonexistent/golden"),
            tmp.clone(),
            tmp.clone(),
            "/nonexistent/b".into(),
        ]);
        assert_eq!(dirs.found, vec![tmp]);
        assert_eq!(
            dirs.missing,
            vec![
                PathBuf::from("/nonexistent/golden"),
                PathBuf::from("/nonexistent/b")
            ]
        );
    }

    #[test]
    fn missing_dir_is_a_named_failure() {
        let section = section_for(golden_dirs([PathBuf::from("/nonexistent/golden")]));
        assert_eq!(section.items.len(), 1);
        assert_eq!(section.items[0].status, Status::Fail);
        assert!(section.items[0]
            .detail
            .contains("/nonexistent/golden does not exist"));
    }

    #[test]
    fn committed_cases_pass() {
        let section = section_for(golden_dirs([golden::committed_dir()]));
        let fails: Vec<_> = section
            .items
            .iter()
            .filter(|i| i.status == Status::Fail)
            .collect();
        assert!(fails.is_empty(), "{fails:?}");
        let passes = section
            .items
            .iter()
            .filter(|i| i.status == Status::Pass)
            .count();
        let ops = hip_kernels::ops::golden_op_names().len();
        assert_eq!(passes, ops, "one row per op: {section:?}");
    }

    #[test]
    fn a_case_that_panics_is_named_and_the_others_still_run() {
        let files: Vec<PathBuf> = (0..9)
            .map(|i| format!("/cases/c{i}.safetensors").into())
            .collect();
        let results = run_cases_with(&files, |p| {
            if p.ends_with("c4.safetensors") {
                panic!("boom in the reference");
            }
            Err(GoldenError::MissingMetadata {
                case: p.display().to_string(),
                key: "op".into(),
            })
        });
        let paths: Vec<&PathBuf> = results.iter().map(|(p, _)| p).collect();
        assert_eq!(paths, files.iter().collect::<Vec<_>>());
        let panicked: Vec<String> = results
            .iter()
            .filter_map(|(_, r)| match r {
                Err(e @ GoldenError::Panicked { .. }) => Some(e.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(panicked.len(), 1, "{panicked:?}");
        assert!(
            panicked[0].contains("/cases/c4.safetensors")
                && panicked[0].contains("boom in the reference"),
            "{}",
            panicked[0]
        );
    }

    #[test]
    fn an_unreadable_case_is_a_failure_row() {
        let dir = std::env::temp_dir().join(format!("hipk-doctor-golden-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("broken.safetensors"), b"not a safetensors file").expect("write");
        let section = section_for(golden_dirs([dir.clone()]));
        let _ = std::fs::remove_dir_all(&dir);
        let broken = section
            .items
            .iter()
            .find(|i| i.name == "broken")
            .expect("row for the broken case");
        assert_eq!(broken.status, Status::Fail);
        assert!(
            broken.detail.contains("not a valid safetensors file"),
            "{}",
            broken.detail
        );
    }
}
