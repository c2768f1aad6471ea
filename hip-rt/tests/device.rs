//! Tests that need a real HIP device: `cargo test -p hip-rt --features device`.
//!
//! NEVER RUN ON HARDWARE: no GPU existed where these were written; they compile and are listed
//! (`-- --list`). Without a device each one fails at once with a message saying so.
#![cfg(feature = "device")]

mod common;

use std::sync::Arc;

use half::{bf16, f16};
use hip_rt::memory::buffer::{DeviceView, DeviceViewMut};
use hip_rt::{
    Batch, Blas, Device, DeviceBuffer, Error, Event, EventOptions, Gemm, GemmElement, LaunchConfig,
    Module, PinnedHostBuffer, Stream, StreamOptions,
};

/// Device 0, or a panic that says the device tests need one.
fn device() -> Device {
    Device::get(0).unwrap_or_else(|e| {
        panic!("the `device` tests need a HIP device, and none is usable: {e}\n(run `cargo test` without `--features device` on machines without one)")
    })
}

fn stream(device: &Device) -> Stream {
    Stream::new(device, StreamOptions::default()).expect("create stream")
}

fn pattern(len: usize) -> Vec<u32> {
    (0..len as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ 0x5a5a_5a5a)
        .collect()
}

#[test]
fn properties_are_plausible() {
    let d = device();
    assert!(d.wavefront_size() == 64 || d.wavefront_size() == 32);
    assert!(
        d.gcn_arch_name().starts_with("gfx"),
        "{}",
        d.gcn_arch_name()
    );
    assert!(d.compute_units() > 0 && d.max_threads_per_block() >= 256);
    let mem = d.memory_info().unwrap();
    assert!(mem.free <= mem.total && mem.total > 0);
    assert!(d.pci_bus_id().unwrap().contains(':'));
    d.synchronize().unwrap();
}

#[test]
fn copies_round_trip_at_0_1_odd_and_256_mib() {
    let d = device();
    let s = stream(&d);
    for len in [0usize, 1, 1001, (256 << 20) / 4] {
        let host = pattern(len);
        let buf = DeviceBuffer::from_slice(&s, &host).unwrap();
        assert_eq!(buf.len(), len);
        let mut copy = DeviceBuffer::<u32>::alloc(&s, len).unwrap();
        s.copy_dtod(&buf, &mut copy).unwrap();
        assert!(
            copy.to_vec(&s).unwrap() == host,
            "round trip of {len} elements differs"
        );
    }
    d.check_err().unwrap();
}

#[test]
fn views_memset_and_zeroed() {
    let d = device();
    let s = stream(&d);
    let mut buf = DeviceBuffer::from_slice(&s, &[1u32; 16]).unwrap();
    s.memset_zero(&mut buf.slice_mut(4..8).unwrap()).unwrap();
    let out = buf.to_vec(&s).unwrap();
    assert_eq!(&out[..4], &[1; 4]);
    assert_eq!(&out[4..8], &[0; 4]);
    assert_eq!(&out[8..], &[1; 8]);
    let mut part = vec![0u32; 3];
    s.copy_dtoh(&buf.slice(7..10).unwrap(), &mut part).unwrap();
    assert_eq!(part, vec![0, 1, 1]);
    assert_eq!(
        DeviceBuffer::<f32>::zeroed(&s, 33)
            .unwrap()
            .to_vec(&s)
            .unwrap(),
        vec![0.0; 33]
    );
}

#[test]
fn async_copies_on_two_streams_are_ordered_by_events() {
    let d = device();
    let (a, b) = (
        stream(&d),
        Stream::new(
            &d,
            StreamOptions {
                non_blocking: true,
                priority: 0,
            },
        )
        .unwrap(),
    );
    let len = 1 << 22;
    let src = PinnedHostBuffer::from_slice(&d, &pattern(len)).unwrap();
    let mut stage = DeviceBuffer::<u32>::alloc(&a, len).unwrap();
    let mut dst = DeviceBuffer::<u32>::alloc(&b, len).unwrap();
    let mut back = PinnedHostBuffer::<u32>::new(&d, len).unwrap();
    let ready = Event::new(&d, EventOptions::NO_TIMING).unwrap();
    a.copy_htod_async(&src, &mut stage).unwrap();
    ready.record(&a).unwrap();
    b.wait(&ready).unwrap();
    b.copy_dtod(&stage, &mut dst).unwrap();
    b.copy_dtoh_async(&dst, &mut back).unwrap();
    assert!(back.as_slice().unwrap() == src.as_slice().unwrap());
    assert!(b.query().unwrap());
    d.check_err().unwrap();
}

