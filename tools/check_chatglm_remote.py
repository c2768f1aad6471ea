#!/usr/bin/env python3
"""THUDM's own ChatGLM3 model code on the tiny `chatglm` checkpoint of tests/data/train_glm
against transformers' GlmForCausalLM on the same weights in the `glm` layout (float64 logits).

DIR holds THUDM's `modeling_chatglm.py` and `configuration_chatglm.py` from a ChatGLM3-6B
release (not in this repository), with `from .configuration_chatglm import` made absolute.
Copies without `rope_ratio` get its rotary cache replaced by one with base 10000·rope_ratio, as
THUDM's later code computes it (in float64 here; the original computes it in float32).

Usage: python3 tools/check_chatglm_remote.py DIR
"""
import json
import os
import sys

import torch
sys.path.insert(0, sys.argv[1])
from configuration_chatglm import ChatGLMConfig
import modeling_chatglm as MC
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
D = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data", "train_glm")
cfg = ChatGLMConfig(**{k: v for k, v in json.load(open(f"{D}/chatglm/config.json")).items() if k not in ("architectures", "model_type")})
cfg.torch_dtype = torch.float64
cfg.max_length = 64
# This copy predates `rope_ratio`; THUDM's later modeling_chatglm.py uses base = 10000 * rope_ratio.
# The cache in float64 (the original computes it in float32).
def fwd(self, max_seq_len, offset=0):
    n, base = self.dim, 10000 * cfg.rope_ratio
    theta = 1.0 / (base ** (torch.arange(0, n, 2, dtype=torch.float64) / n))
    idx = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), theta)
    return torch.stack([torch.cos(idx), torch.sin(idx)], dim=-1)
MC.RotaryEmbedding.forward = fwd
m = MC.ChatGLMForConditionalGeneration(cfg, empty_init=False)
sd = {k: v.double() for k, v in load_file(f"{D}/chatglm/model.safetensors").items()}
missing, unexpected = m.load_state_dict(sd, strict=False)
print("missing", missing, "unexpected", unexpected)
m = m.double().eval()
g = AutoModelForCausalLM.from_pretrained(f"{D}/glm", dtype=torch.float64, attn_implementation="eager").eval()
torch.manual_seed(0)
ids = torch.randint(0, 128, (2, 16))
with torch.no_grad():
    a = m.transformer(input_ids=ids, return_dict=True, use_cache=False)
    la = a.last_hidden_state if hasattr(a, "last_hidden_state") else a[0]
    la = m.transformer.output_layer(la) if la.shape[-1] != 128 else la
    la = la.transpose(0, 1) if la.shape[0] == 16 else la
    lb = g(input_ids=ids, use_cache=False).logits
print("shapes", la.shape, lb.shape)
print("max abs diff", (la - lb).abs().max().item(), "max rel", ((la - lb).abs().max() / lb.abs().max()).item())
