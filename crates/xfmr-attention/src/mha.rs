//! Multi-head attention (paper §3.2.2):
//!
//! ```text
//! MultiHead(Q, K, V) = Concat(head_1, …, head_h) Wᴼ,   head_i = Attention(Q W_iᵠ, K W_iᴷ, V W_iⱽ)
//! ```
//!
//! with `h = n_heads` heads of width `d_k = d_v = d_model / h`. Self-attention takes `Q = K = V`
//! from one sequence; cross-attention takes queries from one sequence and keys/values from
//! another (the encoder memory), possibly of another length.
//!
//! Extension beyond the paper: **grouped-query attention** — `n_kv_heads < n_heads` key/value
//! heads, each shared by `n_heads / n_kv_heads` query heads (GQA; `n_kv_heads = 1` is multi-query
//! attention). With the default `n_kv_heads = n_heads` it is the paper's layer.

use burn::config::Config;
use burn::module::{Initializer, Module};
use burn::nn::Linear;
use burn::tensor::{backend::Backend, Tensor};

use crate::input::Keys;
use crate::options::{AttentionKernel, AttentionOptions, AttentionOutput};
use crate::sdpa::scaled_dot_product_attention;
use crate::{
    AttentionError, AttnMask, InvalidConfig, KvCache, MhaInput, ProjectedMemory, QkRotation,
};

/// Configuration of [`MultiHeadAttention`].
#[derive(Config, Debug)]
pub struct MultiHeadAttentionConfig {
    /// Model width `d_model` (input and output features).
    pub d_model: usize,
    /// Number of query heads `h`; each has width `d_k = d_model / h`.
    pub n_heads: usize,
    /// Number of key/value heads for grouped-query attention; must divide `n_heads`.
    /// Default: `None` (= `n_heads`, the paper's multi-head attention).
    #[config(default = "None")]
    pub n_kv_heads: Option<usize>,
    /// Dropout on the attention weights after softmax. Default: 0.0 (the paper applies its
    /// dropout to sublayer outputs, which is the blocks' business; PyTorch's default is also 0).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Bias on the query projection. Default: true.
    #[config(default = true)]
    pub query_bias: bool,
    /// Bias on the key projection. Default: true.
    #[config(default = true)]
    pub key_bias: bool,
    /// Bias on the value projection. Default: true.
    #[config(default = true)]
    pub value_bias: bool,
    /// Bias on the output projection `Wᴼ`. Default: true.
    #[config(default = true)]
    pub output_bias: bool,
    /// Attention implementation when weights are not requested (see [`AttentionKernel`]).
    /// Default: `Auto`.
    #[config(default = "AttentionKernel::Auto")]
    pub kernel: AttentionKernel,
    /// Initialiser of the query, key and value weights, drawn with the fans of the one packed
    /// `d_model × (d_model + 2·kv_dim)` matrix they form (`kv_dim = n_kv_heads · d_k`), as
    /// PyTorch draws its `in_proj_weight`: Xavier's bound is then `√(6 / 4d_model)` for the
    /// paper's layer, not the `√(3 / d_model)` of a lone square matrix. Their biases start at
    /// zero. Default: Xavier/Glorot uniform, gain 1 (PyTorch's `nn.MultiheadAttention`).
    #[config(default = "Initializer::XavierUniform { gain: 1.0 }")]
    pub initializer: Initializer,
    /// Initialiser of the output projection's weight `Wᴼ` (its bias starts at zero). Default:
    /// Kaiming uniform with gain `1/√3`, that is `U(±1/√d_model)`: PyTorch's `out_proj`, an
    /// `nn.Linear`, and burn's `LinearConfig` default.
    #[config(
        default = "Initializer::KaimingUniform { gain: 1.0 / 3.0f64.sqrt(), fan_out_only: false }"
    )]
    pub output_initializer: Initializer,
}

