#!/usr/bin/env python3
"""A hipk-train checkpoint of the tiny qwen2 and llama loads in transformers and gives the
trainer's next-step loss; a LoRA checkpoint (adapter files) loads in PEFT on its base model
and gives the same.

For each model: runs `hipk-train` (the binary given by --trainer) for the variant's flags with
`--save-every 4`, loads `step_4/` with `AutoModelForCausalLM.from_pretrained` (float64, eager
attention), reads the micro-batch the trainer's step 5 trains on (the token file from the
loader position in `step_4/trainer.json`) and computes its mean cross-entropy; the trainer's
step-5 loss (its log) is the same quantity on the same weights. Writes both to
tests/data/train_llama/interop.json, which `cargo test -p hipk-train` checks (and reruns the
trainer's side).

Usage: python3 tools/hf_interop_llama.py --trainer target/debug/hipk-train [--out FILE]
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "train_llama")


def read_tokens(path):
    with open(path, "rb") as f:
        header = struct.unpack("<256i", f.read(1024))
        width, fmt = (2, "H") if header[0] == 20240520 else (4, "I")
        n = header[2]
        return list(struct.unpack(f"<{n}{fmt}", f.read(width * n)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    ap.add_argument("--out", default=os.path.join(DATA, "interop.json"))
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    variants = json.load(open(os.path.join(DATA, "variants.json")))
    out = {}
    for name in ("qwen2_base", "llama_base", "qwen2_lora"):
        v = variants[name]
        flags = [os.path.join(DATA, f) if f == "peft" else f for f in v["flags"]]
        batch, seq = int(flags[flags.index("--batch") + 1]), int(flags[flags.index("--seq") + 1])
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "run.jsonl")
            cmd = [args.trainer, "--model", os.path.join(DATA, v["model"]),
                   "--data", os.path.join(DATA, v["data"])] + flags
            cmd += ["--checkpoint-dir", tmp, "--save-every", "4", "--log", log]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            steps = [json.loads(line) for line in open(log)]
            step_dir = os.path.join(tmp, "step_4")
            state = json.load(open(os.path.join(step_dir, "trainer.json")))
            if name.endswith("_lora"):
                # The trainer's adapters in PEFT on the base model they were trained on.
                from peft import PeftModel
                base = AutoModelForCausalLM.from_pretrained(
                    os.path.join(DATA, v["model"]), dtype=torch.float64,
                    attn_implementation="eager")
                model = PeftModel.from_pretrained(base, step_dir).to(torch.float64)
            else:
                model = AutoModelForCausalLM.from_pretrained(step_dir, dtype=torch.float64,
                                                             attn_implementation="eager")
            toks = read_tokens(os.path.join(DATA, v["data"]))
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
            print(f"{name}: transformers {loss!r} vs hipk-train step 5 {steps[4]['loss']!r}")
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
