//! Device tests of the AdamW kernels (`adamw`, `l2_norm`, `non_finite`) against the CPU
//! reference (`--features device`; needs a HIP device and kernels built for its arch). Run on
//! hip-emu (the CPU-emulated device), never on a GPU.
//!
//! - AdamW over element counts that are not multiples of a block or chunk, every option, several
//!   tensors in one launch, per-tensor weight decay and learning rate;
//! - a found_inf step leaves every tensor bit-identical; amsgrad propagates a NaN in v or v̂ to
//!   the parameter (torch.maximum); results are bit-identical run to run;
//! - `non_finite` and `l2_norm` against the reference, every dtype;
//! - the adamw golden cases through the library's `DeviceBackend`.

#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::ops::{self, AdamW, AdamWParams, AdamWTensor, DeviceElement};
use hip_kernels::params::{bf16, f16, DType, Host, OnDevice};
use hip_kernels::tolerance::Rule;
use hip_rt::memory::buffer::DeviceView;
use hip_rt::{DeviceBuffer, Stream};

mod device_common;

use device_common::*;

// ---------------------------------------------------------------------------------------------
// AdamW
// ---------------------------------------------------------------------------------------------

struct AdamwState<T> {
    param: Vec<T>,
    grad: Vec<T>,
    m: Vec<f32>,
    v: Vec<f32>,
    vmax: Option<Vec<f32>>,
    master: Option<Vec<f32>>,
}

impl<T: DeviceElement> AdamwState<T> {
    fn random(n: usize, amsgrad: bool, master: bool, rng: &mut Rng) -> Self {
        let param: Vec<T> = rng.vec(n, 1.0);
        AdamwState {
            master: master.then(|| param.iter().map(|p| p.to_f32()).collect()),
            grad: rng.vec(n, 1e-2),
            m: rng.vec(n, 1e-3),
            v: (0..n)
                .map(|_| (rng.normal() * 1e-2).powi(2) as f32)
                .collect(),
            vmax: amsgrad.then(|| {
                (0..n)
                    .map(|_| (rng.normal() * 1e-2).powi(2) as f32)
                    .collect()
            }),
            param,
        }
    }

    fn cpu_step(&mut self, c: &AdamWParams, grad_scale: Option<f32>) {
        let scale = grad_scale.map(|g| [g]);
        cpu::adamw(AdamW::<Host, T> {
            params: *c,
            grad_scale: scale.as_ref().map(|g| &g[..]),
            found_inf: None,
            tensors: &mut [AdamWTensor {
                param: &mut self.param,
                grad: &self.grad,
                exp_avg: &mut self.m,
                exp_avg_sq: &mut self.v,
                max_exp_avg_sq: self.vmax.as_deref_mut(),
                master: self.master.as_deref_mut(),
                weight_decay: None,
                lr_scale: None,
            }],
        })
        .expect("cpu adamw");
    }
}

/// Device copies of one tensor's state.
struct DeviceState<T: DeviceElement> {
    param: DeviceBuffer<T>,
    grad: DeviceBuffer<T>,
    m: DeviceBuffer<f32>,
    v: DeviceBuffer<f32>,
    vmax: Option<DeviceBuffer<f32>>,
    master: Option<DeviceBuffer<f32>>,
}

impl<T: DeviceElement> DeviceState<T> {
    fn upload(s: &Stream, h: &AdamwState<T>) -> Self {
        DeviceState {
            param: upload(s, &h.param),
            grad: upload(s, &h.grad),
            m: upload(s, &h.m),
            v: upload(s, &h.v),
            vmax: h.vmax.as_ref().map(|v| upload(s, v)),
            master: h.master.as_ref().map(|v| upload(s, v)),
        }
    }

    fn tensor(&mut self) -> AdamWTensor<'_, OnDevice, T> {
        AdamWTensor {
            param: &mut self.param,
            grad: &self.grad,
            exp_avg: &mut self.m,
            exp_avg_sq: &mut self.v,
            max_exp_avg_sq: self.vmax.as_mut().map(|b| b as _),
            master: self.master.as_mut().map(|b| b as _),
            weight_decay: None,
            lr_scale: None,
        }
    }

    fn download(&self, s: &Stream) -> AdamwState<T> {
        AdamwState {
            param: download(s, &self.param),
            grad: download(s, &self.grad),
            m: download(s, &self.m),
            v: download(s, &self.v),
            vmax: self.vmax.as_ref().map(|b| download(s, b)),
            master: self.master.as_ref().map(|b| download(s, b)),
        }
    }
}

