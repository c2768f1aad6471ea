//! The training loop of a LLaMA-family run: GPT-2's loop (schedule, clipping, AdamW, f16 loss
//! scaling, log and checkpoint cadence, `crate::train`) around [`Llama`], with the loss
//! divided by the step's global count of counted targets.

use super::checkpoint::{self as ckpt, Restored, Snapshot};
use super::config::LlamaConfig;
use super::lora::{LlamaAdapters, LlamaLora, LoraResume};
use super::model::Llama;
use super::params::{Layout, Trained};
use crate::backend::{AdamWStep, Backend, GradScaling, TrainElement};
use crate::cli::{Args, Device, Precision};
use crate::cpu_backend::Cpu;
use crate::data::{Batch, Loader, Tokens};
use crate::device_backend::DeviceBackend;
use crate::error::{Result, TrainError};
use crate::graph_step::{GraphStep, Phase};
use crate::sft::Slot;
use crate::train::{
    check_resumed, emit_step, json_line, new_state, LossScaler, RankOutcome, Role, StepLog,
};
use half::{bf16, f16};
use std::io::Write;
use std::time::Instant;

/// Where micro-batches come from: a token file, or micro-batches prepared elsewhere (packed
/// SFT rows; the tests use them too).
#[derive(Clone)]
pub enum Source {
    /// A token file and the spec's loader (every target counted).
    Stream {
        /// The file's ids.
        tokens: Tokens,
        /// The loader over them.
        loader: Loader,
    },
    /// Ready micro-batches of the global batch (packed rows: positions, sequence boundaries,
    /// targets −100 where not counted), taken in order and cycled.
    Batches {
        /// The micro-batches.
        list: Vec<Batch>,
        /// Index of the next one.
        next: usize,
    },
    /// SFT examples (`--data FILE.jsonl --tokenizer DIR`), packed and made ahead on a
    /// background thread (docs/SFT.md).
    Sft(Box<crate::sft::source::SftSource>),
}

impl Source {
    /// The next micro-batch of the global batch.
    fn next(&mut self) -> Result<Batch> {
        Ok(match self {
            Source::Stream { tokens, loader } => loader.next(tokens),
            Source::Batches { list, next } => {
                let b = list.get(*next % list.len().max(1)).cloned();
                *next += 1;
                b.unwrap_or_else(|| Batch::stream(Vec::new(), Vec::new()))
            }
            Source::Sft(src) => src.next_batch()?,
        })
    }

    /// The next micro-batch of the global batch, with the slot the SFT producer staged it into
    /// (hand it back with [`Source::recycle`]); `None` for the other sources.
    fn next_staged(&mut self) -> Result<(Batch, Option<Box<dyn Slot>>)> {
        match self {
            Source::Sft(src) => {
                let (b, slot) = src.next_staged()?;
                Ok((b, Some(slot)))
            }
            other => Ok((other.next()?, None)),
        }
    }

    /// Hand a slot of [`Source::next_staged`] back to the producer.
    fn recycle(&self, slot: Option<Box<dyn Slot>>) {
        if let (Source::Sft(src), Some(slot)) = (self, slot) {
            src.recycle(slot);
        }
    }

    /// The position to resume from, and the data's length (checked on resume).
    fn position(&self) -> (usize, usize) {
        match self {
            Source::Stream { tokens, loader } => (loader.pos, tokens.ids.len()),
            Source::Batches { list, next } => (*next, list.len()),
            Source::Sft(src) => src.position(),
        }
    }
}

/// Everything loaded and checked before the first step (tensors in the [`Trained`] order).
#[derive(Clone)]
pub(crate) struct LlamaSetup {
    pub(crate) cfg: LlamaConfig,
    pub(crate) source: Source,
    pub(crate) restored: Restored,
    /// LoRA's flags and first `[params, exp_avg, exp_avg_sq]` (PEFT's order).
    pub(crate) lora: Option<(LlamaLora, [Vec<Vec<f32>>; 3])>,
    /// A line rank 0 prints before the run (`--resume` of a bare PEFT adapter directory).
    pub(crate) note: Option<String>,
}

