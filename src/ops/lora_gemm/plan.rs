//! Launch geometry and memory traffic of the skinny kernels (`kernels/lora_gemm.hip`), pure
//! arithmetic tested without a GPU; and the recognition of a GEMM ([`MatmulParams`]) as one of
//! the three skinny products ([`SkinnyGemm::of`]), through which the GEMM tuner runs them.

use crate::ops::matmul::{MatmulLayout, MatmulParams};

/// Threads per block of every skinny kernel (`kBlock`).
pub const BLOCK: u32 = 256;
/// Rows per block of `lora_down` (one row per thread).
pub const DOWN_ROWS: u64 = BLOCK as u64;
/// Columns of x per K step of `lora_down` (`kKc`).
pub const DOWN_KC: u64 = 32;
/// Rows per LDS chunk of `lora_up` / `lora_gradw` (`kRc`).
pub const ROW_CHUNK: u64 = 16;
/// The rank classes the kernels are instantiated for.
pub const RANK_CLASSES: [usize; 4] = [8, 16, 32, 64];

/// The rank class (padded rank the kernel is compiled for) of rank `r`: the smallest of
/// [`RANK_CLASSES`] ≥ r, or None past [`super::MAX_RANK`] (or for 0).
pub fn rank_class(r: usize) -> Option<usize> {
    (r > 0).then(|| RANK_CLASSES.into_iter().find(|&c| c >= r))?
}

/// One skinny product, as the kernels take it. `W(c, j) = w[c·w_sc + j·w_sj]` (c: the long
/// dimension, j < rank); `G(c, j) = g[c·g_sc + j·g_sj]`. The big operand (x, y, d) is
/// row-major with its own row stride (at least its width: a column block of a wider tensor).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SkinnyGemm {
    /// `out[n, j] = alpha · Σ_c x[n·ldx + c]·W(c, j)` (`lora_down`), out `[rows, rank]` packed.
    Down {
        /// Rows of x.
        rows: usize,
        /// Columns of x (the reduction).
        k: usize,
        /// Rank (columns of out).
        rank: usize,
        /// W's stride along c.
        w_sc: usize,
        /// W's stride along j.
        w_sj: usize,
        /// Scale.
        alpha: f32,
        /// Row stride of x (≥ k).
        ldx: usize,
    },
    /// `y[n·ldy + c] = beta·y[..] + alpha · Σ_j u[n, j]·W(c, j)` (`lora_up`), beta 0 or 1.
    Up {
        /// Rows of u and y.
        rows: usize,
        /// Columns of y.
        cols: usize,
        /// Rank (the reduction).
        rank: usize,
        /// W's stride along c.
        w_sc: usize,
        /// W's stride along j.
        w_sj: usize,
        /// Scale of the product.
        alpha: f32,
        /// Scale of y (0: y is not read).
        beta: f32,
        /// Row stride of y (≥ cols).
        ldy: usize,
    },
    /// `G(c, j) = beta·G(c, j) + alpha · Σ_n d[n, c]·u[n, j]` (`lora_gradw`), beta 0 or 1.
    Gradw(GradwShape),
}

/// One reduction over rows of `lora_gradw`: `d` `[rows, cols]` (rows `ldd` apart), `u`
/// `[rows, rank]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradwShape {
    /// Rows (the reduction).
    pub rows: usize,
    /// Columns of d.
    pub cols: usize,
    /// Rank.
    pub rank: usize,
    /// G's stride along c.
    pub g_sc: usize,
    /// G's stride along j.
    pub g_sj: usize,
    /// Scale of the sum.
    pub alpha: f32,
    /// Add into G (beta 1) instead of overwriting it (beta 0).
    pub accumulate: bool,
    /// Row stride of d (≥ cols).
    pub ldd: usize,
}

/// Which operand of the GEMM each kernel argument is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operands {
    /// `Down`/`Up`: the big operand (x or u) is the GEMM's `a`, W its `b`.
    AB,
    /// `Gradw`: d is the GEMM's `a`, u its `b`.
    DU,
    /// `Gradw`: d is the GEMM's `b`, u its `a`.
    UD,
}

