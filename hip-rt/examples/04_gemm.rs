//! Row-major GEMM in f32, f16 and bf16 (f32 accumulation) through hipBLAS or rocBLAS, checked
//! against a CPU computation.
//!
//! `cargo run -p hip-rt --example 04_gemm`. Exits 2 with a diagnosis when there is no device.

mod common;

use std::sync::Arc;

use common::check;
use half::{bf16, f16};
use hip_rt::{Blas, DeviceBuffer, Gemm, GemmElement, Stream, StreamOptions};

fn main() {
    let device = common::device_or_exit();
    let stream = Arc::new(check(
        "creating a stream",
        Stream::new(&device, StreamOptions::default()),
    ));
    let blas = check("opening hipBLAS/rocBLAS", Blas::new(stream.clone()));
    println!("BLAS backend: {:?}", blas.backend());
    let (m, n, k) = (128, 96, 256);
    let a: Vec<f32> = (0..m * k)
        .map(|i| ((i * 7) % 17) as f32 / 8.0 - 1.0)
        .collect();
    let b: Vec<f32> = (0..k * n)
        .map(|i| ((i * 5) % 13) as f32 / 8.0 - 0.75)
        .collect();
    let want: Vec<f32> = (0..m * n)
        .map(|idx| {
            (0..k)
                .map(|p| f64::from(a[(idx / n) * k + p]) * f64::from(b[p * n + idx % n]))
                .sum::<f64>() as f32
        })
        .collect();
    let g = Gemm::new(m, n, k);
    let worst = [
        run(&blas, &stream, &g, &a, &b, &want, |x| x, |x| x),
        run(
            &blas,
            &stream,
            &g,
            &a,
            &b,
            &want,
            f16::from_f32,
            f16::to_f32,
        ),
        run(
            &blas,
            &stream,
            &g,
            &a,
            &b,
            &want,
            bf16::from_f32,
            bf16::to_f32,
        ),
    ];
    for (name, err) in ["f32", "f16", "bf16"].iter().zip(worst) {
        println!("{name}: {m}x{n}x{k}, max |error| vs CPU = {err:.3e}");
    }
    // Inputs are exact in every type; outputs up to ~200 in magnitude round to bf16 within 1.
    if worst.iter().any(|e| *e > 1.0) {
        eprintln!("error: a GEMM result is off by more than the rounding of its output type");
        std::process::exit(1);
    }
}

#[allow(clippy::too_many_arguments)]
fn run<T: GemmElement>(
    blas: &Blas,
    s: &Stream,
    g: &Gemm,
    a: &[f32],
    b: &[f32],
    want: &[f32],
    from: fn(f32) -> T,
    to: fn(T) -> f32,
) -> f32 {
    let conv = |v: &[f32]| v.iter().map(|x| from(*x)).collect::<Vec<T>>();
    let da = check("uploading A", DeviceBuffer::from_slice(s, &conv(a)));
    let db = check("uploading B", DeviceBuffer::from_slice(s, &conv(b)));
    let mut dc = check("allocating C", DeviceBuffer::<T>::zeroed(s, g.m * g.n));
    check("gemm", blas.gemm(g, &da, &db, &mut dc));
    let got = check("downloading C", dc.to_vec(s));
    got.iter()
        .zip(want)
        .map(|(x, w)| (to(*x) - w).abs())
        .fold(0.0, f32::max)
}
