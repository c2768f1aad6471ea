//! Attention on strided q/k/v/out: straight from the fused QKV projection `[B, T, 3, H, D]`,
//! output `[B, T, H, D]`, gradient into a fused `[B, T, 3, H, D]`. Packed `[B, H, T, D]` is one
//! case of the layouts. The CPU reference gathers into packed f64 copies and runs
//! [`exact::attention_forward`] / [`exact::attention_backward`]: no second copy of the math.
//! The device launchers ([`super::attention_forward_strided`],
//! [`super::attention_backward_strided`]) run `kernels/attention.hip`, whose kernels read every
//! tensor through these strides (the packed launchers pass packed strides); they ran on hip-emu
//! (the CPU emulation of a device), never on a GPU.

use super::{AttentionBackward, AttentionForward, AttentionParams};
use crate::cpu::exact;
use crate::params::{DeviceElement, Exact, Host, ShapeError, Space, TensorLen};

/// Where row `(b, h, t)` (its `head_dim` contiguous elements) of an attention tensor starts:
/// `offset + b·batch_stride + h·head_stride + t·seq_stride` (in elements).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionLayout {
    /// Start of row `(0, 0, 0)`.
    pub offset: usize,
    /// Elements between batches.
    pub batch_stride: usize,
    /// Elements between heads.
    pub head_stride: usize,
    /// Elements between positions.
    pub seq_stride: usize,
}

/// Which third of a fused QKV tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qkv {
    /// Queries (first).
    Q = 0,
    /// Keys (second).
    K = 1,
    /// Values (third).
    V = 2,
}

impl AttentionLayout {
    /// Packed `[batch, heads, seq, head_dim]` (the layout of [`super::attention_forward`]).
    pub const fn packed(heads: usize, seq: usize, head_dim: usize) -> Self {
        Self {
            offset: 0,
            batch_stride: heads * seq * head_dim,
            head_stride: seq * head_dim,
            seq_stride: head_dim,
        }
    }

    /// `[batch, seq, heads, head_dim]` (heads concatenated per position).
    pub const fn bthd(seq: usize, heads: usize, head_dim: usize) -> Self {
        Self {
            offset: 0,
            batch_stride: seq * heads * head_dim,
            head_stride: head_dim,
            seq_stride: heads * head_dim,
        }
    }

    /// One of q, k, v inside the fused projection `[batch, seq, 3, heads, head_dim]`.
    pub const fn fused_qkv(which: Qkv, seq: usize, heads: usize, head_dim: usize) -> Self {
        let hd = heads * head_dim;
        Self {
            offset: which as usize * hd,
            batch_stride: seq * 3 * hd,
            head_stride: head_dim,
            seq_stride: 3 * hd,
        }
    }

    /// One of q, k, v inside the fused projection of grouped-query attention
    /// `[batch, seq, heads + 2·kv_heads, head_dim]`: the `heads` query heads, then the `kv_heads`
    /// key heads, then the `kv_heads` value heads of each position (LLaMA's q, k, v projections
    /// fused into one GEMM). With `kv_heads = heads` it is [`Self::fused_qkv`].
    pub const fn fused_qkv_grouped(
        which: Qkv,
        seq: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
    ) -> Self {
        let offset = match which {
            Qkv::Q => 0,
            Qkv::K => heads * head_dim,
            Qkv::V => (heads + kv_heads) * head_dim,
        };
        let row = (heads + 2 * kv_heads) * head_dim;
        Self {
            offset,
            batch_stride: seq * row,
            head_stride: head_dim,
            seq_stride: row,
        }
    }

    /// Start of row `(b, h, t)` (no overflow once [`Self::validate`] has passed).
    pub fn row(&self, b: usize, h: usize, t: usize) -> usize {
        self.offset + b * self.batch_stride + h * self.head_stride + t * self.seq_stride
    }

    /// Check that every row of a `[batch, heads, seq, head_dim]` view lies inside a buffer of
    /// `len` elements (no index computation can overflow).
    pub fn validate(
        &self,
        op: &'static str,
        tensor: &'static str,
        [batch, heads, seq, head_dim]: [usize; 4],
        len: usize,
    ) -> Result<(), ShapeError> {
        if batch == 0 || heads == 0 || seq == 0 || head_dim == 0 {
            return Ok(());
        }
        let end = [
            (batch - 1, self.batch_stride),
            (heads - 1, self.head_stride),
            (seq - 1, self.seq_stride),
        ]
        .iter()
        .try_fold(self.offset, |acc, &(i, s)| {
            i.checked_mul(s).and_then(|x| acc.checked_add(x))
        })
        .and_then(|last| last.checked_add(head_dim));
        match end {
            Some(end) if end <= len => Ok(()),
            _ => Err(ShapeError::Invalid {
                op,
                name: tensor,
                value: format!(
                    "a buffer of {len} elements with layout {self:?} for [{batch}, {heads}, {seq}, {head_dim}]"
                ),
                reason: "the view reaches past the end of the buffer; fix the strides or the buffer",
            }),
        }
    }
}

