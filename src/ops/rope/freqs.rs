//! The rotary frequency table, computed once per model on the host.

use super::RopeParams;
use crate::params::{invalid, ShapeError};

/// How the base frequencies `θ^(−2i/R)` are rescaled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// None (`rope_type` `default`).
    Default,
    /// Llama 3.x's (`rope_type` `llama3`), exactly as transformers'
    /// `_compute_llama3_parameters`: wavelengths `2π/f` above `original / low_freq_factor`
    /// divide `f` by `factor`, those below `original / high_freq_factor` keep it, the band
    /// between interpolates with `s = (original/wavelen − low) / (high − low)`:
    /// `(1 − s)·f/factor + s·f`.
    Llama3 {
        /// `factor` (8 for Llama 3.1).
        factor: f64,
        /// `low_freq_factor` (1).
        low_freq_factor: f64,
        /// `high_freq_factor` (4).
        high_freq_factor: f64,
        /// `original_max_position_embeddings` (8192).
        original_max_position_embeddings: f64,
    },
}

/// The `rotary_dim / 2` frequencies `f_i = θ^(−2i/R)` (then `scaling`), computed in f64 and
/// rounded once to f32: the table [`super::Rope::freqs`] takes. Bad values (θ ≤ 0, an odd or
/// zero `rotary_dim`, llama3 factors that are not positive or `high ≤ low`) are errors naming
/// them.
pub fn rope_frequencies(
    theta: f64,
    rotary_dim: usize,
    scaling: RopeScaling,
) -> Result<Vec<f32>, ShapeError> {
    let op = RopeParams::OP;
    if !(theta.is_finite() && theta > 0.0) {
        return Err(invalid(op, "theta", theta, "must be finite and positive"));
    }
    if rotary_dim < 2 || rotary_dim % 2 != 0 {
        return Err(invalid(
            op,
            "rotary_dim",
            rotary_dim,
            "must be even and at least 2",
        ));
    }
    let base = (0..rotary_dim / 2).map(|i| 1.0 / theta.powf((2 * i) as f64 / rotary_dim as f64));
    let table: Vec<f64> = match scaling {
        RopeScaling::Default => base.collect(),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor: low,
            high_freq_factor: high,
            original_max_position_embeddings: old,
        } => {
            for (name, v) in [
                ("factor", factor),
                ("low_freq_factor", low),
                ("original_max_position_embeddings", old),
            ] {
                if !(v.is_finite() && v > 0.0) {
                    return Err(invalid(op, name, v, "must be finite and positive"));
                }
            }
            if !(high.is_finite() && high > low) {
                return Err(invalid(
                    op,
                    "high_freq_factor",
                    high,
                    "must be finite and above low_freq_factor",
                ));
            }
            let (low_wavelen, high_wavelen) = (old / low, old / high);
            base.map(|f| {
                let wavelen = 2.0 * std::f64::consts::PI / f;
                if wavelen > low_wavelen {
                    f / factor
                } else if wavelen < high_wavelen {
                    f
                } else {
                    let s = (old / wavelen - low) / (high - low);
                    (1.0 - s) * f / factor + s * f
                }
            })
            .collect()
        }
    };
    Ok(table.iter().map(|&f| f as f32).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_table_is_theta_to_the_minus_two_i_over_r() {
        let t = rope_frequencies(10000.0, 8, RopeScaling::Default).unwrap();
        assert_eq!(t, [1.0, 0.1, 0.01, 0.001]);
    }

    #[test]
    fn llama3_divides_low_frequencies_and_keeps_high_ones() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let (d, l) = (
            rope_frequencies(500000.0, 128, RopeScaling::Default).unwrap(),
            rope_frequencies(500000.0, 128, s).unwrap(),
        );
        assert_eq!(l[0], d[0], "wavelength 2π: high frequency, unchanged");
        assert_eq!(
            l[63],
            (f64::from(d[63]) / 8.0) as f32,
            "longest wavelength: divided"
        );
        let mid = (0..64)
            .filter(|&i| l[i] != d[i] && (f64::from(l[i]) - f64::from(d[i]) / 8.0).abs() > 1e-12);
        assert!(mid.count() > 0, "some band in between is interpolated");
    }

    #[test]
    fn bad_values_are_named() {
        let e = rope_frequencies(0.0, 8, RopeScaling::Default).unwrap_err();
        assert!(e.to_string().contains("theta = 0"), "{e}");
        let e = rope_frequencies(1e4, 7, RopeScaling::Default).unwrap_err();
        assert!(e.to_string().contains("rotary_dim = 7"), "{e}");
        let e = rope_frequencies(
            1e4,
            8,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 4.0,
                high_freq_factor: 1.0,
                original_max_position_embeddings: 8192.0,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("high_freq_factor = 1"), "{e}");
    }
}
