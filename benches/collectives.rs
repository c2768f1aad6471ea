//! RCCL collectives across every visible device, in the style of nccl-tests
//! (`cargo bench --features device --bench collectives -- [--op all_reduce|...|all]
//! [--dtype f32|f16|bf16|i32|u8|all] [--redop sum|prod|max|min|avg|all] [--min 8] [--max 256M]`).
//!
//! For each op, type, reduction and size (doubling from `--min` to `--max`, default 8 B..256 MiB):
//! one checked run against inputs whose result is exact whatever the reduction order, then timed
//! iterations, out of place and in place. Columns as nccl-tests: size, count, type, redop, root,
//! then time, algbw, busbw and #wrong for each placement; bus bandwidth uses nccl-tests' factors
//! (all-reduce 2(n−1)/n, reduce-scatter and all-gather (n−1)/n, broadcast and reduce 1; see
//! `hip_rt::comm::check`). Ends with `# Out of bounds values : N OK|FAILED` and
//! `# Avg bus bandwidth : X`; exits with status 1 when any value is wrong.
//!
//! `HIPK_BENCH_QUICK=1`: sizes 8 B..64 KiB, 1 warm-up and 2 timed iterations (a smoke run).
//! On hip-emu (`HIPK_RCCL_LIBRARY` naming libhip_emu.so, `HIPK_EMU_DEVICES=N`) every figure is a
//! host figure and is labelled emulated. Times are host wall clock around all ranks' calls.

use clap::Parser;
use half::{bf16, f16};
use hip_rt::comm::check::{self, CheckElement, Collective, Measured};
use hip_rt::comm::ReduceOp;
use hip_rt::{Comm, Device, Stream, StreamOptions};

#[path = "device_common/mod.rs"]
mod device_common;
use device_common::{label, quick};

#[derive(Parser, Debug)]
#[command(about = "RCCL collectives bench (nccl-tests style)")]
struct Args {
    /// all_reduce, reduce_scatter, all_gather, broadcast, reduce, or all.
    #[arg(long, default_value = "all")]
    op: String,
    /// f32, f16, bf16, i32, u8, or all.
    #[arg(long, default_value = "f32")]
    dtype: String,
    /// sum, prod, max, min, avg, or all (reducing collectives only).
    #[arg(long, default_value = "sum")]
    redop: String,
    /// Smallest size (bytes; K/M/G suffixes).
    #[arg(long, default_value = "8")]
    min: String,
    /// Largest size (default 256M; 64K with HIPK_BENCH_QUICK=1).
    #[arg(long)]
    max: Option<String>,
    /// Timed iterations per size (default 20; 2 in quick mode).
    #[arg(long)]
    iters: Option<usize>,
    /// Untimed iterations before timing (default 5; 1 in quick mode).
    #[arg(long)]
    warmup: Option<usize>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("collectives: {msg}");
    std::process::exit(2)
}

fn pick<T: Copy>(text: &str, all: &[T], parse: impl Fn(&str) -> Option<T>, what: &str) -> Vec<T> {
    if text == "all" {
        return all.to_vec();
    }
    text.split(',')
        .map(|t| parse(t).unwrap_or_else(|| fail(format!("unknown {what} {t:?}"))))
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Dtype {
    F32,
    F16,
    Bf16,
    I32,
    U8,
}

const DTYPES: [Dtype; 5] = [Dtype::F32, Dtype::F16, Dtype::Bf16, Dtype::I32, Dtype::U8];

fn parse_dtype(t: &str) -> Option<Dtype> {
    Some(match t {
        "f32" | "float" => Dtype::F32,
        "f16" | "half" => Dtype::F16,
        "bf16" | "bfloat16" => Dtype::Bf16,
        "i32" | "int32" => Dtype::I32,
        "u8" | "uint8" => Dtype::U8,
        _ => return None,
    })
}

fn parse_redop(t: &str) -> Option<ReduceOp> {
    ReduceOp::ALL.into_iter().find(|op| op.name() == t)
}

struct Run<'a> {
    comms: &'a [Comm],
    streams: &'a [Stream],
    warmup: usize,
    iters: usize,
    wrong: usize,
    busbw_sum: f64,
    rows: usize,
}

impl Run<'_> {
    fn row<T: CheckElement>(&mut self, coll: Collective, op: ReduceOp, bytes: usize) {
        let measure = |in_place| -> Measured {
            check::measure::<T>(
                self.comms,
                self.streams,
                coll,
                op,
                bytes,
                in_place,
                self.warmup,
                self.iters,
            )
            .unwrap_or_else(|e| fail(format!("{} {} {bytes} B: {e}", coll.name(), T::NAME)))
        };
        let (out, inp) = (measure(false), measure(true));
        let root = match coll {
            Collective::Broadcast | Collective::Reduce => self.comms.len() as i64 - 1,
            _ => -1,
        };
        let redop = if coll.reduces() { op.name() } else { "none" };
        println!(
            "{:>12} {:>12} {:>9} {:>6} {:>6}  {:>9.1} {:>7.2} {:>7.2} {:>6}  {:>9.1} {:>7.2} {:>7.2} {:>6}",
            out.bytes, out.count, T::NAME, redop, root,
            out.time_us, out.algbw, out.busbw, out.wrong,
            inp.time_us, inp.algbw, inp.busbw, inp.wrong,
        );
        self.wrong += out.wrong + inp.wrong;
        self.busbw_sum += out.busbw + inp.busbw;
        self.rows += 2;
    }
}

