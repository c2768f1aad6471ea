//! The training loop: load, check, train, log, checkpoint.

use crate::backend::TrainElement;
use crate::backend::{AdamWStep, Backend, GradScaling, MemStats};
use crate::checkpoint::{self, Snapshot, TrainerState};
use crate::cli::{Args, Device, Precision};
use crate::config::GptConfig;
use crate::cpu_backend::Cpu;
use crate::data::{Loader, Tokens};
use crate::device_backend::DeviceBackend;
use crate::error::{Result, TrainError};
use crate::graph_step::{GraphStep, Phase};
use crate::model::Gpt2;
use crate::outputs;
use crate::trainer_state::LOSS_SCALE_RANGE;
use crate::weights::{load_params, model_paths};
use half::{bf16, f16};
use hip_rt::ddp::LaunchEnv;
use std::io::Write;
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
    /// f16: the loss scale the step's backward used, and whether the step was skipped.
    pub scaler: Option<(f64, bool)>,
    /// On a device: the caching allocator's figures after the step (peak: during the step);
    /// rank 0's with data parallelism.
    pub mem: Option<MemStats>,
    /// Ranks (devices) the step ran on.
    pub world_size: usize,
}

/// `torch.amp.GradScaler`'s dynamic loss scale: halve and reset on a non-finite gradient,
/// double after `window` clean steps in a row.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossScaler {
    /// Current scale.
    pub scale: f64,
    /// Clean steps since the scale last changed.
    pub clean: u64,
    /// Clean steps before doubling.
    pub window: u64,
}

impl LossScaler {
    /// Account for a step whose gradients were (not) all finite. The scale stays inside
    /// [`LOSS_SCALE_RANGE`] (torch's scaler has no bounds; at its ends f32 would round the
    /// scale or its reciprocal to 0 or infinity).
    pub fn update(&mut self, found_inf: bool) {
        let (lo, hi) = (*LOSS_SCALE_RANGE.start(), *LOSS_SCALE_RANGE.end());
        if found_inf {
            self.scale = (self.scale * 0.5).max(lo);
            self.clean = 0;
        } else {
            self.clean = self.clean.saturating_add(1);
            // `>=`: a resume may shorten --scale-window below the clean steps counted so far.
            if self.clean >= self.window {
                self.scale = (self.scale * 2.0).min(hi);
                self.clean = 0;
            }
        }
    }
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
    let mut v = serde_json::json!({
        "step": l.step,
        "loss": l.loss,
        "lr": l.lr,
        "grad_norm": l.grad_norm,
        "tokens_per_s": l.tokens_per_s,
        "world_size": l.world_size,
    });
    if let Some(o) = v.as_object_mut() {
        if let Some(m) = l.mem {
            o.insert("mem_allocated".into(), m.allocated.into());
            o.insert("mem_reserved".into(), m.reserved.into());
            o.insert("mem_peak".into(), m.peak.into());
        }
        if let Some((scale, skipped)) = l.scaler {
            o.insert("loss_scale".into(), scale.into());
            o.insert("skipped".into(), skipped.into());
        }
    }
    v.to_string()
}

/// Everything loaded and checked before the first step.
#[derive(Clone)]
pub(crate) struct Setup {
    pub(crate) cfg: GptConfig,
    pub(crate) tokens: Tokens,
    pub(crate) loader: Loader,
    pub(crate) restored: checkpoint::Restored,
    /// LoRA's adapters (and their moments), when `--lora-rank` > 0.
    pub(crate) lora: Option<crate::lora::HostAdapters>,
}

/// Where this process's (or thread's) rank sits in the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    /// Rank, `0..world`.
    pub rank: usize,
    /// Ranks in all.
    pub world: usize,
}

impl Role {
    /// One device, or the CPU.
    pub const SINGLE: Role = Role { rank: 0, world: 1 };

    /// Rank 0 prints, logs and checkpoints.
    pub fn primary(&self) -> bool {
        self.rank == 0
    }
}

