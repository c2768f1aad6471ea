//! Data parallel training across devices: the pieces a trainer needs around [`Comm`].
//!
//! - [`LaunchEnv`]: torchrun's variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//!   `MASTER_PORT`, optionally `LOCAL_WORLD_SIZE`), or under Slurm `SLURM_PROCID`,
//!   `SLURM_NTASKS`, `SLURM_LOCALID`, `SLURM_JOB_NODELIST` and `SLURM_JOB_ID`, parsed and
//!   checked; none set means a single process.
//! - The rendezvous ([`Server`], [`fetch_id`], [`exchange_id`]): rank 0 makes the RCCL
//!   [`UniqueId`] and hands it to the other ranks over TCP, to those that prove they hold the
//!   job's [`Secret`] (HMAC-SHA256 challenge and response) and share rank 0's [`Settings`];
//!   bounded in time, connections and bytes. [`join_from_env`] does all of it and returns this
//!   rank's communicator and a [`Liveness`] watcher that aborts it when another rank dies,
//!   is killed or stops answering.
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
mod liveness;
mod reducer;
mod rendezvous;
mod scalar;
mod secret;
mod settings;
pub mod slurm;
mod zero;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_hardening;

use std::time::Duration;

pub use buckets::{Bucket, BucketPlan, DEFAULT_BUCKET_BYTES};
pub use env::{LaunchEnv, Launcher, MAX_WORLD, SLURM_PORT_BASE, SLURM_PORT_SPAN};
pub use error::{DdpError, EnvError, RendezvousError, SecretError};
pub use liveness::Liveness;
pub use reducer::{Averaging, GradReducer, ReducerOptions, ScaleFn};
pub use rendezvous::{
    default_timeout, fetch_id, Credentials, PeerStream, RendezvousOptions, Server, Settings,
    DEFAULT_TIMEOUT, MAX_HANDSHAKES, MAX_SETTINGS, VERSION,
};
pub use secret::{Secret, SECRET_FILE_VAR, SECRET_VAR};

use crate::comm::MAX_TIMEOUT;
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
        return env::port(PORT_VAR, &text);
    }
    let agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE")
        .is_some_and(|v| matches!(v.trim(), "True" | "true" | "1"));
    if agent_store {
        return env
            .master_port
            .checked_add(1)
            .ok_or_else(|| EnvError::BadPort {
                var: "MASTER_PORT",
                value: format!(
                    "{} (the rendezvous would use MASTER_PORT+1; set {PORT_VAR})",
                    env.master_port
                ),
            });
    }
    Ok(env.master_port)
}

/// The timeout of `options`, else `HIPK_COMM_TIMEOUT_S`'s (checked), else 300 s.
pub fn timeout_of(options: &RendezvousOptions) -> Result<std::time::Duration, DdpError> {
    match options.timeout {
        Some(t) => Ok(t.min(MAX_TIMEOUT)),
        None => Ok(default_timeout()?),
    }
}

/// This process's copy of rank 0's unique id, and the connections kept for [`Liveness`]:
/// rank 0 creates the id (`ncclGetUniqueId`) and serves it at the rendezvous port to every
/// other rank that proves the job's secret; the others fetch it.
///
/// # Host wait
/// Blocks until every rank has joined, or the timeout.
pub fn exchange_id(
    env: &LaunchEnv,
    options: &RendezvousOptions,
) -> Result<(UniqueId, Vec<PeerStream>), DdpError> {
    let port = rendezvous_port(env, |v| std::env::var(v).ok())?;
    let timeout = timeout_of(options)?;
    let secret = match &options.secret {
        Some(s) => s.clone(),
        None => Secret::from_env()?,
    };
    let creds = Credentials {
        secret,
        settings: options.settings.clone(),
    };
    if env.rank == 0 {
        let id = UniqueId::new()?;
        let mut peers = Vec::new();
        if env.world_size > 1 {
            let server = Server::bind(&env.master_addr, port, options.bind)?;
            peers = server.serve(env.world_size, &id, &creds, timeout)?;
        }
        Ok((id, peers))
    } else {
        let (id, stream) = fetch_id(
            &env.master_addr,
            port,
            env.world_size,
            env.rank,
            &creds,
            timeout,
        )?;
        Ok((id, vec![(0, stream)]))
    }
}

/// One rank of a launched job, joined: see [`join_from_env`].
#[derive(Debug)]
pub struct Joined {
    /// The launcher's variables.
    pub env: LaunchEnv,
    /// This rank's communicator (its timeout is the rendezvous timeout).
    pub comm: Comm,
    /// The watcher of the other ranks: call [`Liveness::finish`] when the run ends normally;
    /// dropping it otherwise tells the other ranks that this one failed.
    pub liveness: Liveness,
}

/// One process per device from torchrun's or Slurm's variables: `Ok(None)` when they are not
/// set (a single process); else open device `LOCAL_RANK`, run the rendezvous
/// ([`exchange_id`]), join the communicator ([`Comm::init_rank`]) and start watching the
/// other ranks ([`Liveness`]: a rank silent for half the timeout is lost).
///
/// # Host wait
/// Blocks until every rank has joined: the rendezvous for at most the timeout, then
/// `ncclCommInitRank` (which has no timeout of its own, but starts only once every rank has
/// the id).
pub fn join_from_env(options: &RendezvousOptions) -> Result<Option<Joined>, DdpError> {
    let Some(env) = LaunchEnv::from_env()? else {
        return Ok(None);
    };
    let timeout = timeout_of(options)?;
    let device = Device::get(env.device_ordinal()).map_err(|e| DdpError::Device {
        local_rank: env.local_rank,
        source: Box::new(e),
    })?;
    let (id, peers) = exchange_id(&env, options)?;
    let comm = Comm::init_rank(&device, env.world_size, env.rank, &id)?;
    comm.set_timeout(timeout);
    // Half the timeout: a stopped rank is named by the watcher before a collective's own
    // timeout (which cannot say which rank is missing) ends the wait.
    let silence = (timeout / 2).max(Duration::from_millis(500));
    let liveness = Liveness::start(env.rank, peers, &comm, silence);
    Ok(Some(Joined {
        env,
        comm,
        liveness,
    }))
}

/// As [`join_from_env`], without the watcher (the other ranks are told this one finished).
pub fn init_from_env(options: &RendezvousOptions) -> Result<Option<(LaunchEnv, Comm)>, DdpError> {
    Ok(join_from_env(options)?.map(|j| {
        j.liveness.finish();
        (j.env, j.comm)
    }))
}

/// How long rank 0 gives a connection to complete its part of the rendezvous (hello, proof)
/// before dropping it.
pub const HELLO_WAIT: Duration = Duration::from_secs(5);
