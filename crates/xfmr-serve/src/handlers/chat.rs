//! `POST /v1/chat/completions`: the conversation through the model's chat template, answered
//! whole or streamed.

use std::sync::Arc;

use axum::extract::State;
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use burn::tensor::backend::Backend;
use serde_json::Value;
use tokio::time::Instant;
use xfmr_llm::Message;

use super::generate::{collect, settings, submit, Prompt};
use super::{kind_of, pick_model, request_id};
use crate::api::{AssistantMessage, ChatChoice, ChatCompletion, GenerationRequest, Usage};
use crate::error::{ApiError, JsonBody};
use crate::http::Tokens;
use crate::sse::{event_stream, Flavour};
use crate::{unix_now, AppState};

/// The `content` of a chat message: a string, or an array of `{"type": "text", "text": ...}`
/// parts.
fn message_text(i: usize, content: Value) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        // Moved, not copied: a content may be most of a megabyte.
        Value::String(s) => Ok(s),
        Value::Array(parts) => parts
            .into_iter()
            .enumerate()
            .map(|(j, part)| match part.get("text").and_then(Value::as_str) {
                Some(text) if part.get("type").and_then(Value::as_str) == Some("text") => {
                    Ok(text.to_string())
                }
                _ => Err(ApiError::invalid(
                    Some(&format!("{param}[{j}]")),
                    format!(
                        "{param}[{j}]: only text parts ({{\"type\": \"text\", \"text\": ...}})"
                    ),
                )),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| texts.concat()),
        other => Err(ApiError::invalid(
            Some(&param),
            format!(
                "{param}: expected a string or an array of text parts, got {}",
                kind_of(&other)
            ),
        )),
    }
}

/// The handler: a [`ChatCompletion`], or its chunks as server-sent events (`stream: true`).
pub(crate) async fn chat<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(mut req): JsonBody<GenerationRequest>,
) -> Result<Response, ApiError> {
    let names = state.names();
    let llm = state.llm.as_ref();
    let model = pick_model(
        req.model.as_deref(),
        llm.map(|l| l.name.as_str()),
        "/v1/chat/completions",
        &names,
    )?
    .to_string();
    let llm = llm.expect("a model was found");
    let Some(messages) = req.messages.take() else {
        return Err(ApiError::invalid(
            Some("messages"),
            "messages: missing (a chat request needs its messages)",
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "messages is empty"));
    }
    let messages = messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            if !["system", "user", "assistant", "developer"].contains(&m.role.as_str()) {
                return Err(ApiError::invalid(
                    Some(&format!("messages[{i}].role")),
                    format!(
                        "messages[{i}].role = {:?}: one of system, developer, user, assistant",
                        m.role
                    ),
                ));
            }
            let role = match m.role.as_str() {
                "developer" => "system".to_string(),
                _ => m.role,
            };
            Ok(Message {
                role,
                content: message_text(i, m.content)?,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let settings = settings(&req, state.config.max_tokens, llm.model.config.vocab_size)?;
    let (rx, prompt_tokens) = submit(&state, Prompt::Chat(&messages), "messages", &settings)?;
    let timeout = state.config.request_timeout;
    if req.stream.unwrap_or(false) {
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        let events = event_stream(
            rx,
            Flavour::Chat,
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
    let (text, finish, completion, cached) = collect(rx, Instant::now() + timeout, timeout).await?;
    let tokens = Tokens {
        prompt: Some(prompt_tokens),
        completion: Some(completion),
    };
    Ok((
        Extension(tokens),
        Json(ChatCompletion {
            choices: vec![ChatChoice {
                finish_reason: finish.as_str().into(),
                index: 0,
                logprobs: None,
                message: AssistantMessage {
                    content: text,
                    role: "assistant".into(),
                },
            }],
            created: unix_now(),
            id: request_id("chatcmpl"),
            model,
            object: "chat.completion".into(),
            system_fingerprint: None,
            usage: Usage::new(prompt_tokens, completion, cached),
        }),
    )
        .into_response())
}
