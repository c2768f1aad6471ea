//! Faults inside kernel fibres: a SIGSEGV/SIGBUS/SIGFPE/SIGILL raised while a GPU thread's
//! fibre runs ends that fibre with `End::Fault` (corosensei's trap-handler support) instead of
//! killing the process; the executor turns it into `ExecError::Fault`. Signals raised anywhere
//! else go to the handler that was installed before ours (or the default action).
//!
//! Only x86_64 Linux rewrites the interrupted context; elsewhere the handler is not installed
//! and a fault in a kernel crashes the process as it would without hip-emu.

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

thread_local! {
    static RUNNING: Cell<Option<Running>> = const { Cell::new(None) };
}

/// Marks `r` as the fibre running on this thread (None after it suspends or ends).
pub(crate) fn set_running(r: Option<Running>) {
    RUNNING.with(|c| c.set(r));
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
    use super::{End, RUNNING};
    use std::cell::RefCell;
    use std::mem::MaybeUninit;
    use std::ptr;
    use std::sync::OnceLock;

    const SIGNALS: [libc::c_int; 4] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL];

    /// The handlers that were installed before ours, in SIGNALS order.
    struct Previous([libc::sigaction; 4]);
    // SAFETY: plain C data (function pointers and masks), never mutated after installation.
    unsafe impl Sync for Previous {}
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
            let mut prev: [libc::sigaction; 4] = std::mem::zeroed();
            for (i, &sig) in SIGNALS.iter().enumerate() {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = handler as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
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
        // SAFETY (whole body): the kernel passes valid siginfo and ucontext pointers to an
        // SA_SIGINFO handler; the trap handler belongs to the fibre marked running on this
        // thread, which is alive (the executor clears RUNNING before it drops a fibre).
        unsafe {
            let uc = ctx as *mut libc::ucontext_t;
            if let Some(r) = running {
                let sp = (*uc).uc_mcontext.gregs[libc::REG_RSP as usize] as usize;
                if r.handler.stack_ptr_in_bounds(sp) {
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
            chain(sig, info, ctx);
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
}
