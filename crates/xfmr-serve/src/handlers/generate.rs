//! What chat and completions share: their generation settings checked, a prompt submitted to
//! the decoding engine, a whole answer collected.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use burn::tensor::backend::Backend;
use serde_json::Value;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::time::Instant;
use xfmr_llm::decode::DecodeRequest;
use xfmr_llm::{LlmError, Message};
use xfmr_models::generate::{SampleOptions, Sampler};

use super::strings;
use crate::api::GenerationRequest;
use crate::engine::{Event, Finish, Job};
use crate::error::ApiError;
use crate::AppState;

/// A request's generation settings, checked.
pub(super) struct Settings {
    max_tokens: Option<usize>,
    /// End tokens held off before this many tokens.
    min_tokens: usize,
    sample: Option<SampleOptions>,
    stop: Vec<String>,
    bias: Vec<(u32, f32)>,
}

/// The longest stop string, bytes.
const MAX_STOP_BYTES: usize = 256;
/// Below this temperature a request decodes greedily.
const MIN_TEMPERATURE: f64 = 1e-3;

/// Seeds for sampled requests that give none: different for each request.
static SEEDS: AtomicU64 = AtomicU64::new(0);

/// `req`'s settings, each checked (`limit`: the server's `max_tokens`; `vocab`: the model's
/// vocabulary size, for `logit_bias`).
pub(super) fn settings(
    req: &GenerationRequest,
    limit: usize,
    vocab: usize,
) -> Result<Settings, ApiError> {
    if let Some(n) = req.n.filter(|&n| n != 1) {
        return Err(ApiError::invalid(
            Some("n"),
            format!("n = {n}: this server returns one choice per prompt (n = 1)"),
        ));
    }
    let (field, max_tokens) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", Some(m)),
        (None, m) => ("max_tokens", m),
    };
    if let Some(m) = max_tokens {
        if m == 0 || m > limit as u64 {
            return Err(ApiError::invalid(
                Some(field),
                format!("{field} = {m}: must be in 1..={limit} on this server"),
            ));
        }
    }
    let min_tokens = req.min_tokens.unwrap_or(0);
    let most = max_tokens.unwrap_or(limit as u64);
    if min_tokens > most {
        return Err(ApiError::invalid(
            Some("min_tokens"),
            format!("min_tokens = {min_tokens}: must be at most {field} ({most})"),
        ));
    }
    let temperature = req.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid(
            Some("temperature"),
            format!("temperature = {temperature}: must be in [0, 2]"),
        ));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&top_p) {
        return Err(ApiError::invalid(
            Some("top_p"),
            format!("top_p = {top_p}: must be in [0, 1]"),
        ));
    }
    let stop = match &req.stop {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => strings("stop", v, 4)?,
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            Some("stop"),
            "stop: empty strings stop nothing",
        ));
    }
    if let Some(i) = stop.iter().position(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            Some(&format!("stop[{i}]")),
            format!("stop[{i}]: longer than {MAX_STOP_BYTES} bytes"),
        ));
    }
    // Temperatures this low, and `top_p` 0 (only the most probable token), are greedy
    // decoding: sampling would divide the logits by almost nothing.
    let greedy = temperature < MIN_TEMPERATURE || top_p == 0.0;
    let sample = (!greedy).then(|| SampleOptions {
        temperature,
        top_k: None,
        top_p: (top_p < 1.0).then_some(top_p),
        seed: match req.seed {
            Some(seed) => seed as u64,
            None => {
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64);
                nanos ^ SEEDS.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            }
        },
    });
    let bias = req
        .logit_bias
        .iter()
        .flatten()
        .map(|(id, &bias)| {
            let param = format!("logit_bias.{id}");
            let token = id.parse::<u32>().ok().filter(|&t| (t as usize) < vocab);
            match token {
                Some(t) if (-100.0..=100.0).contains(&bias) => Ok((t, bias as f32)),
                Some(_) => Err(ApiError::invalid(
                    Some(&param),
                    format!("{param} = {bias}: a bias must be in [-100, 100]"),
                )),
                None => Err(ApiError::invalid(
                    Some(&param),
                    format!("{param}: keys are token ids below {vocab}"),
                )),
            }
        })
        .collect::<Result<_, _>>()?;
    Ok(Settings {
        max_tokens: max_tokens.map(|m| m as usize),
        min_tokens: min_tokens as usize,
        sample,
        stop,
        bias,
    })
}

