//! The training loop: load, check, train, log, checkpoint.

use crate::backend::Backend;
use crate::checkpoint::{self, Snapshot, TrainerState};
use crate::cli::{Args, Device, Precision};
use crate::config::GptConfig;
use crate::cpu_backend::Cpu;
use crate::data::{Loader, Tokens};
use crate::error::{Result, TrainError};
use crate::model::Gpt2;
use crate::weights::{load_params, model_paths};
use hip_kernels::cpu::AdamWConfig;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// What one step printed and logged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLog {
    /// Step number (1-based).
    pub step: u64,
    /// Mean loss over the step's tokens.
    pub loss: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Throughput of the step.
    pub tokens_per_s: f64,
}

/// `1.00e-03`: C's `%.2e`, as the spec's progress line shows it.
pub fn sci2(x: f64) -> String {
    let s = format!("{x:.2e}");
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = e.strip_prefix('-').map_or(("+", e), |d| ("-", d));
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// The JSONL record of a step.
pub fn json_line(l: &StepLog) -> String {
    serde_json::json!({
        "step": l.step,
        "loss": l.loss,
        "lr": l.lr,
        "grad_norm": l.grad_norm,
        "tokens_per_s": l.tokens_per_s,
    })
    .to_string()
}

/// Everything loaded and checked before the first step.
struct Setup {
    cfg: GptConfig,
    tokens: Tokens,
    loader: Loader,
    restored: checkpoint::Restored,
}

fn setup(args: &Args) -> Result<Setup> {
    let (model_dir, weights) = model_paths(&args.model);
    let cfg_path = model_dir.join("config.json");
    let cfg = GptConfig::load(&cfg_path)?;
    if args.seq > cfg.positions {
        return Err(TrainError::file(
            &cfg_path,
            format!(
                "--seq {} is longer than n_positions = {}; use --seq <= {}",
                args.seq, cfg.positions, cfg.positions
            ),
        ));
    }
    let tokens = Tokens::load(&args.data, cfg.vocab)?;
    let mut loader = Loader::new(&args.data, &tokens, args.batch, args.seq)?;
    let restored = match &args.resume {
        None => {
            let params = load_params(&weights, &cfg)?;
            let zeros = params.try_map(|_, t| Ok::<_, TrainError>(vec![0.0; t.len()]))?;
            checkpoint::Restored {
                params,
                exp_avg: zeros.clone(),
                exp_avg_sq: zeros,
                state: new_state(args, 0, 0, tokens.ids.len()),
            }
        }
        Some(dir) => {
            let r = checkpoint::load(dir, &cfg)?;
            let s = &r.state;
            let same = (s.batch, s.seq, s.grad_accum, s.dtype)
                == (args.batch, args.seq, args.grad_accum, args.dtype);
            if !same {
                return Err(TrainError::file(
                    dir,
                    format!(
                        "checkpoint was trained with --batch {} --seq {} --grad-accum {} --dtype {:?}; \
                         resume with the same flags",
                        s.batch, s.seq, s.grad_accum, s.dtype
                    ),
                ));
            }
            if s.data_tokens != tokens.ids.len() || s.loader_pos > tokens.ids.len() {
                return Err(TrainError::file(
                    dir,
                    format!(
                        "checkpoint was trained on a token file of {} tokens (next position {}); {} holds {}",
                        s.data_tokens,
                        s.loader_pos,
                        args.data.display(),
                        tokens.ids.len()
                    ),
                ));
            }
            if s.step >= args.steps {
                return Err(TrainError::file(
                    dir,
                    format!(
                        "checkpoint is at step {}, --steps {} leaves nothing to train",
                        s.step, args.steps
                    ),
                ));
            }
            loader.pos = s.loader_pos;
            r
        }
    };
    Ok(Setup {
        cfg,
        tokens,
        loader,
        restored,
    })
}

fn new_state(args: &Args, step: u64, loader_pos: usize, data_tokens: usize) -> TrainerState {
    TrainerState {
        format: checkpoint::FORMAT.into(),
        step,
        loader_pos,
        data_tokens,
        loss_scale: 1.0,
        scale_clean_steps: 0,
        batch: args.batch,
        seq: args.seq,
        grad_accum: args.grad_accum,
        dtype: args.dtype,
        lr: args.lr,
        lr_min: args.lr_min,
        warmup: args.warmup,
        steps: args.steps,
        adamw: [
            args.beta1,
            args.beta2,
            args.eps,
            args.weight_decay,
            args.grad_clip,
        ],
    }
}

/// Run the trainer as the command line says; returns what every step logged.
pub fn run(args: &Args) -> Result<Vec<StepLog>> {
    args.validate()?;
    if let Device::Gpu(n) = args.device {
        return Err(TrainError::Usage(format!(
            "--device {n}: the device backend is not built yet (it needs the training-step kernels); use --device cpu"
        )));
    }
    if args.dtype != Precision::F32 {
        return Err(TrainError::Usage(format!(
            "--dtype {:?}: only f32 is implemented so far; use --dtype f32",
            args.dtype
        )));
    }
    let setup = setup(args)?;
    if let Some(dir) = &args.checkpoint_dir {
        checkpoint::prepare_dir(dir)?;
    }
    train(&Cpu, args, setup)
}

fn train<B: Backend>(backend: &B, args: &Args, mut s: Setup) -> Result<Vec<StepLog>> {
    let r = &s.restored;
    let mut model = Gpt2::new(
        backend,
        &s.cfg,
        [&r.params, &r.exp_avg, &r.exp_avg_sq],
        args.batch,
        args.seq,
    )?;
    let first = r.state.step + 1;
    println!(
        "train_gpt2 on {}: {} | {} parameters | steps {first}..={} | {} tokens/step",
        backend.name(),
        s.cfg.describe(),
        r.params.iter().iter().map(|t| t.len()).sum::<usize>(),
        args.steps,
        args.batch * args.seq * args.grad_accum
    );
    let mut log = match &args.log {
        None => None,
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(TrainError::io(p))?,
        )),
    };
    let clip = (args.grad_clip > 0.0).then_some(args.grad_clip);
    let tokens_per_step = (args.batch * args.seq * args.grad_accum) as f64;
    let mut out = Vec::new();
    for step in first..=args.steps {
        let t0 = Instant::now();
        let mut scalars = backend.scalars()?;
        model.zero_grads()?;
        for _ in 0..args.grad_accum {
            let b = s.loader.next(&s.tokens);
            let (x, y) = (backend.ids(&b.inputs)?, backend.ids(&b.targets)?);
            model.forward_backward(&x, &y, args.grad_accum, &mut scalars)?;
        }
        model.grad_norm(&mut scalars)?;
        let lr = args.lr_at(step);
        let adamw = AdamWConfig {
            lr,
            beta1: args.beta1,
            beta2: args.beta2,
            eps: args.eps,
            weight_decay: args.weight_decay,
            maximize: false,
            amsgrad: false,
        };
        model.update(&adamw, step, clip, &scalars)?;
        let read = backend.read_step(&scalars)?;
        let l = StepLog {
            step,
            loss: read.loss,
            lr,
            grad_norm: read.grad_norm,
            tokens_per_s: tokens_per_step / t0.elapsed().as_secs_f64().max(1e-9),
        };
        println!(
            "step {}/{} | loss {:.6} | lr {} | norm {:.4} | {:.0} tok/s",
            l.step,
            args.steps,
            l.loss,
            sci2(l.lr),
            l.grad_norm,
            l.tokens_per_s
        );
        if let (Some(w), Some(p)) = (log.as_mut(), &args.log) {
            writeln!(w, "{}", json_line(&l))
                .and_then(|()| w.flush())
                .map_err(TrainError::io(p))?;
        }
        out.push(l);
        if args.save_every > 0 && (step % args.save_every == 0 || step == args.steps) {
            let dir: &PathBuf = args
                .checkpoint_dir
                .as_ref()
                .expect("validated: save_every needs a dir");
            let [params, exp_avg, exp_avg_sq] = model.download()?;
            let state = new_state(args, step, s.loader.pos, s.tokens.ids.len());
            let path = checkpoint::save(
                dir,
                &Snapshot {
                    config: &s.cfg,
                    params: &params,
                    exp_avg: &exp_avg,
                    exp_avg_sq: &exp_avg_sq,
                    state: &state,
                },
            )?;
            println!("saved {}", path.display());
        }
    }
    Ok(out)
}
