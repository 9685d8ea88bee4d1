//! The encoder layer (paper §3.1: self-attention, then the feed-forward network, each a residual
//! sublayer) and the bidirectional encoder stack.

use burn::module::Module;
use burn::nn::Dropout;
use burn::tensor::{backend::Backend, Tensor};
use xfmr_attention::{AttnMask, KvCache, MhaInput, MultiHeadAttention};

use crate::config::{apply_final_norm, sublayer};
use crate::{AttentionPositions, BlockError, FeedForward, LayerConfig, Norm, NormPosition};

/// The input of a self-attention stack ([`Encoder`] or [`CausalDecoder`](crate::CausalDecoder))
/// and of its layers.
///
/// ```
/// # use burn::backend::NdArray;
/// # use burn::tensor::Tensor;
/// # use xfmr_attention::AttnMask;
/// # use xfmr_blocks::SelfAttentionInput;
/// # let device = Default::default();
/// let x = Tensor::<NdArray, 3>::zeros([2, 5, 16], &device);
/// let pad = AttnMask::padding_from_lengths(&[5, 3], 5, &device).unwrap();
/// let input = SelfAttentionInput::new(x).mask(pad);
/// ```
#[derive(Debug, Clone)]
pub struct SelfAttentionInput<B: Backend> {
    /// `[batch, seq, d_model]`.
    pub x: Tensor<B, 3>,
    /// Ignored keys (`true` = ignored), e.g. padding.
    pub mask: Option<AttnMask<B>>,
}

impl<B: Backend> SelfAttentionInput<B> {
    /// Attention over every position of `x` `[batch, seq, d_model]` (or, in a causal stack,
    /// over every earlier one).
    pub fn new(x: Tensor<B, 3>) -> Self {
        Self { x, mask: None }
    }

    /// Adds a mask (`true` = ignored): the union with any mask already set (the mask rule,
    /// [`AttnMask::add_to`]). Broadcastable to
    /// `[batch, heads, seq, seq_k]`, `seq_k` counting cached keys in a cached step.
    pub fn mask(mut self, mask: AttnMask<B>) -> Self {
        AttnMask::add_to(&mut self.mask, mask);
        self
    }

    /// Adds an optional mask.
    pub fn mask_opt(self, mask: Option<AttnMask<B>>) -> Self {
        mask.into_iter().fold(self, Self::mask)
    }
}

/// How a layer's self-attention sees the keys.
pub(crate) enum Attend<'a, B: Backend> {
    /// Every key (the encoder).
    Bidirectional,
    /// Keys at or before the query (teacher-forced decoding).
    Causal,
    /// New queries after the cached keys, whose keys/values are appended to the cache.
    Cached(&'a mut KvCache<B>),
}

/// Self-attention with the layer's attention positions (RoPE, ALiBi) applied.
pub(crate) fn self_attention<B: Backend>(
    attn: &MultiHeadAttention<B>,
    positions: Option<&AttentionPositions>,
    h: Tensor<B, 3>,
    mask: Option<AttnMask<B>>,
    mode: Attend<'_, B>,
    need_weights: bool,
) -> (Tensor<B, 3>, Option<Tensor<B, 4>>) {
    let [_, seq_q, _] = h.dims();
    let device = h.device();
    let past = match &mode {
        Attend::Cached(cache) => cache.len(),
        _ => 0,
    };
    let mut input = MhaInput::self_attn(h).mask_opt(mask);
    if let Some(positions) = positions {
        input = positions.apply(input, seq_q, past + seq_q, &device);
    }
    if need_weights {
        input = input.need_weights();
    }
    let out = match mode {
        Attend::Bidirectional => attn.forward(input),
        Attend::Causal => attn.forward(input.causal()),
        Attend::Cached(cache) => attn.forward_cached(input, cache),
    };
    (out.context, out.weights)
}

impl LayerConfig {
    /// Builds an encoder layer (also the layer of a causal stack).
    ///
    /// # Errors
    /// Any invalid size, dropout or ε, with its value. The layer applies no positions; a stack
    /// gives it its own ([`StackConfig::positions`](crate::StackConfig::positions)), or
    /// [`with_positions`](SelfAttentionLayer::with_positions) does.
    pub fn init_encoder<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<SelfAttentionLayer<B>, BlockError> {
        let norm = self.norm_config();
        Ok(SelfAttentionLayer {
            self_attn: self.attention().init(device)?,
            ffn: self.feed_forward(device)?,
            norm_attn: norm.init(device)?,
            norm_ff: norm.init(device)?,
            dropout: self.residual_dropout()?,
            norm_position: self.norm_position,
            positions: None,
        })
    }
}

