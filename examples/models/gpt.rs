//! A character GPT in candle (pre-norm blocks: causal attention and a GeLU MLP), whole on
//! one device, and the same model tensor-parallel with `coconet_candle::parallel`:
//! token embedding and output head split by vocabulary, attention by heads, the MLP by
//! hidden features, layer norms and position embeddings on every rank. The tensor-
//! parallel model is made from the whole one (`ParallelGpt::shard`), so both start from
//! the same weights.

use candle_core::{D, Device, Module, Tensor, Var};
use candle_nn::{Activation, Embedding, Linear, VarBuilder};
use coconet_candle::parallel::{
    ColumnParallelLinear, Dropout, ParallelAttention, ParallelMlp, TensorParallel,
    VocabParallelEmbedding, dropout, dropout_slice, vocab_parallel_cross_entropy,
};

/// The text as token ids, and the vocabulary.
pub struct Corpus {
    /// Every character of the text as its index in `vocab`.
    pub ids: Vec<u32>,
    /// The distinct characters, sorted.
    pub vocab: Vec<char>,
}

impl Corpus {
    /// Tokenizes `text` by character.
    pub fn new(text: &str) -> Corpus {
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids = text
            .chars()
            .map(|c| vocab.binary_search(&c).expect("in the vocabulary") as u32)
            .collect();
        Corpus { ids, vocab }
    }

    /// Batch `step`'s sequences `from..to` of `context` tokens (inputs and next-token
    /// targets), at fixed pseudo-random offsets, so every run and every P sees the same
    /// global batches.
    pub fn batch(
        &self,
        context: usize,
        step: usize,
        from: usize,
        to: usize,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let span = self.ids.len() - context - 1;
        let (mut x, mut y) = (Vec::new(), Vec::new());
        for j in from..to {
            let mut h = (step * 7919 + j * 104_729) as u64 ^ 0x5DEE_CE66;
            h = h.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let at = (h >> 33) as usize % span;
            x.extend_from_slice(&self.ids[at..at + context]);
            y.extend_from_slice(&self.ids[at + 1..at + context + 1]);
        }
        let n = to - from;
        Ok((
            Tensor::from_vec(x, (n, context), &Device::Cpu)?,
            Tensor::from_vec(y, (n, context), &Device::Cpu)?,
        ))
    }
}

/// The bound of the uniform initial values of parameter `name` of shape `dims` in a
/// seeded model: linear layers ±1/√fan_in as candle-nn draws them (biases too),
/// embeddings ±0.1, norms as built (one and zero: `None`).
pub fn init_bound(name: &str, dims: &[usize]) -> Option<f32> {
    if name.contains("norm") {
        None
    } else if name.starts_with("tokens") || name.starts_with("positions") {
        Some(0.1)
    } else {
        let fan_in = if dims.len() == 2 { dims[1] } else { dims[0] };
        Some(1.0 / (fan_in as f32).sqrt())
    }
}

/// The model's sizes.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Transformer blocks.
    pub layers: usize,
    /// Embedding width.
    pub width: usize,
    /// Attention heads per block.
    pub heads: usize,
    /// Tokens per sequence.
    pub context: usize,
    /// Vocabulary size.
    pub vocab: usize,
}

/// Layer norm over the last dim with differentiable ops (candle-nn's fused one has no
/// backward pass).
#[derive(Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
}

impl LayerNorm {
    fn new(width: usize, vb: VarBuilder) -> candle_core::Result<LayerNorm> {
        Ok(LayerNorm {
            weight: vb.get_with_hints(width, "weight", candle_nn::Init::Const(1.0))?,
            bias: vb.get_with_hints(width, "bias", candle_nn::Init::Const(0.0))?,
        })
    }

    /// A copy in new `Var`s (a rank's own replica).
    fn replica(&self, vars: &mut Vec<Var>) -> candle_core::Result<LayerNorm> {
        Ok(LayerNorm {
            weight: fresh(&self.weight, vars)?,
            bias: fresh(&self.bias, vars)?,
        })
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let mean = x.mean_keepdim(D::Minus1)?;
        let centred = x.broadcast_sub(&mean)?;
        let var = centred.sqr()?.mean_keepdim(D::Minus1)?;
        centred
            .broadcast_div(&(var + 1e-5)?.sqrt()?)?
            .broadcast_mul(&self.weight)?
            .broadcast_add(&self.bias)
    }
}

