//! Lines of a JSONL file with bounded memory: a line longer than [`MAX_LINE_BYTES`] is an error
//! (read no further than that), invalid UTF-8 an error naming its line and column. The reader
//! also hashes every byte it reads (the data file's fingerprint) and knows each line's offset,
//! so a later pass can seek straight to an example.

use super::error::{Result, SftError};
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The longest line read (64 MiB): far beyond any example a `--cutoff-len` keeps, small enough
/// that a file of one endless line cannot exhaust memory.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// One line: its 1-based number, the byte offset of its start and its text (without `\n` or
/// `\r\n`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// 1-based line number.
    pub number: u64,
    /// Byte offset of the line's first byte in the file.
    pub offset: u64,
    /// The text.
    pub text: String,
}

/// Reads the lines of one regular file in order.
pub struct LineReader {
    path: PathBuf,
    inner: BufReader<std::fs::File>,
    number: u64,
    offset: u64,
    max: usize,
    hash: Option<Sha256>,
    done: bool,
}

impl LineReader {
    /// Open `path` (a regular file: no FIFOs or devices) at its start, hashing what is read.
    pub fn open(path: &Path) -> Result<Self> {
        let (f, _) = crate::error::open_regular(path).map_err(|e| match e {
            crate::error::TrainError::Io { source, .. } => SftError::io(path)(source),
            other => SftError::file(path, other.to_string()),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            inner: BufReader::with_capacity(1 << 16, f),
            number: 0,
            offset: 0,
            max: MAX_LINE_BYTES,
            hash: Some(Sha256::new()),
            done: false,
        })
    }

    /// Open `path` at byte `offset`, the start of line `number` (no hashing).
    pub fn open_at(path: &Path, offset: u64, number: u64) -> Result<Self> {
        let mut r = Self::open(path)?;
        r.inner
            .seek(SeekFrom::Start(offset))
            .map_err(SftError::io(path))?;
        r.offset = offset;
        r.number = number.saturating_sub(1);
        r.hash = None;
        Ok(r)
    }

    /// The same reader with a smaller line limit (tests).
    pub fn with_max_line(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    /// The next line, `None` at the end of the file.
    pub fn next_line(&mut self) -> Result<Option<Line>> {
        if self.done {
            return Ok(None);
        }
        let start = self.offset;
        let number = self.number + 1;
        let mut bytes = Vec::new();
        loop {
            let buf = self.inner.fill_buf().map_err(SftError::io(&self.path))?;
            if buf.is_empty() {
                self.done = true;
                if bytes.is_empty() {
                    return Ok(None);
                }
                break;
            }
            let (take, end) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (buf.len(), false),
            };
            // The line's bytes without its `\n` (one `\r` more is allowed: `\r\n` endings).
            if bytes.len() + take - usize::from(end) > self.max + 1 {
                return Err(SftError::line(
                    &self.path,
                    number,
                    format!(
                        "the line is longer than {} MiB (the most one example may take); \
                         split the example, or cut it before writing the file",
                        self.max >> 20
                    ),
                ));
            }
            bytes.extend_from_slice(&buf[..take]);
            if let Some(h) = &mut self.hash {
                h.update(&buf[..take]);
            }
            self.inner.consume(take);
            if end {
                break;
            }
        }
        self.offset += bytes.len() as u64;
        self.number = number;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        let text = String::from_utf8(bytes).map_err(|e| {
            let col = e.utf8_error().valid_up_to() as u64 + 1;
            SftError::Line {
                path: self.path.clone(),
                line: number,
                col: Some(col),
                msg: "invalid UTF-8 (byte column shown); JSONL files must be UTF-8: \
                      re-encode the file (e.g. iconv -t UTF-8)"
                    .into(),
            }
        })?;
        Ok(Some(Line {
            number,
            offset: start,
            text,
        }))
    }

    /// The byte offset of the next line.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The SHA-256 of every byte read so far (the whole file once [`next_line`](Self::next_line)
    /// returned `None`), as hex; `None` for a reader opened at an offset.
    pub fn sha256_hex(&self) -> Option<String> {
        self.hash.as_ref().map(|h| hex(&h.clone().finalize()))
    }
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-256 (hex) of the files `paths`, each prefixed by its length (so moving bytes from one
/// file to the next changes the fingerprint). Reads each file whole, up to `cap` bytes.
pub fn sha256_files(paths: &[&Path], cap: u64) -> Result<String> {
    let mut h = Sha256::new();
    for p in paths {
        let (f, len) = crate::error::open_regular(p).map_err(|e| match e {
            crate::error::TrainError::Io { source, .. } => SftError::io(p)(source),
            other => SftError::file(p, other.to_string()),
        })?;
        if len > cap {
            return Err(SftError::file(
                p,
                format!("is {len} bytes, more than the {cap} this file may have"),
            ));
        }
        let mut bytes = Vec::new();
        f.take(cap)
            .read_to_end(&mut bytes)
            .map_err(SftError::io(p))?;
        h.update((bytes.len() as u64).to_le_bytes());
        h.update(&bytes);
    }
    Ok(hex(&h.finalize()))
}