impl SkinnyGemm {
    /// The skinny product that computes the GEMM `p`, if it is one: one item, packed operands,
    /// beta 0 (or 1 where the kernel adds), and a rank-sized dimension (1 to
    /// [`super::MAX_RANK`]) in the place the kernel expects:
    /// - `Down`: `a` `[m, k]` not transposed, n = rank, beta 0;
    /// - `Up`: `a` `[m, k]` not transposed, k = rank;
    /// - `Gradw`: `a` transposed (`[k, m]`), `b` not, k the rows, m or n the rank.
    pub fn of(p: &MatmulParams) -> Option<(SkinnyGemm, Operands)> {
        let simple = p.batch == 1 && p.layout == MatmulLayout::PACKED;
        let beta_ok = p.beta == 0.0 || p.beta == 1.0;
        if !simple || !beta_ok || !p.alpha.is_finite() || p.m == 0 || p.n == 0 || p.k == 0 {
            return None;
        }
        let fits = |r: usize| rank_class(r).is_some();
        if !p.trans_a && p.beta == 0.0 && fits(p.n) {
            // out[m, n] = a[m, k]·op(b): b is W (trans_b: [n, k] → W(c, j) = b[j·k + c]).
            let (w_sc, w_sj) = if p.trans_b { (1, p.k) } else { (p.n, 1) };
            let d = SkinnyGemm::Down {
                rows: p.m,
                k: p.k,
                rank: p.n,
                w_sc,
                w_sj,
                alpha: p.alpha,
                ldx: p.k,
            };
            return Some((d, Operands::AB));
        }
        if !p.trans_a && fits(p.k) {
            // out[m, n] (+)= a[m, r]·op(b): trans_b: b [n, r] → W(c, j) = b[c·r + j].
            let (w_sc, w_sj) = if p.trans_b { (p.k, 1) } else { (1, p.n) };
            let u = SkinnyGemm::Up {
                rows: p.m,
                cols: p.n,
                rank: p.k,
                w_sc,
                w_sj,
                alpha: p.alpha,
                beta: p.beta,
                ldy: p.n,
            };
            return Some((u, Operands::AB));
        }
        if p.trans_a && !p.trans_b {
            let accumulate = p.beta == 1.0;
            // out [m, n] = aᵀ·b with a [k, m], b [k, n].
            if fits(p.n) {
                // d = a (cols m), u = b: G(c, j) = out[c·n + j].
                let g = GradwShape {
                    rows: p.k,
                    cols: p.m,
                    rank: p.n,
                    g_sc: p.n,
                    g_sj: 1,
                    alpha: p.alpha,
                    accumulate,
                    ldd: p.m,
                };
                return Some((SkinnyGemm::Gradw(g), Operands::DU));
            }
            if fits(p.m) {
                // d = b (cols n), u = a: G(c, j) = out[j·n + c].
                let g = GradwShape {
                    rows: p.k,
                    cols: p.n,
                    rank: p.m,
                    g_sc: 1,
                    g_sj: p.n,
                    alpha: p.alpha,
                    accumulate,
                    ldd: p.n,
                };
                return Some((SkinnyGemm::Gradw(g), Operands::UD));
            }
        }
        None
    }
}

/// Rows per block of `lora_up`: at least 8·RP (W's once-per-block load is then at most
/// 1/8 of an element of T per element of y), more when fewer row blocks fill the device
/// (two blocks per compute unit); a multiple of [`ROW_CHUNK`].
pub fn up_rows_per_block(rows: usize, cols: usize, rank_class: usize, cus: u32) -> u64 {
    let col_blocks = (cols as u64).div_ceil(u64::from(BLOCK)).max(1);
    let want_groups = (2 * u64::from(cus.max(1))).div_ceil(col_blocks).max(1);
    let even = (rows as u64).div_ceil(want_groups).div_ceil(ROW_CHUNK) * ROW_CHUNK;
    even.max(8 * rank_class as u64).max(ROW_CHUNK)
}

/// How `lora_gradw` splits the rows: `groups` groups of `rows_per_group` rows (the last may be
/// shorter). One group writes G directly; several write f32 partials that `lora_gradw_final`
/// adds in group order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GradwPlan {
    /// Row groups (grid y).
    pub groups: u64,
    /// Rows per group.
    pub rows_per_group: u64,
}

impl GradwPlan {
    /// Enough groups to fill `cus` compute units (two blocks each) with the wider job's column
    /// blocks, at least 64 rows per group, and no more groups than keep the partials' traffic
    /// (written and read back, f32) at most 1/32 of d's bytes: `groups ≤ rows·elem / (256·rank)`.
    pub fn new(rows: usize, cols: usize, rank: usize, elem_bytes: usize, cus: u32) -> GradwPlan {
        let col_blocks = (cols as u64).div_ceil(u64::from(BLOCK)).max(1);
        let fill = (2 * u64::from(cus.max(1))).div_ceil(col_blocks);
        let by_rows = (rows as u64).div_ceil(64);
        let by_bytes = (rows as u64 * elem_bytes as u64) / (256 * rank.max(1) as u64);
        let want = fill.min(by_rows).min(by_bytes).max(1);
        let rows_per_group = (rows as u64).div_ceil(want).max(1);
        GradwPlan {
            groups: (rows as u64).div_ceil(rows_per_group).max(1),
            rows_per_group,
        }
    }
}

