//! Kernel execution: host builds of kernels (shared objects hip-build compiles against its
//! shim, loaded by [`host`]) and the fibre scheduler.
//!
//! See README-exec.md. `execute` runs one launch: it checks the configuration as a device would
//! (block size, LDS), then runs the blocks one after another (in a shuffled order with a
//! seed), each GPU thread as a corosensei fibre on a pooled, guarded stack. Launches are
//! serialised process-wide (one executor lock): static `__shared__` variables live once in the
//! `hipemu_lds_0` section of their kernel file's host build, refilled with 0xFF bytes (a NaN in every
//! float format) before every block.

mod elf_check;
mod error;
mod fault;
pub mod host;
pub(crate) mod overrun;
mod race;
mod sched;

use std::ffi::c_void;
use std::sync::Mutex;

pub use error::{Dim3, ExecError};
pub use host::{HostModule, KernelInfo};

use race::Race;
use sched::{Launch, StackPool};

/// LDS a workgroup may use on gfx906 (bytes).
pub const LDS_LIMIT: usize = 64 * 1024;
/// Threads per block a device allows.
pub const MAX_BLOCK_THREADS: u32 = 1024;
/// Byte every LDS byte holds when a block starts (0xFFFF_FFFF is a NaN as f32, f16 pairs,
/// bf16 pairs and f64; -1 as an integer).
pub const LDS_FILL: u8 = 0xFF;
/// Threads a cooperative launch may have on hip-emu: every thread of its grid is a live fibre
/// (a stack each) until the launch ends, so the grid is bounded besides the device's
/// co-residency limit.
pub const COOPERATIVE_MAX_THREADS: u64 = 16384;
/// Default size of a GPU thread's fibre stack (KiB); HIPK_EMU_STACK_KIB overrides it.
pub const DEFAULT_STACK_KIB: usize = 64;

/// One launch, as the runtime hands it over.
#[derive(Debug, Clone, Copy)]
pub struct LaunchSpec<'a> {
    pub kernel: &'static KernelInfo,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    /// Dynamic LDS bytes (hipModuleLaunchKernel's sharedMemBytes).
    pub dynamic_lds: usize,
    /// Static LDS bytes of the kernel (code object metadata: .group_segment_fixed_size).
    pub static_lds: usize,
    /// The kernel's max flat workgroup size (code object metadata); 0 = unknown (1024).
    pub max_flat_workgroup_size: u32,
    /// One byte slice per parameter, in order, each exactly the parameter's size.
    pub params: &'a [&'a [u8]],
    /// Some(seed): run the blocks in a seed-dependent order instead of x-fastest order.
    pub block_order_seed: Option<u64>,
    /// hipLaunchCooperativeKernel: every block of the grid is alive at once (its fibres parked
    /// between grid syncs, its LDS swapped in while it runs), so `this_grid().sync()` holds.
    pub cooperative: bool,
}

/// Shared state of the shim (hip-build's shim/hip/hip_runtime.h: hipemu_state_t), one per host
/// build.
mod ffi {
    #[repr(C)]
    pub struct State {
        pub thread_idx: [u32; 3],
        pub block_idx: [u32; 3],
        pub block_dim: [u32; 3],
        pub grid_dim: [u32; 3],
        pub dynamic_lds: *mut std::ffi::c_void,
        pub block_threads: u32,
    }
}

/// The process-wide executor: fibre stacks and the dynamic LDS buffer, behind the launch lock.
struct Executor {
    stacks: StackPool,
    dynamic: DynamicLds,
}

static EXECUTOR: Mutex<Option<Executor>> = Mutex::new(None);

