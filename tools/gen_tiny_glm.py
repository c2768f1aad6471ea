#!/usr/bin/env python3
"""Write the tiny GLM-family models of the hipk-train tests and their reference figures.

Into OUT (default tests/data/train_glm next to this repo root):
- `glm/`: a GlmForCausalLM (V=128, C=48, L=2, H=4, K=2 groups, D=16 so that H·D = 64 differs
  from C, F=64, partial_rotary_factor 0.5 (rotary on 8 of 16 dims, interleaved), q/k/v biases,
  untied lm_head, rope_theta 50000), one f32 `model.safetensors`.
- `chatglm/`: the same weights in THUDM's ChatGLM layout (`model_type` `chatglm`,
  query_key_value = rows q|k|v, dense_h_to_4h = rows gate|up, rope_ratio 5 so that
  θ = 10000·5 = 50000, the rotary buffer `transformer.rotary_pos_emb.inv_freq` included as
  the original checkpoints carry it).
- `glm_peft/`: a PEFT LoRA adapter (r=4, alpha=8, the six glm targets, B non-zero) on `glm/`,
  written by `peft.PeftModel.save_pretrained`.
- `chatglm_peft/`: a PEFT LoRA adapter (r=4, alpha=8, the four chatglm targets, B non-zero) as
  PEFT writes it on THUDM's model: PEFT saves it on the GlmForCausalLM whose q/k/v are fused
  into one `query_key_value` Linear (tools/train_ref_llama.py's --fuse-qkv), and its names are
  then THUDM's (`base_model.model.transformer.encoder.layers.{l}.self_attention.
  query_key_value.lora_A.weight`, `.dense`, `mlp.dense_h_to_4h`, `mlp.dense_4h_to_h`).
- `chatglm_sft/`: the same architecture in the `chatglm` layout with `padded_vocab_size` 640
  (other weights, seed + 1), for SFT with the small ChatGLM3 tokenizer of
  tests/data/chatglm3_tok/tokenizer (609 ids): the README's LoRA example and the SFT tests.
- `ref_<variant>.jsonl`: tools/train_ref_llama.py (transformers' GlmForCausalLM, float64, eager
  attention; PEFT for LoRA) on `glm/` for each variant in VARIANTS (`chatglm_lora` with
  --fuse-qkv); `variants.json` lists their flags (a `--lora-init` value is a directory here).
  The data files are tests/data/train_llama's (V = 128 there too).

Every random draw comes from torch.Generator(seed), so a rerun writes the same bytes.
Usage: python3 tools/gen_tiny_glm.py [--out DIR] [--seed N] [--no-ref]
"""
import argparse
import json
import os
import subprocess
import sys

import torch
from safetensors.torch import save_file

V, C, L, H, K, D, F = 128, 48, 2, 4, 2, 16, 64
EPS = 1.5625e-7

GLM = {
    "architectures": ["GlmForCausalLM"],
    "model_type": "glm",
    "vocab_size": V,
    "hidden_size": C,
    "intermediate_size": F,
    "num_hidden_layers": L,
    "num_attention_heads": H,
    "num_key_value_heads": K,
    "head_dim": D,
    "max_position_embeddings": 64,
    "rms_norm_eps": EPS,
    "hidden_act": "silu",
    "attention_bias": True,
    "tie_word_embeddings": False,
    "partial_rotary_factor": 0.5,
    "rope_theta": 50000.0,
    # No padding_idx: transformers' nn.Embedding(padding_idx=p) gives row p no gradient, which
    # the trainer's embedding (every row trained, as the spec says) does not copy.
    "pad_token_id": None,
    "eos_token_id": 2,
}

# THUDM's ChatGLMConfig keys (ChatGLM3-6B's config.json, scaled down).
CHATGLM = {
    "architectures": ["ChatGLMModel"],
    "model_type": "chatglm",
    "num_layers": L,
    "padded_vocab_size": V,
    "hidden_size": C,
    "ffn_hidden_size": F,
    "kv_channels": D,
    "num_attention_heads": H,
    "seq_length": 64,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
    "layernorm_epsilon": EPS,
    "rmsnorm": True,
    "apply_residual_connection_post_layernorm": False,
    "post_layer_norm": True,
    "add_bias_linear": False,
    "add_qkv_bias": True,
    "bias_dropout_fusion": True,
    "multi_query_attention": True,
    "multi_query_group_num": K,
    "apply_query_key_layer_scaling": True,
    "attention_softmax_in_fp32": True,
    "fp32_residual_connection": False,
    "original_rope": True,
    "rope_ratio": 5,
    "quantization_bit": 0,
    "pre_seq_len": None,
    "prefix_projection": False,
    "torch_dtype": "float32",
    "eos_token_id": 2,
    "pad_token_id": 0,
}

