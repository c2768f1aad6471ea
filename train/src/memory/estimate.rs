//! The per-rank device memory of a run, predicted from the model's shape and the flags: every
//! buffer the trainer allocates, each rounded as the caching allocator rounds it
//! ([`hip_rt::caching::round_size`]: at least 512 B, a multiple of 512 B, after hip-emu's guard
//! byte), summed by part.
//!
//! The sum is what the allocator's `allocated_bytes` peak (`mem_peak` in the step log) measures:
//! the lists below mirror the models' constructors (`crate::model::Gpt2`,
//! `crate::llama::model::Llama`), the LoRA adapters, the backend's per-step buffers and the ops'
//! scratch, and the device tests check the sum against measured peaks. The allocator margin
//! (reserved beyond allocated) is a separate row: a card needs the peak plus the margin.

use crate::cli::Precision;
use crate::config::GptConfig;
use crate::llama::params::Trained;
use crate::llama::LlamaConfig;
use crate::lora::LoraConfig;
use crate::params::specs;

/// The parts of the table, in print order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The trained (or frozen) weights in the storage type.
    Weights,
    /// f32 master weights (bf16, f16), of the tensors this rank updates.
    Master,
    /// Gradients in the storage type.
    Gradients,
    /// AdamW's two f32 moments, of the tensors this rank updates.
    Optimizer,
    /// Activations the forward saves for the backward.
    Activations,
    /// Logits `[N, V]` (then their gradient) and the per-position losses.
    LogitsLoss,
    /// The backward's scratch, token ids, the step's scalars and the ops' scratch.
    Workspace,
}

impl Part {
    /// Every part, in print order.
    pub const ALL: [Part; 7] = [
        Part::Weights,
        Part::Master,
        Part::Gradients,
        Part::Optimizer,
        Part::Activations,
        Part::LogitsLoss,
        Part::Workspace,
    ];

    /// The row's label.
    pub fn label(self) -> &'static str {
        match self {
            Part::Weights => "weights",
            Part::Master => "master weights (f32)",
            Part::Gradients => "gradients",
            Part::Optimizer => "optimizer state (AdamW, f32)",
            Part::Activations => "activations",
            Part::LogitsLoss => "logits/loss",
            Part::Workspace => "workspace",
        }
    }
}

/// The model, by family.
#[derive(Debug, Clone, Copy)]
pub enum Shape<'a> {
    /// GPT-2.
    Gpt2(&'a GptConfig),
    /// Llama, Qwen2.
    Llama(&'a LlamaConfig),
}

/// LoRA adapters: the rank and, per layer, `(in, out)` of each adapted linear layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraPlan {
    /// Rank r.
    pub rank: usize,
    /// `(in, out)` of each adapted module of one layer.
    pub modules: Vec<(usize, usize)>,
}

impl LoraPlan {
    /// GPT-2's adapters as `cfg` sets them.
    pub fn gpt2(lora: &LoraConfig, cfg: &GptConfig) -> Self {
        Self {
            rank: lora.rank,
            modules: lora.targets.iter().map(|t| t.dims(cfg)).collect(),
        }
    }
}

/// What the run does, as far as memory goes.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Storage type.
    pub dtype: Precision,
    /// Rows per micro-batch on this rank.
    pub batch: usize,
    /// Positions per row.
    pub seq: usize,
    /// Micro-batches per step.
    pub grad_accum: usize,
    /// Ranks.
    pub world: usize,
    /// ZeRO stage 0, 1 or 2.
    pub zero: u8,
    /// LoRA (the base frozen).
    pub lora: Option<LoraPlan>,
    /// `--grad-checkpoint`: only each layer's input is kept, one layer recomputed at a time.
    pub grad_checkpoint: bool,
    /// `--offload-optimizer cpu`: master weights and moments in host memory.
    pub offload: bool,
    /// ZeRO stage 2's reduce-scatter bucket, in elements.
    pub bucket_elems: usize,
    /// Bytes the allocator adds to every request before rounding: 1 on hip-emu (a guard byte
    /// after each block, so that its memory checker sees an overrun), 0 on a GPU.
    pub guard_slack: usize,
}

/// DeepSpeed's `reduce_bucket_size` default, in elements: ZeRO stage 2's bucket.
pub const DEFAULT_BUCKET_ELEMS: usize = 200_000_000;

/// A predicted per-rank table.
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Bytes per part, in [`Part::ALL`]'s order.
    pub parts: [u64; 7],
    /// Buffers counted, in [`Part::ALL`]'s order.
    pub buffers: [u64; 7],
    /// Reserved beyond allocated: segment rounding and fragmentation.
    pub margin: u64,
    /// The rank the figures are of (the one with the largest share).
    pub rank: usize,
}

