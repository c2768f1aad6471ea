//! The trainer's view of SFT data: global micro-batches (all ranks' `W·B` rows, each rank cuts
//! its own) made ahead by the [`Feeder`], the data position for checkpoints, the held-out set,
//! and the first progress line's statistics.

use super::error::{Result, SftError};
use super::eval::eval_batches;
use super::feeder::{FeedStats, Feeder, Slot, Split};
use super::index::SftIndex;
use super::pack::SftBatch;
use super::state::DataState;
use super::tokenizer::SftTokenizer;
use crate::data::Batch;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Micro-batches made ahead: a few (the producer runs at most this many micro-batches ahead).
pub const AHEAD: usize = 4;

/// The file of a checkpoint's step directory holding the SFT [`DataState`].
pub const STATE_FILE: &str = "sft_data.json";

/// SFT training data as the trainer reads it.
pub struct SftSource {
    /// The tokenizer.
    pub tok: Arc<SftTokenizer>,
    /// The training file's index.
    pub index: Arc<SftIndex>,
    /// Rows of a global micro-batch (`W·B`).
    pub global_batch: usize,
    /// The next global row.
    pub next_row: u64,
    feeder: Option<Feeder<Box<dyn Slot>>>,
    /// The slots the producer stages into when it starts ([`SftSource::stage_into`]; none:
    /// [`AHEAD`] host-only slots).
    slots: Option<Vec<Box<dyn Slot>>>,
    /// The held-out set's global micro-batches, when `--eval-data` is given.
    pub eval: Option<SftEval>,
}

/// The held-out set.
#[derive(Clone)]
pub struct SftEval {
    /// Its index.
    pub index: Arc<SftIndex>,
    /// Its global micro-batches (`W·B` rows each; the last padded with empty rows).
    pub batches: Vec<Batch>,
}

impl Clone for SftSource {
    /// The same data at the same position; the copy starts its own producer when first read.
    fn clone(&self) -> Self {
        Self {
            tok: Arc::clone(&self.tok),
            index: Arc::clone(&self.index),
            global_batch: self.global_batch,
            next_row: self.next_row,
            feeder: None,
            slots: None,
            eval: self.eval.clone(),
        }
    }
}

/// An [`SftBatch`] as the model's [`Batch`].
pub fn to_batch(b: SftBatch) -> Batch {
    Batch {
        inputs: b.inputs,
        targets: b.targets,
        positions: Some(b.positions),
        cu_seqlens: Some(b.cu_seqlens),
    }
}

impl SftSource {
    /// Open `data` with `tokenizer`, checked against the model's `vocab`; `eval` the held-out
    /// file. `global_batch` rows per micro-batch.
    pub fn open(
        data: &Path,
        tokenizer: &Path,
        eval: Option<&Path>,
        cutoff_len: usize,
        seq: usize,
        global_batch: usize,
        vocab: usize,
    ) -> Result<Self> {
        let (tok, index) = super::open(data, tokenizer, cutoff_len, seq)?;
        index.check_vocab(vocab, tok.pad_id)?;
        let eval = match eval {
            None => None,
            Some(p) => {
                let idx = Arc::new(SftIndex::build(p, &tok, cutoff_len, seq)?);
                idx.check_vocab(vocab, tok.pad_id)?;
                let batches = eval_batches(&idx, Arc::clone(&tok), Split::single(global_batch))?
                    .into_iter()
                    .map(to_batch)
                    .collect();
                Some(SftEval {
                    index: idx,
                    batches,
                })
            }
        };
        Ok(Self {
            tok,
            index,
            global_batch,
            next_row: 0,
            feeder: None,
            slots: None,
            eval,
        })
    }

    /// Stage the micro-batches into `slots` (a backend's ring: `Backend::feed_slot`) from the
    /// next read on: the producer runs as many micro-batches ahead as there are slots.
    /// Restarts the producer if it ran.
    pub fn stage_into(&mut self, slots: Vec<Box<dyn Slot>>) {
        self.feeder = None;
        self.slots = Some(slots);
    }

