//! `POST /v1/translations` (xfmr's): the trained translation model, greedy or beam search,
//! `n_best` candidates per input.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use burn::tensor::backend::Backend;
use xfmr_models::generate::{BeamOptions, GenerationOptions, Strategy};
use xfmr_translate::translate::{encode_sources, translate_ids, SourceLimit};
use xfmr_translate::TranslateError;

use super::{pick_model, strings};
use crate::api::{Translation, TranslationCandidate, TranslationRequest, Translations};
use crate::error::{ApiError, JsonBody};
use crate::worker::failed;
use crate::AppState;

/// Largest beam a translation request may ask for.
const MAX_BEAM: u64 = 16;
/// Longest translation, tokens.
const MAX_TRANSLATION_TOKENS: u64 = 256;
/// Longest source sentence the server translates, tokens (its end token included), or the
/// model's own limit where that is lower ([`SourceLimit::of_model`]): the encoder's cost grows
/// with the square of a source's length, and one thread serves every request.
const MAX_SOURCE_TOKENS: usize = 512;

/// The handler: every source checked, then translated on the encoder models' thread.
pub(crate) async fn translations<B: Backend>(
    State(state): State<Arc<AppState<B>>>,
    JsonBody(req): JsonBody<TranslationRequest>,
) -> Result<Json<Translations>, ApiError> {
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
    let out = state
        .worker
        .run(timeout, move |models, cancel| {
            let (model, tokenizer) = models.translation.as_ref().expect("loaded");
            // Every source is checked before any is translated, one too long for the limit
            // by bytes without tokenising it (the library's rule: one for every front end).
            let limit = SourceLimit::of_model(model);
            let limit = SourceLimit {
                max_tokens: limit.max_tokens.min(MAX_SOURCE_TOKENS),
                ..limit
            };
            let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            let sources = encode_sources(tokenizer, &refs, limit).map_err(|e| match e {
                TranslateError::SourceTooLong {
                    index,
                    tokens,
                    bytes,
                    max_tokens,
                } => {
                    let param = format!("input[{index}]");
                    let size = match tokens {
                        Some(tokens) => format!("{tokens} tokens"),
                        None => format!("{bytes} bytes, more than {max_tokens} tokens can be"),
                    };
                    let message =
                        format!("{param}: {size}; at most {max_tokens} tokens per source");
                    ApiError::invalid(Some(&param), message)
                }
                e => ApiError::invalid(Some("input"), format!("input: {e}")),
            })?;
            let strategy = match beam {
                1 => Strategy::Greedy,
                _ => Strategy::Beam(BeamOptions {
                    beam_size: beam as usize,
                    length_penalty,
                    n_best: n_best as usize,
                }),
            };
            // Stopped between batches and decoding steps when the client goes away or the
            // deadline passes.
            let options = GenerationOptions::greedy(
                max_tokens as usize,
                tokenizer.eos_id(),
                tokenizer.pad_id(),
            )
            .with_strategy(strategy)
            .with_cancel(cancel.clone());
            translate_ids(model, tokenizer, &sources.ids, &options, 32).map_err(|e| {
                failed(
                    cancel,
                    timeout,
                    ApiError::invalid(Some("input"), format!("input: {e}")),
                )
            })
        })
        .await??;
    let data = out
        .into_iter()
        .enumerate()
        .map(|(index, candidates)| Translation {
            index,
            translations: candidates
                .into_iter()
                .map(|c| TranslationCandidate {
                    score: c.score,
                    text: c.text,
                })
                .collect(),
        })
        .collect();
    Ok(Json(Translations {
        data,
        model,
        object: "list".into(),
    }))
}
