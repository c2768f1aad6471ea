//! The block scheduler: one corosensei fibre per GPU thread, the block's barriers and the
//! waves' exchanges, and the C ABI the shim calls (`hipemu_barrier`, `hipemu_wave_op`).
//!
//! A fibre runs until it reaches a barrier or a wave operation (it suspends with an `Event`)
//! or returns. The scheduler drives one wave at a time: it resumes every ready lane of the wave
//! until all are blocked; when every lane of the wave waits at a wave operation of the same
//! site, the operation completes (each lane gets its result) and the wave goes on. Once no
//! wave can progress, every live thread must wait at the same barrier, which then releases;
//! anything else (lanes of a wave split between a wave operation and a barrier or an exit, a
//! barrier some threads exited before, threads at different barriers) is an `ExecError`. So a
//! launch never hangs on synchronisation, and never aborts the process.

use std::ffi::{c_char, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use corosensei::stack::{DefaultStack, Stack};
use corosensei::{Coroutine, CoroutineResult, Yielder};

use super::error::{describe_sites, ranges, Dim3, ExecError, Site};
use super::fault::{self, End, Running};
use super::host::Trampoline;
use super::race::Race;

/// Lanes per wave (gfx906 and every DCU: wave64).
pub(crate) const WAVE: usize = 64;

pub(crate) const KIND_PERMUTE: u32 = 0;
pub(crate) const KIND_BALLOT: u32 = 1;
pub(crate) const KIND_READFIRSTLANE: u32 = 2;
pub(crate) const KIND_BARRIER: u32 = 3;
/// Grid sync (cooperative groups' `this_grid().sync()`): suspends as `Event::Grid`.
pub(crate) const KIND_GRID_SYNC: u32 = 4;

/// A wave operation requested by one lane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WaveReq {
    kind: u32,
    value: u64,
    src: i32,
    fallback: u64,
    site: Site,
}

/// Why a fibre suspended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Event {
    Barrier(Site),
    Wave(WaveReq),
    Grid(Site),
}

type Fibre = Coroutine<u64, Event, End, DefaultStack>;

#[derive(Debug, Clone, Copy)]
enum State {
    /// Ready to resume with this input (the result of its last wave operation).
    Ready(u64),
    Barrier(Site),
    Wave(WaveReq),
    /// At a grid sync.
    Grid(Site),
    Done,
}

thread_local! {
    /// The yielder of the fibre running on this OS thread (set by the fibre itself).
    static YIELDER: std::cell::Cell<*const Yielder<u64, Event>> =
        const { std::cell::Cell::new(std::ptr::null()) };
}

/// Suspends the running fibre with `ev`; returns the value it is resumed with. Outside a fibre
/// (impossible through the executor) returns `fallback`.
fn suspend(ev: Event, fallback: u64) -> u64 {
    let y = YIELDER.with(|c| c.get());
    if y.is_null() {
        return fallback;
    }
    // SAFETY: y was set by the running fibre from its own Yielder, which lives on that fibre's
    // stack for as long as the fibre runs; we are on that fibre (the executor sets no other).
    let r = unsafe { (*y).suspend(ev) };
    // Other fibres ran meanwhile and set their own yielder: restore ours.
    YIELDER.with(|c| c.set(y));
    r
}

/// Block barrier (shim: __syncthreads; handed to host builds by `host`).
pub(crate) extern "C" fn hipemu_barrier(file: *const c_char, line: u32) {
    let _ = catch_unwind(|| suspend(Event::Barrier(Site { file, line }), 0));
}

/// Wave operation (shim: shuffles, DPP, ballot, readfirstlane, wave barrier).
pub(crate) extern "C" fn hipemu_wave_op(
    kind: u32,
    value: u64,
    src: i32,
    fallback: u64,
    file: *const c_char,
    line: u32,
) -> u64 {
    if kind == KIND_GRID_SYNC {
        let site = Site { file, line };
        return catch_unwind(|| suspend(Event::Grid(site), 0)).unwrap_or(0);
    }
    let req = WaveReq {
        kind,
        value,
        src,
        fallback,
        site: Site { file, line },
    };
    catch_unwind(|| suspend(Event::Wave(req), fallback)).unwrap_or(fallback)
}

/// Everything the scheduler needs to know about one launch.
pub(crate) struct Launch<'a> {
    pub kernel: &'static str,
    pub trampoline: Trampoline,
    /// The shim state of the kernel's host build.
    pub state: *mut super::ffi::State,
    pub args: *const *const c_void,
    pub block: [u32; 3],
    pub stacks: &'a mut StackPool,
    pub race: &'a mut Race,
}

/// Fibre stacks reused across blocks and launches (guarded: one PROT_NONE page below each).
pub(crate) struct StackPool {
    pub size: usize,
    free: Vec<DefaultStack>,
}

