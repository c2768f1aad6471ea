//! The first pass over an SFT file: every line read (bounded), parsed, rendered, tokenised and
//! cut; what is kept of each example is where its line starts and how many tokens and counted
//! targets it has, so the rows can be planned and the statistics printed before training
//! starts, while the examples' tokens are made again, ahead of the trainer, by the producer
//! ([`super::feeder`]). Memory: a few words per example, whatever the file's size.

use super::error::{Result, SftError};
use super::example::{encode, Example};
use super::jsonl::LineReader;
use super::pack::{plan, RowPlan};
use super::record::{parse, Record, Role};
use super::tokenizer::SftTokenizer;
use std::path::{Path, PathBuf};

/// `--cutoff-len`'s default.
pub const DEFAULT_CUTOFF_LEN: usize = 1024;

/// Check `--cutoff-len` against `--seq`: every example must fit a row whole.
pub fn check_flags(cutoff_len: usize, seq: usize) -> Result<()> {
    if cutoff_len < 2 {
        return Err(SftError::Usage(format!(
            "--cutoff-len {cutoff_len}: must be at least 2 (an example of n tokens gives n − 1 \
             training positions)"
        )));
    }
    if cutoff_len > seq + 1 {
        return Err(SftError::Usage(format!(
            "--cutoff-len {cutoff_len} with --seq {seq}: examples are packed whole, so an \
             example's n − 1 positions must fit a row; use --cutoff-len {} or less, or a larger \
             --seq",
            seq + 1
        )));
    }
    Ok(())
}

/// A kept example: where its line is and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// 1-based line number.
    pub line: u64,
    /// Byte offset of the line.
    pub offset: u64,
    /// Tokens after the cut.
    pub tokens: u32,
    /// Counted targets among its positions.
    pub counted: u32,
}

/// What the first progress line states.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Examples read (non-empty lines).
    pub read: u64,
    /// Examples dropped: no assistant turn, or no assistant token left after the cut.
    pub dropped: u64,
    /// Of those, conversations without an assistant turn.
    pub no_assistant: u64,
    /// Examples cut by `--cutoff-len` (kept or not).
    pub cut: u64,
    /// Packed rows.
    pub rows: u64,
    /// Positions of all rows (`rows · seq`).
    pub positions: u64,
    /// Padding positions among them.
    pub padding: u64,
    /// Counted targets of all rows (one epoch).
    pub counted: u64,
}

impl Stats {
    /// The share of padding, 0..=1.
    pub fn padding_share(&self) -> f64 {
        if self.positions == 0 {
            0.0
        } else {
            self.padding as f64 / self.positions as f64
        }
    }
}

/// The largest id an example holds, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxId {
    /// The id.
    pub id: u32,
    /// Its line.
    pub line: u64,
}

/// One SFT file, indexed.
#[derive(Debug, Clone)]
pub struct SftIndex {
    /// The file.
    pub path: PathBuf,
    /// `--cutoff-len`.
    pub cutoff_len: usize,
    /// `--seq`.
    pub seq: usize,
    /// The kept examples, in file order.
    pub entries: Vec<Entry>,
    /// The rows.
    pub rows: Vec<RowPlan>,
    /// Counted targets of each row.
    pub row_counted: Vec<u32>,
    /// What the first progress line states.
    pub stats: Stats,
    /// SHA-256 of the file (hex).
    pub sha256: String,
    /// The largest id of a kept example.
    pub max_id: Option<MaxId>,
}

/// Read line `text` (number `line`) of `path` into an example: `Ok(None)` for an empty line,
/// `Ok(Some(Err(())))` for a conversation without an assistant turn.
pub fn example_of_line(
    path: &Path,
    line: u64,
    text: &str,
    tok: &SftTokenizer,
    cutoff_len: usize,
) -> Result<Option<Option<Example>>> {
    let msgs = match parse(path, line, text)? {
        Record::Empty => return Ok(None),
        Record::Messages(m) => m,
    };
    if !msgs.iter().any(|m| m.role == Role::Assistant) {
        return Ok(Some(None));
    }
    encode(tok, &msgs, cutoff_len)
        .map(|e| Some(Some(e)))
        .map_err(|e| SftError::line(path, line, e.to_string()))
}

impl SftIndex {
    /// Index `path` with `tok`, cutting examples to `cutoff_len` and planning rows of `seq`.
    pub fn build(path: &Path, tok: &SftTokenizer, cutoff_len: usize, seq: usize) -> Result<Self> {
        Self::build_with(path, tok, cutoff_len, seq, |_, _| {})
    }

