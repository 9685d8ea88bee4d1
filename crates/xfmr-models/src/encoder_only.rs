//! Encoder-only (BERT-like) models: bidirectional encoder, pooling, and task heads.

use burn::config::Config;
use burn::module::{Initializer, Module, Param};
use burn::nn::{Dropout, Linear, LinearConfig};
use burn::tensor::activation::tanh;
use burn::tensor::{backend::Backend, Int, Tensor};
use serde::{Deserialize, Serialize};
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    add_positions, exact_gelu, Activation, Encoder, LayerConfig, Norm, NormConfig, NormPosition,
    PositionEncoding, Positions, SelfAttentionInput, StackConfig, TokenEmbedding,
    TokenEmbeddingConfig,
};

use crate::device::check_fits;
use crate::sizes::{check_sizes, Sizes};
use crate::{check_pad_id, table_extents, vocab_logits, ModelError};

/// Configuration of [`EncoderOnly`]. The presets are BERT's (Devlin et al., 2019): learned
/// positions, two segment types, a LayerNorm on the embedding sum, post-norm GELU layers,
/// LayerNorm ε 1e-12, attention dropout 0.1, unscaled embeddings. Every layer option (norm kind
/// and placement, activation, grouped heads, biases) lives in the shared [`LayerConfig`];
/// where positions enter is the model's [`positions`](Self::positions).
#[derive(Config, Debug)]
pub struct EncoderOnlyConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Every layer; its `dropout` also applies to the embeddings, its `norm_eps` and `norm`
    /// to the embedding norm and the MLM head's norm.
    pub layer: LayerConfig,
    /// Layers.
    pub n_layers: usize,
    /// Rows of a learned position table. Default: 512.
    #[config(default = 512)]
    pub max_len: usize,
    /// Segment (token type) vocabulary; 0 for none. Default: 2.
    #[config(default = 2)]
    pub type_vocab_size: usize,
    /// A norm on the embedding sum. Default: true (BERT).
    #[config(default = true)]
    pub embedding_norm: bool,
    /// Scale token embeddings by √d_model (paper) or not (BERT). Default: false.
    #[config(default = false)]
    pub scale_embeddings: bool,
    /// The pooler `tanh(W h_[CLS] + b)` (BERT). Default: true.
    #[config(default = true)]
    pub pooler: bool,
    /// The masked-token prediction head. Default: false.
    #[config(default = false)]
    pub mlm_head: bool,
    /// Classes of a sequence classification head on the pooled output. Default: none.
    #[config(default = "None")]
    pub n_classes: Option<usize>,
    /// Padding id. Default: 0 (BERT's `[PAD]`).
    #[config(default = 0)]
    pub pad_id: u32,
    /// Where positions enter: `Learned` (BERT, the default; `max_len` rows) and `Sinusoidal`
    /// are added to the embeddings, `Rotary` and `Alibi` act in every self-attention sublayer.
    /// Configurations written before this field existed carried it as `layer.positions`:
    /// [`checkpoint::upgrade_config`](crate::checkpoint::upgrade_config) moves it here.
    #[config(default = "PositionEncoding::Learned")]
    pub positions: PositionEncoding,
}

impl EncoderOnlyConfig {
    /// BERT's layer at the given widths: post-norm, GELU, LayerNorm ε 1e-12, dropout 0.1 on
    /// sublayers and attention weights.
    pub fn bert_layer(d_model: usize, n_heads: usize, d_ff: usize) -> LayerConfig {
        LayerConfig::new(d_model, n_heads, d_ff)
            .with_attention_dropout(0.1)
            .with_activation(Activation::Gelu)
            .with_norm_eps(1e-12)
    }

    /// A toy model for tests: d_model 64, 4 heads, d_ff 128, 2 layers.
    pub fn tiny(vocab_size: usize) -> Self {
        Self::new(vocab_size, Self::bert_layer(64, 4, 128), 2)
    }

