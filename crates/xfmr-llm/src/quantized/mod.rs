//! Llama-family GGUF models run with their weights quantised, as llama.cpp runs them on a CPU.
//!
//! [`QuantizedLlama`] holds every linear layer as a [`QuantizedLinear`] over the file's own
//! blocks (the file is read once and shared, not copied), so a decoding step streams the
//! quantised bytes (~100 MB for SmolLM2-135M `Q4_1`) instead of ~540 MB of `f32`. It computes
//! on the host:
//!
//! - the query, key and value products as one pass (one quantisation of the normed input),
//!   the gate and up products likewise ([`QuantizedLinear::forward_fused`]);
//! - RoPE on the file's row order: llama.cpp's converter permutes the query/key rows so that
//!   its interleaved pairs `(2i, 2i+1)` are Hugging Face's half-split pairs `(i, i + d_k/2)`,
//!   so rotating the file's interleaved pairs gives the same scores without un-permuting;
//! - attention over a key/value cache reserved for the whole generation up front, buffers
//!   reused between steps (no allocation of model-sized buffers per token);
//! - the final norm and the logits for the last position only;
//! - sequences that begin the same way share their prefix's keys and values through a
//!   [`PrefixCache`] (copied into each sequence's cache, not fed again).
//!
//! It decodes through [`xfmr_models::generate`] like the `f32` [`DecoderOnly`] (greedy, sampled
//! or beam search). The `f32` model stays the reference checked against transformers; this
//! one is checked against it (logits within a tolerance, greedy tokens where the margin
//! allows).
//!
//! [`DecoderOnly`]: xfmr_models::DecoderOnly

mod linear;
mod ops;
mod prefix;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use xfmr_kernels::silu_mul;
use xfmr_models::generate::{self, Generation, GenerationOptions, IncrementalDecoder, Step};
use xfmr_models::ModelError;

pub use linear::{Activations, ProductScratch, QuantizedLinear};
pub use prefix::PrefixCache;

use ops::{attention, attention_weights, rms_norm, rope, rope_angles, Cached};

use crate::gguf::{Gguf, GgufError};
use crate::llama::LlamaConfig;
use crate::LlmError;

/// One layer's weights.
#[derive(Debug, Clone)]
struct Layer {
    attn_norm: Vec<f32>,
    /// Query, key, value (one fused product).
    qkv: [QuantizedLinear; 3],
    output: QuantizedLinear,
    ffn_norm: Vec<f32>,
    /// Gate (under SiLU) and up (one fused product).
    gate_up: [QuantizedLinear; 2],
    down: QuantizedLinear,
}

/// A Llama-family model whose linear weights stay in their GGUF blocks.
#[derive(Debug, Clone)]
pub struct QuantizedLlama {
    /// What the file says about the model.
    pub config: LlamaConfig,
    embedding: QuantizedLinear,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None`: tied to the embedding.
    output: Option<QuantizedLinear>,
    pad_id: u32,
    activations: Activations,
}

/// The decoding state of a [`QuantizedLlama`]: per row, its key/value cache.
#[derive(Debug, Clone)]
pub struct QuantizedState {
    rows: Vec<SequenceCache>,
    scratch: Scratch,
}

/// One sequence's key/value cache: what [`QuantizedLlama::forward_batch`] extends. Sequences
/// of different lengths decode together, each attending over its own cache only (continuous
/// batching: a server adds and drops sequences between steps).
#[derive(Debug, Clone)]
pub struct SequenceCache {
    /// Per layer, `[len, kv_dim]` keys and values (capacity reserved up front).
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    /// Leading padding tokens of the first step, not fed.
    skip: usize,
}

impl SequenceCache {
    /// Positions fed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Buffers a [`QuantizedLlama`] reuses between decoding steps
/// ([`QuantizedLlama::forward_batch`]); one per decoding thread.
#[derive(Debug, Default)]
pub struct Scratch {
    x: Vec<f32>,
    /// The last position of each sequence, gathered for the final norm.
    last: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    logits: Vec<f32>,
    /// The rotation of each new row of a step (`ops::rope_angles`, `d_k / 2` each).
    angles: Vec<(f32, f32)>,
    product: ProductScratch,
}

impl Scratch {
    /// Empty buffers (they grow to the largest step and stay).
    pub fn new() -> Self {
        Self::default()
    }

    /// The logits of the last step of [`QuantizedLlama::forward_batch_in`], `[sequences,
    /// vocab]` row-major (empty before the first, and after a step of
    /// [`forward_batch`](QuantizedLlama::forward_batch), which takes them).
    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }
}