    /// [`build`](Self::build), handing every non-empty line's example (`None`: no assistant
    /// turn) to `visit` with its line number (the preview's look at the first examples).
    pub fn build_with(
        path: &Path,
        tok: &SftTokenizer,
        cutoff_len: usize,
        seq: usize,
        mut visit: impl FnMut(u64, Option<&Example>),
    ) -> Result<Self> {
        check_flags(cutoff_len, seq)?;
        let mut reader = LineReader::open(path)?;
        let mut entries = Vec::new();
        let mut stats = Stats::default();
        let mut max_id: Option<MaxId> = None;
        while let Some(line) = reader.next_line()? {
            let Some(ex) = example_of_line(path, line.number, &line.text, tok, cutoff_len)? else {
                continue;
            };
            stats.read += 1;
            visit(line.number, ex.as_ref());
            let Some(ex) = ex else {
                stats.dropped += 1;
                stats.no_assistant += 1;
                continue;
            };
            if ex.full_len > ex.ids.len() {
                stats.cut += 1;
            }
            if ex.is_dropped() {
                stats.dropped += 1;
                continue;
            }
            if let Some(&id) = ex.ids.iter().max() {
                if max_id.map_or(true, |m| id > m.id) {
                    max_id = Some(MaxId {
                        id,
                        line: line.number,
                    });
                }
            }
            entries.push(Entry {
                line: line.number,
                offset: line.offset,
                // ≤ cutoff_len ≤ seq + 1, which the trainer bounds well below u32.
                tokens: ex.ids.len() as u32,
                counted: ex.counted() as u32,
            });
        }
        let sha256 = reader.sha256_hex().unwrap_or_default();
        if entries.is_empty() {
            return Err(SftError::file(
                path,
                format!(
                    "holds no example to train on ({} read, {} dropped: without an assistant \
                     turn, or with no assistant token within --cutoff-len {cutoff_len})",
                    stats.read, stats.dropped
                ),
            ));
        }
        let positions: Vec<usize> = entries.iter().map(|e| e.tokens as usize - 1).collect();
        let rows = plan(&positions, seq);
        let row_counted: Vec<u32> = rows
            .iter()
            .map(|r| {
                entries[r.first..r.first + r.count]
                    .iter()
                    .map(|e| e.counted)
                    .sum()
            })
            .collect();
        stats.rows = rows.len() as u64;
        stats.positions = stats.rows * seq as u64;
        stats.padding = rows.iter().map(|r| (seq - r.used) as u64).sum();
        stats.counted = row_counted.iter().map(|&c| u64::from(c)).sum();
        Ok(Self {
            path: path.to_path_buf(),
            cutoff_len,
            seq,
            entries,
            rows,
            row_counted,
            stats,
            sha256,
            max_id,
        })
    }

    /// Every id (and the padding id) must be below the model's `vocab`.
    pub fn check_vocab(&self, vocab: usize, pad_id: u32) -> Result<()> {
        if let Some(m) = self.max_id {
            if m.id as usize >= vocab {
                return Err(SftError::line(
                    &self.path,
                    m.line,
                    format!(
                        "the tokenizer gives id {} but the model's vocab_size is {vocab}: \
                         --tokenizer is not this model's tokenizer",
                        m.id
                    ),
                ));
            }
        }
        if self.stats.padding > 0 && pad_id as usize >= vocab {
            return Err(SftError::file(
                &self.path,
                format!(
                    "the tokenizer's pad_token has id {pad_id}, not below the model's \
                     vocab_size {vocab}: --tokenizer is not this model's tokenizer"
                ),
            ));
        }
        Ok(())
    }

    /// Counted targets of `n` rows from the global row `first` (rows wrap at the end: epochs).
    pub fn counted_rows(&self, first: u64, n: u64) -> u64 {
        let r = self.rows.len() as u64;
        (first..first + n)
            .map(|g| u64::from(self.row_counted[(g % r) as usize]))
            .sum()
    }

    /// The first progress line's data part.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        format!(
            "{}: {} examples read, {} dropped ({} without an assistant turn), {} cut to \
             --cutoff-len {}, {} rows of {}, padding {:.1}%, {} trained tokens per epoch",
            self.path.display(),
            s.read,
            s.dropped,
            s.no_assistant,
            s.cut,
            self.cutoff_len,
            s.rows,
            self.seq,
            100.0 * s.padding_share(),
            s.counted
        )
    }
}
