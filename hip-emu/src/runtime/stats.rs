//! What a profiler would count: kernel launches, host-blocking calls, allocations and bytes
//! copied each way.
//!
//! Every counter is kept twice: for the whole process and for the calling host thread (a test
//! that runs beside other tests in one process reads its own thread's figures and is not
//! disturbed by theirs). Work is counted where the host asks for it (the enqueue), not where
//! the emulator's queue runs it, so a figure never depends on the queue's timing.
//!
//! Read them with `hipemuGetStats` (C ABI: a slice of `u64` in [`Counter`] order; hip-rt's
//! `emu::stats` wraps it) or at process exit: with `HIPK_EMU_STATS=1` hip-emu prints one line
//! `hip-emu stats: KEY=N` per counter to stderr (process totals).
//!
//! Work captured into a graph counts nothing when captured; each `hipGraphLaunch` counts one
//! `graph_launches`, its nodes under `graph_nodes`, and its copies and memsets as usual.
//!
//! What counts as host-blocking: `hipDeviceSynchronize`, `hipStreamSynchronize`,
//! `hipEventSynchronize`, and every synchronous copy or memset (`hipMemcpy*` and `hipMemset*`
//! without `Async`), each once. `hipFree` also waits for the device (as HIP's does); it is counted
//! under `frees`, not `host_waits`.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

/// The environment variable that prints the process totals to stderr at exit.
pub const STATS_VAR: &str = "HIPK_EMU_STATS";

/// One counter; the discriminant is its index in the `hipemuGetStats` array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Counter {
    /// Kernels queued (`hipModuleLaunchKernel`) and BLAS calls queued (one GEMM, one launch).
    Launches = 0,
    /// Host-blocking calls (see the module docs).
    HostWaits,
    /// `hipMalloc` calls that allocated (a zero-byte request allocates nothing).
    Mallocs,
    /// `hipFree` calls that freed a device allocation.
    Frees,
    /// Bytes of host-to-device copies (synchronous and asynchronous).
    BytesHtoD,
    /// Bytes of device-to-host copies.
    BytesDtoH,
    /// Bytes of device-to-device copies.
    BytesDtoD,
    /// Memsets queued (synchronous and asynchronous).
    Memsets,
    /// `hipGraphLaunch` calls (see `super::graph`): one per graph launched, whatever it holds.
    GraphLaunches,
    /// Nodes queued by those launches (kernels in a graph count here, not under `Launches`).
    GraphNodes,
}

/// Number of counters (the length of a full `hipemuGetStats` array).
pub const COUNT: usize = 10;

impl Counter {
    /// Every counter, in index order.
    pub const ALL: [Counter; COUNT] = [
        Counter::Launches,
        Counter::HostWaits,
        Counter::Mallocs,
        Counter::Frees,
        Counter::BytesHtoD,
        Counter::BytesDtoH,
        Counter::BytesDtoD,
        Counter::Memsets,
        Counter::GraphLaunches,
        Counter::GraphNodes,
    ];

    /// The key printed at exit (and used by hip-rt).
    pub fn key(self) -> &'static str {
        match self {
            Counter::Launches => "launches",
            Counter::HostWaits => "host_waits",
            Counter::Mallocs => "mallocs",
            Counter::Frees => "frees",
            Counter::BytesHtoD => "bytes_htod",
            Counter::BytesDtoH => "bytes_dtoh",
            Counter::BytesDtoD => "bytes_dtod",
            Counter::Memsets => "memsets",
            Counter::GraphLaunches => "graph_launches",
            Counter::GraphNodes => "graph_nodes",
        }
    }
}

static PROCESS: [AtomicU64; COUNT] = [const { AtomicU64::new(0) }; COUNT];

thread_local! {
    static THREAD: [Cell<u64>; COUNT] = const { [const { Cell::new(0) }; COUNT] };
}

/// Add `n` to `counter` (process and calling thread).
pub fn add(counter: Counter, n: u64) {
    register_exit_print();
    PROCESS[counter as usize].fetch_add(n, Ordering::Relaxed);
    // A thread being torn down (no thread-local storage left) still counts for the process.
    let _ = THREAD.try_with(|t| {
        let c = &t[counter as usize];
        c.set(c.get().wrapping_add(n));
    });
}

/// Count one event of `counter`.
pub fn bump(counter: Counter) {
    add(counter, 1);
}

