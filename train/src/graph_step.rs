//! `--graph`: the steady training step captured once as a HIP graph and replayed.
//!
//! The first step of a run is eager (it loads the kernels and warms the caching allocator). The
//! next one is captured: forward, backward, gradient norm and AdamW, recorded on the backend's
//! stream (`hip_rt::Stream::begin_capture`) and launched as one graph; every later step is a
//! replay. What changes from step to step never sits in the graph's kernel arguments:
//!
//! - token ids (and LLaMA's positions) go to fixed device buffers, one per `Backend::ids` call
//!   of the step in call order, copied in before the launch, outside the graph;
//! - the learning rate, AdamW's bias corrections (step count) and the loss scale that unscales
//!   the gradients are read by the optimizer's kernels from device-side tables
//!   (`hip_kernels::ops::OptimizerTables`) and a one-float buffer, uploaded before the launch,
//!   outside the graph ([`Phase::Upload`]: the model's `grad_norm` and `update` run with the
//!   backend uploading and launching nothing);
//! - the step's losses, norm and token-id flags land in buffers the graph keeps, read after the
//!   launch by the step's one host wait, as in eager mode.
//!
//! What is a kernel argument of the backward and so part of the graph: the loss scale the loss
//! gradient is multiplied by (f16) and the step's loss divisor (LLaMA: its counted targets).
//! When either changes (the f16 scaler doubles or halves the scale; a step counts another
//! number of targets) the step is captured again ([`Key`]).
//!
//! On by default on a device (`--no-graph` turns it off). Memory: the caching allocator serves the
//! capture from a private pool in which a temporary freed during the step is reused by the
//! step's later requests, as in an eager step (`hip_rt::caching::GraphPool`), so the captured
//! step's peak is the eager one and `--memory-estimate` holds in graph mode too; the pool stays
//! reserved for the replays (its free blocks are not counted as allocated, as PyTorch counts a
//! graph's private pool).
//! Off (eager steps, one line says why, on the CPU only when `--graph` asked): on the CPU, with
//! several ranks (the collectives are not captured), with SFT data (packed rows change their
//! `cu_seqlens` length every step), with `--offload-optimizer cpu` (the update runs on the host),
//! and when the HIP runtime has no graphs or a capture fails. Losses are bit-identical to eager
//! steps: the same kernels run on the same buffers with the same arguments.

use crate::backend::{Backend, TrainElement};
use crate::cli::Args;
use crate::error::Result;

/// What the backend's graph-aware calls do ([`Backend::graph_phase`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Phase {
    /// Ordinary eager launches.
    #[default]
    Eager,
    /// Before a launch, outside the graph: token ids are copied into the captured step's fixed
    /// buffers; the optimizer's tables and the loss scale are uploaded; no kernel is queued.
    Upload,
    /// Inside the capture: token ids go to the fixed buffers with their copies deferred until
    /// the capture has ended; the optimizer launches from the uploaded tables.
    Capture,
}

/// What a step's graph depends on beyond its buffers: the loss scale (bits of the f64) and the
/// loss divisor the backward takes as kernel arguments.
pub type Key = (u64, u64);

/// How one step runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Launch by launch.
    Eager,
    /// Upload, capture, then launch the new graph.
    Capture,
    /// Upload, then launch the graph captured before.
    Replay,
}

/// The step driver's graph state.
#[derive(Debug)]
pub(crate) struct GraphStep {
    on: bool,
    /// The key of the graph the backend holds.
    captured: Option<Key>,
    /// Steps run in this process (the first is always eager).
    steps: u64,
}

impl GraphStep {
    /// On unless `--no-graph`, when the backend and run allow it, else one line says why (on
    /// the CPU only when `--graph` asked). `refusal`: why the loop cannot (SFT data).
    pub(crate) fn new<T: TrainElement, B: Backend<T>>(
        backend: &B,
        args: &Args,
        world: usize,
        refusal: Option<&str>,
    ) -> Self {
        let wanted = !args.no_graph;
        let offload = args.offload_optimizer.is_some();
        let why_not = match (wanted, world, refusal, offload, backend.graph_capable()) {
            (false, ..) => None,
            (_, w, ..) if w > 1 => Some(format!(
                "{w} ranks (the collectives of data parallelism are not captured)"
            )),
            (_, _, Some(r), ..) => Some(r.to_string()),
            (_, _, _, true, _) => {
                Some("--offload-optimizer cpu: the optimizer steps on the host".to_string())
            }
            (.., Err(e)) => Some(e),
            _ => None,
        };
        let on = wanted && why_not.is_none();
        // A graph an earlier run on this backend left points at that run's model: never launched
        // again.
        backend.graph_reset();
        let say = args.graph || backend.memory().is_some();
        if let (true, Some(w), true) = (say, &why_not, world <= 1 || backend.rank() == 0) {
            println!("graph: off, eager steps ({w})");
        }
        GraphStep {
            on,
            captured: None,
            steps: 0,
        }
    }

    /// The plan of the next step, whose graph would have `key`. A capture drops the backend's
    /// old graph first.
    pub(crate) fn plan<T: TrainElement, B: Backend<T>>(&mut self, backend: &B, key: Key) -> Plan {
        self.steps += 1;
        if !self.on || self.steps == 1 {
            return Plan::Eager;
        }
        if self.captured == Some(key) {
            return Plan::Replay;
        }
        if self.captured.take().is_some() {
            backend.graph_reset();
        }
        Plan::Capture
    }

