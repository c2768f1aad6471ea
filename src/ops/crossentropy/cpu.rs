//! Fused softmax + cross-entropy on the CPU, f64 internally.

use super::SoftmaxCrossEntropy;
use crate::params::{DeviceElement, Host, ShapeError};

/// Fused softmax + cross-entropy with mean reduction over the rows whose target is not
/// [`super::IGNORE_INDEX`]; returns that mean (f64, from the unrounded per-row losses) and
/// writes it (rounded) to `loss` when given.
///
/// Per row, in f64: `lse = max + ln Σ_{j<V} exp(x_j − max)` (stable for any finite logits),
/// `loss = lse − x[target]` (stored rounded to f32). With `dloss = Some(d)` and `n` counted rows,
/// the logits are overwritten by `dlogits_j = (exp(x_j − lse) − [j = target])·d/n` for `j < V`;
/// padded columns `V..Vp` are set to 0 and ignored rows are all 0.
///
/// When every row is ignored (or `rows = 0`), the mean is NaN, as PyTorch's `0/0` (the
/// gradient is then 0 everywhere, as PyTorch's). Lengths, `dloss` and every target are checked
/// before anything is written; `error` is not used.
pub fn softmax_cross_entropy<T: DeviceElement>(
    a: SoftmaxCrossEntropy<'_, Host, T>,
) -> Result<f64, ShapeError> {
    a.validate()?;
    let p = a.params;
    p.check_targets(a.targets)?;
    let (v, vp) = (p.vocab, p.padded_vocab);
    let counted = a
        .targets
        .iter()
        .filter(|&&t| t != super::IGNORE_INDEX)
        .count();
    let scale = p.dloss.map(|d| f64::from(d) / counted as f64);
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
    let mean = total / counted as f64;
    if let Some(l) = a.loss {
        l[0] = mean as f32;
    }
    Ok(mean)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::crossentropy::{CrossEntropyParams, IGNORE_INDEX};

    #[test]
    fn uniform_row_huge_logits_ignore_and_padding() {
        // Row 0: logits equal -> loss ln 3, p = 1/3. Row 1: ±1e4 -> loss ≈ 2e4 for the wrong
        // class. Row 2 ignored. Padding column 3 holds garbage and is zeroed.
        let s = CrossEntropyParams {
            rows: 3,
            vocab: 3,
            padded_vocab: 4,
            dloss: Some(2.0),
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
            },
            logits: &mut [0.0f32; 2],
            targets: &[0],
            losses: &mut [0.0],
            loss: None,
            error: None,
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("padded_vocab = 2 (vocab = 3)"),
            "{e}"
        );
    }
}
