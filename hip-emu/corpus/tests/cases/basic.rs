//! Element-wise programs: vector add, saxpy, templates by launch site and explicit
//! instantiation, overloads, a namespaced kernel with a struct argument, vector types, the
//! platform probe, fast math, half precision, device printf, timers.

use super::{cfg1 as cfg, cfg2, close, data, start};
use hip_rt::DeviceRepr;

#[test]
fn vector_add() {
    let Some(e) = start() else { return };
    let n = 1000;
    let (a, b) = (data(n, 1), data(n, 2));
    let f = e.kernel("vector_add", "vector_add");
    let (da, db) = (e.upload(&a), e.upload(&b));
    let mut dc = e.upload(&vec![0f32; n]);
    // SAFETY: (const float* a, const float* b, float* c, int n), n elements each.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&da)
            .arg(&db)
            .arg_mut(&mut dc)
            .value(n as i32)
            .launch(&cfg(4, 256, 0))
    }
    .unwrap();
    let want: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(x, y)| f64::from(*x) + f64::from(*y))
        .collect();
    close(&e.download(&dc), &want, 1e-7, "vector_add");
}

#[test]
fn saxpy_over_a_grid_stride_loop() {
    let Some(e) = start() else { return };
    let n = 3000;
    let (x, y) = (data(n, 3), data(n, 4));
    let f = e.kernel("saxpy", "saxpy_kernel");
    let dx = e.upload(&x);
    let mut dy = e.upload(&y);
    // SAFETY: (float a, const float* x, float* y, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .value(1.5f32)
            .arg(&dx)
            .arg_mut(&mut dy)
            .value(n as i32)
            .launch(&cfg(2, 128, 0))
    }
    .unwrap();
    let want: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(x, y)| 1.5 * f64::from(*x) + f64::from(*y))
        .collect();
    close(&e.download(&dy), &want, 1e-6, "saxpy");
}

#[test]
fn a_template_instantiated_by_its_launch_site() {
    let Some(e) = start() else { return };
    let n = 200;
    let x = data(n, 5);
    let f = e.kernel("moving_average", "moving_average<5>");
    let dx = e.upload(&x);
    let mut dy = e.upload(&vec![0f32; n]);
    // SAFETY: (const float* in, float* out, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&dx)
            .arg_mut(&mut dy)
            .value(n as i32)
            .launch(&cfg(4, 64, 0))
    }
    .unwrap();
    let got = e.download(&dy);
    let want: Vec<f64> = (0..n - 4)
        .map(|i| x[i..i + 5].iter().map(|v| f64::from(*v)).sum::<f64>() / 5.0)
        .collect();
    close(&got[..n - 4], &want, 1e-6, "moving_average<5>");
    assert!(
        got[n - 4..].iter().all(|v| *v == 0.0),
        "the tail is untouched"
    );
}

#[test]
fn explicit_instantiations_of_one_template_stay_apart() {
    let Some(e) = start() else { return };
    let n = 100;
    let x = data(n, 6);
    let mask = [0.1f32, 0.2, 0.4, 0.2, 0.1];
    let dx = e.upload(&x);
    let dm = e.upload(&mask);
    for (name, width) in [("convolution_1d<5>", 5usize), ("convolution_1d<3>", 3)] {
        let f = e.kernel("convolution", name);
        let mut dy = e.upload(&vec![0f32; n]);
        // SAFETY: (const float* in, const float* mask, float* out, int n).
        unsafe {
            e.stream
                .launch_builder(&f)
                .arg(&dx)
                .arg(&dm)
                .arg_mut(&mut dy)
                .value(n as i32)
                .launch(&cfg(2, 64, 0))
        }
        .unwrap();
        let want: Vec<f64> = (0..n as i64)
            .map(|i| {
                (0..width as i64)
                    .map(|j| (i + j - width as i64 / 2, j))
                    .filter(|(at, _)| (0..n as i64).contains(at))
                    .map(|(at, j)| f64::from(x[at as usize]) * f64::from(mask[j as usize]))
                    .sum()
            })
            .collect();
        close(&e.download(&dy), &want, 1e-6, name);
    }
}