/// Bytes a kernel must move (each operand once, outputs once) and bytes its plan moves, at one
/// shape: the hot loop's global bytes per element (from the ISA report: what the loop's
/// instructions request, cache hits included) times the loop's elements, plus what the plan
/// moves outside the loop (W per block, partials, outputs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Traffic {
    /// Bytes the op cannot avoid.
    pub must: f64,
    /// Bytes the kernel's instructions move under the plan.
    pub moved: f64,
}

impl Traffic {
    /// `must / moved`: the share of the bandwidth bound the kernel can reach.
    pub fn ratio(&self) -> f64 {
        self.must / self.moved
    }
}

/// [`Traffic`] of `lora_down` for x `[rows, k]` and rank class `rc` (rank r): the loop moves
/// `loop_bytes_per_elem` per x element (x plus W's share); outside it, out `[rows, r]` is written.
pub fn down_traffic(
    rows: usize,
    k: usize,
    r: usize,
    elem: f64,
    loop_bytes_per_elem: f64,
) -> Traffic {
    let (n, k, r) = (rows as f64, k as f64, r as f64);
    Traffic {
        must: elem * (n * k + k * r + n * r),
        moved: loop_bytes_per_elem * n * k + elem * n * r,
    }
}

/// [`Traffic`] of `lora_up` adding into y `[rows, cols]` at rank r, rank class `rc`: the loop
/// moves `loop_bytes_per_elem` per y element (y twice plus u's share); outside it each block
/// loads W(c, 0..rc) for its columns (ranks past r are not loaded).
pub fn up_traffic(
    rows: usize,
    cols: usize,
    r: usize,
    rows_per_block: u64,
    elem: f64,
    loop_bytes_per_elem: f64,
) -> Traffic {
    let row_blocks = (rows as u64).div_ceil(rows_per_block.max(1)) as f64;
    let (n, c, r) = (rows as f64, cols as f64, r as f64);
    Traffic {
        must: elem * (2.0 * n * c + n * r + c * r),
        moved: loop_bytes_per_elem * n * c + elem * row_blocks * c * r,
    }
}

