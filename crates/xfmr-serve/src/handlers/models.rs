//! `GET /health`, `GET /v1/models` and `GET /v1/models/{id}`: liveness and what is loaded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use burn::tensor::backend::Backend;

use crate::api::{Health, LlmHealth, ModelCard, ModelList};
use crate::error::ApiError;
use crate::AppState;

/// `{"status": "ok"}` and the language model's counters; 503 with `"status": "error"` once
/// its decoding thread has stopped (the server still answers, but can no longer generate).
pub(crate) async fn health<B: Backend>(State(state): State<Arc<AppState<B>>>) -> Response {
    let mut body = Health {
        llm: None,
        status: "ok".into(),
    };
    let mut status = StatusCode::OK;
    if let Some(llm) = &state.llm {
        let s = &llm.engine.stats;
        let get = |a: &AtomicUsize| a.load(Ordering::SeqCst);
        let active = get(&s.active);
        let stopped = s.stopped.load(Ordering::SeqCst);
        body.llm = Some(LlmHealth {
            active,
            cached_tokens: get(&s.cached_tokens),
            cancelled: get(&s.cancelled),
            completed: get(&s.completed),
            decoding: !stopped,
            largest_batch: get(&s.largest_batch),
            model: llm.name.clone(),
            steps: get(&s.steps),
            waiting: llm.engine.load().saturating_sub(active),
        });
        if stopped {
            body.status = "error".into();
            status = StatusCode::SERVICE_UNAVAILABLE;
        }
    }
    (status, Json(body)).into_response()
}

/// Every loaded model's card.
fn model_list<B: Backend>(state: &AppState<B>) -> ModelList {
    let card = |id: &str, kind: &str, endpoints: &[&str]| ModelCard {
        created: state.started,
        endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
        id: id.into(),
        kind: kind.into(),
        object: "model".into(),
        owned_by: "xfmr".into(),
    };
    let mut data = Vec::new();
    if let Some(llm) = &state.llm {
        data.push(card(
            &llm.name,
            "llm",
            &["/v1/chat/completions", "/v1/completions", "/v1/attention"],
        ));
    }
    if let Some(name) = &state.embeddings {
        data.push(card(
            name,
            "embeddings",
            &["/v1/embeddings", "/v1/attention"],
        ));
    }
    if let Some(name) = &state.translation {
        data.push(card(
            name,
            "translation",
            &["/v1/translations", "/v1/attention"],
        ));
    }
    ModelList {
        data,
        object: "list".into(),
    }
}

/// `GET /v1/models`: every loaded model.
pub(crate) async fn models<B: Backend>(State(state): State<Arc<AppState<B>>>) -> Json<ModelList> {
    Json(model_list(&state))
}

/// `GET /v1/models/{id}`: one loaded model, or a 404.
pub(crate) async fn model<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    Path(id): Path<String>,
) -> Result<Json<ModelCard>, ApiError> {
    model_list(&state)
        .data
        .into_iter()
        .find(|m| m.id == id)
        .map(Json)
        .ok_or_else(|| ApiError::model_not_found(&id, "/v1/models", &state.names()))
}
