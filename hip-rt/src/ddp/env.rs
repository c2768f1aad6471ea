//! [`LaunchEnv`]: torchrun's variables, or Slurm's, parsed and checked.

use super::error::EnvError;
use super::slurm;

/// The variables every process launched by torchrun must have.
pub const REQUIRED: [&str; 5] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
];
/// The optional variable: processes on this node.
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// The largest `WORLD_SIZE` (or `SLURM_NTASKS`, `LOCAL_WORLD_SIZE`) accepted: 65536 ranks.
pub const MAX_WORLD: usize = 1 << 16;
/// Under Slurm without `MASTER_PORT`, the port is `SLURM_PORT_BASE + SLURM_JOB_ID mod
/// SLURM_PORT_SPAN`: the same on every rank of a job, different for most concurrent jobs.
pub const SLURM_PORT_BASE: u16 = 20000;
/// See [`SLURM_PORT_BASE`].
pub const SLURM_PORT_SPAN: u64 = 20000;
/// The variables torchrun sets per rank: with none of them and `SLURM_PROCID` set, Slurm's
/// variables describe the launch.
const TORCHRUN_RANK_VARS: [&str; 3] = ["RANK", "WORLD_SIZE", "LOCAL_RANK"];
/// The Slurm variables read.
const SLURM_VARS: [&str; 7] = [
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_JOB_NODELIST",
    "SLURM_NODELIST",
    "SLURM_JOB_ID",
    "SLURM_JOBID",
];

/// Which launcher's variables describe this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// torchrun's (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`).
    Torchrun,
    /// Slurm's (`SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`, the first host of
    /// `SLURM_JOB_NODELIST`, a port from `SLURM_JOB_ID`); `MASTER_ADDR` and `MASTER_PORT`
    /// when set.
    Slurm,
    /// torchrun's, although Slurm's are set too (torchrun started inside a Slurm job).
    TorchrunOverSlurm,
}

/// Where this process sits in a job launched with one process per device (torchrun's or
/// Slurm's variables): its rank among all processes, the world size, its device on this node,
/// and where rank 0 listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    /// `RANK`: this process's rank, `0..world_size`.
    pub rank: usize,
    /// `WORLD_SIZE`: the number of processes (ranks) in the job.
    pub world_size: usize,
    /// `LOCAL_RANK`: this process's index on its node, used as the device ordinal.
    pub local_rank: usize,
    /// `LOCAL_WORLD_SIZE`, when the launcher sets it: processes on this node.
    pub local_world_size: Option<usize>,
    /// `MASTER_ADDR`: rank 0's host name or address.
    pub master_addr: String,
    /// `MASTER_PORT`: the port rank 0 listens on for the rendezvous.
    pub master_port: u16,
    /// Whose variables these are.
    pub launcher: Launcher,
}

impl LaunchEnv {
    /// Read the variables from this process's environment. `Ok(None)` when none of them is
    /// set (a single process); an [`EnvError`] naming the variable, its value and the fix when
    /// they are partly set or invalid.
    pub fn from_env() -> Result<Option<LaunchEnv>, EnvError> {
        let mut bad = None;
        let env = Self::from_lookup(|name| match std::env::var(name) {
            Ok(v) => Some(v),
            Err(std::env::VarError::NotPresent) => None,
            Err(std::env::VarError::NotUnicode(_)) => {
                bad.get_or_insert(name.to_string());
                Some(String::new())
            }
        });
        if let Some(name) = bad {
            let var = REQUIRED
                .iter()
                .chain([&LOCAL_WORLD_SIZE])
                .chain(SLURM_VARS.iter())
                .find(|v| **v == name)
                .copied()
                .unwrap_or("a launcher variable");
            return Err(EnvError::NotUnicode { var });
        }
        env
    }

    /// As [`LaunchEnv::from_env`], reading each variable through `lookup` (for tests, or a
    /// launcher that passes them otherwise).
    pub fn from_lookup(
        mut lookup: impl FnMut(&str) -> Option<String>,
    ) -> Result<Option<LaunchEnv>, EnvError> {
        let slurm = lookup("SLURM_PROCID").is_some();
        if slurm && TORCHRUN_RANK_VARS.iter().all(|v| lookup(v).is_none()) {
            return from_slurm(lookup).map(Some);
        }
        let env = from_torchrun(&mut lookup)?;
        Ok(env.map(|mut e| {
            if slurm {
                e.launcher = Launcher::TorchrunOverSlurm;
            }
            e
        }))
    }