/// Load and check what a run of `world` ranks reads (the loader takes `world × --batch` rows
/// per micro-batch; every rank keeps its own `--batch` rows).
pub(crate) fn setup(args: &Args, cfg: LlamaConfig, world: usize) -> Result<LlamaSetup> {
    let lora = LlamaLora::for_family(args, cfg.family)?;
    if lora.is_some() && args.merge_on_save && cfg.family.is_glm() {
        return Err(TrainError::Usage(format!(
            "--merge-on-save is not implemented for the {} layout's LoRA (its fused targets \
             merge into fused tensors); drop it: PEFT merges the saved adapters with \
             merge_and_unload",
            cfg.family.name()
        )));
    }
    if args.seq > cfg.positions {
        return Err(TrainError::file(
            &cfg.path,
            format!(
                "--seq {} is longer than max_position_embeddings = {}; use --seq <= {}",
                args.seq, cfg.positions, cfg.positions
            ),
        ));
    }
    if crate::sft::is_sft_data(&args.data) {
        return crate::sft::setup::setup(args, cfg, world);
    }
    let tokens = Tokens::load(&args.data, cfg.vocab)?;
    let global_batch = args.batch.checked_mul(world).ok_or_else(|| {
        TrainError::Usage(format!("--batch {} × {world} ranks overflows", args.batch))
    })?;
    let mut loader = Loader::new(&args.data, &tokens, global_batch, args.seq)?;
    let trained = Trained::new(&cfg);
    let mut resumed_adapters = None;
    let mut note = None;
    let restored = match &args.resume {
        Some(dir) if lora.is_some() => {
            let lo = lora
                .as_ref()
                .ok_or_else(|| TrainError::Op("LoRA flags".into()))?;
            let resumed = super::lora::resume(dir, lo, &cfg)?;
            note = resumed.note(dir);
            let (adapters, state) = match resumed {
                LoraResume::Checkpoint(adapters, state) => {
                    check_resumed(args, dir, &state, world, tokens.ids.len())?;
                    loader.pos = state.loader_pos;
                    (adapters, state)
                }
                LoraResume::Peft(adapters) => (
                    adapters,
                    new_state(args, global_batch, 0, 0, tokens.ids.len()),
                ),
            };
            resumed_adapters = Some(adapters);
            let (model_dir, _) = crate::weights::model_paths(&args.model);
            let params = trained.fuse(&super::weights::load(&model_dir, &cfg)?);
            let none: Vec<Vec<f32>> = params.iter().map(|_| Vec::new()).collect();
            Restored {
                params,
                exp_avg: none.clone(),
                exp_avg_sq: none,
                state,
            }
        }
        None => {
            let (model_dir, _) = crate::weights::model_paths(&args.model);
            let params = trained.fuse(&super::weights::load(&model_dir, &cfg)?);
            let zeros: Vec<Vec<f32>> = params.iter().map(|t| vec![0.0; t.len()]).collect();
            Restored {
                params,
                exp_avg: zeros.clone(),
                exp_avg_sq: zeros,
                state: new_state(args, global_batch, 0, 0, tokens.ids.len()),
            }
        }
        Some(dir) => {
            let r = ckpt::load(dir, &cfg)?;
            check_resumed(args, dir, &r.state, world, tokens.ids.len())?;
            loader.pos = r.state.loader_pos;
            Restored {
                params: trained.fuse(&r.params),
                exp_avg: trained.fuse(&r.exp_avg),
                exp_avg_sq: trained.fuse(&r.exp_avg_sq),
                state: r.state,
            }
        }
    };
    let adapters = match &lora {
        None => None,
        Some(lo) if resumed_adapters.is_some() => {
            let a = resumed_adapters.take().unwrap_or_default();
            Some((lo.clone(), a))
        }
        Some(lo) => {
            let values = match &args.lora_init {
                Some(path) => super::lora::load(path, lo, &cfg)?,
                None => super::lora::seeded(lo, &cfg, args.seed.unwrap_or(0)),
            };
            let zeros: Vec<Vec<f32>> = values.iter().map(|t| vec![0.0; t.len()]).collect();
            Some((lo.clone(), [values, zeros.clone(), zeros]))
        }
    };
    Ok(LlamaSetup {
        cfg,
        source: Source::Stream { tokens, loader },
        restored,
        lora: adapters,
        note,
    })
}

/// Rank 0's checks of its outputs, the setup, and the checkpoint directory made ready.
pub(crate) fn prepare(args: &Args, cfg: LlamaConfig, world: usize) -> Result<LlamaSetup> {
    crate::outputs::check_log(args)?;
    let s = setup(args, cfg, world)?;
    if let Some(note) = &s.note {
        println!("{note}");
    }
    crate::outputs::check_checkpoint_dir(args, first_step(&s.restored.state)?)?;
    if let Some(dir) = &args.checkpoint_dir {
        crate::checkpoint::prepare_dir(dir)?;
    }
    Ok(s)
}