VARIANTS = {
    "glm_base": {
        "data": "../train_llama/tokens_u32.bin",
        "flags": ["--batch", "4", "--seq", "16", "--steps", "10", "--lr", "1e-2",
                  "--weight-decay", "0.1", "--grad-clip", "1.0"],
    },
    "glm_packed": {
        "data": "../train_llama/packed.jsonl",
        "flags": ["--batch", "2", "--seq", "16", "--steps", "6", "--lr", "1e-2",
                  "--grad-accum", "2"],
    },
    "glm_lora": {
        "data": "../train_llama/tokens_u32.bin",
        "flags": ["--batch", "4", "--seq", "16", "--steps", "10", "--lr", "1e-2",
                  "--weight-decay", "0.1", "--grad-clip", "1.0",
                  "--lora-rank", "4", "--lora-alpha", "8",
                  "--lora-targets", "q_proj,k_proj,v_proj,o_proj,gate_up_proj,down_proj",
                  "--lora-init", "glm_peft"],
    },
    "chatglm_lora": {
        "data": "../train_llama/tokens_u32.bin",
        "flags": ["--batch", "4", "--seq", "16", "--steps", "10", "--lr", "1e-2",
                  "--weight-decay", "0.1", "--grad-clip", "1.0",
                  "--lora-rank", "4", "--lora-alpha", "8",
                  "--lora-targets", "query_key_value,dense,dense_h_to_4h,dense_4h_to_h",
                  "--lora-init", "chatglm_peft"],
        "ref_flags": ["--fuse-qkv"],
    },
}

GLM_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_up_proj", "down_proj"]
CHATGLM_TARGETS = ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"]


def normal(g, *shape, std):
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * std).float()


def glm_tensors(g, vocab=V):
    proj_std = 0.02 / (2 * L) ** 0.5
    t = {"model.embed_tokens.weight": normal(g, vocab, C, std=0.5)}
    for l in range(L):
        pre = f"model.layers.{l}."
        t[pre + "input_layernorm.weight"] = 1.0 + normal(g, C, std=0.1)
        t[pre + "post_attention_layernorm.weight"] = 1.0 + normal(g, C, std=0.1)
        for name, rows in (("q_proj", H * D), ("k_proj", K * D), ("v_proj", K * D)):
            t[pre + f"self_attn.{name}.weight"] = normal(g, rows, C, std=0.2)
            t[pre + f"self_attn.{name}.bias"] = normal(g, rows, std=0.1)
        t[pre + "self_attn.o_proj.weight"] = normal(g, C, H * D, std=proj_std * 4)
        t[pre + "mlp.gate_up_proj.weight"] = normal(g, 2 * F, C, std=0.1)
        t[pre + "mlp.down_proj.weight"] = normal(g, C, F, std=proj_std * 4)
    t["model.norm.weight"] = 1.0 + normal(g, C, std=0.1)
    t["lm_head.weight"] = normal(g, vocab, C, std=0.1)
    return t


def to_chatglm(t):
    """The same weights under THUDM's names, q/k/v stacked by rows."""
    out = {"transformer.embedding.word_embeddings.weight": t["model.embed_tokens.weight"]}
    for l in range(L):
        a, b = f"model.layers.{l}.", f"transformer.encoder.layers.{l}."
        out[b + "input_layernorm.weight"] = t[a + "input_layernorm.weight"]
        out[b + "post_attention_layernorm.weight"] = t[a + "post_attention_layernorm.weight"]
        for kind in ("weight", "bias"):
            out[b + f"self_attention.query_key_value.{kind}"] = torch.cat(
                [t[a + f"self_attn.{n}.{kind}"] for n in ("q_proj", "k_proj", "v_proj")])
        out[b + "self_attention.dense.weight"] = t[a + "self_attn.o_proj.weight"]
        out[b + "mlp.dense_h_to_4h.weight"] = t[a + "mlp.gate_up_proj.weight"]
        out[b + "mlp.dense_4h_to_h.weight"] = t[a + "mlp.down_proj.weight"]
    out["transformer.encoder.final_layernorm.weight"] = t["model.norm.weight"]
    out["transformer.output_layer.weight"] = t["lm_head.weight"]
    r = D // 2
    theta = 10000.0 * CHATGLM["rope_ratio"]
    out["transformer.rotary_pos_emb.inv_freq"] = (
        1.0 / theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)).float()
    return {k: v.contiguous() for k, v in out.items()}


