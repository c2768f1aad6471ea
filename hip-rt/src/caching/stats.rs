//! Statistics named as PyTorch's `torch.cuda.memory_stats()` names them, and the snapshot of
//! segments and blocks.

use super::backend::DevicePtr;

/// One statistic: its current value, peak since the last reset, and the totals added and
/// removed since the last reset of accumulated stats.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    /// Current value.
    pub current: u64,
    /// Highest `current` since creation or [`super::CachingAllocator::reset_peak_stats`].
    pub peak: u64,
    /// Sum of all increases.
    pub allocated: u64,
    /// Sum of all decreases.
    pub freed: u64,
}

impl Stat {
    #[inline]
    pub(crate) fn increase(&mut self, amount: u64) {
        self.current += amount;
        self.peak = self.peak.max(self.current);
        self.allocated += amount;
    }

    #[inline]
    pub(crate) fn decrease(&mut self, amount: u64) {
        self.current = self.current.saturating_sub(amount);
        self.freed += amount;
    }
}

/// A key [`Stats::get`] does not know.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{key}` is not a memory_stats key (did you mean `{closest}`?): keys are \
     `<stat>.<all|small_pool|large_pool>.<current|peak|allocated|freed>`, \
     `oversize_allocations.<part>`, `oversize_segments.<part>` or a `num_*` counter, as in \
     torch.cuda.memory_stats(); Stats::to_flat lists every key"
)]
pub struct StatKeyError {
    /// The key asked for.
    pub key: String,
    /// The known key closest to it (edit distance).
    pub closest: String,
}

/// Which pool a statistic covers (PyTorch's `all`, `small_pool`, `large_pool`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatType {
    /// Both pools.
    All = 0,
    /// Requests of at most 1 MiB, carved from 2 MiB segments.
    SmallPool = 1,
    /// Larger requests.
    LargePool = 2,
}

impl StatType {
    /// PyTorch's key fragment.
    pub fn name(self) -> &'static str {
        match self {
            StatType::All => "all",
            StatType::SmallPool => "small_pool",
            StatType::LargePool => "large_pool",
        }
    }
}

/// A [`Stat`] for each [`StatType`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// The stat for one pool type.
    #[inline]
    pub fn get(&self, ty: StatType) -> &Stat {
        &self.0[ty as usize]
    }

    /// The aggregate (`all`) stat.
    pub fn all(&self) -> &Stat {
        self.get(StatType::All)
    }

    #[inline]
    pub(crate) fn increase(&mut self, pool: StatType, amount: u64) {
        self.0[StatType::All as usize].increase(amount);
        self.0[pool as usize].increase(amount);
    }

    #[inline]
    pub(crate) fn decrease(&mut self, pool: StatType, amount: u64) {
        self.0[StatType::All as usize].decrease(amount);
        self.0[pool as usize].decrease(amount);
    }

    fn for_each_mut(&mut self, f: impl Fn(&mut Stat)) {
        self.0.iter_mut().for_each(f);
    }
}

/// The allocator's statistics; field names are PyTorch's `memory_stats()` keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Number of allocated blocks (PyTorch `allocation`).
    pub allocation: StatArray,
    /// Number of device segments (`segment`).
    pub segment: StatArray,
    /// Number of active blocks: allocated, or freed but awaiting other streams' events (`active`).
    pub active: StatArray,
    /// Number of inactive blocks that are part of a split segment (`inactive_split`).
    pub inactive_split: StatArray,
    /// Bytes in allocated blocks (`allocated_bytes`).
    pub allocated_bytes: StatArray,
    /// Bytes in device segments (`reserved_bytes`).
    pub reserved_bytes: StatArray,
    /// Bytes in active blocks (`active_bytes`).
    pub active_bytes: StatArray,
    /// Bytes in inactive blocks of split segments: the fragmentation figure (`inactive_split_bytes`).
    pub inactive_split_bytes: StatArray,
    /// Bytes callers asked for, before rounding (`requested_bytes`).
    pub requested_bytes: StatArray,
    /// Allocated blocks of at least `max_split_size` (`oversize_allocations`).
    pub oversize_allocations: Stat,
    /// Segments of at least `max_split_size` (`oversize_segments`).
    pub oversize_segments: Stat,
    /// Device allocations that failed and were retried after freeing the cache.
    pub num_alloc_retries: u64,
    /// Allocations that ended in an out-of-memory error.
    pub num_ooms: u64,
    /// Times all outstanding events were synchronised (cache release).
    pub num_sync_all_streams: u64,
    /// Backend `malloc` calls that succeeded.
    pub num_device_alloc: u64,
    /// Backend `free` calls.
    pub num_device_free: u64,
    /// The configured split limit in bytes (`usize::MAX` = none).
    pub max_split_size: usize,
}