/// A staging buffer longer than its content: the prefix goes over, a longer destination is
/// refused with both lengths.
#[test]
fn a_prefix_of_pinned_memory_copies_to_the_device() {
    let d = device();
    let s = Stream::new(&d, StreamOptions::default()).unwrap();
    let src = PinnedHostBuffer::from_slice(&d, &[3i32, 1, 4, 1, 5, 9]).unwrap();
    let mut dst = DeviceBuffer::<i32>::alloc(&s, 4).unwrap();
    s.copy_htod_async_prefix(&src, &mut dst).unwrap();
    assert_eq!(dst.to_vec(&s).unwrap(), [3, 1, 4, 1]);
    let mut long = DeviceBuffer::<i32>::alloc(&s, 7).unwrap();
    let e = s.copy_htod_async_prefix(&src, &mut long).unwrap_err();
    assert!(
        matches!(e, Error::LengthMismatch { dst: 7, src: 6, .. }),
        "{e}"
    );
    d.check_err().unwrap();
}

#[test]
fn event_timing_measures_work() {
    let d = device();
    let s = stream(&d);
    let (start, end) = (
        Event::new(&d, EventOptions::TIMING).unwrap(),
        Event::new(&d, EventOptions::TIMING).unwrap(),
    );
    let mut big = DeviceBuffer::<u8>::alloc(&s, 256 << 20).unwrap();
    start.record(&s).unwrap();
    for v in 0..8 {
        s.memset_bytes(&mut big, v).unwrap();
    }
    end.record(&s).unwrap();
    end.synchronize().unwrap();
    assert!(end.query().unwrap());
    let ms = start.elapsed_ms(&end).unwrap();
    assert!(ms > 0.0 && ms < 10_000.0, "elapsed {ms} ms");
}

/// The test kernels built for this device's arch with hipcc.
fn module(d: &Device) -> Module {
    let bytes = common::build_bundle(&[d.arch()])
        .unwrap_or_else(|e| panic!("building the test kernels: {e}"));
    Module::load(d, &bytes).unwrap()
}

#[test]
fn module_load_and_launch() {
    let d = device();
    let s = stream(&d);
    let m = module(&d);
    assert!(m.kernel_names().iter().any(|k| k == "hipk_test_add"));
    let add = m.function("hipk_test_add").unwrap();
    let n = 1000i32;
    let mut x = DeviceBuffer::from_slice(&s, &vec![1.0f32; n as usize]).unwrap();
    let cfg = LaunchConfig::for_num_elems(n as u64, add.limits()).unwrap();
    // SAFETY: hipk_test_add(float*, float, int) gets a buffer of n floats, a float and n.
    unsafe {
        s.launch_builder(&add)
            .arg_mut(&mut x)
            .value(2.5f32)
            .value(n)
            .launch(&cfg)
    }
    .unwrap();
    assert_eq!(x.to_vec(&s).unwrap(), vec![3.5f32; n as usize]);

    // A sub-range view as the pointer argument.
    let mut tail = x.slice_mut(500..).unwrap();
    let scale = m.function("hipk_test_scale").unwrap();
    let cfg = LaunchConfig::for_num_elems(500, scale.limits()).unwrap();
    // SAFETY: hipk_test_scale(float*, float, int) gets a view of 500 floats, a float and 500.
    unsafe {
        s.launch_builder(&scale)
            .arg_mut(&mut tail)
            .value(2.0f32)
            .value(500i32)
            .launch(&cfg)
    }
    .unwrap();
    let out = x.to_vec(&s).unwrap();
    assert_eq!((out[499], out[500]), (3.5, 7.0));

    // A configuration beyond the kernel's limits is refused before HIP sees it.
    let too_big = LaunchConfig {
        grid: (1, 1, 1),
        block: (4096, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: never launched: validation fails first.
    let e = unsafe {
        s.launch_builder(&add)
            .arg(&x)
            .value(0f32)
            .value(n)
            .launch(&too_big)
    }
    .unwrap_err();
    assert!(matches!(e, Error::Launch(_)), "{e}");
}

#[test]
fn wrong_arch_and_missing_kernel_are_typed_errors() {
    let d = device();
    let other = if d.arch() == "gfx900" {
        "gfx906"
    } else {
        "gfx900"
    };
    let bytes =
        common::build_bundle(&[other]).unwrap_or_else(|e| panic!("building the test kernels: {e}"));
    match Module::load(&d, &bytes) {
        Err(Error::NoBinaryForGpu {
            device_arch,
            bundle_archs,
            ..
        }) => {
            assert_eq!(device_arch, d.gcn_arch_name());
            assert_eq!(bundle_archs, vec![other.to_string()]);
        }
        other => panic!("expected NoBinaryForGpu, got {other:?}"),
    }
    let m = module(&d);
    match m.function("hipk_no_such_kernel") {
        Err(Error::KernelNotFound { name, available }) => {
            assert_eq!(name, "hipk_no_such_kernel");
            assert!(available.contains(&"hipk_test_add".to_string()));
        }
        other => panic!("expected KernelNotFound, got {other:?}"),
    }
}

/// Row-major reference GEMM in f64.
fn cpu_gemm(g: &Gemm, a: &[f32], b: &[f32], c0: &[f32]) -> Vec<f32> {
    let (m, n, k) = (g.m, g.n, g.k);
    let opa = |i: usize, p: usize| {
        f64::from(if g.trans_a {
            a[p * m + i]
        } else {
            a[i * k + p]
        })
    };
    let opb = |p: usize, j: usize| {
        f64::from(if g.trans_b {
            b[j * k + p]
        } else {
            b[p * n + j]
        })
    };
    (0..m * n)
        .map(|idx| {
            let (i, j) = (idx / n, idx % n);
            let dot: f64 = (0..k).map(|p| opa(i, p) * opb(p, j)).sum();
            (f64::from(g.alpha) * dot + f64::from(g.beta) * f64::from(c0[idx])) as f32
        })
        .collect()
}

/// Inputs exactly representable in f16 and bf16 (multiples of 1/8 in [-2, 2]).
fn small_values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i.wrapping_mul(37).wrapping_add(seed * 11)) % 33) as f32 / 8.0 - 2.0)
        .collect()
}

