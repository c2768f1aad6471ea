//! The LoRA adapter's products on the device: the skinny kernels of `kernels/lora_gemm.hip`
//! (`y` / `dy` strided in place, [`LoraParams::ldy`]; forward in 2 launches; backward in 3, or 4
//! when the row reductions are split into groups:
//! `lora_down` for du, one `lora_gradw` launch for dB and dA together, `lora_up` for dx, and
//! one `lora_gradw_final` for both partial sums), or the GEMM for every product.
//!
//! Never run on a GPU: compiled and statically checked for gfx906; the device tests ran on
//! hip-emu (the CPU-emulated device) only.

use super::plan::{self, GradwPlan, GradwShape, Operands, SkinnyGemm, BLOCK};
use super::{LoraBackward, LoraForward, LoraKernel, LoraParams};
use crate::embedded::kernel_names::lora_gemm as names;
use crate::ops::launch::{kernel, ptr};
use crate::ops::matmul::{Matmul, MatmulLayout, MatmulParams};
use crate::ops::OpError;
use crate::params::{invalid, DeviceElement, OnDevice};
use hip_rt::memory::buffer::{DeviceBuffer, DeviceView, DeviceViewMut};
use hip_rt::{DevicePtr, DeviceRepr, LaunchConfig, Stream};

const SOURCE: &str = "lora_gemm";

