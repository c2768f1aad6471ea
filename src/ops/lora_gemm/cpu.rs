//! The LoRA adapter's products on the CPU: f64 sums of the exact inputs, one rounding per
//! stored value. `u` (forward) and `du` (backward) are rounded to T before they are used, as the
//! device stores and then reads them.

use super::{LoraBackward, LoraForward};
use crate::params::{DeviceElement, Host, ShapeError};

fn wide<T: DeviceElement>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Rows `0..rows` of `cols` elements, `ld` apart, packed and widened (a validated `dy`).
fn wide_rows<T: DeviceElement>(v: &[T], rows: usize, cols: usize, ld: usize) -> Vec<f64> {
    (0..rows)
        .flat_map(|n| v[n * ld..n * ld + cols].iter().map(|x| x.to_f64()))
        .collect()
}

/// `out[n, j] = alpha · Σ_c x[n, c]·w(c, j)` for `n < rows`, `j < rank`, `c < k`, in f64.
fn down(
    x: &[f64],
    w: impl Fn(usize, usize) -> f64,
    rows: usize,
    k: usize,
    rank: usize,
    alpha: f64,
) -> Vec<f64> {
    let mut out = vec![0.0; rows * rank];
    for n in 0..rows {
        let xr = &x[n * k..(n + 1) * k];
        for j in 0..rank {
            out[n * rank + j] =
                alpha * xr.iter().enumerate().map(|(c, v)| v * w(c, j)).sum::<f64>();
        }
    }
    out
}

/// [`LoraForward`]: `u = x·Aᵀ` (rounded to T), `y += scale·u·Bᵀ` (one rounding of the sum;
/// `y`'s rows [`crate::ops::lora_gemm::LoraParams::ldy`] apart).
pub fn lora_forward<T: DeviceElement>(a: LoraForward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    let (rows, din, dout, r) = (p.rows, p.d_in, p.d_out, p.rank);
    let (x, wa, wb) = (wide(a.x), wide(a.a), wide(a.b));
    let u = down(&x, |c, j| wa[j * din + c], rows, din, r, 1.0);
    for (d, v) in a.u.iter_mut().zip(&u) {
        *d = T::from_f64(*v);
    }
    let u = wide(a.u);
    let s = f64::from(p.scale);
    let ld = p.row_stride();
    for n in 0..rows {
        for c in 0..dout {
            let sum: f64 = (0..r).map(|j| u[n * r + j] * wb[c * r + j]).sum();
            let y = &mut a.y[n * ld + c];
            *y = T::from_f64(y.to_f64() + s * sum);
        }
    }
    Ok(())
}

