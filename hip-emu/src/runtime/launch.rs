//! `hipModuleLaunchKernel`: validate, capture the arguments, queue the launch. After the kernel
//! ran (on the device's executor thread), the canaries of every allocation are checked; an
//! execution error or a canary hit becomes a fault of the stream (hipErrorIllegalAddress for
//! memory faults and canary hits, hipErrorLaunchFailure for barrier/wave/race errors), reported
//! by the next synchronising call.
//!
//! hip-emu extension: `hipemuSetLaunchArgSizes(count, sizes)` announces the sizes of the
//! arguments of the next launch on this thread (hip-rt calls it when the runtime exports it).
//! With it, the count and size of every `kernelParams` entry are checked against the code
//! object's metadata; without it (a plain C caller) the metadata's count and sizes are trusted,
//! as a real runtime must.

use std::cell::RefCell;
use std::ffi::{c_uint, c_void};
use std::sync::Arc;

use hip_sys::{hipError_t, hipFunction_t, hipModule_t, hipStream_t};

use super::device::{LDS_PER_BLOCK, MAX_THREADS_PER_BLOCK};
use super::error::{Fail, Res};
use super::graph::{Kind, Node};
use super::memory;
use super::module::{function, Function};
use super::{hip_exports, runtime};
use crate::exec::{self, ExecError, LaunchSpec};

thread_local! {
    static ANNOUNCED: RefCell<Option<Vec<usize>>> = const { RefCell::new(None) };
}

/// hip-emu only: the sizes in bytes of the `count` arguments of this thread's next
/// `hipModuleLaunchKernel`, so that it can check them against the kernel's metadata.
///
/// # Safety
/// `sizes` must be null (clears the announcement) or point at `count` readable `usize`s.
#[no_mangle]
pub unsafe extern "C" fn hipemuSetLaunchArgSizes(count: usize, sizes: *const usize) {
    let value = if sizes.is_null() || count > 4096 {
        None
    } else {
        // SAFETY: `count` readable usizes per this function's contract.
        Some(unsafe { std::slice::from_raw_parts(sizes, count) }.to_vec())
    };
    ANNOUNCED.with(|a| *a.borrow_mut() = value);
}

/// " `name`" when the metadata names the argument (clang omits names in release builds).
fn arg_label(name: Option<&str>) -> String {
    match name {
        Some(n) if !n.is_empty() => format!(" `{n}`"),
        _ => String::new(),
    }
}

/// Check grid, block and LDS as a device would.
fn check_config(f: &Function, grid: [u32; 3], block: [u32; 3], dynamic_lds: usize) -> Res {
    let name = &f.meta.name;
    if grid.contains(&0) || block.contains(&0) {
        return Err(Fail::invalid(format!(
            "kernel `{name}`: grid {grid:?} and block {block:?} must have no zero dimension"
        )));
    }
    if grid[1] > 65535 || grid[2] > 65535 || grid[0] > i32::MAX as u32 {
        return Err(Fail::invalid(format!("kernel `{name}`: grid {grid:?} exceeds the device's maximum [2147483647, 65535, 65535]")));
    }
    let threads: u64 = block.iter().map(|&b| u64::from(b)).product();
    let max_flat = match f.meta.max_flat_workgroup_size {
        0 => MAX_THREADS_PER_BLOCK as u64,
        m => m.min(MAX_THREADS_PER_BLOCK as u64),
    };
    if threads > max_flat {
        return Err(Fail::invalid(format!(
            "kernel `{name}`: a block of {block:?} = {threads} threads exceeds the limit of {max_flat} \
             (the kernel's max flat workgroup size is {}, the device's {MAX_THREADS_PER_BLOCK})",
            f.meta.max_flat_workgroup_size
        )));
    }
    let static_lds = f.meta.group_segment_fixed_size as usize;
    if static_lds.saturating_add(dynamic_lds) > LDS_PER_BLOCK {
        return Err(Fail::invalid(format!(
            "kernel `{name}`: {static_lds} bytes of static LDS + {dynamic_lds} dynamic exceed the \
             {LDS_PER_BLOCK} bytes a workgroup may use"
        )));
    }
    Ok(())
}