    /// With the layer configuration changed by `f`.
    pub fn map_layer(mut self, f: impl FnOnce(LayerConfig) -> LayerConfig) -> Self {
        self.layer = f(self.layer);
        self
    }

    /// Checks every size against its bound ([`xfmr_blocks::limits`]: widths, layer count,
    /// vocabularies, segment types, classes, `max_len`, the model's values in all) before
    /// anything is allocated; [`init`](Self::init) and checkpoint loading call it first.
    ///
    /// # Errors
    /// [`ModelError::InvalidConfig`] naming the first field out of its range (dotted:
    /// `layer.d_model`) and its value.
    pub fn validate(&self) -> Result<(), ModelError> {
        let classes = self.n_classes.unwrap_or(0);
        let mlm = if self.mlm_head { self.vocab_size } else { 0 };
        check_sizes(&Sizes {
            layer: &self.layer,
            positions: &self.positions,
            max_len: self.max_len,
            stacks: &[("n_layers", self.n_layers)],
            vocabularies: &[
                ("vocab_size", self.vocab_size, false),
                ("type_vocab_size", self.type_vocab_size, true),
                ("n_classes", classes, true),
            ],
            // The MLM head's bias and the classifier, counted as whole tables: an upper bound.
            table_rows: &[self.vocab_size, self.type_vocab_size, mlm, classes],
            // The pooler and the MLM head's dense layer.
            extra_squares: 2,
        })
    }

    /// Builds the model with fresh weights.
    ///
    /// # Errors
    /// Sizes out of their bounds ([`validate`](Self::validate)), a bad dropout, ε or head
    /// count, `pad_id` outside the vocabulary.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<EncoderOnly<B>, ModelError> {
        self.validate()?;
        check_pad_id(self.pad_id, self.vocab_size)?;
        if self.n_classes == Some(0) {
            return Err(ModelError::InvalidConfig {
                field: "n_classes",
                value: "0".into(),
                expected: "at least 1 (or none)",
            });
        }
        let layer = &self.layer;
        let d_model = layer.d_model;
        let norm = NormConfig::new(d_model)
            .with_kind(layer.norm)
            .with_eps(layer.norm_eps);
        let normal = Initializer::Normal {
            mean: 0.0,
            std: 0.02,
        };
        let linear = |d_in, d_out| {
            LinearConfig::new(d_in, d_out)
                .with_initializer(normal.clone())
                .init(device)
        };
        let pre = layer.norm_position == NormPosition::Pre;
        Ok(EncoderOnly {
            token_embedding: TokenEmbeddingConfig::new(self.vocab_size, d_model)
                .with_scale(self.scale_embeddings)
                .with_initializer(Some(normal.clone()))
                .init(device)?,
            positions: self.positions.init_input(self.max_len, d_model, device)?,
            token_type_embedding: (self.type_vocab_size > 0)
                .then(|| {
                    TokenEmbeddingConfig::new(self.type_vocab_size, d_model)
                        .with_scale(false)
                        .with_initializer(Some(normal.clone()))
                        .init(device)
                })
                .transpose()?,
            embedding_norm: self.embedding_norm.then(|| norm.init(device)).transpose()?,
            dropout: layer.residual_dropout()?,
            encoder: StackConfig::new(layer.clone(), self.n_layers)
                .with_final_norm(pre)
                .with_positions(self.positions.in_attention())
                .init_encoder(device)?,
            pooler: self.pooler.then(|| linear(d_model, d_model)),
            mlm_head: self
                .mlm_head
                .then(|| -> Result<MlmHead<B>, ModelError> {
                    Ok(MlmHead {
                        dense: linear(d_model, d_model),
                        norm: norm.init(device)?,
                        bias: Initializer::Zeros.init([self.vocab_size], device),
                    })
                })
                .transpose()?,
            classifier: self.n_classes.map(|n| linear(d_model, n)),
            pad_id: self.pad_id,
        })
    }
}

