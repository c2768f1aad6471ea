//! Data types, reduction operators and the element-wise reduction, as RCCL defines them.
//!
//! Ranks are combined in rank order, `((x0 op x1) op x2) ...`, each step rounded to the element
//! type: RCCL stores partial results in the element type between the steps of its ring or
//! tree, so per-step rounding is what it does; the *order* of its steps depends on the
//! algorithm it picks and is not reproduced (float sums may differ from real RCCL in the last
//! bits; integer results and order-independent inputs are identical).
//!
//! * f16 and bf16 steps are computed in f32 and rounded to nearest even; f32 has more than
//!   2p+2 bits for both, so this equals the correctly rounded half-precision operation (RCCL's
//!   `__hadd`/`__hmul` for f16, its float round trip for bf16).
//! * Integers wrap (two's complement), as the device's integer arithmetic does.
//! * max/min of floats ignore a NaN operand (`fmaxf`/`fminf`).
//! * avg (NCCL >= 2.10): integers are summed (wrapping) and divided by nranks, truncating
//!   toward zero; floats are first multiplied by `1/nranks` rounded to the element type (the
//!   `PreMulSum` RCCL uses), then summed.

use half::{bf16, f16};

use super::{NcclResult, RcclFail};

/// `ncclDataType_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataType {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9,
}

impl DataType {
    pub const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
    ];

    pub fn from_raw(raw: u32) -> Result<DataType, RcclFail> {
        DataType::ALL.get(raw as usize).copied().ok_or_else(|| {
            RcclFail::new(
                NcclResult::INVALID_ARGUMENT,
                format!(
                    "data type {raw} is not an ncclDataType_t of the emulated RCCL (0..=9: \
                     int8, uint8, int32, uint32, int64, uint64, float16, float32, float64, \
                     bfloat16)"
                ),
            )
        })
    }

    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "float16",
            DataType::Float32 => "float32",
            DataType::Float64 => "float64",
            DataType::Bfloat16 => "bfloat16",
        }
    }
}

/// `ncclRedOp_t` (the built-in operators).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedOp {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4,
}

impl RedOp {
    pub const ALL: [RedOp; 5] = [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min, RedOp::Avg];

    pub fn from_raw(raw: u32) -> Result<RedOp, RcclFail> {
        RedOp::ALL.get(raw as usize).copied().ok_or_else(|| {
            RcclFail::new(
                NcclResult::INVALID_ARGUMENT,
                format!(
                    "reduction op {raw} is not a built-in ncclRedOp_t (0..=4: sum, prod, max, \
                     min, avg); the emulated RCCL has no user-defined operators"
                ),
            )
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
        }
    }
}

/// One element type's arithmetic.
trait Elem: Copy {
    fn combine(op: RedOp, a: Self, b: Self) -> Self;
    /// Applied to every input before combining (avg of floats: times 1/n).
    fn pre(op: RedOp, x: Self, nranks: usize) -> Self;
    /// Applied to the combined value (avg of integers: divided by n).
    fn post(op: RedOp, x: Self, nranks: usize) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn combine(op: RedOp, a: Self, b: Self) -> Self {
                match op {
                    RedOp::Sum | RedOp::Avg => a.wrapping_add(b),
                    RedOp::Prod => a.wrapping_mul(b),
                    RedOp::Max => a.max(b),
                    RedOp::Min => a.min(b),
                }
            }
            fn pre(_: RedOp, x: Self, _: usize) -> Self {
                x
            }
            fn post(op: RedOp, x: Self, nranks: usize) -> Self {
                match op {
                    // nranks <= 64 fits every integer type.
                    RedOp::Avg => x / (nranks as $t),
                    _ => x,
                }
            }
        }
    )*};
}
int_elem!(i8, u8, i32, u32, i64, u64);

macro_rules! float_elem {
    ($t:ty, $to:expr, $from:expr) => {
        impl Elem for $t {
            fn combine(op: RedOp, a: Self, b: Self) -> Self {
                let (x, y) = ($to(a), $to(b));
                $from(match op {
                    RedOp::Sum | RedOp::Avg => x + y,
                    RedOp::Prod => x * y,
                    RedOp::Max => x.max(y),
                    RedOp::Min => x.min(y),
                })
            }
            fn pre(op: RedOp, x: Self, nranks: usize) -> Self {
                match op {
                    RedOp::Avg => {
                        // RCCL: the scalar 1/n is computed in double, converted to float, then
                        // to the element type.
                        let scale: Self = $from((1.0f64 / nranks as f64) as f32);
                        $from($to(x) * $to(scale))
                    }
                    _ => x,
                }
            }
            fn post(_: RedOp, x: Self, _: usize) -> Self {
                x
            }
        }
    };
}
float_elem!(f16, f16::to_f32, f16::from_f32);
float_elem!(bf16, bf16::to_f32, bf16::from_f32);
float_elem!(f32, std::convert::identity, std::convert::identity);

impl Elem for f64 {
    fn combine(op: RedOp, a: Self, b: Self) -> Self {
        match op {
            RedOp::Sum | RedOp::Avg => a + b,
            RedOp::Prod => a * b,
            RedOp::Max => a.max(b),
            RedOp::Min => a.min(b),
        }
    }
    fn pre(op: RedOp, x: Self, nranks: usize) -> Self {
        match op {
            RedOp::Avg => x * (1.0 / nranks as f64),
            _ => x,
        }
    }
    fn post(_: RedOp, x: Self, _: usize) -> Self {
        x
    }
}

