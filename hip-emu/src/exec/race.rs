//! The race check's executor side (shim/hipemu_race.cpp holds the shadow memory and the
//! instrumentation callbacks): synchronisation epochs, the running thread, and the report.
//!
//! Kernels built with the instrumentation (the test kernels always; kernels/*.hip when hip-emu
//! is built with HIPK_EMU_RACE_CHECK=1) report every LDS access; others never call in, so the
//! bookkeeping here costs a few stores per fibre switch and nothing else.

use super::error::ExecError;
#[cfg(hipemu_kernels)]
use {super::error::Dim3, std::ffi::c_void};

#[cfg(hipemu_kernels)]
mod ffi {
    use std::ffi::c_void;

    /// `hipemu_race_found` of shim/hipemu_race.cpp.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct Found {
        pub found: u32,
        pub first_tid: u32,
        pub second_tid: u32,
        pub first_write: u32,
        pub second_write: u32,
        pub addr: usize,
        pub first_pc: *const c_void,
        pub second_pc: *const c_void,
    }

    /// `hipemu_race_state` of shim/hipemu_race.cpp.
    #[repr(C)]
    pub struct State {
        pub enabled: u32,
        pub tid: u32,
        pub epoch: u32,
        pub wave_epoch: [u32; 16],
        pub static_lo: usize,
        pub static_hi: usize,
        pub dynamic_lo: usize,
        pub dynamic_hi: usize,
        pub shadow: *mut c_void,
        pub shadow_cells: usize,
        pub found: Found,
    }

    extern "C" {
        pub static mut hipemu_race: State;
        pub fn hipemu_race_alloc(cells: usize) -> i32;
    }
}

/// Access to the shim's race state; every method requires the executor lock (held by
/// `execute` for the whole launch), which is what makes the `static mut` accesses sound.
pub(crate) struct Race(());

#[cfg(hipemu_kernels)]
impl Race {
    fn state() -> &'static mut ffi::State {
        // SAFETY: only reached through a `Race`, which exists only under the executor lock; no
        // fibre runs while the executor side touches the state (they alternate on one thread).
        unsafe { &mut *std::ptr::addr_of_mut!(ffi::hipemu_race) }
    }

    /// Starts a launch whose LDS is `static_lds` (the kernel file's hipemu_lds_<n> section) and
    /// `dynamic_lds` (the whole dynamic buffer). Maps the shadow on first use, for
    /// `max_static` bytes of static LDS (the largest section of any kernel).
    pub fn begin_launch(
        static_lds: (usize, usize),
        dynamic_lds: (usize, usize),
        max_static: usize,
    ) -> Result<Race, String> {
        let s = Self::state();
        let cells = max_static.max(static_lds.1 - static_lds.0) + (dynamic_lds.1 - dynamic_lds.0);
        if s.shadow.is_null() || s.shadow_cells < cells {
            // SAFETY: maps fresh memory for the shadow (the old one, if any, is too small and
            // leaked: the section and the buffer never grow, so this happens once).
            if unsafe { ffi::hipemu_race_alloc(cells) } != 0 {
                return Err("cannot map the race check's shadow memory".into());
            }
        }
        (s.static_lo, s.static_hi) = static_lds;
        (s.dynamic_lo, s.dynamic_hi) = dynamic_lds;
        s.enabled = 1;
        Ok(Race(()))
    }

    /// A new block: a fresh barrier epoch (older shadow cells never match again).
    pub fn begin_block(&mut self) {
        let s = Self::state();
        s.epoch = s.epoch.wrapping_add(1).max(1);
        s.wave_epoch = [0; 16];
        s.found.found = 0;
    }

    pub fn set_thread(&mut self, linear: u32) {
        Self::state().tid = linear;
    }

    pub fn barrier(&mut self) {
        let s = Self::state();
        s.epoch = s.epoch.wrapping_add(1).max(1);
    }

    pub fn wave(&mut self, w: usize) {
        let s = Self::state();
        s.wave_epoch[w.min(15)] = s.wave_epoch[w.min(15)].wrapping_add(1);
    }

    /// The block's first race, if any, as an error.
    pub fn take(
        &mut self,
        kernel: &'static str,
        block: [u32; 3],
        dim: [u32; 3],
    ) -> Option<ExecError> {
        let f = Self::state().found;
        if f.found == 0 {
            return None;
        }
        let side = |tid: u32, write: u32, pc: *const c_void| {
            let kind = if write != 0 { "write" } else { "read" };
            format!(
                "thread {} ({kind} at {})",
                Dim3(tid3(tid, dim)),
                source_line(pc)
            )
        };
        Some(ExecError::Race {
            kernel,
            block: Dim3(block),
            addr: f.addr,
            first: side(f.first_tid, f.first_write, f.first_pc),
            second: side(f.second_tid, f.second_write, f.second_pc),
        })
    }
}

#[cfg(hipemu_kernels)]
impl Drop for Race {
    fn drop(&mut self) {
        Self::state().enabled = 0;
    }
}

/// Without host kernels nothing is instrumented: the same interface, doing nothing.
#[cfg(not(hipemu_kernels))]
impl Race {
    pub fn begin_launch(_: (usize, usize), _: (usize, usize), _: usize) -> Result<Race, String> {
        Ok(Race(()))
    }
    pub fn begin_block(&mut self) {}
    pub fn set_thread(&mut self, _: u32) {}
    pub fn barrier(&mut self) {}
    pub fn wave(&mut self, _: usize) {}
    pub fn take(&mut self, _: &'static str, _: [u32; 3], _: [u32; 3]) -> Option<ExecError> {
        None
    }
}

#[cfg(hipemu_kernels)]
fn tid3(t: u32, [x, y, _]: [u32; 3]) -> [u32; 3] {
    [t % x, (t / x) % y, t / (x * y)]
}

#[cfg(hipemu_kernels)]
/// file:line of the instruction before return address `pc` (the instrumented access), from
/// the kernels' DWARF line tables; the innermost inlined location.
fn source_line(pc: *const c_void) -> String {
    let mut out = None;
    let addr = (pc as usize).wrapping_sub(1) as *mut c_void;
    backtrace::resolve(addr, |sym| {
        if out.is_none() {
            if let (Some(file), Some(line)) = (sym.filename(), sym.lineno()) {
                let file = file.display().to_string();
                let file = file
                    .strip_prefix(env!("HIPEMU_SOURCE_ROOT"))
                    .unwrap_or(&file);
                out = Some(format!("{file}:{line}"));
            }
        }
    });
    out.unwrap_or_else(|| format!("pc {pc:p}"))
}
