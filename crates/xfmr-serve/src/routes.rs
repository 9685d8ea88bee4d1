//! The endpoints: request bodies checked field by field, work handed to the decoding engine or
//! the encoder models' thread, answers in OpenAI's shapes.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use burn::tensor::backend::Backend;
use futures_util::stream::{self, Stream};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::time::Instant;
use xfmr_llm::Message;
use xfmr_models::generate::{
    BeamOptions, GenerationOptions, SampleOptions, Strategy, TokenChooser,
};

use crate::engine::{Event, Finish, Job};
use crate::error::{ApiError, BodyLimits, JsonBody};
use crate::{unix_now, AppState};

/// The page (playground and attention explorer), compiled in.
const PAGE: &str = include_str!("page.html");

impl<B: Backend> BodyLimits for Arc<AppState<B>> {
    fn body_limit(&self) -> usize {
        self.config.body_limit
    }

    fn idle_timeout(&self) -> Duration {
        self.config.idle_timeout
    }
}

/// Every endpoint, the body limit, and JSON errors for unknown paths and methods.
pub(crate) fn router<B: Backend>(state: Arc<AppState<B>>) -> Router {
    let limit = state.config.body_limit;
    Router::new()
        .route("/", get(page))
        .route("/health", get(health::<B>))
        .route("/v1/models", get(models::<B>))
        .route("/v1/models/{id}", get(model::<B>))
        .route("/v1/chat/completions", post(chat::<B>))
        .route("/v1/completions", post(completions::<B>))
        .route("/v1/embeddings", post(embeddings::<B>))
        .route("/v1/translations", post(translations::<B>))
        .route("/v1/attention", post(attention::<B>))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::no_route(method.as_str(), uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::wrong_method(method.as_str(), uri.path())
}

async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Html(PAGE),
    )
        .into_response()
}

/// `{"status": "ok"}` and the language model's counters; 503 with `"status": "error"` once
/// its decoding thread has stopped (the server still answers, but can no longer generate).
async fn health<B: Backend>(State(state): State<Arc<AppState<B>>>) -> Response {
    let mut body = json!({"status": "ok"});
    let mut status = StatusCode::OK;
    if let Some(llm) = &state.llm {
        let s = &llm.engine.stats;
        let get = |a: &std::sync::atomic::AtomicUsize| a.load(Ordering::SeqCst);
        let active = get(&s.active);
        let stopped = s.stopped.load(Ordering::SeqCst);
        body["llm"] = json!({"model": llm.name, "active": active,
            "waiting": llm.engine.load().saturating_sub(active),
            "completed": get(&s.completed), "cancelled": get(&s.cancelled),
            "largest_batch": get(&s.largest_batch), "steps": get(&s.steps),
            "cached_tokens": get(&s.cached_tokens),
            "decoding": !stopped});
        if stopped {
            body["status"] = json!("error");
            status = StatusCode::SERVICE_UNAVAILABLE;
        }
    }
    (status, Json(body)).into_response()
}

async fn model<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Result<Json<Value>, ApiError> {
    let Json(list) = models(State(Arc::clone(&state))).await;
    list["data"]
        .as_array()
        .and_then(|models| models.iter().find(|m| m["id"] == id.as_str()))
        .map(|m| Json(m.clone()))
        .ok_or_else(|| ApiError::model_not_found(&id, "/v1/models", &state.names()))
}

async fn models<B: Backend>(State(state): State<Arc<AppState<B>>>) -> Json<Value> {
    let entry = |id: &str, kind: &str, endpoints: &[&str]| {
        json!({"id": id, "object": "model", "created": state.started, "owned_by": "xfmr",
               "kind": kind, "endpoints": endpoints})
    };
    let mut data = Vec::new();
    if let Some(llm) = &state.llm {
        data.push(entry(
            &llm.name,
            "llm",
            &["/v1/chat/completions", "/v1/completions", "/v1/attention"],
        ));
    }
    if let Some(name) = &state.embeddings {
        data.push(entry(
            name,
            "embeddings",
            &["/v1/embeddings", "/v1/attention"],
        ));
    }
    if let Some(name) = &state.translation {
        data.push(entry(
            name,
            "translation",
            &["/v1/translations", "/v1/attention"],
        ));
    }
    Json(json!({"object": "list", "data": data}))
}

