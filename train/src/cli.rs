//! The command line of docs/TRAIN-GPT2.md, and the checks of flags alone (exit 2).

use crate::error::{Result, TrainError};
use clap::{CommandFactory, FromArgMatches, Parser};
use std::path::PathBuf;
use std::process::ExitCode;

/// The whole program under the binary name `name` (`hipk-train`, or `train_gpt2` for existing
/// commands): parse the command line, train, and map the outcome to the exit status (0 done,
/// 1 failed at run time, 2 bad usage).
pub fn main_as(name: &'static str) -> ExitCode {
    if let Some(code) = crate::subcommands::dispatch() {
        return code;
    }
    let parsed = Args::command()
        .name(name)
        .bin_name(name)
        .try_get_matches()
        .and_then(|m| Args::from_arg_matches(&m));
    let args = match parsed {
        Ok(a) => a,
        Err(e) => {
            let code = e.exit_code();
            let _ = e.print();
            return ExitCode::from(code.clamp(0, 255) as u8);
        }
    };
    match crate::train::run(&args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Where to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU reference.
    Cpu,
    /// HIP device N.
    Gpu(usize),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "cpu" {
            return Ok(Device::Cpu);
        }
        s.parse()
            .map(Device::Gpu)
            .map_err(|_| format!("`{s}` is neither `cpu` nor a device index"))
    }
}

/// Storage type of weights and activations.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 everywhere.
    F32,
    /// bf16 weights/activations, f32 master weights.
    Bf16,
    /// f16 with dynamic loss scaling.
    F16,
}

/// Layout of saved checkpoints (`--save-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SaveFormat {
    /// The layout the model was read in.
    Native,
    /// transformers' own classes: a `chatglm` run is written as `glm`.
    Hf,
}

