//! Progress of long work on stderr: which step runs, how many of how many are done, and for how
//! long. Never on stdout, so `--json` stays one JSON document.
//!
//! Nothing is shown for work that ends within the delay (one second). After it:
//! - on a terminal, one status line is redrawn every second and erased at the end;
//! - otherwise (a log file, CI, `ssh node hip-doctor 2>log`), a plain line is written when the
//!   work passes the delay, one each time the step changes (checked once a second, so at most
//!   one line a second), and one at the end with the time taken. Plain lines carry no escape
//!   codes and survive being collected from many nodes.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The steps of one piece of work, shared with the thread that shows them.
#[derive(Debug, Default)]
pub struct Steps {
    total: usize,
    done: AtomicUsize,
    current: Mutex<String>,
}

impl Steps {
    /// Steps for work of `total` steps (0: not counted, only the label and time are shown).
    pub fn new(total: usize) -> Steps {
        Steps {
            total,
            ..Steps::default()
        }
    }

    /// Names the step that starts now.
    pub fn start(&self, what: impl Into<String>) {
        if let Ok(mut current) = self.current.lock() {
            *current = what.into();
        }
    }

    /// Counts one step as done.
    pub fn finish_one(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// `[done/total] current step`, or what of it is known.
    pub fn describe(&self) -> String {
        let current = self.current.lock().map(|c| c.clone()).unwrap_or_default();
        let done = self.done.load(Ordering::Relaxed).min(self.total);
        match (self.total, current.is_empty()) {
            (0, true) => String::new(),
            (0, false) => current,
            (total, true) => format!("[{done}/{total}]"),
            (total, false) => format!("[{}/{total}] {current}", (done + 1).min(total)),
        }
    }
}

/// How progress is written: to a terminal (redrawn line) or as plain lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// One line, redrawn each second and erased at the end.
    Terminal,
    /// Plain lines: start, each change of step, end.
    Lines,
}

/// Runs `work`, showing `label` and its [`Steps`] on `sink` once it has run for `delay`.
pub fn with_steps_on<T, W: Write + Send>(
    sink: W,
    style: Style,
    delay: Duration,
    label: &str,
    steps: &Steps,
    work: impl FnOnce(&Steps) -> T,
) -> T {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::scope(|scope| {
        // Owned by this closure: if `work` unwinds the sender is dropped, the watcher sees the
        // channel close and exits, and the scope's join cannot hang.
        let done_tx = done_tx;
        scope.spawn(move || watch(sink, style, delay, label, steps, &done_rx));
        let out = work(steps);
        let _ = done_tx.send(());
        out
    })
}

fn watch<W: Write>(
    mut sink: W,
    style: Style,
    delay: Duration,
    label: &str,
    steps: &Steps,
    done: &mpsc::Receiver<()>,
) {
    let start = Instant::now();
    let mut wait = delay;
    let mut shown: Option<String> = None;
    let line = |what: &str| {
        if what.is_empty() {
            format!("hip-doctor: {label}")
        } else {
            format!("hip-doctor: {label}: {what}")
        }
    };
    loop {
        match done.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {
                let what = steps.describe();
                let secs = start.elapsed().as_secs();
                match style {
                    Style::Terminal => {
                        let _ = write!(sink, "\r\x1b[2K{} ... {secs} s", line(&what));
                    }
                    Style::Lines if shown.as_ref() != Some(&what) => {
                        let _ = writeln!(sink, "{} ... ({secs} s so far)", line(&what));
                    }
                    Style::Lines => {}
                }
                let _ = sink.flush();
                shown = Some(what);
                wait = Duration::from_secs(1);
            }
            // Finished (or the sender went away because `work` unwound).
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if shown.is_some() {
                    match style {
                        Style::Terminal => {
                            let _ = write!(sink, "\r\x1b[2K");
                        }
                        Style::Lines => {
                            let secs = start.elapsed().as_secs_f64();
                            let _ = writeln!(sink, "hip-doctor: {label} done in {secs:.1} s");
                        }
                    }
                    let _ = sink.flush();
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A sink the test reads back after the watcher has finished.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut v) = self.0.lock() {
                v.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().map(|v| v.clone()).unwrap_or_default())
                .into_owned()
        }
    }

    #[test]
    fn describe_counts_and_names_the_step() {
        let s = Steps::new(3);
        assert_eq!(s.describe(), "[0/3]");
        s.start("copy");
        assert_eq!(s.describe(), "[1/3] copy");
        s.finish_one();
        s.start("sgemm");
        assert_eq!(s.describe(), "[2/3] sgemm");
        s.finish_one();
        s.finish_one();
        s.finish_one();
        assert_eq!(s.describe(), "[3/3] sgemm", "never past the total");
        let uncounted = Steps::new(0);
        assert_eq!(uncounted.describe(), "");
        uncounted.start("loading");
        assert_eq!(uncounted.describe(), "loading");
    }

    #[test]
    fn plain_lines_name_each_step_and_the_end() {
        let sink = Shared::default();
        let steps = Steps::new(2);
        let out = with_steps_on(
            sink.clone(),
            Style::Lines,
            Duration::from_millis(1),
            "benchmarking device 0",
            &steps,
            |s| {
                s.start("device 0 copy");
                std::thread::sleep(Duration::from_millis(1200));
                s.finish_one();
                s.start("device 0 sgemm");
                std::thread::sleep(Duration::from_millis(1200));
                s.finish_one();
                42
            },
        );
        assert_eq!(out, 42);
        let text = sink.text();
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("hip-doctor: benchmarking device 0: [1/2] device 0 copy ... ("),
            "{text}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("hip-doctor: benchmarking device 0: [2/2] device 0 sgemm")),
            "{text}"
        );
        assert!(
            lines
                .last()
                .is_some_and(|l| l.starts_with("hip-doctor: benchmarking device 0 done in")),
            "{text}"
        );
        assert!(
            !text.contains('\x1b'),
            "no escape codes in plain lines: {text:?}"
        );
    }

    #[test]
    fn a_terminal_line_is_redrawn_and_erased() {
        let sink = Shared::default();
        let steps = Steps::new(0);
        with_steps_on(
            sink.clone(),
            Style::Terminal,
            Duration::from_millis(1),
            "querying devices",
            &steps,
            |_| std::thread::sleep(Duration::from_millis(50)),
        );
        let text = sink.text();
        assert!(
            text.starts_with("\r\x1b[2Khip-doctor: querying devices ... 0 s"),
            "{text:?}"
        );
        assert!(text.ends_with("\r\x1b[2K"), "{text:?}");
    }

    #[test]
    fn quick_work_shows_nothing() {
        let sink = Shared::default();
        let steps = Steps::new(1);
        with_steps_on(
            sink.clone(),
            Style::Lines,
            Duration::from_secs(5),
            "quick",
            &steps,
            |_| (),
        );
        assert_eq!(sink.text(), "");
    }
}
