//! Llama-family GGUF models (SmolLM2, TinyLlama, Llama 2/3...) into xfmr's [`DecoderOnly`].
//!
//! The configuration comes from the file's `llama.*` metadata: pre-norm RMSNorm layers,
//! SwiGLU, no biases, grouped key/value heads, rotary positions (half-split pairs, θ from
//! `llama.rope.freq_base`), output tied to the token embedding unless the file has
//! `output.weight`.
//!
//! | llama.cpp | xfmr |
//! |---|---|
//! | `token_embd.weight` | `embedding.weight` |
//! | `blk.{i}.attn_norm.weight` | `stack.layers[i].norm_attn.gamma` |
//! | `blk.{i}.attn_{q,k,v}.weight` | `stack.layers[i].self_attn.{query,key,value}` |
//! | `blk.{i}.attn_output.weight` | `stack.layers[i].self_attn.output` |
//! | `blk.{i}.ffn_norm.weight` | `stack.layers[i].norm_ff.gamma` |
//! | `blk.{i}.ffn_gate.weight` | `stack.layers[i].ffn.linear1` (under SiLU) |
//! | `blk.{i}.ffn_up.weight` | `stack.layers[i].ffn.gate_mut()` |
//! | `blk.{i}.ffn_down.weight` | `stack.layers[i].ffn.linear2` |
//! | `output_norm.weight` | `stack.norm.gamma` |
//! | `output.weight` (absent when tied) | `output` |
//!
//! Linear weights are stored `[out, in]` (dims `[in, out]` innermost first) and transposed into
//! burn's `[in, out]`. llama.cpp's converter permutes the rows of `attn_q` and `attn_k` within
//! each head so that its interleaved-pair RoPE sees the pairs Hugging Face's half-split RoPE
//! uses: row `2i + s` of a head holds Hugging Face's row `s·d_k/2 + i`. The loader undoes the
//! permutation ([`unpermute_rows`]) and builds the model with [`RotaryLayout::HalfSplit`], the
//! layout of the Hugging Face reference. `rope_freqs.weight` (Llama 3.1's frequency scaling)
//! is not supported and is reported as unexpected.

use burn::tensor::backend::Backend;
use xfmr_blocks::{
    Activation, LayerConfig, NormKind, NormPosition, PositionEncoding, RotaryLayout, StateDict,
    StateDictImporter,
};
use xfmr_models::{DecoderOnly, DecoderOnlyConfig};

use crate::gguf::{Gguf, GgufError};
use crate::LlmError;

/// What a Llama-family GGUF file says about its model.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    /// `llama.block_count`.
    pub n_layers: usize,
    /// `llama.embedding_length`.
    pub d_model: usize,
    /// `llama.feed_forward_length`.
    pub d_ff: usize,
    /// `llama.attention.head_count`.
    pub n_heads: usize,
    /// `llama.attention.head_count_kv` (default: `n_heads`).
    pub n_kv_heads: usize,
    /// Rows of `token_embd.weight` (`llama.vocab_size` when present must agree).
    pub vocab_size: usize,
    /// `llama.context_length`.
    pub context_length: usize,
    /// `llama.rope.freq_base` (default 10000).
    pub rope_theta: f64,
    /// `llama.attention.layer_norm_rms_epsilon`.
    pub rms_norm_eps: f64,
    /// No `output.weight`: logits through the token embedding.
    pub tie_embeddings: bool,
}