/// `t` copied into a new `Var` (pushed onto `vars`).
fn fresh(t: &Tensor, vars: &mut Vec<Var>) -> candle_core::Result<Tensor> {
    let v = Var::from_tensor(&t.copy()?)?;
    vars.push(v.clone());
    Ok(v.as_tensor().clone())
}

/// `x` through dropout `d`, if any (the mask over the whole of `x`).
fn maybe(x: Tensor, d: Option<Dropout>) -> candle_core::Result<Tensor> {
    match d {
        Some(d) => dropout(&x, &d),
        None => Ok(x),
    }
}

/// The dropout of each place of the model: the embeddings' (site 0), then per block
/// its attention's (`1 + 2i`: probabilities and output) and its MLP's (`2 + 2i`).
fn sites(d: Option<Dropout>, block: usize) -> (Option<Dropout>, Option<Dropout>) {
    let at = |s: usize| d.map(|d| d.site(s as u64));
    (at(1 + 2 * block), at(2 + 2 * block))
}

/// One block, whole.
pub struct Block {
    norm1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    norm2: LayerNorm,
    up: Linear,
    down: Linear,
    heads: usize,
}

impl Block {
    fn new(s: &Shape, vb: VarBuilder) -> candle_core::Result<Block> {
        let w = s.width;
        Ok(Block {
            norm1: LayerNorm::new(w, vb.pp("norm1"))?,
            qkv: candle_nn::linear(w, 3 * w, vb.pp("qkv"))?,
            proj: candle_nn::linear(w, w, vb.pp("proj"))?,
            norm2: LayerNorm::new(w, vb.pp("norm2"))?,
            up: candle_nn::linear(w, 4 * w, vb.pp("up"))?,
            down: candle_nn::linear(4 * w, w, vb.pp("down"))?,
            heads: s.heads,
        })
    }

