//! Device (and pinned host) allocations: host mmaps laid out so that faults and corruption show.
//!
//! ```text
//! | guard page | head slack (canary) | user bytes (NaN fill) | tail slack (canary) | guard page |
//!               ^ page aligned         ^ start (256-aligned)                       ^ page aligned
//! ```
//! The user range is rounded up to 256 bytes and placed so that its rounded end abuts the tail
//! guard page: an access past the rounded end faults at once, an access into the slack (at most
//! 255 bytes past the end, or before the start) is caught by the canary check after each launch.
//! New allocations are filled with 0xFF bytes, a NaN in f16, bf16, f32 and f64. A freed
//! allocation is made inaccessible (PROT_NONE, its pages released) and kept in a bounded
//! quarantine, so a use after free faults and is reported as such.
//!
//! Poisoning (like AddressSanitizer's manual poisoning API): a sub-allocator that carves blocks
//! out of one allocation (hip-rt's caching allocator) marks the bytes that belong to no live
//! block as poisoned ([`set_poison`]; exported as `hipemuPoison` and `hipemuPoisonAsync`). Pages wholly
//! poisoned are made PROT_NONE (an access faults at once); poisoned bytes of the other pages
//! hold canaries, checked after every launch like the slack. Either way the report names the
//! live block the access ran past, as for an allocation of its own (see [`describe_address`]).
//!
//! The canaries only see writes that change a byte. The overrun check sees every access: the
//! slack and the poisoned bytes are also poisoned in the shadow that the instrumented host
//! builds read before each load and store (`exec::overrun`), so a read, or a write of the bytes
//! already there, is reported by the launch that made it.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::sync::Mutex;

use hip_sys::hipError_t;

use super::error::{Fail, Res};
use crate::exec::overrun;

/// Alignment of every allocation's start (HIP guarantees at least 256).
pub const ALIGN: usize = 256;
/// Byte every new allocation is filled with: all-ones is a NaN in every float width.
pub const NAN_FILL: u8 = 0xFF;
/// Freed allocations kept inaccessible, by count and total mapped bytes.
const QUARANTINE_COUNT: usize = 1024;
const QUARANTINE_BYTES: usize = 16 << 30;

/// Who owns an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    Device(i32),
    PinnedHost,
}

/// One mapping.
#[derive(Debug, Clone)]
pub struct Allocation {
    /// The user's pointer.
    pub start: usize,
    /// Bytes requested.
    pub size: usize,
    /// `size` rounded up to [`ALIGN`] (what capacity accounting charges).
    pub rounded: usize,
    pub owner: Owner,
    /// Serial number, for messages.
    pub id: u64,
    map_base: usize,
    map_len: usize,
}

impl Allocation {
    pub fn end(&self) -> usize {
        self.start + self.size
    }

    /// "allocation #3 (4096 bytes at 0x7f..., device 0)".
    pub fn describe(&self) -> String {
        let owner = match self.owner {
            Owner::Device(d) => format!("device {d}"),
            Owner::PinnedHost => "pinned host".to_owned(),
        };
        format!(
            "allocation #{} ({} bytes at {:#x}, {owner})",
            self.id, self.size, self.start
        )
    }

    /// The slack regions that hold canaries: before the start and after the end.
    fn slack(&self) -> [(usize, usize); 2] {
        let data_base = self.map_base + page_size();
        [
            (data_base, self.start),
            (self.end(), self.start + self.rounded),
        ]
    }
}

/// The process's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|p| *p > 0).unwrap_or(4096)
}

