//! The one layer configuration every stack and model shares, the stack configuration, and the
//! residual wiring common to all layers.

use burn::config::Config;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::{backend::Backend, Tensor};
use xfmr_attention::{InvalidConfig, MultiHeadAttentionConfig};

use crate::{
    Activation, AttentionPositions, BlockError, CausalDecoder, Decoder, DecoderLayer, Encoder,
    FeedForward, FeedForwardConfig, Norm, NormConfig, NormKind, NormPosition, PositionEncoding,
    SelfAttentionLayer,
};

/// The configuration of one layer, shared by encoder, decoder and causal layers and embedded in
/// every model configuration, so that each model exposes the same options. Defaults are the
/// paper's (post-norm LayerNorm, ReLU, biases, full multi-head attention). Positions are not a
/// layer's choice: a model adds the absolute kinds to its embeddings, and a stack gives its
/// layers the kinds that act inside self-attention ([`StackConfig::positions`]).
#[derive(Config, Debug)]
pub struct LayerConfig {
    /// Model width `d_model` (paper: 512).
    pub d_model: usize,
    /// Attention heads `h` (paper: 8).
    pub n_heads: usize,
    /// Feed-forward inner width `d_ff` (paper: 2048).
    pub d_ff: usize,
    /// Key/value heads for grouped-query attention (must divide `n_heads`).
    /// Default: `None` (= `n_heads`, the paper's attention).
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Residual dropout on each sublayer output before the add, also used by the models on the
    /// embedding sums (paper: 0.1). Default: 0.1.
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
    /// Norm placement. Default: `Post` (paper). Pre-norm stacks built by the models end in a
    /// final norm.
    #[config(default = "NormPosition::Post")]
    pub norm_position: NormPosition,
    /// Norm kind. Default: `LayerNorm` (paper).
    #[config(default = "NormKind::LayerNorm")]
    pub norm: NormKind,
    /// Norm ε. Default: 1e-5.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// Biases on the attention and feed-forward projections (LLaMA has none). Default: true.
    #[config(default = true)]
    pub bias: bool,
}

impl LayerConfig {
    /// Checks every size of the layer against its bound ([`crate::limits`]) before anything
    /// is allocated: `d_model` and `n_heads` positive, `d_model` ≤
    /// [`MAX_D_MODEL`](crate::limits::MAX_D_MODEL), `d_ff` positive and ≤
    /// [`MAX_D_FF`](crate::limits::MAX_D_FF), `n_heads` and `n_kv_heads` at most `d_model`.
    /// The building methods check the rest (divisibility, dropout, ε) as they build.
    ///
    /// # Errors
    /// [`BlockError::InvalidConfig`] naming the first field out of its range (`d_model`,
    /// `d_ff`, `n_heads`, `n_kv_heads`) and its value.
    pub fn validate(&self) -> Result<(), BlockError> {
        use crate::limits::{MAX_D_FF, MAX_D_MODEL};
        InvalidConfig::positive("d_model", self.d_model)?;
        InvalidConfig::check(
            self.d_model <= MAX_D_MODEL,
            "d_model",
            self.d_model,
            "at most 65536 (xfmr_blocks::limits::MAX_D_MODEL)",
        )?;
        InvalidConfig::positive("d_ff", self.d_ff)?;
        InvalidConfig::check(
            self.d_ff <= MAX_D_FF,
            "d_ff",
            self.d_ff,
            "at most 262144 (xfmr_blocks::limits::MAX_D_FF)",
        )?;
        InvalidConfig::positive("n_heads", self.n_heads)?;
        InvalidConfig::check(
            self.n_heads <= self.d_model,
            "n_heads",
            self.n_heads,
            "at most d_model (a head is at least one feature wide)",
        )?;
        if let Some(kv) = self.n_kv_heads {
            InvalidConfig::positive("n_kv_heads", kv)?;
            InvalidConfig::check(
                kv <= self.n_heads,
                "n_kv_heads",
                kv,
                "at most n_heads (each key/value head serves whole query heads)",
            )?;
        }
        Ok(())
    }

