//! Shared by the device test files (`mod device_common;`): the stream, a reproducible Rng,
//! upload/download, the tolerance assertion, host-slice wrappers of every launcher, and the
//! golden-case runner (through the library's `DeviceBackend`, which runs every op). Each test
//! file uses part of it.
#![allow(dead_code)]

use hip_kernels::cpu;
use hip_kernels::golden::{
    case_files, committed_dir, env_dirs, load_case, run_case_with, DeviceBackend, GoldenCase,
    Outputs, TensorData,
};
use hip_kernels::ops::{
    self, AttentionBackwardCase, AttentionForwardCase, AttentionParams, DeviceElement,
    LayerNormBackwardCase, LayerNormForwardCase, LayerNormParams, MatmulBias, MatmulBiasParams,
    MatmulCase, MatmulKernel, MatmulParams, OpError,
};
use hip_kernels::params::{DType, Element, Host, OnDevice};
use hip_kernels::tolerance::{tolerance, Rule, Tolerance};
use hip_rt::memory::buffer::{DeviceSlice, DeviceSliceMut};
use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};

pub fn stream() -> Stream {
    let device = Device::get(0).expect("--features device needs HIP device 0");
    Stream::new(&device, StreamOptions::default()).expect("stream")
}

/// xorshift64* with a Box–Muller normal: reproducible inputs without a crate.
pub struct Rng(pub u64);

impl Rng {
    pub fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    pub fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    pub fn vec<T: Element>(&mut self, n: usize, scale: f64) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.normal() * scale)).collect()
    }
}

pub fn upload<T: DeviceElement>(s: &Stream, v: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::from_slice(s, v).expect("upload")
}

/// Integer buffers (token ids, targets, error flags) outside the float helpers.
pub fn up_i32(s: &Stream, v: &[i32]) -> DeviceBuffer<i32> {
    DeviceBuffer::from_slice(s, v).expect("upload")
}

/// `n` token ids in `0..vocab`.
pub fn tokens(rng: &mut Rng, n: usize, vocab: usize) -> Vec<i32> {
    (0..n)
        .map(|_| ((rng.uniform() * vocab as f64) as i32).min(vocab as i32 - 1))
        .collect()
}

pub fn download<T: DeviceElement>(s: &Stream, b: &DeviceBuffer<T>) -> Vec<T> {
    b.to_vec(s).expect("download")
}

/// `v` uploaded `off` elements into a fresh allocation, behind `off` pad elements: with `off = 1`
/// the view starts 4 (f32) or 2 (f16/bf16) bytes past an aligned start, so the kernels must take
/// their scalar / bounds-checked path (allocations are at least 16-byte aligned). [`Shifted::get`]
/// checks that the pad was not written.
pub struct Shifted<T: DeviceElement> {
    pub buf: DeviceBuffer<T>,
    pub off: usize,
    pad: Vec<T>,
}

impl<T: DeviceElement> Shifted<T> {
    pub fn new(s: &Stream, v: &[T], off: usize) -> Self {
        // A pad value no kernel computes by accident.
        let pad = vec![T::from_f64(-12345.0); off];
        let mut all = pad.clone();
        all.extend_from_slice(v);
        Shifted {
            buf: upload(s, &all),
            off,
            pad,
        }
    }

    pub fn view(&self) -> DeviceSlice<'_, T> {
        self.buf.slice(self.off..).expect("view")
    }

    pub fn view_mut(&mut self) -> DeviceSliceMut<'_, T> {
        self.buf.slice_mut(self.off..).expect("view")
    }

    /// The view's elements, after asserting the pad in front of it is untouched.
    pub fn get(&self, s: &Stream) -> Vec<T> {
        let mut all = download(s, &self.buf);
        let v = all.split_off(self.off);
        assert!(
            bits(&all) == bits(&self.pad),
            "the pad before the view was written"
        );
        v
    }
}

/// Asserts every element is within the tolerance of `rule` (the op's) of the reference.
pub fn assert_close<T: Element>(
    what: &str,
    rule: Rule,
    input: DType,
    len: usize,
    got: &[T],
    want: &[T],
) {
    let tol = tolerance(rule, what, T::DTYPE, input, len);
    assert_close_with(
        &format!("{what} ({rule:?}, {input}, len {len})"),
        tol,
        got,
        want,
    );
}

