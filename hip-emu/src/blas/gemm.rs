//! The GEMM every BLAS export runs: `D = alpha * op(A) * op(B) + beta * C` in column-major
//! storage (BLAS convention), batched with strides, on the CPU. Inputs are widened to the
//! compute type (f32 for the 32F compute types, f64 for 64F), products are accumulated in it,
//! and the result is rounded once to D's type (round to nearest even for f16/bf16). With
//! `beta == 0`, C is not read (a NaN in C does not leak into D), as BLAS specifies.

use half::{bf16, f16};

use crate::runtime::memory;

/// An element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    F16,
    Bf16,
    F32,
    F64,
}

impl Ty {
    pub fn bytes(self) -> usize {
        match self {
            Ty::F16 | Ty::Bf16 => 2,
            Ty::F32 => 4,
            Ty::F64 => 8,
        }
    }
}

/// The accumulation type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compute {
    F32,
    F64,
}

/// One matrix operand: address (device memory), type, leading dimension, batch stride.
#[derive(Debug, Clone, Copy)]
pub struct Operand {
    pub ptr: usize,
    pub ty: Ty,
    pub ld: usize,
    pub stride: i64,
}

/// A whole (batched) GEMM, validated by [`GemmCall::check`].
#[derive(Debug, Clone, Copy)]
pub struct GemmCall {
    pub trans_a: bool,
    pub trans_b: bool,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Operand,
    pub b: Operand,
    pub c: Operand,
    pub d: Operand,
    pub batch: usize,
    pub compute: Compute,
    pub alpha: f64,
    pub beta: f64,
}

/// Why a call is rejected: `(is a size error, message)`.
pub type Reject = (bool, String);

impl GemmCall {
    /// Check sizes, leading dimensions and that every operand lies inside live device memory.
    pub fn check(&self, name: &str) -> Result<(), Reject> {
        let size_err = |msg: String| (true, format!("{name}: {msg}"));
        let (a_rows, a_cols) = if self.trans_a {
            (self.k, self.m)
        } else {
            (self.m, self.k)
        };
        let (b_rows, b_cols) = if self.trans_b {
            (self.n, self.k)
        } else {
            (self.k, self.n)
        };
        for (what, ld, rows) in [
            ("lda", self.a.ld, a_rows),
            ("ldb", self.b.ld, b_rows),
            ("ldc", self.c.ld, self.m),
            ("ldd", self.d.ld, self.m),
        ] {
            if ld < rows.max(1) {
                return Err(size_err(format!(
                    "{what} = {ld} is less than the {rows} rows of its column-major operand"
                )));
            }
        }
        if self.m == 0 || self.n == 0 || self.batch == 0 {
            return Ok(());
        }
        let mut operands = vec![("D", self.d, self.m, self.n)];
        if self.k > 0 && self.alpha != 0.0 {
            operands.push(("A", self.a, a_rows, a_cols));
            operands.push(("B", self.b, b_rows, b_cols));
        }
        if self.beta != 0.0 {
            operands.push(("C", self.c, self.m, self.n));
        }
        for (what, op, rows, cols) in operands {
            let span = |batch_index: usize| -> Option<(usize, usize)> {
                let first = (op.stride as i128) * batch_index as i128;
                let elems = (cols as i128 - 1) * op.ld as i128 + rows as i128;
                let start = op.ptr as i128 + first * op.ty.bytes() as i128;
                let bytes = elems * op.ty.bytes() as i128;
                Some((usize::try_from(start).ok()?, usize::try_from(bytes).ok()?))
            };
            let mut ids = Vec::new();
            for idx in [0, self.batch - 1] {
                let (start, bytes) = span(idx).ok_or_else(|| {
                    (
                        false,
                        format!(
                            "{name}: operand {what} of batch {idx} has an address out of range"
                        ),
                    )
                })?;
                let alloc = memory::check_range(
                    start,
                    bytes,
                    &format!(
                        "{name}: operand {what} (batch {idx}, {rows}x{cols}, ld {})",
                        op.ld
                    ),
                )
                .map_err(|f| (false, f.message))?;
                ids.push(alloc.id);
            }
            // Batches in between lie between the first and the last: one allocation holds all.
            if ids[0] != ids[1] {
                return Err((false, format!("{name}: operand {what}'s first and last batch lie in different allocations")));
            }
        }
        Ok(())
    }

    /// Run it.
    ///
    /// # Safety
    /// [`GemmCall::check`] passed and the memory it checked is still live.
    pub unsafe fn run(&self) {
        for batch in 0..self.batch {
            // SAFETY: forwarded from the caller; every element read/written lies in the ranges
            // `check` verified (batch 0 and batch-1 bound the spans for a constant stride).
            unsafe { self.run_one(batch) };
        }
    }