/// Load and check what a run of `world` ranks reads; the loader takes `world × --batch` rows
/// per micro-batch (every rank then keeps its own `--batch` rows).
fn setup(args: &Args, world: usize) -> Result<Setup> {
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
    let global_batch = args.batch.checked_mul(world).ok_or_else(|| {
        TrainError::Usage(format!("--batch {} × {world} ranks overflows", args.batch))
    })?;
    let mut loader = Loader::new(&args.data, &tokens, global_batch, args.seq)?;
    let lora_cfg = crate::lora::LoraConfig::from_args(args)?;
    let mut lora = None;
    let restored = match &args.resume {
        None if lora_cfg.is_some() => {
            let params = load_params(&weights, &cfg)?;
            let state = new_state(args, global_batch, 0, 0, tokens.ids.len());
            let (adapters, r) = crate::lora::start(args, lora_cfg.as_ref(), &cfg, params, state)?;
            lora = Some(adapters);
            r
        }
        None => {
            let params = load_params(&weights, &cfg)?;
            let zeros = params.try_map(|_, t| Ok::<_, TrainError>(vec![0.0; t.len()]))?;
            checkpoint::Restored {
                params,
                exp_avg: zeros.clone(),
                exp_avg_sq: zeros,
                state: new_state(args, global_batch, 0, 0, tokens.ids.len()),
            }
        }
        Some(dir) => {
            let r = match &lora_cfg {
                Some(lc) => {
                    let (adapters, r) =
                        crate::lora::resume(dir, lc, &cfg, load_params(&weights, &cfg)?)?;
                    lora = Some(adapters);
                    r
                }
                None => checkpoint::load(dir, &cfg)?,
            };
            check_resumed(args, dir, &r.state, world, tokens.ids.len())?;
            loader.pos = r.state.loader_pos;
            r
        }
    };
    Ok(Setup {
        cfg,
        tokens,
        loader,
        restored,
        lora,
    })
}

