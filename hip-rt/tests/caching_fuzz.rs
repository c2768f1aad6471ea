//! 10,000 random alloc / free / record_stream / stream completion / empty_cache operations
//! with a fixed seed, writing a pattern into every block and checking it on free; after
//! every operation the allocator's invariants are checked against a recount.

use hip_rt::caching::{
    Allocation, AllocatorConfig, BlockState, CachingAllocator, DevicePtr, HostBackend, HostStream,
    Stat, StatArray, StatType, Stats, MIB,
};

/// splitmix64: tiny, well-distributed, reproducible.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A live allocation: a handle, or (one in four) only an address freed with `free_ptr`.
struct Live {
    handle: Option<Allocation<HostBackend>>,
    ptr: DevicePtr,
    size: usize,
    stream: HostStream,
    tag: u8,
}

impl Live {
    fn record_stream(&self, alloc: &CachingAllocator<HostBackend>, stream: HostStream) {
        match &self.handle {
            Some(h) => h.record_stream(stream).unwrap(),
            None => alloc.record_stream_ptr(self.ptr, stream).unwrap(),
        }
    }

    fn free(self, alloc: &CachingAllocator<HostBackend>) {
        check_pattern(&self);
        if self.handle.is_none() {
            // SAFETY: `ptr` came from `allocate_ptr` on `alloc`, is freed only here, and
            // this `Live` (the only user) is consumed.
            unsafe { alloc.free_ptr(self.ptr) }.unwrap();
        }
    }
}

/// Offsets written in a block: every byte of the first and last 4 KiB, and one byte per
/// 16 KiB in between (page-touching every byte of 40 MiB blocks makes debug runs slow;
/// overlap of live blocks is also checked exactly from their address ranges).
fn pattern_offsets(size: usize) -> impl Iterator<Item = usize> {
    let edge = size.min(4096);
    let head = 0..edge;
    let middle = (edge..size.saturating_sub(4096)).step_by(16 * 1024);
    let tail = size.saturating_sub(4096).max(edge)..size;
    head.chain(middle).chain(tail)
}

fn write_pattern(live: &Live) {
    let base = live.ptr.0 as *mut u8;
    for off in pattern_offsets(live.size) {
        // SAFETY: `off < size` and the block is a live host allocation of at least `size`
        // bytes that this test owns exclusively.
        unsafe { base.add(off).write(live.tag ^ (off as u8)) };
    }
}

fn check_pattern(live: &Live) {
    let base = live.ptr.0 as *const u8;
    for off in pattern_offsets(live.size) {
        // SAFETY: as in `write_pattern`; the byte was written there.
        let got = unsafe { base.add(off).read() };
        assert_eq!(
            got,
            live.tag ^ (off as u8),
            "corrupted at +{off} of {:?} ({} B)",
            live.ptr,
            live.size
        );
    }
}

fn pool_of(is_small: bool) -> StatType {
    if is_small {
        StatType::SmallPool
    } else {
        StatType::LargePool
    }
}

/// Recomputes the `current` of every stat from the snapshot and compares.
fn check_invariants(alloc: &CachingAllocator<HostBackend>, host: &HostBackend, live: &[Live]) {
    let snap = alloc.snapshot();
    let stats = alloc.stats();
    let mut want = Stats::default();
    let add = |a: &mut StatArray, ty: StatType, v: usize| {
        a.0[0].current += v as u64;
        a.0[ty as usize].current += v as u64;
    };
    let mut prev_end = 0;
    for seg in &snap.segments {
        assert!(seg.address.0 >= prev_end, "segments overlap");
        prev_end = seg.address.0 + seg.total_size as u64;
        let ty = pool_of(seg.is_small);
        add(&mut want.segment, ty, 1);
        add(&mut want.reserved_bytes, ty, seg.total_size);
        let mut cursor = seg.address.0;
        let split = seg.blocks.len() > 1;
        for (i, b) in seg.blocks.iter().enumerate() {
            assert_eq!(b.address.0, cursor, "blocks not contiguous");
            assert_eq!(b.size % 512, 0);
            cursor += b.size as u64;
            match b.state {
                BlockState::ActiveAllocated => {
                    add(&mut want.allocation, ty, 1);
                    add(&mut want.allocated_bytes, ty, b.size);
                }
                BlockState::Inactive => {
                    if split {
                        add(&mut want.inactive_split, ty, 1);
                        add(&mut want.inactive_split_bytes, ty, b.size);
                    }
                    let next_free = seg
                        .blocks
                        .get(i + 1)
                        .is_some_and(|n| n.state == BlockState::Inactive);
                    assert!(!next_free, "two adjacent free blocks not merged");
                }
                BlockState::ActivePendingFree => {}
            }
            if b.state != BlockState::Inactive {
                add(&mut want.active, ty, 1);
                add(&mut want.active_bytes, ty, b.size);
                add(&mut want.requested_bytes, ty, b.requested_size);
            }
        }
        assert_eq!(cursor, prev_end, "blocks do not cover their segment");
    }
    let current = |a: &StatArray| a.0.map(|s: Stat| s.current);
    let pairs = [
        ("allocation", &stats.allocation, &want.allocation),
        ("segment", &stats.segment, &want.segment),
        ("active", &stats.active, &want.active),
        (
            "inactive_split",
            &stats.inactive_split,
            &want.inactive_split,
        ),
        (
            "allocated_bytes",
            &stats.allocated_bytes,
            &want.allocated_bytes,
        ),
        (
            "reserved_bytes",
            &stats.reserved_bytes,
            &want.reserved_bytes,
        ),
        ("active_bytes", &stats.active_bytes, &want.active_bytes),
        (
            "inactive_split_bytes",
            &stats.inactive_split_bytes,
            &want.inactive_split_bytes,
        ),
        (
            "requested_bytes",
            &stats.requested_bytes,
            &want.requested_bytes,
        ),
    ];
    for (name, got, want) in pairs {
        assert_eq!(current(got), current(want), "stat {name} != recount");
        for s in got.0 {
            assert!(
                s.peak >= s.current && s.allocated - s.freed == s.current,
                "{name}"
            );
        }
    }
    let reserved = stats.reserved_bytes.all().current;
    assert!(reserved >= stats.allocated_bytes.all().current);
    assert_eq!(reserved as usize, host.used(), "reserved != backend usage");
    assert_eq!(
        stats.segment.all().current as usize,
        host.live_allocations()
    );
    assert_eq!(stats.allocation.all().current as usize, live.len());

    // Every live handle sits in an allocated block big enough for it; none overlap.
    let mut ranges: Vec<(u64, u64)> = live
        .iter()
        .map(|l| (l.ptr.0, l.ptr.0 + l.size as u64))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(w[0].1 <= w[1].0, "live allocations overlap: {w:?}");
    }
    for l in live {
        let seg = snap
            .segments
            .iter()
            .find(|s| {
                let a = l.ptr.0;
                a >= s.address.0 && a < s.address.0 + s.total_size as u64
            })
            .expect("live allocation inside a segment");
        assert_eq!(seg.stream, l.stream, "block served on a foreign stream");
        let b = seg
            .blocks
            .iter()
            .find(|b| b.address == l.ptr)
            .expect("live allocation starts a block");
        assert_eq!(b.state, BlockState::ActiveAllocated);
        assert!(b.size >= l.size && b.requested_size == l.size);
    }
}

