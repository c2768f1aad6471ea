//! The rendezvous: rank 0 hands its RCCL [`UniqueId`] to the other ranks over TCP, to the
//! job's own ranks only.
//!
//! Rank 0 listens on MASTER_ADDR's address (not every interface). Each other rank connects
//! (retrying until the timeout) and the two prove to each other that they hold the job's
//! [`Secret`] without sending it: HMAC-SHA256 over both sides' random nonces.
//!
//! 1. peer → rank 0, hello: magic, version, its world size and rank, a 32-byte nonce.
//! 2. rank 0 → peer, challenge: its own nonce and the MAC of both nonces, world and rank.
//! 3. peer → rank 0, proof: the MAC of both nonces, world, rank and its settings (the run
//!    configuration that must agree across ranks, see [`Settings`]), then the settings.
//! 4. rank 0 → peer, answer: a status, a reason text and, when admitted, the unique id.
//!
//! Every connection is handled on its own thread under one deadline (at most [`HELLO_WAIT`]
//! from its accept, never past the rendezvous timeout), at most [`MAX_HANDSHAKES`] at once,
//! and every read is of a fixed or bounded size. A connection that does not complete the
//! exchange, speaks another version, or fails the proof is dropped and logged on stderr,
//! never fatal: an outsider can neither join nor end the rendezvous. A peer that proves the
//! secret is one of the job's ranks: if it disagrees on the world size, its rank or a setting,
//! the rendezvous fails on every rank, naming what differs.
//!
//! Not protected (there is no TLS): the unique id travels in clear after the proof, so whoever
//! can read the traffic between the nodes, or act as a man in the middle, can join RCCL.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use hip_sys::rccl::NCCL_UNIQUE_ID_BYTES;

use super::error::{DdpError, RendezvousError};
use super::secret::{random, Secret};
pub use super::settings::{Settings, MAX_SETTINGS};
use super::HELLO_WAIT;
use crate::comm::UniqueId;

const MAGIC: [u8; 8] = *b"hipkrdzv";
/// The protocol version; bumped on any change to the messages.
pub const VERSION: u16 = 2;
/// At most this many connections are being handshaken at once; more are closed at accept.
pub const MAX_HANDSHAKES: usize = 64;
/// The longest reason text in an answer, in bytes.
const MAX_TEXT: usize = 1024;
const NONCE: usize = 32;
const TAG: usize = 32;
/// Magic, version, world size (u32), rank (u32), nonce.
const HELLO_LEN: usize = 8 + 2 + 4 + 4 + NONCE;
/// Magic, version, kind.
const HEAD_LEN: usize = 8 + 2 + 1;
const KIND_CHALLENGE: u8 = b'C';
const KIND_ANSWER: u8 = b'A';
/// After the head of an answer: status, world (u32), detail (u32), id, text length (u16).
const ANSWER_FIXED: usize = 1 + 4 + 4 + NCCL_UNIQUE_ID_BYTES + 2;
const LABEL_RANK0: &[u8] = b"hipk-rdzv/2 rank 0";
const LABEL_PEER: &[u8] = b"hipk-rdzv/2 peer";

/// Status codes of an answer.
mod status {
    pub const OK: u8 = 0;
    pub const VERSION: u8 = 1;
    pub const WORLD: u8 = 2;
    pub const RANK: u8 = 3;
    pub const DUPLICATE: u8 = 4;
    /// Rank 0 gave up waiting; detail = the number of ranks missing.
    pub const TIMEOUT: u8 = 5;
    /// Rank 0 gave up because another peer mismatched; detail = that peer's rank.
    pub const ABORTED: u8 = 6;
    /// A setting differs from rank 0's; the text names it.
    pub const SETTINGS: u8 = 7;
}

/// The rendezvous waits as long as collectives do: `HIPK_COMM_TIMEOUT_S`, else 300 s.
pub use crate::comm::{default_timeout, DEFAULT_TIMEOUT};

