//! Token files in llm.c's formats (GPT-2's uint16, LLaMA 3's uint32), the spec's sequential
//! loader and the micro-batch it hands the model.

use crate::error::{Result, TrainError};
use std::io::Read;
use std::path::Path;

/// First header word of a GPT-2 token file (llm.c's `dev/data` format, uint16 ids).
pub const MAGIC: i32 = 20240520;
/// First header word of a LLaMA-3 token file (llm.c's `llama3` branch, uint32 ids).
pub const MAGIC_LLAMA3: i32 = 20240801;
/// Header length in bytes (256 little-endian int32).
pub const HEADER_BYTES: usize = 1024;

/// All token ids of one file.
#[derive(Debug, Clone)]
pub struct Tokens {
    /// The ids, each checked `< vocab`.
    pub ids: Vec<u32>,
}

impl Tokens {
    /// Read `path`: header `[20240520, 1, n, 0, …]` then `n` uint16 ids (GPT-2), or
    /// `[20240801, 7, n, 0, …]` then `n` uint32 ids (LLaMA 3), checking that the file holds
    /// exactly that many tokens and every id is `< vocab`.
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
        let width: usize = match (word(0), word(1)) {
            (MAGIC, 1) => 2,
            (MAGIC_LLAMA3, 7) => 4,
            (MAGIC, v) | (MAGIC_LLAMA3, v) => {
                return Err(TrainError::file(
                    path,
                    format!(
                        "token-file version {v} is not supported for magic {} (only \
                         {MAGIC} version 1: uint16 ids, and {MAGIC_LLAMA3} version 7: uint32 ids)",
                        word(0)
                    ),
                ))
            }
            (m, _) => {
                return Err(TrainError::file(
                    path,
                    format!(
                        "header starts with {m}, not a token-file magic ({MAGIC} for uint16 \
                         GPT-2 ids, {MAGIC_LLAMA3} for uint32 LLaMA-3 ids)"
                    ),
                ))
            }
        };
        let n = usize::try_from(word(2)).map_err(|_| {
            TrainError::file(
                path,
                format!("header's token count {} is negative", word(2)),
            )
        })?;
        let expected = (HEADER_BYTES + width * n) as u64;
        if len != expected {
            return Err(TrainError::file(
                path,
                format!(
                    "header says {n} tokens ({expected} bytes in all) but the file is {} bytes",
                    len
                ),
            ));
        }
        let mut bytes = Vec::with_capacity(width * n);
        f.take((width * n) as u64)
            .read_to_end(&mut bytes)
            .map_err(TrainError::io(path))?;
        if bytes.len() != width * n {
            return Err(TrainError::file(path, "was truncated while read"));
        }
        let ids: Vec<u32> = match width {
            2 => bytes
                .chunks_exact(2)
                .map(|b| u32::from(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            _ => bytes
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        };
        if let Some(i) = ids
            .iter()
            .position(|&t| usize::try_from(t).map_or(true, |t| t >= vocab))
        {
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

/// A target that is not counted in the loss (the HF/PyTorch `ignore_index`).
pub const IGNORE: i32 = -100;

/// One micro-batch: `[B, T]` inputs and targets, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Input ids.
    pub inputs: Vec<i32>,
    /// Target ids (inputs shifted by one for a token stream); [`IGNORE`] (−100) is not counted.
    pub targets: Vec<i32>,
    /// Position ids of every input (`None`: `0..T` in every row, the token stream).
    pub positions: Option<Vec<i32>>,
    /// Sequence boundaries as offsets over the flattened `B·T` positions, starting at 0 and
    /// ending at `B·T` (`None`: every row is one sequence). Attention never crosses them.
    pub cu_seqlens: Option<Vec<i32>>,
}

impl Batch {
    /// A token-stream micro-batch: every target counted, positions `0..T`, one sequence a row.
    pub fn stream(inputs: Vec<i32>, targets: Vec<i32>) -> Self {
        Self {
            inputs,
            targets,
            positions: None,
            cu_seqlens: None,
        }
    }

    /// The positions `range` of the flattened batch (a rank's rows): inputs, targets and
    /// positions cut, and `cu_seqlens` cut to the boundaries inside the range, re-based to start
    /// at 0, with the range's ends added (a sequence crossing an end is split there: each part
    /// still sees only its own sequence's keys before it within the range).
    pub fn rows(&self, range: std::ops::Range<usize>) -> Batch {
        let cut = |v: &Vec<i32>| {
            v.get(range.clone())
                .map(<[i32]>::to_vec)
                .unwrap_or_default()
        };
        let cu_seqlens = self.cu_seqlens.as_ref().map(|cu| {
            let (lo, hi) = (range.start as i64, range.end as i64);
            let mut out = vec![0i32];
            for &c in cu {
                let c = i64::from(c);
                if c > lo && c < hi {
                    out.push(i32::try_from(c - lo).unwrap_or(i32::MAX));
                }
            }
            out.push(i32::try_from(hi - lo).unwrap_or(i32::MAX));
            out
        });
        Batch {
            inputs: cut(&self.inputs),
            targets: cut(&self.targets),
            positions: self.positions.as_ref().map(cut),
            cu_seqlens,
        }
    }

    /// Targets counted in the loss (not [`IGNORE`]) among `rows` of the batch's targets.
    pub fn counted(&self, rows: std::ops::Range<usize>) -> usize {
        self.targets
            .get(rows)
            .map_or(0, |t| t.iter().filter(|&&y| y != IGNORE).count())
    }
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
        // Ids are < vocab ≤ 2^24 (checked at load), so they fit an i32.
        let id = |&t: &u32| i32::try_from(t).unwrap_or(i32::MAX);
        Batch::stream(
            buf[..bt].iter().map(id).collect(),
            buf[1..].iter().map(id).collect(),
        )
    }
}