// SAFETY: a DefaultStack is an mmap'd region owned by the pool; it is never shared between
// threads while in use (only an idle stack moves, under the executor lock).
unsafe impl Send for StackPool {}

impl StackPool {
    pub fn new(size: usize) -> Self {
        StackPool {
            size,
            free: Vec::new(),
        }
    }
    fn take(&mut self) -> std::io::Result<DefaultStack> {
        match self.free.pop() {
            Some(s) => Ok(s),
            None => DefaultStack::new(self.size),
        }
    }
}

/// The fibres of one block between steps (a cooperative launch keeps every block's).
pub(crate) struct Parked {
    fibres: Vec<Option<Fibre>>,
    limits: Vec<usize>,
    state: Vec<State>,
}

/// Where a block's step ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Phase {
    /// Every thread returned.
    Done,
    /// Every thread waits at this grid sync.
    Grid(Site),
}

/// Makes the fibres of a block of `n` threads.
pub(crate) fn spawn(l: &mut Launch<'_>, n: usize) -> Result<Parked, ExecError> {
    let mut p = Parked {
        fibres: Vec::with_capacity(n),
        limits: Vec::with_capacity(n),
        state: vec![State::Ready(0); n],
    };
    for _ in 0..n {
        let stack = match l.stacks.take() {
            Ok(stack) => stack,
            Err(e) => {
                recycle(l, &mut p);
                return Err(ExecError::Resources {
                    kernel: l.kernel,
                    reason: format!("cannot map a {} KiB fibre stack: {e}", l.stacks.size / 1024),
                });
            }
        };
        p.limits.push(stack.limit().get());
        let (tramp, args) = (l.trampoline, l.args);
        let f = move |y: &Yielder<u64, Event>, _input: u64| {
            YIELDER.with(|c| c.set(y as *const _));
            // SAFETY: args holds one pointer per kernel parameter, each to that parameter's
            // bytes (size-checked by execute), alive until the launch returns.
            unsafe { tramp(args) };
            End::Done
        };
        p.fibres.push(Some(Coroutine::with_stack(stack, f)));
    }
    Ok(p)
}

/// Runs block `l.block` (dimensions `dim`) until every thread returned or, with `grid`, until
/// every thread waits at a grid sync. Without `grid` a grid sync is an error.
pub(crate) fn step(
    l: &mut Launch<'_>,
    dim: [u32; 3],
    p: &mut Parked,
    grid: bool,
) -> Result<Phase, ExecError> {
    let n = p.state.len();
    let mut b = Block {
        l,
        dim,
        n,
        grid,
        fibres: std::mem::take(&mut p.fibres),
        limits: std::mem::take(&mut p.limits),
        state: std::mem::take(&mut p.state),
    };
    // A panic in the scheduler must not drop suspended fibres (their Drop would unwind through
    // C++ frames): catch it and report it; the caller recycles the fibres.
    let result = catch_unwind(AssertUnwindSafe(|| b.drive())).unwrap_or_else(|_| {
        Err(ExecError::Internal {
            kernel: b.l.kernel,
            reason: "a panic in the block scheduler".into(),
        })
    });
    p.fibres = b.fibres;
    p.limits = b.limits;
    p.state = b.state;
    result
}

/// Lets every thread of a block waiting at a grid sync go on.
pub(crate) fn release_grid(p: &mut Parked) {
    for s in p.state.iter_mut() {
        if matches!(s, State::Grid(_)) {
            *s = State::Ready(0);
        }
    }
}

/// Runs one block: `threads` GPU threads of block dimensions `dim` (threads = x*y*z).
pub(crate) fn run_block(l: &mut Launch<'_>, dim: [u32; 3]) -> Result<(), ExecError> {
    let n = (dim[0] * dim[1] * dim[2]) as usize;
    let mut p = spawn(l, n)?;
    l.race.begin_block();
    let result = step(l, dim, &mut p, false);
    recycle(l, &mut p);
    result?;
    match l.race.take(l.kernel, l.block, dim) {
        Some(race) => Err(race),
        None => Ok(()),
    }
}

/// Returns every stack to the pool; fibres stopped mid-kernel (after an error, or parked at a
/// grid sync of a failed launch) are reset without unwinding.
pub(crate) fn recycle(l: &mut Launch<'_>, p: &mut Parked) {
    for slot in p.fibres.iter_mut() {
        if let Some(mut f) = slot.take() {
            if !f.done() {
                // SAFETY: nothing on a kernel fibre's stack needs dropping: the closure
                // captures only Copy values and the C++ kernel frames hold plain data (no
                // destructors; they are never unwound).
                unsafe { f.force_reset() };
            }
            l.stacks.free.push(f.into_stack());
        }
    }
}

