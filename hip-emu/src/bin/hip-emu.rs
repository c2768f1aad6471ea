//! `hip-emu`: runs a command on the emulated HIP device, in the spirit of `compute-sanitizer`.
//!
//! ```text
//! hip-emu run [--devices N] [--race] [--seed S] [--lazy] -- cargo test --features device
//! hip-emu lib          # prints the path of libhip_emu.so
//! ```
//!
//! `run` sets `HIPK_HIP_LIBRARY`, `HIPK_HIPBLAS_LIBRARY`, `HIPK_ROCBLAS_LIBRARY` and
//! `HIPK_RCCL_LIBRARY` to libhip_emu.so (and `HIPK_EMU_DEVICES`, `HIPK_EMU_RACE_CHECK=1`,
//! `HIPK_EMU_SEED`, `HIPK_EMU_LAZY=1` from the options), runs the command and exits with its status.
//!
//! The library: `HIPK_EMU_LIBRARY` if set; else `libhip_emu.so` next to this executable (Cargo
//! builds both into `target/<profile>/`), in its `deps/` or in `../lib`; else it is built once from this
//! runner's own sources (`cargo build --release --lib`, which `cargo install --git` and
//! `cargo install --path` leave in place) into `~/.cache/hip-emu/<version>/`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

const USAGE: &str =
    "usage: hip-emu run [--devices N] [--race] [--seed S] [--lazy] -- <command> [args...]
       hip-emu lib
Runs <command> with HIP, hipBLAS, rocBLAS and RCCL pointed at hip-emu (libhip_emu.so), the
emulated HIP device on the CPU (not a GPU: nothing it measures is a device figure).
  --devices N   number of emulated devices (HIPK_EMU_DEVICES)
  --race        build the kernels with hip-emu's LDS race check (HIPK_EMU_RACE_CHECK=1; takes
                effect when the command builds them, e.g. cargo test)
  --seed S      shuffle block order and stream choice (HIPK_EMU_SEED)
  --lazy        run queued work only when the host waits for it, or after 20 ms
                (HIPK_EMU_LAZY=1; with --seed, exposes missing stream and host waits)
Library: HIPK_EMU_LIBRARY, else next to this executable or in ../lib, else built from source.";

fn main() -> ExitCode {
    // OsStrings: the command and its arguments are passed on as given, UTF-8 or not.
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match run(&args) {
        Ok(code) => code,
        Err(msg) => {
            eprintln!("hip-emu: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[OsString]) -> Result<ExitCode, String> {
    match args.first().and_then(|a| a.to_str()) {
        Some("lib") => {
            println!("{}", library()?.display());
            Ok(ExitCode::SUCCESS)
        }
        Some("run") => {
            let mut env: Vec<(&str, String)> = Vec::new();
            let mut rest = &args[1..];
            loop {
                // Options are UTF-8; anything else ends them (the command itself).
                match rest.first().and_then(|a| a.to_str()) {
                    Some("--") => {
                        rest = &rest[1..];
                        break;
                    }
                    Some("--race") => {
                        env.push(("HIPK_EMU_RACE_CHECK", "1".into()));
                        rest = &rest[1..];
                    }
                    Some("--lazy") => {
                        env.push(("HIPK_EMU_LAZY", "1".into()));
                        rest = &rest[1..];
                    }
                    Some(flag @ ("--devices" | "--seed")) => {
                        let raw = rest
                            .get(1)
                            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
                        let value = raw
                            .to_str()
                            .filter(|v| v.parse::<u64>().is_ok())
                            .ok_or_else(|| {
                                format!("{flag} {}: not a number\n{USAGE}", raw.to_string_lossy())
                            })?;
                        let var = if flag == "--devices" {
                            "HIPK_EMU_DEVICES"
                        } else {
                            "HIPK_EMU_SEED"
                        };
                        env.push((var, value.to_string()));
                        rest = &rest[2..];
                    }
                    Some(other) if other.starts_with('-') => {
                        return Err(format!("unknown option {other}\n{USAGE}"))
                    }
                    None if rest
                        .first()
                        .is_some_and(|a| a.as_encoded_bytes().starts_with(b"-")) =>
                    {
                        return Err(format!(
                            "unknown option {}\n{USAGE}",
                            rest[0].to_string_lossy()
                        ))
                    }
                    _ => break,
                }
            }
            let (program, program_args) = rest
                .split_first()
                .ok_or_else(|| format!("no command to run\n{USAGE}"))?;
            let lib = library()?;
            let mut cmd = Command::new(program);
            cmd.args(program_args);
            for var in [
                "HIPK_HIP_LIBRARY",
                "HIPK_HIPBLAS_LIBRARY",
                "HIPK_ROCBLAS_LIBRARY",
                "HIPK_RCCL_LIBRARY",
            ] {
                cmd.env(var, &lib);
            }
            for (k, v) in env {
                cmd.env(k, v);
            }
            let status = cmd
                .status()
                .map_err(|e| format!("cannot run {}: {e}", program.to_string_lossy()))?;
            Ok(match status.code() {
                Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
                None => {
                    use std::os::unix::process::ExitStatusExt;
                    ExitCode::from(128u8.wrapping_add(status.signal().unwrap_or(0) as u8))
                }
            })
        }
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            Ok(ExitCode::SUCCESS)
        }
        _ => Err(USAGE.into()),
    }
}

/// libhip_emu.so: see the module docs for the search order.
fn library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("HIPK_EMU_LIBRARY").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("HIPK_EMU_LIBRARY={} is not a file", p.display()))
        };
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    if let Some(dir) = exe.parent() {
        for candidate in [
            dir.join("libhip_emu.so"),
            dir.join("deps/libhip_emu.so"),
            dir.join("../lib/libhip_emu.so"),
        ] {
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    build_from_source()
}

/// Builds libhip_emu.so from the sources this runner was built from (release) into the cache.
fn build_from_source() -> Result<PathBuf, String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    if !manifest.is_file() {
        return Err(format!(
            "libhip_emu.so is not next to this executable and its sources ({}) are gone: set \
             HIPK_EMU_LIBRARY, or reinstall (cargo install --git <repository> hip-emu)",
            manifest.display()
        ));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .ok_or("neither XDG_CACHE_HOME nor HOME is set: set HIPK_EMU_LIBRARY")?
        .join("hip-emu")
        .join(env!("CARGO_PKG_VERSION"));
    let lib = cache.join("release").join("libhip_emu.so");
    if lib.is_file() {
        return Ok(lib);
    }
    eprintln!(
        "hip-emu: building libhip_emu.so once from {} into {}",
        manifest.display(),
        cache.display()
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--lib", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&cache)
        .status()
        .map_err(|e| format!("cannot run cargo to build libhip_emu.so: {e}"))?;
    if !status.success() || !lib.is_file() {
        return Err(format!("building libhip_emu.so failed ({status})"));
    }
    Ok(lib)
}