/// A checkpoint's state `s` against this run: the same global batch (ranks × `--batch`),
/// `--seq`, `--grad-accum`, `--dtype` and data, and a step before `--steps`. Errors name `dir`
/// and the flags to give.
pub(crate) fn check_resumed(
    args: &Args,
    dir: &std::path::Path,
    s: &TrainerState,
    world: usize,
    data_tokens: usize,
) -> Result<()> {
    let global_batch = args.batch.saturating_mul(world);
    // `batch` in a checkpoint is the global batch (ranks × --batch): a checkpoint
    // resumes on another number of devices when the global batch agrees.
    let same = (s.batch, s.seq, s.grad_accum, s.dtype)
        == (global_batch, args.seq, args.grad_accum, args.dtype);
    if !same {
        let ranks = match world {
            1 => String::new(),
            w => format!(
                " (here {w} ranks × --batch {} = {global_batch})",
                args.batch
            ),
        };
        return Err(TrainError::file(
            dir,
            format!(
                "checkpoint was trained with --batch {} --seq {} --grad-accum {} --dtype {:?} \
                 (batch: rows per micro-batch over all ranks){ranks}; resume with the same flags",
                s.batch, s.seq, s.grad_accum, s.dtype
            ),
        ));
    }
    if s.data_tokens != data_tokens || s.loader_pos > data_tokens {
        return Err(TrainError::file(
            dir,
            format!(
                "checkpoint was trained on a token file of {} tokens (next position {}); {} holds {}",
                s.data_tokens,
                s.loader_pos,
                args.data.display(),
                data_tokens
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
    Ok(())
}

pub(crate) fn new_state(
    args: &Args,
    global_batch: usize,
    step: u64,
    loader_pos: usize,
    data_tokens: usize,
) -> TrainerState {
    TrainerState {
        format: checkpoint::FORMAT.into(),
        step,
        loader_pos,
        data_tokens,
        loss_scale: match args.dtype {
            Precision::F16 => args.scale_init,
            _ => 1.0,
        },
        scale_clean_steps: 0,
        adam_steps: step,
        batch: global_batch,
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

/// Run the trainer as the command line (and torchrun's variables) say; returns what every step
/// logged (rank 0's figures with data parallelism).
pub fn run(args: &Args) -> Result<Vec<StepLog>> {
    args.validate()?;
    let launched = LaunchEnv::from_env().map_err(|e| TrainError::Usage(e.to_string()))?;
    if show_memory_estimate(args, launched.as_ref())? {
        return Ok(Vec::new());
    }
    if launched.is_some() || args.devices.is_some() {
        // Bounds every wait on another rank: checked before any work.
        hip_rt::comm::default_timeout().map_err(|e| TrainError::Usage(e.to_string()))?;
    }
    match (launched, &args.devices) {
        (Some(_), Some(list)) => Err(TrainError::Usage(format!(
            "--devices {} with the launcher variables (RANK, WORLD_SIZE, ...) set: use one \
             process per device (the variables) or one process for all (--devices), not both",
            crate::cli::device_list(list)
        ))),
        (Some(env), None) => crate::parallel::run_launched(args, env),
        (None, Some(list)) => Ok(crate::parallel::run_devices(args, list, false)?
            .into_iter()
            .next()
            .map(|r| r.logs)
            .unwrap_or_default()),
        (None, None) => {
            let (model_dir, _) = model_paths(&args.model);
            if let crate::config::ModelConfig::Llama(cfg) =
                crate::config::ModelConfig::load(&model_dir.join("config.json"))?
            {
                return crate::llama::train::run_single(args, cfg);
            }
            let setup = prepare(args, 1)?;
            match args.device {
                Device::Cpu => train_as(&Cpu, args, setup, Role::SINGLE),
                Device::Gpu(n) => train_as(
                    &{
                        let b = DeviceBackend::new(n, args.grad_accum)?;
                        b.set_offload_flag(args.offload_optimizer.is_some());
                        b
                    },
                    args,
                    setup,
                    Role::SINGLE,
                ),
            }
        }
    }
}

/// The memory estimate (crate::memory): with `--memory-estimate` printed alone (returns true:
/// exit without training); otherwise printed by rank 0 of a device run before it starts.
fn show_memory_estimate(args: &Args, launched: Option<&LaunchEnv>) -> Result<bool> {
    let world = match (launched, &args.devices) {
        (Some(env), _) => env.world_size,
        (None, Some(list)) => list.len(),
        (None, None) => 1,
    };
    crate::memory::check_world(args, world)?;
    crate::memory::check_offload(args, crate::memory::on_device(args, launched.is_some()))?;
    let primary = launched.map_or(true, |e| e.rank == 0);
    if args.memory_estimate {
        if primary {
            let (what, est) = crate::memory::for_args(args, world, None)?;
            println!("{}", est.table(&what));
        }
        return Ok(true);
    }
    if primary && crate::memory::on_device(args, launched.is_some()) {
        let (what, est) = crate::memory::for_args(args, world, None)?;
        println!("{}", est.table(&what));
    }
    Ok(false)
}

/// Rank 0's checks of its outputs, the setup, and the checkpoint directory made ready.
fn prepare(args: &Args, world: usize) -> Result<Setup> {
    outputs::check_log(args)?;
    let setup = setup(args, world)?;
    outputs::check_checkpoint_dir(args, first_step(&setup.restored.state)?)?;
    if let Some(dir) = &args.checkpoint_dir {
        checkpoint::prepare_dir(dir)?;
    }
    Ok(setup)
}

/// What one rank of a data-parallel run ends with.
#[derive(Debug, Clone)]
pub struct RankOutcome {
    /// Its step figures (the same on every rank).
    pub logs: Vec<StepLog>,
    /// Its final f32 parameters, when asked for (to compare ranks).
    pub params: Option<crate::params::Params<Vec<f32>>>,
    /// Its gradient buffers after the last step, when asked for (with ZeRO stage 1 only the
    /// tensors it owns hold the sums across ranks).
    pub grads: Option<crate::params::Params<Vec<f32>>>,
    /// A LLaMA-family rank, when asked for: its final f32 parameters and its gradient
    /// buffers, in HF order (`crate::llama::Layout`).
    pub tensors: Option<[Vec<Vec<f32>>; 2]>,
}

/// A data-parallel rank's run on `backend`: [`prepare`] on rank 0 (the others only read), then
/// [`train_as`]. `keep_params`: download the final parameters.
pub(crate) fn run_rank(
    backend: &DeviceBackend,
    args: &Args,
    role: Role,
    setup: Option<Setup>,
    keep_params: bool,
) -> Result<RankOutcome> {
    let setup = match setup {
        Some(s) => s,
        None if role.primary() => prepare(args, role.world)?,
        None => self::setup(args, role.world)?,
    };
    let (logs, params, grads) = match args.dtype {
        Precision::F32 => train_keep::<f32>(backend, args, setup, role, keep_params)?,
        Precision::Bf16 => train_keep::<bf16>(backend, args, setup, role, keep_params)?,
        Precision::F16 => train_keep::<f16>(backend, args, setup, role, keep_params)?,
    };
    Ok(RankOutcome {
        logs,
        params,
        grads,
        tensors: None,
    })
}

/// Load the setup for `world` ranks once (rank 0's checks included), to hand to every thread.
pub(crate) fn prepare_shared(args: &Args, world: usize) -> Result<Setup> {
    prepare(args, world)
}

/// This rank's setup: [`prepare`] on rank 0 (which writes), [`setup`] on the others.
pub(crate) fn prepare_for(args: &Args, role: Role) -> Result<Setup> {
    match role.primary() {
        true => prepare(args, role.world),
        false => setup(args, role.world),
    }
}

/// The first step to run after `state` (checked: a corrupt counter must not overflow).
fn first_step(state: &TrainerState) -> Result<u64> {
    state
        .step
        .checked_add(1)
        .ok_or_else(|| TrainError::Op(format!("step {} is the last step there is", state.step)))
}

/// [`train`] with the storage type `--dtype` names.
fn train_as<B>(backend: &B, args: &Args, setup: Setup, role: Role) -> Result<Vec<StepLog>>
where
    B: Backend<f32> + Backend<bf16> + Backend<f16>,
{
    let out = match args.dtype {
        Precision::F32 => train::<f32, _>(backend, args, setup, role, false)?,
        Precision::Bf16 => train::<bf16, _>(backend, args, setup, role, false)?,
        Precision::F16 => train::<f16, _>(backend, args, setup, role, false)?,
    };
    Ok(out.0)
}

/// The step figures, and with `keep_params` the final parameters and gradient buffers.
type Trained = (
    Vec<StepLog>,
    Option<crate::params::Params<Vec<f32>>>,
    Option<crate::params::Params<Vec<f32>>>,
);

fn train_keep<T: TrainElement>(
    backend: &DeviceBackend,
    args: &Args,
    setup: Setup,
    role: Role,
    keep_params: bool,
) -> Result<Trained> {
    train::<T, _>(backend, args, setup, role, keep_params)
}

/// The step's progress line (rank 0) and its JSONL record (`--log`, rank 0's writer).
pub(crate) fn emit_step(
    l: &StepLog,
    args: &Args,
    role: Role,
    tok_note: &str,
    log: &mut Option<std::io::BufWriter<std::fs::File>>,
) -> Result<()> {
    let scale_note = match l.scaler {
        Some((sc, true)) => format!(" | scale {sc} skipped"),
        Some((sc, false)) => format!(" | scale {sc}"),
        None => String::new(),
    };
    let mem_note = l.mem.map_or(String::new(), |m| {
        format!(
            " | mem {} alloc, {} reserved, {} peak",
            mib(m.allocated),
            mib(m.reserved),
            mib(m.peak)
        )
    });
    if role.primary() {
        println!(
            "step {}/{} | loss {:.6} | lr {} | norm {:.4} | {:.0} tok/s{tok_note}{scale_note}{mem_note}",
            l.step,
            args.steps,
            l.loss,
            sci2(l.lr),
            l.grad_norm,
            l.tokens_per_s
        );
    }
    if let (Some(w), Some(p)) = (log.as_mut(), &args.log) {
        writeln!(w, "{}", json_line(l))
            .and_then(|()| w.flush())
            .map_err(TrainError::io(p))?;
    }
    Ok(())
}

/// `12.3 MiB`.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn train<T: TrainElement, B: Backend<T>>(
    backend: &B,
    args: &Args,
    mut s: Setup,
    role: Role,
    keep_params: bool,
) -> Result<Trained> {
    let r = &s.restored;
    let mut model = match &s.lora {
        Some(adapters) => {
            let (batch, seq, ckpt) = (args.batch, args.seq, args.grad_checkpoint);
            Gpt2::with_lora(backend, &s.cfg, &r.params, adapters, batch, seq, ckpt)?
        }
        None => Gpt2::new(
            backend,
            &s.cfg,
            [&r.params, &r.exp_avg, &r.exp_avg_sq],
            args.batch,
            args.seq,
            args.zero,
            args.grad_checkpoint,
        )?,
    };
    let first = first_step(&r.state)?;
    let world = role.world;
    let tokens_per_step = args.batch * args.seq * args.grad_accum * world;
    let on = match world {
        1 => backend.name(),
        w => format!("{}, rank 0 of {w}", backend.name()),
    };
    if role.primary() {
        println!(
            "train_gpt2 on {on}: {} | {} parameters | steps {first}..={} | {tokens_per_step} tokens/step",
            s.cfg.describe(),
            crate::lora::describe_parameters(&r.params, s.lora.as_ref(), &s.cfg),
            args.steps,
        );
    }
    let mut log = match (&args.log, role.primary()) {
        (Some(p), true) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).map_err(TrainError::io(p))?,
        )),
        _ => None,
    };
    let clip = (args.grad_clip > 0.0).then_some(args.grad_clip);
    // A skipped (non-finite) step does not count for AdamW's bias corrections, as in torch.
    let mut adam_steps = r.state.adam_steps;
    let mut scaler = (args.dtype == Precision::F16).then_some(LossScaler {
        scale: r.state.loss_scale,
        clean: r.state.scale_clean_steps,
        window: args.scale_window,
    });
    let tokens_per_step = tokens_per_step as f64;
    // This rank's rows of each micro-batch of `world × --batch` rows.
    let rows = args.batch * args.seq;
    let mine = role.rank * rows..(role.rank + 1) * rows;
    // Timings on hip-emu (a CPU emulating the device) are no performance figure: say so.
    let tok_note = if backend.emulated() {
        " (emulated)"
    } else {
        ""
    };
    let mut out = Vec::new();
    // --graph: the steady step captured once and replayed (crate::graph_step).
    let mut graph = GraphStep::new(backend, args, world, None);
    let mut kept = None;
    for step in first..=args.steps {
        let t0 = Instant::now();
        backend.reset_peak_memory();
        let batches: Vec<_> = (0..args.grad_accum)
            .map(|_| s.loader.next(&s.tokens))
            .collect();
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
            (loss_scale.to_bits(), 0),
            &mut kept,
            &mut fresh,
            |phase, scalars| {
                if phase == Phase::Upload {
                    // What the graph reads from outside it: the ids (as the step's calls below
                    // make them), the optimizer's tables and the loss scale.
                    for b in &batches {
                        backend.ids(&b.inputs[mine.clone()])?;
                        backend.ids(&b.targets[mine.clone()])?;
                    }
                    model.grad_norm(scalars)?;
                    return model.update(&hyper, scaling, scalars);
                }
                model.zero_grads()?;
                for (micro, b) in batches.iter().enumerate() {
                    let (x, y) = (
                        backend.ids(&b.inputs[mine.clone()])?,
                        backend.ids(&b.targets[mine.clone()])?,
                    );
                    let last = micro + 1 == args.grad_accum;
                    model.forward_backward(&x, &y, args.grad_accum, loss_scale, scalars, last)?;
                }
                model.grad_norm(scalars)?;
                model.update(&hyper, scaling, scalars)
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
            tokens_per_s: tokens_per_step / t0.elapsed().as_secs_f64().max(1e-9),
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
        emit_step(&l, args, role, tok_note, &mut log)?;
        out.push(l);
        let due = args.save_every > 0 && (step % args.save_every == 0 || step == args.steps);
        // With ZeRO every rank takes part in gathering the state rank 0 saves.
        let gathers = role.primary() || (args.zero >= 1 && world > 1);
        if let (true, true, Some(dir)) = (due, gathers, &args.checkpoint_dir) {
            let global_batch = args.batch * world;
            let mut state = new_state(args, global_batch, step, s.loader.pos, s.tokens.ids.len());
            if let Some(sc) = scaler {
                (state.loss_scale, state.scale_clean_steps) = (sc.scale, sc.clean);
            }
            state.adam_steps = adam_steps;
            if let Some(lo) = &model.lora {
                let path = crate::lora::save(dir, args, &s.cfg, &r.params, lo, backend, &state)?;
                println!("saved {}", path.display());
                continue;
            }
            let [params, exp_avg, exp_avg_sq] = model.download()?;
            if !role.primary() {
                continue;
            }
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
    let params =
        match (keep_params, &model.lora) {
            (false, _) => None,
            // LoRA: the model as a merged save would write it (base + every adapter).
            (true, Some(lo)) => Some(crate::lora::merge::merged(
                &r.params,
                &lo.download(backend)?,
                &s.cfg,
            )?),
            (true, None) => Some(model.download()?.into_iter().next().ok_or_else(|| {
                TrainError::Op("the model's download returned no parameters".into())
            })?),
        };
    let grads = match keep_params {
        true => model.download_grads()?,
        false => None,
    };
    Ok((out, params, grads))
}
