//! `POST /v1/translations` (xfmr's): the trained translation model, greedy or beam search,
//! `n_best` candidates per input.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use burn::tensor::backend::Backend;
use xfmr_models::generate::{BeamOptions, GenerationOptions, Strategy};

use super::{pick_model, strings};
use crate::api::{Translation, TranslationCandidate, TranslationRequest, Translations};
use crate::error::{ApiError, JsonBody};
use crate::worker::failed;
use crate::AppState;

/// Largest beam a translation request may ask for.
const MAX_BEAM: u64 = 16;
/// Longest translation, tokens.
const MAX_TRANSLATION_TOKENS: u64 = 256;
/// Longest source sentence, tokens.
const MAX_SOURCE_TOKENS: usize = 512;
/// Longest source sentence, bytes, refused before it is tokenised (tokenising a megabyte
/// costs tens of megabytes): 64 bytes for each of [`MAX_SOURCE_TOKENS`], over ten times what a
/// subword token of text takes (4 to 5 bytes in English or Spanish). Only a source padded with
/// long runs of spaces could be within the token limit and over this one.
const MAX_SOURCE_BYTES: usize = 64 * MAX_SOURCE_TOKENS;

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
            // Each source is checked before any is translated: the encoder's cost grows with
            // the square of its length.
            for (i, text) in inputs.iter().enumerate() {
                let param = format!("input[{i}]");
                if text.len() > MAX_SOURCE_BYTES {
                    return Err(ApiError::invalid(
                        Some(&param),
                        format!(
                            "{param}: {} bytes; at most {MAX_SOURCE_BYTES} per source",
                            text.len()
                        ),
                    ));
                }
                if cancel.is_cancelled() {
                    return Err(ApiError::timeout(timeout));
                }
                let n = tokenizer
                    .encode(text)
                    .map_err(|e| ApiError::invalid(Some(&param), e.to_string()))?
                    .len();
                if n > MAX_SOURCE_TOKENS {
                    return Err(ApiError::invalid(
                        Some(&param),
                        format!("{param}: {n} tokens; at most {MAX_SOURCE_TOKENS} per source"),
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
            // Stopped between batches and decoding steps when the client goes away or the
            // deadline passes.
            let options = GenerationOptions::greedy(
                max_tokens as usize,
                tokenizer.eos_id(),
                tokenizer.pad_id(),
            )
            .with_strategy(strategy)
            .with_cancel(cancel.clone());
            let refs: Vec<&str> = inputs.iter().map(String::as_str).collect();
            xfmr_train::translate::translate(model, tokenizer, &refs, &options, 32).map_err(|e| {
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
