//! SentencePiece models read natively, and ChatGLM3's tokenizer and LLaMA-Factory's `chatglm3`
//! template on top of them (docs/CHATGLM3-TOKENIZER.md).
//!
//! - [`model`]: `tokenizer.model` (protobuf `ModelProto`) through a bounded wire reader; a
//!   corrupt, truncated or unsupported file is an [`SpmError`] naming it.
//! - [`SpmModel::encode`]: the ids `sentencepiece` gives for a text with a BPE model (the
//!   normalizer with or without a precompiled character map, byte fallback, user-defined
//!   symbols, unused pieces).
//! - [`chatglm3`]: ChatGLM3's special tokens after the vocabulary, and one example's ids and
//!   labels exactly as LLaMA-Factory 0.9.5's supervised processor with `--template chatglm3`.
//!
//! No Python and no C++ library is involved at run time.

use std::path::{Path, PathBuf};

pub mod chatglm3;
mod encode;
pub mod model;
mod normalize;
mod wire;

pub use chatglm3::{ChatGlm3Tokenizer, Conversation, Example, Special};
pub use model::{Piece, PieceType, SpmModel};
pub use wire::WireError;

/// Why a SentencePiece model could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SpmError {
    /// Reading the file failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The file is larger than any SentencePiece model.
    #[error("{}: {size} bytes is larger than the {limit}-byte limit for a SentencePiece model; is this the right file?", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit ([`model::MAX_MODEL_BYTES`]).
        limit: u64,
    },
    /// The file is not a well-formed SentencePiece model (truncated, corrupt, inconsistent).
    #[error("{}: not a valid SentencePiece model: {msg}; copy the tokenizer.model again from the model's release", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the byte offset where there is one.
        msg: String,
    },
    /// A valid model using a feature this reader does not implement.
    #[error("{}: unsupported SentencePiece model: {what}", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The feature and its value.
        what: String,
    },
}

impl SpmError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            SpmError::Io { path, .. }
            | SpmError::TooLarge { path, .. }
            | SpmError::Corrupt { path, .. }
            | SpmError::Unsupported { path, .. } => path,
        }
    }
}

impl From<SpmError> for crate::error::TrainError {
    fn from(e: SpmError) -> Self {
        match e {
            SpmError::Io { path, source } => crate::error::TrainError::Io { path, source },
            other => {
                let path = other.path().to_path_buf();
                let full = other.to_string();
                // TrainError::File prints the path itself.
                let prefix = format!("{}: ", path.display());
                let msg = full
                    .strip_prefix(&prefix)
                    .map_or_else(|| full.clone(), str::to_string);
                crate::error::TrainError::File { path, msg }
            }
        }
    }
}

#[cfg(test)]
mod tests;
