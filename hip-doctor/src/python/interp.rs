//! The Python interpreter: which one, what it says about itself, and the opt-in live import.
//!
//! Every child runs under [`run_bounded`]: its own process group, a time limit after which the
//! whole group is killed, and at most [`OUTPUT_LIMIT`] bytes kept of each stream (the rest is
//! read and dropped, so a child that prints without end neither blocks nor fills memory).

use std::io::Read;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::report::Item;

/// Bytes kept of a child's stdout and of its stderr.
pub const OUTPUT_LIMIT: usize = 256 * 1024;

/// The time limit for asking the interpreter its version and `sys.path`.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(20);

/// The time limit for `--python-import` (importing torch can take a while on a cold disk).
pub const IMPORT_TIMEOUT: Duration = Duration::from_secs(120);

/// How a child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Exited with this code.
    Exited(i32),
    /// Killed by this signal (not ours).
    Signal(i32),
    /// Still running at the time limit; its process group was killed.
    TimedOut(Duration),
    /// Could not be started.
    NotStarted(String),
}

/// What a bounded run produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// How it ended.
    pub ending: Ending,
    /// The first [`OUTPUT_LIMIT`] bytes of stdout, lossily decoded.
    pub stdout: String,
    /// The first [`OUTPUT_LIMIT`] bytes of stderr, lossily decoded.
    pub stderr: String,
    /// Bytes of stdout and stderr dropped past the limit.
    pub dropped: u64,
}

/// Runs `program args` with no stdin, a time limit and bounded output.
pub fn run_bounded(program: &Path, args: &[&str], timeout: Duration) -> Run {
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return Run {
                ending: Ending::NotStarted(format!("{}: {e}", program.display())),
                stdout: String::new(),
                stderr: String::new(),
                dropped: 0,
            }
        }
    };
    let (tx, rx) = mpsc::channel();
    for (which, stream) in [
        (
            0,
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
        (
            1,
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn Read + Send>),
        ),
    ] {
        let tx = tx.clone();
        if let Some(stream) = stream {
            std::thread::spawn(move || {
                let _ = tx.send((which, read_capped(stream)));
            });
        }
    }
    drop(tx);
    let start = Instant::now();
    let ending = loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                break match (status.code(), status.signal()) {
                    (Some(code), _) => Ending::Exited(code),
                    (None, Some(signal)) => Ending::Signal(signal),
                    (None, None) => Ending::Exited(-1),
                }
            }
            Ok(None) if start.elapsed() >= timeout => {
                kill_group(child.id());
                let _ = child.wait();
                break Ending::TimedOut(timeout);
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => break Ending::NotStarted(format!("waiting for {}: {e}", program.display())),
        }
    };
    // A grandchild may hold the pipes open: collect what the readers have, briefly.
    kill_group(child.id());
    let (mut stdout, mut stderr, mut dropped) = (Vec::new(), Vec::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..2 {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((0, (bytes, lost))) => (stdout, dropped) = (bytes, dropped + lost),
            Ok((_, (bytes, lost))) => (stderr, dropped) = (bytes, dropped + lost),
            Err(_) => break,
        }
    }
    Run {
        ending,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        dropped,
    }
}

/// Reads a stream to its end, keeping the first [`OUTPUT_LIMIT`] bytes; returns them and the
/// count dropped.
fn read_capped(mut stream: Box<dyn Read + Send>) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut dropped = 0u64;
    let mut buf = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = OUTPUT_LIMIT.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
                dropped += (n - room) as u64;
            }
        }
    }
    (kept, dropped)
}

/// Kills the process group led by `pid` (the child was started as its leader).
fn kill_group(pid: u32) {
    let Ok(pid) = i32::try_from(pid) else { return };
    // SAFETY: kill(2) takes plain integers and touches no memory of ours; a negative pid names
    // the process group that `run_bounded` created for this child (`process_group(0)`), so no
    // other process is signalled. A group that is already gone makes it return ESRCH.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}

/// Where the interpreter came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The interpreter.
    pub path: PathBuf,
    /// `--python`, `VIRTUAL_ENV`, `CONDA_PREFIX` or `PATH`.
    pub source: &'static str,
}

