//! `hipStream*Capture`, `hipGraph*`, `hipGraphExec*`: stream capture and graphs.
//!
//! Every entry point here is resolved on first use like the others, so a HIP without graphs
//! answers `hip_sys::Error::MissingSymbol` naming the call (and the caller can fall back to
//! eager launches).

use hip_sys::generated::{
    hipGraphExecUpdateResult, hipGraphExec_t, hipGraph_t, hipStreamCaptureMode,
    hipStreamCaptureStatus,
};
use hip_sys::hipStream_t;

use super::hip_fn;
use super::Result;

/// `hipStreamBeginCapture`.
///
/// # Safety
/// `stream` must be a live stream (not the null stream).
pub unsafe fn begin_capture(stream: hipStream_t, mode: hipStreamCaptureMode) -> Result<()> {
    let f = hip_fn!(hipStreamBeginCapture)?;
    // SAFETY: the caller guarantees `stream` is live; `mode` is one of the header's values.
    unsafe { f(stream, mode) }.result()
}

/// `hipStreamEndCapture`: the captured graph (owned by the caller: [`graph_destroy`]).
///
/// # Safety
/// `stream` must be a live stream.
pub unsafe fn end_capture(stream: hipStream_t) -> Result<hipGraph_t> {
    let f = hip_fn!(hipStreamEndCapture)?;
    let mut g: hipGraph_t = std::ptr::null_mut();
    // SAFETY: the caller guarantees `stream` is live; `g` is a valid out-pointer.
    unsafe { f(stream, &mut g) }.result()?;
    Ok(g)
}

/// `hipStreamIsCapturing`.
///
/// # Safety
/// `stream` must be null or a live stream.
pub unsafe fn is_capturing(stream: hipStream_t) -> Result<hipStreamCaptureStatus> {
    let f = hip_fn!(hipStreamIsCapturing)?;
    let mut status = hipStreamCaptureStatus::hipStreamCaptureStatusNone;
    // SAFETY: the caller guarantees `stream`; `status` is a valid out-pointer.
    unsafe { f(stream, &mut status) }.result()?;
    Ok(status)
}

/// `hipGraphDestroy`.
///
/// # Safety
/// `graph` must be live, destroyed at most once, and not used afterwards.
pub unsafe fn graph_destroy(graph: hipGraph_t) -> Result<()> {
    let f = hip_fn!(hipGraphDestroy)?;
    // SAFETY: the caller guarantees `graph` is live and never used again.
    unsafe { f(graph) }.result()
}

/// `hipGraphGetNodes` with a null node array: the number of nodes.
///
/// # Safety
/// `graph` must be live.
pub unsafe fn graph_node_count(graph: hipGraph_t) -> Result<usize> {
    let f = hip_fn!(hipGraphGetNodes)?;
    let mut n = 0usize;
    // SAFETY: the caller guarantees `graph`; a null node array asks for the count only.
    unsafe { f(graph, std::ptr::null_mut(), &mut n) }.result()?;
    Ok(n)
}

/// `hipGraphInstantiate` (no error node, no log).
///
/// # Safety
/// `graph` must be live.
pub unsafe fn instantiate(graph: hipGraph_t) -> Result<hipGraphExec_t> {
    let f = hip_fn!(hipGraphInstantiate)?;
    let mut exec: hipGraphExec_t = std::ptr::null_mut();
    // SAFETY: the caller guarantees `graph`; `exec` is a valid out-pointer; the error node and
    // log buffer are optional (null, size 0).
    unsafe {
        f(
            &mut exec,
            graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    }
    .result()?;
    Ok(exec)
}

/// `hipGraphLaunch`.
///
/// # Safety
/// `exec` must be live and `stream` null or live, on the graph's device; everything the
/// graph's nodes read and write must still be allocated.
pub unsafe fn launch(exec: hipGraphExec_t, stream: hipStream_t) -> Result<()> {
    let f = hip_fn!(hipGraphLaunch)?;
    // SAFETY: the caller's contract.
    unsafe { f(exec, stream) }.result()
}

/// `hipGraphExecDestroy`.
///
/// # Safety
/// `exec` must be live, destroyed at most once, and not used afterwards.
pub unsafe fn exec_destroy(exec: hipGraphExec_t) -> Result<()> {
    let f = hip_fn!(hipGraphExecDestroy)?;
    // SAFETY: the caller guarantees `exec` is live and never used again.
    unsafe { f(exec) }.result()
}

/// `hipGraphExecUpdate`: `Ok(success)`, or the runtime's verdict when it refused the update
/// (`hipErrorGraphExecUpdateFailure`; any other failure is `Err`).
///
/// # Safety
/// `exec` and `graph` must be live.
pub unsafe fn exec_update(
    exec: hipGraphExec_t,
    graph: hipGraph_t,
) -> Result<hipGraphExecUpdateResult> {
    let f = hip_fn!(hipGraphExecUpdate)?;
    let mut node = std::ptr::null_mut();
    let mut verdict = hipGraphExecUpdateResult::hipGraphExecUpdateError;
    // SAFETY: the caller guarantees both handles; both out-pointers are valid.
    let status = unsafe { f(exec, graph, &mut node, &mut verdict) };
    if status == hip_sys::hipError_t::hipErrorGraphExecUpdateFailure {
        return Ok(verdict);
    }
    status.result()?;
    Ok(verdict)
}