impl MultiHeadAttentionConfig {
    /// Number of key/value heads (`n_kv_heads`, or `n_heads` when unset).
    pub fn kv_heads(&self) -> usize {
        self.n_kv_heads.unwrap_or(self.n_heads)
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// Zero sizes, `d_model % n_heads != 0`, `n_heads % n_kv_heads != 0`, dropout outside `[0, 1)`.
    pub fn validate(&self) -> Result<(), AttentionError> {
        InvalidConfig::positive("d_model", self.d_model)?;
        InvalidConfig::positive("n_heads", self.n_heads)?;
        InvalidConfig::positive("n_kv_heads", self.kv_heads())?;
        if !self.d_model.is_multiple_of(self.n_heads) {
            return Err(AttentionError::HeadsDoNotDivide {
                d_model: self.d_model,
                n_heads: self.n_heads,
            });
        }
        if !self.n_heads.is_multiple_of(self.kv_heads()) {
            return Err(AttentionError::KvHeadsDoNotDivide {
                n_heads: self.n_heads,
                n_kv_heads: self.kv_heads(),
            });
        }
        InvalidConfig::dropout("dropout", self.dropout)?;
        Ok(())
    }

    /// Builds the layer after [`validate`](Self::validate).
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn init<B: Backend>(
        &self,
        device: &B::Device,
    ) -> Result<MultiHeadAttention<B>, AttentionError> {
        self.validate()?;
        let d_k = self.d_model / self.n_heads;
        let kv_dim = self.kv_heads() * d_k;
        // q, k and v share the fans of their packed matrix; the output projection has its own.
        let packed = (self.d_model, self.d_model + 2 * kv_dim);
        let linear = |init: &Initializer, d_out: usize, fans: (usize, usize), bias: bool| Linear {
            weight: init.init_with([self.d_model, d_out], Some(fans.0), Some(fans.1), device),
            bias: bias.then(|| Initializer::Zeros.init([d_out], device)),
        };
        let output_fans = (self.d_model, self.d_model);
        Ok(MultiHeadAttention {
            query: linear(&self.initializer, self.d_model, packed, self.query_bias),
            key: linear(&self.initializer, kv_dim, packed, self.key_bias),
            value: linear(&self.initializer, kv_dim, packed, self.value_bias),
            output: linear(
                &self.output_initializer,
                self.d_model,
                output_fans,
                self.output_bias,
            ),
            d_model: self.d_model,
            n_heads: self.n_heads,
            n_kv_heads: self.kv_heads(),
            d_k,
            dropout: self.dropout,
            kernel: self.kernel,
        })
    }
}

/// Multi-head attention with optional grouped key/value heads. Create with
/// [`MultiHeadAttentionConfig`].
///
/// Projections are burn [`Linear`] layers (weight `[d_in, d_out]`, `y = x W + b`);
/// [`MultiHeadAttention::load_torch`] imports PyTorch's `nn.MultiheadAttention` layout.
#[derive(Module, Debug)]
pub struct MultiHeadAttention<B: Backend> {
    /// Query projection `W^Q`: `d_model → n_heads · d_k`.
    pub query: Linear<B>,
    /// Key projection `W^K`: `d_model → n_kv_heads · d_k`.
    pub key: Linear<B>,
    /// Value projection `W^V`: `d_model → n_kv_heads · d_k`.
    pub value: Linear<B>,
    /// Output projection `W^O`: `n_heads · d_k → d_model`.
    pub output: Linear<B>,
    /// Model width.
    pub d_model: usize,
    /// Number of query heads.
    pub n_heads: usize,
    /// Number of key/value heads (`== n_heads` without grouping).
    pub n_kv_heads: usize,
    /// Width of one head.
    pub d_k: usize,
    /// Dropout probability on the attention weights.
    pub dropout: f64,
    /// Attention implementation when weights are not requested.
    pub kernel: AttentionKernel,
}

/// Output of [`MultiHeadAttention`].
pub type MhaOutput<B> = AttentionOutput<B, 3>;

impl<B: Backend> MultiHeadAttention<B> {
    /// Attention over a whole sequence (no cache).
    ///
    /// # Shapes
    /// - `input.query`: `[batch, seq_q, d_model]`
    /// - the memory of [`MhaInput::cross`]: `[batch, seq_k, d_model]`; of
    ///   [`MhaInput::cross_projected`]: `[batch, n_kv_heads, seq_k, d_k]`; self-attention:
    ///   `seq_k = seq_q`
    /// - mask: broadcastable to `[batch, n_heads, seq_q, seq_k]`
    /// - output `context`: `[batch, seq_q, d_model]`; `weights`: `[batch, n_heads, seq_q, seq_k]`
    ///
    /// # Panics
    /// On a shape mismatch, with the message of [`try_forward`](Self::try_forward)'s error.
    pub fn forward(&self, input: MhaInput<B>) -> MhaOutput<B> {
        self.try_forward(input)
            .unwrap_or_else(|e| panic!("MultiHeadAttention::forward: {e}"))
    }

