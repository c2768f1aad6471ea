//! The CPU reference self-check: runs the golden cases through `hip_kernels::cpu` (via
//! [`hip_kernels::golden::run_case_with`] and [`CpuBackend`]).
//!
//! The committed cases (`tests/golden/*.safetensors`) are built into the binary
//! ([`embedded_cases`], written by `build.rs`), so a copied binary checks its CPU reference
//! wherever it runs, with no source tree. Directories listed in `HIPK_GOLDEN_DIR`
//! (colon-separated, as `tests/golden.rs` reads it) add more cases.

use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;

use super::guard::{payload_text, with_steps};
use super::progress::Steps;
use super::report::{Item, Section};
use crate::report::Json;
use hip_kernels::golden::{self, CaseReport, CpuBackend, GoldenError};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/embedded_golden.rs"));
}

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

/// One golden case to run: built into the binary, or a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaseSource {
    /// A committed case embedded at build time.
    Embedded {
        /// The case name (its file name without `.safetensors`).
        name: &'static str,
        /// The file's bytes.
        bytes: &'static [u8],
    },
    /// A case file (from a `HIPK_GOLDEN_DIR` directory).
    File(PathBuf),
}

impl CaseSource {
    /// The case name: the embedded name, or the file name without its extension.
    pub fn name(&self) -> String {
        match self {
            CaseSource::Embedded { name, .. } => (*name).to_string(),
            CaseSource::File(path) => path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.display().to_string()),
        }
    }

    /// Where the case comes from, as a path-like label for errors.
    fn origin(&self) -> PathBuf {
        match self {
            CaseSource::Embedded { name, .. } => {
                PathBuf::from(format!("(embedded) {name}.safetensors"))
            }
            CaseSource::File(path) => path.clone(),
        }
    }

    /// Parses the case and runs the CPU reference on it.
    fn run_cpu(&self) -> Result<CaseReport, GoldenError> {
        match self {
            CaseSource::Embedded { name, bytes } => {
                golden::run_case_with(&mut CpuBackend, &golden::parse_case(name, bytes)?)
            }
            CaseSource::File(path) => golden::run_case(path),
        }
    }
}

/// The committed golden cases built into this binary, sorted by name.
pub fn embedded_cases() -> Vec<CaseSource> {
    embedded::EMBEDDED_CASES
        .iter()
        .map(|&(name, bytes)| CaseSource::Embedded { name, bytes })
        .collect()
}

/// Runs the CPU reference on every case, on a few threads; results in the order given. Each
/// case done is counted in `steps`.
pub fn run_cases(
    cases: &[CaseSource],
    steps: &Steps,
) -> Vec<(CaseSource, Result<CaseReport, GoldenError>)> {
    run_cases_with(cases, steps, CaseSource::run_cpu)
}

