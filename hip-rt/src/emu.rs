//! What only hip-emu (the emulated HIP device) can tell: the counters a profiler would show.
//!
//! A real HIP runtime exports none of hip-emu's `hipemu*` entry points; then [`stats`] returns
//! `None` and nothing here does anything. On hip-emu, tests use the counters to prove what a
//! profiler would prove on a GPU: how many kernels a step launches, how many times the host
//! waits, that a warmed-up step allocates nothing.

use std::sync::OnceLock;

/// Whose figures to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsScope {
    /// The whole process.
    Process,
    /// The calling host thread only (not disturbed by other threads, e.g. parallel tests).
    Thread,
}

/// hip-emu's counters (see hip-emu's `runtime::stats` for what each one counts). Figures are
/// counted where the host asks for the work, not where the emulator runs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EmuStats {
    /// Kernel launches queued, including one per BLAS call.
    pub launches: u64,
    /// Host-blocking calls: device, stream and event synchronisation, synchronous copies and
    /// memsets.
    pub host_waits: u64,
    /// `hipMalloc` calls that allocated.
    pub mallocs: u64,
    /// `hipFree` calls that freed device memory.
    pub frees: u64,
    /// Bytes copied host to device.
    pub bytes_htod: u64,
    /// Bytes copied device to host.
    pub bytes_dtoh: u64,
    /// Bytes copied device to device.
    pub bytes_dtod: u64,
    /// Memsets queued.
    pub memsets: u64,
    /// Graphs launched (`hipGraphLaunch`): one each, whatever the graph holds.
    pub graph_launches: u64,
    /// Nodes those graph launches queued (kernels in a graph count here, not in `launches`).
    pub graph_nodes: u64,
}

impl EmuStats {
    /// What happened between `earlier` and `self` (counters only grow; saturates at 0).
    pub fn since(&self, earlier: &EmuStats) -> EmuStats {
        EmuStats {
            launches: self.launches.saturating_sub(earlier.launches),
            host_waits: self.host_waits.saturating_sub(earlier.host_waits),
            mallocs: self.mallocs.saturating_sub(earlier.mallocs),
            frees: self.frees.saturating_sub(earlier.frees),
            bytes_htod: self.bytes_htod.saturating_sub(earlier.bytes_htod),
            bytes_dtoh: self.bytes_dtoh.saturating_sub(earlier.bytes_dtoh),
            bytes_dtod: self.bytes_dtod.saturating_sub(earlier.bytes_dtod),
            memsets: self.memsets.saturating_sub(earlier.memsets),
            graph_launches: self.graph_launches.saturating_sub(earlier.graph_launches),
            graph_nodes: self.graph_nodes.saturating_sub(earlier.graph_nodes),
        }
    }

    fn from_counters(c: &[u64; COUNTERS]) -> EmuStats {
        EmuStats {
            launches: c[0],
            host_waits: c[1],
            mallocs: c[2],
            frees: c[3],
            bytes_htod: c[4],
            bytes_dtoh: c[5],
            bytes_dtod: c[6],
            memsets: c[7],
            graph_launches: c[8],
            graph_nodes: c[9],
        }
    }
}

/// How many counters hip-emu keeps (the length of its `hipemuGetStats` array).
const COUNTERS: usize = 10;

/// `hipemuGetStats(scope, out, len) -> count`.
type GetStatsFn = unsafe extern "C" fn(u32, *mut u64, usize) -> usize;

/// hip-emu's counters for `scope`, or `None` when the loaded HIP runtime is not hip-emu (or no
/// runtime loads).
pub fn stats(scope: StatsScope) -> Option<EmuStats> {
    static GET: OnceLock<Option<GetStatsFn>> = OnceLock::new();
    // SAFETY: hip-emu defines `hipemuGetStats` with exactly the `GetStatsFn` prototype; no
    // other runtime exports the name.
    let f = (*GET.get_or_init(|| unsafe { symbol::<GetStatsFn>(b"hipemuGetStats\0") }))?;
    let mut counters = [0u64; COUNTERS];
    let scope = match scope {
        StatsScope::Process => 0,
        StatsScope::Thread => 1,
    };
    // SAFETY: `counters` is valid for COUNTERS writes; hip-emu writes at most `len` of them.
    let available = unsafe { f(scope, counters.as_mut_ptr(), counters.len()) };
    // hip-emu reports how many counters it has: fewer than ours means an older emulator whose
    // array would leave some of ours unwritten (zero), so refuse rather than report zeros.
    (available >= counters.len()).then(|| EmuStats::from_counters(&counters))
}

/// `hipemuAddKernelDir(dir) -> 0 | 1`.
type AddKernelDirFn = unsafe extern "C" fn(*const std::ffi::c_char) -> i32;

