//! Data parallelism (docs/TRAIN-GPT2.md, "Several devices"): W ranks, one per device, each
//! running the same training loop on its `--batch` rows of every micro-batch of `W × --batch`
//! rows, with the gradients summed across ranks (each rank's share scaled by 1/W) in buckets on
//! a communication stream as the backward pass produces them.
//!
//! - [`run_devices`]: one process, `--devices 0,1,…`, one thread per rank. A thread per rank
//!   runs exactly the code of one process per rank (each thread owns its backend, streams and
//!   communicator, and RCCL needs no group across devices); one thread driving every device
//!   would have to interleave the W backward passes op by op.
//! - [`run_launched`]: one process per device from torchrun's variables (`RANK`, `WORLD_SIZE`,
//!   `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) or Slurm's (`srun`); rank 0 hands the RCCL
//!   unique id to the others over TCP (`hip_rt::ddp`) once each proved the job's secret and
//!   showed the same settings (flags, model shape, fingerprints of the initial weights and of
//!   the data: the `agree` module).
//!
//! Only rank 0 prints, logs and checkpoints. A rank that fails aborts the communicator (the
//! other threads' with `--devices`; with processes, the liveness watcher of the other ranks
//! sees its connection close), so the others stop at their next wait with an error naming
//! it; a rank killed, stopped or never started ends the others within the communicator's
//! timeout (`HIPK_COMM_TIMEOUT_S`, default 300 s), also naming it.

use crate::cli::{device_list, Args};
use crate::device_backend::DeviceBackend;
use crate::error::{dev, Result, TrainError};
use crate::train::{prepare_for, prepare_shared, run_rank, RankOutcome, Role, StepLog};
use hip_rt::comm::AbortHandle;
use hip_rt::ddp::{LaunchEnv, RendezvousOptions};
use hip_rt::{Comm, Device};
use std::sync::Mutex;

/// Train on the devices `list` in this process, one thread per rank; returns every rank's
/// outcome in rank order (`keep_params`: with its final parameters). The first error of any
/// rank, rank 0's first, is returned, naming its rank.
pub fn run_devices(args: &Args, list: &[usize], keep_params: bool) -> Result<Vec<RankOutcome>> {
    let (model_dir, _) = crate::weights::model_paths(&args.model);
    if let crate::config::ModelConfig::Llama(cfg) =
        crate::config::ModelConfig::load(&model_dir.join("config.json"))?
    {
        let setup = crate::llama::train::prepare(args, cfg, list.len())?;
        return run_threads(args, list, setup, |backend, role, setup| {
            crate::llama::train::train_as(backend, args, setup, role, keep_params)
        });
    }
    let setup = prepare_shared(args, list.len())?;
    run_threads(args, list, setup, |backend, role, setup| {
        run_rank(backend, args, role, Some(setup), keep_params)
    })
}

/// One thread per device of `list`, each running `rank` with its backend, role and a copy of
/// `setup`; every rank's outcome in rank order, or the first error (the rank that failed
/// first, which aborted the others).
fn run_threads<S: Clone + Send>(
    args: &Args,
    list: &[usize],
    setup: S,
    rank_fn: impl Fn(&DeviceBackend, Role, S) -> Result<RankOutcome> + Sync,
) -> Result<Vec<RankOutcome>> {
    let world = list.len();
    let devices = list
        .iter()
        .map(|&n| {
            let ord = i32::try_from(n).map_err(|_| {
                TrainError::Usage(format!(
                    "--devices {}: {n} is not a device index",
                    device_list(list)
                ))
            })?;
            Device::get(ord).map_err(|e| dev(format!("--devices: device {n}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let comms = Comm::init_all(&devices)
        .map_err(|e| dev(format!("--devices {}: {e}", device_list(list))))?;
    // A rank that fails aborts every rank's communicator, so that the others stop at their
    // next wait instead of blocking in a collective it will never join.
    let aborts: Vec<AbortHandle> = comms.iter().map(Comm::abort_handle).collect();
    let first_failed: Mutex<Option<usize>> = Mutex::new(None);
    let results: Vec<Result<RankOutcome>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let setup = setup.clone();
                let (aborts, first_failed, rank_fn) = (&aborts, &first_failed, &rank_fn);
                scope.spawn(move || {
                    let role = Role { rank, world };
                    let fail = |e: &TrainError| {
                        let mut first = first_failed.lock().unwrap_or_else(|p| p.into_inner());
                        if first.is_none() {
                            *first = Some(rank);
                            let why = format!("rank {rank} (device {}) failed: {e}", list[rank]);
                            aborts.iter().for_each(|a| a.abort(why.clone()));
                        }
                    };
                    let backend =
                        DeviceBackend::with_comm(comm, args.grad_accum).inspect_err(fail)?;
                    backend.set_bucket_elems(crate::memory::bucket_elems(args));
                    backend.set_offload_flag(args.offload_optimizer.is_some());
                    // Aborted before the backend (and its communicator) is dropped: a
                    // communicator's teardown may wait for the other ranks.
                    rank_fn(&backend, role, setup).inspect_err(fail)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(TrainError::Op("a rank's thread panicked".into())))
            })
            .collect()
    });
    // The rank that failed first is the cause; the others failed because it aborted them.
    if let Some(rank) = *first_failed.lock().unwrap_or_else(|p| p.into_inner()) {
        if let Some(Err(e)) = results.into_iter().nth(rank) {
            return Err(at_rank(rank, list[rank], e));
        }
        return Err(TrainError::Op(format!("rank {rank} failed")));
    }
    let mut out = Vec::with_capacity(world);
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(o) => out.push(o),
            Err(e) => return Err(at_rank(rank, list[rank], e)),
        }
    }
    Ok(out)
}

