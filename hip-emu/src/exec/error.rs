//! Launch errors of the executor, and how they describe blocks, threads and call sites.

use std::ffi::{c_char, CStr};
use std::fmt;

/// A block, thread or grid coordinate (x, y, z).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dim3(pub [u32; 3]);

impl fmt::Display for Dim3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [x, y, z] = self.0;
        write!(f, "({x}, {y}, {z})")
    }
}

/// Why a launch failed. Every message names the kernel, and where relevant the block, the
/// thread and the source sites (file:line) involved, and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// Grid or block dimensions, or the parameters, do not fit the kernel.
    #[error("kernel {kernel}: invalid launch: {reason}")]
    InvalidLaunch {
        kernel: &'static str,
        reason: String,
    },
    /// More threads per block than the device (1024) or the kernel's launch bound allows.
    #[error(
        "kernel {kernel}: a block of {threads} threads exceeds the limit of {limit} (the kernel's \
         max flat workgroup size is {max_flat}, the device's 1024); launch at most {limit} threads \
         per block"
    )]
    BlockTooLarge {
        kernel: &'static str,
        threads: u64,
        limit: u32,
        max_flat: u32,
    },
    /// Static plus dynamic LDS over the 64 KiB of a workgroup.
    #[error(
        "kernel {kernel}: {total} bytes of LDS ({static_lds} static + {dynamic_lds} dynamic) \
         exceed the 65536 bytes a workgroup may use; request less dynamic shared memory"
    )]
    LdsTooLarge {
        kernel: &'static str,
        static_lds: usize,
        dynamic_lds: usize,
        total: usize,
    },
    /// Threads wait at a barrier that threads which already returned can never reach.
    #[error(
        "kernel {kernel}, block {block}: __syncthreads at {site} waits for threads that have \
         already exited ({exited}); every thread of a block must reach every barrier (no early \
         return before a __syncthreads)"
    )]
    BarrierAfterExit {
        kernel: &'static str,
        block: Dim3,
        site: String,
        exited: String,
    },
    /// Threads of one block wait at different synchronisation points: on a device this hangs
    /// or silently mixes barriers.
    #[error(
        "kernel {kernel}, block {block}: deadlock: the block's threads wait at different \
         barriers: {sites}; every thread must reach the same __syncthreads (barriers in \
         divergent code)"
    )]
    Deadlock {
        kernel: &'static str,
        block: Dim3,
        sites: String,
    },
    /// A wave operation (shuffle, DPP, ballot, readfirstlane) reached by only part of a wave.
    #[error(
        "kernel {kernel}, block {block}, wave {wave}: wave operation under divergence: {sites}; \
         every lane of a wave must execute the same shuffle/DPP/ballot (move it out of the \
         divergent branch, or keep exited lanes in the loop)"
    )]
    WaveDivergence {
        kernel: &'static str,
        block: Dim3,
        wave: u32,
        sites: String,
    },
    /// A memory fault (guard page, unmapped address) or a trap in a GPU thread.
    #[error("kernel {kernel}, block {block}, thread {thread}: {what} at address {addr:#x}{hint}")]
    Fault {
        kernel: &'static str,
        block: Dim3,
        thread: Dim3,
        addr: usize,
        /// "invalid memory access (SIGSEGV)", "stack overflow of the GPU thread's fibre", ...
        what: &'static str,
        /// What to check, with a leading "; ".
        hint: &'static str,
    },
    /// One GPU thread ran for the watchdog's limit without reaching a barrier, a wave
    /// operation or its end.
    #[error(
        "kernel {kernel}, block {block}, thread {thread}: no progress for {seconds} s of CPU time \
         (no barrier, wave operation or return): a spin-wait on another thread or block, which \
         hip-emu never runs concurrently (one fibre at a time, blocks in sequence), or an endless \
         loop; HIPK_EMU_WATCHDOG_S sets the limit"
    )]
    Hang {
        kernel: &'static str,
        block: Dim3,
        thread: Dim3,
        seconds: u32,
    },
    /// The race check found two threads of a block touching the same LDS bytes between two
    /// barriers, at least one of them writing.
    #[error(
        "kernel {kernel}, block {block}: LDS data race at address {addr:#x}: {first} and \
         {second} without a __syncthreads between them; add the missing barrier"
    )]
    Race {
        kernel: &'static str,
        block: Dim3,
        addr: usize,
        first: String,
        second: String,
    },
    /// A grid sync misused: outside a cooperative launch, or not reached by every thread of
    /// the grid at the same place.
    #[error("kernel {kernel}: {reason}")]
    GridSync {
        kernel: &'static str,
        reason: String,
    },
    /// An access reached bytes outside every buffer (the slack after an allocation, or bytes
    /// of a caching allocator's segment that belong to no live block): the overrun check.
    #[error(
        "kernel {kernel}, block {block}: out-of-bounds {access} at address {addr:#x} (at {site})"
    )]
    Overrun {
        kernel: &'static str,
        block: Dim3,
        addr: usize,
        /// "read of 4 bytes", "write of 16 bytes".
        access: String,
        /// file:line of the access.
        site: String,
    },
    /// The executor could not set up the launch (stack memory).
    #[error("kernel {kernel}: hip-emu could not run the launch: {reason}")]
    Resources {
        kernel: &'static str,
        reason: String,
    },
    /// A bug in hip-emu itself (never the kernel's fault).
    #[error("kernel {kernel}: hip-emu internal error: {reason}")]
    Internal {
        kernel: &'static str,
        reason: String,
    },
}