/// Tells hip-emu to look for host builds of kernels (`<key>.so`, made by hip-build's `host`
/// module) in `dir` too; for code objects compiled while the program runs. Returns false when
/// the loaded runtime is not hip-emu (nothing to do there) or `dir` is not UTF-8.
pub fn add_kernel_dir(dir: &std::path::Path) -> bool {
    static ADD: OnceLock<Option<AddKernelDirFn>> = OnceLock::new();
    // SAFETY: hip-emu defines `hipemuAddKernelDir` with exactly this prototype.
    let Some(f) = *ADD.get_or_init(|| unsafe { symbol::<AddKernelDirFn>(b"hipemuAddKernelDir\0") })
    else {
        return false;
    };
    let Some(c) = dir.to_str().and_then(|d| std::ffi::CString::new(d).ok()) else {
        return false;
    };
    // SAFETY: a NUL-terminated string that outlives the call (hip-emu copies it).
    unsafe { f(c.as_ptr()) == 0 }
}

/// True when the loaded HIP runtime is hip-emu.
pub fn is_hip_emu() -> bool {
    static EMU: OnceLock<bool> = OnceLock::new();
    // SAFETY: only the symbol's presence is used; it is never called through this type.
    *EMU.get_or_init(|| unsafe { symbol::<PoisonFn>(b"hipemuPoison\0") }.is_some())
}

/// `hipemuPoison(ptr, bytes, live)`.
type PoisonFn = unsafe extern "C" fn(*mut std::ffi::c_void, usize, i32) -> hip_sys::hipError_t;
/// `hipemuPoisonAsync(ptr, bytes, live, stream)`.
type PoisonAsyncFn = unsafe extern "C" fn(
    *mut std::ffi::c_void,
    usize,
    i32,
    hip_sys::hipStream_t,
) -> hip_sys::hipError_t;

/// Tells hip-emu that `[ptr, ptr + bytes)`, inside one device allocation, holds a live block
/// (`live`) or belongs to none (freed or never handed out), the way AddressSanitizer's manual
/// poisoning lets a custom allocator describe its blocks: hip-emu then reports an access outside
/// every live block as it reports one past a `hipMalloc` allocation. With `stream`, in that
/// stream's order (work queued before still sees the old state); without, at once. Returns
/// false when the loaded runtime is not hip-emu (a real device: nothing to do) or hip-emu
/// refused the range.
///
/// The caching allocator calls this for every segment and block; a sub-allocator of your own
/// can do the same.
pub fn mark_block(
    ptr: crate::DevicePtr,
    bytes: usize,
    live: bool,
    stream: Option<hip_sys::hipStream_t>,
) -> bool {
    static NOW: OnceLock<Option<PoisonFn>> = OnceLock::new();
    static ASYNC: OnceLock<Option<PoisonAsyncFn>> = OnceLock::new();
    let p = ptr.0 as usize as *mut std::ffi::c_void;
    let status = match stream {
        None => {
            // SAFETY: hip-emu defines `hipemuPoison` with exactly this prototype.
            let Some(f) = *NOW.get_or_init(|| unsafe { symbol::<PoisonFn>(b"hipemuPoison\0") })
            else {
                return false;
            };
            // SAFETY: plain values; hip-emu checks the range against its allocations.
            unsafe { f(p, bytes, i32::from(live)) }
        }
        Some(s) => {
            // SAFETY: hip-emu defines `hipemuPoisonAsync` with exactly this prototype.
            let Some(f) =
                *ASYNC.get_or_init(|| unsafe { symbol::<PoisonAsyncFn>(b"hipemuPoisonAsync\0") })
            else {
                return false;
            };
            // SAFETY: as above; `s` is a stream handle of this runtime (or null).
            unsafe { f(p, bytes, i32::from(live), s) }
        }
    };
    status == hip_sys::hipError_t::hipSuccess
}

/// A symbol of hip-emu's own C ABI from the HIP runtime hip-sys loaded, or `None` there (a real
/// runtime) and when no runtime loads.
///
/// # Safety
/// `T` must be the symbol's exact function-pointer type as hip-emu defines it.
pub(crate) unsafe fn symbol<T: Copy>(name: &[u8]) -> Option<T> {
    let hip = hip_sys::hip().ok()?;
    // SAFETY: re-opening the runtime hip-sys already loaded (same file) only takes another
    // reference to it and runs no initialiser again; the handle is leaked below, never closed,
    // so the symbol stays valid for the life of the process.
    let lib = unsafe { hip_sys::libloading::Library::new(hip.path()) }.ok()?;
    // SAFETY: the caller guarantees `T` is the symbol's type.
    let f = unsafe { lib.get::<T>(name) }.ok().map(|s| *s);
    std::mem::forget(lib);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_each_counter() {
        let a = EmuStats::from_counters(&[1, 2, 3, 4, 5, 6, 7, 8, 1, 4]);
        let b = EmuStats::from_counters(&[3, 2, 5, 4, 15, 6, 7, 9, 2, 9]);
        let d = b.since(&a);
        assert_eq!(d.launches, 2);
        assert_eq!(d.host_waits, 0);
        assert_eq!(d.mallocs, 2);
        assert_eq!(d.bytes_htod, 10);
        assert_eq!(d.memsets, 1);
        assert_eq!((d.graph_launches, d.graph_nodes), (1, 5));
        assert_eq!(a.since(&b).launches, 0);
    }
}
