//! The decoder layer (paper §3.1: masked self-attention, encoder-decoder cross-attention,
//! feed-forward, each a residual sublayer) and the decoder stack, teacher-forced or
//! incremental.

use burn::module::Module;
use burn::nn::Dropout;
use burn::tensor::{backend::Backend, Tensor};
use xfmr_attention::{AttnMask, KvCache, MhaInput, MultiHeadAttention, ProjectedMemory};

use crate::config::{apply_final_norm, check_cache_layers, sublayer};
use crate::encoder::{self_attention, Attend};
use crate::{
    AttentionPositions, BlockError, CrossAttentionCache, DecoderCache, FeedForward, LayerConfig,
    Norm, NormPosition,
};

/// The input of a teacher-forced pass of a [`Decoder`] or a [`DecoderLayer`]: target states
/// and the encoder memory they attend to. Masks follow the workspace's one mask rule: each one
/// given is added to those already set (their union).
///
/// ```
/// # use burn::backend::NdArray;
/// # use burn::tensor::Tensor;
/// # use xfmr_attention::AttnMask;
/// # use xfmr_blocks::DecoderInput;
/// # let device = Default::default();
/// let tgt = Tensor::<NdArray, 3>::zeros([2, 5, 16], &device);
/// let memory = Tensor::<NdArray, 3>::zeros([2, 7, 16], &device);
/// let src_pad = AttnMask::padding_from_lengths(&[7, 4], 7, &device).unwrap();
/// let input = DecoderInput::new(tgt, &memory).memory_mask(src_pad);
/// ```
#[derive(Debug, Clone)]
pub struct DecoderInput<B: Backend> {
    /// Target states `[batch, seq, d_model]`.
    pub x: Tensor<B, 3>,
    /// Encoder output `[batch, seq_src, d_model]`.
    pub memory: Tensor<B, 3>,
    /// Target keys to ignore (padding), on top of the causal mask.
    pub self_mask: Option<AttnMask<B>>,
    /// Source keys to ignore (padding) in cross-attention.
    pub memory_mask: Option<AttnMask<B>>,
}

impl<B: Backend> DecoderInput<B> {
    /// Target states `x` `[batch, seq, d_model]` attending to `memory`
    /// `[batch, seq_src, d_model]`.
    pub fn new(x: Tensor<B, 3>, memory: &Tensor<B, 3>) -> Self {
        Self {
            x,
            memory: memory.clone(),
            self_mask: None,
            memory_mask: None,
        }
    }

    /// Adds target padding (`true` = ignored), broadcastable to `[batch, heads, seq, seq]`.
    pub fn self_mask(mut self, mask: AttnMask<B>) -> Self {
        AttnMask::add_to(&mut self.self_mask, mask);
        self
    }

    /// Adds source padding (`true` = ignored), broadcastable to `[batch, heads, seq, seq_src]`.
    pub fn memory_mask(mut self, mask: AttnMask<B>) -> Self {
        AttnMask::add_to(&mut self.memory_mask, mask);
        self
    }
}

/// The input of one incremental step of a [`Decoder`] ([`Decoder::step`]): the new target
/// states only. The memory and its mask were given to [`Decoder::start`] and live, projected,
/// in the [`DecoderCache`].
#[derive(Debug, Clone)]
pub struct DecoderStepInput<B: Backend> {
    /// New target states `[batch, new, d_model]`.
    pub x: Tensor<B, 3>,
    /// Target keys to ignore, on top of the causal mask.
    pub self_mask: Option<AttnMask<B>>,
    /// Return the last layer's cross-attention weights in [`DecoderOutput::cross_weights`].
    pub need_weights: bool,
}

impl<B: Backend> DecoderStepInput<B> {
    /// New target states `x` `[batch, new, d_model]`.
    pub fn new(x: Tensor<B, 3>) -> Self {
        Self {
            x,
            self_mask: None,
            need_weights: false,
        }
    }

    /// Adds target padding (`true` = ignored), broadcastable to `[batch, heads, new, past + new]`.
    pub fn self_mask(mut self, mask: AttnMask<B>) -> Self {
        AttnMask::add_to(&mut self.self_mask, mask);
        self
    }

    /// Requests the last layer's cross-attention weights.
    pub fn need_weights(mut self) -> Self {
        self.need_weights = true;
        self
    }
}

/// The output of a cached decoder step.
#[derive(Debug, Clone)]
pub struct DecoderOutput<B: Backend> {
    /// `[batch, new, d_model]`.
    pub hidden: Tensor<B, 3>,
    /// The **last** layer's cross-attention `[batch, heads, new, seq_src]`, when requested
    /// (the layer whose attention aligns best with the source in practice; fairseq's default
    /// alignment layer).
    pub cross_weights: Option<Tensor<B, 4>>,
}

