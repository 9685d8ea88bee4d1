//! Encoder and decoder layers (paper §3.1) and their stacks.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{backend::Backend, Int, Tensor};
use xfmr_attention::{AttnMask, KvCache, MhaInput, MultiHeadAttention, MultiHeadAttentionConfig};

use crate::{
    check_dropout, Activation, BlockError, FeedForward, FeedForwardConfig, Norm, NormConfig,
    NormKind, NormPosition,
};

/// Configuration shared by encoder and decoder layers.
#[derive(Config, Debug)]
pub struct LayerConfig {
    /// Model width.
    pub d_model: usize,
    /// Attention heads.
    pub n_heads: usize,
    /// Feed-forward inner width.
    pub d_ff: usize,
    /// Key/value heads for grouped-query attention. Default: `None` (= `n_heads`).
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Residual dropout on each sublayer output before the add (paper: 0.1). Default: 0.1.
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Dropout on attention weights. Default: 0.0.
    #[config(default = 0.0)]
    pub attention_dropout: f64,
    /// Dropout after the feed-forward activation. Default: 0.0.
    #[config(default = 0.0)]
    pub ffn_dropout: f64,
    /// Feed-forward activation. Default: `Relu` (paper).
    #[config(default = "Activation::Relu")]
    pub activation: Activation,
    /// Norm placement. Default: `Post` (paper).
    #[config(default = "NormPosition::Post")]
    pub norm_position: NormPosition,
    /// Norm kind. Default: `LayerNorm` (paper).
    #[config(default = "NormKind::LayerNorm")]
    pub norm: NormKind,
    /// Norm ε. Default: 1e-5.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
}

impl LayerConfig {
    fn attention(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_n_kv_heads(self.n_kv_heads)
            .with_dropout(self.attention_dropout)
    }

    fn parts<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<(FeedForward<B>, NormConfig, Dropout), BlockError> {
        check_dropout(self.dropout)?;
        let ffn = FeedForwardConfig::new(self.d_model, self.d_ff)
            .with_activation(self.activation)
            .with_dropout(self.ffn_dropout)
            .init(device)?;
        let norm = NormConfig::new(self.d_model)
            .with_kind(self.norm)
            .with_eps(self.norm_eps);
        Ok((ffn, norm, DropoutConfig::new(self.dropout).init()))
    }

    /// Builds an encoder layer.
    ///
    /// # Errors
    /// Any invalid size, dropout or ε, with its value.
    pub fn init_encoder<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<EncoderLayer<B>, BlockError> {
        let (ffn, norm, dropout) = self.parts(device)?;
        Ok(EncoderLayer {
            self_attn: self.attention().try_init(device)?,
            ffn,
            norm_attn: norm.init(device)?,
            norm_ff: norm.init(device)?,
            dropout,
            norm_position: self.norm_position,
        })
    }

    /// Builds a decoder layer.
    ///
    /// # Errors
    /// Any invalid size, dropout or ε, with its value.
    pub fn init_decoder<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<DecoderLayer<B>, BlockError> {
        let (ffn, norm, dropout) = self.parts(device)?;
        Ok(DecoderLayer {
            self_attn: self.attention().try_init(device)?,
            cross_attn: self.attention().try_init(device)?,
            ffn,
            norm_self: norm.init(device)?,
            norm_cross: norm.init(device)?,
            norm_ff: norm.init(device)?,
            dropout,
            norm_position: self.norm_position,
        })
    }

    fn final_norm<B: Backend>(&self, device: &B::Device) -> Result<Norm<B>, BlockError> {
        NormConfig::new(self.d_model)
            .with_kind(self.norm)
            .with_eps(self.norm_eps)
            .init(device)
    }
}

