//! The emulator's environment: `HIPK_EMU_DEVICES`, `HIPK_EMU_MEMORY`, `HIPK_EMU_SEED`,
//! `HIPK_EMU_LAZY`. Parsed once, on the first runtime call; a bad value fails every call that
//! needs a device with hipErrorInvalidValue and a message naming the variable, its value and the
//! fix.
//!
//! `HIPK_EMU_LAZY=1` keeps queued device work queued until the host waits for it (or the oldest
//! command has waited [`LAZY_GRACE`](super::queue::LAZY_GRACE)); see [`super::queue`]. With
//! `HIPK_EMU_SEED` it runs the work of several streams in a random ready order, which exposes a
//! missing `hipStreamWaitEvent` or a missing host wait.

use super::error::{Fail, Res};

/// Number of emulated devices (`HIPK_EMU_DEVICES`).
pub const DEVICES_VAR: &str = "HIPK_EMU_DEVICES";
/// Memory capacity of each device (`HIPK_EMU_MEMORY`).
pub const MEMORY_VAR: &str = "HIPK_EMU_MEMORY";
/// Seed that shuffles block order and the choice among ready streams (`HIPK_EMU_SEED`).
pub const SEED_VAR: &str = "HIPK_EMU_SEED";
/// `1`: run queued work only while the host waits for it (`HIPK_EMU_LAZY`; unset, empty or `0`:
/// run it as soon as it is ready).
pub const LAZY_VAR: &str = "HIPK_EMU_LAZY";

/// Default capacity per device: 4 GiB.
pub const DEFAULT_MEMORY: usize = 4 << 30;
/// At most this many devices.
pub const MAX_DEVICES: usize = 16;

/// The parsed environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Number of devices (`HIPK_EMU_DEVICES`).
    pub devices: usize,
    /// Capacity of each device in bytes (`HIPK_EMU_MEMORY`).
    pub memory: usize,
    /// `HIPK_EMU_SEED`, if set.
    pub seed: Option<u64>,
    /// `HIPK_EMU_LAZY=1`: the executors run queued work only on demand.
    pub lazy: bool,
}

impl Config {
    /// Read the process environment.
    pub fn from_env() -> Res<Config> {
        let get = |var: &str| std::env::var(var).ok();
        Config::parse(&get)
    }

    /// Parse from a variable lookup (unset or empty = default).
    pub fn parse(get: &dyn Fn(&str) -> Option<String>) -> Res<Config> {
        let value = |var: &str| get(var).filter(|v| !v.trim().is_empty());
        let devices = match value(DEVICES_VAR) {
            None => 1,
            Some(v) => match v.trim().parse::<usize>() {
                Ok(n) if (1..=MAX_DEVICES).contains(&n) => n,
                _ => {
                    return Err(Fail::invalid(format!(
                        "{DEVICES_VAR}={v:?} is not a device count from 1 to {MAX_DEVICES}; \
                         set e.g. {DEVICES_VAR}=2 or unset it for one device"
                    )))
                }
            },
        };
        let memory = match value(MEMORY_VAR) {
            None => DEFAULT_MEMORY,
            Some(v) => parse_bytes(&v).ok_or_else(|| {
                Fail::invalid(format!(
                    "{MEMORY_VAR}={v:?} is not a byte count: use a positive integer with an \
                     optional K, M or G suffix (powers of 1024), e.g. 512M or 4G"
                ))
            })?,
        };
        let seed = match value(SEED_VAR) {
            None => None,
            Some(v) => Some(v.trim().parse::<u64>().map_err(|_| {
                Fail::invalid(format!(
                    "{SEED_VAR}={v:?} is not an unsigned integer seed; set e.g. {SEED_VAR}=1"
                ))
            })?),
        };
        let lazy = match value(LAZY_VAR).as_deref().map(str::trim) {
            None | Some("0") => false,
            Some("1") => true,
            Some(v) => {
                return Err(Fail::invalid(format!(
                    "{LAZY_VAR}={v:?} is neither 1 nor 0; set {LAZY_VAR}=1 to run queued work \
                     only when the host waits for it, or unset it"
                )))
            }
        };
        Ok(Config {
            devices,
            memory,
            seed,
            lazy,
        })
    }
}

/// `"4096"`, `"64K"`, `"512M"`, `"4G"` (case-insensitive, optional `B`/`iB`) → bytes; `None` for
/// zero, garbage or overflow.
pub fn parse_bytes(text: &str) -> Option<usize> {
    let t = text.trim().to_ascii_uppercase();
    let t = t
        .strip_suffix("IB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(&t);
    let (digits, shift) = match t.chars().last()? {
        'K' => (&t[..t.len() - 1], 10),
        'M' => (&t[..t.len() - 1], 20),
        'G' => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: usize = digits.trim().parse().ok()?;
    let bytes = n.checked_mul(1usize << shift)?;
    (bytes > 0).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |var| {
            pairs
                .iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn byte_counts_with_suffixes() {
        let cases = [
            ("4096", Some(4096)),
            ("64K", Some(64 << 10)),
            ("512m", Some(512 << 20)),
            ("4G", Some(4 << 30)),
            ("2GiB", Some(2 << 30)),
            ("1MB", Some(1 << 20)),
            ("0", None),
            ("-1", None),
            ("lots", None),
            ("", None),
            ("99999999999999999999G", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_bytes(text), want, "{text:?}");
        }
    }

    #[test]
    fn defaults_and_bad_values_name_the_variable() {
        let c = Config::parse(&env(&[])).unwrap();
        assert_eq!((c.devices, c.memory, c.seed), (1, DEFAULT_MEMORY, None));
        assert!(!c.lazy);
        let c = Config::parse(&env(&[
            (DEVICES_VAR, "3"),
            (MEMORY_VAR, "1M"),
            (SEED_VAR, "7"),
            (LAZY_VAR, "1"),
        ]))
        .unwrap();
        assert_eq!((c.devices, c.memory, c.seed), (3, 1 << 20, Some(7)));
        assert!(c.lazy);
        for off in [
            &[(LAZY_VAR, "0")][..],
            &[(LAZY_VAR, "")][..],
            &[(LAZY_VAR, " 0 ")][..],
        ] {
            let pairs: &'static [(&str, &str)] = off;
            assert!(!Config::parse(&env(pairs)).unwrap().lazy, "{pairs:?}");
        }
        let err = Config::parse(&env(&[(LAZY_VAR, "yes")])).unwrap_err();
        assert!(
            err.message.contains("HIPK_EMU_LAZY=\"yes\"") && err.message.contains("=1"),
            "{err}"
        );
        for bad in [
            &[(MEMORY_VAR, "4X")][..],
            &[(DEVICES_VAR, "0")][..],
            &[(SEED_VAR, "x")][..],
            &[(LAZY_VAR, "yes")][..],
            &[(LAZY_VAR, "2")][..],
        ] {
            let pairs: &'static [(&str, &str)] = bad;
            let err = Config::parse(&env(pairs)).unwrap_err();
            assert!(err.message.contains(pairs[0].0), "{err}");
            assert_eq!(err.code, hip_sys::hipError_t::hipErrorInvalidValue);
        }
    }
}
