//! `cargo xtask dist`: a release `hip-doctor` that starts on old Linux nodes.
//!
//! The binary is linked by cargo-zigbuild (zig as the linker, from the `ziglang` Python
//! package) against glibc 2.17 (target `x86_64-unknown-linux-gnu.2.17`), the oldest glibc of the
//! systems DTK runs on (CentOS 7). Build scripts (hip-kernels' hipcc step) still run on the host;
//! only the final link is retargeted. The written file is then checked: every versioned symbol
//! it imports, and every version its `.gnu.version_r` section requires, must be at most
//! [`LIMITS`]; otherwise the task fails naming the symbol. The last line printed is the path of
//! the checked binary.

use object::elf::{FileHeader64, SHT_DYNSYM};
use object::read::elf::{FileHeader, Sym};
use object::read::SymbolIndex;
use object::Endianness;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The zig target: the host triple with the glibc version to link against.
pub const ZIG_TARGET: &str = "x86_64-unknown-linux-gnu.2.17";

/// The cargo target directory name of [`ZIG_TARGET`] (cargo-zigbuild drops the glibc suffix).
const TARGET_DIR: &str = "x86_64-unknown-linux-gnu";

/// The newest version allowed for each versioned library: glibc 2.17, and the libstdc++ of
/// GCC 4.8.5 (CentOS 7's), in case a C++ object ever gets linked in.
pub const LIMITS: [(&str, &[u32]); 3] = [
    ("GLIBC_", &[2, 17]),
    ("GLIBCXX_", &[3, 4, 19]),
    ("CXXABI_", &[1, 3, 7]),
];

/// Why `cargo xtask dist` failed.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A tool the build needs is missing.
    #[error("{tool} is not installed ({why}); install it with `{install}`")]
    MissingTool {
        /// The tool.
        tool: &'static str,
        /// What running it said.
        why: String,
        /// The command that installs it.
        install: &'static str,
    },
    /// The build command failed.
    #[error("`{command}` failed ({status}); see its output above")]
    Build {
        /// The command line.
        command: String,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// A file could not be read, written or copied.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not a 64-bit ELF whose dynamic symbols and versions can be read.
    #[error("{path} is not a readable 64-bit ELF file: {message}")]
    Elf {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// The binary needs a library version newer than [`LIMITS`] allows.
    #[error("{path}: symbol `{symbol}` needs {version} (from {library}), newer than {limit}: the binary would not start on older systems; check that the build went through cargo-zigbuild with target {ZIG_TARGET}")]
    TooNew {
        /// The file.
        path: PathBuf,
        /// The symbol (or `(no symbol)` for a version required by `.gnu.version_r` alone).
        symbol: String,
        /// The required version, e.g. `GLIBC_2.34`.
        version: String,
        /// The library the version belongs to, e.g. `libc.so.6`.
        library: String,
        /// The newest version allowed, e.g. `GLIBC_2.17`.
        limit: String,
    },
}

/// One versioned import of a binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The symbol, or `(no symbol)` for a version listed in `.gnu.version_r` only.
    pub symbol: String,
    /// The version name, e.g. `GLIBC_2.17`.
    pub version: String,
    /// The library, e.g. `libc.so.6`.
    pub library: String,
}