/// Runs one launch to completion on the calling thread. Blocks run one after another; an
/// error stops the launch at the failing block (earlier blocks' writes stay, as on a device).
pub fn execute(spec: &LaunchSpec<'_>) -> Result<(), ExecError> {
    let kernel = spec.kernel.name;
    check(spec)?;
    let mut guard = EXECUTOR.lock().unwrap_or_else(|p| p.into_inner());
    if guard.is_none() {
        let dynamic =
            DynamicLds::new().map_err(|reason| ExecError::Resources { kernel, reason })?;
        *guard = Some(Executor {
            stacks: StackPool::new(stack_size()),
            dynamic,
        });
    }
    let ex = guard.as_mut().expect("initialised above");
    fault::prepare_thread().map_err(|reason| ExecError::Resources { kernel, reason })?;
    let _watchdog = fault::watchdog(fault::watchdog_seconds());

    let args: Vec<*const c_void> = spec.params.iter().map(|p| p.as_ptr().cast()).collect();
    let dyn_ptr = ex.dynamic.region(spec.dynamic_lds);
    let (lds_begin, lds_end) = spec.kernel.lds;
    let state = spec.kernel.rt.state;
    // SAFETY: the launch lock is held: no other launch reads or writes the shim's state, which
    // lives in the kernel's host build (never unloaded).
    unsafe {
        let st = &mut *state;
        st.block_dim = spec.block;
        st.grid_dim = spec.grid;
        st.dynamic_lds = dyn_ptr.cast();
        st.block_threads = spec.block.iter().product();
    }
    let mut race = Race::begin_launch(spec.kernel.rt, (lds_begin, lds_end), ex.dynamic.bounds())
        .map_err(|reason| ExecError::Resources { kernel, reason })?;
    let asan = spec.kernel.rt.asan;
    // SAFETY: `asan` is null or the report state of the kernel's host build (never unloaded);
    // the launch lock is held, so no kernel runs.
    unsafe { overrun::reset(asan) };
    let total: u64 = spec.grid.iter().map(|&g| u64::from(g)).product();
    let order = BlockOrder::new(total, spec.block_order_seed);
    let block_at = |i: u64| {
        let b = order.at(i);
        let gx = u64::from(spec.grid[0]);
        let gy = u64::from(spec.grid[1]);
        [
            (b % gx) as u32,
            ((b / gx) % gy) as u32,
            (b / (gx * gy)) as u32,
        ]
    };
    if spec.cooperative {
        let blocks: Vec<[u32; 3]> = (0..total).map(block_at).collect();
        let mut c = Cooperative {
            spec,
            args: &args,
            state,
            lds: (lds_begin, lds_end),
            dyn_ptr,
            stacks: &mut ex.stacks,
            race: &mut race,
        };
        return c.run(&blocks);
    }
    for i in 0..total {
        let block = block_at(i);
        // SAFETY: lds_begin..lds_end is the kernel file's hipemu_lds_<n> section (empty when
        // it has none) and dyn_ptr the launch's dynamic LDS region (dynamic_lds bytes); no
        // fibre runs between blocks.
        unsafe {
            if lds_end > lds_begin {
                std::ptr::write_bytes(lds_begin as *mut u8, LDS_FILL, lds_end - lds_begin);
            }
            std::ptr::write_bytes(dyn_ptr, LDS_FILL, spec.dynamic_lds);
            (*state).block_idx = block;
        }
        let mut launch = Launch {
            kernel,
            trampoline: spec.kernel.trampoline,
            state,
            args: args.as_ptr(),
            block,
            stacks: &mut ex.stacks,
            race: &mut race,
        };
        sched::run_block(&mut launch, spec.block)?;
        // SAFETY: as for the reset above; the block has finished.
        if let Some(r) = unsafe { overrun::take(asan) } {
            return Err(ExecError::Overrun {
                kernel,
                block: Dim3(block),
                addr: r.addr,
                access: format!(
                    "{} of {} bytes",
                    if r.write { "write" } else { "read" },
                    r.size
                ),
                site: race::source_line(r.pc, spec.kernel.rt.source_root),
            });
        }
    }
    Ok(())
}

/// A cooperative launch: every block's fibres are made first; then, round after round, each
/// block runs (its LDS and block index swapped in) until all its threads return or wait at a
/// grid sync. A round in which every block waits at the same grid sync releases it; one in
/// which every block returned ends the launch; anything else is an error naming the blocks.
struct Cooperative<'s, 'e> {
    spec: &'s LaunchSpec<'s>,
    args: &'s [*const c_void],
    state: *mut ffi::State,
    lds: (usize, usize),
    dyn_ptr: *mut u8,
    stacks: &'e mut StackPool,
    race: &'e mut Race,
}