    /// The block, with dropout where `d` gives one: `attention` for the attention
    /// probabilities (its `site(0)`) and output (`site(1)`), `mlp` for the MLP's output.
    fn forward(
        &self,
        x: &Tensor,
        mask: &Tensor,
        (attention_d, mlp_d): (Option<Dropout>, Option<Dropout>),
    ) -> candle_core::Result<Tensor> {
        let (b, t, w) = x.dims3()?;
        let hd = w / self.heads;
        let qkv = self.qkv.forward(&self.norm1.forward(x)?)?;
        let head = |i: usize| -> candle_core::Result<Tensor> {
            qkv.narrow(2, i * w, w)?
                .reshape((b, t, self.heads, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let (q, k, v) = (head(0)?, head(1)?, head(2)?);
        let scores = (q.matmul(&k.t()?.contiguous()?)? / (hd as f64).sqrt())?;
        let mut attention = candle_nn::ops::softmax(&scores.broadcast_add(mask)?, D::Minus1)?;
        if let Some(d) = &attention_d {
            attention = dropout(&attention, &d.site(0))?;
        }
        let y = attention
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((b, t, w))?;
        let x = (x + maybe(self.proj.forward(&y)?, attention_d.map(|d| d.site(1)))?)?;
        let h = Activation::NewGelu.forward(&self.up.forward(&self.norm2.forward(&x)?)?)?;
        x + maybe(self.down.forward(&h)?, mlp_d)?
    }
}

/// The whole model on one device; its parameters live in the `VarMap` it was built from.
pub struct Gpt {
    /// Dropout while training (none by default; set a new seed every step).
    pub dropout: Option<Dropout>,
    tokens: Embedding,
    positions: Embedding,
    blocks: Vec<Block>,
    norm: LayerNorm,
    head: Linear,
    mask: Tensor,
}

/// The causal mask `[T, T]` on `device`: 0 on and below the diagonal, -inf above.
fn causal_mask(t: usize, device: &Device) -> candle_core::Result<Tensor> {
    let mask: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    Tensor::from_vec(mask, (t, t), device)
}

impl Gpt {
    /// A model of shape `s` whose parameters `vb` gives (fresh ones in a `VarMap`:
    /// candle-nn's initialisers).
    pub fn new(s: &Shape, vb: VarBuilder) -> candle_core::Result<Gpt> {
        let blocks = (0..s.layers)
            .map(|i| Block::new(s, vb.pp(format!("block{i}"))))
            .collect::<candle_core::Result<_>>()?;
        Ok(Gpt {
            dropout: None,
            tokens: candle_nn::embedding(s.vocab, s.width, vb.pp("tokens"))?,
            positions: candle_nn::embedding(s.context, s.width, vb.pp("positions"))?,
            blocks,
            norm: LayerNorm::new(s.width, vb.pp("norm"))?,
            head: candle_nn::linear(s.width, s.vocab, vb.pp("head"))?,
            mask: causal_mask(s.context, vb.device())?,
        })
    }

    /// The same model with every parameter tensor `p` replaced by `f(p)` (e.g. its
    /// gradient: sharding that gives each rank's expected gradients).
    pub fn map_params(
        &self,
        f: &dyn Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> candle_core::Result<Gpt> {
        let linear = |l: &Linear| -> candle_core::Result<Linear> {
            Ok(Linear::new(f(l.weight())?, l.bias().map(f).transpose()?))
        };
        let embedding = |e: &Embedding| -> candle_core::Result<Embedding> {
            Ok(Embedding::new(f(e.embeddings())?, e.hidden_size()))
        };
        let norm = |n: &LayerNorm| -> candle_core::Result<LayerNorm> {
            Ok(LayerNorm {
                weight: f(&n.weight)?,
                bias: f(&n.bias)?,
            })
        };
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                Ok(Block {
                    norm1: norm(&b.norm1)?,
                    qkv: linear(&b.qkv)?,
                    proj: linear(&b.proj)?,
                    norm2: norm(&b.norm2)?,
                    up: linear(&b.up)?,
                    down: linear(&b.down)?,
                    heads: b.heads,
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Gpt {
            dropout: self.dropout,
            tokens: embedding(&self.tokens)?,
            positions: embedding(&self.positions)?,
            blocks,
            norm: norm(&self.norm)?,
            head: linear(&self.head)?,
            mask: self.mask.clone(),
        })
    }

    /// Logits `[B, T, V]` for token ids `[B, T]`.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let t = ids.dim(1)?;
        let positions = Tensor::arange(0, t as u32, ids.device())?;
        let x = self
            .tokens
            .forward(ids)?
            .broadcast_add(&self.positions.forward(&positions)?)?;
        let mut x = maybe(x, self.dropout.map(|d| d.site(0)))?;
        for (i, block) in self.blocks.iter().enumerate() {
            x = block.forward(&x, &self.mask, sites(self.dropout, i))?;
        }
        self.head.forward(&self.norm.forward(&x)?)
    }

    /// The mean cross-entropy of predicting `targets` `[B, T]` from `ids` `[B, T]`.
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        let logits = self.forward(ids)?;
        let (b, t, v) = logits.dims3()?;
        candle_nn::loss::cross_entropy(&logits.reshape((b * t, v))?, &targets.reshape(b * t)?)
    }
}

/// One block over this rank's heads and hidden features.
pub struct ParallelBlock {
    norm1: LayerNorm,
    attention: ParallelAttention,
    norm2: LayerNorm,
    mlp: ParallelMlp,
}

/// How much of a row-parallel layer's epilogue runs inside its all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Epilogue {
    /// None: the all-reduce, then candle adds the bias and the residual (separate calls,
    /// as Megatron-LM does without its fused kernels).
    Separate,
    /// Bias, dropout and residual inside the all-reduce (the default): bitwise the
    /// separate calls.
    Fused,
    /// The layer norm that follows too (the paper's whole epilogue; each rank
    /// normalises its block of the rows): within rounding of candle's norm.
    FusedWithNorm,
}

/// The tensor-parallel model: this rank's shard of a [`Gpt`].
pub struct ParallelGpt {
    /// Dropout while training (none by default; set a new seed every step): the same
    /// masks as the whole model's with the same dropout.
    pub dropout: Option<Dropout>,
    tokens: VocabParallelEmbedding,
    positions: Embedding,
    blocks: Vec<ParallelBlock>,
    norm: LayerNorm,
    head: ColumnParallelLinear,
    mask: Tensor,
    tp: TensorParallel,
    /// Whether activations between the tensor-parallel regions hold only this rank's
    /// block of the tokens (the sequence-parallel variant; off by default).
    pub sequence_parallel: bool,
    /// The parameters every rank holds whole (position embeddings, layer norms,
    /// row-parallel biases): under the sequence-parallel variant their gradients are
    /// partial on each rank.
    pub replicated: Vec<Var>,
    /// How much of each row-parallel layer's epilogue runs inside its all-reduce (not
    /// used under `sequence_parallel`).
    pub epilogue: Epilogue,
    /// This rank's parameters, in a fixed order.
    pub vars: Vec<Var>,
}

impl ParallelGpt {
    /// This rank's shard of `whole` (new `Var`s; `whole` is not changed).
    pub fn shard(whole: &Gpt, tp: &TensorParallel) -> candle_core::Result<ParallelGpt> {
        let mut vars = Vec::new();
        let tokens = VocabParallelEmbedding::shard(&whole.tokens, tp)?;
        vars.extend(tokens.vars());
        let positions = Embedding::new(
            fresh(whole.positions.embeddings(), &mut vars)?,
            whole.positions.hidden_size(),
        );
        let mut replicated = vec![vars[vars.len() - 1].clone()];
        let mut blocks = Vec::new();
        for b in &whole.blocks {
            let mut norms = Vec::new();
            let block = ParallelBlock {
                norm1: b.norm1.replica(&mut norms)?,
                attention: ParallelAttention::shard(&b.qkv, &b.proj, b.heads, tp)?,
                norm2: b.norm2.replica(&mut norms)?,
                mlp: ParallelMlp::shard(&b.up, Activation::NewGelu, &b.down, tp)?,
            };
            vars.extend(norms[..2].iter().cloned());
            vars.extend(block.attention.vars());
            vars.extend(norms[2..].iter().cloned());
            vars.extend(block.mlp.vars());
            replicated.extend(norms);
            replicated.extend(block.attention.replicated_vars());
            replicated.extend(block.mlp.replicated_vars());
            blocks.push(block);
        }
        let mut norms = Vec::new();
        let norm = whole.norm.replica(&mut norms)?;
        vars.extend(norms.iter().cloned());
        replicated.extend(norms);
        let head = ColumnParallelLinear::shard(&whole.head, tp)?;
        vars.extend(head.vars());
        Ok(ParallelGpt {
            dropout: whole.dropout,
            tokens,
            positions,
            blocks,
            norm,
            head,
            mask: whole.mask.clone(),
            tp: tp.clone(),
            epilogue: Epilogue::Fused,
            sequence_parallel: false,
            replicated,
            vars,
        })
    }

    /// The model with every block's matmuls overlapped with their all-reduces in
    /// `chunks` row chunks (`with_overlap` on the layers); the row-parallel layers then
    /// add their bias and the residual after the all-reduce ([`Epilogue::Separate`]).
    pub fn with_overlap(mut self, chunks: usize) -> ParallelGpt {
        self.epilogue = Epilogue::Separate;
        self.blocks = self
            .blocks
            .into_iter()
            .map(|b| ParallelBlock {
                attention: b.attention.with_overlap(chunks),
                mlp: b.mlp.with_overlap(chunks),
                ..b
            })
            .collect();
        self
    }

    /// The whole model on every rank (every rank calls it): to save a single-device
    /// checkpoint of a model trained tensor-parallel.
    pub fn gather(&self) -> candle_core::Result<Gpt> {
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                let (qkv, proj) = b.attention.gather()?;
                let (up, down) = b.mlp.gather()?;
                Ok(Block {
                    norm1: b.norm1.clone(),
                    qkv,
                    proj,
                    norm2: b.norm2.clone(),
                    up,
                    down,
                    heads: b.attention.heads() * self.tp.size(),
                })
            })
            .collect::<candle_core::Result<_>>()?;
        Ok(Gpt {
            dropout: self.dropout,
            tokens: self.tokens.gather()?,
            positions: self.positions.clone(),
            blocks,
            norm: self.norm.clone(),
            head: self.head.gather()?,
            mask: self.mask.clone(),
        })
    }

