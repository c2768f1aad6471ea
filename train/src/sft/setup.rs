//! SFT data in a LLaMA-family run: the setup (`--data FILE.jsonl --tokenizer DIR`, resuming
//! its data position), the log's `tokens`, and the held-out loss of `--eval-data`.

use super::source::{SftEval, SftSource};
use crate::backend::{Backend, TrainElement};
use crate::cli::Args;
use crate::error::{Result, TrainError};
use crate::llama::checkpoint as ckpt;
use crate::llama::model::Llama;
use crate::llama::params::Trained;
use crate::llama::train::{LlamaSetup, Source};
use crate::llama::LlamaConfig;
use crate::train::{check_resumed, new_state};

/// The setup of a run on SFT data (`world` ranks, each reading the whole global batch).
pub(crate) fn setup(args: &Args, cfg: LlamaConfig, world: usize) -> Result<LlamaSetup> {
    let Some(tokenizer) = &args.tokenizer else {
        return Err(TrainError::Usage(format!(
            "--data {} is SFT examples (.jsonl): give the model's tokenizer with --tokenizer DIR \
             (tokenizer.json and tokenizer_config.json)",
            args.data.display()
        )));
    };
    let global_batch = args.batch.checked_mul(world).ok_or_else(|| {
        TrainError::Usage(format!("--batch {} × {world} ranks overflows", args.batch))
    })?;
    let mut src = SftSource::open(
        &args.data,
        tokenizer,
        args.eval_data.as_deref(),
        args.cutoff_len,
        args.seq,
        global_batch,
        cfg.vocab,
    )?;
    let rows = src.index.rows.len();
    let trained = Trained::new(&cfg);
    let lora = crate::llama::lora::LlamaLora::for_family(args, cfg.family)?;
    let base = |cfg: &LlamaConfig| -> Result<Vec<Vec<f32>>> {
        let (model_dir, _) = crate::weights::model_paths(&args.model);
        Ok(trained.fuse(&crate::llama::weights::load(&model_dir, cfg)?))
    };
    let mut resumed_adapters = None;
    let mut note = None;
    let restored = match (&args.resume, &lora) {
        (Some(dir), Some(lo)) => {
            let resumed = crate::llama::lora::resume(dir, lo, &cfg)?;
            note = resumed.note(dir);
            let (adapters, state) = match resumed {
                crate::llama::lora::LoraResume::Checkpoint(adapters, state) => {
                    // The data and tokenizer first: a refusal names which of them differs.
                    src.resume_from(dir)?;
                    check_resumed(args, dir, &state, world, rows)?;
                    (adapters, state)
                }
                // A bare PEFT adapter directory: the data from its start.
                crate::llama::lora::LoraResume::Peft(adapters) => {
                    (adapters, new_state(args, global_batch, 0, 0, rows))
                }
            };
            resumed_adapters = Some(adapters);
            let params = base(&cfg)?;
            let none: Vec<Vec<f32>> = params.iter().map(|_| Vec::new()).collect();
            ckpt::Restored {
                params,
                exp_avg: none.clone(),
                exp_avg_sq: none,
                state,
            }
        }
        (None, _) => {
            let params = base(&cfg)?;
            let zeros: Vec<Vec<f32>> = params.iter().map(|t| vec![0.0; t.len()]).collect();
            ckpt::Restored {
                params,
                exp_avg: zeros.clone(),
                exp_avg_sq: zeros,
                state: new_state(args, global_batch, 0, 0, rows),
            }
        }
        (Some(dir), None) => {
            let r = ckpt::load(dir, &cfg)?;
            // The data and tokenizer first: a refusal names which of them differs.
            src.resume_from(dir)?;
            check_resumed(args, dir, &r.state, world, rows)?;
            ckpt::Restored {
                params: trained.fuse(&r.params),
                exp_avg: trained.fuse(&r.exp_avg),
                exp_avg_sq: trained.fuse(&r.exp_avg_sq),
                state: r.state,
            }
        }
    };
    let adapters = match lora {
        None => None,
        Some(lo) => match resumed_adapters {
            Some(a) => Some((lo, a)),
            None => {
                let values = match &args.lora_init {
                    Some(path) => crate::llama::lora::load(path, &lo, &cfg)?,
                    None => crate::llama::lora::seeded(&lo, &cfg, args.seed.unwrap_or(0)),
                };
                let zeros: Vec<Vec<f32>> = values.iter().map(|t| vec![0.0; t.len()]).collect();
                Some((lo, [values, zeros.clone(), zeros]))
            }
        },
    };
    Ok(LlamaSetup {
        cfg,
        source: Source::Sft(Box::new(src)),
        restored,
        lora: adapters,
        note,
    })
}