/// The canary byte at address `addr`: varies with the address, so a constant written over the
/// slack is still noticed.
fn canary(addr: usize) -> u8 {
    let x = (addr as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    ((x >> 56) as u8) | 1
}

#[derive(Default)]
struct Table {
    live: BTreeMap<usize, Allocation>,
    /// Poisoned ranges (start -> end), disjoint and merged, each inside a live allocation.
    poisoned: BTreeMap<usize, usize>,
    /// Pages made PROT_NONE because they are wholly poisoned.
    none_pages: std::collections::BTreeSet<usize>,
    /// Freed, still mapped PROT_NONE, oldest first.
    quarantine: VecDeque<Allocation>,
    quarantine_bytes: usize,
    next_id: u64,
}

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

fn with_table<R>(f: impl FnOnce(&mut Table) -> R) -> R {
    let mut guard = TABLE.lock().unwrap_or_else(|p| p.into_inner());
    f(guard.get_or_insert_with(Table::default))
}

/// Map a new allocation of `size` (> 0) bytes for `owner`. Capacity is the caller's business.
pub fn allocate(size: usize, owner: Owner) -> Res<Allocation> {
    let page = page_size();
    let too_big = || {
        Fail::new(
            hipError_t::hipErrorOutOfMemory,
            format!("{size} bytes cannot be mapped"),
        )
    };
    let rounded = size.checked_next_multiple_of(ALIGN).ok_or_else(too_big)?;
    let data_len = rounded.checked_next_multiple_of(page).ok_or_else(too_big)?;
    let map_len = data_len.checked_add(2 * page).ok_or_else(too_big)?;
    // SAFETY: an anonymous private mapping at an address the kernel chooses; no existing memory
    // is affected.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(Fail::new(
            hipError_t::hipErrorOutOfMemory,
            format!(
                "mmap of {map_len} bytes for a {size}-byte allocation failed: {}",
                std::io::Error::last_os_error()
            ),
        ));
    }
    let map_base = base as usize;
    let data = map_base + page;
    // SAFETY: [data, data + data_len) lies inside the mapping just created (between the guards).
    let rc = unsafe {
        libc::mprotect(
            data as *mut c_void,
            data_len,
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: unmapping exactly the mapping created above, which nothing else references.
        unsafe { libc::munmap(base, map_len) };
        return Err(Fail::new(
            hipError_t::hipErrorOutOfMemory,
            format!("mprotect of a {size}-byte allocation failed: {err}"),
        ));
    }
    let start = data + data_len - rounded;
    let alloc = with_table(|t| {
        t.next_id += 1;
        Allocation {
            start,
            size,
            rounded,
            owner,
            id: t.next_id,
            map_base,
            map_len,
        }
    });
    // SAFETY: the user range lies in the read-write part of the fresh mapping.
    unsafe { std::ptr::write_bytes(start as *mut u8, NAN_FILL, size) };
    for (lo, hi) in alloc.slack() {
        for addr in lo..hi {
            // SAFETY: the slack lies in the read-write part of the fresh mapping.
            unsafe { *(addr as *mut u8) = canary(addr) };
        }
    }
    // The overrun check's shadow: the slack on both sides is poisoned, the user bytes not.
    let end = alloc.end();
    let data_base = alloc.map_base + page;
    overrun::update(data_base, start, false, |_| false);
    overrun::update(start, end, true, |b| b < end);
    overrun::update(end, start + rounded, false, |b| b < end);
    with_table(|t| t.live.insert(start, alloc.clone()));
    Ok(alloc)
}

/// Free the allocation that starts at `ptr` and is owned by `owner`-kind memory; it goes into
/// quarantine. Err names what `ptr` is instead (inside another allocation, already freed, unknown).
pub fn free(ptr: usize, pinned: bool) -> Res<Allocation> {
    with_table(|t| {
        let owned_here = |a: &Allocation| (a.owner == Owner::PinnedHost) == pinned;
        match t.live.get(&ptr) {
            Some(a) if owned_here(a) => {}
            Some(a) => {
                return Err(Fail::invalid(format!(
                    "{:#x} is {}, freed with the wrong call ({})",
                    ptr,
                    a.describe(),
                    if pinned {
                        "hipHostFree of device memory"
                    } else {
                        "hipFree of pinned host memory"
                    }
                )))
            }
            None => return Err(Fail::invalid(describe_unknown(t, ptr, "free"))),
        }
        let alloc = t.live.remove(&ptr).expect("checked above");
        drop_poison(t, alloc.map_base, alloc.map_base + alloc.map_len);
        let data = alloc.map_base + page_size();
        let data_len = alloc.map_len - 2 * page_size();
        // SAFETY: the data pages belong to this allocation, which was just removed from the live
        // table: nothing in the runtime uses them any more (the caller waited for the device).
        unsafe {
            libc::madvise(data as *mut c_void, data_len, libc::MADV_DONTNEED);
            libc::mprotect(data as *mut c_void, data_len, libc::PROT_NONE);
        }
        t.quarantine_bytes += alloc.map_len;
        t.quarantine.push_back(alloc.clone());
        while t.quarantine.len() > QUARANTINE_COUNT || t.quarantine_bytes > QUARANTINE_BYTES {
            let Some(old) = t.quarantine.pop_front() else {
                break;
            };
            t.quarantine_bytes -= old.map_len;
            overrun::clear(old.map_base, old.map_base + old.map_len);
            // SAFETY: the oldest quarantined mapping: inaccessible and referenced by nobody.
            unsafe { libc::munmap(old.map_base as *mut c_void, old.map_len) };
        }
        Ok(alloc)
    })
}