/// One residual sublayer: post-norm `Norm(x + Dropout(f(x)))` or pre-norm
/// `x + Dropout(f(Norm(x)))`.
fn sublayer<B: Backend>(
    x: Tensor<B, 3>,
    norm: &Norm<B>,
    position: NormPosition,
    dropout: &Dropout,
    f: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 3>,
) -> Tensor<B, 3> {
    match position {
        NormPosition::Post => norm.forward(x.clone() + dropout.forward(f(x))),
        NormPosition::Pre => x.clone() + dropout.forward(f(norm.forward(x))),
    }
}

/// A stack's optional final norm.
fn apply_final_norm<B: Backend>(norm: Option<&Norm<B>>, x: Tensor<B, 3>) -> Tensor<B, 3> {
    match norm {
        Some(norm) => norm.forward(x),
        None => x,
    }
}

/// Panics unless a cache holds one entry per layer.
fn check_cache_layers(what: &str, cached: usize, layers: usize) {
    assert_eq!(
        cached, layers,
        "{what} has {cached} layers, the stack {layers}"
    );
}

/// Encoder layer: self-attention, then the feed-forward network, each a residual sublayer.
#[derive(Module, Debug)]
pub struct EncoderLayer<B: Backend> {
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
}

impl<B: Backend> EncoderLayer<B> {
    /// Bidirectional pass (the paper's encoder layer).
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`; `mask`: key padding (`true` = ignored) broadcastable to
    ///   `[batch, heads, seq, seq]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Panics
    /// On shape mismatches (see `MultiHeadAttention::forward`).
    pub fn forward(&self, x: Tensor<B, 3>, mask: Option<&AttnMask<B>>) -> Tensor<B, 3> {
        self.forward_with(x, |h| {
            self.self_attn
                .forward(MhaInput::self_attn(h).mask_opt(mask.cloned()))
                .context
        })
    }

    /// Causal pass: position `i` attends to positions `≤ i` only. This is the block of
    /// decoder-only (GPT-like) models, a decoder layer without cross-attention.
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_causal(&self, x: Tensor<B, 3>, mask: Option<&AttnMask<B>>) -> Tensor<B, 3> {
        self.forward_with(x, |h| {
            self.self_attn
                .forward(MhaInput::self_attn(h).causal().mask_opt(mask.cloned()))
                .context
        })
    }

