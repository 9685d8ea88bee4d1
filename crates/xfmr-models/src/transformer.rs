//! The encoder-decoder Transformer of the paper (§3): the translation model.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, Linear, LinearConfig};
use burn::tensor::{backend::Backend, Int, Tensor};
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    add_positions, Decoder, DecoderCache, DecoderInput, DecoderStepInput, Encoder, LayerConfig,
    NormPosition, PositionEncoding, Positions, SelfAttentionInput, StackConfig, TokenEmbedding,
    TokenEmbeddingConfig,
};

use crate::device::check_fits;
use crate::generate::{self, Generation, GenerationOptions, IncrementalDecoder, Step};
use crate::sizes::{check_sizes, Sizes};
use crate::{
    check_ids, check_pad_id, padded_ids, table_extents, vocab_logits, ModelError, PadSide,
};

/// Configuration of [`Transformer`]. The defaults are the paper's; the presets
/// [`base`](Self::base) and [`big`](Self::big) are its two models (Table 3), and
/// [`small`](Self::small) / [`tiny`](Self::tiny) fit a CPU. Every layer option (norm kind and
/// placement, activation, grouped heads, biases) lives in the shared [`LayerConfig`]; where
/// positions enter is the model's [`positions`](Self::positions).
#[derive(Config, Debug)]
pub struct TransformerConfig {
    /// Source vocabulary size.
    pub src_vocab_size: usize,
    /// Target vocabulary size.
    pub tgt_vocab_size: usize,
    /// Every encoder and decoder layer; its `dropout` also applies to the embedding sums
    /// (paper: 0.1).
    pub layer: LayerConfig,
    /// Encoder layers (paper: 6).
    pub n_encoder_layers: usize,
    /// Decoder layers (paper: 6).
    pub n_decoder_layers: usize,
    /// One embedding table for source, target and output (paper §3.4, a shared BPE vocabulary).
    /// Needs `src_vocab_size == tgt_vocab_size`. Default: true.
    #[config(default = true)]
    pub share_embeddings: bool,
    /// The output projection is the (transposed) target embedding (paper §3.4). Default: true.
    #[config(default = true)]
    pub tie_output: bool,
    /// Rows of the position table (a hard limit for learned positions only). Default: 1024.
    #[config(default = 1024)]
    pub max_len: usize,
    /// Padding token id: source padding is masked from it. Default: 0.
    #[config(default = 0)]
    pub pad_id: u32,
    /// Where positions enter, on both sides: `Sinusoidal` (paper, the default) and `Learned`
    /// are added to the embeddings; `Rotary` and `Alibi` act in every self-attention sublayer
    /// (not in cross-attention). Configurations written before this field existed carried it
    /// as `layer.positions`: [`checkpoint::upgrade_config`](crate::checkpoint::upgrade_config)
    /// moves it here.
    #[config(default = "PositionEncoding::Sinusoidal")]
    pub positions: PositionEncoding,
}

impl TransformerConfig {
    /// The paper's base model: d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, dropout 0.1,
    /// one shared vocabulary (37,000 BPE tokens in the paper's English-German runs: ≈ 63M
    /// parameters with it; the paper reports 65M).
    pub fn base(vocab_size: usize) -> Self {
        Self::new(vocab_size, vocab_size, LayerConfig::new(512, 8, 2048), 6, 6)
    }

    /// The paper's big model: d_model 1024, 16 heads, d_ff 4096, dropout 0.3.
    pub fn big(vocab_size: usize) -> Self {
        let layer = LayerConfig::new(1024, 16, 4096).with_dropout(0.3);
        Self::new(vocab_size, vocab_size, layer, 6, 6)
    }

    /// A CPU-sized model: d_model 256, 4 heads, d_ff 1024, 3 + 3 layers.
    pub fn small(vocab_size: usize) -> Self {
        Self::new(vocab_size, vocab_size, LayerConfig::new(256, 4, 1024), 3, 3)
    }

    /// A toy model for tests and examples: d_model 64, 4 heads, d_ff 128, 2 + 2 layers.
    pub fn tiny(vocab_size: usize) -> Self {
        Self::new(vocab_size, vocab_size, LayerConfig::new(64, 4, 128), 2, 2)
    }

    /// With the layer configuration changed by `f`:
    /// `TransformerConfig::tiny(32).map_layer(|l| l.with_dropout(0.0))`.
    pub fn map_layer(mut self, f: impl FnOnce(LayerConfig) -> LayerConfig) -> Self {
        self.layer = f(self.layer);
        self
    }