/// A read-only attention tensor: a buffer and where its rows are.
pub struct Strided<'a, S: Space, T: hip_rt::Element> {
    /// The buffer (may be shared with other views, e.g. the fused QKV projection).
    pub data: S::In<'a, T>,
    /// Row placement.
    pub layout: AttentionLayout,
}

/// [`AttentionForward`] with q, k, v read through their layouts and `out` written through
/// `out_layout` (elements of `out` outside it are untouched). `lse` stays packed `[B, H, tq]`.
pub struct AttentionForwardStrided<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions, mask and scale.
    pub params: AttentionParams,
    /// Queries `[batch, heads, tq, head_dim]` as a view.
    pub q: Strided<'a, S, T>,
    /// Keys `[batch, heads, tk, head_dim]` as a view.
    pub k: Strided<'a, S, T>,
    /// Values `[batch, heads, tk, head_dim]` as a view.
    pub v: Strided<'a, S, T>,
    /// Output buffer; only its rows under `out_layout` are written.
    pub out: S::Out<'a, T>,
    /// Placement of the output rows (must not overlap).
    pub out_layout: AttentionLayout,
    /// Packed `[batch, heads, tq]` log-sum-exp (f32, overwritten).
    pub lse: S::Out<'a, f32>,
    /// Variable-length sequences, as [`AttentionForward::cu_seqlens`].
    pub cu_seqlens: Option<S::In<'a, i32>>,
}

/// [`AttentionBackward`] with every input read through its layout and dq, dk, dv written into
/// `dqkv` through theirs (elements outside the three are untouched).
pub struct AttentionBackwardStrided<'a, S: Space, T: hip_rt::Element> {
    /// Dimensions, mask and scale.
    pub params: AttentionParams,
    /// Queries as a view.
    pub q: Strided<'a, S, T>,
    /// Keys as a view.
    pub k: Strided<'a, S, T>,
    /// Values as a view.
    pub v: Strided<'a, S, T>,
    /// The forward's output as a view.
    pub out: Strided<'a, S, T>,
    /// Gradient of the output as a view.
    pub dout: Strided<'a, S, T>,
    /// The forward's packed `[batch, heads, tq]` log-sum-exp.
    pub lse: S::In<'a, f32>,
    /// Gradient buffer holding dq, dk and dv (e.g. the fused `[B, T, 3, H, D]` gradient of the
    /// QKV projection); only the rows under the three layouts are written.
    pub dqkv: S::Out<'a, T>,
    /// Placement of dq rows in `dqkv`.
    pub dq: AttentionLayout,
    /// Placement of dk rows in `dqkv`.
    pub dk: AttentionLayout,
    /// Placement of dv rows in `dqkv`.
    pub dv: AttentionLayout,
    /// Variable-length sequences, as [`AttentionForward::cu_seqlens`].
    pub cu_seqlens: Option<S::In<'a, i32>>,
}

impl<S: Space, T: hip_rt::Element> AttentionForwardStrided<'_, S, T> {
    /// Check the params, `lse` and every layout against its buffer (in bounds); the output rows'
    /// disjointness is checked by the CPU reference (it needs the whole index set).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let (qd, kd) = (dims(p, p.tq), kv_dims(p, p.tk));
        let (ql, kl) = (p.q_len()?, p.kv_len()?);
        p.validate_qkv(ql, kl, kl, self.lse.numel())?;
        self.q.layout.validate(OP, "q", qd, self.q.data.numel())?;
        self.k.layout.validate(OP, "k", kd, self.k.data.numel())?;
        self.v.layout.validate(OP, "v", kd, self.v.data.numel())?;
        self.out_layout.validate(OP, "out", qd, self.out.numel())?;
        p.validate_cu_seqlens(self.cu_seqlens.as_ref().map(|c| c.numel()))?;
        Ok(())
    }
}

