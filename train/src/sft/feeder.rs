//! Micro-batches made ahead of the trainer on a background thread: reading the examples again
//! (by their offsets in the index), tokenising, packing and staging them into a bounded pool of
//! slots (pinned host buffers on a device, plain vectors on the CPU), so that a steady step
//! waits for data only when the CPU really is slower than the step.
//!
//! Order, as the spec defines it: global row `g` is row `g mod R` of epoch `g div R`; each
//! micro-batch takes `W·B` rows from the position and rank `r` takes rows `r·B … r·B + B − 1`
//! of them (a W-rank run equals a one-rank run with `--batch W·B`).

use super::error::{Result, SftError};
use super::example::Example;
use super::index::{example_of_line, Entry, SftIndex};
use super::jsonl::LineReader;
use super::pack::SftBatch;
use super::tokenizer::SftTokenizer;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Where a micro-batch is staged besides the host copy every [`Fed`] carries: the trainer's copy
/// source on a device (a slot of its ring of pinned host buffers, `crate::feed::PinnedSlot`),
/// nothing on the CPU (`()`).
pub trait Slot: Send + 'static {
    /// Store `batch` (its four arrays, or the part of them the slot stages).
    fn write(&mut self, batch: &SftBatch) -> std::result::Result<(), String>;

    /// The concrete slot, for the backend that made it.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// No staging: the host copy is all (the CPU backend reads it directly).
