//! Checkpoints `DIR/step_<s>/`: `model.safetensors` (f32, names without prefix) + `config.json`
//! (loadable with `--model`), `optimizer.safetensors` (`exp_avg.<name>`, `exp_avg_sq.<name>`) and
//! `trainer.json`. Written into a temporary directory beside it, synced, then renamed.
//!
//! Every temporary is created exclusively under a fresh random name (`tempfile`), so a file or
//! symlink planted at a predictable name is never opened, and is removed again when a save fails.
//! Temporaries are named `.step_<s>.tmp.<pid>.<random>`, `.step_<s>.old.<pid>.<random>` and
//! `.write-probe.<pid>.<random>`; [`prepare_dir`] removes those of processes that no longer run
//! (and of the older names without `.<random>`), and nothing else.

use crate::config::GptConfig;
use crate::error::{read_regular, Result, TrainError};
use crate::params::{specs, Params};
use crate::weights::{load_params, params_to_safetensors, read_f32_tensors, to_safetensors};
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
    probe.write_all(b"probe").map_err(not_writable)?;
    probe.close().map_err(not_writable)?;
    remove_stale_temporaries(dir)
}

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

/// Whether process `pid` runs (on Linux: `/proc/<pid>` exists). Without a readable `/proc`
/// every process counts as running, so nothing is removed.
fn running(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}

/// Remove the temporaries of processes that no longer run: `.step_*` directories and
/// `.write-probe.*` regular files of our naming only (a symlink is never ours, and is left).
/// A temporary that cannot be removed is reported and left; training goes on.
fn remove_stale_temporaries(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(TrainError::io(dir))? {
        let entry = entry.map_err(TrainError::io(dir))?;
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(temporary_pid) else {
            continue;
        };
        // file_type() does not follow symlinks.
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        let path = entry.path();
        let removed = if name.to_string_lossy().starts_with(".step_") {
            (kind.is_dir() && !running(pid)).then(|| std::fs::remove_dir_all(&path))
        } else {
            (kind.is_file() && !running(pid)).then(|| std::fs::remove_file(&path))
        };
        if let Some(Err(e)) = removed {
            eprintln!(
                "warning: could not remove the stale temporary {}: {e}",
                path.display()
            );
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

/// A new, empty temporary directory `dir/.step_<s>.<kind>.<pid>.<random>` (mode 0777 less the
/// umask, as `create_dir` makes), removed with its content when dropped.
fn temp_dir(dir: &Path, step: u64, kind: &str) -> Result<tempfile::TempDir> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix(&format!(".step_{step}.{kind}.{}.", std::process::id()))
        .permissions(std::fs::Permissions::from_mode(0o777))
        .tempdir_in(dir)
        .map_err(TrainError::io(dir))
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
    if final_dir.symlink_metadata().is_ok() {
        // Never a half-written checkpoint under the final name: the old one moves aside whole
        // (into a temporary directory that removes it when dropped), and back on failure.
        let old = temp_dir(dir, step, "old")?;
        let aside = old.path().join(format!("step_{step}"));
        std::fs::rename(&final_dir, &aside).map_err(TrainError::io(&final_dir))?;
        if let Err(e) = std::fs::rename(tmp.path(), &final_dir) {
            let _ = std::fs::rename(&aside, &final_dir);
            return Err(TrainError::io(&final_dir)(e));
        }
        let _ = tmp.keep();
        old.close().map_err(TrainError::io(&aside))?;
    } else {
        std::fs::rename(tmp.path(), &final_dir).map_err(TrainError::io(&final_dir))?;
        let _ = tmp.keep();
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
    let mut take = |prefix: &str| -> Result<Params<Vec<f32>>> {
        let mut v = Vec::new();
        for s in specs(cfg) {
            let name = format!("{prefix}.{}", s.name);
            match opt.remove(&name) {
                Some((shape, data)) if shape == s.shape => {
                    check_moment(&opt_path, &name, &data, prefix == "exp_avg_sq")?;
                    v.push(data)
                }
                Some((shape, _)) => {
                    return Err(TrainError::file(
                        &opt_path,
                        format!(
                            "tensor `{name}` has shape {shape:?}, expected {:?}",
                            s.shape
                        ),
                    ))
                }
                None => {
                    return Err(TrainError::file(
                        &opt_path,
                        format!("tensor `{name}` is missing"),
                    ))
                }
            }
        }
        Params::from_vec(v, cfg.layers)
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
