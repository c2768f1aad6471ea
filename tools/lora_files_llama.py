#!/usr/bin/env python3
"""PEFT and transformers on the trainer's LoRA files of the tiny qwen2 (tests/data/train_llama).

1. `peft_resaved/`: a trainer LoRA checkpoint whose adapter files PEFT rewrote. Runs
   `hipk-train` (the qwen2_lora variant, `--steps 6 --save-every 4`), copies its `step_4/`,
   loads it with `PeftModel.from_pretrained` on the base model and `save_pretrained`s it over
   the copy: PEFT's own `adapter_model.safetensors` (its tensor order), `adapter_config.json`
   and `README.md`, beside the trainer's `optimizer.safetensors` and `trainer.json`.
   `cargo test -p hipk-train` resumes from it.
2. `merged.json`: `--merge-on-save` checked. Runs the variant with `--steps 5 --save-every 4
   --merge-on-save`, loads the merged `step_4/config.json` + `model.safetensors` (copied to a
   directory of their own, so transformers does not pick up adapter_config.json) with
   `AutoModelForCausalLM.from_pretrained` (float64, eager attention), and the base + step_4
   adapters with PEFT; both losses on the micro-batch of the trainer's step 5 (the token file
   from `loader_pos` in `step_4/trainer.json`), and the trainer's step-5 loss.

Usage: python3 tools/lora_files_llama.py --trainer target/debug/hipk-train
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_interop_llama import DATA, read_tokens  # noqa: E402


def trainer_run(trainer, v, tmp, extra):
    flags = [os.path.join(DATA, f) if f == "peft" else f for f in v["flags"]]
    log = os.path.join(tmp, "run.jsonl")
    cmd = [trainer, "--model", os.path.join(DATA, v["model"]),
           "--data", os.path.join(DATA, v["data"])] + flags + extra
    cmd += ["--checkpoint-dir", tmp, "--log", log]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(line) for line in open(log)], flags


def base_model(v):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(
        os.path.join(DATA, v["model"]), dtype=torch.float64, attn_implementation="eager")


def loss_on(model, v, flags, step_dir):
    batch, seq = int(flags[flags.index("--batch") + 1]), int(flags[flags.index("--seq") + 1])
    state = json.load(open(os.path.join(step_dir, "trainer.json")))
    toks = read_tokens(os.path.join(DATA, v["data"]))
    pos = state["loader_pos"]
    if pos + batch * seq + 1 > len(toks):
        pos = 0
    buf = torch.tensor(toks[pos:pos + batch * seq + 1])
    x, y = buf[:-1].view(batch, seq), buf[1:].view(batch, seq)
    with torch.no_grad():
        logits = model(input_ids=x).logits.to(torch.float64)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trainer", required=True)
    args = ap.parse_args()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    v = json.load(open(os.path.join(DATA, "variants.json")))["qwen2_lora"]
    with tempfile.TemporaryDirectory() as tmp:
        trainer_run(args.trainer, v, tmp, ["--steps", "6", "--save-every", "4"])
        out = os.path.join(DATA, "peft_resaved")
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(os.path.join(tmp, "step_4"), out)
        # float32, as the trainer wrote them: PEFT rewrites the same values in its own files.
        from transformers import AutoModelForCausalLM as M
        base = M.from_pretrained(os.path.join(DATA, v["model"]), dtype=torch.float32)
        model = PeftModel.from_pretrained(base, out)
        # The base as the committed `peft/` names it (not this machine's path).
        for c in model.peft_config.values():
            c.base_model_name_or_path = "qwen2"
        model.save_pretrained(out)
        card = os.path.join(out, "README.md")
        text = open(card).read().replace(os.path.join(DATA, v["model"]), "qwen2")
        open(card, "w").write(text)
        print(f"wrote {out}: {sorted(os.listdir(out))}")

    with tempfile.TemporaryDirectory() as tmp:
        steps, flags = trainer_run(args.trainer, v, tmp,
                                   ["--steps", "5", "--save-every", "4", "--merge-on-save"])
        step_dir = os.path.join(tmp, "step_4")
        alone = os.path.join(tmp, "merged")
        os.makedirs(alone)
        for f in ("config.json", "model.safetensors"):
            shutil.copy(os.path.join(step_dir, f), alone)
        merged = AutoModelForCausalLM.from_pretrained(alone, dtype=torch.float64,
                                                      attn_implementation="eager")
        merged_loss = loss_on(merged, v, flags, step_dir)
        peft = PeftModel.from_pretrained(base_model(v), step_dir).to(torch.float64)
        peft_loss = loss_on(peft, v, flags, step_dir)
        res = {
            "checkpoint": "step_4",
            "merged_transformers_loss": merged_loss,
            "peft_loss": peft_loss,
            "trainer_loss": steps[4]["loss"],
            "trainer_step": steps[4]["step"],
        }
        print(json.dumps(res, indent=2))
        with open(os.path.join(DATA, "merged.json"), "w") as f:
            json.dump({"qwen2_lora": res}, f, indent=2, sort_keys=True)
            f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
