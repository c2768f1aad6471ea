//! Programs that share data through LDS: a tiled matmul (an explicitly instantiated template),
//! transposes with static and dynamic LDS, a block scan, a histogram, a bitonic sort,
//! Floyd-Warshall, a templated block max on dynamic LDS, a dot product, a shuffle reduction.

use super::{cfg1 as cfg, cfg2, close, data, start};
use hip_rt::LaunchConfig;

#[test]
fn tiled_matmul_template() {
    let Some(e) = start() else { return };
    let (m, n, k) = (33usize, 20usize, 45usize);
    let (a, b) = (data(m * k, 20), data(k * n, 21));
    let f = e.kernel("matmul_tiled", "matrix_multiplication_kernel<16u>");
    let (da, db) = (e.upload(&a), e.upload(&b));
    let mut dc = e.upload(&vec![0f32; m * n]);
    // SAFETY: (const float* a, const float* b, float* c, int m, int n, int k).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&da)
            .arg(&db)
            .arg_mut(&mut dc)
            .value(m as i32)
            .value(n as i32)
            .value(k as i32)
            .launch(&cfg2((2, 3), (16, 16)))
    }
    .unwrap();
    let want: Vec<f64> = (0..m * n)
        .map(|i| {
            (0..k)
                .map(|j| f64::from(a[i / n * k + j]) * f64::from(b[j * n + i % n]))
                .sum()
        })
        .collect();
    close(&e.download(&dc), &want, 1e-5, "matmul");
}

fn transposed(x: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    (0..rows * cols)
        .map(|i| f64::from(x[(i % rows) * cols + i / rows]))
        .collect()
}

#[test]
fn transpose_with_static_lds() {
    let Some(e) = start() else { return };
    let (rows, cols) = (40usize, 23usize);
    let x = data(rows * cols, 22);
    let f = e.kernel("transpose_static", "transpose_static");
    let dx = e.upload(&x);
    let mut dy = e.upload(&vec![0f32; rows * cols]);
    // SAFETY: (const float* in, float* out, int rows, int cols).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&dx)
            .arg_mut(&mut dy)
            .value(rows as i32)
            .value(cols as i32)
            .launch(&cfg2((2, 3), (16, 16)))
    }
    .unwrap();
    close(
        &e.download(&dy),
        &transposed(&x, rows, cols),
        0.0,
        "transpose",
    );
}

#[test]
fn transpose_with_dynamic_lds() {
    let Some(e) = start() else { return };
    let (rows, cols, t) = (17usize, 30usize, 8u32);
    let x = data(rows * cols, 23);
    let f = e.kernel("transpose_dynamic", "transpose_dynamic");
    let dx = e.upload(&x);
    let mut dy = e.upload(&vec![0f32; rows * cols]);
    let launch = LaunchConfig {
        grid: (4, 3, 1),
        block: (t, t, 1),
        shared_mem_bytes: t * (t + 1) * 4,
    };
    // SAFETY: (const float* in, float* out, int rows, int cols); t*(t+1) floats of LDS.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&dx)
            .arg_mut(&mut dy)
            .value(rows as i32)
            .value(cols as i32)
            .launch(&launch)
    }
    .unwrap();
    close(
        &e.download(&dy),
        &transposed(&x, rows, cols),
        0.0,
        "transpose",
    );
}

#[test]
fn block_inclusive_scan() {
    let Some(e) = start() else { return };
    let input: Vec<i32> = (0..200).map(|i| (i * 37 % 11) - 5).collect();
    let f = e.kernel("block_scan", "block_scan");
    let din = e.upload(&input);
    let mut dout = e.upload(&[0i32; 200]);
    // SAFETY: (const int* in, int* out, int n), one block of 256.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&din)
            .arg_mut(&mut dout)
            .value(200i32)
            .launch(&cfg(1, 256, 0))
    }
    .unwrap();
    let want: Vec<i32> = input
        .iter()
        .scan(0, |s, v| {
            *s += v;
            Some(*s)
        })
        .collect();
    assert_eq!(e.download(&dout), want);
}

#[test]
fn histogram_with_lds_atomics() {
    let Some(e) = start() else { return };
    let bytes: Vec<u8> = (0..5000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let f = e.kernel("histogram", "histogram");
    let dd = e.upload(&bytes);
    let mut db = e.upload(&[0u32; 64]);
    // SAFETY: (const unsigned char* data, unsigned* bins, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&dd)
            .arg_mut(&mut db)
            .value(5000i32)
            .launch(&cfg(3, 128, 0))
    }
    .unwrap();
    let mut want = [0u32; 64];
    for b in &bytes {
        want[usize::from(*b) % 64] += 1;
    }
    assert_eq!(e.download(&db), want);
}

