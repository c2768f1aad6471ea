//! GPT-2's encoder: token embedding plus position embedding, forward and a deterministic
//! backward. The op's parameters and argument structs ([`EncoderForward`], [`EncoderBackward`]),
//! shared by the CPU reference ([`crate::cpu`]) and the launchers (`kernels/encoder.hip`).

pub(crate) mod cpu;
mod device;
#[cfg(feature = "golden")]
mod golden;

pub use device::{encoder_backward, encoder_forward, NO_ERROR};
#[cfg(feature = "golden")]
pub(crate) use golden::GOLDEN;
#[cfg(feature = "golden")]
pub use golden::{EncoderBackwardCase, EncoderForwardCase};

use crate::params::{check_len, checked_len, invalid, ShapeError, Space, TensorLen};

// Each struct runs itself on its space (`ops::Run`): the CPU reference, or the launcher.
crate::ops::run::launch! {
    EncoderForward['a] T => encoder_forward, encoder_forward;
    EncoderBackward['a] T => encoder_backward, encoder_backward;
}

/// Dimensions of the embedding of `tokens` `[batch, seq]` with `wte` `[vocab, channels]` and
/// `wpe` `[positions, channels]` (only the first `seq` rows of `wpe` are used), and the
/// backward's `accumulate`.
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
    /// Operation name used in errors.
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

    /// Check the dimensions and the lengths of `tokens`, the `[B, T, C]` tensor, the `wte`-shaped
    /// and the `wpe`-shaped tensor (`names` names the last three).
    fn validate(
        &self,
        names: [&'static str; 3],
        tokens: usize,
        btc: usize,
        wte: usize,
        wpe: usize,
    ) -> Result<(), ShapeError> {
        if self.channels == 0 {
            return Err(invalid(Self::OP, "channels", 0, "must be at least 1"));
        }
        if self.seq > self.positions {
            return Err(invalid(
                Self::OP,
                "seq",
                format!("{} (positions = {})", self.seq, self.positions),
                "must not exceed the rows of wpe; use a shorter sequence",
            ));
        }
        check_len(Self::OP, "tokens", self.tokens_len()?, tokens)?;
        check_len(Self::OP, names[0], self.out_len()?, btc)?;
        check_len(Self::OP, names[1], self.wte_len()?, wte)?;
        check_len(Self::OP, names[2], self.wpe_len()?, wpe)
    }

    /// Check that every token id is in `0..vocab` ([`ShapeError::IndexOutOfRange`] names the
    /// first bad one by `b`, `t` and value). The CPU reference calls it; the device reports bad
    /// ids through the `error` flag instead (it never reads tokens on the host).
    pub fn check_tokens(&self, tokens: &[i32]) -> Result<(), ShapeError> {
        let seq = self.seq.max(1);
        crate::params::check_indices(Self::OP, "tokens", tokens, self.vocab, false, |i| {
            format!("b = {}, t = {}", i / seq, i % seq)
        })
    }
}

/// `out[b, t, :] = wte[tokens[b, t], :] + wpe[t, :]`.
pub struct EncoderForward<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions (`accumulate` unused).
    pub params: EncoderParams,
    /// Token ids `[batch, seq]`, each in `0..vocab`.
    pub tokens: S::In<'a, i32>,
    /// Token embedding `[vocab, channels]`.
    pub wte: S::In<'a, T>,
    /// Position embedding `[positions, channels]`.
    pub wpe: S::In<'a, T>,
    /// Output `[batch, seq, channels]` (overwritten).
    pub out: S::Out<'a, T>,
    /// Device only, optional: one `u32` set to the first row `b·seq + t` whose token id is out
    /// of range, or [`NO_ERROR`] (the CPU reference returns the error instead and ignores it).
    pub error: Option<S::Out<'a, u32>>,
}

impl<S: Space, T: hip_rt::Element> EncoderForward<'_, S, T> {
    /// Check every length (the CPU reference and the launcher call this first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        self.params.validate(
            ["out", "wte", "wpe"],
            self.tokens.numel(),
            self.out.numel(),
            self.wte.numel(),
            self.wpe.numel(),
        )?;
        check_error_len(&self.error)
    }
}

/// `dwte[v, :] (+)= Σ_{(b,t): tokens[b,t] = v} dout[b, t, :]`, `dwpe[t, :] (+)= Σ_b dout[b, t, :]`.
pub struct EncoderBackward<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions and `accumulate`.
    pub params: EncoderParams,
    /// Token ids `[batch, seq]` of the forward, each in `0..vocab`.
    pub tokens: S::In<'a, i32>,
    /// Gradient of the forward's `out`, `[batch, seq, channels]`.
    pub dout: S::In<'a, T>,
    /// Gradient of `wte`, `[vocab, channels]`.
    pub dwte: S::Out<'a, T>,
    /// Gradient of `wpe`, `[positions, channels]`.
    pub dwpe: S::Out<'a, T>,
    /// Device only, optional: as [`EncoderForward::error`].
    pub error: Option<S::Out<'a, u32>>,
}

impl<S: Space, T: hip_rt::Element> EncoderBackward<'_, S, T> {
    /// Check every length (the CPU reference and the launcher call this first).
    pub fn validate(&self) -> Result<(), ShapeError> {
        self.params.validate(
            ["dout", "dwte", "dwpe"],
            self.tokens.numel(),
            self.dout.numel(),
            self.dwte.numel(),
            self.dwpe.numel(),
        )?;
        check_error_len(&self.error)
    }
}

fn check_error_len(error: &Option<impl TensorLen>) -> Result<(), ShapeError> {
    match error {
        Some(e) => check_len(EncoderParams::OP, "error", 1, e.numel()),
        None => Ok(()),
    }
}
