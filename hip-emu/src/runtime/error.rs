//! Status codes, this thread's last error, detailed messages and the panic guard every export
//! runs inside.
//!
//! Every failing export carries a message (a [`Fail`]) naming the value involved. The message is
//! kept per thread and per code: `hipGetErrorString(code)` answers the generic description plus
//! the detail of the last `code` this thread received, so hip-sys's `HipError` (which asks the
//! runtime right after a failed call, on the same thread) carries it to Rust with no change to
//! hip-sys or hip-rt. `hipemuLastErrorMessage` returns the most recent detail directly.
//!
//! Last-error semantics follow ROCm 5.x HIP: every runtime call stores its status as the thread's
//! last error (success included); `hipGetLastError` returns it and resets it to success,
//! `hipPeekAtLastError` returns it without resetting.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use hip_sys::hipError_t;

/// A failed runtime call: the status to return and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fail {
    pub code: hipError_t,
    pub message: String,
}

impl Fail {
    pub fn new(code: hipError_t, message: impl Into<String>) -> Fail {
        Fail {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Fail {
        Fail::new(hipError_t::hipErrorInvalidValue, message)
    }

    pub fn handle(message: impl Into<String>) -> Fail {
        Fail::new(hipError_t::hipErrorInvalidHandle, message)
    }
}

impl std::fmt::Display for Fail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.code.builtin_name())
    }
}

/// Result of the runtime's internals.
pub type Res<T = ()> = Result<T, Fail>;

#[derive(Default)]
struct ThreadErrors {
    last: u32,
    /// Detail of the last failure with each code.
    detail: HashMap<u32, String>,
    /// The most recent detail of any code.
    latest: Option<String>,
}

thread_local! {
    static ERRORS: RefCell<ThreadErrors> = RefCell::new(ThreadErrors::default());
}

/// Record `status` as this thread's last error (and its detail) and return its code.
pub fn record(status: Res) -> hipError_t {
    ERRORS.with(|e| {
        let mut e = e.borrow_mut();
        match status {
            Ok(()) => {
                e.last = 0;
                hipError_t::hipSuccess
            }
            Err(fail) => {
                e.last = fail.code.0;
                let text = format!("hip-emu: {}", fail.message);
                e.detail.insert(fail.code.0, text.clone());
                e.latest = Some(text);
                fail.code
            }
        }
    })
}

/// Keep `message` as this thread's latest detail (for `hipemuLastErrorMessage`) without
/// touching the HIP last-error state: for BLAS failures, which HIP's state does not see.
pub fn set_detail(message: &str) {
    ERRORS.with(|e| e.borrow_mut().latest = Some(format!("hip-emu: {message}")));
}

/// `hipGetLastError` (`reset`) / `hipPeekAtLastError`.
pub fn last_error(reset: bool) -> hipError_t {
    ERRORS.with(|e| {
        let mut e = e.borrow_mut();
        let code = hipError_t(e.last);
        if reset {
            e.last = 0;
        }
        code
    })
}

/// The detail this thread last received with `code`.
pub fn detail_for(code: hipError_t) -> Option<String> {
    ERRORS.with(|e| e.borrow().detail.get(&code.0).cloned())
}

/// The most recent detailed message on this thread.
pub fn latest_detail() -> Option<String> {
    ERRORS.with(|e| e.borrow().latest.clone())
}

/// Run an export's body: a panic becomes hipErrorUnknown with its message; the status becomes
/// the thread's last error.
pub fn guard(name: &'static str, body: impl FnOnce() -> Res) -> hipError_t {
    let status = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status,
        Err(payload) => Err(Fail::new(
            hipError_t::hipErrorUnknown,
            format!("{name} panicked inside hip-emu: {}", panic_text(&*payload)),
        )),
    };
    record(status)
}

/// The text of a panic payload.
pub fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic payload)".to_owned()
    }
}

/// At most this many distinct strings are interned; past it, [`intern`] returns a fixed text.
const MAX_INTERNED: usize = 4096;

static INTERNED: Mutex<Option<HashMap<String, &'static std::ffi::CStr>>> = Mutex::new(None);

/// A NUL-terminated copy of `text` that lives for the rest of the process (C callers keep the
/// pointers `hipGetErrorString` returns forever). Identical texts share one copy; the table is
/// bounded, after which a fixed explanation is returned.
pub fn intern(text: &str) -> *const c_char {
    const FULL: &std::ffi::CStr =
        c"hip-emu: too many distinct error messages to keep; call hipemuLastErrorMessage";
    let mut guard = INTERNED.lock().unwrap_or_else(|p| p.into_inner());
    let table = guard.get_or_insert_with(HashMap::new);
    if let Some(s) = table.get(text) {
        return s.as_ptr();
    }
    if table.len() >= MAX_INTERNED {
        return FULL.as_ptr();
    }
    let owned = CString::new(text.replace('\0', " ")).unwrap_or_default();
    let leaked: &'static std::ffi::CStr = Box::leak(owned.into_boxed_c_str());
    table.insert(text.to_owned(), leaked);
    leaked.as_ptr()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_sets_the_last_error_and_get_resets_it() {
        assert_eq!(record(Err(Fail::invalid("bad size 7"))).0, 1);
        assert_eq!(last_error(false).0, 1);
        assert_eq!(last_error(true).0, 1);
        assert_eq!(last_error(true).0, 0);
        record(Err(Fail::invalid("x")));
        record(Ok(()));
        assert_eq!(
            last_error(false).0,
            0,
            "a success overwrites it, as in HIP 5.x"
        );
        assert_eq!(
            detail_for(hipError_t::hipErrorInvalidValue).as_deref(),
            Some("hip-emu: x")
        );
    }

    #[test]
    fn a_panic_becomes_unknown_with_its_text() {
        let code = guard("hipTest", || panic!("boom 42"));
        assert_eq!(code, hipError_t::hipErrorUnknown);
        let detail = latest_detail().unwrap();
        assert!(
            detail.contains("hipTest") && detail.contains("boom 42"),
            "{detail}"
        );
    }

    #[test]
    fn interned_strings_are_shared_and_nul_terminated() {
        let (a, b) = (intern("same text"), intern("same text"));
        assert_eq!(a, b);
        // SAFETY: intern returns a pointer to a leaked, NUL-terminated string.
        let s = unsafe { std::ffi::CStr::from_ptr(a) };
        assert_eq!(s.to_str().unwrap(), "same text");
    }
}
