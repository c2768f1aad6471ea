//! [`LinearCrossEntropy`] on the device: row chunks of `h·Wᵀ` through the (tunable)
//! [`crate::ops::matmul`] and the fused cross-entropy kernels of `kernels/crossentropy.hip`
//! (no kernel of its own). Per chunk of `R` rows (plan: [`LinearCrossEntropyPlan`]):
//!
//! 1. `logits[R, V] = h_chunk·Wᵀ` (matmul, `trans_b`), into the one scratch buffer;
//! 2. `crossentropy_<T>` on those rows: losses, and with `dloss` the gradient over the logits
//!    in place, divided by the divisor or by the count of the whole call's counted targets
//!    (counted once, before the first chunk);
//! 3. `dh_chunk = dlogits·W` (matmul, `beta = 0`);
//! 4. with `dweight`, `dW += dlogitsᵀ·h_chunk` (matmul, `trans_a`, `beta = 1`).
//!
//! then the reduction of all `N` losses into `loss` / `totals`. Each chunk holds whole rows, so
//! the softmax of a row is the plain op's (its online max/sum pass and its gradient pass over one
//! buffer; no merge across vocabulary chunks). The arithmetic is the plain path's (matmul to
//! `[N, V]` logits, then [`super::softmax_cross_entropy`]) except that `dW` is summed over rows
//! chunk by chunk (`beta = 1`), which changes its f32 rounding only; the tests compare with the
//! f64 reference, not bit for bit with the plain path.

use super::device::{
    check_limits, error_ptr, launch_count, launch_reduce, launch_rows, opt_ptr, RowsPtrs,
};
use super::{LinearCrossEntropy, LinearCrossEntropyPlan};
use crate::ops::launch::ptr;
use crate::ops::{matmul, Matmul, MatmulParams, OpError};
use crate::params::{DeviceElement, OnDevice};
use hip_rt::memory::buffer::DeviceBuffer;
use hip_rt::{DeviceView, Stream};

/// [`LinearCrossEntropy`] on `stream`: same semantics and validation as
/// [`crate::cpu::linear_cross_entropy`] (f32 accumulation; the logits and their gradient are
/// stored as `T` between the GEMMs, as in the plain path), bad targets as
/// [`super::softmax_cross_entropy`] (the error flag holds the row index in the whole call).
/// Allocates [`LinearCrossEntropyPlan::scratch_bytes`] from the device's allocator (the
/// logits of one chunk and a 4-byte count; stream-ordered with the caching allocator, the
/// default) and nothing else. Queues the work; no host sync.
pub fn linear_cross_entropy<T: DeviceElement>(
    stream: &Stream,
    a: LinearCrossEntropy<'_, OnDevice, T>,
) -> Result<(), OpError> {
    a.validate()?;
    let p = a.params;
    let plan = LinearCrossEntropyPlan::new(&p, std::mem::size_of::<T>())?;
    check_limits(&p.chunk_params(p.rows))?;
    let (c, v) = (p.dim, p.vocab);
    ptr(stream, "h", a.h)?;
    ptr(stream, "weight", a.weight)?;
    let targets = ptr(stream, "targets", a.targets)?;
    let losses = ptr(stream, "losses", &*a.losses)?;
    let loss = opt_ptr(stream, "loss", a.loss)?;
    let totals = opt_ptr(stream, "totals", a.totals)?;
    let error = error_ptr(stream, a.error)?;
    let mut dh = a.dh;
    let mut dweight = a.dweight;
    let count_buf = DeviceBuffer::<f32>::alloc(stream, 1)?;
    let count = ptr(stream, "count", &count_buf)?;
    launch_count(stream, targets, p.rows, count)?;
    if plan.chunks > 0 {
        let mut logits = DeviceBuffer::<T>::alloc(stream, plan.chunk_rows * v)?;
        for r0 in (0..p.rows).step_by(plan.chunk_rows) {
            let r = plan.chunk_rows.min(p.rows - r0);
            let h = a.h.sub_view(r0 * c..(r0 + r) * c)?;
            let mut lg = logits.slice_mut(..r * v)?;
            matmul(
                stream,
                Matmul {
                    params: MatmulParams {
                        trans_b: true,
                        ..MatmulParams::new(r, v, c)
                    },
                    a: &h,
                    b: a.weight,
                    out: &mut lg,
                },
            )?;
            let at = RowsPtrs {
                logits: lg.device_ptr(),
                targets: targets.byte_add(r0 * std::mem::size_of::<i32>()),
                losses: losses.byte_add(r0 * std::mem::size_of::<f32>()),
                count,
                error,
                first_row: r0,
            };
            launch_rows::<T>(stream, &p.chunk_params(r), at)?;
            if let Some(dh) = dh.as_deref_mut() {
                let mut out = dh.sub_view_mut(r0 * c..(r0 + r) * c)?;
                let params = MatmulParams::new(r, c, v);
                matmul(
                    stream,
                    Matmul {
                        params,
                        a: &lg,
                        b: a.weight,
                        out: &mut out,
                    },
                )?;
            }
            if let Some(dw) = dweight.as_deref_mut() {
                let params = MatmulParams {
                    trans_a: true,
                    beta: 1.0,
                    ..MatmulParams::new(v, c, r)
                };
                matmul(
                    stream,
                    Matmul {
                        params,
                        a: &lg,
                        b: &h,
                        out: dw,
                    },
                )?;
            }
        }
        drop(logits);
    }
    launch_reduce(stream, &p.chunk_params(p.rows), losses, count, loss, totals)?;
    drop(count_buf);
    Ok(())
}