    /// Checks every size against its bound ([`xfmr_blocks::limits`]: widths, layer counts,
    /// vocabularies, `max_len`, the model's values in all) before anything is allocated;
    /// [`init`](Self::init) and checkpoint loading call it first.
    ///
    /// # Errors
    /// [`ModelError::InvalidConfig`] naming the first field out of its range (dotted:
    /// `layer.d_model`) and its value.
    pub fn validate(&self) -> Result<(), ModelError> {
        let tables = [
            self.src_vocab_size,
            if self.share_embeddings {
                0
            } else {
                self.tgt_vocab_size
            },
            if self.tie_output {
                0
            } else {
                self.tgt_vocab_size
            },
        ];
        check_sizes(&Sizes {
            layer: &self.layer,
            positions: &self.positions,
            max_len: self.max_len,
            stacks: &[
                ("n_encoder_layers", self.n_encoder_layers),
                ("n_decoder_layers", self.n_decoder_layers),
            ],
            vocabularies: &[
                ("src_vocab_size", self.src_vocab_size, false),
                ("tgt_vocab_size", self.tgt_vocab_size, false),
            ],
            table_rows: &tables,
            extra_squares: 0,
        })
    }

    /// Builds the model with fresh weights.
    ///
    /// # Errors
    /// Sizes out of their bounds ([`validate`](Self::validate)), `share_embeddings` with
    /// different vocabularies, a bad dropout, ε, head count or position setting, each named
    /// with its value.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Transformer<B>, ModelError> {
        self.validate()?;
        if self.share_embeddings && self.src_vocab_size != self.tgt_vocab_size {
            return Err(ModelError::InvalidConfig {
                field: "share_embeddings",
                value: format!(
                    "true with src_vocab_size {} and tgt_vocab_size {}",
                    self.src_vocab_size, self.tgt_vocab_size
                ),
                expected: "equal vocabulary sizes to share one table",
            });
        }
        check_pad_id(self.pad_id, self.src_vocab_size.min(self.tgt_vocab_size))?;
        let layer = &self.layer;
        let d_model = layer.d_model;
        let pre = layer.norm_position == NormPosition::Pre;
        let embedding = |vocab| TokenEmbeddingConfig::new(vocab, d_model).init(device);
        Ok(Transformer {
            src_embedding: embedding(self.src_vocab_size)?,
            tgt_embedding: (!self.share_embeddings)
                .then(|| embedding(self.tgt_vocab_size))
                .transpose()?,
            output: (!self.tie_output)
                .then(|| LinearConfig::new(d_model, self.tgt_vocab_size).init(device)),
            positions: self.positions.init_input(self.max_len, d_model, device)?,
            dropout: layer.residual_dropout()?,
            encoder: StackConfig::new(layer.clone(), self.n_encoder_layers)
                .with_final_norm(pre)
                .with_positions(self.positions.in_attention())
                .init_encoder(device)?,
            decoder: StackConfig::new(layer.clone(), self.n_decoder_layers)
                .with_final_norm(pre)
                .with_positions(self.positions.in_attention())
                .init_decoder(device)?,
            pad_id: self.pad_id,
        })
    }
}

/// The encoder-decoder Transformer (paper Figure 1).
///
/// Source ids → embedding · √d_model + positions → dropout → encoder → memory; target ids
/// (shifted right behind a start token) → the same embedding path → decoder over the memory →
/// output projection → logits over the target vocabulary.
#[derive(Module, Debug)]
pub struct Transformer<B: Backend> {
    /// Source embedding; also the target and output table when shared (paper §3.4).
    pub src_embedding: TokenEmbedding<B>,
    /// Target embedding, when not shared with the source.
    pub tgt_embedding: Option<TokenEmbedding<B>>,
    /// Output projection, when not tied to the target embedding.
    pub output: Option<Linear<B>>,
    /// Position vectors added to both embeddings (none with RoPE, ALiBi or no positions).
    pub positions: Option<Positions<B>>,
    /// Dropout on the embedding sums.
    pub dropout: Dropout,
    /// The encoder stack.
    pub encoder: Encoder<B>,
    /// The decoder stack.
    pub decoder: Decoder<B>,
    /// Padding id (source padding mask).
    pub pad_id: u32,
}

/// Encoded source sentences: what the decoder attends to.
#[derive(Debug, Clone)]
pub struct Memory<B: Backend> {
    /// `[batch, seq_src, d_model]`.
    pub states: Tensor<B, 3>,
    /// Source padding (`true` = ignored), `[batch, 1, 1, seq_src]`.
    pub mask: AttnMask<B>,
}