    /// Width of one head, `d_k = d_model / n_heads`.
    pub fn d_k(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    pub(crate) fn attention(&self) -> MultiHeadAttentionConfig {
        MultiHeadAttentionConfig::new(self.d_model, self.n_heads)
            .with_n_kv_heads(self.n_kv_heads)
            .with_dropout(self.attention_dropout)
            .with_query_bias(self.bias)
            .with_key_bias(self.bias)
            .with_value_bias(self.bias)
            .with_output_bias(self.bias)
    }

    pub(crate) fn norm_config(&self) -> NormConfig {
        NormConfig::new(self.d_model)
            .with_kind(self.norm)
            .with_eps(self.norm_eps)
    }

    pub(crate) fn feed_forward<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<FeedForward<B>, BlockError> {
        FeedForwardConfig::new(self.d_model, self.d_ff)
            .with_activation(self.activation)
            .with_dropout(self.ffn_dropout)
            .with_bias(self.bias)
            .init(device)
    }

    /// The residual dropout of [`dropout`](Self::dropout), which the models also apply to
    /// their embeddings.
    ///
    /// # Errors
    /// [`BlockError::InvalidConfig`] for a probability outside [0, 1) (burn's own
    /// constructor panics on one: a configuration read from a file must not).
    pub fn residual_dropout(&self) -> Result<Dropout, BlockError> {
        InvalidConfig::dropout("dropout", self.dropout)?;
        Ok(DropoutConfig::new(self.dropout).init())
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
    /// The positions every layer's self-attention applies: `Rotary` or `Alibi`, or `None`
    /// (default). The absolute kinds (`Sinusoidal`, `Learned`) are added to the embeddings
    /// before the stack, not inside it: [`validate`](Self::validate) rejects them
    /// ([`PositionEncoding::in_attention`] keeps what a stack applies of a model's choice).
    #[config(default = "PositionEncoding::None")]
    pub positions: PositionEncoding,
}

impl StackConfig {
    /// Checks the stack's sizes before anything is allocated: `n_layers` positive and at most
    /// [`MAX_LAYERS`](crate::limits::MAX_LAYERS), the layer's ([`LayerConfig::validate`]),
    /// and `positions` one that acts inside attention.
    ///
    /// # Errors
    /// [`BlockError::InvalidConfig`] naming the field and its value.
    pub fn validate(&self) -> Result<(), BlockError> {
        InvalidConfig::positive("n_layers", self.n_layers)?;
        InvalidConfig::check(
            self.n_layers <= crate::limits::MAX_LAYERS,
            "n_layers",
            self.n_layers,
            "at most 1024 (xfmr_blocks::limits::MAX_LAYERS)",
        )?;
        InvalidConfig::check(
            !matches!(
                self.positions,
                PositionEncoding::Sinusoidal | PositionEncoding::Learned
            ),
            "positions",
            format!("{:?}", self.positions),
            "Rotary, Alibi or None: absolute positions are added to the embeddings, before \
             the stack",
        )?;
        self.layer.validate()
    }

    /// The stack's `n_layers` layers built by `init`, each given the positions its
    /// self-attention applies, and the final norm, if any, after [`validate`](Self::validate)
    /// (the layers are built before the positions, so that a layer's own error, heads that do
    /// not divide `d_model` say, comes first).
    fn build<B: Backend, L>(
        &self,
        device: &B::Device,
        init: impl Fn(&LayerConfig, &B::Device) -> Result<L, BlockError>,
        with_positions: impl Fn(L, Option<AttentionPositions>) -> L,
    ) -> Result<(Vec<L>, Option<Norm<B>>), BlockError> {
        self.validate()?;
        let norm = self
            .final_norm
            .then(|| self.layer.norm_config().init(device))
            .transpose()?;
        let layers = (0..self.n_layers)
            .map(|_| init(&self.layer, device))
            .collect::<Result<Vec<_>, _>>()?;
        let positions = self
            .positions
            .init_attention(self.layer.n_heads, self.layer.d_k())?;
        let layers = layers
            .into_iter()
            .map(|layer| with_positions(layer, positions.clone()))
            .collect();
        Ok((layers, norm))
    }

    /// Builds a bidirectional encoder stack.
    ///
    /// # Errors
    /// Zero layers, or any invalid layer or position setting.
    pub fn init_encoder<B: Backend>(&self, device: &B::Device) -> Result<Encoder<B>, BlockError> {
        let (layers, norm) = self.build(
            device,
            LayerConfig::init_encoder::<B>,
            SelfAttentionLayer::with_positions,
        )?;
        Ok(Encoder { layers, norm })
    }

    /// Builds a cross-attending decoder stack (the paper's decoder).
    ///
    /// # Errors
    /// Zero layers, or any invalid layer or position setting.
    pub fn init_decoder<B: Backend>(&self, device: &B::Device) -> Result<Decoder<B>, BlockError> {
        let (layers, norm) = self.build(
            device,
            LayerConfig::init_decoder::<B>,
            DecoderLayer::with_positions,
        )?;
        Ok(Decoder { layers, norm })
    }

    /// Builds a causal (decoder-only, GPT-like) stack.
    ///
    /// # Errors
    /// Zero layers, or any invalid layer or position setting.
    pub fn init_causal<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<CausalDecoder<B>, BlockError> {
        let (layers, norm) = self.build(
            device,
            LayerConfig::init_encoder::<B>,
            SelfAttentionLayer::with_positions,
        )?;
        Ok(CausalDecoder { layers, norm })
    }
}

/// One residual sublayer: post-norm `Norm(x + Dropout(f(x)))` or pre-norm
/// `x + Dropout(f(Norm(x)))`.
pub(crate) fn sublayer<B: Backend>(
    x: Tensor<B, 3>,
    norm: &Norm<B>,
    position: NormPosition,
    dropout: &Dropout,
    f: impl FnOnce(Tensor<B, 3>) -> Tensor<B, 3>,
) -> Tensor<B, 3> {
    match position {
        NormPosition::Post => norm.forward(x.clone() + crate::dropout(dropout, f(x))),
        NormPosition::Pre => x.clone() + crate::dropout(dropout, f(norm.forward(x))),
    }
}

/// A stack's optional final norm.
pub(crate) fn apply_final_norm<B: Backend>(
    norm: Option<&Norm<B>>,
    x: Tensor<B, 3>,
) -> Tensor<B, 3> {
    match norm {
        Some(norm) => norm.forward(x),
        None => x,
    }
}

/// Panics unless a cache holds one entry per layer.
pub(crate) fn check_cache_layers(what: &str, cached: usize, layers: usize) {
    assert_eq!(
        cached, layers,
        "{what} has {cached} layers, the stack {layers}"
    );
}