/// [`Traffic`] of `lora_gradw` (+ `lora_gradw_final` with several groups) reducing d
/// `[rows, cols]` into G `[cols, r]` (read and written when accumulating): the loop moves
/// `loop_bytes_per_elem` per d element (d plus u's share); outside it G, or the f32 partials
/// written and read back plus G.
pub fn gradw_traffic(
    rows: usize,
    cols: usize,
    r: usize,
    plan: GradwPlan,
    elem: f64,
    loop_bytes_per_elem: f64,
) -> Traffic {
    let (n, c, r) = (rows as f64, cols as f64, r as f64);
    let g = 2.0 * elem * c * r;
    let partials = if plan.groups > 1 {
        2.0 * 4.0 * plan.groups as f64 * c * r
    } else {
        0.0
    };
    Traffic {
        must: elem * (n * c + n * r) + g,
        moved: loop_bytes_per_elem * n * c + partials + g,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_classes_pad_up_and_stop_at_the_maximum() {
        assert_eq!(rank_class(0), None);
        assert_eq!(rank_class(1), Some(8));
        assert_eq!(rank_class(8), Some(8));
        assert_eq!(rank_class(9), Some(16));
        assert_eq!(rank_class(33), Some(64));
        assert_eq!(rank_class(64), Some(64));
        assert_eq!(rank_class(65), None);
    }

    #[test]
    fn the_three_products_of_an_adapter_are_recognised() {
        let mm = |m, n, k, ta, tb, beta| MatmulParams {
            trans_a: ta,
            trans_b: tb,
            beta,
            ..MatmulParams::new(m, n, k)
        };
        // u = x·Aᵀ: A [r, in] → W(c, j) = A[j·in + c].
        let (g, o) = SkinnyGemm::of(&mm(100, 8, 768, false, true, 0.0)).unwrap();
        assert_eq!(o, Operands::AB);
        assert!(matches!(
            g,
            SkinnyGemm::Down {
                rows: 100,
                k: 768,
                rank: 8,
                w_sc: 1,
                w_sj: 768,
                ..
            }
        ));
        // du = s·dy·B: B [out, r] → W(c, j) = B[c·r + j].
        let (g, _) = SkinnyGemm::of(&mm(100, 8, 2304, false, false, 0.0)).unwrap();
        assert!(matches!(
            g,
            SkinnyGemm::Down {
                w_sc: 8,
                w_sj: 1,
                ..
            }
        ));
        // y += s·u·Bᵀ and dx += du·A.
        let (g, _) = SkinnyGemm::of(&mm(100, 2304, 8, false, true, 1.0)).unwrap();
        assert!(matches!(
            g,
            SkinnyGemm::Up {
                cols: 2304,
                rank: 8,
                w_sc: 8,
                w_sj: 1,
                ..
            }
        ));
        let (g, _) = SkinnyGemm::of(&mm(100, 768, 8, false, false, 1.0)).unwrap();
        assert!(matches!(
            g,
            SkinnyGemm::Up {
                w_sc: 1,
                w_sj: 768,
                ..
            }
        ));
        // dB = dyᵀ·u [out, r] and dA = duᵀ·x [r, in].
        let (g, o) = SkinnyGemm::of(&mm(2304, 8, 100, true, false, 1.0)).unwrap();
        assert_eq!(o, Operands::DU);
        assert!(matches!(
            g,
            SkinnyGemm::Gradw(GradwShape {
                cols: 2304,
                rank: 8,
                g_sc: 8,
                g_sj: 1,
                accumulate: true,
                ..
            })
        ));
        let (g, o) = SkinnyGemm::of(&mm(8, 768, 100, true, false, 0.0)).unwrap();
        assert_eq!(o, Operands::UD);
        assert!(matches!(
            g,
            SkinnyGemm::Gradw(GradwShape {
                cols: 768,
                rank: 8,
                g_sc: 1,
                g_sj: 768,
                accumulate: false,
                ..
            })
        ));
        // Not skinny: wide on both sides, a general beta, a batch, transposes it does not take.
        assert!(SkinnyGemm::of(&mm(100, 100, 100, false, false, 0.0)).is_none());
        assert!(SkinnyGemm::of(&mm(100, 8, 768, false, true, 0.5)).is_none());
        assert!(SkinnyGemm::of(&MatmulParams {
            batch: 2,
            ..mm(100, 8, 768, false, true, 0.0)
        })
        .is_none());
        assert!(SkinnyGemm::of(&mm(100, 768, 8, true, true, 0.0)).is_none());
        assert!(SkinnyGemm::of(&mm(100, 65, 768, false, true, 0.0)).is_none());
    }

    #[test]
    fn plans_cover_every_row_and_respect_their_bounds() {
        for (rows, cols, rank, bytes, cus) in [
            (0, 5, 8, 4, 60),
            (1, 5, 8, 4, 60),
            (37, 19, 4, 2, 4),
            (4096, 4096, 64, 2, 60),
            (4096, 4096, 8, 2, 60),
            (100_000, 768, 16, 4, 1),
        ] {
            let p = GradwPlan::new(rows, cols, rank, bytes, cus);
            assert!(p.groups * p.rows_per_group >= rows as u64, "{p:?}");
            assert!(
                (p.groups - 1) * p.rows_per_group < rows.max(1) as u64,
                "{p:?}"
            );
            if p.groups > 1 {
                // Partials (f32, written and read) stay within 1/32 of d's bytes.
                let partial = 8 * p.groups * (cols * rank) as u64;
                assert!(32 * partial <= (rows * cols * bytes) as u64, "{p:?}");
            }
            let r = up_rows_per_block(rows, cols, rank_class(rank).unwrap(), cus);
            assert!(r % ROW_CHUNK == 0 && r >= 8 * rank_class(rank).unwrap() as u64);
        }
        assert_eq!(GradwPlan::new(4096, 4096, 64, 4, 60).groups, 1);
        assert_eq!(GradwPlan::new(4096, 4096, 8, 2, 60).groups, 4);
        assert_eq!(up_rows_per_block(4096, 4096, 64, 60), 512);
    }

    #[test]
    fn traffic_counts_each_operand_once_at_the_bound() {
        // lora_down's loop moves x plus W [16, RP] per 256·16 x elements.
        let t = down_traffic(4096, 4096, 8, 2.0, 2.0 * (1.0 + 8.0 / 256.0));
        assert!(t.ratio() > 0.96 && t.ratio() <= 1.0, "{t:?}");
        let t = up_traffic(4096, 4096, 64, 512, 2.0, 4.0);
        assert!(t.ratio() < 1.0 && t.ratio() > 0.9, "{t:?}");
        let plan = GradwPlan {
            groups: 4,
            rows_per_group: 1024,
        };
        let t = gradw_traffic(4096, 4096, 8, plan, 2.0, 2.0);
        assert!(t.ratio() < 1.0 && t.ratio() > 0.9, "{t:?}");
    }
}
