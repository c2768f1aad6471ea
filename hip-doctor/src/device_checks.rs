//! Checks per device, through `hip-rt`: an alloc/copy round trip, GEMM through hipBLAS/rocBLAS
//! against the CPU reference (plain and strided-batched, the latter because some DTK builds are
//! known to miscompute it), memory info, and errors recorded while dropping.
//!
//! None of these has run on a GPU yet: on a machine without a device they are never reached (the
//! section then holds one skipped row). They are written so that each failure names the check,
//! the value and the index.

use std::sync::Arc;

use half::{bf16, f16};
use hip_rt::{Batch, Blas, Device, DeviceBuffer, Gemm, GemmElement, Stream, StreamOptions};

use super::guard::check;
use super::report::{Item, Section};
use hip_kernels::cpu;
use hip_kernels::ops::{Matmul, MatmulParams};
use hip_kernels::params::Element;
use hip_kernels::tolerance::{tolerance, Rule};

/// Sizes (in f32 elements) of the copy round trip: one element, an odd size, 4 MiB.
const COPY_LENS: [usize; 3] = [1, 4099, 1 << 20];

/// One GEMM case: odd sizes so edge handling is exercised, alpha and beta not 0/1.
const GEMM: Gemm = Gemm {
    trans_a: false,
    trans_b: true,
    m: 67,
    n: 45,
    k: 129,
    alpha: 1.5,
    beta: 0.5,
};

/// The section for the device at `ordinal`.
pub fn section(ordinal: usize) -> Section {
    let mut section = Section::new(format!("Checks (device {ordinal})"));
    let device = match i32::try_from(ordinal)
        .map_err(|e| e.to_string())
        .and_then(|o| Device::get(o).map_err(|e| e.to_string()))
    {
        Ok(d) => d,
        Err(e) => {
            section.push(Item::fail("open device", e));
            return section;
        }
    };
    section.push(check("alloc/copy round trip", || copy_round_trip(&device)));
    section.push(check("memory info", || memory_info(&device)));
    section.push(gemm_item(&device));
    match Stream::new(&device, StreamOptions::default()) {
        Ok(stream) => section.items.extend(super::kernel_checks::items(&stream)),
        Err(e) => section.push(Item::fail(
            "kernels vs CPU reference",
            format!("creating a stream: {e}"),
        )),
    }
    section.push(check("allocator stats", || {
        super::alloc_check::check(device.ordinal())
    }));
    section.push(check("errors while dropping", || {
        device
            .check_err()
            .map(|()| "none recorded".to_string())
            .map_err(|e| e.to_string())
    }));
    section
}

/// A value that differs in every element and is exact in f32: `i * 0.5 - 1000`.
fn pattern(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (i % (1 << 22)) as f32 * 0.5 - 1000.0)
        .collect()
}

fn copy_round_trip(device: &Device) -> Result<String, String> {
    let stream = Stream::new(device, StreamOptions::default())
        .map_err(|e| format!("creating a stream: {e}"))?;
    for len in COPY_LENS {
        let host = pattern(len);
        let src = DeviceBuffer::from_slice(&stream, &host)
            .map_err(|e| format!("uploading {len} f32: {e}"))?;
        let mut dst = DeviceBuffer::<f32>::alloc(&stream, len)
            .map_err(|e| format!("allocating {len} f32: {e}"))?;
        stream
            .copy_dtod(&src, &mut dst)
            .map_err(|e| format!("device-to-device copy of {len} f32: {e}"))?;
        let back = dst
            .to_vec(&stream)
            .map_err(|e| format!("downloading {len} f32: {e}"))?;
        if let Some(i) =
            (0..len).find(|&i| back.get(i).map(|v| v.to_bits()) != host.get(i).map(|v| v.to_bits()))
        {
            return Err(format!(
                "{len} f32 round trip differs at index {i}: got {:?}, sent {:?}",
                back.get(i),
                host.get(i)
            ));
        }
    }
    let zeroed =
        DeviceBuffer::<f32>::zeroed(&stream, 4099).map_err(|e| format!("zeroed alloc: {e}"))?;
    let zeros = zeroed
        .to_vec(&stream)
        .map_err(|e| format!("downloading zeroed buffer: {e}"))?;
    if let Some(i) = zeros.iter().position(|v| v.to_bits() != 0) {
        return Err(format!("zeroed buffer holds {} at index {i}", zeros[i]));
    }
    let sizes: Vec<String> = COPY_LENS.iter().map(|l| format!("{} B", l * 4)).collect();
    Ok(format!(
        "host -> device -> device -> host bit-exact at {}; zeroed alloc reads 0",
        sizes.join(", ")
    ))
}

