"""Golden cases of grouped-query and variable-length attention (called by gen.py).

Same ops and schema as gen.py's attention cases (`attention_forward`, `attention_backward`), plus:
k and v are [B, K, Tk, D] with K key/value heads (H % K == 0; query head h reads kv head
h // (H / K)), and an optional int32 `cu_seqlens` [B, n + 1]: row b's sequence s is positions
cu[b, s] .. cu[b, s + 1]; positions outside cu[b, 0] .. cu[b, n] are padding (out = 0,
lse = -inf, zero gradients); attention never crosses sequences (causal within each one).

The float64 definitions are asserted against torch: F.scaled_dot_product_attention with
enable_gqa=True and a block-diagonal (causal) boolean mask on every non-padding row, and
autograd through a masked softmax for the backward (which is the FlashAttention definition from
the stored out and lse, as for the other attention cases).
"""
import math

import torch
import torch.nn.functional as F

F64 = torch.float64
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def f32_exact(x):
    return float(torch.tensor(x, dtype=torch.float32).item())


def randn(gen, shape, dtype):
    return torch.randn(shape, generator=gen, dtype=F64).to(dtype)


def visible(b, tq, tk, causal, cu):
    """[B, 1, Tq, Tk] bool: key j visible to query i of row b."""
    i = torch.arange(tq)[:, None]
    j = torch.arange(tk)[None, :]
    if cu is None:
        m = (j <= i + tk - tq) if causal else torch.ones(tq, tk, dtype=torch.bool)
        return m.expand(b, 1, tq, tk)
    assert tq == tk
    rows = []
    for r in cu.tolist():
        seq = torch.full((tq,), -1)
        for s, (a, e) in enumerate(zip(r, r[1:])):
            seq[a:e] = s
        m = (seq[:, None] == seq[None, :]) & (seq[:, None] >= 0)
        if causal:
            m &= j <= i
        rows.append(m)
    return torch.stack(rows)[:, None]


