//! `--graph` on hip-emu: the steady step as one graph launch plus its data copies (hip-emu's
//! counters, what a profiler would count on a GPU), and losses bit-identical to eager steps for
//! the tiny GPT-2 (f32 with 2 micro-batches and clipping; f32 LoRA; f16 with dynamic loss
//! scaling, whose scale changes make the step be captured again) and LLaMA (f32, f16).

use super::llama_train::variant_args;
use super::{run_tiny, strs, variant_flags};
use crate::train::StepLog;
use hip_kernels::hip_rt::emu::{self, EmuStats, StatsScope};

/// The tiny GPT-2's base variant (`--batch 4 --seq 16`) with `extra` flags.
fn tiny(extra: &[String]) -> Vec<StepLog> {
    let mut f = variant_flags("base");
    f.extend(extra.iter().cloned());
    run_tiny(&f).unwrap()
}

/// One step's figures as bits: step, loss, gradient norm, learning rate, (loss scale, skipped).
type Bits = (u64, u64, u64, u64, Option<(u64, bool)>);

/// What must agree bit for bit between a graph run and an eager run.
fn figures(logs: &[StepLog]) -> Vec<Bits> {
    logs.iter()
        .map(|l| {
            (
                l.step,
                l.loss.to_bits(),
                l.grad_norm.to_bits(),
                l.lr.to_bits(),
                l.scaler.map(|(s, k)| (s.to_bits(), k)),
            )
        })
        .collect()
}

/// `--graph` and `--no-graph` runs of `run(flags)`, compared; returns the graph run's steps.
fn same_as_eager(
    what: &str,
    run: impl Fn(&[String]) -> Vec<StepLog>,
    flags: &[&str],
) -> Vec<StepLog> {
    let with = |mode: &str| {
        let mut f = strs(flags);
        f.push(mode.into());
        run(&f)
    };
    let (graph, eager) = (with("--graph"), with("--no-graph"));
    assert!(!graph.is_empty());
    assert_eq!(
        figures(&graph),
        figures(&eager),
        "{what}: graph steps differ from eager ones"
    );
    graph
}

#[test]
fn gpt2_graph_steps_are_bit_identical_to_eager() {
    let run = |f: &[String]| tiny(f);
    same_as_eager(
        "gpt2 f32, 2 micro-batches, clipped",
        run,
        &[
            "--device",
            "0",
            "--steps",
            "3",
            "--grad-accum",
            "2",
            "--grad-clip",
            "1.0",
        ],
    );
    same_as_eager(
        "gpt2 f32 LoRA r=4",
        run,
        &[
            "--device",
            "0",
            "--steps",
            "3",
            "--lora-rank",
            "4",
            "--lora-targets",
            "attn.c_attn,mlp.c_fc",
        ],
    );
    // The scale doubles after every 2 clean steps: captured at step 2, again at 3 and 5.
    let f16 = [
        "--device",
        "0",
        "--steps",
        "5",
        "--dtype",
        "f16",
        "--scale-window",
        "2",
    ];
    let logs = same_as_eager("gpt2 f16", run, &f16);
    let scales: Vec<f64> = logs.iter().filter_map(|l| l.scaler.map(|s| s.0)).collect();
    assert!(
        scales.windows(2).any(|w| w[0] != w[1]),
        "the loss scale never changed: {scales:?}"
    );
}

#[test]
fn llama_graph_steps_are_bit_identical_to_eager() {
    let run = |f: &[String]| crate::train::run(&variant_args("llama_base", f)).unwrap();
    for dtype in ["f32", "f16"] {
        same_as_eager(
            &format!("llama {dtype}"),
            run,
            &["--device", "0", "--steps", "3", "--dtype", dtype],
        );
    }
}

/// This thread's counters over `run(4 steps)` minus those over `run(2 steps)`: two steady
/// steps (the setup, the first eager step and the capture are in both). A first run, not
/// counted, does what only a process's first run of a model does (loading its kernels), which
/// would otherwise fall in the short run, or in another test's thread if it got there first.
///
/// Host waits are timing-dependent on top of the `waits` each steady step always makes: a
/// pinned staging buffer's host access waits for its last copy only when that copy still runs
/// (hip-rt's `PinnedHostBuffer`: a non-blocking event query first), which under load adds a wait
/// to either run. Such waits only add, so when the first measurement is off, each run is
/// measured up to twice more and the host waits are the difference of the runs' minima.
fn two_steady_steps(run: impl Fn(&str), waits: u64) -> Option<EmuStats> {
    let count = |steps: &str| {
        let before = emu::stats(StatsScope::Thread)?;
        run(steps);
        Some(emu::stats(StatsScope::Thread)?.since(&before))
    };
    count("2")?;
    let (short, long) = (count("2")?, count("4")?);
    let mut steady = long.since(&short);
    let (mut fewest_short, mut fewest_long) = (short.host_waits, long.host_waits);
    for _ in 0..2 {
        if steady.host_waits == 2 * waits {
            break;
        }
        fewest_short = fewest_short.min(count("2")?.host_waits);
        fewest_long = fewest_long.min(count("4")?.host_waits);
        steady.host_waits = fewest_long.saturating_sub(fewest_short);
    }
    Some(steady)
}

#[test]
fn a_steady_step_is_one_graph_launch_plus_its_copies() {
    let gpt2 = |mode: &'static str| {
        move |steps: &str| {
            tiny(&strs(&["--device", "0", "--steps", steps, mode]));
        }
    };
    let llama = |mode: &'static str| {
        move |steps: &str| {
            crate::train::run(&variant_args(
                "llama_base",
                &strs(&["--device", "0", "--steps", steps, mode]),
            ))
            .unwrap();
        }
    };
    for (what, graph, eager) in [
        (
            "gpt2",
            two_steady_steps(gpt2("--graph"), 1),
            two_steady_steps(gpt2("--no-graph"), 1),
        ),
        (
            "llama",
            two_steady_steps(llama("--graph"), 1),
            two_steady_steps(llama("--no-graph"), 1),
        ),
    ] {
        let (Some(g), Some(e)) = (graph, eager) else {
            // Not hip-emu: no counters.
            return;
        };
        println!("{what}: 2 steady steps, graph {g:?}; eager {e:?}");
        assert_eq!(g.graph_launches, 2, "{what}: one graph launch per step");
        assert_eq!(
            g.launches, 0,
            "{what}: no kernel launched outside the graph"
        );
        assert_eq!(e.graph_launches, 0);
        assert_eq!(
            g.graph_nodes,
            e.launches + e.memsets,
            "{what}: the graph holds every launch and memset of the eager step"
        );
        // The same data copies: token ids and the optimizer's tables in, the step's read out,
        // and its one host wait.
        assert_eq!(g.bytes_htod, e.bytes_htod, "{what}: bytes copied in");
        assert_eq!(g.bytes_dtoh, e.bytes_dtoh, "{what}: bytes copied out");
        // One host wait per steady step, the step's read-back, in either mode (it always
        // waits for the stream: a read that first queried its copies' event waited only when
        // they were still running, 1 or 2 times over these two steps beside other tests). A
        // staging buffer's conditional wait is taken out as `two_steady_steps` says.
        assert_eq!(
            (g.host_waits, e.host_waits),
            (2, 2),
            "{what}: host waits over 2 steps (graph, eager)"
        );
        assert!(
            e.launches >= 2 * 20,
            "{what}: an eager step launches dozens"
        );
    }
}
