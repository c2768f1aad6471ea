//! LoRA on the LLaMA family (docs/TRAIN-LLAMA.md, "LoRA"): adapters beside the frozen model on
//! the HF targets `q_proj` … `down_proj`, in PEFT's names.
//!
//! A target is one HF Linear W `[out, in]` whose output is a column block of a wider stacked
//! tensor ([`Site`]: q, k and v share one `[N, (H + 2K)·D]` output, gate and up one `[N, 2F]`).
//! Its adapters `lora_A` `[r, in]` and `lora_B` `[out, r]` add `s · (x·Aᵀ)·Bᵀ` (s = alpha / r)
//! into that block: the adapter op (`hip_kernels::ops::LoraForward`, on a device the skinny
//! kernels of `kernels/lora_gemm.hip`) writes through a view starting at the block's first
//! column with the stacked width as its row stride ([`Tail::tail_mut`],
//! `LoraParams::ldy`), so nothing is copied. The backward (`LoraBackward`) reads the block of
//! the output gradient the same way.
//!
//! Other families plug in by building their own [`Site`] list (a fused target such as GLM's
//! `query_key_value` is one site over the whole stacked width) and calling
//! [`LlamaAdapters::forward`] / [`LlamaAdapters::backward`] beside their GEMMs.

use super::config::{Family, LlamaConfig};
use super::params::Linear;
use crate::backend::{
    adamw_all, AdamWSlot, AdamWStep, Backend, BackendSlot, GradScaling, Tail, TrainElement, View,
};
use crate::cli::Args;
use crate::error::{Result, TrainError};
use crate::lora::checkpoint::{ADAPTER_CONFIG, ADAPTER_MODEL};
use crate::params::Spec;
use crate::weights::read_f32_tensors;
use hip_kernels::ops::{LoraBackward, LoraForward, LoraParams, Run};
use hip_kernels::params::DType;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::path::Path;

/// The default of `--lora-targets` for these models (PEFT's default).
pub const DEFAULT_TARGETS: &str = "q_proj,v_proj";

/// What PEFT puts before `layers.{l}.…` in a LLaMA-family adapter file.
pub const PEFT_PREFIX: &str = "base_model.model.model.";

/// Where a target's output sits: `inputs` → `outputs` columns at column `offset` of rows
/// `width` wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Site {
    /// Input width (`in` of W `[out, in]`).
    pub inputs: usize,
    /// Output width (`out`).
    pub outputs: usize,
    /// First column of the block in the stacked output.
    pub offset: usize,
    /// Row width of the stacked output.
    pub width: usize,
}

/// `target`'s [`Site`] in a model of `cfg` (q, k, v stacked; gate, up stacked; a GLM fused
/// target spans its whole fused output, [`crate::glm::lora`]).
pub fn site(cfg: &LlamaConfig, target: Linear) -> Site {
    if let Some(s) = crate::glm::lora::fused_site(cfg, target) {
        return s;
    }
    let (c, f) = (cfg.channels, cfg.inner);
    let (hd, kd) = (cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim);
    let w = hd + 2 * kd;
    let s = |inputs, outputs, offset, width| Site {
        inputs,
        outputs,
        offset,
        width,
    };
    match target {
        Linear::Q => s(c, hd, 0, w),
        Linear::K => s(c, kd, hd, w),
        Linear::V => s(c, kd, hd + kd, w),
        Linear::O => s(hd, c, 0, c),
        Linear::Gate => s(c, f, 0, 2 * f),
        Linear::Up => s(c, f, f, 2 * f),
        Linear::Down => s(f, c, 0, c),
    }
}

/// Rank, alpha and targets of a LLaMA-family LoRA run.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaLora {
    /// Rank r.
    pub rank: usize,
    /// alpha (scale alpha / r).
    pub alpha: f64,
    /// Targets in [`Linear::ALL`]'s order, each once.
    pub targets: Vec<Linear>,
}