/// BERT's masked-token prediction head: `LayerNorm(GELU(W h + b)) Eᵀ + b_vocab`, tied to the
/// token embedding `E`.
#[derive(Module, Debug)]
pub struct MlmHead<B: Backend> {
    /// The transform's dense layer.
    pub dense: Linear<B>,
    /// The transform's LayerNorm.
    pub norm: Norm<B>,
    /// Output bias `[vocab]`.
    pub bias: Param<Tensor<B, 1>>,
}

/// How token states become one vector per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pooling {
    /// The first token's state (`[CLS]`).
    Cls,
    /// The mean over real (unpadded) tokens (sentence-transformers).
    Mean,
}

/// An encoder-only model.
#[derive(Module, Debug)]
pub struct EncoderOnly<B: Backend> {
    /// Word embeddings.
    pub token_embedding: TokenEmbedding<B>,
    /// Position vectors added to the embeddings (none with RoPE, ALiBi or no positions).
    pub positions: Option<Positions<B>>,
    /// Segment embeddings.
    pub token_type_embedding: Option<TokenEmbedding<B>>,
    /// LayerNorm of the embedding sum.
    pub embedding_norm: Option<Norm<B>>,
    /// Dropout on the embeddings.
    pub dropout: Dropout,
    /// The bidirectional stack.
    pub encoder: Encoder<B>,
    /// `tanh(W h_[CLS] + b)`.
    pub pooler: Option<Linear<B>>,
    /// Masked-token prediction head.
    pub mlm_head: Option<MlmHead<B>>,
    /// Sequence classification head on the pooled output.
    pub classifier: Option<Linear<B>>,
    /// Padding id.
    pub pad_id: u32,
}

impl<B: Backend> EncoderOnly<B> {
    /// Embeddings: `LayerNorm(E[ids] + P[pos] + T[types])` (BERT), then dropout.
    ///
    /// # Shapes
    /// - `ids`, `token_types`: `[batch, seq]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold the
    /// token embedding (synchronised only for a table over
    /// [`DEVICE_BUFFER_BYTES`](crate::DEVICE_BUFFER_BYTES)).
    pub fn embed(
        &self,
        ids: Tensor<B, 2, Int>,
        token_types: Option<Tensor<B, 2, Int>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let mut x = add_positions(
            self.positions.as_ref(),
            self.token_embedding.forward(ids.clone()),
            0,
        )?;
        if let Some(table) = &self.token_type_embedding {
            // BERT's default: every token in segment 0.
            let types = token_types.unwrap_or_else(|| ids.zeros_like());
            x = x + table.forward(types);
        }
        if let Some(norm) = &self.embedding_norm {
            x = norm.forward(x);
        }
        check_fits::<B>(&x.device(), table_extents(None, &self.token_embedding))?;
        Ok(xfmr_blocks::dropout(&self.dropout, x))
    }

