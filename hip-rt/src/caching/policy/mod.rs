//! The caching policy proper: block arena, free pools, split/merge, stream-ordered reuse,
//! garbage collection, release and the out-of-memory path. Everything here runs under the
//! allocator's lock; nothing here knows about HIP.

use std::collections::{HashMap, VecDeque};
use std::hash::BuildHasherDefault;
use std::mem;

use super::backend::{Backend, DevicePtr, MemInfo};
use super::config::AllocatorConfig;
use super::error::AllocError;
use super::stats::{StatType, Stats};
use super::{
    KLARGE_BUFFER, KMIN_BLOCK_SIZE, KMIN_LARGE_ALLOC, KROUND_LARGE, KSMALL_BUFFER, KSMALL_SIZE,
    MAX_REQUEST,
};

mod keys;
mod private;
mod release;

use keys::{AddrHasher, Key, Pool, ADDRESS_LIMIT, MAX_STREAMS};

/// "No block" in the arena's links.
pub(crate) const NONE: u32 = u32::MAX;

/// Rounds a request to the block size: at least 512 B, a multiple of 512 B.
#[inline]
pub fn round_size(size: usize) -> usize {
    if size < KMIN_BLOCK_SIZE {
        KMIN_BLOCK_SIZE
    } else {
        size.div_ceil(KMIN_BLOCK_SIZE) * KMIN_BLOCK_SIZE
    }
}

/// The segment size reserved from the device for a rounded request with no cached fit:
/// 2 MiB for the small pool, 20 MiB for 1–10 MiB, else the request rounded up to 2 MiB.
#[inline]
pub fn allocation_size(rounded: usize) -> usize {
    if rounded <= KSMALL_SIZE {
        KSMALL_BUFFER
    } else if rounded < KMIN_LARGE_ALLOC {
        KLARGE_BUFFER
    } else {
        rounded.div_ceil(KROUND_LARGE) * KROUND_LARGE
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Slot unused.
    Vacant,
    /// Handed out.
    Allocated,
    /// Freed by its owner, waiting for events of other streams.
    Pending,
    /// In a free pool.
    Free,
    /// Freed, but an event could not be recorded nor the device synchronised: never reused.
    Leaked,
}

struct Block {
    addr: u64,
    size: usize,
    requested: usize,
    stream: u32,
    small: bool,
    state: State,
    prev: u32,
    next: u32,
    event_count: u32,
    /// Interned streams other than `stream` that used the block (`record_stream`).
    stream_uses: Vec<u32>,
    /// The pool's `gc_calls` when the block entered it; age = calls since.
    gc_base: u64,
    /// Allocated through the address-keyed API, so present in `by_addr`.
    indexed: bool,
}

impl Block {
    fn is_split(&self) -> bool {
        self.prev != NONE || self.next != NONE
    }

    fn stat_type(&self) -> StatType {
        if self.small {
            StatType::SmallPool
        } else {
            StatType::LargePool
        }
    }
}

/// What a successful allocation hands back: the block id and its address.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Grant {
    pub id: u32,
    pub ptr: DevicePtr,
}

pub(crate) struct Policy<B: Backend> {
    pub backend: B,
    pub config: AllocatorConfig,
    device: i32,
    blocks: Vec<Block>,
    vacant: Vec<u32>,
    small: Pool,
    large: Pool,
    streams: Vec<B::Stream>,
    stream_ids: HashMap<B::Stream, u32>,
    last_stream: u32,
    /// Allocated blocks by address, for frees that only know the pointer.
    by_addr: HashMap<u64, u32, BuildHasherDefault<AddrHasher>>,
    /// Per interned stream: events recorded for blocks used on it, oldest first.
    pending: Vec<VecDeque<(B::Event, u32)>>,
    pending_count: usize,
    pub stats: Stats,
    total_reserved: usize,
    allowed_max: Option<usize>,
    capacity: Option<usize>,
    /// Bytes added to every request before rounding ([`Backend::guard_slack`]), asked at the
    /// first allocation (constructing the policy calls nothing on the backend).
    guard_slack: Option<usize>,
    /// The first error hit while freeing from `Drop`, and how many followed it.
    pub drop_error: Option<AllocError>,
    pub drop_error_count: u64,
    /// Graph capture's private pools (see `private.rs`).
    private: private::Pools<B::Event>,
}

fn backend_err(op: &'static str, device: i32) -> impl FnOnce(super::BackendError) -> AllocError {
    move |source| AllocError::Backend { op, device, source }
}