impl Estimate {
    /// The predicted peak of allocated bytes (what `mem_peak` measures).
    pub fn peak(&self) -> u64 {
        self.parts.iter().sum()
    }

    /// What a card needs free: the peak plus the allocator margin.
    pub fn needs(&self) -> u64 {
        self.peak() + self.margin
    }

    /// The table, its last line `estimated peak per rank: <N> bytes`.
    pub fn table(&self, heading: &str) -> String {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let mut s = format!("memory estimate per rank (rank {}): {heading}\n", self.rank);
        s += &format!("  {:<30} {:>16} {:>10}\n", "part", "bytes", "GiB");
        for (p, b) in Part::ALL.iter().zip(self.parts) {
            s += &format!("  {:<30} {:>16} {:>10.3}\n", p.label(), b, gib(b));
        }
        s += &format!(
            "  {:<30} {:>16} {:>10.3}\n",
            "allocator margin (reserved)",
            self.margin,
            gib(self.margin)
        );
        s += &format!(
            "needs per card (peak + margin): {} bytes ({:.2} GiB)\n",
            self.needs(),
            gib(self.needs())
        );
        s += &format!("estimated peak per rank: {} bytes", self.peak());
        s
    }
}

/// Bytes of one element of `d`.
fn elem_bytes(d: Precision) -> usize {
    match d {
        Precision::F32 => 4,
        Precision::Bf16 | Precision::F16 => 2,
    }
}

/// The running sums.
struct Tally {
    /// [`Settings::guard_slack`].
    slack: usize,
    parts: [u64; 7],
    buffers: [u64; 7],
    /// Each allocation's rounded size (for the margin).
    sizes: Vec<usize>,
}

impl Tally {
    fn new(slack: usize) -> Self {
        Self {
            slack,
            parts: [0; 7],
            buffers: [0; 7],
            sizes: Vec::new(),
        }
    }

    /// One buffer of `elems` elements of `bytes` bytes; an empty one allocates nothing.
    fn add(&mut self, part: Part, elems: usize, bytes: usize) {
        let n = elems.saturating_mul(bytes);
        if n == 0 {
            return;
        }
        let r = hip_rt::caching::round_size(n.saturating_add(self.slack));
        let i = Part::ALL.iter().position(|&p| p == part).unwrap_or(0);
        self.parts[i] += r as u64;
        self.buffers[i] += 1;
        self.sizes.push(r);
    }
}

/// The margin between reserved and allocated bytes, as the caching allocator reserves
/// segments ([`hip_rt::caching::allocation_size`]): requests of at most 1 MiB packed into 2 MiB
/// segments, of 1–10 MiB into 20 MiB segments, larger ones each in a segment of their own rounded
/// up to 2 MiB; plus 2 % of the peak for fragmentation of the per-step scratch (a rule of thumb,
/// not a measurement).
fn margin(sizes: &[usize], peak: u64) -> u64 {
    use hip_rt::caching::{allocation_size, KLARGE_BUFFER, KMIN_LARGE_ALLOC, KSMALL_BUFFER, MIB};
    let packed = |lo: usize, hi: usize, segment: usize| {
        let sum: usize = sizes.iter().filter(|&&s| s > lo && s <= hi).sum();
        sum.next_multiple_of(segment) - sum
    };
    let large: usize = sizes
        .iter()
        .filter(|&&s| s >= KMIN_LARGE_ALLOC)
        .map(|&s| allocation_size(s) - s)
        .sum();
    let slack =
        packed(0, MIB, KSMALL_BUFFER) + packed(MIB, KMIN_LARGE_ALLOC - 1, KLARGE_BUFFER) + large;
    slack as u64 + peak / 50
}

/// Element counts of the tensors a rank keeps optimizer state for: with ZeRO 1 the tensors
/// [`crate::model::zero_owners`] gives `rank`, with ZeRO 2 an element-granular share
/// (`⌈P / W⌉`), else all.
fn owned(lens: &[usize], s: &Settings, rank: usize) -> Vec<usize> {
    match (s.zero, s.world) {
        (_, 0 | 1) | (0, _) => lens.to_vec(),
        (1, w) => {
            let owners = crate::model::zero_owners(lens, w);
            lens.iter()
                .zip(owners)
                .map(|(&n, o)| if o == rank { n } else { 0 })
                .collect()
        }
        (_, w) => vec![lens.iter().sum::<usize>().div_ceil(w)],
    }
}