fn random_size(rng: &mut SplitMix64) -> usize {
    match rng.below(100) {
        0..=59 => 1 + rng.below(64 * 1024) as usize,
        60..=84 => 1 + rng.below(MIB as u64) as usize,
        85..=95 => MIB + rng.below(9 * MIB as u64) as usize,
        _ => 10 * MIB + rng.below(30 * MIB as u64) as usize,
    }
}

fn run(seed: u64, config: AllocatorConfig, ops: usize) -> Stats {
    let host = HostBackend::new(160 * MIB);
    let alloc = CachingAllocator::with_config(host.clone(), config).unwrap();
    let streams = [HostStream::DEFAULT, host.new_stream(), host.new_stream()];
    let mut rng = SplitMix64(seed);
    let mut live: Vec<Live> = Vec::new();
    for op in 0..ops {
        let pick = rng.below(1000);
        match pick {
            0..=449 => {
                let size = random_size(&mut rng);
                let stream = streams[rng.below(3) as usize];
                let by_ptr = rng.below(4) == 0;
                let made = if by_ptr {
                    alloc.allocate_ptr(size, stream).map(|ptr| (None, ptr))
                } else {
                    alloc.allocate(size, stream).map(|a| {
                        let ptr = a.ptr();
                        (Some(a), ptr)
                    })
                };
                match made {
                    Ok((handle, ptr)) => {
                        let l = Live {
                            handle,
                            ptr,
                            size,
                            stream,
                            tag: op as u8,
                        };
                        write_pattern(&l);
                        live.push(l);
                    }
                    Err(e) => {
                        let oom = e.as_out_of_memory().expect("only OOM errors");
                        assert_eq!(oom.requested, size);
                        assert!(!oom.to_string().is_empty());
                    }
                }
            }
            450..=799 if !live.is_empty() => {
                let l = live.swap_remove(rng.below(live.len() as u64) as usize);
                l.free(&alloc);
            }
            800..=899 if !live.is_empty() => {
                let l = &live[rng.below(live.len() as u64) as usize];
                l.record_stream(&alloc, streams[rng.below(3) as usize]);
            }
            900..=979 => host.complete_stream(streams[rng.below(3) as usize]),
            980..=994 => alloc.empty_cache().unwrap(),
            _ => {
                for l in live.drain(..) {
                    l.free(&alloc);
                }
                alloc.empty_cache().unwrap();
                assert_eq!(alloc.stats().reserved_bytes.all().current, 0);
                assert_eq!(host.used(), 0);
            }
        }
        check_invariants(&alloc, &host, &live);
    }
    for l in live.drain(..) {
        l.free(&alloc);
    }
    alloc.empty_cache().unwrap();
    check_invariants(&alloc, &host, &live);
    assert_eq!(
        host.used(),
        0,
        "nothing reserved after a full free + empty_cache"
    );
    alloc.check_err().unwrap();
    alloc.stats()
}

#[test]
fn fuzz_default_config() {
    let stats = run(0x5EED_0001, AllocatorConfig::default(), 10_000);
    // The run must have exercised the interesting paths, or it proves little.
    assert!(stats.num_alloc_retries > 0, "{stats:?}");
    assert!(stats.num_ooms > 0, "{stats:?}");
    assert!(stats.inactive_split.all().peak > 0);
    assert!(stats.active.all().allocated > stats.allocation.all().allocated / 2);
}

#[test]
fn fuzz_split_limit_and_gc() {
    let config =
        AllocatorConfig::parse("max_split_size_mb:24,garbage_collection_threshold:0.6").unwrap();
    let stats = run(0x5EED_0002, config, 10_000);
    assert!(stats.oversize_segments.peak > 0, "{stats:?}");
    assert!(stats.num_device_free > 0);
}
