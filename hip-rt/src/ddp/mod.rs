//! Data parallel training across devices: the pieces a trainer needs around [`Comm`].
//!
//! - [`LaunchEnv`]: torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//!   `MASTER_PORT`, optionally `LOCAL_WORLD_SIZE`), parsed and checked; none set means a single
//!   process.
//! - The rendezvous ([`Server`], [`fetch_id`], [`exchange_id`]): rank 0 makes the RCCL
//!   [`UniqueId`] and hands it to the other ranks over TCP, with a versioned fixed-size
//!   exchange that refuses a mismatched peer and never waits past its timeout.
//!   [`init_from_env`] does all of it and returns this rank's communicator.
//! - [`GradReducer`]: gradients averaged in buckets on a communication stream while the
//!   backward pass runs (streams ordered by events only).
//! - [`ShardPlan`]: ZeRO stage 1 (reduce-scatter gradients into this rank's shard, all-gather
//!   the updated parameters).
//! - [`any_across_ranks`], [`any_in_place`], [`mean_across_ranks`] (and `_across_devices` forms
//!   for one thread driving several devices): the f16 skip decision and the logged loss.
//!
//! ```no_run
//! use hip_rt::ddp::{self, RendezvousOptions};
//! use hip_rt::{Device, Stream, StreamOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! match ddp::init_from_env(&RendezvousOptions::default())? {
//!     Some((env, comm)) => {
//!         // One process of a `torchrun --nproc-per-node N` job: rank env.rank of
//!         // env.world_size, on device env.local_rank.
//!         let stream = Stream::new(comm.device(), StreamOptions::default())?;
//!         let loss = 3.5f32; // this rank's loss
//!         let mean = ddp::mean_across_ranks(&comm, loss, &stream)?;
//!         if env.is_primary() {
//!             println!("loss {mean}");
//!         }
//!     }
//!     None => {
//!         // No launcher variables: a single process.
//!         let _device = Device::get(0)?;
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Which averaging: [`Averaging::Avg`] (the default) uses RCCL's `ncclAvg` (NCCL 2.10 and
//! later based releases; hip-emu's emulated RCCL has it), for f32, f16 and bf16 alike;
//! [`Averaging::Sum`] is the plain sum, the mean when each rank has already scaled its
//! gradients by 1/W, or when a [`ScaleFn`] (the caller's scale kernel) runs after each bucket's
//! sum. hip-rt ships no kernels, so it cannot scale after a sum by itself.
//! [`Averaging::best_for`] picks `Avg` when the loaded RCCL has it.
//!
//! Run on hip-emu's emulated RCCL only (several emulated devices in one process, and several
//! processes on one machine); never on real devices.

mod buckets;
mod env;
mod error;
mod reducer;
mod rendezvous;
mod scalar;
mod zero;

#[cfg(test)]
mod tests;

use std::time::Duration;

pub use buckets::{Bucket, BucketPlan, DEFAULT_BUCKET_BYTES};
pub use env::LaunchEnv;
pub use error::{DdpError, EnvError, RendezvousError};
pub use reducer::{Averaging, GradReducer, ReducerOptions, ScaleFn};
pub use rendezvous::{
    default_timeout, fetch_id, RendezvousOptions, Server, DEFAULT_TIMEOUT, VERSION,
};
pub use scalar::{
    any_across_devices, any_across_ranks, any_in_place, mean_across_devices, mean_across_ranks,
    mean_in_place,
};
pub use zero::ShardPlan;

use crate::comm::{Comm, UniqueId};
use crate::device::Device;

/// Overrides the rendezvous port (default: `MASTER_PORT`, see [`rendezvous_port`]).
pub const PORT_VAR: &str = "HIPK_RDZV_PORT";

/// The port rank 0 listens on for the rendezvous: `HIPK_RDZV_PORT` when set, else
/// `MASTER_PORT + 1` when `TORCHELASTIC_USE_AGENT_STORE` is `True` (torchrun then tells its
/// workers that its agent on node 0 already hosts a store at `MASTER_ADDR:MASTER_PORT`, so that
/// port is taken), else `MASTER_PORT`. Every rank computes the same port from the same
/// variables. `lookup` reads a variable
/// (`|v| std::env::var(v).ok()`).
pub fn rendezvous_port(
    env: &LaunchEnv,
    mut lookup: impl FnMut(&str) -> Option<String>,
) -> Result<u16, EnvError> {
    if let Some(text) = lookup(PORT_VAR) {
        return match text.trim().parse::<u16>() {
            Ok(p) if p != 0 => Ok(p),
            _ => Err(EnvError::BadPort { value: text }),
        };
    }
    let agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE")
        .is_some_and(|v| matches!(v.trim(), "True" | "true" | "1"));
    if agent_store {
        return env
            .master_port
            .checked_add(1)
            .ok_or_else(|| EnvError::BadPort {
                value: format!(
                    "{} (the rendezvous would use MASTER_PORT+1; set {PORT_VAR})",
                    env.master_port
                ),
            });
    }
    Ok(env.master_port)
}

/// This process's copy of rank 0's unique id: rank 0 creates it (`ncclGetUniqueId`) and serves
/// it at the rendezvous port until every other rank has it; the others fetch it.
///
/// # Host wait
/// Blocks until every rank has joined, or `options.timeout`.
pub fn exchange_id(env: &LaunchEnv, options: &RendezvousOptions) -> Result<UniqueId, DdpError> {
    let port = rendezvous_port(env, |v| std::env::var(v).ok())?;
    if env.rank == 0 {
        let id = UniqueId::new()?;
        if env.world_size > 1 {
            let server = Server::bind(&env.master_addr, port, options.bind)?;
            server.serve(env.world_size, &id, options.timeout)?;
        }
        Ok(id)
    } else {
        fetch_id(
            &env.master_addr,
            port,
            env.world_size,
            env.rank,
            options.timeout,
        )
    }
}

/// One process per device from torchrun's variables: `Ok(None)` when they are not set (a
/// single process); else open device `LOCAL_RANK`, run the rendezvous ([`exchange_id`]) and
/// join the communicator ([`Comm::init_rank`]).
///
/// # Host wait
/// Blocks until every rank has joined: the rendezvous for at most `options.timeout`, then
/// `ncclCommInitRank` (which has no timeout of its own, but starts only once every rank has
/// the id).
pub fn init_from_env(options: &RendezvousOptions) -> Result<Option<(LaunchEnv, Comm)>, DdpError> {
    let Some(env) = LaunchEnv::from_env()? else {
        return Ok(None);
    };
    let device = Device::get(env.device_ordinal()).map_err(|e| DdpError::Device {
        local_rank: env.local_rank,
        source: Box::new(e),
    })?;
    let id = exchange_id(&env, options)?;
    let comm = Comm::init_rank(&device, env.world_size, env.rank, &id)?;
    Ok(Some((env, comm)))
}

/// How long rank 0 waits for a connected peer's hello before dropping it as a stray.
pub const HELLO_WAIT: Duration = Duration::from_secs(5);
