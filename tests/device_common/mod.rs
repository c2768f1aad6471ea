//! Shared by the device test files (`mod device_common;`): the stream, a reproducible Rng,
//! upload/download, the tolerance assertion, host-slice wrappers of every launcher, and the
//! golden-case runner (through the library's `DeviceBackend`, which runs every op). Each test
//! file uses part of it.
#![allow(dead_code)]

use hip_kernels::golden::{
    case_files, committed_dir, env_dirs, load_case, run_case_with, DeviceBackend,
};
use hip_kernels::ops::{
    self, AttentionBackward, AttentionForward, AttentionParams, DeviceElement, LayerNormBackward,
    LayerNormForward, LayerNormParams, Matmul, MatmulParams, OpError,
};
use hip_kernels::params::{DType, Element};
use hip_kernels::tolerance::{tolerance, Rule};
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

/// Asserts every element is within the tolerance of `rule` (the op's) of the reference.
pub fn assert_close<T: Element>(
    what: &str,
    rule: Rule,
    input: DType,
    len: usize,
    got: &[T],
    want: &[T],
) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = tolerance(rule, what, T::DTYPE, input, len);
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| !tol.allows(g.to_f64(), w.to_f64()))
        .take(5)
        .map(|(i, (g, w))| format!("[{i}] got {g:?} want {w:?}"))
        .collect();
    assert!(
        bad.is_empty(),
        "{what} ({rule:?}, {input}, len {len}) beyond {tol:?}: {bad:?}"
    );
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
    shape: &LayerNormParams,
    x: &[T],
    w: &[T],
    b: &[T],
) -> Result<LnFwd<T>, OpError> {
    let (dx, dw, db) = (upload(s, x), upload(s, w), upload(s, b));
    let mut y = DeviceBuffer::<T>::zeroed(s, x.len())?;
    let mut mean = DeviceBuffer::<f32>::zeroed(s, shape.rows)?;
    let mut rstd = DeviceBuffer::<f32>::zeroed(s, shape.rows)?;
    ops::layernorm_forward(
        s,
        LayerNormForward {
            params: *shape,
            x: &dx,
            weight: &dw,
            bias: &db,
            y: &mut y,
            mean: &mut mean,
            rstd: &mut rstd,
        },
    )?;
    Ok(LnFwd {
        y: download(s, &y),
        mean: download(s, &mean),
        rstd: download(s, &rstd),
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
        s,
        LayerNormBackward {
            params: *shape,
            x: &bx,
            weight: &bw,
            dy: &bdy,
            mean: &bm,
            rstd: &br,
            dx: &mut dx,
            dweight: &mut dw,
            dbias: &mut db,
        },
    )?;
    Ok((download(s, &dx), download(s, &dw), download(s, &db)))
}

pub fn matmul_device<T: DeviceElement>(
    s: &Stream,
    params: &MatmulParams,
    a: &[T],
    b: &[T],
    c: &[T],
) -> Result<Vec<T>, OpError> {
    let (da, db) = (upload(s, a), upload(s, b));
    let mut out = upload(s, c);
    ops::matmul(
        s,
        Matmul {
            params: *params,
            a: &da,
            b: &db,
            out: &mut out,
        },
    )?;
    Ok(download(s, &out))
}

pub fn attention_forward_device<T: DeviceElement>(
    s: &Stream,
    shape: &AttentionParams,
    q: &[T],
    k: &[T],
    v: &[T],
) -> Result<(Vec<T>, Vec<f32>), OpError> {
    let (dq, dk, dv) = (upload(s, q), upload(s, k), upload(s, v));
    let mut out = DeviceBuffer::<T>::zeroed(s, q.len())?;
    let mut lse = DeviceBuffer::<f32>::zeroed(s, shape.lse_len()?)?;
    ops::attention_forward(
        s,
        AttentionForward {
            params: *shape,
            q: &dq,
            k: &dk,
            v: &dv,
            out: &mut out,
            lse: &mut lse,
        },
    )?;
    Ok((download(s, &out), download(s, &lse)))
}

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
        s,
        AttentionBackward {
            params: *shape,
            q: &bq,
            k: &bk,
            v: &bv,
            out: &bo,
            dout: &bdo,
            lse: &blse,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
        },
    )?;
    Ok((download(s, &dq), download(s, &dk), download(s, &dv)))
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
