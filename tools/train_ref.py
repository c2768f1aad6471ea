#!/usr/bin/env python3
"""PyTorch float64 reference of docs/TRAIN-GPT2.md (the train-gpt2 crate).

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


def forward(p, cfg, idx, targets):
    b, t = idx.shape
    c, h, n_layer = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    d = c // h
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    x = p["wte.weight"][idx] + p["wpe.weight"][:t]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    for l in range(n_layer):
        pre = f"h.{l}."
        a = layer_norm(x, p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
        a = a @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]
        q, k, v = a.split(c, dim=-1)
        q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        s = s.masked_fill(~mask, float("-inf"))
        y = (s.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + y @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        m = layer_norm(x, p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
        m = gelu_tanh(m @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"])
        x = x + m @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"], eps)
    logits = x @ p["wte.weight"].T
    return F.cross_entropy(logits.view(b * t, -1), targets.reshape(-1))


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
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    cfg, params = load_model(args.model)
    if args.seq > cfg["n_positions"]:
        sys.exit(f"--seq {args.seq} > n_positions {cfg['n_positions']}")
    tokens = load_tokens(args.data)
    if int(tokens.max()) >= cfg["vocab_size"]:
        sys.exit(f"token id {int(tokens.max())} >= vocab_size {cfg['vocab_size']}")
    loader = Loader(tokens, args.batch, args.seq)
    for t in params.values():
        t.requires_grad_(True)
    decay = [t for t in params.values() if t.dim() == 2]
    no_decay = [t for t in params.values() if t.dim() != 2]
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
            loss = forward(params, cfg, x, y) / args.grad_accum
            loss.backward()
            loss_sum += loss.item()
        grads = [t.grad for t in params.values()]
        norm = torch.sqrt(sum((g * g).sum() for g in grads)).item()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(list(params.values()), args.grad_clip)
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


if __name__ == "__main__":
    main()