    /// [`forward`](Self::forward) returning shape mismatches as errors.
    ///
    /// # Errors
    /// [`AttentionError::InputShape`] for a wrong width or batch, [`AttentionError::MaskShape`]
    /// for a mask or bias that does not broadcast to the scores.
    pub fn try_forward(&self, input: MhaInput<B>) -> Result<MhaOutput<B>, AttentionError> {
        let [batch, seq_q, _] = self.check_query(&input.query)?;
        if !matches!(input.keys, Keys::Own) && input.rotation.is_some() {
            return Err(AttentionError::RotaryCrossAttention);
        }
        let (key, value) = match &input.keys {
            Keys::Own => self.project_keys(input.query.clone()),
            Keys::Memory(memory) => {
                self.check_memory(memory, batch)?;
                self.project_keys(memory.clone())
            }
            Keys::Projected(memory) => {
                self.check_projected(memory, &input.query)?;
                (memory.keys().clone(), memory.values().clone())
            }
        };
        let seq_k = key.dims()[2];
        self.check_masks(&input, [batch, self.n_heads, seq_q, seq_k])?;
        let query = self.project(input.query, &self.query, self.n_heads);
        let (query, key) = rotate(input.rotation.as_deref(), query, key, 0);
        let mask = with_causal(input.mask, input.causal, seq_q, seq_k, &key.device());
        self.attend(query, key, value, mask, input.bias, input.need_weights)
    }

    /// Incremental self-attention through a key/value cache (`MhaInput::self_attn(x_new)`):
    /// projects only the new tokens, appends their keys/values to `cache`, and attends the new
    /// queries over all cached positions. It is always causal: new query `i` sits at position
    /// `cache.len() + i` and sees keys up to it. Feeding a sequence one token at a time gives
    /// the same result as one causal [`forward`](Self::forward) over the whole sequence.
    ///
    /// Cross-attention while decoding projects the memory once
    /// ([`project_memory`](Self::project_memory)) and attends over it with
    /// [`forward`](Self::forward) and [`MhaInput::cross_projected`].
    ///
    /// # Shapes
    /// - `input.query`: `[batch, new, d_model]`
    /// - mask: broadcastable to `[batch, n_heads, new, past + new]`
    /// - output `context`: `[batch, new, d_model]`
    ///
    /// # Panics
    /// On a shape mismatch (see [`try_forward_cached`](Self::try_forward_cached)).
    pub fn forward_cached(&self, input: MhaInput<B>, cache: &mut KvCache<B>) -> MhaOutput<B> {
        self.try_forward_cached(input, cache)
            .unwrap_or_else(|e| panic!("MultiHeadAttention::forward_cached: {e}"))
    }

