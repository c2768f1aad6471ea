//! Checkpoints `DIR/step_<s>/`: `model.safetensors` (f32, names without prefix) + `config.json`
//! (loadable with `--model`), `optimizer.safetensors` (`exp_avg.<name>`, `exp_avg_sq.<name>`) and
//! `trainer.json`. Written into a temporary directory beside it, synced, then renamed.

use crate::cli::Precision;
use crate::config::GptConfig;
use crate::error::{read_regular, Result, TrainError};
use crate::params::{specs, Params};
use crate::weights::{load_params, params_to_safetensors, read_f32_tensors, to_safetensors};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The `format` value of trainer.json.
pub const FORMAT: &str = "hip-kernels/train_gpt2 checkpoint v1";

/// Everything besides tensors that a resumed run needs to continue bit-identically.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerState {
    /// [`FORMAT`].
    pub format: String,
    /// The last completed step.
    pub step: u64,
    /// The loader's position for the next micro-batch.
    pub loader_pos: usize,
    /// Tokens in the data file (a resume with other data is refused).
    pub data_tokens: usize,
    /// Loss scale (f16; 1 otherwise).
    pub loss_scale: f64,
    /// Clean steps since the loss scale last changed.
    pub scale_clean_steps: u64,
    /// AdamW updates done (steps minus those skipped for a non-finite gradient), the step
    /// count of the bias corrections, as torch keeps it per parameter.
    pub adam_steps: u64,
    /// Flags that change what a step reads: must be equal on resume.
    pub batch: usize,
    /// `--seq`.
    pub seq: usize,
    /// `--grad-accum`.
    pub grad_accum: usize,
    /// `--dtype`.
    pub dtype: Precision,
    /// Optimizer and schedule flags of the run that wrote it (recorded; a resume may change them).
    pub lr: f64,
    /// `--lr-min`.
    pub lr_min: Option<f64>,
    /// `--warmup`.
    pub warmup: u64,
    /// `--steps`.
    pub steps: u64,
    /// `--beta1`, `--beta2`, `--eps`, `--weight-decay`, `--grad-clip`.
    pub adamw: [f64; 5],
}

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

/// Make `dir` (and parents) and prove it writable, before training starts.
pub fn prepare_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(TrainError::io(dir))?;
    let probe = dir.join(format!(".write-probe.{}", std::process::id()));
    std::fs::write(&probe, b"probe")
        .map_err(|e| TrainError::file(dir, format!("checkpoint directory is not writable: {e}")))?;
    std::fs::remove_file(&probe).map_err(TrainError::io(&probe))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(TrainError::io(path))?;
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

/// Write `dir/step_<s>/` atomically; returns its path.
pub fn save(dir: &Path, snap: &Snapshot<'_>) -> Result<PathBuf> {
    let step = snap.state.step;
    let final_dir = dir.join(format!("step_{step}"));
    let pid = std::process::id();
    let tmp = dir.join(format!(".step_{step}.tmp.{pid}"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(TrainError::io(&tmp))?;
    }
    std::fs::create_dir(&tmp).map_err(TrainError::io(&tmp))?;
    let config = serde_json::to_vec_pretty(&snap.config.raw)
        .map_err(|e| TrainError::Op(format!("serializing config.json: {e}")))?;
    let state = serde_json::to_vec_pretty(snap.state)
        .map_err(|e| TrainError::Op(format!("serializing trainer.json: {e}")))?;
    write_synced(&tmp.join("config.json"), &config)?;
    write_synced(
        &tmp.join("model.safetensors"),
        &params_to_safetensors(snap.params, snap.config)?,
    )?;
    write_synced(
        &tmp.join("optimizer.safetensors"),
        &moments_to_safetensors(snap)?,
    )?;
    write_synced(&tmp.join("trainer.json"), &state)?;
    if final_dir.exists() {
        // Never a half-written checkpoint under the final name: the old one moves aside whole.
        let old = dir.join(format!(".step_{step}.old.{pid}"));
        std::fs::rename(&final_dir, &old).map_err(TrainError::io(&final_dir))?;
        std::fs::rename(&tmp, &final_dir).map_err(TrainError::io(&final_dir))?;
        std::fs::remove_dir_all(&old).map_err(TrainError::io(&old))?;
    } else {
        std::fs::rename(&tmp, &final_dir).map_err(TrainError::io(&final_dir))?;
    }
    // Make the rename durable.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(final_dir)
}

/// What [`load`] restores.
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
    let state: TrainerState = serde_json::from_slice(&read_regular(&state_path, 1 << 20)?)
        .map_err(|e| TrainError::file(&state_path, format!("is not a trainer state: {e}")))?;
    if state.format != FORMAT {
        return Err(TrainError::file(
            &state_path,
            format!("format `{}` is not `{FORMAT}`", state.format),
        ));
    }
    let params = load_params(&dir.join("model.safetensors"), cfg)?;
    let opt_path = dir.join("optimizer.safetensors");
    let mut opt = read_f32_tensors(&opt_path)?;
    let mut take = |prefix: &str| -> Result<Params<Vec<f32>>> {
        let mut v = Vec::new();
        for s in specs(cfg) {
            let name = format!("{prefix}.{}", s.name);
            match opt.remove(&name) {
                Some((shape, data)) if shape == s.shape => v.push(data),
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
