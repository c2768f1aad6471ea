//! Edge cases of the training-step kernels beyond the per-op tests (`--features device`; a HIP
//! device: a DCU, or hip-emu). Run on hip-emu (CI); not run on a GPU yet.
//!
//! - the deterministic backward kernels (encoder dwte/dwpe, bias gradient) launched directly on
//!   another block size and grid give the launchers' bits;
//! - f32 → bf16 stores round to nearest even (ties, overflow to inf, NaN, signed zero);
//! - clip's grad_scale from a NaN or infinite norm, with and without a loss scale.
#![cfg(feature = "device")]

mod device_common;

use device_common::{assert_close, bits, download, stream, tokens, up_i32, upload, Rng};
use hip_kernels::embedded::loader;
use hip_kernels::ops::{
    self, BiasBackward, BiasParams, ClipGradScale, ClipParams, DeviceElement, ElementwiseParams,
    EncoderBackward, EncoderParams, ResidualAdd,
};
use hip_kernels::params::{bf16, f16, DType, Host};
use hip_kernels::{cpu, tolerance::Rule};
use hip_rt::{DeviceBuffer, LaunchConfig, Stream};

fn launch_config(grid: (u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid: (grid.0, grid.1, 1),
        block: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The deterministic backward kernels launched directly on another block size and grid (64
/// threads; dwpe on one block of 192) give the launchers' bits: each sum runs in row order
/// whatever the launch shape. The kernels' signatures are those in kernels/encoder.hip and
/// kernels/bias.hip (hip-emu checks the argument sizes against the code object).
fn backward_under_another_grid<T: DeviceElement>(s: &Stream, seed: u64) {
    let mut rng = Rng(seed);
    let pack = 16 / std::mem::size_of::<T>();
    let dtype = T::DTYPE.name();
    let p = EncoderParams {
        batch: 3,
        seq: 100,
        channels: 40,
        vocab: 40,
        positions: 100,
        accumulate: true,
    };
    let rows = p.batch * p.seq;
    let tok = tokens(&mut rng, rows, p.vocab);
    let dout: Vec<T> = rng.vec(rows * p.channels, 1.0);
    let dwte0: Vec<T> = rng.vec(p.vocab * p.channels, 1.0);
    let dwpe0: Vec<T> = rng.vec(p.positions * p.channels, 1.0);
    let (dt, dd) = (up_i32(s, &tok), upload(s, &dout));
    let (mut te, mut pe) = (upload(s, &dwte0), upload(s, &dwpe0));
    ops::encoder_backward(
        s,
        EncoderBackward {
            params: p,
            tokens: &dt,
            dout: &dd,
            dwte: &mut te,
            dwpe: &mut pe,
            error: None,
        },
    )
    .unwrap();
    // next / first as encoder_links_i32 defines them, computed here.
    let next: Vec<i32> = (0..rows)
        .map(|r| {
            (r + 1..rows)
                .find(|&j| tok[j] == tok[r])
                .map_or(-1, |j| j as i32)
        })
        .collect();
    let first: Vec<i32> = (0..rows)
        .map(|r| i32::from(!tok[..r].contains(&tok[r])))
        .collect();
    let (dnext, dfirst) = (up_i32(s, &next), up_i32(s, &first));
    let (te2, pe2) = (upload(s, &dwte0), upload(s, &dwpe0));
    let dwte = loader::function(s.device(), "encoder", &format!("encoder_bwd_dwte_{dtype}"))
        .expect("encoder_bwd_dwte");
    let mut b = s.launch_builder(&dwte);
    b.value(dd.device_ptr())
        .value(dt.device_ptr())
        .value(dnext.device_ptr())
        .value(dfirst.device_ptr())
        .value(te2.device_ptr())
        .value(p.channels as i32);
    let slices = p.channels.div_ceil(64 * pack) as u32;
    // SAFETY: encoder_bwd_dwte_<T>(const T* dout, const int* tokens, const int* next, const
    // int* first, T* dwte, int C): dout holds rows·C, tokens/next/first rows, dwte V·C elements;
    // grid (rows, slices) × 64 threads covers every row and channel pack.
    unsafe { b.launch(&launch_config((rows as u32, slices), 64)) }.unwrap();
    let dwpe = loader::function(s.device(), "encoder", &format!("encoder_bwd_dwpe_{dtype}"))
        .expect("encoder_bwd_dwpe");
    let mut b = s.launch_builder(&dwpe);
    b.value(dd.device_ptr())
        .value(pe2.device_ptr())
        .value(p.batch as i64)
        .value(p.seq as i32)
        .value(p.channels as i32);
    // SAFETY: encoder_bwd_dwpe_<T>(const T* dout, T* dwpe, int64_t batch, int seq, int C):
    // dout holds batch·seq·C, dwpe seq·C elements; the kernel walks them grid-stride.
    unsafe { b.launch(&launch_config((1, 1), 192)) }.unwrap();
    assert!(
        bits(&download(s, &te)) == bits(&download(s, &te2)),
        "dwte {dtype}: not bit-identical under another grid"
    );
    assert!(
        bits(&download(s, &pe)) == bits(&download(s, &pe2)),
        "dwpe {dtype}: not bit-identical under another grid"
    );

    // bias_backward: the launcher's groups (they fix the sum order), 64-thread blocks.
    let (rows, cols) = (300usize, 130usize);
    let dout: Vec<T> = rng.vec(rows * cols, 1.0);
    let db0: Vec<T> = rng.vec(cols, 1.0);
    let dd = upload(s, &dout);
    let mut db = upload(s, &db0);
    let bp = BiasParams {
        rows,
        cols,
        accumulate: true,
    };
    ops::bias_backward(
        s,
        BiasBackward {
            params: bp,
            dout: &dd,
            dbias: &mut db,
        },
    )
    .unwrap();
    let plan = ops::BiasPlan::new(
        rows,
        cols,
        std::mem::size_of::<T>(),
        s.device().compute_units(),
    );
    let partial = DeviceBuffer::<f32>::alloc(s, plan.groups as usize * cols).unwrap();
    let db2 = upload(s, &db0);
    let f = loader::function(s.device(), "bias", &format!("bias_bwd_partial_{dtype}"))
        .expect("bias_bwd_partial");
    let mut b = s.launch_builder(&f);
    b.value(dd.device_ptr())
        .value(partial.device_ptr())
        .value(rows as i64)
        .value(cols as i32)
        .value(plan.rows_per_group as i64);
    let slices = cols.div_ceil(64 * pack) as u32;
    // SAFETY: bias_bwd_partial_<T>(const T* dout, float* partial, int64_t rows, int cols,
    // int64_t rows_per_group): dout holds rows·cols elements, partial groups·cols floats; grid
    // (slices, groups) × 64 threads covers every column pack and row group.
    unsafe { b.launch(&launch_config((slices, plan.groups as u32), 64)) }.unwrap();
    let f = loader::function(s.device(), "bias", &format!("bias_bwd_final_{dtype}"))
        .expect("bias_bwd_final");
    let mut b = s.launch_builder(&f);
    b.value(partial.device_ptr())
        .value(plan.groups as i64)
        .value(cols as i32)
        .value(db2.device_ptr())
        .value(1i32);
    // SAFETY: bias_bwd_final_<T>(const float* partial, int64_t groups, int cols, T* dbias, int
    // accumulate): partial holds groups·cols floats, dbias cols elements; one thread per column.
    unsafe { b.launch(&launch_config((cols.div_ceil(64) as u32, 1), 64)) }.unwrap();
    assert!(
        bits(&download(s, &db)) == bits(&download(s, &db2)),
        "dbias {dtype}: not bit-identical under another grid"
    );
}

#[test]
fn encoder_and_bias_backward_are_bit_identical_under_another_grid() {
    let s = stream();
    backward_under_another_grid::<f32>(&s, 200);
    backward_under_another_grid::<f16>(&s, 201);
    backward_under_another_grid::<bf16>(&s, 202);
}

/// residual_add in bf16: the f32 sums land on ties (1 + 2^-8 → 1, 1 + 3·2^-8 → 1 + 2^-6: to
/// even), just past a tie (rounds up), beyond bf16's range (inf), NaN and −0.
#[test]
fn bf16_stores_round_to_nearest_even() {
    let s = stream();
    let b16 = |bits: u16| bf16::from_bits(bits);
    let cases: [(u16, u16, u16); 7] = [
        (0x3f80, 0x3b80, 0x3f80), // 1 + 2^-8: a tie, to even
        (0x3f81, 0x3b80, 0x3f82), // (1 + 2^-7) + 2^-8: a tie, to even (up)
        (0x3f80, 0x3b81, 0x3f81), // just past the tie: up
        (0x7f7f, 0x7f7f, 0x7f80), // max + max: inf
        (0xff7f, 0xff7f, 0xff80), // -max - max: -inf
        (0x7fc0, 0x3f80, 0x7fc0), // NaN + 1: NaN
        (0x8000, 0x8000, 0x8000), // -0 + -0: -0
    ];
    let a: Vec<bf16> = cases.iter().map(|c| b16(c.0)).collect();
    let b: Vec<bf16> = cases.iter().map(|c| b16(c.1)).collect();
    let (da, db) = (upload(&s, &a), upload(&s, &b));
    let mut out = upload(&s, &vec![bf16::ZERO; cases.len()]);
    let params = ElementwiseParams { len: cases.len() };
    ops::residual_add(
        &s,
        ResidualAdd {
            params,
            a: &da,
            b: &db,
            out: &mut out,
        },
    )
    .unwrap();
    let got: Vec<u16> = download(&s, &out).iter().map(|x| x.to_bits()).collect();
    let want: Vec<u16> = cases.iter().map(|c| c.2).collect();
    assert_eq!(got, want, "device bits");
    let mut host = vec![bf16::ZERO; cases.len()];
    cpu::residual_add(ResidualAdd::<Host, bf16> {
        params,
        a: &a,
        b: &b,
        out: &mut host,
    })
    .unwrap();
    let host: Vec<u16> = host.iter().map(|x| x.to_bits()).collect();
    assert_eq!(host, want, "the CPU reference's bits");
}

/// grad_scale = loss_scale / min(1, max_norm / (norm / loss_scale + eps)): a NaN norm gives NaN,
/// an infinite one inf (the step is then skipped by the caller), finite ones clip or not.
#[test]
fn clip_grad_scale_from_non_finite_and_scaled_norms() {
    let s = stream();
    for (norm, loss_scale, max_norm) in [
        (7.25f32, None, 1.0f32),
        (0.5, None, 1.0),
        (65536.0 * 3.5, Some(65536.0f32), 2.0),
        (f32::NAN, None, 1.0),
        (f32::INFINITY, Some(1024.0), 1.0),
    ] {
        let params = ClipParams { max_norm };
        let dn = upload(&s, &[norm]);
        let ds = loss_scale.map(|v| upload(&s, &[v]));
        let mut gs = upload(&s, &[-1.0f32]);
        ops::clip_grad_scale(
            &s,
            ClipGradScale {
                params,
                norm: &dn,
                loss_scale: ds.as_ref().map(|b| b as _),
                grad_scale: &mut gs,
            },
        )
        .unwrap();
        let mut want = [0.0f32];
        let scale_host = loss_scale.map(|v| [v]);
        cpu::clip_grad_scale(ClipGradScale::<Host> {
            params,
            norm: &[norm],
            loss_scale: scale_host.as_ref().map(|v| &v[..]),
            grad_scale: &mut want,
        })
        .unwrap();
        let got = download(&s, &gs);
        assert_close(
            &format!("grad_scale, norm {norm} loss_scale {loss_scale:?}"),
            Rule::Reduction,
            DType::F32,
            1,
            &got,
            &want,
        );
        assert!(
            !norm.is_nan() || got[0].is_nan(),
            "a NaN norm gives a NaN grad_scale"
        );
        assert!(
            norm.is_finite() || norm.is_nan() || got[0] == f32::INFINITY,
            "an infinite norm gives inf: {got:?}"
        );
    }
}