struct Block<'l, 'a> {
    l: &'l mut Launch<'a>,
    dim: [u32; 3],
    n: usize,
    /// A cooperative launch: a grid sync ends a step.
    grid: bool,
    fibres: Vec<Option<Fibre>>,
    limits: Vec<usize>,
    state: Vec<State>,
}

impl Block<'_, '_> {
    fn tid3(&self, t: usize) -> [u32; 3] {
        let t = t as u32;
        let [x, y, _] = self.dim;
        [t % x, (t / x) % y, t / (x * y)]
    }

    fn drive(&mut self) -> Result<Phase, ExecError> {
        let waves = self.n.div_ceil(WAVE);
        loop {
            for w in 0..waves {
                let lanes = w * WAVE..(w * WAVE + WAVE).min(self.n);
                loop {
                    for t in lanes.clone() {
                        if let State::Ready(input) = self.state[t] {
                            self.state[t] = self.resume(t, input)?;
                        }
                    }
                    if lanes
                        .clone()
                        .all(|t| matches!(self.state[t], State::Wave(_)))
                    {
                        self.complete_wave(w)?;
                        self.l.race.wave(w);
                    } else {
                        break;
                    }
                }
            }
            if self.state.iter().all(|s| matches!(s, State::Done)) {
                return Ok(Phase::Done);
            }
            for w in 0..waves {
                let lanes = w * WAVE..(w * WAVE + WAVE).min(self.n);
                if lanes
                    .clone()
                    .any(|t| matches!(self.state[t], State::Wave(_)))
                {
                    return Err(self.wave_divergence(w));
                }
            }
            if let Some(site) = self.at_grid_sync()? {
                return Ok(Phase::Grid(site));
            }
            self.release_barrier()?;
            self.l.race.barrier();
        }
    }

    fn resume(&mut self, t: usize, input: u64) -> Result<State, ExecError> {
        let tid = self.tid3(t);
        let Some(fibre) = self.fibres[t].as_mut() else {
            return Ok(State::Done);
        };
        // SAFETY: the executor holds the launch lock; nothing else reads or writes the shim's
        // state while a block runs.
        unsafe {
            let st = &mut *self.l.state;
            st.thread_idx = tid;
        }
        self.l.race.set_thread(t as u32);
        fault::set_running(Some(Running {
            handler: fibre.trap_handler(),
        }));
        let r = catch_unwind(AssertUnwindSafe(|| fibre.resume(input)));
        fault::set_running(None);
        match r {
            Ok(CoroutineResult::Yield(Event::Barrier(s))) => Ok(State::Barrier(s)),
            Ok(CoroutineResult::Yield(Event::Wave(w))) => Ok(State::Wave(w)),
            Ok(CoroutineResult::Yield(Event::Grid(s))) => Ok(State::Grid(s)),
            Ok(CoroutineResult::Return(End::Done)) => {
                if let Some(f) = self.fibres[t].take() {
                    self.l.stacks.free.push(f.into_stack());
                }
                Ok(State::Done)
            }
            Ok(CoroutineResult::Return(End::Fault { signal, .. }))
                if signal == fault::WATCHDOG_SIGNAL =>
            {
                Err(ExecError::Hang {
                    kernel: self.l.kernel,
                    block: Dim3(self.l.block),
                    thread: Dim3(tid),
                    seconds: fault::watchdog_seconds(),
                })
            }
            Ok(CoroutineResult::Return(End::Fault { addr, signal })) => {
                let (what, hint) = fault::describe(signal, addr, self.limits[t]);
                Err(ExecError::Fault {
                    kernel: self.l.kernel,
                    block: Dim3(self.l.block),
                    thread: Dim3(tid),
                    addr,
                    what,
                    hint,
                })
            }
            Err(_) => Err(ExecError::Internal {
                kernel: self.l.kernel,
                reason: format!("a panic in the fibre of thread {}", Dim3(tid)),
            }),
        }
    }

    /// Every lane of wave w waits at a wave operation: check they agree, then deliver.
    fn complete_wave(&mut self, w: usize) -> Result<(), ExecError> {
        let (lo, hi) = (w * WAVE, (w * WAVE + WAVE).min(self.n));
        let State::Wave(first) = self.state[lo] else {
            return Err(self.wave_divergence(w));
        };
        let mut values = [0u64; WAVE];
        let mut ballot = 0u64;
        for t in lo..hi {
            match self.state[t] {
                State::Wave(r) if r.kind == first.kind && r.site.same(&first.site) => {
                    values[t - lo] = r.value;
                    if r.value != 0 {
                        ballot |= 1 << (t - lo);
                    }
                }
                _ => return Err(self.wave_divergence(w)),
            }
        }
        let active = hi - lo;
        for t in lo..hi {
            let State::Wave(r) = self.state[t] else {
                unreachable!("checked above: every lane waits at this wave operation")
            };
            let out = match first.kind {
                KIND_PERMUTE if r.src >= 0 && (r.src as usize) < active => values[r.src as usize],
                KIND_PERMUTE => r.fallback,
                KIND_BALLOT => ballot,
                KIND_READFIRSTLANE => values[0],
                KIND_BARRIER => 0,
                k => {
                    return Err(ExecError::Internal {
                        kernel: self.l.kernel,
                        reason: format!("unknown wave operation kind {k} at {}", r.site),
                    })
                }
            };
            self.state[t] = State::Ready(out);
        }
        Ok(())
    }