/// What a rank brings to the rendezvous: the job's secret and its settings.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The job's secret.
    pub secret: Secret,
    /// This rank's run configuration.
    pub settings: Settings,
}

/// How the rendezvous runs.
#[derive(Debug, Clone, Default)]
pub struct RendezvousOptions {
    /// How long rank 0 waits for every rank, and each other rank for rank 0's answer.
    /// `None`: [`default_timeout`] (an out-of-range `HIPK_COMM_TIMEOUT_S` is an error).
    pub timeout: Option<Duration>,
    /// Where rank 0 listens. Default (`None`): the address `MASTER_ADDR` resolves to, on the
    /// rendezvous port.
    pub bind: Option<SocketAddr>,
    /// The settings every rank must share (empty: none compared).
    pub settings: Settings,
    /// The job's secret. `None`: [`Secret::from_env`].
    pub secret: Option<Secret>,
}

fn resolve(host: &str, port: u16) -> Result<Vec<SocketAddr>, RendezvousError> {
    let text = display_addr(host, port);
    match (host, port).to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            if addrs.is_empty() {
                Err(RendezvousError::Resolve {
                    addr: text,
                    source: std::io::Error::new(ErrorKind::NotFound, "no address"),
                })
            } else {
                Ok(addrs)
            }
        }
        Err(source) => Err(RendezvousError::Resolve { addr: text, source }),
    }
}

