//! The encoder-decoder Transformer of the paper (§3): the translation model.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};
use burn::tensor::{backend::Backend, Int, Tensor};
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    Activation, Decoder, DecoderCache, Encoder, LayerConfig, NormPosition, StackConfig,
    TokenEmbedding, TokenEmbeddingConfig,
};

use crate::generate::{self, Generation, GenerationOptions, IncrementalDecoder, Step};
use crate::{
    check_ids, check_pad_id, check_positive, index_tensor, int_tensor, vocab_logits, ModelError,
    PositionKind, Positions,
};

/// Configuration of [`Transformer`]. The defaults are the paper's; the presets
/// [`base`](Self::base) and [`big`](Self::big) are its two models (Table 3), and
/// [`small`](Self::small) / [`tiny`](Self::tiny) fit a CPU.
#[derive(Config, Debug)]
pub struct TransformerConfig {
    /// Source vocabulary size.
    pub src_vocab_size: usize,
    /// Target vocabulary size.
    pub tgt_vocab_size: usize,
    /// Model width (paper: 512).
    pub d_model: usize,
    /// Attention heads (paper: 8).
    pub n_heads: usize,
    /// Feed-forward inner width (paper: 2048).
    pub d_ff: usize,
    /// Encoder layers (paper: 6).
    pub n_encoder_layers: usize,
    /// Decoder layers (paper: 6).
    pub n_decoder_layers: usize,
    /// Dropout on the embedding sums and on every sublayer output (paper: 0.1).
    #[config(default = 0.1)]
    pub dropout: f64,
    /// Dropout on attention weights. Default: 0 (the paper names none).
    #[config(default = 0.0)]
    pub attention_dropout: f64,
    /// Feed-forward activation. Default: ReLU (paper).
    #[config(default = "Activation::Relu")]
    pub activation: Activation,
    /// Norm placement. Default: post-norm (paper). Pre-norm stacks get a final norm.
    #[config(default = "NormPosition::Post")]
    pub norm_position: NormPosition,
    /// LayerNorm ε. Default: 1e-5.
    #[config(default = 1e-5)]
    pub norm_eps: f64,
    /// One embedding table for source, target and output (paper §3.4, a shared BPE vocabulary).
    /// Needs `src_vocab_size == tgt_vocab_size`. Default: true.
    #[config(default = true)]
    pub share_embeddings: bool,
    /// The output projection is the (transposed) target embedding (paper §3.4). Default: true.
    #[config(default = true)]
    pub tie_output: bool,
    /// Position vectors. Default: sinusoidal (paper).
    #[config(default = "PositionKind::Sinusoidal")]
    pub positions: PositionKind,
    /// Rows of the position table (a hard limit for learned positions only). Default: 1024.
    #[config(default = 1024)]
    pub max_len: usize,
    /// Padding token id: source padding is masked from it. Default: 0.
    #[config(default = 0)]
    pub pad_id: usize,
}

impl TransformerConfig {
    /// The paper's base model: d_model 512, 6 + 6 layers, 8 heads, d_ff 2048, dropout 0.1,
    /// one shared vocabulary (37,000 BPE tokens in the paper's English-German runs: ≈ 63M
    /// parameters with it; the paper reports 65M).
    pub fn base(vocab_size: usize) -> Self {
        Self::new(vocab_size, vocab_size, 512, 8, 2048, 6, 6)
    }

    /// The paper's big model: d_model 1024, 16 heads, d_ff 4096, dropout 0.3.
    pub fn big(vocab_size: usize) -> Self {
        Self::new(vocab_size, vocab_size, 1024, 16, 4096, 6, 6).with_dropout(0.3)
    }

    /// A CPU-sized model: d_model 256, 4 heads, d_ff 1024, 3 + 3 layers.
    pub fn small(vocab_size: usize) -> Self {
        Self::new(vocab_size, vocab_size, 256, 4, 1024, 3, 3)
    }

    /// A toy model for tests and examples: d_model 64, 4 heads, d_ff 128, 2 + 2 layers.
    pub fn tiny(vocab_size: usize) -> Self {
        Self::new(vocab_size, vocab_size, 64, 4, 128, 2, 2)
    }

    /// The configuration shared by every layer.
    pub fn layer(&self) -> LayerConfig {
        LayerConfig::new(self.d_model, self.n_heads, self.d_ff)
            .with_dropout(self.dropout)
            .with_attention_dropout(self.attention_dropout)
            .with_activation(self.activation)
            .with_norm_position(self.norm_position)
            .with_norm_eps(self.norm_eps)
    }

