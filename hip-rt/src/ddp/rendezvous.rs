//! The rendezvous: rank 0 hands its RCCL [`UniqueId`] to the other ranks over TCP.
//!
//! Rank 0 listens on the rendezvous port; every other rank connects (retrying until the
//! timeout) and sends a fixed-size hello: a magic, the protocol version, its world size and its
//! rank. Rank 0 checks each hello (a connection that does not start with the magic is dropped
//! and counted as a stray; a wrong version, world size, an out-of-range or repeated rank fails
//! the rendezvous on both sides), and once every rank `1..world` has said hello it answers each
//! with the id. If rank 0 gives up (a missing rank, a mismatched peer) it answers the ranks that
//! did connect with a refusal, so nobody is left waiting. Every message has a fixed size: no
//! length read from the network is ever used to allocate.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use hip_sys::rccl::NCCL_UNIQUE_ID_BYTES;

use super::error::{DdpError, RendezvousError};
use super::HELLO_WAIT;
use crate::comm::UniqueId;

const MAGIC: [u8; 8] = *b"hipkrdzv";
/// The protocol version; bumped on any change to the messages.
pub const VERSION: u16 = 1;
/// A hello: magic, version (u16), world size (u32), rank (u32); big-endian.
const HELLO_LEN: usize = 8 + 2 + 4 + 4;
/// An answer: magic, version (u16), status (u8), rank 0's world size (u32), detail (u32), id.
const ANSWER_LEN: usize = 8 + 2 + 1 + 4 + 4 + NCCL_UNIQUE_ID_BYTES;

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
}

/// The rendezvous waits as long as collectives do: `HIPK_COMM_TIMEOUT_S`, else 300 s.
pub use crate::comm::{default_timeout, DEFAULT_TIMEOUT};

/// How the rendezvous runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RendezvousOptions {
    /// How long rank 0 waits for every rank, and each other rank for rank 0's answer.
    /// Default: [`default_timeout`].
    pub timeout: Duration,
    /// Where rank 0 listens. Default (`None`): every interface of the address family
    /// `MASTER_ADDR` resolves to, on the rendezvous port.
    pub bind: Option<SocketAddr>,
}

impl Default for RendezvousOptions {
    fn default() -> Self {
        RendezvousOptions {
            timeout: default_timeout(),
            bind: None,
        }
    }
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

/// Rank 0's listening socket, bound before any peer is told where it is.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
}

impl Server {
    /// Listen on `bind`, or on every interface of `host`'s address family at `port`.
    pub fn bind(host: &str, port: u16, bind: Option<SocketAddr>) -> Result<Server, DdpError> {
        let addr = match bind {
            Some(a) => a,
            None => {
                let first = resolve(host, port)?[0];
                let any: IpAddr = if first.is_ipv4() {
                    Ipv4Addr::UNSPECIFIED.into()
                } else {
                    Ipv6Addr::UNSPECIFIED.into()
                };
                SocketAddr::new(any, port)
            }
        };
        let listener = TcpListener::bind(addr).map_err(|source| RendezvousError::Bind {
            addr: addr.to_string(),
            source,
        })?;
        let addr = listener.local_addr().unwrap_or(addr);
        Ok(Server { listener, addr })
    }