/// Like [`assert_close`], with an explicit tolerance.
pub fn assert_close_with<T: Element>(what: &str, tol: Tolerance, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !tol.allows(g.to_f64(), w.to_f64()))
        .take(5)
        .map(|(i, (g, w))| format!("[{i}] got {g:?} want {w:?}"))
        .collect();
    assert!(bad.is_empty(), "{what} beyond {tol:?}: {bad:?}");
}

pub fn bits<T: Element>(v: &[T]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

// ---------------------------------------------------------------------------------------------
// Device wrappers (host slices in, host vectors out): each op's in-memory golden case run on the
// device (`GoldenCase::run_device`: upload, the launcher, download), so the tests and the golden
// runner go through the same code.
// ---------------------------------------------------------------------------------------------

/// Output `name` of a device run, as `T` values.
fn output<T: DeviceElement>(outs: &Outputs, name: &str) -> Vec<T> {
    let (_, data) = outs
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("the device run returned no `{name}`"));
    data.as_slice::<T>()
        .unwrap_or_else(|| panic!("`{name}` is {}, not {}", data.dtype(), T::DTYPE))
        .to_vec()
}

/// The three gradients `names` of a device run.
fn grads<T: DeviceElement>(outs: &Outputs, names: [&str; 3]) -> Grads<T> {
    (
        output(outs, names[0]),
        output(outs, names[1]),
        output(outs, names[2]),
    )
}

pub struct LnFwd<T> {
    pub y: Vec<T>,
    pub mean: Vec<f32>,
    pub rstd: Vec<f32>,
}

pub fn ln_forward_device<T: DeviceElement>(
    s: &Stream,
    shape: &LayerNormParams,
    x: &[T],
    w: &[T],
    b: &[T],
) -> Result<LnFwd<T>, OpError> {
    let case = LayerNormForwardCase {
        params: *shape,
        x: TensorData::from_slice(x),
        weight: TensorData::from_slice(w),
        bias: TensorData::from_slice(b),
    };
    let outs = case.run_device(s)?;
    Ok(LnFwd {
        y: output(&outs, "y"),
        mean: output(&outs, "mean"),
        rstd: output(&outs, "rstd"),
    })
}

/// Three gradients downloaded to the host: (dx, dweight, dbias) or (dq, dk, dv).
pub type Grads<T> = (Vec<T>, Vec<T>, Vec<T>);

pub fn ln_backward_device<T: DeviceElement>(
    s: &Stream,
    shape: &LayerNormParams,
    x: &[T],
    w: &[T],
    dy: &[T],
    mean: &[f32],
    rstd: &[f32],
) -> Result<Grads<T>, OpError> {
    let case = LayerNormBackwardCase {
        params: *shape,
        x: TensorData::from_slice(x),
        weight: TensorData::from_slice(w),
        dy: TensorData::from_slice(dy),
        mean: mean.to_vec(),
        rstd: rstd.to_vec(),
    };
    Ok(grads(&case.run_device(s)?, ["dx", "dweight", "dbias"]))
}

/// `out = alpha·op(a)·op(b) + beta·c`; with beta = 0 the device's `out` starts as NaN (C must
/// not be read) and `c` is not used.
pub fn matmul_device<T: DeviceElement>(
    s: &Stream,
    params: &MatmulParams,
    a: &[T],
    b: &[T],
    c: &[T],
) -> Result<Vec<T>, OpError> {
    let case = MatmulCase {
        params: *params,
        a: TensorData::from_slice(a),
        b: TensorData::from_slice(b),
        c: (params.beta != 0.0).then(|| TensorData::from_slice(c)),
    };
    Ok(output(&case.run_device(s)?, "out"))
}

pub fn attention_forward_device<T: DeviceElement>(
    s: &Stream,
    shape: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<(Vec<T>, Vec<f32>), OpError> {
    let case = AttentionForwardCase {
        params: *shape,
        q: TensorData::from_slice(q),
        k: TensorData::from_slice(k),
        v: TensorData::from_slice(v),
        cu_seqlens: None,
    };
    let outs = case.run_device(s)?;
    Ok((output(&outs, "out"), output(&outs, "lse")))
}

/// The backward's outputs start as NaN on the device: every element must be written.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward_device<T: DeviceElement>(
    s: &Stream,
    shape: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &[T],
    dout: &[T],
    lse: &[f32],
) -> Result<Grads<T>, OpError> {
    let case = AttentionBackwardCase {
        params: *shape,
        q: TensorData::from_slice(q),
        k: TensorData::from_slice(k),
        v: TensorData::from_slice(v),
        cu_seqlens: None,
        out: TensorData::from_slice(out),
        dout: TensorData::from_slice(dout),
        lse: lse.to_vec(),
    };
    Ok(grads(&case.run_device(s)?, ["dq", "dk", "dv"]))
}