impl<S: Space, T: hip_rt::Element> AttentionBackwardStrided<'_, S, T> {
    /// Check the params, `lse` and every layout against its buffer (in bounds).
    pub fn validate(&self) -> Result<(), ShapeError> {
        let p = &self.params;
        let (qd, kd) = (dims(p, p.tq), kv_dims(p, p.tk));
        let (ql, kl) = (p.q_len()?, p.kv_len()?);
        p.validate_qkv(ql, kl, kl, self.lse.numel())?;
        for (name, view, d) in [
            ("q", &self.q, qd),
            ("k", &self.k, kd),
            ("v", &self.v, kd),
            ("out", &self.out, qd),
            ("dout", &self.dout, qd),
        ] {
            view.layout.validate(OP, name, d, view.data.numel())?;
        }
        let n = self.dqkv.numel();
        self.dq.validate(OP, "dq", qd, n)?;
        self.dk.validate(OP, "dk", kd, n)?;
        self.dv.validate(OP, "dv", kd, n)?;
        p.validate_cu_seqlens(self.cu_seqlens.as_ref().map(|c| c.numel()))?;
        Ok(())
    }
}

const OP: &str = "attention";

/// `[batch, heads, t, head_dim]` of q, out and their gradients.
fn dims(shape: &AttentionParams, t: usize) -> [usize; 4] {
    [shape.batch, shape.heads, t, shape.head_dim]
}

/// `[batch, n_kv_heads, t, head_dim]` of k, v and their gradients.
fn kv_dims(shape: &AttentionParams, t: usize) -> [usize; 4] {
    [shape.batch, shape.n_kv_heads, t, shape.head_dim]
}

/// Copy a validated view into a packed f64 `[batch, heads, t, head_dim]` vector.
fn gather<T: DeviceElement>(view: &Strided<'_, Host, T>, [b, h, t, d]: [usize; 4]) -> Vec<f64> {
    let mut out = Vec::with_capacity(b * h * t * d);
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let r = view.layout.row(bi, hi, ti);
                out.extend(view.data[r..r + d].iter().map(|x| x.to_f64()));
            }
        }
    }
    out
}

/// Round a packed f64 tensor once into the rows of a validated output layout.
fn scatter<T: DeviceElement>(
    src: &[f64],
    dst: &mut [T],
    layout: &AttentionLayout,
    [b, h, t, d]: [usize; 4],
) {
    let mut rows = src.chunks(d.max(1));
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                let r = layout.row(bi, hi, ti);
                if let Some(s) = rows.next() {
                    for (o, x) in dst[r..r + d].iter_mut().zip(s) {
                        *o = T::from_f64(*x);
                    }
                }
            }
        }
    }
}

