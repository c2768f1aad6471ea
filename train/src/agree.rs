//! What the ranks of a launched run must agree on, compared at the rendezvous
//! (`hip_rt::ddp::Settings`): a rank started with another `--lr`, `--seq`, `--grad-clip`, …, or
//! another `--model` of the same shape, is refused naming the setting instead of training on.
//!
//! Compared: every flag that changes what a step computes (not the paths of outputs, which
//! only rank 0 writes), the model's shape, a SHA-256 fingerprint of the initial weights, AdamW
//! moments and LoRA adapters (after `--resume` or `--lora-init`), and of the token file (its
//! length, the loader's position and a sample of 64 windows of 4096 tokens).

use hip_rt::ddp::Settings;
use sha2::{Digest, Sha256};

use crate::cli::Args;
use crate::train::Setup;

/// Tokens in each window of the data sample.
const WINDOW: usize = 4096;
/// Windows sampled from the token file.
const WINDOWS: usize = 64;

/// The settings of this rank's run.
pub(crate) fn settings(args: &Args, setup: &Setup) -> Settings {
    settings_of(
        args,
        setup.cfg.describe(),
        weights(setup),
        data(&setup.tokens.ids, setup.loader.pos),
        setup.restored.state.step + 1,
    )
}

/// The settings of this rank's run of a LLaMA-family model.
pub(crate) fn llama_settings(args: &Args, setup: &crate::llama::train::LlamaSetup) -> Settings {
    use crate::llama::train::Source;
    let r = &setup.restored;
    let mut h = Sha256::new();
    for group in [&r.params, &r.exp_avg, &r.exp_avg_sq] {
        feed(&mut h, &group.iter().collect::<Vec<_>>());
    }
    // LoRA: the adapters and their moments are what trains; every rank must start from the same.
    for group in setup.lora.iter().flat_map(|(_, g)| g) {
        feed(&mut h, &group.iter().collect::<Vec<_>>());
    }
    settings_of(
        args,
        setup.cfg.describe(),
        hex(h),
        match &setup.source {
            Source::Stream { tokens, loader } => data(&tokens.ids, loader.pos),
            Source::Batches { list, next } => {
                let mut h = Sha256::new();
                h.update((*next as u64).to_le_bytes());
                for b in list {
                    h.update(bytemuck::cast_slice::<i32, u8>(&b.inputs));
                    h.update(bytemuck::cast_slice::<i32, u8>(&b.targets));
                }
                hex(h)
            }
            Source::Sft(src) => {
                let mut h = Sha256::new();
                h.update(src.index.sha256.as_bytes());
                h.update(src.tok.fingerprint.as_bytes());
                h.update(src.next_row.to_le_bytes());
                hex(h)
            }
        },
        r.state.step + 1,
    )
}

/// The flags that change what a step computes, the model's shape and the fingerprints.
fn settings_of(args: &Args, shape: String, weights: String, data: String, first: u64) -> Settings {
    let mut s: Vec<(String, String)> = Vec::new();
    let mut put = |k: &str, v: String| s.push((k.to_string(), v));
    put("--batch", args.batch.to_string());
    put("--seq", args.seq.to_string());
    put("--steps", args.steps.to_string());
    put("--lr", format!("{:e}", args.lr));
    put("--lr-min", format!("{:?}", args.lr_min));
    put("--warmup", args.warmup.to_string());
    put("--beta1", format!("{:e}", args.beta1));
    put("--beta2", format!("{:e}", args.beta2));
    put("--eps", format!("{:e}", args.eps));
    put("--weight-decay", format!("{:e}", args.weight_decay));
    put("--grad-clip", format!("{:e}", args.grad_clip));
    put("--grad-accum", args.grad_accum.to_string());
    put("--zero", args.zero.to_string());
    put("--dtype", format!("{:?}", args.dtype));
    put("--scale-init", format!("{:e}", args.scale_init));
    put("--scale-window", args.scale_window.to_string());
    put("--save-every", args.save_every.to_string());
    put("--lora-rank", args.lora_rank.to_string());
    put("--lora-alpha", format!("{:?}", args.lora_alpha));
    put("--lora-targets", format!("{:?}", args.lora_targets));
    put("model shape", shape);
    put("initial weights (sha256)", weights);
    put("data (sha256 of a sample)", data);
    put("first step", first.to_string());
    Settings(s)
}

fn hex(d: Sha256) -> String {
    d.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn feed(h: &mut Sha256, tensors: &[&Vec<f32>]) {
    for t in tensors {
        h.update((t.len() as u64).to_le_bytes());
        h.update(bytemuck::cast_slice::<f32, u8>(t));
    }
}

/// The parameters, AdamW moments and adapters the run starts from.
fn weights(setup: &Setup) -> String {
    let r = &setup.restored;
    let mut h = Sha256::new();
    feed(&mut h, &r.params.iter());
    feed(&mut h, &r.exp_avg.iter());
    feed(&mut h, &r.exp_avg_sq.iter());
    if let Some(lo) = &setup.lora {
        for group in [&lo.params, &lo.exp_avg, &lo.exp_avg_sq] {
            feed(&mut h, &group.iter().collect::<Vec<_>>());
        }
    }
    hex(h)
}

/// The token file: its length, the loader's position and 64 evenly spaced windows.
fn data(ids: &[u32], pos: usize) -> String {
    let mut h = Sha256::new();
    h.update((ids.len() as u64).to_le_bytes());
    h.update((pos as u64).to_le_bytes());
    let stride = (ids.len() / WINDOWS).max(1);
    for w in 0..WINDOWS {
        let start = (w * stride).min(ids.len());
        let end = (start + WINDOW).min(ids.len());
        h.update(bytemuck::cast_slice::<u32, u8>(&ids[start..end]));
    }
    hex(h)
}
