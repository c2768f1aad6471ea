//! Layer norm forward and backward over the last dimension, f64 internally.

use super::{exact, narrow, widen, Element, LayerNormShape, ShapeError};

/// Layer norm forward over the last dim of `x` `[rows, cols]`: biased variance, `eps` inside the
/// square root; writes `y` (storage type) and the per-row `mean` and `rstd` (f32, rounded from
/// f64). `y` is computed from the unrounded f64 statistics.
#[allow(clippy::too_many_arguments)]
pub fn layernorm_forward<T: Element>(
    shape: &LayerNormShape,
    eps: f32,
    x: &[T],
    weight: &[T],
    bias: &[T],
    y: &mut [T],
    mean: &mut [f32],
    rstd: &mut [f32],
) -> Result<(), ShapeError> {
    let (mut y64, mut m64, mut r64) = (
        vec![0.0; y.len()],
        vec![0.0; mean.len()],
        vec![0.0; rstd.len()],
    );
    exact::layernorm_forward(
        shape,
        eps,
        &widen(x),
        &widen(weight),
        &widen(bias),
        &mut y64,
        &mut m64,
        &mut r64,
    )?;
    narrow(&y64, y);
    narrow(&m64, mean);
    narrow(&r64, rstd);
    Ok(())
}

/// Layer norm backward from the saved f32 `mean` and `rstd`: writes `dx` `[rows, cols]` and
/// `dweight`, `dbias` `[cols]` (overwritten, not accumulated). See [`exact::layernorm_backward`].
#[allow(clippy::too_many_arguments)]
pub fn layernorm_backward<T: Element>(
    shape: &LayerNormShape,
    x: &[T],
    weight: &[T],
    dy: &[T],
    mean: &[f32],
    rstd: &[f32],
    dx: &mut [T],
    dweight: &mut [T],
    dbias: &mut [T],
) -> Result<(), ShapeError> {
    let (mut dx64, mut dw64, mut db64) = (
        vec![0.0; dx.len()],
        vec![0.0; dweight.len()],
        vec![0.0; dbias.len()],
    );
    exact::layernorm_backward(
        shape,
        &widen(x),
        &widen(weight),
        &widen(dy),
        &widen(mean),
        &widen(rstd),
        &mut dx64,
        &mut dw64,
        &mut db64,
    )?;
    narrow(&dx64, dx);
    narrow(&dw64, dweight);
    narrow(&db64, dbias);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_a_row_and_handles_one_column() {
        let s = LayerNormShape { rows: 1, cols: 4 };
        let x = [1.0f32, 2., 3., 4.];
        let (mut y, mut m, mut r) = ([0.0f32; 4], [0.0f32], [0.0f32]);
        layernorm_forward(&s, 0.0, &x, &[2.0; 4], &[1.0; 4], &mut y, &mut m, &mut r).unwrap();
        let rs = 1.0 / 1.25f64.sqrt();
        assert_eq!((m[0], r[0]), (2.5, rs as f32));
        assert_eq!(
            y,
            [
                (1.0 - 3.0 * rs) as f32,
                (1.0 - rs) as f32,
                (1.0 + rs) as f32,
                (1.0 + 3.0 * rs) as f32
            ]
        );
        // C = 1: x̂ = 0, so y = bias and dx = 0, dbias = dy.
        let s1 = LayerNormShape { rows: 2, cols: 1 };
        let (mut y, mut m, mut r) = ([9.0f32; 2], [0.0f32; 2], [0.0f32; 2]);
        layernorm_forward(
            &s1,
            1e-5,
            &[3.0, -7.0],
            &[2.0],
            &[0.5],
            &mut y,
            &mut m,
            &mut r,
        )
        .unwrap();
        assert_eq!(y, [0.5, 0.5]);
        let (mut dx, mut dw, mut db) = ([1.0f32; 2], [1.0f32], [1.0f32]);
        layernorm_backward(
            &s1,
            &[3.0, -7.0],
            &[2.0],
            &[1.5, 2.0],
            &m,
            &r,
            &mut dx,
            &mut dw,
            &mut db,
        )
        .unwrap();
        assert_eq!((dx, dw, db), ([0.0, 0.0], [0.0], [3.5]));
    }

    #[test]
    fn rejects_bad_eps_and_lengths() {
        let s = LayerNormShape { rows: 2, cols: 3 };
        let e = layernorm_forward(
            &s,
            -1.0,
            &[0.0f32; 6],
            &[0.0; 3],
            &[0.0; 3],
            &mut [0.0; 6],
            &mut [0.0; 2],
            &mut [0.0; 2],
        )
        .unwrap_err();
        assert!(e.to_string().contains("eps = -1"), "{e}");
        let e = layernorm_backward(
            &s,
            &[0.0f32; 6],
            &[0.0; 3],
            &[0.0; 6],
            &[0.0; 2],
            &[0.0; 1],
            &mut [0.0; 6],
            &mut [0.0; 3],
            &mut [0.0; 3],
        )
        .unwrap_err();
        assert_eq!(
            e,
            ShapeError::Length {
                op: "layernorm",
                tensor: "rstd",
                expected: 2,
                got: 1
            }
        );
    }
}