    /// Incremental causal pass over new positions through `cache`; equals the matching rows of
    /// [`forward_causal`](Self::forward_causal) over the whole sequence.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, d_model]`; `mask` covers past and new keys: broadcastable to
    ///   `[batch, heads, new, past + new]`
    /// - output: `[batch, new, d_model]`
    pub fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        cache: &mut KvCache<B>,
        mask: Option<&AttnMask<B>>,
    ) -> Tensor<B, 3> {
        self.forward_with(x, |h| {
            self.self_attn
                .forward_cached(MhaInput::self_attn(h).mask_opt(mask.cloned()), cache)
                .context
        })
    }

    fn forward_with(
        &self,
        x: Tensor<B, 3>,
        attend: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let x = sublayer(
            x,
            &self.norm_attn,
            self.norm_position,
            &self.dropout,
            attend,
        );
        sublayer(x, &self.norm_ff, self.norm_position, &self.dropout, |h| {
            self.ffn.forward(h)
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
}

/// Per-layer key/value caches of a decoder layer.
#[derive(Debug, Clone, Default)]
pub struct DecoderLayerCache<B: Backend> {
    /// Self-attention keys/values, one entry per decoded position.
    pub self_attn: KvCache<B>,
    /// Projected memory keys/values, filled on the first step.
    pub cross_attn: KvCache<B>,
}

impl<B: Backend> DecoderLayer<B> {
    /// Full (teacher-forced) pass; self-attention is causal.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`; `memory`: `[batch, seq_src, d_model]`
    /// - `self_mask`: target padding, broadcastable to `[batch, heads, seq, seq]`
    /// - `memory_mask`: source padding, broadcastable to `[batch, heads, seq, seq_src]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        memory: Tensor<B, 3>,
        self_mask: Option<&AttnMask<B>>,
        memory_mask: Option<&AttnMask<B>>,
    ) -> Tensor<B, 3> {
        let x = sublayer(x, &self.norm_self, self.norm_position, &self.dropout, |h| {
            self.self_attn
                .forward(MhaInput::self_attn(h).causal().mask_opt(self_mask.cloned()))
                .context
        });
        self.cross_and_ffn(x, memory, memory_mask, None, false).0
    }

    /// Incremental pass over new positions through `cache`.
    ///
    /// # Shapes
    /// - `x`: `[batch, new, d_model]`; `self_mask` covers past and new keys:
    ///   broadcastable to `[batch, heads, new, past + new]`
    /// - output: `[batch, new, d_model]`
    pub fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        memory: Tensor<B, 3>,
        cache: &mut DecoderLayerCache<B>,
        self_mask: Option<&AttnMask<B>>,
        memory_mask: Option<&AttnMask<B>>,
    ) -> Tensor<B, 3> {
        self.forward_cached_weights(x, memory, cache, self_mask, memory_mask, false)
            .0
    }

    /// [`forward_cached`](Self::forward_cached), also returning the cross-attention weights
    /// when `need_weights`.
    ///
    /// # Shapes
    /// - weights: `[batch, heads, new, seq_src]`
    pub fn forward_cached_weights(
        &self,
        x: Tensor<B, 3>,
        memory: Tensor<B, 3>,
        cache: &mut DecoderLayerCache<B>,
        self_mask: Option<&AttnMask<B>>,
        memory_mask: Option<&AttnMask<B>>,
        need_weights: bool,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 4>>) {
        let x = sublayer(x, &self.norm_self, self.norm_position, &self.dropout, |h| {
            self.self_attn
                .forward_cached(
                    MhaInput::self_attn(h).mask_opt(self_mask.cloned()),
                    &mut cache.self_attn,
                )
                .context
        });
        self.cross_and_ffn(
            x,
            memory,
            memory_mask,
            Some(&mut cache.cross_attn),
            need_weights,
        )
    }

    fn cross_and_ffn(
        &self,
        x: Tensor<B, 3>,
        memory: Tensor<B, 3>,
        memory_mask: Option<&AttnMask<B>>,
        cache: Option<&mut KvCache<B>>,
        need_weights: bool,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 4>>) {
        let mut weights = None;
        let x = sublayer(
            x,
            &self.norm_cross,
            self.norm_position,
            &self.dropout,
            |h| {
                let mut input = MhaInput::cross(h, memory).mask_opt(memory_mask.cloned());
                if need_weights {
                    input = input.need_weights();
                }
                let out = match cache {
                    Some(cache) => self.cross_attn.forward_cached(input, cache),
                    None => self.cross_attn.forward(input),
                };
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

/// Configuration of a stack of layers.
#[derive(Config, Debug)]
pub struct StackConfig {
    /// The layers' configuration.
    pub layer: LayerConfig,
    /// Number of layers (paper: 6).
    pub n_layers: usize,
    /// A norm after the last layer. PyTorch's `nn.Transformer` always has one; pre-norm stacks
    /// need one; the paper's post-norm stack has none. Default: false.
    #[config(default = false)]
    pub final_norm: bool,
}

impl StackConfig {
    fn checked(&self) -> Result<(), BlockError> {
        if self.n_layers == 0 {
            return Err(BlockError::ZeroDim { name: "n_layers" });
        }
        Ok(())
    }

    /// Builds an encoder stack.
    ///
    /// # Errors
    /// Zero layers, or any invalid layer setting.
    pub fn init_encoder<B: Backend>(&self, device: &B::Device) -> Result<Encoder<B>, BlockError> {
        self.checked()?;
        Ok(Encoder {
            layers: (0..self.n_layers)
                .map(|_| self.layer.init_encoder(device))
                .collect::<Result<_, _>>()?,
            norm: self
                .final_norm
                .then(|| self.layer.final_norm(device))
                .transpose()?,
        })
    }

    /// Builds a decoder stack.
    ///
    /// # Errors
    /// Zero layers, or any invalid layer setting.
    pub fn init_decoder<B: Backend>(&self, device: &B::Device) -> Result<Decoder<B>, BlockError> {
        self.checked()?;
        Ok(Decoder {
            layers: (0..self.n_layers)
                .map(|_| self.layer.init_decoder(device))
                .collect::<Result<_, _>>()?,
            norm: self
                .final_norm
                .then(|| self.layer.final_norm(device))
                .transpose()?,
        })
    }
}

/// A stack of encoder layers, optionally followed by a norm.
#[derive(Module, Debug)]
pub struct Encoder<B: Backend> {
    /// The layers.
    pub layers: Vec<EncoderLayer<B>>,
    /// Final norm (PyTorch `encoder.norm`).
    pub norm: Option<Norm<B>>,
}

impl<B: Backend> Encoder<B> {
    /// Bidirectional pass.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`; `mask`: source padding (`true` = ignored)
    /// - output (the memory): `[batch, seq, d_model]`
    pub fn forward(&self, x: Tensor<B, 3>, mask: Option<&AttnMask<B>>) -> Tensor<B, 3> {
        let x = self
            .layers
            .iter()
            .fold(x, |x, layer| layer.forward(x, mask));
        apply_final_norm(self.norm.as_ref(), x)
    }

    /// Causal pass through every layer (a decoder-only stack, see
    /// [`EncoderLayer::forward_causal`]).
    ///
    /// # Shapes
    /// As [`forward`](Self::forward).
    pub fn forward_causal(&self, x: Tensor<B, 3>, mask: Option<&AttnMask<B>>) -> Tensor<B, 3> {
        let x = self
            .layers
            .iter()
            .fold(x, |x, layer| layer.forward_causal(x, mask));
        apply_final_norm(self.norm.as_ref(), x)
    }

    /// Incremental causal pass; equals the matching rows of
    /// [`forward_causal`](Self::forward_causal).
    ///
    /// # Shapes
    /// - `x`: `[batch, new, d_model]`; `mask` broadcastable to `[batch, heads, new, past + new]`
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `cache` has another number of layers.
    pub fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        cache: &mut SelfAttentionCache<B>,
        mask: Option<&AttnMask<B>>,
    ) -> Tensor<B, 3> {
        check_cache_layers("SelfAttentionCache", cache.layers.len(), self.layers.len());
        let x = self
            .layers
            .iter()
            .zip(&mut cache.layers)
            .fold(x, |x, (layer, cache)| layer.forward_cached(x, cache, mask));
        apply_final_norm(self.norm.as_ref(), x)
    }
}

/// Key/value caches of a causal self-attention stack ([`Encoder::forward_cached`]).
#[derive(Debug, Clone)]
pub struct SelfAttentionCache<B: Backend> {
    /// One per layer.
    pub layers: Vec<KvCache<B>>,
}

impl<B: Backend> SelfAttentionCache<B> {
    /// Empty caches for `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: (0..n_layers).map(|_| KvCache::new()).collect(),
        }
    }

    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, KvCache::len)
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reorders the batch of every cache (beam search).
    ///
    /// # Shapes
    /// - `indices`: `[new_batch]`
    pub fn reorder(&mut self, indices: Tensor<B, 1, Int>) {
        for layer in &mut self.layers {
            layer.reorder(indices.clone());
        }
    }
}