#[test]
fn overloads_are_two_kernels() {
    let Some(e) = start() else { return };
    let err = e.kernel_err("overloads", "scale");
    assert!(
        err.contains("scale(float*, int)") && err.contains("scale(double*, int)"),
        "{err}"
    );
    let n = 70;
    let mut df = e.upload(&vec![1.25f32; n]);
    let mut dd = e.upload(&vec![1.25f64; n]);
    let ff = e.kernel("overloads", "scale(float*, int)");
    let fd = e.kernel(
        "overloads",
        hip_emu_corpus::kernel_names::overloads::SCALE_DOUBLE_INT,
    );
    // SAFETY: (float* x, int n) and (double* x, int n).
    unsafe {
        e.stream
            .launch_builder(&ff)
            .arg_mut(&mut df)
            .value(n as i32)
            .launch(&cfg(2, 64, 0))
    }
    .unwrap();
    // SAFETY: as above.
    unsafe {
        e.stream
            .launch_builder(&fd)
            .arg_mut(&mut dd)
            .value(n as i32)
            .launch(&cfg(2, 64, 0))
    }
    .unwrap();
    assert!(e.download(&df).iter().all(|v| *v == 2.5));
    assert!(e.download(&dd).iter().all(|v| *v == 3.75));
}

#[repr(C)]
#[derive(Clone, Copy)]
struct Params {
    dt: f32,
    gravity: f32,
    n: i32,
}
// SAFETY: three 4-byte fields, no padding, as `physics::Params` on the device.
unsafe impl DeviceRepr for Params {}

#[test]
fn a_namespaced_kernel_takes_a_struct_by_value() {
    let Some(e) = start() else { return };
    let n = 90;
    let (pos, vel) = (data(n, 7), data(n, 8));
    let f = e.kernel("namespaced", "physics::integrate");
    let mut dp = e.upload(&pos);
    let mut dv = e.upload(&vel);
    let p = Params {
        dt: 0.1,
        gravity: -9.8,
        n: n as i32,
    };
    // SAFETY: (physics::Params p, float* pos, float* vel).
    unsafe {
        e.stream
            .launch_builder(&f)
            .value(p)
            .arg_mut(&mut dp)
            .arg_mut(&mut dv)
            .launch(&cfg(1, 128, 0))
    }
    .unwrap();
    let v2: Vec<f64> = vel
        .iter()
        .map(|v| f64::from(*v) + f64::from(-9.8f32 * 0.1f32))
        .collect();
    let p2: Vec<f64> = pos
        .iter()
        .zip(&v2)
        .map(|(p, v)| f64::from(*p) + v * 0.1)
        .collect();
    close(&e.download(&dv), &v2, 1e-6, "vel");
    close(&e.download(&dp), &p2, 1e-6, "pos");
}

#[test]
fn vector_types_and_their_operators() {
    let Some(e) = start() else { return };
    let n = 50;
    let (x, y) = (data(4 * n, 9), data(4 * n, 10));
    let f = e.kernel("vector_types", "axpy4");
    let dx = e.upload(&x);
    let mut dy = e.upload(&y);
    let mut ds = e.upload(&vec![0u32; 2 * n]);
    // SAFETY: (float a, const float4* x, float4* y, uint2* sums, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .value(2.0f32)
            .arg(&dx)
            .arg_mut(&mut dy)
            .arg_mut(&mut ds)
            .value(n as i32)
            .launch(&cfg(1, 64, 0))
    }
    .unwrap();
    let want: Vec<f64> = (0..4 * n)
        .map(|i| 2.0 * f64::from(x[i]) + f64::from(y[i]) + (i % 4 + 1) as f64 - 0.5)
        .collect();
    close(&e.download(&dy), &want, 1e-6, "axpy4");
    let sums: Vec<u32> = (0..n as u32).flat_map(|i| [2 * i + 1, 4 * i + 1]).collect();
    assert_eq!(e.download(&ds), sums);
}

