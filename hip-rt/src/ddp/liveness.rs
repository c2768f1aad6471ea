//! [`Liveness`]: the ranks watch each other over the rendezvous connections, so that a rank
//! that dies, is killed or stops answering ends the run on every rank within the
//! communicator's timeout, with an error naming it, on any RCCL (a real one has no watchdog).
//!
//! After the rendezvous rank 0 keeps one connection to every other rank. On each, both sides
//! send a heartbeat byte every quarter of the timeout (at most every second). A side that sees
//! its connection closed without a goodbye (the process exited or was killed: the kernel
//! closes its sockets), or hears nothing for the silence limit ([`super::join_from_env`] uses
//! half the communicator's timeout; the process is stopped or hung), aborts its communicator (`ncclCommAbort`, which ends its waits) with a reason naming
//! that rank; rank 0 also tells every other rank which rank was lost. [`Liveness::finish`]
//! says goodbye: a rank that ends its run normally is not reported.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::rendezvous::PeerStream;
use crate::comm::{AbortHandle, Comm};

const HEARTBEAT: u8 = b'H';
const GOODBYE: u8 = b'B';
/// Rank 0 to the others: a rank was lost; followed by the rank (u32) and a reason code.
const LOST: u8 = b'L';
const REASON_CLOSED: u8 = 1;
const REASON_SILENT: u8 = 2;

/// Watches the other ranks of a launched job (see the module docs). Dropping it without
/// [`Liveness::finish`] closes the connections: the other ranks then report this rank as
/// ended without finishing, which is what a failing rank wants.
#[derive(Debug)]
pub struct Liveness {
    stop: Arc<AtomicBool>,
    goodbye: Arc<AtomicBool>,
    lost: Arc<Mutex<Option<String>>>,
    thread: Option<JoinHandle<()>>,
}

struct Peer {
    rank: usize,
    stream: TcpStream,
    last_heard: Instant,
    done: bool,
    /// Bytes of an unfinished `LOST` message.
    partial: Vec<u8>,
}

