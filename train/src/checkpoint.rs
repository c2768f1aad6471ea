//! Checkpoints `DIR/step_<s>/`: `model.safetensors` (f32, names without prefix) + `config.json`
//! (loadable with `--model`), `optimizer.safetensors` (`exp_avg.<name>`, `exp_avg_sq.<name>`) and
//! `trainer.json`. Written into a temporary directory beside it, synced, then renamed.
//!
//! Every temporary is created exclusively under a fresh random name (`tempfile`), so a file or
//! symlink planted at a predictable name is never opened, and is removed again when a save fails.
//! Temporaries are named `.step_<s>.tmp.<pid>.<random>`, `.step_<s>.old.<pid>.<random>` and
//! `.write-probe.<pid>.<random>`. Each names its owner in an owner file (`.owner` inside a
//! directory, the probe's own content: host name, boot id, pid; [`hip_kernels::files::Owner`])
//! that the owner keeps locked (`flock`) while it runs. [`prepare_dir`] removes a temporary only
//! when its owner provably ended (its lock is free), never by a pid alone: a pid names no process
//! of another PID namespace (a container, another node on a shared file system). A temporary
//! without an owner record (an older version's, or a kill in the instant before the record was
//! written) is kept, with a warning.
//!
//! Replacing an existing `step_<s>` moves it aside (into `.step_<s>.old.*`) and then renames the
//! new one in. A kill between the two leaves no `step_<s>`: the next [`prepare_dir`] (or a
//! `--resume` of that step) moves the old one back.

use crate::config::GptConfig;
use crate::error::{read_regular, Result, TrainError};
use crate::params::{specs, Params};
use crate::weights::{load_params, params_to_safetensors, read_f32_tensors, to_safetensors};
use hip_kernels::files::{FileLock, Liveness, Owner};
use std::io::Write;
use std::path::{Path, PathBuf};

pub use crate::trainer_state::{TrainerState, FORMAT};

/// Host copies of what a checkpoint holds.
pub struct Snapshot<'a> {
    /// Model config (written back as read).
    pub config: &'a GptConfig,
    /// f32 parameters.
    pub params: &'a Params<Vec<f32>>,
    /// AdamW first moments.
    pub exp_avg: &'a Params<Vec<f32>>,
    /// AdamW second moments.
    pub exp_avg_sq: &'a Params<Vec<f32>>,
    /// Trainer state.
    pub state: &'a TrainerState,
}

/// Make `dir` (and parents), prove it writable, and remove the stale temporaries of earlier runs
/// (see the module docs), before training starts.
pub fn prepare_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(TrainError::io(dir))?;
    let not_writable = |e: std::io::Error| {
        TrainError::file(dir, format!("checkpoint directory is not writable: {e}"))
    };
    let mut probe = tempfile::Builder::new()
        .prefix(&format!(".write-probe.{}.", std::process::id()))
        .tempfile_in(dir)
        .map_err(not_writable)?;
    // The probe is its own owner file: locked, then the record written.
    let lock = probe
        .as_file()
        .try_clone()
        .and_then(FileLock::try_lock)
        .map_err(not_writable)?;
    probe
        .write_all(Owner::this().record().as_bytes())
        .map_err(not_writable)?;
    probe.close().map_err(not_writable)?;
    drop(lock);
    remove_stale_temporaries(dir)
}

/// The owner file inside a temporary directory.
const OWNER_FILE: &str = ".owner";

/// The pid in `name` if it is one of our temporaries: `.step_<s>.tmp.<pid>[.<random>]`,
/// `.step_<s>.old.<pid>[.<random>]` or `.write-probe.<pid>[.<random>]`.
pub fn temporary_pid(name: &str) -> Option<u32> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let rest = match name.strip_prefix(".write-probe.") {
        Some(r) => r,
        None => {
            let (step, r) = name.strip_prefix(".step_")?.split_once('.')?;
            if !digits(step) {
                return None;
            }
            r.strip_prefix("tmp.").or_else(|| r.strip_prefix("old."))?
        }
    };
    let (pid, random) = match rest.split_once('.') {
        Some((p, r)) => (p, Some(r)),
        None => (rest, None),
    };
    let random_ok = random.map_or(true, |r| {
        !r.is_empty() && r.bytes().all(|b| b.is_ascii_alphanumeric())
    });
    if !(digits(pid) && random_ok) {
        return None;
    }
    pid.parse().ok()
}

/// Whether `path` is a directory (not through a symlink).
fn is_real_dir(path: &Path) -> bool {
    path.symlink_metadata().is_ok_and(|m| m.is_dir())
}

