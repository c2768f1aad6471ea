//! Device tests of the matmul and attention kernels against the CPU reference (`--features
//! device`; needs a HIP device and kernels built for its arch). NEVER RUN: no GPU was available
//! when they were written; they compile in CI.
//!
//! - golden cases (matmul, attention forward/backward) through a device `GoldenBackend`;
//! - random shapes: matmul M, N, K ∈ {1, 7, 64, 129, 1000} (every layout, every dtype, alpha and
//!   beta, batches); attention T ∈ {1, 17, 128, 1000} (Tq = Tk and Tq ≠ Tk), head dims
//!   16, 32, 64, 80, 96, 128, causal or not, every dtype;
//! - beta = 0 never reads C (C holds NaN); the backward is bit-identical run to run.
#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::golden::{
    case_files, committed_dir, env_dirs, load_case, run_case_with, AdamWCase, AdamWOut,
    AttentionBackwardCase, AttentionBackwardOut, AttentionForwardCase, AttentionForwardOut,
    CaseInputs, GoldenBackend, LayerNormBackwardCase, LayerNormBackwardOut, LayerNormForwardCase,
    LayerNormForwardOut, MatmulCase, TensorData,
};
use hip_kernels::ops::{self, DeviceElement, OpError};
use hip_kernels::params::{AttentionShape, DType, Element, MatmulShape, Op};
use hip_kernels::tolerance::tolerance;
use hip_kernels::with_dtype;
use hip_rt::{Device, DeviceBuffer, Stream, StreamOptions};

fn stream() -> Stream {
    let device = Device::get(0).expect("--features device needs HIP device 0");
    Stream::new(&device, StreamOptions::default()).expect("stream")
}

/// xorshift64* with a Box–Muller normal: reproducible inputs without a crate.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    fn vec<T: Element>(&mut self, n: usize) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.normal())).collect()
    }
}

fn upload<T: DeviceElement>(s: &Stream, v: &[T]) -> DeviceBuffer<T> {
    DeviceBuffer::from_slice(s, v).expect("upload")
}

fn download<T: DeviceElement>(s: &Stream, b: &DeviceBuffer<T>) -> Vec<T> {
    b.to_vec(s).expect("download")
}

/// Asserts every element is within the op's tolerance of the reference.
fn assert_close<T: Element>(what: &str, op: Op, input: DType, len: usize, got: &[T], want: &[T]) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let tol = tolerance(op, what, T::DTYPE, input, len);
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
        "{what} ({op}, {input}, len {len}) beyond {tol:?}: {bad:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Device wrappers (host slices in, host vectors out)
// ---------------------------------------------------------------------------------------------

