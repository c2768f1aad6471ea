//! The forward and backward passes of [`Gpt2`]: every op is its argument struct built with named
//! fields on the backend's space and run on its queue (`.run(queue)`).

use super::{zero2_alloc, zero2_hand, Gpt2, LayerActs};
use crate::backend::{gemm, Backend, Dims, Queue, TrainElement, View};
use crate::error::{Result, TrainError};
use crate::lora::adapters::Adapters;
use crate::lora::Target;
use crate::params::Layer;
use hip_kernels::ops::{
    AttentionBackwardStrided, AttentionForwardStrided, BiasBackward, BiasParams, ElementwiseParams,
    EncoderBackward, EncoderForward, GeluBackward, GeluForward, LayerNormBackward,
    LayerNormForward, Matmul, MatmulBias, MatmulBiasParams, MatmulParams, ResidualLayerNormForward,
    Run, Strided,
};

/// `out = A·B + bias` with `A` `[m, k]`, `B` `[k, n]`; with `gelu`, `out = gelu_tanh` of that.
fn gemm_bias(m: usize, n: usize, k: usize, gelu: bool) -> MatmulBiasParams {
    MatmulBiasParams {
        batch: 1,
        m,
        n,
        k,
        trans_a: false,
        trans_b: false,
        gelu,
    }
}

/// [`gemm`] adding to the output (a weight gradient accumulated over micro-batches).
fn gemm_acc(m: usize, n: usize, k: usize, trans_a: bool, trans_b: bool) -> MatmulParams {
    MatmulParams {
        beta: 1.0,
        ..gemm(m, n, k, trans_a, trans_b)
    }
}

