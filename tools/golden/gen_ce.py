"""Golden cases of the cross-entropy divisor and totals (`crossentropy` with metadata `divisor`
and an input `totals`) and of the chunked `linear_crossentropy` (CE(h·Wᵀ)), issue 31.

Called by gen.py with its own generator, so the cases written before these stay byte-identical.
Same rules as there: every expected tensor is computed in float64 from the tensors stored in
the same case (already rounded to their dtype), then cast once; the float64 definitions are
asserted against torch's `F.cross_entropy(ignore_index=-100, reduction='sum')` and autograd
before anything is written. Tensors per case: README.md ("Cross-entropy with a divisor,
linear cross-entropy").
"""
import math

import torch
import torch.nn.functional as F

import gen as g

F64 = torch.float64
I32 = torch.int32
IGNORE = -100


def close(got, want, rtol=1e-12, atol=1e-12):
    assert torch.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True), (got - want).abs().max()


def ce_sum64(logits, targets):
    """Per-row losses (0 when ignored), their sum, the count of counted rows, dlogits of the sum."""
    keep = targets != IGNORE
    safe = torch.where(keep, targets, torch.zeros_like(targets)).long()
    lse = torch.logsumexp(logits, -1)
    rows = torch.where(keep, lse - logits.gather(1, safe[:, None])[:, 0], torch.zeros_like(lse))
    p = torch.exp(logits - lse[:, None]) - F.one_hot(safe, logits.shape[1]).to(F64)
    d = torch.where(keep[:, None], p, torch.zeros_like(p))
    return rows, rows.sum(), int(keep.sum()), d


def divided(total, count, divisor):
    """The loss output: the sum over the divisor (the count when none; NaN for 0/0)."""
    n = divisor if divisor is not None else count
    return total / n if n else torch.tensor(math.nan, dtype=F64)


def linear_ce64(h, w, targets, dloss, divisor, dw0):
    rows, total, count, d = ce_sum64(h @ w.T, targets)
    n = divisor if divisor is not None else count
    s = dloss / n if (dloss is not None and n) else 0.0
    dh = (d * s) @ w
    dw = None if dw0 is None else dw0 + (d * s).T @ h
    return rows, total, count, dh, dw


def check_definitions(gen):
    for n, c, v, targets, divisor in ((5, 4, 9, [1, -100, 8, 0, 3], 7.0),
                                      (3, 2, 6, [-100] * 3, None),
                                      (3, 1, 151936, [151935, -100, 0], None)):
        h = torch.randn(n, c, generator=gen, dtype=F64, requires_grad=True)
        w = torch.randn(v, c, generator=gen, dtype=F64, requires_grad=True)
        t = torch.tensor(targets)
        total = F.cross_entropy(h @ w.T, t, ignore_index=IGNORE, reduction="sum")
        per_row = F.cross_entropy((h @ w.T).detach(), t, ignore_index=IGNORE, reduction="none")
        count = int((t != IGNORE).sum())
        loss = total / (divisor if divisor is not None else max(count, 1))
        dloss = 0.75
        loss.backward(torch.tensor(dloss, dtype=F64))
        dw0 = torch.randn(v, c, generator=gen, dtype=F64)
        rows, tot, cnt, dh, dw = linear_ce64(h.detach(), w.detach(), t.to(I32), dloss, divisor, dw0)
        close(rows, per_row, 1e-12, 1e-9)
        close(tot, total.detach(), 1e-12, 1e-9)
        assert cnt == count
        close(dh, h.grad, 1e-12, 1e-14)
        close(dw, dw0 + w.grad, 1e-12, 1e-14)