/// The `model` field: a loaded model of the endpoint's kind (the only one when absent).
fn pick_model<'a>(
    asked: Option<&str>,
    available: Option<&'a str>,
    endpoint: &str,
    all: &[String],
) -> Result<&'a str, ApiError> {
    match (asked, available) {
        (None, Some(name)) => Ok(name),
        (Some(asked), Some(name)) if asked == name => Ok(name),
        (asked, _) => Err(ApiError::model_not_found(
            asked.unwrap_or("(none given)"),
            endpoint,
            all,
        )),
    }
}

/// A string or an array of strings (`input`, `prompt`, `stop`), at most `max` of them.
fn strings(param: &str, value: &Value, max: usize) -> Result<Vec<String>, ApiError> {
    let list = match value {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s.clone()),
                other => Err(ApiError::invalid(
                    Some(&format!("{param}[{i}]")),
                    format!("{param}[{i}]: expected a string, got {}", kind_of(other)),
                )),
            })
            .collect::<Result<_, _>>()?,
        other => {
            return Err(ApiError::invalid(
                Some(param),
                format!(
                    "{param}: expected a string or an array of strings, got {}",
                    kind_of(other)
                ),
            ))
        }
    };
    if list.is_empty() {
        return Err(ApiError::invalid(Some(param), format!("{param} is empty")));
    }
    if list.len() > max {
        return Err(ApiError::invalid(
            Some(param),
            format!("{param}: {} items, at most {max}", list.len()),
        ));
    }
    Ok(list)
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The generation fields shared by chat and completions (unknown fields are ignored, as
/// OpenAI's own server does for options it does not know).
#[derive(Debug, Deserialize)]
struct GenerationRequest {
    model: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    prompt: Option<Value>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    seed: Option<i64>,
    stop: Option<Value>,
    logit_bias: Option<std::collections::BTreeMap<String, f64>>,
    n: Option<u64>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Debug, Deserialize)]
struct ChatMessage {
    role: String,
    content: Value,
}

/// A request's generation settings, checked.
struct Settings {
    max_tokens: Option<usize>,
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

fn settings(req: &GenerationRequest, limit: usize, vocab: usize) -> Result<Settings, ApiError> {
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
        sample,
        stop,
        bias,
    })
}

/// A request's id: `prefix-N`, N counting requests since the start.
fn request_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("{prefix}-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Submits one prompt to the engine: checks it against the context and the limit, returns the
/// events' receiver and the prompt's length.
fn submit<B: Backend>(
    state: &AppState<B>,
    prompt: &str,
    param: &str,
    settings: &Settings,
) -> Result<(UnboundedReceiver<Event>, usize), ApiError> {
    let llm = state.llm.as_ref().expect("checked by the caller");
    // Tokenising a prompt of up to the body limit is CPU work: off the async workers' list
    // while it runs, so that other connections are served meanwhile.
    let ids = tokio::task::block_in_place(|| llm.tokenizer.encode(prompt))
        .map_err(|e| ApiError::invalid(Some(param), format!("{param}: {e}")))?;
    if ids.is_empty() {
        return Err(ApiError::invalid(
            Some(param),
            format!("{param}: the prompt has no tokens"),
        ));
    }
    let context = llm.model.config.context_length;
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
    llm.engine.submit(Job {
        prompt: ids.clone(),
        max_tokens,
        chooser: TokenChooser::new(settings.sample.clone()),
        stop: settings.stop.clone(),
        bias: settings.bias.clone(),
        events,
    })?;
    Ok((rx, ids.len()))
}

/// All of a request's text, its end, its token count and its prompt tokens taken from the
/// prefix cache, within `timeout`.
async fn collect(
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

/// OpenAI's `usage`: `cached` of the prompt's tokens were not fed, their keys and values taken
/// from the prefix cache.
fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// The shape of one endpoint's stream chunks.
#[derive(Clone, Copy)]
enum Flavour {
    Chat,
    Completion,
}

impl Flavour {
    fn object(self) -> &'static str {
        match self {
            Self::Chat => "chat.completion.chunk",
            Self::Completion => "text_completion",
        }
    }

    fn choice(self, text: Option<&str>, finish: Option<Finish>, first: bool) -> Value {
        let finish = finish.map(Finish::as_str);
        match self {
            Self::Chat => {
                let delta = match (first, text) {
                    (true, _) => json!({"role": "assistant", "content": text.unwrap_or("")}),
                    (false, Some(t)) => json!({"content": t}),
                    (false, None) => json!({}),
                };
                json!({"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null})
            }
            Self::Completion => json!({"index": 0, "text": text.unwrap_or(""),
                                       "finish_reason": finish, "logprobs": null}),
        }
    }
}

/// Server-sent events for one request: a chunk per piece of text, a last chunk with the
/// finish reason, the usage chunk if asked for, `[DONE]`. An error (the model's, or the
/// request timeout) is sent as an `{"error": ...}` event and ends the stream. Dropping the
/// stream (the client went away) drops the receiver, and the engine frees the slot at its next
/// step.
fn event_stream(
    rx: UnboundedReceiver<Event>,
    flavour: Flavour,
    model: String,
    prompt_tokens: usize,
    include_usage: bool,
    timeout: Duration,
) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    let id = request_id(match flavour {
        Flavour::Chat => "chatcmpl",
        Flavour::Completion => "cmpl",
    });
    let created = unix_now();
    let chunk = move |choices: Vec<Value>, usage: Option<Value>| {
        let mut c = json!({"id": id, "object": flavour.object(), "created": created,
                           "model": model, "choices": choices});
        if let Some(u) = usage {
            c["usage"] = u;
        }
        SseEvent::default().data(c.to_string())
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
                            let u = usage(prompt_tokens, completion_tokens, cached_tokens);
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
                        st.pending
                            .push(SseEvent::default().data(e.body().to_string()));
                    }
                }
            }
        }
    })
}

