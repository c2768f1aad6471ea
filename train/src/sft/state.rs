//! The data position a checkpoint records (row and epoch) with the fingerprints of the data
//! file and the tokenizer: resuming on other data, another tokenizer or another packing is
//! refused, naming which.

use super::error::{Result, SftError};
use super::index::SftIndex;
use super::tokenizer::SftTokenizer;
use serde::{Deserialize, Serialize};

/// Where the SFT data stands in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataState {
    /// The next row to train on, within its epoch.
    pub row: u64,
    /// Its epoch (0 = the first pass).
    pub epoch: u64,
    /// Rows per epoch.
    pub rows: u64,
    /// `--seq` the rows were packed for.
    pub seq: usize,
    /// `--cutoff-len`.
    pub cutoff_len: usize,
    /// SHA-256 of the data file.
    pub data_sha256: String,
    /// SHA-256 of tokenizer.json and tokenizer_config.json.
    pub tokenizer_sha256: String,
}

impl DataState {
    /// The state at global row `g` (`epoch · rows + row`).
    pub fn at(index: &SftIndex, tok: &SftTokenizer, g: u64) -> Self {
        let rows = index.rows.len() as u64;
        Self {
            row: g % rows,
            epoch: g / rows,
            rows,
            seq: index.seq,
            cutoff_len: index.cutoff_len,
            data_sha256: index.sha256.clone(),
            tokenizer_sha256: tok.fingerprint.clone(),
        }
    }

    /// The global row to continue from, after checking that `index` and `tok` are what the
    /// checkpoint was trained on.
    pub fn resume_row(&self, index: &SftIndex, tok: &SftTokenizer) -> Result<u64> {
        if self.data_sha256 != index.sha256 {
            return Err(SftError::file(
                &index.path,
                format!(
                    "is not the data the checkpoint was trained on (SHA-256 {} there, {} here): \
                     resume with the same --data file, or start a new run from the checkpoint's \
                     weights with --model",
                    short(&self.data_sha256),
                    short(&index.sha256)
                ),
            ));
        }
        if self.tokenizer_sha256 != tok.fingerprint {
            return Err(SftError::file(
                &tok.dir,
                format!(
                    "is not the tokenizer the checkpoint was trained with (tokenizer.json and \
                     tokenizer_config.json: SHA-256 {} there, {} here): resume with the same \
                     --tokenizer",
                    short(&self.tokenizer_sha256),
                    short(&tok.fingerprint)
                ),
            ));
        }
        if self.seq != index.seq || self.cutoff_len != index.cutoff_len {
            return Err(SftError::Usage(format!(
                "--seq {} --cutoff-len {}: the checkpoint packed its rows with --seq {} \
                 --cutoff-len {}; resume with those",
                index.seq, index.cutoff_len, self.seq, self.cutoff_len
            )));
        }
        let rows = index.rows.len() as u64;
        if self.rows != rows || self.row >= rows {
            return Err(SftError::file(
                &index.path,
                format!(
                    "packs into {rows} rows, but the checkpoint has {} (row {}): the checkpoint's \
                     data state is inconsistent",
                    self.rows, self.row
                ),
            ));
        }
        self.epoch
            .checked_mul(rows)
            .and_then(|g| g.checked_add(self.row))
            .ok_or_else(|| SftError::file(&index.path, format!("epoch {} overflows", self.epoch)))
    }
}

/// The first 12 hex digits of a fingerprint.
fn short(h: &str) -> &str {
    h.get(..12).unwrap_or(h)
}