impl Clone for Scratch {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl QuantizedLlama {
    /// Reads the model of a parsed Llama-family file, keeping its linear weights quantised.
    ///
    /// # Errors
    /// Metadata or tensors the model cannot use (typed, naming the key or tensor).
    pub fn from_gguf(gguf: &Gguf, pad_id: u32) -> Result<Self, LlmError> {
        let c = LlamaConfig::from_gguf(gguf)?;
        let (d, kv, ff) = (c.d_model, c.n_kv_heads * c.d_k(), c.d_ff);
        let linear =
            |name: &str, shape: [usize; 2]| QuantizedLinear::from_gguf(gguf, name, Some(shape));
        let vector = |name: &str| -> Result<Vec<f32>, GgufError> {
            let v = gguf.dequantize(name)?;
            match v.len() == d {
                true => Ok(v),
                false => Err(GgufError::metadata(
                    name,
                    format!("{} values, not {d}", v.len()),
                )),
            }
        };
        let layers = (0..c.n_layers)
            .map(|i| {
                let b = |n: &str| format!("blk.{i}.{n}");
                Ok(Layer {
                    attn_norm: vector(&b("attn_norm.weight"))?,
                    qkv: [
                        linear(&b("attn_q.weight"), [d, d])?,
                        linear(&b("attn_k.weight"), [kv, d])?,
                        linear(&b("attn_v.weight"), [kv, d])?,
                    ],
                    output: linear(&b("attn_output.weight"), [d, d])?,
                    ffn_norm: vector(&b("ffn_norm.weight"))?,
                    gate_up: [
                        linear(&b("ffn_gate.weight"), [ff, d])?,
                        linear(&b("ffn_up.weight"), [ff, d])?,
                    ],
                    down: linear(&b("ffn_down.weight"), [d, ff])?,
                })
            })
            .collect::<Result<Vec<_>, GgufError>>()?;
        // Every tensor of the file must be one the model reads (as the f32 loader's import
        // report requires): an unknown one (biases, Llama 3.1's `rope_freqs`...) would change
        // the model's output if ignored.
        let used = |name: &str| {
            matches!(
                name,
                "token_embd.weight" | "output_norm.weight" | "output.weight"
            ) || name.strip_prefix("blk.").is_some_and(|rest| {
                rest.split_once('.').is_some_and(|(i, tensor)| {
                    i.parse::<usize>().is_ok_and(|i| i < c.n_layers)
                        && [
                            "attn_norm.weight",
                            "attn_q.weight",
                            "attn_k.weight",
                            "attn_v.weight",
                            "attn_output.weight",
                            "ffn_norm.weight",
                            "ffn_gate.weight",
                            "ffn_up.weight",
                            "ffn_down.weight",
                        ]
                        .contains(&tensor)
                })
            })
        };
        if let Some(t) = gguf.tensors.iter().find(|t| !used(&t.name)) {
            return Err(GgufError::metadata(
                &t.name,
                "a tensor the Llama model does not use (not supported)",
            )
            .into());
        }
        let output = match c.tie_embeddings {
            true => None,
            false => Some(linear("output.weight", [c.vocab_size, d])?),
        };
        Ok(Self {
            embedding: linear("token_embd.weight", [c.vocab_size, d])?,
            layers,
            norm: vector("output_norm.weight")?,
            output,
            pad_id,
            config: c,
            activations: Activations::Int8,
        })
    }

