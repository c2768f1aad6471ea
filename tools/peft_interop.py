#!/usr/bin/env python3
"""PEFT reads the trainer's LoRA adapters, and the trainer reads PEFT's: checked with the real
transformers + PEFT on the test model (tests/data/train_gpt2), in float64.

Two parts, both on the same batches as train_gpt2's loader (--seq 16 --batch 4: batch k is
tokens[(k-1)*64 : (k-1)*64 + 65], inputs and next-token targets):

  make   A PEFT-made adapter for the test model: LoraConfig(r=4, lora_alpha=8,
         target_modules=["c_attn", "c_proj", "c_fc"]) on transformers' GPT2LMHeadModel, lora_A as
         PEFT initialises it, lora_B ~ N(0, 0.05) (nonzero, so every adapter changes the loss),
         written with save_pretrained to tests/data/train_gpt2/lora/peft/. Records PEFT's loss of
         batch 1 with it, and the tensor names and shapes PEFT saves, in
         tests/data/train_gpt2/lora/peft.json.
  check  Runs train_gpt2 (CPU) with --lora-init on that directory for 4 steps (checkpoint at
         step 3), asserts step 1's loss equals PEFT's, loads step_3/ with
         PeftModel.from_pretrained (every adapter tensor must arrive, equal to the file's), and
         asserts PEFT's loss of batch 4 equals the loss train_gpt2 logged at step 4 (computed
         with the same step-3 adapters). Records that loss in peft.json as well.

The Rust tests of train/src/tests/peft.rs use peft.json and the adapter
directory, so CI needs no torch. Needs torch, transformers and peft (not dependencies of the
project); the versions used are recorded in peft.json.

Usage: python3 tools/peft_interop.py make|check|all [--trainer target/debug/train_gpt2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "train_gpt2")
PEFT_DIR = os.path.join(DATA, "lora", "peft")
PEFT_JSON = os.path.join(DATA, "lora", "peft.json")
SEQ, BATCH = 16, 4
RANK, ALPHA = 4, 8
PEFT_TARGETS = ["c_attn", "c_proj", "c_fc"]
OUR_TARGETS = "attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj"
# float64 on both sides of PEFT; train_gpt2's CPU backend computes in f64 and rounds every op's
# output to f32, which leaves about 1e-7 relative on these losses (its tests allow 1e-5).
RTOL = 1e-5


def hf_model(dtype):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg, params = train_ref.load_model(os.path.join(DATA, "model"))
    hf = GPT2LMHeadModel(GPT2Config(**{k: v for k, v in cfg.items() if k != "architectures"}))
    hf = hf.to(dtype).eval()
    missing, unexpected = hf.transformer.load_state_dict(
        {k: v.to(dtype).clone() for k, v in params.items()}, strict=False
    )
    assert all(k.endswith("attn.bias") or k.endswith("masked_bias") for k in missing), missing
    assert not unexpected, unexpected
    hf.lm_head.weight = hf.transformer.wte.weight
    return hf


def batch(k):
    """Batch k (1-based) of train_gpt2's loader for --seq 16 --batch 4."""
    tokens = train_ref.load_tokens(os.path.join(DATA, "tokens.bin"))
    loader = train_ref.Loader(tokens, BATCH, SEQ)
    for _ in range(k):
        x, y = loader.next()
    return x, y


def loss_of(model, k):
    x, y = batch(k)
    with torch.no_grad():
        logits = model(input_ids=x).logits
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).double(), y.reshape(-1)
    ).item()


