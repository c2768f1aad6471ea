//! Runtime version decoding and the DTK-vs-ROCm flavour decision (pure functions).

use std::fmt;
use std::path::{Path, PathBuf};

/// A decoded `hipRuntimeGetVersion` value: `major * 10_000_000 + minor * 100_000 + patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuntimeVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
    /// The integer the runtime returned.
    pub raw: i32,
}

impl RuntimeVersion {
    /// Decode the integer from `hipRuntimeGetVersion` (e.g. 50221153 -> 5.2.21153). `None` for a
    /// negative value, which no runtime returns.
    pub fn decode(raw: i32) -> Option<Self> {
        let v = u32::try_from(raw).ok()?;
        Some(RuntimeVersion {
            major: v / 10_000_000,
            minor: (v % 10_000_000) / 100_000,
            patch: v % 100_000,
            raw,
        })
    }

    /// Whether the runtime is at least `major.minor`.
    pub fn at_least(&self, major: u32, minor: u32) -> bool {
        (self.major, self.minor) >= (major, minor)
    }
}

impl fmt::Display for RuntimeVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Which HIP stack the loaded runtime belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavour {
    /// Hygon DTK (libgalaxyhip; renumbered `hipDeviceAttribute_t`).
    Dtk,
    /// Upstream AMD ROCm (or Debian's packaging of it).
    Rocm,
}

impl fmt::Display for Flavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Flavour::Dtk => "DTK",
            Flavour::Rocm => "ROCm",
        })
    }
}

/// Name of the file DTK installs at its root (`/opt/dtk/.dtk_version`).
pub const DTK_VERSION_FILE: &str = ".dtk_version";

/// Symbols that only DTK's runtime exports. Empty: no DTK-only export has been confirmed from a
/// public source yet, so detection relies on the file name and the install tree. Listed here so
/// that adding one is a one-line change that [`FlavourEvidence::gather`] picks up.
pub const DTK_ONLY_SYMBOLS: &[&str] = &[];

/// What the flavour decision is based on (shown by `hip-doctor`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FlavourEvidence {
    /// The loaded file's name contains "galaxyhip" (DTK's runtime name).
    pub galaxyhip_name: bool,
    /// A `.dtk_version` file in a directory above the loaded library (its install root).
    pub dtk_version_file: Option<PathBuf>,
    /// DTK-only symbols the library exports.
    pub dtk_symbols: Vec<&'static str>,
}

impl FlavourEvidence {
    /// Collect the evidence for the library at `library_path` (ideally canonicalised, so that a
    /// `/opt/dtk -> /opt/dtk-24.04` link still finds the version file). `is_file` and
    /// `has_symbol` are the filesystem and symbol probes.
    pub fn gather(
        library_path: &Path,
        is_file: &dyn Fn(&Path) -> bool,
        has_symbol: &dyn Fn(&str) -> bool,
    ) -> Self {
        let galaxyhip_name = library_path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains("galaxyhip"));
        let dtk_version_file = library_path
            .ancestors()
            .skip(1)
            .map(|dir| dir.join(DTK_VERSION_FILE))
            .find(|candidate| is_file(candidate));
        let dtk_symbols = DTK_ONLY_SYMBOLS
            .iter()
            .copied()
            .filter(|s| has_symbol(s))
            .collect();
        FlavourEvidence {
            galaxyhip_name,
            dtk_version_file,
            dtk_symbols,
        }
    }

    /// DTK if any piece of evidence says so, else ROCm.
    pub fn flavour(&self) -> Flavour {
        if self.galaxyhip_name || self.dtk_version_file.is_some() || !self.dtk_symbols.is_empty() {
            Flavour::Dtk
        } else {
            Flavour::Rocm
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_debian_5_2() {
        let v = RuntimeVersion::decode(50221153).unwrap();
        assert_eq!((v.major, v.minor, v.patch), (5, 2, 21153));
        assert_eq!(v.to_string(), "5.2.21153");
        assert!(v.at_least(5, 2) && !v.at_least(6, 0));
    }

    #[test]
    fn decodes_other_versions() {
        let cases = [
            (60342134, (6, 3, 42134)),
            (50700000, (5, 7, 0)),
            (70000001, (7, 0, 1)),
            (0, (0, 0, 0)),
        ];
        for (raw, want) in cases {
            let v = RuntimeVersion::decode(raw).unwrap();
            assert_eq!((v.major, v.minor, v.patch), want, "raw {raw}");
        }
        assert_eq!(RuntimeVersion::decode(-1), None);
    }

    #[test]
    fn flavour_from_evidence() {
        let files = ["/opt/dtk-24.04/.dtk_version"];
        let is_file = |p: &Path| files.iter().any(|f| Path::new(f) == p);
        let no_symbols = |_: &str| false;
        let cases = [
            ("/opt/dtk-24.04/hip/lib/libamdhip64.so", Flavour::Dtk, true),
            ("/opt/dtk-24.04/lib/libgalaxyhip.so.5", Flavour::Dtk, true),
            ("/usr/lib/libgalaxyhip.so.5", Flavour::Dtk, false),
            ("/opt/rocm-6.3.0/lib/libamdhip64.so.6", Flavour::Rocm, false),
            (
                "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5",
                Flavour::Rocm,
                false,
            ),
        ];
        for (path, want, has_version_file) in cases {
            let e = FlavourEvidence::gather(Path::new(path), &is_file, &no_symbols);
            assert_eq!(e.flavour(), want, "{path}: {e:?}");
            assert_eq!(e.dtk_version_file.is_some(), has_version_file, "{path}");
        }
        let with_symbol = FlavourEvidence {
            dtk_symbols: vec!["hypotheticalDtkOnly"],
            ..Default::default()
        };
        assert_eq!(with_symbol.flavour(), Flavour::Dtk);
    }
}
