//! Device memory of a run: the per-rank estimate (`--memory-estimate`, [`estimate`]) and the
//! checks of the memory flags (docs/MEMORY.md).
//!
//! `--grad-checkpoint`, `--zero 2` ([`crate::zero2`]) and `--offload-optimizer cpu`
//! ([`crate::offload`]) train (both model families).

pub mod estimate;
pub mod table;

use crate::cli::{Args, Device, Precision};
use crate::config::ModelConfig;
use crate::error::{Result, TrainError};
use crate::llama::LlamaConfig;
use crate::lora::LoraConfig;
use estimate::{LoraPlan, Settings, Shape, DEFAULT_BUCKET_ELEMS};

/// The memory flags alone: `--bucket-mb` only with `--zero 2`, positive and finite;
/// `--offload-optimizer cpu` without LoRA (whose adapters' optimizer state is too small to be
/// worth moving) and without `--graph`.
pub fn check_flags(args: &Args) -> Result<()> {
    let bad = |m: String| Err(TrainError::Usage(m));
    if let Some(mb) = args.bucket_mb {
        if !(mb.is_finite() && mb > 0.0 && bucket_elems(args) >= 1) {
            return bad(format!(
                "--bucket-mb {mb}: must be a positive number of MiB holding at least one element"
            ));
        }
        if args.zero != 2 {
            return bad(format!(
                "--bucket-mb {mb} sizes ZeRO stage 2's gradient buckets, but --zero is {}: \
                 add --zero 2 or drop --bucket-mb",
                args.zero
            ));
        }
    }
    if args.offload_optimizer.is_some() && !args.memory_estimate {
        if args.lora_rank > 0 {
            // A choice, not a gap: LoRA's frozen base has no optimizer state, and the adapters'
            // (r·(in + out) per adapted matrix) are a fraction of a percent of the weights.
            return bad(format!(
                "--offload-optimizer cpu with --lora-rank {}: LoRA trains only the adapters, \
                 whose master weights and moments are a fraction of a percent of the model's \
                 memory (the frozen base has no optimizer state), so moving them to the host \
                 frees next to nothing and adds a host round trip per step; drop \
                 --offload-optimizer (or --lora-rank for a full fine-tune)",
                args.lora_rank
            ));
        }
        if args.graph {
            return bad(
                "--offload-optimizer cpu with --graph: the host AdamW update cannot be \
                 captured in a graph; drop --graph or the offload"
                    .into(),
            );
        }
    }
    Ok(())
}

/// The offload's backend: `--offload-optimizer cpu` moves optimizer state off a device, so a
/// run on the CPU backend (`on_device` false) is a usage error naming the flag.
pub fn check_offload(args: &Args, on_device: bool) -> Result<()> {
    if args.offload_optimizer.is_some() && !on_device && !args.memory_estimate {
        return Err(TrainError::Usage(
            "--offload-optimizer cpu moves the optimizer state off a device's memory; the CPU \
             backend has none (train on a device: --device N or --devices 0,1,…, or drop the \
             flag)"
                .into(),
        ));
    }
    Ok(())
}

/// The checks that need the number of ranks `world`.
pub fn check_world(args: &Args, world: usize) -> Result<()> {
    if args.zero == 2 && world < 2 {
        return Err(TrainError::Usage(format!(
            "--zero 2 with {world} rank: ZeRO shards across ranks; run on several devices \
             (--devices 0,1,… or one process per device) or drop --zero"
        )));
    }
    Ok(())
}

/// LoRA's adapters on a LLaMA- or GLM-family model (`--lora-targets` in the layout's names; a
/// fused GLM target is one adapter over its fused output).
fn llama_lora(lora: &crate::llama::lora::LlamaLora, cfg: &LlamaConfig) -> LoraPlan {
    let modules = lora
        .targets
        .iter()
        .map(|&l| {
            let site = crate::llama::lora::site(cfg, l);
            (site.inputs, site.outputs)
        })
        .collect();
    LoraPlan {
        rank: lora.rank,
        modules,
    }
}

