//! HIP graphs: capture a stream's work once, launch it again and again with one call.
//!
//! ```no_run
//! # fn main() -> hip_rt::Result<()> {
//! use hip_rt::{CaptureMode, Device, DeviceBuffer, Stream, StreamOptions};
//! let device = Device::get(0)?;
//! let stream = Stream::new(&device, StreamOptions::default())?;
//! let mut buf: DeviceBuffer<f32> = DeviceBuffer::alloc(&stream, 1024)?;
//! stream.begin_capture(CaptureMode::Global)?;
//! stream.memset_zero(&mut buf)?; // captured, not run
//! let graph = stream.end_capture()?;
//! let exec = graph.instantiate()?;
//! for _ in 0..10 {
//!     // SAFETY: `buf`, the only memory the graph touches, outlives every launch.
//!     unsafe { exec.launch(&stream) }?;
//! }
//! stream.synchronize()?;
//! # Ok(()) }
//! ```
//!
//! - [`Stream::begin_capture`] / [`Stream::end_capture`] (`hipStreamBeginCapture` /
//!   `hipStreamEndCapture`): the work queued on the stream in between (kernels, BLAS calls,
//!   asynchronous copies and memsets) is recorded, not run. A call that would wait for it
//!   (synchronising the stream or the device, a synchronous copy) fails and invalidates the
//!   capture; `end_capture` then fails too.
//! - [`Graph::instantiate`] gives a [`GraphExec`]; [`GraphExec::launch`] queues the whole graph
//!   on a stream; [`GraphExec::update`] (`hipGraphExecUpdate`) swaps in the kernel arguments,
//!   addresses and sizes of a newly captured graph of the same shape, without re-instantiating.
//! - Memory: with the device's caching allocator (the default), the capturing stream's requests
//!   come from a private pool of the graph's own, where a buffer freed during the capture is
//!   reused by the capture's later requests (stream-ordered, as in eager mode: the pool is the
//!   capture's eager peak); any other buffer freed during the capture (allocated before it, or
//!   used on another stream) is held for the graph. The pool and the held buffers return to the
//!   cache when the graph and every `GraphExec` made from it are dropped
//!   ([`crate::caching::GraphPool`], [`Graph::memory_bytes`]). With the direct allocator a free
//!   during a capture is `hipFree`, which waits for the device: it fails and invalidates the
//!   capture.
//! - A HIP without graphs: every call here is `Err(Error::Sys(MissingSymbol))` naming the entry
//!   point ([`supported`] asks first); fall back to eager launches.
//!
//! What has run where: on hip-emu (the CPU-emulated device: capture, replay with the same checks
//! as eager work, counters) in the device tests; never on a GPU.

use std::sync::{Arc, Mutex};

use hip_sys::generated::{
    hipGraphExecUpdateResult, hipGraphExec_t, hipGraph_t, hipStreamCaptureMode,
    hipStreamCaptureStatus,
};

use crate::caching::{GraphPool, HipBackend};
use crate::device::Device;
use crate::error::Result;
use crate::result;
use crate::stream::Stream;

/// How a capture treats potentially unsafe calls from other threads (`hipStreamCaptureMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CaptureMode {
    /// Unsafe calls from any thread are refused during the capture.
    #[default]
    Global,
    /// Only this thread's unsafe calls are refused.
    ThreadLocal,
    /// Nothing is refused on account of the capture.
    Relaxed,
}

impl CaptureMode {
    fn raw(self) -> hipStreamCaptureMode {
        match self {
            CaptureMode::Global => hipStreamCaptureMode::hipStreamCaptureModeGlobal,
            CaptureMode::ThreadLocal => hipStreamCaptureMode::hipStreamCaptureModeThreadLocal,
            CaptureMode::Relaxed => hipStreamCaptureMode::hipStreamCaptureModeRelaxed,
        }
    }
}

/// Whether a stream is capturing (`hipStreamCaptureStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureStatus {
    /// Not capturing.
    None,
    /// Capturing.
    Active,
    /// Capturing, but a refused call invalidated the capture: `end_capture` will fail.
    Invalidated,
}

