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
//! It decodes through [`QuantizedSteps`], logits on the host and no backend tensor: the
//! library's searches ([`xfmr_models::generate::search`]: greedy, sampled or beam search, the
//! beams rows of one step) and the decoding loop of [`crate::decode`] drive it. The `f32`
//! model stays the reference checked against transformers; this one is checked against it (logits within a tolerance, greedy tokens where the margin
//! allows).
//!
//! [`DecoderOnly`]: xfmr_models::DecoderOnly

mod forward;
mod linear;
mod ops;
mod prefix;
mod steps;

use xfmr_models::generate::{self, Generation, GenerationOptions};
use xfmr_models::{pad_rows, ModelError, PadSide};

pub use linear::{Activations, ProductScratch, QuantizedLinear};
pub use prefix::PrefixCache;
pub use steps::QuantizedSteps;
/// What a sequence's key/value cache keeps its elements in
/// ([`QuantizedLlama::with_cache_precision`]).
pub use xfmr_kernels::CachePrecision;

use crate::gguf::{GgmlType, Gguf, GgufError};
use crate::llama::LlamaConfig;
use crate::LlmError;
use xfmr_kernels::quant::interleave::interleave;
use xfmr_kernels::quant::{BlockFormat, Layout, Path};
use xfmr_kernels::HeadCache;

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
    /// What each sequence's key/value cache keeps its elements in.
    cache_precision: CachePrecision,
}

/// One sequence's key/value cache: what [`QuantizedLlama::forward_batch`] extends. Sequences
/// of different lengths decode together, each attending over its own cache only (continuous
/// batching: a server adds and drops sequences between steps).
#[derive(Debug, Clone)]
pub struct SequenceCache {
    /// Per layer and key/value head (`layer · n_kv_heads + head`), its keys and values in the
    /// layout the attention kernel reads ([`HeadCache`]: room reserved up front), each head's
    /// contiguous, so that attention streams them in order.
    heads: Vec<HeadCache>,
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
    /// Where each sequence's rows start among the step's.
    starts: Vec<usize>,
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

/// Whether two entries of a tensor directory have one name or overlapping bytes: a file
/// whose blocks must not be permuted in place (a tensor read twice, or read in ggml's layout
/// from bytes another one permuted), which [`QuantizedLlama::from_gguf_owned`] then reads as
/// stored.
fn shares_bytes(tensors: &[crate::gguf::TensorInfo]) -> bool {
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    let mut ranges: Vec<(usize, usize)> = tensors
        .iter()
        .filter(|t| t.size > 0)
        .map(|t| (t.offset, t.offset + t.size))
        .collect();
    ranges.sort_unstable();
    names.windows(2).any(|w| w[0] == w[1]) || ranges.windows(2).any(|w| w[1].0 < w[0].1)
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
        Self::build(gguf, pad_id, &[])
    }

    /// As [`from_gguf`](Self::from_gguf), taking the file: the blocks of every matrix whose
    /// products are faster so ([`Layout::fastest`]: `Q4_0`, `Q4_1`, `Q5_0` and `Q8_0` on
    /// AVX-512 VNNI) are permuted in place into the interleaved layout, once, with no copy (the
    /// file is read back only through this model afterwards). Elsewhere, when a matrix built
    /// from the file is still alive, or when two tensors of the file share a name or bytes,
    /// the blocks stay as stored.
    ///
    /// # Errors
    /// As [`from_gguf`](Self::from_gguf) (every tensor is checked before any is permuted).
    pub fn from_gguf_owned(mut gguf: Gguf, pad_id: u32) -> Result<Self, LlmError> {
        // Every check in ggml's layout first (the model built and dropped), so that the
        // permuted blocks need none.
        drop(Self::from_gguf(&gguf, pad_id)?);
        let path = Path::detect();
        let picked: Vec<(String, BlockFormat, std::ops::Range<usize>, [usize; 2])> = gguf
            .tensors
            .iter()
            // The matrices the model multiplies with: after the check above every tensor is
            // one the model reads, and the only others are the norms' vectors (read as
            // values, so never permuted, whatever their stored shape).
            .filter(|t| !t.name.ends_with("norm.weight"))
            .filter_map(|t| match (t.ty, &t.shape()[..]) {
                (GgmlType::Quant(format), &[rows, cols])
                    if Layout::fastest(path, format) == Layout::Interleaved =>
                {
                    Some((
                        t.name.clone(),
                        format,
                        t.offset..t.offset + t.size,
                        [rows, cols],
                    ))
                }
                _ => None,
            })
            .collect();
        let permute = !picked.is_empty() && !shares_bytes(&gguf.tensors);
        let Some(bytes) = gguf.bytes_mut().filter(|_| permute) else {
            return Self::from_gguf(&gguf, pad_id);
        };
        for (_, format, range, [rows, cols]) in &picked {
            interleave(*format, &mut bytes[range.clone()], *rows, *cols);
        }
        let names: Vec<&str> = picked.iter().map(|p| p.0.as_str()).collect();
        Self::build(&gguf, pad_id, &names)
    }