    /// Under the sequence-parallel variant, sums the partial gradients of the
    /// parameters every rank holds whole over the ranks (every rank calls it, before
    /// its optimizer step); otherwise they are whole already.
    pub fn sum_partial_gradients(
        &self,
        grads: &mut candle_core::backprop::GradStore,
    ) -> candle_core::Result<()> {
        if !self.sequence_parallel {
            return Ok(());
        }
        for v in &self.replicated {
            if let Some(g) = grads.get(v.as_tensor()) {
                let sum = self.tp.sum_over_ranks(g)?;
                grads.insert(v.as_tensor(), sum);
            }
        }
        Ok(())
    }

    /// This rank's columns of the logits, `[B, T, V/P]`.
    pub fn forward(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        if self.sequence_parallel {
            return self.forward_sequence_parallel(ids);
        }
        let t = ids.dim(1)?;
        let positions = Tensor::arange(0, t as u32, ids.device())?;
        let x = self
            .tokens
            .forward(ids)?
            .broadcast_add(&self.positions.forward(&positions)?)?;
        let mut x = maybe(x, self.dropout.map(|d| d.site(0)))?;
        if self.epilogue == Epilogue::FusedWithNorm {
            return self.forward_fused_norms(x);
        }
        for (i, b) in self.blocks.iter().enumerate() {
            let (a, m) = (&b.attention, &b.mlp);
            let (ad, md) = sites(self.dropout, i);
            if self.epilogue == Epilogue::Fused {
                x = a.forward_residual(&b.norm1.forward(&x)?, &self.mask, &x, ad.as_ref())?;
                x = m.forward_residual(&b.norm2.forward(&x)?, &x, md.as_ref())?;
            } else {
                let out = a.forward_with(&b.norm1.forward(&x)?, &self.mask, ad.as_ref())?;
                x = (&x + maybe(out, ad.map(|d| d.site(1)))?)?;
                x = (&x + maybe(m.forward(&b.norm2.forward(&x)?)?, md)?)?;
            }
        }
        self.head.forward(&self.norm.forward(&x)?)
    }

