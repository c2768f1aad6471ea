//! Host overhead of the caching allocator on the host backend: a cache-hit alloc+free pair
//! at several sizes, and a recorded training-step pattern.
//!
//! `cargo bench -p hip-rt --bench caching`
//!
//! Every bench runs twice: `wall/...` measures wall-clock time (criterion's default), and
//! `cpu/...` the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`, 64-bit Linux),
//! which leaves out time the thread spent preempted; on a shared, loaded machine the second
//! is the figure that reflects the allocator.

use std::hint::black_box;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hip_rt::caching::{AllocatorConfig, CachingAllocator, HostBackend, HostStream, MIB};

const S0: HostStream = HostStream::DEFAULT;

fn allocator() -> CachingAllocator<HostBackend> {
    // Host pages are never touched by the bench, so a large capacity costs nothing.
    CachingAllocator::with_config(HostBackend::new(64 << 30), AllocatorConfig::default())
        .expect("host allocator")
}

/// CPU time of the calling thread, in nanoseconds (`CLOCK_THREAD_CPUTIME_ID`): time the
/// thread spent preempted by other processes does not count.
struct ThreadCpuTime {
    wall: WallTime,
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    // From the C library std already links on Linux.
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

/// Linux's `CLOCK_THREAD_CPUTIME_ID`.
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

fn thread_cpu_ns() -> u64 {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec with the C layout on 64-bit Linux, and
    // clock 3 is the calling thread's CPU clock, which always exists.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Measurement for ThreadCpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, start: u64) -> u64 {
        thread_cpu_ns().saturating_sub(start)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        self.wall.formatter()
    }
}

fn cache_hit_pair<M: Measurement>(c: &mut Criterion<M>, clock: &str) {
    let mut group = c.benchmark_group(format!("{clock}/cache_hit_pair"));
    for (name, size) in [("4KiB", 4096), ("1MiB", MIB), ("64MiB", 64 * MIB)] {
        let alloc = allocator();
        drop(alloc.allocate(size, S0).expect("warm-up"));
        group.bench_with_input(BenchmarkId::new("handle", name), &size, |b, &size| {
            b.iter(|| {
                let a = alloc.allocate(black_box(size), S0).expect("cache hit");
                black_box(a.ptr());
            })
        });
        group.bench_with_input(BenchmarkId::new("raw", name), &size, |b, &size| {
            b.iter(|| {
                let a = alloc.allocate_raw(black_box(size), S0).expect("cache hit");
                black_box(a.ptr());
                alloc.free_raw(a).expect("free");
            })
        });
    }
    group.finish();
}

enum Op {
    Alloc(usize),
    Free(usize),
}

/// A transformer-like step: per layer, the forward pass keeps a few activations of mixed
/// sizes and frees temporaries; the backward pass walks the layers in reverse, allocating
/// gradients and freeing activations; the optimizer allocates and frees small scratch.
fn training_step() -> Vec<Op> {
    let layer_sizes = [3 * MIB, 12 * MIB, 768 * 1024, 48 * 1024, 6 * MIB, 4 * 1024];
    let mut ops = Vec::new();
    let mut next = 0;
    let mut alloc = |ops: &mut Vec<Op>, size| {
        ops.push(Op::Alloc(size));
        next += 1;
        next - 1
    };
    let mut saved = Vec::new();
    for layer in 0..24 {
        let tmp = alloc(&mut ops, 8 * MIB + layer * 4096);
        for &s in &layer_sizes {
            saved.push(alloc(&mut ops, s + layer * 512));
        }
        ops.push(Op::Free(tmp));
    }
    while let Some(act) = saved.pop() {
        let grad = alloc(&mut ops, 2 * MIB + (act % 7) * 64 * 1024);
        ops.push(Op::Free(act));
        ops.push(Op::Free(grad));
    }
    for p in 0..32 {
        let scratch = alloc(&mut ops, 1024 * (p + 1));
        ops.push(Op::Free(scratch));
    }
    ops
}

fn training_pattern<M: Measurement>(c: &mut Criterion<M>, clock: &str) {
    let ops = training_step();
    let allocs = ops.iter().filter(|o| matches!(o, Op::Alloc(_))).count();
    let alloc = allocator();
    let mut slots = Vec::with_capacity(allocs);
    let run = |slots: &mut Vec<Option<hip_rt::caching::Allocation<HostBackend>>>| {
        slots.clear();
        for op in &ops {
            match *op {
                Op::Alloc(size) => slots.push(Some(alloc.allocate(size, S0).expect("alloc"))),
                Op::Free(i) => slots[i] = None,
            }
        }
        slots.clear();
    };
    run(&mut slots); // warm the cache
    let mut group = c.benchmark_group(format!("{clock}/training_step"));
    group.throughput(Throughput::Elements(allocs as u64));
    group.bench_function(format!("{allocs}_allocs"), |b| b.iter(|| run(&mut slots)));
    group.finish();
}

fn config<M: Measurement>(c: Criterion<M>) -> Criterion<M> {
    c.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

fn wall(c: &mut Criterion) {
    cache_hit_pair(c, "wall");
    training_pattern(c, "wall");
}

fn cpu(c: &mut Criterion<ThreadCpuTime>) {
    cache_hit_pair(c, "cpu");
    training_pattern(c, "cpu");
}

criterion_group! {
    name = wall_clock;
    config = config(Criterion::default());
    targets = wall
}
criterion_group! {
    name = cpu_clock;
    config = config(Criterion::default().with_measurement(ThreadCpuTime { wall: WallTime }));
    targets = cpu
}
criterion_main!(wall_clock, cpu_clock);