impl Stats {
    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.allocation,
            &mut self.segment,
            &mut self.active,
            &mut self.inactive_split,
            &mut self.allocated_bytes,
            &mut self.reserved_bytes,
            &mut self.active_bytes,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
        ]
    }

    pub(crate) fn reset_peak(&mut self) {
        for a in self.arrays_mut() {
            a.for_each_mut(|s| s.peak = s.current);
        }
        for s in [&mut self.oversize_allocations, &mut self.oversize_segments] {
            s.peak = s.current;
        }
    }

    pub(crate) fn reset_accumulated(&mut self) {
        for a in self.arrays_mut() {
            a.for_each_mut(|s| {
                s.allocated = 0;
                s.freed = 0;
            });
        }
        for s in [&mut self.oversize_allocations, &mut self.oversize_segments] {
            s.allocated = 0;
            s.freed = 0;
        }
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// One value by its PyTorch key, e.g. `stats.get("allocated_bytes.all.current")`.
    ///
    /// The keys are PyTorch's: `<stat>.<pool>.<part>` for the stats `allocation`, `segment`,
    /// `active`, `inactive_split`, `allocated_bytes`, `reserved_bytes`, `active_bytes`,
    /// `inactive_split_bytes`, `requested_bytes` with pool `all`, `small_pool` or `large_pool`;
    /// `oversize_allocations.<part>` and `oversize_segments.<part>`, where part is `current`,
    /// `peak`, `allocated` or `freed`; and `num_alloc_retries`, `num_ooms`,
    /// `num_sync_all_streams`, `num_device_alloc`, `num_device_free`, `max_split_size`
    /// ([`Stats::to_flat`] lists them all). Any other key is an error naming the closest one,
    /// so a typo is never read as "no such statistic, 0".
    pub fn get(&self, key: &str) -> Result<u64, StatKeyError> {
        let flat = self.to_flat();
        if let Some(v) = flat.iter().find_map(|(k, v)| (k == key).then_some(*v)) {
            return Ok(v);
        }
        let closest = flat
            .iter()
            .map(|(k, _)| (strsim::levenshtein(k, key), k))
            .min()
            .map(|(_, k)| k.clone())
            .unwrap_or_default();
        Err(StatKeyError {
            key: key.to_owned(),
            closest,
        })
    }

    /// The stats as PyTorch's flat `memory_stats()` dictionary, e.g.
    /// `("allocated_bytes.all.current", 1024)`, sorted by key.
    pub fn to_flat(&self) -> Vec<(String, u64)> {
        let arrays: [(&str, &StatArray); 9] = [
            ("allocation", &self.allocation),
            ("segment", &self.segment),
            ("active", &self.active),
            ("inactive_split", &self.inactive_split),
            ("allocated_bytes", &self.allocated_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("active_bytes", &self.active_bytes),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
        ];
        let mut out = Vec::new();
        let mut push_stat = |prefix: String, s: &Stat| {
            for (part, v) in [
                ("current", s.current),
                ("peak", s.peak),
                ("allocated", s.allocated),
                ("freed", s.freed),
            ] {
                out.push((format!("{prefix}.{part}"), v));
            }
        };
        for (name, array) in arrays {
            for ty in [StatType::All, StatType::SmallPool, StatType::LargePool] {
                push_stat(format!("{name}.{}", ty.name()), array.get(ty));
            }
        }
        push_stat("oversize_allocations".into(), &self.oversize_allocations);
        push_stat("oversize_segments".into(), &self.oversize_segments);
        for (k, v) in [
            ("num_alloc_retries", self.num_alloc_retries),
            ("num_ooms", self.num_ooms),
            ("num_sync_all_streams", self.num_sync_all_streams),
            ("num_device_alloc", self.num_device_alloc),
            ("num_device_free", self.num_device_free),
            ("max_split_size", self.max_split_size as u64),
        ] {
            out.push((k.into(), v));
        }
        out.sort();
        out
    }
}

/// The state of one block in a [`Snapshot`] (PyTorch's `active_allocated`,
/// `active_pending_free`, `inactive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockState {
    /// Handed out to a caller.
    ActiveAllocated,
    /// Freed by its owner, waiting for events on streams it was used on.
    ActivePendingFree,
    /// Cached and free for reuse on its segment's stream.
    Inactive,
}

/// One block of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockInfo {
    /// Start address.
    pub address: DevicePtr,
    /// Size in bytes (a multiple of 512).
    pub size: usize,
    /// Bytes the caller asked for (0 for inactive blocks).
    pub requested_size: usize,
    /// Its state.
    pub state: BlockState,
}

/// One device segment (a backend `malloc`) and its blocks in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo<S> {
    /// Start address.
    pub address: DevicePtr,
    /// Size in bytes.
    pub total_size: usize,
    /// The stream the segment serves.
    pub stream: S,
    /// `true` for the small pool (2 MiB segments).
    pub is_small: bool,
    /// Bytes in allocated blocks.
    pub allocated_size: usize,
    /// Bytes in active blocks (allocated or pending free).
    pub active_size: usize,
    /// The blocks, contiguous from `address`.
    pub blocks: Vec<BlockInfo>,
}

/// A snapshot of all segments, sorted by address (PyTorch's `memory_snapshot()`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot<S> {
    /// The device ordinal.
    pub device: i32,
    /// The segments.
    pub segments: Vec<SegmentInfo<S>>,
}