def peft_load(adapter_dir):
    """transformers' GPT-2 in float64 with the adapters of `adapter_dir`, as PEFT loads them."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(hf_model(torch.float64), adapter_dir)
    return model.to(torch.float64).eval()


def check_loaded(model, adapter_file):
    """Every tensor of `adapter_file` arrived in `model` (PEFT names the loaded ones `.default.`)."""
    from safetensors.torch import load_file

    saved = load_file(adapter_file)
    state = {k.replace(".default.", "."): v for k, v in model.state_dict().items() if "lora_" in k}
    assert set(saved) == set(state), (sorted(saved), sorted(state))
    for k, v in saved.items():
        assert torch.equal(state[k].to(torch.float32), v), f"{k} differs after from_pretrained"
        assert k.endswith("lora_A.weight") or v.abs().max() > 0, f"{k} is zero"
    return len(saved)


def make(record):
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    torch.manual_seed(7)
    cfg = LoraConfig(
        r=RANK,
        lora_alpha=ALPHA,
        target_modules=PEFT_TARGETS,
        lora_dropout=0.0,
        bias="none",
        fan_in_fan_out=True,
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(hf_model(torch.float32), cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.05)
    model.save_pretrained(PEFT_DIR)
    # save_pretrained also writes a model card template: not part of the fixture.
    os.remove(os.path.join(PEFT_DIR, "README.md"))
    adapter_file = os.path.join(PEFT_DIR, "adapter_model.safetensors")
    saved = load_file(adapter_file)
    loaded = peft_load(PEFT_DIR)
    n = check_loaded(loaded, adapter_file)
    record["peft_tensors"] = {k: list(v.shape) for k, v in sorted(saved.items())}
    record["peft_adapter_step1_loss"] = loss_of(loaded, 1)
    print(f"make: {n} tensors in {adapter_file}; PEFT's loss of batch 1: "
          f"{record['peft_adapter_step1_loss']!r}")


def run_trainer(trainer, out):
    log = os.path.join(out, "log.jsonl")
    argv = [
        trainer, "--model", os.path.join(DATA, "model"), "--data", os.path.join(DATA, "tokens.bin"),
        "--seq", str(SEQ), "--batch", str(BATCH), "--steps", "4", "--lr", "1e-2",
        "--lora-rank", str(RANK), "--lora-alpha", str(ALPHA), "--lora-targets", OUR_TARGETS,
        "--lora-init", PEFT_DIR, "--checkpoint-dir", os.path.join(out, "ck"), "--save-every", "3",
        "--log", log,
    ]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    with open(log) as f:
        return {r["step"]: r for r in map(json.loads, f)}


def rel(a, b):
    return abs(a - b) / abs(b)


def check(record, trainer):
    ours = json.load(open(PEFT_JSON)) if not record else record
    with tempfile.TemporaryDirectory() as out:
        logged = run_trainer(trainer, out)
        step1 = logged[1]["loss"]
        d1 = rel(step1, ours["peft_adapter_step1_loss"])
        print(f"check: --lora-init {os.path.relpath(PEFT_DIR, ROOT)}: train_gpt2's step-1 loss "
              f"{step1!r}, PEFT's {ours['peft_adapter_step1_loss']!r} (rel {d1:.2e})")
        assert d1 <= RTOL, d1
        step3 = os.path.join(out, "ck", "step_3")
        model = peft_load(step3)
        n = check_loaded(model, os.path.join(step3, "adapter_model.safetensors"))
        peft4 = loss_of(model, 4)
        d4 = rel(logged[4]["loss"], peft4)
        print(f"check: PeftModel.from_pretrained(step_3/) loaded {n} tensors; loss of batch 4: "
              f"PEFT {peft4!r}, train_gpt2's step 4 {logged[4]['loss']!r} (rel {d4:.2e})")
        assert d4 <= RTOL, d4
        with open(os.path.join(step3, "adapter_config.json")) as f:
            written = json.load(f)
    record.update(ours)
    record["trainer_step3_adapters_step4_loss"] = peft4
    record["trainer_adapter_config_keys"] = sorted(written)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["make", "check", "all"])
    ap.add_argument("--trainer", default=os.path.join(ROOT, "target", "debug", "train_gpt2"))
    args = ap.parse_args()
    import peft
    import transformers

    record = {}
    if args.what in ("make", "all"):
        make(record)
    if args.what in ("check", "all"):
        check(record, args.trainer)
    record["about"] = (
        "tools/peft_interop.py: PEFT's figures for the LoRA interop test (float64). "
        f"seq {SEQ}, batch {BATCH}, r {RANK}, lora_alpha {ALPHA}, PEFT target_modules "
        f"{PEFT_TARGETS} (= --lora-targets {OUR_TARGETS}); lr 1e-2 for the 4-step run."
    )
    record["versions"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
    }
    with open(PEFT_JSON, "w") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"wrote {os.path.relpath(PEFT_JSON, ROOT)}")


if __name__ == "__main__":
    main()
