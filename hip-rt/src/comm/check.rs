//! Checking and timing collectives the way nccl-tests does, shared by the `collectives` bench
//! and hip-doctor: inputs whose reduction is exact in every type whatever the order (small
//! integers), a count of wrong elements, and nccl-tests' algorithm and bus bandwidths.
//!
//! Bus bandwidth (nccl-tests' `GetBw`): algorithm bandwidth (`size / time`, size in bytes of the
//! larger buffer) times 2(n−1)/n for all-reduce, (n−1)/n for reduce-scatter and all-gather, and 1
//! for broadcast and reduce, where n is the number of ranks.

use std::time::Instant;

use half::{bf16, f16};

use super::{group, Comm, CommElement, ReduceOp};
use crate::error::Result;
use crate::memory::buffer::DeviceBuffer;
use crate::stream::Stream;

/// A collective, as nccl-tests names its tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Collective {
    AllReduce,
    ReduceScatter,
    AllGather,
    Broadcast,
    Reduce,
}

impl Collective {
    /// Every collective.
    pub const ALL: [Collective; 5] = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast,
        Collective::Reduce,
    ];

    /// `all_reduce`, `reduce_scatter`, ...
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllGather => "all_gather",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
        }
    }

    /// Parse a name (`all_reduce`, `allreduce`, `all-reduce`; any case).
    pub fn parse(text: &str) -> Option<Collective> {
        let key: String = text
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect::<String>()
            .to_ascii_lowercase();
        Collective::ALL
            .into_iter()
            .find(|c| c.name().replace('_', "") == key)
    }

    /// Whether it takes a reduction.
    pub fn reduces(self) -> bool {
        !matches!(self, Collective::AllGather | Collective::Broadcast)
    }

    /// nccl-tests' factor from algorithm to bus bandwidth on `world` ranks.
    pub fn bus_factor(self, world: usize) -> f64 {
        let n = world.max(1) as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::ReduceScatter | Collective::AllGather => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce => 1.0,
        }
    }

    /// For a test of `bytes` (the larger buffer) of `elem`-byte elements on `world` ranks: the
    /// element count of the larger buffer, rounded down to what the collective can move
    /// (a multiple of `world` for reduce-scatter and all-gather). Zero when nothing fits.
    pub fn count(self, bytes: usize, elem: usize, world: usize) -> usize {
        let count = bytes / elem.max(1);
        match self {
            Collective::ReduceScatter | Collective::AllGather => {
                count / world.max(1) * world.max(1)
            }
            _ => count,
        }
    }
}

/// Byte sizes from `min` to `max`, doubling (nccl-tests' `-b min -e max -f 2`).
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut size = min.max(1);
    while size <= max {
        out.push(size);
        match size.checked_mul(2) {
            Some(next) => size = next,
            None => break,
        }
    }
    out
}

/// A size such as `8`, `64K`, `256M`, `1G` (powers of 1024; a trailing `B` is allowed).
pub fn parse_size(text: &str) -> Option<usize> {
    let t = text.trim().trim_end_matches(['B', 'b']);
    let (digits, shift) = match t.chars().last()? {
        'K' | 'k' => (&t[..t.len() - 1], 10),
        'M' | 'm' => (&t[..t.len() - 1], 20),
        'G' | 'g' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1usize << shift)
}

/// Element types the checks run on: converted through f64, where every input and result used
/// here is exact.
pub trait CheckElement: CommElement {
    /// The name nccl-tests prints (`float`, `half`, `bfloat16`, `int32`, `uint8`).
    const NAME: &'static str;
    /// Tolerance of an average, relative (two units in the last place; 0 for integers, whose
    /// averages of these inputs are exact).
    const AVG_TOLERANCE: f64;
    /// `v` in this type.
    fn from_f64(v: f64) -> Self;
    /// This value as f64.
    fn to_f64(self) -> f64;
}

