//! Shared by the device test files (`mod device_common;`): the stream, a reproducible Rng,
//! upload/download, the tolerance assertion, host-slice wrappers of every launcher, the device
//! as a `GoldenBackend` for every op, and the golden-case runner. Each test file uses part of it.
#![allow(dead_code)]

use hip_kernels::golden::{
    case_files, committed_dir, env_dirs, load_case, run_case_with, AdamWCase, AdamWOut,
    AttentionBackwardCase, AttentionBackwardOut, AttentionForwardCase, AttentionForwardOut,
    CaseInputs, GoldenBackend, LayerNormBackwardCase, LayerNormBackwardOut, LayerNormForwardCase,
    LayerNormForwardOut, MatmulCase, TensorData,
};
use hip_kernels::ops::{self, DeviceElement, OpError};
use hip_kernels::params::{AttentionShape, DType, Element, LayerNormShape, MatmulShape, Op};
use hip_kernels::tolerance::{tolerance, Tolerance};
use hip_kernels::with_dtype;
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

pub fn download<T: DeviceElement>(s: &Stream, b: &DeviceBuffer<T>) -> Vec<T> {
    b.to_vec(s).expect("download")
}

/// Asserts every element is within the op's tolerance of the reference.
pub fn assert_close<T: Element>(
    what: &str,
    op: Op,
    input: DType,
    len: usize,
    got: &[T],
    want: &[T],
) {
    let tol = tolerance(op, what, T::DTYPE, input, len);
    assert_close_with(
        &format!("{what} ({op}, {input}, len {len})"),
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
// Device wrappers (host slices in, host vectors out)
// ---------------------------------------------------------------------------------------------

pub struct LnFwd<T> {
    pub y: Vec<T>,
    pub mean: Vec<f32>,
    pub rstd: Vec<f32>,
}

pub fn ln_forward_device<T: DeviceElement>(
    s: &Stream,
    shape: &LayerNormShape,
    eps: f32,
    x: &[T],
    w: &[T],
    b: &[T],
) -> Result<LnFwd<T>, OpError> {
    let (dx, dw, db) = (upload(s, x), upload(s, w), upload(s, b));
    let mut y = DeviceBuffer::<T>::zeroed(s, x.len())?;
    let mut mean = DeviceBuffer::<f32>::zeroed(s, shape.rows)?;
    let mut rstd = DeviceBuffer::<f32>::zeroed(s, shape.rows)?;
    ops::layernorm_forward(s, shape, eps, &dx, &dw, &db, &mut y, &mut mean, &mut rstd)?;
    Ok(LnFwd {
        y: download(s, &y),
        mean: download(s, &mean),
        rstd: download(s, &rstd),
    })
}

/// Three gradients downloaded to the host: (dx, dweight, dbias) or (dq, dk, dv).
pub type Grads<T> = (Vec<T>, Vec<T>, Vec<T>);

#[allow(clippy::too_many_arguments)]
pub fn ln_backward_device<T: DeviceElement>(
    s: &Stream,
    shape: &LayerNormShape,
    x: &[T],
    w: &[T],
    dy: &[T],
    mean: &[f32],
    rstd: &[f32],
) -> Result<Grads<T>, OpError> {
    let (bx, bw, bdy, bm, br) = (
        upload(s, x),
        upload(s, w),
        upload(s, dy),
        upload(s, mean),
        upload(s, rstd),
    );
    let mut dx = DeviceBuffer::<T>::zeroed(s, x.len())?;
    let mut dw = DeviceBuffer::<T>::zeroed(s, w.len())?;
    let mut db = DeviceBuffer::<T>::zeroed(s, w.len())?;
    ops::layernorm_backward(
        s, shape, &bx, &bw, &bdy, &bm, &br, &mut dx, &mut dw, &mut db,
    )?;
    Ok((download(s, &dx), download(s, &dw), download(s, &db)))
}

pub fn matmul_device<T: DeviceElement>(
    s: &Stream,
    shape: &MatmulShape,
    alpha: f32,
    beta: f32,
    a: &[T],
    b: &[T],
    c: &[T],
) -> Result<Vec<T>, OpError> {
    let (da, db) = (upload(s, a), upload(s, b));
    let mut out = upload(s, c);
    ops::matmul(s, shape, alpha, beta, &da, &db, &mut out)?;
    Ok(download(s, &out))
}

pub fn attention_forward_device<T: DeviceElement>(
    s: &Stream,
    shape: &AttentionShape,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<(Vec<T>, Vec<f32>), OpError> {
    let (dq, dk, dv) = (upload(s, q), upload(s, k), upload(s, v));
    let mut out = DeviceBuffer::<T>::zeroed(s, q.len())?;
    let mut lse = DeviceBuffer::<f32>::zeroed(s, shape.lse_len()?)?;
    ops::attention_forward(s, shape, &dq, &dk, &dv, &mut out, &mut lse)?;
    Ok((download(s, &out), download(s, &lse)))
}

#[allow(clippy::too_many_arguments)]
pub fn attention_backward_device<T: DeviceElement>(
    s: &Stream,
    shape: &AttentionShape,
    q: &[T],
    k: &[T],
    v: &[T],
    out: &[T],
    dout: &[T],
    lse: &[f32],
) -> Result<Grads<T>, OpError> {
    let (bq, bk, bv, bo, bdo, blse) = (
        upload(s, q),
        upload(s, k),
        upload(s, v),
        upload(s, out),
        upload(s, dout),
        upload(s, lse),
    );
    // Garbage in the outputs: every element must be written.
    let mut dq = upload(s, &vec![T::from_f64(f64::NAN); q.len()]);
    let mut dk = upload(s, &vec![T::from_f64(f64::NAN); k.len()]);
    let mut dv = upload(s, &vec![T::from_f64(f64::NAN); v.len()]);
    ops::attention_backward(
        s, shape, &bq, &bk, &bv, &bo, &bdo, &blse, &mut dq, &mut dk, &mut dv,
    )?;
    Ok((download(s, &dq), download(s, &dk), download(s, &dv)))
}

// ---------------------------------------------------------------------------------------------
// Golden cases
// ---------------------------------------------------------------------------------------------

/// The device (one stream) as a golden backend for every op.
pub struct HipBackend(pub Stream);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(String);

impl From<OpError> for BackendError {
    fn from(e: OpError) -> Self {
        BackendError(e.to_string())
    }
}
impl From<hip_kernels::params::ShapeError> for BackendError {
    fn from(e: hip_kernels::params::ShapeError) -> Self {
        BackendError(e.to_string())
    }
}

impl GoldenBackend for HipBackend {
    type Error = BackendError;

    fn name(&self) -> String {
        format!(
            "hip:{} {}",
            self.0.device().ordinal(),
            self.0.device().arch()
        )
    }

    fn matmul(&mut self, c: &MatmulCase) -> Result<TensorData, BackendError> {
        const OP: &str = "matmul";
        with_dtype!(c.a.dtype(), T => {
            let init = match &c.c {
                Some(cc) => cc.typed::<T>(OP, "c")?.to_vec(),
                None => vec![<T as Element>::from_f64(f64::NAN); c.shape.out_len()?],
            };
            let out = matmul_device(&self.0, &c.shape, c.alpha, c.beta, c.a.typed::<T>(OP, "a")?, c.b.typed::<T>(OP, "b")?, &init)?;
            Ok(TensorData::from_slice(&out))
        })
    }

    fn layernorm_forward(
        &mut self,
        c: &LayerNormForwardCase,
    ) -> Result<LayerNormForwardOut, BackendError> {
        const OP: &str = "layernorm";
        with_dtype!(c.x.dtype(), T => {
            let o = ln_forward_device(&self.0, &c.shape, c.eps, c.x.typed::<T>(OP, "x")?, c.weight.typed::<T>(OP, "weight")?, c.bias.typed::<T>(OP, "bias")?)?;
            Ok(LayerNormForwardOut { y: TensorData::from_slice(&o.y), mean: o.mean, rstd: o.rstd })
        })
    }

    fn layernorm_backward(
        &mut self,
        c: &LayerNormBackwardCase,
    ) -> Result<LayerNormBackwardOut, BackendError> {
        const OP: &str = "layernorm";
        with_dtype!(c.x.dtype(), T => {
            let (dx, dw, db) = ln_backward_device(&self.0, &c.shape, c.x.typed::<T>(OP, "x")?, c.weight.typed::<T>(OP, "weight")?, c.dy.typed::<T>(OP, "dy")?, &c.mean, &c.rstd)?;
            Ok(LayerNormBackwardOut { dx: TensorData::from_slice(&dx), dweight: TensorData::from_slice(&dw), dbias: TensorData::from_slice(&db) })
        })
    }

    fn attention_forward(
        &mut self,
        c: &AttentionForwardCase,
    ) -> Result<AttentionForwardOut, BackendError> {
        const OP: &str = "attention";
        with_dtype!(c.q.dtype(), T => {
            let (out, lse) = attention_forward_device(&self.0, &c.shape, c.q.typed::<T>(OP, "q")?, c.k.typed::<T>(OP, "k")?, c.v.typed::<T>(OP, "v")?)?;
            Ok(AttentionForwardOut { out: TensorData::from_slice(&out), lse })
        })
    }

    fn attention_backward(
        &mut self,
        c: &AttentionBackwardCase,
    ) -> Result<AttentionBackwardOut, BackendError> {
        const OP: &str = "attention";
        with_dtype!(c.q.dtype(), T => {
            let (dq, dk, dv) = attention_backward_device(&self.0, &c.shape, c.q.typed::<T>(OP, "q")?, c.k.typed::<T>(OP, "k")?, c.v.typed::<T>(OP, "v")?, c.out.typed::<T>(OP, "out")?, c.dout.typed::<T>(OP, "dout")?, &c.lse)?;
            Ok(AttentionBackwardOut { dq: TensorData::from_slice(&dq), dk: TensorData::from_slice(&dk), dv: TensorData::from_slice(&dv) })
        })
    }

    fn adamw(&mut self, c: &AdamWCase) -> Result<AdamWOut, BackendError> {
        const OP: &str = "adamw";
        let s = &self.0;
        with_dtype!(c.param.dtype(), T => {
            let mut param = upload(s, c.param.typed::<T>(OP, "param")?);
            let grad = upload(s, c.grad.typed::<T>(OP, "grad")?);
            let (mut m, mut v) = (upload(s, &c.exp_avg), upload(s, &c.exp_avg_sq));
            let mut vmax = c.max_exp_avg_sq.as_ref().map(|x| upload(s, x));
            ops::adamw(s, &c.config, &c.step, &mut param, &grad, &mut m, &mut v, vmax.as_mut().map(|b| b as _))?;
            Ok(AdamWOut { param: TensorData::from_slice(&download(s, &param)), exp_avg: download(s, &m), exp_avg_sq: download(s, &v), max_exp_avg_sq: vmax.as_ref().map(|b| download(s, b)) })
        })
    }
}

/// Runs every golden case (committed and `HIPK_GOLDEN_DIR`) that `selected` picks through the
/// device backend; fails unless at least one ran and all passed. `what` names the ops in messages.
pub fn run_golden_cases(selected: fn(&CaseInputs) -> bool, what: &str) {
    let mut dirs = vec![committed_dir()];
    dirs.extend(env_dirs());
    let mut backend = HipBackend(stream());
    let (mut failures, mut ran) = (Vec::new(), 0);
    for dir in dirs {
        for path in case_files(&dir).expect("case files") {
            let case = load_case(&path).expect("case");
            if !selected(&case.inputs) {
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