/// A stack of decoder layers, optionally followed by a norm.
#[derive(Module, Debug)]
pub struct Decoder<B: Backend> {
    /// The layers.
    pub layers: Vec<DecoderLayer<B>>,
    /// Final norm (PyTorch `decoder.norm`).
    pub norm: Option<Norm<B>>,
}

/// Key/value caches of every decoder layer.
#[derive(Debug, Clone)]
pub struct DecoderCache<B: Backend> {
    /// One per layer.
    pub layers: Vec<DecoderLayerCache<B>>,
}

impl<B: Backend> DecoderCache<B> {
    /// Empty caches for `n_layers` layers.
    pub fn new(n_layers: usize) -> Self {
        Self {
            layers: (0..n_layers)
                .map(|_| DecoderLayerCache::default())
                .collect(),
        }
    }

    /// Number of decoded positions.
    pub fn len(&self) -> usize {
        self.layers.first().map_or(0, |l| l.self_attn.len())
    }

    /// Whether nothing was decoded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reorders the batch of every cache (beam search).
    ///
    /// # Shapes
    /// - `indices`: `[new_batch]`
    pub fn reorder(&mut self, indices: Tensor<B, 1, Int>) {
        for layer in &mut self.layers {
            layer.self_attn.reorder(indices.clone());
            layer.cross_attn.reorder(indices.clone());
        }
    }
}