/// Handle the temporaries of runs that ended (see the module docs): a moved-aside `step_<s>`
/// whose replacement never arrived is moved back; the rest is removed. `.step_*` directories and
/// `.write-probe.*` regular files of our naming only (a symlink is never ours, and is left). A
/// temporary that cannot be removed, or whose owner cannot be proved ended, is reported and
/// left; training goes on.
fn remove_stale_temporaries(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(TrainError::io(dir))? {
        let entry = entry.map_err(TrainError::io(dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| temporary_pid(n).is_some()) else {
            continue;
        };
        // file_type() does not follow symlinks.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        let step_dir = name.starts_with(".step_");
        if (step_dir && !kind.is_dir()) || (!step_dir && !kind.is_file()) {
            continue;
        }
        let owner_file = if step_dir {
            path.join(OWNER_FILE)
        } else {
            path.clone()
        };
        if Owner::liveness(&owner_file) != Liveness::Dead {
            if !owner_file.exists() {
                eprintln!(
                    "warning: kept {}: it has no owner record, so whether the run that made it                      still runs cannot be told; remove it by hand when no run uses {}{}",
                    path.display(),
                    dir.display(),
                    aside_hint(dir, &path)
                );
            }
            continue;
        }
        if step_dir {
            recover_aside(dir, &path)?;
        }
        let removed = if step_dir {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if let Err(e) = removed {
            eprintln!(
                "warning: could not remove the stale temporary {}: {e}",
                path.display()
            );
        }
    }
    Ok(())
}

/// The `step_<s>` a `.step_<s>.old.*` temporary `tmp` holds, if it holds one.
fn aside_of(tmp: &Path) -> Option<(String, PathBuf)> {
    let name = tmp.file_name()?.to_str()?;
    let (step, rest) = name.strip_prefix(".step_")?.split_once('.')?;
    rest.starts_with("old.").then_some(())?;
    let inner = tmp.join(format!("step_{step}"));
    is_real_dir(&inner).then(|| (format!("step_{step}"), inner))
}

/// For a warning: how to restore the checkpoint a kept `.old` temporary holds, when its
/// `step_<s>` is missing.
fn aside_hint(dir: &Path, tmp: &Path) -> String {
    match aside_of(tmp) {
        Some((name, inner)) if dir.join(&name).symlink_metadata().is_err() => format!(
            "; it holds {name}, moved aside by an interrupted save: restore it with `mv {} {}`",
            inner.display(),
            dir.display()
        ),
        _ => String::new(),
    }
}

/// Move the checkpoint held by the ended owner's `.step_<s>.old.*` temporary `tmp` back to
/// `dir/step_<s>` when that is missing (a save killed between moving the old one aside and
/// renaming the new one in). Returns whether it moved one.
fn recover_aside(dir: &Path, tmp: &Path) -> Result<bool> {
    let Some((name, inner)) = aside_of(tmp) else {
        return Ok(false);
    };
    let target = dir.join(&name);
    if target.symlink_metadata().is_ok() {
        return Ok(false);
    }
    std::fs::rename(&inner, &target).map_err(TrainError::io(&target))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    eprintln!(
        "note: restored {} from {} (a save of it was interrupted before the new one was \
         renamed in)",
        target.display(),
        tmp.display()
    );
    Ok(true)
}

/// Before a `--resume` of `ckpt` that does not exist: restore it if an interrupted save moved
/// it aside (its owner ended).
pub(crate) fn recover_for_resume(ckpt: &Path) -> Result<()> {
    let (Some(dir), Some(name)) = (ckpt.parent(), ckpt.file_name().and_then(|n| n.to_str())) else {
        return Ok(());
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let Some(step) = name.strip_prefix("step_") else {
        return Ok(());
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let prefix = format!(".step_{step}.old.");
    for entry in entries.flatten() {
        let path = entry.path();
        let ours = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix) && temporary_pid(n).is_some());
        if ours
            && is_real_dir(&path)
            && Owner::liveness(&path.join(OWNER_FILE)) == Liveness::Dead
            && recover_aside(dir, &path)?
        {
            let _ = std::fs::remove_dir_all(&path);
            return Ok(());
        }
    }
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// Tests only: called with each checkpoint file's path before it is written; an error
    /// stands for a failed write (a full disk).
    pub static WRITE_FAULT: std::cell::RefCell<Option<WriteFault>> =
        const { std::cell::RefCell::new(None) };
}

/// The type of [`WRITE_FAULT`].
#[cfg(test)]
pub type WriteFault = Box<dyn Fn(&Path) -> std::io::Result<()>>;

/// Write a new file (never an existing one, nor through a symlink) and sync it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    #[cfg(test)]
    WRITE_FAULT
        .with(|f| f.borrow().as_ref().map_or(Ok(()), |f| f(path)))
        .map_err(TrainError::io(path))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(TrainError::io(path))?;
    f.write_all(bytes).map_err(TrainError::io(path))?;
    f.sync_all().map_err(TrainError::io(path))
}

fn moments_to_safetensors(snap: &Snapshot<'_>) -> Result<Vec<u8>> {
    let specs = specs(snap.config);
    let mut list = Vec::with_capacity(2 * specs.len());
    for (prefix, moments) in [("exp_avg", snap.exp_avg), ("exp_avg_sq", snap.exp_avg_sq)] {
        for (s, t) in specs.iter().zip(moments.iter()) {
            list.push((
                format!("{prefix}.{}", s.name),
                s.shape.clone(),
                t.as_slice(),
            ));
        }
    }
    to_safetensors(&list)
}

/// A temporary directory of ours with its owner file claimed (locked while it lives).
struct OwnedTemp {
    dir: tempfile::TempDir,
    lock: FileLock,
}

impl OwnedTemp {
    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A new temporary directory `dir/.step_<s>.<kind>.<pid>.<random>` holding only its owner file
/// (mode 0777 less the umask, as `create_dir` makes), removed with its content when dropped.
fn temp_dir(dir: &Path, step: u64, kind: &str) -> Result<OwnedTemp> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::Builder::new()
        .prefix(&format!(".step_{step}.{kind}.{}.", std::process::id()))
        .permissions(std::fs::Permissions::from_mode(0o777))
        .tempdir_in(dir)
        .map_err(TrainError::io(dir))?;
    let owner = tmp.path().join(OWNER_FILE);
    let lock = Owner::claim(&owner).map_err(TrainError::io(&owner))?;
    Ok(OwnedTemp { dir: tmp, lock })
}

#[cfg(test)]
thread_local! {
    /// Tests only: stop a save as a kill would, right after the old `step_<s>` moved aside
    /// (its temporaries stay, their owner's locks are released).
    pub static KILL_AFTER_ASIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Write `dir/step_<s>/` atomically; returns its path. On any failure the temporary directory
/// is removed and an earlier `step_<s>` stays as it was.
pub fn save(dir: &Path, snap: &Snapshot<'_>) -> Result<PathBuf> {
    let config = serde_json::to_vec_pretty(&snap.config.raw)
        .map_err(|e| TrainError::Op(format!("serializing config.json: {e}")))?;
    let state = serde_json::to_vec_pretty(snap.state)
        .map_err(|e| TrainError::Op(format!("serializing trainer.json: {e}")))?;
    save_files(
        dir,
        snap.state.step,
        &[
            ("config.json", config),
            (
                "model.safetensors",
                params_to_safetensors(snap.params, snap.config)?,
            ),
            ("optimizer.safetensors", moments_to_safetensors(snap)?),
            ("trainer.json", state),
        ],
    )
}

/// Write `files` (name, bytes) as `dir/step_<step>/` atomically, as [`save`] does; returns its
/// path.
pub fn save_files(dir: &Path, step: u64, files: &[(&str, Vec<u8>)]) -> Result<PathBuf> {
    let final_dir = dir.join(format!("step_{step}"));
    let tmp = temp_dir(dir, step, "tmp")?;
    for (name, bytes) in files {
        write_synced(&tmp.path().join(name), bytes)?;
    }
    // The owner file stays out of the checkpoint (the lock is held until the rename is done).
    let owner = tmp.path().join(OWNER_FILE);
    let in_place = |tmp: OwnedTemp| -> Result<()> {
        std::fs::remove_file(&owner).map_err(TrainError::io(&owner))?;
        std::fs::rename(tmp.path(), &final_dir).map_err(TrainError::io(&final_dir))?;
        let OwnedTemp { dir, lock } = tmp;
        let _ = dir.keep();
        drop(lock);
        Ok(())
    };
    if final_dir.symlink_metadata().is_ok() {
        // Never a half-written checkpoint under the final name: the old one moves aside whole
        // (into a temporary directory that removes it when dropped), and back on failure. A
        // kill in between leaves it there for the next run to move back (`recover_aside`).
        let old = temp_dir(dir, step, "old")?;
        let aside = old.path().join(format!("step_{step}"));
        std::fs::rename(&final_dir, &aside).map_err(TrainError::io(&final_dir))?;
        #[cfg(test)]
        if KILL_AFTER_ASIDE.with(std::cell::Cell::get) {
            let _ = (tmp.dir.keep(), old.dir.keep());
            return Err(TrainError::Op(
                "killed after moving the old one aside".into(),
            ));
        }
        if let Err(e) = in_place(tmp) {
            let _ = std::fs::rename(&aside, &final_dir);
            return Err(e);
        }
        old.dir.close().map_err(TrainError::io(&aside))?;
    } else {
        in_place(tmp)?;
    }
    // Make the rename durable.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(final_dir)
}

/// What [`load`] restores.
#[derive(Debug, Clone)]
pub struct Restored {
    /// Parameters.
    pub params: Params<Vec<f32>>,
    /// AdamW first moments.
    pub exp_avg: Params<Vec<f32>>,
    /// AdamW second moments.
    pub exp_avg_sq: Params<Vec<f32>>,
    /// Trainer state.
    pub state: TrainerState,
}

/// Read a checkpoint written by [`save`] for the model `cfg` (an error if it is from another
/// model, or any file is missing or malformed).
pub fn load(dir: &Path, cfg: &GptConfig) -> Result<Restored> {
    if !dir.exists() {
        recover_for_resume(dir)?;
    }
    if !dir.is_dir() {
        return Err(TrainError::file(
            dir,
            "--resume needs a checkpoint directory DIR/step_<s>",
        ));
    }
    if dir.join("adapter_config.json").exists() {
        return Err(TrainError::file(
            dir,
            "is a LoRA checkpoint (adapter_config.json): resume it with its --lora-rank, \
             --lora-alpha and --lora-targets",
        ));
    }
    let ckpt_cfg = GptConfig::load(&dir.join("config.json"))?;
    if !ckpt_cfg.same_model(cfg) {
        return Err(TrainError::file(
            dir,
            format!(
                "checkpoint is from another model ({}) than --model ({})",
                ckpt_cfg.describe(),
                cfg.describe()
            ),
        ));
    }
    let state_path = dir.join("trainer.json");
    let state = TrainerState::from_json(&state_path, &read_regular(&state_path, 1 << 20)?)?;
    let params = load_params(&dir.join("model.safetensors"), cfg)?;
    let opt_path = dir.join("optimizer.safetensors");
    let mut opt = read_f32_tensors(&opt_path)?;
    let all = specs(cfg);
    let mut take = |prefix: &str| -> Result<Params<Vec<f32>>> {
        Params::from_vec(take_moments(&opt_path, &mut opt, prefix, &all)?, cfg.layers)
    };
    let (exp_avg, exp_avg_sq) = (take("exp_avg")?, take("exp_avg_sq")?);
    if let Some(name) = opt.keys().next() {
        return Err(TrainError::file(
            &opt_path,
            format!("unexpected tensor `{name}`"),
        ));
    }
    Ok(Restored {
        params,
        exp_avg,
        exp_avg_sq,
        state,
    })
}

/// The AdamW moments `<prefix>.<name>` of every tensor of `specs` (in that order), taken out of
/// the tensors of `opt_path`; a missing or misshapen one, or a bad value
/// (`check_moment`), is an error naming it.
pub(crate) fn take_moments(
    opt_path: &Path,
    opt: &mut std::collections::BTreeMap<String, crate::weights::HostTensor>,
    prefix: &str,
    specs: &[crate::params::Spec],
) -> Result<Vec<Vec<f32>>> {
    let mut v = Vec::with_capacity(specs.len());
    for s in specs {
        let name = format!("{prefix}.{}", s.name);
        match opt.remove(&name) {
            Some((shape, data)) if shape == s.shape => {
                check_moment(opt_path, &name, &data, prefix == "exp_avg_sq")?;
                v.push(data)
            }
            Some((shape, _)) => {
                return Err(TrainError::file(
                    opt_path,
                    format!(
                        "tensor `{name}` has shape {shape:?}, expected {:?}",
                        s.shape
                    ),
                ))
            }
            None => {
                return Err(TrainError::file(
                    opt_path,
                    format!("tensor `{name}` is missing"),
                ))
            }
        }
    }
    Ok(v)
}

/// An AdamW moment read back: every value finite, and a second moment (`exp_avg_sq`, a running
/// mean of squares) never negative. A checkpoint breaking either would train on NaN.
fn check_moment(path: &Path, name: &str, data: &[f32], second: bool) -> Result<()> {
    let bad = |i: usize| !data[i].is_finite() || (second && data[i] < 0.0);
    match (0..data.len()).find(|&i| bad(i)) {
        None => Ok(()),
        Some(i) => Err(TrainError::file(
            path,
            format!(
                "tensor `{name}` holds {} at flat index {i}; {}",
                data[i],
                if second {
                    "a second moment must be finite and >= 0"
                } else {
                    "a first moment must be finite"
                }
            ),
        )),
    }
}