fn matmul_device<T: DeviceElement>(
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

fn attention_forward_device<T: DeviceElement>(
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

type Grads<T> = (Vec<T>, Vec<T>, Vec<T>);

#[allow(clippy::too_many_arguments)]
fn attention_backward_device<T: DeviceElement>(
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
// Random shapes
// ---------------------------------------------------------------------------------------------

fn check_matmul<T: DeviceElement>(
    s: &Stream,
    rng: &mut Rng,
    shape: MatmulShape,
    alpha: f32,
    beta: f32,
) {
    let a = rng.vec::<T>(shape.a_len().unwrap());
    let b = rng.vec::<T>(shape.b_len().unwrap());
    let c: Vec<T> = if beta == 0.0 {
        vec![T::from_f64(f64::NAN); shape.out_len().unwrap()] // must never be read
    } else {
        rng.vec(shape.out_len().unwrap())
    };
    let mut want = c.clone();
    cpu::matmul(&shape, alpha, beta, &a, &b, &mut want).unwrap();
    let got = matmul_device(s, &shape, alpha, beta, &a, &b, &c).unwrap();
    assert_close(
        &format!("out {shape:?} alpha {alpha} beta {beta}"),
        Op::Matmul,
        T::DTYPE,
        shape.k,
        &got,
        &want,
    );
}

fn matmul_random_shapes<T: DeviceElement>() {
    let s = stream();
    let mut rng = Rng(0x5eed_0001);
    const DIMS: [usize; 5] = [1, 7, 64, 129, 1000];
    for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
        for m in DIMS {
            for n in DIMS {
                for k in DIMS {
                    // At most one dimension of 1000 keeps the f64 reference fast; 1000³ once below.
                    if [m, n, k].iter().filter(|&&d| d == 1000).count() > 1 {
                        continue;
                    }
                    let shape = MatmulShape {
                        batch: 1,
                        m,
                        n,
                        k,
                        trans_a,
                        trans_b,
                    };
                    check_matmul::<T>(&s, &mut rng, shape, 1.0, 0.0);
                }
            }
        }
        let batched = MatmulShape {
            batch: 3,
            m: 129,
            n: 7,
            k: 64,
            trans_a,
            trans_b,
        };
        check_matmul::<T>(&s, &mut rng, batched, 0.5, -1.25);
    }
    let cube = MatmulShape {
        batch: 1,
        m: 1000,
        n: 1000,
        k: 1000,
        trans_a: false,
        trans_b: true,
    };
    check_matmul::<T>(&s, &mut rng, cube, 1.0, 1.0);
    let k0 = MatmulShape {
        batch: 2,
        m: 5,
        n: 3,
        k: 0,
        trans_a: false,
        trans_b: false,
    };
    check_matmul::<T>(&s, &mut rng, k0, 1.0, 2.0);
}

#[test]
fn matmul_random_shapes_f32() {
    matmul_random_shapes::<f32>();
}

#[test]
fn matmul_random_shapes_f16() {
    matmul_random_shapes::<hip_kernels::params::f16>();
}

#[test]
fn matmul_random_shapes_bf16() {
    matmul_random_shapes::<hip_kernels::params::bf16>();
}

fn check_attention<T: DeviceElement>(s: &Stream, rng: &mut Rng, shape: AttentionShape) {
    let (q, k, v) = (
        rng.vec::<T>(shape.q_len().unwrap()),
        rng.vec::<T>(shape.kv_len().unwrap()),
        rng.vec::<T>(shape.kv_len().unwrap()),
    );
    let dout = rng.vec::<T>(shape.q_len().unwrap());
    let mut out = vec![T::from_f64(0.0); q.len()];
    let mut lse = vec![0.0f32; shape.lse_len().unwrap()];
    cpu::attention_forward(&shape, &q, &k, &v, &mut out, &mut lse).unwrap();
    let (got_out, got_lse) = attention_forward_device(s, &shape, &q, &k, &v).unwrap();
    let what = format!("{shape:?}");
    assert_close(
        &format!("out {what}"),
        Op::AttentionForward,
        T::DTYPE,
        shape.tk,
        &got_out,
        &out,
    );
    assert_close(
        &format!("lse {what}"),
        Op::AttentionForward,
        T::DTYPE,
        shape.tk,
        &got_lse,
        &lse,
    );

    // The backward from the reference's out and lse, so both sides see the same inputs.
    let (mut dq, mut dk, mut dv) = (
        vec![T::from_f64(0.0); q.len()],
        vec![T::from_f64(0.0); k.len()],
        vec![T::from_f64(0.0); v.len()],
    );
    cpu::attention_backward(
        &shape, &q, &k, &v, &out, &dout, &lse, &mut dq, &mut dk, &mut dv,
    )
    .unwrap();
    let got = attention_backward_device(s, &shape, &q, &k, &v, &out, &dout, &lse).unwrap();
    let len = shape.tq.max(shape.tk);
    assert_close(
        &format!("dq {what}"),
        Op::AttentionBackward,
        T::DTYPE,
        len,
        &got.0,
        &dq,
    );
    assert_close(
        &format!("dk {what}"),
        Op::AttentionBackward,
        T::DTYPE,
        len,
        &got.1,
        &dk,
    );
    assert_close(
        &format!("dv {what}"),
        Op::AttentionBackward,
        T::DTYPE,
        len,
        &got.2,
        &dv,
    );
}

fn attention_random_shapes<T: DeviceElement>() {
    let s = stream();
    let mut rng = Rng(0x5eed_0002);
    const TS: [usize; 4] = [1, 17, 128, 1000];
    for head_dim in [16, 32, 64, 80, 96, 128] {
        for tq in TS {
            for tk in TS {
                // Every Tq = Tk, and Tq ≠ Tk pairs around 17 and 128 (1000 × 1000 once per head dim).
                if tq != tk && tq.max(tk) == 1000 && tq.min(tk) != 17 {
                    continue;
                }
                for causal in [false, true] {
                    let shape = AttentionShape {
                        batch: 1,
                        heads: 2,
                        tq,
                        tk,
                        head_dim,
                        causal,
                        scale: AttentionShape::default_scale(head_dim),
                    };
                    check_attention::<T>(&s, &mut rng, shape);
                }
            }
        }
    }
}

#[test]
fn attention_random_shapes_f32() {
    attention_random_shapes::<f32>();
}

#[test]
fn attention_random_shapes_f16() {
    attention_random_shapes::<hip_kernels::params::f16>();
}

#[test]
fn attention_random_shapes_bf16() {
    attention_random_shapes::<hip_kernels::params::bf16>();
}

#[test]
fn attention_backward_is_bit_identical_run_to_run() {
    let s = stream();
    let mut rng = Rng(0x5eed_0003);
    let shape = AttentionShape {
        batch: 2,
        heads: 3,
        tq: 300,
        tk: 257,
        head_dim: 80,
        causal: true,
        scale: 0.1,
    };
    let (q, k, v, dout) = (
        rng.vec::<f32>(shape.q_len().unwrap()),
        rng.vec::<f32>(shape.kv_len().unwrap()),
        rng.vec::<f32>(shape.kv_len().unwrap()),
        rng.vec::<f32>(shape.q_len().unwrap()),
    );
    let (out, lse) = attention_forward_device(&s, &shape, &q, &k, &v).unwrap();
    let first = attention_backward_device(&s, &shape, &q, &k, &v, &out, &dout, &lse).unwrap();
    for _ in 0..3 {
        let again = attention_backward_device(&s, &shape, &q, &k, &v, &out, &dout, &lse).unwrap();
        assert!(
            first
                .0
                .iter()
                .zip(&again.0)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "dq differs"
        );
        assert!(
            first
                .1
                .iter()
                .zip(&again.1)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "dk differs"
        );
        assert!(
            first
                .2
                .iter()
                .zip(&again.2)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "dv differs"
        );
    }
}

#[test]
fn bad_shapes_are_rejected_before_any_launch() {
    let s = stream();
    let (a, b) = (upload(&s, &[0f32; 6]), upload(&s, &[0f32; 6]));
    let mut out = upload(&s, &[0f32; 4]);
    let shape = MatmulShape::new(2, 2, 3);
    let e = ops::matmul(&s, &shape, 1.0, 0.0, &a, &b, &mut out).unwrap_err();
    assert!(
        e.to_string().contains("`b`") || e.to_string().contains("`a`"),
        "{e}"
    );
    let big = AttentionShape {
        batch: 1,
        heads: 1,
        tq: 1,
        tk: 1,
        head_dim: 129,
        causal: false,
        scale: 1.0,
    };
    let (x, mut o) = (upload(&s, &[0f32; 129]), upload(&s, &[0f32; 129]));
    let mut lse = upload(&s, &[0f32; 1]);
    let e = ops::attention_forward(&s, &big, &x, &x, &x, &mut o, &mut lse).unwrap_err();
    assert!(e.to_string().contains("head_dim"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// Golden cases
// ---------------------------------------------------------------------------------------------

/// The device as a golden backend for matmul and attention (other ops are filtered out before).
struct HipBackend(Stream);

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct BackendError(String);

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
        _: &LayerNormForwardCase,
    ) -> Result<LayerNormForwardOut, BackendError> {
        Err(BackendError("layernorm is not tested here".into()))
    }

    fn layernorm_backward(
        &mut self,
        _: &LayerNormBackwardCase,
    ) -> Result<LayerNormBackwardOut, BackendError> {
        Err(BackendError("layernorm is not tested here".into()))
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

    fn adamw(&mut self, _: &AdamWCase) -> Result<AdamWOut, BackendError> {
        Err(BackendError("adamw is not tested here".into()))
    }
}

#[test]
fn golden_matmul_and_attention_cases_pass_on_the_device() {
    let mut dirs = vec![committed_dir()];
    dirs.extend(env_dirs());
    let mut backend = HipBackend(stream());
    let (mut failures, mut ran) = (Vec::new(), 0);
    for dir in dirs {
        for path in case_files(&dir).expect("case files") {
            let case = load_case(&path).expect("case");
            if !matches!(
                case.inputs,
                CaseInputs::Matmul(_)
                    | CaseInputs::AttentionForward(_)
                    | CaseInputs::AttentionBackward(_)
            ) {
                continue;
            }
            ran += 1;
            if let Err(e) = run_case_with(&mut backend, &case) {
                failures.push(format!("{}: {e}", path.display()));
            }
        }
    }
    assert!(ran > 0, "no matmul/attention golden cases found");
    assert!(
        failures.is_empty(),
        "{} of {ran} cases failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