fn display_addr(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Where to listen for `host`: its addresses, or the unspecified address of their family when
/// a name (not a literal, not `localhost`) resolves to loopback only.
fn listen_addrs(host: &str, port: u16) -> Result<Vec<SocketAddr>, RendezvousError> {
    let addrs = resolve(host, port)?;
    let name = host.trim_matches(|c| c == '[' || c == ']');
    let literal = name.parse::<std::net::IpAddr>().is_ok();
    let loopback_name = name.eq_ignore_ascii_case("localhost") || name.ends_with(".localhost");
    if literal || loopback_name || !addrs.iter().all(|a| a.ip().is_loopback()) {
        return Ok(addrs);
    }
    let any: std::net::IpAddr = match addrs[0] {
        SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    eprintln!(
        "rendezvous: MASTER_ADDR={host} resolves to {} on rank 0 (a loopback address, as an \
         /etc/hosts line `127.0.1.1 {host}` makes it) which other nodes cannot reach: listening \
         on every interface; set MASTER_ADDR to rank 0's network address to listen on it alone",
        addrs[0].ip()
    );
    Ok(vec![SocketAddr::new(any, port)])
}

/// A joined peer's connection, kept open after the rendezvous (see [`super::Liveness`]).
pub type PeerStream = (usize, TcpStream);

/// Rank 0's listening socket, bound before any peer is told where it is.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
}

/// What a handshake thread reports.
enum Outcome {
    /// A peer that proved the secret, with its hello's world and rank and its settings.
    Proved {
        stream: TcpStream,
        peer: SocketAddr,
        world: usize,
        rank: usize,
        settings: Option<Settings>,
    },
    /// Dropped: why (logged).
    Dropped(String),
}

impl Server {
    /// Listen on `bind`, or on the address `host` resolves to (the interface other ranks reach
    /// it through), at `port`.
    ///
    /// One exception: a host *name* that resolves only to loopback addresses on rank 0's
    /// machine (Debian's `127.0.1.1 <hostname>` line in `/etc/hosts`) while the other nodes
    /// reach it by its network address. Rank 0 then listens on every interface of that
    /// family, and says so on stderr.
    pub fn bind(host: &str, port: u16, bind: Option<SocketAddr>) -> Result<Server, DdpError> {
        let addrs = match bind {
            Some(a) => vec![a],
            None => listen_addrs(host, port)?,
        };
        let mut last = None;
        for addr in addrs {
            match TcpListener::bind(addr) {
                Ok(listener) => {
                    let addr = listener.local_addr().unwrap_or(addr);
                    return Ok(Server { listener, addr });
                }
                Err(source) => last = Some((addr, source)),
            }
        }
        let (addr, source) = last.unwrap_or_else(|| {
            (
                SocketAddr::from(([0, 0, 0, 0], port)),
                std::io::Error::new(ErrorKind::NotFound, "no address"),
            )
        });
        Err(RendezvousError::Bind {
            addr: addr.to_string(),
            source,
        }
        .into())
    }

    /// The address actually bound (its port is the chosen one when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Wait until ranks `1..world` have all proved the secret and said hello, then send each
    /// `id`; returns their connections (rank order), kept open for [`super::Liveness`].
    ///
    /// # Host wait
    /// Blocks for at most about `timeout`; past it, refuses the ranks that did connect and
    /// returns [`RendezvousError::MissingRanks`].
    pub fn serve(
        &self,
        world: usize,
        id: &UniqueId,
        creds: &Credentials,
        timeout: Duration,
    ) -> Result<Vec<PeerStream>, DdpError> {
        let start = Instant::now();
        let deadline = start
            .checked_add(timeout)
            .unwrap_or(start + super::MAX_TIMEOUT);
        let addr = self.addr.to_string();
        let io = |what, peer: String, source| RendezvousError::Io {
            rank: 0,
            what,
            peer,
            source,
        };
        self.listener
            .set_nonblocking(true)
            .map_err(|e| io("set_nonblocking on", addr.clone(), e))?;
        let (tx, rx) = mpsc::channel::<Outcome>();
        let active = Arc::new(AtomicUsize::new(0));
        let mut peers: Vec<Option<(TcpStream, SocketAddr)>> = (0..world).map(|_| None).collect();
        let mut joined = 1; // rank 0 itself
        let mut dropped = 0usize;
        let mut last_drop = String::new();
        let fail = |peers: &mut Vec<Option<(TcpStream, SocketAddr)>>,
                    mut stream: Option<TcpStream>,
                    code: u8,
                    rank: usize,
                    detail: String|
         -> DdpError {
            if let Some(s) = stream.as_mut() {
                let _ = s.write_all(&answer(code, world, rank, None, &detail));
            }
            let note = format!("rank 0 gave up: {detail}");
            refuse_all(peers, status::ABORTED, rank, world, &note);
            RendezvousError::Mismatch {
                detail: format!("rank 0 refused a peer: {detail}"),
            }
            .into()
        };
        while joined < world {
            while let Ok(outcome) = rx.try_recv() {
                match outcome {
                    Outcome::Dropped(why) => {
                        dropped += 1;
                        eprintln!("rendezvous: rank 0 dropped a connection: {why}");
                        last_drop = why;
                    }
                    Outcome::Proved {
                        stream,
                        peer,
                        world: their_world,
                        rank,
                        settings,
                    } => {
                        let (code, detail) = if their_world != world {
                            (
                                status::WORLD,
                                format!("rank {rank} at {peer} has WORLD_SIZE={their_world}, rank 0 has WORLD_SIZE={world}"),
                            )
                        } else if rank == 0 || rank >= world {
                            (
                                status::RANK,
                                format!(
                                    "{peer} says it is rank {rank}; the other ranks are 1..{world}"
                                ),
                            )
                        } else if peers[rank].is_some() {
                            (
                                status::DUPLICATE,
                                format!("two processes say they are rank {rank} (the second at {peer}); each needs its own RANK"),
                            )
                        } else {
                            match settings {
                                None => (
                                    status::SETTINGS,
                                    format!(
                                        "rank {rank} at {peer} sent settings that do not decode"
                                    ),
                                ),
                                Some(s) => match creds.settings.differs(&s, rank) {
                                    Some(d) => (status::SETTINGS, d),
                                    None => (status::OK, String::new()),
                                },
                            }
                        };
                        if code != status::OK {
                            return Err(fail(&mut peers, Some(stream), code, rank, detail));
                        }
                        peers[rank] = Some((stream, peer));
                        joined += 1;
                    }
                }
            }
            if joined == world {
                break;
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                let missing: Vec<usize> = (1..world).filter(|r| peers[*r].is_none()).collect();
                let note = format!("{} rank(s) never connected", missing.len());
                refuse_all(&mut peers, status::TIMEOUT, missing.len(), world, &note);
                return Err(RendezvousError::MissingRanks {
                    addr,
                    world,
                    missing,
                    waited: start.elapsed(),
                    strays: if dropped == 0 {
                        String::new()
                    } else {
                        format!(" ({dropped} connection(s) dropped, the last: {last_drop})")
                    },
                }
                .into());
            }
            let (stream, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    std::thread::sleep(Duration::from_millis(5).min(remaining));
                    continue;
                }
                Err(e) => return Err(io("accept on", addr, e).into()),
            };
            if active.load(Ordering::Acquire) >= MAX_HANDSHAKES {
                dropped += 1;
                last_drop = format!("{peer}: {MAX_HANDSHAKES} handshakes already in progress");
                continue;
            }
            active.fetch_add(1, Ordering::AcqRel);
            let until = Instant::now() + HELLO_WAIT.min(remaining);
            let (tx, active, creds) = (tx.clone(), active.clone(), creds.clone());
            std::thread::spawn(move || {
                let outcome = handshake(stream, peer, until, &creds);
                active.fetch_sub(1, Ordering::AcqRel);
                let _ = tx.send(outcome);
            });
        }
        let mut first_err = None;
        let mut out = Vec::with_capacity(world.saturating_sub(1));
        for (rank, slot) in peers.into_iter().enumerate() {
            if let Some((mut s, _)) = slot {
                let _ = s.set_write_timeout(Some(HELLO_WAIT));
                match s.write_all(&answer(status::OK, world, 0, Some(id), "")) {
                    Ok(()) => out.push((rank, s)),
                    Err(e) => {
                        first_err.get_or_insert_with(|| {
                            io("sending the id to rank", rank.to_string(), e)
                        });
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(out),
        }
    }
}

/// One connection's exchange on rank 0's side, all of it before `until`.
fn handshake(
    mut stream: TcpStream,
    peer: SocketAddr,
    until: Instant,
    creds: &Credentials,
) -> Outcome {
    let drop_it = |why: String| Outcome::Dropped(format!("{peer}: {why}"));
    if stream.set_nonblocking(false).is_err() {
        return drop_it("cannot configure the socket".into());
    }
    let mut hello = [0u8; HELLO_LEN];
    if let Err(e) = read_by(&mut stream, &mut hello[..10], until) {
        return drop_it(format!("no hello ({e})"));
    }
    if hello[..8] != MAGIC {
        return drop_it("does not speak the rendezvous protocol".into());
    }
    let version = u16::from_be_bytes([hello[8], hello[9]]);
    if version != VERSION {
        let text = format!("rank 0 speaks rendezvous version {VERSION}, this process {version}");
        let _ = write_by(
            &mut stream,
            &answer(status::VERSION, 0, 0, None, &text),
            until,
        );
        return drop_it(format!(
            "speaks rendezvous version {version}, not {VERSION}"
        ));
    }
    if let Err(e) = read_by(&mut stream, &mut hello[10..], until) {
        return drop_it(format!("incomplete hello ({e})"));
    }
    let world = u32::from_be_bytes([hello[10], hello[11], hello[12], hello[13]]) as usize;
    let rank = u32::from_be_bytes([hello[14], hello[15], hello[16], hello[17]]) as usize;
    let peer_nonce = &hello[18..];
    let Ok(nonce) = random::<NONCE>() else {
        return drop_it("no random bytes for a nonce".into());
    };
    let wr = (world as u32).to_be_bytes();
    let rk = (rank as u32).to_be_bytes();
    let tag = creds
        .secret
        .mac(LABEL_RANK0, &[peer_nonce, &nonce, &wr, &rk]);
    let mut challenge = head(KIND_CHALLENGE).to_vec();
    challenge.extend(nonce);
    challenge.extend(tag);
    if let Err(e) = write_by(&mut stream, &challenge, until) {
        return drop_it(format!("cannot send the challenge ({e})"));
    }
    let mut proof = [0u8; TAG + 4];
    if let Err(e) = read_by(&mut stream, &mut proof, until) {
        return drop_it(format!("no proof of the job secret ({e})"));
    }
    let len =
        u32::from_be_bytes([proof[TAG], proof[TAG + 1], proof[TAG + 2], proof[TAG + 3]]) as usize;
    if len > MAX_SETTINGS {
        return drop_it(format!(
            "announces {len} bytes of settings (at most {MAX_SETTINGS})"
        ));
    }
    let mut settings = vec![0u8; len];
    if let Err(e) = read_by(&mut stream, &mut settings, until) {
        return drop_it(format!("incomplete settings ({e})"));
    }
    if !creds.secret.verify(
        LABEL_PEER,
        &[&nonce, peer_nonce, &wr, &rk, &settings],
        &proof[..TAG],
    ) {
        return drop_it(format!(
            "claims rank {rank} of {world} but does not prove the job's secret (HIPK_RDZV_SECRET)"
        ));
    }
    Outcome::Proved {
        stream,
        peer,
        world,
        rank,
        settings: Settings::decode(&settings),
    }
}

/// Read exactly `buf` before `until`.
fn read_by(s: &mut TcpStream, buf: &mut [u8], until: Instant) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(ErrorKind::TimedOut, "timed out"));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                return Err(std::io::Error::new(ErrorKind::TimedOut, "timed out"))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Write all of `buf` before `until`.
fn write_by(s: &mut TcpStream, buf: &[u8], until: Instant) -> std::io::Result<()> {
    let left = until
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_write_timeout(Some(left))?;
    s.write_all(buf)
}

fn refuse_all(
    peers: &mut [Option<(TcpStream, SocketAddr)>],
    code: u8,
    detail: usize,
    world: usize,
    text: &str,
) {
    for (s, _) in peers.iter_mut().flatten() {
        let _ = s.set_write_timeout(Some(HELLO_WAIT));
        let _ = s.write_all(&answer(code, world, detail, None, text));
    }
}

fn head(kind: u8) -> [u8; HEAD_LEN] {
    let mut h = [0u8; HEAD_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_be_bytes());
    h[10] = kind;
    h
}

fn answer(code: u8, world: usize, detail: usize, id: Option<&UniqueId>, text: &str) -> Vec<u8> {
    let mut text = text.as_bytes();
    if text.len() > MAX_TEXT {
        text = &text[..MAX_TEXT];
    }
    let mut a = head(KIND_ANSWER).to_vec();
    a.push(code);
    a.extend((world.min(u32::MAX as usize) as u32).to_be_bytes());
    a.extend((detail.min(u32::MAX as usize) as u32).to_be_bytes());
    match id {
        Some(id) => a.extend(id.to_bytes()),
        None => a.extend([0u8; NCCL_UNIQUE_ID_BYTES]),
    }
    a.extend((text.len() as u16).to_be_bytes());
    a.extend(text);
    a
}

/// Rank `rank` of `world` (not 0): connect to rank 0 at `host:port` (retrying until
/// `timeout`), prove the job's secret, check rank 0's proof, and receive the unique id; the
/// connection stays open for [`super::Liveness`].
///
/// # Host wait
/// Blocks until rank 0 answers (which it does once every rank has connected) or `timeout`
/// passes: [`RendezvousError::NoAnswer`].
pub fn fetch_id(
    host: &str,
    port: u16,
    world: usize,
    rank: usize,
    creds: &Credentials,
    timeout: Duration,
) -> Result<(UniqueId, TcpStream), DdpError> {
    let start = Instant::now();
    let deadline = start
        .checked_add(timeout)
        .unwrap_or(start + super::MAX_TIMEOUT);
    let text = display_addr(host, port);
    let no_answer = |last: String| RendezvousError::NoAnswer {
        rank,
        world,
        addr: text.clone(),
        waited: start.elapsed(),
        last,
    };
    let settings = creds.settings.encode()?;
    let mut nap = Duration::from_millis(20);
    let mut last = String::from("never connected");
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(no_answer(last).into());
        }
        match connect(host, port, remaining.min(Duration::from_secs(2))) {
            Ok(s) => match exchange(s, (world, rank), creds, &settings, (start, deadline), &text) {
                Ok(Some(done)) => return Ok(done),
                // Dropped before the challenge (rank 0 busy or not yet serving): try again.
                Ok(None) => {
                    last = "connected, but rank 0 closed the connection before its challenge".into()
                }
                Err(e) => return Err(e),
            },
            Err(e) => last = format!("last connection attempt: {e}"),
        }
        std::thread::sleep(nap.min(deadline.saturating_duration_since(Instant::now())));
        nap = (nap * 2).min(Duration::from_millis(500));
    }
}