    /// The blocks from the embeddings `x` with every layer norm after a residual
    /// addition fused into the all-reduce before it: each sublayer gives the residual
    /// stream and the next sublayer's normalised input.
    fn forward_fused_norms(&self, mut x: Tensor) -> candle_core::Result<Tensor> {
        let params = |n: &LayerNorm| (n.weight.clone(), n.bias.clone());
        let mut normed = match self.blocks.first() {
            Some(b) => b.norm1.forward(&x)?,
            None => self.norm.forward(&x)?,
        };
        for (i, b) in self.blocks.iter().enumerate() {
            let (ad, md) = sites(self.dropout, i);
            let next = self.blocks.get(i + 1).map_or(&self.norm, |n| &n.norm1);
            let (g2, b2) = params(&b.norm2);
            let (x1, n2) = b.attention.forward_residual_norm(
                &normed,
                &self.mask,
                &x,
                ad.as_ref(),
                (&g2, &b2),
            )?;
            let (g, bb) = params(next);
            let (x2, n) = b
                .mlp
                .forward_residual_norm(&n2, &x1, md.as_ref(), (&g, &bb))?;
            x = x2;
            normed = n;
        }
        self.head.forward(&normed)
    }

    /// [`ParallelGpt::forward`] with each rank holding its block of the `B·T` tokens
    /// between the tensor-parallel regions.
    fn forward_sequence_parallel(&self, ids: &Tensor) -> candle_core::Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let n = b * t / self.tp.size();
        let start = self.tp.rank() * n;
        let positions: Vec<u32> = (start..start + n).map(|i| (i % t) as u32).collect();
        let positions = Tensor::from_vec(positions, n, ids.device())?;
        // Dropout on this rank's block of the `[B·T, W]` tokens.
        let whole = [b * t, self.positions.hidden_size()];
        let block = |x: Tensor, d: Option<Dropout>| match d {
            Some(d) => dropout_slice(&x, &d, &whole, 0, start),
            None => Ok(x),
        };
        let x = self
            .tokens
            .forward_sequence_parallel(ids)?
            .add(&self.positions.forward(&positions)?)?;
        let mut x = block(x, self.dropout.map(|d| d.site(0)))?;
        for (i, blk) in self.blocks.iter().enumerate() {
            let (ad, md) = sites(self.dropout, i);
            let normed = blk.norm1.forward(&x)?;
            let a = blk
                .attention
                .forward_sequence_parallel(&normed, b, &self.mask, ad.as_ref())?;
            x = (&x + block(a, ad.map(|d| d.site(1)))?)?;
            let m = blk.mlp.forward_sequence_parallel(&blk.norm2.forward(&x)?)?;
            x = (&x + block(m, md)?)?;
        }
        let logits = self
            .head
            .forward_sequence_parallel(&self.norm.forward(&x)?)?;
        logits.reshape((b, t, logits.dim(1)?))
    }

    /// The mean cross-entropy (the same on every rank), from each rank's logits.
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> candle_core::Result<Tensor> {
        let logits = self.forward(ids)?;
        let (b, t, v) = logits.dims3()?;
        vocab_parallel_cross_entropy(
            &logits.reshape((b * t, v))?,
            &targets.reshape(b * t)?,
            &self.tp,
        )
    }
}
