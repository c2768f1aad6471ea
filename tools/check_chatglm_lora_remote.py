#!/usr/bin/env python3
"""A hipk-train LoRA checkpoint of the tiny `chatglm` (adapters in THUDM's PEFT names) loads with
PEFT on THUDM's own ChatGLM3 model code and gives the trainer's next-step loss (float64).

DIR holds THUDM's `modeling_chatglm.py` and `configuration_chatglm.py` (not in this repository;
see tools/check_chatglm_remote.py, whose rotary cache fix this script repeats). STEP is the
trainer's `step_4/` of the `chatglm_lora` flags (tests/data/train_glm/variants.json) run with
`--steps 5 --checkpoint-dir CK --save-every 4 --log LOG`; the script computes the loss of
step 5's batch and prints it beside the trainer's step-5 loss from LOG.

Usage: python3 tools/check_chatglm_lora_remote.py DIR CK/step_4 LOG
"""
import json
import os
import sys

import torch
import torch.nn.functional as F
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from configuration_chatglm import ChatGLMConfig
import modeling_chatglm as MC
from safetensors.torch import load_file
from peft import PeftModel
from hf_interop_llama import read_tokens
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
D = os.path.join(ROOT, "tests", "data", "train_glm")
cfg = ChatGLMConfig(**{k: v for k, v in json.load(open(f"{D}/chatglm/config.json")).items() if k not in ("architectures", "model_type")})
cfg.torch_dtype = torch.float64
cfg.max_length = 64
def fwd(self, max_seq_len, offset=0):
    n, base = self.dim, 10000 * cfg.rope_ratio
    theta = 1.0 / (base ** (torch.arange(0, n, 2, dtype=torch.float64) / n))
    idx = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), theta)
    return torch.stack([torch.cos(idx), torch.sin(idx)], dim=-1)
MC.RotaryEmbedding.forward = fwd
m = MC.ChatGLMForConditionalGeneration(cfg, empty_init=False)
sd = {k: v.double() for k, v in load_file(f"{D}/chatglm/model.safetensors").items()}
print(m.load_state_dict(sd, strict=False))
m = m.double().eval()
step = sys.argv[2]
pm = PeftModel.from_pretrained(m, step).double().eval()
n_lora = sum(1 for n, _ in pm.named_parameters() if "lora_" in n)
print("lora tensors loaded:", n_lora)
state = json.load(open(os.path.join(step, "trainer.json")))
toks = read_tokens(os.path.join(ROOT, "tests", "data", "train_llama", "tokens_u32.bin"))
pos = state["loader_pos"]; b, t = 4, 16
buf = torch.tensor(toks[pos:pos + b * t + 1])
x, y = buf[:-1].view(b, t), buf[1:].view(b, t)
with torch.no_grad():
    out = pm.base_model.model.transformer(input_ids=x, return_dict=True, use_cache=False)
    h = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    if h.shape[0] == t: h = h.transpose(0, 1)
    logits = pm.base_model.model.transformer.output_layer(h) if h.shape[-1] != 128 else h
loss = F.cross_entropy(logits.reshape(-1, 128).double(), y.reshape(-1)).item()
ours = [json.loads(l) for l in open(sys.argv[3])][4]["loss"]
print(f"THUDM modeling_chatglm + PEFT: {loss!r} vs hipk-train step 5 {ours!r}, rel {abs(loss-ours)/ours:.2e}")