impl<B: Backend> Policy<B> {
    pub fn new(backend: B, config: AllocatorConfig) -> Result<Self, AllocError> {
        let device = backend.device();
        let mut policy = Policy {
            device,
            blocks: Vec::new(),
            vacant: Vec::new(),
            small: Pool::default(),
            large: Pool::default(),
            streams: Vec::new(),
            stream_ids: HashMap::new(),
            last_stream: NONE,
            by_addr: HashMap::default(),
            pending: Vec::new(),
            pending_count: 0,
            stats: Stats {
                max_split_size: config.max_split_size,
                ..Stats::default()
            },
            total_reserved: 0,
            allowed_max: None,
            capacity: None,
            guard_slack: None,
            drop_error: None,
            drop_error_count: 0,
            private: private::Pools::default(),
            config: AllocatorConfig::default(),
            backend,
        };
        let fraction = config.memory_fraction;
        policy.config = config;
        if let Some(f) = fraction {
            policy.set_memory_fraction(f)?;
        }
        Ok(policy)
    }

    fn mem_info(&mut self) -> Result<MemInfo, AllocError> {
        let info = self
            .backend
            .mem_info()
            .map_err(backend_err("mem_info", self.device))?;
        self.capacity = Some(info.total);
        Ok(info)
    }

    pub fn set_memory_fraction(&mut self, fraction: f64) -> Result<(), AllocError> {
        let fraction = super::config::check_fraction(fraction)?;
        let total = self.mem_info()?.total;
        self.allowed_max = Some((fraction * total as f64) as usize);
        self.config.memory_fraction = Some(fraction);
        Ok(())
    }

    fn stream_id(&mut self, stream: B::Stream) -> Result<u32, AllocError> {
        if let Some(&s) = self.streams.get(self.last_stream as usize) {
            if s == stream {
                return Ok(self.last_stream);
            }
        }
        let next = self.streams.len() as u32;
        let id = match self.stream_ids.get(&stream) {
            Some(&id) => id,
            None if next < MAX_STREAMS => {
                self.stream_ids.insert(stream, next);
                self.streams.push(stream);
                self.pending.push(VecDeque::new());
                next
            }
            None => {
                return Err(AllocError::TooManyStreams {
                    device: self.device,
                    limit: MAX_STREAMS as usize,
                })
            }
        };
        self.last_stream = id;
        Ok(id)
    }

    fn pool_mut(&mut self, small: bool) -> &mut Pool {
        if small {
            &mut self.small
        } else {
            &mut self.large
        }
    }

    fn gc_enabled(&self) -> bool {
        self.config.garbage_collection_threshold > 0.0
    }

    fn new_block(&mut self, block: Block) -> u32 {
        match self.vacant.pop() {
            Some(id) => {
                let slot = &mut self.blocks[id as usize];
                let uses = mem::take(&mut slot.stream_uses);
                *slot = block;
                slot.stream_uses = uses;
                id
            }
            None => {
                self.blocks.push(block);
                (self.blocks.len() - 1) as u32
            }
        }
    }

    fn vacate(&mut self, id: u32) {
        let b = &mut self.blocks[id as usize];
        b.state = State::Vacant;
        b.prev = NONE;
        b.next = NONE;
        b.stream_uses.clear();
        self.vacant.push(id);
    }

    fn key(&self, id: u32) -> Key {
        let b = &self.blocks[id as usize];
        Key::new(b.stream, b.size, b.addr, id)
    }

    fn insert_free(&mut self, id: u32) {
        let key = self.key(id);
        let small = self.blocks[id as usize].small;
        let pool = self.pool_mut(small);
        pool.free.insert(key);
        let base = pool.gc_calls;
        let b = &mut self.blocks[id as usize];
        b.gc_base = base;
        b.state = State::Free;
    }

    fn remove_free(&mut self, id: u32) {
        let key = self.key(id);
        let small = self.blocks[id as usize].small;
        self.pool_mut(small).free.remove(&key);
    }

    /// Allocates `size` bytes (`0 < size`) for use on `stream`; `indexed` makes it findable
    /// by address ([`Policy::allocated_at`]).
    pub fn malloc(
        &mut self,
        size: usize,
        stream: B::Stream,
        indexed: bool,
    ) -> Result<Grant, AllocError> {
        let sid = self.stream_id(stream)?;
        self.malloc_on(size, sid, indexed)
    }