impl Slot for () {
    fn write(&mut self, _: &SftBatch) -> std::result::Result<(), String> {
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A second host copy (tests).
impl Slot for SftBatch {
    fn write(&mut self, batch: &SftBatch) -> std::result::Result<(), String> {
        self.clone_from(batch);
        Ok(())
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Slot for Box<dyn Slot> {
    fn write(&mut self, batch: &SftBatch) -> std::result::Result<(), String> {
        (**self).write(batch)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        (**self).as_any()
    }
}

/// Which rows a rank takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Rows per micro-batch per rank (`--batch`).
    pub batch: usize,
    /// Ranks W.
    pub world: usize,
    /// This rank.
    pub rank: usize,
}

impl Split {
    /// One rank: all rows.
    pub fn single(batch: usize) -> Self {
        Self {
            batch,
            world: 1,
            rank: 0,
        }
    }

    /// Rows one micro-batch advances the position by (`W·B`).
    pub fn stride(&self) -> u64 {
        (self.world * self.batch) as u64
    }
}

/// The rows' examples, made again from the file.
pub struct RowMaker {
    path: PathBuf,
    tok: Arc<SftTokenizer>,
    reader: Option<LineReader>,
    /// The offset the reader stands at.
    at: u64,
}

impl RowMaker {
    /// Read `path`'s examples with `tok`.
    pub fn new(path: &Path, tok: Arc<SftTokenizer>) -> Self {
        Self {
            path: path.to_path_buf(),
            tok,
            reader: None,
            at: u64::MAX,
        }
    }

    /// The example of `entry`, checked against what the index saw.
    fn example(&mut self, index: &SftIndex, entry: &Entry) -> Result<Example> {
        if self.reader.is_none() || self.at != entry.offset {
            self.reader = Some(LineReader::open_at(&self.path, entry.offset, entry.line)?);
        }
        let changed = || {
            SftError::line(
                &self.path,
                entry.line,
                "the file changed since it was read at the start (the examples must stay as \
                 they were while training): restart the run",
            )
        };
        let reader = self.reader.as_mut().ok_or_else(changed)?;
        let line = reader.next_line()?.ok_or_else(changed)?;
        // Where the reader stands now: the next entry needs no seek if it follows directly.
        self.at = reader.offset();
        match example_of_line(
            &self.path,
            entry.line,
            &line.text,
            &self.tok,
            index.cutoff_len,
        )? {
            Some(Some(ex)) if ex.ids.len() == entry.tokens as usize => Ok(ex),
            _ => Err(changed()),
        }
    }

    /// Append global row `g` of `index` to `out`.
    pub fn push_row(&mut self, index: &SftIndex, g: u64, out: &mut SftBatch) -> Result<()> {
        let plan = index.rows[(g % index.rows.len() as u64) as usize];
        let mut exs = Vec::with_capacity(plan.count);
        for e in &index.entries[plan.first..plan.first + plan.count] {
            exs.push(self.example(index, e)?);
        }
        let refs: Vec<&Example> = exs.iter().collect();
        // The pad id was checked against the vocabulary (`check_vocab`), far below i32::MAX.
        if !out.push_row(&refs, index.seq, self.tok.pad_id as i32) {
            return Err(SftError::file(
                &self.path,
                "a planned row does not fit --seq (the file changed since it was read): restart \
                 the run",
            ));
        }
        Ok(())
    }

    /// The micro-batch of `split`'s rank at global row `g`.
    pub fn micro_batch(
        &mut self,
        index: &SftIndex,
        split: Split,
        g: u64,
        out: &mut SftBatch,
    ) -> Result<()> {
        out.clear();
        let first = g + (split.rank * split.batch) as u64;
        for i in 0..split.batch as u64 {
            self.push_row(index, first + i, out)?;
        }
        Ok(())
    }
}

/// A staged micro-batch.
pub struct Fed<S> {
    /// The slot it was staged into.
    pub slot: S,
    /// The micro-batch as made (the split's rows), on the host.
    pub batch: SftBatch,
    /// Its first global row (before the rank's offset).
    pub row: u64,
    /// Counted targets of this rank's rows.
    pub counted: u64,
}

/// What the consumer saw of the producer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FeedStats {
    /// Micro-batches taken.
    pub taken: u64,
    /// Of those, how many were not ready when asked for (the trainer waited for data).
    pub waited: u64,
    /// Time spent waiting.
    pub wait: Duration,
}

/// The producer thread and its two channels.
pub struct Feeder<S: Slot> {
    full: Receiver<Result<Fed<S>>>,
    free: SyncSender<S>,
    thread: Option<std::thread::JoinHandle<()>>,
    stats: FeedStats,
}

impl<S: Slot> Feeder<S> {
    /// Start producing `split`'s micro-batches of `index` from global row `start`, staged into
    /// `slots` (as many micro-batches are made ahead as there are slots).
    pub fn start(
        index: Arc<SftIndex>,
        tok: Arc<SftTokenizer>,
        split: Split,
        start: u64,
        slots: Vec<S>,
    ) -> Result<Self> {
        if slots.is_empty() {
            return Err(SftError::Producer("no staging slot to fill".into()));
        }
        let n = slots.len();
        let (full_tx, full) = mpsc::sync_channel::<Result<Fed<S>>>(n);
        let (free, free_rx) = mpsc::sync_channel::<S>(n);
        for s in slots {
            free.send(s)
                .map_err(|_| SftError::Producer("the slot channel closed".into()))?;
        }
        let thread = std::thread::Builder::new()
            .name("sft-feeder".into())
            .spawn(move || produce(index, tok, split, start, free_rx, full_tx))
            .map_err(|e| SftError::Producer(format!("could not start its thread: {e}")))?;
        Ok(Self {
            full,
            free,
            thread: Some(thread),
            stats: FeedStats::default(),
        })
    }

    /// The next micro-batch (waits only if the producer is behind; counted in
    /// [`stats`](Self::stats)).
    pub fn take(&mut self) -> Result<Fed<S>> {
        let got = match self.full.try_recv() {
            Ok(x) => x,
            Err(TryRecvError::Empty) => {
                let t = Instant::now();
                let x = self.full.recv().map_err(|_| self.stopped());
                self.stats.waited += 1;
                self.stats.wait += t.elapsed();
                x?
            }
            Err(TryRecvError::Disconnected) => return Err(self.stopped()),
        };
        self.stats.taken += 1;
        got
    }

    /// Hand a slot back for the producer to fill again.
    pub fn recycle(&self, slot: S) {
        // The producer gone (it stopped on an error): the next `take` reports it.
        let _ = self.free.send(slot);
    }

    /// What the consumer saw so far.
    pub fn stats(&self) -> FeedStats {
        self.stats
    }

    /// The producer's end, as an error.
    fn stopped(&mut self) -> SftError {
        let panicked = self
            .thread
            .take()
            .map(|t| t.join().is_err())
            .unwrap_or(false);
        SftError::Producer(if panicked {
            "its thread panicked".into()
        } else {
            "it ended".into()
        })
    }
}

impl<S: Slot> Drop for Feeder<S> {
    fn drop(&mut self) {
        // Closing both channels ends the producer's loop at its next send or receive; its
        // thread is not joined (it may be blocked in a tokenizer call for a moment).
        let (tx, _) = mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.free, tx));
        let (_, rx) = mpsc::sync_channel(0);
        drop(std::mem::replace(&mut self.full, rx));
    }
}

/// The producer's loop: fill a free slot with the next micro-batch, hand it over, repeat.
fn produce<S: Slot>(
    index: Arc<SftIndex>,
    tok: Arc<SftTokenizer>,
    split: Split,
    start: u64,
    free: Receiver<S>,
    full: SyncSender<Result<Fed<S>>>,
) {
    let mut maker = RowMaker::new(&index.path, tok);
    let mut batch = SftBatch::default();
    let mut g = start;
    while let Ok(mut slot) = free.recv() {
        let made = maker
            .micro_batch(&index, split, g, &mut batch)
            .and_then(|()| slot.write(&batch).map_err(SftError::Producer));
        // The host copy moves out (this thread allocates the next one, not the trainer's).
        let item = made.map(|()| Fed {
            slot,
            row: g,
            counted: batch.counted() as u64,
            batch: std::mem::take(&mut batch),
        });
        let failed = item.is_err();
        if full.send(item).is_err() || failed {
            return;
        }
        g += split.stride();
    }
}