/// Message for a pointer that is not the start of a live allocation.
fn describe_unknown(t: &Table, ptr: usize, what: &str) -> String {
    if let Some(a) = containing(&t.live, ptr) {
        return format!(
            "{ptr:#x} points {} bytes into {}, not at its start: {what} needs the pointer hipMalloc returned",
            ptr - a.start,
            a.describe()
        );
    }
    match freed_containing(t, ptr) {
        Some(a) => format!(
            "{ptr:#x} was already freed ({}, now quarantined)",
            a.describe()
        ),
        None => format!("{ptr:#x} is not an allocation of this runtime"),
    }
}

fn containing(live: &BTreeMap<usize, Allocation>, ptr: usize) -> Option<&Allocation> {
    live.range(..=ptr)
        .next_back()
        .map(|(_, a)| a)
        .filter(|a| ptr <= a.end())
}

fn freed_containing(t: &Table, ptr: usize) -> Option<&Allocation> {
    t.quarantine
        .iter()
        .rev()
        .find(|a| ptr >= a.map_base && ptr < a.map_base + a.map_len)
}

/// What `addr` is, for fault messages: inside/near a live allocation, in a freed one, or unknown.
pub fn describe_address(addr: usize) -> String {
    with_table(|t| {
        if let Some(text) = describe_poisoned(t, addr) {
            return text;
        }
        let near = t
            .live
            .range(..=addr.saturating_add(2 * page_size()))
            .rev()
            .take(4);
        for (_, a) in near {
            if addr >= a.map_base && addr < a.map_base + a.map_len {
                return if addr < a.start {
                    format!(
                        "{addr:#x} is {} bytes before the start of {}",
                        a.start - addr,
                        a.describe()
                    )
                } else if addr >= a.end() {
                    format!(
                        "{addr:#x} is {} bytes past the end of {}",
                        addr - a.end(),
                        a.describe()
                    )
                } else {
                    format!("{addr:#x} is inside {}", a.describe())
                };
            }
        }
        match freed_containing(t, addr) {
            Some(a) => format!("{addr:#x} is in freed {} (use after free)", a.describe()),
            None => format!("{addr:#x} is not in any allocation of this runtime"),
        }
    })
}

/// Check that `[ptr, ptr + len)` lies inside one live allocation (`len` 0: `ptr` in or one past
/// the end of one). `what` names the use in the error.
pub fn check_range(ptr: usize, len: usize, what: &str) -> Res<Allocation> {
    with_table(|t| {
        let a = containing(&t.live, ptr).cloned();
        match a {
            Some(a) if ptr.checked_add(len).is_some_and(|end| end <= a.end()) => Ok(a),
            Some(a) => Err(Fail::invalid(format!(
                "{what}: {len} bytes at {ptr:#x} run {} bytes past the end of {}",
                ptr + len - a.end(),
                a.describe()
            ))),
            None => Err(Fail::invalid(format!(
                "{what}: {}",
                match freed_containing(t, ptr) {
                    Some(f) => format!("{ptr:#x} is in freed {} (use after free)", f.describe()),
                    None => format!("{ptr:#x} is not in a live allocation of this runtime"),
                }
            ))),
        }
    })
}

/// The live allocation `ptr` lies in (or one past the end of), if any.
pub fn allocation_at(ptr: usize) -> Option<Allocation> {
    with_table(|t| containing(&t.live, ptr).cloned())
}

/// True when `ptr` lies in (or one past the end of) a live allocation.
pub fn is_live(ptr: usize) -> bool {
    with_table(|t| containing(&t.live, ptr).is_some())
}

