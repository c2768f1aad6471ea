//! No output flag may destroy an input: `--log` must not be one of the files read (also through
//! a symlink or a hard link: compared by device and inode), and `--checkpoint-dir` must not
//! replace a `step_<s>` directory (or remove a stale temporary) that holds an input. Checked
//! before anything is written; a conflict is a usage error (exit 2).

use crate::checkpoint::temporary_pid;
use crate::cli::Args;
use crate::error::{Result, TrainError};
use crate::weights::model_paths;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Every file the run reads, with the flag that names it.
fn inputs(args: &Args) -> Vec<(&'static str, PathBuf)> {
    let (model_dir, weights) = model_paths(&args.model);
    let mut v = vec![
        ("--model", weights),
        ("--model", model_dir.join("config.json")),
        ("--data", args.data.clone()),
    ];
    if let Some(dir) = &args.resume {
        for f in [
            "config.json",
            "model.safetensors",
            "optimizer.safetensors",
            "trainer.json",
            "adapter_model.safetensors",
            "adapter_config.json",
            "base_model.json",
        ] {
            v.push(("--resume", dir.join(f)));
        }
    }
    if let Some(p) = &args.lora_init {
        // A PEFT adapter directory: the two files read from it.
        if p.is_dir() {
            v.push(("--lora-init", p.join("adapter_model.safetensors")));
            v.push(("--lora-init", p.join("adapter_config.json")));
        } else {
            v.push(("--lora-init", p.clone()));
            v.push(("--lora-init", p.with_file_name("adapter_config.json")));
        }
    }
    v
}

/// Device and inode of an existing file (following symlinks).
fn file_id(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Refuse a `--log` that is one of the inputs. A log that does not exist yet is no input; an
/// input that does not exist is reported when it is read.
pub fn check_log(args: &Args) -> Result<()> {
    let Some(log) = &args.log else {
        return Ok(());
    };
    let Some(id) = file_id(log) else {
        return Ok(());
    };
    for (flag, input) in inputs(args) {
        if file_id(&input) == Some(id) {
            return Err(TrainError::Usage(format!(
                "--log {} is the same file as {} (read through {flag}); the log would overwrite \
                 it: choose another --log path",
                log.display(),
                input.display()
            )));
        }
    }
    Ok(())
}

/// Refuse a `--checkpoint-dir` whose saves of steps `first..=args.steps` would replace (or whose
/// start would clear as a stale temporary) a directory holding an input or the `--log` file.
pub fn check_checkpoint_dir(args: &Args, first: u64) -> Result<()> {
    let (Some(ck), true) = (&args.checkpoint_dir, args.save_every > 0) else {
        return Ok(());
    };
    // A directory that does not exist yet holds nothing.
    let Ok(ck) = ck.canonicalize() else {
        return Ok(());
    };
    let saved =
        |k: u64| (first..=args.steps).contains(&k) && (k % args.save_every == 0 || k == args.steps);
    let mut held = inputs(args);
    if let Some(log) = &args.log {
        held.push(("--log", log.clone()));
    }
    for (flag, file) in held {
        // The log may not exist yet: its directory decides.
        let real = file.canonicalize().or_else(|_| {
            let parent = file.parent().filter(|p| !p.as_os_str().is_empty());
            parent.unwrap_or(Path::new(".")).canonicalize()
        });
        let Ok(real) = real else { continue };
        for a in real.ancestors() {
            if a.parent() != Some(ck.as_path()) {
                continue;
            }
            let name = a.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let step = name.strip_prefix("step_").and_then(|s| s.parse().ok());
            let why = if step.is_some_and(saved) {
                "is replaced when that step is saved"
            } else if temporary_pid(name).is_some() {
                "has the name of a checkpoint temporary, which a run may clear"
            } else {
                continue;
            };
            return Err(TrainError::Usage(format!(
                "--checkpoint-dir {}: {} {why}, and it holds {flag} {}; use another \
                 --checkpoint-dir or move that file out first",
                ck.display(),
                a.display(),
                file.display()
            )));
        }
    }
    Ok(())
}