    /// The model, the tensors `interleaved` names read in [`Layout::Interleaved`] (each name
    /// once in the file, its bytes no other tensor's: [`shares_bytes`] is false).
    fn build(gguf: &Gguf, pad_id: u32, interleaved: &[&str]) -> Result<Self, LlmError> {
        let c = LlamaConfig::from_gguf(gguf)?;
        let (d, kv, ff) = (c.d_model, c.n_kv_heads * c.d_k(), c.d_ff);
        let linear = |name: &str, shape: [usize; 2]| {
            let layout = match interleaved.contains(&name) {
                true => Layout::Interleaved,
                false => Layout::Rows,
            };
            QuantizedLinear::from_gguf_in(gguf, name, Some(shape), layout)
        };
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
            cache_precision: CachePrecision::F16,
        })
    }

    /// The same model with its products computed as `activations` says
    /// ([`Activations::F32`]: the slow reference that checks everything but the activation
    /// quantisation).
    pub fn with_activations(mut self, activations: Activations) -> Self {
        self.activations = activations;
        self
    }

    /// The same model with its sequences' key/value caches kept in `precision` (from the
    /// next [`sequence`](Self::sequence) or [`steps`](Self::steps) on):
    /// [`CachePrecision::F16`] by default, as llama.cpp's; [`CachePrecision::F32`] for
    /// attention in `f32` throughout (with [`Activations::F32`], the reference that checks
    /// the model's arithmetic against transformers).
    pub fn with_cache_precision(mut self, precision: CachePrecision) -> Self {
        self.cache_precision = precision;
        self
    }

    /// What the sequences' key/value caches keep their elements in.
    pub fn cache_precision(&self) -> CachePrecision {
        self.cache_precision
    }

    /// Bytes of all weights as held (quantised blocks and `f32` norms).
    pub fn weight_bytes(&self) -> usize {
        let norms = (self.layers.len() * 2 + 1) * self.config.d_model * 4;
        let linears: usize = self.linears().map(QuantizedLinear::weight_bytes).sum();
        norms + linears
    }

    /// Bytes of the weights held in [`Layout::Interleaved`] (what
    /// [`from_gguf_owned`](Self::from_gguf_owned) lays out for AVX-512 VNNI; 0 elsewhere).
    pub fn interleaved_bytes(&self) -> usize {
        self.linears()
            .filter(|l| l.layout() == Some(Layout::Interleaved))
            .map(QuantizedLinear::weight_bytes)
            .sum()
    }

    /// Every linear layer.
    fn linears(&self) -> impl Iterator<Item = &QuantizedLinear> {
        self.layers
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
    }

    /// Decoding steps of `batch` empty sequences, each cache reserved for `capacity`
    /// positions (at most the model's context).
    pub fn steps(&self, batch: usize, capacity: usize) -> QuantizedSteps<'_> {
        QuantizedSteps::from_caches(self, (0..batch).map(|_| self.sequence(capacity)).collect())
    }

    /// An empty cache for one sequence, reserved for `capacity` positions (at most the
    /// model's context), for [`forward_batch`](Self::forward_batch).
    pub fn sequence(&self, capacity: usize) -> SequenceCache {
        let positions = capacity.min(self.config.context_length);
        SequenceCache {
            heads: (0..self.layers.len() * self.config.n_kv_heads)
                .map(|_| {
                    HeadCache::with_capacity(self.config.d_k(), positions, self.cache_precision)
                })
                .collect(),
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
        let ids = batch.iter().flat_map(|(_, ids)| ids.iter());
        xfmr_models::check_vocabulary(ids, self.config.vocab_size, "token")?;
        self.forward_rows(batch, scratch, None)?;
        Ok(&mut scratch.logits)
    }

    /// Every layer's attention weights over `tokens` (fed from position 0, causal), per layer
    /// `[heads, n, n]` row-major (query rows, key columns; zeros above the diagonal).
    ///
    /// # Errors
    /// As [`forward_batch`](Self::forward_batch).
    pub fn attention_weights(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        xfmr_models::check_vocabulary(tokens, self.config.vocab_size, "token")?;
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
    /// is chosen: [`xfmr_models::generate::search`] over [`QuantizedSteps`], on the host
    /// (a beam search's beams are rows of one step).
    ///
    /// # Errors
    /// An empty prompt, an id outside the vocabulary, invalid options, a context longer than
    /// the model's.
    ///
    /// [`DecoderOnly::generate_streaming`]: xfmr_models::DecoderOnly::generate_streaming
    pub fn generate_streaming(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerationOptions,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> Result<Generation, ModelError> {
        if let Some(i) = prompts.iter().position(Vec::is_empty) {
            return Err(ModelError::InvalidInput(format!("prompt {i} is empty")));
        }
        let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        xfmr_models::check_vocabulary(prompts.iter().flatten(), self.config.vocab_size, "prompt")?;
        let context = self.config.context_length;
        if len + options.max_len > context {
            return Err(ModelError::InvalidInput(format!(
                "a prompt of {len} tokens and {} new ones exceed the model's context of {context}",
                options.max_len
            )));
        }
        let mut steps = self.steps(prompts.len(), len + options.max_len);
        let skip: Vec<usize> = prompts.iter().map(|p| len - p.len()).collect();
        steps.skip_first(&skip);
        let first = pad_rows(prompts, self.pad_id, PadSide::Left);
        generate::search(&mut steps, first, options, on_token)
    }
}