/// Every live allocation whose canaries were overwritten, with the first bad address.
pub fn corrupted_canaries() -> Vec<(Allocation, usize)> {
    with_table(|t| {
        let mut bad = Vec::new();
        let page = page_size();
        let ranges: Vec<(usize, usize)> = t.poisoned.iter().map(|(&s, &e)| (s, e)).collect();
        for (s, e) in ranges {
            // Pages wholly inside [s, e) are PROT_NONE: only the partial first and last pages
            // hold canaries.
            let head = (s, e.min(s.next_multiple_of(page)));
            let tail = ((e / page * page).max(head.1), e);
            for (lo, hi) in [head, tail] {
                if lo >= hi || t.none_pages.contains(&(lo / page * page)) {
                    continue;
                }
                // SAFETY: the page is mapped read-write (not in none_pages) and lies in a live
                // allocation (poisoned ranges are dropped when their allocation is freed).
                let hit = (lo..hi).find(|&addr| unsafe { *(addr as *const u8) } != canary(addr));
                if let Some(addr) = hit {
                    if let Some(a) = containing(&t.live, addr) {
                        bad.push((a.clone(), addr));
                    }
                    for addr in lo..hi {
                        // SAFETY: as above.
                        unsafe { *(addr as *mut u8) = canary(addr) };
                    }
                }
            }
        }
        for a in t.live.values() {
            let hit = a.slack().into_iter().find_map(|(lo, hi)| {
                // SAFETY: the slack lies in the read-write part of a live allocation's mapping.
                (lo..hi).find(|&addr| unsafe { *(addr as *const u8) } != canary(addr))
            });
            if let Some(addr) = hit {
                bad.push((a.clone(), addr));
                // Restore, so the next launch reports only new damage.
                for (lo, hi) in a.slack() {
                    for addr in lo..hi {
                        // SAFETY: as above.
                        unsafe { *(addr as *mut u8) = canary(addr) };
                    }
                }
            }
        }
        bad
    })
}

/// Err when `[ptr, ptr + len)` reaches poisoned memory (checked when a queued copy or memset
/// runs: poisoning is stream-ordered).
pub fn check_unpoisoned(ptr: usize, len: usize, what: &str) -> Res {
    with_table(|t| match first_poisoned(t, ptr, ptr.saturating_add(len)) {
        None => Ok(()),
        Some(bad) => Err(Fail::new(
            hipError_t::hipErrorIllegalAddress,
            format!(
                "{what}: {len} bytes at {ptr:#x} reach memory outside every live block: {}",
                describe_poisoned(t, bad).unwrap_or_default()
            ),
        )),
    })
}

/// The first poisoned address in `[lo, hi)`, if any.
fn first_poisoned(t: &Table, lo: usize, hi: usize) -> Option<usize> {
    if let Some((_, &e)) = t.poisoned.range(..=lo).next_back() {
        if e > lo {
            return Some(lo);
        }
    }
    t.poisoned.range(lo..hi).next().map(|(&s, _)| s)
}

/// "addr is N bytes past the end of allocation (a live block of M bytes at ..., inside
/// allocation #k ...)" when `addr` is poisoned.
fn describe_poisoned(t: &Table, addr: usize) -> Option<String> {
    let (&s, &e) = t.poisoned.range(..=addr).next_back()?;
    if addr >= e {
        return None;
    }
    let a = containing(&t.live, addr)?;
    // The live block before this poisoned range: from the previous range's end (or the
    // allocation's start) to `s`.
    let block_start = t
        .poisoned
        .range(..s)
        .next_back()
        .map_or(a.start, |(_, &pe)| pe)
        .max(a.start);
    if s > a.start && block_start < s {
        return Some(format!(
            "{addr:#x} is {} bytes past the end of allocation (a live block of {} bytes at {block_start:#x} that a caching allocator handed out of {})",
            addr - s,
            s - block_start,
            a.describe()
        ));
    }
    if e < a.end() {
        let next_end = t.poisoned.range(e..).next().map_or(a.end(), |(&ns, _)| ns);
        return Some(format!(
            "{addr:#x} is {} bytes before the start of allocation (a live block of {} bytes at {e:#x} that a caching allocator handed out of {})",
            e - addr,
            next_end - e,
            a.describe()
        ));
    }
    Some(format!(
        "{addr:#x} is in a part of {} that holds no live block (a freed block of a caching allocator: use after free?)",
        a.describe()
    ))
}

/// Forgets the poisoning inside `[lo, hi)` (an allocation being freed).
fn drop_poison(t: &mut Table, lo: usize, hi: usize) {
    let keys: Vec<usize> = t.poisoned.range(lo..hi).map(|(&s, _)| s).collect();
    for k in keys {
        t.poisoned.remove(&k);
    }
    let pages: Vec<usize> = t.none_pages.range(lo..hi).copied().collect();
    for p in pages {
        t.none_pages.remove(&p);
    }
}

