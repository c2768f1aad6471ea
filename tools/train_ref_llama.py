#!/usr/bin/env python3
"""transformers + PEFT float64 reference of the LLaMA family's training (docs/TRAIN-LLAMA.md),
also of `glm` (GlmForCausalLM, docs/TRAIN-GLM.md).

The model is transformers' own `LlamaForCausalLM` / `Qwen2ForCausalLM` (from_pretrained on the
model directory: config.json, single or sharded safetensors), in float64 with eager attention;
LoRA is PEFT's (`PeftModel.from_pretrained` of an adapter directory, or `get_peft_model`).
Autograd gives the gradients, torch.nn.utils.clip_grad_norm_ clips, torch.optim.AdamW (weight
decay on 2-D tensors only) steps. transformers computes the rotary angles in float32; this
script replaces that one module's forward with a float64 one (the same frequencies, checked
against transformers' own to 1e-6) so that the whole reference is float64.

Loss: cross-entropy summed over the step's counted targets (target -100 is not counted) and
divided by their count over the whole step (every micro-batch), as the spec defines it.

Data (--data): an llm.c token file (GPT-2's uint16 [20240520, 1, n] or LLaMA-3's uint32
[20240801, 7, n]) read by the spec's loader (positions 0..T-1 in every row), or a `.jsonl` of
packed micro-batches, one per line, taken in order and cycled:
`{"inputs": [B*T ids], "targets": [B*T ids or -100], "positions": [B*T] (optional),
"cu_seqlens": [offsets over the flattened B*T] (optional: every row one sequence)}`.
With packed data each sequence runs on its own (position_ids from the file), so attention never
crosses sequences.

Writes one JSON object per step (`step`, `loss`, `lr`, `grad_norm`, `tokens`, `tokens_per_s`)
to --log.

Usage: python3 tools/train_ref_llama.py --model DIR --data FILE [--batch 4] [--seq 16]
  [--steps 10] [--lr 1e-3] [--beta1 0.9] [--beta2 0.999] [--eps 1e-8] [--weight-decay 0]
  [--grad-clip 0] [--warmup 0] [--lr-min M] [--grad-accum 1] [--log FILE]
  [--lora-rank R [--lora-alpha A] [--lora-targets q_proj,v_proj] [--lora-init PEFT_DIR]]
  [--save-dir DIR] [--fuse-qkv]

--fuse-qkv (glm only) makes the GlmForCausalLM THUDM's `chatglm` model for LoRA: each layer's
q_proj, k_proj and v_proj become row blocks of one Linear `self_attn.query_key_value` (the same
weights stacked q|k|v; the three modules read its output's columns), so that PEFT puts one
adapter over the fused output, as PEFT on THUDM's ChatGLM does. --lora-targets then takes the
chatglm names (query_key_value, dense, dense_h_to_4h, dense_4h_to_h), and --lora-init a
directory whose adapter file is in THUDM's layout's PEFT names
(`base_model.model.transformer.encoder.layers.{l}.self_attention.query_key_value.lora_A.weight`).
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

F64 = torch.float64


def load_tokens(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        if header[0] == 20240520 and header[1] == 1:
            width, fmt = 2, "H"
        elif header[0] == 20240801 and header[1] == 7:
            width, fmt = 4, "I"
        else:
            sys.exit(f"{path}: bad header {header[:3]}")
        n = header[2]
        data = f.read(width * n)
    if len(data) != width * n:
        sys.exit(f"{path}: header says {n} tokens, file holds {len(data) // width}")
    return torch.tensor(struct.unpack(f"<{n}{fmt}", data), dtype=torch.long)


class StreamLoader:
    """The spec's loader: wrap to 0 when the next B*T+1 tokens do not fit."""

    def __init__(self, tokens, b, t):
        self.tokens, self.b, self.t, self.p = tokens, b, t, 0

    def next(self):
        b, t = self.b, self.t
        if self.p + b * t + 1 > len(self.tokens):
            self.p = 0
        buf = self.tokens[self.p:self.p + b * t + 1]
        self.p += b * t
        return {"inputs": buf[:-1].tolist(), "targets": buf[1:].tolist()}


class PackedLoader:
    def __init__(self, path, b, t):
        with open(path) as f:
            self.batches = [json.loads(line) for line in f if line.strip()]
        for i, mb in enumerate(self.batches):
            if len(mb["inputs"]) != b * t or len(mb["targets"]) != b * t:
                sys.exit(f"{path}: micro-batch {i} is not {b}x{t}")
        self.i = 0

    def next(self):
        mb = self.batches[self.i % len(self.batches)]
        self.i += 1
        return mb


def sequences(mb, b, t):
    """(start, end, positions) of every sequence of a micro-batch over the flattened B*T."""
    cu = mb.get("cu_seqlens") or [r * t for r in range(b + 1)]
    pos = mb.get("positions")
    out = []
    for s, e in zip(cu[:-1], cu[1:]):
        p = pos[s:e] if pos is not None else [(i % t) for i in range(s, e)]
        out.append((s, e, p))
    return out