    unsafe fn run_one(&self, batch: usize) {
        let (m, n, k) = (self.m, self.n, self.k);
        let base = |op: &Operand| {
            (op.ptr as i64 + op.stride * batch as i64 * op.ty.bytes() as i64) as usize
        };
        let (a0, b0, c0, d0) = (base(&self.a), base(&self.b), base(&self.c), base(&self.d));
        // op(A) as m rows of k contiguous values; op(B) as n columns of k values.
        let mut at = vec![0f64; m * k];
        let mut bt = vec![0f64; n * k];
        if self.alpha != 0.0 {
            for i in 0..m {
                for p in 0..k {
                    let idx = if self.trans_a {
                        p + i * self.a.ld
                    } else {
                        i + p * self.a.ld
                    };
                    // SAFETY: inside operand A (checked).
                    at[i * k + p] = unsafe { load(self.a.ty, a0, idx) };
                }
            }
            for j in 0..n {
                for p in 0..k {
                    let idx = if self.trans_b {
                        j + p * self.b.ld
                    } else {
                        p + j * self.b.ld
                    };
                    // SAFETY: inside operand B (checked).
                    bt[j * k + p] = unsafe { load(self.b.ty, b0, idx) };
                }
            }
        }
        for j in 0..n {
            for i in 0..m {
                let (arow, bcol) = (&at[i * k..(i + 1) * k], &bt[j * k..(j + 1) * k]);
                let out = match self.compute {
                    Compute::F32 => {
                        let mut acc = 0f32;
                        for (x, y) in arow.iter().zip(bcol) {
                            acc = (*x as f32).mul_add(*y as f32, acc);
                        }
                        let mut v = self.alpha as f32 * acc;
                        if self.beta != 0.0 {
                            // SAFETY: inside operand C (checked when beta != 0).
                            v += self.beta as f32
                                * unsafe { load(self.c.ty, c0, i + j * self.c.ld) } as f32;
                        }
                        f64::from(v)
                    }
                    Compute::F64 => {
                        let acc: f64 = arow.iter().zip(bcol).map(|(x, y)| x * y).sum();
                        let mut v = self.alpha * acc;
                        if self.beta != 0.0 {
                            // SAFETY: as above.
                            v += self.beta * unsafe { load(self.c.ty, c0, i + j * self.c.ld) };
                        }
                        v
                    }
                };
                // SAFETY: inside operand D (checked).
                unsafe { store(self.d.ty, d0, i + j * self.d.ld, out) };
            }
        }
    }
}

/// Element `idx` of type `ty` at `base`, widened.
///
/// # Safety
/// The element lies in readable memory.
pub unsafe fn load(ty: Ty, base: usize, idx: usize) -> f64 {
    let at = base + idx * ty.bytes();
    // SAFETY: per the contract; unaligned reads are used because BLAS allows any element offset.
    unsafe {
        match ty {
            Ty::F16 => f16::from_bits((at as *const u16).read_unaligned()).to_f64(),
            Ty::Bf16 => bf16::from_bits((at as *const u16).read_unaligned()).to_f64(),
            Ty::F32 => f64::from((at as *const f32).read_unaligned()),
            Ty::F64 => (at as *const f64).read_unaligned(),
        }
    }
}

/// Store `v` rounded to `ty` at element `idx` of `base`.
///
/// # Safety
/// The element lies in writable memory.
unsafe fn store(ty: Ty, base: usize, idx: usize, v: f64) {
    let at = base + idx * ty.bytes();
    // SAFETY: per the contract.
    unsafe {
        match ty {
            Ty::F16 => (at as *mut u16).write_unaligned(f16::from_f32(v as f32).to_bits()),
            Ty::Bf16 => (at as *mut u16).write_unaligned(bf16::from_f32(v as f32).to_bits()),
            Ty::F32 => (at as *mut f32).write_unaligned(v as f32),
            Ty::F64 => (at as *mut f64).write_unaligned(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::memory::{allocate, Owner};

    fn upload(values: &[f32]) -> usize {
        let a = allocate(values.len() * 4, Owner::Device(0)).unwrap();
        // SAFETY: the fresh allocation holds values.len() f32s.
        unsafe {
            std::ptr::copy_nonoverlapping(values.as_ptr(), a.start as *mut f32, values.len())
        };
        a.start
    }

    #[test]
    fn transposed_column_major_gemm_and_beta_zero_ignores_nan_c() {
        // A is 2x3 column-major: [[1,2,3],[4,5,6]]; op(A) = A (N). B^T stored: B is 3x2, stored
        // transposed as a 2x3 column-major matrix [[1,0,2],[0,1,3]] -> B = [[1,0],[0,1],[2,3]].
        let a = upload(&[1., 4., 2., 5., 3., 6.]);
        let b = upload(&[1., 0., 0., 1., 2., 3.]);
        let c = upload(&[f32::NAN; 4]);
        let op = |ptr, ld| Operand {
            ptr,
            ty: Ty::F32,
            ld,
            stride: 0,
        };
        let call = GemmCall {
            trans_a: false,
            trans_b: true,
            m: 2,
            n: 2,
            k: 3,
            a: op(a, 2),
            b: op(b, 2),
            c: op(c, 2),
            d: op(c, 2),
            batch: 1,
            compute: Compute::F32,
            alpha: 1.0,
            beta: 0.0,
        };
        call.check("t").unwrap();
        // SAFETY: check passed; the allocations are live.
        unsafe { call.run() };
        // A*B = [[1+6, 2+9], [4+12, 5+18]] = [[7, 11], [16, 23]], column-major.
        // SAFETY: c holds 4 f32s.
        let out = unsafe { std::slice::from_raw_parts(c as *const f32, 4) };
        assert_eq!(out, &[7., 16., 11., 23.]);
        let bad = GemmCall { k: 4, ..call };
        let (size, msg) = bad.check("hipblasGemmEx").unwrap_err();
        assert!(!size && msg.contains("operand A"), "{msg}");
        let (size, msg) = GemmCall {
            a: op(a, 1),
            ..call
        }
        .check("g")
        .unwrap_err();
        assert!(size && msg.contains("lda = 1"), "{msg}");
    }
}
