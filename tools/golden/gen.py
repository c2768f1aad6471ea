#!/usr/bin/env python3
"""Write the golden cases of hip-kernels into tests/golden/ (one .safetensors file per case).

Schema: docs/GOLDEN-CASES.md. Every expected tensor is computed in float64
from the tensors stored in the same file (already rounded to their dtype), then cast. The float64
definitions used here are checked at generation time against torch itself (F.layer_norm +
autograd, scaled_dot_product_attention + autograd, torch.optim.AdamW, torch._fused_adamw_).

Usage: python3 tools/golden/gen.py [--out DIR] [--seed N]   (default: tests/golden next to this repo root)
"""
import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
F64 = torch.float64


def meta_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return v
    raise TypeError(f"metadata value {v!r} has unsupported type {type(v)}")


def f32_exact(x):
    """The float64 value of x rounded to float32, so kernels taking f32 see the same number."""
    return float(torch.tensor(x, dtype=torch.float32).item())


class Writer:
    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.names = set()

    def write(self, name, op, meta, tensors):
        if name in self.names:
            raise ValueError(f"duplicate case name {name}")
        self.names.add(name)
        md = {"op": op}
        md.update({k: meta_value(v) for k, v in meta.items()})
        tensors = {k: v.contiguous() for k, v in tensors.items()}
        save_file(tensors, os.path.join(self.out_dir, name + ".safetensors"), metadata=md)


def randn(gen, shape, dtype):
    return torch.randn(shape, generator=gen, dtype=F64).to(dtype)


# ---------------------------------------------------------------- matmul
def matmul_case(w, gen, name, dt, batch, m, n, k, trans_a, trans_b, alpha, beta):
    dtype = DTYPES[dt]
    lead = (batch,) if batch else ()
    a = randn(gen, lead + ((k, m) if trans_a else (m, k)), dtype)
    b = randn(gen, lead + ((n, k) if trans_b else (k, n)), dtype)
    a64, b64 = a.to(F64), b.to(F64)
    if trans_a:
        a64 = a64.transpose(-1, -2)
    if trans_b:
        b64 = b64.transpose(-1, -2)
    out = alpha * (a64 @ b64)
    tensors = {"a": a, "b": b}
    if beta != 0.0:
        c = randn(gen, lead + (m, n), dtype)
        out = out + beta * c.to(F64)
        tensors["c"] = c
    tensors["expected_out"] = out.to(dtype)
    w.write(name, "matmul", {"trans_a": trans_a, "trans_b": trans_b, "alpha": alpha, "beta": beta}, tensors)


def gen_matmul(w, gen):
    for dt in DTYPES:
        matmul_case(w, gen, f"matmul_{dt}_m1", dt, 0, 1, 7, 5, False, False, 1.0, 0.0)
        matmul_case(w, gen, f"matmul_{dt}_k1", dt, 0, 3, 4, 1, False, False, 1.0, 0.0)
        matmul_case(w, gen, f"matmul_{dt}_odd_ta", dt, 0, 13, 17, 29, True, False, 1.0, 0.0)
        matmul_case(w, gen, f"matmul_{dt}_odd_tb", dt, 0, 11, 9, 31, False, True, 0.5, 0.0)
        matmul_case(w, gen, f"matmul_{dt}_tatb_beta", dt, 0, 8, 15, 21, True, True, 2.0, -1.25)
        matmul_case(w, gen, f"matmul_{dt}_batch_beta", dt, 3, 5, 6, 19, False, False, -0.75, 0.5)
        matmul_case(w, gen, f"matmul_{dt}_batch_tb", dt, 2, 9, 16, 33, False, True, 1.0, 1.0)
    matmul_case(w, gen, "matmul_f32_long_k", "f32", 0, 8, 8, 512, False, False, 1.0, 0.0)


# ---------------------------------------------------------------- layernorm
def ln_stats(x64, eps):
    mean = x64.mean(-1)
    var = ((x64 - mean[:, None]) ** 2).mean(-1)
    return mean, 1.0 / torch.sqrt(var + eps)