fn assert_adamw_close<T: DeviceElement>(got: &AdamwState<T>, want: &AdamwState<T>) {
    let dt = T::DTYPE;
    assert_close("param", Rule::Optimizer, dt, 1, &got.param, &want.param);
    assert_close("exp_avg", Rule::Optimizer, dt, 1, &got.m, &want.m);
    assert_close("exp_avg_sq", Rule::Optimizer, dt, 1, &got.v, &want.v);
    if let (Some(g), Some(w)) = (&got.vmax, &want.vmax) {
        assert_close("max_exp_avg_sq", Rule::Optimizer, dt, 1, g, w);
    }
    if let (Some(g), Some(w)) = (&got.master, &want.master) {
        assert_close("param", Rule::Optimizer, DType::F32, 1, g, w);
    }
}

fn adamw_multi_random<T: DeviceElement>(s: &Stream, seed: u64) {
    // More tensors than one launch's table holds (ADAMW_TABLE_ROWS), so the list is split.
    let mut lens = vec![1usize, 255, 1023, 4097, 65_537, 200_003, 0];
    lens.extend((0..ops::ADAMW_TABLE_ROWS).map(|i| 3 + 97 * i));
    for (amsgrad, maximize, master, scaled) in [
        (false, false, false, false),
        (true, true, true, true),
        (true, false, false, true),
        (false, true, true, false),
    ] {
        let c = AdamWParams {
            lr: 1e-2,
            amsgrad,
            maximize,
            weight_decay: 0.1,
            step: 7,
            ..AdamWParams::default()
        };
        let mut rng = Rng(seed);
        let mut host: Vec<AdamwState<T>> = lens
            .iter()
            .map(|&n| AdamwState::random(n, amsgrad, master, &mut rng))
            .collect();
        let mut dev: Vec<DeviceState<T>> = host.iter().map(|h| DeviceState::upload(s, h)).collect();
        let scale = upload(s, &[256.0f32]);
        let mut tensors: Vec<AdamWTensor<'_, OnDevice, T>> =
            dev.iter_mut().map(|d| d.tensor()).collect();
        let a = AdamW::<OnDevice, _> {
            params: c,
            grad_scale: scaled.then_some(&scale as &dyn DeviceView<f32>),
            found_inf: None,
            tensors: &mut tensors,
        };
        ops::adamw(s, a).expect("adamw");
        drop(tensors);
        for (h, d) in host.iter_mut().zip(&dev) {
            h.cpu_step(&c, scaled.then_some(256.0));
            assert_adamw_close(&d.download(s), h);
        }
    }
}

#[test]
fn adamw_multi_matches_the_reference_every_option_every_dtype() {
    let s = stream();
    adamw_multi_random::<f32>(&s, 11);
    adamw_multi_random::<f16>(&s, 12);
    adamw_multi_random::<bf16>(&s, 13);
}