/// The explicit argument sizes, checked three ways: metadata, host build, announced sizes.
fn arg_sizes(f: &Function, announced: Option<Vec<usize>>) -> Res<Vec<usize>> {
    let name = &f.meta.name;
    let meta: Vec<usize> = f.meta.explicit_args().map(|a| a.size as usize).collect();
    let host = f.kernel.param_sizes;
    if meta.as_slice() != host {
        return Err(Fail::invalid(format!(
            "kernel `{name}`: the code object's arguments have sizes {meta:?} but hip-emu's host \
             build of the kernel has {host:?}: the code object and the host build come from \
             different sources; rebuild both"
        )));
    }
    if let Some(announced) = announced {
        if announced.len() != meta.len() {
            return Err(Fail::invalid(format!(
                "kernel `{name}` takes {} argument(s) (sizes {meta:?}) but the launch passes {} (sizes {announced:?})",
                meta.len(),
                announced.len()
            )));
        }
        for (i, (want, got)) in meta.iter().zip(&announced).enumerate() {
            if want != got {
                let arg = f.meta.explicit_args().nth(i);
                let kind = arg.map(|a| a.value_kind.as_str()).unwrap_or("?");
                return Err(Fail::invalid(format!(
                    "kernel `{name}` argument {i}{} ({kind}) is {want} bytes but the launch passes {got} bytes",
                    arg_label(arg.and_then(|a| a.name.as_deref()))
                )));
            }
        }
    }
    Ok(meta)
}

/// Copy the arguments out of `kernelParams` and check each global pointer.
///
/// # Safety
/// `params` must point at one pointer per explicit argument, each to `sizes[i]` readable bytes.
unsafe fn capture(
    f: &Function,
    params: *mut *mut c_void,
    sizes: &[usize],
    device: i32,
) -> Res<Vec<Vec<u8>>> {
    let name = &f.meta.name;
    if params.is_null() && !sizes.is_empty() {
        return Err(Fail::invalid(format!(
            "kernel `{name}`: kernelParams is null but the kernel takes {} argument(s)",
            sizes.len()
        )));
    }
    let mut out = Vec::with_capacity(sizes.len());
    for (i, (&size, meta)) in sizes.iter().zip(f.meta.explicit_args()).enumerate() {
        // SAFETY: entry i of the kernelParams array exists per the contract.
        let p = unsafe { *params.add(i) };
        if p.is_null() {
            return Err(Fail::invalid(format!(
                "kernel `{name}`: kernelParams[{i}] is a null pointer"
            )));
        }
        // SAFETY: the entry points at `size` readable bytes per the contract.
        let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), size) }.to_vec();
        if meta.value_kind == "global_buffer" && size == 8 {
            let addr = u64::from_le_bytes(bytes[..8].try_into().unwrap_or([0; 8])) as usize;
            if addr != 0 && !memory::is_live(addr) {
                return Err(Fail::invalid(format!(
                    "kernel `{name}` argument {i}{} (a global pointer): {}",
                    arg_label(meta.name.as_deref()),
                    memory::describe_address(addr)
                )));
            }
            if let Some(a) = memory::allocation_at(addr) {
                if let memory::Owner::Device(owner) = a.owner {
                    if !super::runtime()?.may_access(device, owner) {
                        return Err(Fail::invalid(format!(
                            "kernel `{name}` argument {i}{} points into {}, but the launch is on \
                             device {device} without peer access to device {owner}: call \
                             hipDeviceEnablePeerAccess({owner}, 0) on device {device} first",
                            arg_label(meta.name.as_deref()),
                            a.describe()
                        )));
                    }
                }
            }
        }
        out.push(bytes);
    }
    Ok(out)
}

/// `HIP_LAUNCH_PARAM_BUFFER_POINTER`, `_BUFFER_SIZE`, `_END` (hip_runtime_api.h).
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;
const PARAM_END: usize = 3;