/// [`run_cases`] with any runner. A case whose run panics gives [`GoldenError::Panicked`]
/// naming it; the worker goes on with its other cases.
fn run_cases_with(
    cases: &[CaseSource],
    steps: &Steps,
    run: impl Fn(&CaseSource) -> Result<CaseReport, GoldenError> + Sync,
) -> Vec<(CaseSource, Result<CaseReport, GoldenError>)> {
    if cases.is_empty() {
        return Vec::new();
    }
    let chunk = cases.len().div_ceil(WORKERS);
    let run = &run;
    let guarded = move |c: &CaseSource| {
        let result = panic::catch_unwind(AssertUnwindSafe(|| run(c))).unwrap_or_else(|payload| {
            Err(GoldenError::Panicked {
                path: c.origin(),
                message: payload_text(payload.as_ref()),
            })
        });
        steps.finish_one();
        result
    };
    std::thread::scope(|scope| {
        let handles: Vec<_> = cases
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

/// Builds the self-check section: the embedded cases, then those of `HIPK_GOLDEN_DIR`.
pub fn section() -> Section {
    section_for(embedded_cases(), golden_dirs(golden::env_dirs()))
}

fn section_for(embedded: Vec<CaseSource>, dirs: GoldenDirs) -> Section {
    let mut section = Section::new("CPU reference self-check");
    if !embedded.is_empty() {
        section.push(
            Item::info(
                "embedded golden cases",
                format!("{} cases built into this binary", embedded.len()),
            )
            .with_fact("cases", Json::from(embedded.len())),
        );
    }
    for dir in &dirs.missing {
        section.push(
            Item::fail("golden directory", format!("{} does not exist", dir.display())).with_hint(format!(
                "{GOLDEN_DIR_VAR} names it: fix the path, or unset {GOLDEN_DIR_VAR} (the embedded cases run without it)"
            )),
        );
    }
    let mut cases = embedded;
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
                cases.extend(found.into_iter().map(CaseSource::File));
            }
            Err(e) => section.push(Item::fail("golden directory", e.to_string())),
        }
    }
    if cases.is_empty() {
        if dirs.missing.is_empty() && dirs.found.is_empty() {
            section.push(
                Item::fail("golden cases", "this binary embeds no golden cases").with_hint(format!(
                    "rebuild from a source tree that has tests/golden, or set {GOLDEN_DIR_VAR} to a directory of cases"
                )),
            );
        }
        return section;
    }
    let steps = Steps::new(cases.len());
    let results = with_steps(
        "running the CPU reference on the golden cases",
        &steps,
        |steps| run_cases(&cases, steps),
    );
    if results.len() != cases.len() {
        section.push(Item::fail(
            "golden cases",
            format!(
                "only {} of {} cases reported a result (a worker stopped)",
                results.len(),
                cases.len()
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
    for (case, result) in &results {
        if let Err(e) = result {
            section.push(Item::fail(case.name(), e.to_string()));
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

    fn no_dirs() -> GoldenDirs {
        golden_dirs(Vec::new())
    }

    fn fails(section: &Section) -> Vec<&Item> {
        section
            .items
            .iter()
            .filter(|i| i.status == Status::Fail)
            .collect()
    }

    #[test]
    fn missing_dir_is_a_named_failure() {
        let section = section_for(
            Vec::new(),
            golden_dirs([PathBuf::from("/nonexistent/golden")]),
        );
        assert_eq!(section.items.len(), 1);
        assert_eq!(section.items[0].status, Status::Fail);
        assert!(section.items[0]
            .detail
            .contains("/nonexistent/golden does not exist"));
    }

    #[test]
    fn no_cases_at_all_is_a_failure() {
        let section = section_for(Vec::new(), no_dirs());
        assert_eq!(fails(&section).len(), 1, "{section:?}");
        assert!(section.items[0].detail.contains("embeds no golden cases"));
    }

    #[test]
    fn the_embedded_cases_are_the_committed_ones() {
        let dir = golden::committed_dir();
        let Ok(files) = golden::case_files(&dir) else {
            panic!("{} is listed by build.rs, so it exists", dir.display())
        };
        let committed: Vec<String> = files
            .into_iter()
            .map(|f| CaseSource::File(f).name())
            .collect();
        let embedded: Vec<String> = embedded_cases().iter().map(CaseSource::name).collect();
        assert!(!embedded.is_empty());
        assert_eq!(embedded, committed);
        for case in embedded_cases() {
            let CaseSource::Embedded { name, bytes } = case else {
                unreachable!("embedded_cases gives embedded cases")
            };
            let on_disk = std::fs::read(dir.join(format!("{name}.safetensors")));
            assert!(
                on_disk.is_ok_and(|b| b == bytes),
                "{name} differs from its file"
            );
        }
    }

    #[test]
    fn embedded_cases_pass_without_any_directory() {
        let section = section_for(embedded_cases(), no_dirs());
        assert!(fails(&section).is_empty(), "{section:?}");
        assert_eq!(section.items[0].name, "embedded golden cases");
        let passes = section
            .items
            .iter()
            .filter(|i| i.status == Status::Pass)
            .count();
        let ops = hip_kernels::ops::golden_op_names().len();
        assert_eq!(passes, ops, "one row per op: {section:?}");
        let text = format!("{section:?}");
        assert!(!text.contains("tests/golden"), "reads no directory: {text}");
    }

    #[test]
    fn a_broken_embedded_case_is_a_named_failure() {
        let broken = CaseSource::Embedded {
            name: "broken_case",
            bytes: b"not a safetensors file",
        };
        let section = section_for(vec![broken], no_dirs());
        let fails = fails(&section);
        assert_eq!(fails.len(), 1, "{section:?}");
        assert_eq!(fails[0].name, "broken_case");
        assert!(fails[0].detail.contains("not a valid safetensors file"));
    }

    #[test]
    fn a_case_that_panics_is_named_and_the_others_still_run() {
        let files: Vec<CaseSource> = (0..9)
            .map(|i| CaseSource::File(format!("/cases/c{i}.safetensors").into()))
            .collect();
        let steps = Steps::new(files.len());
        let results = run_cases_with(&files, &steps, |c| {
            if c.name() == "c4" {
                panic!("boom in the reference");
            }
            Err(GoldenError::MissingMetadata {
                case: c.name(),
                key: "op".into(),
            })
        });
        let cases: Vec<&CaseSource> = results.iter().map(|(c, _)| c).collect();
        assert_eq!(cases, files.iter().collect::<Vec<_>>());
        let panicked: Vec<String> = results
            .iter()
            .filter_map(|(_, r)| match r {
                Err(e @ GoldenError::Panicked { .. }) => Some(e.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(panicked.len(), 1, "{panicked:?}");
        assert_eq!(
            steps.describe(),
            "[9/9]",
            "every case counted, the panicking one too"
        );
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
        let section = section_for(Vec::new(), golden_dirs([dir.clone()]));
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