fn first_step(state: &crate::checkpoint::TrainerState) -> Result<u64> {
    state
        .step
        .checked_add(1)
        .ok_or_else(|| TrainError::Op(format!("step {} is the last step there is", state.step)))
}

/// One process, one device or the CPU.
pub(crate) fn run_single(args: &Args, cfg: LlamaConfig) -> Result<Vec<StepLog>> {
    let s = prepare(args, cfg, 1)?;
    let out = match args.device {
        Device::Cpu => train_as(&Cpu, args, s, Role::SINGLE, false)?,
        Device::Gpu(n) => train_as(
            &{
                let b = DeviceBackend::new(n, args.grad_accum)?;
                b.set_offload_flag(args.offload_optimizer.is_some());
                b
            },
            args,
            s,
            Role::SINGLE,
            false,
        )?,
    };
    Ok(out.logs)
}

/// [`train`] with the storage type `--dtype` names.
pub(crate) fn train_as<B>(
    backend: &B,
    args: &Args,
    s: LlamaSetup,
    role: Role,
    keep: bool,
) -> Result<RankOutcome>
where
    B: Backend<f32> + Backend<bf16> + Backend<f16>,
{
    match args.dtype {
        Precision::F32 => train::<f32, _>(backend, args, s, role, keep),
        Precision::Bf16 => train::<bf16, _>(backend, args, s, role, keep),
        Precision::F16 => train::<f16, _>(backend, args, s, role, keep),
    }
}