type Fetched = (UniqueId, TcpStream);

/// One try of the exchange on an open connection: `Ok(None)` when rank 0 closed it before its
/// challenge (worth another try).
fn exchange(
    mut stream: TcpStream,
    (world, rank): (usize, usize),
    creds: &Credentials,
    settings: &[u8],
    (start, deadline): (Instant, Instant),
    text: &str,
) -> Result<Option<Fetched>, DdpError> {
    let io = |what, source| RendezvousError::Io {
        rank,
        what,
        peer: text.to_string(),
        source,
    };
    let no_answer = |last: String| -> DdpError {
        RendezvousError::NoAnswer {
            rank,
            world,
            addr: text.to_string(),
            waited: start.elapsed(),
            last,
        }
        .into()
    };
    let nonce = random::<NONCE>().map_err(DdpError::Secret)?;
    let wr = (world.min(u32::MAX as usize) as u32).to_be_bytes();
    let rk = (rank.min(u32::MAX as usize) as u32).to_be_bytes();
    let mut hello = head(0)[..10].to_vec();
    hello.extend(wr);
    hello.extend(rk);
    hello.extend(nonce);
    if write_by(&mut stream, &hello, deadline).is_err() {
        return Ok(None);
    }
    let mut h = [0u8; HEAD_LEN];
    match read_by(&mut stream, &mut h, deadline) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::TimedOut => {
            return Err(no_answer(
                "connected, but rank 0 did not answer the hello in time".into(),
            ))
        }
        Err(_) => return Ok(None),
    }
    if h[..8] != MAGIC {
        return Err(RendezvousError::Stray {
            rank,
            peer: text.to_string(),
        }
        .into());
    }
    if h[10] == KIND_ANSWER {
        return read_answer(&mut stream, (world, rank), (start, deadline), text).map(Some);
    }
    if h[10] != KIND_CHALLENGE || u16::from_be_bytes([h[8], h[9]]) != VERSION {
        return Err(RendezvousError::Stray {
            rank,
            peer: text.to_string(),
        }
        .into());
    }
    let mut c = [0u8; NONCE + TAG];
    read_by(&mut stream, &mut c, deadline).map_err(|e| io("reading the challenge from", e))?;
    let (their_nonce, tag) = c.split_at(NONCE);
    if !creds
        .secret
        .verify(LABEL_RANK0, &[&nonce, their_nonce, &wr, &rk], tag)
    {
        return Err(RendezvousError::Unproved {
            rank,
            peer: text.to_string(),
        }
        .into());
    }
    let proof = creds
        .secret
        .mac(LABEL_PEER, &[their_nonce, &nonce, &wr, &rk, settings]);
    let mut msg = proof.to_vec();
    msg.extend((settings.len() as u32).to_be_bytes());
    msg.extend(settings);
    write_by(&mut stream, &msg, deadline).map_err(|e| io("sending the proof to", e))?;
    let mut h = [0u8; HEAD_LEN];
    if let Err(e) = read_by(&mut stream, &mut h, deadline) {
        return Err(match e.kind() {
            ErrorKind::TimedOut => no_answer(
                "connected, but rank 0 did not answer: it waits until every rank has connected"
                    .into(),
            ),
            ErrorKind::UnexpectedEof => {
                no_answer("rank 0 closed the connection without an answer".into())
            }
            _ => io("reading the answer from", e).into(),
        });
    }
    if h[..8] != MAGIC || h[10] != KIND_ANSWER {
        return Err(RendezvousError::Stray {
            rank,
            peer: text.to_string(),
        }
        .into());
    }
    read_answer(&mut stream, (world, rank), (start, deadline), text).map(Some)
}