/// The `extra` form of `hipModuleLaunchKernel`: `{HIP_LAUNCH_PARAM_BUFFER_POINTER, buf,
/// HIP_LAUNCH_PARAM_BUFFER_SIZE, &size, HIP_LAUNCH_PARAM_END}`, the arguments packed in `buf` at
/// their kernarg offsets (the code object's metadata). Returns a pointer to each explicit
/// argument inside `buf`, each checked to lie within `size` bytes.
///
/// # Safety
/// `extra` must point at such a list (ending with `HIP_LAUNCH_PARAM_END`, at most 16 entries
/// read), `buf` at `size` readable bytes.
unsafe fn packed_args(f: &Function, extra: *mut *mut c_void) -> Res<Vec<*mut c_void>> {
    let name = &f.meta.name;
    let (mut buffer, mut size): (*mut c_void, Option<usize>) = (std::ptr::null_mut(), None);
    let mut i = 0;
    loop {
        if i >= 16 {
            return Err(Fail::invalid(format!(
                "kernel `{name}`: `extra` has no HIP_LAUNCH_PARAM_END within 16 entries"
            )));
        }
        // SAFETY: entries up to HIP_LAUNCH_PARAM_END exist per the contract.
        let key = unsafe { *extra.add(i) } as usize;
        match key {
            PARAM_END => break,
            PARAM_BUFFER_POINTER | PARAM_BUFFER_SIZE => {
                // SAFETY: a key is followed by its value per the contract.
                let value = unsafe { *extra.add(i + 1) };
                if key == PARAM_BUFFER_POINTER {
                    buffer = value;
                } else if value.is_null() {
                    return Err(Fail::invalid(format!(
                        "kernel `{name}`: HIP_LAUNCH_PARAM_BUFFER_SIZE points at nothing"
                    )));
                } else {
                    // SAFETY: the value points at a size_t per the contract.
                    size = Some(unsafe { *value.cast::<usize>() });
                }
                i += 2;
            }
            other => {
                return Err(Fail::invalid(format!(
                    "kernel `{name}`: `extra` entry {i} is {other:#x}, not a HIP_LAUNCH_PARAM_* key"
                )))
            }
        }
    }
    let Some(size) = size else {
        return Err(Fail::invalid(format!(
            "kernel `{name}`: `extra` has no HIP_LAUNCH_PARAM_BUFFER_SIZE"
        )));
    };
    if buffer.is_null() && f.meta.explicit_args().next().is_some() {
        return Err(Fail::invalid(format!(
            "kernel `{name}`: `extra` has no HIP_LAUNCH_PARAM_BUFFER_POINTER"
        )));
    }
    let mut out = Vec::new();
    for (i, a) in f.meta.explicit_args().enumerate() {
        let end = a.offset.saturating_add(a.size);
        if end > size as u64 {
            return Err(Fail::invalid(format!(
                "kernel `{name}` argument {i}{}: bytes {}..{end} of the packed argument buffer, \
                 which holds {size}",
                arg_label(a.name.as_deref()),
                a.offset
            )));
        }
        // SAFETY: offset + size <= the buffer's size (checked above).
        out.push(unsafe { buffer.cast::<u8>().add(a.offset as usize) }.cast::<c_void>());
    }
    Ok(out)
}

/// Map an execution error to the status a device would report.
fn exec_fail(e: ExecError) -> Fail {
    let code = match &e {
        ExecError::Fault { .. } | ExecError::Overrun { .. } => hipError_t::hipErrorIllegalAddress,
        ExecError::Resources { .. } => hipError_t::hipErrorLaunchOutOfResources,
        _ => hipError_t::hipErrorLaunchFailure,
    };
    let mut message = e.to_string();
    if let ExecError::Fault { addr, .. } | ExecError::Overrun { addr, .. } = e {
        message = format!("{message}: {}", memory::describe_address(addr));
    }
    Fail::new(code, message)
}

