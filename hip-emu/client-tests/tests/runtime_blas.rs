//! hipBLAS and rocBLAS on hip-emu through `hip_rt::Blas` (row-major mapping, transposes,
//! strided batches, f32/f16/bf16) against a CPU loop, plus the legacy GemmEx ABI and BLAS
//! errors through raw calls. Computed on the CPU emulation: no figure is a GPU figure.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use half::{bf16, f16};
use hip_rt::{Batch, Blas, BlasBackend, DeviceBuffer, Gemm, GemmElement, Stream, StreamOptions};

/// Largest |got - want| relative to max(1, |want|): f32 accumulates k <= 64 products of values
/// <= 2 in f32 (error well under 1e-5 relative); f16/bf16 results are rounded once to the
/// output type (half an ulp: 2^-11 and 2^-8 relative).
const TOL_F32: f32 = 1e-5;
const TOL_F16: f32 = 1.0 / 1024.0;
const TOL_BF16: f32 = 1.0 / 128.0;

fn stream() -> Arc<Stream> {
    common::setup(&[]);
    let dev = hip_rt::Device::get_direct(0).expect("hip-emu device");
    Arc::new(Stream::new(&dev, StreamOptions::default()).unwrap())
}

/// Values exactly representable in bf16 and f16 (multiples of 1/8 in [-1, 1]).
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7 + seed * 13) % 17) as f32 / 8.0 - 1.0)
        .collect()
}

/// Row-major reference: C[b] = alpha * op(A[b]) op(B[b]) + beta * C0[b], accumulated in f64.
fn reference(g: &Gemm, batch: usize, a: &[f32], b: &[f32], c0: &[f32]) -> Vec<f32> {
    let (m, n, k) = (g.m, g.n, g.k);
    let mut out = vec![0f32; batch * m * n];
    for bi in 0..batch {
        let (a, b) = (&a[bi * m * k..], &b[bi * k * n..]);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0f64;
                for p in 0..k {
                    let x = if g.trans_a {
                        a[p * m + i]
                    } else {
                        a[i * k + p]
                    };
                    let y = if g.trans_b {
                        b[j * k + p]
                    } else {
                        b[p * n + j]
                    };
                    acc += f64::from(x) * f64::from(y);
                }
                let idx = bi * m * n + i * n + j;
                let old = if g.beta == 0.0 {
                    0.0
                } else {
                    f64::from(g.beta) * f64::from(c0[idx])
                };
                out[idx] = (f64::from(g.alpha) * acc + old) as f32;
            }
        }
    }
    out
}

fn worst(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
        .fold(0.0, f32::max)
}

/// Run `g` (batched when `batch > 1`) in type T and return the worst relative error.
fn check<T: GemmElement>(
    blas: &Blas,
    g: &Gemm,
    batch: usize,
    from: fn(f32) -> T,
    to: fn(T) -> f32,
    nan_c: bool,
) -> f32 {
    let s = blas.stream();
    let (m, n, k) = (g.m, g.n, g.k);
    let (a, b) = (values(batch * m * k, 1), values(batch * k * n, 2));
    let c0 = if nan_c {
        vec![f32::NAN; batch * m * n]
    } else {
        values(batch * m * n, 3)
    };
    let conv = |v: &[f32]| v.iter().map(|x| from(*x)).collect::<Vec<T>>();
    let (da, db) = (
        DeviceBuffer::from_slice(s, &conv(&a)).unwrap(),
        DeviceBuffer::from_slice(s, &conv(&b)).unwrap(),
    );
    let mut dc = DeviceBuffer::from_slice(s, &conv(&c0)).unwrap();
    if batch > 1 {
        blas.gemm_strided_batched(g, &Batch::packed(g, batch), &da, &db, &mut dc)
            .unwrap();
    } else {
        blas.gemm(g, &da, &db, &mut dc).unwrap();
    }
    let got: Vec<f32> = dc.to_vec(s).unwrap().into_iter().map(to).collect();
    worst(&got, &reference(g, batch, &a, &b, &c0))
}

fn shapes() -> Vec<Gemm> {
    let mut out = Vec::new();
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        out.push(Gemm {
            trans_a: ta,
            trans_b: tb,
            m: 7,
            n: 5,
            k: 64,
            alpha: 1.5,
            beta: 0.5,
        });
    }
    out
}

#[test]
fn hipblas_gemm_matches_the_cpu_in_every_type_transpose_and_batch() {
    let blas = Blas::new(stream()).unwrap();
    assert_eq!(blas.backend(), BlasBackend::HipBlas);
    let lib = hip_sys::blas::hipblas().unwrap();
    assert_eq!(
        lib.gemm_ex_abi(),
        Some(hip_sys::blas::GemmExAbi::V2Suffixed)
    );
    for g in shapes() {
        for batch in [1, 3] {
            let e32 = check(&blas, &g, batch, |x| x, |x| x, false);
            let e16 = check(&blas, &g, batch, f16::from_f32, f16::to_f32, false);
            let eb16 = check(&blas, &g, batch, bf16::from_f32, bf16::to_f32, false);
            assert!(
                e32 <= TOL_F32 && e16 <= TOL_F16 && eb16 <= TOL_BF16,
                "{g:?} batch {batch}: {e32} {e16} {eb16}"
            );
        }
    }
    // beta = 0 ignores C entirely, even NaN.
    let g = Gemm::new(9, 4, 16);
    assert!(check(&blas, &g, 1, |x| x, |x| x, true) <= TOL_F32);
    // A wrong answer is caught: the reference of a different shape disagrees.
    let s = blas.stream();
    let (a, b) = (values(9 * 16, 1), values(16 * 4, 2));
    let (da, db) = (
        DeviceBuffer::from_slice(s, &a).unwrap(),
        DeviceBuffer::from_slice(s, &b).unwrap(),
    );
    let mut dc = DeviceBuffer::<f32>::zeroed(s, 36).unwrap();
    blas.gemm(&g, &da, &db, &mut dc).unwrap();
    let swapped = Gemm { trans_b: true, ..g };
    assert!(
        worst(
            &dc.to_vec(s).unwrap(),
            &reference(&swapped, 1, &a, &b, &[0.0; 36])
        ) > 0.1
    );
}