impl LlamaLora {
    /// The LoRA flags of `args` for llama and qwen2 (`None` without `--lora-rank`).
    pub fn from_args(args: &Args) -> Result<Option<Self>> {
        Self::for_family(args, Family::Llama)
    }

    /// The LoRA flags of `args` for a model of `family` (the GLM family's targets are its
    /// layout's module names, [`crate::glm::lora`]).
    pub fn for_family(args: &Args, family: Family) -> Result<Option<Self>> {
        let Some((rank, alpha)) = crate::lora::check_flags(args)? else {
            return Ok(None);
        };
        let list = args
            .lora_targets
            .as_deref()
            .unwrap_or(crate::glm::lora::default_targets(family).unwrap_or(DEFAULT_TARGETS));
        let mut targets = Vec::new();
        for name in list.split(',').map(str::trim) {
            let Some(t) = target_by_name(family, name) else {
                let all = target_names(family);
                return Err(TrainError::Usage(format!(
                    "--lora-targets: `{name}` is not a target of this model; choose from {}",
                    all.join(", ")
                )));
            };
            if targets.contains(&t) {
                return Err(TrainError::Usage(format!(
                    "--lora-targets: `{name}` is listed twice"
                )));
            }
            targets.push(t);
        }
        targets.sort();
        Ok(Some(Self {
            rank,
            alpha,
            targets,
        }))
    }

    /// alpha / r.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }

    /// Every adapter in PEFT's names, layer by layer, targets in order, `lora_A` then `lora_B`.
    pub fn specs(&self, cfg: &LlamaConfig) -> Vec<Spec> {
        let mut out = Vec::new();
        for l in 0..cfg.layers {
            for &t in &self.targets {
                let s = site(cfg, t);
                let base = match (
                    crate::glm::lora::peft_layer_prefix(cfg.family),
                    crate::glm::lora::name_of(cfg.family, t),
                ) {
                    (Some(prefix), Some((_, path))) => format!("{prefix}{l}.{path}"),
                    _ => format!("{PEFT_PREFIX}layers.{l}.{}", t.path()),
                };
                out.push(Spec {
                    name: format!("{base}.lora_A.weight"),
                    shape: vec![self.rank, s.inputs],
                });
                out.push(Spec {
                    name: format!("{base}.lora_B.weight"),
                    shape: vec![s.outputs, self.rank],
                });
            }
        }
        out
    }

    /// Index of layer `l`'s `lora_A` of `t` in [`LlamaLora::specs`] (`lora_B` follows).
    pub fn index(&self, l: usize, t: Linear) -> Option<usize> {
        let k = self.targets.iter().position(|&x| x == t)?;
        Some(2 * (l * self.targets.len() + k))
    }

    /// `adapter_config.json` that `peft.PeftModel.from_pretrained` loads on the base model
    /// (`target_modules` in the names of `family`'s layout).
    pub fn peft_config(&self, family: Family, base_model: &Path) -> Value {
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model.display().to_string(),
            "r": self.rank,
            "lora_alpha": self.alpha,
            "target_modules": self.targets.iter().map(|&t| target_name(family, t)).collect::<Vec<_>>(),
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "use_dora": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "modules_to_save": null,
            "layers_to_transform": null,
            "rank_pattern": {},
            "alpha_pattern": {},
        })
    }
}

/// Seeded adapters (A uniform in ±1/√in as PEFT's kaiming-uniform, B = 0).
pub fn seeded(lora: &LlamaLora, cfg: &LlamaConfig, seed: u64) -> Vec<Vec<f32>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    lora.specs(cfg)
        .iter()
        .map(|s| {
            let len = s.shape.iter().product();
            if s.name.ends_with(".lora_A.weight") {
                let bound = 1.0 / (s.shape[1] as f64).sqrt();
                (0..len)
                    .map(|_| ((2.0 * rng.f64() - 1.0) * bound) as f32)
                    .collect()
            } else {
                vec![0.0; len]
            }
        })
        .collect()
}