/// Per-tensor weight decay and lr scale (torch's param groups) in one `ops::adamw` call: equal
/// bit for bit to one call per tensor with those hyper-parameters as the call's, close to the
/// CPU reference (itself equal to its per-tensor calls), in one launch per
/// `ADAMW_TABLE_ROWS` tensors (counted on hip-emu).
fn adamw_per_tensor_hyper<T: DeviceElement>(s: &Stream, seed: u64) {
    let n_tensors = ops::ADAMW_TABLE_ROWS + 6;
    let mut lens: Vec<usize> = (0..n_tensors).map(|i| 3 + 37 * i).collect();
    lens[1] = 65_537; // more than one chunk
    let overrides: Vec<(Option<f64>, Option<f64>)> = (0..n_tensors)
        .map(|i| {
            let wd = [None, Some(0.0), Some(0.3)][i % 3];
            let scale = [None, Some(0.5), Some(0.0), Some(2.0)][i % 4];
            (wd, scale)
        })
        .collect();
    let c = AdamWParams {
        lr: 1e-2,
        weight_decay: 0.1,
        step: 5,
        ..AdamWParams::default()
    };
    // What torch's param group of tensor i would run with.
    let own = |i: usize| AdamWParams {
        lr: overrides[i].1.map_or(c.lr, |sc| c.lr * sc),
        weight_decay: overrides[i].0.unwrap_or(c.weight_decay),
        ..c
    };
    let mut rng = Rng(seed);
    let host: Vec<AdamwState<T>> = lens
        .iter()
        .map(|&n| AdamwState::random(n, false, false, &mut rng))
        .collect();

    // One call, the overrides in the table.
    let mut one: Vec<DeviceState<T>> = host.iter().map(|h| DeviceState::upload(s, h)).collect();
    let mut tensors: Vec<AdamWTensor<'_, OnDevice, T>> = one
        .iter_mut()
        .zip(&overrides)
        .map(|(d, &(wd, sc))| AdamWTensor {
            weight_decay: wd,
            lr_scale: sc,
            ..d.tensor()
        })
        .collect();
    s.synchronize().expect("sync");
    let before = hip_rt::emu::stats(hip_rt::emu::StatsScope::Thread);
    ops::adamw(
        s,
        AdamW::<OnDevice, _> {
            params: c,
            grad_scale: None,
            found_inf: None,
            tensors: &mut tensors,
        },
    )
    .expect("adamw, one call");
    if let (Some(b), Some(a)) = (before, hip_rt::emu::stats(hip_rt::emu::StatsScope::Thread)) {
        let launches = a.since(&b).launches;
        assert_eq!(
            launches as usize,
            n_tensors.div_ceil(ops::ADAMW_TABLE_ROWS),
            "launches of one adamw call over {n_tensors} tensors"
        );
    }
    drop(tensors);

    // One call per tensor, its hyper-parameters as the call's.
    let mut each: Vec<DeviceState<T>> = host.iter().map(|h| DeviceState::upload(s, h)).collect();
    for (i, d) in each.iter_mut().enumerate() {
        ops::adamw(
            s,
            AdamW::<OnDevice, _> {
                params: own(i),
                grad_scale: None,
                found_inf: None,
                tensors: &mut [d.tensor()],
            },
        )
        .expect("adamw, per tensor");
    }

    for (i, ((o, e), h)) in one.iter().zip(&each).zip(&host).enumerate() {
        let (o, e) = (o.download(s), e.download(s));
        assert_eq!(
            (bits(&o.param), bits(&o.m), bits(&o.v)),
            (bits(&e.param), bits(&e.m), bits(&e.v)),
            "tensor {i} ({:?}): one call != per-tensor call",
            overrides[i]
        );
        // The CPU reference: one call with the override equals its own per-tensor call.
        let (mut a, mut b) = (clone_state(h), clone_state(h));
        cpu::adamw(AdamW::<Host, T> {
            params: c,
            grad_scale: None,
            found_inf: None,
            tensors: &mut [AdamWTensor {
                param: &mut a.param,
                grad: &a.grad,
                exp_avg: &mut a.m,
                exp_avg_sq: &mut a.v,
                max_exp_avg_sq: None,
                master: None,
                weight_decay: overrides[i].0,
                lr_scale: overrides[i].1,
            }],
        })
        .expect("cpu adamw");
        b.cpu_step(&own(i), None);
        assert_eq!(bits(&a.param), bits(&b.param), "cpu tensor {i}");
        assert_adamw_close(&o, &a);
    }
    // The overrides mattered: lr_scale 0 left tensor 2's parameter alone (decay 1 − 0·wd = 1).
    assert_eq!(bits(&one[2].download(s).param), bits(&host[2].param));
    assert_ne!(bits(&one[1].download(s).param), bits(&host[1].param));
}

fn clone_state<T: DeviceElement>(h: &AdamwState<T>) -> AdamwState<T> {
    AdamwState {
        param: h.param.clone(),
        grad: h.grad.clone(),
        m: h.m.clone(),
        v: h.v.clone(),
        vmax: h.vmax.clone(),
        master: h.master.clone(),
    }
}

#[test]
fn adamw_per_tensor_weight_decay_and_lr_scale_in_one_call_every_dtype() {
    let s = stream();
    adamw_per_tensor_hyper::<f32>(&s, 21);
    adamw_per_tensor_hyper::<f16>(&s, 22);
    adamw_per_tensor_hyper::<bf16>(&s, 23);
}

#[test]
fn a_found_inf_step_changes_no_bit() {
    let s = stream();
    let c = AdamWParams {
        amsgrad: true,
        step: 3,
        ..AdamWParams::default()
    };
    let mut rng = Rng(5);
    let host = AdamwState::<bf16>::random(70_001, true, true, &mut rng);
    let mut dev = DeviceState::upload(&s, &host);
    let found = upload(&s, &[1.0f32]);
    let a = AdamW::<OnDevice, _> {
        params: c,
        grad_scale: None,
        found_inf: Some(&found),
        tensors: &mut [dev.tensor()],
    };
    ops::adamw(&s, a).expect("adamw");
    let got = dev.download(&s);
    assert_eq!(bits(&got.param), bits(&host.param));
    assert_eq!((bits(&got.m), bits(&got.v)), (bits(&host.m), bits(&host.v)));
    assert_eq!(
        got.vmax.as_deref().map(bits),
        host.vmax.as_deref().map(bits)
    );
    assert_eq!(
        got.master.as_deref().map(bits),
        host.master.as_deref().map(bits)
    );
}