def ln_backward64(x, w, dy, mean, rstd):
    xhat = (x - mean[:, None]) * rstd[:, None]
    g = dy * w
    dx = rstd[:, None] * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
    return dx, (dy * xhat).sum(0), dy.sum(0)


def check_layernorm_definitions(gen):
    x = torch.randn(5, 12, generator=gen, dtype=F64, requires_grad=True)
    w = torch.randn(12, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(12, generator=gen, dtype=F64, requires_grad=True)
    dy = torch.randn(5, 12, generator=gen, dtype=F64)
    y = F.layer_norm(x, (12,), w, b, 1e-5)
    mean, rstd = ln_stats(x.detach(), 1e-5)
    y_ours = (x.detach() - mean[:, None]) * rstd[:, None] * w.detach() + b.detach()
    assert torch.allclose(y, y_ours, rtol=1e-12, atol=1e-12)
    y.backward(dy)
    dx, dw, db = ln_backward64(x.detach(), w.detach(), dy, mean, rstd)
    for got, want in ((dx, x.grad), (dw, w.grad), (db, b.grad)):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)


def gen_layernorm(w, gen):
    shapes = {"rows1": (1, 64), "c1": (5, 1), "odd": (7, 33), "wide": (3, 768)}
    for dt, dtype in DTYPES.items():
        for tag, (n, c) in shapes.items():
            eps = 1e-5 if tag != "odd" else 1e-6
            x = randn(gen, (n, c), dtype)
            weight = (1.0 + 0.5 * torch.randn(c, generator=gen, dtype=F64)).to(dtype)
            bias = randn(gen, (c,), dtype)
            mean, rstd = ln_stats(x.to(F64), eps)
            y = (x.to(F64) - mean[:, None]) * rstd[:, None] * weight.to(F64) + bias.to(F64)
            w.write(f"layernorm_forward_{dt}_{tag}", "layernorm_forward", {"eps": eps}, {
                "x": x, "weight": weight, "bias": bias, "expected_y": y.to(dtype),
                "expected_mean": mean.float(), "expected_rstd": rstd.float()})
            # Backward: mean/rstd are stored f32 inputs; the expected values use them as stored.
            dy = randn(gen, (n, c), dtype)
            mean32, rstd32 = mean.float(), rstd.float()
            dx, dwt, db = ln_backward64(x.to(F64), weight.to(F64), dy.to(F64), mean32.to(F64), rstd32.to(F64))
            w.write(f"layernorm_backward_{dt}_{tag}", "layernorm_backward", {"eps": eps}, {
                "x": x, "weight": weight, "dy": dy, "mean": mean32, "rstd": rstd32,
                "expected_dx": dx.to(dtype), "expected_dweight": dwt.to(dtype), "expected_dbias": db.to(dtype)})


# ---------------------------------------------------------------- attention
def visible_mask(tq, tk, causal):
    i = torch.arange(tq)[:, None]
    j = torch.arange(tk)[None, :]
    if not causal:
        return torch.ones(tq, tk, dtype=torch.bool)
    return j <= i + tk - tq


def attn_forward64(q, k, v, causal, scale):
    tq, tk = q.shape[-2], k.shape[-2]
    mask = visible_mask(tq, tk, causal)
    s = scale * (q @ k.transpose(-1, -2))
    s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, -1)  # -inf for a fully masked row
    p = torch.exp(s - lse[..., None])
    p = torch.where(mask & torch.isfinite(lse)[..., None], p, torch.zeros_like(p))
    return p @ v, lse


def attn_backward64(q, k, v, out, dout, lse, causal, scale):
    tq, tk = q.shape[-2], k.shape[-2]
    mask = visible_mask(tq, tk, causal) & torch.isfinite(lse)[..., None]
    s = scale * (q @ k.transpose(-1, -2))
    p = torch.where(mask, torch.exp(torch.where(mask, s - lse[..., None], torch.zeros_like(s))), torch.zeros_like(s))
    dd = (dout * out).sum(-1, keepdim=True)
    ds = p * (dout @ v.transpose(-1, -2) - dd)
    return scale * ds @ k, scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ dout


