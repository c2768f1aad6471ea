//! The committed baseline and partial runs (`--only`): a partial `--write-baseline` merges the
//! selected sources into the baseline instead of replacing it, and `--check` requires every
//! baseline kernel of the selected sources to be in the run, and every kernel of the run to be
//! in the baseline (a kernel without a baseline entry would be compared with nothing).

use super::figures::Report;
use super::render;

/// The sources a run covered: `only` as given, or every source when `only` is empty.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    only: &'a [String],
}

impl<'a> Selection<'a> {
    /// `only`: the `--only` stems (empty = every source).
    pub fn new(only: &'a [String]) -> Self {
        Selection { only }
    }

    /// Whether the run covered every source.
    pub fn is_full(&self) -> bool {
        self.only.is_empty()
    }

    /// Whether the run covered `source` (a file stem).
    pub fn covers(&self, source: &str) -> bool {
        self.is_full() || self.only.iter().any(|o| o == source)
    }
}

/// The baseline to write after a run: the run itself for a full run; for a partial run, the
/// existing baseline with the kernels of the selected sources replaced by the run's (the
/// other sources' kernels are kept as they were). A partial run from another arch or compiler
/// than the baseline's is refused: its figures cannot be mixed with the rest.
pub fn merge(base: Option<Report>, run: &Report, sel: Selection<'_>) -> Result<Report, String> {
    if sel.is_full() {
        return Ok(run.clone());
    }
    let Some(mut base) = base else {
        return Err(format!(
            "--write-baseline with --only {} but there is no baseline to merge into; run it \
             without --only to write a baseline of every kernel",
            sel.only.join(",")
        ));
    };
    if base.arch != run.arch || base.compiler != run.compiler {
        return Err(format!(
            "--write-baseline with --only: the baseline is from {} / {} and this run from {} / \
             {}; a partial run cannot be merged with figures of another compiler or arch, run \
             it without --only",
            base.arch, base.compiler, run.arch, run.compiler
        ));
    }
    base.kernels.retain(|k| !sel.covers(&k.source));
    base.kernels.extend(run.kernels.iter().cloned());
    // Sources in name order (as a full run lists them); a stable sort keeps each source's
    // kernels in the order the compiler emitted them.
    base.kernels.sort_by(|a, b| a.source.cmp(&b.source));
    base.label = run.label.clone();
    base.assumptions = run.assumptions.clone();
    Ok(base)
}

/// Regressions of `run` against `base` for the selected sources; empty when none. Baseline
/// kernels of other sources are not required (the run did not build them); a kernel of the
/// run without a baseline entry is an error, since nothing would check it.
pub fn check(base: &Report, run: &Report, sel: Selection<'_>) -> Vec<String> {
    let mut selected = base.clone();
    selected.kernels.retain(|k| sel.covers(&k.source));
    let mut bad = render::check(&selected, run);
    for k in &run.kernels {
        if !selected.kernels.iter().any(|b| b.kernel == k.kernel) {
            bad.push(format!(
                "{}: kernel of `{}` not in the baseline, so nothing checks it; add it with \
                 `cargo xtask isa-report --write-baseline --only {}`",
                k.kernel, k.source, k.source
            ));
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::figures::KernelFigures;
    use crate::isa::render::tests::report;

    fn kernel(name: &str, source: &str, vgprs: u32) -> KernelFigures {
        let mut k = report(vgprs, 80.0, 0.0, 0).kernels.remove(0);
        k.kernel = name.into();
        k.source = source.into();
        k
    }

    fn with(kernels: Vec<KernelFigures>) -> Report {
        let mut r = report(64, 80.0, 0.0, 0);
        r.kernels = kernels;
        r
    }

    fn names(r: &Report) -> Vec<&str> {
        r.kernels.iter().map(|k| k.kernel.as_str()).collect()
    }

    fn full_baseline() -> Report {
        with(vec![
            kernel("adamw_f32", "adamw", 64),
            kernel("gelu_fwd_f32", "gelu", 64),
            kernel("gelu_bwd_f32", "gelu", 64),
            kernel("matmul_f32", "matmul", 64),
        ])
    }

    #[test]
    fn a_partial_write_replaces_only_the_selected_sources() {
        let only = vec!["gelu".to_string()];
        let run = with(vec![
            kernel("gelu_fwd_f32", "gelu", 32),
            kernel("gelu_bwd_f32", "gelu", 32),
        ]);
        let merged = merge(Some(full_baseline()), &run, Selection::new(&only)).unwrap();
        assert_eq!(
            names(&merged),
            ["adamw_f32", "gelu_fwd_f32", "gelu_bwd_f32", "matmul_f32"]
        );
        let vgprs: Vec<u32> = merged.kernels.iter().map(|k| k.vgprs).collect();
        assert_eq!(vgprs, [64, 32, 32, 64], "the gelu figures are the run's");
        // A kernel renamed or removed in the selected source leaves the baseline with it.
        let run = with(vec![kernel("gelu_fwd_f32", "gelu", 32)]);
        let merged = merge(Some(full_baseline()), &run, Selection::new(&only)).unwrap();
        assert_eq!(names(&merged), ["adamw_f32", "gelu_fwd_f32", "matmul_f32"]);
    }

    #[test]
    fn a_full_write_is_the_run_and_a_partial_one_needs_a_compatible_baseline() {
        let run = with(vec![kernel("gelu_fwd_f32", "gelu", 32)]);
        let merged = merge(Some(full_baseline()), &run, Selection::new(&[])).unwrap();
        assert_eq!(names(&merged), ["gelu_fwd_f32"]);
        let only = vec!["gelu".to_string()];
        let err = merge(None, &run, Selection::new(&only)).unwrap_err();
        assert!(err.contains("no baseline"), "{err}");
        let mut other = full_baseline();
        other.compiler = "hipcc 6.0".into();
        let err = merge(Some(other), &run, Selection::new(&only)).unwrap_err();
        assert!(
            err.contains("hipcc 6.0") && err.contains("without --only"),
            "{err}"
        );
    }

    #[test]
    fn check_requires_the_selected_baseline_kernels_and_no_unchecked_ones() {
        let base = full_baseline();
        // A full run missing a kernel of the baseline fails, naming it.
        let run = with(vec![
            kernel("adamw_f32", "adamw", 64),
            kernel("gelu_fwd_f32", "gelu", 64),
            kernel("gelu_bwd_f32", "gelu", 64),
        ]);
        let bad = check(&base, &run, Selection::new(&[]));
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert!(bad[0].contains("matmul_f32") && bad[0].contains("missing"));
        // `--only gelu` requires only gelu's kernels.
        let only = vec!["gelu".to_string()];
        let gelu = with(vec![
            kernel("gelu_fwd_f32", "gelu", 64),
            kernel("gelu_bwd_f32", "gelu", 64),
        ]);
        assert!(check(&base, &gelu, Selection::new(&only)).is_empty());
        let half = with(vec![kernel("gelu_fwd_f32", "gelu", 64)]);
        let bad = check(&base, &half, Selection::new(&only));
        assert!(bad.len() == 1 && bad[0].contains("gelu_bwd_f32"), "{bad:?}");
        // A shrunken baseline (the defect: 143 kernels became 9) fails a full check.
        let shrunk = with(vec![kernel("gelu_fwd_f32", "gelu", 64)]);
        let bad = check(&shrunk, &base, Selection::new(&[]));
        assert_eq!(bad.len(), 3, "{bad:?}");
        assert!(bad.iter().all(|b| b.contains("not in the baseline")));
    }
}