/// Run one launch on the executor thread, then check every allocation's canaries.
fn run(
    spec_kernel: &'static exec::KernelInfo,
    grid: [u32; 3],
    block: [u32; 3],
    dynamic_lds: usize,
    f_meta: (usize, u32),
    params: &[Vec<u8>],
    (seed, cooperative): (Option<u64>, bool),
) -> Res {
    let slices: Vec<&[u8]> = params.iter().map(Vec::as_slice).collect();
    let spec = LaunchSpec {
        kernel: spec_kernel,
        grid,
        block,
        dynamic_lds,
        static_lds: f_meta.0,
        max_flat_workgroup_size: f_meta.1,
        params: &slices,
        block_order_seed: seed,
        cooperative,
    };
    if let Err(e) = exec::execute(&spec) {
        // Restore the canaries this launch overwrote before it stopped: the next launch
        // reports only its own damage.
        let _ = memory::corrupted_canaries();
        return Err(exec_fail(e));
    }
    let hits = memory::corrupted_canaries();
    if let Some((alloc, addr)) = hits.first() {
        return Err(Fail::new(
            hipError_t::hipErrorIllegalAddress,
            format!(
                "kernel `{}` wrote out of bounds: {} (canary at {addr:#x} overwritten{})",
                spec_kernel.name,
                memory::describe_address(*addr),
                if hits.len() > 1 {
                    format!("; {} allocations hit", hits.len())
                } else {
                    String::new()
                },
            ) + &format!(" [{}]", alloc.describe()),
        ));
    }
    Ok(())
}

/// A cooperative launch's grid must be co-resident: at most the occupancy model's blocks per
/// CU times the CUs, and at most hip-emu's own bound.
fn check_cooperative(f: &Function, grid: [u32; 3], block: [u32; 3], dynamic_lds: usize) -> Res {
    let threads: u64 = block.iter().map(|&b| u64::from(b)).product();
    let blocks: u64 = grid.iter().map(|&g| u64::from(g)).product();
    let per_cu = super::occupancy::max_active_blocks(&f.meta, threads, dynamic_lds as u64);
    let resident = per_cu * super::device::COMPUTE_UNITS as u64;
    let name = &f.meta.name;
    if blocks > resident {
        return Err(Fail::new(
            hipError_t::hipErrorCooperativeLaunchTooLarge,
            format!(
                "hipLaunchCooperativeKernel: kernel `{name}`: a grid of {blocks} blocks of \
                 {threads} threads is not co-resident: {per_cu} such blocks fit per CU \
                 (its registers and LDS), {resident} on the device's {} CUs \
                 (hipModuleOccupancyMaxActiveBlocksPerMultiprocessor)",
                super::device::COMPUTE_UNITS
            ),
        ));
    }
    if blocks * threads > exec::COOPERATIVE_MAX_THREADS {
        return Err(Fail::new(
            hipError_t::hipErrorCooperativeLaunchTooLarge,
            format!(
                "hipLaunchCooperativeKernel: kernel `{name}`: a grid of {} threads; hip-emu runs \
                 cooperative grids of at most {} threads (every thread stays alive as a fibre)",
                blocks * threads,
                exec::COOPERATIVE_MAX_THREADS
            ),
        ));
    }
    Ok(())
}

/// hipModuleLaunchKernel and hipLaunchCooperativeKernel.
///
/// # Safety
/// The C API contract of hipModuleLaunchKernel's `kernel_params` and `extra`.
unsafe fn launch(
    f: hipFunction_t,
    (grid, block): ([u32; 3], [u32; 3]),
    shared_mem_bytes: c_uint,
    stream: hipStream_t,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
    cooperative: bool,
) -> Res {
    // Taken first, so an announcement never outlives the launch it was made for.
    let announced = ANNOUNCED.with(|a| a.borrow_mut().take());
    let func = function(f)?;
    let rt = runtime()?;
    let (dev, info) = rt.stream(stream)?;
    let name = func.meta.name.clone();
    if dev.ordinal != func.device {
        return Err(Fail::invalid(format!(
            "kernel `{name}` was loaded on device {} but launched on a stream of device {}",
            func.device, dev.ordinal
        )));
    }
    check_config(&func, grid, block, shared_mem_bytes as usize)?;
    if cooperative {
        check_cooperative(&func, grid, block, shared_mem_bytes as usize)?;
    }
    let sizes = arg_sizes(&func, announced)?;
    let params = if extra.is_null() {
        // SAFETY: the C API contract: one pointer per argument, each to the argument's bytes.
        unsafe { capture(&func, kernel_params, &sizes, dev.ordinal) }?
    } else {
        if !kernel_params.is_null() {
            return Err(Fail::invalid(format!(
                "kernel `{name}`: both kernelParams and extra are given; pass one"
            )));
        }
        // SAFETY: the C API contract of `extra`: a HIP_LAUNCH_PARAM_* list whose buffer
        // holds the packed arguments.
        let mut pointers = unsafe { packed_args(&func, extra) }?;
        // SAFETY: `packed_args` checked that each pointer leads to its argument's bytes
        // inside the caller's buffer.
        unsafe { capture(&func, pointers.as_mut_ptr(), &sizes, dev.ordinal) }?
    };
    let kernel = func.kernel;
    let meta = (
        func.meta.group_segment_fixed_size as usize,
        func.meta.max_flat_workgroup_size as u32,
    );
    let seed = rt.config.seed;
    let dynamic = shared_mem_bytes as usize;
    let mirrors = super::module::module(func.module as hipModule_t)
        .map(|m| m.mirrors.lock().unwrap_or_else(|p| p.into_inner()).clone())
        .unwrap_or_default();
    let check = replay_check(&func, &params);
    let work = move || {
        // The module's variables go in before the kernel and come back after it.
        use super::globals::{sync, Direction};
        sync(&mirrors, Direction::In);
        let result = run(
            kernel,
            grid,
            block,
            dynamic,
            meta,
            &params,
            (seed, cooperative),
        );
        sync(&mirrors, Direction::Out);
        result
    };
    let node = Node::run(
        format!("kernel `{name}`"),
        Kind::Kernel(f as usize),
        Arc::new(work),
    )
    .checked(check);
    if !super::graph::submit(dev.ordinal, info.id, node)? {
        super::stats::bump(super::stats::Counter::Launches);
    }
    Ok(())
}

