#!/usr/bin/env python3
"""PyTorch float64 reference of docs/TRAIN-GPT2.md (the train crate).

Reads the same model directory and token file as the Rust trainer, takes the same flags (those
that change the numbers), trains in float64 and writes one JSON object per step in the spec's
JSONL format (`step`, `loss`, `lr`, `grad_norm`, `tokens_per_s`) to --log (and a progress line to
stdout). Python's json writes floats with repr(), so every number parses back to the same f64.

Written from the spec, not from the Rust code: the model is HF GPT2LMHeadModel's forward with
dropout 0 spelled out with torch ops (Conv1D `y = x @ W + b`, q/k/v split of c_attn, causal
softmax with scale 1/sqrt(D), gelu tanh, tied lm_head), autograd gives the gradients,
torch.nn.utils.clip_grad_norm_ clips and torch.optim.AdamW (two groups: weight decay on the 2-D
tensors only) steps.

Usage: python3 tools/train_ref.py --model DIR --data FILE [--batch 4] [--seq 64] [--steps 20]
           [--lr 1e-3] [--beta1 0.9] [--beta2 0.999] [--eps 1e-8] [--weight-decay 0]
           [--grad-clip 0] [--warmup 0] [--lr-min M] [--grad-accum 1] [--log FILE]
           [--lora-rank R [--lora-alpha A] [--lora-targets LIST] [--lora-init FILE | --seed N]
            [--save-lora-init FILE [--lora-init-b-std S]] [--merged-out DIR]]

LoRA (--lora-rank > 0): every target's output gains (a/r)·(x @ Aᵀ) @ Bᵀ, only the adapters train
(AdamW with weight decay: they are 2-D), grad_norm and clipping cover the adapters only, and the
base weights stay frozen (autograd computes no gradient for them).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

F64 = torch.float64
HEADER_MAGIC = 20240520


def load_model(path):
    """(config dict, {name without `transformer.`: float64 tensor}) from a dir or .safetensors."""
    if os.path.isdir(path):
        directory, st = path, os.path.join(path, "model.safetensors")
    else:
        directory, st = os.path.dirname(path) or ".", path
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    raw = load_file(st)
    params = {}
    for name, t in raw.items():
        short = name[len("transformer."):] if name.startswith("transformer.") else name
        if short.endswith(".attn.bias") or short.endswith(".attn.masked_bias"):
            continue
        params[short] = t.to(F64)
    if "lm_head.weight" in params:
        if not torch.equal(params["lm_head.weight"], params["wte.weight"]):
            sys.exit("lm_head.weight differs from wte.weight (the spec's model is tied)")
        del params["lm_head.weight"]
    return cfg, params


def load_tokens(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] != HEADER_MAGIC or header[1] != 1:
            sys.exit(f"{path}: bad header {header[:3]}")
        n = header[2]
        data = f.read(2 * n)
    if len(data) != 2 * n:
        sys.exit(f"{path}: header says {n} tokens, file holds {len(data) // 2}")
    return torch.tensor(struct.unpack(f"<{n}H", data), dtype=torch.long)


class Loader:
    """The spec's loader: wrap to 0 when the next B*T+1 tokens do not fit."""

    def __init__(self, tokens, b, t):
        self.tokens, self.b, self.t, self.p = tokens, b, t, 0

    def next(self):
        b, t = self.b, self.t
        if self.p + b * t + 1 > len(self.tokens):
            self.p = 0
        buf = self.tokens[self.p:self.p + b * t + 1]
        self.p += b * t
        return buf[:-1].view(b, t), buf[1:].view(b, t)


def layer_norm(x, w, b, eps):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def gelu_tanh(u):
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))


