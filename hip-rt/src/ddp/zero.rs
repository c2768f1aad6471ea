//! ZeRO stage 1 helpers: a flat buffer split into one equal shard per rank, gradients
//! reduce-scattered into the rank's shard, updated parameters all-gathered back.

use std::ops::Range;

use super::error::DdpError;
use super::reducer::Averaging;
use crate::comm::{Comm, CommElement};
use crate::memory::buffer::{DeviceBuffer, DeviceView, DeviceViewMut};
use crate::stream::Stream;

/// A flat buffer of `len` elements split into `world` equal shards of `shard_len` elements.
/// Reduce-scatter and all-gather need equal blocks, so the buffers they run on hold
/// [`padded_len`](ShardPlan::padded_len) = `shard_len × world` elements: the last
/// `padded_len − len` are padding (keep them zero in the gradient buffer; their values in the
/// parameter buffer are never used). Rank `r` owns elements
/// [`shard_range(r)`](ShardPlan::shard_range), of which [`owned(r)`](ShardPlan::owned) are
/// real.
///
/// ```
/// let plan = hip_rt::ddp::ShardPlan::new(10, 4).unwrap();
/// assert_eq!((plan.shard_len(), plan.padded_len()), (3, 12));
/// assert_eq!(plan.shard_range(3), 9..12);
/// assert_eq!(plan.owned(3), 9..10);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardPlan {
    len: usize,
    world: usize,
    shard: usize,
}

impl ShardPlan {
    /// Shards of a buffer of `len` elements over `world` ranks.
    pub fn new(len: usize, world: usize) -> Result<ShardPlan, DdpError> {
        if world == 0 {
            return Err(DdpError::Ranges(
                "a shard plan for 0 ranks; pass comm.world()".into(),
            ));
        }
        let shard = len.div_ceil(world);
        shard.checked_mul(world).ok_or_else(|| {
            DdpError::Ranges(format!("{len} elements over {world} ranks overflow"))
        })?;
        Ok(ShardPlan { len, world, shard })
    }

    /// The real elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Elements per shard (padding included).
    pub fn shard_len(&self) -> usize {
        self.shard
    }

    /// `shard_len × world`: the length of the buffers the collectives run on.
    pub fn padded_len(&self) -> usize {
        self.shard * self.world
    }

    /// Rank `rank`'s shard in the padded buffer (empty for a rank past the world).
    pub fn shard_range(&self, rank: usize) -> Range<usize> {
        if rank >= self.world {
            return self.padded_len()..self.padded_len();
        }
        rank * self.shard..(rank + 1) * self.shard
    }

    /// The real (unpadded) part of rank `rank`'s shard; may be empty for the last ranks.
    pub fn owned(&self, rank: usize) -> Range<usize> {
        let r = self.shard_range(rank);
        r.start.min(self.len)..r.end.min(self.len)
    }

    fn check(&self, what: &'static str, comm: &Comm) -> Result<(), DdpError> {
        if comm.world() != self.world {
            return Err(DdpError::World {
                what,
                planned: self.world,
                world: comm.world(),
            });
        }
        Ok(())
    }

    fn check_len(
        &self,
        what: &'static str,
        found: usize,
        expected: usize,
        rule: &str,
    ) -> Result<(), DdpError> {
        if found != expected {
            return Err(DdpError::Length {
                what,
                found,
                expected,
                rule: format!(
                    "{rule}; plan: {} elements over {} ranks",
                    self.len, self.world
                ),
            });
        }
        Ok(())
    }

    /// Queue on `stream`: `shard` (`shard_len` elements) becomes this rank's shard of the
    /// mean (or sum, see [`Averaging`]) over ranks of `grads` (`padded_len` elements).
    pub fn reduce_scatter<T: CommElement>(
        &self,
        comm: &Comm,
        grads: &impl DeviceView<T>,
        shard: &mut impl DeviceViewMut<T>,
        averaging: Averaging,
        stream: &Stream,
    ) -> Result<(), DdpError> {
        const WHAT: &str = "ShardPlan::reduce_scatter";
        self.check(WHAT, comm)?;
        self.check_len(WHAT, grads.len(), self.padded_len(), "grads = padded_len")?;
        self.check_len(WHAT, shard.len(), self.shard, "shard = shard_len")?;
        Ok(comm.reduce_scatter(grads, shard, averaging.op(), stream)?)
    }

    /// Queue on `stream`: in place, `grads[shard_range(rank)]` becomes this rank's shard of the
    /// mean (or sum) over ranks; the rest of `grads` is left undefined.
    pub fn reduce_scatter_in_place<T: CommElement>(
        &self,
        comm: &Comm,
        grads: &mut DeviceBuffer<T>,
        averaging: Averaging,
        stream: &Stream,
    ) -> Result<(), DdpError> {
        const WHAT: &str = "ShardPlan::reduce_scatter_in_place";
        self.check(WHAT, comm)?;
        self.check_len(WHAT, grads.len(), self.padded_len(), "grads = padded_len")?;
        Ok(comm.reduce_scatter_in_place(grads, averaging.op(), stream)?)
    }

    /// Queue on `stream`: `params` (`padded_len` elements) gets every rank's `shard`
    /// (`shard_len` elements) at that rank's shard range.
    pub fn all_gather<T: CommElement>(
        &self,
        comm: &Comm,
        shard: &impl DeviceView<T>,
        params: &mut impl DeviceViewMut<T>,
        stream: &Stream,
    ) -> Result<(), DdpError> {
        const WHAT: &str = "ShardPlan::all_gather";
        self.check(WHAT, comm)?;
        self.check_len(WHAT, params.len(), self.padded_len(), "params = padded_len")?;
        self.check_len(WHAT, shard.len(), self.shard, "shard = shard_len")?;
        Ok(comm.all_gather(shard, params, stream)?)
    }

    /// Queue on `stream`: in place, every rank's `params[shard_range(rank)]` (its updated
    /// shard) is copied into the same range of every other rank's `params`.
    pub fn all_gather_in_place<T: CommElement>(
        &self,
        comm: &Comm,
        params: &mut DeviceBuffer<T>,
        stream: &Stream,
    ) -> Result<(), DdpError> {
        const WHAT: &str = "ShardPlan::all_gather_in_place";
        self.check(WHAT, comm)?;
        self.check_len(WHAT, params.len(), self.padded_len(), "params = padded_len")?;
        Ok(comm.all_gather_in_place(params, stream)?)
    }
}