/// The adapters from `path` (a PEFT adapter directory or its `adapter_model.safetensors`), in
/// PEFT's names. A missing, misshapen or non-finite adapter, or a tensor left over, is an error
/// naming the file and the tensor; `adapter_config.json` beside it must agree with the flags.
pub fn load(path: &Path, lora: &LlamaLora, cfg: &LlamaConfig) -> Result<Vec<Vec<f32>>> {
    let file = match path.is_dir() {
        true => path.join(ADAPTER_MODEL),
        false => path.to_path_buf(),
    };
    let config = file.with_file_name(ADAPTER_CONFIG);
    if config.exists() {
        check_config(&config, lora, cfg.family)?;
    }
    take(&file, read_f32_tensors(&file)?, "", &lora.specs(cfg), lora)
}

/// Take `prefix` + each spec's name out of `tensors` (checked as [`load`] says); a tensor left
/// over is an error.
fn take(
    file: &Path,
    mut tensors: BTreeMap<String, crate::weights::HostTensor>,
    prefix: &str,
    specs: &[Spec],
    lora: &LlamaLora,
) -> Result<Vec<Vec<f32>>> {
    let mut out = Vec::new();
    for s in specs {
        let name = format!("{prefix}{}", s.name);
        let Some((shape, data)) = tensors.remove(&name) else {
            return Err(TrainError::file(
                file,
                format!(
                    "tensor `{name}` (shape {:?}) is missing; --lora-rank {} and --lora-targets \
                     need it",
                    s.shape, lora.rank
                ),
            ));
        };
        if shape != s.shape {
            return Err(TrainError::file(
                file,
                format!(
                    "tensor `{name}` has shape {shape:?}, expected {:?} (check --lora-rank)",
                    s.shape
                ),
            ));
        }
        if let Some(i) = data.iter().position(|x| !x.is_finite()) {
            return Err(TrainError::file(
                file,
                format!("tensor `{name}` holds {} at flat index {i}", data[i]),
            ));
        }
        out.push(data);
    }
    if let Some(name) = tensors.keys().next() {
        return Err(TrainError::file(
            file,
            format!("tensor `{name}` is not an adapter of this model and these LoRA flags"),
        ));
    }
    Ok(out)
}

/// What `--resume DIR` restores for a LoRA run.
#[derive(Debug, Clone)]
pub enum LoraResume {
    /// A trainer LoRA checkpoint (its `adapter_model.safetensors` as the trainer wrote it or
    /// rewritten by PEFT's `save_pretrained`): adapters, their moments and the trainer state.
    Checkpoint([Vec<Vec<f32>>; 3], crate::checkpoint::TrainerState),
    /// A bare PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`, no
    /// `trainer.json` and no `optimizer.safetensors`): its adapters, zero moments; the run
    /// starts at step 1 as with `--lora-init DIR`.
    Peft([Vec<Vec<f32>>; 3]),
}

impl LoraResume {
    /// The line rank 0 prints when `dir` was a bare PEFT adapter directory.
    pub fn note(&self, dir: &Path) -> Option<String> {
        match self {
            LoraResume::Checkpoint(..) => None,
            LoraResume::Peft(_) => Some(format!(
                "--resume {}: a PEFT adapter directory without trainer state (no trainer.json, \
                 no {}): starting at step 1 from its adapters with fresh AdamW moments, as \
                 --lora-init would",
                dir.display(),
                crate::lora::checkpoint::OPTIMIZER
            )),
        }
    }
}

