//! `POST /v1/attention` (xfmr's): every layer's and head's attention weights over a sentence,
//! for any loaded model (the page's attention explorer draws them).

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use burn::tensor::backend::Backend;

use crate::api::{Attention, AttentionMap, AttentionRequest};
use crate::error::{ApiError, JsonBody};
use crate::worker::Models;
use crate::AppState;

/// Bytes of input allowed per token of `max_attention_tokens`, checked before tokenising: over
/// ten times what a token of text takes in any of the served vocabularies (byte-level BPE,
/// WordPiece, the translation run's subwords: 3 to 5 bytes a token in European languages).
const MAX_BYTES_PER_TOKEN: usize = 64;

/// Which loaded model a request's maps come from.
#[derive(Clone, Copy)]
enum Kind {
    Translation,
    Llm,
    Embeddings,
}

/// Weights rounded to 4 decimals (the page shows colours).
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
) -> AttentionMap {
    AttentionMap {
        heads,
        keys: keys.to_vec(),
        layers: layers.len(),
        name: name.into(),
        queries: queries.to_vec(),
        weights: layers.iter().map(|w| rounded(w)).collect(),
    }
}

/// The handler: the model asked for (when none is: the translation model, else the language
/// model, else the encoder), its maps computed on the encoder models' thread.
pub(crate) async fn attention<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(req): JsonBody<AttentionRequest>,
) -> Result<Json<Attention>, ApiError> {
    let asked = req.model.as_deref();
    // A loaded model's name, if it is the one asked for (or none is).
    let pick = |name: Option<&String>| {
        name.filter(|&n| asked.is_none() || asked == Some(n.as_str()))
            .cloned()
    };
    let llm = state.llm.as_ref().map(|l| &l.name);
    let (kind, model) = if let Some(name) = pick(state.translation.as_ref()) {
        (Kind::Translation, name)
    } else if let Some(name) = pick(llm) {
        (Kind::Llm, name)
    } else if let Some(name) = pick(state.embeddings.as_ref()) {
        (Kind::Embeddings, name)
    } else {
        return Err(ApiError::model_not_found(
            asked.unwrap_or("(none given)"),
            "/v1/attention",
            &state.names(),
        ));
    };
    if req.input.trim().is_empty() {
        return Err(ApiError::invalid(Some("input"), "input is empty"));
    }
    let max = state.config.max_attention_tokens;
    // Refused before it is tokenised: no model's token takes this many bytes of text.
    if req.input.len() > max.saturating_mul(MAX_BYTES_PER_TOKEN) {
        return Err(ApiError::invalid(
            Some("input"),
            format!(
                "input: {} bytes; attention maps are served for at most {max} tokens \
                 ({} bytes)",
                req.input.len(),
                max.saturating_mul(MAX_BYTES_PER_TOKEN)
            ),
        ));
    }
    let input = req.input;
    let timeout = state.config.request_timeout;
    // Short (`max_attention_tokens`): checked once, before it starts.
    let (maps, translation) = state
        .worker
        .run(timeout, move |models, _| maps(models, kind, &input, max))
        .await??;
    Ok(Json(Attention {
        maps,
        model,
        object: "attention".into(),
        translation,
    }))
}

/// `input`'s attention maps in the `kind` model, at most `max` tokens of it (and the
/// translation model's translation), on the encoder models' thread.
fn maps<B: Backend>(
    models: &Models<B>,
    kind: Kind,
    input: &str,
    max: usize,
) -> Result<(Vec<AttentionMap>, Option<String>), ApiError> {
    let invalid = |e: String| ApiError::invalid(Some("input"), format!("input: {e}"));
    let too_long = |n: usize| {
        ApiError::invalid(
            Some("input"),
            format!("input: {n} tokens; attention maps are served for at most {max}"),
        )
    };
    match kind {
        Kind::Translation => {
            let (model, tokenizer) = models.translation.as_ref().expect("loaded");
            let n = tokenizer
                .encode(input)
                .map_err(|e| invalid(e.to_string()))?
                .len();
            if n + 1 > max {
                return Err(too_long(n + 1));
            }
            let a = xfmr_translate::translation_attention(model, tokenizer, input, max)
                .map_err(|e| invalid(e.to_string()))?;
            let (source, target, heads) = (&a.source, &a.target, a.heads);
            let maps = vec![
                attention_map("encoder self-attention", source, source, heads, &a.encoder),
                attention_map("decoder cross-attention", target, source, heads, &a.cross),
            ];
            Ok((maps, Some(a.translation)))
        }
        Kind::Llm => {
            let (model, tokenizer) = models.llm.as_ref().expect("loaded");
            let limit = max.min(model.config.context_length);
            // Tokenised only as far as the limit.
            let ids = match tokenizer.encode_limited(input, limit) {
                Ok(ids) => ids,
                Err(xfmr_llm::LlmError::TooManyTokens { .. }) => {
                    return Err(ApiError::invalid(
                        Some("input"),
                        format!(
                        "input: over {limit} tokens; attention maps are served for at most {limit}"
                    ),
                    ))
                }
                Err(e) => return Err(invalid(e.to_string())),
            };
            let weights = model
                .attention_weights(&ids)
                .map_err(|e| invalid(e.to_string()))?;
            let tokens: Vec<String> = ids
                .iter()
                .map(|&id| tokenizer.decode(&[id]).unwrap_or_else(|_| format!("#{id}")))
                .collect();
            let heads = model.config.n_heads;
            let map = attention_map("causal self-attention", &tokens, &tokens, heads, &weights);
            Ok((vec![map], None))
        }
        Kind::Embeddings => {
            let encoder = models.embeddings.as_ref().expect("loaded");
            let (tokens, weights) = encoder
                .attention(input)
                .map_err(|e| invalid(e.to_string()))?;
            if tokens.len() > max {
                return Err(too_long(tokens.len()));
            }
            let heads = encoder.config.layer.n_heads;
            let map = attention_map("self-attention", &tokens, &tokens, heads, &weights);
            Ok((vec![map], None))
        }
    }
}
