//! GPT-2's encoder: token embedding plus position embedding, forward and backward, f64
//! internally.

use super::error::check_indices;
use super::{Element, OpError, ShapeError};
use crate::params::{check_len, checked_len};

/// Dimensions of the token + position embedding of `tokens` `[batch, seq]` with `wte` `[vocab, channels]` and
/// `wpe` `[positions, channels]` (only the first `seq` rows of `wpe` are used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncoderParams {
    /// Batch size B.
    pub batch: usize,
    /// Sequence length T (≤ `positions`).
    pub seq: usize,
    /// Embedding width C (≥ 1).
    pub channels: usize,
    /// Vocabulary size V (rows of `wte`); token ids must be in `0..vocab`.
    pub vocab: usize,
    /// Rows of `wpe` (GPT-2's `n_positions`), at least `seq`.
    pub positions: usize,
    /// Backward only: add into `dwte`/`dwpe` (gradient accumulation, a `wte` tied to the
    /// classifier) instead of overwriting them. The forward ignores it.
    pub accumulate: bool,
}

impl EncoderParams {
    /// Operation name used in errors and kernel names.
    pub const OP: &'static str = "encoder";

    /// Elements of `tokens` (`[batch, seq]`).
    pub fn tokens_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "tokens", &[self.batch, self.seq])
    }

    /// Elements of `out` / `dout` (`[batch, seq, channels]`).
    pub fn out_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "out", &[self.batch, self.seq, self.channels])
    }

    /// Elements of `wte` / `dwte` (`[vocab, channels]`).
    pub fn wte_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "wte", &[self.vocab, self.channels])
    }

    /// Elements of `wpe` / `dwpe` (`[positions, channels]`).
    pub fn wpe_len(&self) -> Result<usize, ShapeError> {
        checked_len(Self::OP, "wpe", &[self.positions, self.channels])
    }

    /// Check the dimensions and the lengths of `tokens`, the `[B, T, C]` tensor (`out` or
    /// `dout`), the `wte`-shaped and the `wpe`-shaped tensor (`tensors` names them).
    pub fn validate(
        &self,
        tensors: [&'static str; 4],
        tokens: usize,
        btc: usize,
        wte: usize,
        wpe: usize,
    ) -> Result<(), ShapeError> {
        if self.channels == 0 {
            return Err(ShapeError::Invalid {
                op: Self::OP,
                name: "channels",
                value: "0".into(),
                reason: "must be at least 1",
            });
        }
        if self.seq > self.positions {
            return Err(ShapeError::Invalid {
                op: Self::OP,
                name: "seq",
                value: format!("{} (positions = {})", self.seq, self.positions),
                reason: "must not exceed the rows of wpe; use a shorter sequence",
            });
        }
        check_len(Self::OP, tensors[0], self.tokens_len()?, tokens)?;
        check_len(Self::OP, tensors[1], self.out_len()?, btc)?;
        check_len(Self::OP, tensors[2], self.wte_len()?, wte)?;
        check_len(Self::OP, tensors[3], self.wpe_len()?, wpe)
    }

    /// Check that every token id is in `0..vocab` ([`OpError::IndexOutOfRange`] names the first
    /// bad one by `b`, `t` and value).
    pub fn check_tokens(&self, tokens: &[i32]) -> Result<(), OpError> {
        let seq = self.seq.max(1);
        check_indices(
            Self::OP,
            "tokens",
            tokens,
            (self.vocab, "vocab"),
            None,
            |i| format!("b = {}, t = {}", i / seq, i % seq),
        )
    }
}

/// Arguments of [`encoder_forward`].
#[derive(Debug)]
pub struct EncoderForward<'a, T> {
    /// Dimensions.
    pub params: EncoderParams,
    /// Token ids `[batch, seq]`, each in `0..vocab`.
    pub tokens: &'a [i32],
    /// Token embedding `[vocab, channels]`.
    pub wte: &'a [T],
    /// Position embedding `[positions, channels]`.
    pub wpe: &'a [T],
    /// Output `[batch, seq, channels]` (overwritten).
    pub out: &'a mut [T],
    /// Device only, optional: one `u32` the device sets to the first row `b·seq + t` whose
    /// token id is out of range (`u32::MAX` if none). The CPU reference returns the error
    /// instead and does not use it.
    pub error: Option<&'a mut [u32]>,
}