/// The `content` of a chat message: a string, or an array of `{"type": "text", "text": ...}`
/// parts.
fn message_text(i: usize, content: &Value) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => parts
            .iter()
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
                kind_of(other)
            ),
        )),
    }
}

async fn chat<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(req): JsonBody<GenerationRequest>,
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
    let Some(messages) = &req.messages else {
        return Err(ApiError::invalid(
            Some("messages"),
            "messages: missing (a chat request needs its messages)",
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "messages is empty"));
    }
    let messages = messages
        .iter()
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
            let role = if m.role == "developer" {
                "system"
            } else {
                &m.role
            };
            Ok(Message::new(role, &message_text(i, &m.content)?))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let settings = settings(&req, state.config.max_tokens, llm.model.config.vocab_size)?;
    let prompt = tokio::task::block_in_place(|| llm.tokenizer.render_chat(&messages, true))
        .map_err(|e| ApiError::invalid(Some("messages"), format!("messages: {e}")))?;
    let (rx, prompt_tokens) = submit(&state, &prompt, "messages", &settings)?;
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
        return Ok(Sse::new(events).into_response());
    }
    let (text, finish, completion, cached) = collect(rx, Instant::now() + timeout, timeout).await?;
    Ok(Json(json!({
        "id": request_id("chatcmpl"), "object": "chat.completion", "created": unix_now(),
        "model": model, "system_fingerprint": null,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                     "finish_reason": finish.as_str(), "logprobs": null}],
        "usage": usage(prompt_tokens, completion, cached),
    }))
    .into_response())
}

async fn completions<B: Backend>(
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
        let (rx, prompt_tokens) = submit(&state, &prompts[0], "prompt", &settings)?;
        let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
        let events = event_stream(
            rx,
            Flavour::Completion,
            model,
            prompt_tokens,
            include_usage,
            timeout,
        );
        return Ok(Sse::new(events).into_response());
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
            submit(&state, p, &param, &settings)
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
        choices.push(
            json!({"index": index, "text": text, "finish_reason": finish.as_str(),
                            "logprobs": null}),
        );
    }
    Ok(Json(json!({
        "id": request_id("cmpl"), "object": "text_completion", "created": unix_now(),
        "model": model, "choices": choices, "usage": usage(prompt_total, completion_total, cached_total),
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    model: Option<String>,
    input: Value,
    encoding_format: Option<String>,
    dimensions: Option<u64>,
}

async fn embeddings<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(req): JsonBody<EmbeddingRequest>,
) -> Result<Json<Value>, ApiError> {
    let model = pick_model(
        req.model.as_deref(),
        state.embeddings.as_deref(),
        "/v1/embeddings",
        &state.names(),
    )?
    .to_string();
    let inputs = strings("input", &req.input, state.config.max_inputs)?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                Some("encoding_format"),
                format!("encoding_format = {other:?}: \"float\" or \"base64\""),
            ))
        }
    };
    let dimensions = req.dimensions;
    let timeout = state.config.request_timeout;
    let work = state.worker.run(move |models| {
        let encoder = models.embeddings.as_ref().expect("loaded");
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        let tokens: usize = encoder.tokenize(&refs)?.iter().map(Vec::len).sum();
        Ok::<_, xfmr_sentence::SentenceError>((encoder.embed(&refs)?, tokens))
    });
    let (vectors, tokens) = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ApiError::timeout(timeout))??
        .map_err(|e| ApiError::invalid(Some("input"), format!("input: {e}")))?;
    let width = vectors.first().map_or(0, Vec::len);
    if let Some(d) = dimensions.filter(|&d| d as usize != width) {
        return Err(ApiError::invalid(
            Some("dimensions"),
            format!("dimensions = {d}: this model's embeddings have {width}"),
        ));
    }
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match base64 {
                true => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
                false => json!(v),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list", "data": data, "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })))
}

