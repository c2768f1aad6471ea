//! Stream capture and graphs: `hipStreamBeginCapture` / `hipStreamEndCapture` /
//! `hipStreamIsCapturing`, `hipGraphInstantiate`, `hipGraphLaunch`, `hipGraphExecUpdate`,
//! `hipGraphGetNodes` (the count) and the destroys.
//!
//! While a stream captures, the work queued on it (kernel launches, BLAS calls, asynchronous
//! copies and memsets, event records) is checked exactly as an eager call is, then kept as a
//! node of the capture instead of running. A graph is the captured nodes in stream order (one
//! stream, so a chain); an executable graph is a copy of them. `hipGraphLaunch` runs every
//! node's host-side check again (each kernel's pointer arguments and each copy's device ranges
//! must still be live allocations), then queues the nodes on the launch stream, where they run
//! with the same device-side checks as eager work (bounds, canaries, races, LDS).
//!
//! Counters ([`super::stats`]): captured work counts nothing; each `hipGraphLaunch` counts one
//! `graph_launches` and its nodes under `graph_nodes` (kernels are not added to `launches`);
//! bytes copied and memsets inside a launched graph count under their usual counters.
//!
//! What the capture refuses (CUDA's rules for the unsafe calls of a capture, every mode): a
//! capture on the null stream (hipErrorStreamCaptureUnsupported); synchronising or querying a
//! capturing stream, `hipDeviceSynchronize` on its device, a synchronous copy or memset queued on
//! it, or `hipFree` while any stream captures (hipErrorStreamCaptureUnsupported); work on the
//! null stream while a blocking stream of its device captures (hipErrorStreamCaptureImplicit);
//! waiting on an event not recorded inside the same capture (hipErrorStreamCaptureIsolation).
//! Each of these also invalidates the capture: `hipStreamEndCapture` then fails with
//! hipErrorStreamCaptureInvalidated and returns no graph.

use std::collections::HashMap;
use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use hip_sys::generated::{
    hipGraphExecUpdateResult, hipGraphExec_t, hipGraphNode_t, hipGraph_t, hipStreamCaptureMode,
    hipStreamCaptureStatus, hipStreamNonBlocking,
};
use hip_sys::{hipError_t, hipEvent_t, hipStream_t};

use super::error::{Fail, Res};
use super::queue::{EventState, NULL_STREAM};
use super::stats::{self, Counter};
use super::{hip_exports, out, runtime};

/// Work a node runs, as often as its graph is launched.
pub type Replay = Arc<dyn Fn() -> Res + Send + Sync>;

/// What a node does when its graph runs.
#[derive(Clone)]
pub enum Step {
    /// Run the work on the launch stream.
    Run(Replay),
    /// Record the event on the launch stream.
    Record(Arc<EventState>),
}

/// What kind of node: `hipGraphExecUpdate` accepts a graph whose nodes have the same kinds (and
/// kernels the same functions) in the same order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A kernel launch of this `hipFunction_t`.
    Kernel(usize),
    /// A BLAS call.
    Blas,
    /// An asynchronous copy.
    Copy,
    /// An asynchronous memset.
    Memset,
    /// An event record.
    Record,
}

/// One captured operation.
#[derive(Clone)]
pub struct Node {
    /// What it is, for messages (`kernel \`name\``).
    pub label: String,
    /// Its kind, for updates.
    pub kind: Kind,
    /// What runs.
    pub step: Step,
    /// A host-side check run at every `hipGraphLaunch` before anything is queued.
    pub check: Option<Replay>,
    /// Counters added at every launch (bytes copied, memsets).
    pub counts: Vec<(Counter, u64)>,
}

impl Node {
    /// A node that runs `work`.
    pub fn run(label: impl Into<String>, kind: Kind, work: Replay) -> Node {
        Node {
            label: label.into(),
            kind,
            step: Step::Run(work),
            check: None,
            counts: Vec::new(),
        }
    }