/// Tolerance: inputs are exact in every type, products accumulate in f32; the only rounding is
/// f32 accumulation over k terms and, for f16/bf16 outputs, the final store.
fn check_gemm<T: GemmElement>(
    blas: &Blas,
    s: &Stream,
    from: fn(f32) -> T,
    to: fn(T) -> f32,
    rel_out: f32,
) {
    for (trans_a, trans_b) in [(false, false), (true, false), (false, true), (true, true)] {
        let g = Gemm {
            trans_a,
            trans_b,
            alpha: 0.5,
            beta: 0.25,
            ..Gemm::new(33, 17, 65)
        };
        let (a, b, c0) = (
            small_values(33 * 65, 1),
            small_values(65 * 17, 2),
            small_values(33 * 17, 3),
        );
        let conv = |v: &[f32]| v.iter().map(|x| from(*x)).collect::<Vec<T>>();
        let (da, db) = (
            DeviceBuffer::from_slice(s, &conv(&a)).unwrap(),
            DeviceBuffer::from_slice(s, &conv(&b)).unwrap(),
        );
        let mut dc = DeviceBuffer::from_slice(s, &conv(&c0)).unwrap();
        blas.gemm(&g, &da, &db, &mut dc).unwrap();
        let got = dc.to_vec(s).unwrap();
        for (i, (g_val, want)) in got
            .iter()
            .map(|v| to(*v))
            .zip(cpu_gemm(&g, &a, &b, &c0))
            .enumerate()
        {
            let tol = 1e-4 + rel_out * want.abs();
            assert!(
                (g_val - want).abs() <= tol,
                "{} trans=({trans_a},{trans_b}) C[{i}] = {g_val}, want {want}",
                std::any::type_name::<T>()
            );
        }
    }
}

fn blas(d: &Device) -> (Blas, Arc<Stream>) {
    let s = Arc::new(stream(d));
    (
        Blas::new(s.clone())
            .unwrap_or_else(|e| panic!("the GEMM tests need hipBLAS or rocBLAS: {e}")),
        s,
    )
}

#[test]
fn gemm_matches_cpu_for_f32_f16_bf16() {
    let d = device();
    let (blas, s) = blas(&d);
    check_gemm::<f32>(&blas, &s, |x| x, |x| x, 1e-6);
    check_gemm::<f16>(&blas, &s, f16::from_f32, f16::to_f32, 1.0 / 1024.0);
    check_gemm::<bf16>(&blas, &s, bf16::from_f32, bf16::to_f32, 1.0 / 128.0);
    d.check_err().unwrap();
}

