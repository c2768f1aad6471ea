"""Golden cases of the LLaMA-family ops (issue 31): RMS norm (plain, fused with the residual add,
backward), rotary embedding (rotate_half and interleaved pairs, partial rotary, llama3
frequencies, packed positions that restart at 0) and SwiGLU (separate and fused gate-up).

Called by gen.py. Same rules as there: every expected tensor is computed in float64 from the
tensors stored in the same case (already rounded to their dtype), then cast; the float64
definitions are asserted against torch and transformers before anything is written:
F.rms_norm + autograd, transformers' llama and glm `apply_rotary_pos_emb` and
`ROPE_INIT_FUNCTIONS['llama3']`, F.silu + autograd. Cases per op: README.md ("LLaMA-family ops").
"""
import math

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.glm.modeling_glm import apply_rotary_pos_emb as glm_apply_rotary
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply_rotary

import gen as g

F64 = torch.float64
I32 = torch.int32


def close(got, want, rtol=1e-12, atol=1e-12):
    assert torch.allclose(got, want, rtol=rtol, atol=atol), (got - want).abs().max()


# ---------------------------------------------------------------- rmsnorm
def rms64(x, w, eps):
    rstd = 1.0 / torch.sqrt((x * x).mean(-1) + eps)
    return x * rstd[:, None] * w, rstd


def rms_backward64(x, w, dy, rstd):
    xh = x * rstd[:, None]
    gw = dy * w
    dx = rstd[:, None] * (gw - xh * (gw * xh).mean(-1, keepdim=True))
    return dx, (dy * xh).sum(0)


def check_rmsnorm(gen):
    x = torch.randn(5, 12, generator=gen, dtype=F64, requires_grad=True)
    w = torch.randn(12, generator=gen, dtype=F64, requires_grad=True)
    dy = torch.randn(5, 12, generator=gen, dtype=F64)
    y = F.rms_norm(x, (12,), w, 1e-6)
    ours, rstd = rms64(x.detach(), w.detach(), 1e-6)
    close(ours, y.detach())
    y.backward(dy)
    dx, dw = rms_backward64(x.detach(), w.detach(), dy, rstd)
    close(dx, x.grad, rtol=1e-10)
    close(dw, w.grad, rtol=1e-10)


def gen_rmsnorm(w, gen):
    shapes = {"rows1": (1, 64), "c1": (5, 1), "odd": (7, 33), "wide": (3, 768)}
    for dt, dtype in g.DTYPES.items():
        for tag, (n, c) in shapes.items():
            eps = 1e-6 if tag != "odd" else 1e-5
            x = g.randn(gen, (n, c), dtype)
            weight = (1.0 + 0.5 * torch.randn(c, generator=gen, dtype=F64)).to(dtype)
            y, rstd = rms64(x.to(F64), weight.to(F64), eps)
            w.write(f"rmsnorm_forward_{dt}_{tag}", "rmsnorm_forward", {"eps": eps}, {
                "x": x, "weight": weight, "expected_y": y.to(dtype), "expected_rstd": rstd.float()})
            # Backward from the stored f32 rstd.
            dy = g.randn(gen, (n, c), dtype)
            rstd32 = rstd.float()
            dx, dwt = rms_backward64(x.to(F64), weight.to(F64), dy.to(F64), rstd32.to(F64))
            w.write(f"rmsnorm_backward_{dt}_{tag}", "rmsnorm_backward", {"eps": eps}, {
                "x": x, "weight": weight, "dy": dy, "rstd": rstd32,
                "expected_dx": dx.to(dtype), "expected_dweight": dwt.to(dtype)})
            if tag == "rows1":
                continue
            a, b = g.randn(gen, (n, c), dtype), g.randn(gen, (n, c), dtype)
            res = (a.to(F64) + b.to(F64)).to(dtype)  # rounded once, then normalised as stored
            y, rstd = rms64(res.to(F64), weight.to(F64), eps)
            w.write(f"residual_rmsnorm_forward_{dt}_{tag}", "residual_rmsnorm_forward", {"eps": eps}, {
                "a": a, "b": b, "weight": weight, "expected_residual": res,
                "expected_y": y.to(dtype), "expected_rstd": rstd.float()})


