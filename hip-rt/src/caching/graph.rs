//! Graph capture and the cache: what stream-ordered reuse means when work is recorded now and
//! replayed later.
//!
//! A captured graph keeps the addresses its nodes were captured with and touches them at every
//! launch, long after the capture. A block the graph uses must therefore not be handed to anyone
//! else while the graph lives; but within the capture, reuse is as safe as in eager mode.
//!
//! Between [`CachingAllocator::begin_capture`] and [`CachingAllocator::end_capture`] (PyTorch's
//! private pools during `captures_underway`):
//!
//! - Requests on the capturing stream are served from a *private pool* of the capture's own:
//!   segments reserved for it, split and merged as usual. A block of the pool freed during the
//!   capture (and used on no other stream) returns to the pool, and a later request of the same
//!   capture on the same stream may get it: the replays run the captured work in the captured
//!   stream order, so the reuse is stream-ordered exactly as in eager mode, and the pool's size
//!   is the capture's eager peak, not the sum of its temporaries.
//! - Every other free is *held*: a block allocated before the capture or on another stream, or
//!   a pool block used on another stream ([`super::Allocation::record_stream`]), stays allocated
//!   (and counted as such in the statistics) and is not reused, not even by the capture.
//! - Requests on other streams are served from the cache as usual.
//!
//! After the capture, the pool serves nothing (its free blocks, and its blocks that their owners
//! free later, wait in it), and its segments are never released, not even by
//! [`CachingAllocator::empty_cache`] or the out-of-memory path. Everything comes back when the
//! [`GraphPool`] that `end_capture` returns is dropped (hip-rt's `Graph` and every `GraphExec`
//! made from it share one): the held blocks are freed, and the pool's blocks join the capturing
//! stream's cache, in the order of that stream and of every stream the graph was launched on
//! ([`GraphPool::record_stream`]).
//!
//! Statistics: the pool's free blocks are reserved, not allocated (as PyTorch counts them), so a
//! replayed step's `allocated` peak leaves out the temporaries the graph computes into; the
//! capture's own peak is the eager one. [`GraphPool::bytes`] gives the pool's size.
//!
//! Blocks that are still allocated when the capture ends are their owners' to keep alive for as
//! long as the graph is launched: that is the `unsafe` contract of launching a graph.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::backend::{Backend, DevicePtr};
use super::error::AllocError;
use super::policy::{Grant, NONE};
use super::CachingAllocator;

/// The capture state of one allocator.
pub(super) struct Holds<S> {
    /// The capturing stream and its private pool, while a capture is active.
    capture: Option<(S, u32)>,
    /// Blocks freed during the capture: (policy id, address).
    held: Vec<(u32, DevicePtr)>,
}

impl<S> Default for Holds<S> {
    fn default() -> Self {
        Holds {
            capture: None,
            held: Vec::new(),
        }
    }
}

pub(super) fn lock<S>(m: &Mutex<Holds<S>>) -> MutexGuard<'_, Holds<S>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<B: Backend> CachingAllocator<B> {
    /// Starts holding frees for a graph captured on `stream` (see the module docs). One capture
    /// per device at a time: a second is [`AllocError::CaptureActive`].
    pub fn begin_capture(&self, stream: B::Stream) -> Result<(), AllocError> {
        let mut h = lock(&self.shared.graphs);
        if h.capture.is_some() {
            return Err(AllocError::CaptureActive {
                device: self.shared.device,
            });
        }
        let pool = self.lock().open_private(stream)?;
        h.capture = Some((stream, pool));
        h.held.clear();
        self.shared.capturing.store(true, Ordering::Release);
        Ok(())
    }

    /// Stops holding frees; the blocks freed since [`CachingAllocator::begin_capture`] belong to
    /// the returned pool until it drops. Without an active capture the pool is empty.
    pub fn end_capture(&self) -> GraphPool<B> {
        let mut h = lock(&self.shared.graphs);
        let capture = h.capture.take();
        self.shared.capturing.store(false, Ordering::Release);
        if capture.is_some() {
            self.lock().end_private();
        }
        GraphPool {
            allocator: self.clone(),
            blocks: std::mem::take(&mut h.held),
            streams: capture.iter().map(|&(s, _)| s).collect(),
            private: capture.map(|(_, p)| p),
        }
    }

    /// True between `begin_capture` and `end_capture`.
    pub fn capturing(&self) -> bool {
        lock(&self.shared.graphs).capture.is_some()
    }

    /// Allocates `size` bytes (`0 < size`) on `stream`: from the capture's private pool when a
    /// capture on `stream` is under way, else as usual.
    pub(super) fn malloc(
        &self,
        size: usize,
        stream: B::Stream,
        indexed: bool,
    ) -> Result<Grant, AllocError> {
        if self.shared.capturing.load(Ordering::Acquire) {
            let h = lock(&self.shared.graphs);
            if let Some((s, pool)) = h.capture {
                if s == stream {
                    return self.lock().malloc_private(size, pool, indexed);
                }
            }
        }
        self.lock().malloc(size, stream, indexed)
    }

    /// During a capture, keeps the allocated block `id` at `ptr` for the graph instead of
    /// freeing it: `Ok(true)`. `Ok(false)`: free as usual (no capture, or a block of the
    /// capture's private pool that returns to it).
    pub(super) fn hold(&self, id: u32, ptr: DevicePtr) -> Result<bool, AllocError> {
        if !self.shared.capturing.load(Ordering::Acquire) {
            return Ok(false);
        }
        let mut h = lock(&self.shared.graphs);
        let Some((_, pool)) = h.capture else {
            return Ok(false);
        };
        let policy = self.lock();
        if !policy.is_allocated(id, ptr.0) || h.held.iter().any(|&(i, _)| i == id) {
            return Err(self.foreign(ptr));
        }
        if policy.reusable_in(id, pool) {
            return Ok(false);
        }
        drop(policy);
        h.held.push((id, ptr));
        Ok(true)
    }
}