def gen_crossentropy_divisor(w, gen):
    """Two micro-batches' worth of `crossentropy` with the step's count as divisor, totals added."""
    for dt, dtype in g.DTYPES.items():
        for tag, n, v, pattern, divisor, dloss in (("divisor", 6, 13, "mixed", 20.0, 1.0),
                                                   ("divisor_all_ignored", 3, 9, "ignored", 5.0, 0.5)):
            logits = g.randn(gen, (n, v), dtype) * 2
            targets = torch.randint(0, v, (n,), generator=gen, dtype=torch.int64).to(I32)
            if pattern == "mixed":
                targets[1::3] = IGNORE
            else:
                targets[:] = IGNORE
            totals = torch.tensor([3.5, 7.0], dtype=torch.float32)
            x = logits.to(F64)
            rows, total, count, d = ce_sum64(x, targets)
            tensors = {"logits": logits, "targets": targets, "totals": totals,
                       "expected_losses": rows.float(),
                       "expected_loss": divided(total, count, divisor).reshape(1).float(),
                       "expected_dlogits": (d * (dloss / divisor)).to(dtype),
                       "expected_totals": (totals.to(F64) + torch.tensor([float(total), count],
                                                                          dtype=F64)).float()}
            w.write(f"crossentropy_{dt}_{tag}", "crossentropy",
                    {"vocab": v, "dloss": dloss, "divisor": divisor}, tensors)


def linear_case(w, gen, name, dtype, n, c, v, pattern, meta, with_dw, with_totals):
    h = g.randn(gen, (n, c), dtype)
    wt = (torch.randn(v, c, generator=gen, dtype=F64) * (2.0 / math.sqrt(c))).to(dtype)
    targets = torch.randint(0, v, (n,), generator=gen, dtype=torch.int64).to(I32)
    if pattern == "mixed":
        targets[1::3] = IGNORE
    elif pattern == "ignored":
        targets[:] = IGNORE
    elif pattern == "edges":
        targets[0], targets[-1] = v - 1, 0
        targets[1] = IGNORE
    dloss, divisor = meta.get("dloss"), meta.get("divisor")
    dw0 = g.randn(gen, (v, c), dtype) if with_dw else None
    rows, total, count, dh, dw = linear_ce64(h.to(F64), wt.to(F64), targets, dloss, divisor,
                                             None if dw0 is None else dw0.to(F64))
    tensors = {"h": h, "weight": wt, "targets": targets, "expected_losses": rows.float(),
               "expected_loss": divided(total, count, divisor).reshape(1).float()}
    if dloss is not None:
        tensors["expected_dh"] = dh.to(dtype)
    if with_dw:
        tensors["dweight"] = dw0
        tensors["expected_dweight"] = dw.to(dtype)
    if with_totals:
        totals = torch.tensor([1.25, 2.0], dtype=torch.float32)
        tensors["totals"] = totals
        tensors["expected_totals"] = (totals.to(F64) + torch.tensor([float(total), count],
                                                                    dtype=F64)).float()
    w.write(name, "linear_crossentropy", meta, tensors)


def gen_linear(w, gen):
    # (tag, N, C, V, target pattern, metadata, dweight given, totals given)
    variants = [
        ("chunked", 7, 9, 37, "mixed", {"dloss": 1.0, "chunk_rows": 3}, True, True),
        ("frozen_divisor", 5, 16, 50, "mixed", {"dloss": 0.5, "divisor": 12.0}, False, False),
        ("all_ignored", 3, 4, 11, "ignored", {"dloss": 1.0, "chunk_rows": 2}, True, False),
        ("forward_only", 4, 8, 20, "random", {}, False, True),
        ("row1", 1, 3, 5, "random", {"dloss": 2.0}, True, False),
    ]
    for dt, dtype in g.DTYPES.items():
        for tag, n, c, v, pattern, meta, with_dw, with_totals in variants:
            linear_case(w, gen, f"linear_crossentropy_{dt}_{tag}", dtype, n, c, v, pattern, meta,
                        with_dw, with_totals)
    # Qwen2's vocabulary (V = 151936) in bf16, a frozen head (LoRA), C = 1 and chunks of 2 rows
    # so the committed file stays small (the weight is 151936 × 2 bytes).
    linear_case(w, gen, "linear_crossentropy_bf16_qwen_vocab", torch.bfloat16, 3, 1, 151936,
                "edges", {"dloss": 1.0, "chunk_rows": 2}, False, True)


def generate(w, gen):
    gen_crossentropy_divisor(w, gen)
    gen_linear(w, gen)
