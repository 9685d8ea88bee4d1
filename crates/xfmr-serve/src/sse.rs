//! Streamed generations as server-sent events, in OpenAI's chunk format.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::Event as SseEvent;
use futures_util::stream::{self, Stream};
use serde::Serialize;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use crate::api::{ChatChunkChoice, CompletionChoice, Delta, StreamChoice, StreamChunk, Usage};
use crate::engine::{Event, Finish};
use crate::error::ApiError;
use crate::handlers::request_id;
use crate::unix_now;

/// The shape of one endpoint's stream chunks.
#[derive(Clone, Copy)]
pub(crate) enum Flavour {
    /// `POST /v1/chat/completions`: `chat.completion.chunk`s with a `delta`.
    Chat,
    /// `POST /v1/completions`: `text_completion`s with a `text`.
    Completion,
}

impl Flavour {
    /// The chunks' `object`.
    fn object(self) -> &'static str {
        match self {
            Self::Chat => "chat.completion.chunk",
            Self::Completion => "text_completion",
        }
    }

    /// The chunks' id prefix.
    fn id_prefix(self) -> &'static str {
        match self {
            Self::Chat => "chatcmpl",
            Self::Completion => "cmpl",
        }
    }

    /// A chunk's choice: a piece of text, or the end (`finish`); `first` for chat's first
    /// chunk, whose delta has the role.
    fn choice(self, text: Option<&str>, finish: Option<Finish>, first: bool) -> StreamChoice {
        let finish_reason = finish.map(|f| f.as_str().to_string());
        match self {
            Self::Chat => {
                let delta = match (first, text) {
                    (true, _) => Delta {
                        content: Some(text.unwrap_or("").to_string()),
                        role: Some("assistant".into()),
                    },
                    (false, text) => Delta {
                        content: text.map(str::to_string),
                        role: None,
                    },
                };
                StreamChoice::Chat(ChatChunkChoice {
                    delta,
                    finish_reason,
                    index: 0,
                    logprobs: None,
                })
            }
            Self::Completion => StreamChoice::Completion(CompletionChoice {
                finish_reason,
                index: 0,
                logprobs: None,
                text: text.unwrap_or("").to_string(),
            }),
        }
    }
}

/// One event whose data is `body` as JSON.
fn json_event(body: &impl Serialize) -> SseEvent {
    // The bodies are structs of strings and numbers: they always serialise.
    SseEvent::default().data(serde_json::to_string(body).unwrap_or_default())
}

/// Server-sent events for one request: a chunk per piece of text, a last chunk with the
/// finish reason, the usage chunk if asked for, `[DONE]`. An error (the model's, or the
/// request timeout) is sent as an `{"error": ...}` event and ends the stream. Dropping the
/// stream (the client went away) drops the receiver, and the engine frees the slot at its next
/// step.
pub(crate) fn event_stream(
    rx: UnboundedReceiver<Event>,
    flavour: Flavour,
    model: String,
    prompt_tokens: usize,
    include_usage: bool,
    timeout: Duration,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let id = request_id(flavour.id_prefix());
    let created = unix_now();
    let chunk = move |choices: Vec<StreamChoice>, usage: Option<Usage>| {
        json_event(&StreamChunk {
            choices,
            created,
            id: id.clone(),
            model: model.clone(),
            object: flavour.object().into(),
            usage,
        })
    };
    struct St {
        rx: Option<UnboundedReceiver<Event>>,
        first: bool,
        pending: Vec<SseEvent>,
    }
    let deadline = Instant::now() + timeout;
    let start = St {
        rx: Some(rx),
        first: matches!(flavour, Flavour::Chat),
        pending: Vec::new(),
    };
    stream::unfold(start, move |mut st| {
        let chunk = chunk.clone();
        async move {
            loop {
                if let Some(event) = st.pending.pop() {
                    return Some((Ok(event), st));
                }
                let rx = st.rx.as_mut()?;
                let event = match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Err(_) => Event::Failed(ApiError::timeout(timeout).message),
                    Ok(None) => Event::Failed("the language model's thread stopped".into()),
                    Ok(Some(event)) => event,
                };
                // `pending` is popped from the end: push in reverse order.
                match event {
                    Event::Text(text) => {
                        let c = flavour.choice(Some(&text), None, st.first);
                        st.first = false;
                        st.pending.push(chunk(vec![c], None));
                    }
                    Event::Done {
                        finish,
                        completion_tokens,
                        cached_tokens,
                    } => {
                        st.rx = None;
                        st.pending.push(SseEvent::default().data("[DONE]"));
                        if include_usage {
                            let u = Usage::new(prompt_tokens, completion_tokens, cached_tokens);
                            st.pending.push(chunk(Vec::new(), Some(u)));
                        }
                        st.pending.push(chunk(
                            vec![flavour.choice(None, Some(finish), st.first)],
                            None,
                        ));
                    }
                    Event::Failed(message) => {
                        st.rx = None;
                        let e = ApiError::internal(message);
                        st.pending.push(json_event(&e.error_body()));
                    }
                }
            }
        }
    })
}