impl<B: Backend> Transformer<B> {
    fn tgt_table(&self) -> &TokenEmbedding<B> {
        self.tgt_embedding.as_ref().unwrap_or(&self.src_embedding)
    }

    fn embed(
        &self,
        table: &TokenEmbedding<B>,
        ids: Tensor<B, 2, Int>,
        offset: usize,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let x = add_positions(self.positions.as_ref(), table.forward(ids), offset)?;
        check_fits::<B>(&x.device(), table_extents(None, table))?;
        Ok(xfmr_blocks::dropout(&self.dropout, x))
    }

    /// The encoder's input (embedded source with positions) and the source padding mask.
    fn embed_source(
        &self,
        src: Tensor<B, 2, Int>,
    ) -> Result<(Tensor<B, 3>, AttnMask<B>), ModelError> {
        let mask = AttnMask::padding_from_ids(src.clone(), self.pad_id);
        Ok((self.embed(&self.src_embedding, src, 0)?, mask))
    }

    /// Target vocabulary size.
    pub fn tgt_vocab_size(&self) -> usize {
        match &self.output {
            Some(linear) => linear.weight.dims()[1],
            None => self.tgt_table().weight.dims()[0],
        }
    }

    /// Encodes source ids; positions holding `pad_id` are masked.
    ///
    /// # Shapes
    /// - `src`: `[batch, seq_src]`
    /// - output states: `[batch, seq_src, d_model]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold the
    /// source embedding (synchronised only for a table over
    /// [`DEVICE_BUFFER_BYTES`](crate::DEVICE_BUFFER_BYTES)).
    pub fn encode(&self, src: Tensor<B, 2, Int>) -> Result<Memory<B>, ModelError> {
        let (x, mask) = self.embed_source(src)?;
        Ok(Memory {
            states: self
                .encoder
                .forward(SelfAttentionInput::new(x).mask(mask.clone())),
            mask,
        })
    }

    /// Decoder logits for a whole target prefix (teacher forcing): position `i` sees target
    /// positions `≤ i` and the whole memory.
    ///
    /// # Shapes
    /// - `tgt_in`: `[batch, seq_tgt]` (target shifted right, see [`shift_right`](crate::shift_right))
    /// - output: `[batch, seq_tgt, tgt_vocab]` (unnormalised; `log_softmax` over the last axis
    ///   gives log-probabilities)
    ///
    /// # Errors
    /// A sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold the
    /// `batch · seq_tgt · tgt_vocab` logits (synchronised only past
    /// [`DEVICE_BUFFER_BYTES`](crate::DEVICE_BUFFER_BYTES): train on fewer target tokens per
    /// batch) or a vocabulary table.
    pub fn decode(
        &self,
        tgt_in: Tensor<B, 2, Int>,
        memory: &Memory<B>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let x = self.embed(self.tgt_table(), tgt_in, 0)?;
        let h = self
            .decoder
            .forward(DecoderInput::new(x, &memory.states).memory_mask(memory.mask.clone()));
        self.project(h)
    }

    /// Teacher-forced forward: encode `src`, decode `tgt_in`.
    ///
    /// # Shapes
    /// - `src`: `[batch, seq_src]`; `tgt_in`: `[batch, seq_tgt]`
    /// - output: `[batch, seq_tgt, tgt_vocab]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold the
    /// `batch · seq_tgt · tgt_vocab` logits (synchronised only past
    /// [`DEVICE_BUFFER_BYTES`](crate::DEVICE_BUFFER_BYTES): train on fewer target tokens per
    /// batch) or a vocabulary table.
    pub fn forward(
        &self,
        src: Tensor<B, 2, Int>,
        tgt_in: Tensor<B, 2, Int>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let memory = self.encode(src)?;
        self.decode(tgt_in, &memory)
    }