/// True when the loaded HIP runtime exports every graph entry point hip-rt uses (loads the
/// runtime if needed; false when none loads).
pub fn supported() -> bool {
    let Ok(hip) = hip_sys::hip() else {
        return false;
    };
    let api = hip.api();
    api.hipStreamBeginCapture.is_ok()
        && api.hipStreamEndCapture.is_ok()
        && api.hipStreamIsCapturing.is_ok()
        && api.hipGraphInstantiate.is_ok()
        && api.hipGraphLaunch.is_ok()
        && api.hipGraphExecDestroy.is_ok()
        && api.hipGraphDestroy.is_ok()
}

/// The held blocks of a capture, shared by its graph and every executable made from it.
type SharedPool = Arc<Mutex<Option<GraphPool<HipBackend>>>>;

impl Stream {
    /// Starts capturing this stream's work into a graph (`hipStreamBeginCapture`). Not on the
    /// null stream. Tells the device's caching allocator to hold frees for the graph.
    pub fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        self.device().bind_to_thread()?;
        if let Some(cache) = self.device().allocator().caching() {
            cache
                .begin_capture(self.id())
                .map_err(|e| crate::caching::hip::to_rt_error(e, self.device().ordinal()))?;
        }
        // SAFETY: `raw` is the live stream this value owns (HIP refuses the null stream).
        let began = unsafe { result::graph::begin_capture(self.raw(), mode.raw()) };
        if let Err(e) = began {
            if let Some(cache) = self.device().allocator().caching() {
                drop(cache.end_capture());
            }
            return Err(e.into());
        }
        Ok(())
    }

    /// Ends the capture and returns its graph (`hipStreamEndCapture`). Fails when the capture
    /// was invalidated (the error names why); the allocator stops holding frees either way.
    pub fn end_capture(&self) -> Result<Graph> {
        // SAFETY: `raw` is the live stream this value owns.
        let ended = unsafe { result::graph::end_capture(self.raw()) };
        let pool = self
            .device()
            .allocator()
            .caching()
            .map(|cache| cache.end_capture());
        let raw = ended?;
        Ok(Graph {
            raw,
            device: self.device().clone(),
            pool: Arc::new(Mutex::new(pool)),
        })
    }

    /// Captures what `work` queues on this stream: [`Stream::begin_capture`], `work`, then
    /// [`Stream::end_capture`] (also when `work` fails, whose error is returned then).
    pub fn capture(
        &self,
        mode: CaptureMode,
        work: impl FnOnce(&Stream) -> Result<()>,
    ) -> Result<Graph> {
        self.begin_capture(mode)?;
        let done = work(self);
        let graph = self.end_capture();
        done?;
        graph
    }

    /// Whether this stream is capturing (`hipStreamIsCapturing`).
    pub fn capture_status(&self) -> Result<CaptureStatus> {
        // SAFETY: `raw` is null or the live stream this value owns.
        let s = unsafe { result::graph::is_capturing(self.raw()) }?;
        Ok(match s {
            hipStreamCaptureStatus::hipStreamCaptureStatusActive => CaptureStatus::Active,
            hipStreamCaptureStatus::hipStreamCaptureStatusInvalidated => CaptureStatus::Invalidated,
            _ => CaptureStatus::None,
        })
    }
}

/// A captured graph (`hipGraph_t`), destroyed on drop.
pub struct Graph {
    raw: hipGraph_t,
    device: Device,
    pool: SharedPool,
}

// SAFETY: a hipGraph_t is a runtime handle usable from any thread; hip-rt never mutates the
// graph after capture (instantiate and get-nodes only read it).
unsafe impl Send for Graph {}
// SAFETY: as above; every method takes `&self` and only passes the handle to HIP.
unsafe impl Sync for Graph {}

impl Graph {
    /// The device the graph was captured on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The number of nodes (`hipGraphGetNodes`): one per captured kernel, copy, memset, BLAS
    /// call or event record.
    pub fn node_count(&self) -> Result<usize> {
        // SAFETY: `raw` is the live graph this value owns.
        Ok(unsafe { result::graph::graph_node_count(self.raw) }?)
    }

    /// The device memory the graph keeps for its replays: its private pool's segments plus the
    /// blocks held for it ([`crate::caching::GraphPool::bytes`]); 0 without the caching
    /// allocator.
    pub fn memory_bytes(&self) -> usize {
        let guard = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().map_or(0, |p| p.bytes())
    }