macro_rules! check_elements {
    ($($t:ty => $name:literal, $tol:expr, $from:expr, $to:expr;)*) => {$(
        impl CheckElement for $t {
            const NAME: &'static str = $name;
            const AVG_TOLERANCE: f64 = $tol;
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
            fn to_f64(self) -> f64 {
                $to(self)
            }
        }
    )*};
}
check_elements! {
    f32 => "float", 2.0 * f32::EPSILON as f64, |v| v as f32, f64::from;
    f16 => "half", 2.0 / 1024.0, f16::from_f64, f16::to_f64;
    bf16 => "bfloat16", 2.0 / 128.0, bf16::from_f64, bf16::to_f64;
    i32 => "int32", 0.0, |v| v as i32, f64::from;
    u8 => "uint8", 0.0, |v| v as u8, f64::from;
}

/// Rank `rank`'s input at element `i` for `op` on `world` ranks: small integers whose
/// reduction is exact in every [`CheckElement`] whatever the order. Sums stay <= 3·world;
/// products are 2 (one rank holds 2 at each index, the rest 1); averages are exact (the
/// per-rank offsets cancel).
pub fn input(rank: usize, i: usize, world: usize, op: ReduceOp) -> f64 {
    match op {
        ReduceOp::Prod => {
            if (rank + i) % world.max(1) == 0 {
                2.0
            } else {
                1.0
            }
        }
        ReduceOp::Avg => {
            let shift = if world % 2 == 1 && rank == world - 1 {
                0.0
            } else if rank % 2 == 0 {
                1.0
            } else {
                -1.0
            };
            ((i % 3) + 2) as f64 + shift
        }
        _ => ((rank + i) % 3 + 1) as f64,
    }
}

/// The reduction of `values` by `op` over `world` ranks.
pub fn reduce(values: impl Iterator<Item = f64>, op: ReduceOp, world: usize) -> f64 {
    let v: Vec<f64> = values.collect();
    match op {
        ReduceOp::Sum => v.iter().sum(),
        ReduceOp::Prod => v.iter().product(),
        ReduceOp::Max => v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Min => v.iter().copied().fold(f64::INFINITY, f64::min),
        ReduceOp::Avg => v.iter().sum::<f64>() / world.max(1) as f64,
    }
}

/// Whether `got` is `want` (within [`CheckElement::AVG_TOLERANCE`] for an average).
pub fn matches<T: CheckElement>(got: T, want: f64, op: ReduceOp) -> bool {
    let g = got.to_f64();
    if op == ReduceOp::Avg {
        (g - want).abs() <= want.abs() * T::AVG_TOLERANCE
    } else {
        g == want
    }
}

/// One measured test: the figures of one row of nccl-tests' table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// Bytes of the larger buffer per rank.
    pub bytes: usize,
    /// Elements of the larger buffer per rank.
    pub count: usize,
    /// Mean time per iteration, in microseconds (host wall clock, all ranks).
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s (1e9 bytes).
    pub algbw: f64,
    /// Bus bandwidth, GB/s.
    pub busbw: f64,
    /// Elements that differ from the expected result, over every rank.
    pub wrong: usize,
}