    /// The same model with its products computed as `activations` says
    /// ([`Activations::F32`]: the slow reference that checks everything but the activation
    /// quantisation).
    pub fn with_activations(mut self, activations: Activations) -> Self {
        self.activations = activations;
        self
    }

    /// Bytes of all weights as held (quantised blocks and `f32` norms).
    pub fn weight_bytes(&self) -> usize {
        let norms = (self.layers.len() * 2 + 1) * self.config.d_model * 4;
        let linears: usize = self
            .layers
            .iter()
            .flat_map(|l| {
                l.qkv
                    .iter()
                    .chain([&l.output])
                    .chain(&l.gate_up)
                    .chain([&l.down])
            })
            .chain([&self.embedding])
            .chain(&self.output)
            .map(QuantizedLinear::weight_bytes)
            .sum();
        norms + linears
    }

    /// An empty state for `batch` rows, each cache reserved for `capacity` positions (at most
    /// the model's context).
    pub fn start(&self, batch: usize, capacity: usize) -> QuantizedState {
        QuantizedState {
            rows: (0..batch).map(|_| self.sequence(capacity)).collect(),
            scratch: Scratch::default(),
        }
    }

    /// An empty cache for one sequence, reserved for `capacity` positions (at most the
    /// model's context), for [`forward_batch`](Self::forward_batch).
    pub fn sequence(&self, capacity: usize) -> SequenceCache {
        let kv = self.config.n_kv_heads * self.config.d_k();
        let reserve = capacity.min(self.config.context_length) * kv;
        let layers = || {
            (0..self.layers.len())
                .map(|_| Vec::with_capacity(reserve))
                .collect()
        };
        SequenceCache {
            keys: layers(),
            values: layers(),
            len: 0,
            skip: 0,
        }
    }

    /// One decoding step of several independent sequences at once: feeds `batch[j].1`
    /// (≥ 1 tokens: a whole prompt, or the last chosen token) after everything sequence `j`
    /// has been fed, and returns the logits that follow the last of them, `[batch.len(),
    /// vocab]` row-major.
    ///
    /// The products with the weights run once over the tokens of all sequences (the weights
    /// are streamed once per step, not once per sequence: what makes serving several clients
    /// cheaper than serving them in turn); attention runs per sequence over its own cache.
    /// Each row's logits are what the sequence would get alone: no product mixes rows.
    ///
    /// # Errors
    /// An empty batch or token list, an id outside the vocabulary, a sequence longer than
    /// the model's context.
    pub fn forward_batch(
        &self,
        batch: &mut [(&mut SequenceCache, &[u32])],
        scratch: &mut Scratch,
    ) -> Result<Vec<f32>, ModelError> {
        self.forward_batch_in(batch, scratch)?;
        Ok(std::mem::take(&mut scratch.logits))
    }