/// [`LoraBackward`]: `du = scale·dy·B` (rounded to T), `db (+)= scale·dyᵀ·u`,
/// `da (+)= duᵀ·x`, `dx += du·A`, each output rounded once (`dy`'s rows
/// [`crate::ops::lora_gemm::LoraParams::ldy`] apart).
pub fn lora_backward<T: DeviceElement>(a: LoraBackward<'_, Host, T>) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    let (rows, din, dout, r) = (p.rows, p.d_in, p.d_out, p.rank);
    let s = f64::from(p.scale);
    let dy = wide_rows(a.dy, rows, dout, p.row_stride());
    let (x, wa, wb, u) = (wide(a.x), wide(a.a), wide(a.b), wide(a.u));
    let du = down(&dy, |c, j| wb[c * r + j], rows, dout, r, s);
    for (d, v) in a.du.iter_mut().zip(&du) {
        *d = T::from_f64(*v);
    }
    let du = wide(a.du);
    let old = |v: &T| if p.accumulate { v.to_f64() } else { 0.0 };
    // dB[c, j] = s · Σ_n dy[n, c]·u[n, j].
    for c in 0..dout {
        for j in 0..r {
            let sum: f64 = (0..rows).map(|n| dy[n * dout + c] * u[n * r + j]).sum();
            let g = &mut a.db[c * r + j];
            *g = T::from_f64(old(g) + s * sum);
        }
    }
    // dA[j, c] = Σ_n du[n, j]·x[n, c].
    for j in 0..r {
        for c in 0..din {
            let sum: f64 = (0..rows).map(|n| du[n * r + j] * x[n * din + c]).sum();
            let g = &mut a.da[j * din + c];
            *g = T::from_f64(old(g) + sum);
        }
    }
    // dx[n, c] += Σ_j du[n, j]·A[j, c].
    for n in 0..rows {
        for c in 0..din {
            let sum: f64 = (0..r).map(|j| du[n * r + j] * wa[j * din + c]).sum();
            let d = &mut a.dx[n * din + c];
            *d = T::from_f64(d.to_f64() + sum);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::lora_gemm::LoraParams;

    #[test]
    fn forward_and_backward_by_hand() {
        // rows 1, d_in 2, d_out 2, rank 1, scale 2.
        let p = LoraParams::new(1, 2, 2, 1, 2.0);
        let (x, a, b) = ([1.0f32, 2.0], [3.0f32, -1.0], [0.5f32, 4.0]);
        let (mut u, mut y) = ([9.0f32], [10.0f32, 20.0]);
        lora_forward(LoraForward::<Host, f32> {
            params: p,
            x: &x,
            a: &a,
            b: &b,
            u: &mut u,
            y: &mut y,
        })
        .unwrap();
        // u = 1·3 + 2·(−1) = 1; y += 2·1·[0.5, 4].
        assert_eq!((u, y), ([1.0], [11.0, 28.0]));
        let dy = [1.0f32, -1.0];
        let (mut du, mut da, mut db, mut dx) =
            ([0f32], [1.0f32, 1.0], [1.0f32, 1.0], [5.0f32, 5.0]);
        lora_backward(LoraBackward::<Host, f32> {
            params: p.accumulating(),
            x: &x,
            dy: &dy,
            a: &a,
            b: &b,
            u: &u,
            du: &mut du,
            da: &mut da,
            db: &mut db,
            dx: &mut dx,
        })
        .unwrap();
        // du = 2·(1·0.5 − 1·4) = −7; db += 2·dyᵀ·u = [2, −2]; da += du·x = [−7, −14];
        // dx += du·A = [−21, 7].
        assert_eq!(du, [-7.0]);
        assert_eq!(db, [3.0, -1.0]);
        assert_eq!(da, [-6.0, -13.0]);
        assert_eq!(dx, [-16.0, 12.0]);
    }

    #[test]
    fn a_strided_output_block_is_the_packed_one_in_place() {
        // rows 2, d_in 2, d_out 2, rank 1 inside rows of 5: columns 1..3 of each row.
        let p = LoraParams::new(2, 2, 2, 1, 2.0);
        let (x, a, b) = ([1.0f32, 2.0, -1.0, 0.5], [3.0f32, -1.0], [0.5f32, 4.0]);
        let mut u = [0f32; 2];
        let mut packed = [10.0f32, 20.0, 30.0, 40.0];
        let fwd = |p: LoraParams, u: &mut [f32], y: &mut [f32]| {
            lora_forward(LoraForward::<Host, f32> {
                params: p,
                x: &x,
                a: &a,
                b: &b,
                u,
                y,
            })
        };
        fwd(p, &mut u, &mut packed).unwrap();
        // A view from column 1 of a [2, 5] tensor: 9 elements, rows 5 apart.
        let mut wide = [0f32, 10.0, 20.0, 7.0, 7.0, 7.0, 30.0, 40.0, 7.0, 7.0];
        fwd(p.strided(5), &mut u, &mut wide[1..]).unwrap();
        assert_eq!(
            wide,
            [0.0, packed[0], packed[1], 7.0, 7.0, 7.0, packed[2], packed[3], 7.0, 7.0]
        );
        // Too short a view, too small a stride: errors naming them.
        let e = fwd(p.strided(5), &mut u, &mut wide[4..]).unwrap_err();
        assert!(e.to_string().contains("reach 7"), "{e}");
        let e = fwd(p.strided(1), &mut u, &mut wide[1..]).unwrap_err();
        assert!(e.to_string().contains("ldy"), "{e}");
        // The backward reads dy through the same stride.
        let dy_packed = [1.0f32, -1.0, 0.25, 2.0];
        let dy_wide = [9.0f32, 1.0, -1.0, 9.0, 9.0, 9.0, 0.25, 2.0, 9.0];
        let bwd = |p: LoraParams, dy: &[f32]| {
            let (mut du, mut da, mut db, mut dx) = ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 4]);
            lora_backward(LoraBackward::<Host, f32> {
                params: p,
                x: &x,
                dy,
                a: &a,
                b: &b,
                u: &u,
                du: &mut du,
                da: &mut da,
                db: &mut db,
                dx: &mut dx,
            })
            .unwrap();
            (du, da, db, dx)
        };
        assert_eq!(bwd(p, &dy_packed), bwd(p.strided(5), &dy_wide[1..]));
    }
}