/// 400 `context_length_exceeded` for a prompt of over `limit` tokens.
fn too_long(context: usize, limit: usize, settings: &Settings, param: &str) -> ApiError {
    let asked = match settings.max_tokens {
        Some(m) => format!("{m} more were asked for"),
        None => "at least one more is needed".to_string(),
    };
    ApiError::invalid(
        Some(param),
        format!(
            "this model's context is {context} tokens; the prompt has over {limit} and {asked} \
             (lower max_tokens or shorten the prompt)"
        ),
    )
    .with_code("context_length_exceeded")
}

/// A prompt to submit: plain text (completions) or a conversation through the model's chat
/// template (chat).
#[derive(Clone, Copy)]
pub(super) enum Prompt<'a> {
    /// Tokenised as is.
    Text(&'a str),
    /// Rendered with the chat template and the assistant's turn opened, special-token text in
    /// the messages tokenised as plain text.
    Chat(&'a [Message]),
}

/// Submits one prompt to the engine: tokenises it only as far as the context allows (a longer
/// one is refused, `context_length_exceeded`, once its tokens pass the limit, so that its cost
/// is bounded by the context, not by its length), returns the events' receiver and the
/// prompt's length.
pub(super) fn submit<B: Backend>(
    state: &AppState<B>,
    prompt: Prompt<'_>,
    param: &str,
    settings: &Settings,
) -> Result<(UnboundedReceiver<Event>, usize), ApiError> {
    let llm = state.llm.as_ref().expect("checked by the caller");
    let context = llm.model.config.context_length;
    // The prompt leaves room for what was asked for, or at least one token.
    let limit = context.saturating_sub(settings.max_tokens.unwrap_or(1).max(1));
    // Tokenising a prompt of up to the context is CPU work: off the async workers' list
    // while it runs, so that other connections are served meanwhile.
    // A conversation whose contents alone are over `limit` tokens is refused before the
    // template renders it: no token is longer than `max_token_bytes`, and templates include
    // each content (trimmed at most), so its bytes bound its tokens from below.
    if let Prompt::Chat(messages) = prompt {
        let bytes: usize = messages.iter().map(|m| m.content.trim().len()).sum();
        if bytes > limit.saturating_mul(llm.tokenizer.max_token_bytes()) {
            return Err(too_long(context, limit, settings, param));
        }
    }
    let encoded = tokio::task::block_in_place(|| match prompt {
        Prompt::Text(text) => llm.tokenizer.encode_limited(text, limit),
        Prompt::Chat(messages) => llm.tokenizer.encode_chat(messages, true, limit),
    });
    let ids = match encoded {
        Ok(ids) => ids,
        Err(LlmError::TooManyTokens { .. }) => {
            return Err(too_long(context, limit, settings, param))
        }
        Err(e) => return Err(ApiError::invalid(Some(param), format!("{param}: {e}"))),
    };
    if ids.is_empty() {
        return Err(ApiError::invalid(
            Some(param),
            format!("{param}: the prompt has no tokens"),
        ));
    }
    let room = context.saturating_sub(ids.len());
    let max_tokens = settings
        .max_tokens
        .unwrap_or_else(|| state.config.max_tokens.min(room));
    if max_tokens == 0 || ids.len() + max_tokens > context {
        return Err(ApiError::invalid(
            Some(param),
            format!(
                "this model's context is {context} tokens; the prompt has {} and {max_tokens} \
                 more were asked for (lower max_tokens or shorten the prompt)",
                ids.len()
            ),
        )
        .with_code("context_length_exceeded"));
    }
    let (events, rx) = unbounded_channel();
    let request = DecodeRequest::greedy(&llm.tokenizer, max_tokens);
    let sampler = Sampler::new(settings.sample.clone())
        .with_logit_bias(settings.bias.clone())
        .with_min_len(settings.min_tokens, request.end_ids.clone());
    llm.engine.submit(Job {
        prompt: ids.clone(),
        request: request
            .with_sampler(sampler)
            .with_stop(settings.stop.clone()),
        events,
    })?;
    Ok((rx, ids.len()))
}

/// All of a request's text, its end, its token count and its prompt tokens taken from the
/// prefix cache, within `timeout`.
pub(super) async fn collect(
    mut rx: UnboundedReceiver<Event>,
    deadline: Instant,
    timeout: Duration,
) -> Result<(String, Finish, usize, usize), ApiError> {
    let mut text = String::new();
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Err(_) => return Err(ApiError::timeout(timeout)),
            Ok(None) => return Err(ApiError::internal("the language model's thread stopped")),
            Ok(Some(Event::Text(piece))) => text.push_str(&piece),
            Ok(Some(Event::Done {
                finish,
                completion_tokens,
                cached_tokens,
            })) => return Ok((text, finish, completion_tokens, cached_tokens)),
            Ok(Some(Event::Failed(message))) => return Err(ApiError::internal(message)),
        }
    }
}