def check_attention_definitions(gen):
    for tq, tk, causal in ((9, 9, True), (5, 11, True), (6, 6, False), (7, 3, True)):
        q = torch.randn(2, 2, tq, 16, generator=gen, dtype=F64, requires_grad=True)
        k = torch.randn(2, 2, tk, 16, generator=gen, dtype=F64, requires_grad=True)
        v = torch.randn(2, 2, tk, 16, generator=gen, dtype=F64, requires_grad=True)
        dout = torch.randn(2, 2, tq, 16, generator=gen, dtype=F64)
        scale = 0.25
        out, lse = attn_forward64(q.detach(), k.detach(), v.detach(), causal, scale)
        if tq == tk or not causal:
            ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            assert torch.allclose(out, ref.detach(), rtol=1e-12, atol=1e-12)
        # Autograd through a masked softmax that zeroes fully masked rows.
        mask = visible_mask(tq, tk, causal)
        s = (scale * (q @ k.transpose(-1, -2))).masked_fill(~mask, -1e300)
        pa = torch.softmax(s, -1) * mask.any(-1, keepdim=True)
        ref = pa @ v
        assert torch.allclose(out, ref.detach(), rtol=1e-12, atol=1e-12)
        ref.backward(dout)
        got = attn_backward64(q.detach(), k.detach(), v.detach(), out, dout, lse, causal, scale)
        for g, want in zip(got, (q.grad, k.grad, v.grad)):
            assert torch.allclose(g, want, rtol=1e-10, atol=1e-12)


def gen_attention(w, gen):
    # (tag, B, H, Tq, Tk, D, causal)
    variants = [
        ("d16_causal", 2, 2, 12, 12, 16, True),
        ("d32_tq_lt_tk_causal", 1, 2, 5, 13, 32, True),
        ("d64_noncausal", 1, 3, 7, 9, 64, False),
        ("d80_causal", 1, 1, 9, 9, 80, True),
        ("d128_tq_gt_tk_causal", 1, 1, 6, 4, 128, True),
        ("d64_rows1", 1, 1, 1, 17, 64, True),
    ]
    for dt, dtype in DTYPES.items():
        for tag, b, h, tq, tk, d, causal in variants:
            scale = f32_exact(1.0 / math.sqrt(d))
            q, k, v = randn(gen, (b, h, tq, d), dtype), randn(gen, (b, h, tk, d), dtype), randn(gen, (b, h, tk, d), dtype)
            out, lse = attn_forward64(q.to(F64), k.to(F64), v.to(F64), causal, scale)
            meta = {"causal": causal, "scale": scale}
            w.write(f"attention_forward_{dt}_{tag}", "attention_forward", meta, {
                "q": q, "k": k, "v": v, "expected_out": out.to(dtype), "expected_lse": lse.float()})
            # Backward from stored (rounded) out and lse.
            out_s, lse_s = out.to(dtype), lse.float()
            dout = randn(gen, (b, h, tq, d), dtype)
            dq, dk, dv = attn_backward64(q.to(F64), k.to(F64), v.to(F64), out_s.to(F64), dout.to(F64), lse_s.to(F64), causal, scale)
            w.write(f"attention_backward_{dt}_{tag}", "attention_backward", meta, {
                "q": q, "k": k, "v": v, "out": out_s, "dout": dout, "lse": lse_s,
                "expected_dq": dq.to(dtype), "expected_dk": dk.to(dtype), "expected_dv": dv.to(dtype)})


# ---------------------------------------------------------------- adamw
def adamw64(p, g, m, v, vmax, lr, beta1, beta2, eps, wd, step, maximize, amsgrad, grad_scale):
    if grad_scale is not None:
        g = g / grad_scale
    if maximize:
        g = -g
    p = p * (1 - lr * wd)
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    bc1 = 1 - beta1 ** step
    bc2_sqrt = math.sqrt(1 - beta2 ** step)
    if amsgrad:
        vmax = torch.maximum(vmax, v)
        denom = vmax.sqrt() / bc2_sqrt + eps
    else:
        denom = v.sqrt() / bc2_sqrt + eps
    p = p - (lr / bc1) * m / denom
    return p, m, v, vmax


