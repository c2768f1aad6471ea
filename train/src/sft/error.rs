//! What can be wrong with SFT data, a tokenizer directory or their flags: each error names the
//! file, the line (and the column of malformed JSON) and what to do.

use crate::error::TrainError;
use std::path::PathBuf;

/// Everything that stops reading SFT data.
#[derive(Debug, thiserror::Error)]
pub enum SftError {
    /// Flags that contradict each other (exit status 2).
    #[error("bad usage: {0}")]
    Usage(String),
    /// An I/O call failed on `path`.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A line of a JSONL file is wrong.
    #[error("{}:{line}{}: {msg}", path.display(), col.map(|c| format!(":{c}")).unwrap_or_default())]
    Line {
        /// The data file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// 1-based column (of malformed JSON or invalid UTF-8), when known.
        col: Option<u64>,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// A file of the tokenizer directory (or the data file as a whole) is wrong.
    #[error("{}: {msg}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// The background producer of micro-batches stopped (its own error was reported first).
    #[error("the SFT data producer stopped: {0}")]
    Producer(String),
}

impl SftError {
    /// An error on line `line` of `path`.
    pub fn line(path: &std::path::Path, line: u64, msg: impl Into<String>) -> Self {
        SftError::Line {
            path: path.to_path_buf(),
            line,
            col: None,
            msg: msg.into(),
        }
    }

    /// An error about the file `path` as a whole.
    pub fn file(path: &std::path::Path, msg: impl Into<String>) -> Self {
        SftError::File {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }

    /// A closure that wraps an I/O error with `path`, for `map_err`.
    pub fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| SftError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

impl From<SftError> for TrainError {
    fn from(e: SftError) -> Self {
        match e {
            SftError::Usage(m) => TrainError::Usage(m),
            SftError::Io { path, source } => TrainError::Io { path, source },
            SftError::File { path, msg } => TrainError::File { path, msg },
            SftError::Line {
                path,
                line,
                col,
                msg,
            } => TrainError::File {
                msg: format!(
                    "line {line}{}: {msg}",
                    col.map(|c| format!(", column {c}")).unwrap_or_default()
                ),
                path,
            },
            SftError::Producer(m) => TrainError::Op(format!("the SFT data producer stopped: {m}")),
        }
    }
}

/// Result of the SFT data path.
pub type Result<T, E = SftError> = std::result::Result<T, E>;