fn cfg(grid: (u32, u32, u32)) -> LaunchConfig {
    LaunchConfig {
        grid,
        block: (BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn grid_dim(op: &'static str, what: &'static str, n: u64) -> Result<u32, OpError> {
    u32::try_from(n.max(1))
        .ok()
        .filter(|&g| g <= i32::MAX as u32)
        .ok_or_else(|| {
            invalid(
                op,
                what,
                n,
                "needs more blocks than a grid holds; split the call",
            )
            .into()
        })
}

fn as_i32(op: &'static str, what: &'static str, n: usize) -> Result<i32, OpError> {
    i32::try_from(n).map_err(|_| {
        invalid(
            op,
            what,
            n,
            "must be at most 2^31 − 1 on the skinny kernels; use LoraKernel::Gemm",
        )
        .into()
    })
}

/// The rank-class kernel triple of `names` for rank `r` (checked by the caller).
fn by_class(r: usize, list: [[&'static str; 3]; 4]) -> Result<[&'static str; 3], OpError> {
    let class = plan::rank_class(r).ok_or(OpError::NoKernel {
        op: "lora_gemm",
        reason: "the skinny kernels take ranks 1 to 64",
    })?;
    let i = plan::RANK_CLASSES
        .iter()
        .position(|&c| c == class)
        .unwrap_or(3);
    Ok(list[i])
}

/// `lora_down`: `out = alpha · x·W` (see [`SkinnyGemm::Down`]).
fn launch_down<T: DeviceElement>(
    stream: &Stream,
    g: &SkinnyGemm,
    [x, w, out]: [DevicePtr; 3],
) -> Result<(), OpError> {
    let SkinnyGemm::Down {
        rows,
        k,
        rank,
        w_sc,
        w_sj,
        alpha,
        ldx,
    } = *g
    else {
        return Ok(());
    };
    if rows == 0 {
        return Ok(());
    }
    let op = "lora_down";
    let list = [
        names::LORA_DOWN_R8,
        names::LORA_DOWN_R16,
        names::LORA_DOWN_R32,
        names::LORA_DOWN_R64,
    ];
    let f = kernel::<T>(stream, SOURCE, by_class(rank, list)?)?;
    let grid = grid_dim(op, "rows", (rows as u64).div_ceil(plan::DOWN_ROWS))?;
    let mut b = stream.launch_builder(&f);
    b.value(x)
        .value(w)
        .value(out)
        .value(rows as i64)
        .value(as_i32(op, "k", k)?)
        .value(rank as i32)
        .value(w_sc as i64)
        .value(w_sj as i64)
        .value(alpha)
        .value(ldx as i64);
    // SAFETY: lora_down_r<RP>_<T>(const T* x, const T* w, T* out, int64_t rows, int k, int rank,
    // int64_t w_sc, int64_t w_sj, float alpha, int64_t ldx): x holds (rows − 1)·ldx + k
    // elements, w every c·w_sc + j·w_sj for c < k, j < rank, out rows·rank (the callers
    // validated them); one block per 256 rows.
    unsafe { b.launch(&cfg((grid, 1, 1))) }?;
    Ok(())
}

/// `lora_up`: `y = beta·y + alpha · u·Wᵀ` (see [`SkinnyGemm::Up`]).
fn launch_up<T: DeviceElement>(
    stream: &Stream,
    g: &SkinnyGemm,
    [u, w, y]: [DevicePtr; 3],
) -> Result<(), OpError> {
    let SkinnyGemm::Up {
        rows,
        cols,
        rank,
        w_sc,
        w_sj,
        alpha,
        beta,
        ldy,
    } = *g
    else {
        return Ok(());
    };
    if rows == 0 {
        return Ok(());
    }
    let op = "lora_up";
    let list = [
        names::LORA_UP_R8,
        names::LORA_UP_R16,
        names::LORA_UP_R32,
        names::LORA_UP_R64,
    ];
    let names = by_class(rank, list)?;
    let class = plan::rank_class(rank).unwrap_or(plan::RANK_CLASSES[3]);
    let rpb = plan::up_rows_per_block(rows, cols, class, stream.device().compute_units());
    let f = kernel::<T>(stream, SOURCE, names)?;
    let gx = grid_dim(op, "cols", (cols as u64).div_ceil(u64::from(BLOCK)))?;
    let gy = grid_dim(op, "rows", (rows as u64).div_ceil(rpb))?;
    if gy > 65535 {
        return Err(invalid(
            op,
            "rows",
            rows,
            "needs more than 65535 row blocks; split the call",
        )
        .into());
    }
    let mut b = stream.launch_builder(&f);
    b.value(u)
        .value(w)
        .value(y)
        .value(rows as i64)
        .value(as_i32(op, "cols", cols)?)
        .value(rank as i32)
        .value(w_sc as i64)
        .value(w_sj as i64)
        .value(alpha)
        .value(beta)
        .value(rpb as i64)
        .value(ldy as i64);
    // SAFETY: lora_up_r<RP>_<T>(const T* u, const T* w, T* y, int64_t rows, int cols, int rank,
    // int64_t w_sc, int64_t w_sj, float alpha, float beta, int64_t rows_per_block,
    // int64_t ldy): u holds rows·rank elements, y (rows − 1)·ldy + cols, w every
    // c·w_sc + j·w_sj (validated by the callers); grid (column blocks, row blocks) covers y.
    unsafe { b.launch(&cfg((gx, gy, 1))) }?;
    Ok(())
}

/// The kernel's `GradwJob` (`kernels/lora_gemm.hip`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct GradwJob {
    d: u64,
    u: u64,
    g: u64,
    partial: u64,
    g_sc: i64,
    g_sj: i64,
    cols: i64,
    ldd: i64,
    alpha: f32,
    accumulate: i32,
}

// SAFETY: `#[repr(C)]`: four u64 device addresses, four i64, one f32 and one i32 (72 bytes, no
// padding) = the kernel's `struct GradwJob { const void* d; const void* u; void* g;
// float* partial; int64_t g_sc, g_sj, cols, ldd; float alpha; int accumulate; }`; any bit
// pattern is valid and nothing in it is a host pointer.
unsafe impl DeviceRepr for GradwJob {}

/// One or two `lora_gradw` reductions over the same rows and rank (`[d, u, g]` each), in one
/// launch, plus one `lora_gradw_final` launch for both when the rows are split into groups.
/// Takes the partials (f32) from the device's allocator (stream-ordered with the caching
/// allocator, the default).
fn launch_gradw<T: DeviceElement>(
    stream: &Stream,
    jobs: &[(GradwShape, [DevicePtr; 3])],
) -> Result<(), OpError> {
    let op = "lora_gradw";
    let Some((first, _)) = jobs.first() else {
        return Ok(());
    };
    let (rows, rank) = (first.rows, first.rank);
    if jobs.len() > 2 || jobs.iter().any(|(s, _)| s.rows != rows || s.rank != rank) {
        return Err(invalid(
            op,
            "jobs",
            jobs.len(),
            "one or two jobs of the same rows and rank",
        )
        .into());
    }
    let widest = jobs.iter().map(|(s, _)| s.cols).max().unwrap_or(0);
    for (s, _) in jobs {
        as_i32(op, "cols", s.cols)?;
    }
    let plan = GradwPlan::new(
        rows,
        widest,
        rank,
        std::mem::size_of::<T>(),
        stream.device().compute_units(),
    );
    let split = plan.groups > 1;
    let mut partials = Vec::new();
    let mut table = [GradwJob::default(); 2];
    for (slot, (s, [d, u, g])) in table.iter_mut().zip(jobs) {
        let partial = if split {
            let buf = DeviceBuffer::<f32>::alloc(stream, plan.groups as usize * s.cols * rank)?;
            let p = ptr(stream, "partial", &buf)?;
            partials.push(buf);
            p
        } else {
            DevicePtr::NULL
        };
        *slot = GradwJob {
            d: d.0,
            u: u.0,
            g: g.0,
            partial: partial.0,
            g_sc: s.g_sc as i64,
            g_sj: s.g_sj as i64,
            cols: s.cols as i64,
            ldd: s.ldd as i64,
            alpha: s.alpha,
            accumulate: i32::from(s.accumulate),
        };
    }
    let njobs = jobs.len() as u32;
    let list = [
        names::LORA_GRADW_R8,
        names::LORA_GRADW_R16,
        names::LORA_GRADW_R32,
        names::LORA_GRADW_R64,
    ];
    let f = kernel::<T>(stream, SOURCE, by_class(rank, list)?)?;
    let gx = grid_dim(op, "cols", (widest as u64).div_ceil(u64::from(BLOCK)))?;
    let gy = grid_dim(op, "rows", plan.groups)?;
    let mut b = stream.launch_builder(&f);
    b.value(table[0])
        .value(table[1])
        .value(rows as i64)
        .value(rank as i32)
        .value(plan.rows_per_group as i64);
    // SAFETY: lora_gradw_r<RP>_<T>(GradwJob job0, GradwJob job1, int64_t rows, int rank,
    // int64_t rows_per_group): for each of the njobs jobs (grid z) d holds (rows − 1)·ldd + cols
    // elements, u
    // rows·rank, g every c·g_sc + j·g_sj (validated by the callers), partial (when split)
    // groups·cols·rank floats (allocated above); grid (column blocks of the widest job, groups).
    unsafe { b.launch(&cfg((gx, gy, njobs))) }?;
    if split {
        let f = kernel::<T>(stream, SOURCE, names::LORA_GRADW_FINAL)?;
        let gx = grid_dim(
            op,
            "cols·rank",
            ((widest * rank) as u64).div_ceil(u64::from(BLOCK)),
        )?;
        let mut b = stream.launch_builder(&f);
        b.value(table[0])
            .value(table[1])
            .value(plan.groups as i64)
            .value(rank as i32);
        // SAFETY: lora_gradw_final_<T>(GradwJob job0, GradwJob job1, int64_t groups, int rank):
        // the same jobs, whose partials the launch above wrote; one thread per (c, j).
        unsafe { b.launch(&cfg((gx, 1, njobs))) }?;
    }
    drop(partials);
    Ok(())
}

/// Whether the tuner's `hipk-skinny` candidate runs the GEMM `p` ([`SkinnyGemm::of`]).
pub(crate) fn skinny_applies(p: &MatmulParams) -> bool {
    SkinnyGemm::of(p).is_some()
}

/// The GEMM `p` (validated) on the skinny kernel [`SkinnyGemm::of`] finds for it.
pub(crate) fn skinny_matmul<T: DeviceElement>(
    stream: &Stream,
    p: &MatmulParams,
    a: &dyn DeviceView<T>,
    b: &dyn DeviceView<T>,
    out: &mut dyn DeviceViewMut<T>,
) -> Result<(), OpError> {
    let (g, operands) = SkinnyGemm::of(p).ok_or(OpError::NoKernel {
        op: MatmulParams::OP,
        reason: "not a skinny GEMM (see SkinnyGemm::of)",
    })?;
    let (pa, pb, po) = (
        ptr(stream, "a", a)?,
        ptr(stream, "b", b)?,
        ptr(stream, "out", &*out)?,
    );
    match (g, operands) {
        (SkinnyGemm::Down { .. }, _) => launch_down::<T>(stream, &g, [pa, pb, po]),
        (SkinnyGemm::Up { .. }, _) => launch_up::<T>(stream, &g, [pa, pb, po]),
        (SkinnyGemm::Gradw(s), Operands::UD) => launch_gradw::<T>(stream, &[(s, [pb, pa, po])]),
        (SkinnyGemm::Gradw(s), _) => launch_gradw::<T>(stream, &[(s, [pa, pb, po])]),
    }
}

/// Which implementation `kernel` means for `p` on this call.
fn resolve(kernel: LoraKernel, p: &LoraParams) -> Result<LoraKernel, OpError> {
    Ok(match kernel {
        LoraKernel::Auto if crate::ops::matmul::tuning::global_active()? => LoraKernel::Gemm,
        LoraKernel::Auto => crate::ops::matmul::tuning::lora_rule(p),
        k => k,
    })
}

fn mm(
    m: usize,
    n: usize,
    k: usize,
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
    beta: f32,
) -> MatmulParams {
    MatmulParams {
        trans_a,
        trans_b,
        alpha,
        beta,
        ..MatmulParams::new(m, n, k)
    }
}

/// The GEMM layout that reads `dy` (`a`, when `is_a`) or writes `y` (`out`) through
/// [`LoraParams::ldy`]: packed when it is not set.
fn y_layout(p: &LoraParams, is_a: bool) -> MatmulLayout {
    match (p.ldy, is_a) {
        (None, _) => MatmulLayout::PACKED,
        (Some(ld), true) => MatmulLayout {
            lda: Some(ld),
            ..MatmulLayout::PACKED
        },
        (Some(ld), false) => MatmulLayout {
            ldc: Some(ld),
            ..MatmulLayout::PACKED
        },
    }
}

/// [`LoraForward`] on `stream`: [`crate::cpu::lora_forward`]'s semantics (f32 accumulation),
/// on the kernel [`LoraKernel::Auto`] picks. Queues the work; no host sync (unless GEMM tuning
/// is on, see [`crate::ops::matmul()`]).
pub fn lora_forward<T: DeviceElement>(
    stream: &Stream,
    a: LoraForward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    lora_forward_with(stream, a, LoraKernel::Auto)
}

/// [`lora_forward`] on an explicit implementation: `Skinny`: `lora_down` (u) then `lora_up`
/// (y), 2 launches; `Gemm`: two [`crate::ops::matmul()`] calls. Queues the work; no host sync.
pub fn lora_forward_with<T: DeviceElement>(
    stream: &Stream,
    a: LoraForward<'_, OnDevice, T>,
    kernel: LoraKernel,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    let (n, din, dout, r, s) = (p.rows, p.d_in, p.d_out, p.rank, p.scale);
    let down = mm(n, r, din, false, true, 1.0, 0.0);
    let up = MatmulParams {
        layout: y_layout(&p, false),
        ..mm(n, dout, r, false, true, s, 1.0)
    };
    if resolve(kernel, &p)? == LoraKernel::Gemm {
        crate::ops::matmul(
            stream,
            Matmul {
                params: down,
                a: a.x,
                b: a.a,
                out: &mut *a.u,
            },
        )?;
        let u: &dyn DeviceView<T> = &*a.u;
        return crate::ops::matmul(
            stream,
            Matmul {
                params: up,
                a: u,
                b: a.b,
                out: a.y,
            },
        );
    }
    if n == 0 {
        return Ok(());
    }
    let (x, wa, wb) = (
        ptr(stream, "x", a.x)?,
        ptr(stream, "a", a.a)?,
        ptr(stream, "b", a.b)?,
    );
    let (u, y) = (ptr(stream, "u", &*a.u)?, ptr(stream, "y", &*a.y)?);
    // u = x·Aᵀ: W(c, j) = A[j·in + c]; y += s·u·Bᵀ: W(c, j) = B[c·r + j].
    let gd = SkinnyGemm::Down {
        rows: n,
        k: din,
        rank: r,
        w_sc: 1,
        w_sj: din,
        alpha: 1.0,
        ldx: din,
    };
    let gu = SkinnyGemm::Up {
        rows: n,
        cols: dout,
        rank: r,
        w_sc: r,
        w_sj: 1,
        alpha: s,
        beta: 1.0,
        ldy: p.row_stride(),
    };
    launch_down::<T>(stream, &gd, [x, wa, u])?;
    launch_up::<T>(stream, &gu, [u, wb, y])
}

/// [`LoraBackward`] on `stream`: [`crate::cpu::lora_backward`]'s semantics (f32 accumulation),
/// on the kernel [`LoraKernel::Auto`] picks. Queues the work; no host sync (unless GEMM tuning
/// is on).
pub fn lora_backward<T: DeviceElement>(
    stream: &Stream,
    a: LoraBackward<'_, OnDevice, T>,
) -> Result<(), OpError> {
    lora_backward_with(stream, a, LoraKernel::Auto)
}

/// [`lora_backward`] on an explicit implementation: `Skinny`: `lora_down` (du), one
/// `lora_gradw` launch for dB and dA, `lora_up` (dx), and one `lora_gradw_final` when the rows
/// are split ([`GradwPlan`]): 3 or 4 launches; `Gemm`: four [`crate::ops::matmul()`] calls.
/// Takes the partial sums' scratch from the device's allocator. Queues the work; no host sync.
pub fn lora_backward_with<T: DeviceElement>(
    stream: &Stream,
    a: LoraBackward<'_, OnDevice, T>,
    kernel: LoraKernel,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    let (n, din, dout, r, s) = (p.rows, p.d_in, p.d_out, p.rank, p.scale);
    let beta = if p.accumulate { 1.0 } else { 0.0 };
    let du_mm = MatmulParams {
        layout: y_layout(&p, true),
        ..mm(n, r, dout, false, false, s, 0.0)
    };
    let db_mm = MatmulParams {
        layout: y_layout(&p, true),
        ..mm(dout, r, n, true, false, s, beta)
    };
    let da_mm = mm(r, din, n, true, false, 1.0, beta);
    let dx_mm = mm(n, din, r, false, false, 1.0, 1.0);
    if resolve(kernel, &p)? == LoraKernel::Gemm {
        crate::ops::matmul(
            stream,
            Matmul {
                params: du_mm,
                a: a.dy,
                b: a.b,
                out: &mut *a.du,
            },
        )?;
        crate::ops::matmul(
            stream,
            Matmul {
                params: db_mm,
                a: a.dy,
                b: a.u,
                out: a.db,
            },
        )?;
        let du: &dyn DeviceView<T> = &*a.du;
        crate::ops::matmul(
            stream,
            Matmul {
                params: da_mm,
                a: du,
                b: a.x,
                out: a.da,
            },
        )?;
        return crate::ops::matmul(
            stream,
            Matmul {
                params: dx_mm,
                a: du,
                b: a.a,
                out: a.dx,
            },
        );
    }
    if n == 0 {
        // No rows: du and dx are empty; the sums are zero (overwritten) or unchanged.
        if !p.accumulate {
            stream.memset_zero(a.da)?;
            stream.memset_zero(a.db)?;
        }
        return Ok(());
    }
    let (x, dy, wa, wb, u) = (
        ptr(stream, "x", a.x)?,
        ptr(stream, "dy", a.dy)?,
        ptr(stream, "a", a.a)?,
        ptr(stream, "b", a.b)?,
        ptr(stream, "u", a.u)?,
    );
    let (du, da, db, dx) = (
        ptr(stream, "du", &*a.du)?,
        ptr(stream, "da", &*a.da)?,
        ptr(stream, "db", &*a.db)?,
        ptr(stream, "dx", &*a.dx)?,
    );
    // du = s·dy·B: W(c, j) = B[c·r + j]; dx += du·A: W(c, j) = A[j·in + c].
    let g_du = SkinnyGemm::Down {
        rows: n,
        k: dout,
        rank: r,
        w_sc: r,
        w_sj: 1,
        alpha: s,
        ldx: p.row_stride(),
    };
    let g_dx = SkinnyGemm::Up {
        rows: n,
        cols: din,
        rank: r,
        w_sc: 1,
        w_sj: din,
        alpha: 1.0,
        beta: 1.0,
        ldy: din,
    };
    // dB [out, r] (+)= s·dyᵀ·u and dA [r, in] (+)= duᵀ·x.
    let s_db = GradwShape {
        rows: n,
        cols: dout,
        rank: r,
        g_sc: r,
        g_sj: 1,
        alpha: s,
        accumulate: p.accumulate,
        ldd: p.row_stride(),
    };
    let s_da = GradwShape {
        rows: n,
        cols: din,
        rank: r,
        g_sc: 1,
        g_sj: din,
        alpha: 1.0,
        accumulate: p.accumulate,
        ldd: din,
    };
    launch_down::<T>(stream, &g_du, [dy, wb, du])?;
    launch_gradw::<T>(stream, &[(s_db, [dy, u, db]), (s_da, [x, du, da])])?;
    launch_up::<T>(stream, &g_dx, [du, wa, dx])
}
