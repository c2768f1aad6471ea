//! Fused softmax + cross-entropy on the CPU, f64 internally.

use super::{LinearCrossEntropy, SoftmaxCrossEntropy, IGNORE_INDEX};
use crate::cpu::{narrow, widen};
use crate::params::{DeviceElement, Host, ShapeError};

/// Fused softmax + cross-entropy reduced over the rows whose target is not
/// [`super::IGNORE_INDEX`]: returns their loss sum divided by the divisor (`n`: the
/// `params.divisor`, by default the count of counted rows, i.e. the mean; f64, from the
/// unrounded per-row losses) and writes it (rounded) to `loss` when given; adds the sum and
/// the count to `totals` when given.
///
/// Per row, in f64: `lse = max + ln Σ_{j<V} exp(x_j − max)` (stable for any finite logits),
/// `loss = lse − x[target]` (stored rounded to f32). With `dloss = Some(d)`, the logits are
/// overwritten by `dlogits_j = (exp(x_j − lse) − [j = target])·d/n` for `j < V`; padded columns
/// `V..Vp` are set to 0 and ignored rows are all 0.
///
/// When every row is ignored (or `rows = 0`) and no divisor is given, the mean is NaN, as
/// PyTorch's `0/0` (the gradient is then 0 everywhere, as PyTorch's). Lengths, `dloss`, the
/// divisor and every target are checked before anything is written; `error` is not used.
pub fn softmax_cross_entropy<T: DeviceElement>(
    a: SoftmaxCrossEntropy<'_, Host, T>,
) -> Result<f64, ShapeError> {
    a.validate()?;
    let p = a.params;
    p.check_targets(a.targets)?;
    let (v, vp) = (p.vocab, p.padded_vocab);
    let counted = a.targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
    let divisor = p.divisor.map_or(counted as f64, f64::from);
    let scale = p.dloss.map(|d| f64::from(d) / divisor);
    let mut total = 0.0f64;
    for ((row, &target), loss) in a
        .logits
        .chunks_mut(vp)
        .zip(a.targets)
        .zip(a.losses.iter_mut())
    {
        let Ok(target) = usize::try_from(target) else {
            // The ignore index (the only negative value that passed the check).
            *loss = 0.0;
            if scale.is_some() {
                row.fill(T::from_f64(0.0));
            }
            continue;
        };
        let x: Vec<f64> = row[..v].iter().map(|e| e.to_f64()).collect();
        let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + x.iter().map(|xj| (xj - max).exp()).sum::<f64>().ln();
        let l = lse - x[target];
        total += l;
        *loss = l as f32;
        if let Some(s) = scale {
            for (j, (d, xj)) in row.iter_mut().zip(&x).enumerate() {
                let onehot = if j == target { 1.0 } else { 0.0 };
                *d = T::from_f64(((xj - lse).exp() - onehot) * s);
            }
            row[v..].fill(T::from_f64(0.0));
        }
    }
    let mean = total / divisor;
    if let Some(l) = a.loss {
        l[0] = mean as f32;
    }
    if let Some(t) = a.totals {
        t[0] = (f64::from(t[0]) + total) as f32;
        t[1] = (f64::from(t[1]) + counted as f64) as f32;
    }
    Ok(mean)
}