def check_adamw_definition(gen):
    """Cross-check adamw64 against torch.optim.AdamW (float64) and torch._fused_adamw_."""
    n = 257
    for maximize in (False, True):
        for amsgrad in (False, True):
            p0 = torch.randn(n, generator=gen, dtype=F64)
            param = p0.clone().requires_grad_(True)
            opt = torch.optim.AdamW([param], lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1,
                                    maximize=maximize, amsgrad=amsgrad, foreach=False)
            p, m, v = p0.clone(), torch.zeros(n, dtype=F64), torch.zeros(n, dtype=F64)
            vmax = torch.zeros(n, dtype=F64)
            for step in range(1, 4):
                g = 1e-2 * torch.randn(n, generator=gen, dtype=F64)
                param.grad = g.clone()
                opt.step()
                p, m, v, vmax = adamw64(p, g, m, v, vmax, 0.01, 0.8, 0.95, 1e-6, 0.1, step, maximize, amsgrad, None)
            st = opt.state[param]
            assert torch.allclose(param.detach(), p, rtol=1e-12, atol=1e-14), (maximize, amsgrad)
            assert torch.allclose(st["exp_avg"], m, rtol=1e-12, atol=1e-15)
            assert torch.allclose(st["exp_avg_sq"], v, rtol=1e-12, atol=1e-17)
            if amsgrad:
                assert torch.allclose(st["max_exp_avg_sq"], vmax, rtol=1e-12, atol=1e-17)
    # grad_scale and found_inf as torch's fused kernel applies them (float32 kernel, loose check).
    p0 = torch.randn(n, generator=gen, dtype=torch.float32)
    g0 = 1024.0 * 1e-2 * torch.randn(n, generator=gen, dtype=torch.float32)
    for found in (0.0, 1.0):
        p, g = p0.clone(), g0.clone()
        m, v, vm = torch.zeros(n), torch.zeros(n), torch.zeros(n)
        torch._fused_adamw_([p], [g], [m], [v], [vm], [torch.tensor(2.0)], lr=0.01, beta1=0.9, beta2=0.999,
                            weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=True,
                            grad_scale=torch.tensor(1024.0), found_inf=torch.tensor(found))
        if found:
            assert torch.equal(p, p0) and torch.equal(m, torch.zeros(n))
        else:
            z = torch.zeros(n, dtype=F64)
            want = adamw64(p0.to(F64), g0.to(F64), z, z, z, 0.01, 0.9, 0.999, 1e-8, 0.1, 2, True, True, 1024.0)
            assert torch.allclose(p.to(F64), want[0], rtol=1e-5, atol=1e-6)
            assert torch.allclose(m.to(F64), want[1], rtol=1e-5, atol=1e-9)


