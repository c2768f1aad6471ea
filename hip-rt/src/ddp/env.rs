//! [`LaunchEnv`]: torchrun's variables, parsed and checked.

use super::error::EnvError;

/// The variables every launched process must have.
pub const REQUIRED: [&str; 5] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
];
/// The optional variable: processes on this node.
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";

/// Where this process sits in a job launched with one process per device (torchrun's
/// variables): its rank among all processes, the world size, its device on this node, and where
/// rank 0 listens.
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
        let world_size = number("WORLD_SIZE", get(1))?;
        let local_rank = number("LOCAL_RANK", get(2))?;
        let master_addr = get(3).to_string();
        let port_text = get(4);
        if world_size == 0 {
            return Err(EnvError::ZeroSize { var: "WORLD_SIZE" });
        }
        if rank >= world_size {
            return Err(EnvError::RankOutOfRange {
                var: "RANK",
                value: rank,
                size_var: "WORLD_SIZE",
                size: world_size,
            });
        }
        let local_world_size = match local_world.as_deref().map(str::trim) {
            None => None,
            Some(text) => {
                let local = number(LOCAL_WORLD_SIZE, text)?;
                if local == 0 {
                    return Err(EnvError::ZeroSize {
                        var: LOCAL_WORLD_SIZE,
                    });
                }
                if local > world_size {
                    return Err(EnvError::LocalLargerThanWorld {
                        local,
                        world: world_size,
                    });
                }
                if local_rank >= local {
                    return Err(EnvError::RankOutOfRange {
                        var: "LOCAL_RANK",
                        value: local_rank,
                        size_var: LOCAL_WORLD_SIZE,
                        size: local,
                    });
                }
                Some(local)
            }
        };
        if local_rank >= world_size {
            return Err(EnvError::RankOutOfRange {
                var: "LOCAL_RANK",
                value: local_rank,
                size_var: "WORLD_SIZE",
                size: world_size,
            });
        }
        if master_addr.is_empty() {
            return Err(EnvError::EmptyAddr);
        }
        let master_port = match port_text.parse::<u16>() {
            Ok(p) if p != 0 => p,
            _ => {
                return Err(EnvError::BadPort {
                    value: port_text.to_string(),
                })
            }
        };
        Ok(Some(LaunchEnv {
            rank,
            world_size,
            local_rank,
            local_world_size,
            master_addr,
            master_port,
        }))
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