# ---------------------------------------------------------------- rope
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def freqs64(theta, rdim, llama3):
    """f_i = theta^(-2i/R), then transformers' llama3 rescaling, in float64."""
    f = 1.0 / theta ** (torch.arange(0, rdim, 2, dtype=F64) / rdim)
    if llama3 is None:
        return f
    factor, low, high = llama3["factor"], llama3["low_freq_factor"], llama3["high_freq_factor"]
    old = llama3["original_max_position_embeddings"]
    wavelen = 2 * math.pi / f
    scaled = torch.where(wavelen > old / low, f / factor, f)
    s = (old / wavelen - low) / (high - low)
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return torch.where(medium, (1 - s) * scaled / factor + s * scaled, scaled)


def rope64(x, pos, freqs, rdim, interleaved, sign):
    """x [B, T, H, D] float64, pos [B, T], freqs [R/2] float64 -> rotated copy."""
    a = sign * pos.to(F64)[..., None] * freqs  # [B, T, R/2]
    c, s = torch.cos(a)[:, :, None, :], torch.sin(a)[:, :, None, :]
    out = x.clone()
    if interleaved:
        x1, x2 = x[..., 0:rdim:2], x[..., 1:rdim:2]
        out[..., 0:rdim:2] = x1 * c - x2 * s
        out[..., 1:rdim:2] = x2 * c + x1 * s
    else:
        h = rdim // 2
        x1, x2 = x[..., :h], x[..., h:rdim]
        out[..., :h] = x1 * c - x2 * s
        out[..., h:rdim] = x2 * c + x1 * s
    return out


def check_rope(gen):
    # Frequencies: transformers computes in float32; ours (float64) must round to the same table
    # within an ulp or two.
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=2, max_position_embeddings=131072,
                      rope_theta=500000.0,
                      rope_scaling={"rope_type": "llama3", **LLAMA3})
    hf, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    close(freqs64(500000.0, 128, LLAMA3).float().to(F64), hf.to(F64), rtol=1e-6, atol=0)
    # rotate_half (llama): cos/sin as LlamaRotaryEmbedding builds them, [B, T, D].
    b, t, hq, d = 2, 5, 3, 16
    pos = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]])
    f = freqs64(10000.0, d, None)
    emb = torch.cat([pos[..., None].to(F64) * f] * 2, dim=-1)
    q = torch.randn(b, t, hq, d, generator=gen, dtype=F64, requires_grad=True)
    k = torch.randn(b, t, 1, d, generator=gen, dtype=F64)
    qe, ke = llama_apply_rotary(q, k, emb.cos(), emb.sin(), unsqueeze_dim=2)
    close(rope64(q.detach(), pos, f, d, False, 1.0), qe.detach())
    close(rope64(k, pos, f, d, False, 1.0), ke)
    # Backward: the rotation by the opposite angle.
    dq = torch.randn(b, t, hq, d, generator=gen, dtype=F64)
    qe.backward(dq)
    close(rope64(dq, pos, f, d, False, -1.0), q.grad)
    # Interleaved partial rotary (glm): cos/sin over the R rotated dims.
    r = 8
    f = freqs64(10000.0, r, None)
    emb = torch.cat([pos[..., None].to(F64) * f] * 2, dim=-1)
    q = torch.randn(b, t, hq, d, generator=gen, dtype=F64, requires_grad=True)
    qe, _ = glm_apply_rotary(q, k, emb.cos(), emb.sin(), unsqueeze_dim=2)
    close(rope64(q.detach(), pos, f, r, True, 1.0), qe.detach())
    qe.backward(dq)
    close(rope64(dq, pos, f, r, True, -1.0), q.grad)


