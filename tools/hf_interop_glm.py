#!/usr/bin/env python3
"""A hipk-train LoRA checkpoint of the tiny `glm` (tests/data/train_glm) loads in PEFT on
transformers' GlmForCausalLM and gives the trainer's next-step loss.

Runs `hipk-train` (the binary given by --trainer) for the `glm_lora` variant with
`--save-every 4`, loads `step_4/` with `PeftModel.from_pretrained` on the GlmForCausalLM base
(float64, eager attention), reads the micro-batch the trainer's step 5 trains on (the token
file from the loader position in `step_4/trainer.json`) and computes its mean cross-entropy;
the trainer's step-5 loss (its log) is the same quantity on the same weights. Writes both to
tests/data/train_glm/interop.json, which `cargo test -p hipk-train` checks (and reruns the
trainer's side).

Usage: python3 tools/hf_interop_glm.py --trainer target/debug/hipk-train [--out FILE]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_interop_llama import read_tokens  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "train_glm")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--out", default=os.path.join(DATA, "interop.json"))
    args = ap.parse_args()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    variants = json.load(open(os.path.join(DATA, "variants.json")))
    out = {}
    for name in ("glm_lora",):
        v = variants[name]
        flags = list(v["flags"])
        i = flags.index("--lora-init") + 1
        flags[i] = os.path.join(DATA, flags[i])
        batch, seq = int(flags[flags.index("--batch") + 1]), int(flags[flags.index("--seq") + 1])
        data = os.path.normpath(os.path.join(DATA, v["data"]))
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "run.jsonl")
            cmd = [args.trainer, "--model", os.path.join(DATA, "glm"), "--data", data] + flags
            cmd += ["--checkpoint-dir", tmp, "--save-every", "4", "--log", log]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            steps = [json.loads(line) for line in open(log)]
            step_dir = os.path.join(tmp, "step_4")
            state = json.load(open(os.path.join(step_dir, "trainer.json")))
            base = AutoModelForCausalLM.from_pretrained(
                os.path.join(DATA, "glm"), dtype=torch.float64, attn_implementation="eager")
            model = PeftModel.from_pretrained(base, step_dir).to(torch.float64).eval()
            toks = read_tokens(data)
            pos = state["loader_pos"]
            if pos + batch * seq + 1 > len(toks):
                pos = 0
            buf = torch.tensor(toks[pos:pos + batch * seq + 1])
            x, y = buf[:-1].view(batch, seq), buf[1:].view(batch, seq)
            with torch.no_grad():
                logits = model(input_ids=x).logits.to(torch.float64)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()
            out[name] = {
                "checkpoint": "step_4",
                "transformers_loss": loss,
                "trainer_loss": steps[4]["loss"],
                "trainer_step": steps[4]["step"],
            }
            print(f"{name}: PEFT {loss!r} vs hipk-train step 5 {steps[4]['loss']!r}")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