    /// An executable graph (`hipGraphInstantiate`); it keeps the capture's held blocks alive too.
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.device.bind_to_thread()?;
        // SAFETY: `raw` is the live graph this value owns.
        let raw = unsafe { result::graph::instantiate(self.raw) }?;
        Ok(GraphExec {
            raw,
            device: self.device.clone(),
            pools: vec![self.pool.clone()],
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: `raw` is the graph this value owns, destroyed once, here.
        let r = unsafe { result::graph::graph_destroy(self.raw) };
        self.device.record_drop_error(r.map_err(Into::into));
    }
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Graph({:?} on device {})",
            self.raw,
            self.device.ordinal()
        )
    }
}

/// Why [`GraphExec::update`] kept the old graph (`hipGraphExecUpdateResult`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateRefused {
    /// The node count or the edges differ.
    TopologyChanged,
    /// A node's type differs.
    NodeTypeChanged,
    /// A kernel node runs another kernel.
    FunctionChanged,
    /// Parameters changed in a way the runtime cannot update.
    ParametersChanged,
    /// Something about a node is not supported for update.
    NotSupported,
    /// Another reason (the runtime's raw result code).
    Other(i32),
}

/// An executable graph (`hipGraphExec_t`), destroyed on drop.
pub struct GraphExec {
    raw: hipGraphExec_t,
    device: Device,
    /// The held blocks of the graphs it was made from or updated with.
    pools: Vec<SharedPool>,
}

// SAFETY: a hipGraphExec_t is a runtime handle usable from any thread; `update` takes `&mut`.
unsafe impl Send for GraphExec {}
// SAFETY: `launch` only passes the handle to HIP, which allows concurrent launches.
unsafe impl Sync for GraphExec {}

impl GraphExec {
    /// Queues the whole graph on `stream` (`hipGraphLaunch`): one call, whatever it holds. No
    /// host wait.
    ///
    /// # Safety
    /// Every buffer the captured work reads or writes must still be allocated (buffers freed
    /// during the capture are: the graph holds them), and the captured kernels' own contract
    /// must hold for their arguments as captured, as for the `unsafe` launches that were
    /// captured.
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        stream.check_same_device("graph", &self.device)?;
        for pool in &self.pools {
            let mut guard = pool.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(p) = guard.as_mut() {
                p.record_stream(stream.id())
                    .map_err(|e| crate::caching::hip::to_rt_error(e, self.device.ordinal()))?;
            }
        }
        // SAFETY: `raw` is live; `stream` is live and on the graph's device (checked); the
        // caller guarantees the graph's memory.
        Ok(unsafe { result::graph::launch(self.raw, stream.raw()) }?)
    }

    /// Takes `graph`'s kernel arguments, addresses and sizes (`hipGraphExecUpdate`) when it has
    /// the same nodes (kinds, kernels, order); `Ok(Err(reason))` when the runtime refused, and
    /// this executable is unchanged (instantiate `graph` instead).
    pub fn update(&mut self, graph: &Graph) -> Result<std::result::Result<(), UpdateRefused>> {
        // SAFETY: both handles are live (owned by `self` and `graph`).
        let verdict = unsafe { result::graph::exec_update(self.raw, graph.raw) }?;
        use hipGraphExecUpdateResult as R;
        let refused = match verdict {
            R::hipGraphExecUpdateSuccess => {
                if !self.pools.iter().any(|p| Arc::ptr_eq(p, &graph.pool)) {
                    self.pools.push(graph.pool.clone());
                }
                return Ok(Ok(()));
            }
            R::hipGraphExecUpdateErrorTopologyChanged => UpdateRefused::TopologyChanged,
            R::hipGraphExecUpdateErrorNodeTypeChanged => UpdateRefused::NodeTypeChanged,
            R::hipGraphExecUpdateErrorFunctionChanged => UpdateRefused::FunctionChanged,
            R::hipGraphExecUpdateErrorParametersChanged => UpdateRefused::ParametersChanged,
            R::hipGraphExecUpdateErrorNotSupported => UpdateRefused::NotSupported,
            other => UpdateRefused::Other(other.0 as i32),
        };
        Ok(Err(refused))
    }

    /// The device the graph runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: `raw` is the executable this value owns, destroyed once, here.
        let r = unsafe { result::graph::exec_destroy(self.raw) };
        self.device.record_drop_error(r.map_err(Into::into));
    }
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GraphExec({:?} on device {})",
            self.raw,
            self.device.ordinal()
        )
    }
}