    /// Builds the model with fresh weights.
    ///
    /// # Errors
    /// Zero sizes, `share_embeddings` with different vocabularies, a bad dropout, ε or head
    /// count, each named with its value.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<Transformer<B>, ModelError> {
        check_positive("src_vocab_size", self.src_vocab_size)?;
        check_positive("tgt_vocab_size", self.tgt_vocab_size)?;
        check_positive("max_len", self.max_len)?;
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
        let layer = self.layer();
        let pre = self.norm_position == NormPosition::Pre;
        let embedding = |vocab| TokenEmbeddingConfig::new(vocab, self.d_model).init(device);
        Ok(Transformer {
            src_embedding: embedding(self.src_vocab_size)?,
            tgt_embedding: (!self.share_embeddings)
                .then(|| embedding(self.tgt_vocab_size))
                .transpose()?,
            output: (!self.tie_output)
                .then(|| LinearConfig::new(self.d_model, self.tgt_vocab_size).init(device)),
            positions: Positions::init(self.positions, self.max_len, self.d_model, device)?,
            dropout: DropoutConfig::new(self.dropout).init(),
            encoder: StackConfig::new(layer.clone(), self.n_encoder_layers)
                .with_final_norm(pre)
                .init_encoder(device)?,
            decoder: StackConfig::new(layer, self.n_decoder_layers)
                .with_final_norm(pre)
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
    /// Position vectors added to both embeddings.
    pub positions: Positions<B>,
    /// Dropout on the embedding sums.
    pub dropout: Dropout,
    /// The encoder stack.
    pub encoder: Encoder<B>,
    /// The decoder stack.
    pub decoder: Decoder<B>,
    /// Padding id (source padding mask).
    pub pad_id: usize,
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
        let seq = ids.dims()[1];
        let positions = self.positions.range(seq, offset)?;
        Ok(self
            .dropout
            .forward(table.forward(ids) + positions.unsqueeze::<3>()))
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
    /// A sequence longer than a learned position table.
    pub fn encode(&self, src: Tensor<B, 2, Int>) -> Result<Memory<B>, ModelError> {
        let mask = AttnMask::padding_from_ids(src.clone(), self.pad_id as i64);
        let x = self.embed(&self.src_embedding, src, 0)?;
        Ok(Memory {
            states: self.encoder.forward(x, Some(&mask)),
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
    /// A sequence longer than a learned position table.
    pub fn decode(
        &self,
        tgt_in: Tensor<B, 2, Int>,
        memory: &Memory<B>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let x = self.embed(self.tgt_table(), tgt_in, 0)?;
        let h = self
            .decoder
            .forward(x, memory.states.clone(), None, Some(&memory.mask));
        Ok(self.project(h))
    }

    /// Teacher-forced forward: encode `src`, decode `tgt_in`.
    ///
    /// # Shapes
    /// - `src`: `[batch, seq_src]`; `tgt_in`: `[batch, seq_tgt]`
    /// - output: `[batch, seq_tgt, tgt_vocab]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table.
    pub fn forward(
        &self,
        src: Tensor<B, 2, Int>,
        tgt_in: Tensor<B, 2, Int>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        let memory = self.encode(src)?;
        self.decode(tgt_in, &memory)
    }

    fn project(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        vocab_logits(self.output.as_ref(), self.tgt_table(), h)
    }

    /// Starts incremental decoding over `memory` (see [`IncrementalDecoder`]).
    pub fn start(&self, memory: Memory<B>) -> Seq2SeqState<B> {
        Seq2SeqState {
            memory,
            cache: DecoderCache::new(self.decoder.layers.len()),
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
        let len = sources.iter().map(Vec::len).max().unwrap_or(0);
        let flat: Vec<i64> = sources
            .iter()
            .flat_map(|s| {
                s.iter()
                    .map(|&t| t as i64)
                    .chain(std::iter::repeat(self.pad_id as i64))
                    .take(len)
            })
            .collect();
        let src = int_tensor::<B, 2>(flat, [sources.len(), len], &device);
        let state = self.start(self.encode(src)?);
        let first = vec![vec![bos_id]; sources.len()];
        generate::generate(self, state, first, options)
    }
}

/// The decoding state of a [`Transformer`]: the memory and the decoder's caches.
#[derive(Debug, Clone)]
pub struct Seq2SeqState<B: Backend> {
    /// Encoded source.
    pub memory: Memory<B>,
    /// Per-layer key/value caches.
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
        let (h, weights) = self.decoder.forward_cached_weights(
            x,
            state.memory.states.clone(),
            &mut state.cache,
            None,
            Some(&state.memory.mask),
            need_attention,
        );
        let last = h.narrow(1, new - 1, 1);
        let logits = self.project(last).reshape([batch, self.tgt_vocab_size()]);
        let attention = weights.map(|w| {
            let [b, _, q, k] = w.dims();
            // Average over heads, keep the last query: [batch, seq_src].
            w.narrow(2, q - 1, 1).mean_dim(1).reshape([b, k])
        });
        Ok(Step { logits, attention })
    }

    fn reorder(&self, state: &mut Self::State, indices: &[usize]) {
        let idx = index_tensor(indices, &state.memory.states.device());
        state.cache.reorder(idx.clone());
        state.memory.states = state.memory.states.clone().select(0, idx.clone());
        state.memory.mask =
            AttnMask::from_tensor(state.memory.mask.tensor().clone().select(0, idx));
    }
}
