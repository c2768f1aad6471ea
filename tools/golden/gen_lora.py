"""Golden cases of the LoRA adapter's skinny GEMMs (issue 35): `lora_forward` (u = x·Aᵀ,
y += s·u·Bᵀ) and `lora_backward` (du = s·dy·B, dB (+)= s·dyᵀ·u, dA (+)= duᵀ·x, dx += du·A).

Called by gen.py. Same rules as there: every expected tensor is computed in float64 from the
tensors stored in the same case (already rounded to their dtype), then cast; `u` and `du` are
rounded to the case dtype before the products that use them (the op stores them). The float64
definitions are asserted against torch autograd of `x @ W.T + s * (x @ A.T) @ B.T` first.
Cases per op: README.md ("LoRA skinny GEMMs").
"""
import torch

import gen as g

F64 = torch.float64


def forward64(x, a, b, y, s, dtype):
    u = (x @ a.T).to(dtype)
    return u, y + s * (u.to(F64) @ b.T)


def backward64(x, dy, a, b, u, da, db, dx, s, accumulate, dtype):
    du = (s * (dy @ b)).to(dtype)
    du64 = du.to(F64)
    keep = 1.0 if accumulate else 0.0
    db_new = keep * db + s * (dy.T @ u)
    da_new = keep * da + du64.T @ x
    dx_new = dx + du64 @ a
    return du, da_new, db_new, dx_new


def check_definitions(gen):
    n, i, o, r, s = 6, 5, 7, 3, 0.75
    x = torch.randn(n, i, generator=gen, dtype=F64, requires_grad=True)
    w = torch.randn(o, i, generator=gen, dtype=F64)
    a = torch.randn(r, i, generator=gen, dtype=F64, requires_grad=True)
    b = torch.randn(o, r, generator=gen, dtype=F64, requires_grad=True)
    dy = torch.randn(n, o, generator=gen, dtype=F64)
    y = x @ w.T + s * (x @ a.T) @ b.T
    y.backward(dy)
    base = (x @ w.T).detach()
    u, ours = forward64(x.detach(), a.detach(), b.detach(), base, s, F64)
    assert torch.allclose(ours, y.detach(), rtol=1e-12, atol=1e-12)
    zr, zo = torch.zeros(r, i, dtype=F64), torch.zeros(o, r, dtype=F64)
    du, da, db, dx = backward64(x.detach(), dy, a.detach(), b.detach(), u, zr, zo, dy @ w, s, False, F64)
    assert torch.allclose(da, a.grad, rtol=1e-10, atol=1e-12)
    assert torch.allclose(db, b.grad, rtol=1e-10, atol=1e-12)
    assert torch.allclose(dx, x.grad, rtol=1e-10, atol=1e-12)


# (rows, d_in, d_out, rank, scale): odd sizes and partial blocks; d_out past one 256-column
# block; rows past one 256-row block of lora_down; every rank class (8, 16, 32, 64); long rows
# with a narrow target so that lora_gradw splits the rows into groups (f32 only, to keep the
# files small; the device tests split f16 rows too).
SHAPES = {
    "r4_odd": (37, 19, 23, 4, 2.0),
    "r8_wide": (2, 10, 260, 8, 0.5),
    "r9_tall": (260, 3, 2, 9, 1.5),
    "r20": (17, 24, 33, 20, 0.25),
    "r64": (3, 16, 5, 64, 0.125),
    "r4_long": (520, 2, 2, 4, 1.0),
}


def generate(w, gen):
    for dt, dtype in g.DTYPES.items():
        for tag, (n, i, o, r, s) in SHAPES.items():
            if tag == "r4_long" and dt != "f32":  # 4 row groups in f32; the device tests split f16
                continue
            x, a, b = g.randn(gen, (n, i), dtype), g.randn(gen, (r, i), dtype), g.randn(gen, (o, r), dtype)
            y = g.randn(gen, (n, o), dtype)
            u, y_new = forward64(x.to(F64), a.to(F64), b.to(F64), y.to(F64), s, dtype)
            if tag != "r4_long":  # long rows matter to the backward's row groups only
                w.write(f"lora_forward_{dt}_{tag}", "lora_forward", {"scale": s}, {
                    "x": x, "a": a, "b": b, "y": y, "expected_u": u, "expected_y": y_new.to(dtype)})
            accumulate = tag in ("r4_odd", "r20", "r4_long")
            dy = g.randn(gen, (n, o), dtype)
            da, db, dx = g.randn(gen, (r, i), dtype), g.randn(gen, (o, r), dtype), g.randn(gen, (n, i), dtype)
            du, da_new, db_new, dx_new = backward64(
                x.to(F64), dy.to(F64), a.to(F64), b.to(F64), u.to(F64), da.to(F64), db.to(F64),
                dx.to(F64), s, accumulate, dtype)
            w.write(f"lora_backward_{dt}_{tag}", "lora_backward", {"scale": s, "accumulate": accumulate}, {
                "x": x, "dy": dy, "a": a, "b": b, "u": u, "da": da, "db": db, "dx": dx,
                "expected_du": du, "expected_da": da_new.to(dtype), "expected_db": db_new.to(dtype),
                "expected_dx": dx_new.to(dtype)})