#[test]
fn bitonic_sort_in_one_block() {
    let Some(e) = start() else { return };
    let keys: Vec<i32> = (0..256)
        .map(|i: i32| (i.wrapping_mul(7919) % 1000) - 500)
        .collect();
    let f = e.kernel("bitonic_sort", "bitonic_sort");
    let mut dk = e.upload(&keys);
    // SAFETY: (int* keys), 256 keys, 256 ints of dynamic LDS.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg_mut(&mut dk)
            .launch(&cfg(1, 256, 1024))
    }
    .unwrap();
    let mut want = keys.clone();
    want.sort();
    assert_eq!(e.download(&dk), want);
}

#[test]
fn floyd_warshall_one_launch_per_vertex() {
    let Some(e) = start() else { return };
    let n = 24u32;
    let inf = 1u32 << 20;
    let mut dist: Vec<u32> = (0..n * n)
        .map(|i| {
            let (y, x) = (i / n, i % n);
            if x == y {
                0
            } else if (x * 7 + y * 3) % 5 == 0 {
                1 + (x * 13 + y * 29) % 17
            } else {
                inf
            }
        })
        .collect();
    let f = e.kernel("floyd_warshall", "floyd_warshall_step");
    let mut dd = e.upload(&dist);
    for k in 0..n {
        // SAFETY: (unsigned* dist, unsigned n, unsigned k), n*n entries.
        unsafe {
            e.stream
                .launch_builder(&f)
                .arg_mut(&mut dd)
                .value(n)
                .value(k)
                .launch(&cfg2((2, 2), (16, 16)))
        }
        .unwrap();
    }
    for k in 0..n as usize {
        for y in 0..n as usize {
            for x in 0..n as usize {
                let via = dist[y * n as usize + k] + dist[k * n as usize + x];
                if via < dist[y * n as usize + x] {
                    dist[y * n as usize + x] = via;
                }
            }
        }
    }
    assert_eq!(e.download(&dd), dist);
}

#[test]
fn templated_block_max_on_dynamic_lds() {
    let Some(e) = start() else { return };
    let x = data(256, 24);
    let xi: Vec<i32> = x.iter().map(|v| (v * 1000.0) as i32).collect();
    let ff = e.kernel("dynamic_shared", "block_max<float>");
    let fi = e.kernel("dynamic_shared", "block_max<int>");
    let (dx, dxi) = (e.upload(&x), e.upload(&xi));
    let mut df = e.upload(&[0f32; 4]);
    let mut di = e.upload(&[0i32; 4]);
    // SAFETY: (const T* in, T* out), 4 blocks of 64, 64 elements of dynamic LDS.
    unsafe {
        e.stream
            .launch_builder(&ff)
            .arg(&dx)
            .arg_mut(&mut df)
            .launch(&cfg(4, 64, 256))
    }
    .unwrap();
    // SAFETY: as above.
    unsafe {
        e.stream
            .launch_builder(&fi)
            .arg(&dxi)
            .arg_mut(&mut di)
            .launch(&cfg(4, 64, 256))
    }
    .unwrap();
    let want_f: Vec<f32> = x
        .chunks(64)
        .map(|c| c.iter().copied().fold(f32::MIN, f32::max))
        .collect();
    let want_i: Vec<i32> = xi.chunks(64).map(|c| *c.iter().max().unwrap()).collect();
    assert_eq!(e.download(&df), want_f);
    assert_eq!(e.download(&di), want_i);
}

#[test]
fn dot_product_in_double() {
    let Some(e) = start() else { return };
    let n = 4000;
    let a: Vec<f64> = data(n, 25).iter().map(|v| f64::from(*v)).collect();
    let b: Vec<f64> = data(n, 26).iter().map(|v| f64::from(*v)).collect();
    let f = e.kernel("dot_product", "dot_product");
    let (da, db) = (e.upload(&a), e.upload(&b));
    let mut dr = e.upload(&[0f64]);
    // SAFETY: (const double* a, const double* b, double* result, int n), blocks of 256.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&da)
            .arg(&db)
            .arg_mut(&mut dr)
            .value(n as i32)
            .launch(&cfg(4, 256, 0))
    }
    .unwrap();
    let want: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let got = e.download(&dr)[0];
    assert!(
        (got - want).abs() < 1e-9 * (1.0 + want.abs()),
        "{got} vs {want}"
    );
}