def write(directory, cfg, tensors):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    save_file(tensors, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})


def save_peft(peft_model, directory, base, targets=None, rename=()):
    """PEFT's save_pretrained into `directory`, the names then renamed by `rename`
    ((old, new) pieces) and `target_modules` set to `targets` when given; no machine paths."""
    from safetensors.torch import load_file

    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(0.5)
    peft_model.save_pretrained(directory)
    path = os.path.join(directory, "adapter_model.safetensors")
    tensors = {}
    for name, t in load_file(path).items():
        for a, b in rename:
            name = name.replace(a, b)
        tensors[name] = t.contiguous()
    save_file(tensors, path, metadata={"format": "pt"})
    cfg_path = os.path.join(directory, "adapter_config.json")
    with open(cfg_path) as f:
        saved = json.load(f)
    saved["base_model_name_or_path"] = base
    # PEFT writes its set of targets in hash order: a fixed order keeps reruns byte-identical.
    saved["target_modules"] = targets if targets is not None else sorted(saved["target_modules"])
    with open(cfg_path, "w") as f:
        json.dump(saved, f, indent=2, sort_keys=True)
        f.write("\n")
    readme = os.path.join(directory, "README.md")
    if os.path.exists(readme):
        os.remove(readme)


def write_peft(out, seed):
    """`glm_peft/` and `chatglm_peft/` (init_lora_weights False: nn.Linear's own initialisation
    for A and B, B then halved)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import train_ref_llama as ref

    def lora(targets):
        return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
                          task_type="CAUSAL_LM", target_modules=targets, init_lora_weights=False)

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "glm"), dtype=torch.float32)
    save_peft(get_peft_model(model, lora(GLM_TARGETS)), os.path.join(out, "glm_peft"), "glm")
    torch.manual_seed(seed + 1)
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "glm"), dtype=torch.float64)
    ref.fuse_qkv(model)
    model = get_peft_model(model, lora([ref.CHATGLM_TARGETS[t] for t in CHATGLM_TARGETS]))
    model.to(torch.float32)
    save_peft(model, os.path.join(out, "chatglm_peft"), "chatglm", CHATGLM_TARGETS,
              [(b, a) for a, b in ref.CHATGLM_NAMES])


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(root, "tests", "data", "train_glm"))
    ap.add_argument("--seed", type=int, default=2024)
    ap.add_argument("--no-ref", action="store_true")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    t = glm_tensors(g)
    write(os.path.join(args.out, "glm"), GLM, t)
    write(os.path.join(args.out, "chatglm"), CHATGLM, to_chatglm(t))
    sft_vocab = 640
    t_sft = glm_tensors(torch.Generator().manual_seed(args.seed + 1), sft_vocab)
    write(os.path.join(args.out, "chatglm_sft"), dict(CHATGLM, padded_vocab_size=sft_vocab),
          to_chatglm(t_sft))
    with open(os.path.join(args.out, "variants.json"), "w") as f:
        json.dump(VARIANTS, f, indent=2)
        f.write("\n")
    write_peft(args.out, args.seed)
    if args.no_ref:
        return
    ref = os.path.join(root, "tools", "train_ref_llama.py")
    for name, v in VARIANTS.items():
        flags = list(v["flags"])
        if "--lora-init" in flags:
            i = flags.index("--lora-init") + 1
            flags[i] = os.path.join(args.out, flags[i])
        cmd = [sys.executable, ref, "--model", os.path.join(args.out, "glm"),
               "--data", os.path.normpath(os.path.join(args.out, v["data"]))] + flags
        cmd += v.get("ref_flags", [])
        cmd += ["--log", os.path.join(args.out, f"ref_{name}.jsonl")]
        print(" ".join(cmd[1:]))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