def gen_rope(w, gen):
    # (tag, B, T, H, D, R, interleaved, theta, llama3, positions)
    packed = [[0, 1, 2, 0, 1, 2, 3]]
    variants = [
        ("llama_d64", 2, 4, 3, 64, 64, False, 10000.0, None, [[0, 1, 2, 3], [5, 6, 7, 8]]),
        ("llama3_d128_far", 1, 4, 2, 128, 128, False, 500000.0, LLAMA3, [[0, 1, 4095, 131071]]),
        ("glm_partial_interleaved", 1, 7, 2, 32, 16, True, 10000.0, None, packed),
        ("odd_pairs", 1, 7, 2, 10, 6, False, 10000.0, None, packed),
        ("d256", 1, 2, 1, 256, 256, False, 1000000.0, None, [[3, 1000]]),
    ]
    for dt, dtype in g.DTYPES.items():
        for tag, b, t, h, d, r, inter, theta, llama3, pos in variants:
            pos = torch.tensor(pos, dtype=I32)
            table = freqs64(theta, r, llama3).float()
            meta = {"theta": theta, "rotary_dim": r, "interleaved": inter,
                    "rope_type": "llama3" if llama3 else "default"}
            if llama3:
                meta.update({k: float(v) for k, v in llama3.items()})
            for op, sign in (("rope_forward", 1.0), ("rope_backward", -1.0)):
                if op == "rope_backward" and tag in ("d256", "odd_pairs"):
                    continue
                x = g.randn(gen, (b, t, h, d), dtype)
                out = rope64(x.to(F64), pos, table.to(F64), r, inter, sign)
                w.write(f"{op}_{dt}_{tag}", op, meta, {
                    "x": x, "positions": pos, "expected_x": out.to(dtype), "expected_freqs": table})


# ---------------------------------------------------------------- swiglu
def swiglu64(gt, up):
    return gt * torch.sigmoid(gt) * up


def swiglu_backward64(gt, up, dh):
    s = torch.sigmoid(gt)
    return dh * up * s * (1 + gt * (1 - s)), dh * gt * s


def check_swiglu(gen):
    gt = torch.randn(4, 9, generator=gen, dtype=F64, requires_grad=True)
    up = torch.randn(4, 9, generator=gen, dtype=F64, requires_grad=True)
    h = F.silu(gt) * up
    close(swiglu64(gt.detach(), up.detach()), h.detach())
    dh = torch.randn(4, 9, generator=gen, dtype=F64)
    h.backward(dh)
    dg, du = swiglu_backward64(gt.detach(), up.detach(), dh)
    close(dg, gt.grad)
    close(du, up.grad)


def gen_swiglu(w, gen):
    # (tag, N, F, fused)
    variants = [("odd", 7, 13, False), ("fused", 5, 24, True), ("fused_odd", 3, 7, True),
                ("rows1", 1, 8, False)]
    for dt, dtype in g.DTYPES.items():
        for tag, n, f, fused in variants:
            gt = 3.0 * torch.randn(n, f, generator=gen, dtype=F64)
            gt[0, 0], gt[-1, -1] = 30.0, -30.0  # saturated sigmoid on both sides
            gt = gt.to(dtype)
            up = g.randn(gen, (n, f), dtype)
            dh = g.randn(gen, (n, f), dtype)
            h = swiglu64(gt.to(F64), up.to(F64))
            dg, du = swiglu_backward64(gt.to(F64), up.to(F64), dh.to(F64))
            if fused:
                inputs = {"gate_up": torch.cat([gt, up], dim=1)}
                grads = {"expected_dgate_up": torch.cat([dg, du], dim=1).to(dtype)}
            else:
                inputs = {"gate": gt, "up": up}
                grads = {"expected_dgate": dg.to(dtype), "expected_dup": du.to(dtype)}
            meta = {"fused": fused}
            w.write(f"swiglu_forward_{dt}_{tag}", "swiglu_forward", meta,
                    {**inputs, "expected_h": h.to(dtype)})
            w.write(f"swiglu_backward_{dt}_{tag}", "swiglu_backward", meta,
                    {**inputs, "dh": dh, **grads})


def check_definitions(gen):
    check_rmsnorm(gen)
    check_rope(gen)
    check_swiglu(gen)


def generate(w, gen):
    gen_rmsnorm(w, gen)
    gen_rope(w, gen)
    gen_swiglu(w, gen)