/// `out[i] = post(pre(in[0][i]) op pre(in[1][i]) op ...)` for `count` elements.
///
/// # Safety
/// Every `inputs[r]` is valid for reads of `count` elements of `T` and `out` for writes of
/// `count` (any alignment); `out` may alias an input only element for element (in place).
unsafe fn reduce_typed<T: Elem>(op: RedOp, inputs: &[*const u8], out: *mut u8, count: usize) {
    let n = inputs.len();
    for i in 0..count {
        // SAFETY: i < count: in bounds of every input per the contract; unaligned reads.
        let at = |r: usize| unsafe { inputs[r].cast::<T>().add(i).read_unaligned() };
        let mut acc = T::pre(op, at(0), n);
        for r in 1..n {
            acc = T::combine(op, acc, T::pre(op, at(r), n));
        }
        // SAFETY: i < count: in bounds of `out` per the contract; all reads of element i are
        // done, so an aliasing input is not read after this write.
        unsafe { out.cast::<T>().add(i).write_unaligned(T::post(op, acc, n)) };
    }
}

/// Reduce `inputs` (one pointer per rank, in rank order) into `out`, `count` elements of
/// `dtype`.
///
/// # Safety
/// Every `inputs[r]` is valid for reads of `count` elements of `dtype` and `out` for writes of
/// `count` (any alignment); `out` may alias an input only element for element (in place).
pub unsafe fn reduce(dtype: DataType, op: RedOp, inputs: &[*const u8], out: *mut u8, count: usize) {
    if inputs.is_empty() {
        return;
    }
    // SAFETY: forwarded contract, with T the Rust type of `dtype`.
    unsafe {
        match dtype {
            DataType::Int8 => reduce_typed::<i8>(op, inputs, out, count),
            DataType::Uint8 => reduce_typed::<u8>(op, inputs, out, count),
            DataType::Int32 => reduce_typed::<i32>(op, inputs, out, count),
            DataType::Uint32 => reduce_typed::<u32>(op, inputs, out, count),
            DataType::Int64 => reduce_typed::<i64>(op, inputs, out, count),
            DataType::Uint64 => reduce_typed::<u64>(op, inputs, out, count),
            DataType::Float16 => reduce_typed::<f16>(op, inputs, out, count),
            DataType::Float32 => reduce_typed::<f32>(op, inputs, out, count),
            DataType::Float64 => reduce_typed::<f64>(op, inputs, out, count),
            DataType::Bfloat16 => reduce_typed::<bf16>(op, inputs, out, count),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run<T: Copy + Default>(dtype: DataType, op: RedOp, ranks: &[Vec<T>]) -> Vec<T> {
        let count = ranks[0].len();
        let mut out = vec![T::default(); count];
        let inputs: Vec<*const u8> = ranks.iter().map(|v| v.as_ptr().cast()).collect();
        // SAFETY: every input and `out` hold `count` elements of T, T matches dtype.
        unsafe { reduce(dtype, op, &inputs, out.as_mut_ptr().cast(), count) };
        out
    }

    #[test]
    fn integers_wrap_and_avg_truncates_toward_zero() {
        let r = [vec![100i8, -7, 3], vec![100, -2, 5]];
        assert_eq!(run(DataType::Int8, RedOp::Sum, &r), vec![-56, -9, 8]);
        assert_eq!(run(DataType::Int8, RedOp::Avg, &r), vec![-28, -4, 4]);
        assert_eq!(run(DataType::Int8, RedOp::Max, &r), vec![100, -2, 5]);
        let u = [vec![u32::MAX, 7], vec![2, 6], vec![1, 1]];
        assert_eq!(run(DataType::Uint32, RedOp::Sum, &u), vec![2, 14]);
        assert_eq!(
            run(DataType::Uint32, RedOp::Prod, &u),
            vec![u32::MAX - 1, 42]
        );
        assert_eq!(run(DataType::Uint32, RedOp::Min, &u), vec![1, 1]);
    }

    #[test]
    fn half_types_round_every_step_and_avg_premultiplies() {
        let one = f16::from_f32(1.0);
        let tiny = f16::from_f32(0.0004); // below half an ulp of 1.0 in f16 (0.000488)
                                          // (1 + tiny) + tiny: each step rounds back to 1.0; a wide accumulator would not.
        let r = [vec![one], vec![tiny], vec![tiny]];
        assert_eq!(run(DataType::Float16, RedOp::Sum, &r), vec![one]);
        // avg over 3 ranks: each x times f16(1/3), then summed.
        let third = f16::from_f32((1.0f64 / 3.0) as f32);
        let x = vec![vec![f16::from_f32(3.0)]; 3];
        let want = {
            let p = f16::from_f32(3.0f32 * third.to_f32());
            f16::from_f32(f16::from_f32(p.to_f32() + p.to_f32()).to_f32() + p.to_f32())
        };
        assert_eq!(run(DataType::Float16, RedOp::Avg, &x), vec![want]);
        let b = [vec![bf16::from_f32(1.0)], vec![bf16::from_f32(0.003)]];
        assert_eq!(
            run(DataType::Bfloat16, RedOp::Sum, &b),
            vec![bf16::from_f32(1.0)]
        );
        let nan = [vec![f32::NAN], vec![2.0f32]];
        assert_eq!(run(DataType::Float32, RedOp::Max, &nan), vec![2.0]);
    }

    #[test]
    fn unknown_values_are_invalid_arguments() {
        assert_eq!(
            DataType::from_raw(10).unwrap_err().code,
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(
            RedOp::from_raw(5).unwrap_err().code,
            NcclResult::INVALID_ARGUMENT
        );
        assert_eq!(DataType::from_raw(9).unwrap().size(), 2);
    }
}