def loss_sum(model, mb, b, t):
    """Summed cross-entropy over the micro-batch's counted targets, each sequence run alone."""
    inputs = torch.tensor(mb["inputs"], dtype=torch.long)
    targets = torch.tensor(mb["targets"], dtype=torch.long)
    total = torch.zeros((), dtype=F64)
    for s, e, p in sequences(mb, b, t):
        if (targets[s:e] == -100).all():
            continue
        out = model(input_ids=inputs[s:e][None], position_ids=torch.tensor(p)[None], use_cache=False)
        logits = out.logits[0].to(F64)
        total = total + F.cross_entropy(logits, targets[s:e], ignore_index=-100, reduction="sum")
    return total


def spec_frequencies(cfg):
    """The spec's rotary frequencies in float64 (HF's default / llama3 parameters)."""
    params = getattr(cfg, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    rope_type = params.get("rope_type", "default")
    d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # GLM turns only the first int(D * partial_rotary_factor) dims of a head.
    d = int(d * params.get("partial_rotary_factor", 1.0))
    f = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=F64) / d))
    if rope_type == "llama3":
        factor, low, high = params["factor"], params["low_freq_factor"], params["high_freq_factor"]
        old = params["original_max_position_embeddings"]
        low_wl, high_wl = old / low, old / high
        wl = 2 * math.pi / f
        scaled = torch.where(wl > low_wl, f / factor, f)
        smooth = (old / wl - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wl < high_wl) & ~(wl > low_wl)
        f = torch.where(medium, mid, scaled)
    elif rope_type != "default":
        sys.exit(f"rope_type {rope_type} is not the spec's")
    return f


def rotary_f64(model):
    """Replace the rotary embedding's forward by a float64 one (same frequencies)."""
    rot = model.model.rotary_emb
    inv = spec_frequencies(model.config)
    hf = rot.inv_freq.to(F64)
    if not torch.allclose(inv, hf, rtol=1e-6, atol=0):
        sys.exit(f"float64 frequencies {inv} differ from transformers' {hf}")

    def forward(x, position_ids):
        freqs = position_ids[..., None].to(F64) * inv
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)

    rot.forward = forward


def lr_at(s, args):
    if args.warmup > 0 and s <= args.warmup:
        return args.lr * s / args.warmup
    if args.lr_min is None:
        return args.lr
    w, n, m = args.warmup, args.steps, args.lr_min
    return m + 0.5 * (args.lr - m) * (1.0 + math.cos(math.pi * (s - w) / max(1, n - w)))


# chatglm LoRA target -> the module of the fused GlmForCausalLM (--fuse-qkv).
CHATGLM_TARGETS = {"query_key_value": "query_key_value", "dense": "o_proj",
                   "dense_h_to_4h": "gate_up_proj", "dense_4h_to_h": "down_proj"}
# PEFT name pieces: THUDM's layout -> the fused GlmForCausalLM's.
CHATGLM_NAMES = [("base_model.model.transformer.encoder.layers.", "base_model.model.model.layers."),
                 (".self_attention.query_key_value.", ".self_attn.query_key_value."),
                 (".self_attention.dense.", ".self_attn.o_proj."),
                 (".mlp.dense_h_to_4h.", ".mlp.gate_up_proj."),
                 (".mlp.dense_4h_to_h.", ".mlp.down_proj.")]


class _Rows(torch.nn.Module):
    """Columns lo..hi of the attention's fused `query_key_value` output (not a submodule of
    it, so PEFT's wrapper of query_key_value is what is called)."""

    def __init__(self, attn, lo, hi):
        super().__init__()
        self._attn = [attn]
        self.lo, self.hi = lo, hi

    def forward(self, x):
        return self._attn[0].query_key_value(x)[..., self.lo:self.hi]


def fuse_qkv(model):
    """Each layer's q/k/v projections as one Linear `self_attn.query_key_value`."""
    for layer in model.model.layers:
        a = layer.self_attn
        parts = [a.q_proj, a.k_proj, a.v_proj]
        rows = [p.weight.shape[0] for p in parts]
        has_bias = parts[0].bias is not None
        fused = torch.nn.Linear(parts[0].weight.shape[1], sum(rows), bias=has_bias, dtype=F64)
        with torch.no_grad():
            fused.weight.copy_(torch.cat([p.weight for p in parts]))
            if has_bias:
                fused.bias.copy_(torch.cat([p.bias for p in parts]))
        a.query_key_value = fused
        at = 0
        for name, n in zip(("q_proj", "k_proj", "v_proj"), rows):
            setattr(a, name, _Rows(a, at, at + n))
            at += n


def load_chatglm_adapter(peft_model, directory):
    """Copy the adapter file of `directory` (THUDM's layout's PEFT names) into the fused
    model's adapters; every adapter must be found."""
    from safetensors.torch import load_file

    params = dict(peft_model.named_parameters())
    seen = set()
    for name, t in load_file(os.path.join(directory, "adapter_model.safetensors")).items():
        for a, b in CHATGLM_NAMES:
            name = name.replace(a, b)
        name = name.replace(".lora_A.weight", ".lora_A.default.weight")
        name = name.replace(".lora_B.weight", ".lora_B.default.weight")
        if name not in params:
            sys.exit(f"{directory}: {name} is not an adapter of the fused model")
        with torch.no_grad():
            params[name].copy_(t.to(F64))
        seen.add(name)
    missing = [n for n, p in params.items() if p.requires_grad and n not in seen]
    if missing:
        sys.exit(f"{directory}: no tensor for {missing[:3]}")


