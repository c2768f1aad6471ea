//! `--bench`: short microbenchmarks, reported as GB/s or TFLOPS.
//!
//! Each benchmark is a closure that runs the operation once and waits for it to finish (the
//! closure synchronises the device). [`measure`] runs it a few times after a warm-up and keeps
//! the median, so one slow first launch (code-object load) does not distort the figure.

use std::sync::Arc;
use std::time::{Duration, Instant};

use half::f16;
use hip_rt::{Blas, Device, DeviceBuffer, Gemm, GemmElement, Stream, StreamOptions};

use super::diagnose::DeviceState;
use super::guard::{guarded, with_steps};
use super::progress::Steps;
use super::report::{Item, Section};
use crate::report::Json;

/// Warm-up runs before timing.
pub const WARMUP: usize = 2;

/// Timed runs; the median is reported.
pub const RUNS: usize = 10;

/// What one run of a benchmark moves or computes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Work {
    /// Bytes read plus bytes written: reported as GB/s.
    Bytes(f64),
    /// Floating-point operations: reported as TFLOPS.
    Flops(f64),
}

impl Work {
    /// The rate for one run taking `seconds`, with its unit.
    pub fn rate(self, seconds: f64) -> (f64, &'static str) {
        match self {
            Work::Bytes(b) => (b / seconds / 1e9, "GB/s"),
            Work::Flops(f) => (f / seconds / 1e12, "TFLOPS"),
        }
    }
}

/// The median of `times` (the mean of the middle two for an even count); zero when empty.
pub fn median(times: &mut [Duration]) -> Duration {
    times.sort_unstable();
    match times.len() {
        0 => Duration::ZERO,
        n if n % 2 == 1 => times[n / 2],
        n => (times[n / 2 - 1] + times[n / 2]) / 2,
    }
}

/// Runs `once` [`WARMUP`] times untimed, then [`RUNS`] times timed; returns the median time.
pub fn measure<E>(mut once: impl FnMut() -> Result<(), E>) -> Result<Duration, E> {
    for _ in 0..WARMUP {
        once()?;
    }
    let mut times = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = Instant::now();
        once()?;
        times.push(start.elapsed());
    }
    Ok(median(&mut times))
}

/// A benchmark row: `name`, median time and rate; a FAIL row if a run failed.
pub fn bench_item<E: std::fmt::Display>(
    name: &str,
    work: Work,
    once: impl FnMut() -> Result<(), E>,
) -> Item {
    match measure(once) {
        Ok(time) => {
            let seconds = time.as_secs_f64().max(1e-9);
            let (rate, unit) = work.rate(seconds);
            Item::info(
                name,
                format!(
                    "{rate:.2} {unit} (median of {RUNS}, {:.3} ms)",
                    seconds * 1e3
                ),
            )
            .with_fact("median_ms", Json::from(seconds * 1e3))
            .with_fact(unit, Json::from(rate))
        }
        Err(e) => Item::fail(name, format!("benchmark run failed: {e}")),
    }
}

/// Bytes of the device-to-device copy benchmark (256 MiB).
const COPY_BYTES: usize = 256 << 20;

/// Square size of the GEMM benchmarks.
pub const GEMM_N: usize = 2048;

/// The Benchmarks section: one block of rows per device, or one skipped row saying why none ran.
pub fn section(devices: &DeviceState) -> Section {
    let mut section = Section::new("Benchmarks");
    let DeviceState::Found(list) = devices else {
        section.push(Item::skipped(
            "benchmarks",
            "no device: the benchmarks need a HIP device",
        ));
        return section;
    };
    for d in list {
        let prefix = format!("device {}", d.ordinal);
        let steps = Steps::new(PER_DEVICE);
        section.items.extend(guarded(&prefix, || {
            with_steps(&format!("benchmarking {prefix}"), &steps, |steps| {
                device_benches(d.ordinal, &prefix, steps)
            })
        }));
    }
    section
}

/// Benchmarks per device: the copy, two BLAS GEMMs, and the kernels'.
const PER_DEVICE: usize = 3 + super::kernel_bench::COUNT;

/// Names the step `name` in `steps`, runs it, and counts it.
pub(crate) fn step(steps: &Steps, name: &str, run: impl FnOnce() -> Item) -> Item {
    steps.start(name);
    let item = run();
    steps.finish_one();
    item
}