impl Cooperative<'_, '_> {
    fn launch(&mut self, block: [u32; 3]) -> Launch<'_> {
        Launch {
            kernel: self.spec.kernel.name,
            trampoline: self.spec.kernel.trampoline,
            state: self.state,
            args: self.args.as_ptr(),
            block,
            stacks: self.stacks,
            race: self.race,
        }
    }

    fn run(&mut self, blocks: &[[u32; 3]]) -> Result<(), ExecError> {
        let mut parked = Vec::with_capacity(blocks.len());
        let result = self.rounds(blocks, &mut parked);
        for p in parked.iter_mut() {
            sched::recycle(&mut self.launch([0; 3]), p);
        }
        result
    }

    fn rounds(
        &mut self,
        blocks: &[[u32; 3]],
        parked: &mut Vec<sched::Parked>,
    ) -> Result<(), ExecError> {
        let spec = self.spec;
        let kernel = spec.kernel.name;
        let threads: u64 = spec.block.iter().map(|&b| u64::from(b)).product();
        if threads * blocks.len() as u64 > COOPERATIVE_MAX_THREADS {
            return Err(ExecError::InvalidLaunch {
                kernel,
                reason: format!(
                    "a cooperative grid of {} threads: hip-emu runs at most {COOPERATIVE_MAX_THREADS}",
                    threads * blocks.len() as u64
                ),
            });
        }
        for &b in blocks {
            let p = sched::spawn(&mut self.launch(b), threads as usize)?;
            parked.push(p);
        }
        let static_len = self.lds.1 - self.lds.0;
        let mut saved = vec![vec![LDS_FILL; static_len + spec.dynamic_lds]; blocks.len()];
        loop {
            let mut phases = Vec::with_capacity(blocks.len());
            for (i, &b) in blocks.iter().enumerate() {
                let (lds, dyn_ptr, state) = (self.lds, self.dyn_ptr, self.state);
                let (st, dy) = saved[i].split_at_mut(static_len);
                // SAFETY: lds is the kernel file's LDS section (static_len bytes) and dyn_ptr
                // the launch's dynamic LDS region (dynamic_lds bytes); no fibre runs between
                // steps; the launch lock is held.
                unsafe {
                    std::ptr::copy_nonoverlapping(st.as_ptr(), lds.0 as *mut u8, static_len);
                    std::ptr::copy_nonoverlapping(dy.as_ptr(), dyn_ptr, dy.len());
                    (*state).block_idx = b;
                }
                let mut l = self.launch(b);
                l.race.begin_block();
                let phase = sched::step(&mut l, spec.block, &mut parked[i], true)?;
                if let Some(race) = l.race.take(kernel, b, spec.block) {
                    return Err(race);
                }
                // SAFETY: as above, the other way.
                unsafe {
                    std::ptr::copy_nonoverlapping(lds.0 as *const u8, st.as_mut_ptr(), static_len);
                    std::ptr::copy_nonoverlapping(dyn_ptr, dy.as_mut_ptr(), dy.len());
                }
                phases.push(phase);
            }
            let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
            for (i, phase) in phases.iter().enumerate() {
                let label = match phase {
                    sched::Phase::Done => "returned".to_string(),
                    sched::Phase::Grid(site) => format!("grid sync at {site}"),
                };
                match groups.iter_mut().find(|g| g.0 == label) {
                    Some(g) => g.1.push(i as u32),
                    None => groups.push((label, vec![i as u32])),
                }
            }
            match (groups.len(), phases.first()) {
                (1, Some(sched::Phase::Done)) => return Ok(()),
                (1, _) => parked.iter_mut().for_each(sched::release_grid),
                _ => {
                    let named: Vec<String> = groups
                        .iter()
                        .map(|(label, ids)| {
                            let shown: Vec<String> = ids
                                .iter()
                                .take(4)
                                .map(|&i| Dim3(blocks[i as usize]).to_string())
                                .collect();
                            format!("{label}: blocks {}", shown.join(", "))
                        })
                        .collect();
                    return Err(ExecError::GridSync {
                        kernel,
                        reason: format!(
                            "the grid's blocks are at different places: {}; every block must \
                             reach every grid sync (no early return before this_grid().sync())",
                            named.join("; ")
                        ),
                    });
                }
            }
        }
    }
}