#[test]
fn wave_shuffle_reduction() {
    let Some(e) = start() else { return };
    let n = 10_000;
    let x = data(n, 27);
    let f = e.kernel("reduce_shuffle", "reduce_sum");
    let dx = e.upload(&x);
    let mut dt = e.upload(&[0f32]);
    // SAFETY: (const float* in, float* total, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&dx)
            .arg_mut(&mut dt)
            .value(n as i32)
            .launch(&cfg(4, 256, 0))
    }
    .unwrap();
    let want: f64 = x.iter().map(|v| f64::from(*v)).sum();
    // fp32 partial sums over 10^4 values of magnitude < 1: well within 1e-3 absolute.
    assert!(
        (f64::from(e.download(&dt)[0]) - want).abs() < 1e-3,
        "{want}"
    );
}

#[test]
fn occupancy_follows_the_kernels_resources() {
    let Some(e) = start() else { return };
    let f = e.kernel("matmul_tiled", "matrix_multiplication_kernel<16u>");
    let occupancy = hip_sys::sym!(hipModuleOccupancyMaxActiveBlocksPerMultiprocessor)
        .expect("hip-emu exports it");
    let blocks = |block: i32, dynamic: usize| {
        let mut n = -1;
        // SAFETY: a live function; `n` is a valid out-pointer.
        let r = unsafe { occupancy(&mut n, f.raw(), block, dynamic) };
        assert_eq!(r, hip_sys::hipError_t::hipSuccess);
        n
    };
    // 2 KiB of static LDS (two 16x16 float tiles): with 30 KiB more per block, 2 blocks fit in
    // 64 KiB; with 63 KiB more, none.
    let small = blocks(256, 0);
    assert!((1..=10).contains(&small), "{small}");
    assert_eq!(blocks(256, 30 << 10), 2.min(small));
    assert_eq!(blocks(256, 63 << 10), 0);
    assert_eq!(blocks(2048, 0), 0, "over 1024 threads");
    let potential = hip_sys::sym!(hipModuleOccupancyMaxPotentialBlockSize).expect("exported");
    let (mut grid, mut block) = (0, 0);
    // SAFETY: a live function; valid out-pointers.
    let r = unsafe { potential(&mut grid, &mut block, f.raw(), 0, 1024) };
    assert_eq!(r, hip_sys::hipError_t::hipSuccess);
    assert!(block % 64 == 0 && (64..=1024).contains(&block), "{block}");
    assert!(
        blocks(block, 0) > 0 && grid == blocks(block, 0) * 60,
        "{grid} {block}"
    );
    // No block size fits 63 KiB of dynamic LDS next to the 2 KiB of static: an error.
    // SAFETY: as above.
    let r = unsafe { potential(&mut grid, &mut block, f.raw(), 63 << 10, 1024) };
    assert_eq!(r, hip_sys::hipError_t::hipErrorInvalidValue);
    // The runtime form (HIP's `const void* f`: on hip-emu the hipFunction_t) gives the same
    // answer from the same model, limit and dynamic LDS included.
    let runtime_form = hip_sys::sym!(hipOccupancyMaxPotentialBlockSize).expect("exported");
    for (dynamic, limit) in [(0, 1024), (30 << 10, 1024), (0, 192)] {
        let (mut g1, mut b1, mut g2, mut b2) = (0, 0, -1, -1);
        // SAFETY: a live function; valid out-pointers.
        let r1 = unsafe { potential(&mut g1, &mut b1, f.raw(), dynamic, limit) };
        // SAFETY: as above.
        let r2 = unsafe {
            runtime_form(
                &mut g2,
                &mut b2,
                f.raw().cast_const().cast(),
                dynamic,
                limit,
            )
        };
        assert_eq!(
            (r1, r2),
            (
                hip_sys::hipError_t::hipSuccess,
                hip_sys::hipError_t::hipSuccess
            )
        );
        assert_eq!((g1, b1), (g2, b2), "dynamic {dynamic}, limit {limit}");
        assert!(
            b2 <= limit && b2 % 64 == 0 && g2 == blocks(b2, dynamic) * 60,
            "{g2} {b2}"
        );
    }
    // SAFETY: as above.
    let r = unsafe {
        runtime_form(
            &mut grid,
            &mut block,
            f.raw().cast_const().cast(),
            63 << 10,
            1024,
        )
    };
    assert_eq!(r, hip_sys::hipError_t::hipErrorInvalidValue);
    // Not a function: an error saying what `f` must be.
    let stray = 0u64;
    // SAFETY: `f` is only looked up, never called.
    let r = unsafe { runtime_form(&mut grid, &mut block, (&raw const stray).cast(), 0, 1024) };
    assert_eq!(r, hip_sys::hipError_t::hipErrorInvalidHandle);
}