    /// A note for rank 0's first line when the choice of variables needs one (torchrun's used
    /// although Slurm's are set too).
    pub fn note(&self) -> Option<&'static str> {
        match self.launcher {
            Launcher::TorchrunOverSlurm => Some(
                "both torchrun's (RANK, WORLD_SIZE, LOCAL_RANK) and Slurm's (SLURM_PROCID, ...) \
                 variables are set: using torchrun's",
            ),
            _ => None,
        }
    }

    /// The device ordinal this process drives: `LOCAL_RANK`.
    pub fn device_ordinal(&self) -> i32 {
        // LOCAL_RANK < WORLD_SIZE, and a world of 2^31 processes is not a job anyone launches;
        // saturate rather than wrap so that Device::get reports it.
        i32::try_from(self.local_rank).unwrap_or(i32::MAX)
    }

    /// True on rank 0 (the rank that prints, logs and writes checkpoints).
    pub fn is_primary(&self) -> bool {
        self.rank == 0
    }

    /// `MASTER_ADDR:MASTER_PORT` (IPv6 literals in brackets).
    pub fn master(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

fn number(var: &'static str, text: &str) -> Result<usize, EnvError> {
    text.parse::<usize>().map_err(|_| EnvError::NotANumber {
        var,
        value: text.to_string(),
    })
}

/// torchrun's variables: `Ok(None)` when none is set.
fn from_torchrun(
    lookup: &mut impl FnMut(&str) -> Option<String>,
) -> Result<Option<LaunchEnv>, EnvError> {
    let values: Vec<Option<String>> = REQUIRED.iter().map(|v| lookup(v)).collect();
    let local_world = lookup(LOCAL_WORLD_SIZE);
    let set: Vec<&'static str> = REQUIRED
        .iter()
        .zip(&values)
        .filter(|(_, v)| v.is_some())
        .map(|(n, _)| *n)
        .collect();
    if set.is_empty() {
        return match local_world {
            None => Ok(None),
            Some(_) => Err(EnvError::Partial {
                set: vec![LOCAL_WORLD_SIZE],
                missing: REQUIRED.to_vec(),
            }),
        };
    }
    if set.len() < REQUIRED.len() {
        let missing = REQUIRED
            .iter()
            .zip(&values)
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect();
        return Err(EnvError::Partial { set, missing });
    }
    let get = |i: usize| values[i].as_deref().unwrap_or_default().trim();
    let rank = number("RANK", get(0))?;
    let world_size = world("WORLD_SIZE", get(1))?;
    let local_rank = number("LOCAL_RANK", get(2))?;
    if rank >= world_size {
        return Err(EnvError::RankOutOfRange {
            var: "RANK",
            value: rank,
            size_var: "WORLD_SIZE",
            size: world_size,
        });
    }
    let ranks = Ranks {
        rank,
        world_size,
        local_rank,
        local_var: "LOCAL_RANK",
        world_var: "WORLD_SIZE",
    };
    ranks
        .finish(
            local_world,
            get(3).to_string(),
            port("MASTER_PORT", get(4))?,
            Launcher::Torchrun,
        )
        .map(Some)
}

/// A rank started by `srun`: see [`Launcher::Slurm`].
fn from_slurm(mut lookup: impl FnMut(&str) -> Option<String>) -> Result<LaunchEnv, EnvError> {
    let need = |lookup: &mut dyn FnMut(&str) -> Option<String>,
                var: &'static str,
                alt: Option<&'static str>,
                why: &'static str| {
        lookup(var)
            .or_else(|| alt.and_then(&mut *lookup))
            .ok_or(EnvError::SlurmMissing { var, why })
    };
    let rank = number(
        "SLURM_PROCID",
        need(&mut lookup, "SLURM_PROCID", None, "this rank")?.trim(),
    )?;
    let world_size = world(
        "SLURM_NTASKS",
        need(&mut lookup, "SLURM_NTASKS", None, "the world size")?.trim(),
    )?;
    let local_rank = number(
        "SLURM_LOCALID",
        need(
            &mut lookup,
            "SLURM_LOCALID",
            None,
            "the device on this node",
        )?
        .trim(),
    )?;
    if rank >= world_size {
        return Err(EnvError::RankOutOfRange {
            var: "SLURM_PROCID",
            value: rank,
            size_var: "SLURM_NTASKS",
            size: world_size,
        });
    }
    let master_addr = match lookup("MASTER_ADDR") {
        Some(a) => a.trim().to_string(),
        None => {
            let list = need(
                &mut lookup,
                "SLURM_JOB_NODELIST",
                Some("SLURM_NODELIST"),
                "rank 0's host (or set MASTER_ADDR)",
            )?;
            slurm::first_host(&list).map_err(|why| EnvError::BadNodeList {
                value: list.chars().take(200).collect(),
                why,
            })?
        }
    };
    let master_port = match lookup("MASTER_PORT") {
        Some(p) => port("MASTER_PORT", &p)?,
        None => {
            let text = need(
                &mut lookup,
                "SLURM_JOB_ID",
                Some("SLURM_JOBID"),
                "the rendezvous port (or set MASTER_PORT)",
            )?;
            let id = text
                .trim()
                .parse::<u64>()
                .map_err(|_| EnvError::NotANumber {
                    var: "SLURM_JOB_ID",
                    value: text.clone(),
                })?;
            // < 20000 + 20000: fits a u16.
            SLURM_PORT_BASE + (id % SLURM_PORT_SPAN) as u16
        }
    };
    let local_world = lookup(LOCAL_WORLD_SIZE);
    let ranks = Ranks {
        rank,
        world_size,
        local_rank,
        local_var: "SLURM_LOCALID",
        world_var: "SLURM_NTASKS",
    };
    ranks.finish(local_world, master_addr, master_port, Launcher::Slurm)
}

