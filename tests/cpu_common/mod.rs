//! Deterministic inputs for the CPU-reference tests and bench (no RNG crate is allowed).

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