    /// Teacher-forced forward that also returns the attention weights of every layer and head:
    /// the encoder's self-attention and the decoder's cross-attention (the maps every
    /// explanation of the paper draws). Run it on a model without dropout (`valid()`).
    ///
    /// # Shapes
    /// - `src`: `[batch, seq_src]`; `tgt_in`: `[batch, seq_tgt]`
    /// - `logits`: `[batch, seq_tgt, tgt_vocab]`; per layer, `encoder`: `[batch, heads,
    ///   seq_src, seq_src]` and `cross`: `[batch, heads, seq_tgt, seq_src]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold the
    /// `batch · seq_tgt · tgt_vocab` logits (synchronised only past
    /// [`DEVICE_BUFFER_BYTES`](crate::DEVICE_BUFFER_BYTES): train on fewer target tokens per
    /// batch) or a vocabulary table.
    pub fn forward_with_attention(
        &self,
        src: Tensor<B, 2, Int>,
        tgt_in: Tensor<B, 2, Int>,
    ) -> Result<AttentionMaps<B>, ModelError> {
        let (x, mask) = self.embed_source(src)?;
        let (states, encoder) = self
            .encoder
            .forward_with_weights(SelfAttentionInput::new(x).mask(mask.clone()));
        let y = self.embed(self.tgt_table(), tgt_in, 0)?;
        let (h, cross) = self
            .decoder
            .forward_with_weights(DecoderInput::new(y, &states).memory_mask(mask));
        Ok(AttentionMaps {
            logits: self.project(h)?,
            encoder,
            cross,
        })
    }

    fn project(&self, h: Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError> {
        vocab_logits(self.output.as_ref(), self.tgt_table(), h)
    }

    /// Starts incremental decoding over `memory` (see [`IncrementalDecoder`]): every decoder
    /// layer projects the memory into its cross-attention keys/values once, here.
    pub fn start(&self, memory: &Memory<B>) -> Seq2SeqState<B> {
        Seq2SeqState {
            cache: self
                .decoder
                .start(&memory.states, Some(memory.mask.clone())),
        }
    }

    /// Translates: encodes the (right-padded) source sentences and generates target ids
    /// starting from `bos_id`, through the decoder's key/value cache.
    ///
    /// # Errors
    /// Empty input, an id outside the vocabulary, invalid options.
    pub fn generate(
        &self,
        sources: &[Vec<u32>],
        bos_id: u32,
        options: &GenerationOptions,
    ) -> Result<Generation, ModelError> {
        let src_vocab = self.src_embedding.weight.dims()[0];
        check_ids("source", sources, src_vocab)?;
        check_ids("bos_id", &[vec![bos_id]], self.tgt_vocab_size())?;
        let device = self.src_embedding.weight.device();
        let src = padded_ids::<B, u32>(sources, self.pad_id, PadSide::Right, &device);
        let state = self.start(&self.encode(src)?);
        let first = vec![vec![bos_id]; sources.len()];
        generate::generate(self, state, first, options)
    }
}

/// What [`Transformer::forward_with_attention`] returns.
#[derive(Debug, Clone)]
pub struct AttentionMaps<B: Backend> {
    /// `[batch, seq_tgt, tgt_vocab]`, as [`Transformer::forward`].
    pub logits: Tensor<B, 3>,
    /// Per encoder layer, `[batch, heads, seq_src, seq_src]`.
    pub encoder: Vec<Tensor<B, 4>>,
    /// Per decoder layer, `[batch, heads, seq_tgt, seq_src]`.
    pub cross: Vec<Tensor<B, 4>>,
}

/// The decoding state of a [`Transformer`]: the decoder's caches, the projected memory
/// among them.
#[derive(Debug, Clone)]
pub struct Seq2SeqState<B: Backend> {
    /// Per-layer self-attention caches and the projected memory.
    pub cache: DecoderCache<B>,
}

impl<B: Backend> IncrementalDecoder<B> for Transformer<B> {
    type State = Seq2SeqState<B>;

    fn vocab_size(&self) -> usize {
        self.tgt_vocab_size()
    }

    fn device(&self) -> B::Device {
        self.src_embedding.weight.device()
    }

    fn step(
        &self,
        state: &mut Self::State,
        tokens: Tensor<B, 2, Int>,
        need_attention: bool,
    ) -> Result<Step<B>, ModelError> {
        let [batch, new] = tokens.dims();
        let x = self.embed(self.tgt_table(), tokens, state.cache.len())?;
        let mut input = DecoderStepInput::new(x);
        if need_attention {
            input = input.need_weights();
        }
        let out = self.decoder.step(input, &mut state.cache);
        let (h, weights) = (out.hidden, out.cross_weights);
        let last = h.narrow(1, new - 1, 1);
        let logits = self.project(last)?.reshape([batch, self.tgt_vocab_size()]);
        let attention = weights.map(|w| {
            let [b, _, q, k] = w.dims();
            // Average over heads, keep the last query: [batch, seq_src].
            w.narrow(2, q - 1, 1).mean_dim(1).reshape([b, k])
        });
        Ok(Step { logits, attention })
    }

    fn reorder(&self, state: &mut Self::State, indices: &[usize]) {
        state.cache.reorder(indices);
    }
}
