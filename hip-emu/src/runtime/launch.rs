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

use hip_sys::{hipError_t, hipFunction_t, hipStream_t};

use super::device::{LDS_PER_BLOCK, MAX_THREADS_PER_BLOCK};
use super::error::{Fail, Res};
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
    params: Vec<Vec<u8>>,
    seed: Option<u64>,
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
        if !extra.is_null() {
            return Err(Fail::new(hipError_t::hipErrorNotSupported, format!("kernel `{name}`: the `extra` launch argument is not emulated; pass kernelParams")));
        }
        let (grid, block) = ([gx, gy, gz], [bx, by, bz]);
        check_config(&func, grid, block, shared_mem_bytes as usize)?;
        let sizes = arg_sizes(&func, announced)?;
        // SAFETY: the C API contract: one pointer per argument, each to the argument's bytes.
        let params = unsafe { capture(&func, kernel_params, &sizes, dev.ordinal) }?;
        let kernel = func.kernel;
        let meta = (func.meta.group_segment_fixed_size as usize, func.meta.max_flat_workgroup_size as u32);
        let seed = rt.config.seed;
        let dynamic = shared_mem_bytes as usize;
        dev.executor.enqueue(
            info.id,
            format!("kernel `{name}`"),
            Box::new(move || run(kernel, grid, block, dynamic, meta, params, seed)),
        )?;
        super::stats::bump(super::stats::Counter::Launches);
        Ok(())
    }
}
