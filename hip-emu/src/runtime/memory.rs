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

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::sync::Mutex;

use hip_sys::hipError_t;

use super::error::{Fail, Res};

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