#[test]
fn the_amd_platform_path_is_what_runs() {
    let Some(e) = start() else { return };
    let f = e.kernel("platform", "platform_probe");
    let mut d = e.upload(&[0i32; 3]);
    // SAFETY: (int* out), 3 ints.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg_mut(&mut d)
            .launch(&cfg(1, 1, 0))
    }
    .unwrap();
    assert_eq!(
        e.download(&d),
        [1, 64, 64],
        "[AMD path, warpSize, wavefront size]"
    );
}

#[test]
fn fast_math_intrinsics() {
    let Some(e) = start() else { return };
    let n = 64;
    let x: Vec<f32> = data(n, 11).iter().map(|v| v * 3.0).collect();
    let f = e.kernel("fast_math", "fast_math");
    let dx = e.upload(&x);
    let mut d = e.upload(&vec![0f32; 5 * n]);
    // SAFETY: (const float* x, float* out, int n), 5 outputs per element.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&dx)
            .arg_mut(&mut d)
            .value(n as i32)
            .launch(&cfg(1, 64, 0))
    }
    .unwrap();
    let want: Vec<f64> = x
        .iter()
        .flat_map(|v| {
            let v = f64::from(*v);
            [
                v.exp(),
                v / 3.0,
                1.0 / (v.abs() + 1.0).sqrt(),
                v.clamp(0.0, 1.0),
                v * 2.0 + 0.5,
            ]
        })
        .collect();
    // The device's fast versions are accurate to a few ulp: 1e-5 relative covers them.
    close(&e.download(&d), &want, 1e-5, "fast_math");
}

#[test]
fn half_precision_arithmetic() {
    use half::f16;
    let Some(e) = start() else { return };
    let n = 64;
    let h = |s: u32| -> Vec<f16> { data(n, s).iter().map(|v| f16::from_f32(*v * 4.0)).collect() };
    let (a, b, c) = (h(12), h(13), h(14));
    let f = e.kernel("half_math", "half_fma");
    let (da, db, dc) = (e.upload(&a), e.upload(&b), e.upload(&c));
    let mut dout = e.upload(&vec![f16::ZERO; n]);
    let mut dw = e.upload(&vec![0f32; n]);
    // SAFETY: (const __half* a, b, c, __half* out, float* wide, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&da)
            .arg(&db)
            .arg(&dc)
            .arg_mut(&mut dout)
            .arg_mut(&mut dw)
            .value(n as i32)
            .launch(&cfg(1, 64, 0))
    }
    .unwrap();
    let (out, wide) = (e.download(&dout), e.download(&dw));
    for i in 0..n {
        let exact = f64::from(a[i]) * f64::from(b[i]) + f64::from(c[i]);
        let fma = f16::from_f64(exact);
        assert_eq!(
            out[i],
            f16::from_f64(f64::from(fma) - 1.0),
            "fma - 1 at {i}"
        );
        let rounded = f16::from_f32(
            f32::from(f16::from_f32(f32::from(a[i]) * f32::from(b[i]))) + f32::from(c[i]),
        );
        assert_eq!(wide[i], f32::from(rounded), "a*b+c at {i}");
    }
}

#[test]
fn device_printf_runs_beside_the_computation() {
    let Some(e) = start() else { return };
    let input: Vec<i32> = (0..40).collect();
    let f = e.kernel("device_printf", "square_and_report");
    let din = e.upload(&input);
    let mut dout = e.upload(&[0i32; 40]);
    // SAFETY: (const int* in, int* out, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&din)
            .arg_mut(&mut dout)
            .value(40i32)
            .launch(&cfg(1, 64, 0))
    }
    .unwrap();
    let want: Vec<i32> = input.iter().map(|v| v * v).collect();
    assert_eq!(e.download(&dout), want);
}