    /// [`Policy::malloc`] for an interned stream or a private pool's id.
    fn malloc_on(&mut self, size: usize, sid: u32, indexed: bool) -> Result<Grant, AllocError> {
        if size > MAX_REQUEST {
            return Err(AllocError::TooLarge { requested: size });
        }
        if self.pending_count > 0 {
            self.process_events()?;
        }
        if self.private.dissolving() {
            self.poll_dissolving(false)?;
        }
        let stream = self.streams[sid as usize];
        let slack = match self.guard_slack {
            Some(slack) => slack,
            None => *self.guard_slack.insert(self.backend.guard_slack()),
        };
        let rounded = round_size(size.saturating_add(slack));
        let small = rounded <= KSMALL_SIZE;
        let id = match self.get_free_block(small, sid, rounded) {
            Some(id) => id,
            None => self.alloc_new(small, sid, size, rounded)?,
        };
        self.alloc_found_block(id, rounded, size);
        let b = &mut self.blocks[id as usize];
        b.indexed = indexed;
        let ptr = DevicePtr(b.addr);
        // Exactly the requested bytes are live: the rounding slack stays poisoned.
        self.backend.mark(ptr, size, true, Some(stream));
        if indexed {
            self.by_addr.insert(ptr.0, id);
        }
        Ok(Grant { id, ptr })
    }

    fn get_free_block(&mut self, small: bool, sid: u32, rounded: usize) -> Option<u32> {
        if rounded as u64 >= ADDRESS_LIMIT {
            // No segment is that large (segments end below the limit); the size would not
            // even fit in a key.
            return None;
        }
        let max_split = self.config.max_split_size;
        let gc = self.gc_enabled();
        let pool = self.pool_mut(small);
        if gc {
            pool.gc_calls += 1;
        }
        let key = *pool.free.range(Key::at_least(sid, rounded)..).next()?;
        let (found, id) = (key.size(), key.id());
        if key.stream() != sid {
            return None;
        }
        // An oversize block does not serve a splittable request, and serves an oversize
        // request only if it wastes less than 20 MiB.
        if rounded < max_split && found >= max_split {
            return None;
        }
        if rounded >= max_split && found >= rounded.saturating_add(KLARGE_BUFFER) {
            return None;
        }
        pool.free.remove(&key);
        Some(id)
    }

    fn alloc_new(
        &mut self,
        small: bool,
        sid: u32,
        size: usize,
        rounded: usize,
    ) -> Result<u32, AllocError> {
        let segment = allocation_size(rounded);
        if self.gc_enabled() {
            self.garbage_collect()?;
        }
        if let Some(id) = self.alloc_segment(small, sid, segment)? {
            return Ok(id);
        }
        if self.release_available_cached_blocks(small, sid, rounded)? {
            if let Some(id) = self.alloc_segment(small, sid, segment)? {
                return Ok(id);
            }
        }
        // PyTorch's last resort: wait for every stream's outstanding events, release every
        // cached segment that holds no live block (all streams), and retry. The wait may
        // also have returned a block of this stream that now fits.
        self.release_cached_blocks()?;
        self.stats.num_alloc_retries += 1;
        if let Some(id) = self.get_free_block(small, sid, rounded) {
            return Ok(id);
        }
        if let Some(id) = self.alloc_segment(small, sid, segment)? {
            return Ok(id);
        }
        self.stats.num_ooms += 1;
        Err(self.out_of_memory((small, sid), size, rounded, segment))
    }

    fn alloc_segment(
        &mut self,
        small: bool,
        sid: u32,
        size: usize,
    ) -> Result<Option<u32>, AllocError> {
        if let Some(allowed) = self.allowed_max {
            if self.total_reserved.saturating_add(size) > allowed {
                return Ok(None);
            }
        }
        let Some(ptr) = self
            .backend
            .malloc(size)
            .map_err(backend_err("malloc", self.device))?
        else {
            return Ok(None);
        };
        if ptr
            .0
            .checked_add(size as u64)
            .map_or(true, |end| end > ADDRESS_LIMIT)
        {
            // SAFETY: `ptr` was just returned by `malloc(size)` and is not recorded anywhere.
            let _ = unsafe { self.backend.free(ptr, size) };
            return Err(AllocError::AddressOutOfRange {
                device: self.device,
                addr: ptr.0,
                size,
            });
        }
        self.total_reserved += size;
        // No block of the new segment is live yet.
        self.backend.mark(ptr, size, false, None);
        let ty = if small {
            StatType::SmallPool
        } else {
            StatType::LargePool
        };
        self.stats.segment.increase(ty, 1);
        self.stats.reserved_bytes.increase(ty, size as u64);
        if size >= self.config.max_split_size {
            self.stats.oversize_segments.increase(1);
        }
        self.stats.num_device_alloc += 1;
        Ok(Some(self.new_block(Block {
            addr: ptr.0,
            size,
            requested: 0,
            stream: sid,
            small,
            state: State::Free,
            prev: NONE,
            next: NONE,
            event_count: 0,
            stream_uses: Vec::new(),
            gc_base: 0,
            indexed: false,
        })))
    }