/// Marks `[ptr, ptr + len)` (inside one live device allocation) as poisoned (`live` false) or
/// as a live block again (`live` true); see the module docs.
pub fn set_poison(ptr: usize, len: usize, live: bool) -> Res {
    if len == 0 {
        return Ok(());
    }
    with_table(|t| {
        let Some(a) = containing(&t.live, ptr).cloned() else {
            return Err(Fail::invalid(format!(
                "hipemuPoison: {ptr:#x} is not in a live allocation"
            )));
        };
        let end = ptr
            .checked_add(len)
            .filter(|&e| e <= a.end())
            .ok_or_else(|| {
                Fail::invalid(format!(
                    "hipemuPoison: {len} bytes at {ptr:#x} run past the end of {}",
                    a.describe()
                ))
            })?;
        // Remove [ptr, end) from the set, keeping the parts of overlapping ranges outside it.
        let mut overlapping: Vec<(usize, usize)> = t
            .poisoned
            .range(..end)
            .rev()
            .take_while(|(_, &e)| e >= ptr)
            .map(|(&s, &e)| (s, e))
            .collect();
        overlapping.retain(|&(s, e)| e > ptr || (!live && e == ptr) || s >= ptr);
        let (mut lo, mut hi) = (ptr, end);
        for &(s, e) in &overlapping {
            t.poisoned.remove(&s);
            if live {
                if s < ptr {
                    t.poisoned.insert(s, ptr);
                }
                if e > end {
                    t.poisoned.insert(end, e);
                }
            } else {
                lo = lo.min(s);
                hi = hi.max(e);
            }
        }
        if !live {
            // Merge with a range starting right at the end.
            if let Some(e2) = t.poisoned.remove(&hi) {
                hi = e2;
            }
            t.poisoned.insert(lo, hi);
        }
        reprotect(t, &a, ptr, end);
        overrun::update(ptr, end, live, |b| {
            b >= a.start && b < a.end() && first_poisoned(t, b, b + 1).is_none()
        });
        Ok(())
    })
}

/// Page protections and canaries of the pages overlapping `[lo, hi)` after a change.
fn reprotect(t: &mut Table, a: &Allocation, lo: usize, hi: usize) {
    let page = page_size();
    let data_lo = a.map_base + page;
    let data_hi = a.map_base + a.map_len - page;
    let mut p = (lo / page * page).max(data_lo);
    while p < hi.next_multiple_of(page).min(data_hi) {
        let covered = first_unpoisoned(t, p, p + page).is_none();
        let was_none = t.none_pages.contains(&p);
        if covered && !was_none {
            // SAFETY: a page of this live allocation's data, wholly poisoned: no live block
            // uses it.
            unsafe { libc::mprotect(p as *mut c_void, page, libc::PROT_NONE) };
            t.none_pages.insert(p);
        } else if !covered {
            if was_none {
                // SAFETY: a page of this live allocation's data that holds live bytes again.
                unsafe {
                    libc::mprotect(p as *mut c_void, page, libc::PROT_READ | libc::PROT_WRITE)
                };
                t.none_pages.remove(&p);
            }
            let parts: Vec<(usize, usize)> = t
                .poisoned
                .range(..p + page)
                .rev()
                .take_while(|(_, &e)| e > p)
                .map(|(&s, &e)| (s.max(p), e.min(p + page)))
                .collect();
            for (s, e) in parts {
                for addr in s..e {
                    // SAFETY: read-write page of a live allocation; poisoned bytes belong to
                    // no live block.
                    unsafe { *(addr as *mut u8) = canary(addr) };
                }
            }
        }
        p += page;
    }
}

