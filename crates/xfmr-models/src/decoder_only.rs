//! Decoder-only (GPT-like) causal language model.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Dropout, Linear, LinearConfig};
use burn::tensor::activation::log_softmax;
use burn::tensor::{backend::Backend, Bool, Int, Tensor, TensorData};
use xfmr_attention::AttnMask;
use xfmr_blocks::{
    add_positions, Activation, CausalCache, CausalDecoder, LayerConfig, NormPosition,
    PositionEncoding, Positions, SelfAttentionInput, StackConfig, TokenEmbedding,
    TokenEmbeddingConfig,
};

use crate::device::{check_fits, Extent};
use crate::generate::{self, Generation, GenerationOptions, IncrementalDecoder, Step};
use crate::sizes::{check_sizes, Sizes};
use crate::{
    check_ids, check_pad_id, pad_rows, project_rows, rows_within, table_extents, vocab_logits,
    vocab_logits_within, ModelError, PadSide, DEVICE_BUFFER_BYTES, LOGITS_CHUNK_BYTES,
};

/// Configuration of [`DecoderOnly`]. The presets follow GPT-2: pre-norm with a final norm,
/// GELU, learned positions, output tied to the token embedding. Every layer option (norm kind
/// and placement, activation, grouped heads, biases) lives in the shared [`LayerConfig`];
/// where positions enter (RoPE and ALiBi included) is the model's
/// [`positions`](Self::positions).
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
    /// Where positions enter: `Learned` (GPT-2, the default; `max_len` rows) and `Sinusoidal`
    /// are added to the embeddings, `Rotary` (LLaMA) and `Alibi` act in every self-attention
    /// sublayer. Configurations written before this field existed carried it as
    /// `layer.positions`: [`checkpoint::upgrade_config`](crate::checkpoint::upgrade_config)
    /// moves it here.
    #[config(default = "PositionEncoding::Learned")]
    pub positions: PositionEncoding,
}