#[test]
fn clock64_and_wall_clock64_go_forward() {
    let Some(e) = start() else { return };
    let x = data(64, 15);
    let f = e.kernel("timing", "timed_loop");
    let dx = e.upload(&x);
    let mut dy = e.upload(&[0f32; 64]);
    let mut dt = e.upload(&[0i64; 128]);
    // SAFETY: (const float* x, float* y, long long* ticks, int n).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&dx)
            .arg_mut(&mut dy)
            .arg_mut(&mut dt)
            .value(100i32)
            .launch(&cfg(1, 64, 0))
    }
    .unwrap();
    assert!(e.download(&dt).iter().all(|t| *t >= 0));
    let want: Vec<f64> = x
        .iter()
        .map(|v| (0..100).fold(*v, |v, _| v * 0.5 + 1.0) as f64)
        .collect();
    close(&e.download(&dy), &want, 0.0, "timed_loop");
}

#[test]
fn a_2d_grid_over_a_pitched_matrix() {
    let Some(e) = start() else { return };
    let (w, h, pitch) = (37usize, 21usize, 40usize);
    let (a, b) = (data(pitch * h, 16), data(pitch * h, 17));
    let f = e.kernel("matrix_add_2d", "matrix_add_2d");
    let (da, db) = (e.upload(&a), e.upload(&b));
    let mut dc = e.upload(&vec![7f32; pitch * h]);
    // SAFETY: (const float* a, b, float* c, int width, height, pitch).
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg(&da)
            .arg(&db)
            .arg_mut(&mut dc)
            .value(w as i32)
            .value(h as i32)
            .value(pitch as i32)
            .launch(&cfg2((3, 2), (16, 16)))
    }
    .unwrap();
    let want: Vec<f64> = (0..pitch * h)
        .map(|i| {
            if i % pitch < w {
                f64::from(a[i]) + 2.0 * f64::from(b[i])
            } else {
                7.0
            }
        })
        .collect();
    close(&e.download(&dc), &want, 1e-6, "matrix_add_2d");
}