/// The first byte of `[lo, hi)` that is not poisoned, if any.
fn first_unpoisoned(t: &Table, lo: usize, hi: usize) -> Option<usize> {
    let mut at = lo;
    if let Some((_, &e)) = t.poisoned.range(..=at).next_back() {
        if e > at {
            at = e;
        }
    }
    while at < hi {
        match t.poisoned.get(&at) {
            Some(&e) => at = e,
            None => return Some(at),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_alignment_fill_and_lookup() {
        let a = allocate(1000, Owner::Device(0)).unwrap();
        assert_eq!(a.start % ALIGN, 0);
        assert_eq!(a.rounded, 1024);
        assert_eq!(
            (a.start + a.rounded) % page_size(),
            0,
            "rounded end abuts the guard"
        );
        // SAFETY: the allocation is live and 1000 bytes long.
        let bytes = unsafe { std::slice::from_raw_parts(a.start as *const u8, 1000) };
        assert!(bytes.iter().all(|&b| b == NAN_FILL));
        assert!(f32::from_bits(u32::from_ne_bytes([0xFF; 4])).is_nan());
        assert!(check_range(a.start + 10, 990, "t").is_ok());
        let err = check_range(a.start + 10, 991, "copy").unwrap_err();
        assert!(err.message.contains("1 bytes past the end"), "{err}");
        assert!(corrupted_canaries().iter().all(|(b, _)| b.id != a.id));
        // A write into the tail slack is noticed once.
        // SAFETY: byte 1010 is in the tail slack, which is mapped read-write.
        unsafe { *((a.start + 1010) as *mut u8) = 0 };
        let hits = corrupted_canaries();
        assert!(hits
            .iter()
            .any(|(b, addr)| b.id == a.id && *addr == a.start + 1010));
        assert!(corrupted_canaries().iter().all(|(b, _)| b.id != a.id));
        free(a.start, false).unwrap();
        let again = free(a.start, false).unwrap_err();
        assert!(again.message.contains("already freed"), "{again}");
        assert!(describe_address(a.start + 8).contains("use after free"));
        assert!(check_range(a.start, 4, "launch")
            .unwrap_err()
            .message
            .contains("freed"));
    }

    #[test]
    fn poisoned_bytes_are_reported_past_the_live_block_before_them() {
        let page = page_size();
        let a = allocate(3 * page, Owner::Device(0)).unwrap();
        set_poison(a.start, a.size, false).unwrap();
        set_poison(a.start, 1000, true).unwrap();
        let protected = |p: usize| with_table(|t| t.none_pages.contains(&p));
        assert!(
            !protected(a.start),
            "the page of the live block stays accessible"
        );
        assert!(protected(a.start + page) && protected(a.start + 2 * page));
        // A write 10 bytes past the block lands on a canary of its page.
        // SAFETY: byte 1010 is poisoned but on a read-write page of the live allocation.
        unsafe { *((a.start + 1010) as *mut u8) = 0 };
        let hits = corrupted_canaries();
        assert!(hits
            .iter()
            .any(|(b, addr)| b.id == a.id && *addr == a.start + 1010));
        let text = describe_address(a.start + page + 96);
        assert!(
            text.contains(&format!(
                "{} bytes past the end of allocation",
                page + 96 - 1000
            )) && text.contains("a live block of 1000 bytes"),
            "{text}"
        );
        assert!(check_unpoisoned(a.start, 1000, "copy").is_ok());
        let err = check_unpoisoned(a.start + 900, 101, "copy").unwrap_err();
        assert!(err.message.contains("0 bytes past the end"), "{err}");
        // A second block in the middle page makes that page accessible again.
        set_poison(a.start + page, 100, true).unwrap();
        assert!(!protected(a.start + page) && protected(a.start + 2 * page));
        // SAFETY: the new live block's bytes are mapped read-write.
        unsafe { *((a.start + page + 50) as *mut u8) = 7 };
        assert!(describe_address(a.start + page + 150).contains("50 bytes past the end"));
        // Freed again: wholly poisoned, protected; merged with its poisoned neighbours.
        set_poison(a.start + page, 100, false).unwrap();
        assert!(protected(a.start + page));
        with_table(|t| {
            let inside: Vec<_> = t.poisoned.range(a.start..a.end()).collect();
            assert_eq!(inside, [(&(a.start + 1000), &a.end())]);
        });
        assert!(set_poison(a.start, a.size + 1, false).is_err());
        free(a.start, false).unwrap();
        with_table(|t| assert!(t.poisoned.range(a.start..a.end()).next().is_none()));
    }

    #[test]
    fn wrong_free_calls_are_named() {
        let a = allocate(64, Owner::PinnedHost).unwrap();
        let err = free(a.start, false).unwrap_err();
        assert!(
            err.message.contains("hipFree of pinned host memory"),
            "{err}"
        );
        let inner = free(a.start + 8, true).unwrap_err();
        assert!(inner.message.contains("8 bytes into"), "{inner}");
        free(a.start, true).unwrap();
    }
}