/// Builds, copies to `target/dist/hip-doctor`, checks, and prints the path last.
pub fn run() -> Result<(), DistError> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    require_tools()?;
    let args = [
        "zigbuild",
        "--release",
        "-p",
        "hip-doctor",
        "--bin",
        "hip-doctor",
        "--target",
        ZIG_TARGET,
    ];
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(&root)
        .status()
        .map_err(|e| DistError::MissingTool {
            tool: "cargo",
            why: e.to_string(),
            install: "rustup (https://rustup.rs)",
        })?;
    if !status.success() {
        return Err(DistError::Build {
            command: format!("cargo {}", args.join(" ")),
            status,
        });
    }
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let built = target.join(TARGET_DIR).join("release").join("hip-doctor");
    let dist = target.join("dist");
    std::fs::create_dir_all(&dist).map_err(|source| DistError::Io {
        path: dist.clone(),
        source,
    })?;
    let out = dist.join("hip-doctor");
    std::fs::copy(&built, &out).map_err(|source| DistError::Io {
        path: built.clone(),
        source,
    })?;
    let bytes = std::fs::read(&out).map_err(|source| DistError::Io {
        path: out.clone(),
        source,
    })?;
    let needs = requirements(&bytes).map_err(|message| DistError::Elf {
        path: out.clone(),
        message,
    })?;
    check(&needs).map_err(|(need, limit)| DistError::TooNew {
        path: out.clone(),
        symbol: need.symbol.clone(),
        version: need.version.clone(),
        library: need.library.clone(),
        limit,
    })?;
    for (prefix, _) in LIMITS {
        if let Some(max) = newest(&needs, prefix) {
            println!("newest {prefix}* version required: {max}");
        }
    }
    let size = bytes.len() as f64 / (1 << 20) as f64;
    println!("hip-doctor for glibc >= 2.17 ({size:.1} MiB):");
    let shown = out.canonicalize().unwrap_or(out);
    println!("{}", shown.display());
    Ok(())
}

/// Fails naming the missing tool when cargo-zigbuild or zig cannot run.
fn require_tools() -> Result<(), DistError> {
    let probe = |cmd: &mut Command| match cmd.output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        Err(e) => Err(e.to_string()),
    };
    probe(Command::new("cargo-zigbuild").arg("--version")).map_err(|why| {
        DistError::MissingTool {
            tool: "cargo-zigbuild",
            why,
            install: "cargo install cargo-zigbuild --locked",
        }
    })?;
    // cargo-zigbuild runs `zig` from PATH, or `python3 -m ziglang` (the PyPI package).
    probe(Command::new("zig").arg("version"))
        .or_else(|_| probe(Command::new("python3").args(["-m", "ziglang", "version"])))
        .map_err(|why| DistError::MissingTool {
            tool: "zig",
            why,
            install: "pip install ziglang",
        })
}