/// The adapters, their moments and the trainer state of a LoRA checkpoint `dir` written by
/// [`save`] (also after PEFT rewrote its adapter files: names are read by name, f32/f16/bf16,
/// in any order), or the adapters of a bare PEFT adapter directory ([`LoraResume::Peft`]), for
/// the flags `lora`.
pub fn resume(dir: &Path, lora: &LlamaLora, cfg: &LlamaConfig) -> Result<LoraResume> {
    if !dir.exists() {
        crate::checkpoint::recover_for_resume(dir)?;
    }
    if !dir.join(ADAPTER_CONFIG).is_file() {
        return Err(TrainError::file(
            dir,
            format!(
                "has no {ADAPTER_CONFIG}: not a LoRA checkpoint DIR/step_<s> nor a PEFT adapter \
                 directory (resume a full fine-tuning checkpoint without --lora-rank)"
            ),
        ));
    }
    let opt_path = dir.join(crate::lora::checkpoint::OPTIMIZER);
    let state_path = dir.join("trainer.json");
    if !state_path.exists() && !opt_path.exists() {
        let params = load(dir, lora, cfg)?;
        let zeros: Vec<Vec<f32>> = params.iter().map(|t| vec![0.0; t.len()]).collect();
        return Ok(LoraResume::Peft([params, zeros.clone(), zeros]));
    }
    let params = load(dir, lora, cfg)?;
    let state = crate::checkpoint::TrainerState::from_json(
        &state_path,
        &crate::error::read_regular(&state_path, 1 << 20)?,
    )?;
    let (first, second): (BTreeMap<_, _>, BTreeMap<_, _>) = read_f32_tensors(&opt_path)?
        .into_iter()
        .partition(|(k, _)| k.starts_with("exp_avg."));
    let specs = lora.specs(cfg);
    let exp_avg = take(&opt_path, first, "exp_avg.", &specs, lora)?;
    let exp_avg_sq = take(&opt_path, second, "exp_avg_sq.", &specs, lora)?;
    if let Some(x) = exp_avg_sq.iter().flatten().find(|x| **x < 0.0) {
        return Err(TrainError::file(
            &opt_path,
            format!("a second moment holds {x}; it must be >= 0"),
        ));
    }
    Ok(LoraResume::Checkpoint([params, exp_avg, exp_avg_sq], state))
}

/// Check PEFT's `adapter_config.json` at `path` against the flags (`r`, `lora_alpha`,
/// `target_modules`; no rsLoRA, DoRA or bias).
fn check_config(path: &Path, lora: &LlamaLora, family: Family) -> Result<()> {
    let raw: Value = serde_json::from_slice(&crate::error::read_regular(path, 1 << 20)?)
        .map_err(|e| TrainError::file(path, format!("is not valid JSON: {e}")))?;
    let bad = |m: String| Err(TrainError::file(path, m));
    for key in ["use_rslora", "use_dora", "lora_bias"] {
        if raw.get(key).and_then(Value::as_bool) == Some(true) {
            return bad(format!(
                "sets `{key}`, which this trainer does not implement (plain LoRA only)"
            ));
        }
    }
    let r = raw.get("r").and_then(Value::as_u64);
    let alpha = raw.get("lora_alpha").and_then(Value::as_f64);
    let mut targets: Vec<Linear> = Vec::new();
    for e in raw
        .get("target_modules")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = e.as_str().unwrap_or_default();
        match target_by_name(family, name) {
            Some(t) => targets.push(t),
            None => {
                return bad(format!(
                    "target_modules entry `{name}` is not one of {}",
                    target_names(family).join(", ")
                ))
            }
        }
    }
    targets.sort();
    targets.dedup();
    if r != Some(lora.rank as u64) || alpha != Some(lora.alpha) || targets != lora.targets {
        let names: Vec<_> = targets.iter().map(|&t| target_name(family, t)).collect();
        return bad(format!(
            "the adapters have r = {r:?}, lora_alpha = {alpha:?}, target_modules = {}; run with \
             --lora-rank, --lora-alpha and --lora-targets to match",
            names.join(",")
        ));
    }
    Ok(())
}

/// The target of `family` named `name` (PEFT's module name).
fn target_by_name(family: Family, name: &str) -> Option<Linear> {
    match crate::glm::lora::targets(family) {
        Some(_) => crate::glm::lora::by_name(family, name),
        None => Linear::from_name(name),
    }
}

