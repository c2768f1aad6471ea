//! `--eval-data`: the held-out set, rendered, masked and packed as the training data, made once
//! and kept (eval sets are small) for every evaluation; each rank evaluates its share of every
//! micro-batch's rows (`setup::evaluate`).

use super::error::Result;
use super::feeder::{RowMaker, Split};
use super::index::SftIndex;
use super::pack::SftBatch;
use super::tokenizer::SftTokenizer;
use std::sync::Arc;

/// One rank's share of the eval set: micro-batches of `B` rows each.
///
/// The rows are taken `W·B` at a time in order, rank `r` taking rows `r·B … r·B + B − 1` of each
/// group; where the last group runs past the end, a rank's missing rows are padding only (no
/// counted target), so every rank runs the same number of micro-batches of the same shape and
/// the sum over ranks covers every row exactly once.
pub fn eval_batches(
    index: &SftIndex,
    tok: Arc<SftTokenizer>,
    split: Split,
) -> Result<Vec<SftBatch>> {
    let rows = index.rows.len() as u64;
    let stride = split.stride();
    let mut maker = RowMaker::new(&index.path, Arc::clone(&tok));
    let mut out = Vec::new();
    let mut g = 0;
    while g < rows {
        let mut b = SftBatch::default();
        let first = g + (split.rank * split.batch) as u64;
        for r in first..first + split.batch as u64 {
            if r < rows {
                maker.push_row(index, r, &mut b)?;
            } else {
                // A row of padding only: no example, nothing counted.
                b.push_row(&[], index.seq, tok.pad_id as i32);
            }
        }
        out.push(b);
        g += stride;
    }
    Ok(out)
}