impl DecoderOnlyConfig {
    /// GPT-2's layer at the given widths: pre-norm, GELU, dropout 0.1.
    pub fn gpt_layer(d_model: usize, n_heads: usize, d_ff: usize) -> LayerConfig {
        LayerConfig::new(d_model, n_heads, d_ff)
            .with_activation(Activation::Gelu)
            .with_norm_position(NormPosition::Pre)
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

    /// Checks every size against its bound ([`xfmr_blocks::limits`]: widths, layer count,
    /// vocabulary, `max_len`, the model's values in all) before anything is allocated;
    /// [`init`](Self::init) and checkpoint loading call it first.
    ///
    /// # Errors
    /// [`ModelError::InvalidConfig`] naming the first field out of its range (dotted:
    /// `layer.d_model`) and its value.
    pub fn validate(&self) -> Result<(), ModelError> {
        let output = if self.tie_output { 0 } else { self.vocab_size };
        check_sizes(&Sizes {
            layer: &self.layer,
            positions: &self.positions,
            max_len: self.max_len,
            stacks: &[("n_layers", self.n_layers)],
            vocabularies: &[("vocab_size", self.vocab_size, false)],
            table_rows: &[self.vocab_size, output],
            extra_squares: 0,
        })
    }

    /// Builds the model with fresh weights.
    ///
    /// # Errors
    /// Sizes out of their bounds ([`validate`](Self::validate)), a bad dropout, ε, head
    /// count or position setting, `pad_id` outside the vocabulary.
    pub fn init<B: Backend>(&self, device: &B::Device) -> Result<DecoderOnly<B>, ModelError> {
        self.validate()?;
        check_pad_id(self.pad_id, self.vocab_size)?;
        let layer = &self.layer;
        Ok(DecoderOnly {
            embedding: TokenEmbeddingConfig::new(self.vocab_size, layer.d_model)
                .with_scale(self.scale_embeddings)
                .init(device)?,
            positions: self
                .positions
                .init_input(self.max_len, layer.d_model, device)?,
            dropout: layer.residual_dropout()?,
            stack: StackConfig::new(layer.clone(), self.n_layers)
                .with_final_norm(layer.norm_position == NormPosition::Pre)
                .with_positions(self.positions.in_attention())
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

    fn project(&self, h: Tensor<B, 3>) -> Result<Tensor<B, 3>, ModelError> {
        vocab_logits(self.output.as_ref(), &self.embedding, h)
    }

    /// Next-token logits at every position (training, scoring).
    ///
    /// The vocabulary product runs in chunks of rows of at most [`LOGITS_CHUNK_BYTES`] of
    /// logits each, but the result is one tensor of `batch · seq · vocab` floats, which must
    /// fit in one device buffer: on wgpu at most the adapter's largest storage-buffer binding
    /// (128 MiB on lavapipe and other adapters at WebGPU's default, about 2 GiB on most
    /// discrete GPUs), on CUDA a quarter of the device memory. burn does not fail when it
    /// cannot allocate such a tensor (it leaves stale memory in it), so when the result exceeds
    /// [`DEVICE_BUFFER_BYTES`] this synchronises the device and returns
    /// [`ModelError::TooLargeForDevice`] if the device could not hold it. 803 positions of a
    /// 49,152-token vocabulary (158 MB) are past lavapipe's 128 MiB: for long inputs use
    /// [`forward_chunks`](Self::forward_chunks), [`last_logits`](Self::last_logits) or
    /// [`token_log_probs`](Self::token_log_probs), whose tensors each stay within a chunk.
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq]` (right-padded; padding after a sequence never affects it)
    /// - output: `[batch, seq, vocab]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) naming the logits' shape and size
    /// when the device cannot hold them (or the vocabulary table).
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, ModelError> {
        self.project(self.hidden_unchecked(ids)?)
    }

    /// The vocabulary projection of hidden states (as [`forward`](Self::forward) applies it
    /// to [`hidden`](Self::hidden)), multiplied in chunks of `batch · seq` rows whose logits
    /// take at most `max_product_bytes` each (at least one row), then concatenated: the
    /// chunked product equals the single one (`usize::MAX`) up to float rounding.
    ///
    /// # Shapes
    /// - `hidden`: `[batch, seq, d_model]`
    /// - output: `[batch, seq, vocab]`
    ///
    /// # Errors
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice), as [`forward`](Self::forward).
    pub fn vocab_logits(
        &self,
        hidden: Tensor<B, 3>,
        max_product_bytes: usize,
    ) -> Result<Tensor<B, 3>, ModelError> {
        vocab_logits_within(
            self.output.as_ref(),
            &self.embedding,
            hidden,
            max_product_bytes,
        )
    }

    /// Next-token logits at every position, as consecutive chunks of positions whose logits
    /// take at most `max_chunk_bytes` each and never more than [`DEVICE_BUFFER_BYTES`]
    /// ([`LOGITS_CHUNK_BYTES`] is a safe choice on every backend), at least one position per
    /// chunk. The stack runs once, here; each chunk is projected when the iterator reaches it,
    /// so the whole `[batch, seq, vocab]` never exists at once unless the caller keeps every
    /// chunk: the way to read every position's logits of an input too long for
    /// [`forward`](Self::forward) on wgpu.
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq]` (right-padded)
    /// - each item: `[batch, rows, vocab]`, positions in order; the rows add up to `seq`
    ///
    /// # Errors
    /// A sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when one position's logits over the
    /// batch, `[batch, 1, vocab]`, exceed [`DEVICE_BUFFER_BYTES`] (on every backend: split the
    /// batch), or when the device cannot hold the vocabulary table.
    pub fn forward_chunks(
        &self,
        ids: Tensor<B, 2, Int>,
        max_chunk_bytes: usize,
    ) -> Result<impl Iterator<Item = Tensor<B, 3>> + '_, ModelError> {
        let h = self.hidden(ids)?;
        let [batch, _, _] = h.dims();
        let one = Extent::new(
            "logits",
            vec![batch, 1, self.vocab_size()],
            h.dtype().size(),
            "split the batch: chunks hold whole positions of every row",
        );
        if one.exceeds_every_device() {
            return Err(one.error(format!(
                "not attempted: one position of the batch exceeds {DEVICE_BUFFER_BYTES} bytes"
            )));
        }
        Ok(self.project_chunks(h, max_chunk_bytes.min(DEVICE_BUFFER_BYTES)))
    }

    /// The logits of `h` `[batch, seq, d_model]` as consecutive chunks `[batch, rows, vocab]`
    /// of at most `max_bytes` each (at least one position), projected lazily, unchecked (see
    /// [`project_rows`]).
    fn project_chunks(
        &self,
        h: Tensor<B, 3>,
        max_bytes: usize,
    ) -> impl Iterator<Item = Tensor<B, 3>> + '_ {
        let [batch, seq, _] = h.dims();
        let step = rows_within(batch * self.vocab_size(), h.dtype().size(), max_bytes);
        (0..seq).step_by(step).map(move |start| {
            let rows = step.min(seq - start);
            let h = h.clone().narrow(1, start, rows);
            project_rows(self.output.as_ref(), &self.embedding, h, LOGITS_CHUNK_BYTES)
        })
    }

    /// Next-token logits after the last position only: what generation's first step computes,
    /// without the other positions' logits.
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq]` (the last column is read: left-pad batched prompts, as
    ///   [`generate`](Self::generate) does, or give one row)
    /// - output: `[batch, vocab]`
    ///
    /// # Errors
    /// An empty sequence; a sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold the
    /// `[batch, vocab]` logits or the vocabulary table.
    pub fn last_logits(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 2>, ModelError> {
        if ids.dims()[1] == 0 {
            return Err(ModelError::InvalidInput(
                "no position: the last position's logits need at least one token".into(),
            ));
        }
        let h = self.hidden_unchecked(ids)?;
        let [batch, seq, _] = h.dims();
        Ok(self
            .project(h.narrow(1, seq - 1, 1))?
            .reshape([batch, self.vocab_size()]))
    }

    /// Scores a text: the log-probability of each token given the tokens before it,
    /// `log p(ids[t + 1] | ids[..=t])`, computed by chunks of positions (log-softmax over the
    /// vocabulary within each chunk of at most [`LOGITS_CHUNK_BYTES`] of logits), so that a
    /// long text works on wgpu too. A row's sum is the log-likelihood of its tokens after the
    /// first; positions of right padding are scored too, for the caller to mask.
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq]`, `seq ≥ 2` (right-padded)
    /// - output: `[batch, seq - 1]`
    ///
    /// # Errors
    /// Fewer than two positions, a sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold one
    /// chunk (one position's logits over a very large batch) or the vocabulary table.
    pub fn token_log_probs(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 2>, ModelError> {
        let [batch, seq] = ids.dims();
        if seq < 2 {
            return Err(ModelError::InvalidInput(format!(
                "{seq} position(s): scoring needs at least two (each token is scored given \
                 the ones before it)"
            )));
        }
        // The last position predicts nothing here: score positions 0..seq-1.
        let h = self.hidden_unchecked(ids.clone())?.narrow(1, 0, seq - 1);
        let device = h.device();
        let targets = ids.narrow(1, 1, seq - 1);
        let mut start = 0;
        let mut scores = Vec::new();
        let mut extents = table_extents(self.output.as_ref(), &self.embedding);
        for logits in self.project_chunks(h, LOGITS_CHUNK_BYTES) {
            let rows = logits.dims()[1];
            if start == 0 {
                // The first chunk is the largest.
                extents.push(Extent::logits(&logits));
            }
            let target = targets.clone().narrow(1, start, rows).unsqueeze_dim::<3>(2);
            let picked = log_softmax(logits, 2).gather(2, target);
            scores.push(picked.reshape([batch, rows]));
            start += rows;
        }
        let scores = Tensor::cat(scores, 1);
        check_fits::<B>(&device, extents)?;
        Ok(scores)
    }

    /// The stack's output (after its final norm), before the vocabulary projection: what
    /// Hugging Face calls the last hidden state.
    ///
    /// # Shapes
    /// - `ids`: `[batch, seq]`
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Errors
    /// A sequence longer than a learned position table;
    /// [`TooLargeForDevice`](ModelError::TooLargeForDevice) when the device cannot hold the
    /// vocabulary table (synchronised only for a table over [`DEVICE_BUFFER_BYTES`]).
    pub fn hidden(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, ModelError> {
        let h = self.hidden_unchecked(ids)?;
        check_fits::<B>(
            &h.device(),
            table_extents(self.output.as_ref(), &self.embedding),
        )?;
        Ok(h)
    }

    /// [`hidden`](Self::hidden) without the device check, for callers that check the tables
    /// with their result.
    fn hidden_unchecked(&self, ids: Tensor<B, 2, Int>) -> Result<Tensor<B, 3>, ModelError> {
        let x = add_positions(self.positions.as_ref(), self.embedding.forward(ids), 0)?;
        Ok(self
            .stack
            .forward(SelfAttentionInput::new(xfmr_blocks::dropout(
                &self.dropout,
                x,
            ))))
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
        let first = pad_rows(prompts, self.pad_id, PadSide::Left);
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
        let input = SelfAttentionInput::new(xfmr_blocks::dropout(&self.dropout, x)).mask_opt(mask);
        let h = self.stack.step(input, &mut state.cache);
        let logits = self
            .project(h.narrow(1, new - 1, 1))?
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