#[test]
fn strided_batched_gemm_matches_cpu() {
    // DTK has shipped miscompiled strided-batched GEMM (PaddlePaddle #56424): check every batch.
    let d = device();
    let (blas, s) = blas(&d);
    let g = Gemm {
        trans_b: true,
        ..Gemm::new(16, 24, 40)
    };
    let batch = Batch::packed(&g, 7);
    let (a, b) = (small_values(16 * 40 * 7, 4), small_values(24 * 40 * 7, 5));
    let (da, db) = (
        DeviceBuffer::from_slice(&s, &a).unwrap(),
        DeviceBuffer::from_slice(&s, &b).unwrap(),
    );
    let mut dc = DeviceBuffer::<f32>::zeroed(&s, 16 * 24 * 7).unwrap();
    blas.gemm_strided_batched(&g, &batch, &da, &db, &mut dc)
        .unwrap();
    let got = dc.to_vec(&s).unwrap();
    for i in 0..7 {
        let want = cpu_gemm(
            &g,
            &a[i * 640..(i + 1) * 640],
            &b[i * 960..(i + 1) * 960],
            &[0.0; 384],
        );
        for (j, w) in want.iter().enumerate() {
            assert!(
                (got[i * 384 + j] - w).abs() <= 1e-4 + 1e-6 * w.abs(),
                "batch {i} C[{j}] = {}, want {w}",
                got[i * 384 + j]
            );
        }
    }
    // Shapes that do not match the buffers never reach BLAS.
    let e = blas
        .gemm(&Gemm::new(16, 24, 41), &da, &db, &mut dc)
        .unwrap_err();
    assert!(matches!(e, Error::BlasShape(_)), "{e}");
}

#[test]
fn strided_batched_gemm_on_a_borrowed_stream_through_unsized_views() {
    // A caller holding only `&Stream` and `&dyn` views (hip-kernels' GEMM tuner): the handle is
    // bound to that stream for the call, then back to its own, which still works afterwards.
    let d = device();
    let (blas, s) = blas(&d);
    let other = stream(&d);
    let g = Gemm {
        trans_a: true,
        beta: 0.5,
        ..Gemm::new(9, 13, 21)
    };
    let batch = Batch::packed(&g, 3);
    let (a, b, c0) = (
        small_values(9 * 21 * 3, 6),
        small_values(21 * 13 * 3, 7),
        small_values(9 * 13 * 3, 8),
    );
    let (da, db) = (
        DeviceBuffer::from_slice(&other, &a).unwrap(),
        DeviceBuffer::from_slice(&other, &b).unwrap(),
    );
    let mut dc = DeviceBuffer::from_slice(&other, &c0).unwrap();
    let (va, vb): (&dyn DeviceView<f32>, &dyn DeviceView<f32>) = (&da, &db);
    let vc: &mut dyn DeviceViewMut<f32> = &mut dc;
    blas.gemm_strided_batched_on(&other, &g, &batch, va, vb, vc)
        .unwrap();
    let got = dc.to_vec(&other).unwrap();
    for i in 0..3 {
        let (sa, sb, sc) = (9 * 21, 21 * 13, 9 * 13);
        let want = cpu_gemm(
            &g,
            &a[i * sa..(i + 1) * sa],
            &b[i * sb..(i + 1) * sb],
            &c0[i * sc..(i + 1) * sc],
        );
        for (j, w) in want.iter().enumerate() {
            let v = got[i * sc + j];
            assert!(
                (v - w).abs() <= 1e-4 + 1e-6 * w.abs(),
                "batch {i} C[{j}] = {v}, want {w}"
            );
        }
    }
    // Back on the handle's own stream.
    check_gemm::<f32>(&blas, &s, |x| x, |x| x, 1e-6);
    d.check_err().unwrap();
}

#[test]
fn oversized_allocation_is_out_of_memory_and_the_device_survives() {
    // The direct allocator: its OOM is `Error::OutOfMemory` with the device's free memory (the
    // caching allocator `Device::get` uses has its own OOM report, tested in tests/caching_*).
    let d = Device::get_direct(0).expect("a HIP device");
    let s = stream(&d);
    let e = DeviceBuffer::<u8>::alloc(&s, d.total_memory().saturating_mul(2)).unwrap_err();
    assert!(
        matches!(e, Error::OutOfMemory { .. }),
        "expected OutOfMemory, got {e}"
    );
    let msg = e.to_string();
    assert!(msg.contains("MiB free"), "{msg}");
    let buf = DeviceBuffer::from_slice(&s, &pattern(4096)).unwrap();
    assert_eq!(buf.to_vec(&s).unwrap(), pattern(4096));
    d.check_err().unwrap();
}