    /// [`forward_cached`](Self::forward_cached) returning shape mismatches as errors. On error
    /// the cache is left unchanged.
    ///
    /// # Errors
    /// As [`try_forward`](Self::try_forward), [`AttentionError::InputShape`] when the batch
    /// differs from the cache's, [`AttentionError::CachedCrossAttention`] for a cross-attention
    /// input.
    pub fn try_forward_cached(
        &self,
        input: MhaInput<B>,
        cache: &mut KvCache<B>,
    ) -> Result<MhaOutput<B>, AttentionError> {
        let [batch, seq_q, _] = self.check_query(&input.query)?;
        if let Some(cached) = cache.batch_size().filter(|&b| b != batch) {
            return Err(AttentionError::InputShape {
                what: "query",
                actual: input.query.dims().to_vec(),
                expected: format!("batch {cached} to match the key/value cache"),
            });
        }
        if !matches!(input.keys, Keys::Own) {
            return Err(AttentionError::CachedCrossAttention);
        }
        let device = input.query.device();
        let seq_k = cache.len() + seq_q;
        self.check_masks(&input, [batch, self.n_heads, seq_q, seq_k])?;
        let (key, value) = self.project_keys(input.query.clone());
        let query = self.project(input.query, &self.query, self.n_heads);
        // New rows sit after the cached ones.
        let (query, key) = rotate(input.rotation.as_deref(), query, key, cache.len());
        let (key, value) = cache.append(key, value);
        // A single new query sees every cached key: its causal mask is empty.
        let mask = with_causal(input.mask, seq_q > 1, seq_q, seq_k, &device);
        self.attend(query, key, value, mask, input.bias, input.need_weights)
    }

    /// Projects encoder memory into keys and values once, for cross-attention over many
    /// decoding steps ([`MhaInput::cross_projected`]).
    ///
    /// # Shapes
    /// - `memory`: `[batch, seq_src, d_model]`
    /// - keys and values: `[batch, n_kv_heads, seq_src, d_k]`
    pub fn project_memory(&self, memory: Tensor<B, 3>) -> ProjectedMemory<B> {
        let (key, value) = self.project_keys(memory);
        ProjectedMemory::new(key, value)
    }

    /// Keys and values of `source` `[batch, seq, d_model]`, `[batch, n_kv_heads, seq, d_k]`
    /// each.
    fn project_keys(&self, source: Tensor<B, 3>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let key = self.project(source.clone(), &self.key, self.n_kv_heads);
        let value = self.project(source, &self.value, self.n_kv_heads);
        (key, value)
    }

    /// `x W + b`, split into heads.
    ///
    /// `[batch, seq, d_model]` → `[batch, heads, seq, d_k]`. The projection runs as one 2-D
    /// matrix product over all `batch · seq` rows: on the CPU backends a rank-3 `linear` goes
    /// through a batched product (one small product per batch entry), measurably slower.
    fn project(&self, x: Tensor<B, 3>, linear: &Linear<B>, heads: usize) -> Tensor<B, 4> {
        let [batch, seq, d_model] = x.dims();
        // (B, T, d_model) -> (B·T, d_model) -> (B·T, h·d_k)
        crate::linear(linear, x.reshape([batch * seq, d_model]))
            // (B·T, h·d_k) -> (B, T, h, d_k)
            .reshape([batch, seq, heads, self.d_k])
            // (B, T, h, d_k) -> (B, h, T, d_k)
            .swap_dims(1, 2)
    }