fn memory_info(device: &Device) -> Result<String, String> {
    let info = device.memory_info().map_err(|e| e.to_string())?;
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    if info.total == 0 || info.free > info.total {
        return Err(format!(
            "implausible: free {} B of total {} B",
            info.free, info.total
        ));
    }
    Ok(format!(
        "{:.2} GiB free of {:.2} GiB",
        gib(info.free),
        gib(info.total)
    ))
}

fn gemm_item(device: &Device) -> Item {
    let name = "BLAS GEMM vs CPU";
    if hip_sys::blas::hipblas().is_err() && hip_sys::blas::rocblas().is_err() {
        return Item::skipped(
            name,
            "neither hipBLAS nor rocBLAS was found (see Environment)",
        );
    }
    check(name, || {
        let stream = Stream::new(device, StreamOptions::default())
            .map_err(|e| format!("creating a stream: {e}"))?;
        let blas =
            Blas::new(Arc::new(stream)).map_err(|e| format!("creating the BLAS handle: {e}"))?;
        let mut done = Vec::new();
        done.push(gemm_case::<f32>(&blas, 1)?);
        done.push(gemm_case::<f16>(&blas, 1)?);
        done.push(gemm_case::<bf16>(&blas, 1)?);
        done.push(gemm_case::<f32>(&blas, 3)?);
        Ok::<_, String>(format!("{:?}: {}", blas.backend(), done.join("; ")))
    })
}

/// Runs `batch` GEMMs of [`GEMM`]'s shape in `T` on the device and the CPU reference; the first
/// element outside the matmul tolerance for `T` is an error.
fn gemm_case<T: GemmElement + Element>(blas: &Blas, batch: usize) -> Result<String, String> {
    let g = GEMM;
    // The same product as the CPU reference's parameters (alpha and beta included).
    let params = MatmulParams {
        batch,
        m: g.m,
        n: g.n,
        k: g.k,
        trans_a: g.trans_a,
        trans_b: g.trans_b,
        alpha: g.alpha,
        beta: g.beta,
        layout: hip_kernels::ops::MatmulLayout::PACKED,
    };
    let to_t = |v: Vec<f32>| v.into_iter().map(T::from_f32).collect::<Vec<T>>();
    let a = to_t(pattern_scaled(batch * g.m * g.k, 0.01));
    let b = to_t(pattern_scaled(batch * g.k * g.n, 0.02));
    let c = to_t(pattern_scaled(batch * g.m * g.n, 0.03));
    let mut want = c.clone();
    cpu::matmul(Matmul {
        params,
        a: &a,
        b: &b,
        out: &mut want,
    })
    .map_err(|e| format!("CPU reference: {e}"))?;

    let stream = blas.stream();
    let up = |v: &[T], what: &str| {
        DeviceBuffer::from_slice(stream, v).map_err(|e| format!("uploading {what}: {e}"))
    };
    let (da, db, mut dc) = (up(&a, "A")?, up(&b, "B")?, up(&c, "C")?);
    let run = if batch == 1 {
        blas.gemm(&g, &da, &db, &mut dc)
    } else {
        blas.gemm_strided_batched(&g, &Batch::packed(&g, batch), &da, &db, &mut dc)
    };
    run.map_err(|e| format!("gemm: {e}"))?;
    let got = dc
        .to_vec(stream)
        .map_err(|e| format!("downloading C: {e}"))?;

    let dtype = T::DTYPE;
    let tol = tolerance(Rule::Reduction, "out", dtype, dtype, g.k);
    for (i, (x, w)) in got.iter().zip(&want).enumerate() {
        let (x, w) = (x.to_f64(), w.to_f64());
        if !tol.allows(x, w) {
            return Err(format!(
                "{dtype} batch {batch}: element {i} is {x}, the CPU reference gives {w} ({tol:?})"
            ));
        }
    }
    let kind = if batch == 1 {
        "gemm".to_string()
    } else {
        format!("strided-batched x{batch}")
    };
    Ok(format!("{dtype} {kind} {}x{}x{} ok", g.m, g.n, g.k))
}

/// Small values of both signs: `((i * 37) % 101 - 50) * scale`.
fn pattern_scaled(len: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 37) % 101) as f32 - 50.0)
        .map(|v| v * scale)
        .collect()
}

/// The section shown when there is no device to check.
pub fn no_device_section(reason: &str) -> Section {
    let mut section = Section::new("Checks");
    section.push(Item::skipped("device checks", reason.to_string()));
    section
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_exact_and_distinct() {
        let p = pattern(5);
        assert_eq!(p, vec![-1000.0, -999.5, -999.0, -998.5, -998.0]);
        let q = pattern_scaled(3, 0.5);
        assert_eq!(q, vec![-25.0, -6.5, 12.0]);
    }
}