/// Every versioned import of the ELF file `data`: its dynamic symbols with their versions, and
/// each version `.gnu.version_r` requires (a version no symbol uses is still checked by the
/// loader, so it counts too, as `(no symbol)`).
pub fn requirements(data: &[u8]) -> Result<Vec<Requirement>, String> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let header = FileHeader64::<Endianness>::parse(data).map_err(|e| e.to_string())?;
    let endian = header.endian().map_err(|e| e.to_string())?;
    let sections = header.sections(endian, data).map_err(|e| e.to_string())?;
    let symbols = sections
        .symbols(endian, data, SHT_DYNSYM)
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    if let Some(versions) = sections.versions(endian, data).map_err(|e| e.to_string())? {
        for (index, sym) in symbols.symbols().iter().enumerate() {
            let version = versions
                .version(versions.version_index(endian, SymbolIndex(index)))
                .map_err(|e| e.to_string())?;
            let Some(version) = version else { continue };
            let name = sym
                .name(endian, symbols.strings())
                .map_err(|e| e.to_string())?;
            out.push(Requirement {
                symbol: text(name),
                version: text(version.name()),
                library: version.file().map(text).unwrap_or_default(),
            });
        }
    }
    if let Some((mut needs, link)) = sections
        .gnu_verneed(endian, data)
        .map_err(|e| e.to_string())?
    {
        let strings = sections
            .strings(endian, data, link)
            .map_err(|e| e.to_string())?;
        while let Some((need, mut auxes)) = needs.next().map_err(|e| e.to_string())? {
            let library = text(need.file(endian, strings).map_err(|e| e.to_string())?);
            while let Some(aux) = auxes.next().map_err(|e| e.to_string())? {
                let version = text(aux.name(endian, strings).map_err(|e| e.to_string())?);
                if !out.iter().any(|r| r.version == version) {
                    out.push(Requirement {
                        symbol: "(no symbol)".into(),
                        version,
                        library: library.clone(),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// The numbers of a version name with `prefix` (`GLIBC_2.17` → `[2, 17]`); `None` for another
/// prefix or a name that is not dotted numbers (`GLIBC_PRIVATE`).
fn numbers(version: &str, prefix: &str) -> Option<Vec<u32>> {
    let rest = version.strip_prefix(prefix)?;
    rest.split('.').map(|p| p.parse().ok()).collect()
}

/// The first requirement newer than [`LIMITS`], with the limit's name. `GLIBC_PRIVATE` and the
/// like are no version number and are never allowed.
pub fn check(needs: &[Requirement]) -> Result<(), (&Requirement, String)> {
    for need in needs {
        for (prefix, max) in LIMITS {
            let limit = || {
                let dotted: Vec<String> = max.iter().map(u32::to_string).collect();
                format!("{prefix}{}", dotted.join("."))
            };
            if !need.version.starts_with(prefix) {
                continue;
            }
            match numbers(&need.version, prefix) {
                Some(v) if v.as_slice() <= max => {}
                _ => return Err((need, limit())),
            }
        }
    }
    Ok(())
}

/// The newest version with `prefix` that `needs` require, e.g. `GLIBC_2.17`.
pub fn newest(needs: &[Requirement], prefix: &str) -> Option<String> {
    needs
        .iter()
        .filter_map(|n| numbers(&n.version, prefix).map(|v| (v, &n.version)))
        .max()
        .map(|(_, name)| name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(symbol: &str, version: &str) -> Requirement {
        Requirement {
            symbol: symbol.into(),
            version: version.into(),
            library: "libc.so.6".into(),
        }
    }

    #[test]
    fn versions_up_to_the_limit_pass_and_newer_ones_name_the_symbol() {
        let ok = [
            need("memcpy", "GLIBC_2.14"),
            need("dlopen", "GLIBC_2.2.5"),
            need("pthread_create", "GLIBC_2.17"),
            need("_Unwind_Resume", "GCC_3.0"),
        ];
        assert_eq!(check(&ok), Ok(()));
        assert_eq!(newest(&ok, "GLIBC_").as_deref(), Some("GLIBC_2.17"));
        let bad = [need("memcpy", "GLIBC_2.14"), need("dlopen", "GLIBC_2.34")];
        let (which, limit) = check(&bad).expect_err("2.34 > 2.17");
        assert_eq!(which.symbol, "dlopen");
        assert_eq!(limit, "GLIBC_2.17");
        let private = [need("_dl_x", "GLIBC_PRIVATE")];
        assert!(check(&private).is_err());
        let cxx = [need("_ZSt4cout", "GLIBCXX_3.4.21")];
        assert_eq!(
            check(&cxx).map_err(|(_, l)| l),
            Err("GLIBCXX_3.4.19".into())
        );
    }

    #[test]
    fn the_running_xtask_is_read() {
        // This test binary is a host build (glibc of this machine): its requirements are read
        // and include glibc versions, and `newest` finds one.
        let exe = std::env::current_exe().expect("current exe");
        let bytes = std::fs::read(exe).expect("read the test binary");
        let needs = requirements(&bytes).expect("an ELF");
        assert!(
            needs.iter().any(|n| n.version.starts_with("GLIBC_2.")),
            "{needs:?}"
        );
        let Some(max) = newest(&needs, "GLIBC_") else {
            panic!("no GLIBC_ version in {needs:?}")
        };
        // Built here against a glibc newer than 2.17 (2.34 or later moved symbols into libc
        // under new versions): the check must refuse it and name the symbol.
        if numbers(&max, "GLIBC_").is_some_and(|v| v.as_slice() > [2, 17].as_slice()) {
            let (which, limit) = check(&needs).expect_err("a host build needs more than 2.17");
            assert_eq!(limit, "GLIBC_2.17");
            assert!(!which.symbol.is_empty() && which.version.starts_with("GLIBC_2."));
            println!("refused: {} needs {}", which.symbol, which.version);
        }
    }

    #[test]
    fn not_an_elf_is_an_error() {
        assert!(requirements(b"#!/bin/sh\necho hi\n").is_err());
    }
}