fn train<T: TrainElement, B: Backend<T>>(
    backend: &B,
    args: &Args,
    mut s: LlamaSetup,
    role: Role,
    keep: bool,
) -> Result<RankOutcome> {
    let r = &s.restored;
    let mut model = Llama::<T, B>::new(
        backend,
        &s.cfg,
        [&r.params, &r.exp_avg, &r.exp_avg_sq],
        [args.batch, args.seq],
        args.zero,
        s.lora.is_some(),
        args.grad_checkpoint,
    )?;
    if let Some((lo, [p, m, v])) = &s.lora {
        model.lora = Some(LlamaAdapters::new(
            backend,
            &s.cfg,
            lo.clone(),
            [p, m, v],
            args.batch * args.seq,
        )?);
    }
    let hf = Layout::new(&s.cfg);
    let trained = Trained::new(&s.cfg);
    // The config and layout checkpoints are written in (`--save-format hf`: chatglm as glm).
    let save_cfg = crate::glm::convert::save_config(&s.cfg, args.save_format)?;
    let save_hf = Layout::new(&save_cfg);
    let save_trained = Trained::new(&save_cfg);
    let first = first_step(&r.state)?;
    let world = role.world;
    let positions_per_step = args.batch * args.seq * args.grad_accum * world;
    if role.primary() {
        let on = match world {
            1 => backend.name(),
            w => format!("{}, rank 0 of {w}", backend.name()),
        };
        println!(
            "hipk-train on {on}: {} | {} parameters | steps {first}..={} | {positions_per_step} \
             tokens/step",
            s.cfg.describe(),
            match &s.lora {
                None => hf.count().to_string(),
                Some((lo, [p, _, _])) => {
                    let trainable: usize = p.iter().map(Vec::len).sum();
                    let names: Vec<_> = lo
                        .targets
                        .iter()
                        .map(|&t| super::lora::target_name(s.cfg.family, t))
                        .collect();
                    format!(
                        "LoRA r={} alpha={} on {}: {trainable} trainable of {}",
                        lo.rank,
                        lo.alpha,
                        names.join(","),
                        hf.count() + trainable
                    )
                }
            },
            args.steps,
        );
        if let Source::Sft(src) = &s.source {
            println!("data: {}", src.summary());
        }
    }
    let mut log = match (&args.log, role.primary()) {
        (Some(p), true) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(TrainError::io(p))?,
        )),
        _ => None,
    };
    let clip = (args.grad_clip > 0.0).then_some(args.grad_clip);
    let mut adam_steps = r.state.adam_steps;
    let mut scaler = (args.dtype == Precision::F16).then_some(LossScaler {
        scale: r.state.loss_scale,
        clean: r.state.scale_clean_steps,
        window: args.scale_window,
    });
    let rows = args.batch * args.seq;
    let mine = role.rank * rows..(role.rank + 1) * rows;
    let tok_note = if backend.emulated() {
        " (emulated)"
    } else {
        ""
    };
    if let (Source::Sft(src), false) = (&mut s.source, args.host_feed) {
        // The device's ring of pinned slots, made once for the run: a step holds its
        // micro-batches' slots until their copies are queued, the producer fills the rest ahead.
        let n = args.grad_accum + crate::sft::source::AHEAD;
        let slots = (0..n)
            .map(|_| backend.feed_slot(mine.clone()))
            .collect::<Result<Option<Vec<_>>>>()?;
        if let Some(slots) = slots {
            src.stage_into(slots);
        }
    }
    let mut out = Vec::new();
    // --graph: the steady step captured once and replayed (crate::graph_step); SFT's packed
    // rows change their sequence boundaries (and their count) every step.
    let refusal = matches!(s.source, Source::Sft(_))
        .then_some("SFT data: packed rows change their cu_seqlens every step");
    let mut graph = GraphStep::new(backend, args, world, refusal);
    let mut kept = None;
    for step in first..=args.steps {
        let t0 = Instant::now();
        backend.reset_peak_memory();
        // The step's micro-batches (every rank reads the whole global batch), and the divisor:
        // its counted targets over all micro-batches and ranks, known before the step.
        let fed = (0..args.grad_accum)
            .map(|_| s.source.next_staged())
            .collect::<Result<Vec<_>>>()?;
        let counted: usize = fed.iter().map(|(b, _)| b.counted(0..b.targets.len())).sum();
        if counted == 0 {
            return Err(TrainError::Op(format!(
                "step {step} has no counted target (every target is -100)"
            )));
        }
        // SFT's staged slots queue every micro-batch's copies on the device's copy stream now
        // (copy k + 1 runs while micro-batch k computes) and go back to the producer; the other
        // sources upload their ids in the step (graph mode needs that order).
        let sft = matches!(s.source, Source::Sft(_));
        let mut mine_rows = Vec::with_capacity(fed.len());
        let mut staged = Vec::with_capacity(fed.len());
        for (b, slot) in fed {
            let rows = b.rows(mine.clone());
            if sft {
                let ids = backend.batch_ids(&rows, slot.as_deref());
                s.source.recycle(slot);
                staged.push(Some(ids?));
            } else {
                staged.push(None);
            }
            mine_rows.push(rows);
        }
        let lr = args.lr_at(step);
        let hyper = AdamWStep {
            lr,
            beta1: args.beta1,
            beta2: args.beta2,
            eps: args.eps,
            weight_decay: args.weight_decay,
            step: adam_steps.checked_add(1).ok_or_else(|| {
                TrainError::Op(format!("AdamW's step count {adam_steps} cannot grow"))
            })?,
        };
        let loss_scale = scaler.map_or(1.0, |sc| sc.scale);
        let scaling = GradScaling { loss_scale, clip };
        let mut fresh = None;
        let scalars = graph.step(
            backend,
            (loss_scale.to_bits(), counted as u64),
            &mut kept,
            &mut fresh,
            |phase, scalars| {
                if phase == Phase::Upload {
                    // What the graph reads from outside it: the ids in the order
                    // `Llama::forward_backward` makes them, the optimizer's tables, the scale.
                    for b in &mine_rows {
                        backend.ids(&b.inputs)?;
                        backend.ids(&b.targets)?;
                        b.positions.as_deref().map(|p| backend.ids(p)).transpose()?;
                        b.cu_seqlens
                            .as_deref()
                            .map(|c| backend.ids(c))
                            .transpose()?;
                    }
                } else {
                    model.zero_grads()?;
                    for (micro, (b, ids)) in mine_rows.iter().zip(staged.iter_mut()).enumerate() {
                        let last = micro + 1 == args.grad_accum;
                        match ids.take() {
                            Some(ids) => model
                                .forward_backward_ids(b, ids, counted, loss_scale, scalars, last)?,
                            None => {
                                model.forward_backward(b, counted, loss_scale, scalars, last)?
                            }
                        }
                    }
                }
                match &model.lora {
                    Some(lo) => lo.grad_norm(backend, scalars)?,
                    None => model.grad_norm(scalars)?,
                }
                match model.lora.as_mut() {
                    Some(lo) => lo.update(backend, &hyper, scaling, scalars),
                    None => model.update(&hyper, scaling, scalars),
                }
            },
        )?;
        let read = backend.read_step(scalars)?;
        let skipped = !read.grad_norm.is_finite();
        if skipped && scaler.is_none() {
            return Err(TrainError::Op(format!(
                "step {step}: the gradient norm is {} (loss {}); lower --lr or use --grad-clip",
                read.grad_norm, read.loss
            )));
        }
        let l = StepLog {
            step,
            loss: read.loss,
            lr,
            grad_norm: read.grad_norm / loss_scale,
            tokens_per_s: positions_per_step as f64 / t0.elapsed().as_secs_f64().max(1e-9),
            scaler: scaler.map(|sc| (sc.scale, skipped)),
            mem: backend.memory(),
            world_size: world,
        };
        if let Some(sc) = scaler.as_mut() {
            sc.update(skipped);
        }
        if !skipped {
            adam_steps += 1;
        }
        if let Source::Sft(_) = &s.source {
            // SFT data: the log line also has the step's counted targets (`tokens`).
            emit_step(&l, args, role, tok_note, &mut None)?;
            if let (Some(w), Some(p)) = (log.as_mut(), &args.log) {
                let line = crate::sft::setup::with_tokens(&json_line(&l), counted);
                writeln!(w, "{line}")
                    .and_then(|()| w.flush())
                    .map_err(TrainError::io(p))?;
            }
        } else {
            emit_step(&l, args, role, tok_note, &mut log)?;
        }
        out.push(l);
        if let Source::Sft(src) = &s.source {
            if let Some(ev) = crate::sft::setup::eval_due(args, step, src) {
                let (loss, n) =
                    crate::sft::setup::evaluate(&mut model, backend, ev, mine.clone(), world)?;
                let line = crate::sft::setup::eval_line(step, loss, n);
                if role.primary() {
                    println!("eval step {step} | eval_loss {loss:.6} | eval_tokens {n}");
                }
                if let (Some(w), Some(p)) = (log.as_mut(), &args.log) {
                    writeln!(w, "{line}")
                        .and_then(|()| w.flush())
                        .map_err(TrainError::io(p))?;
                }
            }
        }
        let due = args.save_every > 0 && (step % args.save_every == 0 || step == args.steps);
        let gathers = role.primary() || (args.zero >= 1 && world > 1);
        if let (true, true, Some(dir)) = (due, gathers, &args.checkpoint_dir) {
            let (pos, len) = s.source.position();
            let mut state = new_state(args, args.batch * world, step, pos, len);
            if let Some(sc) = scaler {
                (state.loss_scale, state.scale_clean_steps) = (sc.scale, sc.clean);
            }
            state.adam_steps = adam_steps;
            if let (Some(lo), Some((flags, _))) = (&model.lora, &s.lora) {
                let host = lo.download(backend)?;
                // --merge-on-save: the base (HF order) with the adapters folded in, beside them.
                let merged = match args.merge_on_save {
                    true => Some(super::merge::merged(
                        &s.cfg,
                        flags,
                        &trained.split(&hf, &s.restored.params),
                        &host[0],
                    )?),
                    false => None,
                };
                let path = super::lora::save(
                    dir,
                    flags,
                    &s.cfg,
                    &host,
                    &args.model,
                    &state,
                    merged.as_deref(),
                )?;
                if let Source::Sft(src) = &s.source {
                    src.save_state(&path)?;
                }
                println!("saved {}", path.display());
                continue;
            }
            let [params, m, v] = model.download()?;
            if !role.primary() {
                continue;
            }
            let path = ckpt::save(
                dir,
                &Snapshot {
                    config: &save_cfg,
                    params: &save_trained.split(&save_hf, &params),
                    exp_avg: &save_trained.split(&save_hf, &m),
                    exp_avg_sq: &save_trained.split(&save_hf, &v),
                    state: &state,
                },
            )?;
            if let Source::Sft(src) = &s.source {
                src.save_state(&path)?;
            }
            println!("saved {}", path.display());
        }
    }
    if let (Source::Sft(src), true) = (&s.source, role.primary()) {
        let f = src.feed_stats();
        println!(
            "data: the trainer waited for the SFT producer {} times of {} micro-batches ({:.3} s)",
            f.waited,
            f.taken,
            f.wait.as_secs_f64()
        );
    }
    let tensors = match keep {
        true => Some([
            trained.split(&hf, &model.download()?[0]),
            trained.split(&hf, &model.download_grads()?),
        ]),
        false => None,
    };
    Ok(RankOutcome {
        logs: out,
        params: None,
        grads: None,
        tensors,
    })
}