fn read_answer(
    stream: &mut TcpStream,
    (world, rank): (usize, usize),
    (start, deadline): (Instant, Instant),
    text: &str,
) -> Result<Fetched, DdpError> {
    let io = |what, source| RendezvousError::Io {
        rank,
        what,
        peer: text.to_string(),
        source,
    };
    let mut a = [0u8; ANSWER_FIXED];
    read_by(stream, &mut a, deadline).map_err(|e| io("reading the answer from", e))?;
    let code = a[0];
    let their_world = u32::from_be_bytes([a[1], a[2], a[3], a[4]]);
    let detail = u32::from_be_bytes([a[5], a[6], a[7], a[8]]);
    let id = &a[9..9 + NCCL_UNIQUE_ID_BYTES];
    let len = u16::from_be_bytes([a[ANSWER_FIXED - 2], a[ANSWER_FIXED - 1]]) as usize;
    let mut reason = vec![0u8; len.min(MAX_TEXT)];
    read_by(stream, &mut reason, deadline).map_err(|e| io("reading the answer from", e))?;
    let reason = String::from_utf8_lossy(&reason).into_owned();
    let mismatch = |detail: String| -> DdpError { RendezvousError::Mismatch { detail }.into() };
    match code {
        status::OK if their_world as usize == world => {
            let _ = stream.set_read_timeout(None);
            let _ = stream.set_write_timeout(None);
            let s = stream.try_clone().map_err(|e| io("keeping the connection to", e))?;
            Ok((UniqueId::from_bytes(id)?, s))
        }
        status::OK | status::WORLD => Err(mismatch(format!(
            "rank {rank} has WORLD_SIZE={world} but rank 0 at {text} has WORLD_SIZE={their_world}"
        ))),
        status::VERSION => Err(mismatch(format!(
            "rank {rank} speaks rendezvous version {VERSION}; rank 0 at {text} says: {reason}"
        ))),
        status::RANK => Err(mismatch(format!(
            "rank 0 at {text} refused RANK={rank} (WORLD_SIZE={their_world})"
        ))),
        status::DUPLICATE => Err(mismatch(format!(
            "rank 0 at {text} already has a process with RANK={rank}"
        ))),
        status::SETTINGS => Err(RendezvousError::Settings { rank, detail: reason }.into()),
        status::TIMEOUT => Err(RendezvousError::NoAnswer {
            rank,
            world,
            addr: text.to_string(),
            waited: start.elapsed(),
            last: format!("rank 0 gave up: {detail} rank(s) never connected"),
        }
        .into()),
        status::ABORTED => Err(mismatch(format!(
            "rank 0 at {text} gave up because the process claiming rank {detail} did not match ({reason})"
        ))),
        other => Err(mismatch(format!(
            "rank 0 at {text} answered with unknown status {other}"
        ))),
    }
}

fn connect(host: &str, port: u16, wait: Duration) -> std::io::Result<TcpStream> {
    let addrs = (host, port).to_socket_addrs()?;
    let mut last = std::io::Error::new(ErrorKind::NotFound, "no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, wait.max(Duration::from_millis(1))) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}