/// The interpreter: `--python`, else `$VIRTUAL_ENV/bin/python`, else `$CONDA_PREFIX/bin/python`,
/// else `python3` on `PATH`. `var` reads a variable (the process's, or a test's).
pub fn choose(flag: Option<&Path>, var: &dyn Fn(&str) -> Option<String>) -> Option<Choice> {
    if let Some(path) = flag {
        return Some(Choice {
            path: path.to_path_buf(),
            source: "--python",
        });
    }
    for (name, source) in [
        ("VIRTUAL_ENV", "VIRTUAL_ENV"),
        ("CONDA_PREFIX", "CONDA_PREFIX"),
    ] {
        if let Some(root) = var(name).filter(|v| !v.is_empty()) {
            let path = Path::new(&root).join("bin/python");
            if path.is_file() {
                return Some(Choice { path, source });
            }
        }
    }
    let path_var = var("PATH")?;
    std::env::split_paths(&path_var)
        .map(|dir| dir.join("python3"))
        .find(|p| p.is_file())
        .map(|path| Choice {
            path,
            source: "PATH",
        })
}

/// What the interpreter says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// `3.11.2`.
    pub version: String,
    /// `sys.path`, in order.
    pub sys_path: Vec<PathBuf>,
}

/// The program the interpreter runs: its version and `sys.path`, separated by NUL bytes. It
/// imports only `sys` (and `site`, as every start does); no package is imported.
const QUERY: &str =
    "import sys; sys.stdout.write('\\0'.join(['%d.%d.%d' % sys.version_info[:3]] + sys.path))";

/// Asks the interpreter for its version and `sys.path`.
pub fn query(python: &Path, timeout: Duration) -> Result<Facts, String> {
    let run = run_bounded(python, &["-c", QUERY], timeout);
    match &run.ending {
        Ending::Exited(0) => {}
        other => return Err(describe_failure(other, &run)),
    }
    if run.dropped > 0 {
        return Err(format!(
            "it printed more than {OUTPUT_LIMIT} bytes ({} dropped): not a Python interpreter",
            run.dropped
        ));
    }
    let mut parts = run.stdout.split('\0');
    let version = parts.next().unwrap_or_default().to_string();
    let valid =
        version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok());
    if !valid {
        return Err(format!(
            "its answer does not start with a version: {:?}",
            first_chars(&run.stdout, 80)
        ));
    }
    let sys_path = parts.filter(|p| !p.is_empty()).map(PathBuf::from).collect();
    Ok(Facts { version, sys_path })
}

fn first_chars(text: &str, n: usize) -> String {
    text.chars().take(n).collect()
}

/// The last `n` lines of a child's stderr (or stdout), for a detail.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(n);
    lines[start..]
        .iter()
        .map(|l| first_chars(l, 200))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// One line saying how a run went wrong.
fn describe_failure(ending: &Ending, run: &Run) -> String {
    match ending {
        Ending::Exited(code) => {
            let said = tail(&run.stderr, 3);
            if said.is_empty() {
                format!("it exited with status {code}")
            } else {
                format!("it exited with status {code}: {said}")
            }
        }
        Ending::Signal(signal) => format!("it was killed by {}", signal_name(*signal)),
        Ending::TimedOut(limit) => format!(
            "it did not finish within {} s and was killed",
            limit.as_secs()
        ),
        Ending::NotStarted(why) => format!("it could not be started: {why}"),
    }
}

/// `SIGSEGV (11)` and friends.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        _ => "signal",
    };
    format!("{name} ({signal})")
}

/// The name of the live check's row.
pub const IMPORT_ROW: &str = "import torch (live)";

