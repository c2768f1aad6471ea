//! Device tests of the matrix-core matmul (`kernels/matmul_mc.hip`, selected with
//! `MatmulKernel::MatrixCore`) against the CPU reference (`--features device`). Run on hip-emu,
//! which emulates the 16x16x16 tile instruction as a wave-level operation (its own test:
//! hip-emu/tests/exec_mc_tile.rs); never run on a GPU.
//!
//! - f16 and bf16, all four transposes, M, N, K ∈ {1, 7, 64, 129, 300} (at most one 300; 129 and
//!   300 leave partial 128-tiles and partial 32-deep k slices), batches with alpha and beta,
//!   K = 0, a long K;
//! - interior blocks (whole 128 x 128 tiles, K a multiple of 32: the unchecked loop) next to edge
//!   blocks in every layout, and misaligned views (the checked loads' scalar fallback);
//! - the bias / GELU / pre_gelu epilogue (`matmul_bias_with`);
//! - the committed `matmul` and `matmul_bias` golden cases in f16 and bf16;
//! - the kernel choice: f32 has no matrix-core kernel (a typed error), `Auto` keeps the plain
//!   kernel on hip-emu's gfx906.
#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::golden::{
    case_files, committed_dir, download, load_case, run_case_with, upload, GoldenBackend,
    GoldenCase, Outputs,
};
use hip_kernels::ops::{
    self, DeviceElement, Matmul, MatmulBias, MatmulBiasCase, MatmulBiasParams, MatmulCase,
    MatmulKernel, MatmulParams, OpError,
};
use hip_kernels::params::{bf16, f16, Element, Host, OnDevice};
use hip_kernels::tolerance::Rule;
use hip_kernels::with_dtype;
use hip_rt::{DeviceBuffer, Stream};

mod device_common;

use device_common::*;

const MC: MatmulKernel = MatmulKernel::MatrixCore;

/// One matmul on the matrix-core kernel against the reference; `off` > 0 places a, b and out
/// that many elements into their allocations (misaligned rows).
fn check<T: DeviceElement>(s: &Stream, rng: &mut Rng, shape: MatmulParams, off: usize) {
    let a = rng.vec::<T>(shape.a_len().unwrap(), 1.0);
    let b = rng.vec::<T>(shape.b_len().unwrap(), 1.0);
    let c: Vec<T> = if shape.beta == 0.0 {
        vec![T::from_f64(f64::NAN); shape.out_len().unwrap()] // must never be read
    } else {
        rng.vec(shape.out_len().unwrap(), 1.0)
    };
    let mut want = c.clone();
    cpu::matmul(Matmul::<Host, T> {
        params: shape,
        a: &a,
        b: &b,
        out: &mut want,
    })
    .unwrap();
    let (da, db) = (Shifted::new(s, &a, off), Shifted::new(s, &b, off));
    let mut out = Shifted::new(s, &c, off);
    ops::matmul_with(
        s,
        Matmul::<OnDevice, T> {
            params: shape,
            a: &da.view(),
            b: &db.view(),
            out: &mut out.view_mut(),
        },
        MC,
    )
    .unwrap();
    assert_close(
        &format!("matmul_mc {shape:?} offset {off}"),
        Rule::Reduction,
        T::DTYPE,
        shape.k,
        &out.get(s),
        &want,
    );
}

fn random_shapes<T: DeviceElement>(seed: u64) {
    let s = stream();
    let mut rng = Rng(seed);
    const DIMS: [usize; 5] = [1, 7, 64, 129, 300];
    for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
        for m in DIMS {
            for n in DIMS {
                for k in DIMS {
                    if [m, n, k].iter().filter(|&&d| d == 300).count() > 1 {
                        continue;
                    }
                    let shape = MatmulParams {
                        trans_a,
                        trans_b,
                        ..MatmulParams::new(m, n, k)
                    };
                    check::<T>(&s, &mut rng, shape, 0);
                }
            }
        }
        // Whole 128 x 128 tiles with K a multiple of 32 and rows aligned in every layout (the
        // unchecked interior loop) beside edge tiles (260 = 2·128 + 4), in a batch with alpha
        // and beta.
        let interior = MatmulParams {
            batch: 2,
            trans_a,
            trans_b,
            alpha: 0.5,
            beta: -1.25,
            ..MatmulParams::new(260, 256, 96)
        };
        check::<T>(&s, &mut rng, interior, 0);
        // Misaligned views: every block takes the checked loads' scalar path.
        let shifted = MatmulParams {
            trans_a,
            trans_b,
            beta: 1.0,
            ..MatmulParams::new(130, 67, 64)
        };
        check::<T>(&s, &mut rng, shifted, 1);
    }
    let long_k = MatmulParams {
        trans_a: true,
        ..MatmulParams::new(65, 7, 2000)
    };
    check::<T>(&s, &mut rng, long_k, 0);
    let k0 = MatmulParams {
        batch: 2,
        beta: 2.0,
        ..MatmulParams::new(5, 3, 0)
    };
    check::<T>(&s, &mut rng, k0, 0);
}

#[test]
fn matrix_core_matmul_matches_the_reference_f16() {
    random_shapes::<f16>(0x3c_0001);
}

#[test]
fn matrix_core_matmul_matches_the_reference_bf16() {
    random_shapes::<bf16>(0x3c_0002);
}

