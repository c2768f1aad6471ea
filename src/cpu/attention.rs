//! Scaled dot-product attention forward and backward (with lse), f64 internally.

use super::{exact, narrow, widen, AttentionShape, Element, ShapeError};

/// Attention forward on `[batch, heads, t, head_dim]`: `out = softmax(scale·Q·Kᵀ + mask)·V`
/// (storage type) and `lse` `[batch, heads, tq]` (f32) = natural log-sum-exp of the scaled
/// visible scores. Masking and fully masked rows are described in [`AttentionShape`].
pub fn attention_forward<T: Element>(
    shape: &AttentionShape,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &mut [T],
    lse: &mut [f32],
) -> Result<(), ShapeError> {
    let (mut o64, mut l64) = (vec![0.0; out.len()], vec![0.0; lse.len()]);
    exact::attention_forward(shape, &widen(q), &widen(k), &widen(v), &mut o64, &mut l64)?;
    narrow(&o64, out);
    narrow(&l64, lse);
    Ok(())
}

/// Attention backward from the saved `out` and `lse`, as FlashAttention defines it (see
/// [`exact::attention_backward`]): writes `dq`, `dk`, `dv` (overwritten).
#[allow(clippy::too_many_arguments)]
pub fn attention_backward<T: Element>(
    shape: &AttentionShape,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &[T],
    dout: &[T],
    lse: &[f32],
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) -> Result<(), ShapeError> {
    let (mut dq64, mut dk64, mut dv64) = (
        vec![0.0; dq.len()],
        vec![0.0; dk.len()],
        vec![0.0; dv.len()],
    );
    exact::attention_backward(
        shape,
        &widen(q),
        &widen(k),
        &widen(v),
        &widen(out),
        &widen(dout),
        &widen(lse),
        &mut dq64,
        &mut dk64,
        &mut dv64,
    )?;
    narrow(&dq64, dq);
    narrow(&dk64, dk);
    narrow(&dv64, dv);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(tq: usize, tk: usize, causal: bool) -> AttentionShape {
        AttentionShape {
            batch: 1,
            heads: 1,
            tq,
            tk,
            head_dim: 1,
            causal,
            scale: 1.0,
        }
    }

    #[test]
    fn uniform_scores_average_values() {
        // q = 0: every visible key has weight 1/n; lse = ln n.
        let (mut out, mut lse) = ([0.0f32; 2], [0.0f32; 2]);
        attention_forward(
            &shape(2, 3, true),
            &[0.0, 0.0],
            &[1.0, 2.0, 3.0],
            &[3.0, 6.0, 9.0],
            &mut out,
            &mut lse,
        )
        .unwrap();
        assert_eq!(out, [4.5, 6.0]);
        assert_eq!(lse, [2f64.ln() as f32, 3f64.ln() as f32]);
    }

    #[test]
    fn fully_masked_rows_give_zero_out_neg_inf_lse_and_zero_grads() {
        let s = shape(3, 1, true);
        let (q, k, v) = ([1.0f32, 2.0, 3.0], [0.5f32], [7.0f32]);
        let (mut out, mut lse) = ([9.0f32; 3], [9.0f32; 3]);
        attention_forward(&s, &q, &k, &v, &mut out, &mut lse).unwrap();
        assert_eq!(out, [0.0, 0.0, 7.0]);
        assert_eq!(lse, [f32::NEG_INFINITY, f32::NEG_INFINITY, 1.5]);
        let (mut dq, mut dk, mut dv) = ([9.0f32; 3], [9.0f32], [9.0f32]);
        attention_backward(
            &s,
            &q,
            &k,
            &v,
            &out,
            &[1.0, 1.0, 2.0],
            &lse,
            &mut dq,
            &mut dk,
            &mut dv,
        )
        .unwrap();
        // One visible key: P = 1, dS = dout·v − dout·out = 0, dv = dout of the last row.
        assert_eq!((dq, dk, dv), ([0.0; 3], [0.0], [2.0]));
    }

    #[test]
    fn rejects_zero_head_dim_and_bad_lengths() {
        let s = AttentionShape {
            head_dim: 0,
            ..shape(1, 1, false)
        };
        assert!(
            attention_forward::<f32>(&s, &[], &[], &[], &mut [], &mut [0.0])
                .unwrap_err()
                .to_string()
                .contains("head_dim = 0")
        );
        let e = attention_forward(
            &shape(2, 2, false),
            &[0.0f32; 2],
            &[0.0; 2],
            &[0.0; 3],
            &mut [0.0; 2],
            &mut [0.0; 2],
        )
        .unwrap_err();
        assert_eq!(
            e,
            ShapeError::Length {
                op: "attention",
                tensor: "v",
                expected: 2,
                got: 3
            }
        );
    }
}
