//! Deterministic inputs for the CPU-reference tests and bench (no RNG crate is allowed).
//! Included by several test crates and by `benches/cpu_reference.rs`; each uses a subset.
#![allow(dead_code)]

use hip_kernels::cpu;
use hip_kernels::ops::{LayerNormBackward, LayerNormForward, LayerNormParams};
use hip_kernels::params::{DeviceElement, Element, Host, ShapeError};

/// A small deterministic generator of N(0, 1) values (SplitMix64 + Box–Muller).
pub struct Normal(u64);

impl Normal {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Normal(seed)
    }

    fn uniform(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// One N(0, 1) draw.
    pub fn sample(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }

    /// `n` draws.
    pub fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.sample()).collect()
    }
}

/// Round each f64 once to the storage type `T`.
pub fn cast<T: Element>(x: &[f64]) -> Vec<T> {
    x.iter().map(|&v| T::from_f64(v)).collect()
}

/// Random layer-norm inputs in storage type `T` and zeroed output buffers for one shape.
pub struct LayerNormData<T> {
    pub x: Vec<T>,
    pub weight: Vec<T>,
    pub bias: Vec<T>,
    pub dy: Vec<T>,
    pub y: Vec<T>,
    pub mean: Vec<f32>,
    pub rstd: Vec<f32>,
    pub dx: Vec<T>,
    pub dweight: Vec<T>,
    pub dbias: Vec<T>,
}

impl<T: DeviceElement> LayerNormData<T> {
    /// N(0, 1) `x`, `weight`, `bias`, `dy` (drawn in that order) rounded to `T`.
    pub fn random(rng: &mut Normal, s: &LayerNormParams) -> Self {
        let n = s.rows * s.cols;
        let zero = T::from_f64(0.0);
        LayerNormData {
            x: cast(&rng.vec(n)),
            weight: cast(&rng.vec(s.cols)),
            bias: cast(&rng.vec(s.cols)),
            dy: cast(&rng.vec(n)),
            y: vec![zero; n],
            mean: vec![0.0; s.rows],
            rstd: vec![0.0; s.rows],
            dx: vec![zero; n],
            dweight: vec![zero; s.cols],
            dbias: vec![zero; s.cols],
        }
    }

    /// `cpu::layernorm_forward` from `x`, `weight`, `bias` into `y`, `mean`, `rstd` (eps from `s`).
    pub fn forward(&mut self, s: &LayerNormParams) -> Result<(), ShapeError> {
        cpu::layernorm_forward(LayerNormForward::<Host, T> {
            params: *s,
            x: &self.x,
            weight: &self.weight,
            bias: &self.bias,
            y: &mut self.y,
            mean: &mut self.mean,
            rstd: &mut self.rstd,
        })
    }

    /// `cpu::layernorm_backward` from the saved `mean`, `rstd` into `dx`, `dweight`, `dbias`.
    pub fn backward(&mut self, s: &LayerNormParams) -> Result<(), ShapeError> {
        cpu::layernorm_backward(LayerNormBackward::<Host, T> {
            params: *s,
            x: &self.x,
            weight: &self.weight,
            dy: &self.dy,
            mean: &self.mean,
            rstd: &self.rstd,
            dx: &mut self.dx,
            dweight: &mut self.dweight,
            dbias: &mut self.dbias,
            accumulate: false,
        })
    }
}
