//! The language model's bodies: `POST /v1/chat/completions` and `POST /v1/completions`, whole
//! or streamed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A chat or completion request: the generation fields both share, and each one's input
/// (`messages` for chat, `prompt` for completions; the handler says which is missing).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct GenerationRequest {
    /// The model asked for (the loaded one when absent).
    pub model: Option<String>,
    /// Chat: the conversation.
    pub messages: Option<Vec<ChatMessage>>,
    /// Completions: a string or an array of strings.
    pub prompt: Option<Value>,
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// OpenAI's newer name for `max_tokens` (this one wins when both are given).
    pub max_completion_tokens: Option<u64>,
    /// Sampling temperature in [0, 2] (greedy below 0.001).
    pub temperature: Option<f64>,
    /// Nucleus sampling's probability mass in [0, 1].
    pub top_p: Option<f64>,
    /// The sampler's seed (a different one per request when absent).
    pub seed: Option<i64>,
    /// Up to 4 stop strings: a string, an array of strings or `null`.
    pub stop: Option<Value>,
    /// Token id (as a string) to a bias in [-100, 100] added to its logit.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// No end token before this many tokens (vLLM's extension; stop strings still stop).
    pub min_tokens: Option<u64>,
    /// Choices per prompt: only 1.
    pub n: Option<u64>,
    /// Server-sent events, a chunk per piece of text.
    pub stream: Option<bool>,
    /// What a stream adds.
    pub stream_options: Option<StreamOptions>,
}

/// A request's `stream_options`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StreamOptions {
    /// A last chunk with the usage (and no choices) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// One message of a chat request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ChatMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// A string, or an array of `{"type": "text", "text": ...}` parts.
    pub content: Value,
}

/// OpenAI's `usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Usage {
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Tokens of the prompt (or prompts).
    pub prompt_tokens: usize,
    /// How many of the prompt's tokens were not fed.
    pub prompt_tokens_details: PromptTokensDetails,
    /// Prompt and completion.
    pub total_tokens: usize,
}

impl Usage {
    /// `cached` of the prompt's tokens were not fed, their keys and values taken from the
    /// prefix cache.
    pub fn new(prompt: usize, completion: usize, cached: usize) -> Self {
        Self {
            completion_tokens: completion,
            prompt_tokens: prompt,
            prompt_tokens_details: PromptTokensDetails {
                cached_tokens: cached,
            },
            total_tokens: prompt + completion,
        }
    }
}

/// [`Usage::prompt_tokens_details`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PromptTokensDetails {
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_tokens: usize,
}

/// A whole chat completion (`"object": "chat.completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ChatCompletion {
    /// One choice (`n` is 1).
    pub choices: Vec<ChatChoice>,
    /// Unix time of the answer.
    pub created: u64,
    /// `chatcmpl-N`.
    pub id: String,
    /// The model's name.
    pub model: String,
    /// `"chat.completion"`.
    pub object: String,
    /// Always `null`.
    pub system_fingerprint: Option<String>,
    /// Tokens in and out.
    pub usage: Usage,
}

/// A [`ChatCompletion`]'s choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ChatChoice {
    /// `"stop"` or `"length"`.
    pub finish_reason: String,
    /// 0.
    pub index: usize,
    /// Always `null` (no log-probabilities are computed).
    pub logprobs: Option<Value>,
    /// The answer.
    pub message: AssistantMessage,
}

/// The message a [`ChatChoice`] answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct AssistantMessage {
    /// The generated text.
    pub content: String,
    /// `"assistant"`.
    pub role: String,
}

/// A whole completion (`"object": "text_completion"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Completion {
    /// One choice per prompt, in order.
    pub choices: Vec<CompletionChoice>,
    /// Unix time of the answer.
    pub created: u64,
    /// `cmpl-N`.
    pub id: String,
    /// The model's name.
    pub model: String,
    /// `"text_completion"`.
    pub object: String,
    /// Tokens in and out, all prompts together.
    pub usage: Usage,
}

/// A completion's choice, whole or a stream chunk's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CompletionChoice {
    /// `"stop"` or `"length"`; `null` in a stream's chunks before the last.
    pub finish_reason: Option<String>,
    /// The prompt's index.
    pub index: usize,
    /// Always `null` (no log-probabilities are computed).
    pub logprobs: Option<Value>,
    /// The generated text (a stream chunk's piece of it; `""` in the last chunk).
    pub text: String,
}

/// One server-sent event of a stream (chat's `chat.completion.chunk`, completions'
/// `text_completion`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StreamChunk {
    /// One choice; none in the usage chunk.
    pub choices: Vec<StreamChoice>,
    /// Unix time the stream started.
    pub created: u64,
    /// The stream's id, the same in every chunk (`chatcmpl-N`, `cmpl-N`).
    pub id: String,
    /// The model's name.
    pub model: String,
    /// `"chat.completion.chunk"` or `"text_completion"`.
    pub object: String,
    /// Only in the usage chunk (`stream_options.include_usage`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A [`StreamChunk`]'s choice: chat's or a completion's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum StreamChoice {
    /// Chat's, with a `delta`.
    Chat(ChatChunkChoice),
    /// A completion's, with a `text`.
    Completion(CompletionChoice),
}

/// A chat stream chunk's choice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ChatChunkChoice {
    /// The text added.
    pub delta: Delta,
    /// `"stop"` or `"length"` in the last chunk, `null` before.
    pub finish_reason: Option<String>,
    /// 0.
    pub index: usize,
    /// Always `null` (no log-probabilities are computed).
    pub logprobs: Option<Value>,
}

/// A [`ChatChunkChoice`]'s delta: the first chunk's has the role and content (`""` if it has
/// no text), later ones the content only, the last one neither (`{}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Delta {
    /// The piece of text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// `"assistant"`, in the first chunk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}