impl Liveness {
    /// Start watching `peers` (rank 0: every other rank; the others: rank 0) for the
    /// communicator `comm` of rank `rank`: silent for longer than `silence` means lost.
    pub fn start(rank: usize, peers: Vec<PeerStream>, comm: &Comm, silence: Duration) -> Liveness {
        let stop = Arc::new(AtomicBool::new(false));
        let goodbye = Arc::new(AtomicBool::new(false));
        let lost = Arc::new(Mutex::new(None));
        let now = Instant::now();
        let peers: Vec<Peer> = peers
            .into_iter()
            .filter(|(_, s)| s.set_nonblocking(true).is_ok())
            .map(|(r, stream)| Peer {
                rank: r,
                stream,
                last_heard: now,
                done: false,
                partial: Vec::new(),
            })
            .collect();
        let watch = Watch {
            rank,
            peers,
            abort: comm.abort_handle(),
            silence,
            stop: stop.clone(),
            goodbye: goodbye.clone(),
            lost: lost.clone(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("hipk-liveness-{rank}"))
            .spawn(move || watch.run())
            .ok();
        Liveness {
            stop,
            goodbye,
            lost,
            thread,
        }
    }

    /// The rank lost and why, once one was (the communicator is then aborted).
    pub fn lost(&self) -> Option<String> {
        self.lost
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// This rank ended its run normally: say goodbye to the watched ranks and stop.
    pub fn finish(mut self) {
        self.goodbye.store(true, Ordering::Release);
        self.end();
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Liveness {
    fn drop(&mut self) {
        self.end();
    }
}

struct Watch {
    rank: usize,
    peers: Vec<Peer>,
    abort: AbortHandle,
    silence: Duration,
    stop: Arc<AtomicBool>,
    goodbye: Arc<AtomicBool>,
    lost: Arc<Mutex<Option<String>>>,
}

impl Watch {
    fn run(mut self) {
        let beat = (self.silence / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let tick = (beat / 4).max(Duration::from_millis(5));
        let mut last_beat: Option<Instant> = None;
        loop {
            if self.stop.load(Ordering::Acquire) {
                if self.goodbye.load(Ordering::Acquire) {
                    for p in &mut self.peers {
                        let _ = p.stream.set_nonblocking(false);
                        let _ = p.stream.set_write_timeout(Some(Duration::from_secs(1)));
                        let _ = p.stream.write_all(&[GOODBYE]);
                    }
                }
                return;
            }
            if last_beat.map_or(true, |t| t.elapsed() >= beat) {
                for p in self.peers.iter_mut().filter(|p| !p.done) {
                    // A full send buffer (WouldBlock) only means the peer is slow to read.
                    let _ = p.stream.write(&[HEARTBEAT]);
                }
                last_beat = Some(Instant::now());
            }
            if let Some((rank, why)) = self.listen() {
                self.lose(rank, why);
                return;
            }
            std::thread::sleep(tick);
        }
    }

    /// Read what every watched peer sent: the first lost rank and why, if any.
    fn listen(&mut self) -> Option<(usize, String)> {
        let silence = self.silence;
        for p in self.peers.iter_mut().filter(|p| !p.done) {
            let mut buf = [0u8; 64];
            loop {
                match p.stream.read(&mut buf) {
                    Ok(0) => {
                        return Some((
                            p.rank,
                            "closed its connection without finishing its run: it failed, exited or was killed".into(),
                        ))
                    }
                    Ok(n) => {
                        p.last_heard = Instant::now();
                        for &b in &buf[..n] {
                            if !p.partial.is_empty() {
                                p.partial.push(b);
                                if p.partial.len() == 6 {
                                    let r = u32::from_be_bytes([
                                        p.partial[1],
                                        p.partial[2],
                                        p.partial[3],
                                        p.partial[4],
                                    ]) as usize;
                                    let why = match p.partial[5] {
                                        REASON_SILENT => silent_text(silence),
                                        _ => "closed its connection to rank 0 without finishing its run: it failed, exited or was killed".into(),
                                    };
                                    return Some((r, format!("{why} (seen by rank 0)")));
                                }
                                continue;
                            }
                            match b {
                                HEARTBEAT => {}
                                GOODBYE => p.done = true,
                                LOST => p.partial.push(b),
                                other => {
                                    return Some((
                                        p.rank,
                                        format!("sent byte {other:#04x}, which is not the liveness protocol"),
                                    ))
                                }
                            }
                        }
                        if p.done {
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Some((p.rank, format!("broke its connection ({e})"))),
                }
            }
            if !p.done && p.last_heard.elapsed() > silence {
                return Some((p.rank, silent_text(silence)));
            }
        }
        None
    }

    /// Record and report rank `lost`, abort the communicator, and (rank 0) tell the others.
    fn lose(&mut self, lost: usize, why: String) {
        let text = format!("rank {lost} {why}");
        if !std::thread::panicking() {
            eprintln!("rank {}: {text}; aborting the communicator", self.rank);
        }
        *self.lost.lock().unwrap_or_else(PoisonError::into_inner) = Some(text.clone());
        self.abort.abort(text.clone());
        if self.rank == 0 {
            let code = if why.starts_with("sent nothing") {
                REASON_SILENT
            } else {
                REASON_CLOSED
            };
            let mut msg = vec![LOST];
            msg.extend((lost.min(u32::MAX as usize) as u32).to_be_bytes());
            msg.push(code);
            for p in self.peers.iter_mut().filter(|p| p.rank != lost && !p.done) {
                let _ = p.stream.set_nonblocking(false);
                let _ = p.stream.set_write_timeout(Some(Duration::from_secs(1)));
                let _ = p.stream.write_all(&msg);
            }
        }
    }
}

fn silent_text(silence: Duration) -> String {
    format!(
        "sent nothing for {silence:?} (half of HIPK_COMM_TIMEOUT_S): it is stopped, hung or unreachable"
    )
}