#[test]
fn a_constant_table_written_from_rust_is_what_the_kernel_reads() {
    let Some(e) = start() else { return };
    let n = 80;
    let x = data(n, 30);
    let module = e.module("constant_mask");
    let f = module.function("convolution_constant").unwrap();
    let mask = module.global::<f32>("mask").unwrap();
    assert_eq!(mask.len(), 5);
    let dx = e.upload(&x);
    for weights in [[0.1f32, 0.2, 0.4, 0.2, 0.1], [1.0, -1.0, 0.0, 3.0, 0.5]] {
        mask.write(&e.stream, &weights).unwrap();
        assert_eq!(mask.read(&e.stream).unwrap(), weights);
        let mut dy = e.upload(&vec![0f32; n]);
        // SAFETY: (const float* in, float* out, int n).
        unsafe {
            e.stream
                .launch_builder(&f)
                .arg(&dx)
                .arg_mut(&mut dy)
                .value(n as i32)
                .launch(&cfg(2, 64, 0))
        }
        .unwrap();
        let want: Vec<f64> = (0..n as i64)
            .map(|i| {
                (0..5i64)
                    .filter(|j| (0..n as i64).contains(&(i + j - 2)))
                    .map(|j| f64::from(x[(i + j - 2) as usize]) * f64::from(weights[j as usize]))
                    .sum()
            })
            .collect();
        close(&e.download(&dy), &want, 1e-6, "convolution_constant");
    }
    let err = mask.write(&e.stream, &[1.0; 4]).unwrap_err();
    assert!(
        matches!(
            err,
            hip_rt::Error::GlobalLength {
                len: 5,
                given: 4,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn device_globals_are_shared_between_rust_and_the_kernel() {
    let Some(e) = start() else { return };
    let module = e.module("device_globals");
    let f = module.function("use_globals").unwrap();
    let counter = module.global::<u32>("counter").unwrap();
    let scale = module.global::<f32>("scale").unwrap();
    let table = module.global::<i32>("lut::table").unwrap();
    assert_eq!(scale.read(&e.stream).unwrap(), [2.5], "the initial value");
    assert_eq!(table.read(&e.stream).unwrap(), [1, 2, 3, 4, 5, 6, 7, 8]);
    counter.write(&e.stream, &[100]).unwrap();
    scale.write(&e.stream, &[-3.0]).unwrap();
    let mut dx = e.upload(&[1.0f32; 64]);
    // SAFETY: (float* x, int n), 2 blocks of 64 threads.
    unsafe {
        e.stream
            .launch_builder(&f)
            .arg_mut(&mut dx)
            .value(64i32)
            .launch(&cfg(2, 64, 0))
    }
    .unwrap();
    assert_eq!(
        counter.read(&e.stream).unwrap(),
        [228],
        "100 + one per thread"
    );
    assert_eq!(e.download(&dx), [-3.0f32; 64]);
    assert_eq!(
        table.read(&e.stream).unwrap(),
        [10, 20, 30, 40, 50, 60, 70, 80]
    );
    let err = module
        .global::<f64>("counter")
        .err()
        .expect("4 bytes are not an f64");
    assert!(
        matches!(
            err,
            hip_rt::Error::GlobalSize {
                bytes: 4,
                elem: 8,
                ..
            }
        ),
        "{err}"
    );
    let err = module
        .global::<u32>("no_such_variable")
        .err()
        .expect("not a variable");
    assert!(err.to_string().contains("no_such_variable"), "{err}");
}

/// saxpy_kernel's arguments packed at their kernarg offsets (float a; 4 bytes of padding;
/// const float* x; float* y; int n).
#[repr(C)]
struct SaxpyArgs {
    a: f32,
    _pad: u32,
    x: u64,
    y: u64,
    n: i32,
}

/// `hipModuleLaunchKernel` with `extra` = {BUFFER_POINTER, &args, BUFFER_SIZE, &size, END}.
fn launch_packed(
    e: &crate::Emu,
    f: &hip_rt::Function,
    args: &mut SaxpyArgs,
    size: usize,
) -> hip_sys::hipError_t {
    let launch = hip_sys::sym!(hipModuleLaunchKernel).expect("hip-emu exports it");
    let mut size = size;
    let mut extra: [*mut std::ffi::c_void; 5] = [
        1 as *mut _,
        (args as *mut SaxpyArgs).cast(),
        2 as *mut _,
        (&mut size as *mut usize).cast(),
        3 as *mut _,
    ];
    // SAFETY: a live function and stream; `extra` is the documented list, the buffer holds the
    // kernel's arguments and `size` says how many bytes.
    unsafe {
        launch(
            f.raw(),
            2,
            1,
            1,
            128,
            1,
            1,
            0,
            e.stream.raw(),
            std::ptr::null_mut(),
            extra.as_mut_ptr(),
        )
    }
}

#[test]
fn packed_arguments_through_extra() {
    let Some(e) = start() else { return };
    let n = 200;
    let (x, y) = (data(n, 31), data(n, 32));
    let f = e.kernel("saxpy", "saxpy_kernel");
    let dx = e.upload(&x);
    let dy = e.upload(&y);
    let mut args = SaxpyArgs {
        a: -2.0,
        _pad: 0,
        x: dx.device_ptr().0,
        y: dy.device_ptr().0,
        n: n as i32,
    };
    let size = std::mem::size_of::<SaxpyArgs>();
    assert_eq!(
        launch_packed(&e, &f, &mut args, size),
        hip_sys::hipError_t::hipSuccess
    );
    e.stream.synchronize().unwrap();
    let want: Vec<f64> = x
        .iter()
        .zip(&y)
        .map(|(x, y)| -2.0 * f64::from(*x) + f64::from(*y))
        .collect();
    close(&e.download(&dy), &want, 1e-6, "saxpy via extra");
    // A buffer too short for `n` (bytes 24..28) is refused before anything runs.
    assert_eq!(
        launch_packed(&e, &f, &mut args, 24),
        hip_sys::hipError_t::hipErrorInvalidValue
    );
    close(&e.download(&dy), &want, 1e-6, "unchanged");
}
