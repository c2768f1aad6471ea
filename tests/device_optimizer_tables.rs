//! The few-launch optimizer (device-side tensor tables, `ops::OptimizerTables`) and the
//! optimizer step as a HIP graph, on hip-emu (`--features device`; never on a GPU):
//!
//! - AdamW over GPT-2 124M's tensor count (148) and a 7B model's (~290) in one launch,
//!   bit-identical to the by-value launcher (which needs 7 and 13 launches), every dtype;
//! - the global L2 norm in one launch plus one final reduction (bit-identical to
//!   `ops::l2_norm`), with the clip's grad_scale from the same final launch, and the
//!   non-finite check in one launch;
//! - a clipped optimizer step in 3 launches, against the CPU reference;
//! - that step captured once as a graph and replayed: one graph launch per step plus the
//!   table upload, bit-identical to the eager step.
//!
//! Launch counts are hip-emu's counters (`hip_rt::emu`): what a profiler would count on a GPU.
//! Tensor sizes are small (the count, not the size, decides the launches; two tensors span
//! several 64 Ki-element chunks).

#![cfg(feature = "device")]

use hip_kernels::cpu;
use hip_kernels::ops::{self, AdamW, AdamWParams, AdamWTensor, DeviceElement, NormClip};
use hip_kernels::params::{bf16, f16, DType, Host, OnDevice};
use hip_kernels::tolerance::Rule;
use hip_rt::emu::{self, EmuStats, StatsScope};
use hip_rt::memory::buffer::DeviceView;
use hip_rt::{CaptureMode, DeviceBuffer, Stream};

mod device_common;

use device_common::*;

/// GPT-2 124M's parameter tensors: wte, wpe, 12 × (ln_1 w/b, c_attn w/b, c_proj w/b, ln_2 w/b,
/// c_fc w/b, mlp c_proj w/b), ln_f w/b.
const GPT2_TENSORS: usize = 2 + 12 * 12 + 2;
/// A 7B Llama's: embed, 32 × (q, k, v, o, gate, up, down, two norms), final norm, lm_head.
const LLAMA7B_TENSORS: usize = 1 + 32 * 9 + 2;

/// `count` tensor lengths: mostly small and odd, two over a 64 Ki-element chunk.
fn lengths(count: usize) -> Vec<usize> {
    (0..count)
        .map(|i| match i {
            0 => ops::CHUNK + 77,
            1 => 2 * ops::CHUNK + 5,
            _ => 1 + (i * 37) % 700,
        })
        .collect()
}

struct State<T: DeviceElement> {
    param: DeviceBuffer<T>,
    grad: DeviceBuffer<T>,
    m: DeviceBuffer<f32>,
    v: DeviceBuffer<f32>,
    master: Option<DeviceBuffer<f32>>,
}

fn states<T: DeviceElement>(s: &Stream, lens: &[usize], master: bool, seed: u64) -> Vec<State<T>> {
    let mut rng = Rng(seed);
    lens.iter()
        .map(|&n| {
            let param: Vec<T> = rng.vec(n, 1.0);
            let master = master.then(|| param.iter().map(|p| p.to_f32()).collect::<Vec<_>>());
            State {
                param: upload(s, &param),
                grad: upload(s, &rng.vec::<T>(n, 1e-2)),
                m: upload(s, &rng.vec::<f32>(n, 1e-3)),
                v: upload(s, &vec![1e-6f32; n]),
                master: master.map(|m| upload(s, &m)),
            }
        })
        .collect()
}

fn copy_states<T: DeviceElement>(s: &Stream, from: &[State<T>]) -> Vec<State<T>> {
    from.iter()
        .map(|t| State {
            param: upload(s, &download(s, &t.param)),
            grad: upload(s, &download(s, &t.grad)),
            m: upload(s, &download(s, &t.m)),
            v: upload(s, &download(s, &t.v)),
            master: t.master.as_ref().map(|m| upload(s, &download(s, m))),
        })
        .collect()
}

fn tensors<T: DeviceElement>(st: &mut [State<T>]) -> Vec<AdamWTensor<'_, OnDevice, T>> {
    st.iter_mut()
        .enumerate()
        .map(|(i, t)| {
            let mut x = AdamWTensor::new(
                &mut t.param as _,
                &t.grad as _,
                &mut t.m as _,
                &mut t.v as _,
            );
            x.master = t.master.as_mut().map(|b| b as _);
            // Biases and norms without weight decay, one group with its own lr (param groups).
            if i % 5 == 1 {
                x.weight_decay = Some(0.0);
            }
            if i % 7 == 3 {
                x.lr_scale = Some(0.5);
            }
            x
        })
        .collect()
}

