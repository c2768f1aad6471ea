//! Giving memory back: releasing cached segments (one, oversize ones, all, or the oldest
//! by garbage collection), the out-of-memory report, the snapshot, and teardown.

use std::mem;

use super::{backend_err, Policy, State, NONE};
use crate::caching::backend::{Backend, DevicePtr, MemInfo};
use crate::caching::error::{AllocError, OomHint, OutOfMemory};
use crate::caching::stats::{BlockInfo, BlockState, SegmentInfo, Snapshot};

use super::keys::Key;

impl<B: Backend> Policy<B> {
    /// Returns a whole cached segment to the backend.
    pub(super) fn release_block(&mut self, id: u32) -> Result<(), AllocError> {
        let b = &self.blocks[id as usize];
        let (ptr, size, ty) = (DevicePtr(b.addr), b.size, b.stat_type());
        // SAFETY: a whole free segment was returned by `malloc(size)` on this backend (segments
        // keep their address and size while unsplit) and is freed only here, after which
        // its arena slot is vacated, so it cannot be freed twice.
        unsafe { self.backend.free(ptr, size) }.map_err(backend_err("free", self.device))?;
        self.remove_free(id);
        self.vacate(id);
        self.total_reserved -= size;
        self.stats.segment.decrease(ty, 1);
        self.stats.reserved_bytes.decrease(ty, size as u64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.decrease(1);
        }
        self.stats.num_device_free += 1;
        Ok(())
    }

    /// Frees one oversize cached segment big enough for the request, or several of the
    /// largest ones on the same stream. Only with a `max_split_size` set.
    pub(super) fn release_available_cached_blocks(
        &mut self,
        small: bool,
        sid: u32,
        rounded: usize,
    ) -> Result<bool, AllocError> {
        let max_split = self.config.max_split_size;
        // A capture's private segments are never released: its nodes hold their addresses.
        if max_split == usize::MAX || self.private.is_private(sid) {
            return Ok(false);
        }
        let want = rounded.max(max_split);
        let pool = if small { &self.small } else { &self.large };
        let unsplit = |k: &&Key| !self.blocks[k.id() as usize].is_split();
        if let Some(&key) = pool.free.range(Key::at_least(sid, want)..).find(unsplit) {
            if key.stream() == sid {
                self.release_block(key.id())?;
                return Ok(true);
            }
        }
        let victims: Vec<Key> = pool
            .free
            .range(..Key::at_least(sid, want))
            .rev()
            .take_while(|k| k.stream() == sid && k.size() >= max_split)
            .filter(unsplit)
            .copied()
            .collect();
        let mut released = 0;
        for key in victims {
            if released >= want {
                break;
            }
            self.release_block(key.id())?;
            released += key.size();
        }
        Ok(released >= want)
    }

    /// Waits for outstanding events, then returns every unsplit cached segment (but those of
    /// graphs' private pools).
    pub fn release_cached_blocks(&mut self) -> Result<(), AllocError> {
        self.synchronize_and_free_events()?;
        if self.private.dissolving() {
            self.poll_dissolving(true)?;
        }
        let whole: Vec<u32> = (self.small.free.iter().chain(self.large.free.iter()))
            .filter(|k| !self.private.is_private(k.stream()))
            .map(|k| k.id())
            .filter(|&id| !self.blocks[id as usize].is_split())
            .collect();
        for id in whole {
            self.release_block(id)?;
        }
        Ok(())
    }

