//! Running checks safely: a failure inside one check becomes a FAIL row, and anything that takes
//! more than a second shows a progress line on stderr.
//!
//! Checks return `Result`s; [`guarded`] converts errors to rows. As a last safety net it also
//! catches unwinding panics (a bug in a dependency, say): [`install_quiet_panic_hook`] replaces
//! the default hook, which would print a "thread ... panicked" message, by one that only records
//! the message and location so that the row can show them.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

use super::progress::{with_steps_on, Steps, Style};
use super::report::Item;

thread_local! {
    /// The message and location of this thread's most recent panic, recorded by the quiet hook
    /// (the hook runs on the panicking thread, which is the thread that catches it).
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Replaces the process's panic hook by one that prints nothing and records the message for
/// [`guarded`]. Call once, early in `main`.
pub fn install_quiet_panic_hook() {
    panic::set_hook(Box::new(|info| {
        let message = payload_text(info.payload());
        let text = match info.location() {
            Some(loc) => format!("{message} (at {}:{})", loc.file(), loc.line()),
            None => message,
        };
        LAST_PANIC.with(|slot| {
            if let Ok(mut slot) = slot.try_borrow_mut() {
                *slot = Some(text);
            }
        });
    }));
}

/// The message of a panic payload (`&str` or `String`), or a placeholder.
pub(super) fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown internal error".to_string()
    }
}

fn take_last_panic() -> Option<String> {
    LAST_PANIC.with(|slot| slot.try_borrow_mut().ok().and_then(|mut slot| slot.take()))
}

/// Runs `check`, turning an unwinding panic into a FAIL row named `name`.
///
/// The closure returns the rows it produced. With the quiet hook installed, nothing is printed
/// for a panic; the row says it was an internal error in hip-doctor and asks for a report.
pub fn guarded(name: &str, check: impl FnOnce() -> Vec<Item>) -> Vec<Item> {
    // Clear any stale message so that a row never shows an earlier panic's text.
    let _ = take_last_panic();
    match panic::catch_unwind(AssertUnwindSafe(check)) {
        Ok(items) => items,
        Err(payload) => {
            let message = take_last_panic().unwrap_or_else(|| payload_text(payload.as_ref()));
            vec![Item::fail(name, format!("internal error in hip-doctor while checking: {message}"))
                .with_hint("this is a bug in hip-doctor or a library it calls; please report it with this output")]
        }
    }
}

/// Runs one check under [`guarded`] and [`with_progress`]: `Ok(detail)` is a PASS row,
/// `Err(e)` a FAIL row showing `e`.
pub fn check<E: std::fmt::Display>(name: &str, run: impl FnOnce() -> Result<String, E>) -> Item {
    let mut rows = guarded(name, || {
        vec![match with_progress(name, run) {
            Ok(detail) => Item::pass(name, detail),
            Err(e) => Item::fail(name, e.to_string()),
        }]
    });
    rows.pop()
        .unwrap_or_else(|| Item::fail(name, "the check produced no result"))
}

/// Shows `label` on stderr if `work` is still running after one second (see
/// [`crate::progress`]: a redrawn line on a terminal, plain lines otherwise).
pub fn with_progress<T>(label: &str, work: impl FnOnce() -> T) -> T {
    with_progress_after(label, Duration::from_secs(1), work)
}

fn with_progress_after<T>(label: &str, delay: Duration, work: impl FnOnce() -> T) -> T {
    let style = if std::io::stderr().is_terminal() {
        Style::Terminal
    } else {
        Style::Lines
    };
    with_steps_on(
        std::io::stderr(),
        style,
        delay,
        label,
        &Steps::new(0),
        |_| work(),
    )
}

/// [`with_progress`] for work of counted steps: `work` names each step as it starts and counts
/// it when done, and the line shows `[done/total] step`.
pub fn with_steps<T>(label: &str, steps: &Steps, work: impl FnOnce(&Steps) -> T) -> T {
    let style = if std::io::stderr().is_terminal() {
        Style::Terminal
    } else {
        Style::Lines
    };
    with_steps_on(
        std::io::stderr(),
        style,
        Duration::from_secs(1),
        label,
        steps,
        work,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The panic hook is process-wide: tests that replace it run one at a time and restore it.
    static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn errors_pass_through_and_panics_become_fail_rows() {
        let _serial = HOOK.lock().unwrap_or_else(|e| e.into_inner());
        install_quiet_panic_hook();
        let ok = guarded("fine", || vec![Item::pass("fine", "ok")]);
        assert_eq!(ok, vec![Item::pass("fine", "ok")]);

        let rows = guarded("boom", || panic!("index out of range: 7"));
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].name, "boom");
        assert_eq!(rows[0].status, crate::report::Status::Fail);
        assert!(
            rows[0].detail.contains("index out of range: 7"),
            "{}",
            rows[0].detail
        );
        assert!(
            rows[0].detail.contains("guard.rs"),
            "location recorded: {}",
            rows[0].detail
        );
        assert!(!rows[0].detail.contains("panicked"));
        let _ = panic::take_hook();
    }

    #[test]
    fn check_maps_results_to_rows() {
        let ok = check("copy", || Ok::<_, String>("4096 bytes round trip".into()));
        assert_eq!(ok, Item::pass("copy", "4096 bytes round trip"));
        let bad = check("copy", || {
            Err::<String, _>("mismatch at index 3: got 1, expected 2")
        });
        assert_eq!(
            bad,
            Item::fail("copy", "mismatch at index 3: got 1, expected 2")
        );
    }

    #[test]
    fn a_panic_under_progress_does_not_hang() {
        let _serial = HOOK.lock().unwrap_or_else(|e| e.into_inner());
        install_quiet_panic_hook();
        let rows = guarded("slow boom", || {
            with_progress_after("slow boom", Duration::from_millis(1), || {
                std::thread::sleep(Duration::from_millis(20));
                panic!("boom")
            })
        });
        assert_eq!(rows.len(), 1);
        assert!(rows[0].detail.contains("boom"), "{}", rows[0].detail);
        let _ = panic::take_hook();
    }

    #[test]
    fn progress_returns_the_value_and_survives_slow_work() {
        let v = with_progress_after("quick", Duration::from_secs(5), || 7);
        assert_eq!(v, 7);
        let v = with_progress_after("slow", Duration::from_millis(10), || {
            std::thread::sleep(Duration::from_millis(50));
            "done"
        });
        assert_eq!(v, "done");
    }
}