    /// The same with a launch-time check.
    pub fn checked(self, check: Replay) -> Node {
        Node {
            check: Some(check),
            ..self
        }
    }

    /// The same, adding `n` to `counter` at every launch.
    pub fn counting(mut self, counter: Counter, n: u64) -> Node {
        self.counts.push((counter, n));
        self
    }
}

/// A capture in progress.
struct Capture {
    device: i32,
    /// A blocking stream (legacy null-stream work would have to wait for it).
    blocking: bool,
    nodes: Vec<Node>,
    /// Why the capture was invalidated, if it was.
    invalid: Option<String>,
    /// Events recorded inside this capture (handles).
    events: Vec<usize>,
}

/// A graph: its device and nodes.
struct GraphData {
    device: i32,
    nodes: Arc<Vec<Node>>,
}

#[derive(Default)]
struct Tables {
    /// By stream id.
    captures: HashMap<u64, Capture>,
    graphs: HashMap<usize, GraphData>,
    /// Executable graphs: device and nodes (replaced by an update).
    execs: HashMap<usize, GraphData>,
}

fn tables() -> MutexGuard<'static, Tables> {
    static TABLES: OnceLock<Mutex<Tables>> = OnceLock::new();
    TABLES
        .get_or_init(|| Mutex::new(Tables::default()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn invalidate(c: &mut Capture, why: &str) {
    c.invalid.get_or_insert_with(|| why.to_owned());
}

/// Capture `node` when `stream` (an id of `device`) is capturing (`Ok(None)`), else hand it
/// back to be queued (`Ok(Some(node))`). Work on the null stream while a blocking stream of the
/// device captures is hipErrorStreamCaptureImplicit and invalidates that capture.
pub fn try_capture(device: i32, stream: u64, node: Node) -> Res<Option<Node>> {
    let mut t = tables();
    if t.captures.is_empty() {
        return Ok(Some(node));
    }
    if stream == NULL_STREAM {
        let mut hit = false;
        for c in t.captures.values_mut() {
            if c.device == device && c.blocking {
                invalidate(c, "work was queued on the null stream during the capture");
                hit = true;
            }
        }
        if hit {
            return Err(Fail::new(
                hipError_t::hipErrorStreamCaptureImplicit,
                format!(
                    "work on the null stream of device {device} while a blocking stream of it \
                     captures (it would have to wait for the captured work): use the capturing \
                     stream or a non-blocking one; the capture is invalidated"
                ),
            ));
        }
        return Ok(Some(node));
    }
    match t.captures.get_mut(&stream) {
        Some(c) => {
            c.nodes.push(node);
            Ok(None)
        }
        None => Ok(Some(node)),
    }
}

/// Capture `node` on `stream` of `device`, or queue it there now. `Ok(true)`: captured.
pub fn submit(device: i32, stream: u64, node: Node) -> Res<bool> {
    match try_capture(device, stream, node)? {
        None => Ok(true),
        Some(node) => queue(device, stream, &node).map(|()| false),
    }
}

/// True while `stream` captures.
pub fn is_capturing(stream: u64) -> bool {
    tables().captures.contains_key(&stream)
}

/// Refuse a call that would wait for a capturing stream: `stream` (that stream), or `None` (any
/// capturing stream of `device`; with `device` None, of any device). Invalidates the captures it
/// hits.
pub fn refuse_wait(device: Option<i32>, stream: Option<u64>, what: &str) -> Res {
    let mut t = tables();
    if t.captures.is_empty() {
        return Ok(());
    }
    let mut hit = false;
    for (&id, c) in t.captures.iter_mut() {
        let matches = match (stream, device) {
            // Legacy null-stream semantics: it waits for the blocking streams of its device.
            (Some(NULL_STREAM), Some(d)) => c.device == d && c.blocking,
            (Some(s), _) => s == id,
            (None, Some(d)) => c.device == d,
            (None, None) => true,
        };
        if matches {
            invalidate(c, &format!("{what} was called during the capture"));
            hit = true;
        }
    }
    if hit {
        return Err(Fail::new(
            hipError_t::hipErrorStreamCaptureUnsupported,
            format!(
                "{what} would wait for a stream that is capturing (its work has not run and will \
                 not until the graph is launched): end the capture first; the capture is \
                 invalidated"
            ),
        ));
    }
    Ok(())
}

/// `hipEventRecord` on `stream`: `Ok(true)` when captured (a record node).
pub fn capture_record(stream: u64, event: hipEvent_t, state: &Arc<EventState>) -> Res<bool> {
    let mut t = tables();
    let Some(c) = t.captures.get_mut(&stream) else {
        return Ok(false);
    };
    c.events.push(event as usize);
    c.nodes.push(Node {
        label: "event record".into(),
        kind: Kind::Record,
        step: Step::Record(state.clone()),
        check: None,
        counts: Vec::new(),
    });
    Ok(true)
}

/// `hipStreamWaitEvent` on `stream`: `Ok(true)` when the stream captures and the event was
/// recorded inside the same capture (nothing to add: the capture is one stream, in order).
pub fn capture_wait(stream: u64, event: hipEvent_t) -> Res<bool> {
    let mut t = tables();
    let Some(c) = t.captures.get_mut(&stream) else {
        return Ok(false);
    };
    if c.events.contains(&(event as usize)) {
        return Ok(true);
    }
    invalidate(c, "a wait on an event recorded outside the capture");
    Err(Fail::new(
        hipError_t::hipErrorStreamCaptureIsolation,
        format!(
            "hipStreamWaitEvent: event {event:p} was not recorded inside this capture; hip-emu \
             captures one stream, so a graph cannot depend on outside work: wait before \
             hipStreamBeginCapture; the capture is invalidated"
        ),
    ))
}

/// Queue `node` on `stream` of `device` now (not captured).
fn queue(device: i32, stream: u64, node: &Node) -> Res {
    let dev = runtime()?.device(device)?;
    match &node.step {
        Step::Run(work) => {
            let work = work.clone();
            dev.executor
                .enqueue(stream, node.label.clone(), Box::new(move || work()))
                .map(|_| ())
        }
        Step::Record(state) => dev.executor.record(stream, state),
    }
}

fn graph_of(t: &Tables, graph: hipGraph_t) -> Res<&GraphData> {
    t.graphs
        .get(&(graph as usize))
        .ok_or_else(|| Fail::handle(format!("graph {graph:p} is not a live graph of hip-emu")))
}

fn exec_of(t: &Tables, exec: hipGraphExec_t) -> Res<&GraphData> {
    t.execs.get(&(exec as usize)).ok_or_else(|| {
        Fail::handle(format!(
            "executable graph {exec:p} is not a live executable graph of hip-emu"
        ))
    })
}

/// Why `new` cannot replace `old` in an update, if it cannot.
fn update_verdict(old: &[Node], new: &[Node]) -> Option<(hipGraphExecUpdateResult, String)> {
    if old.len() != new.len() {
        return Some((
            hipGraphExecUpdateResult::hipGraphExecUpdateErrorTopologyChanged,
            format!(
                "the graph has {} nodes, the executable {}",
                new.len(),
                old.len()
            ),
        ));
    }
    for (i, (a, b)) in old.iter().zip(new).enumerate() {
        if a.kind != b.kind {
            let result = match (&a.kind, &b.kind) {
                (Kind::Kernel(_), Kind::Kernel(_)) => {
                    hipGraphExecUpdateResult::hipGraphExecUpdateErrorFunctionChanged
                }
                _ => hipGraphExecUpdateResult::hipGraphExecUpdateErrorNodeTypeChanged,
            };
            return Some((
                result,
                format!("node {i} was {} and is now {}", a.label, b.label),
            ));
        }
    }
    None
}

hip_exports! {
    /// Starts capturing `stream` (not the null stream). Every mode behaves as
    /// hipStreamCaptureModeGlobal does for the calls hip-emu refuses (see the module docs).
    fn hipStreamBeginCapture(stream: hipStream_t, mode: hipStreamCaptureMode) {
        let rt = runtime()?;
        let (dev, info) = rt.stream(stream)?;
        if !(0..=2).contains(&mode.0) {
            return Err(Fail::invalid(format!(
                "hipStreamBeginCapture: mode {} is not a hipStreamCaptureMode (0, 1 or 2)",
                mode.0
            )));
        }
        if stream.is_null() {
            return Err(Fail::new(
                hipError_t::hipErrorStreamCaptureUnsupported,
                "hipStreamBeginCapture: the null stream cannot be captured; capture a stream \
                 created with hipStreamCreate",
            ));
        }
        let mut t = tables();
        if t.captures.contains_key(&info.id) {
            return Err(Fail::new(
                hipError_t::hipErrorIllegalState,
                format!("hipStreamBeginCapture: stream {stream:p} is already capturing"),
            ));
        }
        t.captures.insert(info.id, Capture {
            device: dev.ordinal,
            blocking: info.flags & hipStreamNonBlocking == 0,
            nodes: Vec::new(),
            invalid: None,
            events: Vec::new(),
        });
        Ok(())
    }

    /// Ends the capture and returns its graph (hipErrorStreamCaptureInvalidated, and no graph,
    /// when a refused call invalidated it).
    fn hipStreamEndCapture(stream: hipStream_t, graph: *mut hipGraph_t) {
        let (_, info) = runtime()?.stream(stream)?;
        let mut t = tables();
        let Some(c) = t.captures.remove(&info.id) else {
            return Err(Fail::new(
                hipError_t::hipErrorIllegalState,
                format!("hipStreamEndCapture: stream {stream:p} is not capturing"),
            ));
        };
        if let Some(why) = c.invalid {
            return Err(Fail::new(
                hipError_t::hipErrorStreamCaptureInvalidated,
                format!("hipStreamEndCapture: the capture was invalidated: {why}"),
            ));
        }
        if graph.is_null() {
            return Err(Fail::invalid("hipStreamEndCapture: the graph out-pointer is null"));
        }
        let handle = super::new_handle();
        t.graphs.insert(handle, GraphData { device: c.device, nodes: Arc::new(c.nodes) });
        // SAFETY: out-parameter per the C API contract (checked non-null above).
        unsafe { out(graph, handle as hipGraph_t, "pGraph") }
    }

    fn hipStreamIsCapturing(stream: hipStream_t, status: *mut hipStreamCaptureStatus) {
        let (_, info) = runtime()?.stream(stream)?;
        let s = match tables().captures.get(&info.id) {
            None => hipStreamCaptureStatus::hipStreamCaptureStatusNone,
            Some(c) if c.invalid.is_some() => hipStreamCaptureStatus::hipStreamCaptureStatusInvalidated,
            Some(_) => hipStreamCaptureStatus::hipStreamCaptureStatusActive,
        };
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(status, s, "pCaptureStatus") }
    }

    fn hipGraphDestroy(graph: hipGraph_t) {
        runtime()?;
        tables().graphs.remove(&(graph as usize)).map(|_| ()).ok_or_else(|| {
            Fail::handle(format!("hipGraphDestroy: graph {graph:p} is not a live graph of hip-emu"))
        })
    }

    /// With `nodes` null, writes the node count; hip-emu hands out no node handles.
    fn hipGraphGetNodes(graph: hipGraph_t, nodes: *mut hipGraphNode_t, count: *mut usize) {
        runtime()?;
        let n = graph_of(&tables(), graph)?.nodes.len();
        if !nodes.is_null() {
            return Err(Fail::new(
                hipError_t::hipErrorNotSupported,
                "hipGraphGetNodes: hip-emu returns the node count only (pass nodes = null)",
            ));
        }
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(count, n, "numNodes") }
    }

    fn hipGraphInstantiate(
        exec: *mut hipGraphExec_t,
        graph: hipGraph_t,
        error_node: *mut hipGraphNode_t,
        log: *mut c_char,
        log_size: usize,
    ) {
        runtime()?;
        let _ = (error_node, log, log_size);
        let mut t = tables();
        let g = graph_of(&t, graph)?;
        let data = GraphData { device: g.device, nodes: g.nodes.clone() };
        if exec.is_null() {
            return Err(Fail::invalid("hipGraphInstantiate: the pGraphExec out-pointer is null"));
        }
        let handle = super::new_handle();
        t.execs.insert(handle, data);
        // SAFETY: out-parameter per the C API contract (checked non-null above).
        unsafe { out(exec, handle as hipGraphExec_t, "pGraphExec") }
    }

    /// Checks every node (pointers still live), then queues them all on `stream` in capture
    /// order. Launched on a capturing stream, the nodes join that capture.
    fn hipGraphLaunch(exec: hipGraphExec_t, stream: hipStream_t) {
        let rt = runtime()?;
        let (dev, info) = rt.stream(stream)?;
        let (device, nodes) = {
            let t = tables();
            let e = exec_of(&t, exec)?;
            (e.device, e.nodes.clone())
        };
        if device != dev.ordinal {
            return Err(Fail::invalid(format!(
                "hipGraphLaunch: the graph was captured on device {device} but the stream is on \
                 device {}",
                dev.ordinal
            )));
        }
        for (i, n) in nodes.iter().enumerate() {
            if let Some(check) = &n.check {
                check().map_err(|f| Fail::new(f.code, format!(
                    "hipGraphLaunch: node {i} ({}): {}", n.label, f.message
                )))?;
            }
        }
        let mut captured = false;
        for n in nodes.iter() {
            captured |= submit(device, info.id, n.clone())?;
        }
        if !captured {
            stats::bump(Counter::GraphLaunches);
            stats::add(Counter::GraphNodes, nodes.len() as u64);
            for n in nodes.iter() {
                for &(c, k) in &n.counts {
                    stats::add(c, k);
                }
            }
        }
        Ok(())
    }

    fn hipGraphExecDestroy(exec: hipGraphExec_t) {
        runtime()?;
        tables().execs.remove(&(exec as usize)).map(|_| ()).ok_or_else(|| {
            Fail::handle(format!(
                "hipGraphExecDestroy: {exec:p} is not a live executable graph of hip-emu"
            ))
        })
    }

    /// Replaces the executable's nodes with `graph`'s when they have the same kinds in the same
    /// order (kernels: the same functions), so new kernel arguments, copy sizes and addresses
    /// take effect; otherwise hipErrorGraphExecUpdateFailure with the reason in `result`.
    fn hipGraphExecUpdate(
        exec: hipGraphExec_t,
        graph: hipGraph_t,
        error_node: *mut hipGraphNode_t,
        result: *mut hipGraphExecUpdateResult,
    ) {
        runtime()?;
        let mut t = tables();
        let new = graph_of(&t, graph)?.nodes.clone();
        let e = exec_of(&t, exec)?;
        let verdict = update_verdict(&e.nodes, &new);
        if !error_node.is_null() {
            // SAFETY: non-null out-parameter per the C API contract.
            unsafe { error_node.write(std::ptr::null_mut()) };
        }
        let code = verdict.as_ref().map_or(hipGraphExecUpdateResult::hipGraphExecUpdateSuccess, |v| v.0);
        // SAFETY: out-parameter per the C API contract.
        unsafe { out(result, code, "updateResult_out") }?;
        if let Some((_, why)) = verdict {
            return Err(Fail::new(
                hipError_t::hipErrorGraphExecUpdateFailure,
                format!("hipGraphExecUpdate: {why}; instantiate the new graph instead"),
            ));
        }
        if let Some(e) = t.execs.get_mut(&(exec as usize)) {
            e.nodes = new;
        }
        Ok(())
    }
}