/// The live check: what people type by hand, in a child with a time limit.
const IMPORT_PROGRAM: &str = "\
import torch
print('version', torch.__version__)
print('hip', torch.version.hip)
print('cuda', torch.version.cuda)
ok = torch.cuda.is_available()
print('available', ok)
print('devices', torch.cuda.device_count())
if ok:
    a = torch.ones(4, 4, device='cuda')
    print('matmul', float((a @ a).sum().item()))
";

/// `--python-import`: imports torch in a child and reports what it said, or how it died.
/// `amd_node` says whether this node's GPU is AMD/Hygon (so that no usable GPU is a failure).
pub fn live_import(python: &Path, timeout: Duration, amd_node: bool) -> Item {
    let run = run_bounded(python, &["-c", IMPORT_PROGRAM], timeout);
    let dropped = if run.dropped > 0 {
        format!(
            " ({} bytes of output past {OUTPUT_LIMIT} dropped)",
            run.dropped
        )
    } else {
        String::new()
    };
    let item = match run.ending {
        Ending::Signal(signal) => {
            let hint = if signal == libc::SIGSEGV {
                "a segmentation fault while importing torch is most often torchvision or \
                 torchaudio built for another torch (see the pairing rows above): install the \
                 builds made for this torch"
            } else {
                "run the same import by hand to see where it dies"
            };
            Item::fail(
                IMPORT_ROW,
                format!(
                    "the interpreter was killed by {} while importing torch{dropped}; last output: {}",
                    signal_name(signal),
                    tail(&format!("{}\n{}", run.stdout, run.stderr), 2)
                ),
            )
            .with_hint(hint)
            .with_fact("signal", signal)
        }
        Ending::TimedOut(limit) => Item::fail(
            IMPORT_ROW,
            format!(
                "no answer within {} s: the import hung and was killed{dropped}",
                limit.as_secs()
            ),
        )
        .with_hint("a hang at import or at the first CUDA/HIP call is often a driver that does not answer: check /dev/kfd and the Devices rows"),
        Ending::NotStarted(why) => Item::fail(IMPORT_ROW, format!("could not start: {why}")),
        Ending::Exited(code) if code != 0 => Item::fail(
            IMPORT_ROW,
            format!(
                "exited with status {code}{dropped}: {}",
                tail(&run.stderr, 3)
            ),
        ),
        Ending::Exited(_) => return judge_import(&run.stdout, amd_node, &dropped),
    };
    item
}

/// Reads the live check's answer.
fn judge_import(stdout: &str, amd_node: bool, dropped: &str) -> Item {
    let field = |key: &str| {
        stdout.lines().find_map(|l| {
            l.strip_prefix(key)
                .and_then(|rest| rest.strip_prefix(' '))
                .map(str::to_string)
        })
    };
    let (Some(version), Some(available)) = (field("version"), field("available")) else {
        return Item::fail(
            IMPORT_ROW,
            format!(
                "exited 0 but did not print the expected lines{dropped}: {:?}",
                first_chars(stdout, 120)
            ),
        );
    };
    let hip = field("hip").unwrap_or_default();
    let cuda = field("cuda").unwrap_or_default();
    let devices = field("devices").unwrap_or_default();
    let detail = format!(
        "torch {version}, version.hip {hip}, version.cuda {cuda}, cuda.is_available() {available}, device_count() {devices}"
    );
    let item = if available == "True" {
        match field("matmul").as_deref() {
            Some("64.0") => Item::pass(IMPORT_ROW, format!("{detail}; 4x4 matmul on the GPU = 64")),
            other => Item::fail(
                IMPORT_ROW,
                format!("{detail}; a 4x4 matmul of ones on the GPU gave {other:?}, not 64"),
            ),
        }
    } else if amd_node {
        Item::fail(
            IMPORT_ROW,
            format!("{detail}: this torch sees no GPU, training runs on the CPU"),
        )
        .with_hint("see the torch build row: install DTK's torch for this DTK")
    } else {
        Item::info(IMPORT_ROW, format!("{detail}{dropped}"))
    };
    item.with_fact("version", version)
        .with_fact("available", available == "True")
}
