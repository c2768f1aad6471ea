//! Scaled dot-product attention forward and backward (with lse), f64 internally.

use super::{AttentionBackward, AttentionForward};
use crate::cpu::{exact, narrow, widen};
use crate::params::{DeviceElement, Exact, Host, ShapeError};

pub use super::strided::{attention_backward_strided, attention_forward_strided};

/// [`AttentionForward`] on host slices: `out = softmax(scale·Q·Kᵀ + mask)·V` (storage type) and
/// `lse` `[batch, heads, tq]` (f32) = natural log-sum-exp of the scaled visible scores. Masking
/// and fully masked rows are described in [`super::AttentionParams`].
pub fn attention_forward<T: DeviceElement>(
    a: AttentionForward<'_, Host, T>,
) -> Result<(), ShapeError> {
    let (mut o64, mut l64) = (vec![0.0; a.out.len()], vec![0.0; a.lse.len()]);
    let cu = a.cu_seqlens.map(super::varlen::widen);
    exact::attention_forward(AttentionForward::<Exact, f64> {
        params: a.params,
        q: &widen(a.q),
        k: &widen(a.k),
        v: &widen(a.v),
        out: &mut o64,
        lse: &mut l64,
        cu_seqlens: cu.as_deref(),
    })?;
    narrow(&o64, a.out);
    narrow(&l64, a.lse);
    Ok(())
}

/// [`AttentionBackward`] on host slices, from the saved `out` and `lse`, as FlashAttention
/// defines it (see [`exact::attention_backward`]): writes `dq`, `dk`, `dv` (overwritten).
pub fn attention_backward<T: DeviceElement>(
    a: AttentionBackward<'_, Host, T>,
) -> Result<(), ShapeError> {
    let (mut dq64, mut dk64, mut dv64) = (
        vec![0.0; a.dq.len()],
        vec![0.0; a.dk.len()],
        vec![0.0; a.dv.len()],
    );
    let cu = a.cu_seqlens.map(super::varlen::widen);
    exact::attention_backward(AttentionBackward::<Exact, f64> {
        params: a.params,
        q: &widen(a.q),
        k: &widen(a.k),
        v: &widen(a.v),
        out: &widen(a.out),
        dout: &widen(a.dout),
        lse: &widen(a.lse),
        dq: &mut dq64,
        dk: &mut dk64,
        dv: &mut dv64,
        cu_seqlens: cu.as_deref(),
    })?;
    narrow(&dq64, a.dq);
    narrow(&dk64, a.dk);
    narrow(&dv64, a.dv);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::AttentionParams;

    fn shape(tq: usize, tk: usize, causal: bool) -> AttentionParams {
        AttentionParams {
            batch: 1,
            heads: 1,
            n_kv_heads: 1,
            tq,
            tk,
            head_dim: 1,
            causal,
            scale: 1.0,
        }
    }

    fn fwd(
        params: AttentionParams,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<(), ShapeError> {
        attention_forward(AttentionForward::<Host, f32> {
            params,
            q,
            k,
            v,
            out,
            lse,
            cu_seqlens: None,
        })
    }

    #[test]
    fn uniform_scores_average_values() {
        // q = 0: every visible key has weight 1/n; lse = ln n.
        let (mut out, mut lse) = ([0.0f32; 2], [0.0f32; 2]);
        fwd(
            shape(2, 3, true),
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
        fwd(s, &q, &k, &v, &mut out, &mut lse).unwrap();
        assert_eq!(out, [0.0, 0.0, 7.0]);
        assert_eq!(lse, [f32::NEG_INFINITY, f32::NEG_INFINITY, 1.5]);
        let (mut dq, mut dk, mut dv) = ([9.0f32; 3], [9.0f32], [9.0f32]);
        attention_backward(AttentionBackward::<Host, f32> {
            params: s,
            q: &q,
            k: &k,
            v: &v,
            out: &out,
            dout: &[1.0, 1.0, 2.0],
            lse: &lse,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
            cu_seqlens: None,
        })
        .unwrap();
        // One visible key: P = 1, dS = dout·v − dout·out = 0, dv = dout of the last row.
        assert_eq!((dq, dk, dv), ([0.0; 3], [0.0], [2.0]));
    }

    #[test]
    fn rejects_zero_head_dim_and_bad_lengths() {
        let s = AttentionParams {
            head_dim: 0,
            ..shape(1, 1, false)
        };
        assert!(fwd(s, &[], &[], &[], &mut [], &mut [0.0])
            .unwrap_err()
            .to_string()
            .contains("head_dim = 0"));
        let e = fwd(
            shape(2, 2, false),
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
