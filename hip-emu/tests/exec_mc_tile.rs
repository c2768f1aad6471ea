//! hip-emu's emulation of the matrix-core tile multiply-accumulate (kernels/mc_tile.h on the
//! host build, hip-build/shim/hip/hipemu_mma.h) against a direct per-element definition,
//! D[m][n] = C[m][n] + Σ_k A[m][k]·B[k][n], and the lane layout of kernels/mc_layout.h against
//! the published MFMA layout. Test-only kernels: tests/kernels/mc_tile.hip.

mod common;

use common::{arg, available, launch1, ptr, ptr_mut};

/// Deterministic values that are exact in f16 and bf16: multiples of 1/64 in [-2, 2] (at most
/// 8 significant bits). Every product is then a multiple of 2^-12 below 4 in magnitude, and
/// every partial sum (16 terms plus C, C a multiple of 2^-12 below 8) fits f32's 24 bits
/// exactly, so the emulation must match the f64 definition bit for bit.
fn values(n: usize, seed: u64, scale: i64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let q = (s >> 33) as i64 % (2 * 128 + 1) - 128; // -128 ..= 128
            (q * scale) as f32 / (64.0 * scale as f32 * scale as f32)
        })
        .collect()
}

fn reference(a: &[f32], b: &[f32], c: &[f32], k: usize) -> Vec<f64> {
    let mut d = vec![0.0f64; 256];
    for m in 0..16 {
        for n in 0..16 {
            let mut s = c[m * 16 + n] as f64;
            for kk in 0..k {
                s += a[m * k + kk] as f64 * b[kk * 16 + n] as f64;
            }
            d[m * 16 + n] = s;
        }
    }
    d
}

fn run_tile(dtype: i32, waves: usize, seed: u64) {
    let k = if dtype == 2 { 4 } else { 16 };
    let a = values(16 * k, seed, 1);
    let b = values(k * 16, seed + 1, 1);
    // C: multiples of 2^-12 in [-2, 2].
    let c: Vec<f32> = values(256, seed + 2, 1)
        .iter()
        .zip(values(256, seed + 3, 1))
        .map(|(x, y)| x + y / 64.0)
        .collect();
    let mut d = vec![f32::NAN; 256 * waves];
    launch1(
        "hipemu_test_mc_tile",
        1,
        64 * waves as u32,
        &[
            arg(dtype),
            ptr(a.as_ptr()),
            ptr(b.as_ptr()),
            ptr(c.as_ptr()),
            ptr_mut(d.as_mut_ptr()),
        ],
    )
    .unwrap();
    let want = reference(&a, &b, &c, k);
    for w in 0..waves {
        for (i, &x) in want.iter().enumerate() {
            let got = d[w * 256 + i];
            assert_eq!(
                got as f64,
                x,
                "dtype {dtype}, wave {w}, D[{}][{}]",
                i / 16,
                i % 16
            );
        }
    }
}

#[test]
fn tile_emulation_matches_the_per_element_definition_in_f16_bf16_f32() {
    if !available() {
        return;
    }
    // One wave, then four waves of one block (each wave its own rendezvous and table row).
    for (dtype, seed) in [(0, 10), (1, 20), (2, 30), (3, 40)] {
        run_tile(dtype, 1, seed);
        run_tile(dtype, 4, seed + 100);
    }
}

#[test]
fn lane_layout_is_the_published_mfma_layout() {
    if !available() {
        return;
    }
    let mut t: Vec<Vec<i32>> = (0..7).map(|_| vec![-2; 256]).collect();
    let args: Vec<Vec<u8>> = t.iter_mut().map(|v| ptr_mut(v.as_mut_ptr())).collect();
    launch1("hipemu_test_mc_layout", 1, 64, &args).unwrap();
    for l in 0..64i32 {
        for e in 0..4i32 {
            let i = (l * 4 + e) as usize;
            // CDNA MFMA 16x16x16 (AMD's composable_kernel, xdlops_gemm.hpp: 16 threads per
            // block, 4 input blocks of 4 k values, one output group of 4 rows per lane).
            assert_eq!(
                (t[0][i], t[1][i]),
                (l % 16, 4 * (l / 16) + e),
                "A of lane {l}"
            );
            if e == 0 {
                assert_eq!(t[2][i], l / 16, "f32 16x16x4: k of lane {l}");
            }
            assert_eq!(
                (t[3][i], t[4][i]),
                (4 * (l / 16) + e, l % 16),
                "MFMA acc {l}.{e}"
            );
            // The MMAC assumption (kernels/mc_layout.h): row l % 16, columns l / 16 + 4e.
            assert_eq!(
                (t[5][i], t[6][i]),
                (l % 16, l / 16 + 4 * e),
                "MMAC acc {l}.{e}"
            );
        }
    }
    // Each accumulator layout covers the 16 x 16 tile exactly once.
    for (rows, cols) in [(&t[3], &t[4]), (&t[5], &t[6])] {
        let mut seen = [false; 256];
        for i in 0..256 {
            let cell = (rows[i] * 16 + cols[i]) as usize;
            assert!(!seen[cell], "cell {cell} twice");
            seen[cell] = true;
        }
    }
}