impl LlamaConfig {
    /// Reads the configuration from `gguf`'s metadata.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] naming a missing or inconsistent key; an architecture other than
    /// `llama`.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, GgufError> {
        let arch = gguf.get_str("general.architecture")?;
        if arch != "llama" {
            return Err(GgufError::metadata(
                "general.architecture",
                format!("{arch:?}: only \"llama\" models are supported"),
            ));
        }
        let n_heads = gguf.get_usize("llama.attention.head_count")?;
        let n_kv_heads = gguf
            .opt_usize("llama.attention.head_count_kv")?
            .unwrap_or(n_heads);
        let embedding = gguf
            .tensor("token_embd.weight")
            .ok_or_else(|| GgufError::NoTensor("token_embd.weight".into()))?;
        let d_model = gguf.get_usize("llama.embedding_length")?;
        let [vocab_size, width] = embedding.shape()[..] else {
            return Err(GgufError::metadata(
                "token_embd.weight",
                format!("shape {:?} is not 2-D", embedding.shape()),
            ));
        };
        if width != d_model {
            return Err(GgufError::metadata(
                "llama.embedding_length",
                format!("{d_model}, but token_embd.weight is {width} wide"),
            ));
        }
        if let Some(v) = gguf.metadata.get("llama.vocab_size") {
            if v.as_u64() != Some(vocab_size as u64) {
                return Err(GgufError::metadata(
                    "llama.vocab_size",
                    format!("{v:?}, but token_embd.weight has {vocab_size} rows"),
                ));
            }
        }
        let theta = gguf.opt_f64("llama.rope.freq_base")?.unwrap_or(10000.0);
        if let Some(v) = gguf.metadata.get("llama.rope.dimension_count") {
            // Heads that do not split the width are `head_count`'s fault, named below
            // (`check_against`), not the rotary width's.
            let head_width = (n_heads != 0 && d_model.is_multiple_of(n_heads))
                .then(|| (d_model / n_heads) as u64);
            if head_width.is_some() && v.as_u64() != head_width {
                return Err(GgufError::metadata(
                    "llama.rope.dimension_count",
                    format!("{v:?}: partial rotary embeddings are not supported"),
                ));
            }
        }
        let config = Self {
            n_layers: gguf.get_usize("llama.block_count")?,
            d_model,
            d_ff: gguf.get_usize("llama.feed_forward_length")?,
            n_heads,
            n_kv_heads,
            vocab_size,
            context_length: gguf.get_usize("llama.context_length")?,
            rope_theta: theta,
            rms_norm_eps: gguf.get_f64("llama.attention.layer_norm_rms_epsilon")?,
            tie_embeddings: gguf.tensor("output.weight").is_none(),
        };
        config.check_against(gguf)?;
        Ok(config)
    }

    /// Checks the sizes against the tensors the file holds, so that a corrupt header can never
    /// make the model larger than the file: every layer's tensors present, widths equal to
    /// theirs, heads dividing the width.
    fn check_against(&self, gguf: &Gguf) -> Result<(), GgufError> {
        if self.n_layers == 0 || self.n_layers > gguf.tensors.len() {
            return Err(GgufError::metadata(
                "llama.block_count",
                format!(
                    "{} layers for {} tensors",
                    self.n_layers,
                    gguf.tensors.len()
                ),
            ));
        }
        if self.n_heads == 0
            || !self.d_model.is_multiple_of(self.n_heads)
            || !self.d_k().is_multiple_of(2)
        {
            return Err(GgufError::metadata(
                "llama.attention.head_count",
                format!(
                    "{} heads do not split the width {} into even head widths",
                    self.n_heads, self.d_model
                ),
            ));
        }
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(GgufError::metadata(
                "llama.attention.head_count_kv",
                format!(
                    "{} key/value heads do not divide {} heads",
                    self.n_kv_heads, self.n_heads
                ),
            ));
        }
        let kv = self.n_kv_heads * self.d_k();
        for i in 0..self.n_layers {
            for (name, shape) in [
                ("attn_q", vec![self.d_model, self.d_model]),
                ("attn_k", vec![kv, self.d_model]),
                ("attn_v", vec![kv, self.d_model]),
                ("ffn_up", vec![self.d_ff, self.d_model]),
            ] {
                let name = format!("blk.{i}.{name}.weight");
                let found = gguf
                    .tensor(&name)
                    .ok_or_else(|| GgufError::NoTensor(name.clone()))?
                    .shape();
                if found != shape {
                    return Err(GgufError::metadata(
                        &name,
                        format!("shape {found:?}, the metadata implies {shape:?}"),
                    ));
                }
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(GgufError::metadata(
                "llama.attention.layer_norm_rms_epsilon",
                format!("{} is not a positive number", self.rms_norm_eps),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(GgufError::metadata(
                "llama.rope.freq_base",
                format!("{} is not a base > 1", self.rope_theta),
            ));
        }
        Ok(())
    }

    /// The matching [`DecoderOnlyConfig`] (no dropout; `pad_id` is the id batched prompts are
    /// left-padded with, masked everywhere).
    pub fn to_config(&self, pad_id: u32) -> DecoderOnlyConfig {
        let layer = LayerConfig::new(self.d_model, self.n_heads, self.d_ff)
            .with_n_kv_heads(Some(self.n_kv_heads))
            .with_dropout(0.0)
            .with_activation(Activation::SwiGlu)
            .with_norm_position(NormPosition::Pre)
            .with_norm(NormKind::RmsNorm)
            .with_norm_eps(self.rms_norm_eps)
            .with_bias(false);
        DecoderOnlyConfig::new(self.vocab_size, layer, self.n_layers)
            .with_positions(PositionEncoding::Rotary {
                theta: self.rope_theta,
                layout: RotaryLayout::HalfSplit,
            })
            .with_max_len(self.context_length)
            .with_tie_output(self.tie_embeddings)
            .with_pad_id(pad_id)
    }

    /// Width of one head.
    pub fn d_k(&self) -> usize {
        self.d_model / self.n_heads.max(1)
    }

    /// Bytes the key/value cache holds per token of context, with `float_bytes` per element:
    /// `2 · n_layers · n_kv_heads · d_k · float_bytes` (grouped heads are cached once).
    pub fn cache_bytes_per_token(&self, float_bytes: usize) -> usize {
        2 * self.n_layers * self.n_kv_heads * self.d_k() * float_bytes
    }
}

/// Undoes llama.cpp's Q/K row permutation in place: `rows` holds `heads` blocks of `d_k` rows of
/// `cols` values; within each block, stored row `2i + s` becomes row `s·d_k/2 + i`.
pub fn unpermute_rows(values: &mut [f32], heads: usize, d_k: usize, cols: usize) {
    let half = d_k / 2;
    let mut block = vec![0f32; d_k * cols];
    for h in 0..heads {
        let head = &mut values[h * d_k * cols..(h + 1) * d_k * cols];
        block.copy_from_slice(head);
        for i in 0..half {
            for s in 0..2 {
                let from = (2 * i + s) * cols;
                let to = (s * half + i) * cols;
                head[to..to + cols].copy_from_slice(&block[from..from + cols]);
            }
        }
    }
}

/// Every tensor of `gguf` dequantised into a [`StateDict`] under its llama.cpp name, shaped
/// outermost first (`[out, in]` for linear weights), Q/K rows un-permuted.
///
/// # Errors
/// A tensor of a type that cannot be dequantised.
pub fn state_dict(gguf: &Gguf, config: &LlamaConfig) -> Result<StateDict, GgufError> {
    let mut dict = StateDict::default();
    let d_k = config.d_k();
    for info in &gguf.tensors {
        let mut values = gguf.dequantize_info(info)?;
        let shape = info.shape();
        let heads = if info.name.ends_with(".attn_q.weight") {
            Some(config.n_heads)
        } else if info.name.ends_with(".attn_k.weight") {
            Some(config.n_kv_heads)
        } else {
            None
        };
        if let (Some(heads), &[rows, cols]) = (heads, &shape[..]) {
            if rows != heads * d_k || !d_k.is_multiple_of(2) {
                return Err(GgufError::BadTensor {
                    tensor: info.name.clone(),
                    offset: info.offset as u64,
                    reason: format!("{rows} rows are not {heads} heads of an even width {d_k}"),
                });
            }
            unpermute_rows(&mut values, heads, d_k, cols);
        }
        dict.insert(info.name.clone(), shape, values);
    }
    Ok(dict)
}

/// Loads the weights of `dict` (from [`state_dict`]) into `model` through the map in the module
/// docs, reporting every missing, unexpected and wrong-shape tensor at once.
///
/// # Errors
/// [`LlmError::Model`] wrapping the import report.
pub fn load_weights<B: Backend>(
    mut model: DecoderOnly<B>,
    dict: &StateDict,
) -> Result<DecoderOnly<B>, LlmError> {
    // `lazy_device`: no random initialisation of the tables the import replaces.
    let device = model.embedding.weight.lazy_device();
    let mut imp = StateDictImporter::<B>::new(dict, device);
    imp.param(&mut model.embedding.weight, "token_embd.weight");
    for (i, layer) in model.stack.layers.iter_mut().enumerate() {
        let b = format!("blk.{i}.");
        imp.norm(&mut layer.norm_attn, &format!("{b}attn_norm"));
        let attn = &mut layer.self_attn;
        imp.linear(&mut attn.query, &format!("{b}attn_q"));
        imp.linear(&mut attn.key, &format!("{b}attn_k"));
        imp.linear(&mut attn.value, &format!("{b}attn_v"));
        imp.linear(&mut attn.output, &format!("{b}attn_output"));
        imp.norm(&mut layer.norm_ff, &format!("{b}ffn_norm"));
        imp.linear(&mut layer.ffn.linear1, &format!("{b}ffn_gate"));
        match layer.ffn.gate_mut() {
            Some(up) => imp.linear(up, &format!("{b}ffn_up")),
            None => imp.report_other(format!("{b}ffn_up: the model has no SwiGLU gate")),
        }
        imp.linear(&mut layer.ffn.linear2, &format!("{b}ffn_down"));
    }
    match model.stack.norm.as_mut() {
        Some(norm) => imp.norm(norm, "output_norm"),
        None => imp.report_other("output_norm: the stack has no final norm".into()),
    }
    if let Some(output) = model.output.as_mut() {
        imp.linear(output, "output");
    }
    imp.finish("")
        .map_err(|e| LlmError::Model(xfmr_models::ModelError::from(e)))?;
    Ok(model)
}

/// A Llama-family model read from a GGUF file: its configuration and the model.
///
/// # Errors
/// Metadata or tensors the model cannot use (typed, naming the key or tensor), an import
/// mismatch (listed).
pub fn load_llama<B: Backend>(
    gguf: &Gguf,
    pad_id: u32,
    device: &B::Device,
) -> Result<(LlamaConfig, DecoderOnly<B>), LlmError> {
    let config = LlamaConfig::from_gguf(gguf)?;
    let model = config.to_config(pad_id).init::<B>(device)?;
    let dict = state_dict(gguf, &config)?;
    let model = load_weights(model, &dict)?;
    Ok((config, model))
}