/// Train a GPT-2 with hip-kernels (see docs/TRAIN-GPT2.md in the hip-kernels repository).
#[derive(Debug, Clone, Parser)]
#[command(name = "train_gpt2", version, args_override_self = true)]
pub struct Args {
    /// Model: a directory with model.safetensors + config.json, or the .safetensors file.
    #[arg(long)]
    pub model: PathBuf,
    /// Token file (llm.c format), or SFT examples (`.jsonl`, with --tokenizer; docs/SFT.md).
    #[arg(long)]
    pub data: PathBuf,
    /// Rows per micro-batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// Sequence length (≤ n_positions).
    #[arg(long, default_value_t = 64)]
    pub seq: usize,
    /// Optimizer steps (the last step's number).
    #[arg(long, default_value_t = 20)]
    pub steps: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// AdamW beta1.
    #[arg(long, default_value_t = 0.9)]
    pub beta1: f64,
    /// AdamW beta2.
    #[arg(long, default_value_t = 0.999)]
    pub beta2: f64,
    /// AdamW eps.
    #[arg(long, default_value_t = 1e-8)]
    pub eps: f64,
    /// Decoupled weight decay of the 2-D tensors.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub grad_clip: f64,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Cosine decay to this learning rate at the last step (absent: constant after warmup).
    #[arg(long)]
    pub lr_min: Option<f64>,
    /// Micro-batches per step.
    #[arg(long, default_value_t = 1)]
    pub grad_accum: usize,
    /// SFT data on a device: upload each micro-batch from host vectors on the compute stream,
    /// not through the ring of pinned slots and the copy stream (the data path before the
    /// ring, kept for comparisons: the losses are bit-identical either way).
    #[arg(long, hide = true)]
    pub host_feed: bool,
    /// `cpu` or a HIP device index.
    #[arg(long, default_value = "cpu")]
    pub device: Device,
    /// Data parallel in one process: HIP devices `0,1,…`, one rank each (see also torchrun's
    /// variables, one process per device).
    #[arg(long, value_delimiter = ',')]
    pub devices: Option<Vec<usize>>,
    /// ZeRO stage: 0 (off), 1 (each rank keeps the AdamW state of its share of the tensors) or
    /// 2 (an element-granular share of the gradients and optimizer state; docs/MEMORY.md).
    #[arg(long, default_value_t = 0)]
    pub zero: u8,
    /// Storage type.
    #[arg(long, value_enum, default_value_t = Precision::F32)]
    pub dtype: Precision,
    /// Directory of the checkpoints (`step_<s>/`).
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Save every N steps and at the last step (0 = never).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Layout of saved checkpoints: `native` (the layout read) or `hf` (a `chatglm` run
    /// written as transformers' `glm`, which loads without remote code).
    #[arg(long, value_enum, default_value_t = SaveFormat::Native)]
    pub save_format: SaveFormat,
    /// Continue from a checkpoint directory `DIR/step_<s>` (LLaMA-family LoRA: also a bare PEFT
    /// adapter directory, which starts at step 1 from its adapters).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// JSONL log, one object per step.
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Initial loss scale (f16).
    #[arg(long, default_value_t = 65536.0)]
    pub scale_init: f64,
    /// Clean steps before the loss scale doubles (f16).
    #[arg(long, default_value_t = 2000)]
    pub scale_window: u64,
    /// LoRA rank r (> 0: train low-rank adapters only, the base model frozen).
    #[arg(long, default_value_t = 0)]
    pub lora_rank: usize,
    /// LoRA alpha: the adapter path is scaled by alpha / r (default r).
    #[arg(long)]
    pub lora_alpha: Option<f64>,
    /// Comma-separated adapted modules, from attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
    /// (default attn.c_attn).
    #[arg(long)]
    pub lora_targets: Option<String>,
    /// safetensors file holding every adapter to start from (PEFT's names or `h.{l}.{t}.lora_A` /
    /// `lora_B`), or a PEFT adapter directory (`adapter_model.safetensors`, `adapter_config.json`).
    #[arg(long)]
    pub lora_init: Option<PathBuf>,
    /// Seed of the adapters' initialisation (default 0).
    #[arg(long)]
    pub seed: Option<u64>,
    /// With each checkpoint, also write the merged model (model.safetensors + config.json).
    #[arg(long)]
    pub merge_on_save: bool,
    /// SFT data (`--data FILE.jsonl`): the model's tokenizer directory (tokenizer.json,
    /// tokenizer_config.json with its chat_template).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// SFT data: the template that renders examples. `chatglm3` (LLaMA-Factory's; the default
    /// for a ChatGLM3 tokenizer directory: tokenizer.model and no tokenizer.json); without it
    /// a tokenizer.json directory renders with its tokenizer_config.json chat_template.
    #[arg(long)]
    pub template: Option<String>,
    /// SFT data: tokens kept of each example (at most --seq + 1).
    #[arg(long, default_value_t = crate::sft::DEFAULT_CUTOFF_LEN)]
    pub cutoff_len: usize,
    /// SFT held-out examples (`.jsonl`): the loss over them after every --eval-every steps and
    /// after the last.
    #[arg(long)]
    pub eval_data: Option<PathBuf>,
    /// Steps between evaluations of --eval-data (0: after the last step only).
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Print the predicted per-rank device memory of this run as a table (docs/MEMORY.md) and
    /// exit 0 without training; only config.json is read.
    #[arg(long)]
    pub memory_estimate: bool,
    /// Activation checkpointing: keep each layer's input only and recompute the layer in the
    /// backward (the same results bit for bit, less device memory; docs/MEMORY.md).
    #[arg(long)]
    pub grad_checkpoint: bool,
    /// Keep AdamW's state and the f32 master weights in pinned host memory and update on the
    /// CPU (device runs with ZeRO 0 or 1, without LoRA or --graph; docs/MEMORY.md).
    #[arg(long, value_enum)]
    pub offload_optimizer: Option<Offload>,
    /// Capture the steady step once as a HIP graph and replay it: the default on one device
    /// (not with several ranks, SFT data or an offloaded optimizer, where steps are eager and
    /// one line says why); the flag only makes that line print on the CPU too.
    #[arg(long, conflicts_with = "no_graph")]
    pub graph: bool,
    /// Launch every step's kernels one by one instead of replaying a captured step.
    #[arg(long)]
    pub no_graph: bool,
    /// ZeRO stage 2's reduce-scatter bucket in MiB, fractions allowed (default: DeepSpeed's
    /// 2e8 elements).
    #[arg(long)]
    pub bucket_mb: Option<f64>,
}

/// Where `--offload-optimizer` puts the optimizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Offload {
    /// Pinned host memory, updated by the CPU.
    Cpu,
}

