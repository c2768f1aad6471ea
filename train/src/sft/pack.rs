//! Packing: examples in file order, each whole, into rows of `seq` positions; a row takes
//! examples while they fit and the rest is padding. Each example is its own causal sequence
//! with positions from 0 (its bounds go to the attention op as `cu_seqlens`); the padding is one
//! more sequence of its own whose targets are all −100, so no example attends to it and it
//! changes no loss or gradient.

use super::example::{Example, IGNORE};

/// Which examples (indices into the kept examples, in order) one row holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPlan {
    /// Index of the row's first example.
    pub first: usize,
    /// Examples in the row (≥ 1).
    pub count: usize,
    /// Positions the examples fill (the rest of the row is padding).
    pub used: usize,
}

/// Plan the rows of examples taking `positions[i]` positions each (each ≤ `seq`).
pub fn plan(positions: &[usize], seq: usize) -> Vec<RowPlan> {
    let mut rows = Vec::new();
    let mut cur: Option<RowPlan> = None;
    for (i, &n) in positions.iter().enumerate() {
        match &mut cur {
            Some(r) if r.used + n <= seq => {
                r.count += 1;
                r.used += n;
            }
            _ => {
                rows.extend(cur.take());
                cur = Some(RowPlan {
                    first: i,
                    count: 1,
                    used: n,
                });
            }
        }
    }
    rows.extend(cur);
    rows
}

/// One micro-batch of packed rows, row-major `[B, T]`, in the shape the model takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SftBatch {
    /// Input ids.
    pub inputs: Vec<i32>,
    /// Target ids, −100 where not counted.
    pub targets: Vec<i32>,
    /// Position ids: 0, 1, … within each sequence.
    pub positions: Vec<i32>,
    /// Sequence bounds over the flattened `B·T` positions: `[0, …, B·T]`.
    pub cu_seqlens: Vec<i32>,
}

impl SftBatch {
    /// Empty, ready for [`push_row`](Self::push_row).
    pub fn clear(&mut self) {
        self.inputs.clear();
        self.targets.clear();
        self.positions.clear();
        self.cu_seqlens.clear();
    }

    /// Rows held, for rows of `seq` positions.
    pub fn rows(&self, seq: usize) -> usize {
        self.inputs.len() / seq.max(1)
    }

    /// Counted targets (not −100).
    pub fn counted(&self) -> usize {
        self.targets.iter().filter(|&&t| t != IGNORE).count()
    }

    /// Append a row of `seq` positions holding `examples` (whose positions fit `seq`), padded
    /// with `pad_id`. Returns `false` (and appends nothing) if they do not fit.
    pub fn push_row(&mut self, examples: &[&Example], seq: usize, pad_id: i32) -> bool {
        let used: usize = examples.iter().map(|e| e.positions()).sum();
        if used > seq || i32::try_from(self.inputs.len() + seq).is_err() {
            return false;
        }
        let base = self.inputs.len();
        if self.cu_seqlens.is_empty() {
            self.cu_seqlens.push(0);
        }
        for e in examples {
            let n = e.positions();
            // Example ids were checked to fit an i32 when tokenised.
            self.inputs.extend(e.ids[..n].iter().map(|&t| t as i32));
            self.targets.extend_from_slice(&e.labels[1..=n]);
            self.positions.extend(0..n as i32);
            self.cu_seqlens.push(self.inputs.len() as i32);
        }
        let pad = seq - used;
        if pad > 0 {
            self.inputs.resize(base + seq, pad_id);
            self.targets.resize(base + seq, IGNORE);
            self.positions.extend(0..pad as i32);
            self.cu_seqlens.push((base + seq) as i32);
        }
        true
    }
}
