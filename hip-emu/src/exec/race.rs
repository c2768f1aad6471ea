//! The race check's executor side (shim/hipemu_race.cpp holds the shadow memory and the
//! instrumentation callbacks): synchronisation epochs, the running thread, and the report.
//!
//! Kernels built with the instrumentation (hip-build with HIPK_EMU_RACE_CHECK=1; hip-emu's test
//! kernels always) report every LDS access; others never call in, so the bookkeeping here costs
//! a few stores per fibre switch and nothing else. Every host build has its own race state.

use super::error::{Dim3, ExecError};
use super::host::ModuleRt;
use std::ffi::c_void;

pub(crate) mod ffi {
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
}

/// Access to a host build's race state; every method requires the executor lock (held by
/// `execute` for the whole launch), which is what makes the accesses sound.
pub(crate) struct Race {
    rt: ModuleRt,
}

impl Race {
    fn state(&mut self) -> &mut ffi::State {
        // SAFETY: a `Race` exists only under the executor lock; the state lives in a host build
        // that is never unloaded; no fibre runs while the executor side touches the state (they
        // alternate on one thread).
        unsafe { &mut *self.rt.race }
    }

    /// Starts a launch of a kernel of the host build `rt` whose LDS is `static_lds` (the kernel
    /// file's hipemu_lds_0 section) and `dynamic_lds` (the whole dynamic buffer). Maps the
    /// shadow on first use.
    pub fn begin_launch(
        rt: ModuleRt,
        static_lds: (usize, usize),
        dynamic_lds: (usize, usize),
    ) -> Result<Race, String> {
        let mut race = Race { rt };
        let s = race.state();
        let cells = (static_lds.1 - static_lds.0) + (dynamic_lds.1 - dynamic_lds.0);
        if s.shadow.is_null() || s.shadow_cells < cells {
            // SAFETY: maps fresh memory for the shadow (the old one, if any, is too small and
            // leaked: the section and the buffer never grow, so this happens once per build).
            if unsafe { (rt.race_alloc)(cells) } != 0 {
                return Err("cannot map the race check's shadow memory".into());
            }
        }
        (s.static_lo, s.static_hi) = static_lds;
        (s.dynamic_lo, s.dynamic_hi) = dynamic_lds;
        s.enabled = 1;
        Ok(race)
    }

    /// A new block: a fresh barrier epoch (older shadow cells never match again).
    pub fn begin_block(&mut self) {
        let s = self.state();
        s.epoch = s.epoch.wrapping_add(1).max(1);
        s.wave_epoch = [0; 16];
        s.found.found = 0;
    }

    pub fn set_thread(&mut self, linear: u32) {
        self.state().tid = linear;
    }

    pub fn barrier(&mut self) {
        let s = self.state();
        s.epoch = s.epoch.wrapping_add(1).max(1);
    }

    pub fn wave(&mut self, w: usize) {
        let s = self.state();
        s.wave_epoch[w.min(15)] = s.wave_epoch[w.min(15)].wrapping_add(1);
    }

    /// The block's first race, if any, as an error.
    pub fn take(
        &mut self,
        kernel: &'static str,
        block: [u32; 3],
        dim: [u32; 3],
    ) -> Option<ExecError> {
        let f = self.state().found;
        let root = self.rt.source_root;
        if f.found == 0 {
            return None;
        }
        let side = |tid: u32, write: u32, pc: *const c_void| {
            let kind = if write != 0 { "write" } else { "read" };
            format!(
                "thread {} ({kind} at {})",
                Dim3(tid3(tid, dim)),
                source_line(pc, root)
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

impl Drop for Race {
    fn drop(&mut self) {
        self.state().enabled = 0;
    }
}

fn tid3(t: u32, [x, y, _]: [u32; 3]) -> [u32; 3] {
    [t % x, (t / x) % y, t / (x * y)]
}

/// file:line of the instruction before return address `pc` (the instrumented access), from
/// the kernels' DWARF line tables; the innermost inlined location.
pub(super) fn source_line(pc: *const c_void, root: &str) -> String {
    let mut out = None;
    let addr = (pc as usize).wrapping_sub(1) as *mut c_void;
    backtrace::resolve(addr, |sym| {
        if out.is_none() {
            if let (Some(file), Some(line)) = (sym.filename(), sym.lineno()) {
                let file = file.display().to_string();
                let file = file.strip_prefix(root).unwrap_or(&file);
                out = Some(format!("{file}:{line}"));
            }
        }
    });
    out.unwrap_or_else(|| format!("pc {pc:p}"))
}