    /// Releases old unsplit large cached segments, without synchronising, while reserved
    /// memory exceeds `garbage_collection_threshold` of the allowed memory.
    pub(super) fn garbage_collect(&mut self) -> Result<(), AllocError> {
        let allowed = match (self.allowed_max, self.capacity) {
            (Some(a), _) => a,
            (None, Some(c)) => c,
            (None, None) => self.mem_info()?.total,
        };
        let threshold = (self.config.garbage_collection_threshold * allowed as f64) as usize;
        if self.total_reserved <= threshold {
            return Ok(());
        }
        let target = self.total_reserved - threshold;
        let now = self.large.gc_calls;
        let mut candidates: Vec<(u32, u64, usize)> = (self.large.free.iter())
            .filter(|k| !self.private.is_private(k.stream()))
            .map(|k| (k.id(), &self.blocks[k.id() as usize]))
            .filter(|(_, b)| !b.is_split())
            .map(|(id, b)| (id, now - b.gc_base, b.size))
            .collect();
        let mut total_age: u64 = candidates.iter().map(|c| c.1).sum();
        let mut reclaimed = 0;
        while reclaimed < target && !candidates.is_empty() {
            let average = total_age as f64 / candidates.len() as f64;
            let mut freed_any = false;
            let mut kept = Vec::with_capacity(candidates.len());
            for (id, age, size) in mem::take(&mut candidates) {
                if age as f64 >= average {
                    self.release_block(id)?;
                    reclaimed += size;
                    total_age -= age;
                    freed_any = true;
                } else {
                    kept.push((id, age, size));
                }
            }
            candidates = kept;
            if !freed_any {
                break;
            }
        }
        Ok(())
    }

    /// Free cached bytes and the largest free block of one pool, on stream `sid` and on every
    /// other stream.
    fn cached_by_stream(&self, small: bool, sid: u32) -> ((usize, usize), (usize, usize)) {
        let pool = if small { &self.small } else { &self.large };
        let (mut same, mut other) = ((0, 0), (0, 0));
        for key in &pool.free {
            let size = self.blocks[key.id() as usize].size;
            let acc = if key.stream() == sid {
                &mut same
            } else {
                &mut other
            };
            acc.0 += size;
            acc.1 = acc.1.max(size);
        }
        (same, other)
    }

    pub(super) fn out_of_memory(
        &mut self,
        (small, sid): (bool, u32),
        requested: usize,
        rounded: usize,
        segment: usize,
    ) -> AllocError {
        let (stream_cached, other_streams_cached) = self.cached_by_stream(small, sid);
        let info = self.mem_info().unwrap_or(MemInfo { free: 0, total: 0 });
        let fraction = self.config.memory_fraction.zip(self.allowed_max);
        let max_split = self.config.max_split_size;
        let oom = OutOfMemory {
            requested,
            rounded,
            segment_size: segment,
            device: self.device,
            capacity: info.total,
            free: info.free,
            allocated: self.stats.allocated_bytes.all().current as usize,
            reserved: self.total_reserved,
            fraction,
            max_split_size: (max_split != usize::MAX).then_some(max_split),
            stream_cached,
            other_streams_cached,
            hint: OomHint::Exhausted,
        };
        AllocError::OutOfMemory(Box::new(oom.diagnose()))
    }

    /// All segments and their blocks, by address.
    pub fn snapshot(&self) -> Snapshot<B::Stream> {
        let mut segments = Vec::new();
        for head in self.blocks.iter() {
            if head.state == State::Vacant || head.prev != NONE {
                continue;
            }
            let mut seg = SegmentInfo {
                address: DevicePtr(head.addr),
                total_size: 0,
                stream: self.streams[head.stream as usize],
                is_small: head.small,
                allocated_size: 0,
                active_size: 0,
                blocks: Vec::new(),
            };
            let mut b = head;
            loop {
                let state = match b.state {
                    State::Allocated => BlockState::ActiveAllocated,
                    State::Pending | State::Leaked => BlockState::ActivePendingFree,
                    _ => BlockState::Inactive,
                };
                seg.total_size += b.size;
                if state == BlockState::ActiveAllocated {
                    seg.allocated_size += b.size;
                }
                if state != BlockState::Inactive {
                    seg.active_size += b.size;
                }
                seg.blocks.push(BlockInfo {
                    address: DevicePtr(b.addr),
                    size: b.size,
                    requested_size: b.requested,
                    state,
                });
                match self.blocks.get(b.next as usize) {
                    Some(next) => b = next,
                    None => break,
                }
            }
            segments.push(seg);
        }
        segments.sort_by_key(|s| s.address);
        Snapshot {
            device: self.device,
            segments,
        }
    }
}

impl<B: Backend> Drop for Policy<B> {
    fn drop(&mut self) {
        // Errors cannot be reported any more; what cannot be released is left to the driver,
        // which reclaims it at process exit.
        if self.backend.synchronize_device().is_ok() {
            let _ = self.release_cached_blocks();
        }
    }
}
