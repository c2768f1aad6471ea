//! The GEMM implementations the tuner chooses between. Each is one [`Candidate`] entry of
//! [`candidates`]: a name (written to the results file), when it applies, and how it runs.
//! Adding an implementation (a matrix-core kernel, say) is one more line in that list.

use hip_rt::memory::buffer::{DeviceView, DeviceViewMut};
use hip_rt::{Blas, Stream};

use crate::ops::launch::ptr;
use crate::ops::lora_gemm::{skinny_applies, skinny_matmul};
use crate::ops::matmul::{
    arch_has_matrix_cores, device::launch_gemm_tiled, MatmulKernel, MatmulLayout, MatmulParams,
    MatmulTile,
};
use crate::ops::OpError;
use crate::params::{DType, DeviceElement};

/// What decides whether a candidate can run a call.
pub(crate) struct Applicability<'a> {
    /// The call's shape.
    pub params: &'a MatmulParams,
    /// hipBLAS (or rocBLAS) is loaded on the stream's device.
    pub has_blas: bool,
    /// The device's arch (`gfx906`, `gfx90a:sramecc+:xnack-`): for candidates that need
    /// matrix units.
    pub arch: &'a str,
}

/// Where a candidate runs: the stream and, when loaded, the BLAS handle of its device.
pub(crate) struct Context<'a> {
    pub stream: &'a Stream,
    pub blas: Option<&'a Blas>,
}

/// Runs `out = alpha·op(a)·op(b) + beta·out` for `params` (already validated).
pub(crate) type RunFn<T> = fn(
    &Context<'_>,
    &MatmulParams,
    &dyn DeviceView<T>,
    &dyn DeviceView<T>,
    &mut dyn DeviceViewMut<T>,
) -> Result<(), OpError>;

