#!/usr/bin/env python3
"""Write the tiny LLaMA-family models of the hipk-train tests and their reference figures.

Into OUT (default tests/data/train_llama next to this repo root):
- `llama/`: a LlamaForCausalLM (V=128, C=48, L=2, H=4, K=2, D=16 given as `head_dim` so that
  H·D = 64 differs from C, F=96, llama3 rotary scaling spelled `rope_theta` + `rope_scaling` as
  the Hub's Llama 3.1 checkpoints have it, untied lm_head), one f32 `model.safetensors`.
- `qwen2/`: a Qwen2ForCausalLM (V=128, C=32, L=2, H=4, K=1, D=8, F=64, q/k/v biases, tied
  embeddings, rotary in transformers 5's `rope_parameters` spelling), bf16, sharded into two
  files listed by `model.safetensors.index.json`.
- `tokens_u32.bin`: 4096 tokens in llm.c's LLaMA-3 format (header [20240801, 7, n], uint32 ids);
  `tokens_u16.bin`: the same ids in the GPT-2 format (header [20240520, 1, n], uint16 ids). A
  seeded random Markov chain, so that the loss has something to learn.
- `packed.jsonl`: micro-batches of packed rows (the SFT layout: several sequences per row, each
  with positions from 0, targets -100 where not counted, `cu_seqlens` over the flattened rows).
- `peft/`: a PEFT LoRA adapter (r=4, alpha=8, all seven targets, B non-zero) on the qwen2 model,
  written by `peft.PeftModel.save_pretrained` (adapter_model.safetensors + adapter_config.json).
- `ref_<variant>.jsonl`: tools/train_ref_llama.py (transformers + PEFT, float64, eager
  attention) for each variant in VARIANTS; `variants.json` lists their flags.

Every random draw comes from torch.Generator(seed), so a rerun writes the same bytes.
Usage: python3 tools/gen_tiny_llama.py [--out DIR] [--seed N] [--no-ref]
"""
import argparse
import json
import os
import struct
import subprocess
import sys

import torch
from safetensors.torch import save_file

V = 128
NTOKENS = 4096

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": V,
    "hidden_size": 48,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "rope_theta": 10000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "bos_token_id": 1,
    "eos_token_id": 2,
}

QWEN2 = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": V,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-6,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# name -> train_ref_llama.py / hipk-train flags (model and data given per variant)
VARIANTS = {
    "llama_base": {
        "model": "llama", "data": "tokens_u32.bin",
        "flags": ["--batch", "4", "--seq", "16", "--steps", "10", "--lr", "1e-2"],
    },
    "llama_accum": {
        "model": "llama", "data": "tokens_u32.bin",
        "flags": ["--batch", "2", "--seq", "16", "--steps", "10", "--lr", "1e-2",
                  "--grad-accum", "2", "--weight-decay", "0.1", "--grad-clip", "1.0"],
    },
    "llama_packed": {
        "model": "llama", "data": "packed.jsonl",
        "flags": ["--batch", "2", "--seq", "16", "--steps", "6", "--lr", "1e-2",
                  "--grad-accum", "2"],
    },
    "qwen2_base": {
        "model": "qwen2", "data": "tokens_u16.bin",
        "flags": ["--batch", "4", "--seq", "16", "--steps", "10", "--lr", "1e-2",
                  "--weight-decay", "0.1", "--warmup", "2", "--lr-min", "1e-3"],
    },
    "qwen2_lora": {
        "model": "qwen2", "data": "tokens_u16.bin",
        "flags": ["--batch", "4", "--seq", "16", "--steps", "10", "--lr", "1e-2",
                  "--lora-rank", "4", "--lora-alpha", "8",
                  "--lora-targets", "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
                  "--lora-init", "peft"],
    },
}


def normal(g, *shape, std):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).float()


def model_tensors(g, cfg, biases):
    c, f, n_layer = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    h, k = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or c // h
    proj_std = 0.02 / (2 * n_layer) ** 0.5
    # Tied (qwen2): the embedding is also the output layer, so keep the logits moderate.
    emb_std = 0.2 if cfg["tie_word_embeddings"] else 0.5
    t = {"model.embed_tokens.weight": normal(g, V, c, std=emb_std)}
    for l in range(n_layer):
        pre = f"model.layers.{l}."
        t[pre + "input_layernorm.weight"] = 1.0 + normal(g, c, std=0.1)
        t[pre + "post_attention_layernorm.weight"] = 1.0 + normal(g, c, std=0.1)
        for name, rows in (("q_proj", h * d), ("k_proj", k * d), ("v_proj", k * d)):
            t[pre + f"self_attn.{name}.weight"] = normal(g, rows, c, std=0.2)
            if biases:
                t[pre + f"self_attn.{name}.bias"] = normal(g, rows, std=0.1)
        t[pre + "self_attn.o_proj.weight"] = normal(g, c, h * d, std=proj_std * 4)
        t[pre + "mlp.gate_proj.weight"] = normal(g, f, c, std=0.1)
        t[pre + "mlp.up_proj.weight"] = normal(g, f, c, std=0.1)
        t[pre + "mlp.down_proj.weight"] = normal(g, c, f, std=proj_std * 4)
    t["model.norm.weight"] = 1.0 + normal(g, c, std=0.1)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = normal(g, V, c, std=0.1)
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