/// Mark every element of the output views in `taken`; an element marked twice is an error
/// (two outputs would be written to one place).
fn claim(
    taken: &mut [bool],
    views: &[(&'static str, &AttentionLayout, [usize; 4])],
) -> Result<(), ShapeError> {
    for &(tensor, layout, [b, h, t, d]) in views {
        for bi in 0..b {
            for hi in 0..h {
                for ti in 0..t {
                    let r = layout.row(bi, hi, ti);
                    if let Some(pos) = taken[r..r + d].iter().position(|&x| x) {
                        return Err(ShapeError::Invalid {
                            op: OP,
                            name: tensor,
                            value: format!("{layout:?} (element {} written twice)", r + pos),
                            reason: "output rows overlap each other or another output; give each output row its own place",
                        });
                    }
                    taken[r..r + d].fill(true);
                }
            }
        }
    }
    Ok(())
}

/// [`AttentionForwardStrided`] on host slices: [`super::cpu::attention_forward`] on the views.
///
/// With [`AttentionLayout::fused_qkv`] for q/k/v (one shared buffer) and
/// [`AttentionLayout::bthd`] for `out`, this reads the QKV projection directly and writes the
/// input of the output projection. Every layout is checked (in bounds; output rows disjoint)
/// before anything is written.
pub fn attention_forward_strided<T: DeviceElement>(
    a: AttentionForwardStrided<'_, Host, T>,
) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    let (qd, kd) = (dims(&p, p.tq), kv_dims(&p, p.tk));
    claim(&mut vec![false; a.out.len()], &[("out", &a.out_layout, qd)])?;
    let mut o64 = vec![0.0; p.q_len()?];
    let mut l64 = vec![0.0; a.lse.len()];
    exact::attention_forward(AttentionForward::<Exact, f64> {
        params: p,
        q: &gather(&a.q, qd),
        k: &gather(&a.k, kd),
        v: &gather(&a.v, kd),
        out: &mut o64,
        lse: &mut l64,
        cu_seqlens: a.cu_seqlens.map(super::varlen::widen).as_deref(),
    })?;
    scatter(&o64, a.out, &a.out_layout, qd);
    for (l, x) in a.lse.iter_mut().zip(&l64) {
        *l = *x as f32;
    }
    Ok(())
}

/// [`AttentionBackwardStrided`] on host slices: [`super::cpu::attention_backward`] on the
/// views, the gradients scattered into `dqkv`.
///
/// With [`AttentionLayout::fused_qkv`] for the three gradients this writes the gradient of the
/// QKV projection `[B, T, 3, H, D]` directly; packed `[3, B, H, T, D]` (offsets 0, n, 2n of
/// [`AttentionLayout::packed`]) is another case. Every layout is checked (in bounds; the
/// gradient rows disjoint) before anything is written.
pub fn attention_backward_strided<T: DeviceElement>(
    a: AttentionBackwardStrided<'_, Host, T>,
) -> Result<(), ShapeError> {
    a.validate()?;
    let p = a.params;
    let (qd, kd) = (dims(&p, p.tq), kv_dims(&p, p.tk));
    let (ql, kl) = (p.q_len()?, p.kv_len()?);
    claim(
        &mut vec![false; a.dqkv.len()],
        &[("dq", &a.dq, qd), ("dk", &a.dk, kd), ("dv", &a.dv, kd)],
    )?;
    let (mut dq64, mut dk64, mut dv64) = (vec![0.0; ql], vec![0.0; kl], vec![0.0; kl]);
    let lse64: Vec<f64> = a.lse.iter().map(|&x| f64::from(x)).collect();
    exact::attention_backward(AttentionBackward::<Exact, f64> {
        params: p,
        q: &gather(&a.q, qd),
        k: &gather(&a.k, kd),
        v: &gather(&a.v, kd),
        out: &gather(&a.out, qd),
        dout: &gather(&a.dout, qd),
        lse: &lse64,
        dq: &mut dq64,
        dk: &mut dk64,
        dv: &mut dv64,
        cu_seqlens: a.cu_seqlens.map(super::varlen::widen).as_deref(),
    })?;
    scatter(&dq64, a.dqkv, &a.dq, qd);
    scatter(&dk64, a.dqkv, &a.dk, kd);
    scatter(&dv64, a.dqkv, &a.dv, kd);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{attention_backward, attention_forward};
    use crate::params::Host;

    fn view(data: &[f32], layout: AttentionLayout) -> Strided<'_, Host, f32> {
        Strided { data, layout }
    }

    fn shape() -> AttentionParams {
        AttentionParams {
            batch: 2,
            heads: 3,
            n_kv_heads: 3,
            tq: 5,
            tk: 5,
            head_dim: 4,
            causal: true,
            scale: 0.5,
        }
    }

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    /// Fused `[B, T, 3, H, D]` equals the packed entry points on the permuted tensors, bit for bit.
    #[test]
    fn fused_layout_matches_packed_entry_points() {
        let s = shape();
        let (b, h, t, d) = (s.batch, s.heads, s.tq, s.head_dim);
        let qkv = values(b * t * 3 * h * d, 7);
        let fused = |w| AttentionLayout::fused_qkv(w, t, h, d);
        let packed_of = |w| {
            let mut p = Vec::new();
            for bi in 0..b {
                for hi in 0..h {
                    for ti in 0..t {
                        let r = fused(w).row(bi, hi, ti);
                        p.extend_from_slice(&qkv[r..r + d]);
                    }
                }
            }
            p
        };
        let (q, k, v) = (packed_of(Qkv::Q), packed_of(Qkv::K), packed_of(Qkv::V));
        let n = b * h * t * d;
        let (mut out_p, mut lse_p) = (vec![0.0f32; n], vec![0.0f32; b * h * t]);
        attention_forward(AttentionForward::<Host, f32> {
            params: s,
            q: &q,
            k: &k,
            v: &v,
            out: &mut out_p,
            lse: &mut lse_p,
            cu_seqlens: None,
        })
        .unwrap();
        let lay = fused;
        let (mut out_s, mut lse_s) = (vec![9.0f32; n], vec![0.0f32; b * h * t]);
        let bthd = AttentionLayout::bthd(t, h, d);
        attention_forward_strided(AttentionForwardStrided {
            params: s,
            q: view(&qkv, lay(Qkv::Q)),
            k: view(&qkv, lay(Qkv::K)),
            v: view(&qkv, lay(Qkv::V)),
            out: &mut out_s,
            out_layout: bthd,
            lse: &mut lse_s,
            cu_seqlens: None,
        })
        .unwrap();
        assert_eq!(lse_s, lse_p);
        for bi in 0..b {
            for hi in 0..h {
                for ti in 0..t {
                    let p = AttentionLayout::packed(h, t, d).row(bi, hi, ti);
                    let r = bthd.row(bi, hi, ti);
                    assert_eq!(out_s[r..r + d], out_p[p..p + d]);
                }
            }
        }
        let dout = values(n, 3);
        let (mut dq, mut dk, mut dv) = (vec![0.0f32; n], vec![0.0f32; n], vec![0.0f32; n]);
        attention_backward(AttentionBackward::<Host, f32> {
            params: s,
            q: &q,
            k: &k,
            v: &v,
            out: &out_p,
            dout: &dout,
            lse: &lse_p,
            dq: &mut dq,
            dk: &mut dk,
            dv: &mut dv,
            cu_seqlens: None,
        })
        .unwrap();
        // dout packed; out read through the bthd layout of out_s.
        let mut dqkv = vec![9.0f32; qkv.len()];
        attention_backward_strided(AttentionBackwardStrided {
            params: s,
            q: view(&qkv, lay(Qkv::Q)),
            k: view(&qkv, lay(Qkv::K)),
            v: view(&qkv, lay(Qkv::V)),
            out: Strided::<Host, f32> {
                data: &out_s,
                layout: bthd,
            },
            dout: Strided::<Host, f32> {
                data: &dout,
                layout: AttentionLayout::packed(h, t, d),
            },
            lse: &lse_s,
            dqkv: &mut dqkv,
            dq: fused(Qkv::Q),
            dk: fused(Qkv::K),
            dv: fused(Qkv::V),
            cu_seqlens: None,
        })
        .unwrap();
        for (w, want) in [(Qkv::Q, &dq), (Qkv::K, &dk), (Qkv::V, &dv)] {
            for bi in 0..b {
                for hi in 0..h {
                    for ti in 0..t {
                        let p = AttentionLayout::packed(h, t, d).row(bi, hi, ti);
                        let r = fused(w).row(bi, hi, ti);
                        assert_eq!(dqkv[r..r + d], want[p..p + d], "{w:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn out_of_bounds_and_overlapping_layouts_are_rejected() {
        let s = shape();
        let (b, h, t, d) = (s.batch, s.heads, s.tq, s.head_dim);
        let qkv = vec![0.0f32; b * t * 3 * h * d];
        // A fresh borrow per call: the argument structs are invariant in their lifetime.
        let lay = |w| AttentionLayout::fused_qkv(w, t, h, d);
        let n = b * h * t * d;
        let mut out = vec![7.0f32; n];
        let mut lse = vec![0.0f32; b * h * t];
        let e = attention_forward_strided(AttentionForwardStrided {
            params: s,
            q: view(&qkv, lay(Qkv::Q)),
            k: view(&qkv, lay(Qkv::K)),
            v: Strided::<Host, f32> {
                data: &qkv[..qkv.len() - 1],
                layout: AttentionLayout::fused_qkv(Qkv::V, t, h, d),
            },
            out: &mut out,
            out_layout: AttentionLayout::bthd(t, h, d),
            lse: &mut lse,
            cu_seqlens: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("v = a buffer of"), "{e}");
        let e = attention_forward_strided(AttentionForwardStrided {
            params: s,
            q: view(&qkv, lay(Qkv::Q)),
            k: view(&qkv, lay(Qkv::K)),
            v: view(&qkv, lay(Qkv::V)),
            out: &mut out,
            out_layout: AttentionLayout {
                head_stride: 0,
                ..AttentionLayout::bthd(t, h, d)
            },
            lse: &mut lse,
            cu_seqlens: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("written twice"), "{e}");
        assert!(out.iter().all(|&x| x == 7.0));
        let mut dqkv = vec![7.0f32; qkv.len()];
        let e = attention_backward_strided(AttentionBackwardStrided {
            params: s,
            q: view(&qkv, lay(Qkv::Q)),
            k: view(&qkv, lay(Qkv::K)),
            v: view(&qkv, lay(Qkv::V)),
            out: view(&qkv, lay(Qkv::Q)),
            dout: view(&qkv, lay(Qkv::Q)),
            lse: &lse,
            dqkv: &mut dqkv,
            dq: AttentionLayout::fused_qkv(Qkv::Q, t, h, d),
            dk: AttentionLayout::fused_qkv(Qkv::Q, t, h, d),
            dv: AttentionLayout::fused_qkv(Qkv::V, t, h, d),
            cu_seqlens: None,
        })
        .unwrap_err();
        assert!(e.to_string().contains("dk = "), "{e}");
        assert!(dqkv.iter().all(|&x| x == 7.0));
    }
}