/// One GEMM implementation.
pub(crate) struct Candidate<T: DeviceElement> {
    /// Name in the results file (letters, digits and `-`).
    pub name: &'static str,
    /// Whether it can run this call at all.
    pub applies: fn(&Applicability<'_>) -> bool,
    /// Queue the GEMM.
    pub run: RunFn<T>,
}

impl<T: DeviceElement> Candidate<T> {
    const fn new(
        name: &'static str,
        applies: fn(&Applicability<'_>) -> bool,
        run: RunFn<T>,
    ) -> Self {
        Candidate { name, applies, run }
    }
}

/// Every candidate, in the order they are tried. The first that applies and succeeds is the
/// reference the others' results are checked against. One line per candidate.
pub(crate) fn candidates<T: DeviceElement>() -> Vec<Candidate<T>> {
    vec![
        Candidate::new("hipk-big", |_| true, ours_big::<T>),
        Candidate::new("hipk-small", |_| true, ours_small::<T>),
        Candidate::new("hipblas", blas_applies, hipblas::<T>),
        Candidate::new("hipk-mc", |c| mc_applies(T::DTYPE, c), ours_mc::<T>),
        Candidate::new(
            "hipk-skinny",
            |c| skinny_applies(c.params),
            ours_skinny::<T>,
        ),
    ]
}

/// The candidate called `name`, if this build has it.
pub(crate) fn by_name<T: DeviceElement>(name: &str) -> Option<Candidate<T>> {
    candidates::<T>().into_iter().find(|c| c.name == name)
}

/// Our kernel family `kernel`, with the plain kernel's tile forced when `tile` is given.
fn ours<T: DeviceElement>(
    (kernel, tile): (MatmulKernel, Option<MatmulTile>),
    cx: &Context<'_>,
    params: &MatmulParams,
    a: &dyn DeviceView<T>,
    b: &dyn DeviceView<T>,
    out: &mut dyn DeviceViewMut<T>,
) -> Result<(), OpError> {
    let s = cx.stream;
    let ptrs = [ptr(s, "a", a)?, ptr(s, "b", b)?, ptr(s, "out", &*out)?];
    launch_gemm_tiled::<T>(s, params, ptrs, None, kernel, tile)
}

/// The matrix-core kernel: f16/bf16 on an arch with a 16x16x16 matrix unit.
fn mc_applies(dtype: DType, c: &Applicability<'_>) -> bool {
    dtype != DType::F32 && arch_has_matrix_cores(c.arch)
}

fn ours_mc<T: DeviceElement>(
    cx: &Context<'_>,
    params: &MatmulParams,
    a: &dyn DeviceView<T>,
    b: &dyn DeviceView<T>,
    out: &mut dyn DeviceViewMut<T>,
) -> Result<(), OpError> {
    ours((MatmulKernel::MatrixCore, None), cx, params, a, b, out)
}

fn ours_big<T: DeviceElement>(
    cx: &Context<'_>,
    p: &MatmulParams,
    a: &dyn DeviceView<T>,
    b: &dyn DeviceView<T>,
    out: &mut dyn DeviceViewMut<T>,
) -> Result<(), OpError> {
    ours(
        (MatmulKernel::Plain, Some(MatmulTile::Big)),
        cx,
        p,
        a,
        b,
        out,
    )
}

fn ours_small<T: DeviceElement>(
    cx: &Context<'_>,
    p: &MatmulParams,
    a: &dyn DeviceView<T>,
    b: &dyn DeviceView<T>,
    out: &mut dyn DeviceViewMut<T>,
) -> Result<(), OpError> {
    ours(
        (MatmulKernel::Plain, Some(MatmulTile::Small)),
        cx,
        p,
        a,
        b,
        out,
    )
}

/// The LoRA skinny kernels (`kernels/lora_gemm.hip`) on the GEMMs they recognise
/// ([`crate::ops::lora_gemm::plan::SkinnyGemm::of`]: one rank-sized dimension, packed).
fn ours_skinny<T: DeviceElement>(
    cx: &Context<'_>,
    p: &MatmulParams,
    a: &dyn DeviceView<T>,
    b: &dyn DeviceView<T>,
    out: &mut dyn DeviceViewMut<T>,
) -> Result<(), OpError> {
    skinny_matmul::<T>(cx.stream, p, a, b, out)
}

/// hipBLAS takes packed operands only (hip-rt's `Blas` has no leading-dimension arguments).
fn blas_applies(c: &Applicability<'_>) -> bool {
    c.has_blas && c.params.layout == MatmulLayout::PACKED
}

fn hipblas<T: DeviceElement>(
    cx: &Context<'_>,
    params: &MatmulParams,
    a: &dyn DeviceView<T>,
    b: &dyn DeviceView<T>,
    out: &mut dyn DeviceViewMut<T>,
) -> Result<(), OpError> {
    let blas = cx.blas.ok_or(OpError::NoKernel {
        op: MatmulParams::OP,
        reason: "hipBLAS is not loaded",
    })?;
    let (gemm, batch) = params.gemm();
    Ok(blas.gemm_strided_batched_on(cx.stream, &gemm, &batch, a, b, out)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_file_safe_and_blas_needs_a_packed_layout() {
        let list = candidates::<f32>();
        for (i, c) in list.iter().enumerate() {
            assert!(
                c.name
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ch == '-'),
                "{}",
                c.name
            );
            assert!(list[..i].iter().all(|d| d.name != c.name), "{}", c.name);
        }
        let packed = MatmulParams::new(4, 4, 4);
        let strided = MatmulParams {
            layout: MatmulLayout {
                ldc: Some(8),
                ..MatmulLayout::PACKED
            },
            ..packed
        };
        let blas = by_name::<f32>("hipblas").unwrap();
        let with = |p: &MatmulParams, has_blas| {
            (blas.applies)(&Applicability {
                params: p,
                has_blas,
                arch: "gfx906",
            })
        };
        assert!(with(&packed, true));
        assert!(!with(&packed, false));
        assert!(!with(&strided, true));
        assert!(by_name::<f32>("nonesuch").is_none());
    }
}