// ---------------------------------------------------------------------------------------------
// Golden cases
// ---------------------------------------------------------------------------------------------

/// Runs every golden case (committed and `HIPK_GOLDEN_DIR`) that `selected` picks through the
/// device backend; fails unless at least one ran and all passed. `selected` gets the op name;
/// `what` names the ops in messages.
pub fn run_golden_cases(selected: fn(&str) -> bool, what: &str) {
    let mut dirs = vec![committed_dir()];
    dirs.extend(env_dirs());
    let mut backend = DeviceBackend(stream());
    let (mut failures, mut ran) = (Vec::new(), 0);
    for dir in dirs {
        for path in case_files(&dir).expect("case files") {
            let case = load_case(&path).expect("case");
            if !selected(case.op()) {
                continue;
            }
            ran += 1;
            if let Err(e) = run_case_with(&mut backend, &case) {
                failures.push(format!("{}: {e}", path.display()));
            }
        }
    }
    assert!(ran > 0, "no {what} golden cases found");
    assert!(
        failures.is_empty(),
        "{} of {ran} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `matmul_bias` (one launch, the fused epilogue; with `kernel`, `matmul_bias_with` that kernel
/// family) against the CPU reference: `pre` asks for `pre_gelu` (with `p.gelu`); `offset`
/// places every tensor at that element of its buffer; out and pre_gelu start as NaN.
pub fn matmul_bias_case<T: DeviceElement>(
    s: &Stream,
    p: MatmulBiasParams,
    pre: bool,
    offset: usize,
    seed: u64,
    kernel: Option<MatmulKernel>,
) {
    let mut rng = Rng(seed);
    let m = p.matmul();
    let len = m.out_len().unwrap();
    let (a, b, bias): (Vec<T>, Vec<T>, Vec<T>) = (
        rng.vec(m.a_len().unwrap(), 1.0),
        rng.vec(m.b_len().unwrap(), 1.0),
        rng.vec(p.n, 1.0),
    );
    let (mut want, mut want_pre) = (vec![T::from_f64(0.0); len], vec![T::from_f64(0.0); len]);
    cpu::matmul_bias(MatmulBias::<Host, T> {
        params: p,
        a: &a,
        b: &b,
        bias: &bias,
        out: &mut want,
        pre_gelu: pre.then_some(&mut want_pre[..]),
    })
    .unwrap();
    let (da, dbm, dbias) = (
        Shifted::new(s, &a, offset),
        Shifted::new(s, &b, offset),
        Shifted::new(s, &bias, offset),
    );
    // NaN where nothing may be read: the kernel must overwrite every element of out.
    let nan = vec![T::from_f64(f64::NAN); len];
    let (mut out, mut pre_buf) = (Shifted::new(s, &nan, offset), Shifted::new(s, &nan, offset));
    let mut pre_view = pre_buf.view_mut();
    let args: MatmulBias<'_, OnDevice, T> = MatmulBias {
        params: p,
        a: &da.view(),
        b: &dbm.view(),
        bias: &dbias.view(),
        out: &mut out.view_mut(),
        pre_gelu: if pre { Some(&mut pre_view) } else { None },
    };
    match kernel {
        None => ops::matmul_bias(s, args),
        Some(k) => ops::matmul_bias_with(s, args, k),
    }
    .unwrap();
    let what = format!("{p:?} kernel {kernel:?} pre {pre} offset {offset}");
    // One rounding of (f32 accumulator + bias), GELU in f32: the reduction rule of k + 1 terms.
    assert_close(
        &format!("out {what}"),
        Rule::Reduction,
        T::DTYPE,
        p.k + 1,
        &out.get(s),
        &want,
    );
    let got_pre = pre_buf.get(s);
    if pre {
        assert_close(
            &format!("pre_gelu {what}"),
            Rule::Reduction,
            T::DTYPE,
            p.k + 1,
            &got_pre,
            &want_pre,
        );
    } else {
        assert!(
            got_pre.iter().all(|x| x.to_f64().is_nan()),
            "pre_gelu not asked for, not written: {what}"
        );
    }
}