    /// The address actually bound (its port is the chosen one when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Wait until ranks `1..world` have all said hello, then send each `id`.
    ///
    /// # Host wait
    /// Blocks for at most about `timeout`; past it, refuses the ranks that did connect and
    /// returns [`RendezvousError::MissingRanks`].
    pub fn serve(&self, world: usize, id: &UniqueId, timeout: Duration) -> Result<(), DdpError> {
        let start = Instant::now();
        let deadline = start + timeout;
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
        let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
        let mut joined = 1; // rank 0 itself
        let mut strays = 0usize;
        while joined < world {
            // Checked before every accept, so that a stream of strays cannot hold rank 0 here.
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                let missing: Vec<usize> = (1..world).filter(|r| peers[*r].is_none()).collect();
                refuse_all(&mut peers, status::TIMEOUT, missing.len(), world);
                return Err(RendezvousError::MissingRanks {
                    addr,
                    world,
                    missing,
                    waited: start.elapsed(),
                    strays: if strays == 0 {
                        String::new()
                    } else {
                        format!(" ({strays} stray connection(s) refused)")
                    },
                }
                .into());
            }
            let (mut stream, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted =>
                {
                    std::thread::sleep(Duration::from_millis(10).min(remaining));
                    continue;
                }
                Err(e) => return Err(io("accept on", addr, e).into()),
            };
            // A peer has until the deadline (at most HELLO_WAIT) to say hello.
            let hello_wait = HELLO_WAIT.min(remaining).max(Duration::from_millis(1));
            let hello = stream
                .set_nonblocking(false)
                .and_then(|()| stream.set_read_timeout(Some(hello_wait)))
                .and_then(|()| stream.set_write_timeout(Some(HELLO_WAIT)))
                .and_then(|()| {
                    let mut buf = [0u8; HELLO_LEN];
                    stream.read_exact(&mut buf).map(|()| buf)
                });
            let Ok(hello) = hello else {
                strays += 1;
                continue;
            };
            if hello[..8] != MAGIC {
                strays += 1;
                continue;
            }
            let version = u16::from_be_bytes([hello[8], hello[9]]);
            let their_world = u32::from_be_bytes(hello[10..14].try_into().unwrap_or([0; 4]));
            let rank = u32::from_be_bytes(hello[14..18].try_into().unwrap_or([0; 4])) as usize;
            let refusal = if version != VERSION {
                Some((
                    status::VERSION,
                    format!("{peer} speaks rendezvous version {version}, rank 0 speaks {VERSION}"),
                ))
            } else if their_world as usize != world {
                Some((
                    status::WORLD,
                    format!("rank {rank} at {peer} has WORLD_SIZE={their_world}, rank 0 has WORLD_SIZE={world}"),
                ))
            } else if rank == 0 || rank >= world {
                Some((
                    status::RANK,
                    format!("{peer} says it is rank {rank}; the other ranks are 1..{world}"),
                ))
            } else if peers[rank].is_some() {
                Some((
                    status::DUPLICATE,
                    format!("two processes say they are rank {rank} (the second at {peer}); each needs its own RANK"),
                ))
            } else {
                None
            };
            if let Some((code, detail)) = refusal {
                let _ = stream.write_all(&answer(code, world, rank, None));
                refuse_all(&mut peers, status::ABORTED, rank, world);
                return Err(RendezvousError::Mismatch {
                    detail: format!("rank 0 refused a peer: {detail}"),
                }
                .into());
            }
            peers[rank] = Some(stream);
            joined += 1;
        }
        let mut first_err = None;
        for (rank, stream) in peers.iter_mut().enumerate() {
            if let Some(s) = stream {
                let _ = s.set_write_timeout(Some(HELLO_WAIT));
                if let Err(e) = s.write_all(&answer(status::OK, world, 0, Some(id))) {
                    first_err
                        .get_or_insert_with(|| io("sending the id to rank", rank.to_string(), e));
                }
            }
        }
        match first_err {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}

fn refuse_all(peers: &mut [Option<TcpStream>], code: u8, detail: usize, world: usize) {
    for s in peers.iter_mut().flatten() {
        let _ = s.write_all(&answer(code, world, detail, None));
    }
}

fn answer(code: u8, world: usize, detail: usize, id: Option<&UniqueId>) -> [u8; ANSWER_LEN] {
    let mut a = [0u8; ANSWER_LEN];
    a[..8].copy_from_slice(&MAGIC);
    a[8..10].copy_from_slice(&VERSION.to_be_bytes());
    a[10] = code;
    a[11..15].copy_from_slice(&(world.min(u32::MAX as usize) as u32).to_be_bytes());
    a[15..19].copy_from_slice(&(detail.min(u32::MAX as usize) as u32).to_be_bytes());
    if let Some(id) = id {
        a[19..].copy_from_slice(&id.to_bytes());
    }
    a
}

fn hello(world: usize, rank: usize) -> [u8; HELLO_LEN] {
    let mut h = [0u8; HELLO_LEN];
    h[..8].copy_from_slice(&MAGIC);
    h[8..10].copy_from_slice(&VERSION.to_be_bytes());
    h[10..14].copy_from_slice(&(world.min(u32::MAX as usize) as u32).to_be_bytes());
    h[14..18].copy_from_slice(&(rank.min(u32::MAX as usize) as u32).to_be_bytes());
    h
}

/// Rank `rank` of `world` (not 0): connect to rank 0 at `host:port` (retrying until
/// `timeout`), say hello and receive the unique id.
///
/// # Host wait
/// Blocks until rank 0 answers (which it does once every rank has connected) or `timeout`
/// passes: [`RendezvousError::NoAnswer`].
pub fn fetch_id(
    host: &str,
    port: u16,
    world: usize,
    rank: usize,
    timeout: Duration,
) -> Result<UniqueId, DdpError> {
    let start = Instant::now();
    let deadline = start + timeout;
    let text = display_addr(host, port);
    let no_answer = |last: String| RendezvousError::NoAnswer {
        rank,
        world,
        addr: text.clone(),
        waited: start.elapsed(),
        last,
    };
    let mut nap = Duration::from_millis(20);
    let mut last = String::from("never connected");
    let mut stream = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(no_answer(last).into());
        }
        match connect(host, port, remaining.min(Duration::from_secs(2))) {
            Ok(s) => break s,
            Err(e) => last = format!("last connection attempt: {e}"),
        }
        std::thread::sleep(nap.min(deadline.saturating_duration_since(Instant::now())));
        nap = (nap * 2).min(Duration::from_millis(500));
    };
    let remaining = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let io = |what, source| RendezvousError::Io {
        rank,
        what,
        peer: text.clone(),
        source,
    };
    stream
        .set_write_timeout(Some(remaining))
        .and_then(|()| stream.write_all(&hello(world, rank)))
        .map_err(|e| io("sending the hello to", e))?;
    stream
        .set_read_timeout(Some(remaining))
        .map_err(|e| io("setting a timeout on", e))?;
    let mut a = [0u8; ANSWER_LEN];
    if let Err(e) = stream.read_exact(&mut a) {
        return Err(match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => no_answer(
                "connected, but rank 0 did not answer: it waits until every rank has connected"
                    .into(),
            ),
            ErrorKind::UnexpectedEof => {
                no_answer("rank 0 closed the connection without an answer".into())
            }
            _ => io("reading the answer from", e),
        }
        .into());
    }
    if a[..8] != MAGIC {
        return Err(RendezvousError::Stray { rank, peer: text }.into());
    }
    let version = u16::from_be_bytes([a[8], a[9]]);
    let code = a[10];
    let their_world = u32::from_be_bytes([a[11], a[12], a[13], a[14]]);
    let detail = u32::from_be_bytes([a[15], a[16], a[17], a[18]]);
    let mismatch = |detail: String| -> DdpError { RendezvousError::Mismatch { detail }.into() };
    match code {
        status::OK if version == VERSION && their_world as usize == world => {
            Ok(UniqueId::from_bytes(&a[19..])?)
        }
        status::OK | status::WORLD => Err(mismatch(format!(
            "rank {rank} has WORLD_SIZE={world} but rank 0 at {text} has WORLD_SIZE={their_world}"
        ))),
        status::VERSION => Err(mismatch(format!(
            "rank {rank} speaks rendezvous version {VERSION}, rank 0 at {text} version {version}"
        ))),
        status::RANK => Err(mismatch(format!(
            "rank 0 at {text} refused RANK={rank} (WORLD_SIZE={their_world})"
        ))),
        status::DUPLICATE => Err(mismatch(format!(
            "rank 0 at {text} already has a process with RANK={rank}"
        ))),
        status::TIMEOUT => {
            Err(no_answer(format!("rank 0 gave up: {detail} rank(s) never connected")).into())
        }
        status::ABORTED => Err(mismatch(format!(
            "rank 0 at {text} gave up because the process claiming rank {detail} did not match"
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
