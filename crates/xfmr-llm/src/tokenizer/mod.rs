//! The tokenizer a GGUF file describes, as a Hugging Face `tokenizers` tokenizer (no Python at
//! run time), its chat template, and streamed decoding.
//!
//! For `tokenizer.ggml.model = "gpt2"` (byte-level BPE: SmolLM2, Llama 3, Qwen...), the
//! tokenizer is assembled as Hugging Face `transformers` assembles it from the same file (its
//! `GGUFGPTConverter`), which is what the parity fixtures were tokenized with:
//!
//! - a BPE model over `tokenizer.ggml.tokens` (id = index) and `tokenizer.ggml.merges`
//!   (`"left right"`), no unknown token, no byte fallback;
//! - GPT-2's byte-level pre-tokenizer (its split regex, no prefix space unless
//!   `tokenizer.ggml.add_space_prefix` says so) and decoder;
//! - every token of type 3 (`CONTROL`: `<|im_start|>`, `<|im_end|>`, `<|endoftext|>`...) added
//!   as a special token, so that it is matched whole in the text and never split.
//!
//! Outside input is bounded: the chat template renders under limits (`template.rs`: fuel,
//! output size, and a memory budget where the program installs
//! [`BudgetAllocator`](crate::budget::BudgetAllocator)), and is probed once at load; texts are
//! tokenised within a token limit without work proportional to their length, and chat
//! messages with their contents kept as text (`limited.rs`).
//!
//! Departure: llama.cpp pre-splits digits one by one for `tokenizer.ggml.pre = "smollm"` (as
//! SmolLM's own `tokenizer.json` does); `transformers`, the reference here, applies GPT-2's
//! split, which keeps runs of digits together. We follow the reference. Other `pre` names with
//! their own split regexes (Llama 3, Qwen 2) are refused rather than tokenized wrongly.

mod limited;
mod template;

use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use serde::Serialize;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{
    AddedToken, DecodeStream, DecoderWrapper, ModelWrapper, NormalizerWrapper,
    PostProcessorWrapper, PreTokenizerWrapper, Tokenizer,
};

pub use template::{
    TemplateLimit, TemplateLimits, CHAT_TEMPLATE_BYTES_PER_INPUT_BYTE, CHAT_TEMPLATE_FUEL,
    CHAT_TEMPLATE_MEMORY_BYTES, CHAT_TEMPLATE_OUTPUT_BYTES,
};

use crate::gguf::{Gguf, GgufError, Value};
use crate::LlmError;

/// `tokenizer.ggml.pre` values whose split is GPT-2's (or is approximated by it in
/// `transformers`, the reference: see the module docs).
const GPT2_SPLIT_PRE: &[&str] = &["default", "gpt2", "gpt-2", "smollm", "starcoder", "refact"];

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// The texts of control tokens that end a turn, as llama.cpp's `llama_vocab` lists them
/// (its end-of-generation set): a control token spelled so ends generation.
const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|end_of_text|>",
    "<EOT>",
    "</s>",
];