def load_model(args):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=F64, attn_implementation="eager")
    rotary_f64(model)
    if args.fuse_qkv:
        fuse_qkv(model)
    if args.lora_rank <= 0:
        return model, None
    from peft import LoraConfig, PeftModel, get_peft_model

    if args.fuse_qkv:
        names = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
        alpha = args.lora_alpha if args.lora_alpha is not None else args.lora_rank
        cfg = LoraConfig(r=args.lora_rank, lora_alpha=alpha, lora_dropout=0.0, bias="none",
                         task_type="CAUSAL_LM", target_modules=[CHATGLM_TARGETS[t] for t in names])
        peft_model = get_peft_model(model, cfg)
        peft_model.to(F64)
        if args.lora_init:
            c = json.load(open(os.path.join(args.lora_init, "adapter_config.json")))
            if (c["r"], c["lora_alpha"], sorted(c["target_modules"])) != (args.lora_rank, alpha, sorted(names)):
                sys.exit(f"{args.lora_init}: adapter_config.json differs from the flags")
            load_chatglm_adapter(peft_model, args.lora_init)
        return peft_model, peft_model
    if args.lora_init:
        peft_model = PeftModel.from_pretrained(model, args.lora_init, is_trainable=True)
        c = peft_model.peft_config["default"]
        want = sorted(t.strip() for t in args.lora_targets.split(",") if t.strip())
        alpha = args.lora_alpha if args.lora_alpha is not None else args.lora_rank
        if (c.r, c.lora_alpha, sorted(c.target_modules)) != (args.lora_rank, alpha, want):
            sys.exit(f"{args.lora_init}: r={c.r} alpha={c.lora_alpha} targets={c.target_modules}"
                     f" differ from the flags")
    else:
        cfg = LoraConfig(r=args.lora_rank,
                         lora_alpha=args.lora_alpha if args.lora_alpha is not None else args.lora_rank,
                         lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                         target_modules=[t.strip() for t in args.lora_targets.split(",")])
        peft_model = get_peft_model(model, cfg)
    peft_model.to(F64)
    return peft_model, peft_model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--steps", type=int, default=10)
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
    ap.add_argument("--lora-targets", default="q_proj,v_proj")
    ap.add_argument("--lora-init", help="a PEFT adapter directory")
    ap.add_argument("--save-dir", help="after the last step, save_pretrained here")
    ap.add_argument("--fuse-qkv", action="store_true",
                    help="glm as THUDM's chatglm: one query_key_value Linear per layer")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    model, peft_model = load_model(args)
    model.train()
    if args.data.endswith(".jsonl"):
        loader = PackedLoader(args.data, args.batch, args.seq)
    else:
        tokens = load_tokens(args.data)
        if int(tokens.max()) >= model.config.vocab_size:
            sys.exit(f"token id {int(tokens.max())} >= vocab_size {model.config.vocab_size}")
        loader = StreamLoader(tokens, args.batch, args.seq)
    trainable = [p for p in model.parameters() if p.requires_grad]
    if peft_model is not None:
        n_train = sum(p.numel() for p in trainable)
        n_all = sum(p.numel() for p in model.parameters())
        print(f"lora | trainable {n_train} of {n_all} parameters")
    decay = [t for t in trainable if t.dim() == 2]
    no_decay = [t for t in trainable if t.dim() != 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps, foreach=False)
    log = open(args.log, "w") if args.log else None
    for s in range(1, args.steps + 1):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        mbs = [loader.next() for _ in range(args.grad_accum)]
        # The divisor: the step's counted targets over every micro-batch, known before the step.
        count = sum(sum(1 for y in mb["targets"] if y != -100) for mb in mbs)
        if count == 0:
            sys.exit(f"step {s} has no counted target")
        loss_total = 0.0
        for mb in mbs:
            loss = loss_sum(model, mb, args.batch, args.seq) / count
            loss.backward()
            loss_total += loss.item()
        norm = torch.sqrt(sum((p.grad * p.grad).sum() for p in trainable)).item()
        if args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainable, args.grad_clip)
        lr = lr_at(s, args)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        tok_s = args.batch * args.seq * args.grad_accum / (time.perf_counter() - t0)
        rec = {"step": s, "loss": loss_total, "lr": lr, "grad_norm": norm, "tokens": count,
               "tokens_per_s": tok_s}
        print(f"step {s}/{args.steps} | loss {loss_total:.6f} | lr {lr:.2e} | norm {norm:.4f}")
        if log:
            log.write(json.dumps(rec) + "\n")
    if log:
        log.close()
    if args.save_dir:
        model.save_pretrained(args.save_dir)


if __name__ == "__main__":
    main()
