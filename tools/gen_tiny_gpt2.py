#!/usr/bin/env python3
"""Write the tiny GPT-2 of the train_gpt2 tests and its reference figures.

Into OUT (default tests/data/train_gpt2 next to this repo root):
- `model/config.json` + `model/model.safetensors`: an HF-GPT-2-shaped model (V=96, P=32, C=32,
  L=2, H=4), f32, names with the `transformer.` prefix and the `attn.bias` causal-mask buffers an
  HF save carries (the trainer must ignore them), no lm_head (tied). Random weights, seeded.
- `tokens.bin`: 4096 tokens in llm.c's format (256 int32 header, uint16 ids) from a seeded
  random Markov chain over the vocabulary, so that the loss has something to learn.
- `ref_<variant>.jsonl`: tools/train_ref.py (float64) for 20 steps of each variant in VARIANTS.

Everything is drawn from torch.Generator(seed), so a rerun writes the same bytes.
Usage: python3 tools/gen_tiny_gpt2.py [--out DIR] [--seed N] [--no-ref]
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import torch
from safetensors.torch import save_file

V, P, C, L, H = 96, 32, 32, 2, 4
NTOKENS = 4096
MAGIC = 20240520

# name -> train_ref.py / train_gpt2 flags, after COMMON (no flag given twice)
COMMON = ["--seq", "16", "--steps", "20", "--lr", "1e-2"]
VARIANTS = {
    "base": ["--batch", "4"],
    "accum": ["--batch", "2", "--grad-accum", "2"],
    "clip": ["--batch", "4", "--grad-clip", "0.8"],
    "cosine": ["--batch", "4", "--warmup", "5", "--lr-min", "1e-4"],
    "decay": ["--batch", "4", "--weight-decay", "0.1"],
}


def model_tensors(g):
    def normal(*shape, std):
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).float()

    t = {
        "transformer.wte.weight": normal(V, C, std=0.02),
        "transformer.wpe.weight": normal(P, C, std=0.01),
    }
    proj_std = 0.02 / (2 * L) ** 0.5
    mask = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
    for l in range(L):
        pre = f"transformer.h.{l}."
        for ln in ("ln_1", "ln_2"):
            t[pre + ln + ".weight"] = 1.0 + normal(C, std=0.1)
            t[pre + ln + ".bias"] = normal(C, std=0.05)
        t[pre + "attn.c_attn.weight"] = normal(C, 3 * C, std=0.02 * 8)
        t[pre + "attn.c_attn.bias"] = normal(3 * C, std=0.02)
        t[pre + "attn.c_proj.weight"] = normal(C, C, std=proj_std)
        t[pre + "attn.c_proj.bias"] = normal(C, std=0.02)
        t[pre + "attn.bias"] = mask.clone()
        t[pre + "mlp.c_fc.weight"] = normal(C, 4 * C, std=0.02)
        t[pre + "mlp.c_fc.bias"] = normal(4 * C, std=0.02)
        t[pre + "mlp.c_proj.weight"] = normal(4 * C, C, std=proj_std)
        t[pre + "mlp.c_proj.bias"] = normal(C, std=0.02)
    t["transformer.ln_f.weight"] = 1.0 + normal(C, std=0.1)
    t["transformer.ln_f.bias"] = normal(C, std=0.05)
    return t


def tokens(g):
    # Each token has 4 likely successors: a learnable but not trivial stream.
    succ = torch.randint(0, V, (V, 4), generator=g)
    out, cur = [], 0
    for _ in range(NTOKENS):
        out.append(cur)
        r = torch.randint(0, 8, (1,), generator=g).item()
        cur = succ[cur, r].item() if r < 4 else torch.randint(0, V, (1,), generator=g).item()
    return out


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "train_gpt2"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--no-ref", action="store_true")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    model_dir = os.path.join(args.out, "model")
    os.makedirs(model_dir, exist_ok=True)
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "vocab_size": V,
        "n_positions": P,
        "n_embd": C,
        "n_layer": L,
        "n_head": H,
        "n_inner": None,
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    }
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    save_file(model_tensors(g), os.path.join(model_dir, "model.safetensors"))
    toks = tokens(g)
    with open(os.path.join(args.out, "tokens.bin"), "wb") as f:
        f.write(struct.pack("<256i", MAGIC, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))
    if args.no_ref:
        return
    ref = os.path.join(root, "tools", "train_ref.py")
    for name, flags in VARIANTS.items():
        cmd = [sys.executable, ref, "--model", model_dir, "--data", os.path.join(args.out, "tokens.bin")]
        cmd += COMMON + flags + ["--log", os.path.join(args.out, f"ref_{name}.jsonl")]
        print(" ".join(cmd[1:]))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(args.out, "variants.json"), "w") as f:
        json.dump({"common": COMMON, "variants": VARIANTS}, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
