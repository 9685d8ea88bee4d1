//! Decoder-only (GPT-like) causal language model.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear, LinearConfig};
use burn::tensor::{backend::Backend, Bool, Int, Tensor, TensorData};
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    add_positions, Activation, CausalCache, CausalDecoder, LayerConfig, NormPosition,
    PositionEncoding, Positions, SelfAttentionInput, StackConfig, TokenEmbedding,
    TokenEmbeddingConfig,
};

use crate::generate::{self, Generation, GenerationOptions, IncrementalDecoder, Step};
use crate::{check_ids, check_pad_id, check_positive, vocab_logits, ModelError};

/// Configuration of [`DecoderOnly`]. The presets follow GPT-2: pre-norm with a final norm,
/// GELU, learned positions, output tied to the token embedding. Every layer option (norm kind
/// and placement, activation, grouped heads, biases, positions: RoPE and ALiBi included) lives
/// in the shared [`LayerConfig`].
#[derive(Config, Debug)]
pub struct DecoderOnlyConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Every layer; its `dropout` also applies to the embedding sum.
    pub layer: LayerConfig,
    /// Layers.
    pub n_layers: usize,
    /// Context length (rows of a learned position table). Default: 1024.
    #[config(default = 1024)]
    pub max_len: usize,
    /// Scale token embeddings by √d_model (paper) or not (GPT-2). Default: false.
    #[config(default = false)]
    pub scale_embeddings: bool,
    /// Output projection tied to the token embedding. Default: true.
    #[config(default = true)]
    pub tie_output: bool,
    /// Padding id (left padding of batched prompts). Default: 0.
    #[config(default = 0)]
    pub pad_id: u32,
}

impl DecoderOnlyConfig {
    /// GPT-2's layer at the given widths: pre-norm, GELU, learned positions, dropout 0.1.
    pub fn gpt_layer(d_model: usize, n_heads: usize, d_ff: usize) -> LayerConfig {
        LayerConfig::new(d_model, n_heads, d_ff)
            .with_activation(Activation::Gelu)
            .with_norm_position(NormPosition::Pre)
            .with_positions(PositionEncoding::Learned)
    }

    /// The paper's base widths as a causal language model: d_model 512, 8 heads, d_ff 2048,
    /// 6 layers (GPT-2's layer).
    pub fn base(vocab_size: usize) -> Self {
        Self::new(vocab_size, Self::gpt_layer(512, 8, 2048), 6)
    }

    /// A toy model for tests and examples: d_model 64, 4 heads, d_ff 128, 2 layers.
    pub fn tiny(vocab_size: usize) -> Self {
        Self::new(vocab_size, Self::gpt_layer(64, 4, 128), 2)
    }

    /// With the layer configuration changed by `f`.
    pub fn map_layer(mut self, f: impl FnOnce(LayerConfig) -> LayerConfig) -> Self {
        self.layer = f(self.layer);
        self
    }

    /// Builds the model with fresh weights.
    ///
    /// # Errors
    /// Zero sizes, a bad dropout, ε, head count or position setting, `pad_id` outside the
    /// vocabulary.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<DecoderOnly<B>, ModelError> {
        check_positive("vocab_size", self.vocab_size)?;
        check_positive("max_len", self.max_len)?;
        check_pad_id(self.pad_id, self.vocab_size)?;
        let layer = &self.layer;
        Ok(DecoderOnly {
            embedding: TokenEmbeddingConfig::new(self.vocab_size, layer.d_model)
                .with_scale(self.scale_embeddings)
                .init(device)?,
            positions: layer
                .positions
                .init_input(self.max_len, layer.d_model, device)?,
            dropout: DropoutConfig::new(layer.dropout).init(),
            stack: StackConfig::new(layer.clone(), self.n_layers)
                .with_final_norm(layer.norm_position == NormPosition::Pre)
                .init_causal(device)?,
            output: (!self.tie_output)
                .then(|| LinearConfig::new(layer.d_model, self.vocab_size).init(device)),
            pad_id: self.pad_id,
        })
    }
}

/// A decoder-only causal language model: embeddings + positions → causal self-attention
/// stack (decoder layers without cross-attention) → logits.
#[derive(Module, Debug)]
pub struct DecoderOnly<B: Backend> {
    /// Token embedding (also the output projection when tied).
    pub embedding: TokenEmbedding<B>,
    /// Position vectors added to the embeddings (none with RoPE, ALiBi or no positions).
    pub positions: Option<Positions<B>>,
    /// Dropout on the embedding sum.
    pub dropout: Dropout,
    /// The causal stack.
    pub stack: CausalDecoder<B>,
    /// Output projection when not tied.
    pub output: Option<Linear<B>>,
    /// Padding id.
    pub pad_id: u32,
}