    /// [`forward_batch`](Self::forward_batch) leaving the logits in `scratch` and lending
    /// them, `[batch.len(), vocab]` row-major: a decoding loop that calls it every step
    /// reuses one buffer instead of allocating (and the allocator zeroing) a fresh one each
    /// step (1.5 MiB for eight sequences of a 49,152-token vocabulary).
    ///
    /// # Errors
    /// As [`forward_batch`](Self::forward_batch).
    pub fn forward_batch_in<'s>(
        &self,
        batch: &mut [(&mut SequenceCache, &[u32])],
        scratch: &'s mut Scratch,
    ) -> Result<&'s mut [f32], ModelError> {
        if batch.is_empty() {
            return Err(ModelError::InvalidInput("a step of no sequences".into()));
        }
        let vocab = self.config.vocab_size;
        if let Some(id) = batch
            .iter()
            .flat_map(|(_, ids)| ids.iter())
            .find(|&&id| id as usize >= vocab)
        {
            return Err(ModelError::InvalidInput(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            )));
        }
        self.forward_rows(batch, scratch, None)?;
        Ok(&mut scratch.logits)
    }

    /// Every layer's attention weights over `tokens` (fed from position 0, causal), per layer
    /// `[heads, n, n]` row-major (query rows, key columns; zeros above the diagonal).
    ///
    /// # Errors
    /// As [`forward_batch`](Self::forward_batch).
    pub fn attention_weights(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        let vocab = self.config.vocab_size;
        if let Some(id) = tokens.iter().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::InvalidInput(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            )));
        }
        let mut cache = self.sequence(tokens.len());
        let mut weights = Vec::new();
        self.forward_rows(
            &mut [(&mut cache, tokens)],
            &mut Scratch::default(),
            Some(&mut weights),
        )?;
        Ok(weights)
    }

    /// Continues prompts, as [`DecoderOnly::generate_streaming`] does (left-padded batch,
    /// each row decoding as it would alone), calling `on_token(prompt, token)` as each token
    /// is chosen. The logits of each step are a `B` tensor on `B`'s default device.
    ///
    /// # Errors
    /// An empty prompt, an id outside the vocabulary, invalid options, a context longer than
    /// the model's.
    ///
    /// [`DecoderOnly::generate_streaming`]: xfmr_models::DecoderOnly::generate_streaming
    pub fn generate_streaming<B: Backend>(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerationOptions,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> Result<Generation, ModelError> {
        let vocab = self.config.vocab_size;
        if let Some(i) = prompts.iter().position(Vec::is_empty) {
            return Err(ModelError::InvalidInput(format!("prompt {i} is empty")));
        }
        let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        if let Some(id) = prompts.iter().flatten().find(|&&id| id as usize >= vocab) {
            return Err(ModelError::InvalidInput(format!(
                "prompt id {id} is outside the vocabulary of {vocab}"
            )));
        }
        let context = self.config.context_length;
        if len + options.max_len > context {
            return Err(ModelError::InvalidInput(format!(
                "a prompt of {len} tokens and {} new ones exceed the model's context of {context}",
                options.max_len
            )));
        }
        let mut state = self.start(prompts.len(), len + options.max_len);
        let first = prompts
            .iter()
            .zip(&mut state.rows)
            .map(|(p, row)| {
                row.skip = len - p.len();
                let mut padded = vec![self.pad_id; len - p.len()];
                padded.extend(p);
                padded
            })
            .collect();
        generate::generate_streaming::<B, _>(self, state, first, options, on_token)
    }

    /// Feeds each sequence its tokens (one pass of the products over all of them) and
    /// leaves the logits after each sequence's last token in `s.logits`, `[sequences,
    /// vocab]`. With `record`, pushes each layer's attention weights `[heads, n, past + n]`
    /// (one sequence only).
    ///
    /// The whole pass runs on one of rayon's workers (`rayon::scope` moves it there when the
    /// caller is not one): its ~150 parallel regions then fork from a worker, whose partners
    /// steal from its queue, instead of each being injected into the pool from outside and
    /// waited for on a lock (a sleep and a wake-up per region; one client's decoding
    /// 14% faster, docs/benchmarks.md).
    fn forward_rows(
        &self,
        rows: &mut [(&mut SequenceCache, &[u32])],
        s: &mut Scratch,
        record: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<(), ModelError> {
        rayon::scope(|_| self.forward_rows_on_worker(rows, s, record))
    }

    /// [`forward_rows`](Self::forward_rows)' body.
    fn forward_rows_on_worker(
        &self,
        rows: &mut [(&mut SequenceCache, &[u32])],
        s: &mut Scratch,
        mut record: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (d, d_k) = (c.d_model, c.d_k());
        let kv = c.n_kv_heads * d_k;
        debug_assert!(record.is_none() || rows.len() == 1);
        for (row, tokens) in rows.iter() {
            if tokens.is_empty() {
                return Err(ModelError::InvalidInput("a step of no tokens".into()));
            }
            if row.len + tokens.len() > c.context_length {
                return Err(ModelError::InvalidInput(format!(
                    "{} positions exceed the model's context of {}",
                    row.len + tokens.len(),
                    c.context_length
                )));
            }
        }
        // Where each sequence's tokens start among all of them.
        let starts: Vec<usize> = rows
            .iter()
            .scan(0, |at, (_, t)| {
                let start = *at;
                *at += t.len();
                Some(start)
            })
            .collect();
        let n: usize = rows.iter().map(|(_, t)| t.len()).sum();
        let eps = c.rms_norm_eps as f32;
        s.x.resize(n * d, 0.0);
        for (&t, x) in rows
            .iter()
            .flat_map(|(_, t)| t.iter())
            .zip(s.x.chunks_exact_mut(d))
        {
            self.embedding.row_into(t as usize, x);
        }
        let width = d + 2 * kv;
        // Every new row's rotation, once for all layers: rows in `starts` order.
        let half = d_k / 2;
        s.angles.clear();
        for (row, tokens) in rows.iter() {
            for i in 0..tokens.len() {
                rope_angles(d_k, row.len + i, c.rope_theta, &mut s.angles);
            }
        }
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm(&s.x, &layer.attn_norm, eps, &mut s.h);
            s.qkv.resize(n * width, 0.0);
            let [q, k, v] = &layer.qkv;
            QuantizedLinear::forward_fused(
                &[q, k, v],
                &s.h,
                n,
                &mut s.qkv,
                &mut s.product,
                self.activations,
            );
            s.attn.resize(n * d, 0.0);
            for ((row, tokens), &start) in rows.iter_mut().zip(&starts) {
                let m = tokens.len();
                let qkv = &mut s.qkv[start * width..(start + m) * width];
                let angles = s.angles[start * half..(start + m) * half].chunks_exact(half);
                for (row_qkv, angles) in qkv.chunks_exact_mut(width).zip(angles) {
                    let (q, kv_part) = row_qkv.split_at_mut(d);
                    rope(q, d_k, angles);
                    rope(&mut kv_part[..kv], d_k, angles);
                    row.keys[l].extend_from_slice(&kv_part[..kv]);
                    row.values[l].extend_from_slice(&kv_part[kv..]);
                }
            }
            // Every query of every sequence in one parallel pass over (query, key/value head)
            // pairs: one fork-join per layer.
            let caches: Vec<Cached<'_>> = rows
                .iter()
                .zip(&starts)
                .map(|((row, tokens), &start)| Cached {
                    keys: &row.keys[l],
                    values: &row.values[l],
                    past: row.len,
                    start,
                    n: tokens.len(),
                })
                .collect();
            attention(c, &s.qkv, width, &caches, &mut s.attn);
            if let Some(weights) = record.as_deref_mut() {
                for ((row, tokens), &start) in rows.iter().zip(&starts) {
                    let qkv = &s.qkv[start * width..(start + tokens.len()) * width];
                    weights.push(attention_weights(c, qkv, width, &row.keys[l], row.len));
                }
            }
            s.proj.resize(n * d, 0.0);
            QuantizedLinear::forward_fused(
                &[&layer.output],
                &s.attn,
                n,
                &mut s.proj,
                &mut s.product,
                self.activations,
            );
            s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
            rms_norm(&s.x, &layer.ffn_norm, eps, &mut s.h);
            let ff = c.d_ff;
            s.gate_up.resize(n * 2 * ff, 0.0);
            let [gate, up] = &layer.gate_up;
            QuantizedLinear::forward_fused(
                &[gate, up],
                &s.h,
                n,
                &mut s.gate_up,
                &mut s.product,
                self.activations,
            );
            s.act.resize(n * ff, 0.0);
            for (act, gu) in s
                .act
                .chunks_exact_mut(ff)
                .zip(s.gate_up.chunks_exact(2 * ff))
            {
                let (g, u) = gu.split_at(ff);
                silu_mul(g, u, act);
            }
            QuantizedLinear::forward_fused(
                &[&layer.down],
                &s.act,
                n,
                &mut s.proj,
                &mut s.product,
                self.activations,
            );
            s.x.iter_mut().zip(&s.proj).for_each(|(x, p)| *x += p);
        }
        // The last position of each sequence only: final norm and logits.
        s.last.clear();
        for ((row, tokens), &start) in rows.iter_mut().zip(&starts) {
            row.len += tokens.len();
            let last = start + tokens.len() - 1;
            s.last.extend_from_slice(&s.x[last * d..(last + 1) * d]);
        }
        rms_norm(&s.last, &self.norm, eps, &mut s.h);
        let output = self.output.as_ref().unwrap_or(&self.embedding);
        s.logits.resize(rows.len() * c.vocab_size, 0.0);
        QuantizedLinear::forward_fused(
            &[output],
            &s.h,
            rows.len(),
            &mut s.logits,
            &mut s.product,
            self.activations,
        );
        Ok(())
    }
}

