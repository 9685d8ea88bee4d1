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
//! - the final norm and the logits for the last position only.
//!
//! It decodes through [`xfmr_models::generate`] like the `f32` [`DecoderOnly`] (greedy, sampled
//! or beam search). The `f32` model stays the reference checked against transformers; this
//! one is checked against it (logits within a tolerance, greedy tokens where the margin
//! allows).
//!
//! [`DecoderOnly`]: xfmr_models::DecoderOnly

mod linear;
mod ops;

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use xfmr_models::generate::{self, Generation, GenerationOptions, IncrementalDecoder, Step};
use xfmr_models::ModelError;

pub use linear::{Activations, ProductScratch, QuantizedLinear};

use ops::{attention, rms_norm, rope};

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
    rows: Vec<RowCache>,
    scratch: Scratch,
}

#[derive(Debug, Clone)]
struct RowCache {
    /// Per layer, `[len, kv_dim]` keys and values (capacity reserved up front).
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    len: usize,
    /// Leading padding tokens of the first step, not fed.
    skip: usize,
}

/// Buffers reused between steps.
#[derive(Debug, Default)]
struct Scratch {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate_up: Vec<f32>,
    act: Vec<f32>,
    logits: Vec<f32>,
    product: ProductScratch,
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
        let kv = self.config.n_kv_heads * self.config.d_k();
        let reserve = capacity.min(self.config.context_length) * kv;
        let layers = || {
            (0..self.layers.len())
                .map(|_| Vec::with_capacity(reserve))
                .collect()
        };
        QuantizedState {
            rows: (0..batch)
                .map(|_| RowCache {
                    keys: layers(),
                    values: layers(),
                    len: 0,
                    skip: 0,
                })
                .collect(),
            scratch: Scratch::default(),
        }
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

    /// Feeds `tokens` to one row and leaves the logits after the last of them in
    /// `scratch.logits`.
    fn forward_row(
        &self,
        row: &mut RowCache,
        tokens: &[u32],
        s: &mut Scratch,
    ) -> Result<(), ModelError> {
        let c = &self.config;
        let (d, d_k) = (c.d_model, c.d_k());
        let kv = c.n_kv_heads * d_k;
        let (n, past) = (tokens.len(), row.len);
        if n == 0 {
            return Err(ModelError::InvalidInput("a step of no tokens".into()));
        }
        if past + n > c.context_length {
            return Err(ModelError::InvalidInput(format!(
                "{} positions exceed the model's context of {}",
                past + n,
                c.context_length
            )));
        }
        let eps = c.rms_norm_eps as f32;
        s.x.resize(n * d, 0.0);
        for (i, &t) in tokens.iter().enumerate() {
            self.embedding
                .row_into(t as usize, &mut s.x[i * d..(i + 1) * d]);
        }
        let width = d + 2 * kv;
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
            for (i, row_qkv) in s.qkv.chunks_exact_mut(width).enumerate() {
                let position = past + i;
                let (q, kv_part) = row_qkv.split_at_mut(d);
                rope(q, d_k, position, c.rope_theta);
                rope(&mut kv_part[..kv], d_k, position, c.rope_theta);
                row.keys[l].extend_from_slice(&kv_part[..kv]);
                row.values[l].extend_from_slice(&kv_part[kv..]);
            }
            s.attn.resize(n * d, 0.0);
            attention(
                c,
                &s.qkv,
                width,
                &row.keys[l],
                &row.values[l],
                past,
                &mut s.attn,
            );
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
                for ((a, &g), &u) in act.iter_mut().zip(g).zip(u) {
                    *a = g / (1.0 + (-g).exp()) * u;
                }
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
        row.len = past + n;
        // The last position only: final norm and logits.
        rms_norm(&s.x[(n - 1) * d..], &self.norm, eps, &mut s.h);
        let output = self.output.as_ref().unwrap_or(&self.embedding);
        s.logits.resize(c.vocab_size, 0.0);
        QuantizedLinear::forward_fused(
            &[output],
            &s.h,
            1,
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
        let mut logits = Vec::with_capacity(batch * vocab);
        for (row, ids) in state.rows.iter_mut().zip(ids.chunks_exact(new)) {
            let ids: Vec<u32> = ids[row.skip.min(new)..].iter().map(|&t| t as u32).collect();
            row.skip = 0;
            self.forward_row(row, &ids, &mut state.scratch)?;
            logits.extend_from_slice(&state.scratch.logits);
        }
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
                RowCache {
                    keys: copy(&row.keys),
                    values: copy(&row.values),
                    len: row.len,
                    skip: row.skip,
                }
            })
            .collect();
    }
}