impl<B: Backend> DecoderOnly<B> {
    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.embedding.weight.dims()[0]
    }

    fn project(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        vocab_logits(self.output.as_ref(), &self.embedding, h)
    }

    /// Next-token logits at every position (training, scoring).
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq]` (right-padded; padding after a sequence never affects it)
    /// - output: `[batch, seq, vocab]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table.
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, ModelError> {
        Ok(self.project(self.hidden(ids)?))
    }

    /// The stack's output (after its final norm), before the vocabulary projection: what
    /// Hugging Face calls the last hidden state.
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table.
    pub fn hidden(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, ModelError> {
        let x = add_positions(self.positions.as_ref(), self.embedding.forward(ids), 0)?;
        Ok(self
            .stack
            .forward(SelfAttentionInput::new(self.dropout.forward(x))))
    }

    /// An empty decoding state for `batch` sequences.
    pub fn start(&self, batch: usize) -> LmState<B> {
        LmState {
            cache: self.stack.start(),
            ignored: vec![Vec::new(); batch],
            next_position: vec![0; batch],
        }
    }

    /// Continues prompts: the prompts are left-padded into one batch (padding masked and
    /// skipped by the positions, so each row decodes as it would alone), run through the stack
    /// once, then tokens are generated one at a time through the key/value cache.
    ///
    /// # Errors
    /// An empty prompt, an id outside the vocabulary, invalid options, a context longer than a
    /// learned position table.
    pub fn generate(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerationOptions,
    ) -> Result<Generation, ModelError> {
        self.generate_streaming(prompts, options, &mut |_, _| {})
    }

    /// As [`generate`](Self::generate), calling `on_token(prompt, token)` as each token is
    /// chosen (see [`generate::generate_streaming`]).
    ///
    /// # Errors
    /// As [`generate`](Self::generate).
    pub fn generate_streaming(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerationOptions,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> Result<Generation, ModelError> {
        check_ids("prompt", prompts, self.vocab_size())?;
        if let Some(i) = prompts.iter().position(Vec::is_empty) {
            return Err(ModelError::InvalidInput(format!(
                "prompt {i} is empty: a decoder-only model needs at least one token to condition on"
            )));
        }
        let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let first = prompts
            .iter()
            .map(|p| {
                let mut row = vec![self.pad_id; len - p.len()];
                row.extend(p);
                row
            })
            .collect::<Vec<_>>();
        let mut state = self.start(prompts.len());
        for (row, p) in state.ignored.iter_mut().zip(prompts) {
            // Leading pads are ignored keys for the rest of the decoding.
            row.extend((0..len).map(|k| k < len - p.len()));
        }
        generate::generate_streaming(self, state, first, options, on_token)
    }
}

/// The decoding state of a [`DecoderOnly`] model.
#[derive(Debug, Clone)]
pub struct LmState<B: Backend> {
    /// Per-layer key/value caches.
    pub cache: CausalCache<B>,
    /// Per row, whether each position fed so far is padding (ignored as a key). Rows whose
    /// prompt was left-padded start with `true`s; the step consumes the entries not yet in the
    /// cache.
    pub ignored: Vec<Vec<bool>>,
    /// Per row, the position of the next real token.
    pub next_position: Vec<usize>,
}

impl<B: Backend> IncrementalDecoder<B> for DecoderOnly<B> {
    type State = LmState<B>;

    fn vocab_size(&self) -> usize {
        DecoderOnly::vocab_size(self)
    }

    fn device(&self) -> B::Device {
        self.embedding.weight.device()
    }

    fn step(
        &self,
        state: &mut Self::State,
        tokens: Tensor<B, 2, Int>,
        _need_attention: bool,
    ) -> Result<Step<B>, ModelError> {
        let [batch, new] = tokens.dims();
        let past = state.cache.len();
        let total = past + new;
        // Rows whose flags do not cover the new tokens yet get "not ignored" for them.
        for row in &mut state.ignored {
            row.resize(total, false);
        }
        // Positions: count real tokens only, so a left-padded row matches its unpadded self.
        let positions: Vec<Vec<usize>> = state
            .ignored
            .iter()
            .zip(&mut state.next_position)
            .map(|(ignored, next)| {
                ignored[past..]
                    .iter()
                    .map(|&pad| {
                        let p = *next;
                        if !pad {
                            *next += 1;
                        }
                        p
                    })
                    .collect()
            })
            .collect();
        let device = self.embedding.weight.device();
        let mut x = self.embedding.forward(tokens);
        if let Some(table) = &self.positions {
            x = x + table.gather(&positions)?;
        }
        let mask = state.ignored.iter().any(|r| r.iter().any(|&p| p)).then(|| {
            let flat: Vec<bool> = state.ignored.iter().flatten().copied().collect();
            AttnMask::from_key_padding(Tensor::<B, 2, Bool>::from_data(
                TensorData::new(flat, [batch, total]),
                &device,
            ))
        });
        let input = SelfAttentionInput::new(self.dropout.forward(x)).mask_opt(mask);
        let h = self.stack.step(input, &mut state.cache);
        let logits = self
            .project(h.narrow(1, new - 1, 1))
            .reshape([batch, self.vocab_size()]);
        Ok(Step {
            logits,
            attention: None,
        })
    }

    fn reorder(&self, state: &mut Self::State, indices: &[usize]) {
        state.cache.reorder(indices);
        state.ignored = indices.iter().map(|&i| state.ignored[i].clone()).collect();
        state.next_position = indices.iter().map(|&i| state.next_position[i]).collect();
    }
}