impl LayerConfig {
    /// Builds a decoder layer.
    ///
    /// # Errors
    /// Any invalid size, dropout or ε, with its value. The layer applies no positions; a stack
    /// gives it its own ([`StackConfig::positions`](crate::StackConfig::positions)), or
    /// [`with_positions`](DecoderLayer::with_positions) does.
    pub fn init_decoder<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<DecoderLayer<B>, BlockError> {
        let norm = self.norm_config();
        Ok(DecoderLayer {
            self_attn: self.attention().init(device)?,
            cross_attn: self.attention().init(device)?,
            ffn: self.feed_forward(device)?,
            norm_self: norm.init(device)?,
            norm_cross: norm.init(device)?,
            norm_ff: norm.init(device)?,
            dropout: self.residual_dropout()?,
            norm_position: self.norm_position,
            positions: None,
        })
    }
}

/// Decoder layer: masked self-attention, encoder-decoder cross-attention, feed-forward.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    /// Causal self-attention.
    pub self_attn: MultiHeadAttention<B>,
    /// Cross-attention over the encoder memory (PyTorch `multihead_attn`).
    pub cross_attn: MultiHeadAttention<B>,
    /// Feed-forward network.
    pub ffn: FeedForward<B>,
    /// Norm of the self-attention sublayer (PyTorch `norm1`).
    pub norm_self: Norm<B>,
    /// Norm of the cross-attention sublayer (PyTorch `norm2`).
    pub norm_cross: Norm<B>,
    /// Norm of the feed-forward sublayer (PyTorch `norm3`).
    pub norm_ff: Norm<B>,
    /// Residual dropout.
    pub dropout: Dropout,
    /// Norm placement.
    pub norm_position: NormPosition,
    /// RoPE or ALiBi in self-attention (never in cross-attention), if the layer uses either.
    pub positions: Option<AttentionPositions>,
}

/// Where cross-attention's keys and values come from.
enum Cross<'a, B: Backend> {
    /// Projected from the memory in this call (teacher forcing).
    Memory(&'a Tensor<B, 3>),
    /// Projected once when decoding started.
    Projected(&'a ProjectedMemory<B>),
}

/// One layer's pass, whichever the input: its parts.
struct LayerPass<'a, B: Backend> {
    x: Tensor<B, 3>,
    self_mask: Option<AttnMask<B>>,
    memory_mask: Option<AttnMask<B>>,
    cross: Cross<'a, B>,
    need_weights: bool,
}

impl<B: Backend> DecoderLayer<B> {
    /// The same layer applying `positions` (RoPE, ALiBi) in its self-attention.
    pub fn with_positions(mut self, positions: Option<AttentionPositions>) -> Self {
        self.positions = positions;
        self
    }

    /// Full (teacher-forced) pass; self-attention is causal.
    ///
    /// # Shapes
    /// - `input.x`: `[batch, seq, d_model]`; `input.memory`: `[batch, seq_src, d_model]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// On shape mismatches.
    pub fn forward(&self, input: DecoderInput<B>) -> Tensor<B, 3> {
        self.run(
            LayerPass {
                x: input.x,
                self_mask: input.self_mask,
                memory_mask: input.memory_mask,
                cross: Cross::Memory(&input.memory),
                need_weights: false,
            },
            Attend::Causal,
        )
        .0
    }

    fn run(
        &self,
        pass: LayerPass<'_, B>,
        mode: Attend<'_, B>,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 4>>) {
        let LayerPass {
            x,
            self_mask,
            memory_mask,
            cross,
            need_weights,
        } = pass;
        let x = sublayer(x, &self.norm_self, self.norm_position, &self.dropout, |h| {
            let positions = self.positions.as_ref();
            self_attention(&self.self_attn, positions, h, self_mask, mode, false).0
        });
        let mut weights = None;
        let x = sublayer(
            x,
            &self.norm_cross,
            self.norm_position,
            &self.dropout,
            |h| {
                let input = match cross {
                    Cross::Memory(memory) => MhaInput::cross(h, memory.clone()),
                    Cross::Projected(memory) => MhaInput::cross_projected(h, memory.clone()),
                };
                let mut input = input.mask_opt(memory_mask);
                if need_weights {
                    input = input.need_weights();
                }
                let out = self
                    .cross_attn
                    .try_forward(input)
                    .unwrap_or_else(|e| panic!("DecoderLayer cross-attention: {e}"));
                weights = out.weights;
                out.context
            },
        );
        let x = sublayer(x, &self.norm_ff, self.norm_position, &self.dropout, |h| {
            self.ffn.forward(h)
        });
        (x, weights)
    }
}