    /// Scaled dot-product attention over projected heads, heads merged, then `W^O`.
    fn attend(
        &self,
        query: Tensor<B, 4>,
        key: Tensor<B, 4>,
        value: Tensor<B, 4>,
        mask: Option<AttnMask<B>>,
        bias: Option<Tensor<B, 4>>,
        need_weights: bool,
    ) -> Result<MhaOutput<B>, AttentionError> {
        let [batch, _, seq_q, _] = query.dims();
        // Grouped key/value heads go to the attention as they are (it shares them without
        // copying).
        let mut options = AttentionOptions::default()
            .with_optional_mask(mask)
            .with_dropout(self.dropout)
            .with_weights(need_weights)
            .with_kernel(self.kernel);
        options.bias = bias;
        let out = scaled_dot_product_attention(query, key, value, options)?;
        let context = out
            .context
            // (B, h, Tq, d_k) -> (B, Tq, h, d_k)
            .swap_dims(1, 2)
            // (B, Tq, h, d_k) -> (B·Tq, h·d_k)
            .reshape([batch * seq_q, self.n_heads * self.d_k]);
        // (B·Tq, h·d_k) -> (B·Tq, d_model) -> (B, Tq, d_model)
        let context = crate::linear(&self.output, context).reshape([batch, seq_q, self.d_model]);
        Ok(MhaOutput {
            context,
            weights: out.weights,
        })
    }

    fn check_query(&self, query: &Tensor<B, 3>) -> Result<[usize; 3], AttentionError> {
        let dims = query.dims();
        if dims[2] != self.d_model {
            return Err(AttentionError::InputShape {
                what: "query",
                actual: dims.to_vec(),
                expected: format!("[batch, seq, {}]", self.d_model),
            });
        }
        Ok(dims)
    }

    fn check_memory(&self, memory: &Tensor<B, 3>, batch: usize) -> Result<(), AttentionError> {
        let [mb, _, md] = memory.dims();
        if mb != batch || md != self.d_model {
            return Err(AttentionError::InputShape {
                what: "memory",
                actual: memory.dims().to_vec(),
                expected: format!("[{batch}, seq_k, {}]", self.d_model),
            });
        }
        Ok(())
    }

    fn check_projected(
        &self,
        memory: &ProjectedMemory<B>,
        query: &Tensor<B, 3>,
    ) -> Result<(), AttentionError> {
        let [_, heads, seq_src, d_k] = memory.keys().dims();
        let d_v = memory.values().dims()[3];
        let batch = query.dims()[0];
        if memory.batch_size() != batch
            || heads != self.n_kv_heads
            || d_k != self.d_k
            || d_v != self.d_k
            || seq_src == 0
        {
            return Err(AttentionError::InputShape {
                what: "projected memory",
                actual: memory.keys().dims().to_vec(),
                expected: format!(
                    "keys and values [{batch}, {}, seq_src ≥ 1, {}] to match the query {:?} and \
                     this layer",
                    self.n_kv_heads,
                    self.d_k,
                    query.dims()
                ),
            });
        }
        Ok(())
    }

    fn check_masks(&self, input: &MhaInput<B>, scores: [usize; 4]) -> Result<(), AttentionError> {
        if let Some(mask) = &input.mask {
            mask.check(scores)?;
        }
        if let Some(bias) = &input.bias {
            crate::mask::check_broadcast("bias", bias.dims(), scores)?;
        }
        Ok(())
    }
}

/// Queries and keys rotated at absolute positions starting at `offset`, when a rotation is set.
fn rotate<B: Backend>(
    rotation: Option<&dyn QkRotation<B>>,
    query: Tensor<B, 4>,
    key: Tensor<B, 4>,
    offset: usize,
) -> (Tensor<B, 4>, Tensor<B, 4>) {
    match rotation {
        Some(r) => (r.rotate(query, offset), r.rotate(key, offset)),
        None => (query, key),
    }
}

/// The user's mask, combined with the causal mask when asked.
fn with_causal<B: Backend>(
    mask: Option<AttnMask<B>>,
    causal: bool,
    seq_q: usize,
    seq_k: usize,
    device: &B::Device,
) -> Option<AttnMask<B>> {
    if !causal {
        return mask;
    }
    let causal = AttnMask::causal(seq_q, seq_k, device);
    Some(match mask {
        Some(mask) => mask.union(causal),
        None => causal,
    })
}