def gen_adamw(w, gen):
    # (tag, n, step, maximize, amsgrad, found_inf, grad_scale, weight_decay)
    variants = [
        ("plain", 300, 1, False, False, False, None, 0.1),
        ("step7_nowd", 129, 7, False, False, False, None, 0.0),
        ("maximize", 77, 3, True, False, False, None, 0.1),
        ("amsgrad", 200, 5, False, True, False, None, 0.05),
        ("grad_scale", 150, 2, False, False, False, 65536.0, 0.1),
        ("found_inf", 64, 4, False, True, True, 1024.0, 0.1),
        ("all_flags", 101, 12, True, True, False, 128.0, 0.01),
    ]
    for dt, dtype in DTYPES.items():
        lr = 1e-2 if dt != "bf16" else 5e-2
        for tag, n, step, maximize, amsgrad, found_inf, grad_scale, wd in variants:
            beta1, beta2, eps = 0.9, 0.999, 1e-8
            param = randn(gen, (n,), dtype)
            grad = (1e-2 * (grad_scale or 1.0) * torch.randn(n, generator=gen, dtype=F64)).to(dtype)
            if found_inf:
                grad[n // 2] = math.inf
            exp_avg = (1e-2 * torch.randn(n, generator=gen, dtype=F64)).float()
            exp_avg_sq = (1e-4 * torch.randn(n, generator=gen, dtype=F64).abs()).float()
            tensors = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
            vmax = None
            if amsgrad:
                vmax = (1e-4 * torch.randn(n, generator=gen, dtype=F64).abs()).float()
                tensors["max_exp_avg_sq"] = vmax
            if found_inf:
                outs = (param, exp_avg, exp_avg_sq, vmax)
            else:
                p, m, v, vm = adamw64(param.to(F64), grad.to(F64), exp_avg.to(F64), exp_avg_sq.to(F64),
                                      vmax.to(F64) if amsgrad else None, lr, beta1, beta2, eps, wd, step,
                                      maximize, amsgrad, grad_scale)
                outs = (p.to(dtype), m.float(), v.float(), vm.float() if amsgrad else None)
            for key, t in zip(("param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"), outs):
                if t is not None:
                    tensors["expected_" + key] = t.clone()
            meta = {"lr": lr, "beta1": beta1, "beta2": beta2, "eps": eps, "weight_decay": wd, "step": step,
                    "maximize": maximize, "amsgrad": amsgrad, "found_inf": found_inf}
            if grad_scale is not None:
                meta["grad_scale"] = grad_scale
            w.write(f"adamw_{dt}_{tag}", "adamw", meta, tensors)


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(root, "tests", "golden"))
    ap.add_argument("--seed", type=int, default=20261202,
                    help="draw other inputs (to check that tolerances hold for any draw); commit only the default")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for f in os.listdir(args.out):
        if f.endswith(".safetensors"):
            os.remove(os.path.join(args.out, f))
    gen = torch.Generator().manual_seed(args.seed)
    check_layernorm_definitions(gen)
    check_attention_definitions(gen)
    check_adamw_definition(gen)
    import gen_train
    # Its own generator, so the cases of the original ops stay byte-identical.
    gen_t = torch.Generator().manual_seed(args.seed + 13)
    gen_train.check_definitions(gen_t)
    # LLaMA-family ops (issue 31): their own generator too.
    import gen_llama
    gen_l = torch.Generator().manual_seed(args.seed + 31)
    gen_llama.check_definitions(gen_l)
    w = Writer(args.out)
    gen_matmul(w, gen)
    gen_layernorm(w, gen)
    gen_attention(w, gen)
    gen_adamw(w, gen)
    gen_train.generate(w, gen_t)
    import gen_ce
    # Cross-entropy divisor/totals and linear_crossentropy (issue 31): their own generator too.
    gen_c = torch.Generator().manual_seed(args.seed + 31)
    gen_ce.check_definitions(gen_c)
    gen_ce.generate(w, gen_c)
    gen_llama.generate(w, gen_l)
    # Grouped-query and variable-length attention: its own generator (the cases above stay
    # byte-identical); definitions asserted against torch's SDPA before writing.
    import gen_attention_gqa
    gen_g = torch.Generator().manual_seed(args.seed + 31)
    gen_attention_gqa.check_definitions(gen_g)
    gen_attention_gqa.generate(w, gen_g)
    # LoRA skinny GEMMs (issue 35): their own generator; definitions asserted against autograd.
    import gen_lora
    gen_lo = torch.Generator().manual_seed(args.seed + 35)
    gen_lora.check_definitions(gen_lo)
    gen_lora.generate(w, gen_lo)
    total = sum(os.path.getsize(os.path.join(args.out, f)) for f in os.listdir(args.out)
                if f.endswith(".safetensors"))
    print(f"wrote {len(w.names)} cases to {args.out} ({total / 1e6:.2f} MB)")
    if total > 3e6:
        sys.exit(f"golden cases total {total} bytes, over the 3 MB budget: shrink the shapes")


if __name__ == "__main__":
    main()