/// The rank with the largest share of optimizer state (ZeRO 1), else 0.
fn largest_rank(lens: &[usize], s: &Settings) -> usize {
    (0..s.world.max(1))
        .max_by_key(|&r| (owned(lens, s, r).iter().sum::<usize>(), usize::MAX - r))
        .unwrap_or(0)
}

/// The trained tensors' element counts and the frozen ones', for `shape` under `s`.
fn tensors(shape: Shape, s: &Settings) -> (Vec<usize>, Vec<usize>) {
    let base: Vec<usize> = match shape {
        Shape::Gpt2(cfg) => specs(cfg)
            .iter()
            .map(|t| t.shape.iter().product())
            .collect(),
        Shape::Llama(cfg) => Trained::new(cfg)
            .specs
            .iter()
            .map(|t| t.shape.iter().product())
            .collect(),
    };
    match &s.lora {
        None => (base, Vec::new()),
        Some(l) => {
            let layers = match shape {
                Shape::Gpt2(c) => c.layers,
                Shape::Llama(c) => c.layers,
            };
            let mut adapters = Vec::new();
            for _ in 0..layers {
                for &(i, o) in &l.modules {
                    adapters.push(l.rank * i);
                    adapters.push(o * l.rank);
                }
            }
            (adapters, base)
        }
    }
}

/// The predicted per-rank table for `shape` under `s`, of the rank with the largest share.
pub fn estimate(shape: Shape, s: &Settings) -> Estimate {
    let (trained, _) = tensors(shape, s);
    estimate_rank(shape, s, largest_rank(&trained, s))
}

/// The predicted table of `rank`.
pub fn estimate_rank(shape: Shape, s: &Settings, rank: usize) -> Estimate {
    let t = elem_bytes(s.dtype);
    let mut y = Tally::new(s.guard_slack);
    let (trained, frozen) = tensors(shape, s);
    // Weights: the frozen base (LoRA) and the trained tensors, in the storage type.
    for &n in frozen.iter().chain(&trained) {
        y.add(Part::Weights, n, t);
    }
    // Gradients: every trained tensor. ZeRO 2 (crate::zero2): this rank's share, plus what the
    // backward holds at once: the largest tensor (the embedding, written first and last), a
    // bucket not yet reduced with the group that tops it, and the layer being written. The same
    // with `--grad-accum` > 1: every micro-batch's buckets go to their owners and add into the
    // share (the scratch copy of an owned piece is at most a bucket's share, inside the slack).
    match (s.zero, s.world) {
        (2, w) if w > 1 => {
            let total: usize = trained.iter().sum();
            y.add(Part::Gradients, total.div_ceil(w), t);
            let layers = match shape {
                Shape::Gpt2(c) => c.layers,
                Shape::Llama(c) => c.layers,
            };
            let embed = trained.iter().copied().max().unwrap_or(0);
            let layer = (total - embed) / layers.max(1);
            let held = embed
                .saturating_add(s.bucket_elems)
                .saturating_add(2 * layer)
                .min(total);
            y.add(Part::Gradients, embed, t);
            if held > embed {
                y.add(Part::Gradients, held - embed, t);
            }
        }
        _ => trained.iter().for_each(|&n| y.add(Part::Gradients, n, t)),
    }
    if !s.offload {
        let mine = owned(&trained, s, rank);
        if s.dtype != Precision::F32 {
            mine.iter().for_each(|&n| y.add(Part::Master, n, 4));
        }
        for _ in 0..2 {
            mine.iter().for_each(|&n| y.add(Part::Optimizer, n, 4));
        }
    }
    let n = s.batch * s.seq;
    match shape {
        Shape::Gpt2(cfg) => gpt2_activations(&mut y, cfg, s, t),
        Shape::Llama(cfg) => llama_activations(&mut y, cfg, s, t),
    }
    if let Some(l) = &s.lora {
        let layers = match shape {
            Shape::Gpt2(c) => c.layers,
            Shape::Llama(c) => c.layers,
        };
        // Each adapter's saved `x·A` `[N, r]` and one scratch of that size.
        for _ in 0..layers * l.modules.len() + 1 {
            y.add(Part::Activations, n * l.rank, t);
        }
    }
    // The backend: two token-id flags per micro-batch (u32), the step's scalars (one f32 per
    // micro-batch and the norm), this micro-batch's inputs and targets (i32).
    y.add(Part::Workspace, 2 * s.grad_accum, 4);
    y.add(Part::Workspace, s.grad_accum + 1, 4);
    y.add(Part::Workspace, n, 4);
    y.add(Part::Workspace, n, 4);
    // The norm op's scratch: one f32 per 64 Ki elements of each trained tensor; the layer
    // norms' backward partials (at most one row group per row, two [C] f32 each).
    let chunks: usize = trained.iter().map(|&n| n.div_ceil(1 << 16)).sum();
    let (c, norms) = match shape {
        Shape::Gpt2(cfg) => (cfg.channels, 2),
        Shape::Llama(cfg) => (cfg.channels, 1),
    };
    let ln_partial = n.min(NORM_GROUPS) * norms * c;
    y.add(Part::Workspace, chunks.max(ln_partial), 4);
    if s.world > 1 {
        // The loss average and the f16 skip vote across ranks.
        y.add(Part::Workspace, s.world, 4);
        y.add(Part::Workspace, 1, 4);
    }
    let peak = y.parts.iter().sum();
    Estimate {
        parts: y.parts,
        buffers: y.buffers,
        margin: margin(&y.sizes, peak),
        rank,
    }
}

