//! The error of the ops that read integer indices (token ids, class targets): a bad shape, or an
//! index outside its range, named by position and value.

use super::ShapeError;

/// Bad input to an op that reads integer indices.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    /// A shape, length or parameter error (see [`ShapeError`]).
    #[error(transparent)]
    Shape(#[from] ShapeError),
    /// An index is outside `0..limit` (and is not the op's ignore value, where it has one).
    #[error(
        "{op}: `{tensor}`[{position}] = {value} is out of range; it must be in 0..{limit}{allowed} \
         (check the data against the model's {limit_name} = {limit})"
    )]
    IndexOutOfRange {
        /// Operation name.
        op: &'static str,
        /// Tensor (argument) name.
        tensor: &'static str,
        /// Position of the bad element, formatted with its axis names (`b = 1, t = 3`).
        position: String,
        /// The offending value.
        value: i64,
        /// Exclusive upper bound.
        limit: usize,
        /// Name of the bound (`vocab`).
        limit_name: &'static str,
        /// Other allowed values, formatted (`" or -100 (ignored)"`), or empty.
        allowed: &'static str,
    },
}

/// The first element of `idx` outside `0..limit` and not equal to `ignore`, as an
/// [`OpError::IndexOutOfRange`] whose position is `position(flat index)`.
pub(crate) fn check_indices(
    op: &'static str,
    tensor: &'static str,
    idx: &[i32],
    (limit, limit_name): (usize, &'static str),
    ignore: Option<i32>,
    position: impl Fn(usize) -> String,
) -> Result<(), OpError> {
    let bad = idx
        .iter()
        .position(|&v| Some(v) != ignore && !usize::try_from(v).is_ok_and(|u| u < limit));
    match bad {
        None => Ok(()),
        Some(i) => Err(OpError::IndexOutOfRange {
            op,
            tensor,
            position: position(i),
            value: i64::from(idx[i]),
            limit,
            limit_name,
            allowed: if ignore.is_some() {
                " or -100 (ignored)"
            } else {
                ""
            },
        }),
    }
}