/// Every buffer's bytes, for bit-identity.
fn snapshot<T: DeviceElement>(s: &Stream, st: &[State<T>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    for t in st {
        out.push(bits(&download(s, &t.param)));
        out.push(bits(&download(s, &t.m)));
        out.push(bits(&download(s, &t.v)));
        if let Some(m) = &t.master {
            out.push(bits(&download(s, m)));
        }
    }
    out
}

fn counted(f: impl FnOnce()) -> EmuStats {
    let before = emu::stats(StatsScope::Thread).expect("the device tests run on hip-emu");
    f();
    emu::stats(StatsScope::Thread).unwrap().since(&before)
}

fn params(step: u64) -> AdamWParams {
    AdamWParams {
        lr: 3e-3,
        weight_decay: 0.1,
        step,
        ..AdamWParams::default()
    }
}

fn adamw_one_launch<T: DeviceElement>(s: &Stream, count: usize, master: bool, seed: u64) {
    let lens = lengths(count);
    let mut tabled = states::<T>(s, &lens, master, seed);
    let mut by_value = copy_states(s, &tabled);
    let scale = upload(s, &[4.0f32]);
    let mut tables = ops::OptimizerTables::new();
    for step in 1..=2 {
        let d = counted(|| {
            let mut t = tensors(&mut tabled);
            let a = AdamW::<OnDevice, T> {
                params: params(step),
                grad_scale: Some(&scale as &dyn DeviceView<f32>),
                found_inf: None,
                tensors: &mut t,
            };
            ops::adamw_tabled(s, a, &mut tables).expect("adamw_tabled");
        });
        assert_eq!(d.launches, 1, "{count} tensors: one AdamW launch");
        let table_bytes = 48 + 72 * count as u64;
        assert_eq!(d.bytes_htod, table_bytes, "one upload of the table");
        let d = counted(|| {
            let mut t = tensors(&mut by_value);
            let a = AdamW::<OnDevice, T> {
                params: params(step),
                grad_scale: Some(&scale as &dyn DeviceView<f32>),
                found_inf: None,
                tensors: &mut t,
            };
            ops::adamw(s, a).expect("adamw");
        });
        assert_eq!(
            d.launches as usize,
            count.div_ceil(ops::ADAMW_TABLE_ROWS),
            "the by-value launcher needs a launch per 24 tensors"
        );
        assert_eq!(
            snapshot(s, &tabled),
            snapshot(s, &by_value),
            "{count} tensors, step {step}: bit-identical to the by-value launcher"
        );
    }
}

#[test]
fn adamw_over_gpt2_and_7b_tensor_counts_is_one_launch_every_dtype() {
    let s = stream();
    adamw_one_launch::<f32>(&s, GPT2_TENSORS, false, 1);
    adamw_one_launch::<bf16>(&s, GPT2_TENSORS, true, 2);
    adamw_one_launch::<f16>(&s, LLAMA7B_TENSORS, false, 3);
}

fn norm_one_launch<T: DeviceElement>(s: &Stream, count: usize, seed: u64) {
    let lens = lengths(count);
    let mut rng = Rng(seed);
    let host: Vec<Vec<T>> = lens.iter().map(|&n| rng.vec(n, 1.0)).collect();
    let dev: Vec<DeviceBuffer<T>> = host.iter().map(|h| upload(s, h)).collect();
    let views: Vec<&dyn DeviceView<T>> = dev.iter().map(|d| d as _).collect();
    let mut tables = ops::OptimizerTables::new();
    let mut norm = upload(s, &[0.0f32]);
    let d = counted(|| ops::l2_norm_tabled(s, &views, &mut norm, None, &mut tables).unwrap());
    assert_eq!(
        d.launches, 2,
        "one launch over every tensor plus the final reduction"
    );
    let got = download(s, &norm)[0];
    let mut want = upload(s, &[0.0f32]);
    ops::l2_norm(s, &views, &mut want).unwrap();
    assert_eq!(
        got.to_bits(),
        download(s, &want)[0].to_bits(),
        "same sums, same order"
    );
    let slices: Vec<&[T]> = host.iter().map(|h| &h[..]).collect();
    let reference = cpu::l2_norm(&slices);
    assert!((f64::from(got) - reference).abs() <= 1e-5 * reference);
    // With the clip, from the same final launch; against the separate clip kernel.
    let mut scale = upload(s, &[0.0f32]);
    let loss_scale = upload(s, &[8.0f32]);
    let max_norm = (reference / 8.0 / 3.0) as f32;
    let clip = NormClip {
        max_norm,
        loss_scale: Some(&loss_scale),
        grad_scale: &mut scale,
    };
    let d = counted(|| {
        // SAFETY: the uploaded tensors (`dev`) are alive.
        unsafe { tables.launch_norm::<T>(s, &mut norm, Some(clip)) }.unwrap()
    });
    assert_eq!(d.launches, 2);
    let mut separate = upload(s, &[0.0f32]);
    ops::clip_grad_scale(
        s,
        ops::ClipGradScale {
            params: ops::ClipParams { max_norm },
            norm: &want,
            loss_scale: Some(&loss_scale),
            grad_scale: &mut separate,
        },
    )
    .unwrap();
    assert_eq!(download(s, &scale), download(s, &separate));
    assert!(
        download(s, &scale)[0] > 8.0,
        "the norm is over max_norm: clipped"
    );
    // The non-finite check over the same table: one launch (and the zeroing memset).
    let mut flag = upload(s, &[7.0f32]);
    let d = counted(|| {
        // SAFETY: as above.
        unsafe { tables.launch_non_finite::<T>(s, &mut flag) }.unwrap()
    });
    assert_eq!((d.launches, d.memsets), (1, 1));
    assert_eq!(download(s, &flag), [0.0]);
    let mut bad = host[count - 1].clone();
    bad[0] = T::from_f64(f64::NAN);
    let bad = upload(s, &bad);
    let mut views = views;
    views[count - 1] = &bad;
    tables.upload_norm(s, &views).unwrap();
    // SAFETY: as above (`bad` replaces the last tensor and is alive).
    unsafe { tables.launch_non_finite::<T>(s, &mut flag) }.unwrap();
    assert_eq!(download(s, &flag), [1.0]);
    // A launch for another dtype than the upload's is refused.
    // SAFETY: refused before anything is queued.
    let e = unsafe { tables.launch_non_finite::<f32>(s, &mut flag) };
    if T::DTYPE != DType::F32 {
        assert!(e.unwrap_err().to_string().contains("launch dtype"));
    }
}

#[test]
fn the_global_norm_is_one_launch_plus_one_reduction_every_dtype() {
    let s = stream();
    norm_one_launch::<f32>(&s, GPT2_TENSORS, 11);
    norm_one_launch::<f16>(&s, LLAMA7B_TENSORS, 12);
    norm_one_launch::<bf16>(&s, GPT2_TENSORS, 13);
}

/// The clipped step: norm partials, finalize + clip, AdamW: 3 launches, no host round trip.
/// `tables` must hold the gradients' norm table already.
fn clipped_step(
    s: &Stream,
    tables: &ops::OptimizerTables,
    norm: &mut DeviceBuffer<f32>,
    scale: &mut DeviceBuffer<f32>,
) {
    let clip = NormClip {
        max_norm: 0.05,
        loss_scale: None,
        grad_scale: scale,
    };
    // SAFETY: the callers keep the tensors of both uploads alive until they synchronise.
    unsafe {
        tables.launch_norm::<f32>(s, norm, Some(clip)).unwrap();
        tables
            .launch_adamw::<f32>(s, Some(&*scale as &dyn DeviceView<f32>), None)
            .unwrap();
    }
}

fn upload_step(s: &Stream, st: &mut [State<f32>], tables: &mut ops::OptimizerTables, step: u64) {
    let mut t = tensors(st);
    let a = AdamW::<OnDevice, f32> {
        params: params(step),
        grad_scale: None,
        found_inf: None,
        tensors: &mut t,
    };
    tables.upload_adamw(s, &a).unwrap();
}

fn upload_grads(s: &Stream, st: &[State<f32>], tables: &mut ops::OptimizerTables) {
    let grads: Vec<&dyn DeviceView<f32>> = st.iter().map(|t| &t.grad as _).collect();
    tables.upload_norm(s, &grads).unwrap();
}

#[test]
fn a_clipped_step_is_three_launches_and_matches_the_reference() {
    let s = stream();
    let lens = lengths(GPT2_TENSORS);
    let mut st = states::<f32>(&s, &lens, false, 21);
    let host_params: Vec<Vec<f32>> = st.iter().map(|t| download(&s, &t.param)).collect();
    let host_grads: Vec<Vec<f32>> = st.iter().map(|t| download(&s, &t.grad)).collect();
    let mut tables = ops::OptimizerTables::new();
    let (mut norm, mut scale) = (upload(&s, &[0.0f32]), upload(&s, &[0.0f32]));
    upload_grads(&s, &st, &mut tables);
    upload_step(&s, &mut st, &mut tables, 1);
    let d = counted(|| clipped_step(&s, &tables, &mut norm, &mut scale));
    assert_eq!(d.launches, 3, "norm, finalize + clip, AdamW");
    assert_eq!(d.host_waits, 0, "no host round trip");
    // The reference: clip_grad_norm_ then AdamW on the host, from the same initial state.
    let grads: Vec<&[f32]> = host_grads.iter().map(|g| &g[..]).collect();
    let total = cpu::l2_norm(&grads);
    let grad_scale = [(1.0 / (0.05 / (total + 1e-6)).min(1.0)) as f32];
    let moments = initial_m(&lens, 21);
    for (i, ((mut p, g), mut exp_avg)) in host_params
        .into_iter()
        .zip(&host_grads)
        .zip(moments)
        .enumerate()
    {
        let mut exp_avg_sq = vec![1e-6f32; p.len()];
        let mut t = AdamWTensor::<Host, f32>::new(&mut p, g, &mut exp_avg, &mut exp_avg_sq);
        if i % 5 == 1 {
            t.weight_decay = Some(0.0);
        }
        if i % 7 == 3 {
            t.lr_scale = Some(0.5);
        }
        cpu::adamw(AdamW::<Host, f32> {
            params: params(1),
            grad_scale: Some(&grad_scale),
            found_inf: None,
            tensors: &mut [t],
        })
        .unwrap();
        let got = download(&s, &st[i].param);
        assert_close("param", Rule::Optimizer, DType::F32, 1, &got, &p);
        assert_close(
            "exp_avg",
            Rule::Optimizer,
            DType::F32,
            1,
            &download(&s, &st[i].m),
            &exp_avg,
        );
    }
}

/// The first moments `states(lens, _, seed)` drew.
fn initial_m(lens: &[usize], seed: u64) -> Vec<Vec<f32>> {
    let mut rng = Rng(seed);
    lens.iter()
        .map(|&n| {
            let _: Vec<f32> = rng.vec(n, 1.0);
            let _: Vec<f32> = rng.vec(n, 1e-2);
            rng.vec(n, 1e-3)
        })
        .collect()
}

#[test]
fn the_optimizer_step_as_a_graph_is_one_launch_and_bit_identical() {
    let s = stream();
    let lens = lengths(GPT2_TENSORS);
    let mut eager = states::<f32>(&s, &lens, false, 31);
    let mut graphed = copy_states(&s, &eager);
    let (mut norm_e, mut scale_e) = (upload(&s, &[0.0f32]), upload(&s, &[0.0f32]));
    let (mut norm_g, mut scale_g) = (upload(&s, &[0.0f32]), upload(&s, &[0.0f32]));
    let mut tables_e = ops::OptimizerTables::new();
    let mut tables_g = ops::OptimizerTables::new();
    upload_grads(&s, &eager, &mut tables_e);
    upload_grads(&s, &graphed, &mut tables_g);
    // The graph needs a first upload (its launch reads the table's address); capture once.
    upload_step(&s, &mut graphed, &mut tables_g, 1);
    s.synchronize().unwrap();
    let graph = s
        .capture(CaptureMode::Global, |s| {
            clipped_step(s, &tables_g, &mut norm_g, &mut scale_g);
            Ok(())
        })
        .unwrap();
    assert_eq!(graph.node_count().unwrap(), 3);
    let exec = graph.instantiate().unwrap();
    for step in 1..=3 {
        upload_step(&s, &mut eager, &mut tables_e, step);
        clipped_step(&s, &tables_e, &mut norm_e, &mut scale_e);
        let d = counted(|| {
            // The step's scalars change every step: uploaded outside the graph.
            upload_step(&s, &mut graphed, &mut tables_g, step);
            // SAFETY: every tensor the graph's tables point at (`graphed`) and the norm and
            // scale buffers are alive.
            unsafe { exec.launch(&s) }.unwrap();
        });
        assert_eq!((d.graph_launches, d.launches, d.graph_nodes), (1, 0, 3));
        assert_eq!(
            d.bytes_htod,
            48 + 72 * GPT2_TENSORS as u64,
            "the table upload"
        );
        assert_eq!(
            snapshot(&s, &graphed),
            snapshot(&s, &eager),
            "step {step}: the replay is bit-identical to the eager step"
        );
        assert_eq!(download(&s, &norm_g), download(&s, &norm_e));
    }
}
