//! Driving a [`Decoding`] over a model's steps ([`HostSteps`] of one row): [`run`], over the
//! two ways models give host logits ([`QuantizedSteps`], [`TensorSteps`]).

use std::time::{Duration, Instant};

use burn::tensor::backend::Backend;
use xfmr_models::generate::{Cancel, HostSteps, IncrementalDecoder, TensorSteps};
use xfmr_models::ModelError;

use super::{DecodeRequest, Decoding, Event, Finish, Next};
use crate::quantized::{PrefixCache, QuantizedSteps, SequenceCache};
use crate::{GgufTokenizer, LlmError, QuantizedLlama};

/// A finished [`decode`] or [`decode_tensor`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// Generated ids (no end token).
    pub tokens: Vec<u32>,
    /// Why it ended.
    pub finish: Finish,
    /// Prompt tokens taken from the prefix cache.
    pub cached_tokens: usize,
    /// From the start to the first chosen token: the prompt's forward pass and one choice.
    pub prompt_time: Duration,
    /// From the first chosen token to the end.
    pub generation_time: Duration,
}

/// Runs `decoding` to its end over `steps` of one row: feeds `prompt` (≥ 1 token: what the
/// steps have not been fed of it), then each chosen token; checks the request's cancel token
/// before each step. Returns the time to the first chosen token and from it to the last (end tokens not
/// counted; with no token, the whole time and zero).
///
/// # Errors
/// The model's step ([`LlmError::Model`], [`ModelError::Cancelled`] among them), a token the
/// tokenizer cannot decode ([`LlmError::Tokenizer`]); [`Event::Failed`] was emitted.
pub fn run(
    steps: &mut dyn HostSteps,
    decoding: &mut Decoding<'_>,
    prompt: &[u32],
    emit: &mut dyn FnMut(Event),
) -> Result<(Duration, Duration), LlmError> {
    let start = Instant::now();
    let cancel = decoding.request.cancel.clone();
    let mut feed = prompt.to_vec();
    // When the first and the last token were chosen (end tokens not counted).
    let (mut first, mut last) = (None, None);
    let mut failure = None;
    if decoding.request.max_tokens == 0 {
        decoding.end(Finish::Length, emit);
    }
    while !decoding.is_done() {
        let logits = match cancel
            .as_ref()
            .map_or(Ok(()), Cancel::check)
            .and_then(|()| steps.step(&feed, feed.len(), false))
        {
            Ok(logits) => logits,
            Err(e) => {
                decoding.fail(e.to_string(), emit);
                failure = Some(LlmError::from(e));
                break;
            }
        };
        let before = decoding.tokens().len();
        let next = decoding.advance(logits, emit);
        if decoding.tokens().len() > before {
            let now = start.elapsed();
            first.get_or_insert(now);
            last = Some(now);
        }
        if let Next::Feed(token) = next {
            feed.clear();
            feed.push(token);
        }
    }
    if let Some(e) = failure.or_else(|| decoding.take_error()) {
        return Err(e);
    }
    let total = start.elapsed();
    let first = first.unwrap_or(total);
    Ok((first, last.unwrap_or(total) - first))
}

/// Decodes one prompt on the quantised model through a [`Decoding`] ([`run`] over
/// [`QuantizedSteps`]). Events go to `emit` as they happen. With `prefixes`, the longest
/// prefix of `prompt` it holds is restored first, and what was fed is stored again at the end
/// (as the server does between requests).
///
/// # Errors
/// An empty prompt, a prompt and `max_tokens` beyond the model's context,
/// ids outside the vocabulary, [`ModelError::Cancelled`] ([`LlmError::Model`]); a token the
/// tokenizer cannot decode ([`LlmError::Tokenizer`]). [`Event::Failed`] was emitted for the
/// errors of a step.
pub fn decode(
    model: &QuantizedLlama,
    tokenizer: &GgufTokenizer,
    prompt: &[u32],
    request: DecodeRequest,
    prefixes: Option<&mut PrefixCache>,
    emit: &mut dyn FnMut(Event),
) -> Result<Decoded, LlmError> {
    let context = model.config.context_length;
    check(prompt)?;
    if prompt.len() + request.max_tokens > context {
        return Err(ModelError::InvalidInput(format!(
            "a prompt of {} tokens and {} new ones exceed the model's context of {context}",
            prompt.len(),
            request.max_tokens
        ))
        .into());
    }
    let mut cache = model.sequence(prompt.len() + request.max_tokens);
    let mut prefixes = prefixes;
    let cached = prefixes
        .as_deref_mut()
        .map_or(0, |p| p.restore(prompt, &mut cache));
    let mut decoding = Decoding::new(tokenizer, request).with_cached_tokens(cached);
    let mut steps = QuantizedSteps::new(model, cache);
    let timing = run(&mut steps, &mut decoding, &prompt[cached..], emit);
    if let Some(prefixes) = prefixes {
        store(prefixes, prompt, decoding.tokens(), &steps.caches()[0]);
    }
    let (prompt_time, generation_time) = timing?;
    Ok(Decoded {
        tokens: decoding.tokens().to_vec(),
        finish: decoding.finish().unwrap_or(Finish::Length),
        cached_tokens: cached,
        prompt_time,
        generation_time,
    })
}

/// Decodes one prompt on a tensor model (an `f32` [`DecoderOnly`](xfmr_models::DecoderOnly)
/// on any backend) through a [`Decoding`]: [`run`] over [`TensorSteps`] from `state`, a fresh
/// one-row state.
///
/// # Errors
/// An empty prompt, the model's step errors, a token the tokenizer cannot decode.
pub fn decode_tensor<B: Backend, M: IncrementalDecoder<B>>(
    model: &M,
    state: M::State,
    tokenizer: &GgufTokenizer,
    prompt: &[u32],
    request: DecodeRequest,
    emit: &mut dyn FnMut(Event),
) -> Result<Decoded, LlmError> {
    check(prompt)?;
    let mut decoding = Decoding::new(tokenizer, request);
    let mut steps = TensorSteps::new(model, state);
    let (prompt_time, generation_time) = run(&mut steps, &mut decoding, prompt, emit)?;
    Ok(Decoded {
        tokens: decoding.tokens().to_vec(),
        finish: decoding.finish().unwrap_or(Finish::Length),
        cached_tokens: 0,
        prompt_time,
        generation_time,
    })
}

/// A non-empty prompt.
fn check(prompt: &[u32]) -> Result<(), LlmError> {
    if prompt.is_empty() {
        return Err(ModelError::InvalidInput("the prompt is empty".into()).into());
    }
    Ok(())
}

/// Keeps what `cache` has been fed (`prompt`, then the first of `generated`) in `prefixes`.
pub fn store(prefixes: &mut PrefixCache, prompt: &[u32], generated: &[u32], cache: &SequenceCache) {
    let fed = cache.len().saturating_sub(prompt.len());
    if fed == 0 {
        return prefixes.store(prompt, cache);
    }
    let mut tokens = Vec::with_capacity(cache.len());
    tokens.extend_from_slice(prompt);
    tokens.extend_from_slice(&generated[..fed.min(generated.len())]);
    prefixes.store(&tokens, cache);
}
