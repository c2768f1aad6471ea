"""Golden cases of the training-step ops (issue 13): encoder, GELU, residual add, fused softmax
cross-entropy, matmul + bias (+ GELU), bias gradient, residual + layer norm, attention on the
fused QKV layout, and the gradient-clipping grad_scale.

Called by gen.py. Same rules as there: every expected tensor is computed in float64 from the
tensors stored in the same case (already rounded to their dtype), then cast; the float64
definitions are asserted against torch (functional ops + autograd) before anything is written.
Which stored tensors each expected value comes from is listed per op in tools/golden/README.md
("Training-step ops").
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


# ---------------------------------------------------------------- encoder
def encoder_forward64(tokens, wte, wpe):
    t = tokens.shape[1]
    return wte[tokens.long()] + wpe[:t][None]


def encoder_backward64(tokens, dout, dwte, dwpe, accumulate):
    """dwte[v] (+)= sum of dout rows whose token is v; dwpe[t] (+)= sum over the batch."""
    c = dout.shape[-1]
    t = tokens.shape[1]
    gw = torch.zeros_like(dwte).index_add_(0, tokens.reshape(-1).long(), dout.reshape(-1, c))
    gp = torch.zeros_like(dwpe)
    gp[:t] = dout.sum(0)
    if accumulate:
        return dwte + gw, dwpe + gp
    return gw, gp


def check_encoder(gen):
    tokens = torch.tensor([[3, 1, 3, 0], [3, 3, 2, 1]], dtype=I32)
    wte = torch.randn(5, 6, generator=gen, dtype=F64, requires_grad=True)
    wpe = torch.randn(7, 6, generator=gen, dtype=F64, requires_grad=True)
    out = F.embedding(tokens.long(), wte) + wpe[:4][None]
    close(encoder_forward64(tokens, wte.detach(), wpe.detach()), out.detach())
    dout = torch.randn(2, 4, 6, generator=gen, dtype=F64)
    out.backward(dout)
    z = torch.zeros(5, 6, dtype=F64), torch.zeros(7, 6, dtype=F64)
    gw, gp = encoder_backward64(tokens, dout, z[0], z[1], False)
    close(gw, wte.grad)
    close(gp, wpe.grad)


def gen_encoder(w, gen):
    # (tag, B, T, C, V, P, token pattern)
    variants = [
        ("odd", 2, 5, 7, 11, 9, "random"),
        ("repeats", 3, 4, 33, 6, 4, "repeats"),
        ("t1", 1, 1, 16, 3, 2, "random"),
    ]
    for dt, dtype in g.DTYPES.items():
        for tag, b, t, c, v, p, pattern in variants:
            if pattern == "repeats":
                tokens = torch.tensor([[2, 2, 2, 5], [0, 2, 5, 2], [2, 0, 0, 2]], dtype=I32)
            else:
                tokens = torch.randint(0, v, (b, t), generator=gen, dtype=torch.int64).to(I32)
            wte, wpe = g.randn(gen, (v, c), dtype), g.randn(gen, (p, c), dtype)
            out = encoder_forward64(tokens, wte.to(F64), wpe.to(F64))
            w.write(f"encoder_forward_{dt}_{tag}", "encoder_forward", {}, {
                "tokens": tokens, "wte": wte, "wpe": wpe, "expected_out": out.to(dtype)})
            for accumulate in (False, True):
                dout = g.randn(gen, (b, t, c), dtype)
                dwte, dwpe = g.randn(gen, (v, c), dtype), g.randn(gen, (p, c), dtype)
                gw, gp = encoder_backward64(tokens, dout.to(F64), dwte.to(F64), dwpe.to(F64), accumulate)
                name = f"encoder_backward_{dt}_{tag}" + ("_acc" if accumulate else "")
                w.write(name, "encoder_backward", {"accumulate": accumulate}, {
                    "tokens": tokens, "dout": dout, "dwte": dwte, "dwpe": dwpe,
                    "expected_dwte": gw.to(dtype), "expected_dwpe": gp.to(dtype)})


# ---------------------------------------------------------------- gelu, residual add
def gelu64(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def gelu_grad64(x):
    k = math.sqrt(2.0 / math.pi)
    th = torch.tanh(k * (x + 0.044715 * x ** 3))
    return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x)


def check_gelu(gen):
    x = (3.0 * torch.randn(200, generator=gen, dtype=F64)).requires_grad_(True)
    y = F.gelu(x, approximate="tanh")
    close(gelu64(x.detach()), y.detach(), 1e-14, 1e-15)
    dy = torch.randn(200, generator=gen, dtype=F64)
    y.backward(dy)
    close(dy * gelu_grad64(x.detach()), x.grad, 1e-12, 1e-14)


def gen_elementwise(w, gen):
    for dt, dtype in g.DTYPES.items():
        for tag, n in (("n1", 1), ("odd", 1031)):
            x = (3.0 * torch.randn(n, generator=gen, dtype=F64)).to(dtype)
            w.write(f"gelu_forward_{dt}_{tag}", "gelu_forward", {}, {
                "x": x, "expected_out": gelu64(x.to(F64)).to(dtype)})
            dout = g.randn(gen, (n,), dtype)
            w.write(f"gelu_backward_{dt}_{tag}", "gelu_backward", {}, {
                "x": x, "dout": dout, "expected_dx": (dout.to(F64) * gelu_grad64(x.to(F64))).to(dtype)})
            a, b = g.randn(gen, (n,), dtype), g.randn(gen, (n,), dtype)
            w.write(f"residual_add_{dt}_{tag}", "residual_add", {}, {
                "a": a, "b": b, "expected_out": (a.to(F64) + b.to(F64)).to(dtype)})


# ---------------------------------------------------------------- cross-entropy
def crossentropy64(logits, targets, vocab, dloss):
    """Per-row loss, mean over counted rows, dlogits [N, Vp] (padding and ignored rows 0)."""
    x = logits[:, :vocab]
    keep = targets != IGNORE
    safe = torch.where(keep, targets, torch.zeros_like(targets)).long()
    lse = torch.logsumexp(x, -1)
    rows = torch.where(keep, lse - x.gather(1, safe[:, None])[:, 0], torch.zeros_like(lse))
    n = int(keep.sum())
    mean = rows.sum() / n if n else torch.tensor(math.nan, dtype=F64)
    d = None
    if dloss is not None:
        p = torch.exp(x - lse[:, None])
        p = p - F.one_hot(safe, vocab).to(F64)
        d = torch.zeros_like(logits)
        d[:, :vocab] = torch.where(keep[:, None], p * (dloss / n if n else 0.0), torch.zeros_like(p))
    return rows, mean, d


def check_crossentropy(gen):
    for n_rows, vocab, targets in ((6, 9, [1, -100, 8, 0, 8, -100]), (3, 4, [-100] * 3)):
        x = torch.randn(n_rows, vocab + 3, generator=gen, dtype=F64)
        x[0, :vocab] *= 1e4
        x = x.requires_grad_(True)
        t = torch.tensor(targets)
        loss = F.cross_entropy(x[:, :vocab], t, ignore_index=IGNORE)
        per_row = F.cross_entropy(x[:, :vocab].detach(), t, ignore_index=IGNORE, reduction="none")
        rows, mean, d = crossentropy64(x.detach(), t.to(I32), vocab, 0.75)
        close(rows, per_row, 1e-12, 1e-9)
        close(mean, loss.detach(), 1e-12, 1e-9)
        loss.backward(torch.tensor(0.75, dtype=F64))
        close(d, x.grad, 1e-12, 1e-14)


def gen_crossentropy(w, gen):
    # (tag, N, V, Vp, logit scale, target pattern, dloss)
    variants = [
        ("odd", 7, 37, 37, 2.0, "mixed", 1.0),
        ("padded", 5, 50, 64, 2.0, "random", 0.25),
        ("huge", 4, 33, 33, 1e4, "random", 1.0),
        ("all_ignored", 3, 17, 20, 1.0, "ignored", 1.0),
        ("forward_only", 5, 29, 29, 1.0, "mixed", None),
        ("row1", 1, 1, 1, 1.0, "random", 2.0),
    ]
    for dt, dtype in g.DTYPES.items():
        for tag, n, v, vp, scale, pattern, dloss in variants:
            logits = (scale * torch.randn(n, vp, generator=gen, dtype=F64)).clamp(-1e4, 1e4).to(dtype)
            if tag == "huge":
                # ±1e4 mixed with O(1) logits: exp overflows without the max shift.
                logits[1, :] = torch.randn(vp, generator=gen, dtype=F64).to(dtype)
                logits[1, 3] = 1e4
                logits[2, :] = -1e4
            targets = torch.randint(0, v, (n,), generator=gen, dtype=torch.int64).to(I32)
            if pattern == "mixed":
                targets[1::3] = IGNORE
            elif pattern == "ignored":
                targets[:] = IGNORE
            if tag == "huge":
                targets[0] = int(logits[0, :v].to(F64).argmin())  # loss ≈ 2e4
            rows, mean, d = crossentropy64(logits.to(F64), targets, v, dloss)
            tensors = {"logits": logits, "targets": targets, "expected_losses": rows.float(),
                       "expected_loss": mean.reshape(1).float()}
            meta = {"vocab": v}
            if dloss is not None:
                meta["dloss"] = dloss
                tensors["expected_dlogits"] = d.to(dtype)
            w.write(f"crossentropy_{dt}_{tag}", "crossentropy", meta, tensors)
    # One GPT-2-wide row (V = 50257 padded to 50304), f32 only (the committed data stays small).
    logits = (3.0 * torch.randn(1, 50304, generator=gen, dtype=F64)).float()
    targets = torch.tensor([50256], dtype=I32)
    rows, mean, d = crossentropy64(logits.to(F64), targets, 50257, 1.0)
    w.write("crossentropy_f32_gpt2_row", "crossentropy", {"vocab": 50257, "dloss": 1.0}, {
        "logits": logits, "targets": targets, "expected_losses": rows.float(),
        "expected_loss": mean.reshape(1).float(), "expected_dlogits": d.float()})


# ---------------------------------------------------------------- matmul + bias, bias gradient
def check_bias(gen):
    a = torch.randn(5, 7, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(7, 3, generator=gen, dtype=F64)
    bias = torch.randn(3, generator=gen, dtype=F64, requires_grad=True)
    y = F.gelu(torch.addmm(bias, a, b), approximate="tanh")
    close(gelu64(a.detach() @ b + bias.detach()), y.detach())
    dy = torch.randn(5, 3, generator=gen, dtype=F64)
    y.backward(dy)
    # The bias gradient of the linear layer is the column sum of its output gradient.
    pre_grad = dy * gelu_grad64(a.detach() @ b + bias.detach())
    close(pre_grad.sum(0), bias.grad)


def gen_bias(w, gen):
    # (tag, batch, m, n, k, trans_a, trans_b, gelu)
    variants = [
        ("odd", 0, 7, 13, 9, False, False, False),
        ("gelu_tb", 0, 5, 11, 17, False, True, True),
        ("gelu_batch_ta", 2, 3, 6, 5, True, False, True),
    ]
    for dt, dtype in g.DTYPES.items():
        for tag, batch, m, n, k, ta, tb, gelu in variants:
            lead = (batch,) if batch else ()
            a = g.randn(gen, lead + ((k, m) if ta else (m, k)), dtype)
            b = g.randn(gen, lead + ((n, k) if tb else (k, n)), dtype)
            bias = g.randn(gen, (n,), dtype)
            a64, b64 = a.to(F64), b.to(F64)
            a64 = a64.transpose(-1, -2) if ta else a64
            b64 = b64.transpose(-1, -2) if tb else b64
            pre = a64 @ b64 + bias.to(F64)
            tensors = {"a": a, "b": b, "bias": bias}
            if gelu:
                tensors["expected_out"] = gelu64(pre).to(dtype)
                tensors["expected_pre_gelu"] = pre.to(dtype)
            else:
                tensors["expected_out"] = pre.to(dtype)
            w.write(f"matmul_bias_{dt}_{tag}", "matmul_bias", {"trans_a": ta, "trans_b": tb, "gelu": gelu}, tensors)
        for tag, rows, cols, accumulate in (("odd", 37, 19, False), ("acc", 9, 130, True), ("rows1", 1, 5, False)):
            dout = g.randn(gen, (rows, cols), dtype)
            dbias = g.randn(gen, (cols,), dtype)
            want = dout.to(F64).sum(0) + (dbias.to(F64) if accumulate else 0.0)
            w.write(f"bias_backward_{dt}_{tag}", "bias_backward", {"accumulate": accumulate}, {
                "dout": dout, "dbias": dbias, "expected_dbias": want.to(dtype)})


# ---------------------------------------------------------------- residual + layer norm
def check_residual_layernorm(gen):
    a = torch.randn(4, 10, generator=gen, dtype=F64)
    b = torch.randn(4, 10, generator=gen, dtype=F64)
    wt = torch.randn(10, generator=gen, dtype=F64)
    bs = torch.randn(10, generator=gen, dtype=F64)
    y = F.layer_norm(a + b, (10,), wt, bs, 1e-5)
    mean, rstd = g.ln_stats(a + b, 1e-5)
    close((a + b - mean[:, None]) * rstd[:, None] * wt + bs, y)


def gen_residual_layernorm(w, gen):
    for dt, dtype in g.DTYPES.items():
        for tag, n, c, eps in (("odd", 5, 37, 1e-5), ("c1", 3, 1, 1e-5), ("wide", 2, 768, 1e-6)):
            a, b = g.randn(gen, (n, c), dtype), g.randn(gen, (n, c), dtype)
            weight = (1.0 + 0.5 * torch.randn(c, generator=gen, dtype=F64)).to(dtype)
            bias = g.randn(gen, (c,), dtype)
            x = (a.to(F64) + b.to(F64)).to(dtype)  # the stored residual
            mean, rstd = g.ln_stats(x.to(F64), eps)
            y = (x.to(F64) - mean[:, None]) * rstd[:, None] * weight.to(F64) + bias.to(F64)
            w.write(f"residual_layernorm_forward_{dt}_{tag}", "residual_layernorm_forward", {"eps": eps}, {
                "a": a, "b": b, "weight": weight, "bias": bias, "expected_residual": x,
                "expected_y": y.to(dtype), "expected_mean": mean.float(), "expected_rstd": rstd.float()})


# ---------------------------------------------------------------- attention on the QKV layout
def split_qkv(qkv, layout):
    """q, k, v as [B, H, T, D] views of the stored qkv ([B, T, 3, H, D] or packed [3, B, H, T, D])."""
    if layout == "bt3hd":
        return tuple(qkv[:, :, i].permute(0, 2, 1, 3) for i in range(3))
    return qkv[0], qkv[1], qkv[2]


def to_out_layout(x, layout):
    """[B, H, T, D] to the output layout ([B, T, H, D] with the fused QKV, else packed)."""
    return x.permute(0, 2, 1, 3) if layout == "bt3hd" else x


def from_out_layout(x, layout):
    return x.permute(0, 2, 1, 3) if layout == "bt3hd" else x


def join_grads(dq, dk, dv, layout):
    if layout == "bt3hd":
        return torch.stack([t.permute(0, 2, 1, 3) for t in (dq, dk, dv)], 2)
    return torch.stack([dq, dk, dv], 0)


def check_attention_strided(gen):
    b, t, h, d, scale = 2, 6, 3, 8, 0.25
    qkv = torch.randn(b, t, 3, h, d, generator=gen, dtype=F64, requires_grad=True)
    q, k, v = split_qkv(qkv, "bt3hd")
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    out, lse = g.attn_forward64(q.detach(), k.detach(), v.detach(), True, scale)
    close(out, ref.detach())
    dout = torch.randn(b, t, h, d, generator=gen, dtype=F64)
    to_out_layout(ref, "bt3hd").backward(dout)
    grads = g.attn_backward64(q.detach(), k.detach(), v.detach(), out, from_out_layout(dout, "bt3hd"), lse, True, scale)
    close(join_grads(*grads, "bt3hd"), qkv.grad, 1e-10, 1e-12)


def gen_attention_strided(w, gen):
    # (tag, layout, B, T, H, D, causal)
    variants = [
        ("bt3hd_causal", "bt3hd", 2, 7, 3, 16, True),
        ("bt3hd_noncausal_d64", "bt3hd", 1, 5, 2, 64, False),
        ("packed_causal", "packed", 1, 9, 2, 32, True),
    ]
    for dt, dtype in g.DTYPES.items():
        for tag, layout, b, t, h, d, causal in variants:
            scale = g.f32_exact(1.0 / math.sqrt(d))
            shape = (b, t, 3, h, d) if layout == "bt3hd" else (3, b, h, t, d)
            qkv = g.randn(gen, shape, dtype)
            q, k, v = (x.to(F64) for x in split_qkv(qkv, layout))
            out, lse = g.attn_forward64(q, k, v, causal, scale)
            meta = {"causal": causal, "scale": scale, "layout": layout}
            out_s, lse_s = to_out_layout(out, layout).to(dtype), lse.float()
            w.write(f"attention_forward_strided_{dt}_{tag}", "attention_forward_strided", meta, {
                "qkv": qkv, "expected_out": out_s, "expected_lse": lse_s})
            dout = g.randn(gen, tuple(out_s.shape), dtype)
            grads = g.attn_backward64(q, k, v, from_out_layout(out_s.to(F64), layout),
                                      from_out_layout(dout.to(F64), layout), lse_s.to(F64), causal, scale)
            w.write(f"attention_backward_strided_{dt}_{tag}", "attention_backward_strided", meta, {
                "qkv": qkv, "out": out_s, "dout": dout, "lse": lse_s,
                "expected_dqkv": join_grads(*grads, layout).to(dtype)})


# ---------------------------------------------------------------- clipping
def clip_grad_scale64(norm, max_norm, loss_scale):
    coef = min(1.0, max_norm / (norm / loss_scale + 1e-6))
    return coef, loss_scale / coef


def check_clip(gen):
    for max_norm in (0.5, 100.0):
        grads = [torch.randn(17, generator=gen, dtype=F64), torch.randn(5, 3, generator=gen, dtype=F64)]
        params = [torch.zeros_like(x, requires_grad=True) for x in grads]
        for p, gr in zip(params, grads):
            p.grad = gr.clone()
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        coef, _ = clip_grad_scale64(float(norm), max_norm, 1.0)
        for p, gr in zip(params, grads):
            close(p.grad, gr * coef)


def gen_clip(w, gen):
    for tag, norm, max_norm, loss_scale in (("clips", 7.25, 1.0, 1.0), ("no_clip", 0.5, 1.0, 1.0),
                                            ("loss_scale", 65536.0 * 3.5, 2.0, 65536.0)):
        coef, scale = clip_grad_scale64(g.f32_exact(norm), max_norm, loss_scale)
        w.write(f"clip_f32_{tag}", "clip", {"max_norm": max_norm, "loss_scale": loss_scale}, {
            "norm": torch.tensor([norm], dtype=torch.float32),
            "expected_coefficient": torch.tensor([coef], dtype=torch.float32),
            "expected_grad_scale": torch.tensor([scale], dtype=torch.float32)})


def check_definitions(gen):
    check_encoder(gen)
    check_gelu(gen)
    check_crossentropy(gen)
    check_bias(gen)
    check_residual_layernorm(gen)
    check_attention_strided(gen)
    check_clip(gen)


def generate(w, gen):
    gen_encoder(w, gen)
    gen_elementwise(w, gen)
    gen_crossentropy(w, gen)
    gen_bias(w, gen)
    gen_residual_layernorm(w, gen)
    gen_attention_strided(w, gen)
    gen_clip(w, gen)