/// PEFT's module name of target `t` in `family`'s layout.
pub fn target_name(family: Family, t: Linear) -> &'static str {
    crate::glm::lora::name_of(family, t).map_or(t.name(), |n| n.0)
}

/// Every target name of `family`, in order.
fn target_names(family: Family) -> Vec<&'static str> {
    match crate::glm::lora::targets(family) {
        Some(all) => all.iter().map(|t| t.0).collect(),
        None => Linear::ALL.iter().map(|t| t.name()).collect(),
    }
}

fn op(e: hip_kernels::ops::OpError) -> TrainError {
    TrainError::Op(e.to_string())
}

/// The adapters of a LLaMA-family model on backend `B` (storage type `T`, f32 master weights
/// when `T` is not f32), their gradients, AdamW moments and saved `u = x·Aᵀ`.
pub struct LlamaAdapters<T: TrainElement, B: Backend<T>> {
    /// Rank, alpha, targets.
    pub cfg: LlamaLora,
    /// Each target's site.
    sites: Vec<(Linear, Site)>,
    rows: usize,
    /// `lora_A`, `lora_B`, … in [`LlamaLora::specs`]' order.
    pub params: Vec<B::Buf<T>>,
    /// f32 master weights, when `T` is not f32.
    pub master: Option<Vec<B::Buf<f32>>>,
    /// Gradients.
    pub grads: Vec<B::Buf<T>>,
    /// AdamW first moments.
    pub exp_avg: Vec<B::Buf<f32>>,
    /// AdamW second moments.
    pub exp_avg_sq: Vec<B::Buf<f32>>,
    saved: Vec<B::Buf<T>>,
    du: B::Buf<T>,
    _t: PhantomData<T>,
}

impl<T: TrainElement, B: Backend<T>> LlamaAdapters<T, B> {
    /// Upload `[params, exp_avg, exp_avg_sq]` for micro-batches of `rows` positions.
    pub fn new(
        be: &B,
        model: &LlamaConfig,
        cfg: LlamaLora,
        [params, exp_avg, exp_avg_sq]: [&[Vec<f32>]; 3],
        rows: usize,
    ) -> Result<Self> {
        let specs = cfg.specs(model);
        if params.len() != specs.len() || exp_avg.len() != specs.len() {
            return Err(TrainError::Op(format!(
                "{} adapter tensors for {} adapters",
                params.len(),
                specs.len()
            )));
        }
        let up_stat = |v: &Vec<f32>| be.upload::<f32>(v);
        let size = rows
            .checked_mul(cfg.rank)
            .ok_or_else(|| TrainError::Op(format!("{rows} rows × rank {} overflows", cfg.rank)))?;
        Ok(Self {
            sites: cfg.targets.iter().map(|&t| (t, site(model, t))).collect(),
            rows,
            params: params
                .iter()
                .map(|v| be.upload::<T>(v))
                .collect::<Result<_>>()?,
            master: match <T as hip_kernels::params::Element>::DTYPE {
                DType::F32 => None,
                _ => Some(params.iter().map(up_stat).collect::<Result<_>>()?),
            },
            grads: params
                .iter()
                .map(|p| be.zeros::<T>(p.len()))
                .collect::<Result<_>>()?,
            exp_avg: exp_avg.iter().map(up_stat).collect::<Result<_>>()?,
            exp_avg_sq: exp_avg_sq.iter().map(up_stat).collect::<Result<_>>()?,
            saved: (0..specs.len() / 2)
                .map(|_| be.zeros::<T>(size))
                .collect::<Result<_>>()?,
            du: be.zeros(size)?,
            cfg,
            _t: PhantomData,
        })
    }

    fn slot(&self, l: usize, t: Linear) -> Option<(usize, Site)> {
        let i = self.cfg.index(l, t)?;
        let &(_, s) = self.sites.iter().find(|d| d.0 == t)?;
        Some((i, s))
    }

