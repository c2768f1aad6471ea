//! The encoder's CPU reference: sums in f64, one rounding per stored value.

use super::{EncoderBackward, EncoderForward};
use crate::params::{DeviceElement, Host, ShapeError};

/// `out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]`, each sum rounded once.
///
/// Every length and every token id is checked before `out` is written
/// ([`ShapeError::IndexOutOfRange`] names the first bad id by `b`, `t` and value); `error` is
/// not used.
pub fn encoder_forward<T: DeviceElement>(a: EncoderForward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    p.check_tokens(a.tokens)?;
    let c = p.channels;
    let seq = p.seq.max(1);
    for (i, (row, &tok)) in a.out.chunks_mut(c).zip(a.tokens).enumerate() {
        // Checked above: 0 <= tok < vocab.
        let tok = tok as usize;
        let (e, w) = (&a.wte[tok * c..][..c], &a.wpe[(i % seq) * c..][..c]);
        for ((o, e), w) in row.iter_mut().zip(e).zip(w) {
            *o = T::from_f64(e.to_f64() + w.to_f64());
        }
    }
    Ok(())
}

/// Embedding backward: `dwte[v, :] (+)= Σ_{(b,t): tokens[b,t] = v} dout[b, t, :]` and
/// `dwpe[t, :] (+)= Σ_b dout[b, t, :]`.
///
/// Each sum is formed in f64 in `(b, t)` order and rounded once into its slot (with
/// `accumulate`, the old value is part of that one rounding), so the result does not depend on
/// threads or order. With `accumulate = false`, rows of tokens that do not occur and rows
/// `t ≥ seq` of `dwpe` are set to 0; with `accumulate = true` they are not written. Every length
/// and token id is checked before anything is written.
pub fn encoder_backward<T: DeviceElement>(
    a: EncoderBackward<'_, Host, T>,
) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    p.check_tokens(a.tokens)?;
    let (tokens, dout, c) = (a.tokens, a.dout, p.channels);
    let (dwte, dwpe) = (a.dwte, a.dwpe);
    if !p.accumulate {
        dwte.fill(T::from_f64(0.0));
        dwpe.fill(T::from_f64(0.0));
    }
    let store = |slot: &mut T, sum: f64| {
        let old = if p.accumulate { slot.to_f64() } else { 0.0 };
        *slot = T::from_f64(old + sum);
    };
    // dwte: positions grouped by token (stable, so each group is in (b, t) order).
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    order.sort_by_key(|&i| tokens[i]);
    let mut acc = vec![0.0f64; c];
    for group in order.chunk_by(|&i, &j| tokens[i] == tokens[j]) {
        acc.fill(0.0);
        for &i in group {
            for (s, g) in acc.iter_mut().zip(&dout[i * c..][..c]) {
                *s += g.to_f64();
            }
        }
        let tok = tokens[group[0]] as usize;
        for (slot, &s) in dwte[tok * c..][..c].iter_mut().zip(&acc) {
            store(slot, s);
        }
    }
    // dwpe: rows 0..seq, summed over the batch in order.
    for t in 0..p.seq {
        acc.fill(0.0);
        for b in 0..p.batch {
            for (s, g) in acc.iter_mut().zip(&dout[(b * p.seq + t) * c..][..c]) {
                *s += g.to_f64();
            }
        }
        for (slot, &s) in dwpe[t * c..][..c].iter_mut().zip(&acc) {
            store(slot, s);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::encoder::EncoderParams;
    use crate::params::Host;

    fn shape() -> EncoderParams {
        EncoderParams {
            batch: 2,
            seq: 2,
            channels: 2,
            vocab: 3,
            positions: 3,
            accumulate: false,
        }
    }

    #[test]
    fn forward_adds_rows_and_backward_sums_repeats() {
        let wte = [1.0f32, 2., 10., 20., 100., 200.];
        let wpe = [0.5f32, 0.25, 0.125, 0.0625, 9.0, 9.0];
        let tokens = [2, 0, 2, 2];
        let mut out = [0.0f32; 8];
        encoder_forward(EncoderForward::<Host, f32> {
            params: shape(),
            tokens: &tokens,
            wte: &wte,
            wpe: &wpe,
            out: &mut out,
            error: None,
        })
        .unwrap();
        assert_eq!(
            out,
            [100.5, 200.25, 1.125, 2.0625, 100.5, 200.25, 100.125, 200.0625]
        );
        let dout = [1.0f32, 2., 3., 4., 5., 6., 7., 8.];
        let (mut dwte, mut dwpe) = ([9.0f32; 6], [1.0f32; 6]);
        encoder_backward(EncoderBackward::<Host, f32> {
            params: shape(),
            tokens: &tokens,
            dout: &dout,
            dwte: &mut dwte,
            dwpe: &mut dwpe,
            error: None,
        })
        .unwrap();
        // Token 2 at (0,0), (1,0), (1,1); token 0 at (0,1); token 1 never.
        assert_eq!(dwte, [3., 4., 0., 0., 13., 16.]);
        assert_eq!(dwpe, [6., 8., 10., 12., 0., 0.]);
        encoder_backward(EncoderBackward::<Host, f32> {
            params: EncoderParams {
                accumulate: true,
                ..shape()
            },
            tokens: &tokens,
            dout: &dout,
            dwte: &mut dwte,
            dwpe: &mut dwpe,
            error: None,
        })
        .unwrap();
        assert_eq!(dwte, [6., 8., 0., 0., 26., 32.]);
        assert_eq!(dwpe, [12., 16., 20., 24., 0., 0.]);
    }

    #[test]
    fn bad_token_is_named_and_nothing_is_written() {
        let mut out = [7.0f32; 8];
        let e = encoder_forward(EncoderForward::<Host, f32> {
            params: shape(),
            tokens: &[0, 1, 2, 3],
            wte: &[0.0; 6],
            wpe: &[0.0; 6],
            out: &mut out,
            error: None,
        })
        .unwrap_err();
        assert!(
            matches!(&e, ShapeError::IndexOutOfRange { value: 3, limit: 3, position, .. } if position == "b = 1, t = 1"),
            "{e}"
        );
        assert!(e.to_string().contains("`tokens`[b = 1, t = 1] = 3"), "{e}");
        assert_eq!(out, [7.0; 8]);
        let (mut dwte, mut dwpe) = ([7.0f32; 6], [7.0f32; 6]);
        let e = encoder_backward(EncoderBackward::<Host, f32> {
            params: shape(),
            tokens: &[0, -1, 2, 1],
            dout: &[0.0; 8],
            dwte: &mut dwte,
            dwpe: &mut dwpe,
            error: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("= -1"), "{e}");
        assert_eq!((dwte, dwpe), ([7.0; 6], [7.0; 6]));
        let e = encoder_forward(EncoderForward::<Host, f32> {
            params: EncoderParams { seq: 4, ..shape() },
            tokens: &[0; 8],
            wte: &[0.0f32; 6],
            wpe: &[0.0; 6],
            out: &mut [0.0; 16],
            error: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("seq = 4 (positions = 3)"), "{e}");
    }
}