/// `0,1,2`: a `--devices` list as written.
pub fn device_list(list: &[usize]) -> String {
    list.iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

impl Args {
    /// Check what the flags alone decide (the files are checked when read).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TrainError::Usage(m));
        for (name, v) in [
            ("--batch", self.batch),
            ("--seq", self.seq),
            ("--grad-accum", self.grad_accum),
        ] {
            if v == 0 {
                return bad(format!("{name} 0: must be at least 1"));
            }
        }
        if self.steps == 0 {
            return bad("--steps 0: must be at least 1".into());
        }
        let finite_nonneg = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                bad(format!("{name} {v}: must be a finite number >= 0"))
            }
        };
        finite_nonneg("--lr", self.lr)?;
        finite_nonneg("--eps", self.eps)?;
        finite_nonneg("--weight-decay", self.weight_decay)?;
        finite_nonneg("--grad-clip", self.grad_clip)?;
        if let Some(m) = self.lr_min {
            finite_nonneg("--lr-min", m)?;
        }
        for (name, b) in [("--beta1", self.beta1), ("--beta2", self.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return bad(format!("{name} {b}: must be in [0, 1)"));
            }
        }
        let scales = crate::trainer_state::LOSS_SCALE_RANGE;
        if !scales.contains(&self.scale_init) {
            return bad(format!(
                "--scale-init {:?}: must be in {:e}..={:e} (2^-64..=2^64)",
                self.scale_init,
                scales.start(),
                scales.end()
            ));
        }
        if self.scale_window == 0 {
            return bad("--scale-window 0: must be at least 1".into());
        }
        if let Some(list) = &self.devices {
            if let Device::Gpu(n) = self.device {
                return bad(format!(
                    "--device {n} with --devices {}: give one or the other",
                    device_list(list)
                ));
            }
            if list.is_empty() {
                return bad("--devices: give at least one device index".into());
            }
            for (i, d) in list.iter().enumerate() {
                if list[..i].contains(d) {
                    return bad(format!(
                        "--devices {}: device {d} is listed twice (one rank per device)",
                        device_list(list)
                    ));
                }
            }
        }
        if self.zero > 2 {
            return bad(format!(
                "--zero {}: only stages 0 (off), 1 (sharded optimizer state) and 2 (also \
                 sharded gradients) exist",
                self.zero
            ));
        }
        crate::memory::check_flags(self)?;
        if self.save_every > 0 && self.checkpoint_dir.is_none() {
            return bad(format!(
                "--save-every {} needs --checkpoint-dir DIR",
                self.save_every
            ));
        }
        crate::sft::check_args(self)?;
        crate::lora::check_flags(self)?;
        if self.lora_rank > 0 && self.zero > 0 {
            return bad(format!(
                "--zero {} with --lora-rank {}: ZeRO shards the base model's optimizer state, \
                 which LoRA does not have (only the small adapters train); drop --zero",
                self.zero, self.lora_rank
            ));
        }
        if self
            .batch
            .checked_mul(self.seq)
            .and_then(|n| n.checked_mul(self.grad_accum))
            .is_none()
        {
            return bad(format!(
                "--batch {} × --seq {} × --grad-accum {} overflows",
                self.batch, self.seq, self.grad_accum
            ));
        }
        Ok(())
    }

    /// The learning rate of step `s` (1-based): linear warmup, then constant or cosine to
    /// `--lr-min` at `--steps`.
    pub fn lr_at(&self, s: u64) -> f64 {
        let (w, n) = (self.warmup, self.steps);
        if w > 0 && s <= w {
            return self.lr * s as f64 / w as f64;
        }
        match self.lr_min {
            None => self.lr,
            Some(m) => {
                // π·(s − W) / max(1, N − W), in that order (as the spec's formula reads).
                let x = std::f64::consts::PI * s.saturating_sub(w) as f64
                    / n.saturating_sub(w).max(1) as f64;
                m + 0.5 * (self.lr - m) * (1.0 + x.cos())
            }
        }
    }
}