/// The ranks read, with the names of the variables they came from.
struct Ranks {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_var: &'static str,
    world_var: &'static str,
}

impl Ranks {
    /// The checks both launchers share, and the [`LaunchEnv`].
    fn finish(
        self,
        local_world: Option<String>,
        master_addr: String,
        master_port: u16,
        launcher: Launcher,
    ) -> Result<LaunchEnv, EnvError> {
        let local_world_size = match local_world.as_deref().map(str::trim) {
            None => None,
            Some(text) => {
                let local = world(LOCAL_WORLD_SIZE, text)?;
                if local > self.world_size {
                    return Err(EnvError::LocalLargerThanWorld {
                        local,
                        world: self.world_size,
                    });
                }
                if self.local_rank >= local {
                    return Err(EnvError::RankOutOfRange {
                        var: self.local_var,
                        value: self.local_rank,
                        size_var: LOCAL_WORLD_SIZE,
                        size: local,
                    });
                }
                Some(local)
            }
        };
        if self.local_rank >= self.world_size {
            return Err(EnvError::RankOutOfRange {
                var: self.local_var,
                value: self.local_rank,
                size_var: self.world_var,
                size: self.world_size,
            });
        }
        if master_addr.is_empty() {
            return Err(EnvError::EmptyAddr);
        }
        Ok(LaunchEnv {
            rank: self.rank,
            world_size: self.world_size,
            local_rank: self.local_rank,
            local_world_size,
            master_addr,
            master_port,
            launcher,
        })
    }
}

/// A count of ranks in `1..=MAX_WORLD` from `var`.
fn world(var: &'static str, text: &str) -> Result<usize, EnvError> {
    let n = text.parse::<u64>().map_err(|_| EnvError::NotANumber {
        var,
        value: text.to_string(),
    })?;
    if n == 0 {
        return Err(EnvError::ZeroSize { var });
    }
    if n > MAX_WORLD as u64 {
        return Err(EnvError::TooLarge {
            var,
            value: text.to_string(),
            max: MAX_WORLD,
        });
    }
    Ok(n as usize)
}

/// A TCP port in `1..=65535` from `var`.
pub(crate) fn port(var: &'static str, text: &str) -> Result<u16, EnvError> {
    match text.trim().parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(EnvError::BadPort {
            var,
            value: text.to_string(),
        }),
    }
}
