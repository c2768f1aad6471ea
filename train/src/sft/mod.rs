//! SFT data as fine-tuners have it (docs/SFT.md): JSONL conversations or alpaca records,
//! rendered with the model's chat template, tokenised with the model's tokenizer, the loss on
//! the assistant's tokens only, packed into rows of `--seq` positions.
//!
//! - [`jsonl`]: lines with bounded memory, offsets and the file's fingerprint.
//! - [`record`]: a line as a conversation (`messages` or alpaca).
//! - [`tokenizer`], [`template`]: `--tokenizer DIR` (tokenizer.json, tokenizer_config.json).
//! - [`example`]: the incremental rendering rule, labels, `--cutoff-len`.
//! - [`index`]: the first pass (statistics, row plan); [`pack`]: rows and micro-batches.
//! - [`feeder`]: micro-batches made ahead on a background thread into staging slots.
//! - [`eval`]: the held-out set; [`state`]: the data position and fingerprints for resuming.
//! - [`preview`]: `sft-preview`, the look before training.
//! - [`source`]: what the trainer reads (global micro-batches, checkpoints' data state, eval).

pub mod error;
pub mod eval;
pub mod example;
pub mod feeder;
pub mod index;
pub mod jsonl;
pub mod pack;
pub mod preview;
pub mod record;
pub mod setup;
pub mod source;
pub mod state;
pub mod template;
pub mod tokenizer;

#[cfg(test)]
mod tests;

pub use error::SftError;
pub use example::{Example, IGNORE};
pub use feeder::{Fed, FeedStats, Feeder, Slot, Split};
pub use index::{SftIndex, Stats, DEFAULT_CUTOFF_LEN};
pub use pack::SftBatch;
pub use state::DataState;
pub use tokenizer::SftTokenizer;

use std::path::Path;
use std::sync::Arc;

/// `--data FILE.jsonl --tokenizer DIR`: the tokenizer and the file's index.
pub fn open(
    data: &Path,
    tokenizer: &Path,
    cutoff_len: usize,
    seq: usize,
) -> error::Result<(Arc<SftTokenizer>, Arc<SftIndex>)> {
    index::check_flags(cutoff_len, seq)?;
    let tok = Arc::new(SftTokenizer::load(tokenizer)?);
    let idx = Arc::new(SftIndex::build(data, &tok, cutoff_len, seq)?);
    Ok((tok, idx))
}

/// Whether `--data` names SFT examples (a `.jsonl` file) rather than a token stream.
pub fn is_sft_data(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("jsonl"))
}

/// The SFT flags against `--data`: `--tokenizer` and `--eval-data` only with SFT examples,
/// `--eval-every` only with `--eval-data`, `--cutoff-len` within `--seq` + 1 (usage errors).
pub fn check_args(args: &crate::cli::Args) -> crate::error::Result<()> {
    let bad = |m: String| Err(crate::error::TrainError::Usage(m));
    if is_sft_data(&args.data) {
        if args.tokenizer.is_none() {
            return bad(format!(
                "--data {} is SFT examples (.jsonl): give the model's tokenizer with --tokenizer \
                 DIR (tokenizer.json and tokenizer_config.json)",
                args.data.display()
            ));
        }
        index::check_flags(args.cutoff_len, args.seq)?;
        if let Some(dir) = &args.tokenizer {
            tokenizer::check_template(args.template.as_deref(), dir)
                .map_err(crate::error::TrainError::Usage)?;
        }
    } else {
        for (flag, given) in [
            ("--tokenizer", args.tokenizer.is_some()),
            ("--eval-data", args.eval_data.is_some()),
            ("--template", args.template.is_some()),
        ] {
            if given {
                return bad(format!(
                    "{flag} is for SFT examples, but --data {} is a token file (SFT data is a \
                     .jsonl file)",
                    args.data.display()
                ));
            }
        }
    }
    if args.eval_every > 0 && args.eval_data.is_none() {
        return bad(format!(
            "--eval-every {} needs --eval-data FILE.jsonl",
            args.eval_every
        ));
    }
    if let Some(e) = &args.eval_data {
        if !is_sft_data(e) {
            return bad(format!(
                "--eval-data {}: held-out SFT examples are a .jsonl file",
                e.display()
            ));
        }
    }
    Ok(())
}
