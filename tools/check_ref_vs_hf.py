#!/usr/bin/env python3
"""Check tools/train_ref.py's model against Hugging Face's GPT2LMHeadModel (float64).

The spec's model is "HF GPT2LMHeadModel with dropout 0"; train_ref.py spells it out with torch
ops. This loads the same weights into transformers' implementation and compares the loss and
every parameter gradient on a few batches of the token file. Needs `transformers` (not a
dependency of the project; any 4.x).

Usage: python3 tools/check_ref_vs_hf.py [--model DIR] [--data FILE] [--batch 4] [--seq 16]
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_ref  # noqa: E402


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    d = os.path.join(root, "tests", "data", "train_gpt2")
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(d, "model"))
    ap.add_argument("--data", default=os.path.join(d, "tokens.bin"))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=16)
    args = ap.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg, params = train_ref.load_model(args.model)
    hf = GPT2LMHeadModel(GPT2Config(**{k: v for k, v in cfg.items() if k != "architectures"}))
    hf = hf.double().eval()
    missing, unexpected = hf.transformer.load_state_dict(
        {k: v.clone() for k, v in params.items()}, strict=False
    )
    # Only the causal-mask buffers may be absent from our tensors (newer HF has none).
    assert all(k.endswith("attn.bias") or k.endswith("masked_bias") for k in missing), missing
    assert not unexpected, unexpected
    for t in params.values():
        t.requires_grad_(True)
    loader = train_ref.Loader(train_ref.load_tokens(args.data), args.batch, args.seq)
    worst_loss, worst_grad = 0.0, 0.0
    for _ in range(3):
        x, y = loader.next()
        for t in params.values():
            t.grad = None
        hf.zero_grad(set_to_none=True)
        ours = train_ref.forward(params, cfg, x, y)
        ours.backward()
        theirs = hf(input_ids=x, labels=None).logits
        theirs = torch.nn.functional.cross_entropy(theirs.reshape(-1, theirs.shape[-1]), y.reshape(-1))
        theirs.backward()
        worst_loss = max(worst_loss, abs(ours.item() - theirs.item()) / theirs.item())
        hf_params = dict(hf.transformer.named_parameters())
        for name, t in params.items():
            g_hf = hf_params[name].grad
            worst_grad = max(worst_grad, ((t.grad - g_hf).abs().max() / g_hf.abs().max()).item())
    print(f"train_ref vs transformers GPT2LMHeadModel (f64), 3 batches: "
          f"max rel loss diff {worst_loss:.3e}, max rel grad diff {worst_grad:.3e}")
    assert worst_loss < 1e-12 and worst_grad < 1e-10


if __name__ == "__main__":
    main()
