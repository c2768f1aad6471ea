//! Variable-length attention: `cu_seqlens`, the starts of the sequences packed into each row.
//!
//! `cu_seqlens` holds `batch × (n + 1)` integers, row-major: row `b`'s sequence `s` is the
//! positions `cu[b][s] .. cu[b][s + 1]` (an empty sequence when the two are equal). Positions
//! before `cu[b][0]` or from `cu[b][n]` on belong to no sequence: they are padding, with
//! `out = 0`, `lse = −inf` and zero gradients, and no query sees them. A query sees the keys of
//! its own sequence only (with `causal`: those at or before it). It needs `tq = tk` (self
//! attention over the packed positions). One row holding every sequence (`batch = 1`) is the
//! flattened-batch layout; `batch` rows of `t` positions each with their own starts is the
//! packed-row layout.

use super::AttentionParams;
use crate::params::{invalid, ShapeError};
use std::ops::Range;

/// `cu_seqlens` as the f64 core takes it (every i32 is exact in f64).
pub(crate) fn widen(cu: &[i32]) -> Vec<f64> {
    cu.iter().map(|&x| f64::from(x)).collect()
}

/// Entries per row of a `cu_seqlens` of `len` entries (`n + 1` for `n` sequences), after
/// checking `len` against the shape. The values are checked by [`check_cu_seqlens`].
pub(crate) fn entries_per_row(p: &AttentionParams, len: usize) -> Result<usize, ShapeError> {
    let op = AttentionParams::OP;
    if p.tq != p.tk {
        return Err(invalid(
            op,
            "cu_seqlens",
            format!("given with tq = {} and tk = {}", p.tq, p.tk),
            "variable-length attention needs tq == tk (one set of packed positions)",
        ));
    }
    if p.batch == 0 {
        return if len == 0 {
            Ok(0)
        } else {
            Err(invalid(
                op,
                "cu_seqlens",
                format!("{len} entries for batch 0"),
                "must be empty when batch is 0",
            ))
        };
    }
    if len == 0 || len % p.batch != 0 {
        return Err(invalid(
            op,
            "cu_seqlens",
            format!("{len} entries for batch {}", p.batch),
            "must hold batch × (n + 1) sequence starts (n + 1 per row, n ≥ 0)",
        ));
    }
    if len / p.batch > i32::MAX as usize {
        return Err(invalid(
            op,
            "cu_seqlens",
            format!("{} entries per row", len / p.batch),
            "must be below 2^31 per row",
        ));
    }
    Ok(len / p.batch)
}

/// Check `cu_seqlens` (its length, then every row non-decreasing and inside `0..=tq`), as the
/// CPU reference does before computing. The device launchers check only the length (reading
/// the buffer back would wait for the device); callers that build `cu_seqlens` on the host
/// can call this before uploading it.
pub fn check_cu_seqlens(p: &AttentionParams, cu: &[i32]) -> Result<(), ShapeError> {
    let wide: Vec<i64> = cu.iter().map(|&x| i64::from(x)).collect();
    check_rows(p, &wide)
}

pub(crate) fn check_rows(p: &AttentionParams, cu: &[i64]) -> Result<(), ShapeError> {
    let per_row = entries_per_row(p, cu.len())?;
    for (b, row) in cu.chunks(per_row.max(1)).enumerate() {
        for (s, &x) in row.iter().enumerate() {
            if x < 0 || x as u64 > p.tq as u64 {
                return Err(invalid(
                    AttentionParams::OP,
                    "cu_seqlens",
                    format!("{x} at row {b}, entry {s} (t = {})", p.tq),
                    "every sequence start must lie in 0..=t",
                ));
            }
            if s > 0 && x < row[s - 1] {
                return Err(invalid(
                    AttentionParams::OP,
                    "cu_seqlens",
                    format!("{x} at row {b}, entry {s} after {}", row[s - 1]),
                    "sequence starts must not decrease within a row",
                ));
            }
        }
    }
    Ok(())
}

