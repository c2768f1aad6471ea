//! The CPU reference: the oracle every device kernel is judged against.
//!
//! Same operation names and argument structs as the device launchers in [`crate::ops`], over
//! [`crate::params::Host`] slices instead of device buffers. The functions live with their op in
//! `src/ops/<family>/cpu.rs` and are re-exported here; this module holds what they share.
//!
//! Numerics: every reduction and every intermediate is computed in **f64** from the exact
//! widening of the stored inputs, and each output is rounded once (via f32, as torch casts) to its
//! storage type. Kernels accumulate in f32, so this reference is strictly more accurate than what
//! it checks. Work is split over threads with `std::thread::scope` when it is large enough to pay.
//!
//! Errors: every function validates all lengths and parameters before touching any output and
//! returns [`ShapeError`](crate::params::ShapeError) naming the tensor and the values; it never
//! panics on bad input.

pub mod exact;

pub use crate::ops::cpu_functions::*;

use crate::params::Element;

/// Below this many multiply-adds a call runs on the calling thread.
const PAR_MIN_WORK: usize = 1 << 16;

/// Run `f` on every item, spreading items over up to `available_parallelism` scoped threads when
/// `work` (total multiply-adds, roughly) is large enough.
pub(crate) fn par_for_each<I: Send>(items: Vec<I>, work: usize, f: impl Fn(I) + Sync) {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 || work < PAR_MIN_WORK {
        items.into_iter().for_each(f);
        return;
    }
    let per = items.len().div_ceil(threads);
    let mut groups: Vec<Vec<I>> = Vec::with_capacity(threads);
    let mut it = items.into_iter().peekable();
    while it.peek().is_some() {
        groups.push(it.by_ref().take(per).collect());
    }
    let f = &f;
    std::thread::scope(|s| {
        for g in groups {
            s.spawn(move || g.into_iter().for_each(f));
        }
    });
}

/// Exact widening of a storage slice to f64.
pub(crate) fn widen<T: Element>(x: &[T]) -> Vec<f64> {
    x.iter().map(|v| v.to_f64()).collect()
}

/// Round each f64 once into its storage slot (lengths were validated by the caller).
pub(crate) fn narrow<T: Element>(src: &[f64], dst: &mut [T]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = T::from_f64(*s);
    }
}
