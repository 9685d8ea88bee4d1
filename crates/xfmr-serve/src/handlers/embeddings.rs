//! `POST /v1/embeddings`: the sentence encoder's embeddings, as numbers or base64.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use burn::tensor::backend::Backend;

use super::{pick_model, strings};
use crate::api::{Embedding, EmbeddingRequest, EmbeddingUsage, EmbeddingVector, Embeddings};
use crate::error::{ApiError, JsonBody};
use crate::http::Tokens;
use crate::AppState;

/// The handler: one embedding per input, computed on the encoder models' thread.
pub(crate) async fn embeddings<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(req): JsonBody<EmbeddingRequest>,
) -> Result<Response, ApiError> {
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
    let (vectors, tokens) = state
        .worker
        .run(timeout, move |models, cancel| {
            let encoder = models.embeddings.as_ref().expect("loaded");
            let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            let tokens: usize = encoder.tokenize(&refs)?.iter().map(Vec::len).sum();
            Ok::<_, xfmr_sentence::SentenceError>((
                encoder.embed_with_cancel(&refs, cancel)?,
                tokens,
            ))
        })
        .await?
        .map_err(|e| {
            let cancelled = matches!(
                e,
                xfmr_sentence::SentenceError::Model(xfmr_models::ModelError::Cancelled)
            );
            match cancelled {
                true => ApiError::timeout(timeout),
                false => ApiError::invalid(Some("input"), format!("input: {e}")),
            }
        })?;
    let width = vectors.first().map_or(0, Vec::len);
    if let Some(d) = dimensions.filter(|&d| d as usize != width) {
        return Err(ApiError::invalid(
            Some("dimensions"),
            format!("dimensions = {d}: this model's embeddings have {width}"),
        ));
    }
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match base64 {
                true => {
                    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    EmbeddingVector::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
                false => EmbeddingVector::Float(v),
            };
            Embedding {
                embedding,
                index,
                object: "embedding".into(),
            }
        })
        .collect();
    let tokens_used = Tokens {
        prompt: Some(tokens),
        completion: None,
    };
    let body = Json(Embeddings {
        data,
        model,
        object: "list".into(),
        usage: EmbeddingUsage {
            prompt_tokens: tokens,
            total_tokens: tokens,
        },
    });
    Ok((Extension(tokens_used), body).into_response())
}