/// Check `coll` once on `comms` (one per rank, `streams[r]` on rank r's device), then time
/// `iters` iterations after `warmup` untimed ones. `bytes` is the larger buffer per rank
/// ([`Collective::count`] rounds it); root is the last rank for broadcast and reduce.
///
/// # Host wait
/// Waits for every iteration ([`Comm::wait`], bounded by each communicator's timeout) and copies
/// the checked results back to the host.
#[allow(clippy::too_many_arguments)]
pub fn measure<T: CheckElement>(
    comms: &[Comm],
    streams: &[Stream],
    coll: Collective,
    op: ReduceOp,
    bytes: usize,
    in_place: bool,
    warmup: usize,
    iters: usize,
) -> Result<Measured> {
    let world = comms.len();
    let elem = std::mem::size_of::<T>();
    let count = coll.count(bytes, elem, world);
    let block = match coll {
        Collective::ReduceScatter | Collective::AllGather => count / world.max(1),
        _ => count,
    };
    let (send_len, recv_len) = match coll {
        Collective::ReduceScatter => (count, block),
        Collective::AllGather => (block, count),
        _ => (count, count),
    };
    let op = if coll.reduces() { op } else { ReduceOp::Sum };
    let root = world.saturating_sub(1);
    let mut bufs = Vec::with_capacity(world);
    for (r, s) in streams.iter().enumerate().take(world) {
        let send: Vec<T> = (0..send_len)
            .map(|i| T::from_f64(input(r, i, world, op)))
            .collect();
        let main_len = if in_place {
            send_len.max(recv_len)
        } else {
            recv_len
        };
        let mut main = vec![T::from_f64(0.0); main_len];
        if in_place {
            let at = if coll == Collective::AllGather {
                r * block
            } else {
                0
            };
            main[at..at + send_len].copy_from_slice(&send);
        }
        bufs.push((
            DeviceBuffer::from_slice(s, &send)?,
            DeviceBuffer::from_slice(s, &main)?,
        ));
    }
    let run = |bufs: &mut Vec<(DeviceBuffer<T>, DeviceBuffer<T>)>| -> Result<()> {
        group(|| {
            for (r, (c, (send, main))) in comms.iter().zip(bufs.iter_mut()).enumerate() {
                let s = &streams[r];
                match (coll, in_place) {
                    (Collective::AllReduce, false) => c.all_reduce(send, main, op, s)?,
                    (Collective::AllReduce, true) => c.all_reduce_in_place(main, op, s)?,
                    (Collective::ReduceScatter, false) => c.reduce_scatter(send, main, op, s)?,
                    (Collective::ReduceScatter, true) => c.reduce_scatter_in_place(main, op, s)?,
                    (Collective::AllGather, false) => c.all_gather(send, main, s)?,
                    (Collective::AllGather, true) => c.all_gather_in_place(main, s)?,
                    (Collective::Broadcast, false) => c.broadcast(send, main, root, s)?,
                    (Collective::Broadcast, true) => c.broadcast_in_place(main, root, s)?,
                    (Collective::Reduce, false) => c.reduce(send, main, op, root, s)?,
                    (Collective::Reduce, true) => c.reduce_in_place(main, op, root, s)?,
                }
            }
            Ok(())
        })
    };
    run(&mut bufs)?;
    for c in comms {
        c.wait()?;
    }
    // The expected value at element i of the (whole) reduced or gathered array.
    let reduced = |i: usize| reduce((0..world).map(|r| input(r, i, world, op)), op, world);
    let mut wrong = 0;
    for (r, (_, main)) in bufs.iter().enumerate() {
        let got = main.to_vec(&streams[r])?;
        // (where the result starts in `got`, how many elements, expected value of the k-th)
        let (at, len): (usize, usize) = match coll {
            Collective::ReduceScatter if in_place => (r * block, block),
            Collective::ReduceScatter => (0, block),
            Collective::Reduce if r != root => (0, 0),
            _ => (0, recv_len),
        };
        let want = |k: usize| match coll {
            Collective::AllReduce | Collective::Reduce => reduced(k),
            Collective::ReduceScatter => reduced(r * block + k),
            Collective::AllGather => input(k / block.max(1), k % block.max(1), world, op),
            Collective::Broadcast => input(root, k, world, op),
        };
        wrong += (0..len)
            .filter(|&k| !got.get(at + k).is_some_and(|&g| matches(g, want(k), op)))
            .count();
    }
    // Timed iterations: in place, start from zeros so repeated reductions never overflow.
    if in_place {
        for (r, (_, main)) in bufs.iter_mut().enumerate() {
            streams[r].memset_zero(main)?;
        }
    }
    for _ in 0..warmup {
        run(&mut bufs)?;
    }
    for c in comms {
        c.wait()?;
    }
    let start = Instant::now();
    for _ in 0..iters {
        run(&mut bufs)?;
    }
    for c in comms {
        c.wait()?;
    }
    let secs = start.elapsed().as_secs_f64() / iters.max(1) as f64;
    let bytes = count * elem;
    let algbw = if secs > 0.0 {
        bytes as f64 / 1e9 / secs
    } else {
        0.0
    };
    Ok(Measured {
        bytes,
        count,
        time_us: secs * 1e6,
        algbw,
        busbw: algbw * coll.bus_factor(world),
        wrong,
    })
}
