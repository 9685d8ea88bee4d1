//! `POST /v1/completions`: plain continuations of one prompt or several (decoded in one
//! batch), answered whole or, for one prompt, streamed.

use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use burn::tensor::backend::Backend;
use tokio::time::Instant;

use super::generate::{collect, settings, submit, Prompt};
use super::{pick_model, request_id, strings};
use crate::api::{Completion, CompletionChoice, GenerationRequest, Usage};
use crate::error::{ApiError, JsonBody};
use crate::http::Tokens;
use crate::sse::{event_stream, Flavour};
use crate::{unix_now, AppState};

/// The handler: a [`Completion`], or its chunks as server-sent events (`stream: true`).
pub(crate) async fn completions<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(req): JsonBody<GenerationRequest>,
) -> Result<Response, ApiError> {
    let names = state.names();
    let model = pick_model(
        req.model.as_deref(),
        state.llm.as_ref().map(|l| l.name.as_str()),
        "/v1/completions",
        &names,
    )?
    .to_string();
    let Some(prompt) = &req.prompt else {
        return Err(ApiError::invalid(
            Some("prompt"),
            "prompt: missing (a completion request needs its prompt)",
        ));
    };
    let prompts = strings("prompt", prompt, state.config.max_batch)?;
    let vocab = state.llm.as_ref().map_or(0, |l| l.model.config.vocab_size);
    let settings = settings(&req, state.config.max_tokens, vocab)?;
    let timeout = state.config.request_timeout;
    if req.stream.unwrap_or(false) {
        if prompts.len() != 1 {
            return Err(ApiError::invalid(
                Some("prompt"),
                "prompt: a streamed completion takes one prompt",
            ));
        }
        let (rx, prompt_tokens) = submit(&state, Prompt::Text(&prompts[0]), "prompt", &settings)?;
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        let events = event_stream(
            rx,
            Flavour::Completion,
            model,
            prompt_tokens,
            include_usage,
            timeout,
        );
        let tokens = Tokens {
            prompt: Some(prompt_tokens),
            completion: None,
        };
        return Ok((Extension(tokens), Sse::new(events)).into_response());
    }
    // Every prompt is submitted before any is awaited: they decode in one batch.
    let submitted = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let param = match prompts.len() {
                1 => "prompt".to_string(),
                _ => format!("prompt[{i}]"),
            };
            submit(&state, Prompt::Text(p), &param, &settings)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let (mut choices, mut prompt_total, mut completion_total, mut cached_total) =
        (Vec::new(), 0, 0, 0);
    let deadline = Instant::now() + timeout;
    for (index, (rx, prompt_tokens)) in submitted.into_iter().enumerate() {
        let (text, finish, completion, cached) = collect(rx, deadline, timeout).await?;
        prompt_total += prompt_tokens;
        completion_total += completion;
        cached_total += cached;
        choices.push(CompletionChoice {
            finish_reason: Some(finish.as_str().into()),
            index,
            logprobs: None,
            text,
        });
    }
    let tokens = Tokens {
        prompt: Some(prompt_total),
        completion: Some(completion_total),
    };
    Ok((
        Extension(tokens),
        Json(Completion {
            choices,
            created: unix_now(),
            id: request_id("cmpl"),
            model,
            object: "text_completion".into(),
            usage: Usage::new(prompt_total, completion_total, cached_total),
        }),
    )
        .into_response())
}