#[test]
fn rocblas_backend_matches_the_cpu() {
    let blas = Blas::with_backend(stream(), BlasBackend::RocBlas).unwrap();
    assert_eq!(blas.backend(), BlasBackend::RocBlas);
    for g in shapes() {
        for batch in [1, 2] {
            assert!(
                check(&blas, &g, batch, |x| x, |x| x, false) <= TOL_F32,
                "{g:?}"
            );
            assert!(
                check(&blas, &g, batch, bf16::from_f32, bf16::to_f32, false) <= TOL_BF16,
                "{g:?}"
            );
        }
    }
}

#[test]
fn legacy_gemm_ex_abi_and_errors_through_raw_calls() {
    use hip_sys::blas::{
        hipblasDatatype_t as Dt, hipblasGemmAlgo_t, hipblasOperation_t as Op, hipblasStatus_t as St,
    };
    let s = stream();
    let lib = hip_sys::blas::hipblas().unwrap();
    let (create, set_stream, gemm_ex) = (
        hip_sys::sym!(lib, hipblasCreate).unwrap(),
        hip_sys::sym!(lib, hipblasSetStream).unwrap(),
        hip_sys::sym!(lib, hipblasGemmEx).unwrap(),
    );
    let mut h = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the stream is live.
    unsafe {
        create(&mut h).result().unwrap();
        set_stream(h, s.raw()).result().unwrap();
    }
    // Column-major 2x2: C = A * B with A = [[1,2],[3,4]], B = I * 2.
    let a = DeviceBuffer::from_slice(&s, &[1f32, 3., 2., 4.]).unwrap();
    let b = DeviceBuffer::from_slice(&s, &[2f32, 0., 0., 2.]).unwrap();
    let c = DeviceBuffer::<f32>::zeroed(&s, 4).unwrap();
    let (alpha, beta) = (1f32, 0f32);
    let call = |lda: i32, compute: Dt| {
        // SAFETY: device operands of 4 f32 each; host scalars live across the call.
        unsafe {
            gemm_ex(
                h,
                Op::HIPBLAS_OP_N,
                Op::HIPBLAS_OP_N,
                2,
                2,
                2,
                (&alpha as *const f32).cast(),
                a.device_ptr().as_raw(),
                Dt::HIPBLAS_R_32F,
                lda,
                b.device_ptr().as_raw(),
                Dt::HIPBLAS_R_32F,
                2,
                (&beta as *const f32).cast(),
                c.device_ptr().as_raw(),
                Dt::HIPBLAS_R_32F,
                2,
                compute,
                hipblasGemmAlgo_t::HIPBLAS_GEMM_DEFAULT,
            )
        }
    };
    assert_eq!(call(2, Dt::HIPBLAS_R_32F), St::HIPBLAS_STATUS_SUCCESS);
    assert_eq!(c.to_vec(&s).unwrap(), vec![2., 6., 4., 8.]);
    assert_eq!(call(1, Dt::HIPBLAS_R_32F), St::HIPBLAS_STATUS_INVALID_VALUE);
    assert!(
        common::last_message().contains("lda = 1"),
        "{}",
        common::last_message()
    );
    assert_eq!(call(2, Dt::HIPBLAS_R_16F), St::HIPBLAS_STATUS_NOT_SUPPORTED);
    assert_eq!(call(2, Dt(999)), St::HIPBLAS_STATUS_NOT_SUPPORTED);
    // An operand past its allocation is rejected before anything runs.
    let small = DeviceBuffer::<f32>::zeroed(&s, 3).unwrap();
    // SAFETY: the emulator checks the operand ranges before reading.
    let st = unsafe {
        gemm_ex(
            h,
            Op::HIPBLAS_OP_N,
            Op::HIPBLAS_OP_N,
            2,
            2,
            2,
            (&alpha as *const f32).cast(),
            small.device_ptr().as_raw(),
            Dt::HIPBLAS_R_32F,
            2,
            b.device_ptr().as_raw(),
            Dt::HIPBLAS_R_32F,
            2,
            (&beta as *const f32).cast(),
            c.device_ptr().as_raw(),
            Dt::HIPBLAS_R_32F,
            2,
            Dt::HIPBLAS_R_32F,
            hipblasGemmAlgo_t::HIPBLAS_GEMM_DEFAULT,
        )
    };
    assert_eq!(st, St::HIPBLAS_STATUS_INVALID_VALUE);
    assert!(
        common::last_message().contains("operand A"),
        "{}",
        common::last_message()
    );
    let destroy = hip_sys::sym!(lib, hipblasDestroy).unwrap();
    // SAFETY: `h` is live and destroyed once; a second destroy is an error, not UB.
    unsafe {
        assert_eq!(destroy(h), St::HIPBLAS_STATUS_SUCCESS);
        assert_eq!(destroy(h), St::HIPBLAS_STATUS_NOT_INITIALIZED);
        assert_eq!(
            destroy(std::ptr::null_mut()),
            St::HIPBLAS_STATUS_HANDLE_IS_NULLPTR
        );
    }
}