/// This process is one rank of a job launched with torchrun's or Slurm's variables (`env`):
/// device `LOCAL_RANK`, the unique id from rank 0 at `MASTER_ADDR:MASTER_PORT`. Returns the
/// step figures (every rank has them; only rank 0 printed and logged them).
pub fn run_launched(args: &Args, env: LaunchEnv) -> Result<Vec<StepLog>> {
    let role = Role {
        rank: env.rank,
        world: env.world_size,
    };
    // Usage errors of the variables first (exit 2): the rendezvous port and the secret.
    let usage = |e: &dyn std::fmt::Display| TrainError::Usage(e.to_string());
    hip_rt::ddp::rendezvous_port(&env, |v| std::env::var(v).ok()).map_err(|e| usage(&e))?;
    let secret = hip_rt::ddp::Secret::from_env().map_err(|e| usage(&e))?;
    if let (Some(note), true) = (env.note(), role.primary()) {
        println!("note: {note}");
    }
    let (model_dir, _) = crate::weights::model_paths(&args.model);
    if let crate::config::ModelConfig::Llama(cfg) =
        crate::config::ModelConfig::load(&model_dir.join("config.json"))?
    {
        let setup = match role.primary() {
            true => crate::llama::train::prepare(args, cfg, role.world)?,
            false => crate::llama::train::setup(args, cfg, role.world)?,
        };
        let settings = crate::agree::llama_settings(args, &setup);
        return join_and_run(args, &env, secret, settings, |backend| {
            crate::llama::train::train_as(backend, args, setup, role, false)
        });
    }
    let setup = prepare_for(args, role)?;
    let settings = crate::agree::settings(args, &setup);
    join_and_run(args, &env, secret, settings, |backend| {
        run_rank(backend, args, role, Some(setup), false)
    })
}

/// Join the job (the rendezvous compares `settings`) and run this rank with `rank_fn`.
fn join_and_run(
    args: &Args,
    env: &LaunchEnv,
    secret: hip_rt::ddp::Secret,
    settings: hip_rt::ddp::Settings,
    rank_fn: impl FnOnce(&DeviceBackend) -> Result<RankOutcome>,
) -> Result<Vec<StepLog>> {
    let at = |e: &dyn std::fmt::Display| {
        dev(format!(
            "rank {} of {} (LOCAL_RANK {}): {e}",
            env.rank, env.world_size, env.local_rank
        ))
    };
    let options = RendezvousOptions {
        settings,
        secret: Some(secret),
        ..RendezvousOptions::default()
    };
    let joined = hip_rt::ddp::join_from_env(&options)
        .map_err(|e| at(&e))?
        .ok_or_else(|| at(&"the launcher variables went away"))?;
    let liveness = joined.liveness;
    let backend = DeviceBackend::with_comm(joined.comm, args.grad_accum)?;
    backend.set_bucket_elems(crate::memory::bucket_elems(args));
    backend.set_offload_flag(args.offload_optimizer.is_some());
    match rank_fn(&backend) {
        Ok(o) => {
            liveness.finish();
            Ok(o.logs)
        }
        Err(e) => {
            // Another rank lost is the cause: name it.
            let e = match liveness.lost() {
                Some(lost) => at(&format!("{lost}; this rank stopped at: {e}")),
                None => at_rank(env.rank, env.local_rank, e),
            };
            // Closing the connections tells the other ranks (if this rank is the cause), and
            // aborting (rather than destroying) the communicator waits for none of them.
            drop(liveness);
            if let Some(a) = backend.abort_handle() {
                a.abort(e.to_string());
            }
            Err(e)
        }
    }
}

/// `e`, naming the rank and device it happened on.
fn at_rank(rank: usize, device: usize, e: TrainError) -> TrainError {
    match e {
        TrainError::Usage(_) | TrainError::File { .. } | TrainError::Io { .. } => e,
        TrainError::Device(m) => TrainError::Device(format!("rank {rank} (device {device}): {m}")),
        other => TrainError::Op(format!("rank {rank} (device {device}): {other}")),
    }
}