/// amsgrad with a NaN already in max_exp_avg_sq (element 0) or in exp_avg_sq (element 1): both
/// stay NaN in v̂ and reach the parameter, as torch.maximum propagates NaN; element 2 is finite.
fn adamw_amsgrad_nan<T: DeviceElement>(s: &Stream) {
    let c = AdamWParams {
        lr: 1e-2,
        amsgrad: true,
        step: 1,
        ..AdamWParams::default()
    };
    let mut host = AdamwState::<T> {
        param: vec![T::from_f64(1.0); 3],
        grad: vec![T::from_f64(0.1); 3],
        m: vec![0.0; 3],
        v: vec![0.25, f32::NAN, 0.25],
        vmax: Some(vec![f32::NAN, 0.5, 0.5]),
        master: None,
    };
    let mut dev = DeviceState::upload(s, &host);
    ops::adamw(
        s,
        AdamW::<OnDevice, _> {
            params: c,
            grad_scale: None,
            found_inf: None,
            tensors: &mut [dev.tensor()],
        },
    )
    .expect("adamw");
    let got = dev.download(s);
    host.cpu_step(&c, None);
    assert_adamw_close(&got, &host);
    let vmax = got.vmax.as_deref().unwrap();
    let p: Vec<f64> = got.param.iter().map(|x| x.to_f64()).collect();
    assert!(
        vmax[0].is_nan() && vmax[1].is_nan() && vmax[2] == 0.5,
        "{vmax:?}"
    );
    assert!(p[0].is_nan() && p[1].is_nan() && p[2].is_finite(), "{p:?}");
}

#[test]
fn adamw_amsgrad_propagates_nan_like_torch_maximum() {
    let s = stream();
    adamw_amsgrad_nan::<f32>(&s);
    adamw_amsgrad_nan::<f16>(&s);
    adamw_amsgrad_nan::<bf16>(&s);
}

fn non_finite_and_l2_norm<T: DeviceElement>(s: &Stream, seed: u64) {
    let mut rng = Rng(seed);
    let a: Vec<T> = rng.vec(100_000, 1.0);
    let mut b: Vec<T> = rng.vec(3, 1.0);
    let (da, db) = (upload(s, &a), upload(s, &b));
    let mut flag = upload(s, &[7.0f32]);
    let mut norm = upload(s, &[0.0f32]);
    ops::non_finite(s, &[&da, &db], &mut flag).expect("non_finite");
    assert_eq!(download(s, &flag), [0.0]);
    ops::l2_norm(s, &[&da, &db], &mut norm).expect("l2_norm");
    let want = cpu::l2_norm(&[&a[..], &b[..]]);
    let got = download(s, &norm)[0];
    assert!(
        (f64::from(got) - want).abs() <= 1e-5 * want,
        "l2 norm {got} vs {want}"
    );
    ops::l2_norm(s, &[&da, &db], &mut norm).expect("l2_norm again");
    assert_eq!(
        download(s, &norm)[0].to_bits(),
        got.to_bits(),
        "l2 norm is deterministic"
    );
    // No tensors (a ZeRO rank that owns none): the norm is 0, written, not left as it was.
    ops::l2_norm::<T>(s, &[], &mut norm).expect("l2_norm of no tensors");
    assert_eq!(download(s, &norm), [0.0], "l2 norm of no tensors");
    b[2] = T::from_f64(f64::INFINITY);
    let db = upload(s, &b);
    ops::non_finite(s, &[&da, &db], &mut flag).expect("non_finite");
    assert_eq!(download(s, &flag), [1.0]);
}

#[test]
fn non_finite_and_l2_norm_match_the_reference_every_dtype() {
    let s = stream();
    non_finite_and_l2_norm::<f32>(&s, 8);
    non_finite_and_l2_norm::<f16>(&s, 9);
    non_finite_and_l2_norm::<bf16>(&s, 10);
}

#[test]
fn golden_adamw_cases_pass_on_the_device() {
    run_golden_cases(|op| op == "adamw", "adamw");
}