    /// Adds `s · (x·Aᵀ)·Bᵀ` into `t`'s column block of `y` (the stacked output, already
    /// `x·Wᵀ + b`); nothing when `t` carries no adapters.
    pub fn forward(
        &mut self,
        be: &B,
        l: usize,
        t: Linear,
        x: &B::Buf<T>,
        y: &mut B::Buf<T>,
    ) -> Result<()> {
        let Some((i, site)) = self.slot(l, t) else {
            return Ok(());
        };
        let params = self.params_of(site);
        let mut block = y.tail_mut(site.offset)?;
        LoraForward::<B::Space, T> {
            params,
            x: x.view(),
            a: self.params[i].view(),
            b: self.params[i + 1].view(),
            u: self.saved[i / 2].view_mut(),
            y: block.view_mut(),
        }
        .run(be.queue())
        .map_err(op)
    }

    /// The adapter op's parameters at `site`: its rows, dimensions and row stride.
    fn params_of(&self, site: Site) -> LoraParams {
        let scale = self.cfg.scale() as f32;
        LoraParams::new(self.rows, site.inputs, site.outputs, self.cfg.rank, scale)
            .strided(site.width)
    }

    /// The adapters' backward of layer `l`'s target `t` with input `x` and the stacked output
    /// gradient `dy` (only read; mutable for its column-block view): accumulates `dA`, `dB` and adds the adapter path's input gradient to `dx`
    /// (which holds the base's `dy·W`). Nothing when `t` carries no adapters.
    pub fn backward(
        &mut self,
        be: &B,
        l: usize,
        t: Linear,
        x: &B::Buf<T>,
        dy: &mut B::Buf<T>,
        dx: &mut B::Buf<T>,
    ) -> Result<()> {
        let Some((i, site)) = self.slot(l, t) else {
            return Ok(());
        };
        let params = self.params_of(site);
        let (ga, gb) = self.grads.split_at_mut(i + 1);
        let block = dy.tail_mut(site.offset)?;
        // dA and dB accumulate over the step's micro-batches.
        LoraBackward::<B::Space, T> {
            params: params.accumulating(),
            x: x.view(),
            dy: block.view(),
            a: self.params[i].view(),
            b: self.params[i + 1].view(),
            u: self.saved[i / 2].view(),
            du: self.du.view_mut(),
            da: ga[i].view_mut(),
            db: gb[0].view_mut(),
            dx: dx.view_mut(),
        }
        .run(be.queue())
        .map_err(op)
    }

    /// Zero the gradients (start of a step).
    pub fn zero_grads(&mut self, be: &B) -> Result<()> {
        for g in &mut self.grads {
            be.fill_zero(g)?;
        }
        Ok(())
    }

    /// Data parallel: hand layer `l`'s adapter gradients (final for this step) to the
    /// backend's all-reduce, one bucket. Nothing on one device.
    pub fn grads_ready(&mut self, be: &B, l: usize) -> Result<()> {
        let per_layer = 2 * self.cfg.targets.len();
        let start = l * per_layer;
        let mut bufs: Vec<&mut B::Buf<T>> =
            self.grads.iter_mut().skip(start).take(per_layer).collect();
        be.grads_ready(&mut bufs, None)
    }

    /// Store the adapters' gradient norm in `scalars`.
    pub fn grad_norm(&self, be: &B, scalars: &mut B::Scalars) -> Result<()> {
        let all: Vec<&B::Buf<T>> = self.grads.iter().collect();
        be.grad_norm(&all, scalars)
    }