/// A stack of decoder layers, optionally followed by a norm: the paper's decoder.
#[derive(Module, Debug)]
pub struct Decoder<B: Backend> {
    /// The layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// Final norm (PyTorch `decoder.norm`).
    pub norm: Option<Norm<B>>,
}

impl<B: Backend> Decoder<B> {
    /// Full teacher-forced pass: position `i` sees target positions `≤ i` and the whole memory.
    ///
    /// # Shapes
    /// - `input.x`: `[batch, seq, d_model]`; `input.memory`: `[batch, seq_src, d_model]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// On shape mismatches.
    pub fn forward(&self, input: DecoderInput<B>) -> Tensor<B, 3> {
        self.forward_impl(input, false).0
    }

    /// [`forward`](Self::forward) that also returns every layer's cross-attention weights
    /// (which source positions each target position reads): what an alignment map shows.
    ///
    /// # Shapes
    /// - output: `[batch, seq, d_model]`; weights: one `[batch, heads, seq, seq_src]` per layer
    ///
    /// # Panics
    /// On shape mismatches.
    pub fn forward_with_weights(
        &self,
        input: DecoderInput<B>,
    ) -> (Tensor<B, 3>, Vec<Tensor<B, 4>>) {
        self.forward_impl(input, true)
    }

    fn forward_impl(
        &self,
        input: DecoderInput<B>,
        need_weights: bool,
    ) -> (Tensor<B, 3>, Vec<Tensor<B, 4>>) {
        let DecoderInput {
            mut x,
            memory,
            self_mask,
            memory_mask,
        } = input;
        let mut weights = Vec::new();
        for layer in &self.layers {
            let pass = LayerPass {
                x,
                self_mask: self_mask.clone(),
                memory_mask: memory_mask.clone(),
                cross: Cross::Memory(&memory),
                need_weights,
            };
            let (out, w) = layer.run(pass, Attend::Causal);
            x = out;
            weights.extend(w);
        }
        (apply_final_norm(self.norm.as_ref(), x), weights)
    }

    /// Starts incremental decoding: projects `memory` into every layer's cross-attention keys
    /// and values, once.
    ///
    /// # Shapes
    /// - `memory`: `[batch, seq_src, d_model]`; `memory_mask` broadcastable to
    ///   `[batch, heads, 1, seq_src]`
    pub fn start(
        &self,
        memory: &Tensor<B, 3>,
        memory_mask: Option<AttnMask<B>>,
    ) -> DecoderCache<B> {
        let batch = memory.dims()[0];
        DecoderCache {
            self_attn: (0..self.layers.len()).map(|_| KvCache::new()).collect(),
            cross: CrossAttentionCache::new(
                self.layers
                    .iter()
                    .map(|l| l.cross_attn.project_memory(memory.clone()))
                    .collect(),
                memory_mask,
                batch,
            ),
        }
    }

    /// Incremental pass over new positions after the cached ones; `hidden` equals the matching
    /// rows of [`forward`](Self::forward). The memory and its mask come from the cache.
    ///
    /// # Shapes
    /// - `input.x`: `[batch, new, d_model]`; `input.self_mask` broadcastable to
    ///   `[batch, heads, new, past + new]`
    /// - output `hidden`: `[batch, new, d_model]`; `cross_weights`: `[batch, heads, new, seq_src]`
    ///
    /// # Panics
    /// If `cache` belongs to a stack with another number of layers, or on shape mismatches.
    pub fn step(
        &self,
        input: DecoderStepInput<B>,
        cache: &mut DecoderCache<B>,
    ) -> DecoderOutput<B> {
        check_cache_layers("DecoderCache", cache.self_attn.len(), self.layers.len());
        let last = self.layers.len() - 1;
        let memory_mask = cache.cross.mask.clone();
        let mut x = input.x;
        let mut cross_weights = None;
        let caches = cache.self_attn.iter_mut().zip(&cache.cross.layers);
        for (i, (layer, (self_cache, cross))) in self.layers.iter().zip(caches).enumerate() {
            let pass = LayerPass {
                x,
                self_mask: input.self_mask.clone(),
                memory_mask: memory_mask.clone(),
                cross: Cross::Projected(cross),
                need_weights: input.need_weights && i == last,
            };
            let (out, w) = layer.run(pass, Attend::Cached(self_cache));
            x = out;
            cross_weights = w;
        }
        DecoderOutput {
            hidden: apply_final_norm(self.norm.as_ref(), x),
            cross_weights,
        }
    }
}
