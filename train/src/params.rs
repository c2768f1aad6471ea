//! The parameter set of a GPT-2 as one struct of named tensors, generic over what a tensor is
//! (a host `Vec<f32>`, a backend buffer), in one canonical order used for files and optimizer.

use crate::config::GptConfig;
use crate::error::{Result, TrainError};

/// One layer's tensors (HF Conv1D layout: weights `[in, out]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Layer<T> {
    /// `ln_1.weight` `[C]`.
    pub ln1_w: T,
    /// `ln_1.bias` `[C]`.
    pub ln1_b: T,
    /// `attn.c_attn.weight` `[C, 3C]`.
    pub qkv_w: T,
    /// `attn.c_attn.bias` `[3C]`.
    pub qkv_b: T,
    /// `attn.c_proj.weight` `[C, C]`.
    pub proj_w: T,
    /// `attn.c_proj.bias` `[C]`.
    pub proj_b: T,
    /// `ln_2.weight` `[C]`.
    pub ln2_w: T,
    /// `ln_2.bias` `[C]`.
    pub ln2_b: T,
    /// `mlp.c_fc.weight` `[C, F]`.
    pub fc_w: T,
    /// `mlp.c_fc.bias` `[F]`.
    pub fc_b: T,
    /// `mlp.c_proj.weight` `[F, C]`.
    pub mproj_w: T,
    /// `mlp.c_proj.bias` `[C]`.
    pub mproj_b: T,
}

/// All parameters (or gradients, or optimizer moments) of a GPT-2.
#[derive(Debug, Clone, PartialEq)]
pub struct Params<T> {
    /// `wte.weight` `[V, C]` (also the tied lm_head).
    pub wte: T,
    /// `wpe.weight` `[P, C]`.
    pub wpe: T,
    /// `h.{l}.*`.
    pub layers: Vec<Layer<T>>,
    /// `ln_f.weight` `[C]`.
    pub lnf_w: T,
    /// `ln_f.bias` `[C]`.
    pub lnf_b: T,
}

/// Name (without `transformer.`) and shape of one parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// `h.0.attn.c_attn.weight`.
    pub name: String,
    /// `[C, 3C]`.
    pub shape: Vec<usize>,
}

impl Spec {
    /// Weight decay applies (2-D tensors only).
    pub fn decays(&self) -> bool {
        self.shape.len() == 2
    }
}

/// How long a prefix of the canonical order the forward of a `layers`-layer GPT-2 has read
/// when it starts layer `l`: the embeddings, the layers before `l` and layer `l`'s `ln_1`
/// (fused into the residual add that ends layer `l - 1`); every tensor from the last layer's
/// end on (`ln_f` follows it). With the optimizer offloaded the forward waits for that
/// prefix's uploads only.
pub fn read_before(l: usize, layers: usize) -> usize {
    match l < layers {
        true => 2 + 12 * l + 2,
        false => usize::MAX,
    }
}