/// The check a graph launch repeats for a captured kernel: every global pointer argument still
/// points into a live allocation.
fn replay_check(f: &Function, params: &[Vec<u8>]) -> super::graph::Replay {
    let name = f.meta.name.clone();
    let pointers: Vec<(usize, String, usize)> = params
        .iter()
        .zip(f.meta.explicit_args())
        .enumerate()
        .filter(|(_, (bytes, meta))| meta.value_kind == "global_buffer" && bytes.len() == 8)
        .filter_map(|(i, (bytes, meta))| {
            let addr = u64::from_le_bytes(bytes[..8].try_into().ok()?) as usize;
            (addr != 0).then(|| (i, arg_label(meta.name.as_deref()), addr))
        })
        .collect();
    Arc::new(move || {
        for (i, label, addr) in &pointers {
            if !memory::is_live(*addr) {
                return Err(Fail::invalid(format!(
                    "kernel `{name}` argument {i}{label} (a global pointer): {}",
                    memory::describe_address(*addr)
                )));
            }
        }
        Ok(())
    })
}

hip_exports! {
    /// Validates and queues; never waits. Errors found later (faults, canaries, barrier
    /// misuse) are returned by the next synchronising call on the stream or device.
    fn hipModuleLaunchKernel(
        f: hipFunction_t,
        gx: c_uint, gy: c_uint, gz: c_uint,
        bx: c_uint, by: c_uint, bz: c_uint,
        shared_mem_bytes: c_uint,
        stream: hipStream_t,
        kernel_params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        // SAFETY: forwarded from the caller.
        unsafe { launch(f, ([gx, gy, gz], [bx, by, bz]), shared_mem_bytes, stream, kernel_params, extra, false) }
    }

    /// A cooperative launch: every block of the grid is alive at once, so cooperative groups'
    /// `this_grid().sync()` holds. HIP's `f` is the kernel's host stub; hip-emu has none, so
    /// `f` is a `hipFunction_t` from `hipModuleGetFunction` (cast to `const void*`). A grid
    /// that is not co-resident (occupancy model) or over `exec::COOPERATIVE_MAX_THREADS` is
    /// hipErrorCooperativeLaunchTooLarge.
    fn hipLaunchCooperativeKernel(
        f: *const c_void,
        grid: hip_sys::generated::dim3,
        block: hip_sys::generated::dim3,
        kernel_params: *mut *mut c_void,
        shared_mem_bytes: c_uint,
        stream: hipStream_t,
    ) {
        let (grid, block) = ([grid.x, grid.y, grid.z], [block.x, block.y, block.z]);
        // SAFETY: forwarded from the caller (kernelParams as hipModuleLaunchKernel's).
        unsafe { launch(f as hipFunction_t, (grid, block), shared_mem_bytes, stream, kernel_params, std::ptr::null_mut(), true) }
    }
}