LORA_TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def proj(p, lora, name, x):
    """Conv1D `x @ W + b`, plus the LoRA path `scale * (x @ A^T) @ B^T` when `name` has adapters."""
    y = x @ p[name + ".weight"] + p[name + ".bias"]
    if lora is not None and name + ".lora_A" in lora["adapters"]:
        a, bm = lora["adapters"][name + ".lora_A"], lora["adapters"][name + ".lora_B"]
        y = y + lora["scale"] * ((x @ a.T) @ bm.T)
    return y


def forward(p, cfg, idx, targets, lora=None):
    b, t = idx.shape
    c, h, n_layer = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    d = c // h
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    x = p["wte.weight"][idx] + p["wpe.weight"][:t]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for l in range(n_layer):
        pre = f"h.{l}."
        a = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
        a = proj(p, lora, pre + "attn.c_attn", a)
        q, k, v = a.split(c, dim=-1)
        q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        s = s.masked_fill(~mask, float("-inf"))
        y = (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + proj(p, lora, pre + "attn.c_proj", y)
        m = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
        m = gelu_tanh(proj(p, lora, pre + "mlp.c_fc", m))
        x = x + proj(p, lora, pre + "mlp.c_proj", m)
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
    logits = x @ p["wte.weight"].T
    return F.cross_entropy(logits.view(b * t, -1), targets.reshape(-1))


def make_lora(args, cfg, params):
    """The spec's adapters (None without --lora-rank): {"adapters": {name: tensor}, "scale": a/r}.

    `h.{l}.{t}.lora_A` is [r, in], `h.{l}.{t}.lora_B` is [out, r]. Without --lora-init, A is uniform
    in +-1/sqrt(in) and B is 0 (B is N(0, --lora-init-b-std) instead when that test-only knob is
    set, so that a committed init file exercises every adapter from step 1)."""
    r = args.lora_rank
    if r <= 0:
        return None
    alpha = float(args.lora_alpha) if args.lora_alpha is not None else float(r)
    targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
    for t in targets:
        if t not in LORA_TARGETS:
            sys.exit(f"--lora-targets: {t!r} is not one of {', '.join(LORA_TARGETS)}")
    shapes = {}
    for l in range(cfg["n_layer"]):
        for t in targets:
            n_in, n_out = params[f"h.{l}.{t}.weight"].shape
            shapes[f"h.{l}.{t}.lora_A"] = (r, n_in)
            shapes[f"h.{l}.{t}.lora_B"] = (n_out, r)
    if args.lora_init:
        raw = load_file(args.lora_init)
        if set(raw) != set(shapes):
            sys.exit(f"{args.lora_init}: tensors {sorted(raw)} != expected {sorted(shapes)}")
        adapters = {}
        for name, shape in shapes.items():
            if tuple(raw[name].shape) != shape:
                sys.exit(f"{args.lora_init}: {name} is {tuple(raw[name].shape)}, expected {shape}")
            adapters[name] = raw[name].to(F64)
    else:
        gen = torch.Generator().manual_seed(args.seed)
        adapters = {}
        for name, shape in shapes.items():
            if name.endswith("lora_A"):
                bound = 1.0 / math.sqrt(shape[1])
                adapters[name] = (torch.rand(shape, generator=gen, dtype=F64) * 2 - 1) * bound
            elif args.lora_init_b_std > 0:
                adapters[name] = torch.randn(shape, generator=gen, dtype=F64) * args.lora_init_b_std
            else:
                adapters[name] = torch.zeros(shape, dtype=F64)
    return {"adapters": adapters, "scale": alpha / r, "alpha": alpha, "targets": targets}


def write_merged(path, cfg, params, lora):
    """A full model dir with W' = W + (a/r) * A^T @ B^T for every adapted target (f32)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    merged = {}
    for name, t in params.items():
        t = t.detach()
        base = name[: -len(".weight")]
        if lora is not None and base + ".lora_A" in lora["adapters"]:
            a, bm = lora["adapters"][base + ".lora_A"].detach(), lora["adapters"][base + ".lora_B"].detach()
            t = t + lora["scale"] * (a.T @ bm.T)
        merged[name] = t.to(torch.float32).contiguous()
    save_file(merged, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def lr_at(s, args):
    if args.warmup > 0 and s <= args.warmup:
        return args.lr * s / args.warmup
    if args.lr_min is None:
        return args.lr
    w, n, m = args.warmup, args.steps, args.lr_min
    return m + 0.5 * (args.lr - m) * (1.0 + math.cos(math.pi * (s - w) / max(1, n - w)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--grad-clip", type=float, default=0.0)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--lr-min", type=float, default=None)
    ap.add_argument("--grad-accum", type=int, default=1)
    ap.add_argument("--log")
    ap.add_argument("--lora-rank", type=int, default=0)
    ap.add_argument("--lora-alpha", type=float, default=None)
    ap.add_argument("--lora-targets", default="attn.c_attn")
    ap.add_argument("--lora-init")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lora-init-b-std", type=float, default=0.0, help="test-only: B ~ N(0, std)")
    ap.add_argument("--save-lora-init", help="write the initial adapters (f32) to this file")
    ap.add_argument("--merged-out", help="after the last step, write the merged model here")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    cfg, params = load_model(args.model)
    if args.seq > cfg["n_positions"]:
        sys.exit(f"--seq {args.seq} > n_positions {cfg['n_positions']}")
    tokens = load_tokens(args.data)
    if int(tokens.max()) >= cfg["vocab_size"]:
        sys.exit(f"token id {int(tokens.max())} >= vocab_size {cfg['vocab_size']}")
    loader = Loader(tokens, args.batch, args.seq)
    lora = make_lora(args, cfg, params)
    if lora is not None and args.save_lora_init:
        from safetensors.torch import save_file

        save_file({k: v.to(torch.float32).contiguous() for k, v in lora["adapters"].items()},
                  args.save_lora_init)
        # Train from exactly the adapters written (f32), as the Rust trainer will read them.
        lora["adapters"] = {k: v.to(torch.float32).to(F64) for k, v in lora["adapters"].items()}
    # Trainable tensors: every parameter, or (LoRA) only the adapters; the base stays frozen.
    trainable = list(params.values()) if lora is None else list(lora["adapters"].values())
    for t in trainable:
        t.requires_grad_(True)
    if lora is not None:
        n_train = sum(t.numel() for t in trainable)
        n_all = n_train + sum(t.numel() for t in params.values())
        print(f"lora r={args.lora_rank} alpha={lora['alpha']} targets={','.join(lora['targets'])}"
              f" | trainable {n_train} of {n_all} parameters")
    decay = [t for t in trainable if t.dim() == 2]
    no_decay = [t for t in trainable if t.dim() != 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": args.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=args.lr,
        betas=(args.beta1, args.beta2),
        eps=args.eps,
        foreach=False,
    )
    log = open(args.log, "w") if args.log else None
    for s in range(1, args.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for _ in range(args.grad_accum):
            x, y = loader.next()
            loss = forward(params, cfg, x, y, lora) / args.grad_accum
            loss.backward()
            loss_sum += loss.item()
        grads = [t.grad for t in trainable]
        norm = torch.sqrt(sum((g * g).sum() for g in grads)).item()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainable, args.grad_clip)
        lr = lr_at(s, args)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        tok_s = args.batch * args.seq * args.grad_accum / (time.perf_counter() - t0)
        rec = {"step": s, "loss": loss_sum, "lr": lr, "grad_norm": norm, "tokens_per_s": tok_s}
        print(f"step {s}/{args.steps} | loss {loss_sum:.6f} | lr {lr:.2e} | norm {norm:.4f}")
        if log:
            log.write(json.dumps(rec) + "\n")
    if log:
        log.close()
    if args.merged_out:
        write_merged(args.merged_out, cfg, params, lora)


if __name__ == "__main__":
    main()