    fn should_split(&self, b: &Block, rounded: usize) -> bool {
        let remaining = b.size - rounded;
        if b.small {
            remaining >= KMIN_BLOCK_SIZE
        } else {
            rounded < self.config.max_split_size && remaining > KSMALL_SIZE
        }
    }

    fn alloc_found_block(&mut self, id: u32, rounded: usize, requested: usize) {
        let b = &self.blocks[id as usize];
        let ty = b.stat_type();
        let already_split = b.is_split();
        if self.should_split(b, rounded) {
            let rest = Block {
                addr: b.addr + rounded as u64,
                size: b.size - rounded,
                requested: 0,
                stream: b.stream,
                small: b.small,
                state: State::Free,
                prev: id,
                next: b.next,
                event_count: 0,
                stream_uses: Vec::new(),
                gc_base: 0,
                indexed: false,
            };
            let rest_size = rest.size as u64;
            let rest_id = self.new_block(rest);
            let b = &mut self.blocks[id as usize];
            let after = b.next;
            b.next = rest_id;
            b.size = rounded;
            if after != NONE {
                self.blocks[after as usize].prev = rest_id;
            }
            self.insert_free(rest_id);
            if already_split {
                self.stats.inactive_split_bytes.decrease(ty, rounded as u64);
            } else {
                self.stats.inactive_split_bytes.increase(ty, rest_size);
                self.stats.inactive_split.increase(ty, 1);
            }
        } else if already_split {
            self.stats.inactive_split_bytes.decrease(ty, b.size as u64);
            self.stats.inactive_split.decrease(ty, 1);
        }
        let b = &mut self.blocks[id as usize];
        b.state = State::Allocated;
        b.requested = requested;
        let (size, oversize) = (b.size as u64, b.size >= self.config.max_split_size);
        let s = &mut self.stats;
        s.allocation.increase(ty, 1);
        s.allocated_bytes.increase(ty, size);
        s.active.increase(ty, 1);
        s.active_bytes.increase(ty, size);
        s.requested_bytes.increase(ty, requested as u64);
        if oversize {
            s.oversize_allocations.increase(1);
        }
    }

    /// The size of block `id` (rounded; 0 for an unknown id).
    pub fn block_size(&self, id: u32) -> usize {
        self.blocks.get(id as usize).map_or(0, |b| b.size)
    }

    /// The allocated block at `addr`, if any.
    pub fn allocated_at(&self, addr: u64) -> Option<u32> {
        self.by_addr.get(&addr).copied()
    }

    /// `true` if `id` is an allocated block at `addr` (guards raw frees).
    pub fn is_allocated(&self, id: u32, addr: u64) -> bool {
        self.blocks
            .get(id as usize)
            .is_some_and(|b| b.state == State::Allocated && b.addr == addr)
    }

    /// Marks an allocated block as used on `stream` (PyTorch's `recordStream`).
    pub fn record_stream(&mut self, id: u32, stream: B::Stream) -> Result<(), AllocError> {
        let sid = self.stream_id(stream)?;
        let streams = &self.streams;
        if let Some(b) = self.blocks.get_mut(id as usize) {
            // A private pool's block runs on its pool's stream (`streams[b.stream]`).
            let own = streams[b.stream as usize] == stream;
            if b.state == State::Allocated && !own && !b.stream_uses.contains(&sid) {
                b.stream_uses.push(sid);
            }
        }
        Ok(())
    }

    /// Returns an allocated block. Reusable at once on its stream; after the events of
    /// `record_stream` streams complete otherwise.
    pub fn free(&mut self, id: u32) -> Result<(), AllocError> {
        let max_split = self.config.max_split_size;
        let b = &mut self.blocks[id as usize];
        b.state = State::Pending;
        let (ty, size) = (b.stat_type(), b.size);
        if b.indexed {
            self.by_addr.remove(&b.addr);
        }
        self.stats.allocation.decrease(ty, 1);
        self.stats.allocated_bytes.decrease(ty, size as u64);
        if size >= max_split {
            self.stats.oversize_allocations.decrease(1);
        }
        if self.blocks[id as usize].stream_uses.is_empty() {
            self.free_block(id);
            Ok(())
        } else {
            self.insert_events(id)
        }
    }