/// Per-layer names after `h.{l}.` and shapes, in the canonical order.
fn layer_specs(c: usize, f: usize) -> [(&'static str, Vec<usize>); 12] {
    [
        ("ln_1.weight", vec![c]),
        ("ln_1.bias", vec![c]),
        ("attn.c_attn.weight", vec![c, 3 * c]),
        ("attn.c_attn.bias", vec![3 * c]),
        ("attn.c_proj.weight", vec![c, c]),
        ("attn.c_proj.bias", vec![c]),
        ("ln_2.weight", vec![c]),
        ("ln_2.bias", vec![c]),
        ("mlp.c_fc.weight", vec![c, f]),
        ("mlp.c_fc.bias", vec![f]),
        ("mlp.c_proj.weight", vec![f, c]),
        ("mlp.c_proj.bias", vec![c]),
    ]
}

/// Every parameter of `cfg`, in the canonical order of [`Params::iter`].
pub fn specs(cfg: &GptConfig) -> Vec<Spec> {
    let (c, f) = (cfg.channels, cfg.inner);
    let spec = |name: String, shape| Spec { name, shape };
    let mut out = vec![
        spec("wte.weight".into(), vec![cfg.vocab, c]),
        spec("wpe.weight".into(), vec![cfg.positions, c]),
    ];
    for l in 0..cfg.layers {
        for (n, s) in layer_specs(c, f) {
            out.push(spec(format!("h.{l}.{n}"), s));
        }
    }
    out.push(spec("ln_f.weight".into(), vec![c]));
    out.push(spec("ln_f.bias".into(), vec![c]));
    out
}

impl<T> Layer<T> {
    fn iter(&self) -> [&T; 12] {
        [
            &self.ln1_w,
            &self.ln1_b,
            &self.qkv_w,
            &self.qkv_b,
            &self.proj_w,
            &self.proj_b,
            &self.ln2_w,
            &self.ln2_b,
            &self.fc_w,
            &self.fc_b,
            &self.mproj_w,
            &self.mproj_b,
        ]
    }

    /// The layer's tensors, mutably (ln_1 first, mlp.c_proj last).
    pub fn iter_mut(&mut self) -> [&mut T; 12] {
        [
            &mut self.ln1_w,
            &mut self.ln1_b,
            &mut self.qkv_w,
            &mut self.qkv_b,
            &mut self.proj_w,
            &mut self.proj_b,
            &mut self.ln2_w,
            &mut self.ln2_b,
            &mut self.fc_w,
            &mut self.fc_b,
            &mut self.mproj_w,
            &mut self.mproj_b,
        ]
    }

    fn from_iter(next: &mut impl FnMut() -> Result<T>) -> Result<Self> {
        Ok(Self {
            ln1_w: next()?,
            ln1_b: next()?,
            qkv_w: next()?,
            qkv_b: next()?,
            proj_w: next()?,
            proj_b: next()?,
            ln2_w: next()?,
            ln2_b: next()?,
            fc_w: next()?,
            fc_b: next()?,
            mproj_w: next()?,
            mproj_b: next()?,
        })
    }

    fn try_map<U, E>(&self, f: &mut impl FnMut(&T) -> Result<U, E>) -> Result<Layer<U>, E> {
        Ok(Layer {
            ln1_w: f(&self.ln1_w)?,
            ln1_b: f(&self.ln1_b)?,
            qkv_w: f(&self.qkv_w)?,
            qkv_b: f(&self.qkv_b)?,
            proj_w: f(&self.proj_w)?,
            proj_b: f(&self.proj_b)?,
            ln2_w: f(&self.ln2_w)?,
            ln2_b: f(&self.ln2_b)?,
            fc_w: f(&self.fc_w)?,
            fc_b: f(&self.fc_b)?,
            mproj_w: f(&self.mproj_w)?,
            mproj_b: f(&self.mproj_b)?,
        })
    }
}

impl<T> Params<T> {
    /// The tensors in the canonical order of [`specs`].
    pub fn iter(&self) -> Vec<&T> {
        let mut v = vec![&self.wte, &self.wpe];
        for l in &self.layers {
            v.extend(l.iter());
        }
        v.extend([&self.lnf_w, &self.lnf_b]);
        v
    }

    /// [`Params::iter`], mutably.
    pub fn iter_mut(&mut self) -> Vec<&mut T> {
        let mut v = vec![&mut self.wte, &mut self.wpe];
        for l in &mut self.layers {
            v.extend(l.iter_mut());
        }
        v.extend([&mut self.lnf_w, &mut self.lnf_b]);
        v
    }

    /// Build from tensors in the canonical order of [`specs`].
    pub fn from_vec(tensors: Vec<T>, layers: usize) -> Result<Self> {
        let count = tensors.len();
        let wrong = || {
            TrainError::Op(format!(
                "{count} tensors for a {layers}-layer GPT-2, which has {}",
                4 + 12 * layers
            ))
        };
        if count != 4 + 12 * layers {
            return Err(wrong());
        }
        let mut it = tensors.into_iter();
        let mut next = || it.next().ok_or_else(wrong);
        let (wte, wpe) = (next()?, next()?);
        let layers = (0..layers)
            .map(|_| Layer::from_iter(&mut next))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            wte,
            wpe,
            layers,
            lnf_w: next()?,
            lnf_b: next()?,
        })
    }

    /// Apply `f` to every tensor (with its index in the canonical order).
    pub fn try_map<U, E>(
        &self,
        mut f: impl FnMut(usize, &T) -> Result<U, E>,
    ) -> Result<Params<U>, E> {
        let mut i = 0;
        let mut g = |t: &T| {
            i += 1;
            f(i - 1, t)
        };
        let (wte, wpe) = (g(&self.wte)?, g(&self.wpe)?);
        let layers = self
            .layers
            .iter()
            .map(|l| l.try_map(&mut g))
            .collect::<Result<Vec<_>, E>>()?;
        Ok(Params {
            wte,
            wpe,
            layers,
            lnf_w: g(&self.lnf_w)?,
            lnf_b: g(&self.lnf_b)?,
        })
    }
}
