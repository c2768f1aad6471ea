//! The trainer's one error type: what went wrong, naming the file, tensor or value, and the exit
//! status it maps to (2 bad usage, 1 everything found at run time).

use std::path::{Path, PathBuf};

/// Everything that stops the trainer.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Flags that contradict each other or are out of range (exit status 2).
    #[error("bad usage: {0}")]
    Usage(String),
    /// An I/O call failed on `path`.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The content of a file is wrong (config, weights, tokens, checkpoint).
    #[error("{}: {msg}", path.display())]
    File {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong and how to fix it.
        msg: String,
    },
    /// An op of the backend rejected its arguments (a trainer bug or a bad model shape).
    #[error("{0}")]
    Op(String),
    /// The HIP device or runtime failed (no device, out of memory, a failed launch).
    #[error("device: {0}")]
    Device(String),
    /// A token id the device found out of range (reported through its flag at the step's read).
    #[error(
        "{what} id {value} at b = {b}, t = {t} is not below the model's vocab_size {vocab}; \
         the data was tokenized for another vocabulary"
    )]
    BadToken {
        /// Which ids: `input token` or `target token`.
        what: &'static str,
        /// Row of the micro-batch.
        b: usize,
        /// Position in the row.
        t: usize,
        /// The id.
        value: i32,
        /// The model's vocabulary size.
        vocab: usize,
    },
}

impl TrainError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            TrainError::Usage(_) => 2,
            _ => 1,
        }
    }

    /// A content error in `path`.
    pub fn file(path: &Path, msg: impl Into<String>) -> Self {
        TrainError::File {
            path: path.to_path_buf(),
            msg: msg.into(),
        }
    }

    /// A closure that wraps an I/O error with `path`, for `map_err`.
    pub fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Self + '_ {
        move |source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// An op's error (its arguments rejected) as a [`TrainError::Op`].
pub fn op(e: impl std::fmt::Display) -> TrainError {
    TrainError::Op(e.to_string())
}

/// An op struct's run (`hip_kernels::ops::Run`) that failed, as [`op`] reports it, so that the
/// model's `.run(queue)?` reads as one line.
impl From<hip_kernels::ops::OpError> for TrainError {
    fn from(e: hip_kernels::ops::OpError) -> Self {
        op(e)
    }
}

/// A device or runtime error as a [`TrainError::Device`].
pub fn dev(e: impl std::fmt::Display) -> TrainError {
    TrainError::Device(e.to_string())
}

/// Result of the trainer.
pub type Result<T, E = TrainError> = std::result::Result<T, E>;

/// Open `path` only if it is a regular file, without blocking on a FIFO (checked on the opened
/// file); returns it and its size.
pub fn open_regular(path: &Path) -> Result<(std::fs::File, u64)> {
    hip_kernels::files::open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => TrainError::file(path, e.to_string()),
        _ => TrainError::io(path)(e),
    })
}

/// Read a whole regular file of at most `cap` bytes (no FIFOs, devices or endless files).
pub fn read_regular(path: &Path, cap: u64) -> Result<Vec<u8>> {
    hip_kernels::files::read_bounded(path, cap).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
            TrainError::file(path, e.to_string())
        }
        _ => TrainError::io(path)(e),
    })
}
