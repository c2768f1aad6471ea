//! Token files in llm.c's format and the spec's sequential loader.

use crate::error::{Result, TrainError};
use std::io::Read;
use std::path::Path;

/// First header word of a token file.
pub const MAGIC: i32 = 20240520;
/// Header length in bytes (256 little-endian int32).
pub const HEADER_BYTES: usize = 1024;

/// All token ids of one file.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// The ids, each checked `< vocab`.
    pub ids: Vec<u16>,
}

impl Tokens {
    /// Read `path` (header `[20240520, 1, ntokens, 0, …]` then `ntokens` uint16), checking that the
    /// file holds exactly that many tokens and every id is `< vocab`.
    pub fn load(path: &Path, vocab: usize) -> Result<Self> {
        let (mut f, len) = crate::error::open_regular(path)?;
        let mut header = [0u8; HEADER_BYTES];
        f.read_exact(&mut header).map_err(|_| {
            TrainError::file(
                path,
                format!(
                    "is {} bytes, shorter than the {HEADER_BYTES}-byte header of a token file",
                    len
                ),
            )
        })?;
        let word =
            |i: usize| i32::from_le_bytes(header[4 * i..4 * i + 4].try_into().unwrap_or([0; 4]));
        if word(0) != MAGIC {
            return Err(TrainError::file(
                path,
                format!(
                    "header starts with {}, not the token-file magic {MAGIC}",
                    word(0)
                ),
            ));
        }
        if word(1) != 1 {
            return Err(TrainError::file(
                path,
                format!(
                    "token-file version {} is not supported (only 1: uint16 ids)",
                    word(1)
                ),
            ));
        }
        let n = usize::try_from(word(2)).map_err(|_| {
            TrainError::file(
                path,
                format!("header's token count {} is negative", word(2)),
            )
        })?;
        let expected = (HEADER_BYTES + 2 * n) as u64;
        if len != expected {
            return Err(TrainError::file(
                path,
                format!(
                    "header says {n} tokens ({expected} bytes in all) but the file is {} bytes",
                    len
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(2 * n);
        f.take(2 * n as u64)
            .read_to_end(&mut bytes)
            .map_err(TrainError::io(path))?;
        if bytes.len() != 2 * n {
            return Err(TrainError::file(path, "was truncated while read"));
        }
        let ids: Vec<u16> = bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        if let Some(i) = ids.iter().position(|&t| usize::from(t) >= vocab) {
            return Err(TrainError::file(
                path,
                format!(
                    "token {i} has id {} but the model's vocab_size is {vocab}; \
                     the data was tokenized for another vocabulary",
                    ids[i]
                ),
            ));
        }
        Ok(Self { ids })
    }
}

/// One micro-batch: `[B, T]` inputs and targets, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Input ids.
    pub inputs: Vec<i32>,
    /// Target ids (inputs shifted by one).
    pub targets: Vec<i32>,
}

/// The spec's loader: position `p`, wrapped to 0 when the next `B·T + 1` tokens do not fit.
#[derive(Debug, Clone)]
pub struct Loader {
    /// Rows B.
    pub batch: usize,
    /// Sequence length T.
    pub seq: usize,
    /// Position of the next micro-batch.
    pub pos: usize,
}

impl Loader {
    /// A loader at position 0; `tokens` must hold at least one micro-batch (`B·T + 1` tokens).
    pub fn new(path: &Path, tokens: &Tokens, batch: usize, seq: usize) -> Result<Self> {
        let need = batch * seq + 1;
        if tokens.ids.len() < need {
            return Err(TrainError::file(
                path,
                format!(
                    "holds {} tokens, fewer than one micro-batch needs (batch {batch} × seq {seq} + 1 \
                     = {need}); use more data or a smaller --batch/--seq",
                    tokens.ids.len()
                ),
            ));
        }
        Ok(Self { batch, seq, pos: 0 })
    }

    /// The next micro-batch.
    pub fn next(&mut self, tokens: &Tokens) -> Batch {
        let bt = self.batch * self.seq;
        if self.pos + bt + 1 > tokens.ids.len() {
            self.pos = 0;
        }
        let buf = &tokens.ids[self.pos..self.pos + bt + 1];
        self.pos += bt;
        Batch {
            inputs: buf[..bt].iter().map(|&t| i32::from(t)).collect(),
            targets: buf[1..].iter().map(|&t| i32::from(t)).collect(),
        }
    }
}