/// `out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]`, each sum rounded once.
///
/// Every length and every token id is checked before `out` is written.
pub fn encoder_forward<T: Element>(args: EncoderForward<'_, T>) -> Result<(), OpError> {
    let EncoderForward {
        params: shape,
        tokens,
        wte,
        wpe,
        out,
        error: _,
    } = args;
    shape.validate(
        ["tokens", "out", "wte", "wpe"],
        tokens.len(),
        out.len(),
        wte.len(),
        wpe.len(),
    )?;
    shape.check_tokens(tokens)?;
    let c = shape.channels;
    let t_len = shape.seq.max(1);
    for (i, (row, &tok)) in out.chunks_mut(c).zip(tokens).enumerate() {
        let t = i % t_len;
        // Checked above: 0 <= tok < vocab.
        let tok = tok as usize;
        let (e, p) = (&wte[tok * c..][..c], &wpe[t * c..][..c]);
        for ((o, e), p) in row.iter_mut().zip(e).zip(p) {
            *o = T::from_f64(e.to_f64() + p.to_f64());
        }
    }
    Ok(())
}

/// Arguments of [`encoder_backward`].
#[derive(Debug)]
pub struct EncoderBackward<'a, T> {
    /// Dimensions.
    pub params: EncoderParams,
    /// Token ids `[batch, seq]` of the forward, each in `0..vocab`.
    pub tokens: &'a [i32],
    /// Gradient of the forward's `out`, `[batch, seq, channels]`.
    pub dout: &'a [T],
    /// Gradient of `wte`, `[vocab, channels]`.
    pub dwte: &'a mut [T],
    /// Gradient of `wpe`, `[positions, channels]`.
    pub dwpe: &'a mut [T],
    /// Device only, optional: as [`EncoderForward::error`].
    pub error: Option<&'a mut [u32]>,
}

/// Embedding backward: `dwte[v, :] (+)= Σ_{(b,t): tokens[b,t] = v} dout[b, t, :]` and
/// `dwpe[t, :] (+)= Σ_b dout[b, t, :]`.
///
/// Each sum is formed in f64 in `(b, t)` order and rounded once into its slot (with
/// `accumulate`, the old value is part of that one rounding), so the result does not depend on
/// threads or order. With `accumulate = false`, rows of tokens that do not occur and rows
/// `t ≥ seq` of `dwpe` are set to 0; with `accumulate = true` they are not written. Every length
/// and token id is checked before anything is written.
pub fn encoder_backward<T: Element>(args: EncoderBackward<'_, T>) -> Result<(), OpError> {
    let EncoderBackward {
        params: shape,
        tokens,
        dout,
        dwte,
        dwpe,
        error: _,
    } = args;
    let accumulate = shape.accumulate;
    shape.validate(
        ["tokens", "dout", "dwte", "dwpe"],
        tokens.len(),
        dout.len(),
        dwte.len(),
        dwpe.len(),
    )?;
    shape.check_tokens(tokens)?;
    let c = shape.channels;
    if !accumulate {
        dwte.fill(T::from_f64(0.0));
        dwpe.fill(T::from_f64(0.0));
    }
    let store = |slot: &mut T, sum: f64| {
        let old = if accumulate { slot.to_f64() } else { 0.0 };
        *slot = T::from_f64(old + sum);
    };
    // dwte: positions grouped by token (stable, so each group is in (b, t) order).
    let mut order: Vec<usize> = (0..tokens.len()).collect();
    order.sort_by_key(|&i| tokens[i]);
    let mut acc = vec![0.0f64; c];
    for group in order.chunk_by(|&i, &j| tokens[i] == tokens[j]) {
        acc.fill(0.0);
        for &i in group {
            for (a, g) in acc.iter_mut().zip(&dout[i * c..][..c]) {
                *a += g.to_f64();
            }
        }
        let tok = tokens[group[0]] as usize;
        for (slot, &s) in dwte[tok * c..][..c].iter_mut().zip(&acc) {
            store(slot, s);
        }
    }
    // dwpe: rows 0..seq, summed over the batch in order.
    let t_len = shape.seq;
    for t in 0..t_len {
        acc.fill(0.0);
        for b in 0..shape.batch {
            for (a, g) in acc.iter_mut().zip(&dout[(b * t_len + t) * c..][..c]) {
                *a += g.to_f64();
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
        encoder_forward(EncoderForward {
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
        encoder_backward(EncoderBackward {
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
        encoder_backward(EncoderBackward {
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
        let e = encoder_forward(EncoderForward {
            params: shape(),
            tokens: &[0, 1, 2, 3],
            wte: &[0.0; 6],
            wpe: &[0.0; 6],
            out: &mut out,
            error: None,
        })
        .unwrap_err();
        assert!(
            matches!(&e, OpError::IndexOutOfRange { value: 3, limit: 3, position, .. } if position == "b = 1, t = 1"),
            "{e}"
        );
        assert!(e.to_string().contains("`tokens`[b = 1, t = 1] = 3"), "{e}");
        assert_eq!(out, [7.0; 8]);
        let (mut dwte, mut dwpe) = ([7.0f32; 6], [7.0f32; 6]);
        let e = encoder_backward(EncoderBackward {
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
        let e = encoder_forward(EncoderForward {
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