/// A step's log line with `tokens` (the step's counted targets) added.
pub fn with_tokens(line: &str, tokens: usize) -> String {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(mut o)) => {
            o.insert("tokens".into(), tokens.into());
            serde_json::Value::Object(o).to_string()
        }
        _ => line.to_string(),
    }
}

/// The eval log line `{"step", "eval_loss", "eval_tokens"}` (no `loss` key).
pub fn eval_line(step: u64, loss: f64, tokens: usize) -> String {
    serde_json::json!({"step": step, "eval_loss": loss, "eval_tokens": tokens}).to_string()
}

/// The held-out set when step `step` is due for an evaluation: every `--eval-every` steps
/// and after the last.
pub fn eval_due<'a>(args: &Args, step: u64, src: &'a SftSource) -> Option<&'a SftEval> {
    let ev = src.eval.as_ref()?;
    let due = step == args.steps || (args.eval_every > 0 && step % args.eval_every == 0);
    due.then_some(ev)
}

/// The counted-target mean loss over the whole held-out set, and its counted targets.
///
/// Each eval micro-batch holds every rank's rows (`mine` is this rank's range of positions in
/// it): each rank runs the forward on its share only, with the global count of counted targets
/// as the divisor, and the ranks' sums are exchanged once per evaluation (each rank broadcasts
/// its f64 share as two f32s, high and low part, so the sum keeps f64 precision). The backend's
/// read divides by the `world` ranks (its losses are rank shares summed by the step's
/// all-reduce, which an evaluation does not run), so each read is scaled back by `world`.
pub(crate) fn evaluate<T: TrainElement, B: Backend<T>>(
    model: &mut Llama<'_, T, B>,
    backend: &B,
    ev: &SftEval,
    mine: std::ops::Range<usize>,
    world: usize,
) -> Result<(f64, usize)> {
    let total: usize = ev
        .batches
        .iter()
        .map(|b| b.counted(0..b.targets.len()))
        .sum();
    if total == 0 {
        return Err(TrainError::file(
            &ev.index.path,
            "has no counted target to evaluate",
        ));
    }
    let mut share = 0.0;
    for b in &ev.batches {
        let part = b.rows(mine.clone());
        if part.counted(0..part.targets.len()) > 0 {
            let mut scalars = backend.scalars()?;
            model.eval_loss(&part, total, &mut scalars)?;
            share += backend.read_step(&scalars)?.loss * world as f64;
        }
    }
    Ok((sum_over_ranks(backend, share)?, total))
}

/// The sum over the ranks of each rank's `value` (the value itself on one rank): every rank's
/// value, as an f32 pair (high, low), broadcast from its owner in one group.
fn sum_over_ranks<T: TrainElement, B: Backend<T>>(backend: &B, value: f64) -> Result<f64> {
    let world = backend.world();
    if world == 1 {
        return Ok(value);
    }
    let hi = value as f32;
    let lo = (value - f64::from(hi)) as f32;
    let mut slots = (0..world)
        .map(|r| {
            if r == backend.rank() {
                backend.upload::<f32>(&[hi, lo])
            } else {
                backend.zeros::<f32>(2)
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let mut roots: Vec<_> = slots.iter_mut().enumerate().map(|(r, b)| (b, r)).collect();
    backend.broadcast::<f32>(&mut roots)?;
    let mut sum = 0.0;
    for slot in &slots {
        let v = backend.download::<f32>(slot)?;
        sum += f64::from(v[0]) + f64::from(v[1]);
    }
    Ok(sum)
}