def packed(g, toks, rows, seq, micro_batches):
    """Micro-batches of `rows` rows of `seq` positions: sequences of 3..=seq tokens from the
    stream, packed whole, the rest of a row padding (input 0, target -100, its own sequence);
    within a sequence the first target of each is -100 too (a prompt token, not counted)."""
    out, p = [], 0
    for _ in range(micro_batches):
        inputs, targets, positions, cu = [], [], [], [0]
        for _ in range(rows):
            used = 0
            while True:
                n = int(torch.randint(3, seq + 1, (1,), generator=g).item())
                if used + n > seq:
                    break
                chunk = toks[p:p + n + 1]
                p = (p + n + 1) % (len(toks) - seq - 2)
                inputs += chunk[:n]
                tg = chunk[1:n + 1]
                tg[0] = -100
                targets += tg
                positions += list(range(n))
                used += n
                cu.append(cu[-1] + n)
            if used < seq:
                pad = seq - used
                inputs += [0] * pad
                targets += [-100] * pad
                positions += list(range(pad))
                cu.append(cu[-1] + pad)
        out.append({"inputs": inputs, "targets": targets, "positions": positions, "cu_seqlens": cu})
    return out


def write_sharded(directory, tensors, shards):
    """Split `tensors` (names in order) into `shards` bf16 files and write the HF index."""
    names = list(tensors)
    per = (len(names) + shards - 1) // shards
    weight_map, total = {}, 0
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].to(torch.bfloat16).contiguous() for n in names[i * per:(i + 1) * per]}
        save_file(part, os.path.join(directory, file), metadata={"format": "pt"})
        for n, t in part.items():
            weight_map[n] = file
            total += t.numel() * 2
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
        f.write("\n")


def write_peft(out, seed):
    """A PEFT adapter on the qwen2 model, saved by PEFT itself (B non-zero: init_lora_weights
    False keeps nn.Linear's own initialisation for A and B)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "qwen2"), dtype=torch.float32)
    cfg = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                     "up_proj", "down_proj"],
                     init_lora_weights=False)
    peft_model = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.5)
    peft_dir = os.path.join(out, "peft")
    peft_model.save_pretrained(peft_dir)
    # Keep the committed files free of this machine's paths (PEFT ignores this key on load).
    cfg_path = os.path.join(peft_dir, "adapter_config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    saved["base_model_name_or_path"] = "qwen2"
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    readme = os.path.join(peft_dir, "README.md")
    if os.path.exists(readme):
        os.remove(readme)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "train_llama"))
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--no-ref", action="store_true")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    for name, cfg in (("llama", LLAMA), ("qwen2", QWEN2)):
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
        t = model_tensors(g, cfg, biases=name == "qwen2")
        if name == "llama":
            save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        else:
            write_sharded(d, t, 2)
    toks = tokens(g)
    with open(os.path.join(args.out, "tokens_u32.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240801, 7, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}I", *toks))
    with open(os.path.join(args.out, "tokens_u16.bin"), "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks))
    with open(os.path.join(args.out, "packed.jsonl"), "w") as f:
        for mb in packed(g, toks, rows=2, seq=16, micro_batches=8):
            f.write(json.dumps(mb) + "\n")
    write_peft(args.out, args.seed)
    if args.no_ref:
        return
    ref = os.path.join(root, "tools", "train_ref_llama.py")
    for name, v in VARIANTS.items():
        flags = list(v["flags"])
        if "--lora-init" in flags:
            i = flags.index("--lora-init") + 1
            flags[i] = os.path.join(args.out, flags[i])
        cmd = [sys.executable, ref, "--model", os.path.join(args.out, v["model"]),
               "--data", os.path.join(args.out, v["data"])] + flags
        cmd += ["--log", os.path.join(args.out, f"ref_{name}.jsonl")]
        print(" ".join(cmd[1:]))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(args.out, "variants.json"), "w") as f:
        json.dump(VARIANTS, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