    fn insert_events(&mut self, id: u32) -> Result<(), AllocError> {
        let uses = mem::take(&mut self.blocks[id as usize].stream_uses);
        let mut failure = None;
        for &sid in &uses {
            let stream = self.streams[sid as usize];
            match self.backend.record_event(stream) {
                Ok(event) => {
                    self.pending[sid as usize].push_back((event, id));
                    self.pending_count += 1;
                    self.blocks[id as usize].event_count += 1;
                }
                Err(e) => failure = Some(backend_err("record_event", self.device)(e)),
            }
        }
        let b = &mut self.blocks[id as usize];
        b.stream_uses = uses;
        b.stream_uses.clear();
        let Some(err) = failure else {
            return Ok(());
        };
        // Without an event we cannot know when the other stream is done: wait for the whole
        // device instead. If even that fails, the block is never reused.
        if self.backend.synchronize_device().is_err() {
            self.blocks[id as usize].state = State::Leaked;
        } else if self.blocks[id as usize].event_count == 0 {
            self.free_block(id);
        }
        Err(err)
    }

    fn event_done(&mut self, sid: usize) {
        if let Some((event, id)) = self.pending[sid].pop_front() {
            self.backend.recycle_event(event);
            self.pending_count -= 1;
            let b = &mut self.blocks[id as usize];
            b.event_count -= 1;
            if b.event_count == 0 && b.state == State::Pending {
                self.free_block(id);
            }
        }
    }

    /// Frees blocks whose events have completed (queries only; never blocks).
    fn process_events(&mut self) -> Result<(), AllocError> {
        for sid in 0..self.pending.len() {
            while let Some((event, _)) = self.pending[sid].front() {
                let done = self
                    .backend
                    .event_query(event)
                    .map_err(backend_err("event_query", self.device))?;
                if !done {
                    break;
                }
                self.event_done(sid);
            }
        }
        Ok(())
    }

    /// Waits for every outstanding event and frees the blocks they held.
    fn synchronize_and_free_events(&mut self) -> Result<(), AllocError> {
        self.stats.num_sync_all_streams += 1;
        for sid in 0..self.pending.len() {
            while let Some((event, _)) = self.pending[sid].front() {
                self.backend
                    .event_synchronize(event)
                    .map_err(backend_err("event_synchronize", self.device))?;
                self.event_done(sid);
            }
        }
        Ok(())
    }

    /// Puts a block back into its pool, merging it with free neighbours.
    fn free_block(&mut self, id: u32) {
        let b = &self.blocks[id as usize];
        let (addr, size, stream) = (DevicePtr(b.addr), b.size, self.streams[b.stream as usize]);
        // A block of the capture under way stays live for the checker: the graph's replays
        // touch it (the pool's free blocks are marked free when it dissolves).
        if b.stream != self.private.capturing() {
            self.backend.mark(addr, size, false, Some(stream));
        }
        let b = &self.blocks[id as usize];
        let (ty, original, requested) = (b.stat_type(), b.size as u64, b.requested as u64);
        let mut net_count: i64 = 0;
        let mut net_bytes: i64 = 0;
        for towards_prev in [true, false] {
            let b = &self.blocks[id as usize];
            let other = if towards_prev { b.prev } else { b.next };
            if other == NONE || self.blocks[other as usize].state != State::Free {
                continue;
            }
            self.remove_free(other);
            let o = &self.blocks[other as usize];
            let (o_addr, o_size, o_prev, o_next) = (o.addr, o.size, o.prev, o.next);
            let b = &mut self.blocks[id as usize];
            b.size += o_size;
            if towards_prev {
                b.addr = o_addr;
                b.prev = o_prev;
                if o_prev != NONE {
                    self.blocks[o_prev as usize].next = id;
                }
            } else {
                b.next = o_next;
                if o_next != NONE {
                    self.blocks[o_next as usize].prev = id;
                }
            }
            self.vacate(other);
            net_count -= 1;
            net_bytes -= o_size as i64;
        }
        self.blocks[id as usize].requested = 0;
        self.insert_free(id);
        let b = &self.blocks[id as usize];
        if b.is_split() {
            net_count += 1;
            net_bytes += b.size as i64;
        }
        let s = &mut self.stats;
        apply_net(&mut s.inactive_split, ty, net_count);
        apply_net(&mut s.inactive_split_bytes, ty, net_bytes);
        s.active.decrease(ty, 1);
        s.active_bytes.decrease(ty, original);
        s.requested_bytes.decrease(ty, requested);
    }

    /// A copy of the statistics.
    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }
}

#[inline]
fn apply_net(array: &mut super::stats::StatArray, ty: StatType, net: i64) {
    if net > 0 {
        array.increase(ty, net as u64);
    } else if net < 0 {
        array.decrease(ty, net.unsigned_abs());
    }
}