/// The device's checks of a launch configuration, before anything runs.
fn check(spec: &LaunchSpec<'_>) -> Result<(), ExecError> {
    let k = spec.kernel;
    let kernel = k.name;
    let invalid = |reason: String| Err(ExecError::InvalidLaunch { kernel, reason });
    if spec.params.len() != k.param_sizes.len() {
        return invalid(format!(
            "{} arguments given, the kernel takes {}",
            spec.params.len(),
            k.param_sizes.len()
        ));
    }
    for (i, (p, &size)) in spec.params.iter().zip(k.param_sizes).enumerate() {
        if p.len() != size {
            return invalid(format!(
                "argument {i} is {} bytes, the kernel's parameter is {size}",
                p.len()
            ));
        }
    }
    if spec.grid.contains(&0) || spec.block.contains(&0) {
        return invalid(format!(
            "grid {} and block {} must be at least 1 in every dimension",
            Dim3(spec.grid),
            Dim3(spec.block)
        ));
    }
    if spec.grid[0] > i32::MAX as u32 || spec.grid[1] > 65535 || spec.grid[2] > 65535 {
        return invalid(format!(
            "grid {} exceeds the device's (2147483647, 65535, 65535)",
            Dim3(spec.grid)
        ));
    }
    let threads: u64 = spec.block.iter().map(|&b| u64::from(b)).product();
    let max_flat = if spec.max_flat_workgroup_size == 0 {
        MAX_BLOCK_THREADS
    } else {
        spec.max_flat_workgroup_size
    };
    let limit = max_flat.min(MAX_BLOCK_THREADS);
    if threads > u64::from(limit) {
        return Err(ExecError::BlockTooLarge {
            kernel,
            threads,
            limit,
            max_flat: spec.max_flat_workgroup_size,
        });
    }
    let total = spec.static_lds.saturating_add(spec.dynamic_lds);
    if total > LDS_LIMIT {
        return Err(ExecError::LdsTooLarge {
            kernel,
            static_lds: spec.static_lds,
            dynamic_lds: spec.dynamic_lds,
            total,
        });
    }
    Ok(())
}

/// Fibre stack size: HIPK_EMU_STACK_KIB or DEFAULT_STACK_KIB (at least 16 KiB).
fn stack_size() -> usize {
    std::env::var("HIPK_EMU_STACK_KIB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(DEFAULT_STACK_KIB)
        .max(16)
        * 1024
}

/// The dynamic LDS buffer: LDS_LIMIT bytes followed by a PROT_NONE page; a launch's region
/// ends right at the guard page, so reading or writing past the requested size faults.
struct DynamicLds {
    base: *mut u8,
}

// SAFETY: the mapping is owned by the executor and only touched under the launch lock.
unsafe impl Send for DynamicLds {}

const PAGE: usize = 4096;

impl DynamicLds {
    fn new() -> Result<Self, String> {
        // SAFETY: a fresh private anonymous mapping; the last page is made inaccessible.
        unsafe {
            let len = LDS_LIMIT + PAGE;
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err("cannot map the dynamic LDS buffer".into());
            }
            if libc::mprotect(
                base.cast::<u8>().add(LDS_LIMIT).cast(),
                PAGE,
                libc::PROT_NONE,
            ) != 0
            {
                libc::munmap(base, len);
                return Err("cannot protect the dynamic LDS guard page".into());
            }
            Ok(DynamicLds { base: base.cast() })
        }
    }

    /// The whole buffer (the race check's dynamic LDS range).
    fn bounds(&self) -> (usize, usize) {
        (self.base as usize, self.base as usize + LDS_LIMIT)
    }

    /// Start of a region of `size` bytes (<= LDS_LIMIT, 16-byte aligned) ending at the guard.
    fn region(&self, size: usize) -> *mut u8 {
        let rounded = size.div_ceil(16) * 16;
        // SAFETY: rounded <= LDS_LIMIT (checked by check()), so this stays inside the mapping.
        unsafe { self.base.add(LDS_LIMIT - rounded.min(LDS_LIMIT)) }
    }
}

/// Block visiting order: identity, or with a seed the affine permutation i -> (a*i + c) mod n
/// with a coprime to n (no table, any grid size).
struct BlockOrder {
    n: u64,
    a: u64,
    c: u64,
}

impl BlockOrder {
    fn new(n: u64, seed: Option<u64>) -> Self {
        let Some(seed) = seed else {
            return BlockOrder { n, a: 1, c: 0 };
        };
        if n <= 1 {
            return BlockOrder { n, a: 1, c: 0 };
        }
        let mut s = seed;
        let mut next = || {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut a = next() % n;
        while gcd(a, n) != 1 {
            a = (a + 1) % n;
        }
        BlockOrder {
            n,
            a,
            c: next() % n,
        }
    }

    fn at(&self, i: u64) -> u64 {
        ((u128::from(self.a) * u128::from(i) + u128::from(self.c)) % u128::from(self.n)) as u64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_block_order_is_a_permutation() {
        for n in [1u64, 2, 6, 7, 64, 100] {
            for seed in [None, Some(1), Some(42)] {
                let o = BlockOrder::new(n, seed);
                let mut seen: Vec<u64> = (0..n).map(|i| o.at(i)).collect();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n {n} seed {seed:?}");
            }
        }
        let o = BlockOrder::new(100, Some(7));
        assert!((0..100).any(|i| o.at(i) != i), "a seed changes the order");
    }
}