/// The most row groups a norm backward's partials take (a device's CUs times the blocks per
/// CU; 4 × 120 CUs of a K100_AI, rounded up).
const NORM_GROUPS: usize = 512;

/// GPT-2's activations, logits and backward scratch (`crate::model::Gpt2::build`).
fn gpt2_activations(y: &mut Tally, cfg: &GptConfig, s: &Settings, t: usize) {
    let (b, n, c, f) = (s.batch, s.batch * s.seq, cfg.channels, cfg.inner);
    let layer = |y: &mut Tally| {
        for (len, bytes) in [
            (n * c, t),
            (n, 4),
            (n, 4),
            (n * 3 * c, t),
            (n * c, t),
            (b * cfg.heads * s.seq, 4),
            (n * c, t),
            (n * c, t),
            (n, 4),
            (n, 4),
            (n * f, t),
            (n * f, t),
        ] {
            y.add(Part::Activations, len, bytes);
        }
    };
    layers(y, cfg.layers, n * c, t, s.grad_checkpoint, layer);
    y.add(Part::Activations, n * c, t); // encoded
    y.add(Part::Activations, n * c, t); // lnf
    y.add(Part::Activations, n, 4);
    y.add(Part::Activations, n, 4);
    y.add(Part::LogitsLoss, n * cfg.vocab, t);
    y.add(Part::LogitsLoss, n, 4);
    for len in [n * c, n * c, n * 3 * c, n * f, n * f, n * c] {
        y.add(Part::Workspace, len, t);
    }
    if s.lora.is_some() {
        // The frozen layer norms' unused weight gradients.
        y.add(Part::Workspace, c, t);
        y.add(Part::Workspace, c, t);
    }
}

/// The LLaMA family's activations, logits and backward scratch
/// (`crate::llama::model::Llama::new`).
fn llama_activations(y: &mut Tally, cfg: &LlamaConfig, s: &Settings, t: usize) {
    let (n, c, f) = (s.batch * s.seq, cfg.channels, cfg.inner);
    let qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim;
    let hd = cfg.heads * cfg.head_dim;
    let layer = |y: &mut Tally| {
        for (len, bytes) in [
            (n * c, t),
            (n, 4),
            (n * qkv, t),
            (n * hd, t),
            (n * cfg.heads, 4),
            (n * c, t),
            (n * c, t),
            (n, 4),
            (n * 2 * f, t),
            (n * f, t),
        ] {
            y.add(Part::Activations, len, bytes);
        }
    };
    layers(y, cfg.layers, n * c, t, s.grad_checkpoint, layer);
    y.add(Part::Activations, n * c, t); // embedded
    y.add(Part::Activations, n * c, t); // final norm
    y.add(Part::Activations, n, 4);
    y.add(Part::LogitsLoss, n * cfg.vocab, t);
    y.add(Part::LogitsLoss, n, 4);
    for len in [
        n * c,
        n * c,
        n * qkv,
        n * hd,
        n * 2 * f,
        n * f,
        s.seq * c,
        s.seq * c,
    ] {
        y.add(Part::Workspace, len, t);
    }
    // The rotary table and the stream's positions.
    y.add(Part::Workspace, cfg.head_dim / 2, 4);
    y.add(Part::Workspace, n, 4);
}

/// `count` layers' saved activations: each layer's output `[N, C]` (`output` elements; the
/// next layer's input) and (`layer` adds one layer's) the rest of its activations, of every
/// layer, or with checkpointing of one layer at a time (recomputed in the backward).
fn layers(
    y: &mut Tally,
    count: usize,
    output: usize,
    t: usize,
    checkpoint: bool,
    layer: impl Fn(&mut Tally),
) {
    for _ in 0..count {
        y.add(Part::Activations, output, t);
    }
    let sets = match checkpoint {
        true => count.min(1),
        false => count,
    };
    for _ in 0..sets {
        layer(y);
    }
}