fn bias_params(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    ab: (bool, bool),
    gelu: bool,
) -> MatmulBiasParams {
    MatmulBiasParams {
        batch,
        m,
        n,
        k,
        trans_a: ab.0,
        trans_b: ab.1,
        gelu,
    }
}

#[test]
fn matrix_core_bias_epilogue_matches_the_reference() {
    let s = stream();
    let cases = [
        (bias_params(1, 1, 5, 3, (false, false), true), true, 0),
        (bias_params(2, 37, 19, 17, (true, false), true), false, 0),
        (bias_params(1, 130, 67, 64, (false, true), false), false, 0),
        (bias_params(3, 65, 33, 32, (true, true), true), true, 1),
        (bias_params(1, 256, 129, 64, (false, true), true), true, 0),
        (bias_params(2, 128, 128, 32, (true, false), true), false, 0),
    ];
    for (i, (p, pre, off)) in cases.into_iter().enumerate() {
        matmul_bias_case::<f16>(&s, p, pre, off, 500 + i as u64, Some(MC));
        matmul_bias_case::<bf16>(&s, p, pre, off, 600 + i as u64, Some(MC));
    }
}

/// Runs the matmul and matmul_bias golden cases on the matrix-core kernels (f16 and bf16; f32
/// cases are skipped: no matrix-core kernel).
struct MatrixCoreBackend(Stream);

impl GoldenBackend for MatrixCoreBackend {
    type Error = OpError;

    fn name(&self) -> String {
        "device (matrix-core matmul)".into()
    }

    fn run(&mut self, case: &dyn GoldenCase) -> Result<Outputs, OpError> {
        let s = &self.0;
        let any = case.as_any();
        if let Some(c) = any.downcast_ref::<MatmulCase>() {
            return with_dtype!(c.a.dtype(), T => {
                let fill = |v: f64| vec![T::from_f64(v); c.params.out_len().unwrap()];
                let init = match &c.c { Some(t) => t.typed::<T>("matmul", "c")?.to_vec(), None => fill(f64::NAN) };
                let mut out = upload(s, &init)?;
                let (a, b) = (upload(s, c.a.typed::<T>("matmul", "a")?)?, upload(s, c.b.typed::<T>("matmul", "b")?)?);
                ops::matmul_with(s, Matmul { params: c.params, a: &a, b: &b, out: &mut out }, MC)?;
                Ok(vec![("out", download(s, &out)?)])
            });
        }
        if let Some(c) = any.downcast_ref::<MatmulBiasCase>() {
            let p = c.params;
            let len = p.batch * p.m * p.n;
            return with_dtype!(c.a.dtype(), T => {
                let (a, b) = (upload(s, c.a.typed::<T>("matmul_bias", "a")?)?, upload(s, c.b.typed::<T>("matmul_bias", "b")?)?);
                let bias = upload(s, c.bias.typed::<T>("matmul_bias", "bias")?)?;
                let mut out = DeviceBuffer::<T>::zeroed(s, len)?;
                let mut pre = if p.gelu { Some(DeviceBuffer::<T>::zeroed(s, len)?) } else { None };
                ops::matmul_bias_with(s, MatmulBias {
                    params: p, a: &a, b: &b, bias: &bias, out: &mut out,
                    pre_gelu: pre.as_mut().map(|x| x as _),
                }, MC)?;
                let mut o = vec![("out", download(s, &out)?)];
                if let Some(pb) = &pre {
                    o.push(("pre_gelu", download(s, pb)?));
                }
                Ok(o)
            });
        }
        case.run_device(s)
    }
}

#[test]
fn golden_matmul_cases_pass_on_the_matrix_core_kernels() {
    let mut backend = MatrixCoreBackend(stream());
    let (mut ran, mut failures) = (Vec::new(), Vec::new());
    for path in case_files(&committed_dir()).expect("case files") {
        let case = load_case(&path).expect("case");
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let half = name.contains("_f16") || name.contains("_bf16");
        if !matches!(case.op(), "matmul" | "matmul_bias") || !half {
            continue;
        }
        match run_case_with(&mut backend, &case) {
            Ok(_) => ran.push(name),
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // Both dtypes, both ops.
    for want in [
        "matmul_f16",
        "matmul_bf16",
        "matmul_bias_f16",
        "matmul_bias_bf16",
    ] {
        assert!(
            ran.iter().any(|n| n.starts_with(want)),
            "no {want} case ran: {ran:?}"
        );
    }
}

#[test]
fn the_kernel_choice_is_checked_and_auto_keeps_the_plain_kernel_on_gfx906() {
    let s = stream();
    let shape = MatmulParams::new(3, 4, 5);
    let (a, b) = (vec![1.0f32; 15], vec![1.0f32; 20]);
    let (da, db) = (upload(&s, &a).unwrap(), upload(&s, &b).unwrap());
    let mut out = upload(&s, &[0.0f32; 12]).unwrap();
    let e = ops::matmul_with(
        &s,
        Matmul {
            params: shape,
            a: &da,
            b: &db,
            out: &mut out,
        },
        MC,
    )
    .unwrap_err();
    assert!(
        matches!(e, OpError::NoKernel { .. }) && e.to_string().contains("f16 or bf16"),
        "{e}"
    );
    // hip-emu's device is a gfx906: Auto resolves to the plain kernels.
    let arch = s.device().arch().to_string();
    assert!(!ops::arch_has_matrix_cores(&arch), "{arch}");
}
