//! Every request and response body, one type each, in OpenAI's shapes (xfmr's own endpoints
//! in the same style).
//!
//! **Requests** are read by [`JsonBody`](crate::error::JsonBody): unknown fields are ignored,
//! as OpenAI's own server does for options it does not know, and a missing optional field is
//! `None`. The fields a client may send as one string or as several (`prompt`, `input`,
//! `stop`, a message's `content`) are kept as JSON values: the handlers check them, so that an
//! error names the item at fault (`prompt[2]`).
//!
//! **Responses** serialise their fields in the order they are declared, which is the order
//! the server has always sent them: alphabetical (the bodies used to be `serde_json` maps,
//! which sort their keys). A key is always sent, `null` when it has no value, except where
//! the server leaves it out: a stream chunk's `usage` (sent only in the usage chunk), the
//! chat delta's `role` and `content`, health's `llm` (without a language model) and the
//! attention's `translation` (of the translation model only). Numbers the models compute as
//! `f32` are sent as the `f64`s they widen to ([`wide`]), as before.

mod encoders;
mod generation;

use serde::{Deserialize, Serialize};

pub(crate) use encoders::{
    Attention, AttentionMap, AttentionRequest, Embedding, EmbeddingRequest, EmbeddingUsage,
    EmbeddingVector, Embeddings, Translation, TranslationCandidate, TranslationRequest,
    Translations,
};
pub(crate) use generation::{
    AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletion, Completion, CompletionChoice,
    Delta, GenerationRequest, StreamChoice, StreamChunk, Usage,
};

/// OpenAI's error body, `{"error": {...}}` ([`ApiError`](crate::ApiError)'s, on every 4xx and
/// 5xx, and as a stream's last event when it fails).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The inside of [`ErrorBody`]: all four keys always sent, `null` when unset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ErrorDetail {
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`...).
    pub code: Option<String>,
    /// What went wrong, for a person.
    pub message: String,
    /// The request field at fault, as a path (`messages[0].content`).
    pub param: Option<String>,
    /// OpenAI's error type (`invalid_request_error`, `rate_limit_error`, `server_error`).
    #[serde(rename = "type")]
    pub kind: String,
}

/// `GET /health`: `"ok"`, or `"error"` (with a 503) once the language model's decoding thread
/// has stopped; the language model's counters when one is loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Health {
    /// The language model's counters (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmHealth>,
    /// `"ok"` or `"error"`.
    pub status: String,
}

/// The language model's counters in [`Health`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LlmHealth {
    /// Requests in the batch now.
    pub active: usize,
    /// Prompt tokens taken from the prefix cache since the start.
    pub cached_tokens: usize,
    /// Requests whose client went away before they ended.
    pub cancelled: usize,
    /// Requests that ended.
    pub completed: usize,
    /// Whether the decoding thread still runs.
    pub decoding: bool,
    /// The largest batch decoded in one step.
    pub largest_batch: usize,
    /// The model's name.
    pub model: String,
    /// Decoding steps since the start.
    pub steps: usize,
    /// Requests waiting for a place in the batch.
    pub waiting: usize,
}

/// `GET /v1/models`: every loaded model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ModelList {
    /// One card per model: the language model, the encoder, the translation model.
    pub data: Vec<ModelCard>,
    /// `"list"`.
    pub object: String,
}

/// One loaded model (`GET /v1/models/{id}` answers one alone).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ModelCard {
    /// Unix time the server started.
    pub created: u64,
    /// The endpoints that serve it.
    pub endpoints: Vec<String>,
    /// Its name.
    pub id: String,
    /// xfmr's: `"llm"`, `"embeddings"` or `"translation"`.
    pub kind: String,
    /// `"model"`.
    pub object: String,
    /// `"xfmr"`.
    pub owned_by: String,
}

/// Serialisers for `f32`s sent as the `f64`s they widen to (`0.1f32` as
/// `0.10000000149011612`), as the server has always sent them; `NaN` and infinities as
/// `null`. They deserialise as plain numbers.
pub(crate) mod wide {
    use serde::{Serialize, Serializer};

    /// A list of numbers.
    pub fn floats<S: Serializer>(values: &[f32], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(values.iter().map(|&v| f64::from(v)))
    }

    /// A list of lists of numbers.
    pub fn rows<S: Serializer>(rows: &[Vec<f32>], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(rows.iter().map(|row| Floats(row)))
    }

    /// One row of [`rows`].
    struct Floats<'a>(&'a [f32]);

    impl Serialize for Floats<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            floats(self.0, s)
        }
    }
}

#[cfg(test)]
mod tests;