/// A GGUF file's tokenizer, special ids and chat template. Read with its methods, as
/// `xfmr_translate::SubwordTokenizer` is (`eos_id()`, `pad_id()`, ...).
#[derive(Clone)]
pub struct GgufTokenizer {
    /// The Hugging Face tokenizer.
    tokenizer: Tokenizer,
    /// `tokenizer.ggml.bos_token_id`.
    bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`: generation stops there.
    eos_id: u32,
    /// `tokenizer.ggml.padding_token_id`, else the end id.
    pad_id: u32,
    /// `tokenizer.ggml.add_bos_token`: prompts start with the BOS id.
    add_bos: bool,
    /// `tokenizer.chat_template`, a Jinja template.
    chat_template: Option<String>,
    /// The number of tokens in the file (`tokenizer.ggml.tokens`).
    n_tokens: usize,
    /// The same tokenizer without the control tokens added: text that spells one is split
    /// into ordinary tokens (message contents in [`GgufTokenizer::encode_chat`]).
    plain: Arc<Tokenizer>,
    /// The control tokens matched whole in text, and the id text encodes each to, longest
    /// first.
    control: Arc<Vec<(String, u32)>>,
    /// The longest token in bytes: no text longer than `n × max_token_bytes` has `n` tokens.
    max_token_bytes: usize,
    /// Whether a control token's text holds a space (then texts are tokenised whole, not in
    /// chunks: see [`GgufTokenizer::encode_limited`]).
    control_has_space: bool,
    /// The ids that end generation.
    end_of_generation: Vec<u32>,
    /// The limits every rendering of the chat template runs under.
    limits: TemplateLimits,
    /// Set when a rendering of `chat_template` went past its memory budget: every later one is
    /// refused (shared by clones; a new template starts clear).
    hostile: Arc<AtomicBool>,
}

impl std::fmt::Debug for GgufTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufTokenizer")
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("bos_id", &self.bos_id)
            .field("eos_id", &self.eos_id)
            .field("pad_id", &self.pad_id)
            .field("add_bos", &self.add_bos)
            .finish()
    }
}

/// GPT-2's map from bytes to printable characters (`bytes_to_unicode`).
fn byte_chars() -> [char; 256] {
    let mut chars = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0..256u32 {
        let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
        chars[b as usize] = if printable {
            char::from_u32(b).expect("latin-1")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("valid")
        };
    }
    chars
}

impl GgufTokenizer {
    /// The Hugging Face tokenizer the file's vocabulary and merges make.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// `tokenizer.ggml.bos_token_id`, if the file has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// `tokenizer.ggml.eos_token_id`: generation stops there.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// `tokenizer.ggml.padding_token_id`, else the end id.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// `tokenizer.ggml.add_bos_token`: whether [`encode`](Self::encode) starts a prompt with
    /// the BOS id.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// `tokenizer.chat_template`, a Jinja template, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// With another chat template (`None`: none), as if the file had said so. Unlike the
    /// file's template, it is not probed: a hostile one is found on its first rendering.
    pub fn with_chat_template(mut self, template: Option<String>) -> Self {
        self.chat_template = template;
        self.hostile = Arc::new(AtomicBool::new(false));
        self
    }

    /// With other limits for chat-template rendering (the fuzz targets use small ones).
    pub fn with_template_limits(mut self, limits: TemplateLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The limits chat-template rendering runs under.
    pub fn template_limits(&self) -> TemplateLimits {
        self.limits
    }

    /// The longest token's length in bytes (an upper bound): a text of more than
    /// `max_tokens × max_token_bytes()` bytes has more than `max_tokens` tokens, which is how
    /// [`encode_limited`](Self::encode_limited) refuses it without tokenising it.
    pub fn max_token_bytes(&self) -> usize {
        self.max_token_bytes
    }

    /// The ids that end generation, as llama.cpp's `llama_vocab::is_eog` decides: the end id
    /// (`tokenizer.ggml.eos_token_id`), `tokenizer.ggml.eot_token_id` and
    /// `tokenizer.ggml.eom_token_id` when the file has them, and every control token spelled
    /// as one of the usual end markers (`<|endoftext|>`, `<|im_end|>`, `<|eot_id|>`,
    /// `<|eom_id|>`, `<|end|>`, `<end_of_turn>`, `<|end_of_text|>`, `<EOT>`, `</s>`). Sorted,
    /// without repeats.
    pub fn end_of_generation_ids(&self) -> &[u32] {
        &self.end_of_generation
    }

    /// Whether `id` ends generation (see [`end_of_generation_ids`](Self::end_of_generation_ids)).
    pub fn is_end_of_generation(&self, id: u32) -> bool {
        self.end_of_generation.binary_search(&id).is_ok()
    }

    /// The number of tokens in the file (`tokenizer.ggml.tokens`): every id is below it. It
    /// can exceed the tokenizer's own vocabulary size when the file spells two ids alike (the
    /// later one is the one text encodes to, as in llama.cpp).
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Builds the tokenizer from `gguf`'s metadata.
    ///
    /// # Errors
    /// [`GgufError::Metadata`] naming a missing key, a tokenizer kind other than `gpt2`, a
    /// pre-tokenizer with a split of its own, a malformed merge; tokenizer errors.
    pub fn from_gguf(gguf: &Gguf) -> Result<Self, LlmError> {
        let model = gguf.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(GgufError::metadata(
                "tokenizer.ggml.model",
                format!("{model:?}: only byte-level BPE (\"gpt2\") is supported"),
            )
            .into());
        }
        if let Some(pre) = gguf.metadata.get("tokenizer.ggml.pre") {
            let pre = pre.as_str().unwrap_or_default();
            if !GPT2_SPLIT_PRE.contains(&pre) {
                return Err(GgufError::metadata(
                    "tokenizer.ggml.pre",
                    format!("{pre:?}: its split is not GPT-2's (supported: {GPT2_SPLIT_PRE:?})"),
                )
                .into());
            }
        }
        let tokens = gguf.get_strings("tokenizer.ggml.tokens")?;
        let merges = gguf.get_strings("tokenizer.ggml.merges")?;
        let types: Vec<Option<u64>> = match gguf.metadata.get("tokenizer.ggml.token_type") {
            Some(Value::Array(items)) => items.iter().map(Value::as_u64).collect(),
            _ => Vec::new(),
        };
        // Tokens are written in GPT-2's byte-level spelling; one that is not (a raw string
        // llama.cpp could not map back) is respelled, as `transformers` does.
        let alphabet = byte_chars();
        let in_alphabet: HashSet<char> = alphabet.iter().copied().collect();
        let byte_level = |t: &str| t.chars().all(|c| in_alphabet.contains(&c));
        let spelled = |t: &str| -> String {
            if byte_level(t) {
                t.to_string()
            } else {
                t.bytes().map(|b| alphabet[b as usize]).collect()
            }
        };
        let mut vocab = Vocab::default();
        for (i, t) in tokens.iter().enumerate() {
            vocab.insert(spelled(t), i as u32);
        }
        let merges = merges
            .iter()
            .enumerate()
            .map(|(i, m)| match m.split(' ').collect::<Vec<_>>()[..] {
                [a, b] => Ok((a.to_string(), b.to_string())),
                _ => Err(GgufError::metadata(
                    "tokenizer.ggml.merges",
                    format!("merge {i} ({m:?}) is not two tokens"),
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| LlmError::Tokenizer(e.to_string()))?;
        let add_prefix_space = matches!(
            gguf.metadata.get("tokenizer.ggml.add_space_prefix"),
            Some(Value::Bool(true))
        );
        let mut tokenizer = Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(ByteLevel::new(add_prefix_space, true, true)));
        tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
        let plain = Arc::new(tokenizer.clone());
        let is_control = |i: usize| types.get(i).copied().flatten() == Some(3);
        let added: Vec<AddedToken> = tokens
            .iter()
            .enumerate()
            .filter(|(i, t)| is_control(*i) && byte_level(t))
            .map(|(_, t)| AddedToken::from(t.to_string(), true))
            .collect();
        tokenizer.add_special_tokens(&added);
        // The id the tokenizer gives each control token's text (the later of two alike ids).
        let mut control: Vec<(String, u32)> = added
            .iter()
            .filter_map(|t| Some((t.content.clone(), tokenizer.token_to_id(&t.content)?)))
            .collect();
        control.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        control.dedup_by(|a, b| a.0 == b.0);
        // A byte-level token of n characters stands for n bytes; a respelled one for its
        // UTF-8 bytes; a control token for its text: each at most `t.len()` bytes.
        let max_token_bytes = tokens.iter().map(|t| t.len()).max().unwrap_or(1).max(1);
        let control_has_space = control.iter().any(|(t, _)| t.contains(' '));
        let id = |key: &str| -> Result<Option<u32>, GgufError> {
            match gguf.opt_usize(key)? {
                Some(id) if id >= tokens.len() => Err(GgufError::metadata(
                    key,
                    format!("{id} is outside the {} tokens", tokens.len()),
                )),
                id => Ok(id.map(|id| id as u32)),
            }
        };
        let eos_id = id("tokenizer.ggml.eos_token_id")?.ok_or_else(|| {
            GgufError::metadata(
                "tokenizer.ggml.eos_token_id",
                "absent: generation would never stop",
            )
        })?;
        let mut end_of_generation = vec![eos_id];
        end_of_generation.extend(id("tokenizer.ggml.eot_token_id")?);
        end_of_generation.extend(id("tokenizer.ggml.eom_token_id")?);
        end_of_generation.extend(
            tokens
                .iter()
                .enumerate()
                .filter(|(i, t)| is_control(*i) && END_OF_GENERATION_TEXTS.contains(t))
                .map(|(i, _)| i as u32),
        );
        end_of_generation.sort_unstable();
        end_of_generation.dedup();
        let this = Self {
            n_tokens: tokens.len(),
            tokenizer,
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id,
            pad_id: id("tokenizer.ggml.padding_token_id")?.unwrap_or(eos_id),
            add_bos: matches!(
                gguf.metadata.get("tokenizer.ggml.add_bos_token"),
                Some(Value::Bool(true))
            ),
            chat_template: gguf
                .metadata
                .get("tokenizer.chat_template")
                .and_then(Value::as_str)
                .map(str::to_string),
            plain,
            control: Arc::new(control),
            max_token_bytes,
            control_has_space,
            end_of_generation,
            limits: TemplateLimits::default(),
            hostile: Arc::new(AtomicBool::new(false)),
        };
        this.probe_chat_template()?;
        Ok(this)
    }

    /// Token ids of `text`; special tokens written in the text (`<|im_start|>`) are matched
    /// whole. The BOS id is prepended when the file asks for it.
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, LlmError> {
        let encoding = self
            .tokenizer
            .encode(text, false)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))?;
        let mut ids = Vec::with_capacity(encoding.len() + 1);
        if let (true, Some(bos)) = (self.add_bos, self.bos_id) {
            ids.push(bos);
        }
        ids.extend(encoding.get_ids());
        Ok(ids)
    }

    /// The text of `ids`, special tokens left out.
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`].
    pub fn decode(&self, ids: &[u32]) -> Result<String, LlmError> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))
    }

    /// A decoder that turns tokens into text one at a time (see [`TextStream`]).
    pub fn stream(&self) -> TextStream<'_> {
        TextStream {
            inner: self.tokenizer.decode_stream(true),
            vocab: self.n_tokens,
        }
    }
}

/// Text from tokens as they are generated: [`push`](Self::push) returns the new text once the
/// bytes seen so far end on a whole character, so a multi-byte character split over several
/// tokens is printed once, whole.
pub struct TextStream<'a> {
    inner: DecodeStream<
        'a,
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >,
    /// Ids below this are the file's ([`GgufTokenizer::n_tokens`]).
    vocab: usize,
}

impl TextStream<'_> {
    /// The text `id` completes (empty while a character is still incomplete).
    ///
    /// # Errors
    /// [`LlmError::Tokenizer`] for an id outside the vocabulary.
    pub fn push(&mut self, id: u32) -> Result<String, LlmError> {
        // The tokenizers library's stream decodes an id past the vocabulary as nothing (found
        // by fuzzing, `fuzz/src/targets/gguf_tokenizer.rs`).
        if id as usize >= self.vocab {
            return Err(LlmError::Tokenizer(format!(
                "token id {id} is outside the vocabulary of {}",
                self.vocab
            )));
        }
        self.inner
            .step(id)
            .map(Option::unwrap_or_default)
            .map_err(|e| LlmError::Tokenizer(e.to_string()))
    }
}