impl<B: Backend> IncrementalDecoder<B> for QuantizedLlama {
    type State = QuantizedState;

    fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    fn device(&self) -> B::Device {
        Default::default()
    }

    fn step(
        &self,
        state: &mut Self::State,
        tokens: Tensor<B, 2, Int>,
        _need_attention: bool,
    ) -> Result<Step<B>, ModelError> {
        let [batch, new] = tokens.dims();
        if new == 0 || batch != state.rows.len() {
            return Err(ModelError::InvalidInput(format!(
                "a step of [{batch}, {new}] tokens for a state of {} rows",
                state.rows.len()
            )));
        }
        let ids = tokens
            .into_data()
            .convert::<i64>()
            .into_vec::<i64>()
            .map_err(|e| ModelError::InvalidInput(format!("token ids: {e:?}")))?;
        let vocab = self.config.vocab_size;
        if let Some(id) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
            return Err(ModelError::InvalidInput(format!(
                "token id {id} is outside the vocabulary of {vocab}"
            )));
        }
        let fed: Vec<Vec<u32>> = state
            .rows
            .iter_mut()
            .zip(ids.chunks_exact(new))
            .map(|(row, ids)| {
                let skip = std::mem::take(&mut row.skip).min(new);
                ids[skip..].iter().map(|&t| t as u32).collect()
            })
            .collect();
        let mut rows: Vec<(&mut SequenceCache, &[u32])> = state
            .rows
            .iter_mut()
            .zip(&fed)
            .map(|(row, ids)| (row, ids.as_slice()))
            .collect();
        self.forward_rows(&mut rows, &mut state.scratch, None)?;
        let logits = std::mem::take(&mut state.scratch.logits);
        Ok(Step {
            logits: Tensor::from_data(TensorData::new(logits, [batch, vocab]), &Default::default()),
            attention: None,
        })
    }

    fn reorder(&self, state: &mut Self::State, indices: &[usize]) {
        // `Vec::clone` keeps lengths, not capacities: reserve what the originals had.
        state.rows = indices
            .iter()
            .map(|&i| {
                let row = &state.rows[i];
                let copy = |caches: &[Vec<f32>]| {
                    caches
                        .iter()
                        .map(|c| {
                            let mut v = Vec::with_capacity(c.capacity());
                            v.extend_from_slice(c);
                            v
                        })
                        .collect()
                };
                SequenceCache {
                    keys: copy(&row.keys),
                    values: copy(&row.values),
                    len: row.len,
                    skip: row.skip,
                }
            })
            .collect();
    }
}