/// [`LinearCrossEntropy`]: cross-entropy of `h·Wᵀ`, in f64 from the widened inputs with no
/// chunking and no intermediate rounding (the oracle of the chunked device op): the logits of a
/// row are exact f64 dot products, the loss and `dlogits` are
/// [`softmax_cross_entropy`]'s f64 values, `dh = dlogits·W` is rounded once, and `dweight` gets
/// `dweight + dlogitsᵀ·h` summed in f64 and rounded once. Returns the loss sum divided by the
/// divisor (the mean by default) and writes `losses`, `loss` and `totals` as
/// [`softmax_cross_entropy`] does. `params.chunk_rows` is checked but does not change the result;
/// `error` is not used (bad targets are an error, before anything is written).
pub fn linear_cross_entropy<T: DeviceElement>(
    a: LinearCrossEntropy<'_, Host, T>,
) -> Result<f64, ShapeError> {
    a.validate()?;
    let p = a.params;
    p.chunk_params(p.rows).check_targets(a.targets)?;
    let (c, v) = (p.dim, p.vocab);
    let h = widen(a.h);
    let w = widen(a.weight);
    let counted = a.targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
    let divisor = p.divisor.map_or(counted as f64, f64::from);
    let scale = p.dloss.map(|d| f64::from(d) / divisor);
    let mut dh = vec![0.0f64; if scale.is_some() { h.len() } else { 0 }];
    let mut dw = a.dweight.as_deref().map(widen);
    let mut total = 0.0f64;
    let mut x = vec![0.0f64; v];
    for (i, (&target, loss)) in a.targets.iter().zip(a.losses.iter_mut()).enumerate() {
        let Ok(target) = usize::try_from(target) else {
            *loss = 0.0; // ignored: no loss, zero gradient
            continue;
        };
        let hi = &h[i * c..(i + 1) * c];
        for (xj, wj) in x.iter_mut().zip(w.chunks_exact(c)) {
            *xj = hi.iter().zip(wj).map(|(a, b)| a * b).sum();
        }
        let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + x.iter().map(|xj| (xj - max).exp()).sum::<f64>().ln();
        let l = lse - x[target];
        total += l;
        *loss = l as f32;
        let Some(s) = scale else { continue };
        let dhi = &mut dh[i * c..(i + 1) * c];
        for (j, (xj, wj)) in x.iter().zip(w.chunks_exact(c)).enumerate() {
            let onehot = if j == target { 1.0 } else { 0.0 };
            let g = ((xj - lse).exp() - onehot) * s;
            for (d, wk) in dhi.iter_mut().zip(wj) {
                *d += g * wk;
            }
            if let Some(dw) = dw.as_mut() {
                for (d, hk) in dw[j * c..(j + 1) * c].iter_mut().zip(hi) {
                    *d += g * hk;
                }
            }
        }
    }
    if let Some(out) = a.dh {
        narrow(&dh, out);
    }
    if let (Some(out), Some(dw)) = (a.dweight, dw) {
        narrow(&dw, out);
    }
    let mean = total / divisor;
    if let Some(l) = a.loss {
        l[0] = mean as f32;
    }
    if let Some(t) = a.totals {
        t[0] = (f64::from(t[0]) + total) as f32;
        t[1] = (f64::from(t[1]) + counted as f64) as f32;
    }
    Ok(mean)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::crossentropy::{CrossEntropyParams, LinearCrossEntropyParams};

    #[test]
    fn uniform_row_huge_logits_ignore_and_padding() {
        // Row 0: logits equal -> loss ln 3, p = 1/3. Row 1: ±1e4 -> loss ≈ 2e4 for the wrong
        // class. Row 2 ignored. Padding column 3 holds garbage and is zeroed.
        let s = CrossEntropyParams {
            rows: 3,
            vocab: 3,
            padded_vocab: 4,
            dloss: Some(2.0),
            divisor: None,
        };
        let mut logits = [
            5.0f32, 5.0, 5.0, 99.0, 1e4, -1e4, 0.0, 99.0, 1.0, 2.0, 3.0, 99.0,
        ];
        let mut losses = [9.0f32; 3];
        let mean = softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
            params: s,
            logits: &mut logits,
            targets: &[1, 1, IGNORE_INDEX],
            losses: &mut losses,
            loss: None,
            totals: None,
            error: None,
        })
        .unwrap();
        let l0 = 3f64.ln();
        assert_eq!(losses, [l0 as f32, 2e4, 0.0]);
        assert_eq!(mean, (l0 + 2e4) / 2.0);
        // d/n = 1: row 0 = p − onehot = (1/3, −2/3, 1/3); row 1 = (1, −1, e^-1e4 ≈ 0).
        let third = (1.0f64 / 3.0) as f32;
        assert_eq!(
            logits,
            [
                third,
                (-2.0f64 / 3.0) as f32,
                third,
                0.0,
                1.0,
                -1.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0,
                0.0
            ]
        );
    }

    #[test]
    fn all_ignored_gives_nan_mean_and_zero_gradient() {
        let mut logits = [1.0f32, 2.0, 3.0, 4.0];
        let mut losses = [1.0f32; 2];
        let mean = softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
            params: CrossEntropyParams::new(2, 2),
            logits: &mut logits,
            targets: &[IGNORE_INDEX; 2],
            losses: &mut losses,
            loss: None,
            totals: None,
            error: None,
        })
        .unwrap();
        assert!(mean.is_nan());
        assert_eq!((logits, losses), ([0.0; 4], [0.0; 2]));
    }

    #[test]
    fn forward_only_leaves_logits_and_bad_targets_are_named() {
        let mut logits = [0.0f32, 0.0];
        let mut losses = [0.0f32];
        softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
            params: CrossEntropyParams {
                dloss: None,
                ..CrossEntropyParams::new(1, 2)
            },
            logits: &mut logits,
            targets: &[0],
            losses: &mut losses,
            loss: None,
            totals: None,
            error: None,
        })
        .unwrap();
        assert_eq!((logits, losses), ([0.0; 2], [2f64.ln() as f32]));
        for bad in [2, -1, -101] {
            let mut logits = [7.0f32; 4];
            let e = softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
                params: CrossEntropyParams::new(2, 2),
                logits: &mut logits,
                targets: &[0, bad],
                losses: &mut [0.0; 2],
                loss: None,
                totals: None,
                error: None,
            })
            .unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("`targets`[row = 1] = {bad}")),
                "{e}"
            );
            assert_eq!(logits, [7.0; 4]);
        }
        let e = softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
            params: CrossEntropyParams {
                rows: 1,
                vocab: 3,
                padded_vocab: 2,
                dloss: None,
                divisor: None,
            },
            logits: &mut [0.0f32; 2],
            targets: &[0],
            losses: &mut [0.0],
            loss: None,
            totals: None,
            error: None,
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("padded_vocab = 2 (vocab = 3)"),
            "{e}"
        );
    }

    #[test]
    fn a_divisor_scales_the_gradient_and_totals_accumulate() {
        // Two micro-batches of one step: 2 counted rows, then 1 counted + 1 ignored. With the
        // step's count (3) as divisor, the summed `loss` outputs are the step's mean and the
        // gradients are those of one call over all three rows.
        let x = [
            0.5f32, -1.0, 2.0, 0.0, 1.5, -0.5, 3.0, 1.0, -2.0, 0.25, 0.0, 4.0,
        ];
        let t = [2, 0, 1, IGNORE_INDEX];
        let whole = |x: &mut [f32], t: &[i32], rows| {
            let mut losses = vec![0.0f32; rows];
            softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
                params: CrossEntropyParams::new(rows, 3),
                logits: x,
                targets: t,
                losses: &mut losses,
                loss: None,
                totals: None,
                error: None,
            })
            .unwrap()
        };
        let mut all = x;
        let mean = whole(&mut all[..9], &t[..3], 3);
        let mut parts = x;
        let mut totals = [0.0f32; 2];
        let mut sum = 0.0;
        for (r, rows) in [(0, 2), (2, 2)] {
            let mut loss = [0.0f32];
            let part = softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
                params: CrossEntropyParams {
                    divisor: Some(3.0),
                    ..CrossEntropyParams::new(rows, 3)
                },
                logits: &mut parts[r * 3..(r + rows) * 3],
                targets: &t[r..r + rows],
                losses: &mut [0.0; 2],
                loss: Some(&mut loss),
                totals: Some(&mut totals),
                error: None,
            })
            .unwrap();
            assert_eq!(loss[0], part as f32);
            sum += part;
        }
        assert!((sum - mean).abs() < 1e-15, "{sum} vs {mean}");
        assert_eq!(&parts[..9], &all[..9]);
        assert_eq!(&parts[9..], &[0.0; 3]);
        assert_eq!(totals[1], 3.0);
        assert!(
            (f64::from(totals[0]) - 3.0 * mean).abs() < 1e-5,
            "{totals:?}"
        );
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let e = softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
                params: CrossEntropyParams {
                    divisor: Some(bad),
                    ..CrossEntropyParams::new(1, 3)
                },
                logits: &mut [0.0; 3],
                targets: &[0],
                losses: &mut [0.0],
                loss: None,
                totals: None,
                error: None,
            })
            .unwrap_err();
            assert!(e.to_string().contains("divisor"), "{e}");
        }
    }

    #[test]
    fn linear_matches_logits_then_crossentropy() {
        // h·Wᵀ written out, then the plain op: the fused reference must give the same losses,
        // and dh = dlogits·W, dW = dW0 + dlogitsᵀ·h by hand. Row 2 is ignored.
        let (n, c, v) = (3, 2, 3);
        let h = [1.0f32, -2.0, 0.5, 0.25, 3.0, 1.0];
        let w = [0.5f32, 1.0, -1.0, 0.0, 2.0, -0.5];
        let t = [2, 0, IGNORE_INDEX];
        let mut logits = vec![0.0f32; n * v];
        for i in 0..n {
            for j in 0..v {
                logits[i * v + j] = (0..c).map(|k| h[i * c + k] * w[j * c + k]).sum();
            }
        }
        let mut dl = logits.clone();
        let mut plain = [0.0f32; 3];
        let mean = softmax_cross_entropy(SoftmaxCrossEntropy::<Host, f32> {
            params: CrossEntropyParams {
                dloss: Some(0.5),
                ..CrossEntropyParams::new(n, v)
            },
            logits: &mut dl,
            targets: &t,
            losses: &mut plain,
            loss: None,
            totals: None,
            error: None,
        })
        .unwrap();
        let (mut dh, mut dw, mut losses) = ([0.0f32; 6], [1.0f32; 6], [0.0f32; 3]);
        let mut totals = [0.0f32; 2];
        let got = linear_cross_entropy(LinearCrossEntropy::<Host, f32> {
            params: LinearCrossEntropyParams {
                dloss: Some(0.5),
                chunk_rows: Some(1),
                ..LinearCrossEntropyParams::new(n, c, v)
            },
            h: &h,
            weight: &w,
            targets: &t,
            dh: Some(&mut dh),
            dweight: Some(&mut dw),
            losses: &mut losses,
            loss: None,
            totals: Some(&mut totals),
            error: None,
        })
        .unwrap();
        // Logits of dyadic inputs are exact in f32: the losses agree to the last bit.
        assert_eq!((got, losses), (mean, plain));
        assert_eq!(totals[1], 2.0);
        for i in 0..n {
            for k in 0..c {
                let want: f32 = (0..v).map(|j| dl[i * v + j] * w[j * c + k]).sum();
                assert!((dh[i * c + k] - want).abs() < 1e-6, "dh[{i}, {k}]");
            }
        }
        for j in 0..v {
            for k in 0..c {
                let want: f32 = 1.0 + (0..n).map(|i| dl[i * v + j] * h[i * c + k]).sum::<f32>();
                assert!((dw[j * c + k] - want).abs() < 1e-6, "dw[{j}, {k}]");
            }
        }
        assert_eq!(&dh[4..], &[0.0, 0.0]);
        // dh is required exactly with dloss; dweight needs dloss.
        let e = linear_cross_entropy(LinearCrossEntropy::<Host, f32> {
            params: LinearCrossEntropyParams::new(n, c, v),
            h: &h,
            weight: &w,
            targets: &t,
            dh: None,
            dweight: None,
            losses: &mut losses,
            loss: None,
            totals: None,
            error: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("dh = None"), "{e}");
    }
}
