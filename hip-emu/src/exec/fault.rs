//! Faults inside kernel fibres: a SIGSEGV/SIGBUS/SIGFPE/SIGILL raised while a GPU thread's
//! fibre runs ends that fibre with `End::Fault` (corosensei's trap-handler support) instead of
//! killing the process; the executor turns it into `ExecError::Fault`. Signals raised anywhere
//! else go to the handler that was installed before ours (or the default action).
//!
//! The same mechanism is the watchdog: during a launch a per-thread CPU-time timer ticks every
//! second (SIGXCPU); when one fibre has run for `HIPK_EMU_WATCHDOG_S` ticks (default 60, 0 = off)
//! without suspending or ending, it is ended with `signal == WATCHDOG_SIGNAL` and the executor
//! reports `ExecError::Hang` (a spin-wait on another thread or block never ends here: fibres
//! are not preempted and blocks run one after another).
//!
//! Only x86_64 Linux rewrites the interrupted context; elsewhere the handler is not installed,
//! a fault in a kernel crashes the process as it would without hip-emu and there is no watchdog.

use std::cell::Cell;

use corosensei::trap::CoroutineTrapHandler;

/// How a GPU thread's fibre ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum End {
    Done,
    Fault { addr: usize, signal: i32 },
}

/// The fibre now running on this OS thread, for the signal handler.
#[derive(Clone, Copy)]
pub(crate) struct Running {
    pub handler: CoroutineTrapHandler<End>,
}

/// The signal of the watchdog's timer.
pub(crate) const WATCHDOG_SIGNAL: i32 = libc::SIGXCPU;

thread_local! {
    static RUNNING: Cell<Option<Running>> = const { Cell::new(None) };
    /// Fibre resumes on this thread so far (the watchdog's measure of progress).
    static PROGRESS: Cell<u64> = const { Cell::new(0) };
    /// (PROGRESS at the last watchdog tick, ticks since it last changed).
    static SEEN: Cell<(u64, u32)> = const { Cell::new((0, 0)) };
    /// Ticks without progress that end a fibre (0: the watchdog is off).
    static LIMIT_TICKS: Cell<u32> = const { Cell::new(0) };
}

/// Marks `r` as the fibre running on this thread (None after it suspends or ends).
pub(crate) fn set_running(r: Option<Running>) {
    if r.is_some() {
        PROGRESS.with(|p| p.set(p.get().wrapping_add(1)));
    }
    RUNNING.with(|c| c.set(r));
}