impl<B: Backend> Decoder<B> {
    /// Full teacher-forced pass.
    ///
    /// # Shapes
    /// - `x`: `[batch, seq, d_model]`; `memory`: `[batch, seq_src, d_model]`
    /// - output: `[batch, seq, d_model]`
    pub fn forward(
        &self,
        x: Tensor<B, 3>,
        memory: Tensor<B, 3>,
        self_mask: Option<&AttnMask<B>>,
        memory_mask: Option<&AttnMask<B>>,
    ) -> Tensor<B, 3> {
        let x = self.layers.iter().fold(x, |x, layer| {
            layer.forward(x, memory.clone(), self_mask, memory_mask)
        });
        apply_final_norm(self.norm.as_ref(), x)
    }

    /// Incremental pass over new positions; equals the matching rows of [`forward`](Self::forward).
    ///
    /// # Shapes
    /// - `x`: `[batch, new, d_model]`; `self_mask` broadcastable to `[batch, heads, new, past + new]`
    /// - output: `[batch, new, d_model]`
    ///
    /// # Panics
    /// If `cache` has another number of layers.
    pub fn forward_cached(
        &self,
        x: Tensor<B, 3>,
        memory: Tensor<B, 3>,
        cache: &mut DecoderCache<B>,
        self_mask: Option<&AttnMask<B>>,
        memory_mask: Option<&AttnMask<B>>,
    ) -> Tensor<B, 3> {
        self.forward_cached_weights(x, memory, cache, self_mask, memory_mask, false)
            .0
    }

    /// [`forward_cached`](Self::forward_cached), also returning the **last** layer's
    /// cross-attention weights when `need_weights` (the layer whose attention aligns best with
    /// the source in practice; fairseq's default alignment layer).
    ///
    /// # Shapes
    /// - weights: `[batch, heads, new, seq_src]`
    ///
    /// # Panics
    /// If `cache` has another number of layers.
    pub fn forward_cached_weights(
        &self,
        x: Tensor<B, 3>,
        memory: Tensor<B, 3>,
        cache: &mut DecoderCache<B>,
        self_mask: Option<&AttnMask<B>>,
        memory_mask: Option<&AttnMask<B>>,
        need_weights: bool,
    ) -> (Tensor<B, 3>, Option<Tensor<B, 4>>) {
        check_cache_layers("DecoderCache", cache.layers.len(), self.layers.len());
        let last = self.layers.len() - 1;
        let mut weights = None;
        let mut x = x;
        for (i, (layer, cache)) in self.layers.iter().zip(&mut cache.layers).enumerate() {
            let (out, w) = layer.forward_cached_weights(
                x,
                memory.clone(),
                cache,
                self_mask,
                memory_mask,
                need_weights && i == last,
            );
            x = out;
            weights = w;
        }
        (apply_final_norm(self.norm.as_ref(), x), weights)
    }
}