impl<T: TrainElement, B: Backend<T>> Gpt2<'_, T, B> {
    pub(super) fn forward(&mut self, inputs: &B::Ids) -> Result<()> {
        let (be, d, p, a) = (self.backend, self.dims, &self.params, &mut self.acts);
        let queue = be.queue();
        let mut lora = self.lora.as_mut();
        let (n, c, f) = (d.rows(), d.channels, d.inner);
        // Offload: each stretch of the forward waits for the uploads of the weights it reads.
        let read_before = |l: usize| crate::params::read_before(l, self.layers);
        be.offload_params_ready(read_before(0))?;
        let embed = EncoderForward::<B::Space, T> {
            params: d.encoder(false),
            tokens: inputs.view(),
            wte: p.wte.view(),
            wpe: p.wpe.view(),
            out: a.encoded.view_mut(),
            error: None,
        };
        be.encoder_forward(embed, inputs, d.token_check("input token"))?;
        // The first layer norm reads the embeddings; every later one is fused with the residual
        // add before it (the next layer's ln_1, or ln_f after the last layer).
        if let Some(s) = a.layers.first_mut() {
            let w = &p.layers[0];
            LayerNormForward::<B::Space, T> {
                params: d.ln(),
                x: a.encoded.view(),
                weight: w.ln1_w.view(),
                bias: w.ln1_b.view(),
                y: s.ln1.view_mut(),
                mean: s.ln1_mean.view_mut(),
                rstd: s.ln1_rstd.view_mut(),
            }
            .run(queue)?;
        }
        let ckpt = self.grad_checkpoint;
        for l in 0..self.layers {
            be.offload_params_ready(read_before(l + 1))?;
            let (done, rest) = a.resid.split_at_mut(l);
            let x = done.last().unwrap_or(&a.encoded);
            let out = rest
                .first_mut()
                .ok_or_else(|| TrainError::Op(format!("layer {l} has no output buffer")))?;
            // With checkpointing every layer runs in the one set of activations.
            let (cur, later) = a.layers.split_at_mut(if ckpt { 1 } else { l + 1 });
            let s = cur
                .last_mut()
                .ok_or_else(|| TrainError::Op(format!("layer {l} has no activations")))?;
            let w = &p.layers[l];
            layer_front(be, d, w, l, x, s, &mut a.branch, lora.as_deref_mut())?;
            MatmulBias::<B::Space, T> {
                params: gemm_bias(n, c, f, false),
                a: s.fc_gelu.view(),
                b: w.mproj_w.view(),
                bias: w.mproj_b.view(),
                out: a.branch.view_mut(),
                pre_gelu: None,
            }
            .run(queue)?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.forward(be, l, Target::MlpProj, &s.fc_gelu, &mut a.branch)?;
            }
            // The next layer's ln_1 (into the same set with checkpointing), or ln_f.
            let (ln_w, ln_b, resid_mid, y, mean, rstd) = match (l + 1 < self.layers, ckpt) {
                (true, true) => {
                    let nw = &p.layers[l + 1];
                    let LayerActs {
                        resid_mid,
                        ln1,
                        ln1_mean,
                        ln1_rstd,
                        ..
                    } = s;
                    (&nw.ln1_w, &nw.ln1_b, &*resid_mid, ln1, ln1_mean, ln1_rstd)
                }
                (true, false) => {
                    let nw = &p.layers[l + 1];
                    let next = later.first_mut().ok_or_else(|| {
                        TrainError::Op(format!("layer {} has no activations", l + 1))
                    })?;
                    (
                        &nw.ln1_w,
                        &nw.ln1_b,
                        &s.resid_mid,
                        &mut next.ln1,
                        &mut next.ln1_mean,
                        &mut next.ln1_rstd,
                    )
                }
                (false, _) => (
                    &p.lnf_w,
                    &p.lnf_b,
                    &s.resid_mid,
                    &mut a.lnf,
                    &mut a.lnf_mean,
                    &mut a.lnf_rstd,
                ),
            };
            ResidualLayerNormForward::<B::Space, T> {
                params: d.ln(),
                a: resid_mid.view(),
                b: a.branch.view(),
                weight: ln_w.view(),
                bias: ln_b.view(),
                residual: out.view_mut(),
                y: y.view_mut(),
                mean: mean.view_mut(),
                rstd: rstd.view_mut(),
            }
            .run(queue)?;
        }
        be.offload_params_ready(usize::MAX)?;
        if self.layers == 0 {
            LayerNormForward::<B::Space, T> {
                params: d.ln(),
                x: a.encoded.view(),
                weight: p.lnf_w.view(),
                bias: p.lnf_b.view(),
                y: a.lnf.view_mut(),
                mean: a.lnf_mean.view_mut(),
                rstd: a.lnf_rstd.view_mut(),
            }
            .run(queue)?;
        }
        Matmul::<B::Space, T> {
            params: gemm(n, d.vocab, c, false, true),
            a: a.lnf.view(),
            b: p.wte.view(),
            out: a.logits.view_mut(),
        }
        .run(queue)?;
        Ok(())
    }

    pub(super) fn backward(&mut self, inputs: &B::Ids, last: bool) -> Result<()> {
        let (be, d, p, a) = (self.backend, self.dims, &self.params, &mut self.acts);
        let queue = be.queue();
        // `None` with a frozen base (LoRA): no weight gradient is computed, only the input
        // gradients the adapters need.
        let mut g = self.grads.as_mut();
        // ZeRO stage 2: gradients exist only from the backward that writes them to the bucket
        // that reduces them (canonical lengths `z2`).
        let z2 = self.zero2.then_some(&self.grad_lens[..]);
        let at_lnf = 2 + 12 * self.layers;
        if let (Some(lens), Some(g)) = (z2, g.as_deref_mut()) {
            let head = vec![(0, &mut g.wte), (1, &mut g.wpe)];
            let lnf = vec![(at_lnf, &mut g.lnf_w), (at_lnf + 1, &mut g.lnf_b)];
            zero2_alloc::<T, B>(be, head.into_iter().chain(lnf).collect(), lens)?;
        }
        let mut lora = self.lora.as_mut();
        let mut frozen = self.frozen_ln.as_mut();
        // ZeRO stage 1: the owners of canonical tensors `at..at + k` (where their sums go).
        let owners = self.owners.as_deref();
        let roots = |at: usize, k: usize| owners.map(|o| &o[at..at + k]);
        let (n, c, f, v) = (d.rows(), d.channels, d.inner, d.vocab);
        // logits = lnf · wteᵀ; `a.logits` now holds dlogits.
        if let Some(g) = g.as_deref_mut() {
            Matmul::<B::Space, T> {
                params: gemm_acc(v, c, n, true, false),
                a: a.logits.view(),
                b: a.lnf.view(),
                out: g.wte.view_mut(),
            }
            .run(queue)?;
        }
        Matmul::<B::Space, T> {
            params: gemm(n, c, v, false, false),
            a: a.logits.view(),
            b: p.wte.view(),
            out: a.branch.view_mut(),
        }
        .run(queue)?;
        be.fill_zero(&mut a.dres)?;
        let x_last = a.resid.last().unwrap_or(&a.encoded);
        let (dw, db) = ln_grads(
            g.as_deref_mut().map(|g| (&mut g.lnf_w, &mut g.lnf_b)),
            frozen.as_deref_mut(),
        )?;
        // Layer norm backwards accumulate into the step's gradients in place (one rounding to
        // T), `dx` into the residual stream's gradient.
        LayerNormBackward::<B::Space, T> {
            params: d.ln(),
            x: x_last.view(),
            weight: p.lnf_w.view(),
            dy: a.branch.view(),
            mean: a.lnf_mean.view(),
            rstd: a.lnf_rstd.view(),
            dx: a.dres.view_mut(),
            dweight: dw.view_mut(),
            dbias: db.view_mut(),
            accumulate: true,
        }
        .run(queue)?;
        // ZeRO 2: every micro-batch's gradients go to their owners' shards.
        let hand = last || z2.is_some();
        if let (true, Some(g)) = (hand, g.as_deref_mut()) {
            let at = at_lnf;
            match z2 {
                Some(_) => {
                    zero2_hand::<T, B>(be, vec![(at, &mut g.lnf_w), (at + 1, &mut g.lnf_b)], last)?
                }
                None => be.grads_ready(&mut [&mut g.lnf_w, &mut g.lnf_b], roots(at, 2))?,
            }
        }
        let ckpt = self.grad_checkpoint;
        for l in (0..self.layers).rev() {
            let x = match l {
                0 => &a.encoded,
                _ => &a.resid[l - 1],
            };
            let w = &p.layers[l];
            let s = a
                .layers
                .get_mut(if ckpt { 0 } else { l })
                .ok_or_else(|| TrainError::Op(format!("layer {l} has no activations")))?;
            if ckpt {
                // Recompute the layer's activations from its input, exactly as the forward
                // made them (the standalone layer norm equals the fused one of the forward:
                // both normalise the stored residual).
                LayerNormForward::<B::Space, T> {
                    params: d.ln(),
                    x: x.view(),
                    weight: w.ln1_w.view(),
                    bias: w.ln1_b.view(),
                    y: s.ln1.view_mut(),
                    mean: s.ln1_mean.view_mut(),
                    rstd: s.ln1_rstd.view_mut(),
                }
                .run(queue)?;
                layer_front(be, d, w, l, x, s, &mut a.branch, lora.as_deref_mut())?;
            }
            let s = &*s;
            if let (Some(lens), Some(g)) = (z2, g.as_deref_mut()) {
                let bufs = g.layers[l].iter_mut().into_iter().enumerate();
                zero2_alloc::<T, B>(be, bufs.map(|(k, b)| (2 + 12 * l + k, b)).collect(), lens)?;
            }
            let mut gw = g.as_deref_mut().map(|g| &mut g.layers[l]);
            // MLP: resid_out = resid_mid + gelu(ln2·Wfc + bfc)·Wmproj + bmproj.
            Linear {
                rows: n,
                inputs: f,
                outputs: c,
                x: &s.fc_gelu,
                weight: &w.mproj_w,
                dout: &a.dres,
                dx: &mut a.dfc_gelu,
                grads: gw.as_deref_mut().map(|g| (&mut g.mproj_w, &mut g.mproj_b)),
            }
            .backward::<T, B>(queue)?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Target::MlpProj, &s.fc_gelu, &a.dres, &mut a.dfc_gelu)?;
            }
            GeluBackward::<B::Space, T> {
                params: ElementwiseParams { len: n * f },
                x: s.fc_pre.view(),
                dout: a.dfc_gelu.view(),
                dx: a.dfc_pre.view_mut(),
            }
            .run(queue)?;
            Linear {
                rows: n,
                inputs: c,
                outputs: f,
                x: &s.ln2,
                weight: &w.fc_w,
                dout: &a.dfc_pre,
                dx: &mut a.branch,
                grads: gw.as_deref_mut().map(|g| (&mut g.fc_w, &mut g.fc_b)),
            }
            .backward::<T, B>(queue)?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Target::CFc, &s.ln2, &a.dfc_pre, &mut a.branch)?;
            }
            let (dw, db) = ln_grads(
                gw.as_deref_mut().map(|g| (&mut g.ln2_w, &mut g.ln2_b)),
                frozen.as_deref_mut(),
            )?;
            LayerNormBackward::<B::Space, T> {
                params: d.ln(),
                x: s.resid_mid.view(),
                weight: w.ln2_w.view(),
                dy: a.branch.view(),
                mean: s.ln2_mean.view(),
                rstd: s.ln2_rstd.view(),
                dx: a.dres.view_mut(),
                dweight: dw.view_mut(),
                dbias: db.view_mut(),
                accumulate: true,
            }
            .run(queue)?;
            // Attention: resid_mid = x + attn(ln1·Wqkv + bqkv)·Wproj + bproj.
            Linear {
                rows: n,
                inputs: c,
                outputs: c,
                x: &s.atty,
                weight: &w.proj_w,
                dout: &a.dres,
                dx: &mut a.datty,
                grads: gw.as_deref_mut().map(|g| (&mut g.proj_w, &mut g.proj_b)),
            }
            .backward::<T, B>(queue)?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Target::AttnProj, &s.atty, &a.dres, &mut a.datty)?;
            }
            // `dqkv` is written whole: the three fused layouts tile [B, T, 3, H, D].
            let [q, k, v] = d.qkv_layouts().map(|layout| Strided::<B::Space, T> {
                data: s.qkv.view(),
                layout,
            });
            let [dq, dk, dv] = d.qkv_layouts();
            AttentionBackwardStrided::<B::Space, T> {
                params: d.attention(),
                q,
                k,
                v,
                out: Strided {
                    data: s.atty.view(),
                    layout: d.bthd(),
                },
                dout: Strided {
                    data: a.datty.view(),
                    layout: d.bthd(),
                },
                lse: s.lse.view(),
                dqkv: a.dqkv.view_mut(),
                dq,
                dk,
                dv,
                cu_seqlens: None,
            }
            .run(queue)?;
            Linear {
                rows: n,
                inputs: c,
                outputs: 3 * c,
                x: &s.ln1,
                weight: &w.qkv_w,
                dout: &a.dqkv,
                dx: &mut a.branch,
                grads: gw.as_deref_mut().map(|g| (&mut g.qkv_w, &mut g.qkv_b)),
            }
            .backward::<T, B>(queue)?;
            if let Some(lo) = lora.as_deref_mut() {
                lo.backward(be, l, Target::CAttn, &s.ln1, &a.dqkv, &mut a.branch)?;
            }
            let (dw, db) = ln_grads(
                gw.as_deref_mut().map(|g| (&mut g.ln1_w, &mut g.ln1_b)),
                frozen.as_deref_mut(),
            )?;
            LayerNormBackward::<B::Space, T> {
                params: d.ln(),
                x: x.view(),
                weight: w.ln1_w.view(),
                dy: a.branch.view(),
                mean: s.ln1_mean.view(),
                rstd: s.ln1_rstd.view(),
                dx: a.dres.view_mut(),
                dweight: dw.view_mut(),
                dbias: db.view_mut(),
                accumulate: true,
            }
            .run(queue)?;
            if let (true, Some(gw)) = (hand, gw) {
                // Layer l's twelve gradients are final: one bucket.
                match z2 {
                    Some(_) => {
                        let bufs = gw.iter_mut().into_iter().enumerate();
                        let bufs = bufs.map(|(k, b)| (2 + 12 * l + k, b)).collect();
                        zero2_hand::<T, B>(be, bufs, last)?;
                    }
                    None => be.grads_ready(&mut gw.iter_mut(), roots(2 + 12 * l, 12))?,
                }
            }
        }
        if let (true, Some(lo)) = (last, lora) {
            // LoRA: the adapters' gradients are the only ones to sum across ranks (one bucket).
            be.grads_ready(&mut lo.grads.iter_mut().collect::<Vec<_>>(), None)?;
        }
        if let Some(g) = g {
            // The forward checked these ids; the kernel never indexes with a bad one.
            EncoderBackward::<B::Space, T> {
                params: d.encoder(true),
                tokens: inputs.view(),
                dout: a.dres.view(),
                dwte: g.wte.view_mut(),
                dwpe: g.wpe.view_mut(),
                error: None,
            }
            .run(queue)?;
            if hand {
                match z2 {
                    Some(_) => {
                        zero2_hand::<T, B>(be, vec![(0, &mut g.wte), (1, &mut g.wpe)], last)?
                    }
                    None => be.grads_ready(&mut [&mut g.wte, &mut g.wpe], roots(0, 2))?,
                }
            }
        }
        // Frozen embeddings (LoRA): the residual gradient ends here.
        Ok(())
    }
}