/// Watchdog limit in seconds: HIPK_EMU_WATCHDOG_S, default 60; 0 turns it off.
pub(crate) fn watchdog_seconds() -> u32 {
    std::env::var("HIPK_EMU_WATCHDOG_S")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

/// Arms the watchdog on this thread for the life of the returned guard (None when off or
/// unsupported).
pub(crate) fn watchdog(seconds: u32) -> Option<imp::Watchdog> {
    if seconds == 0 {
        return None;
    }
    LIMIT_TICKS.with(|l| l.set(seconds));
    let now = PROGRESS.with(|p| p.get());
    SEEN.with(|s| s.set((now, 0)));
    imp::Watchdog::arm()
}

/// Installs the handlers (once per process) and an alternate signal stack on this thread (so a
/// fibre's stack overflow can be handled), when supported.
pub(crate) fn prepare_thread() -> Result<(), String> {
    imp::prepare_thread()
}

/// (what, hint) of a fault, for the error message. `stack_bottom`: lowest address of the
/// faulting fibre's stack mapping, whose first page is the guard page.
pub(crate) fn describe(
    signal: i32,
    addr: usize,
    stack_bottom: usize,
) -> (&'static str, &'static str) {
    const PAGE: usize = 4096;
    if signal == libc::SIGSEGV && addr >= stack_bottom && addr < stack_bottom + PAGE {
        return (
            "stack overflow of the GPU thread's fibre",
            "; the kernel's per-thread arrays are too large for the fibre stack (raise \
             HIPK_EMU_STACK_KIB)",
        );
    }
    match signal {
        libc::SIGSEGV => (
            "invalid memory access (SIGSEGV)",
            "; an out-of-bounds or freed pointer (device allocations are guarded): check the \
             indexing and the pointer arguments",
        ),
        libc::SIGBUS => ("bus error (SIGBUS)", "; a misaligned or unmapped access"),
        libc::SIGFPE => (
            "arithmetic trap (SIGFPE)",
            "; an integer division by zero or overflow (on a device the result is undefined)",
        ),
        _ => (
            "illegal instruction (SIGILL)",
            "; __builtin_trap or undefined behaviour in the kernel",
        ),
    }
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod imp {
    use super::{End, LIMIT_TICKS, PROGRESS, RUNNING, SEEN, WATCHDOG_SIGNAL};
    use std::cell::RefCell;
    use std::mem::MaybeUninit;
    use std::ptr;
    use std::sync::OnceLock;

    const SIGNALS: [libc::c_int; 5] = [
        libc::SIGSEGV,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGILL,
        super::WATCHDOG_SIGNAL,
    ];

    /// The handlers that were installed before ours, in SIGNALS order.
    struct Previous([libc::sigaction; 5]);
    // SAFETY: plain C data (function pointers and masks), never mutated after installation.
    unsafe impl Sync for Previous {}
    // SAFETY: as for Sync: plain C data, no thread affinity.
    unsafe impl Send for Previous {}

    static PREVIOUS: OnceLock<Result<Previous, String>> = OnceLock::new();

    /// The alternate signal stack this module gave the thread.
    struct AltStack {
        base: *mut libc::c_void,
        len: usize,
    }

    impl Drop for AltStack {
        fn drop(&mut self) {
            // SAFETY: disables the alternate stack (ours: installed by prepare_thread on this
            // thread) before unmapping the memory it lives in.
            unsafe {
                let ss = libc::stack_t {
                    ss_sp: ptr::null_mut(),
                    ss_flags: libc::SS_DISABLE,
                    ss_size: 0,
                };
                libc::sigaltstack(&ss, ptr::null_mut());
                libc::munmap(self.base, self.len);
            }
        }
    }

    thread_local! {
        static ALT: RefCell<Option<AltStack>> = const { RefCell::new(None) };
    }

    pub(super) fn prepare_thread() -> Result<(), String> {
        PREVIOUS
            .get_or_init(install)
            .as_ref()
            .map_err(Clone::clone)?;
        // SAFETY: queries this thread's alternate signal stack.
        let enabled = unsafe {
            let mut old = MaybeUninit::<libc::stack_t>::zeroed();
            libc::sigaltstack(ptr::null(), old.as_mut_ptr()) == 0
                && old.assume_init().ss_flags & libc::SS_DISABLE == 0
        };
        if enabled {
            return Ok(());
        }
        let len = 256 * 1024;
        // SAFETY: a fresh anonymous mapping, registered as this thread's alternate stack and
        // kept (ALT) until the thread ends, when AltStack::drop unregisters it first.
        unsafe {
            let base = libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err("cannot map an alternate signal stack".into());
            }
            let ss = libc::stack_t {
                ss_sp: base,
                ss_flags: 0,
                ss_size: len,
            };
            if libc::sigaltstack(&ss, ptr::null_mut()) != 0 {
                libc::munmap(base, len);
                return Err("sigaltstack failed".into());
            }
            ALT.with(|a| *a.borrow_mut() = Some(AltStack { base, len }));
        }
        Ok(())
    }

    fn install() -> Result<Previous, String> {
        // SAFETY: sigaction with a zero-initialised struct filled as the man page requires;
        // the previous actions are kept for chaining.
        unsafe {
            let mut prev: [libc::sigaction; 5] = std::mem::zeroed();
            for (i, &sig) in SIGNALS.iter().enumerate() {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
                libc::sigemptyset(&mut sa.sa_mask);
                if libc::sigaction(sig, &sa, &mut prev[i]) != 0 {
                    return Err(format!("cannot install the handler of signal {sig}"));
                }
            }
            Ok(Previous(prev))
        }
    }

    /// Ends the running fibre with End::Fault when the signal came from it; else chains.
    unsafe extern "C" fn handler(
        sig: libc::c_int,
        info: *mut libc::siginfo_t,
        ctx: *mut libc::c_void,
    ) {
        let running = RUNNING.try_with(|c| c.get()).ok().flatten();
        // SAFETY: (the whole body) the kernel passes valid siginfo and ucontext pointers to an
        // SA_SIGINFO handler; the trap handler belongs to the fibre marked running on this
        // thread, which is alive (the executor clears RUNNING before it drops a fibre).
        unsafe {
            let uc = ctx as *mut libc::ucontext_t;
            if let Some(r) = running {
                let sp = (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] as usize;
                if r.handler.stack_ptr_in_bounds(sp) && (sig != WATCHDOG_SIGNAL || stalled()) {
                    let addr = (*info).si_addr() as usize;
                    let regs = r
                        .handler
                        .setup_trap_handler(move || End::Fault { addr, signal: sig });
                    let g = &mut (*uc).uc_mcontext.gregs;
                    g[libc::REG_RIP as usize] = regs.rip as i64;
                    g[libc::REG_RSP as usize] = regs.rsp as i64;
                    g[libc::REG_RBP as usize] = regs.rbp as i64;
                    g[libc::REG_RDI as usize] = regs.rdi as i64;
                    g[libc::REG_RSI as usize] = regs.rsi as i64;
                    return;
                }
            }
            if sig == WATCHDOG_SIGNAL && (*info).si_code == libc::SI_TIMER {
                return; // a tick of our timer: no fibre to stop, nothing to chain
            }
            chain(sig, info, ctx);
        }
    }

    /// A watchdog tick: true when the running fibre made no progress for the limit's ticks.
    fn stalled() -> bool {
        let progress = PROGRESS.try_with(|p| p.get()).unwrap_or(0);
        let limit = LIMIT_TICKS.try_with(|l| l.get()).unwrap_or(0);
        let Ok((last, ticks)) = SEEN.try_with(|s| s.get()) else {
            return false;
        };
        let ticks = if last == progress { ticks + 1 } else { 0 };
        let _ = SEEN.try_with(|s| s.set((progress, ticks)));
        limit > 0 && ticks >= limit
    }

    /// A CPU-time timer of this thread ticking every second with WATCHDOG_SIGNAL, deleted on
    /// drop.
    pub(crate) struct Watchdog {
        timer: libc::timer_t,
    }

    impl Watchdog {
        pub(super) fn arm() -> Option<Watchdog> {
            // SAFETY: timer_create/settime with fully initialised arguments; the signal goes to
            // this thread only (SIGEV_THREAD_ID), whose handler is installed (prepare_thread).
            unsafe {
                let mut ev: libc::sigevent = std::mem::zeroed();
                ev.sigev_notify = libc::SIGEV_THREAD_ID;
                ev.sigev_signo = WATCHDOG_SIGNAL;
                ev.sigev_notify_thread_id = libc::gettid();
                let mut timer: libc::timer_t = std::mem::zeroed();
                if libc::timer_create(libc::CLOCK_THREAD_CPUTIME_ID, &mut ev, &mut timer) != 0 {
                    return None;
                }
                let second = libc::timespec {
                    tv_sec: 1,
                    tv_nsec: 0,
                };
                let spec = libc::itimerspec {
                    it_interval: second,
                    it_value: second,
                };
                if libc::timer_settime(timer, 0, &spec, ptr::null_mut()) != 0 {
                    libc::timer_delete(timer);
                    return None;
                }
                Some(Watchdog { timer })
            }
        }
    }

    impl Drop for Watchdog {
        fn drop(&mut self) {
            // SAFETY: deletes the timer created by arm (a tick still pending is ignored by the
            // handler: SI_TIMER outside a fibre).
            unsafe { libc::timer_delete(self.timer) };
        }
    }

    /// Hands the signal to the previous handler; with none (default action), restores the
    /// default and returns, so the faulting instruction faults again and the default applies.
    unsafe fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
        let Some(Ok(prev)) = PREVIOUS.get() else {
            return;
        };
        let Some(i) = SIGNALS.iter().position(|&s| s == sig) else {
            return;
        };
        let p = &prev.0[i];
        // SAFETY: p is the action that was installed for sig before ours; calling it with the
        // arguments of its declared form is what the kernel would have done.
        unsafe {
            if p.sa_sigaction == libc::SIG_DFL || p.sa_sigaction == libc::SIG_IGN {
                libc::sigaction(sig, p, ptr::null_mut());
            } else if p.sa_flags & libc::SA_SIGINFO != 0 {
                let f: unsafe extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    std::mem::transmute(p.sa_sigaction);
                f(sig, info, ctx);
            } else {
                let f: unsafe extern "C" fn(libc::c_int) = std::mem::transmute(p.sa_sigaction);
                f(sig);
            }
        }
    }
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
mod imp {
    pub(super) fn prepare_thread() -> Result<(), String> {
        Ok(())
    }

    pub(crate) struct Watchdog;

    impl Watchdog {
        pub(super) fn arm() -> Option<Watchdog> {
            None
        }
    }
}
