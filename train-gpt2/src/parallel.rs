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
//!   `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`); rank 0 hands the RCCL unique id to the
//!   others over TCP (`hip_rt::ddp`).
//!
//! Only rank 0 prints, logs and checkpoints. A rank that fails makes the others fail within
//! the communicator's timeout (`HIPK_COMM_TIMEOUT_S`), each naming its rank.

use crate::cli::{device_list, Args};
use crate::device_backend::DeviceBackend;
use crate::error::{dev, Result, TrainError};
use crate::train::{prepare_shared, run_rank, RankOutcome, Role, StepLog};
use hip_rt::ddp::{LaunchEnv, RendezvousOptions};
use hip_rt::{Comm, Device};

/// Train on the devices `list` in this process, one thread per rank; returns every rank's
/// outcome in rank order (`keep_params`: with its final parameters). The first error of any
/// rank, rank 0's first, is returned, naming its rank.
pub fn run_devices(args: &Args, list: &[usize], keep_params: bool) -> Result<Vec<RankOutcome>> {
    let world = list.len();
    let setup = prepare_shared(args, world)?;
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
    let results: Vec<Result<RankOutcome>> = std::thread::scope(|scope| {
        let handles: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let setup = setup.clone();
                scope.spawn(move || {
                    let role = Role { rank, world };
                    let backend = DeviceBackend::with_comm(comm, args.grad_accum)?;
                    run_rank(&backend, args, role, Some(setup), keep_params)
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
    let mut out = Vec::with_capacity(world);
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(o) => out.push(o),
            Err(e) => return Err(at_rank(rank, list[rank], e)),
        }
    }
    Ok(out)
}

/// This process is one rank of a job launched with torchrun's variables (`env`): device
/// `LOCAL_RANK`, the unique id from rank 0 at `MASTER_ADDR:MASTER_PORT`. Returns the step
/// figures (every rank has them; only rank 0 printed and logged them).
pub fn run_launched(args: &Args, env: LaunchEnv) -> Result<Vec<StepLog>> {
    let role = Role {
        rank: env.rank,
        world: env.world_size,
    };
    let at = |e: &dyn std::fmt::Display| {
        dev(format!(
            "rank {} of {} (LOCAL_RANK {}): {e}",
            env.rank, env.world_size, env.local_rank
        ))
    };
    let (_, comm) = hip_rt::ddp::init_from_env(&RendezvousOptions::default())
        .map_err(|e| at(&e))?
        .ok_or_else(|| at(&"the launcher variables went away"))?;
    let backend = DeviceBackend::with_comm(comm, args.grad_accum)?;
    run_rank(&backend, args, role, None, false)
        .map(|o| o.logs)
        .map_err(|e| at_rank(env.rank, env.local_rank, e))
}

/// `e`, naming the rank and device it happened on.
fn at_rank(rank: usize, device: usize, e: TrainError) -> TrainError {
    match e {
        TrainError::Usage(_) | TrainError::File { .. } | TrainError::Io { .. } => e,
        TrainError::Device(m) => TrainError::Device(format!("rank {rank} (device {device}): {m}")),
        other => TrainError::Op(format!("rank {rank} (device {device}): {other}")),
    }
}