/// Layer `l`'s forward from its input `x` and its `ln_1` (already in `s`) up to the MLP's
/// GELU: every activation its backward reads, written into `s` (`branch` is scratch). The
/// forward runs it for each layer and then the MLP's projection and the residual add; with
/// activation checkpointing the backward runs it again, from the kept input, to recompute
/// the layer's activations bit for bit.
#[allow(clippy::too_many_arguments)]
fn layer_front<T: TrainElement, B: Backend<T>>(
    be: &B,
    d: Dims,
    w: &Layer<B::Buf<T>>,
    l: usize,
    x: &B::Buf<T>,
    s: &mut LayerActs<B::Buf<T>, B::Buf<f32>>,
    branch: &mut B::Buf<T>,
    mut lora: Option<&mut Adapters<T, B>>,
) -> Result<()> {
    let queue = be.queue();
    let (n, c, f) = (d.rows(), d.channels, d.inner);
    MatmulBias::<B::Space, T> {
        params: gemm_bias(n, 3 * c, c, false),
        a: s.ln1.view(),
        b: w.qkv_w.view(),
        bias: w.qkv_b.view(),
        out: s.qkv.view_mut(),
        pre_gelu: None,
    }
    .run(queue)?;
    if let Some(lo) = lora.as_deref_mut() {
        lo.forward(be, l, Target::CAttn, &s.ln1, &mut s.qkv)?;
    }
    // q, k, v read from the fused `qkv` [B, T, 3, H, D]; `atty` [B, T, H, D].
    let [q, k, v] = d.qkv_layouts().map(|layout| Strided::<B::Space, T> {
        data: s.qkv.view(),
        layout,
    });
    AttentionForwardStrided::<B::Space, T> {
        params: d.attention(),
        q,
        k,
        v,
        out: s.atty.view_mut(),
        out_layout: d.bthd(),
        lse: s.lse.view_mut(),
        cu_seqlens: None,
    }
    .run(queue)?;
    MatmulBias::<B::Space, T> {
        params: gemm_bias(n, c, c, false),
        a: s.atty.view(),
        b: w.proj_w.view(),
        bias: w.proj_b.view(),
        out: branch.view_mut(),
        pre_gelu: None,
    }
    .run(queue)?;
    if let Some(lo) = lora.as_deref_mut() {
        lo.forward(be, l, Target::AttnProj, &s.atty, branch)?;
    }
    ResidualLayerNormForward::<B::Space, T> {
        params: d.ln(),
        a: x.view(),
        b: branch.view(),
        weight: w.ln2_w.view(),
        bias: w.ln2_b.view(),
        residual: s.resid_mid.view_mut(),
        y: s.ln2.view_mut(),
        mean: s.ln2_mean.view_mut(),
        rstd: s.ln2_rstd.view_mut(),
    }
    .run(queue)?;
    let fc = |gelu| gemm_bias(n, f, c, gelu);
    match lora.filter(|lo| lo.adapts(Target::CFc)) {
        // The adapter adds to GELU's input: the bias GEMM writes it, the adapter accumulates
        // into it, then GELU.
        Some(lo) => {
            MatmulBias::<B::Space, T> {
                params: fc(false),
                a: s.ln2.view(),
                b: w.fc_w.view(),
                bias: w.fc_b.view(),
                out: s.fc_pre.view_mut(),
                pre_gelu: None,
            }
            .run(queue)?;
            lo.forward(be, l, Target::CFc, &s.ln2, &mut s.fc_pre)?;
            GeluForward::<B::Space, T> {
                params: ElementwiseParams { len: n * f },
                x: s.fc_pre.view(),
                out: s.fc_gelu.view_mut(),
            }
            .run(queue)?;
        }
        None => MatmulBias::<B::Space, T> {
            params: fc(true),
            a: s.ln2.view(),
            b: w.fc_w.view(),
            bias: w.fc_b.view(),
            out: s.fc_gelu.view_mut(),
            pre_gelu: Some(s.fc_pre.view_mut()),
        }
        .run(queue)?,
    }
    Ok(())
}