fn main() {
    let args = Args::parse();
    let ops = pick(&args.op, &Collective::ALL, Collective::parse, "op");
    let dtypes = pick(&args.dtype, &DTYPES, parse_dtype, "dtype");
    let redops = pick(&args.redop, &ReduceOp::ALL, parse_redop, "redop");
    let size = |t: &str| check::parse_size(t).unwrap_or_else(|| fail(format!("bad size {t:?}")));
    let min = size(&args.min);
    let max = size(
        args.max
            .as_deref()
            .unwrap_or(if quick() { "64K" } else { "256M" }),
    );
    let warmup = args.warmup.unwrap_or(if quick() { 1 } else { 5 });
    let iters = args.iters.unwrap_or(if quick() { 2 } else { 20 }).max(1);

    let count = Device::count().unwrap_or_else(|e| fail(format!("no HIP device: {e}")));
    let devices: Vec<Device> = (0..count)
        .map(|i| Device::get(i).unwrap_or_else(|e| fail(e)))
        .collect();
    let rccl = hip_sys::rccl::rccl().unwrap_or_else(|e| fail(format!("RCCL is not usable: {e}")));
    let comms = Comm::init_all(&devices).unwrap_or_else(|e| fail(e));
    let streams: Vec<Stream> = devices
        .iter()
        .map(|d| Stream::new(d, StreamOptions::default()).unwrap_or_else(|e| fail(e)))
        .collect();
    let tag = label(&devices[0]);
    println!("# collectives: {count} ranks, one per device, in one process{tag}");
    for d in &devices {
        println!(
            "#  rank {} on device {}: {}",
            d.ordinal(),
            d.ordinal(),
            d.name()
        );
    }
    println!("# RCCL {} at {}", rccl.version(), rccl.path().display());
    if devices[0].is_emulated() {
        println!(
            "# every time and bandwidth below is {}",
            hip_rt::EMULATED_FIGURE_LABEL
        );
    }
    println!("# sizes {min}..{max} B doubling, {warmup} warm-up and {iters} timed iterations, check: 1 run");
    let mut run = Run {
        comms: &comms,
        streams: &streams,
        warmup,
        iters,
        wrong: 0,
        busbw_sum: 0.0,
        rows: 0,
    };
    for coll in ops {
        println!("#\n# {}", coll.name());
        println!(
            "#{:>11} {:>12} {:>9} {:>6} {:>6}  {:>33}  {:>33}",
            "", "", "", "", "", "out-of-place", "in-place"
        );
        println!(
            "#{:>11} {:>12} {:>9} {:>6} {:>6}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}",
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong"
        );
        println!(
            "#{:>11} {:>12} {:>9} {:>6} {:>6}  {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}",
            "(B)",
            "(elements)",
            "",
            "",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            "(us)",
            "(GB/s)",
            "(GB/s)",
            ""
        );
        let coll_redops: &[ReduceOp] = if coll.reduces() {
            &redops
        } else {
            &[ReduceOp::Sum]
        };
        for &dtype in &dtypes {
            for &op in coll_redops {
                for bytes in check::sizes(min, max) {
                    let elem = match dtype {
                        Dtype::F32 | Dtype::I32 => 4,
                        Dtype::F16 | Dtype::Bf16 => 2,
                        Dtype::U8 => 1,
                    };
                    if coll.count(bytes, elem, count as usize) == 0 {
                        continue;
                    }
                    match dtype {
                        Dtype::F32 => run.row::<f32>(coll, op, bytes),
                        Dtype::F16 => run.row::<f16>(coll, op, bytes),
                        Dtype::Bf16 => run.row::<bf16>(coll, op, bytes),
                        Dtype::I32 => run.row::<i32>(coll, op, bytes),
                        Dtype::U8 => run.row::<u8>(coll, op, bytes),
                    }
                }
            }
        }
    }
    let (wrong, avg) = (run.wrong, run.busbw_sum / run.rows.max(1) as f64);
    let verdict = if wrong == 0 { "OK" } else { "FAILED" };
    println!("# Out of bounds values : {wrong} {verdict}");
    println!("# Avg bus bandwidth    : {avg:.4}{tag}");
    println!("#");
    drop(comms);
    if wrong != 0 {
        std::process::exit(1);
    }
}