/// The process totals, in [`Counter`] order.
pub fn process() -> [u64; COUNT] {
    std::array::from_fn(|i| PROCESS[i].load(Ordering::Relaxed))
}

/// The calling thread's figures, in [`Counter`] order.
pub fn thread() -> [u64; COUNT] {
    THREAD
        .try_with(|t| std::array::from_fn(|i| t[i].get()))
        .unwrap_or([0; COUNT])
}

/// The lines printed at exit: `hip-emu stats: KEY=N`, one per counter.
pub fn render(values: &[u64; COUNT]) -> String {
    Counter::ALL
        .iter()
        .map(|c| format!("hip-emu stats: {}={}\n", c.key(), values[*c as usize]))
        .collect()
}

/// Whether `HIPK_EMU_STATS` asks for the exit print (`1`, `true`, `yes`, `on`).
fn print_requested() -> bool {
    std::env::var(STATS_VAR).is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

extern "C" fn print_at_exit() {
    use std::io::Write;
    // Ignoring a write error: stderr may already be closed at exit, and there is no one left to
    // tell.
    let _ = std::io::stderr().write_all(render(&process()).as_bytes());
}

/// Register the exit print once, on the first counted event, when `HIPK_EMU_STATS` asks for it.
fn register_exit_print() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if print_requested() {
            // SAFETY: `print_at_exit` is a plain `extern "C" fn()` that lives as long as this
            // library, which hip-sys never unloads (its handle is leaked); glibc runs handlers
            // registered from a shared object at that object's unload or at exit.
            unsafe { libc::atexit(print_at_exit) };
        }
    });
}

/// Copy the counters of `scope` (0: the process, 1: the calling thread) into `out[..len]`, in
/// [`Counter`] order, and return how many the emulator has ([`COUNT`]; a caller built against
/// fewer counters gets the first `len`). Returns 0 and writes nothing for an unknown scope or a
/// null `out` with a non-zero `len`.
///
/// # Safety
/// `out` is null (then `len` must be 0) or valid for writes of `len` `u64`s.
#[no_mangle]
pub unsafe extern "C" fn hipemuGetStats(scope: u32, out: *mut u64, len: usize) -> usize {
    let values = match scope {
        0 => process(),
        1 => thread(),
        _ => return 0,
    };
    if len > 0 {
        if out.is_null() {
            return 0;
        }
        for (i, v) in values.iter().take(len).enumerate() {
            // SAFETY: `out` is valid for `len` writes (the caller's contract) and i < len.
            unsafe { out.add(i).write(*v) };
        }
    }
    COUNT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_figures_are_the_callers_own() {
        let before = thread();
        bump(Counter::Launches);
        add(Counter::BytesHtoD, 40);
        let other = std::thread::spawn(|| {
            bump(Counter::Launches);
            thread()
        })
        .join()
        .unwrap();
        let after = thread();
        assert_eq!(after[Counter::Launches as usize] - before[0], 1);
        assert_eq!(after[Counter::BytesHtoD as usize] - before[4], 40);
        assert_eq!(other[Counter::Launches as usize], 1);
        assert!(process()[0] >= 2);
    }

    #[test]
    fn the_c_entry_point_copies_in_counter_order() {
        bump(Counter::Memsets);
        let mut out = [u64::MAX; 3];
        // SAFETY: `out` holds 3 u64s.
        let n = unsafe { hipemuGetStats(1, out.as_mut_ptr(), out.len()) };
        assert_eq!(n, COUNT);
        assert_eq!(out, [thread()[0], thread()[1], thread()[2]]);
        // SAFETY: null with len 0 writes nothing.
        assert_eq!(unsafe { hipemuGetStats(1, std::ptr::null_mut(), 0) }, COUNT);
        // SAFETY: as above.
        assert_eq!(unsafe { hipemuGetStats(7, out.as_mut_ptr(), 1) }, 0);
    }

    #[test]
    fn the_exit_lines_name_every_key() {
        let text = render(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
        for key in [
            "launches",
            "host_waits",
            "mallocs",
            "frees",
            "bytes_htod",
            "bytes_dtoh",
        ] {
            assert!(text.contains(&format!("hip-emu stats: {key}=")), "{text}");
        }
        assert!(text.contains("hip-emu stats: host_waits=2\n"));
        assert_eq!(text.lines().count(), COUNT);
    }
}