def expand_kv(x, h):
    """[B, K, T, D] -> [B, H, T, D]: query head h reads kv head h // (H / K)."""
    return x.repeat_interleave(h // x.shape[1], dim=1)


def forward64(q, k, v, causal, scale, cu):
    b, h, tq, _ = q.shape
    tk = k.shape[-2]
    mask = visible(b, tq, tk, causal, cu)
    s = scale * (q @ expand_kv(k, h).transpose(-1, -2))
    s = s.masked_fill(~mask, -math.inf)
    lse = torch.logsumexp(s, -1)  # -inf for a row that sees nothing
    p = torch.exp(s - lse[..., None])
    p = torch.where(mask & torch.isfinite(lse)[..., None], p, torch.zeros_like(p))
    return p @ expand_kv(v, h), lse


def backward64(q, k, v, out, dout, lse, causal, scale, cu):
    """FlashAttention's definition from the stored out and lse; dk, dv summed over each group."""
    b, h, tq, d = q.shape
    kh, tk = k.shape[1], k.shape[-2]
    mask = visible(b, tq, tk, causal, cu) & torch.isfinite(lse)[..., None]
    ke, ve = expand_kv(k, h), expand_kv(v, h)
    s = scale * (q @ ke.transpose(-1, -2))
    p = torch.where(mask, torch.exp(torch.where(mask, s - lse[..., None], torch.zeros_like(s))),
                    torch.zeros_like(s))
    dd = (dout * out).sum(-1, keepdim=True)
    ds = p * (dout @ ve.transpose(-1, -2) - dd)
    dq = scale * ds @ ke
    dk = (scale * ds.transpose(-1, -2) @ q).view(b, kh, h // kh, tk, d).sum(2)
    dv = (p.transpose(-1, -2) @ dout).view(b, kh, h // kh, tk, d).sum(2)
    return dq, dk, dv


def check_definitions(gen):
    shapes = [  # (B, H, K, T, causal, cu)
        (2, 4, 2, 9, True, [[0, 4, 4, 9], [2, 3, 7, 8]]),
        (1, 3, 1, 8, False, [[1, 1, 5, 6]]),
        (2, 2, 2, 6, True, None),
        (1, 4, 1, 7, False, None),
    ]
    for b, h, kh, t, causal, cu in shapes:
        cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
        q = torch.randn(b, h, t, 16, generator=gen, dtype=F64, requires_grad=True)
        k = torch.randn(b, kh, t, 16, generator=gen, dtype=F64, requires_grad=True)
        v = torch.randn(b, kh, t, 16, generator=gen, dtype=F64, requires_grad=True)
        dout = torch.randn(b, h, t, 16, generator=gen, dtype=F64)
        scale = 0.25
        out, lse = forward64(q.detach(), k.detach(), v.detach(), causal, scale, cu_t)
        mask = visible(b, t, t, causal, cu_t)
        live = mask.any(-1)  # [B, 1, T]: rows that see a key (not padding)
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        sel = live[..., None].expand_as(out)
        assert torch.allclose(out[sel], ref.detach()[sel], rtol=1e-12, atol=1e-12)
        assert torch.all(out[~sel] == 0) and torch.all(torch.isinf(lse[~live.expand_as(lse)]))
        # Autograd through a masked softmax that zeroes rows seeing nothing (padding).
        s = (scale * (q @ expand_kv(k, h).transpose(-1, -2))).masked_fill(~mask, -1e300)
        pa = torch.softmax(s, -1) * live[..., None]
        ref = pa @ expand_kv(v, h)
        assert torch.allclose(out, ref.detach(), rtol=1e-12, atol=1e-12)
        ref.backward(dout)
        got = backward64(q.detach(), k.detach(), v.detach(), out, dout, lse, causal, scale, cu_t)
        for g, want in zip(got, (q.grad, k.grad, v.grad)):
            assert torch.allclose(g, want, rtol=1e-10, atol=1e-12)


def generate(w, gen):
    # (tag, B, H, K, Tq, Tk, D, causal, cu_seqlens or None)
    variants = [
        ("gqa_k1_d32_causal", 1, 4, 1, 10, 10, 32, True, None),
        ("gqa_k2_d64_noncausal", 1, 4, 2, 5, 7, 64, False, None),
        ("gqa_k3_d40_tq_gt_tk_causal", 1, 6, 3, 6, 4, 40, True, None),
        # K = H; row 1: padding, a sequence of length 1, an empty one, padding at the end.
        ("varlen_kh_d16_causal", 2, 2, 2, 12, 12, 16, True, [[0, 5, 5, 12], [2, 3, 3, 9]]),
        ("varlen_k1_d64_noncausal", 1, 3, 1, 11, 11, 64, False, [[1, 4, 4, 5, 9]]),
        ("varlen_k1_d128_causal", 1, 2, 1, 7, 7, 128, True, [[0, 1, 5, 7]]),
    ]
    for dt, dtype in DTYPES.items():
        for tag, b, h, kh, tq, tk, d, causal, cu in variants:
            scale = f32_exact(1.0 / math.sqrt(d))
            cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
            q = randn(gen, (b, h, tq, d), dtype)
            k, v = randn(gen, (b, kh, tk, d), dtype), randn(gen, (b, kh, tk, d), dtype)
            out, lse = forward64(q.to(F64), k.to(F64), v.to(F64), causal, scale, cu_t)
            meta = {"causal": causal, "scale": scale}
            extra = {} if cu_t is None else {"cu_seqlens": cu_t}
            w.write(f"attention_forward_{dt}_{tag}", "attention_forward", meta, {
                "q": q, "k": k, "v": v, **extra,
                "expected_out": out.to(dtype), "expected_lse": lse.float()})
            out_s, lse_s = out.to(dtype), lse.float()
            dout = randn(gen, (b, h, tq, d), dtype)
            dq, dk, dv = backward64(q.to(F64), k.to(F64), v.to(F64), out_s.to(F64), dout.to(F64),
                                    lse_s.to(F64), causal, scale, cu_t)
            w.write(f"attention_backward_{dt}_{tag}", "attention_backward", meta, {
                "q": q, "k": k, "v": v, **extra, "out": out_s, "dout": dout, "lse": lse_s,
                "expected_dq": dq.to(dtype), "expected_dk": dk.to(dtype), "expected_dv": dv.to(dtype)})
