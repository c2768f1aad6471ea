//! Storage element types shared by the CPU reference and the device launchers.

use half::{bf16, f16};

/// Storage type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (8-bit exponent, 7-bit mantissa).
    BF16,
}

impl DType {
    /// All supported storage types.
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
        }
    }

    /// Lower-case name, as used in kernel names (`<op>_<dtype>`): `f32`, `f16`, `bf16`.
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A storage element type: `f32`, `half::f16` or `half::bf16`.
///
/// Conversions from `f64` round to nearest-even through `f32` first (f64 → f32 → 16-bit), which is
/// exactly what PyTorch does when it casts float64 to float16/bfloat16 (c10 converts via float).
/// It differs from a single correctly rounded f64 → 16-bit conversion only when the f32 rounding
/// lands exactly on a 16-bit tie.
pub trait Element:
    Copy + Send + Sync + PartialEq + std::fmt::Debug + bytemuck::Pod + 'static
{
    /// The matching [`DType`].
    const DTYPE: DType;
    /// Exact widening to `f64`.
    fn to_f64(self) -> f64;
    /// Round-to-nearest-even narrowing from `f64` (via `f32`, as torch does).
    fn from_f64(v: f64) -> Self;
    /// Exact widening to `f32`.
    fn to_f32(self) -> f32;
    /// Round-to-nearest-even narrowing from `f32`.
    fn from_f32(v: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

/// `Element` for a `half` 16-bit type: exact widening, and narrowing from f64 through f32.
macro_rules! half_element {
    ($t:ident, $dtype:expr) => {
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn to_f64(self) -> f64 {
                $t::to_f64(self)
            }
            fn from_f64(v: f64) -> Self {
                $t::from_f32(v as f32)
            }
            fn to_f32(self) -> f32 {
                $t::to_f32(self)
            }
            fn from_f32(v: f32) -> Self {
                $t::from_f32(v)
            }
        }
    };
}

half_element!(f16, DType::F16);
half_element!(bf16, DType::BF16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_f64_rounds_like_torch_via_f32() {
        // Values torch casts to 1.0 (f64 → f32 → 16-bit), not to the next 16-bit value.
        assert_eq!(
            <bf16 as Element>::from_f64(1.0 + 2f64.powi(-8) + 2f64.powi(-30)).to_f64(),
            1.0
        );
        assert_eq!(
            <f16 as Element>::from_f64(1.0 + 2f64.powi(-11) + 2f64.powi(-40)).to_f64(),
            1.0
        );
        assert_eq!(
            <f16 as Element>::from_f64(1.0 + 3.0 * 2f64.powi(-11)).to_f64(),
            1.0 + 2f64.powi(-9)
        );
    }
}