/// Where a layer norm's weight and bias gradients go: the model's gradients, or with a frozen
/// base the scratch pair nobody reads.
fn ln_grads<'x, U>(
    trained: Option<(&'x mut U, &'x mut U)>,
    frozen: Option<&'x mut [U; 2]>,
) -> Result<(&'x mut U, &'x mut U)> {
    match (trained, frozen) {
        (Some(t), _) => Ok(t),
        (None, Some([w, b])) => Ok((w, b)),
        (None, None) => Err(TrainError::Op(
            "a layer norm's weight gradients have no buffer".into(),
        )),
    }
}

/// The tensors of a linear layer `out = x·W + b` (`x` `[rows, inputs]`, `W` `[inputs, outputs]`)
/// in the backward.
struct Linear<'x, U> {
    rows: usize,
    inputs: usize,
    outputs: usize,
    /// The forward's input.
    x: &'x U,
    /// `W`.
    weight: &'x U,
    /// Gradient of `out` `[rows, outputs]`.
    dout: &'x U,
    /// Gradient of `x`: written.
    dx: &'x mut U,
    /// Gradients of `W` and `b`, accumulated; `None` when the weights are frozen (LoRA).
    grads: Option<(&'x mut U, &'x mut U)>,
}

impl<U> Linear<'_, U> {
    /// `dW += xᵀ·dout`, `db += Σ_rows dout` (when the weights train), then `dx = dout·Wᵀ`.
    fn backward<T: TrainElement, B: Backend<T, Buf<T> = U>>(
        self,
        queue: Queue<'_, B, T>,
    ) -> Result<()>
    where
        U: View<B::Space, T>,
    {
        let Linear {
            rows: n,
            inputs: k,
            outputs: m,
            ..
        } = self;
        if let Some((dweight, dbias)) = self.grads {
            Matmul::<B::Space, T> {
                params: gemm_acc(k, m, n, true, false),
                a: self.x.view(),
                b: self.dout.view(),
                out: dweight.view_mut(),
            }
            .run(queue)?;
            BiasBackward::<B::Space, T> {
                params: BiasParams {
                    rows: n,
                    cols: m,
                    accumulate: true,
                },
                dout: self.dout.view(),
                dbias: dbias.view_mut(),
            }
            .run(queue)?;
        }
        Matmul::<B::Space, T> {
            params: gemm(n, k, m, false, true),
            a: self.dout.view(),
            b: self.weight.view(),
            out: self.dx.view_mut(),
        }
        .run(queue)?;
        Ok(())
    }
}