    /// The capture of `key` succeeded.
    pub(crate) fn captured(&mut self, key: Key) {
        self.captured = Some(key);
    }

    /// Runs one step whose graph would have `key`, eagerly or as a graph, and returns the
    /// scalars to read it from: `work(phase, scalars)` queues the whole step ([`Phase::Eager`],
    /// [`Phase::Capture`]) or, with [`Phase::Upload`], only what a graph reads from outside it:
    /// the step's token ids (the same `ids` calls in the same order as the step makes), then the
    /// model's `grad_norm` and `update` (which then upload their tables and launch nothing).
    /// `kept` holds the captured step's scalars for as long as its graph lives; `fresh` an eager
    /// step's. A capture that fails falls back to an eager step (one line, see
    /// [`GraphStep::failed`]).
    pub(crate) fn step<'k, T: TrainElement, B: Backend<T>>(
        &mut self,
        backend: &B,
        key: Key,
        kept: &'k mut Option<B::Scalars>,
        fresh: &'k mut Option<B::Scalars>,
        mut work: impl FnMut(Phase, &mut B::Scalars) -> Result<()>,
    ) -> Result<&'k B::Scalars> {
        let plan = self.plan(backend, key);
        if plan == Plan::Capture {
            *kept = None;
            let mut sc = backend.scalars()?;
            match self.capture(backend, &mut sc, &mut work) {
                Ok(()) => {
                    self.captured(key);
                    backend.graph_launch()?;
                    return Ok(kept.insert(sc));
                }
                Err(e) => self.failed(backend, &e),
            }
        }
        if let (Plan::Replay, Some(sc)) = (plan, kept.as_mut()) {
            backend.graph_phase(Phase::Upload);
            let up = work(Phase::Upload, sc);
            backend.graph_phase(Phase::Eager);
            up?;
            backend.graph_launch()?;
            return Ok(sc);
        }
        let mut sc = backend.scalars()?;
        work(Phase::Eager, &mut sc)?;
        Ok(fresh.insert(sc))
    }

    /// The upload pass, then the step captured into the backend's graph.
    fn capture<T: TrainElement, B: Backend<T>>(
        &mut self,
        backend: &B,
        sc: &mut B::Scalars,
        work: &mut impl FnMut(Phase, &mut B::Scalars) -> Result<()>,
    ) -> Result<()> {
        backend.graph_phase(Phase::Upload);
        let up = work(Phase::Upload, sc);
        backend.graph_phase(Phase::Eager);
        up?;
        backend.graph_begin()?;
        let body = backend
            .clear_scalars(sc)
            .and_then(|()| work(Phase::Capture, sc));
        let end = backend.graph_end();
        if body.is_err() {
            backend.graph_reset();
        }
        body.and(end)
    }

    /// A capture (or a launch) failed: one line, and eager steps from now on.
    pub(crate) fn failed<T: TrainElement, B: Backend<T>>(
        &mut self,
        backend: &B,
        e: &dyn std::fmt::Display,
    ) {
        println!("graph: off from now on, eager steps (the capture failed: {e})");
        self.on = false;
        self.captured = None;
        backend.graph_phase(Phase::Eager);
        backend.graph_reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu_backend::Cpu;
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        let mut v = vec!["train_gpt2", "--model", "m", "--data", "d"];
        v.extend_from_slice(extra);
        Args::try_parse_from(v).unwrap()
    }

    #[test]
    fn graphs_are_on_unless_refused() {
        let wanted = |extra: &[&str]| !args(extra).no_graph;
        assert!(wanted(&[]) && wanted(&["--graph"]) && !wanted(&["--no-graph"]));
        // The CPU backend refuses, quietly unless --graph asked.
        assert!(!GraphStep::new::<f32, _>(&Cpu, &args(&[]), 1, None).on);
    }

    #[test]
    fn the_cpu_runs_eager_steps() {
        let mut g = GraphStep::new::<f32, _>(&Cpu, &args(&["--graph"]), 1, None);
        assert!(!g.on);
        assert_eq!(g.plan::<f32, _>(&Cpu, (0, 0)), Plan::Eager);
        assert_eq!(g.plan::<f32, _>(&Cpu, (0, 0)), Plan::Eager);
    }

    #[test]
    fn plans_capture_once_per_key_after_the_first_step() {
        let mut g = GraphStep {
            on: true,
            captured: None,
            steps: 0,
        };
        assert_eq!(g.plan::<f32, _>(&Cpu, (1, 1)), Plan::Eager);
        assert_eq!(g.plan::<f32, _>(&Cpu, (1, 1)), Plan::Capture);
        g.captured((1, 1));
        assert_eq!(g.plan::<f32, _>(&Cpu, (1, 1)), Plan::Replay);
        assert_eq!(g.plan::<f32, _>(&Cpu, (2, 1)), Plan::Capture, "a new scale");
        g.failed::<f32, _>(&Cpu, &"test");
        assert_eq!(g.plan::<f32, _>(&Cpu, (2, 1)), Plan::Eager);
    }
}
