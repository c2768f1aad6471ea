//! What every op shares: element types, the [`Space`]s an op's argument struct is generic over,
//! and [`ShapeError`] with the length helpers its `validate` uses.
//!
//! Each op's own parameters and argument struct live with the op in [`crate::ops`] (see
//! `docs/ADDING-AN-OP.md`); the CPU reference and the launcher call the same `validate`, so both
//! reject the same inputs with the same [`ShapeError`]. Every tensor is dense and row-major;
//! batched tensors are packed (batch stride = the size of one matrix).

mod element;
mod space;

pub use element::{DType, Element};
/// The 16-bit float types [`Element`] is implemented for (re-exported `half` types).
pub use half::{bf16, f16};
pub use space::{opt_numel, DeviceElement, Exact, Host, OnDevice, Space, TensorLen};

/// Bad shape, length, dtype, parameter or index value given to an op (CPU reference or device
/// launcher).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    /// A buffer has the wrong number of elements for the shape.
    #[error("{op}: `{tensor}` has {got} elements but the shape needs {expected}; pass a buffer of exactly {expected} elements")]
    Length {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
        /// Elements the shape requires.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// A tensor has the wrong element type.
    #[error("{op}: `{tensor}` is {got} but must be {expected}; convert it first")]
    DType {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
        /// Required type.
        expected: DType,
        /// Given type.
        got: DType,
    },
    /// The element count of a shape does not fit in `usize`.
    #[error("{op}: the size of `{tensor}` overflows usize; use smaller dimensions")]
    Overflow {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
    },
    /// A dimension or parameter is out of its valid range.
    #[error("{op}: {name} = {value} is invalid: {reason}")]
    Invalid {
        /// Operation name.
        op: &'static str,
        /// Parameter name.
        name: &'static str,
        /// The offending value, formatted.
        value: String,
        /// What is required.
        reason: &'static str,
    },
    /// An optional buffer is present where it must be absent, or the reverse.
    #[error("{op}: `{tensor}` must be {}; {fix}", if *.required { "given" } else { "absent" })]
    Presence {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
        /// Whether the tensor is required.
        required: bool,
        /// How to fix it.
        fix: &'static str,
    },
    /// An index input (a token id, a class target) is outside `0..limit` (and is not -100, the
    /// ignore index, where the op has one).
    #[error(
        "{op}: `{tensor}`[{position}] = {value} is out of range; it must be in 0..{limit}{} \
         (check the data against the model's size {limit})",
        if *.ignorable { " or -100 (ignored)" } else { "" }
    )]
    IndexOutOfRange {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
        /// Position of the bad element with its axis names (`b = 1, t = 3`).
        position: String,
        /// The offending value.
        value: i64,
        /// Exclusive upper bound (the vocabulary size).
        limit: usize,
        /// -100 is allowed (PyTorch's ignore_index).
        ignorable: bool,
    },
}

/// The first element of `idx` outside `0..limit` (other than -100 when `ignorable`), as a
/// [`ShapeError::IndexOutOfRange`] whose position is `position(flat index)`.
pub fn check_indices(
    op: &'static str,
    tensor: &'static str,
    idx: &[i32],
    limit: usize,
    ignorable: bool,
    position: impl Fn(usize) -> String,
) -> Result<(), ShapeError> {
    let bad = idx
        .iter()
        .position(|&v| !(usize::try_from(v).is_ok_and(|u| u < limit) || ignorable && v == -100));
    match bad {
        None => Ok(()),
        Some(i) => Err(ShapeError::IndexOutOfRange {
            op,
            tensor,
            position: position(i),
            value: i64::from(idx[i]),
            limit,
            ignorable,
        }),
    }
}

/// Product of dimensions, or [`ShapeError::Overflow`].
///
/// The product of the non-zero dimensions must fit in `usize` even when another dimension is
/// zero: code indexes with sub-products (`m·n` per batch, `tq·d` per head) whether or not the
/// batch is empty, so `[0, 2^32, 2^32]` is an overflow, not an empty tensor.
pub fn checked_len(
    op: &'static str,
    tensor: &'static str,
    dims: &[usize],
) -> Result<usize, ShapeError> {
    let non_zero = dims
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or(ShapeError::Overflow { op, tensor })?;
    Ok(if dims.contains(&0) { 0 } else { non_zero })
}

/// Check that a buffer length equals the expected element count.
pub fn check_len(
    op: &'static str,
    tensor: &'static str,
    expected: usize,
    got: usize,
) -> Result<(), ShapeError> {
    if expected == got {
        Ok(())
    } else {
        Err(ShapeError::Length {
            op,
            tensor,
            expected,
            got,
        })
    }
}

/// A [`ShapeError::Invalid`] for parameter `name` of `op`.
pub fn invalid(
    op: &'static str,
    name: &'static str,
    value: impl std::fmt::Display,
    reason: &'static str,
) -> ShapeError {
    ShapeError::Invalid {
        op,
        name,
        value: value.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_dimension_does_not_hide_an_overflow() {
        let half = 1usize << (usize::BITS / 2);
        let overflow = |tensor| ShapeError::Overflow {
            op: "matmul",
            tensor,
        };
        assert_eq!(
            checked_len("matmul", "out", &[0, half, half]),
            Err(overflow("out"))
        );
        assert_eq!(
            checked_len("matmul", "out", &[half, 0, half]),
            Err(overflow("out"))
        );
        assert_eq!(checked_len("matmul", "out", &[0, half, half - 1]), Ok(0));
        assert_eq!(checked_len("matmul", "out", &[3, 0]), Ok(0));
        assert_eq!(checked_len("matmul", "out", &[]), Ok(1));
    }
}