/// Keys visible to query `i`: without `row` (no `cu_seqlens`), `0..visible_keys(i)`; with the
/// validated starts of `i`'s row, the keys of `i`'s sequence (up to `i` when causal), empty for
/// padding.
pub(crate) fn key_range(p: &AttentionParams, row: Option<&[i64]>, i: usize) -> Range<usize> {
    let Some(row) = row else {
        return 0..p.visible_keys(i);
    };
    let i64_i = i as i64;
    // The last start ≤ i among row[..n] whose sequence holds i.
    match row.windows(2).find(|w| w[0] <= i64_i && i64_i < w[1]) {
        Some(w) => {
            let start = w[0] as usize;
            let end = if p.causal { i + 1 } else { w[1] as usize };
            start..end
        }
        None => 0..0,
    }
}

/// Keys visible to query `i` of batch row `b` with a validated `cu_seqlens` ([`check_cu_seqlens`])
/// or none: the keys of `i`'s sequence (up to `i` when causal), empty for padding; without
/// `cu_seqlens` `0..visible_keys(i)`. For models of the op (tests) and callers that need the mask.
pub fn visible_key_range(
    p: &AttentionParams,
    cu_seqlens: Option<&[i32]>,
    b: usize,
    i: usize,
) -> Range<usize> {
    let row: Option<Vec<i64>> = cu_seqlens.map(|cu| {
        let per_row = cu.len() / p.batch.max(1);
        cu[b * per_row..(b + 1) * per_row]
            .iter()
            .map(|&x| i64::from(x))
            .collect()
    });
    key_range(p, row.as_deref(), i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(batch: usize, t: usize, causal: bool) -> AttentionParams {
        AttentionParams {
            batch,
            heads: 2,
            n_kv_heads: 1,
            tq: t,
            tk: t,
            head_dim: 4,
            causal,
            scale: 1.0,
        }
    }

    #[test]
    fn key_ranges_stay_inside_each_sequence_and_padding_sees_nothing() {
        let p = shape(1, 8, true);
        // Padding at 0, sequences [1, 4), [4, 4) (empty), [4, 5), padding [5, 8).
        let row = [1i64, 4, 4, 5];
        let r: Vec<_> = (0..8).map(|i| key_range(&p, Some(&row), i)).collect();
        assert_eq!(r, vec![0..0, 1..2, 1..3, 1..4, 4..5, 0..0, 0..0, 0..0]);
        let p = shape(1, 8, false);
        assert_eq!(key_range(&p, Some(&row), 2), 1..4);
        assert_eq!(key_range(&p, None, 2), 0..8);
    }

    #[test]
    fn bad_cu_seqlens_are_named() {
        let p = shape(2, 6, true);
        let e = check_cu_seqlens(&p, &[0, 3, 6, 0, 4]).unwrap_err();
        assert!(e.to_string().contains("batch × (n + 1)"), "{e}");
        let e = check_cu_seqlens(&p, &[0, 3, 6, 0, 7, 7]).unwrap_err();
        assert!(e.to_string().contains("7 at row 1, entry 1 (t = 6)"), "{e}");
        let e = check_cu_seqlens(&p, &[0, 3, 2, 0, 6, 6]).unwrap_err();
        assert!(e.to_string().contains("2 at row 0, entry 2 after 3"), "{e}");
        let e = check_cu_seqlens(&p, &[0, -1, 2, 0, 6, 6]).unwrap_err();
        assert!(e.to_string().contains("-1 at row 0"), "{e}");
        check_cu_seqlens(&p, &[0, 3, 6, 2, 2, 5]).unwrap();
        let q = AttentionParams { tk: 5, ..p };
        let e = check_cu_seqlens(&q, &[0, 3, 6, 0, 4, 5]).unwrap_err();
        assert!(e.to_string().contains("tq == tk"), "{e}");
    }
}