#[derive(Debug, Deserialize)]
struct TranslationRequest {
    model: Option<String>,
    input: Value,
    beam: Option<u64>,
    n_best: Option<u64>,
    max_tokens: Option<u64>,
}

/// Largest beam a translation request may ask for.
const MAX_BEAM: u64 = 16;
/// Longest translation, tokens.
const MAX_TRANSLATION_TOKENS: u64 = 256;
/// Longest source sentence, tokens.
const MAX_SOURCE_TOKENS: usize = 512;

async fn translations<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(req): JsonBody<TranslationRequest>,
) -> Result<Json<Value>, ApiError> {
    let model = pick_model(
        req.model.as_deref(),
        state.translation.as_deref(),
        "/v1/translations",
        &state.names(),
    )?
    .to_string();
    let inputs = strings("input", &req.input, state.config.max_inputs)?;
    let beam = req.beam.unwrap_or(4);
    if !(1..=MAX_BEAM).contains(&beam) {
        return Err(ApiError::invalid(
            Some("beam"),
            format!("beam = {beam}: must be in 1..={MAX_BEAM} (1: greedy)"),
        ));
    }
    let n_best = req.n_best.unwrap_or(1);
    if !(1..=beam).contains(&n_best) {
        return Err(ApiError::invalid(
            Some("n_best"),
            format!("n_best = {n_best}: must be in 1..={beam} (the beam)"),
        ));
    }
    let max_tokens = req.max_tokens.unwrap_or(128);
    if !(1..=MAX_TRANSLATION_TOKENS).contains(&max_tokens) {
        return Err(ApiError::invalid(
            Some("max_tokens"),
            format!("max_tokens = {max_tokens}: must be in 1..={MAX_TRANSLATION_TOKENS}"),
        ));
    }
    let timeout = state.config.request_timeout;
    let length_penalty = state.config.translation_length_penalty;
    let work = state.worker.run(move |models| {
        let (model, tokenizer) = models.translation.as_ref().expect("loaded");
        // Each source is checked before any is translated: the encoder's cost grows with the
        // square of its length.
        for (i, text) in inputs.iter().enumerate() {
            let n = tokenizer
                .encode(text)
                .map_err(|e| ApiError::invalid(Some(&format!("input[{i}]")), e.to_string()))?
                .len();
            if n > MAX_SOURCE_TOKENS {
                return Err(ApiError::invalid(
                    Some(&format!("input[{i}]")),
                    format!("input[{i}]: {n} tokens; at most {MAX_SOURCE_TOKENS} per source"),
                ));
            }
        }
        let strategy = match beam {
            1 => Strategy::Greedy,
            _ => Strategy::Beam(BeamOptions {
                beam_size: beam as usize,
                length_penalty,
                n_best: n_best as usize,
            }),
        };
        let options =
            GenerationOptions::greedy(max_tokens as usize, tokenizer.eos_id(), tokenizer.pad_id())
                .with_strategy(strategy);
        let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
        xfmr_train::translate::translate(model, tokenizer, &refs, &options, 32)
            .map_err(|e| ApiError::invalid(Some("input"), format!("input: {e}")))
    });
    let out = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ApiError::timeout(timeout))???;
    let data: Vec<Value> = out
        .into_iter()
        .enumerate()
        .map(|(index, candidates)| {
            let translations: Vec<Value> = candidates
                .into_iter()
                .map(|c| json!({"text": c.text, "score": c.score}))
                .collect();
            json!({"index": index, "translations": translations})
        })
        .collect();
    Ok(Json(
        json!({"object": "list", "model": model, "data": data}),
    ))
}