/// A call site in kernel source, as passed by the shim (__builtin_FILE / __builtin_LINE).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Site {
    pub file: *const c_char,
    pub line: u32,
}

impl Site {
    pub fn same(&self, other: &Site) -> bool {
        if self.line != other.line {
            return false;
        }
        if self.file == other.file {
            return true;
        }
        if self.file.is_null() || other.file.is_null() {
            return false;
        }
        // SAFETY: both are NUL-terminated string literals of the kernels' binary (static).
        unsafe { CStr::from_ptr(self.file) == CStr::from_ptr(other.file) }
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.file.is_null() {
            return write!(f, "<unknown>:{}", self.line);
        }
        // SAFETY: a NUL-terminated string literal of the kernels' binary (static).
        let file = unsafe { CStr::from_ptr(self.file) };
        write!(f, "{}:{}", file.to_string_lossy(), self.line)
    }
}

/// "0-63, 96, 100-101": sorted thread (or lane) numbers as ranges (the first 12 runs, then
/// how many numbers there are in all).
pub(crate) fn ranges(ids: &[u32]) -> String {
    const MAX_RUNS: usize = 12;
    let mut out = String::new();
    let mut i = 0;
    let mut runs = 0;
    while i < ids.len() {
        if runs == MAX_RUNS {
            out.push_str(&format!(", ... ({} in all)", ids.len()));
            break;
        }
        runs += 1;
        let start = ids[i];
        let mut end = start;
        while i + 1 < ids.len() && ids[i + 1] == end + 1 {
            i += 1;
            end = ids[i];
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        if start == end {
            out.push_str(&start.to_string());
        } else {
            out.push_str(&format!("{start}-{end}"));
        }
        i += 1;
    }
    out
}

/// "site A (threads 0-63), site B (threads 64-127)": groups (site, ids) in order of first id.
pub(crate) fn describe_sites(groups: &[(String, Vec<u32>)], what: &str) -> String {
    groups
        .iter()
        .map(|(site, ids)| format!("{site} ({what} {})", ranges(ids)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_compress_runs() {
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0-2, 5, 7-8");
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[3]), "3");
        let evens: Vec<u32> = (0..64).map(|i| 2 * i).collect();
        assert_eq!(
            ranges(&evens),
            "0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, ... (64 in all)"
        );
    }
}
