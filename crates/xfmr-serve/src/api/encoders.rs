//! The encoder models' bodies: `POST /v1/embeddings`, `POST /v1/translations` and
//! `POST /v1/attention` (which the language model answers too).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::wide;

/// An embeddings request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct EmbeddingRequest {
    /// The model asked for (the loaded encoder when absent).
    pub model: Option<String>,
    /// A string or an array of strings.
    pub input: Value,
    /// `"float"` (the default) or `"base64"`.
    pub encoding_format: Option<String>,
    /// The width asked for: only the model's own.
    pub dimensions: Option<u64>,
}

/// The answer to an [`EmbeddingRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Embeddings {
    /// One embedding per input, in order.
    pub data: Vec<Embedding>,
    /// The model's name.
    pub model: String,
    /// `"list"`.
    pub object: String,
    /// The inputs' tokens.
    pub usage: EmbeddingUsage,
}

/// One input's embedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Embedding {
    /// The vector.
    pub embedding: EmbeddingVector,
    /// The input's index.
    pub index: usize,
    /// `"embedding"`.
    pub object: String,
}

/// An [`Embedding`]'s vector, as `encoding_format` asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum EmbeddingVector {
    /// `"float"`: the numbers.
    Float(#[serde(serialize_with = "wide::floats")] Vec<f32>),
    /// `"base64"`: the `f32`s' little-endian bytes, in base64.
    Base64(String),
}

/// An [`Embeddings`]' `usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct EmbeddingUsage {
    /// The inputs' tokens.
    pub prompt_tokens: usize,
    /// The same.
    pub total_tokens: usize,
}

/// A translations request (xfmr's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct TranslationRequest {
    /// The model asked for (the loaded translation model when absent).
    pub model: Option<String>,
    /// A string or an array of strings.
    pub input: Value,
    /// Beam size, 1 (greedy) to 16; 4 by default.
    pub beam: Option<u64>,
    /// Candidates per input, 1 to the beam; 1 by default.
    pub n_best: Option<u64>,
    /// Longest translation, 1 to 256 tokens; 128 by default.
    pub max_tokens: Option<u64>,
}

/// The answer to a [`TranslationRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Translations {
    /// One entry per input, in order.
    pub data: Vec<Translation>,
    /// The model's name.
    pub model: String,
    /// `"list"`.
    pub object: String,
}

/// One input's translations.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Translation {
    /// The input's index.
    pub index: usize,
    /// `n_best` candidates, best first.
    pub translations: Vec<TranslationCandidate>,
}

/// One candidate translation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TranslationCandidate {
    /// Its ranking score (log-probability; length-penalised for beam search).
    pub score: f64,
    /// The text.
    pub text: String,
}

/// An attention request (xfmr's).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AttentionRequest {
    /// The model asked for (when absent: the translation model, else the language model,
    /// else the encoder).
    pub model: Option<String>,
    /// The sentence.
    pub input: String,
}

/// The answer to an [`AttentionRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Attention {
    /// The encoder's self-attention and the decoder's cross-attention for the translation
    /// model, the one self-attention of the others.
    pub maps: Vec<AttentionMap>,
    /// The model's name.
    pub model: String,
    /// `"attention"`.
    pub object: String,
    /// The translation model's greedy translation (absent for the other models).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub translation: Option<String>,
}

/// One attention map: `layers × heads` matrices of `queries × keys`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct AttentionMap {
    /// Heads per layer.
    pub heads: usize,
    /// The attended tokens.
    pub keys: Vec<String>,
    /// Layers.
    pub layers: usize,
    /// Which attention (`"causal self-attention"`, `"decoder cross-attention"`...).
    pub name: String,
    /// The attending tokens.
    pub queries: Vec<String>,
    /// Per layer, its weights flat (`[heads, queries, keys]` row-major), rounded to 4
    /// decimals.
    #[serde(serialize_with = "wide::rows")]
    pub weights: Vec<Vec<f32>>,
}