fn device_benches(ordinal: usize, prefix: &str, steps: &Steps) -> Vec<Item> {
    let setup = i32::try_from(ordinal)
        .map_err(|e| e.to_string())
        .and_then(|o| Device::get(o).map_err(|e| e.to_string()))
        .and_then(|d| {
            Stream::new(&d, StreamOptions::default())
                .map(Arc::new)
                .map_err(|e| e.to_string())
        });
    let stream = match setup {
        Ok(s) => s,
        Err(e) => return vec![Item::fail(format!("{prefix} setup"), e)],
    };
    let copy = format!("{prefix} device copy {} MiB", COPY_BYTES >> 20);
    let mut rows = vec![step(steps, &copy, || copy_bench(&stream, &copy))];
    match Blas::new(stream.clone()) {
        Ok(blas) => {
            let sgemm = format!("{prefix} BLAS sgemm {GEMM_N}^3");
            rows.push(step(steps, &sgemm, || gemm_bench::<f32>(&blas, &sgemm)));
            let hgemm = format!("{prefix} BLAS hgemm {GEMM_N}^3 (f32 acc)");
            rows.push(step(steps, &hgemm, || gemm_bench::<f16>(&blas, &hgemm)));
        }
        Err(e) => {
            rows.push(Item::skipped(
                format!("{prefix} BLAS GEMM"),
                format!("no BLAS handle: {e}"),
            ));
            steps.finish_one();
            steps.finish_one();
        }
    }
    rows.extend(super::kernel_bench::items(&stream, prefix, steps));
    rows
}

fn copy_bench(stream: &Stream, name: &str) -> Item {
    let len = COPY_BYTES / 4;
    let buffers = DeviceBuffer::<f32>::zeroed(stream, len)
        .and_then(|a| Ok((a, DeviceBuffer::<f32>::zeroed(stream, len)?)));
    let (src, mut dst) = match buffers {
        Ok(pair) => pair,
        Err(e) => return Item::fail(name, format!("allocating: {e}")),
    };
    // Read once and write once per copy.
    bench_item(name, Work::Bytes(2.0 * COPY_BYTES as f64), || {
        stream.copy_dtod(&src, &mut dst)?;
        stream.synchronize()
    })
}

fn gemm_bench<T: GemmElement + hip_kernels::params::Element>(blas: &Blas, name: &str) -> Item {
    let stream = blas.stream();
    let g = Gemm::new(GEMM_N, GEMM_N, GEMM_N);
    let host: Vec<T> = (0..GEMM_N * GEMM_N)
        .map(|i| T::from_f32(((i % 7) as f32 - 3.0) * 0.125))
        .collect();
    let buffers = DeviceBuffer::from_slice(stream, &host).and_then(|a| {
        Ok((
            a,
            DeviceBuffer::from_slice(stream, &host)?,
            DeviceBuffer::<T>::zeroed(stream, host.len())?,
        ))
    });
    let (a, b, mut c) = match buffers {
        Ok(t) => t,
        Err(e) => return Item::fail(name, format!("allocating: {e}")),
    };
    let flops = 2.0 * (GEMM_N as f64).powi(3);
    bench_item(name, Work::Flops(flops), || {
        blas.gemm(&g, &a, &b, &mut c)?;
        stream.synchronize()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_have_the_right_units() {
        assert_eq!(Work::Bytes(2e9).rate(0.5), (4.0, "GB/s"));
        assert_eq!(Work::Flops(3e12).rate(1.5), (2.0, "TFLOPS"));
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        let ms = Duration::from_millis;
        assert_eq!(median(&mut [ms(5), ms(1), ms(3)]), ms(3));
        assert_eq!(
            median(&mut [ms(4), ms(1), ms(3), ms(2)]),
            Duration::from_micros(2500)
        );
        assert_eq!(median(&mut []), Duration::ZERO);
    }

    #[test]
    fn measure_runs_warmup_plus_runs_and_stops_on_error() {
        let mut calls = 0;
        assert!(measure(|| {
            calls += 1;
            Ok::<_, String>(())
        })
        .is_ok());
        assert_eq!(calls, WARMUP + RUNS);
        let mut calls = 0;
        let failed = bench_item("x", Work::Bytes(1.0), || {
            calls += 1;
            if calls == 3 {
                Err("launch failed")
            } else {
                Ok(())
            }
        });
        assert_eq!(
            failed,
            Item::fail("x", "benchmark run failed: launch failed")
        );
        assert_eq!(calls, 3);
    }
}