    fn wave_divergence(&self, w: usize) -> ExecError {
        let lanes = w * WAVE..(w * WAVE + WAVE).min(self.n);
        let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
        for t in lanes {
            let label = match self.state[t] {
                State::Wave(r) => format!("wave operation at {}", r.site),
                State::Barrier(s) => format!("__syncthreads at {s}"),
                State::Grid(s) => format!("grid sync at {s}"),
                State::Done => "exited".to_string(),
                State::Ready(_) => "running".to_string(),
            };
            let lane = (t % WAVE) as u32;
            match groups.iter_mut().find(|g| g.0 == label) {
                Some(g) => g.1.push(lane),
                None => groups.push((label, vec![lane])),
            }
        }
        ExecError::WaveDivergence {
            kernel: self.l.kernel,
            block: Dim3(self.l.block),
            wave: w as u32,
            sites: describe_sites(&groups, "lanes"),
        }
    }

    /// No wave can progress and no lane waits at a wave operation. When a thread waits at a
    /// grid sync, every thread must wait at that one (in a cooperative launch): Some(its site).
    fn at_grid_sync(&self) -> Result<Option<Site>, ExecError> {
        let Some(site) = self.state.iter().find_map(|s| match s {
            State::Grid(site) => Some(*site),
            _ => None,
        }) else {
            return Ok(None);
        };
        let kernel = self.l.kernel;
        let block = Dim3(self.l.block);
        if !self.grid {
            return Err(ExecError::GridSync {
                kernel,
                reason: format!(
                    "block {block}: grid sync at {site} in a launch that is not cooperative; \
                     launch the kernel with hipLaunchCooperativeKernel"
                ),
            });
        }
        let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
        for (t, s) in self.state.iter().enumerate() {
            let label = match s {
                State::Grid(s) => format!("grid sync at {s}"),
                State::Barrier(s) => format!("__syncthreads at {s}"),
                State::Done => "exited".to_string(),
                State::Ready(_) | State::Wave(_) => "running".to_string(),
            };
            match groups.iter_mut().find(|g| g.0 == label) {
                Some(g) => g.1.push(t as u32),
                None => groups.push((label, vec![t as u32])),
            }
        }
        if groups.len() > 1 {
            return Err(ExecError::GridSync {
                kernel,
                reason: format!(
                    "block {block}: the block's threads wait at different places: {}; every \
                     thread of the grid must reach the same grid sync",
                    describe_sites(&groups, "threads")
                ),
            });
        }
        Ok(Some(site))
    }

    /// No wave can progress and no lane waits at a wave operation: every live thread must be
    /// at the same barrier.
    fn release_barrier(&mut self) -> Result<(), ExecError> {
        let mut groups: Vec<(Site, Vec<u32>)> = Vec::new();
        let mut exited = Vec::new();
        for (t, s) in self.state.iter().enumerate() {
            match s {
                State::Barrier(site) => match groups.iter_mut().find(|g| g.0.same(site)) {
                    Some(g) => g.1.push(t as u32),
                    None => groups.push((*site, vec![t as u32])),
                },
                State::Done => exited.push(t as u32),
                _ => {}
            }
        }
        if groups.len() > 1 {
            let named: Vec<(String, Vec<u32>)> = groups
                .into_iter()
                .map(|(s, ids)| (format!("__syncthreads at {s}"), ids))
                .collect();
            return Err(ExecError::Deadlock {
                kernel: self.l.kernel,
                block: Dim3(self.l.block),
                sites: describe_sites(&named, "threads"),
            });
        }
        let Some((site, _)) = groups.first() else {
            return Err(ExecError::Internal {
                kernel: self.l.kernel,
                reason: "no thread can progress, yet none waits at a barrier".into(),
            });
        };
        if !exited.is_empty() {
            return Err(ExecError::BarrierAfterExit {
                kernel: self.l.kernel,
                block: Dim3(self.l.block),
                site: site.to_string(),
                exited: format!("threads {}", ranges(&exited)),
            });
        }
        for s in self.state.iter_mut() {
            if matches!(s, State::Barrier(_)) {
                *s = State::Ready(0);
            }
        }
        Ok(())
    }
}