    /// Contextual token states (BERT's `last_hidden_state`).
    ///
    /// # Shapes
    /// - `ids`, `token_types`: `[batch, seq]`; `mask` (`true` = ignored), e.g.
    ///   [`AttnMask::from_keep_mask`] of an HF `attention_mask`, or
    ///   [`padding_mask`](Self::padding_mask)
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table.
    pub fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        token_types: Option<Tensor<B, 2, Int>>,
        mask: Option<&AttnMask<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let x = self.embed(ids, token_types)?;
        Ok(self
            .encoder
            .forward(SelfAttentionInput::new(x).mask_opt(mask.cloned())))
    }

    /// [`forward`](Self::forward) that also returns every layer's self-attention weights.
    ///
    /// # Shapes
    /// - as [`forward`](Self::forward); weights: one `[batch, heads, seq, seq]` per layer
    ///
    /// # Errors
    /// As [`forward`](Self::forward).
    pub fn forward_with_attention(
        &self,
        ids: Tensor<B, 2, Int>,
        token_types: Option<Tensor<B, 2, Int>>,
        mask: Option<&AttnMask<B>>,
    ) -> Result<(Tensor<B, 3>, Vec<Tensor<B, 4>>), ModelError> {
        let x = self.embed(ids, token_types)?;
        Ok(self
            .encoder
            .forward_with_weights(SelfAttentionInput::new(x).mask_opt(mask.cloned())))
    }

    /// The mask of `pad_id` positions.
    pub fn padding_mask(&self, ids: Tensor<B, 2, Int>) -> AttnMask<B> {
        AttnMask::padding_from_ids(ids, self.pad_id)
    }

    /// Pools token states into one vector per sequence.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`; `keep`: `[batch, seq]`, 1 = real token, 0 = padding
    ///   (HF's `attention_mask`)
    /// - output: `[batch, d_model]`
    pub fn pool(hidden: Tensor<B, 3>, keep: Tensor<B, 2, Int>, pooling: Pooling) -> Tensor<B, 2> {
        let [batch, _, d_model] = hidden.dims();
        match pooling {
            Pooling::Cls => cls_state(hidden),
            Pooling::Mean => {
                let weights = keep.float().unsqueeze_dim::<3>(2);
                let sum = (hidden * weights.clone())
                    .sum_dim(1)
                    .reshape([batch, d_model]);
                // sentence-transformers clamps the count at 1e-9.
                let count = weights.sum_dim(1).reshape([batch, 1]).clamp_min(1e-9);
                sum / count
            }
        }
    }

    /// BERT's pooled output `tanh(W h_[CLS] + b)`.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`; output `[batch, d_model]`
    ///
    /// # Panics
    /// If the model has no pooler.
    pub fn pooled(&self, hidden: Tensor<B, 3>) -> Tensor<B, 2> {
        let pooler = self
            .pooler
            .as_ref()
            .expect("EncoderOnly::pooled: no pooler");
        tanh(xfmr_attention::linear(pooler, cls_state(hidden)))
    }

    /// Sequence classification logits from the pooled output (or the `[CLS]` state without a
    /// pooler).
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`; output `[batch, n_classes]`
    ///
    /// # Panics
    /// If the model has no classifier.
    pub fn classify(&self, hidden: Tensor<B, 3>) -> Tensor<B, 2> {
        let classifier = self
            .classifier
            .as_ref()
            .expect("EncoderOnly::classify: no classification head (set n_classes)");
        let pooled = match &self.pooler {
            Some(_) => self.pooled(hidden),
            None => cls_state(hidden),
        };
        xfmr_attention::linear(classifier, xfmr_blocks::dropout(&self.dropout, pooled))
    }

    /// Masked-token prediction logits. The vocabulary product runs in chunks of rows (as in
    /// [`DecoderOnly::forward`](crate::DecoderOnly::forward), whose limits the result shares).
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`; output `[batch, seq, vocab]`
    ///
    /// # Errors
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold the
    /// `batch · seq · vocab` logits (or the token embedding): score fewer rows at a time.
    ///
    /// # Panics
    /// If the model has no MLM head.
    pub fn mlm_logits(&self, hidden: Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError> {
        let head = self
            .mlm_head
            .as_ref()
            .expect("EncoderOnly::mlm_logits: no MLM head (set mlm_head)");
        let [batch, seq, d] = hidden.dims();
        let h = exact_gelu(xfmr_attention::linear(
            &head.dense,
            hidden.reshape([batch * seq, d]),
        ));
        let h = head.norm.forward(h.reshape([batch, seq, d]));
        Ok(vocab_logits(None, &self.token_embedding, h)? + head.bias.val().unsqueeze::<3>())
    }
}

/// The first token's state `[batch, d_model]` of `hidden` `[batch, seq, d_model]`.
fn cls_state<B: Backend>(hidden: Tensor<B, 3>) -> Tensor<B, 2> {
    let [batch, _, d_model] = hidden.dims();
    hidden.narrow(1, 0, 1).reshape([batch, d_model])
}

/// L2-normalises rows (sentence-transformers' `Normalize`): `x / max(‖x‖, 1e-12)`.
///
/// # Shapes
/// - `x`: `[batch, d]`; output `[batch, d]`
pub fn l2_normalize<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let norm = x.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
    x / norm
}