#[derive(Debug, Deserialize)]
struct AttentionRequest {
    model: Option<String>,
    input: String,
}

/// Weights rounded to 4 decimals (the page shows colours; the body stays small).
fn rounded(weights: &[f32]) -> Vec<f32> {
    weights
        .iter()
        .map(|w| (w * 10_000.0).round() / 10_000.0)
        .collect()
}

/// One attention map of the response: `layers × heads` matrices of `queries × keys`, each
/// layer's weights flat (`[heads, queries, keys]` row-major).
fn attention_map(
    name: &str,
    queries: &[String],
    keys: &[String],
    heads: usize,
    layers: &[Vec<f32>],
) -> Value {
    json!({"name": name, "queries": queries, "keys": keys, "layers": layers.len(),
           "heads": heads, "weights": layers.iter().map(|w| rounded(w)).collect::<Vec<_>>()})
}

async fn attention<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(req): JsonBody<AttentionRequest>,
) -> Result<Json<Value>, ApiError> {
    let names = state.names();
    let asked = req.model.as_deref();
    let is = |name: Option<&str>| name.is_some() && (asked.is_none() || asked == name);
    let llm = state.llm.as_ref().map(|l| l.name.as_str());
    let (kind, model_name) = if is(state.translation.as_deref()) {
        ("translation", state.translation.clone())
    } else if is(llm) {
        ("llm", llm.map(str::to_string))
    } else if is(state.embeddings.as_deref()) {
        ("embeddings", state.embeddings.clone())
    } else {
        return Err(ApiError::model_not_found(
            asked.unwrap_or("(none given)"),
            "/v1/attention",
            &names,
        ));
    };
    if req.input.trim().is_empty() {
        return Err(ApiError::invalid(Some("input"), "input is empty"));
    }
    let max = state.config.max_attention_tokens;
    let too_long = move |n: usize| {
        ApiError::invalid(
            Some("input"),
            format!("input: {n} tokens; attention maps are served for at most {max}"),
        )
    };
    let input = req.input;
    let timeout = state.config.request_timeout;
    let work = state.worker.run(move |models| -> Result<Value, ApiError> {
        let invalid = |e: String| ApiError::invalid(Some("input"), format!("input: {e}"));
        match kind {
            "translation" => {
                let (model, tokenizer) = models.translation.as_ref().expect("loaded");
                let n = tokenizer.encode(&input).map_err(|e| invalid(e.to_string()))?.len();
                if n + 1 > max {
                    return Err(too_long(n + 1));
                }
                let a = xfmr_train::translate::translation_attention(model, tokenizer, &input, max)
                    .map_err(|e| invalid(e.to_string()))?;
                Ok(json!({"translation": a.translation, "maps": [
                    attention_map("encoder self-attention", &a.source, &a.source, a.heads, &a.encoder),
                    attention_map("decoder cross-attention", &a.target, &a.source, a.heads, &a.cross),
                ]}))
            }
            "llm" => {
                let (model, tokenizer) = models.llm.as_ref().expect("loaded");
                let ids = tokenizer.encode(&input).map_err(|e| invalid(e.to_string()))?;
                if ids.len() > max.min(model.config.context_length) {
                    return Err(too_long(ids.len()));
                }
                let weights = model
                    .attention_weights(&ids)
                    .map_err(|e| invalid(e.to_string()))?;
                let tokens: Vec<String> = ids
                    .iter()
                    .map(|&id| tokenizer.decode(&[id]).unwrap_or_else(|_| format!("#{id}")))
                    .collect();
                Ok(json!({"maps": [attention_map(
                    "causal self-attention", &tokens, &tokens, model.config.n_heads, &weights,
                )]}))
            }
            _ => {
                let encoder = models.embeddings.as_ref().expect("loaded");
                let (tokens, weights) = encoder
                    .attention(&input)
                    .map_err(|e| invalid(e.to_string()))?;
                if tokens.len() > max {
                    return Err(too_long(tokens.len()));
                }
                let heads = encoder.config.layer.n_heads;
                Ok(json!({"maps": [attention_map(
                    "self-attention", &tokens, &tokens, heads, &weights,
                )]}))
            }
        }
    });
    let mut body = tokio::time::timeout(timeout, work)
        .await
        .map_err(|_| ApiError::timeout(timeout))???;
    body["object"] = json!("attention");
    body["model"] = json!(model_name);
    Ok(Json(body))
}