    /// One AdamW step of every adapter (all 2-D: weight decay applies).
    pub fn update(
        &mut self,
        be: &B,
        hyper: &AdamWStep,
        scaling: GradScaling,
        scalars: &B::Scalars,
    ) -> Result<()> {
        let mut masters = self.master.as_mut().map(|m| m.iter_mut());
        let mut slots: Vec<BackendSlot<'_, B, T>> = self
            .params
            .iter_mut()
            .zip(&self.grads)
            .zip(self.exp_avg.iter_mut().zip(self.exp_avg_sq.iter_mut()))
            .map(|((param, grad), (exp_avg, exp_avg_sq))| AdamWSlot {
                master: masters.as_mut().and_then(|it| it.next()),
                param,
                grad,
                exp_avg,
                exp_avg_sq,
                decay: true,
            })
            .collect();
        adamw_all(be, hyper, scaling, scalars, &mut slots)
    }

    /// The adapters (f32: the master weights when there are) and their moments on the host.
    pub fn download(&self, be: &B) -> Result<[Vec<Vec<f32>>; 3]> {
        let stat = |t: &B::Buf<f32>| be.download(t);
        let params = match &self.master {
            Some(m) => m.iter().map(stat).collect::<Result<_>>()?,
            None => self
                .params
                .iter()
                .map(|t| be.download(t))
                .collect::<Result<_>>()?,
        };
        Ok([
            params,
            self.exp_avg.iter().map(stat).collect::<Result<_>>()?,
            self.exp_avg_sq.iter().map(stat).collect::<Result<_>>()?,
        ])
    }
}

/// Write a LoRA checkpoint `dir/step_<s>/` atomically: `adapter_model.safetensors` (PEFT's
/// names), `adapter_config.json`, the adapters' AdamW moments (`optimizer.safetensors`) and
/// `trainer.json`. The frozen base is not written; with `merged` (`--merge-on-save`: HF
/// tensors in [`super::params::Layout::new`]'s order, [`super::merge::merged`]) the merged
/// model is, as `config.json` + `model.safetensors` (f32, HF names).
pub fn save(
    dir: &Path,
    lora: &LlamaLora,
    cfg: &LlamaConfig,
    [params, exp_avg, exp_avg_sq]: &[Vec<Vec<f32>>; 3],
    base_model: &Path,
    state: &crate::checkpoint::TrainerState,
    merged: Option<&[Vec<f32>]>,
) -> Result<std::path::PathBuf> {
    let specs = lora.specs(cfg);
    let named = |prefix: &str, group: &'_ [Vec<f32>]| -> Vec<(String, Vec<usize>, Vec<f32>)> {
        specs
            .iter()
            .zip(group)
            .map(|(s, t)| (format!("{prefix}{}", s.name), s.shape.clone(), t.clone()))
            .collect()
    };
    let adapters = named("", params);
    let mut moments = named("exp_avg.", exp_avg);
    moments.extend(named("exp_avg_sq.", exp_avg_sq));
    let json = |v: &Value, name: &str| {
        serde_json::to_vec_pretty(v).map_err(|e| TrainError::Op(format!("serializing {name}: {e}")))
    };
    let state_json = serde_json::to_vec_pretty(state)
        .map_err(|e| TrainError::Op(format!("serializing trainer.json: {e}")))?;
    let mut files = vec![
        (
            ADAPTER_MODEL,
            crate::weights::to_safetensors(&as_refs(&adapters))?,
        ),
        (
            ADAPTER_CONFIG,
            json(&lora.peft_config(cfg.family, base_model), ADAPTER_CONFIG)?,
        ),
        (
            crate::lora::checkpoint::OPTIMIZER,
            crate::weights::to_safetensors(&as_refs(&moments))?,
        ),
        ("trainer.json", state_json),
    ];
    if let Some(m) = merged {
        files.push(("config.json", json(&cfg.raw, "config.json")?));
        files.push(("model.safetensors", super::weights::to_bytes(cfg, m)?));
    }
    crate::checkpoint::save_files(dir, state.step, &files)
}

/// The `(name, shape, data)` triples as `to_safetensors` takes them.
fn as_refs(v: &[(String, Vec<usize>, Vec<f32>)]) -> Vec<(String, Vec<usize>, &[f32])> {
    v.iter()
        .map(|(n, s, t)| (n.clone(), s.clone(), t.as_slice()))
        .collect()
}
