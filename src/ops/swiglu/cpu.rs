//! SwiGLU forward and backward on host slices, f64 internally.

use super::{GateUp, GateUpGrad, SwigluBackward, SwigluForward, SwigluParams};
use crate::cpu::narrow;
use crate::params::{DeviceElement, Host, ShapeError};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `(g, u)` of row `r`, column `j` as f64.
fn gate_up<T: DeviceElement>(
    input: &GateUp<'_, Host, T>,
    f: usize,
    r: usize,
    j: usize,
) -> (f64, f64) {
    match input {
        GateUp::Separate { gate, up } => (gate[r * f + j].to_f64(), up[r * f + j].to_f64()),
        GateUp::Fused { gate_up: x } => (x[r * 2 * f + j].to_f64(), x[r * 2 * f + f + j].to_f64()),
    }
}

/// [`SwigluForward`] on host slices: `h = silu(g)·u` in f64, rounded once.
pub fn swiglu_forward<T: DeviceElement>(a: SwigluForward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let SwigluParams { rows, ffn: f } = a.params;
    let h: Vec<f64> = (0..rows * f)
        .map(|i| {
            let (g, u) = gate_up(&a.input, f, i / f, i % f);
            g * sigmoid(g) * u
        })
        .collect();
    narrow(&h, a.h);
    Ok(())
}

/// [`SwigluBackward`] on host slices: `dg = dh·u·σ(g)·(1 + g·(1 − σ(g)))`, `du = dh·silu(g)` in
/// f64, each rounded once, written in the layout of `grad`.
pub fn swiglu_backward<T: DeviceElement>(a: SwigluBackward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let SwigluParams { rows, ffn: f } = a.params;
    let (mut dg, mut du) = (vec![0.0; rows * f], vec![0.0; rows * f]);
    for i in 0..rows * f {
        let (g, u) = gate_up(&a.input, f, i / f, i % f);
        let (dh, s) = (a.dh[i].to_f64(), sigmoid(g));
        dg[i] = dh * u * s * (1.0 + g * (1.0 - s));
        du[i] = dh * g * s;
    }
    match a.grad {
        GateUpGrad::Separate { dgate, dup } => {
            narrow(&dg, dgate);
            narrow(&du, dup);
        }
        GateUpGrad::Fused { dgate_up: out } => {
            if f > 0 {
                for ((row, g), u) in out
                    .chunks_exact_mut(2 * f)
                    .zip(dg.chunks_exact(f))
                    .zip(du.chunks_exact(f))
                {
                    narrow(g, &mut row[..f]);
                    narrow(u, &mut row[f..]);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_and_separate_layouts_agree_and_match_the_definition() {
        let (rows, f) = (2, 3);
        let g = [-2.0f32, -0.5, 0.0, 0.5, 1.0, 3.0];
        let u = [1.0f32, 2.0, -1.0, 0.25, -3.0, 0.5];
        let dh = [0.5f32, -1.0, 2.0, 1.5, 0.25, -0.75];
        let fused: Vec<f32> = (0..rows)
            .flat_map(|r| {
                g[r * f..(r + 1) * f]
                    .iter()
                    .chain(&u[r * f..(r + 1) * f])
                    .copied()
            })
            .collect();
        let p = SwigluParams { rows, ffn: f };
        let (mut h1, mut h2) = ([0.0f32; 6], [0.0f32; 6]);
        swiglu_forward(SwigluForward::<Host, f32> {
            params: p,
            input: GateUp::Separate { gate: &g, up: &u },
            h: &mut h1,
        })
        .unwrap();
        swiglu_forward(SwigluForward::<Host, f32> {
            params: p,
            input: GateUp::Fused { gate_up: &fused },
            h: &mut h2,
        })
        .unwrap();
        assert_eq!(h1, h2);
        for i in 0..6 {
            let (gv, uv) = (f64::from(g[i]), f64::from(u[i]));
            assert_eq!(h1[i], (gv / (1.0 + (-gv).exp()) * uv) as f32);
        }
        let (mut dg, mut du, mut dgu) = ([f32::NAN; 6], [f32::NAN; 6], [f32::NAN; 12]);
        swiglu_backward(SwigluBackward::<Host, f32> {
            params: p,
            input: GateUp::Separate { gate: &g, up: &u },
            dh: &dh,
            grad: GateUpGrad::Separate {
                dgate: &mut dg,
                dup: &mut du,
            },
        })
        .unwrap();
        swiglu_backward(SwigluBackward::<Host, f32> {
            params: p,
            input: GateUp::Fused { gate_up: &fused },
            dh: &dh,
            grad: GateUpGrad::Fused { dgate_up: &mut dgu },
        })
        .unwrap();
        for r in 0..rows {
            assert_eq!(&dgu[r * 6..r * 6 + 3], &dg[r * 3..r * 3 + 3]);
            assert_eq!(&dgu[r * 6 + 3..r * 6 + 6], &du[r * 3..r * 3 + 3]);
        }
        // Central differences of h·dh in g and u.
        let hsum = |g: f64, u: f64| g / (1.0 + (-g).exp()) * u;
        for i in 0..6 {
            let (gv, uv, d) = (f64::from(g[i]), f64::from(u[i]), f64::from(dh[i]));
            let e = 1e-6;
            let fd_g = d * (hsum(gv + e, uv) - hsum(gv - e, uv)) / (2.0 * e);
            let fd_u = d * (hsum(gv, uv + e) - hsum(gv, uv - e)) / (2.0 * e);
            assert!((f64::from(dg[i]) - fd_g).abs() < 1e-6, "dg[{i}]");
            assert!((f64::from(du[i]) - fd_u).abs() < 1e-6, "du[{i}]");
        }
    }
}