/// The paper's encoder layer: self-attention, then the feed-forward network, each a residual
/// sublayer. Named for what it holds, because two stacks use it: [`Encoder`] (bidirectional) and a
/// [`CausalDecoder`](crate::CausalDecoder), which runs it under a
/// look-ahead mask: GPT's block is the paper's encoder layer made causal.
#[derive(Module, Debug)]
pub struct SelfAttentionLayer<B: Backend> {
    /// Self-attention.
    pub self_attn: MultiHeadAttention<B>,
    /// Feed-forward network.
    pub ffn: FeedForward<B>,
    /// Norm of the attention sublayer (PyTorch `norm1`).
    pub norm_attn: Norm<B>,
    /// Norm of the feed-forward sublayer (PyTorch `norm2`).
    pub norm_ff: Norm<B>,
    /// Residual dropout.
    pub dropout: Dropout,
    /// Norm placement.
    pub norm_position: NormPosition,
    /// RoPE or ALiBi in self-attention, if the layer uses either.
    pub positions: Option<AttentionPositions>,
}

impl<B: Backend> SelfAttentionLayer<B> {
    /// The same layer applying `positions` (RoPE, ALiBi) in its self-attention.
    pub fn with_positions(mut self, positions: Option<AttentionPositions>) -> Self {
        self.positions = positions;
        self
    }

    /// Bidirectional pass (the paper's encoder layer).
    ///
    /// # Shapes
    /// - `input.x`: `[batch, seq, d_model]`; mask broadcastable to `[batch, heads, seq, seq]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// On shape mismatches (see `MultiHeadAttention::forward`).
    pub fn forward(&self, input: SelfAttentionInput<B>) -> Tensor<B, 3> {
        self.run(input, Attend::Bidirectional)
    }

    /// [`forward`](Self::forward) that also returns the self-attention weights.
    ///
    /// # Shapes
    /// - output: `[batch, seq, d_model]` and weights `[batch, heads, seq, seq]`
    pub fn forward_with_weights(
        &self,
        input: SelfAttentionInput<B>,
    ) -> (Tensor<B, 3>, Tensor<B, 4>) {
        let (x, weights) = self.run_weights(input, Attend::Bidirectional, true);
        (x, weights.expect("weights were requested"))
    }

    pub(crate) fn run(&self, input: SelfAttentionInput<B>, mode: Attend<'_, B>) -> Tensor<B, 3> {
        self.run_weights(input, mode, false).0
    }

    fn run_weights(
        &self,
        input: SelfAttentionInput<B>,
        mode: Attend<'_, B>,
        need_weights: bool,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 4>>) {
        let SelfAttentionInput { x, mask } = input;
        let mut weights = None;
        let x = sublayer(x, &self.norm_attn, self.norm_position, &self.dropout, |h| {
            let (context, w) = self_attention(
                &self.self_attn,
                self.positions.as_ref(),
                h,
                mask,
                mode,
                need_weights,
            );
            weights = w;
            context
        });
        let x = sublayer(x, &self.norm_ff, self.norm_position, &self.dropout, |h| {
            self.ffn.forward(h)
        });
        (x, weights)
    }
}

/// A stack of encoder layers, optionally followed by a norm: the paper's encoder.
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    /// The layers.
    pub layers: Vec<SelfAttentionLayer<B>>,
    /// Final norm (PyTorch `encoder.norm`).
    pub norm: Option<Norm<B>>,
}

impl<B: Backend> Encoder<B> {
    /// Bidirectional pass.
    ///
    /// # Shapes
    /// - `input.x`: `[batch, seq, d_model]`; mask: source padding (`true` = ignored)
    /// - output (the memory): `[batch, seq, d_model]`
    pub fn forward(&self, input: SelfAttentionInput<B>) -> Tensor<B, 3> {
        let SelfAttentionInput { x, mask } = input;
        let x = self.layers.iter().fold(x, |x, layer| {
            layer.forward(SelfAttentionInput {
                x,
                mask: mask.clone(),
            })
        });
        apply_final_norm(self.norm.as_ref(), x)
    }

    /// [`forward`](Self::forward) that also returns every layer's self-attention weights: what
    /// an attention map shows.
    ///
    /// # Shapes
    /// - output: `[batch, seq, d_model]`; weights: one `[batch, heads, seq, seq]` per layer
    pub fn forward_with_weights(
        &self,
        input: SelfAttentionInput<B>,
    ) -> (Tensor<B, 3>, Vec<Tensor<B, 4>>) {
        let SelfAttentionInput { mut x, mask } = input;
        let mut weights = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let (out, w) = layer.forward_with_weights(SelfAttentionInput {
                x,
                mask: mask.clone(),
            });
            x = out;
            weights.push(w);
        }
        (apply_final_norm(self.norm.as_ref(), x), weights)
    }
}
