//! Rotary embedding forward and backward on host slices, f64 internally.

use super::Rope;
use crate::params::{DeviceElement, Host, ShapeError};

/// Rotate every pair of the view by `sign·pos·f_i` (f64 angle from the f32 table, f64 sin/cos,
/// one rounding per element).
fn rotate<T: DeviceElement>(a: Rope<'_, Host, T>, sign: f64) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    let half = p.pairs();
    for b in 0..p.batch {
        for t in 0..p.seq {
            let pos = f64::from(a.positions[b * p.seq + t]);
            let cs: Vec<(f64, f64)> = a
                .freqs
                .iter()
                .map(|&f| {
                    let angle = sign * pos * f64::from(f);
                    (angle.cos(), angle.sin())
                })
                .collect();
            for h in 0..p.heads {
                let row = a.layout.row(b, h, t);
                for (i, &(c, s)) in cs.iter().enumerate() {
                    let (j1, j2) = if p.interleaved {
                        (row + 2 * i, row + 2 * i + 1)
                    } else {
                        (row + i, row + half + i)
                    };
                    let (x1, x2) = (a.x[j1].to_f64(), a.x[j2].to_f64());
                    a.x[j1] = T::from_f64(x1 * c - x2 * s);
                    a.x[j2] = T::from_f64(x2 * c + x1 * s);
                }
            }
        }
    }
    Ok(())
}

/// [`Rope`] forward on host slices: each pair `(x1, x2)` of the first `rotary_dim` dims of every
/// row of the view becomes `(x1·cos a − x2·sin a, x2·cos a + x1·sin a)`, `a = pos·f_i`, computed
/// in f64 and rounded once; nothing else in `x` is touched.
pub fn rope_forward<T: DeviceElement>(a: Rope<'_, Host, T>) -> Result<(), ShapeError> {
    rotate(a, 1.0)
}

/// [`Rope`] backward on host slices: the gradient of a rotation is the rotation by `−a`, applied
/// in place to the gradient's view.
pub fn rope_backward<T: DeviceElement>(a: Rope<'_, Host, T>) -> Result<(), ShapeError> {
    rotate(a, -1.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{AttentionLayout, RopeParams};

    #[test]
    fn rotates_pairs_in_both_layouts_and_the_backward_undoes_it() {
        let p = RopeParams {
            batch: 1,
            seq: 2,
            heads: 1,
            head_dim: 6,
            rotary_dim: 4,
            interleaved: false,
        };
        let x0 = [
            1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 1.0, 0.0, 0.0, 0.0, 7.0, 8.0,
        ];
        let freqs = [0.5f32, 0.25];
        for interleaved in [false, true] {
            let mut x = x0;
            rope_forward(Rope::<Host, f32> {
                params: RopeParams { interleaved, ..p },
                x: &mut x,
                layout: AttentionLayout::packed(1, 2, 6),
                positions: &[3, 0],
                freqs: &freqs,
            })
            .unwrap();
            let (a0, a1) = (1.5f64, 0.75f64);
            let want: [f64; 4] = if interleaved {
                [
                    a0.cos() - 2.0 * a0.sin(),
                    2.0 * a0.cos() + a0.sin(),
                    3.0 * a1.cos() - 4.0 * a1.sin(),
                    4.0 * a1.cos() + 3.0 * a1.sin(),
                ]
            } else {
                [
                    a0.cos() - 3.0 * a0.sin(),
                    2.0 * a1.cos() - 4.0 * a1.sin(),
                    3.0 * a0.cos() + a0.sin(),
                    4.0 * a1.cos() + 2.0 * a1.sin(),
                ]
            };
            for (g, w) in x[..4].iter().zip(&want) {
                assert_eq!(*g, *w as f32, "one rounding of the f64 rotation");
            }
            assert_eq!(x[4..], x0[4..], "dims past R and position 0 are unchanged");
            rope_backward(Rope::<Host, f32> {
                params: RopeParams { interleaved, ..p },
                x: &mut x,
                layout: AttentionLayout::packed(1, 2, 6),
                positions: &[3, 0],
                freqs: &freqs,
            })
            .unwrap();
            for (g, w) in x.iter().zip(&x0) {
                assert!((g - w).abs() < 1e-6, "{x:?}");
            }
        }
    }
}
