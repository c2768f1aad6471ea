//! Graph capture and the cache: what stream-ordered reuse means when work is recorded now and
//! replayed later.
//!
//! A captured graph keeps the addresses its nodes were captured with and touches them at every
//! launch, long after the capture. A block freed during the capture would, under the ordinary
//! rule (reusable at once on its stream), go back to the cache while the graph still uses it:
//! the next request, eager or captured, could get it and be overwritten by the next replay.
//!
//! So, between [`CachingAllocator::begin_capture`] and [`CachingAllocator::end_capture`], every
//! free on the device is *held*: the block stays allocated (and counted as such in the
//! statistics), is not reused, not even by later requests of the same capture (a capture's
//! allocations never alias), and passes to the [`GraphPool`] that `end_capture` returns. The
//! pool gives the blocks back to the cache when it is dropped (hip-rt's `Graph` and every
//! `GraphExec` made from it share one), in the order of their streams and of every stream the
//! graph was launched on ([`GraphPool::record_stream`]). Requests during a capture are served
//! as usual (from the cache or the device).
//!
//! Blocks that are still allocated when the capture ends are their owners' to keep alive for as
//! long as the graph is launched: that is the `unsafe` contract of launching a graph.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::backend::{Backend, DevicePtr};
use super::error::AllocError;
use super::CachingAllocator;

/// The capture state of one allocator.
pub(super) struct Holds<S> {
    /// The capturing stream, while a capture is active.
    capture: Option<S>,
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
        h.capture = Some(stream);
        h.held.clear();
        Ok(())
    }

    /// Stops holding frees; the blocks freed since [`CachingAllocator::begin_capture`] belong to
    /// the returned pool until it drops. Without an active capture the pool is empty.
    pub fn end_capture(&self) -> GraphPool<B> {
        let mut h = lock(&self.shared.graphs);
        let stream = h.capture.take();
        GraphPool {
            allocator: self.clone(),
            blocks: std::mem::take(&mut h.held),
            streams: stream.into_iter().collect(),
        }
    }

    /// True between `begin_capture` and `end_capture`.
    pub fn capturing(&self) -> bool {
        lock(&self.shared.graphs).capture.is_some()
    }

    /// During a capture, keeps the allocated block `id` at `ptr` for the graph instead of
    /// freeing it: `Ok(true)`. `Ok(false)`: no capture, free as usual.
    pub(super) fn hold(&self, id: u32, ptr: DevicePtr) -> Result<bool, AllocError> {
        let mut h = lock(&self.shared.graphs);
        if h.capture.is_none() {
            return Ok(false);
        }
        if !self.lock().is_allocated(id, ptr.0) || h.held.iter().any(|&(i, _)| i == id) {
            return Err(self.foreign(ptr));
        }
        h.held.push((id, ptr));
        Ok(true)
    }
}

/// The blocks freed while a graph was captured: kept allocated (never reused) until this drops,
/// then returned to the cache like any freed block.
pub struct GraphPool<B: Backend> {
    allocator: CachingAllocator<B>,
    blocks: Vec<(u32, DevicePtr)>,
    /// The capture stream and every other stream the graph was launched on.
    streams: Vec<B::Stream>,
}

impl<B: Backend> GraphPool<B> {
    /// The held blocks' addresses.
    pub fn addresses(&self) -> Vec<DevicePtr> {
        self.blocks.iter().map(|&(_, p)| p).collect()
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
        for (id, ptr) in std::mem::take(&mut self.blocks) {
            let mut policy = self.allocator.lock();
            let result = if policy.is_allocated(id, ptr.0) {
                policy.free(id)
            } else {
                Err(self.allocator.foreign(ptr))
            };
            if let Err(e) = result {
                policy.drop_error_count += 1;
                policy.drop_error.get_or_insert(e);
            }
        }
    }
}
