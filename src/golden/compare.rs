//! Element-wise comparison of outputs with expected tensors, and running a case end to end.

use super::{load_case, Case, CpuBackend, GoldenBackend, GoldenError, Tensor, TensorData};
use crate::params::DType;
use crate::tolerance::Tolerance;
use std::path::Path;

/// Summary of one compared output tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorReport {
    /// Output name (without `expected_`).
    pub tensor: String,
    /// Its dtype.
    pub dtype: DType,
    /// Number of elements.
    pub len: usize,
    /// Largest `|got − expected|` over finite pairs.
    pub max_abs_err: f64,
    /// The tolerance applied.
    pub tolerance: Tolerance,
}

/// Summary of one passed case.
#[derive(Debug, Clone, PartialEq)]
pub struct CaseReport {
    /// Case name.
    pub case: String,
    /// Backend name.
    pub backend: String,
    /// Op name.
    pub op: &'static str,
    /// Storage dtype of the case.
    pub dtype: DType,
    /// One entry per expected output.
    pub tensors: Vec<TensorReport>,
}

/// The first element of an output outside tolerance.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    /// Case name.
    pub case: String,
    /// Output name.
    pub tensor: String,
    /// Flat (row-major) index of the first bad element.
    pub index: usize,
    /// The same index per dimension of the expected tensor's shape.
    pub coords: Vec<usize>,
    /// Value produced.
    pub got: f64,
    /// Value expected.
    pub expected: f64,
    /// The tolerance applied.
    pub tolerance: Tolerance,
    /// How many elements are outside tolerance.
    pub bad: usize,
    /// Elements in the tensor.
    pub len: usize,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "golden case {}: `{}`[{}] (index {:?}) = {:e}, expected {:e} (|diff| {:e} > atol {:e} + rtol {:e}·|expected|); {} of {} elements outside tolerance",
            self.case,
            self.tensor,
            self.index,
            self.coords,
            self.got,
            self.expected,
            (self.got - self.expected).abs(),
            self.tolerance.atol,
            self.tolerance.rtol,
            self.bad,
            self.len
        )
    }
}

fn coords(shape: &[usize], mut index: usize) -> Vec<usize> {
    let mut c = vec![0; shape.len()];
    for (slot, &dim) in c.iter_mut().zip(shape).rev() {
        if dim > 0 {
            *slot = index % dim;
            index /= dim;
        }
    }
    c
}

/// Compare `got` with `expected` element-wise under `tol`. Fails on a dtype or length difference
/// ([`GoldenError::OutputShape`]) or on the first element outside tolerance
/// ([`GoldenError::Mismatch`], which also counts all bad elements).
pub fn compare(
    case: &str,
    tensor: &str,
    got: &TensorData,
    expected: &Tensor,
    tol: Tolerance,
) -> Result<TensorReport, GoldenError> {
    let exp = &expected.data;
    if got.dtype() != exp.dtype() || got.len() != exp.len() {
        return Err(GoldenError::OutputShape {
            case: case.into(),
            tensor: tensor.into(),
            expected: format!("{} × {}", exp.dtype(), exp.len()),
            got: format!("{} × {}", got.dtype(), got.len()),
        });
    }
    let (mut first, mut bad, mut max_abs_err) = (None, 0usize, 0.0f64);
    for i in 0..exp.len() {
        let (g, e) = (
            got.get_f64(i).unwrap_or(f64::NAN),
            exp.get_f64(i).unwrap_or(f64::NAN),
        );
        if g.is_finite() && e.is_finite() {
            max_abs_err = max_abs_err.max((g - e).abs());
        }
        if !tol.allows(g, e) {
            bad += 1;
            first.get_or_insert((i, g, e));
        }
    }
    match first {
        None => Ok(TensorReport {
            tensor: tensor.into(),
            dtype: exp.dtype(),
            len: exp.len(),
            max_abs_err,
            tolerance: tol,
        }),
        Some((index, got, expected_v)) => Err(GoldenError::Mismatch(Box::new(Mismatch {
            case: case.into(),
            tensor: tensor.into(),
            index,
            coords: coords(&expected.shape, index),
            got,
            expected: expected_v,
            tolerance: tol,
            bad,
            len: exp.len(),
        }))),
    }
}

/// Load the case at `path` and check the CPU reference on it.
pub fn run_case(path: &Path) -> Result<CaseReport, GoldenError> {
    run_case_with(&mut CpuBackend, &load_case(path)?)
}

/// Run `backend` on `case` and compare every expected output.
pub fn run_case_with<B: GoldenBackend>(
    backend: &mut B,
    case: &Case,
) -> Result<CaseReport, GoldenError> {
    let backend_name = backend.name();
    let fail = |e: B::Error| GoldenError::Backend {
        case: case.name.clone(),
        backend: backend_name.clone(),
        source: Box::new(e),
    };
    let outputs = backend.run(&*case.inputs).map_err(fail)?;
    let mut tensors = Vec::with_capacity(case.expected.len());
    for (name, expected) in &case.expected {
        let Some((_, got)) = outputs.iter().find(|(n, _)| n == name) else {
            return Err(GoldenError::OutputShape {
                case: case.name.clone(),
                tensor: name.clone(),
                expected: "an output".into(),
                got: "nothing (the backend did not return it)".into(),
            });
        };
        let tol = case.inputs.tolerance(name, expected.data.dtype());
        tensors.push(compare(&case.name, name, got, expected, tol)?);
    }
    Ok(CaseReport {
        case: case.name.clone(),
        backend: backend_name,
        op: case.op(),
        dtype: case.dtype,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: Vec<f32>, shape: Vec<usize>) -> Tensor {
        Tensor {
            shape,
            data: TensorData::F32(v),
        }
    }

    #[test]
    fn reports_first_bad_element_with_coords() {
        let exp = t(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], vec![2, 3]);
        let got = TensorData::F32(vec![1.0, 2.0, 3.0, 4.0, 5.5, 7.0]);
        let err = compare("c", "y", &got, &exp, Tolerance::torch_default(DType::F32)).unwrap_err();
        let GoldenError::Mismatch(m) = err else {
            panic!("{err}")
        };
        assert_eq!(
            (m.index, m.coords.clone(), m.got, m.expected, m.bad),
            (4, vec![1, 1], 5.5, 5.0, 2)
        );
        let text = m.to_string();
        assert!(
            text.contains("golden case c")
                && text.contains("`y`[4]")
                && text.contains("5.5e0")
                && text.contains("expected 5e0"),
            "{text}"
        );
        assert!(compare(
            "c",
            "y",
            &TensorData::F16(vec![]),
            &exp,
            Tolerance::torch_default(DType::F32)
        )
        .is_err());
    }
}