/// The memory a captured graph keeps (see the module docs): its private pool, and the blocks
/// freed during the capture that were held for it (kept allocated, never reused). When this
/// drops, the held blocks are freed and the pool's blocks join the capture stream's cache.
pub struct GraphPool<B: Backend> {
    allocator: CachingAllocator<B>,
    /// Held blocks: (policy id, address).
    blocks: Vec<(u32, DevicePtr)>,
    /// The capture stream and every other stream the graph was launched on.
    streams: Vec<B::Stream>,
    /// The private pool's id (none when no capture was under way).
    private: Option<u32>,
}

impl<B: Backend> GraphPool<B> {
    /// The held blocks' addresses (not the private pool's).
    pub fn addresses(&self) -> Vec<DevicePtr> {
        self.blocks.iter().map(|&(_, p)| p).collect()
    }

    /// The bytes of the segments the private pool reserved, and their count.
    pub fn private_segments(&self) -> (usize, usize) {
        match self.private {
            Some(pool) => self.allocator.lock().private_segments(pool),
            None => (0, 0),
        }
    }

    /// The graph's memory in bytes: the private pool's segments plus the held blocks outside
    /// them.
    pub fn bytes(&self) -> usize {
        let policy = self.allocator.lock();
        let private = self.private.map_or(NONE, |p| p);
        let held: usize = (self.blocks.iter())
            .filter(|&&(id, _)| !policy.in_pool(id, private))
            .map(|&(id, _)| policy.block_size(id))
            .sum();
        let private = self.private.map_or(0, |p| policy.private_segments(p).0);
        held + private
    }

    /// Note a launch of the graph on `stream`: when the pool drops, its blocks are not reused
    /// before the work queued on `stream` by then has completed (as [`super::Allocation::record_stream`]).
    pub fn record_stream(&mut self, stream: B::Stream) -> Result<(), AllocError> {
        if self.streams.contains(&stream) {
            return Ok(());
        }
        let mut policy = self.allocator.lock();
        for &(id, _) in &self.blocks {
            policy.record_stream(id, stream)?;
        }
        drop(policy);
        self.streams.push(stream);
        Ok(())
    }
}

impl<B: Backend> fmt::Debug for GraphPool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphPool")
            .field("device", &self.allocator.device())
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

impl<B: Backend> Drop for GraphPool<B> {
    fn drop(&mut self) {
        let mut policy = self.allocator.lock();
        let mut errors = Vec::new();
        for (id, ptr) in std::mem::take(&mut self.blocks) {
            let result = if policy.is_allocated(id, ptr.0) {
                policy.free(id)
            } else {
                Err(self.allocator.foreign(ptr))
            };
            errors.extend(result.err());
        }
        if let Some(pool) = self.private.take() {
            let others = self.streams.get(1..).unwrap_or_default();
            errors.extend(policy.close_private(pool, others).err());
        }
        for e in errors {
            policy.drop_error_count += 1;
            policy.drop_error.get_or_insert(e);
        }
    }
}