    /// The next global micro-batch, and the slot it was staged into: hand the slot back with
    /// [`SftSource::recycle`] once its contents are read (or their copies queued).
    pub fn next_staged(&mut self) -> Result<(Batch, Box<dyn Slot>)> {
        if self.feeder.is_none() {
            let slots = self
                .slots
                .take()
                .unwrap_or_else(|| (0..AHEAD).map(|_| Box::new(()) as Box<dyn Slot>).collect());
            self.feeder = Some(Feeder::start(
                Arc::clone(&self.index),
                Arc::clone(&self.tok),
                Split::single(self.global_batch),
                self.next_row,
                slots,
            )?);
        }
        let f = self
            .feeder
            .as_mut()
            .ok_or_else(|| SftError::Producer("not started".into()))?;
        let fed = f.take()?;
        if fed.row != self.next_row {
            return Err(SftError::Producer(format!(
                "made row {} where row {} was due",
                fed.row, self.next_row
            )));
        }
        self.next_row += self.global_batch as u64;
        // The host copy moved out of the producer (no copy on the trainer's thread).
        Ok((to_batch(fed.batch), fed.slot))
    }

    /// Hand `slot` back for the producer to fill again.
    pub fn recycle(&self, slot: Box<dyn Slot>) {
        if let Some(f) = &self.feeder {
            f.recycle(slot);
        }
    }

    /// The next global micro-batch (its slot handed back at once).
    pub fn next_batch(&mut self) -> Result<Batch> {
        let (b, slot) = self.next_staged()?;
        self.recycle(slot);
        Ok(b)
    }

    /// What the consumer saw of the producer (waits for data).
    pub fn feed_stats(&self) -> FeedStats {
        self.feeder.as_ref().map(Feeder::stats).unwrap_or_default()
    }

    /// The checkpoint's position: the row within its epoch and the rows of an epoch (what the
    /// trainer state's `loader_pos` and `data_tokens` hold for SFT data).
    pub fn position(&self) -> (usize, usize) {
        let rows = self.index.rows.len() as u64;
        ((self.next_row % rows) as usize, rows as usize)
    }

    /// The data state a checkpoint records.
    pub fn state(&self) -> DataState {
        DataState::at(&self.index, &self.tok, self.next_row)
    }

    /// Write the data state into the checkpoint directory `step_dir`.
    pub fn save_state(&self, step_dir: &Path) -> crate::error::Result<()> {
        let p = step_dir.join(STATE_FILE);
        let text = serde_json::to_string_pretty(&self.state())
            .map_err(|e| crate::error::TrainError::file(&p, e.to_string()))?;
        std::fs::write(&p, text + "\n").map_err(crate::error::TrainError::io(&p))
    }

    /// Continue from the data state of checkpoint `step_dir` (refused for other data, another
    /// tokenizer or other packing flags, naming which).
    pub fn resume_from(&mut self, step_dir: &Path) -> crate::error::Result<()> {
        let p: PathBuf = step_dir.join(STATE_FILE);
        let bytes = crate::error::read_regular(&p, 1 << 20).map_err(|_| {
            crate::error::TrainError::file(
                &p,
                "not found: the checkpoint was not trained on SFT data (--data FILE.jsonl \
                 --tokenizer DIR); resume it with the data it was trained on",
            )
        })?;
        let state: DataState = serde_json::from_slice(&bytes).map_err(|e| {
            crate::error::TrainError::file(
                &p,
                format!("malformed ({e}); the checkpoint is damaged"),
            )
        })?;
        self.next_row = state.resume_row(&self.index, &self.tok)?;
        self.feeder = None;
        Ok(())
    }

    /// The first progress line's data statement.
    pub fn summary(&self) -> String {
        let mut s = self.index.summary();
        if let Some(e) = &self.eval {
            s.push_str(&format!(
                "; eval {}: {} examples, {} rows, {} trained tokens",
                e.index.path.display(),
                e.index.stats.read - e.index.stats.dropped,
                e.index.stats.rows,
                e.index.stats.counted
            ));
        }
        s
    }
}