/// The estimate of the run `args` describes on `world` ranks (reads only config.json), of
/// `rank` (`None`: the rank with the largest share), and a one-line description of what it is
/// of.
pub fn for_args(
    args: &Args,
    world: usize,
    rank: Option<usize>,
) -> Result<(String, estimate::Estimate)> {
    let (model_dir, _) = crate::weights::model_paths(&args.model);
    let cfg = ModelConfig::load(&model_dir.join("config.json"))?;
    let bucket_elems = bucket_elems(args);
    let mut s = Settings {
        dtype: args.dtype,
        batch: args.batch,
        seq: args.seq,
        grad_accum: args.grad_accum,
        world,
        zero: args.zero,
        lora: None,
        grad_checkpoint: args.grad_checkpoint,
        offload: args.offload_optimizer.is_some(),
        bucket_elems,
        guard_slack: guard_slack(),
    };
    let of = |shape: Shape, s: &Settings| match rank {
        Some(r) => estimate::estimate_rank(shape, s, r),
        None => estimate::estimate(shape, s),
    };
    let (describe, est) = match &cfg {
        ModelConfig::Gpt2(c) => {
            s.lora = LoraConfig::from_args(args)?.map(|l| LoraPlan::gpt2(&l, c));
            (c.describe(), of(Shape::Gpt2(c), &s))
        }
        ModelConfig::Llama(c) => {
            s.lora = crate::llama::lora::LlamaLora::for_family(args, c.family)?
                .map(|l| llama_lora(&l, c));
            (c.describe(), of(Shape::Llama(c), &s))
        }
    };
    let mut what = vec![
        format!("{:?}", args.dtype).to_lowercase(),
        format!("batch {} × seq {}", args.batch, args.seq),
        format!("{world} rank{}", if world == 1 { "" } else { "s" }),
        format!("zero {}", args.zero),
    ];
    if let Some(l) = &s.lora {
        what.push(format!("LoRA r={}", l.rank));
    }
    if args.grad_checkpoint {
        what.push("grad-checkpoint".into());
    }
    if s.offload {
        what.push("optimizer offloaded to cpu".into());
    }
    Ok((format!("{describe}; {}", what.join(", ")), est))
}

/// ZeRO stage 2's bucket in elements of the storage type: `--bucket-mb` MiB, or
/// [`DEFAULT_BUCKET_ELEMS`] (DeepSpeed's `reduce_bucket_size`).
pub fn bucket_elems(args: &Args) -> usize {
    match args.bucket_mb {
        Some(mb) => (mb * (1u64 << 20) as f64 / estimate_elem_bytes(args.dtype) as f64) as usize,
        None => DEFAULT_BUCKET_ELEMS,
    }
}

/// hip-emu's guard byte per allocation when the loaded HIP runtime is hip-emu (the figures
/// are then the emulator's), else none.
fn guard_slack() -> usize {
    usize::from(hip_rt::emu::is_hip_emu())
}

fn estimate_elem_bytes(d: Precision) -> usize {
    match d {
        Precision::F32 => 4,
        _ => 2,
    }
}

/// Whether a run on `args.device` / `--devices` / the launcher uses a HIP device (whose memory
/// the estimate is of).
pub fn on_device(args: &Args, launched: bool) -> bool {
    launched || args.devices.is_some() || matches!(args.device, Device::Gpu(_))
}

#[cfg(test)]
mod tests {
    use crate::cli::Args;
    use crate::error::TrainError;
    use clap::Parser;

    fn args(extra: &[&str]) -> Args {
        let mut argv = vec!["hipk-train", "--model", "m", "--data", "d"];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv).unwrap()
    }

    fn usage(extra: &[&str]) -> String {
        let a = args(extra);
        let r = a.validate().and_then(|()| super::check_world(&a, 1));
        match r {
            Err(TrainError::Usage(m)) => m,
            other => panic!("{extra:?}: expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn memory_flags_give_usage_errors_naming_the_flag() {
        let m = usage(&["--zero", "2", "--memory-estimate"]);
        assert!(m.contains("--zero 2 with 1 rank"), "{m}");
        let m = usage(&["--zero", "3"]);
        assert!(m.starts_with("--zero 3"), "{m}");
        let m = usage(&["--bucket-mb", "64"]);
        assert!(
            m.starts_with("--bucket-mb 64") && m.contains("--zero 2"),
            "{m}"
        );
        let m = usage(&["--zero", "2", "--bucket-mb", "0"]);
        assert!(m.starts_with("--bucket-mb 0"), "{m}");
        assert!(args(&["--grad-checkpoint"]).validate().is_ok());
        assert!(args(&["--offload-optimizer", "cpu"]).validate().is_ok());
        let m = usage(&["--offload-optimizer", "cpu", "--graph"]);
        assert!(m.starts_with("--offload-optimizer cpu with --graph"), "{m}");
        let a = args(&["--offload-optimizer", "cpu"]);
        let e = super::check_offload(&a, false);
        assert!(
            matches!(&e, Err(TrainError::Usage(m)) if m.starts_with("--offload-optimizer cpu")),
            "{e:?}"
        );
        assert!(super::check_offload(&a, true).is_ok());
        let m = usage(&["--zero", "1", "--lora-rank", "4"]);
        assert!(m.contains("--lora-rank 4"), "{m}");
        // Offload with ZeRO 2 trains (and is estimated).
        let a = args(&[
            "--memory-estimate",
            "--grad-checkpoint",
            "--zero",
            "2",
            "--offload-optimizer",
            "cpu",
        ]);
        assert!(a.validate().is_ok());
        assert!(args(&["--zero", "1", "--offload-optimizer", "cpu"])
            .validate()
            .is_ok());
        assert!(args(&["--zero", "2", "--offload-optimizer", "cpu"])
            .validate()
            .is_ok());
        // LoRA with offload: refused, saying why.
        let m = usage(&["--lora-rank", "8", "--offload-optimizer", "cpu"]);
        assert!(
            m.starts_with("--offload-optimizer cpu with --lora-rank 8")
                && m.contains("frees next to nothing"),
            "{m}"
        );
    }
}
