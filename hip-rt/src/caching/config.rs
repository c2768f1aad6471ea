//! Allocator configuration in PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax, read from
//! `HIPK_ALLOC_CONF`: `max_split_size_mb:128,garbage_collection_threshold:0.8`.

use super::{KLARGE_BUFFER, MIB};

/// The environment variable the allocator reads its configuration from.
pub const CONFIG_ENV: &str = "HIPK_ALLOC_CONF";

/// Options we know from PyTorch but do not implement; naming one is an error, not a silent no-op.
const UNSUPPORTED: &[&str] = &[
    "roundup_power2_divisions",
    "max_non_split_rounding_mb",
    "expandable_segments",
    "release_lock_on_cudamalloc",
    "backend",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "graph_capture_record_stream_reuse",
];

/// Known option names, for error messages.
const KNOWN: &str = "max_split_size_mb, garbage_collection_threshold, per_process_memory_fraction";

/// A rejected configuration string or value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    /// A key nobody knows.
    #[error("{CONFIG_ENV}: unknown option `{key}`; known options: {KNOWN}")]
    UnknownKey {
        /// The key as written.
        key: String,
    },
    /// A PyTorch option this allocator does not implement.
    #[error("{CONFIG_ENV}: option `{key}` is a PyTorch option this allocator does not implement; remove it (supported: {KNOWN})")]
    Unsupported {
        /// The key as written.
        key: String,
    },
    /// `key` without `:value`.
    #[error("{CONFIG_ENV}: option `{key}` has no value; write it as `{key}:<value>`")]
    MissingValue {
        /// The key as written.
        key: String,
    },
    /// A value that does not parse or is out of range.
    #[error("{CONFIG_ENV}: bad value `{value}` for `{key}`: expected {expected}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value as written.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// The same key twice.
    #[error("{CONFIG_ENV}: option `{key}` is given twice; keep one")]
    Duplicate {
        /// The key.
        key: &'static str,
    },
    /// The environment variable is not valid UTF-8.
    #[error("{CONFIG_ENV} is not valid UTF-8; set it to ASCII text like `max_split_size_mb:128`")]
    NotUnicode,
    /// `set_memory_fraction` outside `(0, 1]`.
    #[error("invalid memory fraction {0}: expected a number greater than 0.0 and at most 1.0 (the share of the device's memory this process may reserve)")]
    InvalidFraction(f64),
}

/// The allocator's tunables. `Default` is PyTorch's default: no split limit, no garbage
/// collection, no fraction cap.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorConfig {
    /// Blocks of at least this many bytes are never split ("oversize"); `usize::MAX` = no limit.
    pub max_split_size: usize,
    /// Fraction (0, 1) of the allowed memory above which cached, unsplit large blocks are
    /// released, oldest first, before a new device allocation; 0 = off.
    pub garbage_collection_threshold: f64,
    /// Cap on reserved memory as a fraction of device capacity; `None` = no cap.
    pub memory_fraction: Option<f64>,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        AllocatorConfig {
            max_split_size: usize::MAX,
            garbage_collection_threshold: 0.0,
            memory_fraction: None,
        }
    }
}

impl AllocatorConfig {
    /// Parses a configuration string such as
    /// `max_split_size_mb:128,garbage_collection_threshold:0.8,per_process_memory_fraction:0.9`.
    /// Whitespace around tokens is ignored, as are empty entries. An empty string is the default.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut config = AllocatorConfig::default();
        let mut seen: Vec<&'static str> = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (key, value) = match entry.split_once(':') {
                Some((k, v)) => (k.trim(), v.trim()),
                None => (entry, ""),
            };
            let name = known_key(key)?;
            if value.is_empty() {
                return Err(ConfigError::MissingValue { key: key.into() });
            }
            if seen.contains(&name) {
                return Err(ConfigError::Duplicate { key: name });
            }
            seen.push(name);
            match name {
                "max_split_size_mb" => config.max_split_size = parse_max_split_mb(value)?,
                "garbage_collection_threshold" => {
                    config.garbage_collection_threshold = parse_unit_interval(
                        name,
                        value,
                        |v| v > 0.0 && v < 1.0,
                        "a number strictly between 0.0 and 1.0",
                    )?;
                }
                _ => {
                    config.memory_fraction = Some(parse_unit_interval(
                        name,
                        value,
                        |v| v > 0.0 && v <= 1.0,
                        "a number greater than 0.0 and at most 1.0",
                    )?);
                }
            }
        }
        Ok(config)
    }

    /// Reads and parses [`CONFIG_ENV`]; unset means the default.
    pub fn from_env() -> Result<Self, ConfigError> {
        match std::env::var(CONFIG_ENV) {
            Ok(text) => Self::parse(&text),
            Err(std::env::VarError::NotPresent) => Ok(Self::default()),
            Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::NotUnicode),
        }
    }
}

fn known_key(key: &str) -> Result<&'static str, ConfigError> {
    for name in [
        "max_split_size_mb",
        "garbage_collection_threshold",
        "per_process_memory_fraction",
    ] {
        if key == name {
            return Ok(name);
        }
    }
    if UNSUPPORTED.contains(&key) {
        return Err(ConfigError::Unsupported { key: key.into() });
    }
    Err(ConfigError::UnknownKey { key: key.into() })
}

/// PyTorch requires more than `kLargeBuffer` (20 MiB): smaller limits would forbid splitting
/// the 20 MiB segments that serve 1–10 MiB requests.
fn parse_max_split_mb(value: &str) -> Result<usize, ConfigError> {
    const EXPECTED: &str = "an integer number of MiB greater than 20";
    let bad = || ConfigError::BadValue {
        key: "max_split_size_mb",
        value: value.into(),
        expected: EXPECTED,
    };
    let mb: usize = value.parse().map_err(|_| bad())?;
    if mb <= KLARGE_BUFFER / MIB {
        return Err(bad());
    }
    Ok(mb.saturating_mul(MIB))
}

fn parse_unit_interval(
    key: &'static str,
    value: &str,
    accept: impl Fn(f64) -> bool,
    expected: &'static str,
) -> Result<f64, ConfigError> {
    match value.parse::<f64>() {
        Ok(v) if accept(v) => Ok(v),
        _ => Err(ConfigError::BadValue {
            key,
            value: value.into(),
            expected,
        }),
    }
}

/// Validates a memory fraction for `set_memory_fraction`.
pub(crate) fn check_fraction(fraction: f64) -> Result<f64, ConfigError> {
    if fraction > 0.0 && fraction <= 1.0 {
        Ok(fraction)
    } else {
        Err(ConfigError::InvalidFraction(fraction))
    }
}
