//! The overrun check's executor side (shim/hipemu_asan.cpp holds the instrumentation's
//! callbacks): the shadow memory every host build reads before each load and store, and the
//! report of the first access that reached poisoned bytes.
//!
//! The shadow is one byte per 8-byte granule of the address space, at `(addr >> 3) + offset`,
//! mapped once (2^44 bytes reserved, zero pages on demand): 0 means the granule is addressable,
//! k in 1..7 its first k bytes, a negative value none. The runtime's allocator poisons the slack
//! around each allocation and every byte a caching allocator marks as belonging to no live
//! block (see `runtime::memory`), so a one-element overrun, read or write, of any buffer is
//! reported at once, whatever the bytes it touched hold.

use std::ffi::c_void;
use std::sync::OnceLock;

/// Bytes of address space the shadow covers: the user half of x86-64 and AArch64 (47 bits).
const COVERED_BITS: u32 = 47;
/// Shadow value of a granule no byte of which may be accessed.
const POISONED: u8 = 0xF9;

pub(crate) mod ffi {
    use std::ffi::c_void;

    /// `hipemu_asan_state` of shim/hipemu_asan.cpp.
    #[repr(C)]
    pub struct State {
        pub version: u32,
        pub found: u32,
        pub addr: usize,
        pub size: u64,
        pub write: u32,
        pub pad: u32,
        pub pc: *const c_void,
    }
}

/// The first bad access of a launch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Report {
    pub addr: usize,
    pub size: u64,
    pub write: bool,
    pub pc: *const c_void,
}

/// The shadow's offset, mapping it on first use; Err says why it cannot be mapped.
pub fn shadow_offset() -> Result<usize, String> {
    static SHADOW: OnceLock<Result<usize, String>> = OnceLock::new();
    SHADOW
        .get_or_init(|| {
            let len = 1usize << (COVERED_BITS - 3);
            // SAFETY: a fresh private anonymous mapping at an address the kernel chooses;
            // nothing else is affected. NORESERVE: only the pages written are ever backed.
            let base = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(format!(
                    "the overrun check cannot reserve its {} GiB shadow (mmap with MAP_NORESERVE \
                     failed: {}); allow overcommit (vm.overcommit_memory 0 or 1) and an unlimited \
                     address space (ulimit -v)",
                    len >> 30,
                    std::io::Error::last_os_error()
                ));
            }
            Ok(base as usize)
        })
        .clone()
}

/// Sets the shadow of `[lo, hi)`: granules wholly inside get `interior` (addressable or not);
/// a granule the range covers only in part gets the count of its leading bytes for which
/// `addressable` holds. No-op when the shadow cannot be mapped (every host build then fails to
/// load, saying why).
pub(crate) fn update(lo: usize, hi: usize, interior: bool, addressable: impl Fn(usize) -> bool) {
    let Ok(offset) = shadow_offset() else { return };
    if lo >= hi || hi > 1usize << COVERED_BITS {
        return;
    }
    let granule = |g: usize| -> u8 {
        let k = (0..8).take_while(|&i| addressable(g + i)).count();
        match k {
            8 => 0,
            0 => POISONED,
            k => k as u8,
        }
    };
    let first = lo & !7;
    let last = (hi - 1) & !7;
    let inner_lo = lo.next_multiple_of(8);
    let inner_hi = hi & !7;
    // SAFETY: every granule of [lo, hi) has its shadow byte inside the mapping (hi is below
    // 2^47, the mapping covers 2^47 >> 3 bytes); only hip-emu writes the shadow.
    unsafe {
        if inner_lo < inner_hi {
            std::ptr::write_bytes(
                ((inner_lo >> 3) + offset) as *mut u8,
                if interior { 0 } else { POISONED },
                (inner_hi - inner_lo) >> 3,
            );
        }
        for g in [first, last] {
            if g < inner_lo || g >= inner_hi {
                *(((g >> 3) + offset) as *mut u8) = granule(g);
            }
        }
    }
}

/// Makes `[lo, hi)` addressable again (memory being unmapped: the addresses may be reused by
/// anything). Large ranges give their shadow pages back.
pub(crate) fn clear(lo: usize, hi: usize) {
    let Ok(offset) = shadow_offset() else { return };
    if lo >= hi || hi > 1usize << COVERED_BITS {
        return;
    }
    let (s_lo, s_hi) = ((lo >> 3) + offset, ((hi + 7) >> 3) + offset);
    let page = crate::runtime::memory::page_size();
    let (p_lo, p_hi) = (s_lo.next_multiple_of(page), s_hi / page * page);
    // SAFETY: [s_lo, s_hi) lies in the shadow mapping (above); zero pages are valid shadow.
    unsafe {
        if p_lo < p_hi {
            std::ptr::write_bytes(s_lo as *mut u8, 0, p_lo - s_lo);
            libc::madvise(p_lo as *mut c_void, p_hi - p_lo, libc::MADV_DONTNEED);
            std::ptr::write_bytes(p_hi as *mut u8, 0, s_hi - p_hi);
        } else {
            std::ptr::write_bytes(s_lo as *mut u8, 0, s_hi - s_lo);
        }
    }
}

/// Forgets any report of a module (before a launch).
///
/// # Safety
/// `state` is null or the `hipemu_asan` of a loaded host build, and no kernel of it runs.
pub(crate) unsafe fn reset(state: *mut ffi::State) {
    if !state.is_null() {
        // SAFETY: per the contract.
        unsafe { (*state).found = 0 };
    }
}

/// The module's report, if a kernel reached poisoned bytes since [`reset`].
///
/// # Safety
/// As for [`reset`].
pub(crate) unsafe fn take(state: *mut ffi::State) -> Option<Report> {
    if state.is_null() {
        return None;
    }
    // SAFETY: per the contract; no kernel runs, so the fields are stable.
    let s = unsafe { &mut *state };
    if s.found == 0 {
        return None;
    }
    s.found = 0;
    Some(Report {
        addr: s.addr,
        size: s.size,
        write: s.write != 0,
        pc: s.pc,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shadow(addr: usize) -> u8 {
        // SAFETY: the shadow is mapped (the test maps it first) and covers addr.
        unsafe { *(((addr >> 3) + shadow_offset().unwrap()) as *const u8) }
    }

    #[test]
    fn partial_granules_hold_the_count_of_leading_addressable_bytes() {
        let base = 0x1000_0000_0000usize;
        let end = base + 1001;
        update(base, end, true, |b| b < end);
        update(end, base + 1024, false, |b| b < end);
        assert_eq!(shadow(base), 0);
        assert_eq!(shadow(base + 992), 0);
        assert_eq!(shadow(base + 1000), 1, "1 of the granule's 8 bytes is live");
        assert_eq!(shadow(base + 1008), POISONED);
        assert_eq!(shadow(base + 1016), POISONED);
        clear(base, base + 1024);
        assert_eq!(shadow(base + 1000), 0);
        assert_eq!(shadow(base + 1016), 0);
    }
}
